#include "tools/cpu_binding.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include "core/cpus.h"

namespace tributary::tools {

std::vector<std::vector<int>> group_cores(const std::vector<CpuInfo>& cpus) {
  std::map<std::pair<int, int>, std::vector<int>> by_core;
  for (const CpuInfo& c : cpus) by_core[{c.package, c.core}].push_back(c.cpu);
  std::vector<std::vector<int>> cores;
  cores.reserve(by_core.size());
  for (auto& [key, list] : by_core) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    cores.push_back(std::move(list));
  }
  std::sort(cores.begin(), cores.end(),
            [](const std::vector<int>& a, const std::vector<int>& b) { return a[0] < b[0]; });
  return cores;
}

std::vector<std::vector<int>> plan_core_binding(const std::vector<std::vector<int>>& cores,
                                                int workers) {
  std::vector<std::vector<int>> plan;
  if (cores.empty()) return plan;
  for (int i = 0; i < workers; ++i) plan.push_back(cores[static_cast<size_t>(i) % cores.size()]);
  return plan;
}

namespace {

// The integer in a sysfs file, or `fallback`.
int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v = 0;
  return (in >> v) ? v : fallback;
}

}  // namespace

std::vector<CpuInfo> allowed_cpus(std::string& error) {
  std::vector<CpuInfo> found;
  for (const int cpu : internal::affinity_cpus(&error)) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const int core = read_int(dir + "core_id", -1);
    found.push_back(core < 0 ? CpuInfo{cpu, kUnknownPackage, cpu}
                             : CpuInfo{cpu, read_int(dir + "physical_package_id", 0), core});
  }
  return found;
}

#if defined(__linux__)
CpuMask cpu_mask(const std::vector<int>& cpus) {
  int size = 1;
  for (int c : cpus) size = std::max(size, c + 1);
  CpuMask mask{CpuMask::Set(CPU_ALLOC(size)), CPU_ALLOC_SIZE(size)};
  if (mask.set) {
    CPU_ZERO_S(mask.bytes, mask.set.get());
    for (int c : cpus) CPU_SET_S(c, mask.bytes, mask.set.get());
  }
  return mask;
}
#endif

}  // namespace tributary::tools
