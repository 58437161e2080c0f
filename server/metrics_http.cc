#include "server/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fxdp::server {
namespace {

constexpr size_t kMaxHead = 8 << 10;  // bytes of a request line and headers
constexpr int kTimeoutMs = 2000;      // to receive a whole request head

std::string Response(const std::string& status, const std::string& body,
                     const std::string& extra = "") {
  return absl::StrCat(
      "HTTP/1.1 ", status, "\r\nContent-Type: ",
      status == "200 OK" ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8",
      "\r\nContent-Length: ", body.size(), "\r\n", extra, "Connection: close\r\n\r\n", body);
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away, or the send timed out
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const std::string& host_in,
                                                                int port, Render render) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string where = absl::StrCat(host_in.empty() ? "*" : host_in, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() || host == "0.0.0.0" ? nullptr : host.c_str(),
                           port_text.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-port: cannot listen on ", where, ": ", gai_strerror(rc)));
  }
  int fd = -1, error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      error = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-port: cannot listen on ", where, ": ", std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsHttp>(new MetricsHttp(fd, actual, std::move(render)));
}

MetricsHttp::MetricsHttp(int fd, int port, Render render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  if (pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread(&MetricsHttp::Serve, this);
}

MetricsHttp::~MetricsHttp() {
  if (wake_[1] >= 0) {
    const char b = 0;
    (void)!write(wake_[1], &b, 1);
  }
  thread_.join();
  close(fd_);
  for (int w : wake_)
    if (w >= 0) close(w);
}

void MetricsHttp::Serve() {
  while (true) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(p, wake_[0] >= 0 ? 2 : 1, wake_[0] >= 0 ? -1 : 100) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Answer(conn);
    close(conn);
  }
}

void MetricsHttp::Answer(int conn) const {
  timeval tv{kTimeoutMs / 1000, (kTimeoutMs % 1000) * 1000};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  std::string head;
  char buf[1024];
  const std::string too_large =
      Response("431 Request Header Fields Too Large",
               absl::StrCat("a request head is at most ", kMaxHead, " bytes\n"));
  while (head.find("\r\n\r\n") == std::string::npos) {
    if (head.size() > kMaxHead) return WriteAll(conn, too_large);
    if (std::chrono::steady_clock::now() >= deadline) {
      return WriteAll(conn, Response("408 Request Timeout", "the request took too long\n"));
    }
    const ssize_t n = recv(conn, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return WriteAll(conn, Response("408 Request Timeout", "the request took too long\n"));
    }
    if (n <= 0) return;  // closed before a whole head
    head.append(buf, static_cast<size_t>(n));
  }
  if (head.find("\r\n\r\n") + 4 > kMaxHead) return WriteAll(conn, too_large);
  WriteAll(conn, Respond(head, render_));
}

std::string MetricsHttp::Respond(const std::string& head, const Render& render) {
  const std::string line = head.substr(0, head.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0) {
    return Response("400 Bad Request", "expected 'GET /metrics HTTP/1.1'\n");
  }
  if (parts[0] != "GET") {
    return Response("405 Method Not Allowed", "only GET\n", "Allow: GET\r\n");
  }
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") return Response("404 Not Found", "the metrics are at /metrics\n");
  return Response("200 OK", render());
}

}  // namespace fxdp::server
