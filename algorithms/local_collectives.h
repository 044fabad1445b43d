// Collectives among the replicas of one process, over host-addressable memory. The in-process
// backends (reduction_to_one_device, hierarchical_copy) are compositions of these, and the
// multi-process backends use them for their local stage.
//
// Preconditions: the front door has validated the arguments (counts, dtypes, overlap). Tensors may
// live on CPUs and CUDA GPUs in any mix: with a GPU involved, device_local_collectives.h does the
// work (synchronously, with the device kernels and peer copies).
// `mean_divisor` is the number of replicas in sync; ops other than kMean ignore it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "tributary/dtype.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {

// Every dst = op over all srcs (each source read once, each destination written once), reduced on
// `on` when given (TF's reduce_to_device), else on the first destination's device. Host-only
// tensors with no `on` (or a CPU one) reduce in place in host memory, in parallel.
Status local_reduce(ReduceOp op, std::span<const Tensor> srcs, std::span<const Tensor> dsts,
                    int64_t mean_divisor, const std::optional<Device>& on = std::nullopt);
// Every dst = src.
Status local_copy(const Tensor& src, std::span<const Tensor> dsts);
// outputs[i] = concat(inputs) along the flat element order.
Status local_all_gather(std::span<const Tensor> inputs, std::span<const Tensor> outputs);
// outputs[i] = op over j of inputs[j].slice(i * count, count).
Status local_reduce_scatter(ReduceOp op, std::span<const Tensor> inputs,
                            std::span<const Tensor> outputs, int64_t mean_divisor);

}  // namespace tributary::algorithms
