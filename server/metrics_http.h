// MetricsHttp: `fxdp-server --metrics-port PORT`, Prometheus text metrics
// over plain HTTP/1.1 on the --listen host (no authentication, no TLS: bind
// it where only the scraper reaches, as --health-listen). One thread accepts
// and answers one connection at a time: `GET /metrics` is 200 with the text
// (text/plain; version=0.0.4) that `render` returns; other paths 404, other
// methods 405; a request head over 8 KiB is 431, one not complete within 2 s
// (each read and write is bounded too) is 408; every response closes its
// connection. No dependency beyond POSIX sockets.
#ifndef FXDP_SERVER_METRICS_HTTP_H_
#define FXDP_SERVER_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace fxdp::server {

class MetricsHttp {
 public:
  using Render = std::function<std::string()>;

  // Listens on `host` (as --listen names it: a name, an IPv4 address, [V6],
  // or empty for every address) and `port` (0: a free one), serving on its
  // own thread. UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsHttp>> Start(const std::string& host, int port,
                                                            Render render);
  ~MetricsHttp();  // stops the thread, closes the sockets
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  int port() const { return port_; }

  // The response to one request head (exposed for tests): status line,
  // headers and body.
  static std::string Respond(const std::string& head, const Render& render);

 private:
  MetricsHttp(int fd, int port, Render render);
  void Serve();
  void Answer(int conn) const;

  const int fd_;
  const int port_;
  const Render render_;
  int wake_[2] = {-1, -1};  // a pipe: a byte in it ends Serve
  std::thread thread_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_METRICS_HTTP_H_
