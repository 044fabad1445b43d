// Element-wise reduction kernels for host memory: the inner loop of every CPU backend, and the
// float16 / bfloat16 <-> float32 conversions they (and tests) use.
//
// Contract of reduce():
//   dsts[j][i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], for i in [0, count), every j.
//   - Sources are combined left to right (srcs[0] first), so results are deterministic for a given
//     order of sources.
//   - kMean is the sum divided once, at the end, by `mean_divisor` (>= 1). Partial stages of a
//     multi-step algorithm pass kSum and divide only in the last stage. For other ops the divisor
//     is ignored.
//   - Each source byte is read once and each destination byte written once: the kernel works
//     block by block (a few KiB, in stack buffers that stay in L1) and stores each finished block
//     to every destination. On x86-64, outputs of kStreamingStoreMinBytes or more are written with
//     non-temporal stores (then a store fence, before returning), except to a destination that is
//     also a source: its lines were just read into the cache.
//   - On x86-64 the loops exist for x86-64-v3 (AVX2, FMA, F16C) and for the baseline; the CPU
//     picks one at run time. Results do not depend on the choice (NaN payloads aside).
//   - A destination may be exactly one of the sources (in place); any other overlap between a
//     destination and a source or another destination is not allowed. The caller validates this.
//   - Every pointer is aligned to its element size (as any Tensor's data is).
//   - float16 and bfloat16 accumulate in float32 and round once, to nearest even, on store.
//   - Floating-point min/max propagate NaN: if either input is NaN the result is NaN. min(+0, -0)
//     may return either zero.
//   - Integer kSum and kProd wrap modulo 2^bits, as unsigned arithmetic does (never undefined
//     behaviour); integer kMean divides that wrapped sum, read back in the dtype, by the divisor,
//     truncating toward zero as C++ does. This makes a mean computed in one step equal to one
//     computed from wrapped partial sums, whatever the algorithm.
//   - nsrc >= 1, ndst >= 0, count may be 0. The kernel assumes the default floating-point
//     environment (round to nearest, no flush-to-zero of inputs).
// Thread safety: reduce() keeps no state; concurrent calls on disjoint destinations are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "tributary/dtype.h"
#include "tributary/half.h"

namespace tributary::algorithms {

// The size, in bytes, of the accumulation block (per block, the accumulator holds this many bytes).
inline constexpr size_t kReduceBlockBytes = 8192;
// Outputs of at least this many bytes (per destination) are written with non-temporal stores:
// beyond the private caches a normal store first reads the line (a quarter of a 2-source
// reduction's traffic), and an output this large would mostly be evicted before reuse anyway.
inline constexpr size_t kStreamingStoreMinBytes = size_t{8} << 20;

// Elements per accumulation block for `dtype`: kReduceBlockBytes over the accumulator's element
// size (float32 for the half types). Exposed so tests can probe block boundaries.
size_t reduce_block_elements(DType dtype);

void reduce(ReduceOp op, DType dtype, std::span<const void* const> srcs,
            std::span<void* const> dsts, size_t count, int64_t mean_divisor = 1);

// reduce(), with the caller choosing which destinations are written with non-temporal stores (bit
// j for dsts[j]; x86-64 only): for one block of a larger output (parallel.h), whose size alone
// would not tell reduce() to stream.
void reduce_streaming(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                      std::span<void* const> dsts, size_t count, int64_t mean_divisor,
                      uint64_t streaming_mask);

// reduce() without the AVX2/F16C loops that x86-64 CPUs which have them run for float16 and
// bfloat16: the portable loops that other CPUs run, so that tests cover them on any machine.
// Results are bit-identical to reduce() except for NaN payloads. Other dtypes: same as reduce().
void reduce_portable_for_testing(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                                 std::span<void* const> dsts, size_t count,
                                 int64_t mean_divisor = 1);

// The float16 / bfloat16 <-> float32 conversions (round to nearest even, NaN/Inf/subnormals
// handled) that the portable kernels use, defined in the public tributary/half.h.
using ::tributary::bfloat16_to_float;
using ::tributary::float_to_bfloat16;
using ::tributary::float_to_half;
using ::tributary::half_to_float;

}  // namespace tributary::algorithms
