// Shared memory's single-copy threshold under shm_single_copy=auto (shm_group.h, "Single copy"):
// where some rank timed the kernel's copies between processes at more than kSlowKernelCopyRatio
// times memcpy's, single copy waits for buffers past the caches. The measurement itself runs in
// every ring test with two processes on one host (RingSingleCopy in ring_test.cc checks what it
// led to there).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "transports/shm/shm_group.h"

namespace tributary::transports::shm {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(SingleCopyThreshold, SlowKernelCopiesWaitForBuffersPastTwiceTheLastLevelCache) {
  EXPECT_EQ(single_copy_slow_from(32 * kMiB), 64 * kMiB);
  EXPECT_EQ(single_copy_slow_from(0), 64 * kMiB);              // unknown: 32 MiB assumed
  EXPECT_EQ(single_copy_slow_from(2 * kMiB), 16 * kMiB);       // at least 16 MiB
  EXPECT_EQ(single_copy_slow_from(4096 * kMiB), 1024 * kMiB);  // at most 1 GiB
}

TEST(SingleCopyThreshold, OneSlowRankRaisesItForEveryRank) {
  const size_t layout = 16 << 10;
  EXPECT_EQ(single_copy_from(layout, {1.2, 1.4}, 32 * kMiB), layout);
  EXPECT_EQ(single_copy_from(layout, {1.2, 8.6}, 32 * kMiB), 64 * kMiB);
  EXPECT_EQ(single_copy_from(layout, {8.6, 0}, 32 * kMiB), 64 * kMiB);
  // Exactly the ratio is not above it.
  EXPECT_EQ(single_copy_from(layout, {kSlowKernelCopyRatio}, 32 * kMiB), layout);
}

TEST(SingleCopyThreshold, UnmeasuredRanksAndLargerLayoutThresholdsStand) {
  EXPECT_EQ(single_copy_from(16 << 10, {0, 0}, 32 * kMiB), size_t{16} << 10);
  // A layout threshold past the slow one, or none, is kept.
  EXPECT_EQ(single_copy_from(256 * kMiB, {9.0}, 32 * kMiB), 256 * kMiB);
  EXPECT_EQ(single_copy_from(SIZE_MAX, {9.0}, 32 * kMiB), SIZE_MAX);
}

TEST(SingleCopyThreshold, TheLastLevelCacheIsReadFromSysfs) {
  std::ifstream size("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (!(size >> text)) GTEST_SKIP() << "no level-3 cache described in sysfs here";
  // "32768K": the value, then its unit.
  const size_t value = std::stoull(text);
  const size_t scale = text.back() == 'K' ? 1024 : text.back() == 'M' ? 1024 * 1024 : 1;
  EXPECT_GE(last_level_cache_bytes(), value * scale);
}

}  // namespace
}  // namespace tributary::transports::shm
