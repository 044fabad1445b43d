#include "algorithms/reduce_kernels.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tributary::algorithms {
namespace {

#if defined(__GNUC__)
#define TRIBUTARY_ALWAYS_INLINE inline __attribute__((always_inline))
#define TRIBUTARY_RESTRICT __restrict
#else
#define TRIBUTARY_ALWAYS_INLINE inline
#define TRIBUTARY_RESTRICT
#endif

// One dispatcher per dtype is compiled twice on x86-64: for x86-64-v3 (AVX2, FMA, F16C) and for
// the baseline; the loader picks one (ifunc) on first call. Everything below the dispatchers is
// always_inline, so it is compiled once per clone, and the per-call cost is one indirect call.
// Not under ThreadSanitizer: the loader runs ifunc resolvers before TSan's runtime is up, and an
// instrumented resolver then crashes the process at start.
#if defined(__SANITIZE_THREAD__)
#define TRIBUTARY_NO_KERNEL_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRIBUTARY_NO_KERNEL_CLONES 1
#endif
#endif
#if defined(TRIBUTARY_NO_KERNEL_CLONES)
#define TRIBUTARY_KERNEL_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRIBUTARY_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__clang__) && __clang_major__ >= 14
#define TRIBUTARY_KERNEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TRIBUTARY_KERNEL_CLONES
#endif

bool mask_bit(uint64_t mask, size_t j) { return j < 64 && ((mask >> j) & 1) != 0; }

struct Args {
  const void* const* srcs;
  size_t nsrc;
  void* const* dsts;
  size_t ndst;
  size_t count;
  int64_t mean_divisor;
  bool mean;  // divide the sum by mean_divisor
  // Bit j: write dsts[j] with non-temporal stores (large outputs that are not also a source).
  uint64_t streaming_mask;
  // With one or two sources, the block is computed straight into dsts[0] (which is then the
  // source of the copies to the other destinations) instead of into an L1 block that is copied to
  // every destination: one store pass less. Set when dsts[0] is cached (not streaming) and is
  // either exactly one of the sources or overlaps none of them.
  bool direct;

  bool streams(size_t j) const { return mask_bit(streaming_mask, j); }
};

// ---- storing a finished block -------------------------------------------------------------------

// Copies `bytes` from an L1-resident block to a destination. Non-temporal stores skip the read
// for ownership that a normal store of a cold line costs, which is a quarter of the memory traffic
// of a 2-source reduction; they are used only for outputs too large to stay in the caches anyway.
TRIBUTARY_ALWAYS_INLINE void store_block(void* dst, const void* src, size_t bytes, bool streaming) {
#if defined(__x86_64__)
  if (streaming) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = std::min(bytes, (size_t{0} - reinterpret_cast<uintptr_t>(d)) & 15);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), v0);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), v1);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), v2);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), v3);
    }
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    }
    std::memcpy(d, s, bytes);
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(dst, src, bytes);
}

// Orders the non-temporal stores before whatever the caller does next (e.g. release a lock).
void finish_streaming(bool streaming) {
#if defined(__x86_64__)
  if (streaming) _mm_sfence();
#else
  (void)streaming;
#endif
}

// ---- element conversions and operators ----------------------------------------------------------

// Storage <-> accumulator conversion for a dtype.
template <typename Storage, typename Acc>
struct Plain {
  static Acc load(Storage v) { return static_cast<Acc>(v); }
  static Storage store(Acc v) { return static_cast<Storage>(v); }
};
struct Half {
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float v) { return float_to_half(v); }
};
struct BFloat16 {
  static float load(uint16_t v) { return bfloat16_to_float(v); }
  static uint16_t store(float v) { return float_to_bfloat16(v); }
};

// Integer sums and products are computed in the unsigned type of the same width (wrapping is
// defined there); static_cast narrows the int that small unsigned types promote to.
struct SumOp {
  static constexpr bool kIsSum = true;
  template <typename A>
  static A apply(A a, A b) {
    return static_cast<A>(a + b);
  }
};
struct ProdOp {
  static constexpr bool kIsSum = false;
  template <typename A>
  static A apply(A a, A b) {
    return static_cast<A>(a * b);
  }
};
// Floating-point min/max return `a` when `a` is NaN and `b` when `b` is NaN (the comparison is
// false), so a NaN in any source reaches the result. The selects vectorise to compare + blend.
struct MinOp {
  static constexpr bool kIsSum = false;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      return (a != a || a < b) ? a : b;
    } else {
      return b < a ? b : a;
    }
  }
};
struct MaxOp {
  static constexpr bool kIsSum = false;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      return (a != a || a > b) ? a : b;
    } else {
      return b > a ? b : a;
    }
  }
};

// ---- block loops --------------------------------------------------------------------------------
// Simple loops over one block with restrict pointers: the shape GCC's vectoriser handles best. The
// last pass over a block also divides (kMean) and converts to the storage type, so a block of a
// 2-source reduction is touched once in L1 after its sources are read.

// The mean's single division, fused into the last pass.
template <bool kMean, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE A finish(A v, int64_t divisor) {
  if constexpr (!kMean) {
    return v;
  } else if constexpr (std::is_floating_point_v<A>) {
    return v / static_cast<A>(divisor);
  } else if constexpr (sizeof(S) == 8) {
    // The wrapped sum, read back in the (signed or not) storage type, truncated toward zero.
    return static_cast<A>(static_cast<int64_t>(static_cast<S>(v)) / divisor);
  } else {
    // The same quotient through floating point, which vectorises (SIMD has no integer division).
    // Exact: |x| < 2^p (p: F's significand bits), so the rounded quotient is within
    // |x/d| 2^-p < 1/d of x/d, and a non-integer x/d is at least 1/d from any integer: the
    // truncations agree. (A divisor that F rounds is larger than |x|: the quotient is 0 either
    // way.)
    using F = std::conditional_t<sizeof(S) == 1, float, double>;
    return static_cast<A>(
        static_cast<S>(static_cast<F>(static_cast<S>(v)) / static_cast<F>(divisor)));
  }
}

// Writes an accumulator value as O: the storage type (converting) or the accumulator itself.
template <typename Conv, typename O, typename A>
TRIBUTARY_ALWAYS_INLINE O emit(A v) {
  if constexpr (std::is_same_v<O, A>) {
    return v;
  } else {
    return Conv::store(v);
  }
}

template <typename Conv, typename Op, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE void first_pair(A* TRIBUTARY_RESTRICT acc, const S* TRIBUTARY_RESTRICT a,
                                        const S* TRIBUTARY_RESTRICT b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(Conv::load(a[i]), Conv::load(b[i]));
}

// Two sources per pass halve the accumulator traffic; the order of operations is unchanged.
template <typename Conv, typename Op, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE void accumulate_pair(A* TRIBUTARY_RESTRICT acc,
                                             const S* TRIBUTARY_RESTRICT a,
                                             const S* TRIBUTARY_RESTRICT b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    acc[i] = Op::apply(Op::apply(acc[i], Conv::load(a[i])), Conv::load(b[i]));
  }
}

template <typename Conv, typename Op, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE void accumulate_one(A* TRIBUTARY_RESTRICT acc,
                                            const S* TRIBUTARY_RESTRICT a, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], Conv::load(a[i]));
}

// The element loops of the direct path: `out` is a destination that may be one of the sources
// itself (in place), at the same index only, so no iteration depends on another's store.
#if defined(__clang__)
#define TRIBUTARY_SAME_INDEX_ALIASING _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define TRIBUTARY_SAME_INDEX_ALIASING _Pragma("GCC ivdep")
#else
#define TRIBUTARY_SAME_INDEX_ALIASING
#endif

template <typename Op, bool kMean, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE void direct_from_one(A* out, const S* a, size_t n, int64_t divisor) {
  TRIBUTARY_SAME_INDEX_ALIASING
  for (size_t i = 0; i < n; ++i) out[i] = finish<kMean, S>(static_cast<A>(a[i]), divisor);
}

template <typename Op, bool kMean, typename S, typename A>
TRIBUTARY_ALWAYS_INLINE void direct_from_pair(A* out, const S* a, const S* b, size_t n,
                                              int64_t divisor) {
  TRIBUTARY_SAME_INDEX_ALIASING
  for (size_t i = 0; i < n; ++i) {
    out[i] = finish<kMean, S>(Op::apply(static_cast<A>(a[i]), static_cast<A>(b[i])), divisor);
  }
}

// Final passes: out[i] = finish(...). When O is the accumulator type, `out` is the accumulator
// itself and only `acc` is touched, so that no two restrict pointers name the same memory.
template <typename Conv, bool kMean, typename S, typename A, typename O>
TRIBUTARY_ALWAYS_INLINE void final_from_one(O* TRIBUTARY_RESTRICT out,
                                            const S* TRIBUTARY_RESTRICT a, size_t n,
                                            int64_t divisor) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = emit<Conv, O>(finish<kMean, S>(static_cast<A>(Conv::load(a[i])), divisor));
  }
}

template <typename Conv, typename Op, bool kMean, typename S, typename A, typename O>
TRIBUTARY_ALWAYS_INLINE void final_from_pair(O* TRIBUTARY_RESTRICT out,
                                             const S* TRIBUTARY_RESTRICT a,
                                             const S* TRIBUTARY_RESTRICT b, size_t n,
                                             int64_t divisor) {
  for (size_t i = 0; i < n; ++i) {
    const A v = Op::apply(static_cast<A>(Conv::load(a[i])), static_cast<A>(Conv::load(b[i])));
    out[i] = emit<Conv, O>(finish<kMean, S>(v, divisor));
  }
}

template <typename Conv, typename Op, bool kMean, typename S, typename A, typename O>
TRIBUTARY_ALWAYS_INLINE void final_acc_one(O* TRIBUTARY_RESTRICT out, A* TRIBUTARY_RESTRICT acc,
                                           const S* TRIBUTARY_RESTRICT a, size_t n,
                                           int64_t divisor) {
  if constexpr (std::is_same_v<O, A>) {
    for (size_t i = 0; i < n; ++i) {
      acc[i] = finish<kMean, S>(Op::apply(acc[i], static_cast<A>(Conv::load(a[i]))), divisor);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const A v = Op::apply(acc[i], static_cast<A>(Conv::load(a[i])));
      out[i] = emit<Conv, O>(finish<kMean, S>(v, divisor));
    }
  }
}

template <typename Conv, typename Op, bool kMean, typename S, typename A, typename O>
TRIBUTARY_ALWAYS_INLINE void final_acc_pair(O* TRIBUTARY_RESTRICT out, A* TRIBUTARY_RESTRICT acc,
                                            const S* TRIBUTARY_RESTRICT a,
                                            const S* TRIBUTARY_RESTRICT b, size_t n,
                                            int64_t divisor) {
  if constexpr (std::is_same_v<O, A>) {
    for (size_t i = 0; i < n; ++i) {
      const A v = Op::apply(Op::apply(acc[i], static_cast<A>(Conv::load(a[i]))),
                            static_cast<A>(Conv::load(b[i])));
      acc[i] = finish<kMean, S>(v, divisor);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const A v = Op::apply(Op::apply(acc[i], static_cast<A>(Conv::load(a[i]))),
                            static_cast<A>(Conv::load(b[i])));
      out[i] = emit<Conv, O>(finish<kMean, S>(v, divisor));
    }
  }
}

// The block-wise reduction for storage type S and accumulator type A. `acc` holds
// kReduceBlockBytes / sizeof(A) elements and `out` as many S; when S and A share a representation
// (float/float, int32/uint32) the block is finished in `acc` and `out` is unused.
template <typename S, typename A, typename Conv, typename Op, bool kMean>
TRIBUTARY_ALWAYS_INLINE void reduce_blocks(const Args& args, A* acc, S* out) {
  constexpr size_t kBlock = kReduceBlockBytes / sizeof(A);
  constexpr bool kSameBytes =
      sizeof(S) == sizeof(A) && std::is_integral_v<S> == std::is_integral_v<A>;
  using O = std::conditional_t<kSameBytes, A, S>;
  O* result;
  if constexpr (kSameBytes) {
    result = acc;
  } else {
    result = out;
  }
  const auto* const* srcs = reinterpret_cast<const S* const*>(args.srcs);
  const size_t nsrc = args.nsrc;
  const int64_t divisor = args.mean_divisor;
  if constexpr (kSameBytes && std::is_same_v<Conv, Plain<S, A>>) {
    if (args.direct && nsrc <= 2) {
      // S and A share a representation (float/float, int32/uint32), so dsts[0] holds A's.
      A* const first = static_cast<A*>(args.dsts[0]);
      for (size_t base = 0; base < args.count; base += kBlock) {
        const size_t n = std::min(kBlock, args.count - base);
        if (nsrc == 1) {
          direct_from_one<Op, kMean, S, A>(first + base, srcs[0] + base, n, divisor);
        } else {
          direct_from_pair<Op, kMean, S, A>(first + base, srcs[0] + base, srcs[1] + base, n,
                                            divisor);
        }
        for (size_t j = 1; j < args.ndst; ++j) {
          store_block(static_cast<S*>(args.dsts[j]) + base, first + base, n * sizeof(S),
                      args.streams(j));
        }
      }
      return;
    }
  }
  for (size_t base = 0; base < args.count; base += kBlock) {
    const size_t n = std::min(kBlock, args.count - base);
    if (nsrc == 1) {
      final_from_one<Conv, kMean, S, A>(result, srcs[0] + base, n, divisor);
    } else if (nsrc == 2) {
      final_from_pair<Conv, Op, kMean, S, A>(result, srcs[0] + base, srcs[1] + base, n, divisor);
    } else {
      first_pair<Conv, Op>(acc, srcs[0] + base, srcs[1] + base, n);
      size_t k = 2;
      for (; nsrc - k > 2; k += 2) {
        accumulate_pair<Conv, Op>(acc, srcs[k] + base, srcs[k + 1] + base, n);
      }
      if (nsrc - k == 2) {
        final_acc_pair<Conv, Op, kMean>(result, acc, srcs[k] + base, srcs[k + 1] + base, n,
                                        divisor);
      } else {
        final_acc_one<Conv, Op, kMean>(result, acc, srcs[k] + base, n, divisor);
      }
    }
    for (size_t j = 0; j < args.ndst; ++j) {
      store_block(static_cast<S*>(args.dsts[j]) + base, result, n * sizeof(S), args.streams(j));
    }
  }
}

template <typename S, typename A, typename Conv, typename Op>
TRIBUTARY_ALWAYS_INLINE void reduce_blocks_for(const Args& args, A* acc, S* out) {
  if constexpr (Op::kIsSum) {
    if (args.mean) return reduce_blocks<S, A, Conv, Op, true>(args, acc, out);
  }
  reduce_blocks<S, A, Conv, Op, false>(args, acc, out);
}

template <typename S, typename A, typename Conv>
TRIBUTARY_ALWAYS_INLINE void dispatch_float(ReduceOp op, const Args& args, A* acc, S* out) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return reduce_blocks_for<S, A, Conv, SumOp>(args, acc, out);
    case ReduceOp::kProd:
      return reduce_blocks_for<S, A, Conv, ProdOp>(args, acc, out);
    case ReduceOp::kMin:
      return reduce_blocks_for<S, A, Conv, MinOp>(args, acc, out);
    case ReduceOp::kMax:
      return reduce_blocks_for<S, A, Conv, MaxOp>(args, acc, out);
  }
}

// Integers: sum and product wrap in the unsigned type U; min and max compare in T. T and U may
// alias each other, so one accumulator array serves both.
template <typename T>
TRIBUTARY_ALWAYS_INLINE void dispatch_int(ReduceOp op, const Args& args, T* acc) {
  using U = std::make_unsigned_t<T>;
  auto* wrapping = reinterpret_cast<U*>(acc);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return reduce_blocks_for<T, U, Plain<T, U>, SumOp>(args, wrapping, nullptr);
    case ReduceOp::kProd:
      return reduce_blocks_for<T, U, Plain<T, U>, ProdOp>(args, wrapping, nullptr);
    case ReduceOp::kMin:
      return reduce_blocks_for<T, T, Plain<T, T>, MinOp>(args, acc, nullptr);
    case ReduceOp::kMax:
      return reduce_blocks_for<T, T, Plain<T, T>, MaxOp>(args, acc, nullptr);
  }
}

// ---- float16 and bfloat16 with AVX2 -------------------------------------------------------------
// The portable path above converts with integer bit operations and goes through an L1 block per
// pass; for the 2-byte types that arithmetic, not memory, sets the pace (about 40% of memcpy).
// Where the CPU has AVX2 and F16C, these loops keep the running result in registers across all
// sources (the vectoriser cannot, for a run-time number of sources), convert with vcvtph2ps /
// vcvtps2ph or shifts, and store each block once. They are picked at run time.
#if defined(__x86_64__) && defined(__GNUC__)
#define TRIBUTARY_HAVE_AVX2_HALF_PATH 1
#define TRIBUTARY_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

struct Half8 {
  using Scalar = Half;
  TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE static void store(uint16_t* p, __m256 v) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_store_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound));
  }
};

// bfloat16 works on 16 elements as two 8-lane halves in an interleaved order: unpacking with
// zeros puts each value in the high half of a 32-bit lane (a float), and packing the two halves
// back with packus undoes the interleave within each 128-bit lane, so no cross-lane shuffles.
struct BFloat16x16 {
  using Scalar = BFloat16;
  struct Pair {
    __m256 lo, hi;
  };
  TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE static Pair load(const uint16_t* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x))};
  }
  // float_to_bfloat16 on eight lanes, the result in the low 16 bits of each.
  TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE static __m256i round(__m256 v) {
    const __m256i w = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(w, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256i quiet_nan = _mm256_or_si256(w, _mm256_set1_epi32(0x00400000));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet_nan, is_nan), 16);
  }
  TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE static void store(uint16_t* p, Pair v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(p),
                       _mm256_packus_epi32(round(v.lo), round(v.hi)));
  }
};

// The vector form of SumOp, ProdOp, MinOp and MaxOp, with the same NaN rule: minps/maxps return
// their second operand when either is NaN, so a NaN first operand is blended back in.
template <typename Op>
TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE __m256 apply8(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, SumOp>) {
    return _mm256_add_ps(a, b);
  } else if constexpr (std::is_same_v<Op, ProdOp>) {
    return _mm256_mul_ps(a, b);
  } else if constexpr (std::is_same_v<Op, MinOp>) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  } else {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
}

template <typename Op>
TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE BFloat16x16::Pair apply8(BFloat16x16::Pair a,
                                                                       BFloat16x16::Pair b) {
  return {apply8<Op>(a.lo, b.lo), apply8<Op>(a.hi, b.hi)};
}

TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE __m256 divide8(__m256 v, __m256 d) {
  return _mm256_div_ps(v, d);
}
TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE BFloat16x16::Pair divide8(BFloat16x16::Pair v,
                                                                        __m256 d) {
  return {_mm256_div_ps(v.lo, d), _mm256_div_ps(v.hi, d)};
}

// V: Half8 (8 lanes) or BFloat16x16 (16). `out` is a 64-byte aligned block of
// kReduceBlockBytes / 4 elements.
template <typename V, typename Op, bool kMean>
TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE void reduce_half_avx2_blocks(const Args& args,
                                                                           uint16_t* out) {
  using Scalar = typename V::Scalar;
  constexpr size_t kWidth = std::is_same_v<V, Half8> ? 8 : 16;
  constexpr size_t kBlock = kReduceBlockBytes / sizeof(float);
  const auto* const* srcs = reinterpret_cast<const uint16_t* const*>(args.srcs);
  const size_t nsrc = args.nsrc;
  const float divisor = static_cast<float>(args.mean_divisor);
  const __m256 divisor8 = _mm256_set1_ps(divisor);
  for (size_t base = 0; base < args.count; base += kBlock) {
    const size_t n = std::min(kBlock, args.count - base);
    const uint16_t* s0 = srcs[0] + base;
    size_t i = 0;
    if (nsrc == 2) {
      const uint16_t* s1 = srcs[1] + base;
      for (; i + kWidth <= n; i += kWidth) {
        auto v = apply8<Op>(V::load(s0 + i), V::load(s1 + i));
        if constexpr (kMean) v = divide8(v, divisor8);
        V::store(out + i, v);
      }
    } else {
      for (; i + kWidth <= n; i += kWidth) {
        auto v = V::load(s0 + i);
        for (size_t k = 1; k < nsrc; ++k) v = apply8<Op>(v, V::load(srcs[k] + base + i));
        if constexpr (kMean) v = divide8(v, divisor8);
        V::store(out + i, v);
      }
    }
    // The scalar conversions round exactly as the vector ones (NaN payloads aside).
    for (; i < n; ++i) {
      float v = Scalar::load(s0[i]);
      for (size_t k = 1; k < nsrc; ++k) v = Op::apply(v, Scalar::load(srcs[k][base + i]));
      if constexpr (kMean) v = v / divisor;
      out[i] = Scalar::store(v);
    }
    for (size_t j = 0; j < args.ndst; ++j) {
      store_block(static_cast<uint16_t*>(args.dsts[j]) + base, out, n * sizeof(uint16_t),
                  args.streams(j));
    }
  }
}

template <typename V>
TRIBUTARY_AVX2_TARGET TRIBUTARY_ALWAYS_INLINE void dispatch_half_avx2(ReduceOp op,
                                                                      const Args& args) {
  alignas(64) uint16_t out[kReduceBlockBytes / sizeof(float)];
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      if (args.mean) return reduce_half_avx2_blocks<V, SumOp, true>(args, out);
      return reduce_half_avx2_blocks<V, SumOp, false>(args, out);
    case ReduceOp::kProd:
      return reduce_half_avx2_blocks<V, ProdOp, false>(args, out);
    case ReduceOp::kMin:
      return reduce_half_avx2_blocks<V, MinOp, false>(args, out);
    case ReduceOp::kMax:
      return reduce_half_avx2_blocks<V, MaxOp, false>(args, out);
  }
}

TRIBUTARY_AVX2_TARGET void reduce_float16_avx2(ReduceOp op, const Args& args) {
  dispatch_half_avx2<Half8>(op, args);
}

TRIBUTARY_AVX2_TARGET void reduce_bfloat16_avx2(ReduceOp op, const Args& args) {
  dispatch_half_avx2<BFloat16x16>(op, args);
}

bool cpu_has_avx2_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    // __builtin_cpu_supports checks that the OS saves AVX state; F16C is read from CPUID (Clang's
    // builtin does not know "f16c").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif  // x86-64 with GCC or Clang

// ---- per-dtype dispatchers (the multiversioned functions) ---------------------------------------

TRIBUTARY_KERNEL_CLONES void reduce_float32(ReduceOp op, const Args& args) {
  alignas(64) float acc[kReduceBlockBytes / sizeof(float)];
  dispatch_float<float, float, Plain<float, float>>(op, args, acc, static_cast<float*>(nullptr));
}

TRIBUTARY_KERNEL_CLONES void reduce_float64(ReduceOp op, const Args& args) {
  alignas(64) double acc[kReduceBlockBytes / sizeof(double)];
  dispatch_float<double, double, Plain<double, double>>(op, args, acc,
                                                        static_cast<double*>(nullptr));
}

// The portable half paths: baseline code only (x86-64-v3 machines take the AVX2 paths above).
void reduce_float16_portable(ReduceOp op, const Args& args) {
  alignas(64) float acc[kReduceBlockBytes / sizeof(float)];
  alignas(64) uint16_t out[kReduceBlockBytes / sizeof(float)];
  dispatch_float<uint16_t, float, Half>(op, args, acc, out);
}

void reduce_bfloat16_portable(ReduceOp op, const Args& args) {
  alignas(64) float acc[kReduceBlockBytes / sizeof(float)];
  alignas(64) uint16_t out[kReduceBlockBytes / sizeof(float)];
  dispatch_float<uint16_t, float, BFloat16>(op, args, acc, out);
}

void reduce_float16(ReduceOp op, const Args& args) {
#if defined(TRIBUTARY_HAVE_AVX2_HALF_PATH)
  if (cpu_has_avx2_f16c()) return reduce_float16_avx2(op, args);
#endif
  reduce_float16_portable(op, args);
}

void reduce_bfloat16(ReduceOp op, const Args& args) {
#if defined(TRIBUTARY_HAVE_AVX2_HALF_PATH)
  if (cpu_has_avx2_f16c()) return reduce_bfloat16_avx2(op, args);
#endif
  reduce_bfloat16_portable(op, args);
}

TRIBUTARY_KERNEL_CLONES void reduce_int32(ReduceOp op, const Args& args) {
  alignas(64) int32_t acc[kReduceBlockBytes / sizeof(int32_t)];
  dispatch_int<int32_t>(op, args, acc);
}

TRIBUTARY_KERNEL_CLONES void reduce_int64(ReduceOp op, const Args& args) {
  alignas(64) int64_t acc[kReduceBlockBytes / sizeof(int64_t)];
  dispatch_int<int64_t>(op, args, acc);
}

TRIBUTARY_KERNEL_CLONES void reduce_int8(ReduceOp op, const Args& args) {
  alignas(64) int8_t acc[kReduceBlockBytes / sizeof(int8_t)];
  dispatch_int<int8_t>(op, args, acc);
}

TRIBUTARY_KERNEL_CLONES void reduce_uint8(ReduceOp op, const Args& args) {
  alignas(64) uint8_t acc[kReduceBlockBytes / sizeof(uint8_t)];
  dispatch_int<uint8_t>(op, args, acc);
}

// Accumulator element size per dtype (float32 for the half types).
size_t accumulator_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return sizeof(float);
    default:
      return dtype_size(dtype);
  }
}

// `forced`: `forced_mask` says which destinations stream (the caller saw the whole output, of
// which this call is one block).
void reduce_impl(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                 std::span<void* const> dsts, size_t count, int64_t mean_divisor, bool portable,
                 bool forced = false, uint64_t forced_mask = 0) {
  assert(!srcs.empty());
  assert(op != ReduceOp::kMean || mean_divisor >= 1);
  if (count == 0 || dsts.empty() || srcs.empty()) return;
  const size_t elem = dtype_size(dtype);
  const size_t bytes = count * elem;
#ifndef NDEBUG
  for (const void* s : srcs) assert(reinterpret_cast<uintptr_t>(s) % elem == 0);
  for (void* d : dsts) assert(reinterpret_cast<uintptr_t>(d) % elem == 0);
#endif
  const bool mean = op == ReduceOp::kMean && mean_divisor != 1;
  // A destination that is also a source was just read, so its lines are in cache and a normal
  // store costs no extra read; only the others bypass the cache.
  uint64_t streaming_mask = forced ? forced_mask : 0;
  if (!forced && bytes >= kStreamingStoreMinBytes) {
    for (size_t j = 0; j < dsts.size() && j < 64; ++j) {
      if (std::find(srcs.begin(), srcs.end(), dsts[j]) == srcs.end()) {
        streaming_mask |= uint64_t{1} << j;
      }
    }
  }

  if (srcs.size() == 1 && !mean) {
    // Every op of one source is the identity: a copy, skipped where the destination is the source.
    for (size_t j = 0; j < dsts.size(); ++j) {
      if (dsts[j] != srcs[0]) store_block(dsts[j], srcs[0], bytes, mask_bit(streaming_mask, j));
    }
    finish_streaming(streaming_mask != 0);
    return;
  }

  // The direct path (Args::direct): dsts[0] cached, and exactly a source or clear of all of them.
  bool direct = !mask_bit(streaming_mask, 0) && srcs.size() <= 2;
  if (direct) {
    const auto* d = static_cast<const std::byte*>(dsts[0]);
    for (const void* src : srcs) {
      const auto* x = static_cast<const std::byte*>(src);
      if (x != d && x < d + bytes && d < x + bytes) direct = false;
    }
  }
  const Args args{srcs.data(), srcs.size(),  dsts.data(),    dsts.size(),
                  count,       mean_divisor, mean,           streaming_mask,
                  direct};
  switch (dtype) {
    case DType::kFloat32:
      reduce_float32(op, args);
      break;
    case DType::kFloat64:
      reduce_float64(op, args);
      break;
    case DType::kFloat16:
      portable ? reduce_float16_portable(op, args) : reduce_float16(op, args);
      break;
    case DType::kBFloat16:
      portable ? reduce_bfloat16_portable(op, args) : reduce_bfloat16(op, args);
      break;
    case DType::kInt32:
      reduce_int32(op, args);
      break;
    case DType::kInt64:
      reduce_int64(op, args);
      break;
    case DType::kInt8:
      reduce_int8(op, args);
      break;
    case DType::kUInt8:
      reduce_uint8(op, args);
      break;
  }
  finish_streaming(streaming_mask != 0);
}

}  // namespace

size_t reduce_block_elements(DType dtype) { return kReduceBlockBytes / accumulator_size(dtype); }

void reduce(ReduceOp op, DType dtype, std::span<const void* const> srcs,
            std::span<void* const> dsts, size_t count, int64_t mean_divisor) {
  reduce_impl(op, dtype, srcs, dsts, count, mean_divisor, /*portable=*/false);
}

void reduce_streaming(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                      std::span<void* const> dsts, size_t count, int64_t mean_divisor,
                      uint64_t streaming_mask) {
  reduce_impl(op, dtype, srcs, dsts, count, mean_divisor, /*portable=*/false, /*forced=*/true,
              streaming_mask);
}

void reduce_portable_for_testing(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                                 std::span<void* const> dsts, size_t count, int64_t mean_divisor) {
  reduce_impl(op, dtype, srcs, dsts, count, mean_divisor, /*portable=*/true);
}

}  // namespace tributary::algorithms
