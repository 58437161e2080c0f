// `world` ranks of one Gloo group inside one test process: rank 0 serves the
// rendezvous TCPStore on a free port, the other ranks (threads) connect to it.
#ifndef FXDP_TESTS_EXECUTOR_LOCAL_RENDEZVOUS_H_
#define FXDP_TESTS_EXECUTOR_LOCAL_RENDEZVOUS_H_

#include <chrono>
#include <memory>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/status/statusor.h"
#include "executor/gloo/gloo_backend.h"
#include "executor/gloo/gloo_communicator.h"
#include "tests/test_util.h"

namespace fxdp::testing {

struct LocalRendezvous {
  LocalRendezvous(int world, std::chrono::milliseconds timeout) {
    rank0.port = 0;  // rank 0 picks a free port
    rank0.world_size = world;
    rank0.timeout = timeout;
    store0 = ValueOrDie(executor::ConnectStore(rank0));
  }

  // Rank `r`'s options: the port rank 0's store listens on.
  executor::RendezvousOptions Options(int r) const {
    executor::RendezvousOptions o = rank0;
    o.rank = r;
    o.port = static_cast<c10d::TCPStore*>(store0.get())->getPort();
    return o;
  }

  // Rank `r`'s communicator: rank 0's over `store0`, the others connecting to
  // it. It returns once every rank has joined: call it from a thread per rank.
  absl::StatusOr<std::unique_ptr<executor::GlooCommunicator>> Communicator(int r) const {
    return r == 0 ? executor::GlooCommunicator::Create(store0, Options(0), "127.0.0.1")
                  : executor::GlooCommunicator::Connect(Options(r), "127.0.0.1");
  }

  executor::RendezvousOptions rank0;  // port 0: the store's port is in Options()
  c10::intrusive_ptr<c10d::Store> store0;
};

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_EXECUTOR_LOCAL_RENDEZVOUS_H_
