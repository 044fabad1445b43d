// The front door of every backend: validation, sequence numbers, timing and logging.
#include "tributary/cross_device_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/flight_recorder.h"
#include "core/gpu.h"
#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/strings.h"

namespace tributary {
namespace {

constexpr std::array<Collective, 6> kAllCollectives = {
    Collective::kReduce,    Collective::kBatchReduce, Collective::kAllReduce,
    Collective::kBroadcast, Collective::kAllGather,   Collective::kReduceScatter};

// Names an argument in messages ("inputs[2]", "pairs[1].destinations[0]"), formatted only when a
// message is needed: validation runs on every call and must stay cheap.
struct Label {
  std::string_view name;
  int index = -1;
  int pair = -1;
  std::string str() const {
    // Appends only: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&& at -O3.
    std::string s;
    if (pair >= 0) s.append("pairs[").append(std::to_string(pair)).append("].");
    s.append(name);
    if (index >= 0) s.append("[").append(std::to_string(index)).append("]");
    return s;
  }
};

Label at(std::string_view name, size_t index, int pair = -1) {
  return Label{name, static_cast<int>(index), pair};
}

// A byte range [begin, end) of a buffer, with a label for messages.
struct Range {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  Label label;
  bool empty() const { return begin == end; }
};

Range range_of(const Tensor& t, Label label) {
  uintptr_t b = reinterpret_cast<uintptr_t>(t.data());
  return Range{b, b + t.nbytes(), label};
}

bool overlaps(const Range& a, const Range& b) {
  return !a.empty() && !b.empty() && a.begin < b.end && b.begin < a.end;
}
bool same(const Range& a, const Range& b) { return a.begin == b.begin && a.end == b.end; }

std::string bytes_text(int64_t count, DType dtype) {
  return format_size(static_cast<uint64_t>(count) * dtype_size(dtype));
}

// Validation of one group of tensors that must agree in dtype and element count.
class Validator {
 public:
  Validator(std::string_view call) : call_(call) {}

  Status error(const std::string& what) const {
    return invalid_argument(std::string(call_) + ": " + what);
  }

  // Every tensor: non-negative count, data unless empty.
  Status check_tensor(const Tensor& t, Label label) const {
    if (t.num_elements() < 0) [[unlikely]] {
      return error(label.str() + " has shape " + shape_to_string(t.shape()) +
                   " with a negative dimension");
    }
    if (t.data() == nullptr && t.num_elements() > 0) [[unlikely]] {
      return error(label.str() + " has null data but " + std::to_string(t.num_elements()) +
                   " elements; pass a buffer, or a zero-element tensor");
    }
    // Element-aligned, as C++ (the host kernels) and CUDA (a fault) require of typed memory.
    // (An empty tensor is never read: any pointer will do, as null does.)
    if (t.num_elements() > 0 && reinterpret_cast<uintptr_t>(t.data()) % dtype_size(t.dtype()) != 0)
        [[unlikely]] {
      return error(label.str() + " is not aligned to its " + std::to_string(dtype_size(t.dtype())) +
                   "-byte elements (address " + fmt::format("{}", t.data()) +
                   "); pass a buffer that starts on an element boundary (e.g. a copy)");
    }
    return Status();
  }

  // All tensors in `ts` share dtype and count with ts[0].
  Status check_uniform(const std::vector<Tensor>& ts, Label name) const {
    for (size_t i = 0; i < ts.size(); ++i) {
      Label li{name.name, static_cast<int>(i), name.pair};
      Label l0{name.name, 0, name.pair};
      TRIBUTARY_RETURN_IF_ERROR(check_tensor(ts[i], li));
      if (ts[i].dtype() != ts[0].dtype()) [[unlikely]] {
        return error(li.str() + " has dtype " + std::string(dtype_name(ts[i].dtype())) + " but " +
                     l0.str() + " has " + std::string(dtype_name(ts[0].dtype())) +
                     "; every replica must pass the same dtype");
      }
      if (ts[i].num_elements() != ts[0].num_elements()) [[unlikely]] {
        return error(li.str() + " has " + std::to_string(ts[i].num_elements()) + " elements " +
                     shape_to_string(ts[i].shape()) + " but " + l0.str() + " has " +
                     std::to_string(ts[0].num_elements()) + " " + shape_to_string(ts[0].shape()) +
                     "; every replica must pass the same number of elements");
      }
    }
    return Status();
  }

  // `rule()` explains the expected count; it is only called to write a message.
  template <typename Rule>
  Status check_dtype_count(const Tensor& t, Label label, DType dtype, int64_t count,
                           Rule rule) const {
    TRIBUTARY_RETURN_IF_ERROR(check_tensor(t, label));
    if (t.dtype() != dtype) [[unlikely]] {
      return error(label.str() + " has dtype " + std::string(dtype_name(t.dtype())) +
                   " but the input is " + std::string(dtype_name(dtype)) +
                   "; outputs must have the input's dtype");
    }
    if (t.num_elements() != count) [[unlikely]] {
      return error(label.str() + " has " + std::to_string(t.num_elements()) +
                   " elements but must have " + std::to_string(count) + " (" + std::string(rule()) +
                   ")");
    }
    return Status();
  }

  // Outputs never overlap each other; an output may alias an input only where
  // `allowed(output index, input index)` says so, and then exactly (the same range), never
  // partially.
  template <typename Outs, typename Ins, typename Allowed>
  Status check_overlap(const Outs& outputs, const Ins& inputs, Allowed allowed) const {
    if (outputs.size() > kPairwiseUpTo) return check_overlap_sorted(outputs, inputs, allowed);
    for (size_t i = 0; i < outputs.size(); ++i) {
      for (size_t j = i + 1; j < outputs.size(); ++j) {
        if (overlaps(outputs[i], outputs[j])) [[unlikely]] {
          return error(outputs[i].label.str() + " and " + outputs[j].label.str() +
                       " overlap; every output needs its own memory");
        }
      }
      for (size_t j = 0; j < inputs.size(); ++j) {
        if (!overlaps(outputs[i], inputs[j])) continue;
        if (!same(outputs[i], inputs[j]) || !allowed(i, j)) [[unlikely]] {
          return error(outputs[i].label.str() + " overlaps " + inputs[j].label.str() +
                       "; an output may only be exactly its own replica's input (in place)");
        }
      }
    }
    return Status();
  }

 private:
  // Up to this many outputs every pair is compared (no allocation); above, the ranges are sorted,
  // so that thousands of replicas cost O(n log n), not O(n^2).
  static constexpr size_t kPairwiseUpTo = 32;

  template <typename Outs, typename Ins, typename Allowed>
  Status check_overlap_sorted(const Outs& outputs, const Ins& inputs, Allowed allowed) const {
    std::vector<size_t> order;  // the non-empty outputs by address
    order.reserve(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].empty()) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return outputs[a].begin != outputs[b].begin ? outputs[a].begin < outputs[b].begin : a < b;
    });
    // Sorted by start, two outputs overlap only if some neighbours do.
    for (size_t k = 1; k < order.size(); ++k) {
      const Range& prev = outputs[order[k - 1]];
      const Range& next = outputs[order[k]];
      if (next.begin < prev.end) [[unlikely]] {
        const size_t a = std::min(order[k - 1], order[k]), b = std::max(order[k - 1], order[k]);
        return error(outputs[a].label.str() + " and " + outputs[b].label.str() +
                     " overlap; every output needs its own memory");
      }
    }
    // Disjoint and sorted by start, the outputs are sorted by end too: an input's overlapping
    // outputs start at the first that ends after the input begins.
    for (size_t j = 0; j < inputs.size(); ++j) {
      const Range& in = inputs[j];
      if (in.empty()) continue;
      auto it = std::upper_bound(order.begin(), order.end(), in.begin,
                                 [&](uintptr_t at, size_t i) { return at < outputs[i].end; });
      for (; it != order.end() && outputs[*it].begin < in.end; ++it) {
        if (!same(outputs[*it], in) || !allowed(*it, j)) [[unlikely]] {
          return error(outputs[*it].label.str() + " overlaps " + in.label.str() +
                       "; an output may only be exactly its own replica's input (in place)");
        }
      }
    }
    return Status();
  }

  std::string_view call_;
};

// The byte ranges of one group of tensors, without a heap allocation for up to 8 of them (the
// front door runs on every call; small messages feel every allocation).
class RangeList {
 public:
  size_t size() const { return size_; }
  Range& operator[](size_t i) { return size_ <= kInline ? inline_[i] : heap_[i]; }
  const Range& operator[](size_t i) const { return size_ <= kInline ? inline_[i] : heap_[i]; }
  void push_back(const Range& r) {
    if (size_ < kInline) {
      inline_[size_] = r;
    } else {
      if (size_ == kInline) heap_.assign(inline_.begin(), inline_.end());
      heap_.push_back(r);
    }
    ++size_;
  }

 private:
  static constexpr size_t kInline = 8;
  std::array<Range, kInline> inline_;
  std::vector<Range> heap_;
  size_t size_ = 0;
};

RangeList ranges(const std::vector<Tensor>& ts, std::string_view name) {
  RangeList out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back(range_of(ts[i], at(name, i)));
  return out;
}

// Rules quoted in count errors.
constexpr auto kSameAsInput = [] { return "same as each input"; };
constexpr auto kSameAsValue = [] { return "same as each value"; };
constexpr auto kSameAsSource = [] { return "same as the source"; };

}  // namespace

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kReduce:
      return "reduce";
    case Collective::kBatchReduce:
      return "batch_reduce";
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kRegisterBuffers:
      return "register_buffers";
  }
  return "?";
}

std::span<const Collective> all_collectives() { return kAllCollectives; }

bool Capabilities::supports(DeviceType t) const {
  return std::find(device_types.begin(), device_types.end(), t) != device_types.end();
}
bool Capabilities::supports(DType t) const {
  return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
}
bool Capabilities::supports(ReduceOp op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}
bool Capabilities::supports(Collective c) const {
  return std::find(collectives.begin(), collectives.end(), c) != collectives.end();
}

std::string Capabilities::to_string() const {
  std::vector<std::string> d, t, o, c;
  for (auto x : device_types) d.emplace_back(device_type_name(x));
  for (auto x : dtypes) t.emplace_back(dtype_name(x));
  for (auto x : ops) o.emplace_back(reduce_op_name(x));
  for (auto x : collectives) c.emplace_back(collective_name(x));
  return "devices: " + internal::join(d, ",") + "; dtypes: " + internal::join(t, ",") +
         "; ops: " + internal::join(o, ",") + "; collectives: " + internal::join(c, ",") +
         "; multi-process: " + (multi_process ? "yes" : "no");
}

std::string CallInfo::describe() const {
  std::string s = std::string(collective_name(collective)) + " #" + std::to_string(sequence) +
                  " (" + bytes_text(count, dtype) + " " + std::string(dtype_name(dtype));
  if (collective != Collective::kBroadcast && collective != Collective::kAllGather &&
      collective != Collective::kRegisterBuffers) {
    s += ", " + std::string(reduce_op_name(op));
  }
  return s + ")";
}

// The instance's first failure, and what the front door does when a collective ends: the observer
// of every asynchronous Work (no allocation per call), so shared with Works that may complete after
// the instance is gone. `recorder` is set before the first call and then only read.
struct CrossDeviceOps::Health final : Work::Observer {
  mutable std::mutex mu;
  Status first_failure;
  std::atomic<bool> failed{false};  // read without the lock on every call
  std::shared_ptr<internal::FlightRecorder> recorder;
  void ending(uint64_t sequence, const Status& s) override {
    if (!s.ok()) record(s);
    if (recorder) recorder->record_end(sequence, s);
  }
  void ended(uint64_t sequence, const Status& s) override {
    if (recorder) recorder->report_end(sequence, s);
  }
  // Keeps the first failure; true when `s` is it.
  bool record(const Status& s) {
    std::lock_guard lock(mu);
    if (!first_failure.ok() || s.ok()) return false;
    first_failure = s;
    failed.store(true, std::memory_order_release);
    return true;
  }
  Status get() const {
    if (!failed.load(std::memory_order_acquire)) return Status();
    std::lock_guard lock(mu);
    return first_failure;
  }

  // abort() from another thread (CallScope): under `pending_mu`, whether a public call is in
  // flight, and the reason an abort left for it. An abort that finds a call in flight wakes it
  // (interrupt()) and leaves the abandon() to the call's thread, as it returns; one that finds none
  // abandons at once.
  std::mutex pending_mu;
  bool in_call = false;
  Status pending_abandon;
};

// Marks a public call in flight from its start to its return, for abort() on another thread.
class CrossDeviceOps::CallScope {
 public:
  explicit CallScope(CrossDeviceOps& ops) : ops_(ops) {
    std::lock_guard lock(ops_.health_->pending_mu);
    ops_.health_->in_call = true;
  }
  ~CallScope() {
    Status why;
    {
      std::lock_guard lock(ops_.health_->pending_mu);
      ops_.health_->in_call = false;
      why = std::exchange(ops_.health_->pending_abandon, Status());
    }
    // An abort came while the call was in flight: tell the peers before the caller gets its error.
    if (!why.ok()) ops_.abandon(why);
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  CrossDeviceOps& ops_;
};

namespace internal {
// The live registrations of one instance, shared with their handles. `ops` is cleared when the
// instance goes, after which a handle's release does nothing.
struct Registrations {
  std::mutex mu;
  CrossDeviceOps* ops = nullptr;
  uint64_t last_id = 0;
  std::vector<uint64_t> live;
};
}  // namespace internal

BufferRegistration::BufferRegistration(BufferRegistration&& other) noexcept
    : owner_(std::move(other.owner_)), id_(std::exchange(other.id_, 0)) {}

BufferRegistration& BufferRegistration::operator=(BufferRegistration&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

BufferRegistration::~BufferRegistration() { release(); }

bool BufferRegistration::active() const {
  std::shared_ptr<internal::Registrations> r = owner_.lock();
  if (!r) return false;
  std::lock_guard lock(r->mu);
  return r->ops != nullptr && std::find(r->live.begin(), r->live.end(), id_) != r->live.end();
}

void BufferRegistration::release() {
  std::shared_ptr<internal::Registrations> r = owner_.lock();
  owner_.reset();
  if (!r) return;
  std::lock_guard lock(r->mu);
  auto it = std::find(r->live.begin(), r->live.end(), id_);
  if (r->ops == nullptr || it == r->live.end()) return;
  r->live.erase(it);
  r->ops->release_buffers_impl(id_);
}

CrossDeviceOps::CrossDeviceOps(std::string name, BackendContext context, Options options,
                               Capabilities capabilities)
    : name_(std::move(name)),
      context_(std::move(context)),
      options_(std::move(options)),
      capabilities_(std::move(capabilities)) {
  registrations_ = std::make_shared<internal::Registrations>();
  registrations_->ops = this;
  if (const Options::Value* t = options_.find("timeout")) timeout_ = std::chrono::nanoseconds(t->i);
  log_level_ = static_cast<int>(internal::log_level_from(context_.config));
  log_prefix_ = "rank " + std::to_string(context_.rank) + "/" + name_;
  health_ = std::make_shared<Health>();
  recorder_ = internal::make_recorder(name_, context_.rank, context_.world_size, context_.config);
  health_->recorder = recorder_;
}

CrossDeviceOps::~CrossDeviceOps() {
  {
    std::lock_guard lock(registrations_->mu);
    registrations_->ops = nullptr;
    registrations_->live.clear();
  }
  internal::release_recorder(recorder_);
}

void CrossDeviceOps::leave_recording_to_members() {
  internal::release_recorder(recorder_);
  recorder_.reset();
  health_->recorder.reset();
}

namespace internal {
void attach_progress_store(CrossDeviceOps& ops, std::shared_ptr<Store> scope) {
  ops.scope_ = scope;
  if (ops.recorder_ && scope) ops.recorder_->report_progress_to(std::move(scope));
}
}  // namespace internal

Status CrossDeviceOps::broken() const { return health_->get(); }

Work CrossDeviceOps::screened(Work work) {
  // A call refused before it was issued: harmless in one process, but across processes the
  // peers are about to wait for this rank, so tell them now rather than at their timeout.
  // Capability refusals (Unimplemented) are the same on every rank and break nothing.
  if (validating_ && world_size() > 1) {
    Status s = work.error();
    // Not after an abort from another thread (the first failure stands, and is told once).
    if (s.code() == StatusCode::kInvalidArgument && health_->record(s)) {
      publish_refusal(s);
      abandon(s);
    }
  }
  validating_ = false;
  return work;
}

void CrossDeviceOps::abort(const Status& why) {
  if (!health_->record(why) || world_size() <= 1) return;
  publish_refusal(why);
  bool in_flight;
  {
    std::lock_guard lock(health_->pending_mu);
    in_flight = health_->in_call;
    if (in_flight) health_->pending_abandon = why;
  }
  if (in_flight) {
    // A call on another thread: its waits end now, it fails with `why`, and as it returns it tells
    // the peers (CallScope). Outside the lock: interrupt() may complete Works, whose callbacks run.
    interrupt(why);
  } else {
    // A call that starts meanwhile is refused before it reaches the backend (broken()).
    abandon(why);
  }
}

namespace {
constexpr std::string_view kRefusedKey = "refused/";
constexpr std::string_view kFailedKey = "failed/";
constexpr std::string_view kExplainedKey = "explained/";
// How long the store's host stays for its failing peers' explanations.
constexpr std::chrono::milliseconds kHostStays{4000};
constexpr std::string_view kSilentMarker = " did not fail with the others";
constexpr size_t kMaxPublishedReason = 4096;
// How long a failed collective waits for its peers' failures before it names the silent ones: a
// quarter of the timeout, from 250 ms to 2 s (ranks that fail together report within
// milliseconds of each other; the error should not come long after the timeout).
std::chrono::milliseconds roll_call_grace(std::chrono::nanoseconds timeout) {
  return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(timeout / 4),
                    std::chrono::milliseconds(250), std::chrono::milliseconds(2000));
}
// Store requests made while explaining a failure: a store that stopped answering (rank 0 stopped)
// costs at most this each.
constexpr std::chrono::milliseconds kExplainRequest{1000};

// An instance fails once: its rank's key holds the sequence number of the collective that failed.
std::string failed_key(int rank) { return std::string(kFailedKey) + std::to_string(rank); }

// Whether the transport's message already says that rank `r` is gone: its process exited (the
// same-host transports watch their peers' processes: "rank 1 (pid 42, on this host) exited",
// "rank 1 (process 42 on this host) exited") or it closed its connection ("rank 1 closed the
// connection", "rank 1 (socket 0 of 2) closed the connection", "... failed: Connection reset by
// peer (did rank 1 exit ...)"). Such a rank did not stay silent, and a stopped process neither
// exits nor closes: the roll call leaves it to the transport's message, which says what happened.
bool reported_gone(std::string_view said, int r) {
  const std::string who = "rank " + std::to_string(r);
  if (said.find("did " + who + " exit") != std::string_view::npos) return true;
  for (size_t at = said.find(who); at != std::string_view::npos; at = said.find(who, at + 1)) {
    std::string_view rest = said.substr(at + who.size());
    // Not "rank 12" for rank 1.
    if (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front()))) continue;
    if (rest.starts_with(" (")) {  // "(pid 42, on this host)", "(socket 0 of 2)"
      const size_t close = rest.find(')');
      if (close == std::string_view::npos) continue;
      rest.remove_prefix(close + 1);
    }
    if (rest.starts_with(" exited") || rest.starts_with(" closed the connection")) return true;
  }
  return false;
}
}  // namespace

void CrossDeviceOps::publish_refusal(const Status& why) const {
  if (!scope_ || world_size() <= 1) return;
  (void)scope_->set(std::string(kRefusedKey) + std::to_string(rank()),
                    why.message().substr(0, kMaxPublishedReason), kExplainRequest);
}

Status CrossDeviceOps::explain_failure(Status failure, uint64_t sequence) const {
  Status named = find_root_cause(std::move(failure), sequence);
  if (!scope_) return named;
  // Done with the store for this failure. The store lives in rank 0's process: rank 0 stays until
  // the peers that failed too are done with it (else they would blame rank 0 for leaving), for at
  // most kHostStays; silent peers (no failure reported) are not waited for.
  (void)scope_->set(std::string(kExplainedKey) + std::to_string(rank()), "1", kExplainRequest);
  if (rank() == 0 && !context_.lost_key.empty()) {
    const auto until = std::chrono::steady_clock::now() + kHostStays;
    for (int r = 1; r < world_size() && std::chrono::steady_clock::now() < until; ++r) {
      if (!scope_->get(failed_key(r), std::chrono::milliseconds(0)).ok()) continue;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      (void)scope_->get(std::string(kExplainedKey) + std::to_string(r),
                        std::max(left, std::chrono::milliseconds(0)));
    }
  }
  return named;
}

Status CrossDeviceOps::find_root_cause(Status failure, uint64_t sequence) const {
  // The roll call: every rank whose collective failed says so first, whatever the failure, so
  // that a rank that stays silent (stopped, hung: alive, so no will fires for it) can be named.
  const auto called = std::chrono::steady_clock::now();
  Status reported;
  if (scope_) reported = scope_->set(failed_key(rank()), std::to_string(sequence), kExplainRequest);
  const StatusCode code = failure.code();
  if (world_size() <= 1 || (code != StatusCode::kUnavailable && code != StatusCode::kAborted &&
                            code != StatusCode::kDeadlineExceeded)) {
    return failure;
  }
  // The store neither answered nor closed the connection: its host, rank 0, is silent too.
  if (reported.code() == StatusCode::kDeadlineExceeded && rank() != 0 &&
      failure.message().find(kSilentMarker) == std::string::npos) {
    return Status(code, "rank 0" + std::string(kSilentMarker) +
                            ": it hosts the job's store, which did not answer within " +
                            format_duration(kExplainRequest) +
                            " either: stopped (SIGSTOP, a debugger), hung or starved of CPU. "
                            "what rank " +
                            std::to_string(rank()) + " saw: " + failure.message());
  }
  // A peer that refused its part said why in the store before it broke the connections. Backends
  // that pass the reason on their own connections (ring, ucx, gloo's control channel) have it in
  // the message already: that is the root cause, and no roll call follows (the refusing rank
  // issued no collective, so it would be named as silent).
  if (failure.message().find(" refused its part: ") != std::string::npos) return failure;
  // A transport that compared the ranks' calls and found them different named both: that is the
  // root cause, and the waits below (for a will, for the roll call) would only hold it back.
  if (failure.message().find("collective mismatch: ") != std::string::npos) return failure;
  if (scope_) {
    // One quick look per peer, within 1 s in all (a store that stopped answering costs no more).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (int r = 0; r < world_size() && std::chrono::steady_clock::now() < until; ++r) {
      if (r == rank()) continue;
      auto reason =
          scope_->get(std::string(kRefusedKey) + std::to_string(r), std::chrono::milliseconds(0));
      if (!reason.ok()) {
        // Not there (deadline_exceeded at once), or the store is gone: ask no further then.
        if (reason.status().code() == StatusCode::kDeadlineExceeded) continue;
        break;
      }
      // The peer gave up on purpose: the collective was aborted, whatever broke here after it.
      return Status(StatusCode::kAborted, "rank " + std::to_string(r) + " refused its part: " + *reason +
                              ". what rank " + std::to_string(rank()) +
                              " saw: " + failure.message());
    }
  }
  if (!context_.lost_key.empty()) {
    // A broken connection is often a death the store is about to hear of: wait for its will. A
    // timeout rarely is (a peer that died while this rank waited has its will there already), and
    // waiting 2 s for one put a timeout=1s error at 3 s: look only for as long as the roll call
    // below waits anyway.
    const std::chrono::milliseconds grace = code == StatusCode::kDeadlineExceeded
                                                ? roll_call_grace(timeout_)
                                                : std::chrono::milliseconds(2000);
    Status named = internal::name_lost_ranks(context_, failure, grace);
    if (named.message() != failure.message()) return named;
  }
  if (!reported.ok()) return failure;  // no roll call without this rank's own report
  return name_silent_ranks(std::move(failure), sequence, called + roll_call_grace(timeout_));
}

Status CrossDeviceOps::name_silent_ranks(Status failure, uint64_t sequence,
                                         std::chrono::steady_clock::time_point until) const {
  const std::string& said = failure.message();
  if (!scope_ || said.find(kSilentMarker) != std::string::npos ||
      said.find(" was lost: ") != std::string::npos ||
      said.find(" were lost: ") != std::string::npos) {
    return failure;  // no store, or named already (a composite backend's inner front door)
  }
  // A peer that failed too (this collective, or a later one after completing this) answered. A peer
  // the transport already reports gone (exited, or closed its connection) never answers and is
  // never named silent: waiting for it would only hold the error back by the whole grace.
  std::vector<std::string> others;
  for (int r = 0; r < world_size(); ++r) {
    if (r != rank() && !reported_gone(said, r)) others.push_back(failed_key(r));
  }
  if (others.empty()) return failure;
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  Status all = scope_->wait(others, std::max(left, std::chrono::milliseconds(0)));
  if (all.ok() || all.code() != StatusCode::kDeadlineExceeded) return failure;
  std::vector<int> silent;
  const auto stop = std::chrono::steady_clock::now() + kExplainRequest;
  for (int r = 0; r < world_size(); ++r) {
    if (r == rank()) continue;
    if (std::chrono::steady_clock::now() >= stop) return failure;  // the store is too slow to say
    auto there = scope_->get(failed_key(r), std::chrono::milliseconds(0));
    if (there.ok()) continue;
    if (there.status().code() != StatusCode::kDeadlineExceeded) return failure;  // store gone
    if (reported_gone(said, r)) continue;  // exited or closed: not silent, and said already
    silent.push_back(r);
  }
  // A key that is not there and a store that did not answer look alike (both deadlines): the
  // store must still give back this rank's own report, or nobody is named.
  if (silent.empty() ||
      !scope_->get(failed_key(rank()), std::chrono::milliseconds(0)).ok()) {
    return failure;
  }
  std::string names = "rank " + std::to_string(silent[0]);
  if (silent.size() > 1) {
    names = "ranks " + std::to_string(silent[0]);
    for (size_t i = 1; i < silent.size(); ++i) {
      names += (i + 1 == silent.size() ? " and " : ", ") + std::to_string(silent[i]);
    }
  }
  const bool one = silent.size() == 1;
  // With wills kept, a rank that is not lost still holds its connection to the store.
  const std::string alive =
      context_.lost_key.empty()
          ? std::string()
          : std::string(", though ") + (one ? "its process is" : "their processes are") +
                " still connected to the job's store";
  return Status(failure.code(),
                names + std::string(kSilentMarker) + ": no failure reported within " +
                    format_duration(roll_call_grace(timeout_)) +
                    " of this rank's failure of collective #" +
                    std::to_string(sequence) + alive +
                    ": stopped (SIGSTOP, a debugger), hung, starved of CPU, or not issuing the "
                    "collectives the others issue (see the stall report). what rank " +
                    std::to_string(rank()) + " saw: " + said);
}

std::string CrossDeviceOps::spec() const {
  std::string opts = options_.to_string();
  return opts.empty() ? name_ : name_ + ":" + opts;
}

void CrossDeviceOps::log_debug(const std::string& m) const {
  if (log_level_ <= static_cast<int>(internal::LogLevel::kDebug)) {
    internal::write_log_line(internal::LogLevel::kDebug, log_prefix_, m);
  }
}
void CrossDeviceOps::log_info(const std::string& m) const {
  if (log_level_ <= static_cast<int>(internal::LogLevel::kInfo)) {
    internal::write_log_line(internal::LogLevel::kInfo, log_prefix_, m);
  }
}
void CrossDeviceOps::log_warning(const std::string& m) const {
  if (log_level_ <= static_cast<int>(internal::LogLevel::kWarning)) {
    internal::write_log_line(internal::LogLevel::kWarning, log_prefix_, m);
  }
}

Status CrossDeviceOps::check_supported(Collective c, ReduceOp op, DType dtype) const {
  std::string call(collective_name(c));
  if (!capabilities_.supports(c)) {
    return unimplemented(call + " is not supported by backend '" + name_ + "' (" +
                         capabilities_.to_string() + ")");
  }
  if (!capabilities_.supports(dtype)) {
    return unimplemented(call + ": backend '" + name_ + "' does not support dtype " +
                         std::string(dtype_name(dtype)) + " (" + capabilities_.to_string() + ")");
  }
  bool has_op = c != Collective::kBroadcast && c != Collective::kAllGather;
  if (has_op && !capabilities_.supports(op)) {
    return unimplemented(call + ": backend '" + name_ + "' does not support reduce op " +
                         std::string(reduce_op_name(op)) + " (" + capabilities_.to_string() + ")");
  }
  return Status();
}

Status CrossDeviceOps::check_device(const Tensor& t, std::string_view name, int index,
                                    int pair) const {
  if (!capabilities_.supports(t.device().type())) [[unlikely]] {
    return unimplemented(Label{name, index, pair}.str() + " is on " + t.device().to_string() +
                         " but backend '" + name_ + "' does not support " +
                         std::string(device_type_name(t.device().type())) + " devices");
  }
  if (t.device().is_cuda()) [[unlikely]] {
    // A GPU this process cannot see: say so before any CUDA call fails on it.
    if (Status s = gpu::check_visible(t.device()); !s.ok()) {
      return Status(s.code(), Label{name, index, pair}.str() + ": " + s.message());
    }
  }
  return Status();
}

CallInfo CrossDeviceOps::begin(Collective c, ReduceOp op, DType dtype, int64_t count) {
  validating_ = false;
  CallInfo call;
  call.sequence = ++sequence_;
  call.collective = c;
  call.op = op;
  call.dtype = dtype;
  call.count = count;
  call.timeout = timeout_;
  call.start = std::chrono::steady_clock::now();
  if (recorder_) recorder_->issued(call);
  return call;
}

Work CrossDeviceOps::finish(const CallInfo& call, Work work) {
  // A collective that failed after validation leaves the group in an unknown state.
  if (work.completed_on_host()) {
    // Already complete (synchronous backends): no callback to allocate.
    Status s = work.error();
    if (!s.ok()) {
      // The root cause first: a peer's refusal, or a rank that died (not the broken neighbour).
      if (world_size() > 1) {
        Status named = explain_failure(s, call.sequence);
        if (named.message() != s.message()) {
          s = std::move(named);
          work = Work::completed(s);
        }
      }
      health_->record(s);
    }
    if (recorder_) recorder_->ended(call.sequence, s);
  } else {
    work.observe(health_, call.sequence);
  }
  if (log_level_ <= static_cast<int>(internal::LogLevel::kDebug)) {
    std::string what = call.describe();
    std::string prefix = log_prefix_;
    const auto start = call.start;
    work.on_complete([what, prefix, start](const Status& s) {
      auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
      internal::write_log_line(internal::LogLevel::kDebug, prefix,
                               what + (s.ok() ? " done" : " failed: " + s.message()) + " in " +
                                   std::to_string(us) + " us");
    });
  }
  return work;
}

// Checks a PerReplica group: one tensor per local replica, on that replica's device.
#define TRIBUTARY_CHECK_REPLICAS(v, call, name)                                                  \
  do {                                                                                           \
    if ((v).empty()) {                                                                           \
      return Work::completed(invalid_argument(std::string(call) + ": " + name +                  \
                                              " is an empty replica list; pass one tensor per "  \
                                              "local replica"));                                 \
    }                                                                                            \
    if ((v).size() != devices().size()) {                                                        \
      return Work::completed(invalid_argument(                                                   \
          std::string(call) + ": " + name + " has " + std::to_string((v).size()) +               \
          " values but this backend serves " + std::to_string(devices().size()) +                \
          " local replicas; pass one tensor per replica"));                                      \
    }                                                                                            \
    for (size_t i_ = 0; i_ < (v).size(); ++i_) {                                                 \
      if ((v)[i_].device() != devices()[i_]) {                                                   \
        return Work::completed(                                                                  \
            invalid_argument(std::string(call) + ": " + name + "[" + std::to_string(i_) +        \
                             "] is on " + (v)[i_].device().to_string() + " but local replica " + \
                             std::to_string(i_) + " is " + devices()[i_].to_string()));          \
      }                                                                                          \
    }                                                                                            \
  } while (0)

#define TRIBUTARY_REFUSE_IF_BROKEN(call)                                                    \
  do {                                                                                      \
    if (::tributary::Status _b = broken(); !_b.ok()) {                                      \
      return ::tributary::Work::completed(                                                  \
          ::tributary::failed_precondition(std::string(call) + ": backend '" + name_ +      \
                                           "' is unusable after an earlier "                \
                                           "failure; create a new one. The failure was: " + \
                                           _b.message()));                                  \
    }                                                                                       \
  } while (0)

#define TRIBUTARY_RETURN_WORK_IF_ERROR(expr)                         \
  do {                                                               \
    ::tributary::Status _trib_s = (expr);                            \
    if (!_trib_s.ok()) return ::tributary::Work::completed(_trib_s); \
  } while (0)

Work CrossDeviceOps::all_reduce(ReduceOp op, const PerReplica<Tensor>& inputs,
                                const PerReplica<Tensor>& outputs) {
  CallScope scope(*this);
  validating_ = true;
  return screened(all_reduce_front(op, inputs, outputs));
}

Work CrossDeviceOps::all_reduce_front(ReduceOp op, const PerReplica<Tensor>& inputs,
                                      const PerReplica<Tensor>& outputs) {
  constexpr std::string_view kCall = "all_reduce";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  TRIBUTARY_CHECK_REPLICAS(inputs, kCall, "inputs");
  TRIBUTARY_CHECK_REPLICAS(outputs, kCall, "outputs");
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(inputs.values(), Label{"inputs"}));
  const DType dtype = inputs[0].dtype();
  const int64_t count = inputs[0].num_elements();
  TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kAllReduce, op, dtype));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_device(inputs[i], "inputs", static_cast<int>(i)));
    TRIBUTARY_RETURN_WORK_IF_ERROR(
        v.check_dtype_count(outputs[i], at("outputs", i), dtype, count, kSameAsInput));
  }
  // In place: output i may be exactly input i.
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(ranges(outputs.values(), "outputs"),
                                                 ranges(inputs.values(), "inputs"),
                                                 [](size_t i, size_t j) { return i == j; }));
  CallInfo call = begin(Collective::kAllReduce, op, dtype, count);
  return finish(call, all_reduce_impl(call, op, inputs, outputs));
}

StatusOr<BufferRegistration> CrossDeviceOps::register_buffers(const PerReplica<Tensor>& buffers) {
  CallScope scope(*this);
  validating_ = true;
  uint64_t id = 0;
  TRIBUTARY_RETURN_IF_ERROR(screened(register_front(buffers, &id)).wait());
  return BufferRegistration(registrations_, id);
}

Work CrossDeviceOps::register_front(const PerReplica<Tensor>& buffers, uint64_t* id) {
  constexpr std::string_view kCall = "register_buffers";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  TRIBUTARY_CHECK_REPLICAS(buffers, kCall, "buffers");
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(buffers.values(), Label{"buffers"}));
  const DType dtype = buffers[0].dtype();
  if (!capabilities_.supports(dtype)) {
    return Work::completed(unimplemented(std::string(kCall) + ": backend '" + name_ +
                                         "' does not support dtype " +
                                         std::string(dtype_name(dtype)) + " (" +
                                         capabilities_.to_string() + ")"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_device(buffers[i], "buffers", static_cast<int>(i)));
  }
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(ranges(buffers.values(), "buffers"), RangeList{},
                                                 [](size_t, size_t) { return false; }));
  CallInfo call = begin(Collective::kRegisterBuffers, ReduceOp::kSum, dtype,
                        buffers[0].num_elements());
  uint64_t next = 0;
  {
    std::lock_guard lock(registrations_->mu);
    next = ++registrations_->last_id;
  }
  Status s = register_buffers_impl(call, next, buffers);
  if (s.ok()) {
    std::lock_guard lock(registrations_->mu);
    registrations_->live.push_back(next);
    *id = next;
  }
  return finish(call, Work::completed(std::move(s)));
}

Status CrossDeviceOps::register_buffers_impl(const CallInfo& call, uint64_t id,
                                             const PerReplica<Tensor>& buffers) {
  (void)call;
  (void)id;
  (void)buffers;
  return Status();
}

Work CrossDeviceOps::reduce(ReduceOp op, const PerReplica<Tensor>& value,
                            const Mirrored<Tensor>& destinations) {
  CallScope scope(*this);
  validating_ = true;
  return screened(reduce_front(op, value, destinations));
}

Work CrossDeviceOps::reduce_front(ReduceOp op, const PerReplica<Tensor>& value,
                                  const Mirrored<Tensor>& destinations) {
  ReducePair pair{value, destinations};
  constexpr std::string_view kCall = "reduce";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  TRIBUTARY_CHECK_REPLICAS(value, kCall, "value");
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(value.values(), Label{"value"}));
  if (destinations.empty()) {
    return Work::completed(v.error("destinations can not be empty; pass at least one tensor"));
  }
  const DType dtype = value[0].dtype();
  const int64_t count = value[0].num_elements();
  TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kReduce, op, dtype));
  for (size_t i = 0; i < destinations.size(); ++i) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(
        check_device(destinations[i], "destinations", static_cast<int>(i)));
    TRIBUTARY_RETURN_WORK_IF_ERROR(
        v.check_dtype_count(destinations[i], at("destinations", i), dtype, count, kSameAsValue));
  }
  // A destination may be a value's own buffer when it is on that value's device.
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(
      ranges(destinations.values(), "destinations"), ranges(value.values(), "value"),
      [&](size_t i, size_t j) { return value[j].device() == destinations[i].device(); }));
  CallInfo call = begin(Collective::kReduce, op, dtype, count);
  return finish(call, reduce_impl(call, op, value, destinations));
}

Work CrossDeviceOps::batch_reduce(ReduceOp op, std::span<const ReducePair> pairs) {
  CallScope scope(*this);
  validating_ = true;
  return screened(batch_reduce_front(op, pairs));
}

Work CrossDeviceOps::batch_reduce_front(ReduceOp op, std::span<const ReducePair> pairs) {
  constexpr std::string_view kCall = "batch_reduce";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  if (pairs.empty()) {
    return Work::completed(v.error("value_destination_pairs is empty; pass at least one pair"));
  }
  std::vector<Range> outs, ins;
  std::vector<std::vector<size_t>> alias;
  int64_t total = 0;
  for (size_t p = 0; p < pairs.size(); ++p) {
    const int pi = static_cast<int>(p);
    const ReducePair& pair = pairs[p];
    TRIBUTARY_CHECK_REPLICAS(pair.value, kCall, (Label{"value", -1, pi}.str()));
    TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(pair.value.values(), Label{"value", -1, pi}));
    if (pair.destinations.empty()) {
      return Work::completed(v.error(Label{"destinations", -1, pi}.str() + " can not be empty"));
    }
    const DType dtype = pair.value[0].dtype();
    const int64_t count = pair.value[0].num_elements();
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kBatchReduce, op, dtype));
    const size_t in_base = ins.size();
    for (size_t j = 0; j < pair.value.size(); ++j) {
      ins.push_back(range_of(pair.value[j], at("value", j, pi)));
    }
    for (size_t i = 0; i < pair.destinations.size(); ++i) {
      const Label label = at("destinations", i, pi);
      TRIBUTARY_RETURN_WORK_IF_ERROR(
          check_device(pair.destinations[i], "destinations", static_cast<int>(i), pi));
      TRIBUTARY_RETURN_WORK_IF_ERROR(
          v.check_dtype_count(pair.destinations[i], label, dtype, count, kSameAsValue));
      outs.push_back(range_of(pair.destinations[i], label));
      std::vector<size_t> a;
      for (size_t j = 0; j < pair.value.size(); ++j) {
        if (pair.value[j].device() == pair.destinations[i].device()) a.push_back(in_base + j);
      }
      alias.push_back(std::move(a));
    }
    total += count;
  }
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(outs, ins, [&](size_t i, size_t j) {
    return std::find(alias[i].begin(), alias[i].end(), j) != alias[i].end();
  }));
  CallInfo call = begin(Collective::kBatchReduce, op, pairs[0].value[0].dtype(), total);
  return finish(call, batch_reduce_impl(call, op, pairs));
}

Work CrossDeviceOps::batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                       std::span<const ReducePair> pairs) {
  for (const ReducePair& pair : pairs) {
    CallInfo one = call;
    one.collective = Collective::kReduce;
    one.dtype = pair.value[0].dtype();
    one.count = pair.value[0].num_elements();
    Status s = reduce_impl(one, op, pair.value, pair.destinations).wait();
    if (!s.ok()) return Work::completed(s);
  }
  return Work::completed();
}

Work CrossDeviceOps::broadcast(const Tensor& source, const Mirrored<Tensor>& destinations,
                               int root) {
  CallScope scope(*this);
  validating_ = true;
  return screened(broadcast_front(source, destinations, root));
}

Work CrossDeviceOps::broadcast_front(const Tensor& source, const Mirrored<Tensor>& destinations,
                                     int root) {
  constexpr std::string_view kCall = "broadcast";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  if (root < 0 || root >= world_size()) {
    return Work::completed(v.error("root " + std::to_string(root) +
                                   " is not a process rank in [0, " + std::to_string(world_size()) +
                                   ")"));
  }
  if (destinations.empty()) {
    return Work::completed(v.error("destinations can not be empty; pass at least one tensor"));
  }
  // Off the root process the source is ignored; the destinations define dtype and count.
  const bool is_root = root == rank();
  const Tensor& shape_of = is_root ? source : destinations[0];
  if (is_root) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_tensor(source, Label{"source"}));
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_device(source, "source"));
  }
  const DType dtype = shape_of.dtype();
  const int64_t count = shape_of.num_elements();
  TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kBroadcast, ReduceOp::kSum, dtype));
  for (size_t i = 0; i < destinations.size(); ++i) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(
        check_device(destinations[i], "destinations", static_cast<int>(i)));
    TRIBUTARY_RETURN_WORK_IF_ERROR(
        v.check_dtype_count(destinations[i], at("destinations", i), dtype, count, kSameAsSource));
  }
  RangeList src;
  if (is_root) src.push_back(range_of(source, Label{"source"}));
  // On the root, a destination on the source's device may be the source itself.
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(
      ranges(destinations.values(), "destinations"), src,
      [&](size_t i, size_t) { return is_root && destinations[i].device() == source.device(); }));
  CallInfo call = begin(Collective::kBroadcast, ReduceOp::kSum, dtype, count);
  return finish(call, broadcast_impl(call, source, destinations, root));
}

Work CrossDeviceOps::all_gather(const PerReplica<Tensor>& inputs,
                                const PerReplica<Tensor>& outputs) {
  CallScope scope(*this);
  validating_ = true;
  return screened(all_gather_front(inputs, outputs));
}

Work CrossDeviceOps::all_gather_front(const PerReplica<Tensor>& inputs,
                                      const PerReplica<Tensor>& outputs) {
  constexpr std::string_view kCall = "all_gather";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  TRIBUTARY_CHECK_REPLICAS(inputs, kCall, "inputs");
  TRIBUTARY_CHECK_REPLICAS(outputs, kCall, "outputs");
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(inputs.values(), Label{"inputs"}));
  const DType dtype = inputs[0].dtype();
  const int64_t count = inputs[0].num_elements();
  const int64_t n = num_replicas_in_sync();
  TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kAllGather, ReduceOp::kSum, dtype));
  RangeList outs = ranges(outputs.values(), "outputs");
  RangeList ins = ranges(inputs.values(), "inputs");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Label label = at("outputs", i);
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_device(inputs[i], "inputs", static_cast<int>(i)));
    TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_dtype_count(outputs[i], label, dtype, count * n, [n] {
      return "num_replicas_in_sync (" + std::to_string(n) + ") x the input's count";
    }));
    // In place: the input is the output's slice at this replica's global position.
    const int64_t pos =
        static_cast<int64_t>(rank()) * num_local_replicas() + static_cast<int64_t>(i);
    Range own = range_of(outputs[i].slice(pos * count, count), label);
    if (!ins[i].empty() && same(own, ins[i])) {
      outs[i] = own;  // the rest of outputs[i] must still not touch other buffers
      Range before{range_of(outputs[i], label).begin, own.begin, label};
      Range after{own.end, range_of(outputs[i], label).end, label};
      for (size_t j = 0; j < ins.size(); ++j) {
        if (j != i && (overlaps(before, ins[j]) || overlaps(after, ins[j]))) {
          return Work::completed(v.error(label.str() + " overlaps " + ins[j].label.str()));
        }
      }
      for (size_t j = 0; j < outs.size(); ++j) {
        if (j != i && (overlaps(before, outs[j]) || overlaps(after, outs[j]))) {
          return Work::completed(v.error(label.str() + " overlaps " + outs[j].label.str()));
        }
      }
    }
  }
  // In place, outs[i] is now exactly its own slice, which input i may be.
  TRIBUTARY_RETURN_WORK_IF_ERROR(
      v.check_overlap(outs, ins, [](size_t i, size_t j) { return i == j; }));
  CallInfo call = begin(Collective::kAllGather, ReduceOp::kSum, dtype, count);
  return finish(call, all_gather_impl(call, inputs, outputs));
}

Work CrossDeviceOps::reduce_scatter(ReduceOp op, const PerReplica<Tensor>& inputs,
                                    const PerReplica<Tensor>& outputs) {
  CallScope scope(*this);
  validating_ = true;
  return screened(reduce_scatter_front(op, inputs, outputs));
}

Work CrossDeviceOps::reduce_scatter_front(ReduceOp op, const PerReplica<Tensor>& inputs,
                                          const PerReplica<Tensor>& outputs) {
  constexpr std::string_view kCall = "reduce_scatter";
  Validator v(kCall);
  TRIBUTARY_REFUSE_IF_BROKEN(kCall);
  TRIBUTARY_CHECK_REPLICAS(inputs, kCall, "inputs");
  TRIBUTARY_CHECK_REPLICAS(outputs, kCall, "outputs");
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_uniform(inputs.values(), Label{"inputs"}));
  const DType dtype = inputs[0].dtype();
  const int64_t total = inputs[0].num_elements();
  const int64_t n = num_replicas_in_sync();
  if (total % n != 0) {
    return Work::completed(v.error("inputs have " + std::to_string(total) +
                                   " elements, not a multiple of num_replicas_in_sync (" +
                                   std::to_string(n) + "); each replica receives an equal slice"));
  }
  const int64_t count = total / n;
  TRIBUTARY_RETURN_WORK_IF_ERROR(check_supported(Collective::kReduceScatter, op, dtype));
  RangeList ins = ranges(inputs.values(), "inputs");
  RangeList outs = ranges(outputs.values(), "outputs");
  for (size_t i = 0; i < outputs.size(); ++i) {
    TRIBUTARY_RETURN_WORK_IF_ERROR(check_device(inputs[i], "inputs", static_cast<int>(i)));
    TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_dtype_count(
        outputs[i], at("outputs", i), dtype, count,
        [n] { return "the input's count / num_replicas_in_sync (" + std::to_string(n) + ")"; }));
    const int64_t pos =
        static_cast<int64_t>(rank()) * num_local_replicas() + static_cast<int64_t>(i);
    Range own = range_of(inputs[i].slice(pos * count, count), at("inputs", i));
    if (!outs[i].empty() && same(own, outs[i])) {
      // In place: the output is the input's slice at this replica's position. Other replicas'
      // outputs must still stay clear of the whole input.
      for (size_t j = 0; j < outs.size(); ++j) {
        if (j != i && overlaps(outs[j], ins[i])) {
          return Work::completed(v.error(outs[j].label.str() + " overlaps " + ins[i].label.str()));
        }
      }
      ins[i] = Range{};  // checked above
    }
  }
  TRIBUTARY_RETURN_WORK_IF_ERROR(v.check_overlap(outs, ins, [](size_t, size_t) { return false; }));
  CallInfo call = begin(Collective::kReduceScatter, op, dtype, count);
  return finish(call, reduce_scatter_impl(call, op, inputs, outputs));
}

}  // namespace tributary
