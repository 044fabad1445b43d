// HierarchicalGroup: the collectives of processes spread over several hosts, composed from a group
// inside each host and a group across hosts, as NCCL's tree/ring over NVLink + network and
// Horovod's hierarchical all-reduce do. The host layout must be uniform: H hosts with L processes
// each. Local rank l of host h is global rank members[h][l]; the "local" group holds this host's
// processes (its rank = l), the "cross" group the processes with this local rank, one per host (its
// rank = h).
//
//  - all_reduce: the local group reduce-scatters the buffer into L blocks (block l to local rank
//    l), each cross group all-reduces its block across hosts, the local group all-gathers the
//    blocks. Every byte crosses the network once per host, split over L parallel cross groups;
//    same-host traffic stays in the local group (shared memory).
//  - reduce_scatter: local reduce-scatter of the blocks regrouped by local rank, then a cross
//    reduce-scatter.
//  - all_gather: cross all-gather of the own block, then local all-gather of the H blocks each.
//  - broadcast: cross broadcast among the processes with the root's local rank, then local
//    broadcast from it.
// MEAN is summed in the first stage and divided once, in the last reduction.
//
// Either group may be null when it would have a single rank (one host, or one process per host);
// its stage is then skipped. Failure: the first error of either group breaks this one; abort()
// aborts both, so that the peers of both learn it at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/process_group.h"

namespace tributary::algorithms {

class HierarchicalGroup final : public ProcessGroup {
 public:
  // `members[h]`: the global ranks of host h in local-rank order; every host has the same count.
  HierarchicalGroup(int rank, std::vector<std::vector<int>> members,
                    std::unique_ptr<ProcessGroup> local, std::unique_ptr<ProcessGroup> cross);

  int rank() const override { return rank_; }
  int size() const override { return hosts_ * per_host_; }
  std::string describe() const override;
  Status all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype, ReduceOp op,
                    int64_t mean_divisor, const void* source) override;
  Status broadcast(const GroupCall& call, void* data, size_t bytes, int root) override;
  Status all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) override;
  Status reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count, DType dtype,
                        ReduceOp op, int64_t mean_divisor) override;
  void abort(const Status& why) override;
  void interrupt(const Status& why) override;  // both groups
  Status error() const override;

 private:
  // Runs `body`; an error aborts both groups.
  template <typename Body>
  Status guarded(Body&& body);
  std::byte* scratch(std::vector<std::byte>& buffer, size_t bytes);
  // An error of the local or the cross group, with the key to its rank numbers when the group
  // names ranks by their place in it ("across hosts (the group of local rank 1: its ranks 0, 1
  // are ranks 1, 3 of the job)").
  Status in_local(Status s) const;
  Status in_cross(Status s) const;

  int rank_;
  std::vector<std::vector<int>> members_;
  int hosts_;
  int per_host_;
  int host_ = 0;   // this process's host index
  int local_ = 0;  // and local rank
  std::unique_ptr<ProcessGroup> local_group_;
  std::unique_ptr<ProcessGroup> cross_group_;
  std::vector<std::byte> a_, b_;
};

}  // namespace tributary::algorithms
