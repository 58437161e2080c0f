#include "executor/gloo/gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "executor/torch_types.h"

namespace fxdp::executor {

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousOptions& opts) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(opts.port);
  so.isServer = opts.rank == 0;
  so.numWorkers = opts.world_size;
  // The process group's own timeout governs the rendezvous.
  so.waitWorkers = false;
  so.timeout = opts.timeout;
  try {
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(opts.host, so));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", opts.rank, ": cannot reach the store at ",
                                               opts.host, ":", opts.port, ": ",
                                               ExceptionMessage(e)));
  }
}

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooBackend(
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
    const std::string& interface_host) {
  try {
    auto go = c10d::ProcessGroupGloo::Options::create(opts.timeout);
    go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(interface_host));
    return c10::intrusive_ptr<c10d::Backend>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, opts.rank, opts.world_size, go));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", opts.rank, " of ", opts.world_size,
                                               ": Gloo rendezvous failed: ", ExceptionMessage(e)));
  }
}

}  // namespace fxdp::executor
