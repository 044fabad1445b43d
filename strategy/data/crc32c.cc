// Table-driven CRC32C, slicing by 4 bytes: TFRecord files are read once per epoch, so a portable
// implementation is enough (no SSE4.2 dependency).
#include "strategy/data/crc32c.h"

#include <array>

namespace tributary::data_internal {

namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // Castagnoli, reflected

using Tables = std::array<std::array<uint32_t, 256>, 4>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t s = 1; s < 4; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 4) {
    c ^= static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
    c = kTables[3][c & 0xff] ^ kTables[2][(c >> 8) & 0xff] ^ kTables[1][(c >> 16) & 0xff] ^
        kTables[0][c >> 24];
    p += 4;
    n -= 4;
  }
  while (n--) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  return ~c;
}

}  // namespace tributary::data_internal
