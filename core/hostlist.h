// Slurm hostlist helpers private to core (the expansions themselves are public, in cluster.h).
#pragma once

#include <string_view>

namespace tributary::internal {

// Slurm's order for host names: runs of digits compare as numbers, everything else as text, so
// "n9" < "n10" < "o1". Used to pick the first host of a node list.
bool slurm_host_less(std::string_view a, std::string_view b);

}  // namespace tributary::internal
