// Helpers shared by the C++ tests: testdata paths and status matchers.
#ifndef FXDP_TESTS_TEST_UTIL_H_
#define FXDP_TESTS_TEST_UTIL_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fxdp::testing {

// The hand-written golden graphs in tests/testdata/ (text form).
inline constexpr const char* kGoldenGraphs[] = {"mlp_sgd.txt", "mlp_sgd_hyper.txt",
                                                "batchnorm_getitem.txt", "foreach_adam_like.txt"};

inline std::string TestDataPath(const std::string& name) {
  return std::string(FXDP_SOURCE_DIR) + "/tests/testdata/" + name;
}

inline std::string ReadTestData(const std::string& name) {
  std::ifstream f(TestDataPath(name), std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing testdata " << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <typename T>
T ValueOrDie(absl::StatusOr<T> s) {
  if (!s.ok()) {
    ADD_FAILURE() << s.status();
    std::abort();
  }
  return *std::move(s);
}

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// A Status, or a StatusOr's status, with `code` and a message containing `substr`.
MATCHER_P2(StatusIs, code, substr,
           std::string("status ") + absl::StatusCodeToString(code) + " with message containing '" +
               std::string(substr) + "'") {
  const absl::Status& s = StatusOf(arg);
  *result_listener << "got " << s;
  return s.code() == code && std::string(s.message()).find(substr) != std::string::npos;
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_TEST_UTIL_H_
