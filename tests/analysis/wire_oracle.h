// The oracle of the wire-decoder tests (ir_wire_decoder_test.cc,
// ir_wire_edge_test.cc): the direct decoder (analysis/ir/wire_decoder.h) and
// the protobuf path (parse into a v1::GraphDef, then DecodeGraph) must both
// accept with equal graphs, or both refuse with the same status.
#ifndef FXDP_TESTS_ANALYSIS_WIRE_ORACLE_H_
#define FXDP_TESTS_ANALYSIS_WIRE_ORACLE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "analysis/ir/wire_decoder.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/test_util.h"

namespace fxdp::ir::wire_test {

namespace pb = ::google::protobuf;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::ValueOrDie;

// The oracle's parser logs every string with invalid UTF-8 it meets, and
// thousands of mutated inputs have some: keep the test log readable.
[[maybe_unused]] const pb::LogHandler* const kPreviousLogHandler = pb::SetLogHandler(nullptr);

// ---- The comparison.

inline std::string Hex(const std::string& b, size_t max = 96) {
  std::string out;
  for (size_t i = 0; i < std::min(b.size(), max); ++i)
    absl::StrAppend(&out, absl::Hex(static_cast<uint8_t>(b[i]), absl::kZeroPad2));
  if (b.size() > max) absl::StrAppend(&out, "...");
  return out;
}

struct Tally {
  int cases = 0;
  int accepted = 0;          // both accepted, equal graphs
  int verifier_refused = 0;  // both refused; the direct decoder returned the verifier's status
  int refused = 0;           // both refused; the direct decoder deferred to the protobuf path
  int failures = 0;
};

// Checks that the direct decoder agrees with the protobuf path on `bytes`.
inline void Compare(const std::string& bytes, const std::string& what, Tally* t) {
  ++t->cases;
  const absl::StatusOr<Graph> want = DecodeGraphBytesViaMessage(bytes);
  absl::StatusOr<Graph> fast;
  const bool decided = DecodeGraphWire(bytes, &fast);
  const absl::StatusOr<Graph> got = DecodeGraphBytes(bytes);
  std::string problem;
  if (want.ok()) {
    if (!decided)
      problem = "valid input refused by the direct decoder";
    else if (!fast.ok())
      problem = absl::StrCat("direct decoder: ", fast.status().ToString());
    else if (!(*fast == *want))
      problem = "direct decoder built a different graph";
    else if (!got.ok() || !(*got == *want))
      problem = "DecodeGraphBytes differs";
    else
      ++t->accepted;
  } else {
    if (decided && fast.status() != want.status())
      problem = absl::StrCat("direct decoder: ",
                             fast.ok() ? std::string("accepted") : fast.status().ToString());
    else if (got.status() != want.status())
      problem = absl::StrCat("DecodeGraphBytes: ",
                             got.ok() ? std::string("accepted") : got.status().ToString());
    else if (decided)
      ++t->verifier_refused;
    else
      ++t->refused;
  }
  if (!problem.empty()) {
    ++t->failures;
    if (t->failures <= 5)
      ADD_FAILURE() << what << ": " << problem << "\n  protobuf path: "
                    << (want.ok() ? std::string("OK") : want.status().ToString()) << "\n  bytes ("
                    << bytes.size() << "): " << Hex(bytes);
  }
}

inline std::vector<std::string> GoldenEncodings() {
  std::vector<std::string> out;
  for (const char* name : ::fxdp::testing::kGoldenGraphs)
    out.push_back(EncodeGraphBytes(ValueOrDie(ParseGraphText(ReadTestData(name)))));
  return out;
}

}  // namespace fxdp::ir::wire_test

#endif  // FXDP_TESTS_ANALYSIS_WIRE_ORACLE_H_
