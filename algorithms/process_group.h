// ProcessGroup: the collectives of a group of processes, one host buffer per process. It is what a
// multi-process backend supplies to ProcessGroupOps (process_group_ops.h), which adds the local
// replicas of each process around it. Implementations:
//  - TransportGroup (here): the algorithms of collectives.h over a point-to-point Transport (TCP,
//    UCX, loopback);
//  - ShmGroup (transports/shm): processes of one host, through shared memory;
//  - HierarchicalGroup (hierarchical_group.h): a group within each host and one across hosts,
//    composed;
//  - GlooGroup (backends/gloo): Gloo's own algorithms and TCP transport.
//
// Contract (every method): called by every rank of the group with the same arguments, in the same
// order, from one thread at a time; `call.tag` names the collective (sequence and fingerprint), so
// that ranks that disagree fail with a mismatch error naming both sides on every rank, and
// `call.deadline` bounds every wait. After any error the group is broken: it tells its peers (so
// they fail at once, not at their deadline) and every later call returns that first error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/transport.h"

namespace tributary::algorithms {

struct GroupCall {
  MessageTag tag;
  Deadline deadline;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For logs and `tributary-info`: "tcp (4 ranks)", "shared memory (2 ranks)", ...
  virtual std::string describe() const = 0;
  // Whether its errors name ranks by their number in the whole job (else by their number in this
  // group, which a group made of some of the job's ranks must then translate: HierarchicalGroup).
  virtual bool names_global_ranks() const { return false; }
  // Whether the group itself fails every rank when they name different broadcast roots (gloo's
  // fingerprint exchange carries call.tag.root); otherwise ProcessGroupOps agrees on the root
  // first, with a small all-reduce.
  virtual bool checks_roots() const { return false; }

  // `data` (count elements) = op over every rank's data; with `source` (not overlapping `data`),
  // out of place: `source` is the input, `data` only the output. MEAN divides by `mean_divisor`.
  virtual Status all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype,
                            ReduceOp op, int64_t mean_divisor, const void* source) = 0;
  // `bytes` of root's `data` to every rank's `data`.
  virtual Status broadcast(const GroupCall& call, void* data, size_t bytes, int root) = 0;
  // `data` holds size() blocks of `bytes_per_rank`; this rank's block (at rank()) is filled, the
  // others are filled by the call.
  virtual Status all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) = 0;
  // `data` holds size() * count elements (it may be used as scratch); `out` (count elements, not
  // overlapping `data`) receives block rank() of the reduction.
  virtual Status reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count,
                                DType dtype, ReduceOp op, int64_t mean_divisor) = 0;
  // Whether reduce_scatter only reads `data` (never as scratch) and takes for `out` data's own
  // block rank() too (in place): ProcessGroupOps then passes a single local replica's input and
  // output themselves, with no copy through staging.
  virtual bool reduce_scatter_reads_only() const { return false; }

  // register_buffers (cross_device_ops.h): later all-reduces on exactly `data` (count elements
  // of dtype; ShmGroup: or a prefix of it, and its other collectives) may use what the group
  // prepares for it, until
  // release_buffer(id). Collective, like the others. Default: nothing to prepare.
  virtual Status register_buffer(const GroupCall& call, uint64_t id, void* data, int64_t count,
                                 DType dtype) {
    (void)call, (void)id, (void)data, (void)count, (void)dtype;
    return Status();
  }
  // Local: drops what register_buffer(id) prepared.
  virtual void release_buffer(uint64_t id) { (void)id; }
  // Whether the host buffers this group all-reduces should be shareable memory
  // (Buffer::allocate_shareable), registered: ProcessGroupOps then stages batch_reduce's packs
  // there and registers the staging buffer whenever it grows (at the same call on every rank,
  // since every rank packs alike), so that the group can take a faster path on it.
  virtual bool wants_shareable_staging() const { return false; }
  // What register_buffer(id) prepared, for the info log; empty when nothing.
  virtual std::string describe_registration(uint64_t id) const {
    (void)id;
    return std::string();
  }

  // Breaks the group with `why` (if not broken already) and tells the peers.
  virtual void abort(const Status& why) = 0;
  // The one method that may be called from another thread, while a call is in flight (or not):
  // that call's waits end within milliseconds with `why`, and its thread breaks the group as for
  // any failure (telling the peers); with no call in flight, the next wait fails so. Must not
  // block. Default: nothing (the call ends at its deadline).
  virtual void interrupt(const Status& why) { (void)why; }
  // The first error, or OK.
  virtual Status error() const = 0;

  // Set by ProcessGroupOps: publishes why this rank fails, in the job's store, where peers look
  // for the root cause of their own failure (CrossDeviceOps::publish_refusal).
  void set_refusal_publisher(std::function<void(const Status&)> publish) {
    publish_ = std::move(publish);
  }

 protected:
  // For a failure every rank detects alike (a mismatch found by an exchange of the group's own):
  // called before the group closes its connections, so that peers which notice the closed
  // connection first can still say why.
  void publish_refusal(const Status& why) const {
    if (publish_) publish_(why);
  }

 private:
  std::function<void(const Status&)> publish_;
};

// The algorithms of collectives.h over a Transport. `algorithm` picks the all-reduce (kAuto: the
// cost model), `segment_bytes` the ring's pipelining granularity and `slice_bytes` the ring
// all-reduce's slice (0 = auto for both).
class TransportGroup final : public ProcessGroup {
 public:
  TransportGroup(std::unique_ptr<Transport> transport, AllReduceAlgorithm algorithm,
                 size_t segment_bytes, size_t slice_bytes, std::string name = "tcp");

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  std::string describe() const override;
  Status all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype, ReduceOp op,
                    int64_t mean_divisor, const void* source) override;
  Status broadcast(const GroupCall& call, void* data, size_t bytes, int root) override;
  Status all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) override;
  Status reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count, DType dtype,
                        ReduceOp op, int64_t mean_divisor) override;
  void abort(const Status& why) override { transport_->abort(why); }
  void interrupt(const Status& why) override { transport_->interrupt(why); }
  Status error() const override { return transport_->error(); }

  Transport& transport() { return *transport_; }

 private:
  AlgorithmContext context(const GroupCall& call);
  Status fenced(const GroupCall& call, Status done);

  std::unique_ptr<Transport> transport_;
  AllReduceAlgorithm algorithm_;
  size_t segment_bytes_;
  size_t slice_bytes_;
  std::string name_;
  std::vector<std::byte> scratch_;
};

}  // namespace tributary::algorithms
