#include "backends/gloo/gloo_ops.h"

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/local_collectives.h"
#include "algorithms/packing.h"
#include "backends/gloo/gloo_store.h"
#include "tributary/options.h"

namespace tributary::backends {
namespace {

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

// With one source, the final op is a copy to every output; for MEAN it also divides, once.
ReduceOp final_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kMean : ReduceOp::kSum; }

std::span<const Tensor> one(const Tensor& t) { return std::span<const Tensor>(&t, 1); }

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

// What every rank sends before a collective when verify is on. Fixed layout: it crosses hosts.
struct Fingerprint {
  uint64_t sequence = 0;
  int64_t count = 0;
  int32_t root = 0;
  int32_t local_replicas = 0;
  uint8_t collective = 0;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t valid = 0;
  uint8_t bound = 0;       // the binding's place on this rank + 1 (GlooOps::Binding), 0 for none
  // The call's first output is the buffer of registration id: 1 + (id - 1) % 255; 0 for none.
  uint8_t registered = 0;
  uint16_t magic = 0;
};
static_assert(sizeof(Fingerprint) == 32);
constexpr uint16_t kFingerprintMagic = 0x676f;  // "go"

Fingerprint fingerprint_of(const CallInfo& call, int root, int local_replicas, int place,
                           uint64_t registration) {
  Fingerprint f;
  f.bound = static_cast<uint8_t>(place + 1);
  f.registered = registration == 0 ? 0 : static_cast<uint8_t>(1 + (registration - 1) % 255);
  f.sequence = call.sequence;
  f.count = call.count;
  f.root = root;
  f.local_replicas = local_replicas;
  f.collective = static_cast<uint8_t>(call.collective);
  f.op = static_cast<uint8_t>(call.op);
  f.dtype = static_cast<uint8_t>(call.dtype);
  f.valid = 1;
  f.magic = kFingerprintMagic;
  return f;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.sequence == b.sequence && a.count == b.count && a.root == b.root &&
         a.local_replicas == b.local_replicas && a.collective == b.collective && a.op == b.op &&
         a.dtype == b.dtype;
}

std::string describe(const Fingerprint& f) {
  if (f.magic != kFingerprintMagic || f.valid != 1 ||
      f.collective > static_cast<uint8_t>(Collective::kRegisterBuffers) || f.op > 4 ||
      f.dtype > 7) {
    return "something that is not a tributary 'gloo' collective";
  }
  CallInfo c;
  c.sequence = f.sequence;
  c.count = f.count;
  c.collective = static_cast<Collective>(f.collective);
  c.op = static_cast<ReduceOp>(f.op);
  c.dtype = static_cast<DType>(f.dtype);
  std::string s = c.describe();
  if (c.collective == Collective::kBroadcast) s += " from root " + std::to_string(f.root);
  if (f.registered) s += " on the buffer of registration #" + std::to_string(f.registered);
  return s + " with " + std::to_string(f.local_replicas) + " local replica(s)";
}

}  // namespace

std::string resolve_gloo_mode(const std::string& mode, const std::string& algorithm) {
  // auto = async: in Gloo's sync modes the calling thread writes with blocking sends, and two
  // ranks that each send a message larger than the socket buffers to the other before reading
  // deadlock (seen here at 64 MiB with ring_chunked). Sync modes stay available for small messages.
  (void)algorithm;
  return mode == "auto" ? "async" : mode;
}

GlooOps::GlooOps(BackendContext context, Options options, Capabilities caps, GlooConnection gloo,
                 std::unique_ptr<algorithms::ProcessGroup> control)
    : CrossDeviceOps("gloo", std::move(context), std::move(options), std::move(caps)),
      gloo_(std::move(gloo.context)),
      control_(std::move(control)),
      peers_(std::move(gloo.peers)) {
  algorithm_ = parse_gloo_algorithm(this->options().get_string("algorithm"));
  const std::string& rs = this->options().get_string("reduce_scatter");
  reduce_scatter_ = rs == "halving_doubling" ? GlooReduceScatter::kHalvingDoubling
                    : rs == "all_reduce"     ? GlooReduceScatter::kAllReduce
                                             : GlooReduceScatter::kAuto;
  auto_threshold_ = this->options().get_size("auto_threshold");
  bytes_per_pack_ = this->options().get_size("bytes_per_pack");
  verify_ = this->options().get_bool("verify");
  sync_ = resolve_gloo_mode(this->options().get_string("mode"),
                            this->options().get_string("algorithm")) != "async";
  if (gloo_) {
    cache_ = std::make_unique<AlgorithmCache>(gloo_, this->options().get_size("cache_bytes"));
  }
}

GlooOps::~GlooOps() {
  if (gloo_ && failure_.ok()) {
    // Gloo's waits check for a closed connection before checking for data that has arrived, so a
    // rank that finished the last collective and closed at once could fail a peer still reading
    // that collective's (delivered) data. A barrier first makes every rank leave it before anyone
    // closes. Bounded: in async mode by min(timeout, 10 s); in sync mode (a classic all-reduce of
    // one element) by the timeout.
    try {
      SigpipeGuard guard;
      if (sync_) {
        // A sum of zeros: the instance's buffer is uninitialized, and Gloo's int64 sum of
        // whatever it holds may overflow (undefined behaviour; UBSan stops the process).
        BoundAlgorithm& barrier =
            cache_->get(ClassicKind::kHalvingDoubling, DType::kInt64, ReduceOp::kSum, 1);
        std::memset(barrier.data(), 0, sizeof(int64_t));
        barrier.run();
      } else {
        gloo::BarrierOptions opts(gloo_);
        opts.setTag(0);
        opts.setTimeout(std::min(std::chrono::ceil<std::chrono::milliseconds>(timeout()),
                                 std::chrono::milliseconds(10000)));
        gloo::barrier(opts);
      }
    } catch (...) {
      // Destructors never throw; the connections close below either way.
    }
  }
  // Instances first: they hold buffers registered with the context's pairs.
  registered_.clear();
  cache_.reset();
  gloo_.reset();
}

template <typename Body>
Status GlooOps::guarded(const CallInfo& call, Body&& body) {
  if (!failure_.ok()) {
    return failed_precondition(call.describe() +
                               ": backend 'gloo' is unusable after an earlier "
                               "failure; create a new one. The failure was: " +
                               failure_.message());
  }
  // Formatted only when something failed: this runs on every collective.
  const auto where = [&] {
    return call.describe() + " on rank " + std::to_string(rank()) + " of " +
           std::to_string(world_size());
  };
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
                              format_duration(call.timeout) + " (Gloo: " + what +
                              "); is every rank still running and issuing the same collectives? "
                              "raise timeout= in the gloo spec to wait longer");
      } else {
        s = unavailable(where() + ": the connection with " + who + " failed (Gloo: " + what +
                        "); " + who +
                        " may have died, or closed its connections after an error of its "
                        "own");
      }
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
  if (!s.ok() && gloo_) {
    // A mismatch every rank sees alike, but the first to see it closes the connections, which the
    // others may notice before their own check: its reason goes to the store first.
    if (s.code() == StatusCode::kAborted && s.message().starts_with("collective mismatch")) {
      publish_refusal(s);
    }
    abandon(s);
  }
  return s;
}

void GlooOps::abandon(const Status& why) {
  if (!gloo_) return;
  if (failure_.ok()) failure_ = why;
  // Peers may be waiting for this rank: closing the connections fails them at once instead of
  // at their timeout (the control channel tells them why). The instance is unusable from here on
  // anyway.
  if (control_) control_->abort(why);
  try {
    SigpipeGuard guard;
    gloo_->closeConnections();
  } catch (...) {
  }
}

uint32_t GlooOps::tag(const CallInfo& call) const {
  return static_cast<uint32_t>(call.sequence & 0x7fffffffu);
}

std::chrono::milliseconds GlooOps::call_timeout(const CallInfo& call) const {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(call.timeout);
  return ms.count() < 1 ? std::chrono::milliseconds(1) : ms;
}

std::byte* GlooOps::staging(size_t bytes) {
  if (staging_.size() < bytes) staging_.resize(bytes);
  return staging_.data();
}

GlooAlgorithm GlooOps::resolve(uint64_t bytes) const {
  GlooAlgorithm a = algorithm_;
  if (a == GlooAlgorithm::kAuto) {
    a = bytes < auto_threshold_ ? GlooAlgorithm::kHalvingDoubling : GlooAlgorithm::kRingChunked;
  }
  return a;
}

Status GlooOps::verify_order(const CallInfo& call, int root, Binding* binding) {
  const bool bind = binding && binding->possible;
  const uint64_t registration = binding && binding->registered ? binding->registration : 0;
  // A registration's sizes are always checked: it is rare, and a mismatch there would otherwise
  // surface only as a timeout at the first collective on the buffers.
  const bool always = call.collective == Collective::kRegisterBuffers;
  if (!control_ || (!verify_ && !bind && !always)) return Status();
  // Every rank fills its own row of a zeroed table and the control channel sums the tables (a
  // recursive doubling of a few hundred bytes): each holds every row after. The channel's frames
  // carry the call's tag, so ranks in different collectives fail there, naming both calls.
  constexpr size_t kWords = sizeof(Fingerprint) / sizeof(int64_t);
  const size_t n = static_cast<size_t>(world_size());
  std::vector<Fingerprint> all(n);
  all[static_cast<size_t>(rank())] =
      fingerprint_of(call, root, num_local_replicas(), bind ? binding->here : -1, registration);
  algorithms::MessageTag tag = algorithms::MessageTag::of(call);
  tag.root = root;
  const algorithms::GroupCall group{tag, std::chrono::steady_clock::now() + call.timeout};
  TRIBUTARY_RETURN_IF_ERROR(control_->all_reduce(group, all.data(),
                                                 static_cast<int64_t>(n * kWords), DType::kInt64,
                                                 ReduceOp::kSum, 1, nullptr));
  const Fingerprint& mine = all[static_cast<size_t>(rank())];
  if (bind) {
    binding->agreed = mine.bound - 1;
    for (const Fingerprint& f : all) {
      if (f.bound != mine.bound) binding->agreed = -1;
    }
  }
  for (size_t r = 0; r < n; ++r) {
    if (same_call(all[r], mine) && all[r].registered == mine.registered) continue;
    return aborted("collective mismatch: rank " + std::to_string(r) + " issued " +
                   describe(all[r]) + " but rank " + std::to_string(rank()) + " issued " +
                   describe(mine) +
                   (same_call(all[r], mine)
                        ? "; a registered buffer (register_buffers) must be used, and released, "
                          "at the same point on every rank"
                        : "; every rank must issue the same collectives in the same order"));
  }
  return Status();
}

GlooOps::Binding GlooOps::plan_binding(const CallInfo& call, ReduceOp op,
                                       std::span<const Tensor> inputs,
                                       std::span<const Tensor> outputs) {
  Binding b;
  const uint64_t bytes = static_cast<uint64_t>(call.count) * dtype_size(call.dtype);
  const std::optional<ClassicKind> kind = classic_kind(resolve(bytes));
  if (!registered_.empty() && kind && *kind != ClassicKind::kBcube) {
    for (auto& [id, r] : registered_) {
      if (r.data == outputs[0].data() && r.dtype == call.dtype && r.count == call.count) {
        b.kind = *kind;
        b.registered = &r;
        b.registration = id;
        return b;
      }
    }
  }
  // Only what every rank agrees on decides: the number of destinations of a reduce is a local
  // choice (more than one get a copy of the first). Not bcube: its run() can return while sends
  // of later steps still read the buffer.
  (void)outputs;
  if (!gloo_ || !kind || *kind == ClassicKind::kBcube || inputs.size() != 1 || bytes == 0 ||
      bytes > kGlooClassicMaxBytes || (!verify_ && bytes < kBindAloneMinBytes) ||
      !cache_->binding_pays(*kind, call.dtype, partial_op(op), call.count)) {
    return b;
  }
  b.possible = true;
  b.kind = *kind;
  b.here = cache_->bound_place(*kind, call.dtype, partial_op(op), call.count, outputs[0].data());
  return b;
}

Status GlooOps::reduce_everywhere(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                                  std::span<const Tensor> outputs, const Binding* binding) {
  const int64_t n = num_replicas_in_sync();
  if (!gloo_) return algorithms::local_reduce(op, inputs, outputs, n);
  const int64_t count = inputs[0].num_elements();
  if (count == 0) return Status();
  const DType dtype = inputs[0].dtype();
  const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
  const GlooAlgorithm algorithm = resolve(bytes);
  if (binding && binding->registered) {
    // Gloo runs on the first output: the local replicas are reduced into it first.
    const Tensor& out = outputs[0];
    if (inputs.size() > 1) {
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(partial_op(op), inputs, one(out), n));
    } else if (inputs[0].data() != out.data()) {
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(inputs[0], one(out)));
    }
    registered_instance(*binding->registered, binding->kind, op).run();
    if (op == ReduceOp::kMean) {
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(op, one(out), one(out), n));
    }
    return algorithms::local_copy(out, outputs.subspan(1));
  }
  if (binding && binding->possible) {
    // On the caller's buffer, as a program using Gloo directly would: out-of-place copies first.
    const Tensor& out = outputs[0];
    if (inputs[0].data() != out.data()) {
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(inputs[0], one(out)));
    }
    cache_->get_bound(binding->kind, dtype, partial_op(op), count, out.data(), binding->agreed)
        .run();
    if (op == ReduceOp::kMean) {
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(op, one(out), one(out), n));
    }
    return algorithms::local_copy(out, outputs.subspan(1));
  }
  if (std::optional<ClassicKind> kind = classic_kind(algorithm)) {
    return classic_all_reduce(*kind, op, inputs, outputs);
  }
  // gloo::allreduce works on the caller's buffer: the first output holds the local reduction.
  const Tensor& first = outputs[0];
  if (inputs.size() != 1 || inputs[0].data() != first.data()) {
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(partial_op(op), inputs, one(first), n));
  }
  unbound_all_reduce(algorithm, gloo_, first.data(), static_cast<size_t>(count), dtype,
                     partial_op(op), tag(call), call_timeout(call));
  if (op == ReduceOp::kMean) return algorithms::local_reduce(op, one(first), outputs, n);
  return algorithms::local_copy(first, outputs.subspan(1));
}

Status GlooOps::classic_all_reduce(ClassicKind kind, ReduceOp op, std::span<const Tensor> inputs,
                                   std::span<const Tensor> outputs) {
  // Classic instances run on their own buffer: reduce into it, run, copy out (dividing for MEAN),
  // in pieces of at most kGlooClassicMaxBytes (their counts are ints).
  const int64_t n = num_replicas_in_sync();
  const int64_t count = inputs[0].num_elements();
  const DType dtype = inputs[0].dtype();
  const int64_t piece = static_cast<int64_t>(kGlooClassicMaxBytes / dtype_size(dtype));
  std::vector<Tensor> in_slices, out_slices;
  for (int64_t offset = 0; offset < count; offset += piece) {
    const int64_t len = std::min(piece, count - offset);
    std::span<const Tensor> ins = inputs, outs = outputs;
    if (len != count) {
      in_slices.clear();
      out_slices.clear();
      for (const Tensor& t : inputs) in_slices.push_back(t.slice(offset, len));
      for (const Tensor& t : outputs) out_slices.push_back(t.slice(offset, len));
      ins = in_slices;
      outs = out_slices;
    }
    BoundAlgorithm& bound = cache_->get(kind, dtype, partial_op(op), len);
    const Tensor buffer(bound.data(), dtype, Shape{len}, devices()[0]);
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(partial_op(op), ins, one(buffer), n));
    bound.run();
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(final_op(op), one(buffer), outs, n));
  }
  return Status();
}

void GlooOps::classic_broadcast(std::byte* data, size_t bytes, int root) {
  for (size_t offset = 0; offset < bytes; offset += kGlooClassicMaxBytes) {
    const size_t len = std::min<size_t>(kGlooClassicMaxBytes, bytes - offset);
    BoundAlgorithm& bound = cache_->get(ClassicKind::kBroadcast, DType::kUInt8, ReduceOp::kSum,
                                        static_cast<int64_t>(len), root);
    if (rank() == root) std::memcpy(bound.data(), data + offset, len);
    bound.run();
    if (rank() != root) std::memcpy(data + offset, bound.data(), len);
  }
}

void GlooOps::classic_all_gather(std::byte* data, size_t block_bytes) {
  // In pieces of each process's block: piece k of every block is gathered, then put in place.
  const size_t p = static_cast<size_t>(world_size());
  const size_t most = std::max<size_t>(1, kGlooClassicMaxBytes / (p + 1));
  std::byte* mine = data + static_cast<size_t>(rank()) * block_bytes;
  for (size_t offset = 0; offset < block_bytes; offset += most) {
    const size_t len = std::min(most, block_bytes - offset);
    BoundAlgorithm& bound = cache_->get(ClassicKind::kAllGather, DType::kUInt8, ReduceOp::kSum,
                                        static_cast<int64_t>(len));
    std::memcpy(bound.input(), mine + offset, len);
    bound.run();
    const auto* gathered = static_cast<const std::byte*>(bound.data());
    for (size_t r = 0; r < p; ++r) {
      if (r != static_cast<size_t>(rank())) {
        std::memcpy(data + r * block_bytes + offset, gathered + r * len, len);
      }
    }
  }
}

Status GlooOps::register_buffers_impl(const CallInfo& call, uint64_t id,
                                      const PerReplica<Tensor>& buffers) {
  return guarded(call, [&]() -> Status {
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, -1));
    const Tensor& t = buffers[0];
    const uint64_t bytes = t.nbytes();
    // Decided from what every rank agreed on, so every rank keeps it or none does.
    if (!gloo_ || bytes == 0 || bytes > kGlooClassicMaxBytes) {
      return Status();
    }
    Registered& r = registered_[id];
    r.data = t.data();
    r.dtype = t.dtype();
    r.count = t.num_elements();
    return Status();
  });
}

void GlooOps::release_buffers_impl(uint64_t id) { registered_.erase(id); }

BoundAlgorithm& GlooOps::registered_instance(Registered& r, ClassicKind kind, ReduceOp op) {
  op = partial_op(op);
  for (const std::unique_ptr<BoundAlgorithm>& a : r.instances) {
    if (a->kind == kind && a->op == op) return *a;
  }
  r.instances.push_back(cache_->build_detached(kind, r.dtype, op, r.count, r.data));
  return *r.instances.back();
}

Work GlooOps::all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                              const PerReplica<Tensor>& outputs) {
  return finish(guarded(call, [&] {
    Binding binding = plan_binding(call, op, inputs.values(), outputs.values());
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, -1, &binding));
    return reduce_everywhere(call, op, inputs.values(), outputs.values(), &binding);
  }));
}

Work GlooOps::reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                          const Mirrored<Tensor>& destinations) {
  // As TF's CollectiveAllReduce: all-reduce, then place the result on every destination.
  return finish(guarded(call, [&] {
    Binding binding = plan_binding(call, op, value.values(), destinations.values());
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, -1, &binding));
    return reduce_everywhere(call, op, value.values(), destinations.values(), &binding);
  }));
}

Work GlooOps::batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                std::span<const ReducePair> pairs) {
  // Packed as every multi-process backend packs (algorithms/packing.h), one all-reduce per pack;
  // verify checks each pack, the empty ones included.
  return finish(guarded(call, [&]() -> Status {
    algorithms::PackedBatchReduce how;
    how.collective = Collective::kAllReduce;
    how.bytes_per_pack = bytes_per_pack_;
    how.reduce_one = [&](const CallInfo& pack_call, const ReducePair& p) -> Status {
      // A pack of one value is a reduce: a registered destination is used as such.
      Binding binding = plan_binding(pack_call, op, p.value.values(), p.destinations.values());
      TRIBUTARY_RETURN_IF_ERROR(verify_order(pack_call, -1, &binding));
      return reduce_everywhere(pack_call, op, p.value.values(), p.destinations.values(), &binding);
    };
    how.reduce_pack = [&](const CallInfo& pack_call,
                          std::span<const Tensor> views) -> StatusOr<const std::byte*> {
      TRIBUTARY_RETURN_IF_ERROR(verify_order(pack_call, -1));
      if (pack_call.count == 0) return nullptr;
      const size_t bytes = static_cast<size_t>(pack_call.count) * dtype_size(pack_call.dtype);
      const Tensor result(staging(bytes), pack_call.dtype, Shape{pack_call.count}, devices()[0]);
      TRIBUTARY_RETURN_IF_ERROR(reduce_everywhere(pack_call, op, views, one(result)));
      return static_cast<const std::byte*>(result.data());
    };
    return algorithms::packed_batch_reduce(call, pairs, devices(), packs_, how);
  }));
}

Work GlooOps::broadcast_impl(const CallInfo& call, const Tensor& source,
                             const Mirrored<Tensor>& destinations, int root) {
  return finish(guarded(call, [&]() -> Status {
    if (!gloo_) return algorithms::local_copy(source, destinations.values());
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, root));
    const Tensor& first = destinations[0];
    if (first.nbytes() == 0) return Status();
    if (rank() == root) TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(source, one(first)));
    if (sync_) {
      classic_broadcast(static_cast<std::byte*>(first.data()), first.nbytes(), root);
    } else {
      unbound_broadcast(gloo_, first.data(), first.nbytes(), root, tag(call), call_timeout(call));
    }
    return algorithms::local_copy(first, std::span<const Tensor>(destinations.values()).subspan(1));
  }));
}

Work GlooOps::all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                              const PerReplica<Tensor>& outputs) {
  return finish(guarded(call, [&]() -> Status {
    if (!gloo_) return algorithms::local_all_gather(inputs.values(), outputs.values());
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, -1));
    const int64_t count = inputs[0].num_elements();
    if (count == 0) return Status();
    const int64_t local = num_local_replicas();
    const Tensor& first = outputs[0];
    // This process's replicas fill their blocks of outputs[0]; Gloo fills the rest.
    for (int64_t i = 0; i < local; ++i) {
      const Tensor slot = first.slice((rank() * local + i) * count, count);
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(inputs[static_cast<size_t>(i)], one(slot)));
    }
    const size_t block = static_cast<size_t>(local * count) * dtype_size(first.dtype());
    if (sync_) {
      classic_all_gather(static_cast<std::byte*>(first.data()), block);
    } else {
      unbound_all_gather(gloo_, first.data(), block, tag(call), call_timeout(call));
    }
    return algorithms::local_copy(first, std::span<const Tensor>(outputs.values()).subspan(1));
  }));
}

Work GlooOps::reduce_scatter_impl(const CallInfo& call, ReduceOp op,
                                  const PerReplica<Tensor>& inputs,
                                  const PerReplica<Tensor>& outputs) {
  return finish(guarded(call, [&]() -> Status {
    const int64_t n = num_replicas_in_sync();
    if (!gloo_) {
      return algorithms::local_reduce_scatter(op, inputs.values(), outputs.values(), n);
    }
    const int64_t count = outputs[0].num_elements();
    const DType dtype = inputs[0].dtype();
    const size_t elem = dtype_size(dtype);
    const int64_t total = inputs[0].num_elements();
    const int64_t local = num_local_replicas();
    const uint64_t bytes = static_cast<uint64_t>(total) * elem;
    const bool halving_doubling =
        reduce_scatter_ == GlooReduceScatter::kHalvingDoubling && bytes < kGlooClassicMaxBytes;
    TRIBUTARY_RETURN_IF_ERROR(verify_order(call, -1));
    if (count == 0) return Status();
    std::byte* mine = nullptr;  // this process's `local * count` reduced elements
    if (halving_doubling) {
      BoundAlgorithm& bound =
          cache_->get(ClassicKind::kReduceScatterHalvingDoubling, dtype, partial_op(op), total);
      const Tensor buffer(bound.data(), dtype, Shape{total}, devices()[0]);
      TRIBUTARY_RETURN_IF_ERROR(
          algorithms::local_reduce(partial_op(op), inputs.values(), one(buffer), n));
      bound.run();
      mine = static_cast<std::byte*>(bound.data());  // Gloo leaves it at the start
    } else {
      // All-reduce everything, keep this process's slice: twice the bytes, any size.
      const Tensor full(staging(bytes), dtype, Shape{total}, devices()[0]);
      TRIBUTARY_RETURN_IF_ERROR(
          reduce_everywhere(call, partial_op(op), inputs.values(), one(full)));
      mine = staging_.data() + static_cast<size_t>(rank() * local * count) * elem;
    }
    for (int64_t i = 0; i < local; ++i) {
      const Tensor part(mine + static_cast<size_t>(i * count) * elem, dtype, Shape{count},
                        devices()[0]);
      TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(final_op(op), one(part),
                                                         one(outputs[static_cast<size_t>(i)]), n));
    }
    return Status();
  }));
}

}  // namespace tributary::backends
