// Gradient packing: how many small tensors become a few fused buffers before a collective, by
// TensorFlow's rules (tf.distribute cross_device_utils), plus the byte-level pack/unpack.
//
// Two schemes, named as TF names them:
//   - split_num_packs: _ConcatAndSplitPacker(num_packs), used by NCCL and HierarchicalCopy. All
//     tensors are concatenated, then split into `num_packs` pieces of total / num_packs elements,
//     the last piece taking the remainder.
//   - group_by_size: CollectiveAllReduce's bytes_per_pack. Tensors are grouped in order; a pack is
//     closed once it holds strictly more than bytes_per_pack bytes, so every pack but the last is
//     larger than bytes_per_pack ("few but large packs"). CollectiveAllReduce applies this to the
//     reversed list of gradients; reversing is the caller's choice, not done here.
// pack/unpack copy host memory. The caller guarantees that dst (src) holds the sum of the tensors'
// nbytes() and overlaps none of them. A packed buffer is one dtype in TF; mixing dtypes here works
// byte-wise, but a tensor then starts at an offset that may not be aligned to its element size.
// All functions are pure (no state); errors are returned as Status, never thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {

// TF's _ConcatAndSplitPacker sizes: `num_packs` pieces of total_elements / num_packs elements, the
// remainder in the last. total 10, 3 packs -> {3, 3, 4}; total 2, 3 packs -> {0, 0, 2}.
// num_packs <= 0 or total_elements < 0 is an InvalidArgument error naming the argument.
StatusOr<std::vector<int64_t>> split_num_packs(int64_t total_elements, int64_t num_packs);

// TF's group_by_size: consecutive groups of indices into `sizes_bytes`, in order. A new pack starts
// when the current one holds strictly more than bytes_per_pack bytes; bytes_per_pack == 0 gives one
// pack. Sizes [400, 400, 4, 1200, 40] with 400 -> {{0, 1}, {2, 3}, {4}}; with 800 ->
// {{0, 1, 2}, {3}, {4}}. No sizes -> no packs (TF would return one empty pack).
std::vector<std::vector<size_t>> group_by_size(std::span<const uint64_t> sizes_bytes,
                                               uint64_t bytes_per_pack);

// Sum of the tensors' nbytes(): the size of the buffer pack() fills.
size_t packed_nbytes(std::span<const Tensor> tensors);

// Concatenates the tensors' bytes, in order, into dst (which holds packed_nbytes(tensors) bytes).
void pack(std::span<const Tensor> tensors, void* dst);
// The inverse of pack: copies consecutive slices of src back into the tensors.
void unpack(const void* src, std::span<const Tensor> tensors);

// TF's packed batch_reduce (CollectiveAllReduce with bytes_per_pack), as every multi-process
// backend runs it: the pairs are grouped by dtype (a pack holds one element type), then by
// group_by_size. A group of one pair is reduced as it is (`reduce_one`: no copies in or out). A
// larger group is concatenated, per local replica, into `packs` (the caller keeps them across
// calls: a fresh allocation of a large pack faults in every page on every call), reduced by
// `reduce_pack`, which returns the buffer holding the reduced pack, and unpacked from it into every
// destination of every pair. Each callback gets `call` with the pack's collective (`collective`),
// dtype and count. Packs of no elements reach the callbacks too (views empty), for backends that
// exchange something per pack; the others return at once. Every rank packs alike, so the packs of
// the ranks match. The first error ends the call.
struct PackedBatchReduce {
  Collective collective = Collective::kBatchReduce;
  uint64_t bytes_per_pack = 0;
  std::function<Status(const CallInfo& pack, const ReducePair& pair)> reduce_one;
  std::function<StatusOr<const std::byte*>(const CallInfo& pack, std::span<const Tensor> views)>
      reduce_pack;
  // Optional: where local replica 0's pack of `bytes` is built instead of packs[0] (memory its
  // collective can run on in place, e.g. shareable memory registered with a group).
  std::function<StatusOr<std::byte*>(const CallInfo& pack, size_t bytes)> first_pack_buffer;
};
Status packed_batch_reduce(const CallInfo& call, std::span<const ReducePair> pairs,
                           std::span<const Device> devices,
                           std::vector<std::vector<std::byte>>& packs,
                           const PackedBatchReduce& how);

}  // namespace tributary::algorithms
