// The two status macros fxdp uses everywhere (abseil 20220623 ships none).
#ifndef FXDP_UTIL_STATUS_MACROS_H_
#define FXDP_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FXDP_CONCAT_INNER_(a, b) a##b
#define FXDP_CONCAT_(a, b) FXDP_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define FXDP_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status fxdp_status_ = (expr);        \
    if (!fxdp_status_.ok()) return fxdp_status_; \
  } while (0)

// `FXDP_ASSIGN_OR_RETURN(auto x, F())` assigns the value of the StatusOr
// F() to `x`, or returns its status from the enclosing function.
#define FXDP_ASSIGN_OR_RETURN(lhs, expr) \
  FXDP_ASSIGN_OR_RETURN_IMPL_(FXDP_CONCAT_(fxdp_statusor_, __LINE__), lhs, expr)
#define FXDP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#endif  // FXDP_UTIL_STATUS_MACROS_H_
