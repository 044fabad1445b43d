// Collectives among the replicas of one process, over host-addressable memory. The in-process
// backends (reduction_to_one_device, hierarchical_copy) are compositions of these, and the
// multi-process backends use them for their local stage.
//
// Preconditions: the front door has validated the arguments (counts, dtypes, overlap). Every tensor
// must be in host-addressable memory (CPU devices); other devices are an Unimplemented error.
// `mean_divisor` is the number of replicas in sync; ops other than kMean ignore it.
#pragma once

#include <cstdint>
#include <span>

#include "tributary/dtype.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {

// Every dst = op over all srcs (each source read once, each destination written once).
Status local_reduce(ReduceOp op, std::span<const Tensor> srcs, std::span<const Tensor> dsts,
                    int64_t mean_divisor);
// Every dst = src.
Status local_copy(const Tensor& src, std::span<const Tensor> dsts);
// outputs[i] = concat(inputs) along the flat element order.
Status local_all_gather(std::span<const Tensor> inputs, std::span<const Tensor> outputs);
// outputs[i] = op over j of inputs[j].slice(i * count, count).
Status local_reduce_scatter(ReduceOp op, std::span<const Tensor> inputs,
                            std::span<const Tensor> outputs, int64_t mean_divisor);

}  // namespace tributary::algorithms
