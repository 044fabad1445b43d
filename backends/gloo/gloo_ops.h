// gloo: collectives across processes (and hosts) with Gloo's own algorithms and its TCP transport
// (Debian's libgloo-dev), the peer that `ring` is measured against and a backend users may choose.
//
// Every collective runs in three stages, as in `ring`: the process's local replicas are reduced (or
// gathered) into one host buffer, that buffer goes through Gloo across processes, and the result is
// copied to every local output. The all-reduce algorithm is the spec's choice among everything the
// installed Gloo offers (gloo_algorithms.h: ring, ring_chunked, halving_doubling, bcube,
// unbound_ring, unbound_bcube); `auto` takes halving_doubling below `auto_threshold` (default
// 4 MiB) and ring_chunked from there on. Reduce-scatter is Gloo's ReduceScatterHalvingDoubling
// (or, with reduce_scatter=all_reduce, an all-reduce that keeps this process's slice); reduce is an
// all-reduce whose result is copied to the destinations, as TF's CollectiveAllReduce does. MEAN is
// Gloo's SUM divided once, at the end, by num_replicas_in_sync. With one process no Gloo context
// exists: the local stage is all there is. Dtypes: those of Gloo's templates (no bfloat16).
//
// Modes (option `mode`): in async mode Gloo's I/O thread reads the sockets and wakes the caller;
// every algorithm works, and broadcast / all-gather are gloo::broadcast / gloo::allgather. In sync
// mode the calling thread reads its own sockets (busy_poll: spinning), which saves a thread
// hand-off per message (several times lower latency on a loaded machine), but only the classic
// algorithms work: broadcast and all-gather become BroadcastOneToAll and AllgatherRing, and the
// unbound_* all-reduces are refused. `auto` (the default) is async: in the sync modes two ranks
// that each write a message larger than the socket buffers to the other deadlock.
//
// Rendezvous: Gloo's TCP addresses are exchanged through the context's store (GlooStore), under
// "gloo/<instance>/", the instance numbered by creation order as every multi-process backend is.
//
// Collectives run on the calling thread and the returned Work is complete. Every blocking step
// honours `timeout` (Gloo's context timeout). Failure: every exception Gloo throws is caught here
// and becomes a Status naming the collective, this rank and, where it can be told, the peer's rank;
// an I/O error says that the peer may have died. After one, this rank closes its connections (so
// that peers waiting for it fail at once) and the instance refuses every later collective with
// FailedPrecondition quoting the first error (create a new one).
// Control channel: besides Gloo's mesh, the ranks join a TcpTransport (transports/tcp, the ring
// backend's transport: authenticated frames with a secret, deadlines, a peer's death or abort seen
// at once) under "gloo/<instance>/control/". Only 32-byte fingerprints cross it, never data: a
// round trip through Gloo's async pairs costs 130 us (2 processes) to 700 us (4 processes on 2
// cores) here; the exchange over this transport measured 27-35 us with a polling wait and 50-90 us
// with the sleeping one it uses (2 processes, waiting for the slower rank included). It sleeps at
// once rather than polling because Gloo's I/O threads share the cores (4 processes on 2 cores:
// 0.4-1.0 ms a small collective so, 1.6-2.0 ms polling).
// Ordering: with verify=true (the default) every collective first exchanges a 32-byte fingerprint
// (sequence, collective, op, dtype, count, root, local replicas) over the control channel, so that
// ranks issuing different collectives (even different kinds, whose Gloo exchanges would never
// meet) fail at once on every rank with a message naming both sides instead of combining
// unrelated data; verify=false skips it where nothing else needs the exchange (see Binding).
// Buffers registered with register_buffers need none: their instances are their own (Registered),
// and the fingerprint (verify=true) carries whether the call's buffer is registered.
// Destruction is collective: a barrier first (at most min(timeout, 10 s) in async mode, timeout in
// sync mode), because Gloo fails a wait on a closed connection even when its data has arrived, so
// a rank that closed at once could fail a slower peer. Writes to a dead peer would raise SIGPIPE:
// SIGPIPE is blocked in Gloo's I/O thread and, during each collective, in the calling thread, and
// a pending one is discarded.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/process_group.h"
#include "backends/gloo/gloo_algorithms.h"
#include "backends/gloo/gloo_context.h"
#include "tributary/cross_device_ops.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace tributary::backends {

// The mode an instance runs in: "auto" becomes "async" for the unbound_* algorithms (they need
// Gloo's I/O thread) and "sync" otherwise; other modes are returned as given.
std::string resolve_gloo_mode(const std::string& mode, const std::string& algorithm);

// How the reduce-scatter runs across processes.
enum class GlooReduceScatter : uint8_t { kAuto, kHalvingDoubling, kAllReduce };

class GlooOps final : public CrossDeviceOps {
 public:
  // `control`: the control channel over the same ranks (null for one process).
  GlooOps(BackendContext context, Options options, Capabilities caps, GlooConnection gloo,
          std::unique_ptr<algorithms::ProcessGroup> control);
  ~GlooOps() override;

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
  // This rank will not issue the collective its peers wait in: close the connections so that they
  // fail at once (as after a failure of our own).
  void abandon(const Status& why) override;
  // Checks over the control channel (whatever verify says) that every rank registers the same
  // count and dtype, then keeps the first buffer: all-reduces and reduces whose first output is
  // exactly it run a classic instance bound to it (Registered), with no agreement among the ranks
  // (several local replicas are reduced into it first). Only with several processes, for messages
  // the classic instances take (<= kGlooClassicMaxBytes); otherwise nothing is kept and the buffer
  // works as any other.
  Status register_buffers_impl(const CallInfo& call, uint64_t id,
                               const PerReplica<Tensor>& buffers) override;
  void release_buffers_impl(uint64_t id) override;

 private:
  // Runs `body` with SIGPIPE held back, converts whatever it throws into a Status naming `call`,
  // and remembers the first failure; refuses to run once one is remembered.
  template <typename Body>
  Status guarded(const CallInfo& call, Body&& body);
  Work finish(Status s) { return Work::completed(std::move(s)); }

  // Whether an all-reduce runs a classic instance on the caller's buffer (no copy in or out): one
  // local replica, a classic algorithm, one piece, and the ranks agree on which cached instance
  // (AlgorithmCache::get_bound). The agreement rides on the fingerprint exchange; without verify
  // that exchange is made for the binding alone, so only from kBindAloneMinBytes. Below it the two
  // copies cost less than the exchange plus the wake-up of Gloo's I/O thread that it causes
  // (measured, 2 processes, in place: binding from 256 KiB left 512 KiB at 433-864 us against
  // 437-503 us copying).
  // A registered buffer and the instances bound to it, one per (kind, op), each built at the
  // first call that needs it (on every rank at the same call: registered buffers are used alike
  // on every rank, which verify checks). Outside the AlgorithmCache: never evicted, destroyed at
  // release.
  struct Registered {
    void* data = nullptr;
    DType dtype = DType::kFloat32;
    int64_t count = 0;
    std::vector<std::unique_ptr<BoundAlgorithm>> instances;
  };
  struct Binding {
    bool possible = false;  // the same on every rank: decided from the call alone
    ClassicKind kind = ClassicKind::kRing;
    int here = -1;    // this rank's place for the buffer (AlgorithmCache::bound_place)
    int agreed = -1;  // every rank's, when they all match; else -1
    // The call's first output is this registered buffer (registration id `registration`): its
    // instance runs, no agreement needed.
    Registered* registered = nullptr;
    uint64_t registration = 0;
  };
  static constexpr uint64_t kBindAloneMinBytes = uint64_t{1} << 20;
  Binding plan_binding(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                       std::span<const Tensor> outputs);
  // Exchanges the call's fingerprint with every rank over the control channel when verify is on or
  // `binding` is possible; a mismatch is Aborted, naming both sides. `binding`, when possible,
  // rides along and comes back agreed.
  Status verify_order(const CallInfo& call, int root, Binding* binding = nullptr);
  // Reduces `inputs` (one per local replica) across every replica of every process, writing the
  // result (the full op, MEAN divided) to every tensor of `outputs`.
  Status reduce_everywhere(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                           std::span<const Tensor> outputs, const Binding* binding = nullptr);
  // A classic all-reduce, in pieces of at most kGlooClassicMaxBytes.
  Status classic_all_reduce(ClassicKind kind, ReduceOp op, std::span<const Tensor> inputs,
                            std::span<const Tensor> outputs);
  // Sync mode's broadcast and all-gather (BroadcastOneToAll, AllgatherRing), in pieces; `data`
  // holds P blocks of `block_bytes` for the all-gather, this rank's filled.
  void classic_broadcast(std::byte* data, size_t bytes, int root);
  void classic_all_gather(std::byte* data, size_t block_bytes);
  // The algorithm that runs `bytes` (auto resolved).
  GlooAlgorithm resolve(uint64_t bytes) const;
  uint32_t tag(const CallInfo& call) const;
  std::chrono::milliseconds call_timeout(const CallInfo& call) const;
  // A host buffer of at least `bytes`, reused across calls.
  std::byte* staging(size_t bytes);
  // The instance of `r` for `kind` and `op` (MEAN as SUM), built on first use.
  BoundAlgorithm& registered_instance(Registered& r, ClassicKind kind, ReduceOp op);

  std::shared_ptr<gloo::Context> gloo_;
  std::unique_ptr<algorithms::ProcessGroup> control_;
  PeerDirectory peers_;
  std::unique_ptr<AlgorithmCache> cache_;
  std::map<uint64_t, Registered> registered_;  // by registration id; after cache_ (goes first)
  GlooAlgorithm algorithm_;
  GlooReduceScatter reduce_scatter_;
  uint64_t auto_threshold_;
  uint64_t bytes_per_pack_;
  bool verify_;
  bool sync_;       // Gloo's sync mode (mode=sync or busy_poll): classic algorithms only
  Status failure_;  // the first failure of a collective
  std::vector<std::byte> staging_;
  std::vector<std::vector<std::byte>> packs_;  // batch_reduce's packs, one per local replica
};

}  // namespace tributary::backends
