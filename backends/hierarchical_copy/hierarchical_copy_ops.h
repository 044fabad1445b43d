// hierarchical_copy: TF's HierarchicalCopyAllReduce, made correct for every replica count.
//
// The local replicas are split into consecutive groups of `group_size` (default: ceil(n / 2), i.e. two
// groups, TF's DGX-1 layout; the last group may be smaller). Each all-reduce:
//   1. each group reduces into its leader's output;
//   2. the leaders' partial results are reduced on the root group's leader, and the total is copied
//      back to every leader (fused into one pass over host memory);
//   3. each leader copies the total to the members of its group.
// As in TF the roots rotate: pack p uses group p % groups as root and member p % size of each group
// as leader, so successive packs spread the work. TF's own code takes groups [0, n/2) and
// [n/2, 2*(n/2)), which leaves the last replica out of the sum when n is odd; here every replica
// counts, for any n >= 1.
//
// batch_reduce: when every pair's destinations are the replicas' own outputs (one per replica, on
// the replicas' devices), tensors of one dtype are concatenated per replica, split into `num_packs`
// packs (TF's rule: total/num_packs elements each, the remainder in the last), all-reduced pack by
// pack and split back; num_packs=0 reduces tensor by tensor. Other destinations fall back to
// reduce-to-one-device per pair, as TF does. Half types round each group's partial result to the
// dtype (as the copies between devices do in TF).
#pragma once

#include <vector>

#include "tributary/cross_device_ops.h"

namespace tributary::backends {

class HierarchicalCopyOps final : public CrossDeviceOps {
 public:
  HierarchicalCopyOps(BackendContext context, Options options, Capabilities caps);

  // The groups of local replica indices for this instance's replica count.
  const std::vector<std::vector<int>>& groups() const { return groups_; }

 protected:
  Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override;
  Work batch_reduce_impl(const CallInfo& call, ReduceOp op,
                         std::span<const ReducePair> pairs) override;
  Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override;
  Work broadcast_impl(const CallInfo& call, const Tensor& source,
                      const Mirrored<Tensor>& destinations, int root) override;
  Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override;
  Work reduce_scatter_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override;

 private:
  // The three-stage all-reduce of one pack; `pack` picks the rotating roots.
  Status hierarchical_all_reduce(ReduceOp op, std::span<const Tensor> inputs,
                                 std::span<const Tensor> outputs, int64_t pack) const;
  // True when `destinations` are one tensor per local replica, on that replica's device.
  bool matches_replicas(const Mirrored<Tensor>& destinations) const;

  std::vector<std::vector<int>> groups_;
  int64_t num_packs_ = 1;
};

}  // namespace tributary::backends
