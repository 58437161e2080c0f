#include "server/listen_check.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fxdp::server {
namespace {

std::string Cannot(const std::string& listen, const std::string& why) {
  return absl::StrCat("cannot listen on ", listen, ": ", why);
}

}  // namespace

std::string WhyCannotListen(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:"))
    return Cannot(listen, "gRPC could not bind the socket (does it exist?)");
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return Cannot(listen, "expected HOST:PORT");
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return Cannot(listen, absl::StrCat("the address does not resolve (", gai_strerror(rc), ")"));
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr && error == 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) error = errno;
    close(fd);
  }
  freeaddrinfo(found);
  if (error == EADDRINUSE)
    return absl::StrCat("address ", listen, " is in use (another fxdp-server?)");
  if (error != 0) return Cannot(listen, std::strerror(error));
  return Cannot(listen, "gRPC could not start the server (see its messages above)");
}

}  // namespace fxdp::server
