// gloo: collectives across processes (and hosts) with Gloo's own algorithms and its TCP transport
// (Debian's libgloo-dev), the peer that `ring` is measured against and a backend users may choose.
//
// GlooGroup is the backend's ProcessGroup: what crosses processes. Everything around it is
// algorithms::ProcessGroupOps, as for ring and ucx: the local replicas are reduced (or gathered)
// into one host buffer first, packed batch_reduce, copies to the local outputs, first-failure
// tracking, and abort of the peers on a local refusal.
//
// The all-reduce algorithm is the spec's choice among everything the installed Gloo offers
// (gloo_algorithms.h: ring, ring_chunked, halving_doubling, bcube, unbound_ring, unbound_bcube);
// `auto` takes halving_doubling below `auto_threshold` (default 4 MiB) and ring_chunked from there
// on. Reduce-scatter is Gloo's ReduceScatterHalvingDoubling (sync modes only) or an all-reduce
// that keeps this process's block. MEAN is Gloo's SUM divided once, at the end, by the group
// call's divisor (num_replicas_in_sync). Dtypes: those of Gloo's templates (no bfloat16).
//
// Modes (option `mode`): in async mode Gloo's I/O thread reads the sockets and wakes the caller;
// every algorithm works, and all-gather is tributary's own on Gloo's classic buffers, over the
// caller's buffer, with a clear to send (ClearToSendAllgather: a direct exchange up to 2 MiB of
// output, a ring above). In sync mode the calling thread reads its own sockets (busy_poll:
// spinning), which saves a thread hand-off per message (several times lower latency on a loaded
// machine), but only Gloo's classic algorithms work: all-gather becomes AllgatherRing, and the
// unbound_* all-reduces are refused. Broadcast is BroadcastOneToAll in every mode. Gloo's unbound
// gloo::broadcast and gloo::allgather, which async mode used before, saw a peer that died in the
// middle of a message only at the timeout (gloo_algorithms.h). AllgatherRing is not used in async
// mode: there a peer's next run may write into its buffer before this rank has copied the last
// result out, which the clear to send rules out. `auto` (the default) is async: in the sync modes
// two ranks that each write a message larger than the socket buffers to the other deadlock.
//
// Rendezvous: Gloo's TCP addresses are exchanged through the context's store (GlooStore), under
// "gloo/<instance>/", the instance numbered by creation order as every multi-process backend is.
//
// Every blocking step is bounded by the backend's `timeout`: the context's timeout for the classic
// instances, the all-gather and unbound_bcube (pieces of a broadcast or unbound_bcube stop
// once the call's deadline has passed), what is left of the call's deadline for unbound_ring and
// the control channel. Failure: every exception Gloo throws is caught here and becomes a Status
// naming the collective, this rank and, where it can be told, the peer's rank; an I/O error says
// that the peer may have died. After one, this rank closes its connections (so that peers waiting
// for it fail at once) and every later call returns that first error. Control channel: besides
// Gloo's mesh, the ranks join a TcpTransport (transports/tcp, the ring backend's transport:
// authenticated frames with a secret, deadlines, a peer's death or abort seen at once) under
// "gloo/<instance>/control/". Only 32-byte fingerprints cross it, never data: a round trip through
// Gloo's async pairs costs 130 us (2 processes) to 700 us (4 processes on 2 cores) here; the
// exchange over this transport measured 27-35 us with a polling wait and 50-90 us with the sleeping
// one it uses (2 processes, waiting for the slower rank included). It sleeps at once rather than
// polling because Gloo's I/O threads share the cores (4 processes on 2 cores: 0.4-1.0 ms a small
// collective so, 1.6-2.0 ms polling). Ordering: with verify=true (the default) every group call
// first exchanges a 32-byte fingerprint (sequence, collective, op, dtype, count, root, local
// replicas) over the control channel, so that ranks issuing different collectives (even different
// kinds, whose Gloo exchanges would never meet) fail at once on every rank with a message naming
// both sides instead of combining unrelated data; the fingerprint carries the broadcast root, so
// ProcessGroupOps' own agreement on it is skipped (checks_roots). verify=false skips the exchange
// where nothing else needs it (see Binding); ProcessGroupOps then agrees on broadcast roots with a
// small all-reduce. Buffers registered with register_buffer need no agreement: their instances are
// their own (Registered), and the fingerprint (verify=true) carries whether the call's buffer is
// registered. Destruction is collective: a barrier first (at most min(timeout, 10 s) in async mode,
// timeout in sync mode), because Gloo fails a wait on a closed connection even when its data has
// arrived, so a rank that closed at once could fail a slower peer. Writes to a dead peer would
// raise SIGPIPE: SIGPIPE is blocked in Gloo's I/O thread and, during each group call, in the
// calling thread, and a pending one is discarded.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/process_group.h"
#include "backends/gloo/gloo_algorithms.h"
#include "backends/gloo/gloo_context.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace tributary::backends {

// The mode an instance runs in: "auto" becomes "async"; other modes are returned as given.
std::string resolve_gloo_mode(const std::string& mode, const std::string& algorithm);

// How the reduce-scatter runs across processes.
enum class GlooReduceScatter : uint8_t { kAuto, kHalvingDoubling, kAllReduce };

struct GlooGroupSettings {
  GlooAlgorithm algorithm = GlooAlgorithm::kAuto;
  GlooReduceScatter reduce_scatter = GlooReduceScatter::kAuto;
  uint64_t auto_threshold = uint64_t{4} << 20;
  uint64_t cache_bytes = uint64_t{1} << 30;
  bool verify = true;
  bool sync = false;   // Gloo's sync mode (mode=sync or busy_poll): classic algorithms only
  int local_replicas = 1;  // in the fingerprint: every rank must have as many
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // the destructor's barrier
};

class GlooGroup final : public algorithms::ProcessGroup {
 public:
  // `gloo`: a connected mesh of two or more processes; `control`: the control channel over the
  // same ranks.
  GlooGroup(GlooConnection gloo, std::unique_ptr<algorithms::ProcessGroup> control,
            GlooGroupSettings settings);
  ~GlooGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override;
  bool names_global_ranks() const override { return true; }
  bool checks_roots() const override { return settings_.verify; }

  Status all_reduce(const algorithms::GroupCall& call, void* data, int64_t count, DType dtype,
                    ReduceOp op, int64_t mean_divisor, const void* source) override;
  Status broadcast(const algorithms::GroupCall& call, void* data, size_t bytes,
                   int root) override;
  Status all_gather(const algorithms::GroupCall& call, void* data, size_t bytes_per_rank) override;
  Status reduce_scatter(const algorithms::GroupCall& call, void* data, void* out, int64_t count,
                        DType dtype, ReduceOp op, int64_t mean_divisor) override;
  // Checks over the control channel (whatever verify says) that every rank registers the same
  // count and dtype, then keeps the buffer: all-reduces on exactly it run a classic instance bound
  // to it (Registered), with no agreement among the ranks. Only for messages the classic instances
  // take (<= kGlooClassicMaxBytes); otherwise nothing is kept and the buffer works as any other.
  Status register_buffer(const algorithms::GroupCall& call, uint64_t id, void* data,
                         int64_t count, DType dtype) override;
  void release_buffer(uint64_t id) override { registered_.erase(id); }

  // Closes the connections (peers waiting for this rank fail at once) and the control channel,
  // which tells the peers why.
  void abort(const Status& why) override;
  // Wakes the control channel's wait (the fingerprint exchange, where a rank waits for a peer that
  // has not issued the collective): it fails with `why`. Gloo's own waits cannot be woken from
  // another thread (closing a pair does not wake them); a call already inside Gloo's algorithm
  // ends when its exchange does, or at the timeout. With verify=false there is no exchange to wake.
  void interrupt(const Status& why) override;
  Status error() const override;

 private:
  // Runs `body` with SIGPIPE held back, converts whatever it throws into a Status naming `call`,
  // and remembers the first failure (aborting); refuses to run once one is remembered.
  template <typename Body>
  Status guarded(const algorithms::GroupCall& call, Body&& body);

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
  // Whether an all-reduce runs a classic instance on the call's buffer (no copy in or out): a
  // classic algorithm, one piece, and the ranks agree on which cached instance
  // (AlgorithmCache::get_bound). The agreement rides on the fingerprint exchange; without verify
  // that exchange is made for the binding alone, so only from kBindAloneMinBytes. Below it the two
  // copies cost less than the exchange plus the wake-up of Gloo's I/O thread that it causes
  // (measured, 2 processes, in place: binding from 256 KiB left 512 KiB at 433-864 us against
  // 437-503 us copying).
  struct Binding {
    bool possible = false;  // the same on every rank: decided from the call alone
    ClassicKind kind = ClassicKind::kRing;
    int here = -1;    // this rank's place for the buffer (AlgorithmCache::bound_place)
    int agreed = -1;  // every rank's, when they all match; else -1
    // The call's buffer is this registered one (registration id `registration`): its instance
    // runs, no agreement needed.
    Registered* registered = nullptr;
    uint64_t registration = 0;
  };
  static constexpr uint64_t kBindAloneMinBytes = uint64_t{1} << 20;
  Binding plan_binding(const algorithms::MessageTag& tag, void* data, int64_t count, DType dtype,
                       ReduceOp op);
  // Exchanges the call's fingerprint with every rank over the control channel when verify is on,
  // `binding` is possible or `always`; a mismatch is Aborted, naming both sides. `binding`, when
  // possible, rides along and comes back agreed.
  Status verify_order(const algorithms::GroupCall& call, Binding* binding = nullptr,
                      bool always = false);
  // A classic all-reduce through the cache's own buffers, in pieces of at most
  // kGlooClassicMaxBytes: `src` in, the result (MEAN divided) to `data`.
  void classic_all_reduce(ClassicKind kind, void* data, const void* src, int64_t count,
                          DType dtype, ReduceOp op, int64_t mean_divisor);
  // Broadcast (every mode) through BroadcastOneToAll, in pieces of kBroadcastPieceBytes, each
  // through the instance of its size class (a power of two from kBroadcastMinClassBytes), so that
  // the cache holds a few buffers per root, not one per size broadcast; failing between pieces
  // once `deadline` has passed. Sync mode's all-gather (AllgatherRing), in pieces; `data` holds P
  // blocks of `block_bytes`, this rank's filled.
  static constexpr size_t kBroadcastPieceBytes = size_t{4} << 20;
  static constexpr size_t kBroadcastMinClassBytes = size_t{4} << 10;
  void classic_broadcast(std::byte* data, size_t bytes, int root,
                         std::chrono::steady_clock::time_point deadline);
  void classic_all_gather(std::byte* data, size_t block_bytes);
  // The algorithm that runs `bytes` (auto resolved).
  GlooAlgorithm resolve(uint64_t bytes) const;
  // The instance of `r` for `kind` and `op` (MEAN as SUM), built on first use.
  BoundAlgorithm& registered_instance(Registered& r, ClassicKind kind, ReduceOp op);

  std::shared_ptr<gloo::Context> gloo_;
  std::unique_ptr<algorithms::ProcessGroup> control_;
  PeerDirectory peers_;
  GlooGroupSettings settings_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<AlgorithmCache> cache_;
  std::unique_ptr<ClearToSendAllgather> exchange_;  // async mode's all-gather
  std::map<uint64_t, Registered> registered_;  // by registration id; after cache_ (goes first)
  mutable std::mutex mu_;                      // guards failure_ (abort may come from any thread)
  Status failure_;                             // the first failure
};

}  // namespace tributary::backends
