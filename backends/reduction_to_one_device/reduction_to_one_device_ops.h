// reduction_to_one_device: TF's ReductionToOneDevice. Every collective gathers the replicas' values on
// one device (`reduce_to_device`, default the first destination's device), reduces them there, and
// copies the result to every destination. MEAN divides by the number of values reduced.
//
// On host memory the "copy to every destination" is fused into the reduction's store: each block is
// reduced once in cache and written to every destination, so each input byte is read once and each
// output byte written once. batch_reduce is one reduce per pair, as in TF ("doesn't support efficient
// batching").
#pragma once

#include <optional>

#include "tributary/cross_device_ops.h"

namespace tributary::backends {

class ReductionToOneDeviceOps final : public CrossDeviceOps {
 public:
  ReductionToOneDeviceOps(BackendContext context, Options options, Capabilities caps,
                          std::optional<Device> reduce_to_device);

 protected:
  Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override;
  Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override;
  Work broadcast_impl(const CallInfo& call, const Tensor& source,
                      const Mirrored<Tensor>& destinations, int root) override;
  Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override;
  Work reduce_scatter_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override;

 private:
  std::optional<Device> reduce_to_device_;
};

}  // namespace tributary::backends
