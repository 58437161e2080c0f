// Creating c10d's Gloo backend. This is the only TU that includes
// ProcessGroupGloo.hpp (compiled against third_party/gloo-shim); everything
// else sees a c10d::Backend.
#ifndef FXDP_EXECUTOR_GLOO_GLOO_BACKEND_H_
#define FXDP_EXECUTOR_GLOO_GLOO_BACKEND_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace fxdp::executor {

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // the store server (rank 0's host)
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{30000};
};

// Connects to (rank 0: serves) a c10d TCPStore for the rendezvous.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousOptions& opts);

// A Gloo process group over `store` whose collectives fail after `timeout`.
// `interface_host` is the address this rank's Gloo device binds to.
absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooBackend(
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
    const std::string& interface_host);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_GLOO_GLOO_BACKEND_H_
