// Host staging: how a backend that moves only host memory (ring, ucx, gloo) serves GPU tensors, as
// TF's collective ops, Horovod and torch.distributed's Gloo process group do. The GPU tensors of a
// call are copied into pinned host memory, the backend runs the collective there, and the results
// are copied back to the GPUs before the call's Work completes.
//
// The registry wraps such a backend in a HostStagedOps when any local replica is a GPU (and
// tributary is built with CUDA): the backend itself is made for CPU devices, one per replica, and
// every call on the wrapper is exactly one call of the same kind on it, so that a rank with GPU
// replicas and a rank with CPU replicas run the same collective sequence and interoperate.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/tensor.h"

namespace tributary::internal {

// Where the GPU tensors of one call live in host memory. Bookkeeping only (no CUDA), so that it is
// tested without a GPU. Tensors whose memory overlaps on one device share one host twin (an
// in-place all_reduce's input and output, an in-place all_gather's input inside its output, a
// broadcast source that is also a destination), so the host backend sees the same aliasing as the
// caller.
class StagingPlan {
 public:
  static constexpr size_t kAlignment = 256;

  // Adds a GPU tensor that the collective reads (its contents go to the host first) and/or writes
  // (its twin goes back to the device afterwards). `fixed_host`, when not null, is a host buffer of
  // t.nbytes() that the twin should be (a registered buffer's twin); it is used when t's memory is
  // the whole of its overlap group. Returns the tensor's slot.
  size_t add(const Tensor& t, bool read, bool write, std::byte* fixed_host = nullptr);
  // Groups the overlapping tensors and lays out the twins that are not fixed in one block. Returns
  // the block's size in bytes (0 when every twin is fixed or there is nothing to stage).
  size_t layout();

  // After layout(): slot's twin, given the block, labelled `device` (a host device).
  Tensor host_tensor(size_t slot, std::byte* block, const Device& device) const;
  std::byte* host_data(size_t slot, std::byte* block) const;
  const Tensor& device_tensor(size_t slot) const { return entries_[slot].tensor; }
  // After layout(): the slots to copy to the host before the collective, and back to their devices
  // after it; a tensor listed twice (the same memory) is copied once.
  const std::vector<size_t>& reads() const { return reads_; }
  const std::vector<size_t>& writes() const { return writes_; }
  size_t num_groups() const { return groups_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    Tensor tensor;
    bool read = false;
    bool write = false;
    std::byte* fixed = nullptr;
    size_t group = 0;
    size_t offset = 0;  // within the group's twin
  };
  struct Group {
    const std::byte* begin = nullptr;
    size_t bytes = 0;
    std::byte* fixed = nullptr;  // the twin, when it is a registered buffer
    size_t block_offset = 0;     // otherwise its place in the block
    std::pair<int, int> device;  // (type, index)
  };
  std::vector<Entry> entries_;
  std::vector<Group> groups_;
  std::vector<size_t> reads_;
  std::vector<size_t> writes_;
};

// What staging moves, and how: which devices' tensors get host twins, the host memory twins live
// in, and the copies. cuda_staging() is the real one (GPU tensors, pinned memory, one CUDA stream
// per GPU and direction); tests of the staging layer may stage CPU tensors through plain memory.
class StagingDevice {
 public:
  virtual ~StagingDevice() = default;
  virtual bool stages(const Device& device) const = 0;
  virtual StatusOr<void*> allocate(size_t bytes) = 0;
  virtual void free(void* host) noexcept = 0;
  // Copies the plan's `slots` between their tensors and their twins (into the twins when
  // `to_host`) and waits until they are done.
  virtual Status copy(const StagingPlan& plan, const std::vector<size_t>& slots, std::byte* block,
                      bool to_host) = 0;
};
std::shared_ptr<StagingDevice> cuda_staging();

// Wraps `inner`, made for the CPU devices of host_context(context), so that it serves `context`'s
// replicas, GPU ones included. The wrapper has inner's name and options; its capabilities are
// inner's plus GPU devices. Each call on it is one call of the same kind on `inner`: the tensors
// `device` stages are copied to host twins first, and the written ones back when inner's Work
// completes, before the wrapper's does. Twins live in blocks kept for reuse (up to 4 free blocks,
// the largest kept: one call of 1 GiB keeps 1 GiB pinned while the backend lives); a registration
// (register_buffers) gets twins of its own, registered with `inner`.
std::unique_ptr<CrossDeviceOps> make_host_staged_ops(
    const BackendContext& context, std::unique_ptr<CrossDeviceOps> inner,
    std::shared_ptr<StagingDevice> device = cuda_staging());
// `context` with every GPU replica given a CPU device of its own (CPU replicas keep theirs).
BackendContext host_context(const BackendContext& context);

}  // namespace tributary::internal
