// Status propagation macros. Debian's Abseil (20220623) ships no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so they are defined once here.
#ifndef PSTRAIN_COMMON_BASE_STATUS_MACROS_H_
#define PSTRAIN_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PSTRAIN_CONCAT_INNER_(a, b) a##b
#define PSTRAIN_CONCAT_(a, b) PSTRAIN_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status pstrain_status_ = (expr);           \
    if (!pstrain_status_.ok()) return pstrain_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())`: assigns the value of a StatusOr, or returns
// its error status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr) \
  PSTRAIN_ASSIGN_OR_RETURN_IMPL_(PSTRAIN_CONCAT_(pstrain_statusor_, __LINE__), lhs, expr)

#define PSTRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return statusor.status();             \
  lhs = std::move(statusor).value()

#endif  // PSTRAIN_COMMON_BASE_STATUS_MACROS_H_
