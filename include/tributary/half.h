// float16 and bfloat16 <-> float32 conversions, for filling and reading half-precision tensors.
// tributary stores float16 as IEEE binary16 and bfloat16 as the top half of a float32, each in a
// uint16_t. Conversions to half round to nearest even; conversions to float are exact.
// These are branch-free so that loops over them vectorise; the CPU reduction kernels use them too.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "tributary/export.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

// IEEE binary16 <-> float32. float_to_half rounds to nearest even, overflows to infinity, keeps
// subnormals, and maps NaN to a quiet NaN of the same sign. half_to_float is exact.
// These are branch-free so the compiler can vectorise loops over them.
inline float half_to_float(uint16_t h) {
  const uint32_t w = uint32_t{h} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
  // Normal, infinite and NaN inputs: move exponent and mantissa into place, rebias by 2^-112.
  constexpr uint32_t kExpOffset = uint32_t{0xE0} << 23;
  const float normalized = std::bit_cast<float>((two_w >> 4) + kExpOffset) * 0x1.0p-112f;
  // Subnormal inputs: the mantissa as the low bits of 0.5 + m * 2^-24, minus 0.5 (exact).
  constexpr uint32_t kMagicMask = uint32_t{126} << 23;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | kMagicMask) - 0.5f;
  // Select with a mask rather than ?: so that GCC (with its default -ftrapping-math) vectorises.
  constexpr uint32_t kDenormalCutoff = uint32_t{1} << 27;
  const uint32_t is_denormal = uint32_t{0} - static_cast<uint32_t>(two_w < kDenormalCutoff);
  const uint32_t bits = sign | (std::bit_cast<uint32_t>(denormalized) & is_denormal) |
                        (std::bit_cast<uint32_t>(normalized) & ~is_denormal);
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_half(float f) {
  // Scaling by 2^112 then 2^-110 overflows exactly the values that round to infinity in binary16.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t bias = std::max(shl1_w & 0xFF000000u, 0x71000000u);
  // Adding 2^(e+13) makes the float adder round the mantissa at binary16's precision (RNE).
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  const uint32_t is_nan = uint32_t{0} - static_cast<uint32_t>(shl1_w > 0xFF000000u);
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

// bfloat16 (the top half of a float32) <-> float32. float_to_bfloat16 rounds to nearest even,
// overflows to infinity, and maps NaN to a quiet NaN of the same sign.
inline float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

inline uint16_t float_to_bfloat16(float f) {
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (w >> 16) | 0x0040u;
  const bool is_nan = (w & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
