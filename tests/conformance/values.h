// Inputs and expected results shared by the conformance suites: small integers whose reductions are
// exact in every dtype and any order, and the float64 reference rounded as a backend must round.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "tributary/dtype.h"

namespace tributary::conformance {

// The value global replica `replica` holds at element `i` for `op`.
inline double exact_value(ReduceOp op, int replica, int64_t i) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return static_cast<double>((i * 7 + replica * 3) % 5);
    case ReduceOp::kMin:
    case ReduceOp::kMax: return static_cast<double>((i * 5 + replica * 7) % 11);
    case ReduceOp::kProd: return (i + replica) % 4 == 0 ? 2.0 : 1.0;
  }
  return 0;
}

// The reduction of `xs` in float64, rounded to `t` (integer MEAN truncates).
inline double reference(ReduceOp op, DType t, const std::vector<double>& xs) {
  double acc = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: acc += xs[k]; break;
      case ReduceOp::kMin: acc = std::min(acc, xs[k]); break;
      case ReduceOp::kMax: acc = std::max(acc, xs[k]); break;
      case ReduceOp::kProd: acc *= xs[k]; break;
    }
  }
  if (op == ReduceOp::kMean) {
    acc /= static_cast<double>(xs.size());
    if (!dtype_is_floating(t)) acc = std::trunc(acc);
  }
  return dtype_round(t, acc);
}

// The expected all-reduce result at element i over `n` global replicas.
inline double expected_at(ReduceOp op, DType t, int n, int64_t i) {
  std::vector<double> xs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i);
  return reference(op, t, xs);
}

}  // namespace tributary::conformance
