// tributary-run --bind-to: which CPUs each worker of this node may run on (mpirun's --bind-to).
//
//   none  (the default, as torchrun): workers inherit the launcher's CPUs.
//   core: local worker i runs on the hardware threads of one core, the (i mod C)-th of the C cores
//         among the launcher's allowed CPUs, cores ordered by their lowest CPU number. More workers
//         than cores share cores round robin; the launcher warns (mpirun refuses unless told to
//         overload).
//
// Why it is not the default: a rank that spends its time in one thread (UCX over TCP at 1-4 MiB)
// gains from staying on its core, as Open MPI's ranks do; ranks that reduce on several threads
// (`ring` over shared memory) lose, since each is then confined to one core (README, "Where
// tributary is behind").
//
// Linux only (sched_setaffinity and sysfs); elsewhere --bind-to core is refused.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace tributary::tools {

// One CPU as sysfs describes it.
struct CpuInfo {
  int cpu = 0;
  int package = 0;  // topology/physical_package_id (-1 on some virtual machines)
  int core = 0;     // topology/core_id (unique within its package)
};

// The package of a CPU whose topology cannot be read: below every real id, so that such a CPU,
// with its own number as core id, is a core of its own.
inline constexpr int kUnknownPackage = -(1 << 30);

// The cores of `cpus` (those sharing package and core id), each its CPUs in increasing order, the
// cores ordered by their lowest CPU.
std::vector<std::vector<int>> group_cores(const std::vector<CpuInfo>& cpus);

// For each of `workers` local workers, the CPUs of its core (round robin over `cores`).
std::vector<std::vector<int>> plan_core_binding(const std::vector<std::vector<int>>& cores,
                                                int workers);

// The CPUs this process may run on, with their sysfs topology (a CPU whose topology cannot be read
// counts as a core of its own). Empty with `error` set when the affinity cannot be read
// (internal::affinity_cpus, core/cpus.h).
std::vector<CpuInfo> allowed_cpus(std::string& error);

#if defined(__linux__)
// An affinity mask sized for its largest CPU (glibc's fixed cpu_set_t stops at 1024 CPUs), for
// sched_setaffinity(0, mask.bytes, mask.set.get()).
struct CpuMask {
  struct Free {
    void operator()(cpu_set_t* set) const { CPU_FREE(set); }
  };
  using Set = std::unique_ptr<cpu_set_t, Free>;
  Set set;
  size_t bytes = 0;
};
CpuMask cpu_mask(const std::vector<int>& cpus);
#endif

}  // namespace tributary::tools
