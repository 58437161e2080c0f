// libFuzzer target: the text form's parser (analysis/ir/text.h), which
// `fxdp graph parse` and the tests feed with hand-written graphs. A graph it
// accepts must print, parse again to the same graph, and encode to bytes the
// wire decoder accepts as the same graph. Everything else must be a status.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "text_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fxdp::ir::Graph> g = fxdp::ir::ParseGraphText(text);
  if (!g.ok()) return 0;
  const std::string printed = fxdp::ir::PrintGraph(*g);
  absl::StatusOr<fxdp::ir::Graph> again = fxdp::ir::ParseGraphText(printed);
  if (!again.ok()) Fail("printed graph does not parse", again.status().ToString() + "\n" + printed);
  if (!(*again == *g)) Fail("print/parse round trip", "another graph\n" + printed);
  absl::StatusOr<fxdp::ir::Graph> decoded =
      fxdp::ir::DecodeGraphBytes(fxdp::ir::EncodeGraphBytes(*g));
  if (!decoded.ok()) Fail("encoded graph does not decode", decoded.status().ToString());
  if (!(*decoded == *g)) Fail("encode/decode round trip", "another graph");
  return 0;
}
