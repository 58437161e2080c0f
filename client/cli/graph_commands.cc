// fxdp graph print|check|roundtrip|parse: work on saved graphs, no server.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "analysis/op_schemas.h"
#include "client/cli/commands.h"

namespace fxdp::cli {
namespace {

constexpr char kGraphUsage[] =
    "usage: fxdp graph <subcommand>\n"
    "\n"
    "  print FILE [--source]  decode and verify a binary GraphDef and print its text form\n"
    "                      (--source: with each node's line of the user's code)\n"
    "  check FILE          decode and verify, check every op and its arguments against\n"
    "                      the schemas of torch 2.13 (what fxdp-worker runs); print a\n"
    "                      one-line summary\n"
    "  roundtrip IN OUT    decode and verify IN, re-encode it to OUT; fails unless\n"
    "                      OUT has exactly the bytes of IN\n"
    "  parse TEXT OUT      parse the text form TEXT, verify it, write binary OUT\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "fxdp graph: %s\n\n%s", msg.c_str(), kGraphUsage);
  return kExitUsage;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

}  // namespace

int ReportError(const std::string& cmd, const absl::Status& status) {
  std::fprintf(stderr, "fxdp %s: %s\n", cmd.c_str(), std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kInternal: return kExitIo;
    default: return kExitInvalidInput;
  }
}

int GraphCommand(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("missing subcommand");
  if (WantsHelp(args)) {
    std::fputs(kGraphUsage, stdout);
    return kExitOk;
  }
  const std::string& sub = args[0];
  const std::string cmd = "graph " + sub;
  auto expect = [&](size_t n) { return args.size() == n + 1; };
  if (sub == "print" || sub == "check") {
    const bool with_source = sub == "print" && args.size() == 3 && args[2] == "--source";
    if (!expect(1) && !with_source) return Usage(sub + " takes one FILE");
    auto g = ir::ReadGraphFile(args[1]);
    if (!g.ok()) return ReportError(cmd, g.status());
    if (sub == "print") {
      std::fputs(ir::PrintGraph(*g, with_source).c_str(), stdout);
    } else {
      if (absl::Status s = CheckOpSchemas(*g); !s.ok()) return ReportError(cmd, s);
      int64_t calls = 0, params = 0, grads = 0;
      for (const ir::Node& n : g->nodes()) {
        calls += n.is_call();
        params += n.is_placeholder() && n.placeholder.role == ir::PlaceholderRole::kParameter;
        grads += !n.grad_of.empty();
      }
      std::printf(
          "%s: ok: %d nodes, %lld calls, %lld parameters, %lld gradients, format %d, "
          "torch %s\n",
          args[1].c_str(), g->size(), static_cast<long long>(calls), static_cast<long long>(params),
          static_cast<long long>(grads), g->header().format_version,
          g->header().torch_version.c_str());
    }
    return kExitOk;
  }
  if (sub == "roundtrip") {
    if (!expect(2)) return Usage("roundtrip takes IN and OUT");
    auto bytes = ir::ReadFileBytes(args[1]);
    if (!bytes.ok()) return ReportError(cmd, bytes.status());
    auto g = ir::DecodeGraphBytes(*bytes);
    if (!g.ok()) return ReportError(cmd, g.status());
    if (absl::Status s = ir::WriteGraphFile(*g, args[2]); !s.ok()) return ReportError(cmd, s);
    const std::string again = ir::EncodeGraphBytes(*g);
    if (again != *bytes) {
      size_t at = 0;
      while (at < again.size() && at < bytes->size() && again[at] == (*bytes)[at]) ++at;
      return ReportError(
          cmd, absl::DataLossError(absl::StrCat("re-encoding ", args[1], " gave ", again.size(),
                                                " bytes instead of ", bytes->size(),
                                                "; first difference at byte ", at)));
    }
    return kExitOk;
  }
  if (sub == "parse") {
    if (!expect(2)) return Usage("parse takes TEXT and OUT");
    auto text = ir::ReadFileBytes(args[1]);
    if (!text.ok()) return ReportError(cmd, text.status());
    auto g = ir::ParseGraphText(*text);
    if (!g.ok())
      return ReportError(
          cmd, absl::InvalidArgumentError(absl::StrCat(args[1], ": ", g.status().message())));
    if (absl::Status s = ir::WriteGraphFile(*g, args[2]); !s.ok()) return ReportError(cmd, s);
    return kExitOk;
  }
  return Usage("unknown subcommand '" + sub + "'");
}

}  // namespace fxdp::cli
