// GlooCommunicator (gloo_communicator.h): collectives through c10d's
// ProcessGroupGloo, failures that name the lost peer's rank.
#include "executor/gloo/gloo_communicator.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "executor/socket_abort.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {

namespace {

using PeerAddresses = GlooCommunicator::PeerAddresses;

// Every rank publishes its socket addresses and reads the others'. Gloo
// names a peer by the address of its socket on the other end of the pair:
// the peer's listening socket or the socket it connected from, both of which
// are in the peer's list. Best effort: a peer that does not publish within the store's timeout is
// left out (the next collective reports it anyway).
std::shared_ptr<const PeerAddresses> ExchangeAddresses(c10d::Store& store, int rank, int world) {
  auto peers = std::make_shared<PeerAddresses>();
  try {
    const std::vector<std::string> own = OwnSocketAddresses();
    const std::string mine = absl::StrJoin(own, " ");
    store.set(absl::StrCat("fxdp/sockets/", rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::set<std::string> shared;
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      const std::vector<uint8_t> v = store.get(absl::StrCat("fxdp/sockets/", r));
      for (absl::string_view a :
           absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(v.data()), v.size()), ' ',
                          absl::SkipEmpty())) {
        auto [it, inserted] = peers->emplace(std::string(a), r);
        if (!inserted && it->second != r) shared.insert(std::string(a));
      }
    }
    // Addresses this process holds itself, or two peers claim, name no one.
    shared.insert(own.begin(), own.end());
    for (const std::string& a : shared) peers->erase(a);
  } catch (const std::exception&) {
  }
  return peers;
}

// The ranks whose socket addresses ("[ip]:port", perhaps followed by Gloo's
// "$seq") appear in `msg`. Gloo versions differ in the byte order they print
// a port in: both are tried.
std::vector<std::pair<int, std::string>> PeersNamedIn(absl::string_view msg,
                                                      const PeerAddresses& peers) {
  std::vector<std::pair<int, std::string>> found;
  size_t pos = 0;
  while ((pos = msg.find('[', pos)) != absl::string_view::npos) {
    const size_t close = msg.find(']', pos);
    if (close == absl::string_view::npos) break;
    if (close + 1 == msg.size() || msg[close + 1] != ':') {
      pos = close;
      continue;
    }
    size_t end = close + 2;
    while (end < msg.size() && absl::ascii_isdigit(static_cast<unsigned char>(msg[end]))) ++end;
    int port = 0;
    const absl::string_view ip = msg.substr(pos + 1, close - pos - 1);
    if (end > close + 2 && ip.find_first_of("[ ") == absl::string_view::npos &&
        absl::SimpleAtoi(msg.substr(close + 2, end - close - 2), &port) && port < 65536) {
      const std::string printed(msg.substr(pos, end - pos));
      const int swapped = ((port & 0xff) << 8) | ((port >> 8) & 0xff);
      for (int p : {port, swapped}) {
        auto it = peers.find(absl::StrCat("[", ip, "]:", p));
        if (it == peers.end()) continue;
        if (std::none_of(found.begin(), found.end(),
                         [&](const auto& f) { return f.first == it->second; }))
          found.emplace_back(it->second, printed);
        break;
      }
    }
    pos = close + 2;
  }
  return found;
}

// Gloo's message without its boilerplate tail ("Check the logs of the remote
// worker before reporting an error. GLHF! ...").
std::string TrimGlooMessage(std::string msg) {
  for (const char* tail : {" Check the logs of the remote worker", " GLHF!"}) {
    if (size_t p = msg.find(tail); p != std::string::npos) msg.resize(p);
  }
  return msg;
}

std::string DescribePeers(const std::vector<std::pair<int, std::string>>& peers) {
  std::vector<std::string> parts;
  for (const auto& [rank, addr] : peers)
    parts.push_back(absl::StrCat("rank ", rank, " (", addr, ")"));
  return absl::StrJoin(parts, ", ");
}

// A collective Gloo refused to start: UNAVAILABLE, naming the peers its
// message names.
absl::Status StartFailed(const std::string& who, const char* op, const std::exception& e,
                         const PeerAddresses& peers) {
  const std::string msg = TrimGlooMessage(ExceptionMessage(e));
  const auto named = PeersNamedIn(msg, peers);
  return absl::UnavailableError(absl::StrCat(
      who, ": starting ", op, " failed",
      named.empty() ? "" : absl::StrCat(", lost the connection to ", DescribePeers(named)), ": ",
      msg));
}

class GlooWork : public Work {
 public:
  // `chunk` >= 0: Wait returns chunk `chunk` of `result` cut in world_size
  // parts (a reduce-scatter over an all-reduce) and releases the rest.
  GlooWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, at::Tensor result, std::string who,
           std::shared_ptr<const PeerAddresses> peers, const char* op = "all_reduce",
           int chunk = -1, int world_size = 1)
      : works_(std::move(works)),
        result_(std::move(result)),
        who_(std::move(who)),
        peers_(std::move(peers)),
        op_(op),
        chunk_(chunk),
        world_size_(world_size) {}

  // A reduce-scatter whose all-reduce is done keeps its chunk and releases
  // the whole buffer (and the c10d works that hold it) at once.
  void Poll() override {
    if (chunk_ < 0 || works_.empty()) return;
    try {
      for (auto& w : works_)
        if (!w->isCompleted()) return;
      c10::InferenceMode normal(false);
      for (auto& w : works_) w->wait();  // rethrows a failure: Wait reports it
    } catch (const std::exception&) {
      return;
    }
    works_.clear();
    absl::StatusOr<at::Tensor> mine = TakeChunk();
    if (mine.ok()) {
      result_ = *std::move(mine);
      chunk_ = -1;
    }
  }

  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    const auto start = std::chrono::steady_clock::now();
    try {
      c10::InferenceMode normal(false);
      for (auto& w : works_) {
        const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - start);
        w->wait(std::max(left, std::chrono::milliseconds(1)));
      }
    } catch (const std::exception& e) {
      const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      const std::string msg = TrimGlooMessage(ExceptionMessage(e));
      // "Application timeout caused pair closure": an earlier collective on
      // the same pair timed out and Gloo closed it under this one.
      const bool timed_out =
          absl::StrContains(msg, "timed out") || absl::StrContains(msg, "Timed out") ||
          absl::StrContains(msg, "Timeout") || absl::StrContains(msg, "Application timeout");
      const auto named = PeersNamedIn(msg, *peers_);
      std::string status = timed_out ? absl::StrCat("timed out after ", elapsed.count(),
                                                    " ms (timeout ", timeout.count(), " ms)")
                                     : absl::StrCat("failed after ", elapsed.count(), " ms");
      if (!named.empty()) {
        absl::StrAppend(&status, timed_out ? ", waiting for " : ", lost the connection to ",
                        DescribePeers(named));
      } else if (timed_out) {
        absl::StrAppend(&status, ": a peer is hung or slower than the timeout");
      }
      return absl::Status(
          timed_out ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
          absl::StrCat(who_, ": ", op_, " ", status, ": ", msg));
    }
    works_.clear();
    if (chunk_ < 0) return result_;
    return TakeChunk();
  }

 private:
  // This rank's chunk of the reduced buffer, copied out; the buffer dies.
  absl::StatusOr<at::Tensor> TakeChunk() {
    try {
      const int64_t n = result_.numel() / world_size_;
      at::Tensor mine = result_.narrow(0, chunk_ * n, n).clone();
      result_ = at::Tensor();
      return mine;
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat(who_, ": ", op_, ": copying this rank's chunk out: ", ExceptionMessage(e)));
    }
  }

  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  at::Tensor result_;
  std::string who_;
  std::shared_ptr<const PeerAddresses> peers_;
  const char* op_;
  int chunk_;
  int world_size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    const RendezvousOptions& opts, const std::string& interface_host) {
  FXDP_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(opts));
  return Create(store, opts, interface_host);
}

namespace {

// Gloo's rendezvous waits for one store key per peer ("/<device>/<rank>"); on
// a timeout c10d lists the keys it still lacks ("... keys: /0/1, /0/2"):
// the ranks that did not show up.
std::vector<int> MissingRanks(absl::string_view msg) {
  std::vector<int> ranks;
  const size_t at = msg.rfind("keys: ");
  if (at == absl::string_view::npos) return ranks;
  for (absl::string_view key : absl::StrSplit(msg.substr(at + 6), ',', absl::SkipWhitespace())) {
    key = absl::StripAsciiWhitespace(key);
    const size_t slash = key.rfind('/');
    int r = -1;
    if (slash == absl::string_view::npos || !absl::SimpleAtoi(key.substr(slash + 1), &r)) break;
    ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
    const std::string& interface_host) {
  absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> created =
      CreateGlooBackend(store, opts, interface_host);
  if (!created.ok()) {
    const std::vector<int> missing = MissingRanks(created.status().message());
    if (missing.empty()) return created.status();
    return absl::Status(
        created.status().code(),
        absl::StrCat(created.status().message(), " (no word from rank",
                     missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "), " within ",
                     opts.timeout.count(), " ms: not started, unreachable or slower)"));
  }
  c10::intrusive_ptr<c10d::Backend> backend = *std::move(created);
  // Gloo's pairs are connected now (full mesh): its sockets exist.
  std::shared_ptr<const PeerAddresses> peers =
      ExchangeAddresses(*store, opts.rank, opts.world_size);
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
      store, std::move(backend), opts.rank, opts.world_size, std::move(peers)));
}

std::vector<std::string> GlooCommunicator::PeerSocketAddresses() const {
  std::vector<std::string> out;
  for (const auto& [address, rank] : *peers_) out.push_back(address);
  return out;
}

std::string GlooCommunicator::name() const {
  return absl::StrCat("gloo rank ", rank_, "/", world_size_);
}

absl::StatusOr<at::Tensor> GlooCommunicator::CopyForGloo(const at::Tensor& input,
                                                         const char* op) const {
  if (!input.device().is_cpu()) {
    return absl::UnimplementedError(
        absl::StrCat(name(), ": Gloo ", op, " of a ", input.device().str(),
                     " tensor is not supported (Gloo is the CPU communicator)"));
  }
  try {
    // A normal (not inference) contiguous CPU copy: Gloo works in place on it
    // from its own threads, outside the caller's InferenceMode.
    c10::InferenceMode normal(false);
    return input.reshape({-1}).clone(at::MemoryFormat::Contiguous);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": copying the ", op, " input failed: ", ExceptionMessage(e)));
  }
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllReduceSum(const at::Tensor& input) {
  FXDP_ASSIGN_OR_RETURN(at::Tensor buf, CopyForGloo(input, "all_reduce"));
  return Start(buf.view(input.sizes()));
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllReduceSumDonated(at::Tensor buffer) {
  if (!buffer.device().is_cpu() || !buffer.is_contiguous()) return AllReduceSum(buffer);
  return Start(std::move(buffer));
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::ReduceScatterSum(const at::Tensor& input) {
  if (input.numel() % world_size_ != 0) return ReduceScatterSumDonated(input);  // the error
  FXDP_ASSIGN_OR_RETURN(at::Tensor buf, CopyForGloo(input, "reduce_scatter_tensor"));
  return ReduceScatterSumDonated(std::move(buf));
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::ReduceScatterSumDonated(at::Tensor buffer) {
  const char* op = "reduce_scatter_tensor";
  const int64_t n = buffer.numel();
  if (n % world_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": ", op, " of ", n, " elements, not a multiple of the world size ", world_size_));
  }
  if (!buffer.device().is_cpu() || !buffer.is_contiguous()) return ReduceScatterSum(buffer);
  return Start(buffer.view({-1}), /*chunk=*/true);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllGather(const at::Tensor& input) {
  const char* op = "all_gather_into_tensor";
  if (!input.device().is_cpu()) {
    return absl::UnimplementedError(
        absl::StrCat(name(), ": Gloo ", op, " of a ", input.device().str(),
                     " tensor is not supported (Gloo is the CPU communicator)"));
  }
  const int64_t n = input.numel();
  at::Tensor out;
  try {
    // Normal (not inference): Gloo's threads write into it.
    c10::InferenceMode normal(false);
    out = at::empty({n * world_size_}, input.options());
    out.narrow(0, rank_ * n, n).copy_(input.reshape({-1}));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": allocating the ", op, " result failed: ", ExceptionMessage(e)));
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    c10::InferenceMode normal(false);
    for (int r = 0; r < world_size_; ++r) {
      std::vector<at::Tensor> part{out.narrow(0, r * n, n)};
      c10d::BroadcastOptions o;
      o.rootRank = r;
      works.push_back(backend_->broadcast(part, o));
    }
  } catch (const std::exception& e) {
    return StartFailed(name(), op, e, *peers_);
  }
  return std::unique_ptr<Work>(
      std::make_unique<GlooWork>(std::move(works), std::move(out), name(), peers_, op));
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::Start(at::Tensor buf, bool chunk) {
  const char* op = chunk ? "reduce_scatter_tensor" : "all_reduce";
  try {
    c10::InferenceMode normal(false);
    std::vector<at::Tensor> tensors{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    std::vector<c10::intrusive_ptr<c10d::Work>> works{backend_->allreduce(tensors, o)};
    return std::unique_ptr<Work>(std::make_unique<GlooWork>(
        std::move(works), std::move(buf), name(), peers_, op, chunk ? rank_ : -1, world_size_));
  } catch (const std::exception& e) {
    return StartFailed(name(), op, e, *peers_);
  }
}

}  // namespace fxdp::executor
