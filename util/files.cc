#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fxdp::util {
namespace {

// `path` made absolute (against the working directory) with "." and ".."
// collapsed textually; symlinks are not followed.
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

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("error writing ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
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

absl::StatusOr<std::string> ConfinePath(const std::string& path, const std::vector<std::string>& roots) {
  const std::string allowed = roots.empty() ? "none were configured"
                                            : absl::StrCat("allowed: ", absl::StrJoin(roots, ", "));
  auto outside = [&] {
    return absl::PermissionDeniedError(
        absl::StrCat("'", path, "' is outside this worker's data roots (", allowed, ")"));
  };
  std::vector<std::string> resolved_roots;
  for (const std::string& r : roots) {
    const std::string rr = Resolved(r);
    if (!rr.empty()) resolved_roots.push_back(rr);
  }
  const std::string lexical = LexicalAbsolute(path);
  bool inside = false;
  for (size_t i = 0; i < roots.size(); ++i)
    inside = inside || Under(lexical, LexicalAbsolute(roots[i]));
  for (const std::string& rr : resolved_roots) inside = inside || Under(lexical, rr);
  if (!inside) return outside();
  const std::string real = Resolved(lexical);
  if (real.empty()) {
    const int e = errno;
    if (e == EACCES) return absl::PermissionDeniedError(absl::StrCat("'", path, "': permission denied"));
    return absl::NotFoundError(absl::StrCat("'", path, "' does not exist under the data roots"));
  }
  for (const std::string& rr : resolved_roots)
    if (Under(real, rr)) return real;
  return outside();  // a symlink (or "..") that leads out of the roots
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': no such file"));
    if (e == EACCES) return absl::PermissionDeniedError(absl::StrCat("cannot open '", path, "': permission denied"));
    if (e == ELOOP)
      return absl::FailedPreconditionError(absl::StrCat("'", path, "' is a symbolic link, not a regular file"));
    return absl::FailedPreconditionError(absl::StrCat("cannot open '", path, "': ", std::strerror(e)));
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
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
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is ", kind, ", not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' has ", WithCommas(size),
                                                      " bytes, over the limit of ", WithCommas(max_bytes)));
  std::string bytes(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, bytes.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("error reading '", path, "': ", std::strerror(errno)));
    if (n == 0)
      return absl::DataLossError(absl::StrCat("'", path, "' shrank while being read (", WithCommas(got), " of ",
                                              WithCommas(size), " bytes)"));
    got += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace fxdp::util
