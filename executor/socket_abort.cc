#include "executor/socket_abort.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fxdp::executor {
namespace {

// Calls `fn(fd)` for every socket descriptor of this process.
void ForEachSocket(const std::function<void(int)>& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(e->d_name, &fd) || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) fn(fd);
  }
  closedir(dir);
}

}  // namespace

std::string SocketAddress(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    if (inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip)) == nullptr) return "";
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      if (inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof(ip)) == nullptr) return "";
    } else if (inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip)) == nullptr) {
      return "";
    }
    port = ntohs(in6->sin6_port);
  } else {
    return "";
  }
  return absl::StrCat("[", ip, "]:", port);
}

std::vector<std::string> OwnSocketAddresses() {
  std::vector<std::string> out;
  ForEachSocket([&](int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
    std::string a = SocketAddress(ss);
    if (!a.empty()) out.push_back(std::move(a));
  });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> ResolveAddresses(const std::string& host, int port) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof(ss)));
    std::string s = SocketAddress(ss);
    if (!s.empty()) out.push_back(std::move(s));
  }
  freeaddrinfo(res);
  return out;
}

void ConnectionAborter::Watch(const std::vector<std::string>& remote) {
  std::lock_guard<std::mutex> l(mu_);
  remote_.insert(remote.begin(), remote.end());
  if (aborted_) ShutdownLocked();
}

int ConnectionAborter::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
  return ShutdownLocked();
}

bool ConnectionAborter::aborted() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}

int ConnectionAborter::ShutdownLocked() const {
  int n = 0;
  if (remote_.empty()) return n;
  ForEachSocket([&](int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;  // not connected
    if (remote_.count(SocketAddress(ss)) > 0 && shutdown(fd, SHUT_RDWR) == 0) ++n;
  });
  return n;
}

}  // namespace fxdp::executor
