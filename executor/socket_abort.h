// Interrupting a rank's blocked network I/O from another thread: see [Aborting
// a job's connections].
//
// [Aborting a job's connections] Neither c10d's TCPStore nor
// ProcessGroupGloo (torch 2.13) can abort an operation in flight:
// ProcessGroupGloo has no abort(), a collective waiting for a peer blocks
// until its timeout, and the destructor first runs every queued collective.
// What ends them at once is their connection failing: shutdown(2) of a
// socket (SHUT_RDWR; the descriptor stays open, its owner closes it as
// usual, so no descriptor number is ever reused under it) wakes its readers
// and writers with an error. Gloo then fails every pending operation of that
// pair ("Connection closed by peer"), later ones fail at once, the peer sees
// the connection end the same way, and the process group and the store can
// be destroyed without waiting. ConnectionAborter keeps the remote addresses
// of one job's connections (the rendezvous store's, then every peer's
// sockets: Gloo's pairs and the store's connections) and shuts down this
// process's TCP sockets connected to any of them.
#ifndef FXDP_EXECUTOR_SOCKET_ABORT_H_
#define FXDP_EXECUTOR_SOCKET_ABORT_H_

#include <sys/socket.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace fxdp::executor {

// "[ip]:port" of an IPv4 or IPv6 address (an IPv4-mapped IPv6 address as its
// IPv4 form); "" for another family.
std::string SocketAddress(const sockaddr_storage& address);

// "[ip]:port" of every TCP/IP socket this process holds (listening or
// connected), from /proc/self/fd; sorted, unique.
std::vector<std::string> OwnSocketAddresses();

// "[ip]:port" of every address `host` resolves to (getaddrinfo; an IP is
// itself), empty when it does not resolve.
std::vector<std::string> ResolveAddresses(const std::string& host, int port);

class ConnectionAborter {
 public:
  // Connections to `remote` ("[ip]:port") are aborted by Abort(); after an
  // Abort(), at once.
  void Watch(const std::vector<std::string>& remote);
  // Shuts down every TCP socket of this process whose peer is a watched
  // address, now and in later Watch calls. Thread-safe; returns the sockets
  // shut down by this call.
  int Abort();
  bool aborted() const;

 private:
  int ShutdownLocked() const;
  mutable std::mutex mu_;
  std::set<std::string> remote_;
  bool aborted_ = false;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_SOCKET_ABORT_H_
