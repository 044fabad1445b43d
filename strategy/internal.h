// What the strategy layer's files share: the per-thread context stack.
#pragma once

#include <string>

#include "tributary/strategy/strategy.h"

namespace tributary::strategy_internal {

// TF keeps the strategy stack per thread (per graph); so do we. Replica threads start with their
// ReplicaContext set; a merge function runs with `merge` set (cross-replica context).
struct ThreadContext {
  Strategy* scope = nullptr;  // the strategy whose scope() this thread is in
  int scope_depth = 0;
  ReplicaContext* replica = nullptr;  // set on a replica thread during run()
  Strategy* merge = nullptr;          // set while this thread runs a merge function
};
ThreadContext& thread_context();

// The strategy this thread is working for, or null for the default context.
Strategy* current_strategy();

// "Mixing different tf.distribute.Strategy objects: A is not B"
Status mixing_error(const Strategy& used, const Strategy& current);

// Global replica 0's `value` (the chief's; the others' `value` gives only dtype and shape), on
// every worker, on the CPU. The broadcast runs on this worker's first replica device, so that a
// backend of that device (nccl: GPU memory only) takes it. A collective: every worker calls it.
StatusOr<Array> broadcast_from_chief(Strategy& s, const Array& value);

}  // namespace tributary::strategy_internal
