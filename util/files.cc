#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fxdp::util {

absl::Status WriteError(const std::string& path, int err, const std::string& doing) {
  const absl::StatusCode code =
      err == ENOSPC || err == EDQUOT || err == EFBIG  ? absl::StatusCode::kResourceExhausted
      : err == EACCES || err == EPERM || err == EROFS ? absl::StatusCode::kPermissionDenied
                                                      : absl::StatusCode::kDataLoss;
  return absl::Status(code, absl::StrCat(path, ": ", std::strerror(err), " (", doing, ")"));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes, bool durable) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const std::string needed = absl::StrCat("needed ", bytes.size(), " bytes");
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return WriteError(path, errno, absl::StrCat("creating ", tmp));
  auto failed = [&](const std::string& doing) {
    const int err = errno;
    close(fd);
    std::remove(tmp.c_str());
    return WriteError(path, err, doing);
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return failed(needed);
    }
    done += static_cast<size_t>(n);
  }
  // Some filesystems report a full disk only here (NFS, quotas).
  if (durable && fsync(fd) != 0) return failed(needed);
  if (close(fd) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return WriteError(path, err, needed);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return WriteError(path, err, absl::StrCat("renaming ", tmp, " over it"));
  }
  if (!durable) return absl::OkStatus();
  // The rename itself is durable once the directory is.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return WriteError(path, errno, absl::StrCat("opening its directory ", dir, " to sync it"));
  const int rc = fsync(dfd);
  const int err = errno;
  close(dfd);
  if (rc != 0) return WriteError(path, err, absl::StrCat("syncing its directory ", dir));
  return absl::OkStatus();
}

std::string WithCommas(uint64_t n) {
  std::string digits = absl::StrCat(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

absl::StatusOr<RegularFile> RegularFile::Open(const std::string& resolved, uint64_t max_bytes,
                                              const std::string& shown) {
  const std::string& path = shown.empty() ? resolved : shown;
  const int fd = open(resolved.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return OpenError(path, errno);
  return FromDescriptor(fd, path, max_bytes);
}

absl::Status RegularFile::OpenError(const std::string& path, int e) {
  if (e == ENOENT || e == ENOTDIR)
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': no such file"));
  if (e == EACCES)
    return absl::PermissionDeniedError(absl::StrCat("cannot open '", path, "': permission denied"));
  if (e == ELOOP)
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is a symbolic link, not a regular file"));
  return absl::FailedPreconditionError(
      absl::StrCat("cannot open '", path, "': ", std::strerror(e)));
}

absl::StatusOr<RegularFile> RegularFile::FromDescriptor(int fd, const std::string& path,
                                                        uint64_t max_bytes) {
  RegularFile file(path, fd, 0);  // closes fd on every return below
  struct stat st {};
  if (fstat(fd, &st) != 0)
    return absl::DataLossError(absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is ", kind, ", not a regular file"));
  }
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > max_bytes)
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' has ", WithCommas(file.size_),
                                                      " bytes, over the limit of ",
                                                      WithCommas(max_bytes)));
  return file;
}

RegularFile::RegularFile(RegularFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) close(fd_);
}

absl::Status RegularFile::ReadAt(uint64_t offset, uint64_t n, void* dest) const {
  char* out = static_cast<char*>(dest);
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = pread(fd_, out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return absl::DataLossError(
          absl::StrCat("error reading '", path_, "': ", std::strerror(errno)));
    if (r == 0)
      return absl::DataLossError(absl::StrCat("'", path_, "' shrank while being read (",
                                              WithCommas(offset + got), " of ", WithCommas(size_),
                                              " bytes)"));
    got += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<RegularFile> f = RegularFile::Open(path, max_bytes);
  if (!f.ok()) return f.status();
  std::string bytes(f->size(), '\0');
  if (absl::Status s = f->ReadAt(0, f->size(), bytes.data()); !s.ok()) return s;
  return bytes;
}

}  // namespace fxdp::util
