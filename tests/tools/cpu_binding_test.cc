#include "tools/cpu_binding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tributary::tools {
namespace {

using Cpus = std::vector<std::vector<int>>;

// Two packages of two cores with two hardware threads each, numbered as Linux does on x86 (the
// second threads of all cores after the first threads): cores are the threads that share package
// and core id, ordered by their lowest CPU.
TEST(CpuBinding, GroupsHardwareThreadsByPackageAndCore) {
  const std::vector<CpuInfo> cpus = {{0, 0, 0}, {1, 0, 1}, {2, 1, 0}, {3, 1, 1},
                                     {4, 0, 0}, {5, 0, 1}, {6, 1, 0}, {7, 1, 1}};
  EXPECT_EQ(group_cores(cpus), (Cpus{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Core ids repeat across packages: the same core id in another package is another core.
  EXPECT_EQ(group_cores({{0, 0, 0}, {1, 1, 0}}), (Cpus{{0}, {1}}));
  // An allowed set that holds only some CPUs (taskset): only those.
  EXPECT_EQ(group_cores({{5, 0, 1}, {1, 0, 1}, {2, 1, 0}}), (Cpus{{1, 5}, {2}}));
  EXPECT_TRUE(group_cores({}).empty());
  // A CPU whose topology cannot be read (allowed_cpus: kUnknownPackage, its number as core id) is
  // a core of its own, even beside a real package -1 (some virtual machines report one).
  EXPECT_EQ(group_cores({{0, -1, 3}, {3, kUnknownPackage, 3}, {4, kUnknownPackage, 4}}),
            (Cpus{{0}, {3}, {4}}));
}

TEST(CpuBinding, WorkersTakeCoresInOrderAndShareThemRoundRobin) {
  const Cpus cores = {{0, 4}, {1, 5}, {2, 6}};
  EXPECT_EQ(plan_core_binding(cores, 2), (Cpus{{0, 4}, {1, 5}}));
  EXPECT_EQ(plan_core_binding(cores, 5), (Cpus{{0, 4}, {1, 5}, {2, 6}, {0, 4}, {1, 5}}));
  EXPECT_TRUE(plan_core_binding({}, 3).empty());
}

#if defined(__linux__)
// A worker's mask holds CPUs past glibc's fixed cpu_set_t (1024), and only the CPUs asked for.
TEST(CpuBinding, MaskHoldsCpusBeyondTheFixedSetSize) {
  const CpuMask mask = cpu_mask({1, 2000});
  ASSERT_TRUE(mask.set);
  EXPECT_GE(mask.bytes * 8, 2001u);
  EXPECT_TRUE(CPU_ISSET_S(1, mask.bytes, mask.set.get()));
  EXPECT_TRUE(CPU_ISSET_S(2000, mask.bytes, mask.set.get()));
  EXPECT_EQ(CPU_COUNT_S(mask.bytes, mask.set.get()), 2);
}
#endif

// This process's own CPUs: at least one, each listed once.
TEST(CpuBinding, ReadsThisProcesssCpus) {
  std::string error;
  const std::vector<CpuInfo> cpus = allowed_cpus(error);
#if defined(__linux__)
  ASSERT_FALSE(cpus.empty()) << error;
  const Cpus cores = group_cores(cpus);
  size_t total = 0;
  for (const auto& c : cores) total += c.size();
  EXPECT_EQ(total, cpus.size());
#else
  EXPECT_TRUE(cpus.empty());
  EXPECT_FALSE(error.empty());
#endif
}

}  // namespace
}  // namespace tributary::tools
