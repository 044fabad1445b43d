// Host memory that the other processes of this host can map (Buffer::allocate_shareable): each
// allocation is a memfd of its own, mapped shared, and kept in a table so that a backend handed a
// pointer can find the descriptor and offset behind it (register_buffers, for the shared-memory
// group's direct path: peers map the same pages through /proc/<pid>/fd/<fd>).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "tributary/tensor.h"

namespace tributary::internal {

// The allocator behind Buffer::allocate_shareable (CPU only; lives for the whole program).
Allocator* shareable_allocator();

// Where [p, p + bytes) lies inside one shareable allocation: its memfd (open in this process for
// as long as the allocation lives) and the offset of `p` in it. nullopt when it does not lie wholly
// inside one.
struct ShareableRegion {
  int fd = -1;
  uint64_t offset = 0;
  // Unique per allocation in this process (an address and a descriptor may be reused after a free;
  // this is not): a holder of a region can tell whether its memory is still the same allocation.
  uint64_t serial = 0;
};
std::optional<ShareableRegion> find_shareable(const void* p, size_t bytes);

}  // namespace tributary::internal
