// Files: reading files without trusting them: regular files only, bounded
// size (where they may be: util/data_roots.h).
//
//   ReadRegularFile  opens with O_NOFOLLOW|O_NONBLOCK (a FIFO cannot block it),
//                 fstat()s the open descriptor and refuses anything but a
//                 regular file (directories, FIFOs, sockets, devices such as
//                 /dev/zero), refuses files over `max_bytes` before reading,
//                 and reads at most the size fstat reported.
//
// Errors name the path as given; they never contain file contents.
#ifndef FXDP_UTIL_FILES_H_
#define FXDP_UTIL_FILES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fxdp::util {

// The bytes of the regular file at `path`: FAILED_PRECONDITION for a file
// that is not a regular file (or a symlink as the last component) or larger
// than `max_bytes`, NOT_FOUND / PERMISSION_DENIED from open, DATA_LOSS for a
// read error or a file that shrank while read.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);

// A regular file opened with ReadRegularFile's checks, read piece by piece
// (pread): a reader that needs part of a large file never holds all of it.
class RegularFile {
 public:
  // The errors of ReadRegularFile's open, stat and size checks. Errors (here
  // and from ReadAt) name `shown` when given (the path as a user gave it,
  // where `path` is where it resolved to), else `path`.
  static absl::StatusOr<RegularFile> Open(const std::string& path, uint64_t max_bytes,
                                          const std::string& shown = "");
  // The same checks on a descriptor opened elsewhere (util::DataRoots), which
  // the RegularFile owns from now on (closed on error too); errors name `path`.
  static absl::StatusOr<RegularFile> FromDescriptor(int fd, const std::string& path,
                                                    uint64_t max_bytes);
  // open()'s errno as Open reports it, naming `path`.
  static absl::Status OpenError(const std::string& path, int e);
  RegularFile(RegularFile&& o) noexcept;
  RegularFile& operator=(RegularFile&& o) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  const std::string& path() const { return path_; }  // as errors name it
  uint64_t size() const { return size_; }            // as fstat reported it at Open
  // Reads bytes [offset, offset + n) into `dest`: DATA_LOSS for a read error
  // or a file that is shorter than that now (naming the path).
  absl::Status ReadAt(uint64_t offset, uint64_t n, void* dest) const;

 private:
  RegularFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes `bytes` to `path` through a temporary file in the same directory,
// renamed over `path` once complete (readers never see half a file); every
// write, close and rename is checked. `durable`: the file is fsync()ed before
// the rename and its directory after it, so that once this returns OK the
// file survives a crash or power loss. Errors name `path`, the system's
// reason and what was being done ("/d/x: No space left on device (needed
// 1048576 bytes)"): RESOURCE_EXHAUSTED for a full disk, quota or file size
// limit, PERMISSION_DENIED, else DATA_LOSS. Nothing is left behind.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 bool durable = false);

// A write to `path` that failed with errno `err` while `doing`: the
// system's reason and what was being done; a full disk (or quota, or file
// size limit) is RESOURCE_EXHAUSTED, a denied one PERMISSION_DENIED,
// anything else DATA_LOSS.
absl::Status WriteError(const std::string& path, int err, const std::string& doing);

// "1,234,567" (a byte count in an error message).
std::string WithCommas(uint64_t n);

}  // namespace fxdp::util

#endif  // FXDP_UTIL_FILES_H_
