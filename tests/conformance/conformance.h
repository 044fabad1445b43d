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
//
// TRIBUTARY_CONFORMANCE puts the replicas on CPU devices (CPU:0, CPU:1, ...);
// TRIBUTARY_CONFORMANCE_GPU runs the same cases on GPU devices (GPU:0, GPU:1, ...), with inputs
// written to host shadows, uploaded to the device buffers before the collective and the results
// downloaded before they are checked. A GPU case needs as many visible GPUs as replicas (virtual
// ones count: TRIBUTARY_VIRTUAL_GPUS=N), else it is a visible skip that says so.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "tributary/dtype.h"

namespace tributary::conformance {

// The spec of a GPU instantiation is the backend spec behind this prefix ("gpu|nccl"); the suite
// strips it. Specs without it run on CPU devices.
inline constexpr char kGpuSpecPrefix[] = "gpu|";

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
// trailing static_assert takes the caller's semicolon. The spec is not part of the test names.
#define TRIBUTARY_CONFORMANCE_INSTANTIATE_(name, full_spec)                                  \
  namespace tributary::conformance {                                                         \
  INSTANTIATE_TEST_SUITE_P(name, ReduceConformance,                                          \
                           ::testing::Combine(::testing::Values(full_spec), kOps, kDTypes,   \
                                              kCounts, ::testing::Bool(), kReplicas),        \
                           reduce_param_name);                                               \
  INSTANTIATE_TEST_SUITE_P(name, MoveConformance,                                            \
                           ::testing::Combine(::testing::Values(full_spec), kDTypes, kCounts, \
                                              ::testing::Bool(), kReplicas),                 \
                           move_param_name);                                                 \
  }                                                                                          \
  static_assert(true, "")

// Replicas on CPU devices CPU:0 .. CPU:replicas-1.
#define TRIBUTARY_CONFORMANCE(name, spec) TRIBUTARY_CONFORMANCE_INSTANTIATE_(name, std::string(spec))

// Replicas on GPU devices GPU:0 .. GPU:replicas-1.
#define TRIBUTARY_CONFORMANCE_GPU(name, spec) \
  TRIBUTARY_CONFORMANCE_INSTANTIATE_(         \
      name, std::string(::tributary::conformance::kGpuSpecPrefix) + std::string(spec))
