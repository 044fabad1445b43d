// The conformance suite every CrossDeviceOps backend joins with one line:
//
//   TRIBUTARY_CONFORMANCE(HierarchicalCopyPacked, "hierarchical_copy:num_packs=3");
//
// It runs every collective over op x dtype x size (0, 1, odd, not divisible by the replica count,
// larger than a kernel block) x in-place/out-of-place x replica count (1, 2, 3, 4, 5, 8), with
// results checked exactly on small-integer inputs (whose reductions are exact in every dtype), and
// against a float64 reference on random inputs. A backend that cannot be created here (missing GPU,
// missing library) is a visible skip carrying the reason; an op or dtype the backend does not
// support must be refused with Unimplemented, which the suite checks.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "tributary/dtype.h"

namespace tributary::conformance {

// spec, op, dtype, count, in_place, replicas
using ReduceParam = std::tuple<std::string, ReduceOp, DType, int64_t, bool, int>;
// spec, dtype, count, in_place, replicas
using MoveParam = std::tuple<std::string, DType, int64_t, bool, int>;

class ReduceConformance : public ::testing::TestWithParam<ReduceParam> {};
class MoveConformance : public ::testing::TestWithParam<MoveParam> {};

std::string reduce_param_name(const ::testing::TestParamInfo<ReduceParam>& info);
std::string move_param_name(const ::testing::TestParamInfo<MoveParam>& info);

inline const auto kCounts = ::testing::Values<int64_t>(0, 1, 7, 1001, 70001);
inline const auto kReplicas = ::testing::Values(1, 2, 3, 4, 5, 8);
inline const auto kOps = ::testing::Values(ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin,
                                           ReduceOp::kMax, ReduceOp::kProd);
inline const auto kDTypes = ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                              DType::kBFloat16, DType::kInt32, DType::kInt64,
                                              DType::kInt8, DType::kUInt8);

}  // namespace tributary::conformance

// Opens the suite's namespace (INSTANTIATE_TEST_SUITE_P needs the unqualified fixture names); the
// trailing static_assert takes the caller's semicolon.
#define TRIBUTARY_CONFORMANCE(name, spec)                                                      \
  namespace tributary::conformance {                                                         \
  INSTANTIATE_TEST_SUITE_P(name, ReduceConformance,                                          \
                           ::testing::Combine(::testing::Values(std::string(spec)), kOps,    \
                                              kDTypes, kCounts, ::testing::Bool(), kReplicas), \
                           reduce_param_name);                                               \
  INSTANTIATE_TEST_SUITE_P(name, MoveConformance,                                            \
                           ::testing::Combine(::testing::Values(std::string(spec)), kDTypes, \
                                              kCounts, ::testing::Bool(), kReplicas),        \
                           move_param_name);                                                 \
  }                                                                                          \
  static_assert(true, "")
