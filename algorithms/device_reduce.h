// Element-wise reduction kernels for CUDA device memory: reduce()'s contract (reduce_kernels.h) on
// buffers that live on a GPU, enqueued on a CUDA stream. The device counterpart of reduce(), for
// the backends that reduce GPU tensors without NCCL.
//
// This header needs no CUDA toolkit: a stream is a `void*` (a cudaStream_t; nullptr is the legacy
// default stream). algorithms/cuda/device_reduce.cu implements it when tributary is built with
// CUDA, algorithms/no_cuda_device_reduce.cc otherwise (every call then returns kUnimplemented).
//
// Contract of device_reduce(): that of reduce() (reduce_kernels.h), minus the non-temporal stores:
//   dsts[j][i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], for i in [0, count), every j;
//   sources combined left to right; kMean is the sum divided once, at the end, by mean_divisor
//   (>= 1); float16/bfloat16 accumulate in float32 and round to nearest even once on store;
//   integer kSum/kProd wrap modulo 2^bits; integer kMean divides the wrapped sum, read back in the
//   dtype, truncating toward zero; floating min/max propagate NaN; one source (and no division)
//   is a copy. Results equal reduce()'s bit for bit, NaN payloads aside.
//   - Every pointer is device memory that `device` can address (its own, or a peer's with peer
//     access enabled), aligned to its element size. A destination may be exactly one of the
//     sources (in place); no other overlap is allowed.
//   - Work is enqueued on `stream` (a stream of `device`) and the call returns once it is
//     enqueued; the caller synchronizes. The calling thread's current device is restored on return.
//   - nsrc >= 1, ndst >= 0; count 0 (or no destination) enqueues nothing and returns OK.
//   - Errors: kInvalidArgument for bad arguments (no source, a null or misaligned pointer, a mean
//     divisor < 1, a negative device); a CUDA failure keeps the runtime's text and names the call:
//     "device_reduce(sum, float32, 3 sources) on GPU:0: cudaLaunchKernel failed: ...".
//   - Up to kDeviceReduceMaxPointers sources and destinations take one kernel launch. More sources
//     are reduced in a chain of launches that keeps the left-to-right order, through a destination
//     that no later launch reads, else a stream-ordered scratch buffer (cudaMallocAsync); float16
//     and bfloat16 always chain through float32 scratch, so that they still round once. Further
//     destinations are copied from the first one written.
// Thread safety: no state beyond a per-device cache of launch sizes; calls from several threads are
// safe (as CUDA stream use from several threads is).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tributary/status.h"

#if __cplusplus >= 202002L
#include <span>

#include "tributary/dtype.h"
#else
// nvcc compiles algorithms/cuda/device_reduce.cu as C++17 (CMake 3.25 has no CUDA20 for nvcc),
// where dtype.h (which needs <span>) cannot be included: the enums are declared opaque here and
// their enumerators spelled in device_reduce_enums below, which C++20 code checks against dtype.h.
namespace tributary {
enum class DType : uint8_t;
enum class ReduceOp : uint8_t;
}  // namespace tributary
#endif

namespace tributary::algorithms {

// Sources, and destinations, that one kernel launch takes (passed by value as kernel arguments).
inline constexpr size_t kDeviceReduceMaxPointers = 8;

// True when tributary was built with the CUDA kernels.
bool device_kernels_built();

// The definition of device_reduce() below, with the pointer lists as (pointer, size): the entry
// point that C++17 code (device_reduce.cu) can declare and define.
Status device_reduce_n(ReduceOp op, DType dtype, const void* const* srcs, size_t nsrc,
                       void* const* dsts, size_t ndst, size_t count, int64_t mean_divisor,
                       int device, void* stream);

// data[i] = data[i] / divisor, in place, with kMean's rounding rules (floating types divide in
// float32 (the half types too) or float64 and round once; integers truncate toward zero): the
// division of a MEAN computed as a sum and then a division. divisor >= 1; a divisor of 1 enqueues
// nothing. Same errors and stream rules as device_reduce().
Status device_divide(DType dtype, void* data, size_t count, int64_t divisor, int device,
                     void* stream);

#if __cplusplus >= 202002L
// reduce()'s contract (reduce_kernels.h) on CUDA device memory, minus the non-temporal stores:
// dsts[j][i] = srcs[0][i] op ... op srcs[n-1][i]. Every pointer is device memory that device
// `device` can address (its own, or a peer's with peer access enabled). Enqueued on `stream`
// (after cudaSetDevice(device)); returns once enqueued. Errors (a launch failure, no CUDA) are a
// Status naming the call.
inline Status device_reduce(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                            std::span<void* const> dsts, size_t count, int64_t mean_divisor,
                            int device, void* stream) {
  return device_reduce_n(op, dtype, srcs.data(), srcs.size(), dsts.data(), dsts.size(), count,
                         mean_divisor, device, stream);
}
#endif

// The enumerators of DType and ReduceOp, for device_reduce.cu (C++17, without dtype.h).
namespace device_reduce_enums {
inline constexpr DType kFloat32 = static_cast<DType>(0);
inline constexpr DType kFloat64 = static_cast<DType>(1);
inline constexpr DType kFloat16 = static_cast<DType>(2);
inline constexpr DType kBFloat16 = static_cast<DType>(3);
inline constexpr DType kInt32 = static_cast<DType>(4);
inline constexpr DType kInt64 = static_cast<DType>(5);
inline constexpr DType kInt8 = static_cast<DType>(6);
inline constexpr DType kUInt8 = static_cast<DType>(7);
inline constexpr ReduceOp kSum = static_cast<ReduceOp>(0);
inline constexpr ReduceOp kMean = static_cast<ReduceOp>(1);
inline constexpr ReduceOp kMin = static_cast<ReduceOp>(2);
inline constexpr ReduceOp kMax = static_cast<ReduceOp>(3);
inline constexpr ReduceOp kProd = static_cast<ReduceOp>(4);
#if __cplusplus >= 202002L
static_assert(kFloat32 == DType::kFloat32 && kFloat64 == DType::kFloat64 &&
                  kFloat16 == DType::kFloat16 && kBFloat16 == DType::kBFloat16 &&
                  kInt32 == DType::kInt32 && kInt64 == DType::kInt64 && kInt8 == DType::kInt8 &&
                  kUInt8 == DType::kUInt8,
              "device_reduce_enums must spell DType's enumerators (dtype.h)");
static_assert(kSum == ReduceOp::kSum && kMean == ReduceOp::kMean && kMin == ReduceOp::kMin &&
                  kMax == ReduceOp::kMax && kProd == ReduceOp::kProd,
              "device_reduce_enums must spell ReduceOp's enumerators (dtype.h)");
#endif
}  // namespace device_reduce_enums

}  // namespace tributary::algorithms
