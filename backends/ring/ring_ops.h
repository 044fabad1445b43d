// ring: collectives across processes (and hosts) over TCP, with the algorithms of algorithms/ and the
// in-process machinery for the local replicas of each process.
//
// Every collective runs in three stages: the process's local replicas are reduced (or gathered)
// into one host buffer, that buffer goes through the inter-process algorithm over the TcpTransport,
// and the result is copied to every local output. The algorithm is the cost model's choice
// (ring for large messages, halving-doubling for small ones) unless the spec forces one
// (`ring:algorithm=halving_doubling`). Collectives run on the calling thread and the returned Work
// is complete; every blocking step honours `timeout`.
//
// Ordering and failure: every frame carries the collective's sequence number and fingerprint, so
// ranks that issue different collectives fail with an error naming both sides. A peer that dies or
// goes silent fails the collective on every surviving rank within the timeout, naming the peer;
// after that the instance refuses further collectives (create a new one).
#pragma once

#include <memory>
#include <vector>

#include "algorithms/collectives.h"
#include "backends/ring/tcp_transport.h"
#include "tributary/cross_device_ops.h"

namespace tributary::backends {

class RingOps final : public CrossDeviceOps {
 public:
  RingOps(BackendContext context, Options options, Capabilities caps,
          std::unique_ptr<algorithms::Transport> transport);

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

 private:
  algorithms::AlgorithmContext algorithm_context(const CallInfo& call);
  // Reduces `inputs` (one per local replica) into `result`, then all-reduces it across processes.
  Status reduce_everywhere(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                           const Tensor& result);
  // The transport's first error stays the answer to every later collective.
  Work finish(Status s);
  // A host buffer of at least `bytes`, reused across calls.
  std::byte* staging(size_t bytes);

  std::unique_ptr<algorithms::Transport> transport_;
  algorithms::AllReduceAlgorithm algorithm_;
  size_t segment_bytes_;
  uint64_t bytes_per_pack_;
  std::vector<std::byte> scratch_;
  std::vector<std::byte> staging_;
};

}  // namespace tributary::backends
