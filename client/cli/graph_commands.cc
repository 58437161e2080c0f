// fxdp graph print|check|roundtrip|parse|instantiate: work on saved graphs, no server.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/instantiate.h"
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
    "  parse TEXT OUT      parse the text form TEXT, verify it, write binary OUT\n"
    "  instantiate IN OUT --shape NAME=AxB ...\n"
    "                      a graph traced with symbolic sizes at these input shapes (one\n"
    "                      --shape per batch input; docs/shapes.md): its guards checked,\n"
    "                      the static graph written to OUT (what fxdp-worker run takes)\n"
    "\n"
    "print and check take --shape too: a symbolic graph is instantiated first.\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "fxdp graph: %s\n\n%s", msg.c_str(), kGraphUsage);
  return kExitUsage;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// Takes every "--shape NAME=AxB" out of *args into *shapes: -1, or the exit code.
int TakeShapes(std::vector<std::string>* args, ir::InputShapes* shapes) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a != "--shape" && a.rfind("--shape=", 0) != 0) {
      rest.push_back(a);
      continue;
    }
    std::string text = a.size() > 8 ? a.substr(8) : "";
    if (a == "--shape") {
      if (i + 1 == args->size()) return Usage("--shape needs NAME=AxB");
      text = (*args)[++i];
    }
    if (absl::Status s = ir::ParseInputShape(text, shapes); !s.ok())
      return Usage(absl::StrCat("--shape: ", s.message()));
  }
  *args = std::move(rest);
  return -1;
}

int PrintOrCheck(const std::string& cmd, const std::vector<std::string>& args,
                 const ir::InputShapes& shapes) {
  const bool print = args[0] == "print";
  const bool with_source = print && args.size() == 3 && args[2] == "--source";
  if (args.size() != 2 && !with_source) return Usage(args[0] + " takes one FILE");
  auto g = ir::ReadGraphFileAt(args[1], shapes);
  if (!g.ok()) return ReportError(cmd, g.status());
  if (print) {
    std::fputs(ir::PrintGraph(*g, with_source).c_str(), stdout);
    return kExitOk;
  }
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
      static_cast<long long>(grads), g->header().format_version, g->header().torch_version.c_str());
  return kExitOk;
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

int GraphCommand(const std::vector<std::string>& given) {
  if (given.empty()) return Usage("missing subcommand");
  if (WantsHelp(given)) {
    std::fputs(kGraphUsage, stdout);
    return kExitOk;
  }
  std::vector<std::string> args = given;
  ir::InputShapes shapes;
  if (int rc = TakeShapes(&args, &shapes); rc >= 0) return rc;
  const std::string& sub = args[0];
  const std::string cmd = "graph " + sub;
  auto expect = [&](size_t n) { return args.size() == n + 1; };
  if (!shapes.empty() && sub != "print" && sub != "check" && sub != "instantiate")
    return Usage(sub + " takes no --shape");
  if (sub == "print" || sub == "check") return PrintOrCheck(cmd, args, shapes);
  if (sub == "instantiate") {
    if (!expect(2)) return Usage("instantiate takes IN and OUT");
    auto g = ir::ReadGraphFileAt(args[1], shapes);
    if (!g.ok()) return ReportError(cmd, g.status());
    if (absl::Status s = ir::WriteGraphFile(*g, args[2]); !s.ok()) return ReportError(cmd, s);
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
