// The CPUs this process may run on, header-only so that tools outside the library (tributary-run's
// --bind-to) read them as the library does.
//
// hardware_concurrency() counts the machine's online CPUs. A process's affinity mask is what it
// may actually use: taskset, a container's or batch job's cgroup cpuset, and a launcher's binding
// (mpirun --bind-to, tributary-run --bind-to) all narrow it, so that a container given 2 of a
// host's 64 CPUs would otherwise size its work for 64. `nproc`, OpenMP and Go's runtime count the
// mask, as the library does wherever it sizes work by cores (algorithms/parallel.cc's threads,
// core/rendezvous.h's oversubscription rule). A CPU quota (cgroup CFS bandwidth: docker --cpus,
// Kubernetes limits) is not counted: measured, neither the waits nor the pool gained from it
// (README, "The ring backend").
#pragma once

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tributary::internal {

// This process's CPUs (its affinity), ascending; empty with `error` set (when given) when they
// cannot be read, or off Linux. Strictly, the calling thread's (sched_getaffinity(0)): a process
// whose threads were all started under its launcher's mask has one; a trainer that narrows one
// thread's mask before it sets up the library is counted by that thread's.
inline std::vector<int> affinity_cpus(std::string* error = nullptr) {
  std::vector<int> cpus;
#if defined(__linux__)
  // The kernel refuses (EINVAL) a mask smaller than its own CPU count: grow until it fits.
  for (int size = CPU_SETSIZE;; size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    if (set == nullptr) {
      if (error) *error = "cannot read this process's CPU affinity: out of memory";
      return cpus;
    }
    const size_t bytes = CPU_ALLOC_SIZE(size);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) != 0) {
      const int err = errno;
      CPU_FREE(set);
      if (err == EINVAL && size < (1 << 22)) continue;
      if (error)
        *error = std::string("cannot read this process's CPU affinity: ") + std::strerror(err);
      return cpus;
    }
    for (int cpu = 0; cpu < size; ++cpu) {
      if (CPU_ISSET_S(cpu, bytes, set)) cpus.push_back(cpu);
    }
    CPU_FREE(set);
    return cpus;
  }
#else
  if (error) *error = "CPU affinity is read on Linux only";
  return cpus;
#endif
}

// The machine's online CPUs, at least 1.
inline int online_cpus() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// How many CPUs this process may run on: its affinity's count, else online_cpus().
inline int usable_cpus() {
  const size_t n = affinity_cpus().size();
  return n > 0 ? static_cast<int>(n) : online_cpus();
}

// "0-3,8" for {0, 1, 2, 3, 8} (ascending): the kernel's cpulist format, as /proc/self/status's
// Cpus_allowed_list.
inline std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]);
    if (j > i) text += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text;
}

// The CPUs of a cpulist text ("0-3,8"; "" is none), ascending and each once; nullopt when the text
// is not one. CPU numbers stop below 65536 (Linux's NR_CPUS is at most 8192), and the work is in
// the items, not in the width of their ranges, so that a text from a peer costs no more than its
// length and one list of at most 65536.
inline std::optional<std::vector<int>> parse_cpu_list(std::string_view text) {
  constexpr int kMaxCpus = 1 << 16;
  std::vector<std::pair<int, int>> ranges;
  auto number = [](std::string_view s, int& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 0 && v < kMaxCpus;
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const size_t dash = item.find('-');
    int first = 0, last = 0;
    if (!number(item.substr(0, dash), first)) return std::nullopt;
    last = first;
    if (dash != std::string_view::npos && (!number(item.substr(dash + 1), last) || last < first)) {
      return std::nullopt;
    }
    ranges.emplace_back(first, last);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing comma
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<int> cpus;
  int next = 0;  // the lowest CPU not yet listed
  for (const auto& [first, last] : ranges) {
    for (int c = std::max(first, next); c <= last; ++c) cpus.push_back(c);
    next = std::max(next, last + 1);
  }
  return cpus;
}

}  // namespace tributary::internal
