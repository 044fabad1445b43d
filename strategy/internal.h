// What the strategy layer's files share: the per-thread context stack.
#pragma once

#include <cstdint>
#include <string>

#include "tributary/strategy/strategy.h"

namespace tributary::strategy_internal {

// Integer elements, exactly (int64 beyond 2^53 included): loaded widened to int64, stored narrowed
// with two's-complement wrap-around, as TF's integer kernels compute. `dtype` is an integer dtype.
inline int64_t load_integer(DType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DType::kInt8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kUInt8:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(data)[i];
    default:
      return static_cast<const int64_t*>(data)[i];
  }
}
inline void store_integer(DType dtype, void* data, int64_t i, int64_t v) {
  switch (dtype) {
    case DType::kInt8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      break;
    case DType::kUInt8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kInt32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      break;
    default:
      static_cast<int64_t*>(data)[i] = v;
  }
}
// Two's-complement arithmetic without undefined overflow.
inline int64_t wrapping_add(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
}
inline int64_t wrapping_sub(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y));
}
inline int64_t wrapping_mul(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
}
// Truncating division (C++'s and TF's for integers); `y` is not 0.
inline int64_t truncating_div(int64_t x, int64_t y) { return y == -1 ? wrapping_sub(0, x) : x / y; }

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
