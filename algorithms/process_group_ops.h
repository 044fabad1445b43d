// ProcessGroupOps: a CrossDeviceOps for several processes, each with one or more local replicas,
// composed once for every multi-process backend: the backend supplies a ProcessGroup (its
// transport and algorithms), this class does the rest.
//
// Every collective runs in three stages: the process's local replicas are reduced (or gathered)
// into one host buffer, that buffer goes through the group, and the result is copied to every local
// output. With one local replica out of place, the group reads the input directly (no copy up
// front). batch_reduce packs tensors by dtype and by TF's bytes_per_pack rule (group_by_size), one
// group all-reduce per pack; every rank packs the same way, so the packs match. reduce is an
// all-reduce whose result goes to every destination, as TF's CollectiveAllReduce does.
// Collectives run on the calling thread and the returned Work is complete.
//
// Failure: the group's first error (a dead or silent peer, a mismatch) answers every later
// collective. A local failure (or abandon(): this rank refuses a call its peers will issue) aborts
// the group, so that the peers fail at once instead of at their timeout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/process_group.h"
#include "tributary/cross_device_ops.h"
#include "tributary/options.h"

namespace tributary::algorithms {

// The options of every backend whose group is a TransportGroup (ring over TCP, ucx): algorithm,
// segment_bytes, slice_bytes, bytes_per_pack, poll and secret_file, with one help text, so that
// they agree.
std::vector<OptionDef> transport_group_options();
// What a ProcessGroupOps over host memory offers: CPU devices, every dtype, op and collective,
// several processes.
Capabilities process_group_capabilities();
AllReduceAlgorithm parse_algorithm(
    const std::string& name);  // "ring", "halving_doubling", else auto
// Checks what the option types cannot say (segment_bytes and slice_bytes 0 or at least 4 KiB),
// naming `backend`.
Status check_transport_group_options(const std::string& backend, const Options& options);
// The options every rank of a group must agree on, as text for the setup checks
// ("local_replicas=1,algorithm=auto,segment_bytes=0,slice_bytes=0,bytes_per_pack=0").
std::string transport_group_layout(const BackendContext& context, const Options& options);

class ProcessGroupOps final : public CrossDeviceOps {
 public:
  // `group` may be null only for a world of one process. `bytes_per_pack`: see batch_reduce.
  ProcessGroupOps(std::string name, BackendContext context, Options options, Capabilities caps,
                  std::unique_ptr<ProcessGroup> group, uint64_t bytes_per_pack);

  // The group the collectives cross processes with (null with one process).
  const ProcessGroup* group() const { return group_.get(); }

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
  void abandon(const Status& why) override;
  void interrupt(const Status& why) override;
  // The group's register_buffer on the first buffer (the one every all-reduce's result lands in
  // before it crosses processes).
  Status register_buffers_impl(const CallInfo& call, uint64_t id,
                               const PerReplica<Tensor>& buffers) override;
  void release_buffers_impl(uint64_t id) override;

 private:
  GroupCall group_call(const CallInfo& call) const;
  Status group_error() const { return group_ ? group_->error() : Status(); }
  // Reduces `inputs` (one per local replica) into `result`, then all-reduces it across processes.
  Status reduce_everywhere(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                           const Tensor& result);
  // reduce_everywhere into outputs[0], then a copy to every other output.
  Status reduce_to_all(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                       std::span<const Tensor> outputs);
  // Fails every rank unless all name the same broadcast root (groups that do not check it).
  Status agree_on_root(const CallInfo& call, const GroupCall& gc, int root);
  Status batch_reduce_packs(const CallInfo& call, ReduceOp op, std::span<const ReducePair> pairs);
  // The group's first error stays the answer to every later collective.
  Work finish(Status s);
  // A host buffer of at least `bytes`, reused across calls.
  std::byte* staging(size_t bytes);
  // Where the group wants it (wants_shareable_staging), batch_reduce builds local replica 0's pack
  // here: shareable memory of at least `bytes`, reused across calls and registered with the group
  // anew whenever it grows (a collective step, taken at the same call on every rank, since every
  // rank packs alike), so the pack is all-reduced in place on it.
  StatusOr<std::byte*> pack_staging(const CallInfo& call, size_t bytes);

  std::unique_ptr<ProcessGroup> group_;
  uint64_t bytes_per_pack_;
  std::vector<std::byte> staging_;
  Buffer shared_staging_;                   // pack_staging's, where shareable
  std::vector<std::byte> fallback_staging_;  // pack_staging's where shareable memory failed
  size_t pack_staging_bytes_ = 0;
  std::vector<std::vector<std::byte>> packs_;  // batch_reduce's packs, one per local replica
};

}  // namespace tributary::algorithms
