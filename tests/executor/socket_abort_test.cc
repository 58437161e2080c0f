// ConnectionAborter (executor/socket_abort.h): shutting down the sockets
// connected to watched addresses wakes a blocked reader at once, and a Gloo
// collective blocked on a peer that never comes fails at once instead of at
// its timeout (5 minutes here: a test that waited for it would not finish),
// after which the communicator is destroyed without waiting. Real sockets,
// real Gloo (2 ranks in one process over a TCPStore on 127.0.0.1).
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/socket_abort.h"
#include "tests/executor/local_rendezvous.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::LocalRendezvous;
using ::fxdp::testing::ValueOrDie;

constexpr std::chrono::milliseconds kLong(300000);

// A listening socket on 127.0.0.1 and its port.
int Listen(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

TEST(ConnectionAborterTest, ShutsDownOnlyTheWatchedConnectionsAndWakesTheirReaders) {
  int port = 0, other_port = 0;
  const int server = Listen(&port), other_server = Listen(&other_port);
  const int client = Connect(port), other = Connect(other_port);
  const int accepted = accept(server, nullptr, nullptr),
            other_accepted = accept(other_server, nullptr, nullptr);
  EXPECT_EQ(ResolveAddresses("127.0.0.1", port),
            std::vector<std::string>{absl::StrCat("[127.0.0.1]:", port)});

  ConnectionAborter aborter;
  aborter.Watch(ResolveAddresses("127.0.0.1", port));
  ssize_t got = -2;
  std::thread reader([&] {
    char c = 0;
    got = recv(client, &c, 1, 0);  // blocks: nothing is ever sent
  });
  EXPECT_FALSE(aborter.aborted());
  EXPECT_EQ(aborter.Abort(), 1);  // `client` only: its peer is the watched address
  reader.join();
  EXPECT_EQ(got, 0);
  EXPECT_TRUE(aborter.aborted());
  char c = 0;
  EXPECT_EQ(recv(accepted, &c, 1, 0), 0);           // the other end sees it end
  EXPECT_EQ(send(other, "x", 1, MSG_NOSIGNAL), 1);  // a connection not watched is untouched
  EXPECT_EQ(recv(other_accepted, &c, 1, 0), 1);

  // Watched after the abort: shut down at once.
  aborter.Watch(ResolveAddresses("127.0.0.1", other_port));
  EXPECT_EQ(recv(other, &c, 1, 0), 0);
  for (int fd : {server, other_server, client, other, accepted, other_accepted}) close(fd);
}

TEST(ConnectionAborterTest, ACollectiveWaitingForAnAbsentPeerFailsAtOnceAndTheGroupIsDestroyed) {
  // Gloo writes to a pair shut down under it: EPIPE, not SIGPIPE's default
  // (fxdp-worker ignores SIGPIPE too: executor/worker/main.cc).
  std::signal(SIGPIPE, SIG_IGN);
  const LocalRendezvous rv(2, kLong);
  std::unique_ptr<GlooCommunicator> rank1;
  std::thread t([&] { rank1 = ValueOrDie(rv.Communicator(1)); });
  std::unique_ptr<GlooCommunicator> rank0 = ValueOrDie(rv.Communicator(0));
  t.join();
  // Rank 0 all-reduces; rank 1 never does. Both ranks live in this process,
  // so their peer maps are empty: watch every socket of the process.
  std::unique_ptr<Work> w = ValueOrDie(rank0->AllReduceSum(at::ones({4})));
  ConnectionAborter aborter;
  aborter.Watch(OwnSocketAddresses());
  absl::StatusOr<at::Tensor> r;
  std::thread wait([&] { r = w->Wait(kLong); });  // blocked, or about to be
  EXPECT_GT(aborter.Abort(), 0);
  wait.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  w.reset();
  rank0.reset();  // neither blocks on the dead pair
  rank1.reset();
}

}  // namespace
}  // namespace fxdp::executor
