// Helpers of the interpreter's tests (interpreter_test.cc, interpreter_collectives_test.cc,
// step_runner_test.cc): a graph from its text body, a CPU program, run inputs, a tolerant
// comparison.
#ifndef FXDP_TESTS_EXECUTOR_INTERPRETER_TEST_UTIL_H_
#define FXDP_TESTS_EXECUTOR_INTERPRETER_TEST_UTIL_H_

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "executor/interpreter.h"
#include "tests/test_util.h"

namespace fxdp::executor {

inline ir::Graph Parse(const std::string& body) {
  return ::fxdp::testing::ValueOrDie(ir::ParseGraphText(
      absl::StrCat("graph format=1 producer=\"test\" torch=\"2.13.0\" {\n", body, "}\n")));
}

inline Program LoadCpu(const ir::Graph& g, ProgramOptions o = {}) {
  return ::fxdp::testing::ValueOrDie(Program::Load(g, o));
}

inline std::vector<c10::IValue> Values(std::initializer_list<at::Tensor> ts) {
  std::vector<c10::IValue> v;
  for (const at::Tensor& t : ts) v.emplace_back(t);
  return v;
}

inline void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << what << "\ngot\n"
                                                   << got << "\nwant\n"
                                                   << want;
}

}  // namespace fxdp::executor

#endif  // FXDP_TESTS_EXECUTOR_INTERPRETER_TEST_UTIL_H_
