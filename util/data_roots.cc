#include "util/data_roots.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fxdp::util {
namespace {

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

// `path`'s part below `dir` ("" for `dir` itself); `path` must be under it.
std::string Below(const std::string& path, const std::string& dir) {
  if (path.size() == dir.size()) return "";
  return path.substr(dir == "/" ? 1 : dir.size() + 1);
}

std::string Join(const std::string& dir, const std::string& rel) {
  if (rel.empty()) return dir;
  return dir == "/" ? absl::StrCat("/", rel) : absl::StrCat(dir, "/", rel);
}

// The O_NOFOLLOW walk: each directory of `rel` opened from the previous
// one's descriptor (O_PATH, then fstat: a symlink is ELOOP), the last
// component with `flags | O_NOFOLLOW`.
int WalkBeneath(int dirfd, const std::string& rel, int flags) {
  const std::vector<std::string> parts = absl::StrSplit(rel, '/', absl::SkipEmpty());
  if (parts.empty()) return -ENOENT;
  int cur = dirfd;
  auto drop = [&](int fd) {
    if (fd != dirfd) close(fd);
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next = openat(cur, parts[i].c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    const int e = errno;
    drop(cur);
    if (next < 0) return -e;
    struct stat st {};
    const int err = fstat(next, &st) != 0 ? errno
                    : S_ISLNK(st.st_mode) ? ELOOP
                    : S_ISDIR(st.st_mode) ? 0
                                          : ENOTDIR;
    if (err != 0) {
      close(next);
      return -err;
    }
    cur = next;
  }
  const int fd = openat(cur, parts.back().c_str(), flags | O_NOFOLLOW);
  const int e = errno;
  drop(cur);
  return fd >= 0 ? fd : -e;
}

absl::Status ExcludedError(const std::string& path, const std::string& excluded) {
  return absl::PermissionDeniedError(
      absl::StrCat("'", path, "' is in '", excluded,
                   "', which this worker never reads data from (fxdp-worker attach ",
                   "--data-exclude: the server's --state-dir, keys and tokens)"));
}

}  // namespace

namespace internal {

int OpenBeneath(int dirfd, const std::string& rel, int flags, bool use_openat2) {
  if (use_openat2) {
    struct open_how how {};
    how.flags = static_cast<uint64_t>(flags | O_NOFOLLOW);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int e = 0;
    // EAGAIN: a rename or mount raced the lookup (the kernel asks for a retry).
    for (int attempt = 0; attempt < 64; ++attempt) {
      const long fd = syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof(how));
      if (fd >= 0) return static_cast<int>(fd);
      e = errno;
      if (e != EAGAIN && e != EINTR) break;
    }
    if (e != ENOSYS) return -e;
  }
  return WalkBeneath(dirfd, rel, flags);
}

}  // namespace internal

std::string LexicalAbsolute(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    char cwd[PATH_MAX];
    full = absl::StrCat(getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "/", "/", path);
  }
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(full, '/', absl::SkipEmpty())) {
    if (p == ".") continue;
    if (p == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  return absl::StrCat("/", absl::StrJoin(parts, "/"));
}

bool PathUnder(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

std::string RealPathAsFarAsItExists(const std::string& path) {
  if (path.empty()) return "";
  std::string head = LexicalAbsolute(path), tail;
  while (true) {
    const std::string real = RealPath(head);
    if (!real.empty()) return tail.empty() ? real : Join(real, tail);
    if (head == "/") return Join("/", tail);
    const size_t slash = head.rfind('/');
    const std::string last = head.substr(slash + 1);
    tail = tail.empty() ? last : absl::StrCat(last, "/", tail);
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

absl::StatusOr<DataRoots> DataRoots::Open(const std::vector<std::string>& roots,
                                          const std::vector<std::string>& excluded) {
  DataRoots out;
  out.configured_ = roots;
  for (const std::string& r : roots) {
    const int fd = open(r.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "data root '", r, "' is not a directory that can be opened: ", std::strerror(errno)));
    out.roots_.push_back(Root{LexicalAbsolute(r), RealPath(r), fd});
    if (out.roots_.back().real.empty()) out.roots_.back().real = out.roots_.back().configured;
  }
  for (const std::string& x : excluded) {
    Excluded e;
    e.real = RealPathAsFarAsItExists(x);
    struct stat st {};
    // A path that does not exist (yet) is excluded as a directory: nothing
    // under it is ever opened.
    e.is_dir = stat(e.real.c_str(), &st) != 0 || S_ISDIR(st.st_mode);
    e.dev = st.st_dev;
    e.ino = st.st_ino;
    if (!e.real.empty()) out.excluded_.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<DataRoots::Resolved> DataRoots::Resolve(const std::string& path) const {
  // The kernel would stop at a NUL that the checks below look past
  // ("state/x\0/../../ok" is "ok" to them, "state/x" to openat2).
  if (path.find('\0') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CHexEscape(path), "' contains a NUL byte"));
  const std::string lexical = LexicalAbsolute(path);
  Resolved out;
  for (const Root& r : roots_) {
    for (const std::string* spelling : {&r.configured, &r.real}) {
      if (out.root == nullptr && PathUnder(lexical, *spelling)) {
        out.root = &r;
        out.rel = Below(lexical, *spelling);
      }
    }
  }
  if (out.root == nullptr) {
    const std::string allowed = configured_.empty()
                                    ? "none were configured"
                                    : absl::StrCat("allowed: ", absl::StrJoin(configured_, ", "));
    return absl::PermissionDeniedError(
        absl::StrCat("'", path, "' is outside this worker's data roots (", allowed, ")"));
  }
  // Nothing below a root is a link (they are refused), so this is where the
  // file is.
  const std::string real = Join(out.root->real, out.rel);
  for (const Excluded& x : excluded_)
    if (PathUnder(real, x.real)) return ExcludedError(path, x.real);
  return out;
}

absl::StatusOr<int> DataRoots::OpenChecked(const std::string& path, bool* is_root) const {
  absl::StatusOr<Resolved> where = Resolve(path);
  if (!where.ok()) return where.status();
  const Root* root = where->root;
  const std::string& rel = where->rel;
  *is_root = rel.empty();
  if (rel.empty()) return -1;
  const int fd = internal::OpenBeneath(root->fd, rel, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd == -ELOOP || fd == -EXDEV)
    return absl::PermissionDeniedError(absl::StrCat(
        "'", path, "' goes through a symbolic link below its data root '", root->configured,
        "': data files are opened without following links (one could lead outside this worker's "
        "data roots)"));
  if (fd == -ENOENT || fd == -ENOTDIR)
    return absl::NotFoundError(absl::StrCat("'", path, "' does not exist under the data roots"));
  if (fd < 0) return RegularFile::OpenError(path, -fd);
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    for (const Excluded& x : excluded_) {
      if (!x.is_dir && x.dev == st.st_dev && x.ino == st.st_ino) {
        close(fd);
        return ExcludedError(path, x.real);
      }
    }
  }
  return fd;
}

absl::StatusOr<RegularFile> DataRoots::OpenFile(const std::string& path, uint64_t max_bytes) const {
  bool is_root = false;
  absl::StatusOr<int> fd = OpenChecked(path, &is_root);
  if (!fd.ok()) return fd.status();
  if (is_root)
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is a directory, not a regular file"));
  return RegularFile::FromDescriptor(*fd, path, max_bytes);
}

absl::StatusOr<bool> DataRoots::IsDirectory(const std::string& path) const {
  bool is_root = false;
  absl::StatusOr<int> fd = OpenChecked(path, &is_root);
  if (!fd.ok()) return fd.status();
  if (is_root) return true;
  struct stat st {};
  const bool ok = fstat(*fd, &st) == 0;
  const int e = errno;
  close(*fd);
  if (!ok) return RegularFile::OpenError(path, e);
  return S_ISDIR(st.st_mode);
}

DataRoots::DataRoots(DataRoots&& o) noexcept
    : configured_(std::move(o.configured_)),
      roots_(std::move(o.roots_)),
      excluded_(std::move(o.excluded_)) {
  o.roots_.clear();
}

DataRoots& DataRoots::operator=(DataRoots&& o) noexcept {
  if (this != &o) {
    Close();
    configured_ = std::move(o.configured_);
    roots_ = std::move(o.roots_);
    excluded_ = std::move(o.excluded_);
    o.roots_.clear();
  }
  return *this;
}

DataRoots::~DataRoots() { Close(); }

void DataRoots::Close() {
  for (Root& r : roots_)
    if (r.fd >= 0) close(r.fd);
  roots_.clear();
}

}  // namespace fxdp::util
