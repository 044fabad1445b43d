// The CPUs a process may run on (core/cpus.h): the kernel's cpulist text both ways, and the
// affinity as the kernel reports it.
#include "core/cpus.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace tributary::internal {
namespace {

TEST(Cpus, ListsCpusAsTheKernelDoes) {
  EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(cpu_list_text({1, 5}), "1,5");
  EXPECT_EQ(cpu_list_text({7}), "7");
  EXPECT_EQ(cpu_list_text({}), "");
}

TEST(Cpus, ParsesCpuListsIntoAscendingCpusEachOnce) {
  using Cpus = std::vector<int>;
  EXPECT_EQ(parse_cpu_list("0-3,8"), (Cpus{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_cpu_list("7"), (Cpus{7}));
  EXPECT_EQ(parse_cpu_list(""), Cpus{});
  // Overlapping and unordered items, as a union of several ranks' lists might give.
  EXPECT_EQ(parse_cpu_list("4-5,0-2,1-4"), (Cpus{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(parse_cpu_list(cpu_list_text({0, 2, 3, 4, 9, 10})), (Cpus{0, 2, 3, 4, 9, 10}));
  EXPECT_EQ(parse_cpu_list("65535"), (Cpus{65535}));
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1,", ",1", " 1", "1 ", "0x1", "65536",
                          "0-65536", "99999999999"}) {
    EXPECT_FALSE(parse_cpu_list(bad).has_value()) << "'" << bad << "'";
  }
}

#if defined(__linux__)
// The CPUs the kernel lists for this process (/proc/self/status, Cpus_allowed_list).
std::vector<int> cpus_allowed_by_proc() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    const std::string key = "Cpus_allowed_list:";
    if (line.rfind(key, 0) != 0) continue;
    std::string text = line.substr(key.size());
    text.erase(0, text.find_first_not_of(" \t"));
    auto cpus = parse_cpu_list(text);
    return cpus ? *cpus : std::vector<int>{-1};
  }
  return {-1};
}

TEST(Cpus, ReadsThisProcesssAffinityAsTheKernelListsIt) {
  std::string error;
  const std::vector<int> cpus = affinity_cpus(&error);
  ASSERT_FALSE(cpus.empty()) << error;
  EXPECT_EQ(cpus, cpus_allowed_by_proc());
  EXPECT_EQ(usable_cpus(), static_cast<int>(cpus.size()));
  EXPECT_LE(usable_cpus(), online_cpus());
}

// A narrowed affinity (taskset, a cpuset, a launcher's binding) is what counts, not the machine's
// CPUs. The mask is the calling thread's, so a thread of its own narrows it.
TEST(Cpus, CountsANarrowedAffinity) {
  const std::vector<int> mine = affinity_cpus();
  ASSERT_FALSE(mine.empty());
  if (mine.back() >= CPU_SETSIZE) GTEST_SKIP() << "CPU " << mine.back() << " is past cpu_set_t";
  std::vector<int> seen;
  int counted = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(mine.back(), &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return;
    seen = affinity_cpus();
    counted = usable_cpus();
  }).join();
  EXPECT_EQ(seen, std::vector<int>{mine.back()});
  EXPECT_EQ(counted, 1);
}
#endif

}  // namespace
}  // namespace tributary::internal
