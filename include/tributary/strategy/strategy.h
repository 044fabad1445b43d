// Strategy and ReplicaContext: tf.distribute's strategy layer in C++.
//
// A Strategy is a placement policy (which local devices hold replicas, where variables live) plus
// one CrossDeviceOps (the backend that reduces across replicas and processes) plus an input policy.
// The concrete strategies (strategies.h) are selections of these three; they add no mechanism.
//
// Contexts, as in TF (distribute_lib): code runs in exactly one of
//  - replica context: inside the function given to run(), one thread per local replica, each with
//    its ReplicaContext (get_replica_context() returns it);
//  - cross-replica context: inside a (non-default) strategy's scope() or a merge_call function
//    (get_replica_context() returns null, in_cross_replica_context() is true);
//  - the default replica context: outside any scope, where get_strategy() is the default strategy.
//    The default strategy's scope() changes nothing (TF's _DefaultDistributionContext pushes no
//    context): inside it get_replica_context() is still the default replica context, and another
//    strategy's scope() and methods may be used there.
// scope() inside run() (replica context) is refused as TF refuses it: TF's "Method requires being
// in cross-replica context, use get_replica_context().merge_call()" for the running strategy, and
// "Mixing different tf.distribute.Strategy objects" for another one.
// Cross-replica methods (reduce, gather, reduce_to, ...) called from replica context fail with TF's
// message ("Method requires being in cross-replica context, use
// get_replica_context().merge_call()"); a method of strategy A used inside strategy B's scope or
// run fails with "Mixing different tf.distribute.Strategy objects: A is not B".
//
// run(): calls `fn` once per local replica, concurrently, on persistent replica threads (one per
// local device; a one-replica strategy runs `fn` on the calling thread). A PerReplica or Mirrored
// argument must have one component per local replica (kInvalidArgument otherwise, before any
// replica runs). An error Status or an exception from any replica ends run() with that error: the
// first to fail in time, with its replica id (as TF's Coordinator keeps the first request_stop),
// not necessarily the lowest-numbered failing replica's. Cross-replica calls made from replica
// context (all_reduce, all_gather, merge_call, synchronized variable updates) are meeting points:
// every local replica must make the same calls in the same order. A replica that returns or fails
// while others wait at a meeting point, or that makes a different call there (another method, or
// the same one with another ReduceOp, axis, number of values, dtype or shape), fails every waiting
// replica at once with an error that says so (TF's "Some replicas made a different number of
// replica_context().merge_call() calls."); a replica that never arrives fails the others after the
// backend's timeout. Nothing hangs.
//
// Where C++ differs from TF (keeping the meaning):
//  - No exceptions cross the API: failures are Status values, and TF's ValueError/RuntimeError
//    become kInvalidArgument/kFailedPrecondition with TF's message text.
//  - run() takes `fn(ReplicaContext&, args...)`; PerReplica/Mirrored arguments are unwrapped per
//    replica (select_replica), Variables and plain values are passed whole. Results come back as a
//    PerReplica, always (C++ has no "unwrap when identical" rule; read values()[0]).
//  - Values are Arrays (array.h), not nests: a batch of several tensors is a std::vector<Array>.
//  - ReduceOp has MIN, MAX and PROD besides TF's SUM and MEAN; reduce (without an axis),
//    reduce_to, batch_reduce_to and all_reduce accept them (an extension; with an axis only SUM and
//    MEAN, as TF).
//  - MEAN of integer values in reduce() and ReplicaContext::all_reduce() is TF's true division
//    (`/`): the integer sum (through the backend) divided by the count, returned as float32 for
//    int8 and uint8 and float64 for int32 and int64 (TF's _TRUEDIV_TABLE). The
//    default strategy and OneDeviceStrategy return the value itself when there is no axis (TF's
//    _reduce_to there returns its input). reduce_to and batch_reduce_to write into buffers of the
//    value's dtype and keep the backend's rule (integer MEAN truncates toward zero, dtype.h).
//  - Multi-worker: an error on one worker before a collective its peers will wait in (bad input to
//    reduce, a failing merge function, a run() that fails there, ...) aborts the backend so that
//    every worker fails at once instead of at its timeout; the strategy is then unusable, as after
//    any failed collective (a worker whose step failed is out of step with its peers).
//  - merge_call's result is handed to every replica as is (no per-replica unwrapping).
//  - StrategyExtended's operations (reduce_to, batch_reduce_to, broadcast_to, update) are methods
//    of Strategy itself; update() takes a function returning each copy's new value instead of a
//    function that assigns it.
//  - Variables are created with create_variable() in cross-replica context (no variable-creator
//    scope), not from inside run().
//  - A Strategy is driven by one user thread at a time (the thread that calls run(), reduce(),
//    ...), like a CrossDeviceOps. Every process of a multi-worker job must make the same
//    cross-replica calls, variable creations and reads of ON_READ variables, in the same order.
#pragma once

#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"
#include "tributary/strategy/indexed_slices.h"
#include "tributary/values.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

class Strategy;
class Variable;
struct VariableImpl;

// Component `i` of a per-replica value, the value itself otherwise (TF's select_replica).
template <typename T>
const T& select_replica(int i, const PerReplica<T>& v) {
  return v[static_cast<size_t>(i)];
}
template <typename T>
const T& select_replica(int i, const Mirrored<T>& v) {
  return v[static_cast<size_t>(i)];
}
template <typename T>
const T& select_replica(int, const T& v) {
  return v;
}

namespace internal {
// What run() checks of an argument: a PerReplica or Mirrored needs one component per replica.
template <typename T>
struct RunArgument {
  static constexpr const char* kKind = nullptr;
  static size_t size(const T&) { return 0; }
};
template <typename T>
struct RunArgument<PerReplica<T>> {
  static constexpr const char* kKind = "PerReplica";
  static size_t size(const PerReplica<T>& v) { return v.size(); }
};
template <typename T>
struct RunArgument<Mirrored<T>> {
  static constexpr const char* kKind = "Mirrored";
  static size_t size(const Mirrored<T>& v) { return v.size(); }
};
}  // namespace internal

// TF's ValueContext: what distribute_values_from_function's function is told.
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

class ReplicaContext {
 public:
  Strategy& strategy() const { return *strategy_; }
  // Global id (TF: replica_id_in_sync_group): worker index * local replicas + local id.
  int replica_id_in_sync_group() const;
  int local_replica_id() const { return local_id_; }
  int num_replicas_in_sync() const;
  const Device& device() const;

  // Reduces `value` across every replica in sync (all workers); every replica gets the result.
  // Every local replica must pass the same op, dtype and shape: a replica that passes another
  // (SUM on one, MAX on another) fails every replica with kInvalidArgument naming the difference.
  // MEAN of an integer value is TF's true division (see above).
  StatusOr<Array> all_reduce(ReduceOp op, const Array& value);
  // Several values in one meeting (TF's nest), with the same rules per value: one collective per
  // value, in order (not fused into one; batch_reduce_to is the fused form).
  StatusOr<std::vector<Array>> all_reduce(ReduceOp op, std::span<const Array> values);
  // Sparse values (indexed_slices.h): every replica gets the concatenation of every replica's
  // slices in global replica order (their rows may differ in number); SUM or MEAN only.
  StatusOr<IndexedSlices> all_reduce(ReduceOp op, const IndexedSlices& value);
  // Concatenates every replica's value along `axis` in global replica order. Sizes along `axis`
  // may differ between replicas (as TF's collective all_gather allows); everything else, `axis`
  // included, must match (kInvalidArgument on every replica otherwise).
  StatusOr<Array> all_gather(const Array& value, int axis);

  // Pauses every local replica, runs `fn` once in cross-replica context with each replica's `arg`
  // (in local replica order), and returns its result to every replica. The `fn` that runs is
  // replica 0's, always (TF runs threads[0].merge_fn): when replicas pass different callables, or
  // closures over replica-local data, the result does not depend on which replica arrived last.
  // `fn` is any callable (a lambda, a function, a std::function) taking (Strategy&,
  // const PerReplica<A>&) and returning StatusOr<R> or R (merge_call returns StatusOr<R>), or
  // Status (merge_call returns Status):
  //   ctx.merge_call([](Strategy& s, const PerReplica<int>& v) { return v[0] + v[1]; }, 1);
  template <typename Fn, typename A>
  auto merge_call(Fn&& fn, A arg);

  // For the strategy layer: a meeting of the local replicas. Every replica passes `arg`; when the
  // last arrives, replica 0's `fn` runs once on all of them (in cross-replica context, on the last
  // arriver's thread) and every replica gets its result. `what` names the call, so that replicas
  // making different calls are told which; `fn` checks that the arguments agree.
  using MergeFn = std::function<StatusOr<std::any>(std::vector<std::any>& args)>;
  StatusOr<std::any> meet(std::string_view what, std::any arg, MergeFn fn);

 private:
  friend class Strategy;
  ReplicaContext(Strategy* strategy, int local_id) : strategy_(strategy), local_id_(local_id) {}
  Strategy* strategy_;
  int local_id_;
};

// The strategy in scope on this thread, else the default strategy.
Strategy& get_strategy();
// True inside a non-default strategy's scope or run().
bool has_strategy();
// This thread's replica context: the running replica's inside run(), null in cross-replica context
// (a non-default strategy's scope, or merge_call), the default strategy's (replica 0) elsewhere,
// inside default_strategy().scope() included.
ReplicaContext* get_replica_context();
bool in_cross_replica_context();

// Entered by Strategy::scope(); leaves on destruction. Move-only; thread-bound.
class [[nodiscard]] StrategyScope {
 public:
  StrategyScope(StrategyScope&& other) noexcept;
  StrategyScope& operator=(StrategyScope&&) = delete;
  StrategyScope(const StrategyScope&) = delete;
  ~StrategyScope();

 private:
  friend class Strategy;
  explicit StrategyScope(Strategy* s) : strategy_(s) {}
  Strategy* strategy_;
};

// TF's tf.VariableSynchronization and tf.VariableAggregation.
enum class VariableSynchronization { kAuto, kNone, kOnWrite, kOnRead };
enum class VariableAggregation { kNone, kSum, kMean, kOnlyFirstReplica };
std::string_view variable_synchronization_name(VariableSynchronization s);  // "ON_WRITE"
std::string_view variable_aggregation_name(VariableAggregation a);          // "SUM"

struct VariableOptions {
  std::string name = "Variable";
  VariableSynchronization synchronization = VariableSynchronization::kAuto;  // AUTO = ON_WRITE
  VariableAggregation aggregation = VariableAggregation::kNone;
  bool trainable = true;
};

enum class StrategyKind { kDefault, kOneDevice, kMirrored, kMultiWorkerMirrored, kCentralStorage };

// What a concrete strategy selects (strategies.h builds these).
struct StrategyParts {
  StrategyKind kind = StrategyKind::kDefault;
  // Set by make_strategy("default") only: the Strategy is a handle on default_strategy() (see
  // there).
  bool default_handle = false;
  std::string name = "DefaultStrategy";              // TF's class name, for messages
  std::vector<Device> devices = {Device::cpu()};     // local replicas, in order
  std::unique_ptr<CrossDeviceOps> cross_device_ops;  // spans devices x workers
  // Where variables live: one copy per replica (mirrored), or one copy on `parameter_device`.
  bool central_variables = false;
  Device parameter_device = Device::cpu();
  int worker_index = 0;  // this process among the workers
  int num_workers = 1;
  bool is_chief = true;
};

class Strategy {
 public:
  explicit Strategy(StrategyParts parts);
  ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  StrategyKind kind() const { return parts_.kind; }
  const std::string& name() const { return parts_.name; }
  // This strategy's number among the strategies of its name made in this process (1, 2, ...), so
  // that messages tell two of them apart; 0 for the default strategy (there is only one).
  int instance() const { return instance_; }
  // "MirroredStrategy#2(devices=[CPU:0, CPU:1], cross_device_ops=reduction_to_one_device:...)";
  // the default strategy is "DefaultStrategy(...)".
  std::string describe() const;
  int num_replicas_in_sync() const;
  int num_local_replicas() const { return static_cast<int>(parts_.devices.size()); }
  const std::vector<Device>& worker_devices() const { return parts_.devices; }
  // Where variables live: the replica devices, or CentralStorage's parameter device.
  std::vector<Device> parameter_devices() const;
  int worker_index() const { return parts_.worker_index; }
  int num_workers() const { return parts_.num_workers; }
  bool is_chief() const { return parts_.is_chief; }
  // TF's should_checkpoint: only the chief writes checkpoints.
  bool should_checkpoint() const { return parts_.is_chief; }
  CrossDeviceOps& cross_device_ops() const { return *parts_.cross_device_ops; }
  bool central_variables() const { return parts_.central_variables; }

  // Enters this strategy's cross-replica context on this thread (re-entering the same strategy is
  // counted; entering another strategy's scope inside it is "Must not nest tf.distribute.Strategy
  // scopes."). Inside run() it is TF's error: "Method requires being in cross-replica context, use
  // get_replica_context().merge_call()" for the running strategy, "Mixing different
  // tf.distribute.Strategy objects" for another. The default strategy's scope changes nothing (the
  // default replica context stays current); it is refused inside another strategy's scope or run.
  StatusOr<StrategyScope> scope();

  // --- replica context ---------------------------------------------------------------------------
  Status run(const std::function<Status(ReplicaContext&)>& fn);
  // fn(ReplicaContext&, select_replica(i, args)...) returning StatusOr<R>, R or Status; the results
  // come back per replica.
  template <typename Fn, typename... Args>
  auto run(Fn&& fn, const Args&... args);
  // run() for bindings whose language handles signals on the calling thread (Python's Ctrl-C):
  // while it waits for several local replicas, `interrupt_check` is called every 50 ms on the
  // calling thread, holding no lock of ours, until every replica has returned. Its first error ends
  // the step as a replica's failure would: replicas waiting for each other, or reaching a meeting,
  // fail at once (the binding stops its own code running in replicas). Multi-worker, the backend is
  // aborted at once (CrossDeviceOps::abort, thread-safe): a replica inside a collective that waits
  // for the other workers returns within milliseconds, and the peers are told. One worker: a
  // replica inside an in-process collective returns when that ends (such a collective waits for no
  // one). The step then returns that error. With one local replica, fn runs on the calling thread
  // and `interrupt_check` is never called (the binding's own handling applies).
  Status run_interruptible(const std::function<Status(ReplicaContext&)>& fn,
                           const std::function<Status()>& interrupt_check);

  // --- cross-replica context ---------------------------------------------------------------------
  // TF's Strategy.reduce. axis none: reduce across replicas. axis given: reduce each replica's
  // value along `axis` first; MEAN then divides by the global number of elements along `axis`, so
  // partial and empty batches give the exact global mean. A negative axis counts from the end
  // (axis + rank, as TF); an axis outside [-rank, rank) is TF's error. MEAN of integer values is
  // TF's true division (float32 for int8/uint8, float64 for int32/int64), with or without an axis.
  StatusOr<Array> reduce(ReduceOp op, const PerReplica<Array>& value,
                         std::optional<int> axis = std::nullopt);
  // Sparse values (indexed_slices.h): the concatenation of every replica's slices in global
  // replica order, on the CPU; SUM or MEAN only (TF reduces IndexedSlices by gathering them).
  StatusOr<IndexedSlices> reduce(ReduceOp op, const PerReplica<IndexedSlices>& value);
  // A value that is not distributed. On one worker, TF's reduce_non_distributed_value: MEAN returns
  // it, SUM returns it with one replica in sync and is an error otherwise; an axis reduces the
  // value along it. On several workers (MultiWorkerMirrored), as TF's collective strategy: the
  // value is this worker's part, reduced across the workers as one value per worker (SUM adds the
  // workers' values, MEAN divides by the number of workers, or with an axis by the global count
  // along it), so every worker must call it, as any collective.
  StatusOr<Array> reduce(ReduceOp op, const Array& value, std::optional<int> axis = std::nullopt);
  // A sparse value that is not distributed: as the Array overload (on several workers, the
  // workers' slices concatenated in worker order; MEAN divides the values by the workers).
  StatusOr<IndexedSlices> reduce(ReduceOp op, const IndexedSlices& value);
  // Concatenation of every replica's value along `axis`, in global replica order.
  StatusOr<Array> gather(const PerReplica<Array>& value, int axis);
  // A value that is not distributed (TF wraps it as one component): on one worker the value
  // itself; on several, this worker's part, concatenated with the others' in worker order.
  StatusOr<Array> gather(const Array& value, int axis);
  // The local components (TF's experimental_local_results).
  std::vector<Array> local_results(const PerReplica<Array>& value) const { return value.values(); }
  // value_fn(ValueContext) per local replica, always a PerReplica.
  StatusOr<PerReplica<Array>> distribute_values_from_function(
      const std::function<StatusOr<Array>(const ValueContext&)>& value_fn);

  // --- StrategyExtended --------------------------------------------------------------------------
  // Reduces to the devices of `destination` (without updating it): one result per device.
  StatusOr<Mirrored<Array>> reduce_to(ReduceOp op, const PerReplica<Array>& value,
                                      const Variable& destination);
  StatusOr<Mirrored<Array>> reduce_to(ReduceOp op, const PerReplica<Array>& value,
                                      const std::vector<Device>& destinations);
  // Several all-reduces (destinations = the values' own devices), fused by the backend.
  StatusOr<std::vector<Mirrored<Array>>> batch_reduce_to(ReduceOp op,
                                                         std::span<const PerReplica<Array>> values);
  // Copies `value` (the chief's, in multi-worker) to every device of `destination`.
  StatusOr<Mirrored<Array>> broadcast_to(const Array& value, const Variable& destination);
  // TF's extended.update: `fn(component_index, current_value)` gives each component's new value;
  // every new value is computed and checked before any component changes. In replica context it
  // is TF's _replica_ctx_update: a merge_call (every local replica must call it, on the same
  // variable) that runs update once in cross-replica context, component i computed by replica i's
  // `fn` (a variable with one copy, e.g. CentralStorage's, by replica 0's, TF's primary).
  Status update(Variable& variable,
                const std::function<StatusOr<Array>(int component, const Array& current)>& fn);

  // --- variables ---------------------------------------------------------------------------------
  // Creates a variable placed by this strategy: a MirroredVariable (ON_WRITE), a
  // SyncOnReadVariable (ON_READ), or, for CentralStorage, one copy on the parameter device. The
  // default strategy and OneDeviceStrategy create plain variables (TF calls next_creator): one
  // copy, none of the distributed-variable rules (variable.h).
  // Multi-worker: the chief's initial value is broadcast, so every replica starts identical (every
  // worker must create its variables in the same order). Cross-replica context only.
  StatusOr<Variable> create_variable(const Array& initial_value, VariableOptions options = {});

  // For the strategy layer: fails unless this thread may make cross-replica calls on this
  // strategy; `method` names the caller in the message.
  Status require_cross_replica(std::string_view method) const;
  // For the strategy layer: `failure` happened on this worker only, before or instead of a
  // collective its peers will wait in. Multi-worker: the backend is aborted so that the other
  // workers fail at once rather than at their timeout (the strategy is unusable afterwards, as
  // after any failed collective). One worker: nothing (the strategy stays usable).
  void tell_peers(const Status& failure);
  // Replica 0's context, which code outside any scope sees for the default strategy.
  ReplicaContext* default_replica_context() const { return contexts_[0].get(); }

 private:
  friend class ReplicaContext;
  friend class StrategyScope;
  friend struct VariableImpl;
  struct Pool;
  // The default strategy for a handle (make_strategy("default")), else this.
  Strategy* identity() const;
  template <typename... Args>
  Status check_run_args(const Args&... args);
  Status check_run_arguments(std::span<const char* const> kinds, std::span<const size_t> sizes);
  Status run_erased(const std::function<Status(ReplicaContext&)>& fn,
                    const std::function<Status()>* interrupt_check = nullptr);
  Status run_replicas(const std::function<Status(ReplicaContext&)>& fn,
                      const std::function<Status()>* interrupt_check);
  StatusOr<std::vector<Array>> all_reduce_local(ReduceOp op, std::span<const Array> per_replica);
  StatusOr<std::vector<Array>> all_gather_local(std::span<const Array> per_replica, int axis);
  StatusOr<std::vector<IndexedSlices>> all_reduce_slices_local(
      ReduceOp op, std::span<const IndexedSlices> per_replica);
  StatusOr<Array> reduce_across_workers(ReduceOp op, const Array& value, std::optional<int> axis);
  StatusOr<IndexedSlices> reduce_across_workers(ReduceOp op, const IndexedSlices& value);

  StrategyParts parts_;
  int instance_ = 0;
  std::vector<std::unique_ptr<ReplicaContext>> contexts_;
  std::unique_ptr<Pool> pool_;
};

// The default strategy: one replica on CPU:0, run() calls fn on the calling thread, reduce returns
// its input, variables are plain. One per program (TF's singleton), created on first use. TF
// forbids a second one; here make_strategy("default") (which must return an owner) gives a handle
// on this one: its run(), scope(), create_variable() and update() act on default_strategy(), its
// context checks treat it as default_strategy(), and describe() names it as such. Python's
// make_strategy("default") returns default_strategy() itself.
Strategy& default_strategy();

// --- template definitions ------------------------------------------------------------------------
namespace internal {
template <typename T>
struct UnwrapStatusOr {
  using type = T;
};
template <typename T>
struct UnwrapStatusOr<StatusOr<T>> {
  using type = T;
};
}  // namespace internal

template <typename... Args>
Status Strategy::check_run_args(const Args&... args) {
  const char* const kinds[] = {internal::RunArgument<Args>::kKind..., nullptr};
  const size_t sizes[] = {internal::RunArgument<Args>::size(args)..., 0};
  return check_run_arguments(std::span<const char* const>(kinds, sizeof...(Args)),
                             std::span<const size_t>(sizes, sizeof...(Args)));
}

template <typename Fn, typename... Args>
auto Strategy::run(Fn&& fn, const Args&... args) {
  using Raw = std::invoke_result_t<Fn&, ReplicaContext&, decltype(select_replica(0, args))...>;
  // Before select_replica indexes any component.
  Status bad_args = check_run_args(args...);
  if constexpr (std::is_same_v<Raw, Status> || std::is_void_v<Raw>) {
    if (!bad_args.ok()) return bad_args;
    return run_erased([&](ReplicaContext& ctx) -> Status {
      if constexpr (std::is_void_v<Raw>) {
        fn(ctx, select_replica(ctx.local_replica_id(), args)...);
        return ok_status();
      } else {
        return fn(ctx, select_replica(ctx.local_replica_id(), args)...);
      }
    });
  } else {
    using R = typename internal::UnwrapStatusOr<Raw>::type;
    if (!bad_args.ok()) return StatusOr<PerReplica<R>>(std::move(bad_args));
    std::vector<std::optional<R>> slots(static_cast<size_t>(num_local_replicas()));
    Status s = run_erased([&](ReplicaContext& ctx) -> Status {
      Raw r = fn(ctx, select_replica(ctx.local_replica_id(), args)...);
      if constexpr (std::is_same_v<Raw, R>) {
        slots[ctx.local_replica_id()].emplace(std::move(r));
      } else {
        if (!r.ok()) return r.status();
        slots[ctx.local_replica_id()].emplace(std::move(r).value());
      }
      return ok_status();
    });
    if (!s.ok()) return StatusOr<PerReplica<R>>(s);
    std::vector<R> out;
    out.reserve(slots.size());
    for (auto& slot : slots) out.push_back(std::move(*slot));
    return StatusOr<PerReplica<R>>(PerReplica<R>(std::move(out)));
  }
}

template <typename Fn, typename A>
auto ReplicaContext::merge_call(Fn&& fn, A arg) {
  using Raw = std::invoke_result_t<Fn&, Strategy&, const PerReplica<A>&>;
  // Status results carry no value; everything else is a StatusOr<R> (R or StatusOr<R> from fn).
  constexpr bool kStatusOnly = std::is_same_v<Raw, Status> || std::is_void_v<Raw>;
  using R = typename internal::UnwrapStatusOr<Raw>::type;
  Strategy* s = strategy_;
  StatusOr<std::any> r = meet(
      "merge_call", std::any(std::move(arg)), [&fn, s](std::vector<std::any>& args) -> StatusOr<std::any> {
        std::vector<A> values;
        values.reserve(args.size());
        for (auto& a : args) values.push_back(std::any_cast<A>(std::move(a)));
        const PerReplica<A> per_replica(std::move(values));
        if constexpr (std::is_void_v<Raw>) {
          fn(*s, per_replica);
          return std::any();
        } else if constexpr (kStatusOnly) {
          Status st = fn(*s, per_replica);
          if (!st.ok()) return st;
          return std::any();
        } else {
          StatusOr<R> out = fn(*s, per_replica);
          if (!out.ok()) return out.status();
          return std::any(std::move(out).value());
        }
      });
  if constexpr (kStatusOnly) {
    return r.ok() ? ok_status() : r.status();
  } else {
    if (!r.ok()) return StatusOr<R>(r.status());
    return StatusOr<R>(std::any_cast<R>(std::move(*r)));
  }
}

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
