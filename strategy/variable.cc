// Variables: creation, reads and the ON_WRITE / ON_READ update rules (values.py, values_util.py).
#include "tributary/strategy/variable.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "fmt/format.h"
#include "strategy/internal.h"

namespace tributary {

struct Variable::State {
  Strategy* strategy = nullptr;
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  VariableSynchronization sync = VariableSynchronization::kOnWrite;
  VariableAggregation aggregation = VariableAggregation::kNone;
  bool trainable = true;
  // The default strategy's and OneDeviceStrategy's: one copy, no distributed-variable rules (TF
  // creates a plain tf.Variable there).
  bool plain = false;
  bool central = false;           // one copy on the parameter device
  std::vector<Array> components;  // owned storage, updated in place under `mu`
  mutable std::mutex mu;
  // Held across a read-modify-write of one copy (assign_add of the replica's own copy), so that
  // it cannot interleave with another update of this variable.
  std::mutex update_mu;
};

namespace {

enum class UpdateKind { kAssign, kAdd, kSub };

std::string_view update_name(UpdateKind k) {
  switch (k) {
    case UpdateKind::kAssign:
      return "assign";
    case UpdateKind::kAdd:
      return "assign_add";
    case UpdateKind::kSub:
      return "assign_sub";
  }
  return "?";
}

enum class ScatterKind { kAdd, kSub, kMul, kDiv, kMin, kMax, kUpdate };

std::string_view scatter_name(ScatterKind k) {
  switch (k) {
    case ScatterKind::kAdd:
      return "scatter_add";
    case ScatterKind::kSub:
      return "scatter_sub";
    case ScatterKind::kMul:
      return "scatter_mul";
    case ScatterKind::kDiv:
      return "scatter_div";
    case ScatterKind::kMin:
      return "scatter_min";
    case ScatterKind::kMax:
      return "scatter_max";
    case ScatterKind::kUpdate:
      return "scatter_update";
  }
  return "?";
}

// Row `row` of the variable's data combined with slice `k` of `values` (both CPU, same dtype).
// Integers exactly, with TF's wrap-around (strategy_internal's helpers); floats in double.
template <typename T>
T scatter_op(ScatterKind kind, T x, T y) {
  using namespace strategy_internal;
  constexpr bool kInt = std::is_integral_v<T>;
  switch (kind) {
    case ScatterKind::kAdd:
      if constexpr (kInt) return wrapping_add(x, y);
      return x + y;
    case ScatterKind::kSub:
      if constexpr (kInt) return wrapping_sub(x, y);
      return x - y;
    case ScatterKind::kMul:
      if constexpr (kInt) return wrapping_mul(x, y);
      return x * y;
    case ScatterKind::kDiv:  // integer division truncates (a zero divisor was refused before)
      if constexpr (kInt) return truncating_div(x, y);
      return x / y;
    case ScatterKind::kMin:
      return std::min(x, y);
    case ScatterKind::kMax:
      return std::max(x, y);
    case ScatterKind::kUpdate:
      break;
  }
  return y;
}

void scatter_row(ScatterKind kind, DType dtype, void* data, int64_t row, const Array& values,
                 int64_t k, int64_t row_elems) {
  const bool integral = !dtype_is_floating(dtype);
  for (int64_t e = 0; e < row_elems; ++e) {
    const int64_t at = row * row_elems + e;
    const int64_t from = k * row_elems + e;
    if (integral) {
      const int64_t x = strategy_internal::load_integer(dtype, data, at);
      const int64_t y = strategy_internal::load_integer(dtype, values.data<void>(), from);
      strategy_internal::store_integer(dtype, data, at, scatter_op<int64_t>(kind, x, y));
    } else {
      const double x = dtype_load(dtype, data, at);
      dtype_store(dtype, data, at, scatter_op<double>(kind, x, values.at(from)));
    }
  }
}

// TF's AggregatingVariable (ps_values.py) refuses an update with aggregation NONE in replica
// context: one copy, many replicas.
Status central_needs_aggregation(const std::string& variable, const std::string& strategy) {
  return invalid_argument(fmt::format(
      "You must specify an aggregation method to update a variable in Replica Context. You "
      "can do so by passing an explicit value for argument `aggregation` to tf.Variable(..)."
      "e.g. `tf.Variable(..., aggregation=tf.VariableAggregation.SUM)` (variable '{}' lives "
      "once on {}'s parameter device; VariableOptions::aggregation)",
      variable, strategy));
}

StatusOr<ReduceOp> reduce_op_of(VariableAggregation a) {
  if (a == VariableAggregation::kSum) return ReduceOp::kSum;
  if (a == VariableAggregation::kMean) return ReduceOp::kMean;
  return invalid_argument(fmt::format(
      "Could not convert from `tf.VariableAggregation` {} to`tf.distribute.ReduceOp` type",
      variable_aggregation_name(a)));
}

// Depth of variable_sync_on_read_context() scopes on this thread.
thread_local int sync_on_read_depth = 0;

// The replica context of `s` this thread runs in, if any.
ReplicaContext* replica_of(const Strategy& s) {
  const auto& t = strategy_internal::thread_context();
  if (t.replica != nullptr && t.merge == nullptr && &t.replica->strategy() == &s) return t.replica;
  return nullptr;
}

}  // namespace

struct VariableImpl {
  using State = Variable::State;

  static Status check_value(const State& v, const Array& value, std::string_view what) {
    if (value.dtype() != v.dtype || value.shape() != v.shape) {
      return invalid_argument(fmt::format(
          "{} on variable '{}' ({}{}): the value is {}; dtype and shape must match", what, v.name,
          dtype_name(v.dtype), shape_to_string(v.shape), value.tensor().to_string()));
    }
    return ok_status();
  }

  static StatusOr<Array> on_cpu(const Array& a) { return a.to_device(Device::cpu()); }

  static StatusOr<Array> apply(UpdateKind k, const Array& current, const Array& value) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array cur, on_cpu(current));
    TRIBUTARY_ASSIGN_OR_RETURN(Array val, on_cpu(value));
    switch (k) {
      case UpdateKind::kAssign:
        return val;
      case UpdateKind::kAdd:
        return add(cur, val);
      case UpdateKind::kSub:
        return subtract(cur, val);
    }
    return internal_error("unknown update");
  }

  // A copy of component i, on its device (a GPU's memory may run out: a Status, not a crash).
  static StatusOr<Array> snapshot(const State& v, size_t i) {
    std::lock_guard lock(v.mu);
    return Array::copy_of(v.components[i].tensor());
  }

  // A copy of component i in host memory, for host math and bindings (one copy from a GPU).
  static StatusOr<Array> host_copy(const State& v, size_t i) {
    std::lock_guard lock(v.mu);
    const Array& c = v.components[i];
    return c.device().is_cpu() ? Array::copy_of(c.tensor()) : c.to_device(Device::cpu());
  }

  // Writes new values into the components whose index is in `which` (all when empty).
  static Status commit(State& v, const std::vector<std::pair<size_t, Array>>& updates) {
    std::lock_guard lock(v.mu);
    for (const auto& [i, value] : updates) {
      Array& c = v.components[i];
      if (c.nbytes() == 0) continue;
      if (c.device().is_cpu() && value.device().is_cpu()) {
        std::memcpy(c.mutable_data<void>(), value.data<void>(), c.nbytes());
      } else {
        TRIBUTARY_ASSIGN_OR_RETURN(
            Allocator * alloc, allocator_for(c.device().is_cpu() ? value.device() : c.device()));
        TRIBUTARY_RETURN_IF_ERROR(alloc->copy(c.mutable_data<void>(), c.device(),
                                              value.data<void>(), value.device(), c.nbytes()));
      }
    }
    return ok_status();
  }

  // Applies `k` with `value` to every component: computed first, then committed.
  static Status update_all(State& v, UpdateKind k, const Array& value) {
    std::vector<std::pair<size_t, Array>> updates;
    for (size_t i = 0; i < v.components.size(); ++i) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array current, host_copy(v, i));
      TRIBUTARY_ASSIGN_OR_RETURN(Array next, apply(k, current, value));
      updates.emplace_back(i, std::move(next));
    }
    return commit(v, updates);
  }

  static Status update_one(State& v, size_t i, UpdateKind k, const Array& value) {
    std::lock_guard serial(v.update_mu);
    TRIBUTARY_ASSIGN_OR_RETURN(Array current, host_copy(v, i));
    TRIBUTARY_ASSIGN_OR_RETURN(Array next, apply(k, current, value));
    return commit(v, {{i, std::move(next)}});
  }

  static Status update(State& v, UpdateKind k, const Array& value) {
    TRIBUTARY_RETURN_IF_ERROR(check_value(v, value, update_name(k)));
    if (v.plain) {
      // A plain variable: its one copy is updated in any context, whatever its aggregation.
      std::lock_guard serial(v.update_mu);
      return update_all(v, k, value);
    }
    Strategy& s = *v.strategy;
    if (ReplicaContext* ctx = replica_of(s)) return update_in_replica(v, *ctx, k, value);
    TRIBUTARY_RETURN_IF_ERROR(
        s.require_cross_replica(fmt::format("{} on variable '{}'", update_name(k), v.name)));
    if (v.sync == VariableSynchronization::kOnRead) {
      if (v.aggregation == VariableAggregation::kSum) {
        if (k != UpdateKind::kAssign) {
          return invalid_argument(
              fmt::format("SyncOnReadVariable does not support `{}` in cross-replica context when "
                          "aggregation is set to `tf.VariableAggregation.SUM`. (variable '{}')",
                          update_name(k), v.name));
        }
        // Each copy gets x / N so that the aggregated read returns x.
        TRIBUTARY_ASSIGN_OR_RETURN(Array part, on_cpu(value));
        TRIBUTARY_ASSIGN_OR_RETURN(part, scale(part, 1.0 / s.num_replicas_in_sync()));
        return update_all(v, k, part);
      }
    }
    return update_all(v, k, value);
  }

  static Status update_in_replica(State& v, ReplicaContext& ctx, UpdateKind k, const Array& value) {
    const size_t local = static_cast<size_t>(ctx.local_replica_id());
    if (v.sync == VariableSynchronization::kOnRead) return update_one(v, local, k, value);
    if (v.aggregation == VariableAggregation::kNone) {
      if (v.central) return central_needs_aggregation(v.name, v.strategy->name());
      return update_one(v, local, k, value);
    }
    Strategy& s = *v.strategy;
    State* state = &v;
    const std::string what = fmt::format("{} on variable '{}'", update_name(k), v.name);
    StatusOr<std::any> r = ctx.meet(
        what, std::any(value), [&s, state, k](std::vector<std::any>& args) -> StatusOr<std::any> {
          std::vector<Array> values;
          for (auto& a : args) values.push_back(std::any_cast<Array>(a));
          Array agreed;
          if (state->aggregation == VariableAggregation::kOnlyFirstReplica) {
            agreed = values[0];
            if (s.num_workers() > 1) {
              // Global replica 0 (the chief's first) decides, on every worker.
              TRIBUTARY_ASSIGN_OR_RETURN(agreed,
                                         strategy_internal::broadcast_from_chief(s, values[0]));
            }
          } else {
            TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp op, reduce_op_of(state->aggregation));
            TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> reduced, s.all_reduce_local(op, values));
            agreed = reduced[0];
          }
          TRIBUTARY_RETURN_IF_ERROR(update_all(*state, k, agreed));
          return std::any();
        });
    return r.ok() ? ok_status() : r.status();
  }

  // --- sparse updates (scatter_*) -------------------------------------------------------------
  // TF's resource scatter kernels' checks, on `delta` as this variable would apply it.
  static Status check_scatter(const State& v, ScatterKind k, const IndexedSlices& delta) {
    const std::string what = fmt::format("{} on variable '{}' ({}{})", scatter_name(k), v.name,
                                         dtype_name(v.dtype), shape_to_string(v.shape));
    if (v.shape.empty()) {
      return invalid_argument(fmt::format("{}: params must be at least 1 dimensional", what));
    }
    if (delta.dtype() != v.dtype) {
      return invalid_argument(fmt::format("{}: the updates are {}; the dtypes must match", what,
                                          delta.values().tensor().to_string()));
    }
    const Shape& u = delta.values().shape();
    if (!std::equal(u.begin() + 1, u.end(), v.shape.begin() + 1, v.shape.end())) {
      return invalid_argument(fmt::format(
          "{}: Must have updates.shape = indices.shape + params.shape[1:] or updates.shape = [], "
          "got updates.shape {}, indices.shape {}, params.shape {}",
          what, shape_to_string(u), shape_to_string(delta.indices().shape()),
          shape_to_string(v.shape)));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> indices, delta.index_values());
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t row = indices[i];
      if (row < 0 || row >= v.shape[0]) {
        return invalid_argument(
            fmt::format("{}: indices[{}] = {} is not in [0, {})", what, i, row, v.shape[0]));
      }
    }
    if (k == ScatterKind::kDiv && !dtype_is_floating(v.dtype)) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array values, delta.values().to_device(Device::cpu()));
      for (int64_t i = 0; i < values.num_elements(); ++i) {
        if (values.at(i) == 0)
          return invalid_argument(fmt::format("{}: Integer division by zero", what));
      }
    }
    return ok_status();
  }

  // Applies checked `delta` to the copies in `which`: rows in place on the CPU; a copy on another
  // device is updated on a host copy and written back whole.
  static Status scatter_some(State& v, const std::vector<size_t>& which, ScatterKind k,
                             const IndexedSlices& delta) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array values, delta.values().to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> indices, delta.index_values());
    const int64_t n = values.dim0();
    const int64_t row_elems = n == 0 ? 0 : values.num_elements() / n;
    auto apply_to = [&](void* data) {
      for (int64_t r = 0; r < n; ++r) {
        scatter_row(k, v.dtype, data, indices[static_cast<size_t>(r)], values, r, row_elems);
      }
    };
    std::vector<std::pair<size_t, Array>> off_host;
    for (size_t i : which) {
      if (v.components[i].device().is_cpu()) continue;
      TRIBUTARY_ASSIGN_OR_RETURN(Array copy, host_copy(v, i));
      apply_to(copy.mutable_data<void>());
      off_host.emplace_back(i, std::move(copy));
    }
    TRIBUTARY_RETURN_IF_ERROR(commit(v, off_host));
    std::lock_guard lock(v.mu);
    for (size_t i : which) {
      if (v.components[i].device().is_cpu()) apply_to(v.components[i].mutable_data<void>());
    }
    return ok_status();
  }

  static Status scatter_all(State& v, ScatterKind k, const IndexedSlices& delta) {
    std::vector<size_t> all(v.components.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return scatter_some(v, all, k, delta);
  }

  static Status scatter(State& v, ScatterKind k, const IndexedSlices& delta) {
    if (!v.plain && v.sync == VariableSynchronization::kOnRead) {
      return unimplemented(fmt::format(
          "Variables with `synchronization=ON_READ` doesn't support `{}` (variable '{}')",
          scatter_name(k), v.name));
    }
    const bool keeps_one =
        k == ScatterKind::kMin || k == ScatterKind::kMax || k == ScatterKind::kUpdate;
    if (!v.plain && keeps_one && v.aggregation != VariableAggregation::kNone &&
        v.aggregation != VariableAggregation::kOnlyFirstReplica) {
      return unimplemented(fmt::format(
          "{} is only supported for mirrored variable (variable created within certain "
          "`tf.distribute.Strategy` scope) with NONE or `ONLY_FIRST_REPLICA` aggregation, got: {}. "
          "(variable '{}')",
          scatter_name(k), variable_aggregation_name(v.aggregation), v.name));
    }
    if (v.plain) {
      TRIBUTARY_RETURN_IF_ERROR(check_scatter(v, k, delta));
      std::lock_guard serial(v.update_mu);
      return scatter_all(v, k, delta);
    }
    Strategy& s = *v.strategy;
    if (ReplicaContext* ctx = replica_of(s)) return scatter_in_replica(v, *ctx, k, delta);
    TRIBUTARY_RETURN_IF_ERROR(
        s.require_cross_replica(fmt::format("{} on variable '{}'", scatter_name(k), v.name)));
    TRIBUTARY_RETURN_IF_ERROR(check_scatter(v, k, delta));
    return scatter_all(v, k, delta);
  }

  // What a replica brings to an aggregated scatter: its slices with int64 indices and the
  // variable's row count as dense_shape (which scatters ignore), so that replicas differing only
  // there still line up.
  static StatusOr<IndexedSlices> for_gathering(const State& v, const IndexedSlices& mine) {
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> indices, mine.index_values());
    TRIBUTARY_ASSIGN_OR_RETURN(Array index_array, Array::from_vector(indices));
    Shape dense = mine.values().shape();
    dense[0] = v.shape.empty() ? 0 : v.shape[0];
    return IndexedSlices::make(mine.values(), std::move(index_array), std::move(dense));
  }

  static Status scatter_in_replica(State& v, ReplicaContext& ctx, ScatterKind k,
                                   const IndexedSlices& delta) {
    if (v.aggregation == VariableAggregation::kNone) {
      if (v.central) return central_needs_aggregation(v.name, v.strategy->name());
      TRIBUTARY_RETURN_IF_ERROR(check_scatter(v, k, delta));
      std::lock_guard serial(v.update_mu);
      return scatter_some(v, {static_cast<size_t>(ctx.local_replica_id())}, k, delta);
    }
    // Aggregated: the slices are checked once gathered (TF checks the aggregate as it applies
    // it), so that every replica of every worker sees the same slices and fails alike, and
    // ONLY_FIRST_REPLICA looks at replica 0's alone.
    Strategy& s = *v.strategy;
    State* state = &v;
    StatusOr<std::any> r = ctx.meet(
        fmt::format("{} on variable '{}'", scatter_name(k), v.name), std::any(delta),
        [&s, state, k](std::vector<std::any>& args) -> StatusOr<std::any> {
          const State& var = *state;
          const Shape slice(var.shape.empty() ? var.shape.begin() : var.shape.begin() + 1,
                            var.shape.end());
          std::vector<IndexedSlices> values;
          ReduceOp op = ReduceOp::kSum;
          if (var.aggregation == VariableAggregation::kOnlyFirstReplica) {
            // Global replica 0's slices; every other replica adds none (of the variable's kind) to
            // the concatenation.
            for (size_t i = 0; i < args.size(); ++i) {
              if (s.worker_index() == 0 && i == 0) {
                TRIBUTARY_ASSIGN_OR_RETURN(
                    IndexedSlices first,
                    for_gathering(var, std::any_cast<const IndexedSlices&>(args[i])));
                values.push_back(std::move(first));
                continue;
              }
              Shape none = slice, dense = slice;
              none.insert(none.begin(), 0);
              dense.insert(dense.begin(), var.shape.empty() ? 0 : var.shape[0]);
              TRIBUTARY_ASSIGN_OR_RETURN(Array no_values, Array::zeros(var.dtype, none));
              TRIBUTARY_ASSIGN_OR_RETURN(Array no_indices, Array::zeros(DType::kInt64, Shape{0}));
              TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices empty,
                                         IndexedSlices::make(no_values, no_indices, dense));
              values.push_back(std::move(empty));
            }
          } else {
            TRIBUTARY_ASSIGN_OR_RETURN(op, reduce_op_of(var.aggregation));
            for (const std::any& a : args) {
              TRIBUTARY_ASSIGN_OR_RETURN(
                  IndexedSlices mine, for_gathering(var, std::any_cast<const IndexedSlices&>(a)));
              values.push_back(std::move(mine));
            }
          }
          TRIBUTARY_ASSIGN_OR_RETURN(std::vector<IndexedSlices> agreed,
                                     s.all_reduce_slices_local(op, values));
          TRIBUTARY_RETURN_IF_ERROR(
              check_scatter(var, k, agreed[0])
                  .with_context("the slices gathered from every replica, in replica order"));
          TRIBUTARY_RETURN_IF_ERROR(scatter_all(*state, k, agreed[0]));
          return std::any();
        });
    return r.ok() ? ok_status() : r.status();
  }

  static StatusOr<Array> read(const State& v) {
    if (v.plain) return snapshot(v, 0);  // one copy, nothing to aggregate, in any context
    Strategy& s = *v.strategy;
    if (ReplicaContext* ctx = replica_of(s)) {
      TRIBUTARY_ASSIGN_OR_RETURN(
          Array local, snapshot(v, v.central ? 0 : static_cast<size_t>(ctx->local_replica_id())));
      if (v.sync != VariableSynchronization::kOnRead || sync_on_read_depth == 0) return local;
      // Inside variable_sync_on_read_context(): the aggregated value, read by every replica
      // together (a collective across workers, as the cross-replica read is).
      if (v.aggregation == VariableAggregation::kOnlyFirstReplica) {
        // Global replica 0's copy: everyone else contributes zeros to a sum.
        if (ctx->replica_id_in_sync_group() != 0) {
          TRIBUTARY_ASSIGN_OR_RETURN(local, Array::zeros(local.dtype(), local.shape(),
                                                         local.device()));
        }
        return ctx->all_reduce(ReduceOp::kSum, local);
      }
      StatusOr<ReduceOp> op = reduce_op_of(v.aggregation);
      if (!op.ok()) {
        return op.status().with_context(fmt::format(
            "reading SyncOnReadVariable '{}' inside variable_sync_on_read_context() needs an "
            "aggregation",
            v.name));
      }
      return ctx->all_reduce(*op, local);
    }
    TRIBUTARY_RETURN_IF_ERROR(
        s.require_cross_replica(fmt::format("read of variable '{}'", v.name)));
    if (v.sync == VariableSynchronization::kOnWrite ||
        v.aggregation == VariableAggregation::kOnlyFirstReplica) {
      return snapshot(v, 0);
    }
    StatusOr<ReduceOp> op = reduce_op_of(v.aggregation);
    if (!op.ok()) {
      return op.status().with_context(fmt::format(
          "reading SyncOnReadVariable '{}' in cross-replica context needs an aggregation", v.name));
    }
    std::vector<Array> copies;
    for (size_t i = 0; i < v.components.size(); ++i) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array copy, snapshot(v, i));
      copies.push_back(std::move(copy));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> r, s.all_reduce_local(*op, copies));
    return r[0].to_device(Device::cpu());
  }
};

StatusOr<Variable> Strategy::create_variable(const Array& initial_value, VariableOptions options) {
  // A handle on the default strategy creates the default strategy's variables.
  if (Strategy* s = identity(); s != this) return s->create_variable(initial_value, options);
  StatusOr<Variable> made = [&]() -> StatusOr<Variable> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica(fmt::format(
        "create_variable ('{}'; create variables outside run(), e.g. in scope())", options.name)));
    VariableSynchronization sync = options.synchronization;
    if (sync == VariableSynchronization::kAuto) sync = VariableSynchronization::kOnWrite;
    // TF: the default strategy and OneDevice._create_variable call next_creator, which makes a
    // plain tf.Variable: none of the distributed checks below apply.
    const bool plain = kind() == StrategyKind::kDefault || kind() == StrategyKind::kOneDevice;
    if (sync == VariableSynchronization::kNone && !plain) {
      return invalid_argument(fmt::format(
          "`NONE` variable synchronization mode is not supported with tf.distribute strategy. "
          "Please change the `synchronization` for variable: {}",
          options.name));
    }
    if (options.aggregation == VariableAggregation::kMean && !plain &&
        !dtype_is_floating(initial_value.dtype())) {
      return invalid_argument(fmt::format(
          "creating distributed tf.Variable with aggregation=MEAN and a non-floating dtype is not "
          "supported, please use a different aggregation or dtype (variable '{}', {})",
          options.name, dtype_name(initial_value.dtype())));
    }
    auto state = std::make_shared<Variable::State>();
    state->strategy = this;
    state->name = options.name;
    state->dtype = initial_value.dtype();
    state->shape = initial_value.shape();
    state->sync = sync;
    state->aggregation = options.aggregation;
    state->trainable = options.trainable;
    state->plain = plain;
    // CentralStorage keeps ON_WRITE variables once; ON_READ ones stay per replica (they are
    // per-replica accumulators by definition).
    state->central = parts_.central_variables && sync == VariableSynchronization::kOnWrite;
    const std::vector<Device> devices =
        state->central ? std::vector<Device>{parts_.parameter_device} : parts_.devices;
    TRIBUTARY_ASSIGN_OR_RETURN(Array initial, initial_value.to_device(Device::cpu()));
    for (const Device& d : devices) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array c, Array::zeros(state->dtype, state->shape, d));
      state->components.push_back(std::move(c));
    }
    if (num_workers() > 1) {
      // Every replica starts from the chief's value (TF: broadcast from the chief).
      // The source on the first component's device, as a backend of that device takes it.
      TRIBUTARY_ASSIGN_OR_RETURN(Array source, initial.to_device(state->components[0].device()));
      std::vector<Tensor> dst;
      for (const Array& c : state->components) dst.push_back(c.tensor());
      TRIBUTARY_RETURN_IF_ERROR(
          parts_.cross_device_ops->broadcast(source.tensor(), Mirrored<Tensor>(std::move(dst)), 0)
              .wait()
              .with_context(
                  fmt::format("broadcasting the initial value of variable '{}'", options.name)));
    } else {
      std::vector<std::pair<size_t, Array>> init;
      for (size_t i = 0; i < state->components.size(); ++i) init.emplace_back(i, initial);
      TRIBUTARY_RETURN_IF_ERROR(VariableImpl::commit(*state, init));
    }
    return Variable(std::move(state));
  }();
  if (!made.ok()) tell_peers(made.status());
  return made;
}

namespace {

using UpdateFn = std::function<StatusOr<Array>(int, const Array&)>;

// What one replica brings to the meeting of an update() in replica context.
struct ReplicaUpdate {
  const Variable::State* variable;
  const UpdateFn* fn;  // alive on the replica's stack while it waits in the meeting
};

}  // namespace

Status Strategy::update(Variable& variable, const UpdateFn& fn) {
  if (Strategy* s = identity(); s != this) return s->update(variable, fn);
  if (!variable.valid()) return invalid_argument("update: the variable is empty");
  Variable::State& v = *variable.state();
  const auto& t = strategy_internal::thread_context();
  const bool in_replica =
      t.replica != nullptr && t.merge == nullptr && &t.replica->strategy() == this;
  if (!in_replica) TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("update"));
  if (v.strategy != this) {
    return invalid_argument(fmt::format("update: variable '{}' was created by {}, not {}", v.name,
                                        v.strategy->describe(), describe()));
  }
  if (in_replica) {
    // TF's _replica_ctx_update: a merge_call whose function calls update in cross-replica
    // context; component i is computed by replica i's fn (TF: fn with replica i's args).
    Variable target = variable;
    StatusOr<std::any> r = t.replica->meet(
        fmt::format("update on variable '{}'", v.name), std::any(ReplicaUpdate{&v, &fn}),
        [this, target](std::vector<std::any>& args) mutable -> StatusOr<std::any> {
          std::vector<const UpdateFn*> fns;
          for (size_t i = 0; i < args.size(); ++i) {
            const auto& a = std::any_cast<const ReplicaUpdate&>(args[i]);
            if (a.variable != target.state().get()) {
              return invalid_argument(fmt::format(
                  "update: replica {} updates another variable than replica 0 (both named "
                  "'{}'); every replica must update the same variable",
                  i, target.name()));
            }
            fns.push_back(a.fn);
          }
          TRIBUTARY_RETURN_IF_ERROR(
              update(target, [&fns](int component, const Array& current) -> StatusOr<Array> {
                const size_t i = static_cast<size_t>(component);
                return (*fns[i < fns.size() ? i : 0])(component, current);
              }));
          return std::any();
        });
    return r.ok() ? ok_status() : r.status();
  }
  std::vector<std::pair<size_t, Array>> updates;
  for (size_t i = 0; i < v.components.size(); ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array current, VariableImpl::snapshot(v, i));
    StatusOr<Array> next = fn(static_cast<int>(i), std::move(current));
    if (!next.ok()) return next.status().with_context(fmt::format("update of component {}", i));
    TRIBUTARY_RETURN_IF_ERROR(VariableImpl::check_value(v, *next, "update"));
    updates.emplace_back(i, std::move(*next));
  }
  return VariableImpl::commit(v, updates);
}

// --- Variable ------------------------------------------------------------------------------------

namespace {
const Variable::State& must(const std::shared_ptr<Variable::State>& s) {
  assert(s && "use of an empty Variable handle");
  return *s;
}
}  // namespace

const std::string& Variable::name() const { return must(state_).name; }
DType Variable::dtype() const { return must(state_).dtype; }
const Shape& Variable::shape() const { return must(state_).shape; }
VariableSynchronization Variable::synchronization() const { return must(state_).sync; }
VariableAggregation Variable::aggregation() const { return must(state_).aggregation; }
bool Variable::trainable() const { return must(state_).trainable; }
Strategy& Variable::strategy() const { return *must(state_).strategy; }

std::vector<Device> Variable::devices() const {
  std::vector<Device> d;
  for (const Array& c : must(state_).components) d.push_back(c.device());
  return d;
}

SyncOnReadContext::SyncOnReadContext() { ++sync_on_read_depth; }
SyncOnReadContext::~SyncOnReadContext() { --sync_on_read_depth; }
SyncOnReadContext variable_sync_on_read_context() { return SyncOnReadContext(); }
bool in_variable_sync_on_read_context() { return sync_on_read_depth > 0; }

StatusOr<Array> Variable::read() const {
  if (!state_) return failed_precondition("read of an empty Variable handle");
  return VariableImpl::read(*state_);
}

Status Variable::assign(const Array& value) {
  if (!state_) return failed_precondition("assign to an empty Variable handle");
  return VariableImpl::update(*state_, UpdateKind::kAssign, value);
}
Status Variable::assign_add(const Array& delta) {
  if (!state_) return failed_precondition("assign_add to an empty Variable handle");
  return VariableImpl::update(*state_, UpdateKind::kAdd, delta);
}
Status Variable::assign_sub(const Array& delta) {
  if (!state_) return failed_precondition("assign_sub to an empty Variable handle");
  return VariableImpl::update(*state_, UpdateKind::kSub, delta);
}

#define TRIBUTARY_SCATTER(method, kind)                                              \
  Status Variable::method(const IndexedSlices& delta) {                              \
    if (!state_) return failed_precondition(#method " on an empty Variable handle"); \
    return VariableImpl::scatter(*state_, ScatterKind::kind, delta);                 \
  }
TRIBUTARY_SCATTER(scatter_add, kAdd)
TRIBUTARY_SCATTER(scatter_sub, kSub)
TRIBUTARY_SCATTER(scatter_mul, kMul)
TRIBUTARY_SCATTER(scatter_div, kDiv)
TRIBUTARY_SCATTER(scatter_min, kMin)
TRIBUTARY_SCATTER(scatter_max, kMax)
TRIBUTARY_SCATTER(scatter_update, kUpdate)
#undef TRIBUTARY_SCATTER

StatusOr<std::vector<Array>> Variable::values_on_host() const {
  std::vector<Array> out;
  for (size_t i = 0; i < must(state_).components.size(); ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array copy, VariableImpl::host_copy(*state_, i));
    out.push_back(std::move(copy));
  }
  return out;
}

std::vector<Array> Variable::values() const {
  std::vector<Array> out;
  for (size_t i = 0; i < must(state_).components.size(); ++i) {
    StatusOr<Array> copy = VariableImpl::snapshot(*state_, i);
    if (!copy.ok()) {  // out of memory on the component's device: there is no Status to return
      std::fprintf(stderr, "tributary: Variable::values() of '%s': %s\n", state_->name.c_str(),
                   copy.status().to_string().c_str());
      std::abort();
    }
    out.push_back(std::move(*copy));
  }
  return out;
}

}  // namespace tributary
