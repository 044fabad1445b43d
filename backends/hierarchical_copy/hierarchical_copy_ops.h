// hierarchical_copy: TF's HierarchicalCopyAllReduce, made correct for every replica count.
//
// The local replicas are split into consecutive groups of `group_size` (default on CPUs: ceil(n / 2),
// i.e. two groups, TF's DGX-1 layout; the last group may be smaller). On GPUs the default groups
// come from the topology the driver reports instead of a fixed table (groups_from_topology). Each
// all-reduce:
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

// How GPU i reaches GPU j, as the driver reports it (core/gpu.h's PeerLink, kept here CUDA-free).
struct GpuLink {
  bool peer_access = false;   // i can read and write j's memory directly
  int performance_rank = -1;  // the driver's relative rank of the link: lower is faster (NVLink)
};

// Groups of GPUs for the hierarchy: GPUs joined by the fastest kind of link present (the lowest
// performance rank among peer-accessible pairs) form cliques, greedily in index order: a GPU joins
// the first group all of whose members it reaches that fast, else starts a new group. A DGX-1
// (0-3 and 4-7 fully NVLinked, PCIe across) gives {0,1,2,3} and {4,5,6,7}; GPUs without peer
// access give one group each; virtual GPUs of one physical GPU (rank 0 to each other) one group.
// `links[i][j]` for i != j; the diagonal is ignored.
std::vector<std::vector<int>> groups_from_topology(const std::vector<std::vector<GpuLink>>& links);

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
