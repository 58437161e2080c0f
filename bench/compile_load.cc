// fxdp_compile_load: a closed-loop load generator for fxdp-server's
// CompileService (proto/fxdp/v1/compile.proto), through the generated gRPC
// stubs (bench/README.md, area 4 and "The programs").
//
//   fxdp_compile_load --server=HOST:PORT --graph=PATH [--rpc=analyze|expand]
//       [--clients=1] [--duration_s=2] [--world_size=2] [--json=OUT]
//     N client threads, each with its own channel (its own TCP connection:
//     a local subchannel pool), send the same request back to back for
//     --duration_s after one untimed warm-up call each (which also fills the
//     server's compile cache, when it has one), and record every call's
//     latency. Prints (or writes) JSON: requests, errors, qps, latency
//     p50/p90/p99/max/mean in ms, and the fraction of answers that came from
//     the cache (the response's `cached`).
//   fxdp_compile_load --inprocess --graph=PATH [--rpc=...] [--duration_s=2]
//       [--world_size=2] [--json=OUT]
//     the floor: the same request computed in this process by the library
//     calls behind the RPCs (server/compile/compile_service.h RunAnalyze/RunExpand:
//     decode, analysis, expansion, building the response), one thread, no
//     gRPC, no cache.
//
// Exit codes: 0 ok, 1 a failed setup or any failed call, 2 usage.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "analysis/ir/proto_codec.h"
#include "proto/fxdp/v1/compile.grpc.pb.h"
#include "server/compile/compile_service.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "fxdp_compile_load: %s\n", what.c_str());
  return 1;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank.
  size_t k = static_cast<size_t>(p / 100.0 * static_cast<double>(sorted.size()) + 0.999999);
  if (k < 1) k = 1;
  if (k > sorted.size()) k = sorted.size();
  return sorted[k - 1];
}

struct ClientResult {
  std::vector<double> ms;
  int64_t errors = 0;
  int64_t cached = 0;
  std::string first_error;
};

// One call of `rpc`; true on success, `cached` set from the response.
bool Call(fxdp::v1::CompileService::Stub* stub, bool expand, const fxdp::v1::AnalyzeRequest& ar,
          const fxdp::v1::ExpandRequest& er, bool* cached, std::string* error) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  grpc::Status s;
  if (expand) {
    fxdp::v1::ExpandResponse r;
    s = stub->Expand(&ctx, er, &r);
    *cached = r.cached();
  } else {
    fxdp::v1::AnalyzeResponse r;
    s = stub->Analyze(&ctx, ar, &r);
    *cached = r.cached();
  }
  if (!s.ok()) *error = std::to_string(s.error_code()) + ": " + s.error_message();
  return s.ok();
}

struct Args {
  std::string server, graph_path, rpc = "analyze", json_path;
  int64_t clients = 1, world = 2;
  double duration_s = 2;
  bool inprocess = false;
};

// The command line into `a`: 0, or 2 after a usage message.
int ParseArgs(int argc, char** argv, Args* a) {
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--server", &a->server) || Flag(argv[i], "--graph", &a->graph_path) ||
        Flag(argv[i], "--rpc", &a->rpc) || Flag(argv[i], "--json", &a->json_path)) {
      continue;
    }
    if (std::strcmp(argv[i], "--inprocess") == 0) {
      a->inprocess = true;
    } else if (Flag(argv[i], "--clients", &v)) {
      if (!absl::SimpleAtoi(v, &a->clients) || a->clients < 1 || a->clients > 1024) {
        std::fprintf(stderr, "--clients needs 1..1024\n");
        return 2;
      }
    } else if (Flag(argv[i], "--world_size", &v)) {
      if (!absl::SimpleAtoi(v, &a->world) || a->world < 1) {
        std::fprintf(stderr, "--world_size needs >= 1\n");
        return 2;
      }
    } else if (Flag(argv[i], "--duration_s", &v)) {
      if (!absl::SimpleAtod(v, &a->duration_s) || a->duration_s <= 0) {
        std::fprintf(stderr, "--duration_s needs a positive number\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: fxdp_compile_load --server=HOST:PORT --graph=PATH "
                   "[--rpc=analyze|expand] [--clients=N] [--duration_s=S] [--world_size=W] "
                   "[--json=OUT]\n"
                   "       fxdp_compile_load --inprocess --graph=PATH [--rpc=...] "
                   "[--duration_s=S] [--world_size=W] [--json=OUT]\n");
      return 2;
    }
  }
  if (a->rpc != "analyze" && a->rpc != "expand") {
    std::fprintf(stderr, "--rpc must be analyze or expand\n");
    return 2;
  }
  if (a->graph_path.empty() || (!a->inprocess && a->server.empty())) {
    std::fprintf(stderr, "--graph and --server (or --inprocess) are needed\n");
    return 2;
  }
  return 0;
}

// The same request for either RPC.
struct Requests {
  bool expand = false;
  fxdp::v1::AnalyzeRequest ar;
  fxdp::v1::ExpandRequest er;
};

// --inprocess: one untimed warm-up call, then back to back for the duration.
// The seconds the timed calls took, or the first failure.
absl::StatusOr<double> RunInProcess(const Args& a, const Requests& q, ClientResult& r) {
  double elapsed_s = 0;
  for (int warm = 1; warm >= 0; --warm) {
    const Clock::time_point start = Clock::now();
    const Clock::time_point end =
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(warm ? 0.0 : a.duration_s));
    do {
      const Clock::time_point t0 = Clock::now();
      absl::Status s = q.expand ? fxdp::server::RunExpand(q.er).status()
                                : fxdp::server::RunAnalyze(q.ar).status();
      const double ms = Ms(Clock::now() - t0);
      if (!s.ok()) return absl::InternalError(s.ToString());  // printed whole
      if (!warm) r.ms.push_back(ms);
    } while (Clock::now() < end);
    if (!warm) elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed_s;
}

// A stub per client, each on its own connection, each warmed up by one call
// (in turn: the first fills the cache).
absl::StatusOr<std::vector<std::unique_ptr<fxdp::v1::CompileService::Stub>>> ConnectClients(
    const Args& a, const Requests& q) {
  std::vector<std::unique_ptr<fxdp::v1::CompileService::Stub>> stubs;
  for (int64_t c = 0; c < a.clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per client
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto channel = grpc::CreateCustomChannel(a.server, grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      return absl::UnavailableError("cannot connect to " + a.server);
    }
    stubs.push_back(fxdp::v1::CompileService::NewStub(channel));
  }
  for (auto& stub : stubs) {
    bool cached = false;
    std::string error;
    if (!Call(stub.get(), q.expand, q.ar, q.er, &cached, &error))
      return absl::UnknownError("warm-up: " + error);
  }
  return stubs;
}

// The clients' threads, started together, each calling back to back for the
// duration. The seconds they ran, or a failure to connect or warm up.
absl::StatusOr<double> RunClients(const Args& a, const Requests& q,
                                  std::vector<ClientResult>& results) {
  auto stubs = ConnectClients(a, q);
  if (!stubs.ok()) return stubs.status();
  std::atomic<int64_t> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start, end;
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < a.clients; ++c) {
    threads.emplace_back([&, c] {
      ClientResult& r = results[static_cast<size_t>(c)];
      r.ms.reserve(4096);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (Clock::now() < end) {
        bool cached = false;
        std::string error;
        const Clock::time_point t0 = Clock::now();
        const bool ok =
            Call((*stubs)[static_cast<size_t>(c)].get(), q.expand, q.ar, q.er, &cached, &error);
        const double ms = Ms(Clock::now() - t0);
        if (!ok) {
          if (r.errors++ == 0) r.first_error = error;
          continue;
        }
        r.ms.push_back(ms);
        r.cached += cached ? 1 : 0;
      }
    });
  }
  while (ready.load() < a.clients) std::this_thread::yield();
  start = Clock::now();
  end = start +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.duration_s));
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The run's one JSON line; `errors` and `first_error` summed over the clients.
std::string SummaryJson(const Args& a, const Requests& q, size_t request_bytes, double elapsed_s,
                        const std::vector<ClientResult>& results, int64_t* errors,
                        std::string* first_error) {
  std::vector<double> all;
  int64_t cached = 0;
  for (const ClientResult& r : results) {
    all.insert(all.end(), r.ms.begin(), r.ms.end());
    *errors += r.errors;
    cached += r.cached;
    if (first_error->empty()) *first_error = r.first_error;
  }
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (double x : all) sum += x;
  const double n = static_cast<double>(all.size());
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"mode\": \"%s\", \"rpc\": \"%s\", \"clients\": %lld, \"world_size\": %lld, "
                "\"graph_nodes\": %d, \"request_bytes\": %zu, \"duration_s\": %.3f, "
                "\"requests\": %zu, \"errors\": %lld, \"qps\": %.2f, \"p50_ms\": %.4f, "
                "\"p90_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f, \"mean_ms\": %.4f, "
                "\"cached_fraction\": %.4f}\n",
                a.inprocess ? "inprocess" : "grpc", a.rpc.c_str(),
                static_cast<long long>(a.inprocess ? 1 : a.clients),
                static_cast<long long>(a.world), q.ar.graph().nodes_size(), request_bytes,
                elapsed_s, all.size(), static_cast<long long>(*errors),
                elapsed_s > 0 ? n / elapsed_s : 0.0, Percentile(all, 50), Percentile(all, 90),
                Percentile(all, 99), all.empty() ? 0.0 : all.back(), n > 0 ? sum / n : 0.0,
                n > 0 ? static_cast<double>(cached) / n : 0.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = ParseArgs(argc, argv, &a); rc != 0) return rc;
  absl::StatusOr<std::string> bytes = fxdp::ir::ReadFileBytes(a.graph_path);
  if (!bytes.ok()) return Fail(bytes.status().ToString());
  Requests q;
  q.expand = a.rpc == "expand";
  if (!q.ar.mutable_graph()->ParseFromString(*bytes)) return Fail("cannot parse " + a.graph_path);
  q.ar.set_world_size(static_cast<int32_t>(a.world));
  *q.er.mutable_graph() = q.ar.graph();
  q.er.set_world_size(static_cast<int32_t>(a.world));

  std::vector<ClientResult> results(static_cast<size_t>(a.inprocess ? 1 : a.clients));
  absl::StatusOr<double> elapsed_s =
      a.inprocess ? RunInProcess(a, q, results[0]) : RunClients(a, q, results);
  if (!elapsed_s.ok()) return Fail(std::string(elapsed_s.status().message()));
  int64_t errors = 0;
  std::string first_error;
  const std::string json =
      SummaryJson(a, q, bytes->size(), *elapsed_s, results, &errors, &first_error);
  if (a.json_path.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::ofstream f(a.json_path);
    f << json;
    if (!f.good()) return Fail("cannot write " + a.json_path);
  }
  if (errors > 0) return Fail(std::to_string(errors) + " calls failed, first: " + first_error);
  return 0;
}
