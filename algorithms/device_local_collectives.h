// local_collectives.h's collectives when some tensor lives on a GPU: the reduction runs on one
// device (a GPU's kernels, or the CPU's), its inputs copied there from wherever they live (peer
// copies between GPUs, host<->device copies), and the result is copied to every destination. Each
// GPU's inputs are read on a stream of that GPU, so work the caller queued on that GPU's legacy
// default stream is done first; every call is synchronous (it returns once all copies are done).
// local_collectives.cc dispatches here; the CPU-only paths never come here.
#pragma once

#include <cstdint>
#include <span>

#include "tributary/dtype.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {

// Every dst = op over srcs, reduced on `on`.
Status device_local_reduce(ReduceOp op, std::span<const Tensor> srcs, std::span<const Tensor> dsts,
                           int64_t mean_divisor, const Device& on);
Status device_local_copy(const Tensor& src, std::span<const Tensor> dsts);
Status device_local_all_gather(std::span<const Tensor> inputs, std::span<const Tensor> outputs);

}  // namespace tributary::algorithms
