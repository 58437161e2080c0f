// Data roots: the directories whose files a remote party may name (a job's
// data_paths) and the one way such a file is opened.
//
//   * Each root is opened once (DataRoots::Open; a root that is itself a
//     symlink is followed there, once, as the operator configured it).
//   * A path is made absolute (against the working directory), "." and ".."
//     collapsed lexically; it must then lie under a root, spelled as
//     configured or as its real path. Paths lexically outside every root are
//     refused before anything is looked up (the error says nothing about
//     files outside).
//   * The rest is opened beneath the root's descriptor with openat2(2)
//     RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS and
//     O_NOFOLLOW: no symbolic link is followed anywhere below a root, so
//     swapping a directory for a link while files are opened cannot lead
//     out (issue 25.8). Kernels without openat2 (ENOSYS) get the same rule
//     from a walk: each directory opened with openat(O_NOFOLLOW) from the
//     previous one's descriptor.
//   * Excluded paths (the server's --state-dir, its key and token files:
//     `fxdp-worker attach --data-exclude`) are never opened even under a
//     root (issue 25.3): since nothing below a root follows a link, the
//     opened file's path is the root's real path plus the lexical rest, and
//     is compared with the exclusions' real paths; an excluded file is
//     also compared by device and inode after the open (a hard link).
//   * The descriptor is fstat()ed and read from; the path is never opened
//     twice (no check-then-open).
//   * Writing (CreateFile, Remove: the checkpoints a worker writes,
//     docs/checkpoints.md) takes the same roots and exclusions, refuses any
//     "." or ".." component outright, creates each missing directory with
//     mkdirat() and opens it with O_NOFOLLOW from its parent's descriptor
//     (a link anywhere below the root is refused, also one swapped in
//     between), and creates the file new (O_CREAT | O_EXCL | O_NOFOLLOW)
//     under a temporary name that becomes `path` only when it is complete
//     (renameat2 RENAME_NOREPLACE): an existing file is never replaced,
//     truncated or written through.
//
// Errors name the path as given and never contain file contents.
#ifndef FXDP_UTIL_DATA_ROOTS_H_
#define FXDP_UTIL_DATA_ROOTS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/files.h"

namespace fxdp::util {

// A file being written beneath a data root (DataRoots::CreateFile): its
// bytes go to a temporary file beside `path` that Commit renames to `path`;
// one never committed is removed when this is destroyed. Errors name `path`.
class NewFile {
 public:
  NewFile() = default;
  NewFile(NewFile&& o) noexcept { *this = std::move(o); }
  NewFile& operator=(NewFile&& o) noexcept;
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;
  ~NewFile();

  // Appends `bytes`: RESOURCE_EXHAUSTED past the max_bytes it was created
  // with (or a full disk), else WriteError's codes.
  absl::Status Write(absl::string_view bytes);
  // fsync, then the rename to `path` (ALREADY_EXISTS if something appeared
  // there meanwhile: it is left as it is) and an fsync of the directory.
  absl::Status Commit();
  const std::string& path() const { return path_; }
  uint64_t written() const { return written_; }

 private:
  friend class DataRoots;
  void Drop();
  std::string path_, name_, tmp_;  // as given; its name and the temporary's in dir_fd_
  int dir_fd_ = -1, fd_ = -1;
  uint64_t max_bytes_ = 0, written_ = 0;
};

class DataRoots {
 public:
  // Opens each root (NOT_FOUND / FAILED_PRECONDITION naming one that is not
  // an existing directory); `excluded` must exist (files or directories).
  static absl::StatusOr<DataRoots> Open(const std::vector<std::string>& roots,
                                        const std::vector<std::string>& excluded = {});
  DataRoots() = default;
  DataRoots(DataRoots&& o) noexcept;
  DataRoots& operator=(DataRoots&& o) noexcept;
  DataRoots(const DataRoots&) = delete;
  DataRoots& operator=(const DataRoots&) = delete;
  ~DataRoots();

  // The regular file `path` names, opened beneath its root (RegularFile's
  // checks: regular files only, at most `max_bytes`). PERMISSION_DENIED for
  // a path outside the roots (or none configured), an excluded one, or one
  // through a symbolic link; NOT_FOUND when it does not exist;
  // INVALID_ARGUMENT for a path with a NUL byte.
  absl::StatusOr<RegularFile> OpenFile(const std::string& path, uint64_t max_bytes) const;

  // Whether `path` is a directory (a dataset directory, docs/datasets.md),
  // under OpenFile's rules (the same errors for a path outside the roots,
  // excluded, through a link or missing); a root itself is one.
  absl::StatusOr<bool> IsDirectory(const std::string& path) const;

  // A new regular file at `path` (NewFile: written, then committed), its
  // missing directories created (mode 0755). INVALID_ARGUMENT for a "." or
  // ".." component, a NUL byte or more than PATH_MAX bytes; the errors of
  // OpenFile for a path outside the roots, excluded or through a link
  // (PERMISSION_DENIED); ALREADY_EXISTS when `path` exists (of any kind);
  // FAILED_PRECONDITION for a directory of it that is not one.
  absl::StatusOr<NewFile> CreateFile(const std::string& path, uint64_t max_bytes) const;
  // Removes the file (or link: never followed) `path`, or with `directory`
  // the empty directory `path`, beneath its root; CreateFile's checks.
  // NOT_FOUND when it does not exist, FAILED_PRECONDITION for a directory
  // that is not empty.
  absl::Status Remove(const std::string& path, bool directory) const;

  const std::vector<std::string>& configured() const { return configured_; }

 private:
  struct Root {
    std::string configured, real;  // lexical absolute, realpath
    int fd = -1;
  };
  struct Excluded {
    std::string real;
    dev_t dev = 0;
    ino_t ino = 0;
    bool is_dir = false;
  };
  void Close();
  // OpenFile's checks and open: a descriptor (the caller's), or -1 with
  // *is_root set for a root itself (never opened here).
  absl::StatusOr<int> OpenChecked(const std::string& path, bool* is_root) const;
  // The root `path` lies under and the rest below it; PERMISSION_DENIED
  // outside every root or in an excluded path.
  struct Resolved {
    const Root* root = nullptr;
    std::string rel;
  };
  absl::StatusOr<Resolved> Resolve(const std::string& path) const;
  // CreateFile and Remove: the descriptor of `path`'s directory (created
  // when `create`), and its last component.
  absl::StatusOr<int> ParentBeneath(const std::string& path, bool create, std::string* name) const;
  std::vector<std::string> configured_;  // as given, for errors
  std::vector<Root> roots_;
  std::vector<Excluded> excluded_;
};

// `path` made absolute (against the working directory) with "." and ".."
// collapsed textually; no link is followed.
std::string LexicalAbsolute(const std::string& path);

// Whether `path` (absolute, normalized) is `dir` or lies under it.
bool PathUnder(const std::string& path, const std::string& dir);

// The real path of `path` as far as it exists: realpath() of its longest
// existing prefix, the rest appended lexically ("" only for an empty path).
// For checks that a path does not lead into a directory (the server's own
// --state-dir) before a worker opens it.
std::string RealPathAsFarAsItExists(const std::string& path);

namespace internal {
// openat2(dirfd, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS), or the O_NOFOLLOW walk when `use_openat2` is false
// or openat2 is ENOSYS. `rel` is relative without "." or "..". A descriptor,
// or -errno (ELOOP: a link on the way).
int OpenBeneath(int dirfd, const std::string& rel, int flags, bool use_openat2 = true);
}  // namespace internal

}  // namespace fxdp::util

#endif  // FXDP_UTIL_DATA_ROOTS_H_
