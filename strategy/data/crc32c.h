// CRC32C (Castagnoli) and TFRecord's masked form of it (internal to strategy/data).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tributary::data_internal {

// CRC32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// TFRecord stores CRCs masked, because a CRC computed over data that itself contains CRCs is weak;
// rotating and adding a constant breaks that pattern (the same mask as LevelDB and TensorFlow).
inline uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace tributary::data_internal
