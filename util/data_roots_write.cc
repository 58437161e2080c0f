// Writing beneath a data root (data_roots.h): DataRoots::CreateFile and
// Remove, and the NewFile a created file is written through.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/data_roots.h"

namespace fxdp::util {
namespace {

std::atomic<uint64_t> g_temporaries{0};

// renameat2(RENAME_NOREPLACE), or on a filesystem without it a link and an
// unlink (link(2) never replaces either): 0 or an errno.
int RenameNoReplace(int dir_fd, const std::string& from, const std::string& to) {
  if (syscall(SYS_renameat2, dir_fd, from.c_str(), dir_fd, to.c_str(), RENAME_NOREPLACE) == 0)
    return 0;
  const int e = errno;
  if (e != EINVAL && e != ENOSYS) return e;
  if (linkat(dir_fd, from.c_str(), dir_fd, to.c_str(), 0) != 0) return errno;
  unlinkat(dir_fd, from.c_str(), 0);
  return 0;
}

}  // namespace

NewFile& NewFile::operator=(NewFile&& o) noexcept {
  if (this != &o) {
    Drop();
    path_ = std::move(o.path_);
    name_ = std::move(o.name_);
    tmp_ = std::move(o.tmp_);
    dir_fd_ = std::exchange(o.dir_fd_, -1);
    fd_ = std::exchange(o.fd_, -1);
    max_bytes_ = o.max_bytes_;
    written_ = o.written_;
  }
  return *this;
}

NewFile::~NewFile() { Drop(); }

void NewFile::Drop() {
  if (fd_ >= 0) {
    close(fd_);
    unlinkat(dir_fd_, tmp_.c_str(), 0);  // never committed
  }
  if (dir_fd_ >= 0) close(dir_fd_);
  fd_ = dir_fd_ = -1;
}

absl::Status NewFile::Write(absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is not open"));
  if (bytes.size() > max_bytes_ - written_) {
    return absl::ResourceExhaustedError(absl::StrCat("'", path_, "': writing ", bytes.size(),
                                                     " bytes more after ", written_,
                                                     " would pass its limit of ", max_bytes_));
  }
  while (!bytes.empty()) {
    const ssize_t n = write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WriteError(path_, n < 0 ? errno : EIO, absl::StrCat("writing ", tmp_));
    bytes.remove_prefix(static_cast<size_t>(n));
    written_ += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status NewFile::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is not open"));
  if (fsync(fd_) != 0) return WriteError(path_, errno, absl::StrCat("syncing ", tmp_));
  const int closed = close(fd_);
  const int close_errno = errno;
  fd_ = -1;
  int e = closed != 0 ? close_errno : RenameNoReplace(dir_fd_, tmp_, name_);
  if (e != 0) unlinkat(dir_fd_, tmp_.c_str(), 0);
  if (e == EEXIST)
    return absl::AlreadyExistsError(absl::StrCat("'", path_,
                                                 "' appeared while it was written; it "
                                                 "is left as it is"));
  if (e != 0) return WriteError(path_, e, absl::StrCat("renaming ", tmp_, " to it"));
  if (fsync(dir_fd_) != 0) return WriteError(path_, errno, "syncing its directory");
  return absl::OkStatus();
}

absl::StatusOr<int> DataRoots::ParentBeneath(const std::string& path, bool create,
                                             std::string* name) const {
  if (path.size() > PATH_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("a path of ", path.size(), " bytes is longer than PATH_MAX (", PATH_MAX, ")"));
  }
  if (path.find('\0') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CHexEscape(path), "' contains a NUL byte"));
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' has a '", part,
                       "' component: a path written beneath a data root names none"));
    }
  }
  absl::StatusOr<Resolved> where = Resolve(path);
  if (!where.ok()) return where.status();
  std::vector<std::string> parts = absl::StrSplit(where->rel, '/', absl::SkipEmpty());
  if (parts.empty())
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a data root itself"));
  *name = parts.back();
  parts.pop_back();
  int cur = where->root->fd;
  // The root's descriptor is O_PATH: the first directory is opened from it.
  const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(cur, ".", flags & ~O_NOFOLLOW);
  if (fd < 0) return WriteError(path, errno, "opening its data root");
  for (const std::string& dir : parts) {
    if (create && mkdirat(fd, dir.c_str(), 0755) != 0 && errno != EEXIST) {
      const int e = errno;
      close(fd);
      return WriteError(path, e, absl::StrCat("creating its directory '", dir, "'"));
    }
    const int next = openat(fd, dir.c_str(), flags);
    int e = errno;
    // O_DIRECTORY | O_NOFOLLOW on a link is ENOTDIR (or ELOOP): say which.
    struct stat st {};
    if (next < 0 && (e == ENOTDIR || e == ELOOP))
      e = fstatat(fd, dir.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode) ? ELOOP
                                                                                         : ENOTDIR;
    close(fd);
    if (next >= 0) {
      fd = next;
      continue;
    }
    if (e == ELOOP) {
      return absl::PermissionDeniedError(absl::StrCat(
          "'", path, "' goes through a symbolic link ('", dir, "') below its data root '",
          where->root->configured, "': files are written without following links"));
    }
    if (e == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "': '", dir, "' on its way is not a directory"));
    }
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    return WriteError(path, e, absl::StrCat("opening its directory '", dir, "'"));
  }
  return fd;
}

absl::StatusOr<NewFile> DataRoots::CreateFile(const std::string& path, uint64_t max_bytes) const {
  NewFile f;
  absl::StatusOr<int> dir = ParentBeneath(path, /*create=*/true, &f.name_);
  if (!dir.ok()) return dir.status();
  f.dir_fd_ = *dir;
  f.path_ = path;
  f.max_bytes_ = max_bytes;
  struct stat st {};
  if (fstatat(f.dir_fd_, f.name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("'", path, "' exists already (", S_ISLNK(st.st_mode) ? "a symbolic link" : "",
                     S_ISDIR(st.st_mode) ? "a directory" : "", S_ISREG(st.st_mode) ? "a file" : "",
                     "); nothing is written over it"));
  }
  f.tmp_ = absl::StrCat(".", f.name_, ".tmp.", getpid(), ".", g_temporaries.fetch_add(1));
  f.fd_ =
      openat(f.dir_fd_, f.tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return WriteError(path, errno, absl::StrCat("creating ", f.tmp_));
  return f;
}

absl::Status DataRoots::Remove(const std::string& path, bool directory) const {
  std::string name;
  absl::StatusOr<int> dir = ParentBeneath(path, /*create=*/false, &name);
  if (!dir.ok()) return dir.status();
  const int rc = unlinkat(*dir, name.c_str(), directory ? AT_REMOVEDIR : 0);
  const int e = errno;
  close(*dir);
  if (rc == 0) return absl::OkStatus();
  if (e == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  if (e == ENOTEMPTY || e == EEXIST || e == EISDIR || e == ENOTDIR) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' cannot be removed: ", std::strerror(e),
                     directory ? " (only an empty directory is)" : " (only a file or a link is)"));
  }
  return WriteError(path, e, "removing it");
}

}  // namespace fxdp::util
