#include "backends/gloo/gloo_group.h"

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "algorithms/reduce_kernels.h"
#include "backends/gloo/gloo_store.h"

namespace tributary::backends {
namespace {

using algorithms::GroupCall;
using algorithms::MessageTag;

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

// `count` elements of `src` to `dst` (which may be `src`): MEAN divides by `divisor`, any other
// op copies.
void finish_into(void* dst, const void* src, int64_t count, DType dtype, ReduceOp op,
                 int64_t divisor) {
  if (op == ReduceOp::kMean) {
    const std::array<const void*, 1> srcs{src};
    const std::array<void*, 1> dsts{dst};
    algorithms::reduce(ReduceOp::kMean, dtype, srcs, dsts, static_cast<size_t>(count), divisor);
  } else if (dst != src) {
    std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(dtype));
  }
}

std::optional<ClassicKind> classic_kind(GlooAlgorithm a) {
  switch (a) {
    case GlooAlgorithm::kRing:
      return ClassicKind::kRing;
    case GlooAlgorithm::kRingChunked:
      return ClassicKind::kRingChunked;
    case GlooAlgorithm::kHalvingDoubling:
      return ClassicKind::kHalvingDoubling;
    case GlooAlgorithm::kBcube:
      return ClassicKind::kBcube;
    default:
      return std::nullopt;
  }
}

// What every rank sends before a group call when verify is on. Fixed layout: it crosses hosts.
struct Fingerprint {
  uint64_t sequence = 0;
  int64_t count = 0;
  int32_t root = 0;
  int32_t local_replicas = 0;
  uint8_t collective = 0;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t valid = 0;
  uint8_t bound = 0;  // the binding's place on this rank + 1 (GlooGroup::Binding), 0 for none
  // The call's buffer is the one of registration id: 1 + (id - 1) % 255; 0 for none.
  uint8_t registered = 0;
  uint16_t magic = 0;
};
static_assert(sizeof(Fingerprint) == 32);
constexpr uint16_t kFingerprintMagic = 0x676f;  // "go"

Fingerprint fingerprint_of(const MessageTag& tag, int local_replicas, int place,
                           uint64_t registration) {
  Fingerprint f;
  f.bound = static_cast<uint8_t>(place + 1);
  f.registered = registration == 0 ? 0 : static_cast<uint8_t>(1 + (registration - 1) % 255);
  f.sequence = tag.sequence;
  f.count = tag.count;
  f.root = tag.root;
  f.local_replicas = local_replicas;
  f.collective = static_cast<uint8_t>(tag.collective);
  f.op = static_cast<uint8_t>(tag.op);
  f.dtype = static_cast<uint8_t>(tag.dtype);
  f.valid = 1;
  f.magic = kFingerprintMagic;
  return f;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.sequence == b.sequence && a.count == b.count && a.root == b.root &&
         a.local_replicas == b.local_replicas && a.collective == b.collective && a.op == b.op &&
         a.dtype == b.dtype;
}

std::string describe_fingerprint(const Fingerprint& f) {
  if (f.magic != kFingerprintMagic || f.valid != 1 ||
      f.collective > static_cast<uint8_t>(Collective::kRegisterBuffers) || f.op > 4 ||
      f.dtype > 7) {
    return "something that is not a tributary 'gloo' collective";
  }
  MessageTag t;
  t.sequence = f.sequence;
  t.count = f.count;
  t.collective = static_cast<Collective>(f.collective);
  t.op = static_cast<ReduceOp>(f.op);
  t.dtype = static_cast<DType>(f.dtype);
  std::string s = t.describe_call();
  if (t.collective == Collective::kBroadcast) s += " from root " + std::to_string(f.root);
  if (f.registered) s += " on the buffer of registration #" + std::to_string(f.registered);
  return s + " with " + std::to_string(f.local_replicas) + " local replica(s)";
}

// What is left of the call's deadline, as Gloo's timeouts take it (at least 1 ms).
std::chrono::milliseconds time_left(const GroupCall& call) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(call.deadline -
                                                                 std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

uint32_t gloo_tag(const GroupCall& call) {
  return static_cast<uint32_t>(call.tag.sequence & 0x7fffffffu);
}

}  // namespace

std::string resolve_gloo_mode(const std::string& mode, const std::string& algorithm) {
  // auto = async: in Gloo's sync modes the calling thread writes with blocking sends, and two
  // ranks that each send a message larger than the socket buffers to the other before reading
  // deadlock (seen here at 64 MiB with ring_chunked). Sync modes stay available for small messages.
  (void)algorithm;
  return mode == "auto" ? "async" : mode;
}

GlooGroup::GlooGroup(GlooConnection gloo, std::unique_ptr<algorithms::ProcessGroup> control,
                     GlooGroupSettings settings)
    : gloo_(std::move(gloo.context)),
      control_(std::move(control)),
      peers_(std::move(gloo.peers)),
      settings_(settings),
      rank_(gloo_->rank),
      size_(gloo_->size),
      cache_(std::make_unique<AlgorithmCache>(gloo_, settings.cache_bytes)),
      // At construction, on every rank (slots), and before any peer can issue an all-gather: a
      // clear to send for a slot not yet registered makes Gloo's I/O thread spin.
      exchange_(settings.sync ? nullptr : std::make_unique<ClearToSendAllgather>(gloo_)) {}

GlooGroup::~GlooGroup() {
  if (error().ok()) {
    // Gloo's waits check for a closed connection before checking for data that has arrived, so a
    // rank that finished the last collective and closed at once could fail a peer still reading
    // that collective's (delivered) data. A barrier first makes every rank leave it before anyone
    // closes. Bounded: in async mode by min(timeout, 10 s); in sync mode (a classic all-reduce of
    // one element) by the timeout.
    try {
      SigpipeGuard guard;
      if (settings_.sync) {
        // A sum of zeros: the instance's buffer is uninitialized, and Gloo's int64 sum of
        // whatever it holds may overflow (undefined behaviour; UBSan stops the process).
        BoundAlgorithm& barrier =
            cache_->get(ClassicKind::kHalvingDoubling, DType::kInt64, ReduceOp::kSum, 1);
        std::memset(barrier.data(), 0, sizeof(int64_t));
        barrier.run();
      } else {
        gloo::BarrierOptions opts(gloo_);
        opts.setTag(0);
        opts.setTimeout(std::min(settings_.timeout, std::chrono::milliseconds(10000)));
        gloo::barrier(opts);
      }
    } catch (...) {
      // Destructors never throw; the connections close below either way.
    }
  }
  // Instances first: they hold buffers registered with the context's pairs.
  registered_.clear();
  exchange_.reset();
  cache_.reset();
  gloo_.reset();
}

std::string GlooGroup::describe() const { return "gloo (" + std::to_string(size_) + " ranks)"; }

Status GlooGroup::error() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void GlooGroup::abort(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (failure_.ok()) failure_ = why;
  }
  // Peers may be waiting for this rank: closing the connections fails them at once instead of
  // at their timeout (the control channel tells them why). The group is unusable from here on.
  if (control_) control_->abort(why);
  try {
    SigpipeGuard guard;
    gloo_->closeConnections();
  } catch (...) {
  }
}

void GlooGroup::interrupt(const Status& why) {
  if (control_) control_->interrupt(why);
}

template <typename Body>
Status GlooGroup::guarded(const GroupCall& call, Body&& body) {
  TRIBUTARY_RETURN_IF_ERROR(error());
  // Formatted only when something failed: this runs on every collective.
  const auto where = [&] {
    return call.tag.describe_call() + " on rank " + std::to_string(rank_) + " of " +
           std::to_string(size_);
  };
  const auto timeout = time_left(call);
  Status s;
  {
    SigpipeGuard guard;
    try {
      s = body();
    } catch (const gloo::IoException& e) {
      const std::string what = e.what();
      const int peer = peers_.peer_in(what);
      const std::string who = peer < 0 ? "a peer" : "rank " + std::to_string(peer);
      if (gloo_timed_out(what)) {
        s = deadline_exceeded(where() + ": " + who + " did not answer within " +
                              format_duration(timeout) + " (Gloo: " + what +
                              "); is every rank still running and issuing the same collectives? "
                              "raise timeout= in the gloo spec to wait longer");
      } else {
        s = unavailable(where() + ": the connection with " + who + " failed (Gloo: " + what +
                        "); " + who +
                        " may have died, or closed its connections after an error of its "
                        "own");
      }
    } catch (const GlooSizeMismatch& e) {
      s = aborted("collective mismatch: " + where() + ": " + e.what() +
                  "; every rank must issue the same collectives in the same order, with the same "
                  "sizes (verify=true checks that before Gloo runs)");
    } catch (const gloo::EnforceNotMet& e) {
      s = internal_error(where() + ": a Gloo check failed: " + e.what());
    } catch (const gloo::Exception& e) {
      s = aborted(where() + ": Gloo error: " + e.what());
    } catch (const StoreError& e) {
      s = e.status().with_context(where());
    } catch (const std::bad_alloc&) {
      s = resource_exhausted(where() + ": out of memory");
    } catch (const std::exception& e) {
      s = internal_error(where() + ": " + e.what());
    } catch (...) {
      s = internal_error(where() + ": unknown exception from Gloo");
    }
  }
  if (!s.ok()) {
    // A mismatch every rank sees alike, but the first to see it closes the connections, which the
    // others may notice before their own check: its reason goes to the store first.
    if (s.code() == StatusCode::kAborted && s.message().starts_with("collective mismatch")) {
      publish_refusal(s);
    }
    abort(s);
  }
  return s;
}

GlooAlgorithm GlooGroup::resolve(uint64_t bytes) const {
  GlooAlgorithm a = settings_.algorithm;
  if (a == GlooAlgorithm::kAuto) {
    a = bytes < settings_.auto_threshold ? GlooAlgorithm::kHalvingDoubling
                                         : GlooAlgorithm::kRingChunked;
  }
  return a;
}

Status GlooGroup::verify_order(const GroupCall& call, Binding* binding, bool always) {
  const bool bind = binding && binding->possible;
  const uint64_t registration = binding && binding->registered ? binding->registration : 0;
  if (!settings_.verify && !bind && !always) return Status();
  // Every rank fills its own row of a zeroed table and the control channel sums the tables (a
  // recursive doubling of a few hundred bytes): each holds every row after. The channel's frames
  // carry the call's tag, so ranks in different collectives fail there, naming both calls.
  constexpr size_t kWords = sizeof(Fingerprint) / sizeof(int64_t);
  const size_t n = static_cast<size_t>(size_);
  std::vector<Fingerprint> all(n);
  all[static_cast<size_t>(rank_)] = fingerprint_of(call.tag, settings_.local_replicas,
                                                   bind ? binding->here : -1, registration);
  TRIBUTARY_RETURN_IF_ERROR(control_->all_reduce(call, all.data(),
                                                 static_cast<int64_t>(n * kWords), DType::kInt64,
                                                 ReduceOp::kSum, 1, nullptr));
  const Fingerprint& mine = all[static_cast<size_t>(rank_)];
  if (bind) {
    binding->agreed = mine.bound - 1;
    for (const Fingerprint& f : all) {
      if (f.bound != mine.bound) binding->agreed = -1;
    }
  }
  for (size_t r = 0; r < n; ++r) {
    if (same_call(all[r], mine) && all[r].registered == mine.registered) continue;
    return aborted("collective mismatch: rank " + std::to_string(r) + " issued " +
                   describe_fingerprint(all[r]) + " but rank " + std::to_string(rank_) + " issued " +
                   describe_fingerprint(mine) +
                   (same_call(all[r], mine)
                        ? "; a registered buffer (register_buffers) must be used, and released, "
                          "at the same point on every rank"
                        : "; every rank must issue the same collectives in the same order"));
  }
  return Status();
}

GlooGroup::Binding GlooGroup::plan_binding(const MessageTag& tag, void* data, int64_t count,
                                           DType dtype, ReduceOp op) {
  Binding b;
  const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
  const std::optional<ClassicKind> kind = classic_kind(resolve(bytes));
  // Not bcube: its run() can return while sends of later steps still read the buffer.
  if (!kind || *kind == ClassicKind::kBcube) return b;
  // Only the collective's own all-reduce: not the broadcast's root agreement (ProcessGroupOps),
  // whose buffer is a local of the caller's.
  if (tag.collective == Collective::kBroadcast) return b;
  for (auto& [id, r] : registered_) {
    if (r.data == data && r.dtype == dtype && r.count == count) {
      b.kind = *kind;
      b.registered = &r;
      b.registration = id;
      return b;
    }
  }
  if (bytes == 0 || bytes > kGlooClassicMaxBytes ||
      (!settings_.verify && bytes < kBindAloneMinBytes) ||
      !cache_->binding_pays(*kind, dtype, partial_op(op), count)) {
    return b;
  }
  b.possible = true;
  b.kind = *kind;
  b.here = cache_->bound_place(*kind, dtype, partial_op(op), count, data);
  return b;
}

Status GlooGroup::all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype,
                             ReduceOp op, int64_t mean_divisor, const void* source) {
  return guarded(call, [&]() -> Status {
    Binding binding = plan_binding(call.tag, data, count, dtype, op);
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, &binding));
    if (count == 0) return Status();
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    const GlooAlgorithm algorithm = resolve(bytes);
    if (binding.registered || binding.possible) {
      // On the caller's buffer, as a program using Gloo directly would: out of place, the input
      // is copied there first.
      if (source) std::memcpy(data, source, bytes);
      BoundAlgorithm& instance =
          binding.registered ? registered_instance(*binding.registered, binding.kind, op)
                             : cache_->get_bound(binding.kind, dtype, partial_op(op), count, data,
                                                 binding.agreed);
      instance.run();
      finish_into(data, data, count, dtype, op, mean_divisor);
      return Status();
    }
    if (std::optional<ClassicKind> kind = classic_kind(algorithm)) {
      classic_all_reduce(*kind, data, source ? source : data, count, dtype, op, mean_divisor);
      return Status();
    }
    // gloo::allreduce works on the caller's buffer.
    if (source) std::memcpy(data, source, bytes);
    unbound_all_reduce(algorithm, gloo_, data, static_cast<size_t>(count), dtype, partial_op(op),
                       gloo_tag(call), time_left(call));
    finish_into(data, data, count, dtype, op, mean_divisor);
    return Status();
  });
}

void GlooGroup::classic_all_reduce(ClassicKind kind, void* data, const void* src, int64_t count,
                                   DType dtype, ReduceOp op, int64_t mean_divisor) {
  // Classic instances run on their own buffer: copy in, run, copy out (dividing for MEAN), in
  // pieces of at most kGlooClassicMaxBytes (their counts are ints).
  const size_t elem = dtype_size(dtype);
  const int64_t piece = static_cast<int64_t>(kGlooClassicMaxBytes / elem);
  for (int64_t offset = 0; offset < count; offset += piece) {
    const int64_t len = std::min(piece, count - offset);
    const size_t at = static_cast<size_t>(offset) * elem;
    BoundAlgorithm& bound = cache_->get(kind, dtype, partial_op(op), len);
    std::memcpy(bound.data(), static_cast<const std::byte*>(src) + at,
                static_cast<size_t>(len) * elem);
    bound.run();
    finish_into(static_cast<std::byte*>(data) + at, bound.data(), len, dtype, op, mean_divisor);
  }
}

void GlooGroup::classic_broadcast(std::byte* data, size_t bytes, int root,
                                  std::chrono::steady_clock::time_point deadline) {
  for (size_t offset = 0; offset < bytes; offset += kBroadcastPieceBytes) {
    if (offset > 0 && std::chrono::steady_clock::now() >= deadline) {
      // Worded as Gloo's own timeouts are, so that guarded() reports it as one.
      throw gloo::IoException("Timed out with " + std::to_string(bytes - offset) + " of " +
                              std::to_string(bytes) + " bytes still to broadcast");
    }
    const size_t len = std::min<size_t>(kBroadcastPieceBytes, bytes - offset);
    // The instance of the piece's size class, sending the piece's bytes only.
    const size_t size_class = std::max<size_t>(kBroadcastMinClassBytes, std::bit_ceil(len));
    BoundAlgorithm& bound = cache_->get(ClassicKind::kBroadcast, DType::kUInt8, ReduceOp::kSum,
                                        static_cast<int64_t>(size_class), root);
    if (rank_ == root) std::memcpy(bound.data(), data + offset, len);
    bound.run_prefix(len, broadcast_size_word(bytes));
    if (rank_ != root) std::memcpy(data + offset, bound.data(), len);
  }
}

void GlooGroup::classic_all_gather(std::byte* data, size_t block_bytes) {
  // In pieces of each process's block: piece k of every block is gathered, then put in place.
  const size_t p = static_cast<size_t>(size_);
  const size_t most = std::max<size_t>(1, kGlooClassicMaxBytes / (p + 1));
  std::byte* mine = data + static_cast<size_t>(rank_) * block_bytes;
  for (size_t offset = 0; offset < block_bytes; offset += most) {
    const size_t len = std::min(most, block_bytes - offset);
    BoundAlgorithm& bound = cache_->get(ClassicKind::kAllGather, DType::kUInt8, ReduceOp::kSum,
                                        static_cast<int64_t>(len));
    std::memcpy(bound.input(), mine + offset, len);
    bound.run();
    const auto* gathered = static_cast<const std::byte*>(bound.data());
    for (size_t r = 0; r < p; ++r) {
      if (r != static_cast<size_t>(rank_)) {
        std::memcpy(data + r * block_bytes + offset, gathered + r * len, len);
      }
    }
  }
}

Status GlooGroup::broadcast(const GroupCall& call, void* data, size_t bytes, int root) {
  return guarded(call, [&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call));
    if (bytes == 0) return Status();
    classic_broadcast(static_cast<std::byte*>(data), bytes, root, call.deadline);
    return Status();
  });
}

Status GlooGroup::all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) {
  return guarded(call, [&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call));
    if (bytes_per_rank == 0) return Status();
    if (settings_.sync) {
      classic_all_gather(static_cast<std::byte*>(data), bytes_per_rank);
    } else {
      exchange_->run(data, bytes_per_rank);
    }
    return Status();
  });
}

Status GlooGroup::reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count,
                                 DType dtype, ReduceOp op, int64_t mean_divisor) {
  return guarded(call, [&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call));
    if (count == 0) return Status();
    const size_t elem = dtype_size(dtype);
    const int64_t total = count * size_;
    const uint64_t bytes = static_cast<uint64_t>(total) * elem;
    if (settings_.reduce_scatter == GlooReduceScatter::kHalvingDoubling &&
        bytes < kGlooClassicMaxBytes) {
      BoundAlgorithm& bound =
          cache_->get(ClassicKind::kReduceScatterHalvingDoubling, dtype, partial_op(op), total);
      std::memcpy(bound.data(), data, bytes);
      bound.run();
      // Gloo leaves this process's block at the buffer's start.
      finish_into(out, bound.data(), count, dtype, op, mean_divisor);
      return Status();
    }
    // All-reduce everything in `data` (scratch), keep this process's block: twice the bytes, any
    // size. The rest of the group call's contract holds there: a classic algorithm copies
    // through its own buffer, an unbound one runs in place.
    const GlooAlgorithm algorithm = resolve(bytes);
    if (std::optional<ClassicKind> kind = classic_kind(algorithm)) {
      classic_all_reduce(*kind, data, data, total, dtype, partial_op(op), 1);
    } else {
      unbound_all_reduce(algorithm, gloo_, data, static_cast<size_t>(total), dtype,
                         partial_op(op), gloo_tag(call), time_left(call));
    }
    finish_into(out, static_cast<const std::byte*>(data) + static_cast<size_t>(rank_ * count) * elem,
                count, dtype, op, mean_divisor);
    return Status();
  });
}

Status GlooGroup::register_buffer(const GroupCall& call, uint64_t id, void* data, int64_t count,
                                  DType dtype) {
  return guarded(call, [&]() -> Status {
    // A registration's sizes are always checked: it is rare, and a mismatch there would otherwise
    // surface only as a timeout at the first collective on the buffers.
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, nullptr, /*always=*/true));
    const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    // Decided from what every rank agreed on, so every rank keeps it or none does.
    if (bytes == 0 || bytes > kGlooClassicMaxBytes) return Status();
    Registered& r = registered_[id];
    r.data = data;
    r.dtype = dtype;
    r.count = count;
    return Status();
  });
}

BoundAlgorithm& GlooGroup::registered_instance(Registered& r, ClassicKind kind, ReduceOp op) {
  op = partial_op(op);
  for (const std::unique_ptr<BoundAlgorithm>& a : r.instances) {
    if (a->kind == kind && a->op == op) return *a;
  }
  r.instances.push_back(cache_->build_detached(kind, r.dtype, op, r.count, r.data));
  return *r.instances.back();
}

}  // namespace tributary::backends
