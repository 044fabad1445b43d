// Cluster specs: TF_CONFIG JSON, Slurm hostlists and tasks-per-node lists. The first byte picks
// the parser; the rest is its input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tributary/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: (void)tributary::parse_tf_config(text); break;
    case 1: (void)tributary::expand_slurm_hostlist(text); break;
    case 2: (void)tributary::expand_slurm_tasks_per_node(text); break;
  }
  return 0;
}
