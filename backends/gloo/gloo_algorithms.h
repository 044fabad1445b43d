// Gloo's collective algorithms behind one typed dispatch: which all-reduce algorithms the installed
// Gloo offers, how tributary's dtypes and reduce ops map onto Gloo's templates, and a cache of the
// "classic" algorithm instances (gloo/allreduce_ring.h and friends), which are expensive to build.
//
// Two families of Gloo collectives exist in the installed headers:
//  - classic: AllreduceRing, AllreduceRingChunked, AllreduceHalvingDoubling, AllreduceBcube (and
//    ReduceScatterHalvingDoubling). Each instance is built once over fixed buffers: construction
//    allocates Gloo's receive buffers and claims transport slots, and run() may be called many
//    times. Building one per call would cost an allocation (fresh pages) per call, so instances
//    live in an AlgorithmCache, each bound to a host buffer that the cache owns; the backend copies
//    into it and out of it. Their element and byte counts are `int`s, so the backend runs larger
//    messages through them in pieces of kGlooClassicMaxBytes. They are the only ones that work
//    when the pairs are in Gloo's sync mode (the calling thread reads its own sockets).
//  - unbound: gloo::allreduce() (gloo/allreduce.h; the API PyTorch's ProcessGroupGloo uses) with
//    its RING or BCUBE algorithm. It works on the caller's buffers per call, matched by tag, and
//    needs Gloo's I/O thread (async mode). A peer that dies while its message to this rank is
//    arriving is seen only at the timeout: Gloo does not wake that receive when the connection
//    fails (so broadcast and all-gather are classic in every mode, and `auto` never picks an
//    unbound all-reduce).
//
// Per algorithm (P processes, S bytes; from Gloo's docs/algorithms.md):
//   ring              P-1 steps, P*S bytes sent per process (whole buffer each step)
//   ring_chunked      4P steps, 2S bytes per process (2P chunks, double-buffered)
//   halving_doubling  2 lg P steps, 2S bytes per process (Rabenseifner; binary blocks when P is
//                     not a power of two)
//   bcube             2 log_B P steps, 2 * sum_s S/B^s bytes (B = the context's base, which must
//                     divide P; the backend picks the smallest divisor >= 2 of P)
//   unbound_ring      gloo::allreduce ring: reduce-scatter then all-gather, pipelined in segments
//                     of at most 1 MiB; about 2S(P-1)/P bytes per process
//   unbound_bcube     gloo::allreduce bcube
// Besides all-reduce: BroadcastOneToAll (the root sends to every process), AllgatherRing (P-1
// steps), ReduceScatterHalvingDoubling. And one of ours on Gloo's classic buffers, for
// all-gather in async mode (ClearToSendAllgather, below).
//
// Every function here may throw Gloo's exceptions (gloo::IoException, gloo::EnforceNotMet, ...)
// or std::bad_alloc; the backend's boundary (GlooGroup::guarded) converts them to Status.
// Threading: an AlgorithmCache is used by one thread at a time (its backend's calling thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <vector>

#include "tributary/dtype.h"

namespace gloo {
class Algorithm;
class Context;
namespace transport {
class Buffer;
}  // namespace transport
}  // namespace gloo

namespace tributary::backends {

enum class GlooAlgorithm : uint8_t {
  kAuto,
  kRing,
  kRingChunked,
  kHalvingDoubling,
  kBcube,
  kUnboundRing,
  kUnboundBcube,
};

// Spec names ("auto", "ring", "ring_chunked", "halving_doubling", "bcube", "unbound_ring",
// "unbound_bcube"), in declaration order.
std::span<const std::string_view> gloo_algorithm_names();
std::string_view gloo_algorithm_name(GlooAlgorithm a);
GlooAlgorithm parse_gloo_algorithm(std::string_view name);  // kAuto for unknown names

// Classic algorithms count elements and bytes in int: the backend runs larger messages through
// them in pieces of at most this many bytes.
inline constexpr uint64_t kGlooClassicMaxBytes = uint64_t{1} << 30;

// The dtypes Gloo's templates reduce: float32, float64, float16 (gloo::float16), int32, int64,
// int8, uint8. Not bfloat16 (Gloo has no such type).
bool gloo_supports(DType dtype);
std::vector<DType> gloo_dtypes();

// unbound_bcube runs larger messages in pieces of at most this many bytes. Gloo's bcube allocates
// scratch as large as its message on every call: up to 32 MiB glibc's malloc keeps that memory
// after the first call and hands it out again, while from 32 MiB every call maps fresh pages and
// faults them in. That halved its speed here (2 processes, 32 and 64 MiB: 1.4 GB/s against
// 3.4-3.9 with malloc told to keep the memory, GLIBC_TUNABLES=glibc.malloc.mmap_threshold).
inline constexpr uint64_t kGlooUnboundBcubePieceBytes = uint64_t{16} << 20;

// gloo::allreduce() over `data` (count elements) in place. MEAN reduces as SUM (the caller
// divides). Each wait of unbound_ring is bounded by what is left of `timeout`; unbound_bcube's
// waits by the context's timeout (Gloo's BCUBE ignores the option), and a message in pieces
// fails between two pieces once `timeout` has passed.
void unbound_all_reduce(GlooAlgorithm algorithm, const std::shared_ptr<gloo::Context>& context,
                        void* data, size_t count, DType dtype, ReduceOp op, uint32_t tag,
                        std::chrono::milliseconds timeout);
// The word a broadcast's receivers send the root with their clear to send: the size itself below
// 2 GiB, above it a 31-bit hash of the size with the high bit set (the word is Gloo's int), so that
// sizes apart by a multiple of 4 GiB differ too.
uint32_t broadcast_size_word(uint64_t bytes);

// Deletes a Gloo algorithm. Gloo declares ~Algorithm() noexcept(false), and unique_ptr's own
// deleter would turn a throw into std::terminate; this one swallows it (destructors never throw).
struct AlgorithmDeleter {
  void operator()(gloo::Algorithm* algorithm) const noexcept;
};
using AlgorithmPtr = std::unique_ptr<gloo::Algorithm, AlgorithmDeleter>;

// What a cached classic instance computes.
enum class ClassicKind : uint8_t {
  kRing,
  kRingChunked,
  kHalvingDoubling,
  kBcube,
  kReduceScatterHalvingDoubling,  // each process keeps count / P elements, at the buffer's start
  kBroadcast,  // BroadcastOneToAll of up to `count` bytes (dtype uint8) from `root` (run_prefix)
  kAllGather,  // AllgatherRing of `count` bytes per process: data() holds P blocks, then the
               // input block (input())
};

// A classic instance and the host buffer it runs on (`count` elements of `dtype`): one the cache
// owns, or the caller's (`user`).
struct BoundAlgorithm {
  ClassicKind kind;
  DType dtype;
  ReduceOp op;
  int64_t count = 0;
  int root = 0;             // kBroadcast
  size_t input_offset = 0;  // kAllGather: where input() starts in the buffer
  uint64_t footprint = 0;   // bytes held: the buffer and an estimate of Gloo's own buffers
  std::unique_ptr<std::byte[]> buffer;
  void* user = nullptr;  // the caller's buffer it runs on, instead of `buffer`
  int place = -1;        // with `user`: its place among its key's (AlgorithmCache::get_bound)
  AlgorithmPtr algorithm;

  void* data() const { return user ? user : buffer.get(); }
  void* input() const;  // kAllGather: where this process's block goes before run()
  void run();
  // kBroadcast: broadcasts the buffer's first `bytes` (at most count) instead of all of it; every
  // process passes the same `check` (broadcast_size_word of the whole broadcast's size), or the
  // root throws GlooSizeMismatch.
  void run_prefix(size_t bytes, uint32_t check);
};

// Instances by (kind, dtype, op, count), least recently used evicted first while the footprint
// exceeds `max_bytes` (the instance just asked for is always kept). Every rank must see the same
// sequence of get() calls, which the collective order guarantees, so that ranks build, reuse and
// evict the same instances at the same time and their transport slots match.
class AlgorithmCache {
 public:
  AlgorithmCache(std::shared_ptr<gloo::Context> context, uint64_t max_bytes);
  ~AlgorithmCache();
  AlgorithmCache(const AlgorithmCache&) = delete;
  AlgorithmCache& operator=(const AlgorithmCache&) = delete;

  // The instance for this call, built on a miss. `op` is the op Gloo applies (SUM for MEAN).
  // count * element size must be in (0, kGlooClassicMaxBytes].
  BoundAlgorithm& get(ClassicKind kind, DType dtype, ReduceOp op, int64_t count, int root = 0);

  // Instances that run on the caller's buffer, so that nothing is copied in or out: up to
  // kMaxBoundPerKey per (kind, dtype, op, count), each in a numbered place. Which one, if any, is
  // bound to `user` is a local fact (buffer addresses differ between ranks), so the ranks first
  // agree on the place, then either all reuse that place's instance or all build a new one in the
  // same place (a free one, else the key's least recently used); construction (transport slots)
  // and eviction stay in step on every rank.
  static constexpr int kMaxBoundPerKey = 4;
  // The place of this rank's instance for the key that is bound to `user`, or -1.
  int bound_place(ClassicKind kind, DType dtype, ReduceOp op, int64_t count,
                  const void* user) const;
  // `agreed_place` >= 0: every rank answered bound_place() with it; returns that instance. -1:
  // builds one over `user` in place of the key's free or least recently used one.
  BoundAlgorithm& get_bound(ClassicKind kind, DType dtype, ReduceOp op, int64_t count, void* user,
                            int agreed_place);
  // Whether binding still pays for the key: false once its instances were rebuilt more often
  // than reused (buffers that change every call; the copying path is cheaper then). Decided from
  // agreed outcomes only, so it is the same on every rank.
  bool binding_pays(ClassicKind kind, DType dtype, ReduceOp op, int64_t count) const;
  // An all-reduce instance over the caller's buffer `user` that the cache neither holds, counts
  // nor evicts (a registered buffer's: GlooGroup::register_buffer). Built like the cache's,
  // so every rank must build it at the same call; its footprint is Gloo's own buffers
  // (1-2x the buffer, gloo_overhead_factor).
  std::unique_ptr<BoundAlgorithm> build_detached(ClassicKind kind, DType dtype, ReduceOp op,
                                                 int64_t count, void* user);
  // Destroys every instance.
  void clear() noexcept;
  size_t size() const { return entries_.size(); }

 private:
  BoundAlgorithm& build(ClassicKind kind, DType dtype, ReduceOp op, int64_t count, int root,
                        void* user);

  std::shared_ptr<gloo::Context> context_;
  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::list<BoundAlgorithm> entries_;  // most recently used first
  struct BindStats {
    uint64_t reused = 0, rebuilt = 0;
  };
  std::map<std::tuple<ClassicKind, DType, ReduceOp, int64_t>, BindStats> bind_stats_;
};

// All-gather on Gloo's classic buffers over the caller's buffer, with a clear to send: before a
// process sends into a peer's buffer, the peer tells it that the buffer is registered for this
// call. Up to kClearToSendExchangeMaxBytes of output, every process sends its block straight to
// every other (one step); above, a ring of P-1 steps, each block in two halves so that a process
// forwards the first while the second arrives (each process sends and receives P-1 blocks either
// way). Gloo's AllgatherRing has no clear to send, so in async mode a peer's next run can write
// into a result not yet copied out; and unlike gloo::allgather (unbound buffers), the receives here
// are woken when a connection fails, so a peer that dies in the middle of a block is seen at once.
// The clear-to-send buffers live as long as the object; each run registers buffers over the
// caller's blocks on the object's data slot before clearing anyone to send (a peer sends run n+1's
// data only after this rank's clear to send for it, so after run n's buffers are gone), and drops
// them on the way out; on an error it closes the context's connections first (Gloo's I/O thread may
// still hold them). Async mode only (in sync mode two processes writing large blocks to each other
// would deadlock). Every wait has the context's timeout. Every process must construct it at the
// same point (slots), and before its peers send to it: a clear to send that arrives for a slot not
// yet registered makes Gloo's I/O thread spin until it is.
inline constexpr size_t kClearToSendExchangeMaxBytes = size_t{2} << 20;
// Thrown by ClearToSendAllgather::run when a peer gathers blocks of another size, and by a
// broadcast's root when a receiver expects another size (verify=false lets such calls reach
// Gloo): the clear to send carries the size, and the rank that sees the difference refuses before
// sending anything, where Gloo's I/O thread would stop the process on a message larger than its
// buffer.
class GlooSizeMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ClearToSendAllgather {
 public:
  explicit ClearToSendAllgather(std::shared_ptr<gloo::Context> context);
  ~ClearToSendAllgather();
  ClearToSendAllgather(const ClearToSendAllgather&) = delete;
  ClearToSendAllgather& operator=(const ClearToSendAllgather&) = delete;

  // `data` holds context->size blocks of `block_bytes` (> 0), this process's already filled.
  void run(void* data, size_t block_bytes);

 private:
  struct Peer {
    uint64_t clear_in_word = 0, clear_out_word = 0;                // the sender's block size
    std::unique_ptr<gloo::transport::Buffer> clear_in, clear_out;  // for the object's life
    std::unique_ptr<gloo::transport::Buffer> in, out;              // for one run
  };
  // Clears `p` to send (saying this rank's block size); waits for `p`'s clear, and throws
  // GlooSizeMismatch when its block size differs.
  void clear(Peer& p, size_t block_bytes);
  void await_clear(Peer& p, size_t block_bytes);
  void exchange(uint8_t* data, size_t block_bytes, int slot);
  void ring(uint8_t* data, size_t block_bytes, int slot);

  std::shared_ptr<gloo::Context> context_;
  int data_slot_ = 0;
  std::vector<Peer> peers_;  // by rank; this process's entry unused
};

}  // namespace tributary::backends
