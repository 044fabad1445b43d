#include "transports/shm/shm_group.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include "algorithms/reduce_kernels.h"
#include "core/crypto/crypto.h"
#include "core/rendezvous.h"
#include "core/shareable_memory.h"
#include "core/strings.h"
#include "transports/shm/shm_segment.h"
#include "tributary/options.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TRIBUTARY_CPU_RELAX() _mm_pause()
#else
#define TRIBUTARY_CPU_RELAX() ((void)0)
#endif

namespace tributary::transports::shm {
namespace {

using algorithms::GroupCall;
using algorithms::MessageTag;
using Clock = std::chrono::steady_clock;

enum class Field { kStaged, kReduced, kConsumed };

const char* verb(Field f) {
  switch (f) {
    case Field::kStaged:
      return "stage its data for";
    case Field::kReduced:
      return "reduce its piece of";
    case Field::kConsumed:
      return "finish its reads and writes of";
  }
  return "";
}

MessageTag tag_of(const SlotHeader& h) {
  MessageTag t;
  t.sequence = h.sequence;
  t.step = h.step;
  t.count = h.count;
  t.collective = static_cast<Collective>(h.collective);
  t.op = static_cast<ReduceOp>(h.op);
  t.dtype = static_cast<DType>(h.dtype);
  return t;
}

SlotHeader header_of(const MessageTag& tag, size_t bytes, int root) {
  SlotHeader h;
  h.sequence = tag.sequence;
  h.step = tag.step;
  h.count = tag.count;
  h.collective = static_cast<uint8_t>(tag.collective);
  h.op = static_cast<uint8_t>(tag.op);
  h.dtype = static_cast<uint8_t>(tag.dtype);
  h.bytes = bytes;
  h.root = root;
  return h;
}

bool same_call(const SlotHeader& a, const SlotHeader& b) {
  // A direct all-reduce also names its registration: ranks on different registered buffers of
  // the same size would otherwise read and write buffers their peers are not using. (Where each
  // rank's input is may differ: see all_reduce_direct.)
  return a.sequence == b.sequence && a.count == b.count && a.bytes == b.bytes && a.root == b.root &&
         a.collective == b.collective && a.op == b.op && a.dtype == b.dtype &&
         a.single_copy == b.single_copy &&
         (a.single_copy != kHeaderDirect || a.source_address == b.source_address);
}

// Splits `total` items into chunks of at most `max_per_chunk`, as evenly as possible, each a
// multiple of `align` items (but the last): every rank computes the same cut.
struct Chunking {
  int64_t per = 0;
  int64_t chunks = 0;
  Chunking(int64_t total, int64_t max_per_chunk, int64_t align) {
    max_per_chunk = std::max<int64_t>(1, max_per_chunk);
    chunks = (total + max_per_chunk - 1) / max_per_chunk;
    if (chunks == 0) return;
    per = (total + chunks - 1) / chunks;
    per = std::min(max_per_chunk, (per + align - 1) / align * align);
    chunks = (total + per - 1) / per;
  }
  int64_t offset(int64_t k) const { return k * per; }
  int64_t length(int64_t k, int64_t total) const { return std::min(per, total - k * per); }
};

}  // namespace

struct ShmGroup::Impl {
  int rank = 0, size = 1;
  ShmGroupOptions options;
  std::vector<Mapping> maps;       // by local rank, this rank's own included
  std::vector<PeerProcess> procs;  // by local rank (this rank's own is empty)
  uint64_t next_chunk = 0;         // chunks every rank has walked so far
  Status error;
  // interrupt() from another thread: the waits fail with `interrupt_why` (peer_trouble).
  std::atomic<bool> interrupted{false};
  std::mutex interrupt_mu;
  Status interrupt_why;
  // All-reduces read and write the peers' buffers (every rank found at setup that it may).
  bool single_copy = false;
  std::vector<std::byte> scratch;  // single copy: a block for each peer
  // The largest kernel copy / memcpy time ratio a rank measured at setup, and that rank (-1: none
  // measured); options.single_copy_min_bytes is then the threshold it led to.
  double slowest_kernel_copy = 0;
  int slowest_kernel_copy_rank = -1;
  size_t layout_single_copy_from = SIZE_MAX;  // the threshold the layout gave (before measuring)

  // A registered buffer that every rank allocated shareable and maps (the direct path).
  struct Direct {
    uint64_t id = 0;            // the registration's, alike on every rank
    std::byte* data = nullptr;  // this rank's
    size_t bytes = 0;
    uint64_t serial = 0;  // of the shareable allocation (internal::ShareableRegion::serial)
    std::vector<PeerBuffer> peers;  // by local rank (this rank's own is empty)
    std::vector<std::byte*> views;  // every rank's buffer, by local rank, as mapped here
  };
  std::map<uint64_t, Direct> direct;  // by registration id
  std::map<uint64_t, std::string> registration_notes;  // why each registration is direct or not

  int global(int r) const {
    return options.global_ranks.size() == static_cast<size_t>(size) ? options.global_ranks[r] : r;
  }
  std::string name(int r) const { return "rank " + std::to_string(global(r)); }
  Control& ctl(int r) { return maps[static_cast<size_t>(r)].control(); }
  std::atomic<uint64_t>& field(int r, Field f) {
    Control& c = ctl(r);
    switch (f) {
      case Field::kStaged:
        return c.staged.value;
      case Field::kReduced:
        return c.reduced.value;
      case Field::kConsumed:
        break;
    }
    return c.consumed.value;
  }
  size_t slot_of(uint64_t g) const { return static_cast<size_t>(g % options.slots); }
  std::byte* slot(int r, uint64_t g) { return maps[static_cast<size_t>(r)].data(slot_of(g)); }

  void publish(Field f, uint64_t value) {
    field(rank, f).store(value, std::memory_order_release);
    ring_bell(ctl(rank));
  }

  // Breaks the group with `s` and tells the peers (the reason goes into this rank's segment).
  void fail(const Status& s) {
    if (!error.ok()) return;
    error = s;
    Control& c = ctl(rank);
    const std::string m = s.message().substr(0, kMaxReason - 1);
    std::memcpy(c.reason, m.data(), m.size());
    c.reason[m.size()] = '\0';
    c.aborted.store(1, std::memory_order_release);
    ring_bell(c);
  }

  std::string exited(int r, const std::string& what) const {
    return name(r) + " (process " + std::to_string(procs[static_cast<size_t>(r)].pid()) +
           " on this host) exited while " + name(rank) + " " + what +
           "; it may have been killed or crashed (see its log)";
  }

  // A peer that gave up or exited, or another thread's interrupt(); OK when none did. Every wait
  // looks here at least every millisecond.
  Status peer_trouble(const MessageTag& tag) {
    if (interrupted.load(std::memory_order_relaxed)) [[unlikely]] {
      std::lock_guard lock(interrupt_mu);
      return interrupt_why;
    }
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      Control& c = ctl(r);
      if (c.aborted.load(std::memory_order_acquire) != 0) {
        return aborted(name(r) + " gave up while " + name(rank) + " waited for " + tag.describe() +
                       ": " + std::string(c.reason, strnlen(c.reason, kMaxReason)));
      }
      if (procs[static_cast<size_t>(r)].exited()) {
        return unavailable(exited(r, "waited for " + tag.describe()));
      }
    }
    return Status();
  }

  // Waits until rank `r`'s counter `f` reaches `value`: polls for `spin` (yielding between looks
  // after kPollAlone, unless poll=always), then with more ranks than cores polls with sched_yield()
  // for `yield`, then sleeps on its bell, checking the deadline and the peers at least every
  // millisecond.
  Status wait_one(int r, Field f, uint64_t value, const GroupCall& call) {
    std::atomic<uint64_t>& a = field(r, f);
    if (a.load(std::memory_order_acquire) >= value) return Status();
    if (options.spin.count() > 0) {
      // A long spin (poll=always) looks at the peers and the deadline every millisecond, as the
      // sleeping loop below does; the default 50 us never gets there.
      const auto start = Clock::now();
      const auto spin_until = start + options.spin;
      const bool yields = options.spin != internal::kPollAlways;  // always: a pure poll
      auto next_look = start + std::chrono::milliseconds(1);
      for (;;) {
        for (int i = 0; i < 32; ++i) {
          if (a.load(std::memory_order_acquire) >= value) return Status();
          TRIBUTARY_CPU_RELAX();
        }
        const auto now = Clock::now();
        if (now >= spin_until) break;
        if (yields && now - start >= internal::kPollAlone) sched_yield();  // see kPollAlone
        if (now >= next_look) {
          if (Status s = peer_trouble(call.tag); !s.ok()) return s;
          if (now >= call.deadline) break;  // the loop below says so
          next_look = now + std::chrono::milliseconds(1);
        }
      }
    }
    if (options.yield.count() > 0) {
      // More ranks than cores: give the core away at once, so that the rank this one waits for
      // can run, but stay runnable (a futex wake-up costs more than the wait often lasts).
      const auto yield_until = Clock::now() + options.yield;
      do {
        if (a.load(std::memory_order_acquire) >= value) return Status();
        sched_yield();
      } while (Clock::now() < yield_until);
    }
    Control& c = ctl(r);
    while (a.load(std::memory_order_acquire) < value) {
      if (Status s = peer_trouble(call.tag); !s.ok()) return s;
      const auto now = Clock::now();
      if (now >= call.deadline) {
        return deadline_exceeded(name(r) + " did not " + verb(f) + " " + call.tag.describe() +
                                 " within the timeout; is it still running? (raise timeout= in "
                                 "the backend spec to wait longer)");
      }
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = c.bell.load(std::memory_order_seq_cst);
      if (a.load(std::memory_order_acquire) < value) {
        sleep_on_bell(
            c, seen,
            std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(1), call.deadline - now));
      }
      c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
    return Status();
  }

  Status wait_all(Field f, uint64_t value, const GroupCall& call) {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      TRIBUTARY_RETURN_IF_ERROR(wait_one(r, f, value, call));
    }
    return Status();
  }

  // Step 1 of chunk `g`: waits until this rank's slot is free (every rank consumed what it held),
  // fills it, labels it and publishes it; then waits for every rank's and checks their labels.
  Status stage(const GroupCall& call, uint64_t g, SlotHeader header,
               const std::function<void(std::byte*)>& fill) {
    if (g >= options.slots) {
      TRIBUTARY_RETURN_IF_ERROR(wait_all(Field::kConsumed, g + 1 - options.slots, call));
    }
    fill(slot(rank, g));
    header.chunk = g;
    maps[static_cast<size_t>(rank)].header(slot_of(g)) = header;
    publish(Field::kStaged, g + 1);
    TRIBUTARY_RETURN_IF_ERROR(wait_all(Field::kStaged, g + 1, call));
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const SlotHeader& theirs = maps[static_cast<size_t>(r)].header(slot_of(g));
      if (theirs.chunk != g || !same_call(theirs, header)) {
        return aborted("collective mismatch: " + name(r) + " issued " + describe(theirs) + " but " +
                       name(rank) + " issued " + describe(header) +
                       "; every rank must issue the same collectives in the same order, with the "
                       "same backend options" +
                       ((theirs.single_copy == kHeaderDirect) != (header.single_copy == kHeaderDirect)
                            ? std::string("; a registered buffer (register_buffers) must be used "
                                          "on every rank, and released at the same point")
                            : std::string()));
      }
    }
    return Status();
  }

  static std::string describe(const SlotHeader& h) {
    std::string s = tag_of(h).describe() + " (" + std::to_string(h.bytes) + " bytes";
    if (h.root >= 0) s += ", root " + std::to_string(h.root);
    if (h.single_copy == kHeaderSingleCopy) s += ", single copy";
    if (h.single_copy == kHeaderDirect) {
      s += ", on the registered shareable buffer of registration #" +
           (h.source_address == ~uint64_t{0} ? std::string("(batch_reduce's packs)")
                                             : std::to_string(h.source_address));
      if (h.output_address != 0) {
        s += " from that of registration #" + std::to_string(h.output_address);
      }
    }
    if (h.single_copy == kHeaderRegister) s += ", a registration";
    return s + ")";
  }

  // Runs `body` (a whole collective); any error breaks the group and tells the peers.
  template <typename Body>
  Status guarded(Body&& body) {
    if (!error.ok()) return error;
    Status s = body();
    if (!s.ok()) fail(s);
    return s;
  }

  // Copies `bytes` between `local` and `remote` in rank `r`'s address space (single copy).
  Status access_peer(int r, void* local, uint64_t remote, size_t bytes, PeerAccess access,
                     const GroupCall& call) {
    const int e = peer_memory(procs[static_cast<size_t>(r)].pid(), local, remote, bytes, access);
    if (e == 0) return Status();
    if (Status s = peer_trouble(call.tag); !s.ok()) return s;
    const bool read = access == PeerAccess::kRead;
    if (e == ESRCH) {
      return unavailable(exited(r, std::string(read ? "read its data" : "write its result") +
                                       " for " + call.tag.describe()));
    }
    return unavailable(std::string("cannot ") + (read ? "read" : "write") + " the buffer of " +
                       name(r) + " for " + call.tag.describe() + " (" +
                       (read ? "process_vm_readv" : "process_vm_writev") + ": " + std::strerror(e) +
                       "); set shm_single_copy=off to exchange data through the slots");
  }

  Status all_reduce(const GroupCall& call, std::byte* out, const std::byte* in, int64_t count,
                    DType dtype, ReduceOp op, int64_t mean_divisor);
  Status all_reduce_single_copy(const GroupCall& call, std::byte* out, const std::byte* in,
                                int64_t count, DType dtype, ReduceOp op, int64_t mean_divisor);
  Status all_reduce_direct(const GroupCall& call, const Direct& d, const Direct* from,
                           const std::byte* in, int64_t count, DType dtype, ReduceOp op,
                           int64_t mean_divisor);
  Status all_gather_direct(const GroupCall& call, const Direct& d, size_t block);
  Status broadcast_direct(const GroupCall& call, const Direct& d, size_t bytes, int root);
  Status reduce_scatter_direct(const GroupCall& call, const Direct& d, std::byte* out,
                               int64_t count, DType dtype, ReduceOp op, int64_t mean_divisor);
  // Walks this rank's 1/n piece of a `count`-element all-reduce (pieces of whole 64-byte lines, the
  // last ones short or empty) in blocks of at most `block_bytes`: for each, gave_up() (a peer that
  // gave up may have handed its buffers back), then body(byte offset, bytes, elements).
  template <typename GaveUp, typename Body>
  Status for_each_own_block(int64_t count, DType dtype, size_t block_bytes, GaveUp& gave_up,
                            Body&& body) const {
    const size_t elem = dtype_size(dtype);
    const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
    const int64_t piece = ((count + size - 1) / size + align - 1) / align * align;
    const int64_t block =
        std::max<int64_t>(align, static_cast<int64_t>(block_bytes / elem) / align * align);
    const int64_t last = std::min<int64_t>(count, piece * (rank + 1));
    for (int64_t b = std::min<int64_t>(count, piece * rank); b < last; b += block) {
      TRIBUTARY_RETURN_IF_ERROR(gave_up());
      const int64_t n = std::min<int64_t>(block, last - b);
      TRIBUTARY_RETURN_IF_ERROR(
          body(static_cast<size_t>(b) * elem, static_cast<size_t>(n) * elem, n));
    }
    return Status();
  }
  // The registration (direct) whose buffer starts at `data` and holds at least `bytes`, for a
  // call over `small_bytes`; null if none.
  const Direct* direct_at(const std::byte* data, size_t bytes) const {
    if (bytes <= options.small_bytes) return nullptr;
    for (const auto& [id, d] : direct) {
      if (d.data == data && bytes <= d.bytes) return &d;
    }
    return nullptr;
  }
  // FailedPrecondition when the buffer of registration `d` was freed while registered: one freed
  // (and its address reused) would have every peer read or write memory this rank no longer holds.
  Status still_held(const GroupCall& call, const Direct& d, size_t bytes) const {
    const std::optional<internal::ShareableRegion> still = internal::find_shareable(d.data, bytes);
    if (still && still->serial == d.serial) return Status();
    return failed_precondition(
        call.tag.describe() + ": the buffer of registration #" + std::to_string(d.id) +
        " was freed while registered; register_buffers' buffers must stay valid until the "
        "registration is released (on every rank)");
  }
  // The frame of every direct call (see the header): the header round (the entry barrier), then
  // `body(g, gave_up)`, which calls gave_up() before each block it reads or writes in a peer's
  // buffer (an error once a peer gave up: that peer may have handed its buffers back to its
  // caller), then `consumed` (the exit barrier). On failure this rank tells its peers and waits
  // until none still reads or writes its buffers.
  uint64_t direct_calls = 0;  // run on the direct path (ShmGroup::direct_calls)
  template <typename Body>
  Status direct_call(const GroupCall& call, SlotHeader header, Body&& body) {
    ++direct_calls;
    header.single_copy = kHeaderDirect;
    return framed_call(call, header, std::forward<Body>(body));
  }
  // direct_call's frame, for any call whose ranks write into each other's buffers (the direct path,
  // and single copy's writes into the peers' outputs).
  template <typename Body>
  Status framed_call(const GroupCall& call, const SlotHeader& header, Body&& body) {
    const uint64_t g = next_chunk++;
    auto gave_up = [&]() -> Status {
      for (int r = 0; r < size; ++r) {
        if (r != rank && ctl(r).aborted.load(std::memory_order_acquire) != 0) {
          return peer_trouble(call.tag);
        }
      }
      return Status();
    };
    Status s = stage(call, g, header, [](std::byte*) {});
    // Pairs with the fence in quiesce(): either this rank sees a peer's `aborted` in gave_up(), or
    // that peer sees this rank's `staged` and waits until it is done.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (s.ok()) s = body(g, gave_up);
    if (s.ok()) {
      publish(Field::kConsumed, g + 1);
      s = wait_all(Field::kConsumed, g + 1, call);
    }
    if (!s.ok()) {
      // Published before waiting, so that the peers stop too. A peer can only have passed the
      // entry barrier (and so touch this rank's buffers) once this rank staged its header.
      fail(s);
      if (field(rank, Field::kStaged).load(std::memory_order_relaxed) >= g + 1) quiesce(g, call);
    }
    return s;
  }
  Status register_buffer(const GroupCall& call, uint64_t id, std::byte* data, int64_t count,
                         DType dtype);
  // After a failure in the middle of a framed call (chunk `g`: the direct path, single copy):
  // waits until no live peer may still read or write this rank's buffers (each has finished,
  // failed or exited), so that the caller never gets back a buffer that changes under it, nor hands
  // one back that a peer reads. Bounded by the call's deadline (at least 100 ms): a peer stalled
  // past it that then reads a buffer its caller took back cannot succeed with what it read, since
  // this rank never publishes `consumed` for the call; but one stalled inside a block (it checks
  // before every block, and single copy before every write, whether this rank gave up) may still
  // write that block into this rank's buffer after the call returned its error. Only a peer
  // stopped (SIGSTOP, a debugger) or starved for longer than that can.
  void quiesce(uint64_t g, const GroupCall& call);
  Status reduce_scatter(const GroupCall& call, const std::byte* in, std::byte* out, int64_t count,
                        DType dtype, ReduceOp op, int64_t mean_divisor);
  Status all_gather(const GroupCall& call, std::byte* data, size_t block);
  Status broadcast(const GroupCall& call, std::byte* data, size_t bytes, int root);
};

Status ShmGroup::Impl::all_reduce(const GroupCall& call, std::byte* out, const std::byte* in,
                                  int64_t count, DType dtype, ReduceOp op, int64_t mean_divisor) {
  const size_t elem = dtype_size(dtype);
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
  const Chunking cut(count, static_cast<int64_t>(options.slot_bytes / elem), align);
  const size_t total = static_cast<size_t>(count) * elem;
  const bool small = total <= options.small_bytes;
  // The registered buffer, or a prefix of it: every rank's header says how much (a rank that
  // all-reduces another length is a mismatch), and every rank's registration starts at its own.
  // Out of place, the input may be a registration of its own too.
  if (const Direct* to = direct_at(out, total); to != nullptr) {
    return all_reduce_direct(call, *to, in != out ? direct_at(in, total) : nullptr, in, count,
                             dtype, op, mean_divisor);
  }
  if (single_copy && !small && total >= options.single_copy_min_bytes &&
      total <= options.single_copy_max_bytes) {
    return all_reduce_single_copy(call, out, in, count, dtype, op, mean_divisor);
  }
  const SlotHeader header = header_of(call.tag, total, -1);
  std::vector<const void*> srcs(static_cast<size_t>(size));
  // Chunk k's piece of rank r (the large path): reduced by r, which reads it from `in` itself, so
  // only the other pieces are staged.
  auto piece_range = [&](int64_t m, int r) {
    const int64_t piece = ((m + size - 1) / size + align - 1) / align * align;
    const int64_t b = std::min<int64_t>(m, piece * r);
    return std::pair<int64_t, int64_t>(b, std::min<int64_t>(m, b + piece));
  };
  // The last step of chunk k (large path): once every rank has reduced its piece, copies the other
  // pieces from their owners' slots, and frees this rank's slot for reuse.
  auto gather = [&](int64_t k, uint64_t g) -> Status {
    const int64_t m = cut.length(k, count);
    const size_t at = static_cast<size_t>(cut.offset(k)) * elem;
    TRIBUTARY_RETURN_IF_ERROR(wait_all(Field::kReduced, g + 1, call));
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const auto [rb, re] = piece_range(m, r);
      if (re > rb) {
        std::memcpy(out + at + static_cast<size_t>(rb) * elem,
                    slot(r, g) + static_cast<size_t>(rb) * elem,
                    static_cast<size_t>(re - rb) * elem);
      }
    }
    publish(Field::kConsumed, g + 1);
    return Status();
  };
  for (int64_t k = 0; k < cut.chunks; ++k) {
    const int64_t off = cut.offset(k), m = cut.length(k, count);
    const size_t at = static_cast<size_t>(off) * elem;
    const uint64_t g = next_chunk++;
    // Named copies, not a structured binding: the lambda below captures them (clang 14 cannot).
    const std::pair<int64_t, int64_t> mine =
        small ? std::pair<int64_t, int64_t>(0, 0) : piece_range(m, rank);
    const int64_t b = mine.first, e = mine.second;
    TRIBUTARY_RETURN_IF_ERROR(stage(call, g, header, [&](std::byte* s) {
      std::memcpy(s, in + at, static_cast<size_t>(b) * elem);
      std::memcpy(s + static_cast<size_t>(e) * elem, in + at + static_cast<size_t>(e) * elem,
                  static_cast<size_t>(m - e) * elem);
    }));
    if (small) {
      // Every rank reduces the whole chunk: one synchronisation, the latency path.
      for (int r = 0; r < size; ++r) srcs[static_cast<size_t>(r)] = slot(r, g);
      void* dst = out + at;
      algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1), static_cast<size_t>(m),
                         mean_divisor);
      publish(Field::kConsumed, g + 1);
      continue;
    }
    // This rank's piece, reduced (its own part read straight from `in`, sources in rank order as
    // every reducer uses) into its output, then copied from there into its own slot for the
    // others. Not reduced into both at once: vector stores to slot lines that a peer core has
    // read are slow where that core is far away (an invalidation round trip each), while
    // memcpy's string copy is not. tributary-bench, 2 processes on the 2 vCPUs of an AMD EPYC
    // VM, float32 sum in place, before -> after, interleaved: 1 MiB 5.9-7.1 -> 12.6-14.0 GB/s,
    // 16 MiB 5.6-6.2 -> 8.6-12.5, 256 MiB 5.5-5.8 -> 6.5-10.0. A two-thread copy of this loop
    // showed no change in the VM's other mode, where the cores are close (13-14 GB/s at 16 MiB).
    if (e > b) {
      const size_t pb = static_cast<size_t>(b) * elem;
      const size_t n = static_cast<size_t>(e - b);
      for (int r = 0; r < size; ++r) srcs[static_cast<size_t>(r)] = slot(r, g) + pb;
      srcs[static_cast<size_t>(rank)] = in + at + pb;
      void* dst = out + at + pb;
      algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1), n, mean_divisor);
      std::memcpy(slot(rank, g) + pb, dst, n * elem);
    }
    publish(Field::kReduced, g + 1);
    // The previous chunk's gather, one chunk behind: every rank that staged this chunk (the wait
    // in stage() above) has reduced its piece of the previous one, so this does not wait, where
    // gathering this chunk now would wait for the slowest rank's reduction of it.
    if (k > 0) TRIBUTARY_RETURN_IF_ERROR(gather(k - 1, g - 1));
  }
  if (!small && cut.chunks > 0) {
    TRIBUTARY_RETURN_IF_ERROR(gather(cut.chunks - 1, next_chunk - 1));
  }
  return Status();
}

// The single-copy all-reduce (see the header), in direct_call's frame: the header round carries
// every rank's input and output address; then each rank reduces its 1/n share a block at a time,
// reading each peer's input of the block into a scratch block (which stays in the cache), reducing
// it with its own input into its output, and writing the result from there into every peer's
// output. Each share of every rank's buffers is read and written by its reducer alone, so in place
// too no rank waits on another between the barriers; and each piece is reduced from every rank's
// input in rank order, so that every rank ends with the same bits, as on the slot path.
Status ShmGroup::Impl::all_reduce_single_copy(const GroupCall& call, std::byte* out,
                                              const std::byte* in, int64_t count, DType dtype,
                                              ReduceOp op, int64_t mean_divisor) {
  SlotHeader header = header_of(call.tag, static_cast<size_t>(count) * dtype_size(dtype), -1);
  header.single_copy = kHeaderSingleCopy;
  header.source_address = reinterpret_cast<uintptr_t>(in);
  header.output_address = reinterpret_cast<uintptr_t>(out);
  return framed_call(call, header, [&](uint64_t g, auto& gave_up) -> Status {
    std::vector<uint64_t> sources(static_cast<size_t>(size)), outputs(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const SlotHeader& h = maps[static_cast<size_t>(r)].header(slot_of(g));
      sources[static_cast<size_t>(r)] = h.source_address;
      outputs[static_cast<size_t>(r)] = h.output_address;
    }
    std::vector<const void*> srcs(static_cast<size_t>(size));
    return for_each_own_block(
        count, dtype, options.single_copy_block_bytes, gave_up,
        [&](size_t off, size_t len, int64_t n) -> Status {
          for (int r = 0; r < size; ++r) {
            if (r == rank) {
              srcs[static_cast<size_t>(r)] = in + off;
              continue;
            }
            std::byte* to = scratch.data() + static_cast<size_t>(r < rank ? r : r - 1) *
                                                 options.single_copy_block_bytes;
            TRIBUTARY_RETURN_IF_ERROR(access_peer(r, to, sources[static_cast<size_t>(r)] + off, len,
                                                  PeerAccess::kRead, call));
            srcs[static_cast<size_t>(r)] = to;
          }
          void* dst = out + off;
          algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1),
                             static_cast<size_t>(n), mean_divisor);
          for (int r = 0; r < size; ++r) {
            if (r == rank) continue;
            // A peer that gave up since the block began may have handed its output back already.
            if (ctl(r).aborted.load(std::memory_order_acquire) != 0) return peer_trouble(call.tag);
            TRIBUTARY_RETURN_IF_ERROR(access_peer(r, out + off,
                                                  outputs[static_cast<size_t>(r)] + off, len,
                                                  PeerAccess::kWrite, call));
          }
          return Status();
        });
  });
}

// Registration, in two header-only rounds: every rank publishes where its buffer lies (its memfd
// and offset, or that it is not shareable), maps every peer's where all are shareable, then
// publishes whether that worked; the direct path is used only where every rank mapped every peer.
Status ShmGroup::Impl::register_buffer(const GroupCall& call, uint64_t id, std::byte* data,
                                       int64_t count, DType dtype) {
  direct.erase(id);
  registration_notes.erase(id);
  const size_t total = static_cast<size_t>(count) * dtype_size(dtype);
  const std::optional<internal::ShareableRegion> region = internal::find_shareable(data, total);
  SlotHeader header = header_of(call.tag, total, -1);
  header.single_copy = kHeaderRegister;
  header.source_address = region ? static_cast<uint64_t>(region->fd) : UINT64_MAX;
  header.output_address = region ? region->offset : 0;
  const uint64_t g = next_chunk++;
  TRIBUTARY_RETURN_IF_ERROR(stage(call, g, header, [](std::byte*) {}));
  std::vector<std::pair<uint64_t, uint64_t>> where(static_cast<size_t>(size));
  std::string why_not;
  for (int r = 0; r < size; ++r) {
    const SlotHeader& h = maps[static_cast<size_t>(r)].header(slot_of(g));
    where[static_cast<size_t>(r)] = {h.source_address, h.output_address};
    if (h.source_address == UINT64_MAX && why_not.empty()) {
      why_not = "the buffer of " + name(r) +
                " is not from Buffer::allocate_shareable (every rank's must be)";
    }
  }
  publish(Field::kConsumed, g + 1);
  Direct d;
  d.id = id;
  d.data = data;
  d.bytes = total;
  d.serial = region ? region->serial : 0;
  d.peers.resize(static_cast<size_t>(size));
  d.views.resize(static_cast<size_t>(size));
  d.views[static_cast<size_t>(rank)] = data;
  if (total <= options.small_bytes && why_not.empty()) {
    why_not = "it is no larger than " + format_size(options.small_bytes) +
              " (such all-reduces take the slots' one-step path)";
  }
  bool mapped = why_not.empty();
  for (int r = 0; r < size && mapped; ++r) {
    if (r == rank) continue;
    auto b = PeerBuffer::open(procs[static_cast<size_t>(r)].pid(),
                              static_cast<int>(where[static_cast<size_t>(r)].first),
                              where[static_cast<size_t>(r)].second, total);
    if (!b.ok()) {
      mapped = false;
      why_not = name(rank) + " could not map the buffer of " + name(r) + ": " + b.status().message();
      break;
    }
    d.views[static_cast<size_t>(r)] = b->data();
    d.peers[static_cast<size_t>(r)] = std::move(*b);
  }
  header.source_address = header.output_address = 0;
  header.verdict = mapped ? kVerdictMapped : kVerdictRefused;
  const uint64_t g2 = next_chunk++;
  TRIBUTARY_RETURN_IF_ERROR(stage(call, g2, header, [](std::byte*) {}));
  for (int r = 0; r < size; ++r) {
    if (maps[static_cast<size_t>(r)].header(slot_of(g2)).verdict == kVerdictMapped) continue;
    if (mapped) why_not = name(r) + " could not map every peer's buffer (its info log says why)";
    mapped = false;
  }
  publish(Field::kConsumed, g2 + 1);
  registration_notes[id] =
      mapped ? "collectives on it (all-reduce, all-gather, broadcast, reduce-scatter) read and "
               "write every rank's buffer directly (shared memory, no copies)"
             : "collectives on it take the usual shared-memory path: " + why_not;
  if (mapped) direct.emplace(id, std::move(d));
  return Status();
}

// The direct all-reduce (see the header): every rank's buffer is mapped by every rank, so each
// reduces its piece from all of them (in rank order: every rank gets the same bits) and writes the
// result into every one of them. The header round is the entry barrier (every rank's input is in
// its buffer, and the call is the same); `consumed` the exit one (no rank writes into this one's
// buffer any more).
Status ShmGroup::Impl::all_reduce_direct(const GroupCall& call, const Direct& d,
                                         const Direct* from, const std::byte* in, int64_t count,
                                         DType dtype, ReduceOp op, int64_t mean_divisor) {
  const size_t elem = dtype_size(dtype);
  const size_t total = static_cast<size_t>(count) * elem;
  TRIBUTARY_RETURN_IF_ERROR(still_held(call, d, total));
  if (from != nullptr) TRIBUTARY_RETURN_IF_ERROR(still_held(call, *from, total));
  // Out of place from a registered input, the peers read the input where it is (the header names
  // its registration); from any other, it is copied into the output first.
  if (from == nullptr && in != d.data) std::memcpy(d.data, in, total);
  SlotHeader header = header_of(call.tag, total, -1);
  header.source_address = d.id;
  header.output_address = from != nullptr ? from->id : 0;
  return direct_call(call, header, [&](uint64_t g, auto& gave_up) -> Status {
    // Each rank's input: its registered input, or its output (copied in, or in place). Ranks may
    // differ here (one process reducing several local replicas into its output first, beside one
    // that has a single replica), so each header says where its own input is.
    std::vector<const std::byte*> sources(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const uint64_t input = maps[static_cast<size_t>(r)].header(slot_of(g)).output_address;
      const auto it = input == 0 ? direct.end() : direct.find(input);
      if (input != 0 && it == direct.end()) {
        return aborted(call.tag.describe() + ": " + name(r) +
                       " reads its input from registration #" + std::to_string(input) +
                       ", which " + name(rank) +
                       " does not hold; a registration must be released at the same point on "
                       "every rank");
      }
      sources[static_cast<size_t>(r)] =
          (it == direct.end() ? d : it->second).views[static_cast<size_t>(r)];
    }
    std::vector<const void*> srcs(static_cast<size_t>(size));
    return for_each_own_block(count, dtype, options.slot_bytes, gave_up,
                              [&](size_t off, size_t len, int64_t n) -> Status {
                                for (int r = 0; r < size; ++r) {
                                  srcs[static_cast<size_t>(r)] =
                                      sources[static_cast<size_t>(r)] + off;
                                }
                                void* dst = d.data + off;
                                algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1),
                                                   static_cast<size_t>(n), mean_divisor);
                                // Reduced here first, then copied: memcpy's string stores, not the
                                // kernel's vector ones, go to the lines that the peers' cores read
                                // (see all_reduce).
                                for (int r = 0; r < size; ++r) {
                                  if (r != rank)
                                    std::memcpy(d.views[static_cast<size_t>(r)] + off, dst, len);
                                }
                                return Status();
                              });
  });
}

// The direct all-gather: every rank's own block is in its registered buffer at the entry barrier,
// and each rank copies every peer's block from the peer's buffer into its own (it writes only its
// own buffer; the exit barrier keeps each block until every peer has read it).
Status ShmGroup::Impl::all_gather_direct(const GroupCall& call, const Direct& d, size_t block) {
  TRIBUTARY_RETURN_IF_ERROR(still_held(call, d, block * static_cast<size_t>(size)));
  SlotHeader header = header_of(call.tag, block, -1);
  header.source_address = d.id;
  return direct_call(call, header, [&](uint64_t, auto& gave_up) -> Status {
    for (size_t off = 0; off < block; off += options.slot_bytes) {
      TRIBUTARY_RETURN_IF_ERROR(gave_up());
      const size_t len = std::min(options.slot_bytes, block - off);
      for (int r = 0; r < size; ++r) {
        const size_t at = static_cast<size_t>(r) * block + off;
        if (r != rank) std::memcpy(d.data + at, d.views[static_cast<size_t>(r)] + at, len);
      }
    }
    return Status();
  });
}

// The direct reduce-scatter: every rank's input is its registered buffer (size() blocks of
// `count`), and each rank reduces block `rank` from all of them into its output, which nobody
// else touches (the exit barrier keeps each input until every peer has read its block).
Status ShmGroup::Impl::reduce_scatter_direct(const GroupCall& call, const Direct& d,
                                             std::byte* out, int64_t count, DType dtype,
                                             ReduceOp op, int64_t mean_divisor) {
  const size_t elem = dtype_size(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  TRIBUTARY_RETURN_IF_ERROR(still_held(call, d, bytes * static_cast<size_t>(size)));
  SlotHeader header = header_of(call.tag, bytes * static_cast<size_t>(size), -1);
  header.source_address = d.id;
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
  const int64_t block = std::max<int64_t>(align, static_cast<int64_t>(options.slot_bytes / elem) /
                                                     align * align);
  return direct_call(call, header, [&](uint64_t, auto& gave_up) -> Status {
    std::vector<const void*> srcs(static_cast<size_t>(size));
    for (int64_t b = 0; b < count; b += block) {
      TRIBUTARY_RETURN_IF_ERROR(gave_up());
      const int64_t n = std::min<int64_t>(block, count - b);
      const size_t off = static_cast<size_t>(rank) * bytes + static_cast<size_t>(b) * elem;
      for (int r = 0; r < size; ++r) {
        srcs[static_cast<size_t>(r)] = d.views[static_cast<size_t>(r)] + off;
      }
      void* dst = out + static_cast<size_t>(b) * elem;
      algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1), static_cast<size_t>(n),
                         mean_divisor);
    }
    return Status();
  });
}

// The direct broadcast: each rank, the root included, copies its 1/n piece of the root's registered
// buffer into every other rank's (so every core copies, as the slots have root and peers copy at
// once: one rank copying the whole buffer alone moved 10% less at 128 MiB with 2 processes).
Status ShmGroup::Impl::broadcast_direct(const GroupCall& call, const Direct& d, size_t bytes,
                                        int root) {
  TRIBUTARY_RETURN_IF_ERROR(still_held(call, d, bytes));
  SlotHeader header = header_of(call.tag, bytes, root);
  header.source_address = d.id;
  const size_t piece = (bytes + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
  const size_t first = std::min(bytes, (piece + 63) / 64 * 64 * static_cast<size_t>(rank));
  const size_t last = std::min(bytes, first + (piece + 63) / 64 * 64);
  return direct_call(call, header, [&](uint64_t, auto& gave_up) -> Status {
    const std::byte* from = d.views[static_cast<size_t>(root)];
    for (size_t off = first; off < last; off += options.slot_bytes) {
      TRIBUTARY_RETURN_IF_ERROR(gave_up());
      const size_t len = std::min(options.slot_bytes, last - off);
      for (int r = 0; r < size; ++r) {
        if (r != root) std::memcpy(d.views[static_cast<size_t>(r)] + off, from + off, len);
      }
    }
    return Status();
  });
}

void ShmGroup::Impl::quiesce(uint64_t g, const GroupCall& call) {
  // `aborted` is published (fail()); a peer that has not staged yet will see it before it writes
  // (the fence pairs with the one after its entry barrier), so only peers past it are waited for.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Past the deadline too, briefly: a peer inside the loop sees `aborted` within one block.
  const auto until = std::max(call.deadline, Clock::now() + std::chrono::milliseconds(100));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    Control& c = ctl(r);
    if (c.staged.value.load(std::memory_order_acquire) < g + 1) continue;
    while (c.consumed.value.load(std::memory_order_acquire) < g + 1 &&
           c.aborted.load(std::memory_order_acquire) == 0 &&
           !procs[static_cast<size_t>(r)].exited() && Clock::now() < until) {
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = c.bell.load(std::memory_order_seq_cst);
      if (c.consumed.value.load(std::memory_order_acquire) < g + 1 &&
          c.aborted.load(std::memory_order_acquire) == 0) {
        sleep_on_bell(c, seen, std::chrono::milliseconds(1));
      }
      c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
}

Status ShmGroup::Impl::reduce_scatter(const GroupCall& call, const std::byte* in, std::byte* out,
                                      int64_t count, DType dtype, ReduceOp op,
                                      int64_t mean_divisor) {
  const size_t elem = dtype_size(dtype);
  const size_t total = static_cast<size_t>(count) * elem * static_cast<size_t>(size);
  if (const Direct* d = direct_at(in, total); d != nullptr) {
    return reduce_scatter_direct(call, *d, out, count, dtype, op, mean_divisor);
  }
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
  const int64_t per_block = static_cast<int64_t>(options.slot_bytes / elem) / size;
  const Chunking cut(count, per_block, align);
  const SlotHeader header =
      header_of(call.tag, static_cast<size_t>(count) * elem * static_cast<size_t>(size), -1);
  std::vector<const void*> srcs(static_cast<size_t>(size));
  for (int64_t k = 0; k < cut.chunks; ++k) {
    const int64_t off = cut.offset(k), m = cut.length(k, count);
    const size_t piece = static_cast<size_t>(m) * elem;
    const uint64_t g = next_chunk++;
    // The slot holds this chunk's part of every block, block j at j * piece.
    TRIBUTARY_RETURN_IF_ERROR(stage(call, g, header, [&](std::byte* s) {
      for (int j = 0; j < size; ++j) {
        std::memcpy(
            s + static_cast<size_t>(j) * piece,
            in + (static_cast<size_t>(j) * static_cast<size_t>(count) + static_cast<size_t>(off)) *
                     elem,
            piece);
      }
    }));
    for (int r = 0; r < size; ++r) {
      srcs[static_cast<size_t>(r)] = slot(r, g) + static_cast<size_t>(rank) * piece;
    }
    void* dst = out + static_cast<size_t>(off) * elem;
    algorithms::reduce(op, dtype, srcs, std::span<void* const>(&dst, 1), static_cast<size_t>(m),
                       mean_divisor);
    publish(Field::kConsumed, g + 1);
  }
  return Status();
}

Status ShmGroup::Impl::all_gather(const GroupCall& call, std::byte* data, size_t block) {
  if (const Direct* d = direct_at(data, block * static_cast<size_t>(size)); d != nullptr) {
    return all_gather_direct(call, *d, block);
  }
  const Chunking cut(static_cast<int64_t>(block), static_cast<int64_t>(options.slot_bytes), 64);
  const SlotHeader header = header_of(call.tag, block, -1);
  for (int64_t k = 0; k < cut.chunks; ++k) {
    const size_t off = static_cast<size_t>(cut.offset(k));
    const size_t m = static_cast<size_t>(cut.length(k, static_cast<int64_t>(block)));
    const uint64_t g = next_chunk++;
    TRIBUTARY_RETURN_IF_ERROR(stage(call, g, header, [&](std::byte* s) {
      std::memcpy(s, data + static_cast<size_t>(rank) * block + off, m);
    }));
    for (int r = 0; r < size; ++r) {
      if (r != rank) std::memcpy(data + static_cast<size_t>(r) * block + off, slot(r, g), m);
    }
    publish(Field::kConsumed, g + 1);
  }
  return Status();
}

Status ShmGroup::Impl::broadcast(const GroupCall& call, std::byte* data, size_t bytes, int root) {
  if (const Direct* d = direct_at(data, bytes); d != nullptr) {
    return broadcast_direct(call, *d, bytes, root);
  }
  const Chunking cut(static_cast<int64_t>(bytes), static_cast<int64_t>(options.slot_bytes), 64);
  const SlotHeader header = header_of(call.tag, bytes, root);
  for (int64_t k = 0; k < cut.chunks; ++k) {
    const size_t off = static_cast<size_t>(cut.offset(k));
    const size_t m = static_cast<size_t>(cut.length(k, static_cast<int64_t>(bytes)));
    const uint64_t g = next_chunk++;
    TRIBUTARY_RETURN_IF_ERROR(stage(call, g, header, [&](std::byte* s) {
      if (rank == root) std::memcpy(s, data + off, m);
    }));
    if (rank != root) std::memcpy(data + off, slot(root, g), m);
    publish(Field::kConsumed, g + 1);
  }
  return Status();
}

// --- setup
// -----------------------------------------------------------------------------------------
namespace {

// "pid:fd:bytes:layout" as published; the layout text may hold colons (it comes last).
struct Published {
  int64_t pid = 0;
  int fd = -1;
  size_t bytes = 0;
  std::string layout;
};

std::optional<Published> parse_published(const std::string& text) {
  Published p;
  const char* at = text.data();
  const char* end = text.data() + text.size();
  auto field = [&](auto& v) {
    auto [next, ec] = std::from_chars(at, end, v);
    if (ec != std::errc() || next == end || *next != ':') return false;
    at = next + 1;
    return true;
  };
  if (!field(p.pid) || !field(p.fd) || !field(p.bytes)) return std::nullopt;
  p.layout.assign(at, end);
  return p;
}

// How many times as long the kernel takes to copy `bytes` of process `pid`'s memory at `remote`
// (process_vm_readv, single copy's call) as memcpy takes from `mapped`, the same memory as this
// process maps it. Each try copies at least 1 MiB (a small block many times over), so that the
// clock's resolution does not matter; the best of 8 interleaved tries each counts, after one
// untimed try of each (page faults): a try that lost the CPU only gets slower, so the best is the
// copy's own cost. 0 when a read fails (the probe before reports why) or memcpy took no
// measurable time.
double kernel_copy_ratio(int64_t pid, uint64_t remote, const std::byte* mapped, size_t bytes) {
  constexpr int kTries = 8;
  const size_t repeats = std::max<size_t>(1, (size_t{1} << 20) / bytes);
  std::vector<std::byte> into(bytes);
  auto best = Clock::duration::max();
  auto best_memcpy = Clock::duration::max();
  for (int i = 0; i <= kTries; ++i) {
    const auto t0 = Clock::now();
    for (size_t k = 0; k < repeats; ++k) {
      if (peer_memory(pid, into.data(), remote, bytes, PeerAccess::kRead) != 0) return 0;
    }
    const auto t1 = Clock::now();
    for (size_t k = 0; k < repeats; ++k) {
      std::memcpy(into.data(), mapped, bytes);
      asm volatile("" : : "r"(into.data()) : "memory");  // each copy is needed
    }
    const auto t2 = Clock::now();
    if (i == 0) continue;
    best = std::min(best, t1 - t0);
    best_memcpy = std::min(best_memcpy, t2 - t1);
  }
  if (best_memcpy.count() <= 0) return 0;
  return static_cast<double>(best.count()) / static_cast<double>(best_memcpy.count());
}

}  // namespace

size_t last_level_cache_bytes() {
  size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream type(dir + "/type"), size(dir + "/size");
    std::string t, text;
    if (!(type >> t) || !(size >> text)) continue;
    if (t != "Unified") continue;
    size_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc()) continue;
    const char unit = end < text.data() + text.size() ? *end : 'B';
    const size_t scale = unit == 'K' ? size_t{1} << 10 : unit == 'M' ? size_t{1} << 20 : 1;
    largest = std::max(largest, value * scale);
  }
  return largest;
}

namespace {

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { close_now(); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

}  // namespace

size_t single_copy_slow_from(size_t llc_bytes) {
  constexpr size_t kLeast = size_t{16} << 20, kMost = size_t{1} << 30;
  const size_t llc = llc_bytes == 0 ? size_t{32} << 20 : std::min(llc_bytes, kMost);
  return std::clamp(2 * llc, kLeast, kMost);
}

size_t single_copy_from(size_t layout_from, const std::vector<double>& ratios, size_t llc_bytes) {
  const bool slow =
      std::any_of(ratios.begin(), ratios.end(), [](double r) { return r > kSlowKernelCopyRatio; });
  if (!slow || layout_from == SIZE_MAX) return layout_from;
  return std::max(layout_from, single_copy_slow_from(llc_bytes));
}

ShmGroup::ShmGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmGroup::~ShmGroup() = default;

StatusOr<std::unique_ptr<ShmGroup>> ShmGroup::create(Store& store, int rank, int size,
                                                     const ShmGroupOptions& options) {
  const std::string who = "shared memory (rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + " on this host)";
  if (options.slot_bytes < 4096 || options.slots < 2 || options.single_copy_block_bytes < 4096) {
    return invalid_argument(who +
                            ": slots of at least 4 KiB, at least 2 of them, and single-copy blocks "
                            "of at least 4 KiB are needed");
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->options = options;
  impl->maps.resize(static_cast<size_t>(size));
  impl->procs.resize(static_cast<size_t>(size));
  const auto deadline = Clock::now() + options.timeout;
  auto remaining = [&] {
    return std::chrono::duration_cast<Store::Duration>(
        std::max(Clock::duration::zero(), deadline - Clock::now()));
  };
  const uint64_t layout = internal::digest64(options.layout);
  int fd = -1;
  TRIBUTARY_ASSIGN_OR_RETURN(impl->maps[static_cast<size_t>(rank)],
                             Mapping::create(options.slots, options.slot_bytes, layout, &fd));
  FdCloser own(fd);
  const size_t bytes = impl->maps[static_cast<size_t>(rank)].size();
  TRIBUTARY_RETURN_IF_ERROR(store.set("shm/" + std::to_string(rank),
                                      std::to_string(::getpid()) + ":" + std::to_string(fd) + ":" +
                                          std::to_string(bytes) + ":" + options.layout));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    auto text = store.get("shm/" + std::to_string(peer), remaining());
    if (!text.ok()) {
      return text.status().with_context(who + ": waiting for " + impl->name(peer));
    }
    auto p = parse_published(*text);
    if (!p) return internal_error(who + ": " + impl->name(peer) + " published '" + *text + "'");
    if (p->layout != options.layout) {
      return invalid_argument(
          who + ": " + impl->name(peer) + " is set up differently (" +
          internal::layout_difference(options.layout, p->layout, impl->name(peer)) +
          "); every process must use the same number of local replicas, the same backend "
          "options and the same secret");
    }
    TRIBUTARY_ASSIGN_OR_RETURN(impl->maps[static_cast<size_t>(peer)],
                               Mapping::open_peer(p->pid, p->fd, p->bytes));
    if (impl->ctl(peer).layout != layout) {
      return invalid_argument(who + ": " + impl->name(peer) + " is set up differently");
    }
    impl->procs[static_cast<size_t>(peer)] = PeerProcess(p->pid);
  }
  // Single copy: may this rank read every peer's memory? Its verdict goes into its segment before
  // its "mapped" key, so that every rank reads every verdict after the wait below.
  const bool single_copy_wanted = options.single_copy_min_bytes != SIZE_MAX && size > 1;
  std::string own_refusal;
  if (single_copy_wanted) {
    std::string& refused = own_refusal;
    for (int peer = 0; peer < size && refused.empty(); ++peer) {
      if (peer == rank) continue;
      // Reads the peer's segment magic where the peer maps it, then writes the same value back
      // (single copy writes its results into the peers' outputs): the kernel asks the same of
      // both, but a seccomp filter may allow only one.
      const int64_t pid = impl->procs[static_cast<size_t>(peer)].pid();
      uint64_t magic = 0;
      int e =
          peer_memory(pid, &magic, impl->ctl(peer).self_address, sizeof magic, PeerAccess::kRead);
      const char* call = "process_vm_readv";
      if (e == 0 && magic == kSegmentMagic) {
        e = peer_memory(pid, &magic, impl->ctl(peer).self_address, sizeof magic,
                        PeerAccess::kWrite);
        call = "process_vm_writev";
      }
      if (e != 0 || magic != kSegmentMagic) {
        refused = "reaching the memory of " + impl->name(peer) + " (process " +
                  std::to_string(pid) + ") with " + call + " failed: " +
                  (e != 0 ? std::string(std::strerror(e)) : std::string("it read back wrong"));
      }
    }
    if (refused.empty() && options.single_copy_measure) {
      // A block of the next rank's slots, as single copy reads a peer's input.
      const int peer = (rank + 1) % size;
      const Mapping& m = impl->maps[static_cast<size_t>(peer)];
      const auto* base = reinterpret_cast<const std::byte*>(&m.control());
      const size_t offset = static_cast<size_t>(m.data(0) - base);
      // Single copy's own block, as its calls read and write one at a time.
      const size_t block =
          std::min(options.single_copy_block_bytes, options.slots * options.slot_bytes);
      const double ratio =
          kernel_copy_ratio(impl->procs[static_cast<size_t>(peer)].pid(),
                            impl->ctl(peer).self_address + offset, m.data(0), block);
      // Both published before the release store of the verdict below; every peer reads them after
      // its acquire load of this rank's verdict.
      impl->ctl(rank).kernel_copy_ratio_x100.store(
          static_cast<uint32_t>(std::min(ratio * 100.0 + 0.5, 1e9)), std::memory_order_relaxed);
      impl->ctl(rank).cache_bytes.store(last_level_cache_bytes(), std::memory_order_relaxed);
    }
    // Published even when refused, and before failing on it: every rank then learns the verdict
    // after the wait below and fails with it too, instead of waiting for this rank's key.
    impl->ctl(rank).single_copy.store(refused.empty() ? kSingleCopyReadable : kSingleCopyRefused,
                                      std::memory_order_release);
  }
  // Once every rank has mapped every segment, the descriptors can go: the memory then lives
  // exactly as long as some process maps it.
  TRIBUTARY_RETURN_IF_ERROR(store.set("shm/" + std::to_string(rank) + "/mapped", "1"));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("shm/" + std::to_string(r) + "/mapped");
  TRIBUTARY_RETURN_IF_ERROR(store.wait(keys, remaining()).with_context(who));
  own.close_now();
  if (single_copy_wanted) {
    if (!own_refusal.empty() && options.single_copy_required) {
      return failed_precondition(
          who + ": shm_single_copy=on, but " + own_refusal +
          "; the kernel allows it between processes of the same user where one may ptrace the "
          "other (Yama's kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE); set shm_single_copy=auto "
          "to use the slots where it is refused");
    }
    impl->single_copy = true;
    for (int r = 0; r < size; ++r) {
      if (impl->ctl(r).single_copy.load(std::memory_order_acquire) == kSingleCopyReadable) continue;
      impl->single_copy = false;
      if (options.single_copy_required) {
        return failed_precondition(
            who + ": shm_single_copy=on, but " + impl->name(r) +
            " may not read and write the memory of its peers (its own error says "
            "why); set shm_single_copy=auto to use the slots there");
      }
    }
    if (impl->single_copy) {
      impl->scratch.resize(static_cast<size_t>(size - 1) * options.single_copy_block_bytes);
      std::vector<double> ratios;
      uint64_t cache = 0;  // the largest any rank read: every rank takes the same
      for (int r = 0; r < size; ++r) {
        cache = std::max(cache, impl->ctl(r).cache_bytes.load(std::memory_order_relaxed));
        const double ratio =
            impl->ctl(r).kernel_copy_ratio_x100.load(std::memory_order_relaxed) / 100.0;
        ratios.push_back(ratio);
        if (ratio > impl->slowest_kernel_copy) {
          impl->slowest_kernel_copy = ratio;
          impl->slowest_kernel_copy_rank = r;
        }
      }
      impl->layout_single_copy_from = options.single_copy_min_bytes;
      impl->options.single_copy_min_bytes =
          single_copy_from(options.single_copy_min_bytes, ratios, static_cast<size_t>(cache));
    }
  }
  return std::unique_ptr<ShmGroup>(new ShmGroup(std::move(impl)));
}

int ShmGroup::rank() const { return impl_->rank; }
int ShmGroup::size() const { return impl_->size; }

bool ShmGroup::names_global_ranks() const {
  return impl_->options.global_ranks.size() == static_cast<size_t>(impl_->size);
}

std::string ShmGroup::describe() const {
  std::string s = "shared memory (" + std::to_string(impl_->size) + " ranks, " +
                  std::to_string(impl_->options.slots) + " slots of " +
                  std::to_string(impl_->options.slot_bytes >> 10) + " KiB";
  if (impl_->single_copy) {
    const ShmGroupOptions& o = impl_->options;
    auto from = [&](size_t min_bytes) {
      return min_bytes > o.small_bytes ? "from " + format_size(min_bytes)
                                       : "over " + format_size(o.small_bytes);
    };
    s += "; all-reduces " + from(o.single_copy_min_bytes) +
         (o.single_copy_max_bytes != SIZE_MAX ? " to " + format_size(o.single_copy_max_bytes)
                                              : std::string()) +
         " read and write the peers' buffers (single copy)";
    const double ratio = impl_->slowest_kernel_copy;
    if (ratio > 0) {
      char text[32];
      std::snprintf(text, sizeof text, "%.2fx", ratio);
      s += std::string("; the kernel's copies between processes took ") + text +
           " memcpy's time at setup (" + impl_->name(impl_->slowest_kernel_copy_rank) +
           (ratio > kSlowKernelCopyRatio
                ? ", above " + std::to_string(static_cast<int>(kSlowKernelCopyRatio)) +
                      "x: single copy only for buffers past the caches, " +
                      from(o.single_copy_min_bytes) + " instead of " +
                      from(impl_->layout_single_copy_from) + ")"
                : ")");
    }
  }
  return s + ")";
}

Status ShmGroup::all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype,
                            ReduceOp op, int64_t mean_divisor, const void* source) {
  return impl_->guarded([&] {
    return impl_->all_reduce(call, static_cast<std::byte*>(data),
                             static_cast<const std::byte*>(source ? source : data), count, dtype,
                             op, mean_divisor);
  });
}

Status ShmGroup::broadcast(const GroupCall& call, void* data, size_t bytes, int root) {
  return impl_->guarded(
      [&] { return impl_->broadcast(call, static_cast<std::byte*>(data), bytes, root); });
}

Status ShmGroup::all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) {
  return impl_->guarded(
      [&] { return impl_->all_gather(call, static_cast<std::byte*>(data), bytes_per_rank); });
}

Status ShmGroup::reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count,
                                DType dtype, ReduceOp op, int64_t mean_divisor) {
  return impl_->guarded([&] {
    return impl_->reduce_scatter(call, static_cast<const std::byte*>(data),
                                 static_cast<std::byte*>(out), count, dtype, op, mean_divisor);
  });
}

Status ShmGroup::register_buffer(const algorithms::GroupCall& call, uint64_t id, void* data,
                                 int64_t count, DType dtype) {
  return impl_->guarded([&] {
    return impl_->register_buffer(call, id, static_cast<std::byte*>(data), count, dtype);
  });
}

void ShmGroup::release_buffer(uint64_t id) {
  impl_->direct.erase(id);
  impl_->registration_notes.erase(id);
}

bool ShmGroup::wants_shareable_staging() const { return impl_->size > 1; }

std::string ShmGroup::describe_registration(uint64_t id) const {
  auto it = impl_->registration_notes.find(id);
  return it == impl_->registration_notes.end() ? std::string() : it->second;
}

bool ShmGroup::registered_direct(uint64_t id) const { return impl_->direct.count(id) != 0; }
uint64_t ShmGroup::direct_calls() const { return impl_->direct_calls; }

void ShmGroup::abort(const Status& why) { impl_->fail(why); }

void ShmGroup::interrupt(const Status& why) {
  std::lock_guard lock(impl_->interrupt_mu);
  if (impl_->interrupt_why.ok()) impl_->interrupt_why = why;
  impl_->interrupted.store(true);
}

Status ShmGroup::error() const { return impl_->error; }

}  // namespace tributary::transports::shm
