// Cluster specs: TF_CONFIG JSON, Slurm hostlists and tasks-per-node lists, and what a peer publishes
// of its host at a backend's setup (algorithms/host_layout.h: "agreement|kernel|cpus|host", whose
// CPUs are a cpulist). The first byte picks the parser; the rest is its input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "algorithms/host_layout.h"
#include "core/cpus.h"
#include "tributary/cluster.h"
#include "tributary/store.h"

namespace {

// A parsed cpulist prints back to text that parses to the same CPUs.
void cpu_list(std::string_view text) {
  const auto cpus = tributary::internal::parse_cpu_list(text);
  if (!cpus) return;
  if (tributary::internal::parse_cpu_list(tributary::internal::cpu_list_text(*cpus)) != cpus) {
    std::abort();
  }
}

// Rank 1's published host entry, as rank 0 reads it at setup.
void host_entry(std::string_view text) {
  tributary::MemoryStore store;
  if (!store.set("host/1", std::string(text)).ok()) return;
  tributary::BackendContext context;
  context.rank = 0;
  context.world_size = 2;
  context.config.set("TRIBUTARY_HOST_ID", "a");
  const std::string agreement = "x";
  auto layout = tributary::algorithms::learn_hosts(store, context, "fuzz", agreement,
                                                   std::chrono::milliseconds(0));
  if (!layout.ok()) return;
  (void)layout->machine_of(0);
  (void)layout->machine_of(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: (void)tributary::parse_tf_config(text); break;
    case 1: (void)tributary::expand_slurm_hostlist(text); break;
    case 2: (void)tributary::expand_slurm_tasks_per_node(text); break;
    case 3: cpu_list(text); break;
    case 4: host_entry(text); break;
  }
  return 0;
}
