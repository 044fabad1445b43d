// Cross-replica operations (Strategy::reduce, gather, reduce_to, ...) and the replica-context
// collectives they share with ReplicaContext, all through the strategy's one CrossDeviceOps.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "fmt/format.h"
#include "strategy/internal.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace {

PerReplica<Tensor> tensors_of(std::span<const Array> arrays) {
  std::vector<Tensor> t;
  t.reserve(arrays.size());
  for (const Array& a : arrays) t.push_back(a.tensor());
  return PerReplica<Tensor>(std::move(t));
}

Status wait(Work work) { return work.wait(); }

// "ReduceOp.SUM", as TF prints it.
std::string op_text(ReduceOp op) {
  std::string name(reduce_op_name(op));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return "ReduceOp." + name;
}

// The dtype of TF's true division (`/`, math_ops._TRUEDIV_TABLE) of `dtype` by a count: floats
// keep theirs, 8-bit integers give float32, wider ones float64.
DType true_division_dtype(DType dtype) {
  if (dtype_is_floating(dtype)) return dtype;
  return dtype == DType::kInt8 || dtype == DType::kUInt8 ? DType::kFloat32 : DType::kFloat64;
}

// TF's reduce_non_distributed_value: the value stands for the same value on every replica, so MEAN
// gives it back and SUM only with one replica in sync (MIN and MAX, which TF lacks, give it back
// too; PROD is SUM's case).
Status check_non_distributed_reduce(ReduceOp op, const std::string& value, int replicas) {
  if ((op == ReduceOp::kSum || op == ReduceOp::kProd) && replicas != 1) {
    return invalid_argument(fmt::format(
        "A non-DistributedValues value {} cannot be reduced with the given reduce op "
        "ReduceOp.{}. (It is the same on every one of the {} replicas; pass a PerReplica value, "
        "one per local replica.)",
        value, op == ReduceOp::kSum ? "SUM" : "PROD", replicas));
  }
  return ok_status();
}

// IndexedSlices reduce by concatenation: SUM and MEAN only (TF's).
Status check_sparse_reduce_op(ReduceOp op) {
  if (op == ReduceOp::kSum || op == ReduceOp::kMean) return ok_status();
  return invalid_argument(fmt::format(
      "`reduce_op` must be Reduce.SUM or Reduce.MEAN, not {}: IndexedSlices are reduced by "
      "concatenating every replica's slices",
      op_text(op)));
}

// TF's shortcut for a value that is not distributed and is zero (a Python 0 in TF): itself.
bool all_zero(const Array& a) {
  if (!a.device().is_cpu()) return false;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    if (a.at(i) != 0) return false;
  }
  return true;
}

// TF's reduce: an axis in [-rank, rank), a negative one counting from the end.
StatusOr<int> normalize_axis(int axis, int rank) {
  if (axis < -rank || axis >= rank) {
    return invalid_argument(
        fmt::format("`axis` = {} out of range for `value` with rank {}", axis, rank));
  }
  return axis < 0 ? axis + rank : axis;
}

// [outer, A, inner] -> [A, outer, inner] (to_front) or back.
StatusOr<Array> move_axis(const Array& a, int axis, bool to_front, Shape result_shape) {
  int64_t outer = 1, inner = 1;
  const Shape& logical = to_front ? a.shape() : result_shape;
  for (int i = 0; i < axis; ++i) outer *= logical[i];
  for (size_t i = axis + 1; i < logical.size(); ++i) inner *= logical[i];
  const int64_t size = logical[axis];
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(a.dtype(), std::move(result_shape)));
  const size_t block = static_cast<size_t>(inner) * dtype_size(a.dtype());
  const auto* src = a.data<unsigned char>();
  auto* dst = out.mutable_data<unsigned char>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < size; ++k) {
      const int64_t natural = (o * size + k), front = (k * outer + o);
      const int64_t from = to_front ? natural : front, to = to_front ? front : natural;
      if (block) std::memcpy(dst + to * block, src + from * block, block);
    }
  }
  return out;
}

Status check_per_replica(const Strategy& s, std::span<const Array> values, std::string_view what) {
  if (static_cast<int>(values.size()) != s.num_local_replicas()) {
    return invalid_argument(fmt::format("{}: expected one value per local replica ({}), got {}",
                                        what, s.num_local_replicas(), values.size()));
  }
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i].dtype() != values[0].dtype()) {
      return invalid_argument(fmt::format("{}: replica {} has {} but replica 0 has {}", what, i,
                                          values[i].tensor().to_string(),
                                          values[0].tensor().to_string()));
    }
  }
  return ok_status();
}

// The values placed on the strategy's replica devices (CPU replicas share storage).
StatusOr<std::vector<Array>> place(const Strategy& s, std::span<const Array> values) {
  std::vector<Array> out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i < s.worker_devices().size()) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array a, values[i].to_device(s.worker_devices()[i]));
      out.push_back(std::move(a));
    } else {
      out.push_back(values[i]);
    }
  }
  return out;
}

// Multi-worker: a failure on this worker only is told to the peers (Strategy::tell_peers).
template <typename R>
R told(Strategy& s, R r) {
  if (!r.ok()) {
    if constexpr (std::is_same_v<R, Status>) {
      s.tell_peers(r);
    } else {
      s.tell_peers(r.status());
    }
  }
  return r;
}

}  // namespace

using strategy_internal::thread_context;

namespace strategy_internal {

StatusOr<Array> broadcast_from_chief(Strategy& s, const Array& value) {
  const Device& first = s.worker_devices()[0];
  TRIBUTARY_ASSIGN_OR_RETURN(Array source, value.to_device(first));
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(value.dtype(), value.shape(), first));
  TRIBUTARY_RETURN_IF_ERROR(
      s.cross_device_ops().broadcast(source.tensor(), Mirrored<Tensor>({out.tensor()}), 0).wait());
  return out.to_device(Device::cpu());
}

}  // namespace strategy_internal

void Strategy::tell_peers(const Status& failure) {
  if (!failure.ok() && parts_.num_workers > 1) parts_.cross_device_ops->abort(failure);
}

std::string_view variable_synchronization_name(VariableSynchronization s) {
  switch (s) {
    case VariableSynchronization::kAuto:
      return "AUTO";
    case VariableSynchronization::kNone:
      return "NONE";
    case VariableSynchronization::kOnWrite:
      return "ON_WRITE";
    case VariableSynchronization::kOnRead:
      return "ON_READ";
  }
  return "?";
}

std::string_view variable_aggregation_name(VariableAggregation a) {
  switch (a) {
    case VariableAggregation::kNone:
      return "NONE";
    case VariableAggregation::kSum:
      return "SUM";
    case VariableAggregation::kMean:
      return "MEAN";
    case VariableAggregation::kOnlyFirstReplica:
      return "ONLY_FIRST_REPLICA";
  }
  return "?";
}

std::string Strategy::describe() const {
  if (Strategy* s = identity(); s != this) return s->describe();  // a handle on the default
  std::string devices;
  for (const Device& d : parts_.devices) devices += (devices.empty() ? "" : ", ") + d.to_string();
  std::string s = parts_.name;
  if (instance_ > 0) s += fmt::format("#{}", instance_);
  s += fmt::format("(devices=[{}]", devices);
  if (parts_.central_variables) s += ", parameter_device=" + parts_.parameter_device.to_string();
  if (parts_.num_workers > 1) {
    s += fmt::format(", worker={}/{}", parts_.worker_index, parts_.num_workers);
  }
  if (parts_.cross_device_ops) s += ", cross_device_ops=" + parts_.cross_device_ops->spec();
  return s + ")";
}

int Strategy::num_replicas_in_sync() const { return num_local_replicas() * parts_.num_workers; }

std::vector<Device> Strategy::parameter_devices() const {
  if (parts_.central_variables) return {parts_.parameter_device};
  return parts_.devices;
}

Status Strategy::require_cross_replica(std::string_view method) const {
  const auto& t = thread_context();
  const Strategy* self = identity();
  if (t.replica != nullptr && t.merge == nullptr) {
    if (&t.replica->strategy() != self)
      return strategy_internal::mixing_error(*this, t.replica->strategy());
    if (method == "gather") {
      return failed_precondition(
          "tf.distribute.Strategy.gather method requires cross-replica context, use "
          "get_replica_context().all_gather() instead");
    }
    return failed_precondition(fmt::format(
        "Method requires being in cross-replica context, use get_replica_context().merge_call() "
        "(called {} from replica {})",
        method, t.replica->local_replica_id()));
  }
  Strategy* current = strategy_internal::current_strategy();
  if (current != nullptr && current != self)
    return strategy_internal::mixing_error(*this, *current);
  return ok_status();
}

StatusOr<std::vector<Array>> Strategy::all_reduce_local(ReduceOp op,
                                                        std::span<const Array> per_replica) {
  TRIBUTARY_RETURN_IF_ERROR(check_per_replica(*this, per_replica, "all_reduce"));
  // TF's MEAN is the sum divided with `/` (truediv): an integer mean is a float64, not the
  // backend's integer MEAN (which truncates). So integers are summed, then divided here. With one
  // replica in sync (the default strategy, OneDevice, a one-device Mirrored, one worker of one
  // replica) TF's CrossDeviceOps.reduce takes its shortcut and returns the value itself.
  const bool plain = num_replicas_in_sync() == 1;
  const bool true_division =
      op == ReduceOp::kMean && !plain && !dtype_is_floating(per_replica[0].dtype());
  std::vector<Array> inputs, outputs;
  for (int i = 0; i < num_local_replicas(); ++i) {
    if (per_replica[i].shape() != per_replica[0].shape()) {
      return invalid_argument(fmt::format(
          "all_reduce: replica {} has {} but replica 0 has {}; every replica must reduce the "
          "same shape",
          i, per_replica[i].tensor().to_string(), per_replica[0].tensor().to_string()));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array in, per_replica[i].to_device(parts_.devices[i]));
    TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(in.dtype(), in.shape(), parts_.devices[i]));
    inputs.push_back(std::move(in));
    outputs.push_back(std::move(out));
  }
  TRIBUTARY_RETURN_IF_ERROR(wait(parts_.cross_device_ops->all_reduce(
      true_division ? ReduceOp::kSum : op, tensors_of(inputs), tensors_of(outputs))));
  if (!true_division) return outputs;
  const double count = num_replicas_in_sync();
  for (int i = 0; i < num_local_replicas(); ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array sum, outputs[i].to_device(Device::cpu()));
    std::vector<double> q = sum.to_doubles();
    for (double& x : q) x /= count;
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array mean, Array::from_doubles(true_division_dtype(sum.dtype()), q, sum.shape()));
    TRIBUTARY_ASSIGN_OR_RETURN(outputs[i], mean.to_device(parts_.devices[i]));
  }
  return outputs;
}

namespace {

// Every replica's rows in global replica order: replica r holds along[r] rows of `row_elems`
// elements (`local[i]`, any device, for local replica i). Each is padded to the longest on the
// host, all-gathered on the replica devices, and compacted on the host: one flat CPU array of
// sum(along) rows per local replica. Nothing is sent when every replica has no rows.
StatusOr<std::vector<Array>> gather_rows(Strategy& s, std::span<const Array> local,
                                         std::span<const int64_t> along, int64_t row_elems) {
  const int n_local = s.num_local_replicas();
  const int64_t max_along = *std::max_element(along.begin(), along.end());
  int64_t total = 0;
  for (int64_t a : along) total += a;
  const DType dtype = local[0].dtype();
  const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(dtype);
  std::vector<Array> padded, gathered;
  for (int i = 0; i < n_local; ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array mine, local[i].to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(Array pad, Array::zeros(dtype, Shape{max_along * row_elems}));
    if (mine.nbytes()) std::memcpy(pad.mutable_data<void>(), mine.data<void>(), mine.nbytes());
    TRIBUTARY_ASSIGN_OR_RETURN(pad, pad.to_device(s.worker_devices()[i]));
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array out,
        Array::zeros(dtype, Shape{static_cast<int64_t>(along.size()) * max_along * row_elems},
                     s.worker_devices()[i]));
    padded.push_back(std::move(pad));
    gathered.push_back(std::move(out));
  }
  if (max_along * row_elems > 0) {
    TRIBUTARY_RETURN_IF_ERROR(
        wait(s.cross_device_ops().all_gather(tensors_of(padded), tensors_of(gathered))));
  }
  std::vector<Array> results;
  for (int i = 0; i < n_local; ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array all, gathered[i].to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(Array compact, Array::zeros(dtype, Shape{total * row_elems}));
    auto* dst = compact.mutable_data<unsigned char>();
    const auto* src = all.data<unsigned char>();
    size_t at = 0;
    for (size_t r = 0; r < along.size(); ++r) {
      const size_t bytes = static_cast<size_t>(along[r]) * row_bytes;
      if (bytes) std::memcpy(dst + at, src + r * static_cast<size_t>(max_along) * row_bytes, bytes);
      at += bytes;
    }
    results.push_back(std::move(compact));
  }
  return results;
}

// One all-gather of `width` int64 per local replica (descriptions of the values about to be
// gathered, so that every replica sees every replica's alike); the CPU result, replica-major.
StatusOr<std::vector<int64_t>> gather_descriptions(Strategy& s,
                                                   const std::vector<std::vector<int64_t>>& mine,
                                                   size_t width) {
  std::vector<Array> in, out;
  for (int i = 0; i < s.num_local_replicas(); ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::from_vector(mine[i]));
    TRIBUTARY_ASSIGN_OR_RETURN(a, a.to_device(s.worker_devices()[i]));
    TRIBUTARY_ASSIGN_OR_RETURN(
        Array o,
        Array::zeros(DType::kInt64, Shape{static_cast<int64_t>(width) * s.num_replicas_in_sync()},
                     s.worker_devices()[i]));
    in.push_back(std::move(a));
    out.push_back(std::move(o));
  }
  TRIBUTARY_RETURN_IF_ERROR(wait(s.cross_device_ops().all_gather(tensors_of(in), tensors_of(out))));
  TRIBUTARY_ASSIGN_OR_RETURN(Array all, out[0].to_device(Device::cpu()));
  return all.to_vector<int64_t>();
}

constexpr int kMaxGatherRank = 8;

}  // namespace

StatusOr<std::vector<Array>> Strategy::all_gather_local(std::span<const Array> per_replica,
                                                        int axis) {
  TRIBUTARY_RETURN_IF_ERROR(check_per_replica(*this, per_replica, "all_gather"));
  const int n_local = num_local_replicas();
  const int n = num_replicas_in_sync();
  // 1. Every replica's shape, so that sizes along `axis` may differ (TF's collective all_gather
  //    pads to the largest and slices back) and mismatches are seen alike by every replica.
  constexpr int kMaxRank = kMaxGatherRank;
  std::vector<std::vector<int64_t>> descs;
  for (int i = 0; i < n_local; ++i) {
    const Array& v = per_replica[i];
    if (v.rank() == 0 || v.rank() > kMaxRank) {
      return invalid_argument(fmt::format(
          "all_gather: component tensors must have a non-zero rank (at most {}); replica {} has {}",
          kMaxRank, i, v.tensor().to_string()));
    }
    std::vector<int64_t> desc(kMaxRank + 1, -1);
    desc[0] = v.rank();
    for (int d = 0; d < v.rank(); ++d) desc[d + 1] = v.shape()[d];
    descs.push_back(std::move(desc));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> all,
                             gather_descriptions(*this, descs, kMaxRank + 1));
  const int64_t* first = all.data();
  const int rank = static_cast<int>(first[0]);
  if (axis < 0 || axis >= rank) {
    return invalid_argument(
        fmt::format("all_gather: `axis` = {} out of range for `value` with rank {}", axis, rank));
  }
  int64_t total_along = 0;
  std::vector<int64_t> along(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* d = first + r * (kMaxRank + 1);
    bool same = d[0] == rank;
    for (int k = 0; same && k < rank; ++k) same = k == axis || d[k + 1] == first[k + 1];
    if (!same) {
      return invalid_argument(fmt::format(
          "all_gather: replica {}'s shape differs from replica 0's outside axis {}; shapes may "
          "differ only along the gathered axis",
          r, axis));
    }
    along[r] = d[axis + 1];
    total_along += along[r];
  }
  // 2. Move `axis` to the front (on the host), gather every replica's rows, and move it back.
  int64_t row_elems = 1;
  for (int k = 0; k < rank; ++k) {
    if (k != axis) row_elems *= first[k + 1];
  }
  std::vector<Array> fronts;
  for (int i = 0; i < n_local; ++i) {
    const Array& v = per_replica[i];
    Shape front = v.shape();
    front.erase(front.begin() + axis);
    front.insert(front.begin(), v.shape()[axis]);
    TRIBUTARY_ASSIGN_OR_RETURN(Array moved, v.to_device(Device::cpu()));
    if (axis != 0) {
      TRIBUTARY_ASSIGN_OR_RETURN(moved, move_axis(moved, axis, true, front));
    }
    fronts.push_back(std::move(moved));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> rows, gather_rows(*this, fronts, along, row_elems));
  std::vector<Array> results;
  for (int i = 0; i < n_local; ++i) {
    Shape natural = per_replica[i].shape();
    natural[axis] = total_along;
    Array compact = rows[i];
    if (axis != 0) {
      Shape front_shape;
      front_shape.push_back(total_along);
      for (int k = 0; k < rank; ++k) {
        if (k != axis) front_shape.push_back(first[k + 1]);
      }
      TRIBUTARY_ASSIGN_OR_RETURN(compact, compact.reshape(front_shape));
      TRIBUTARY_ASSIGN_OR_RETURN(compact, move_axis(compact, axis, false, natural));
    } else {
      TRIBUTARY_ASSIGN_OR_RETURN(compact, compact.reshape(natural));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array placed, compact.to_device(parts_.devices[i]));
    results.push_back(std::move(placed));
  }
  return results;
}

StatusOr<std::vector<IndexedSlices>> Strategy::all_reduce_slices_local(
    ReduceOp op, std::span<const IndexedSlices> per_replica) {
  if (static_cast<int>(per_replica.size()) != num_local_replicas()) {
    return invalid_argument(fmt::format(
        "all_reduce of IndexedSlices: expected one value per local replica ({}), got {}",
        num_local_replicas(), per_replica.size()));
  }
  TRIBUTARY_RETURN_IF_ERROR(check_sparse_reduce_op(op));
  std::vector<IndexedSlices> results;
  if (num_replicas_in_sync() == 1) {  // TF's shortcut: the value itself
    TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices placed, per_replica[0].to_device(parts_.devices[0]));
    results.push_back(std::move(placed));
    return results;
  }
  // 1. What every replica holds: dtypes, rows and dense_shape (rank <= 8), gathered so that a
  //    difference fails every replica alike, and rows may differ.
  constexpr size_t kHead = 5, kWidth = kHead + kMaxGatherRank;
  std::vector<std::vector<int64_t>> descs;
  for (const IndexedSlices& v : per_replica) {
    std::vector<int64_t> d(kWidth, -1);
    d[0] = static_cast<int64_t>(v.dtype());
    d[1] = static_cast<int64_t>(v.indices().dtype());
    d[2] = v.num_rows();
    d[3] = static_cast<int64_t>(v.dense_shape().size());
    d[4] = static_cast<int64_t>(op);  // the workers' ops are compared too (the all-gathers are not)
    for (size_t k = 0; k < v.dense_shape().size() && k < kMaxGatherRank; ++k) {
      d[kHead + k] = v.dense_shape()[k];
    }
    descs.push_back(std::move(d));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> all, gather_descriptions(*this, descs, kWidth));
  const int n = num_replicas_in_sync();
  auto describe = [&](int r) {
    const int64_t* d = all.data() + static_cast<size_t>(r) * kWidth;
    Shape dense;
    for (int64_t k = 0; k < std::min<int64_t>(d[3], kMaxGatherRank); ++k)
      dense.push_back(d[kHead + k]);
    return fmt::format("values {}, indices {}, dense_shape {}",
                       dtype_name(static_cast<DType>(d[0])), dtype_name(static_cast<DType>(d[1])),
                       shape_to_string(dense));
  };
  std::vector<int64_t> rows(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* d = all.data() + static_cast<size_t>(r) * kWidth;
    if (d[3] > kMaxGatherRank) {
      return invalid_argument(fmt::format(
          "all_reduce of IndexedSlices: replica {} has a dense_shape of rank {}; at most {}", r,
          d[3], kMaxGatherRank));
    }
    if (d[4] != all[4]) {
      return invalid_argument(fmt::format(
          "all_reduce: replica 0 passed {} but replica {} passed {}; every replica must "
          "all_reduce with the same op",
          op_text(static_cast<ReduceOp>(all[4])), r, op_text(static_cast<ReduceOp>(d[4]))));
    }
    if (d[0] != all[0] || d[1] != all[1] || !std::equal(d + 3, d + 4, all.data() + 3) ||
        !std::equal(d + kHead, d + kWidth, all.data() + kHead)) {
      return invalid_argument(fmt::format(
          "all_reduce of IndexedSlices: replica {} has {} but replica 0 has {}; every replica must "
          "reduce slices of the same dtypes and dense_shape",
          r, describe(r), describe(0)));
    }
    rows[r] = d[2];
  }
  // 2. Every replica's values, then indices (padded to the most rows; each keeps its own).
  const Shape& dense_shape = per_replica[0].dense_shape();
  const int64_t row_elems = shape_num_elements(Shape(dense_shape.begin() + 1, dense_shape.end()));
  std::vector<Array> values, indices;
  for (const IndexedSlices& v : per_replica) {
    values.push_back(v.values());
    indices.push_back(v.indices());
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> all_values,
                             gather_rows(*this, values, rows, row_elems));
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> all_indices, gather_rows(*this, indices, rows, 1));
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  Shape values_shape = dense_shape;
  values_shape[0] = total;
  for (int i = 0; i < num_local_replicas(); ++i) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array v, all_values[i].reshape(values_shape));
    if (op == ReduceOp::kMean) {
      // TF divides the values by the group size; an integer mean is TF's true division.
      v = cast(v, true_division_dtype(v.dtype()));
      TRIBUTARY_ASSIGN_OR_RETURN(v, scale(v, 1.0 / n));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices made,
                               IndexedSlices::make(std::move(v), all_indices[i], dense_shape));
    TRIBUTARY_ASSIGN_OR_RETURN(made, made.to_device(parts_.devices[i]));
    results.push_back(std::move(made));
  }
  return results;
}

// --- ReplicaContext
// --------------------------------------------------------------------------------

int ReplicaContext::replica_id_in_sync_group() const {
  return strategy_->worker_index() * strategy_->num_local_replicas() + local_id_;
}
int ReplicaContext::num_replicas_in_sync() const { return strategy_->num_replicas_in_sync(); }
const Device& ReplicaContext::device() const { return strategy_->worker_devices()[local_id_]; }

StatusOr<Array> ReplicaContext::all_reduce(ReduceOp op, const Array& value) {
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> r,
                             all_reduce(op, std::span<const Array>(&value, 1)));
  return r[0];
}

namespace {

// What one replica brings to an all_reduce meeting.
struct AllReduceArg {
  ReduceOp op;
  std::vector<Array> values;
};

// Every replica must make the same all_reduce: the same op, count, dtypes and shapes. Checked
// in the merge, so that a difference fails every replica with the same message.
Status check_same_all_reduce(const std::vector<AllReduceArg>& args) {
  const AllReduceArg& first = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    const AllReduceArg& a = args[i];
    if (a.op != first.op) {
      return invalid_argument(fmt::format(
          "all_reduce: replica 0 passed {} but replica {} passed {}; every replica must "
          "all_reduce with the same op",
          op_text(first.op), i, op_text(a.op)));
    }
    if (a.values.size() != first.values.size()) {
      return invalid_argument(
          fmt::format("all_reduce: replica {} passed {} value(s) but replica 0 passed {}; every "
                      "replica must all_reduce the same number of values",
                      i, a.values.size(), first.values.size()));
    }
    for (size_t k = 0; k < a.values.size(); ++k) {
      const Array& mine = a.values[k];
      const Array& theirs = first.values[k];
      if (mine.dtype() != theirs.dtype() || mine.shape() != theirs.shape()) {
        return invalid_argument(fmt::format(
            "all_reduce: replica {} has {}{} but replica 0 has {}{} (value {}); every replica "
            "must reduce the same {}",
            i, dtype_name(mine.dtype()), shape_to_string(mine.shape()), dtype_name(theirs.dtype()),
            shape_to_string(theirs.shape()), k,
            mine.dtype() != theirs.dtype() ? "dtype" : "shape"));
      }
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<std::vector<Array>> ReplicaContext::all_reduce(ReduceOp op,
                                                        std::span<const Array> values) {
  Strategy* s = strategy_;
  AllReduceArg mine{op, std::vector<Array>(values.begin(), values.end())};
  StatusOr<std::any> r =
      meet("all_reduce", std::any(std::move(mine)),
           [s](std::vector<std::any>& args) -> StatusOr<std::any> {
             const size_t n = args.size();
             std::vector<AllReduceArg> per_replica;
             per_replica.reserve(n);
             for (auto& a : args) per_replica.push_back(std::any_cast<AllReduceArg>(std::move(a)));
             TRIBUTARY_RETURN_IF_ERROR(check_same_all_reduce(per_replica));
             const ReduceOp agreed = per_replica[0].op;
             const size_t count = per_replica[0].values.size();
             // result[k][i]: value k for replica i. One collective per value, in order.
             std::vector<std::vector<Array>> result(count);
             for (size_t k = 0; k < count; ++k) {
               std::vector<Array> column;
               for (size_t i = 0; i < n; ++i) column.push_back(per_replica[i].values[k]);
               TRIBUTARY_ASSIGN_OR_RETURN(result[k], s->all_reduce_local(agreed, column));
             }
             return std::any(std::move(result));
           });
  if (!r.ok()) return r.status();
  const auto& result = std::any_cast<const std::vector<std::vector<Array>>&>(*r);
  std::vector<Array> out;
  for (const auto& column : result) out.push_back(column[local_id_]);
  return out;
}

StatusOr<Array> ReplicaContext::all_gather(const Array& value, int axis) {
  Strategy* s = strategy_;
  StatusOr<std::any> r = meet(
      "all_gather", std::any(std::make_pair(axis, value)),
      [s](std::vector<std::any>& args) -> StatusOr<std::any> {
        std::vector<Array> values;
        const int agreed = std::any_cast<const std::pair<int, Array>&>(args[0]).first;
        for (size_t i = 0; i < args.size(); ++i) {
          auto& [a, v] = std::any_cast<std::pair<int, Array>&>(args[i]);
          if (a != agreed) {
            return invalid_argument(fmt::format(
                "all_gather: replica 0 passed axis {} but replica {} passed axis {}; every "
                "replica must gather along the same axis",
                agreed, i, a));
          }
          values.push_back(std::move(v));
        }
        TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> out, s->all_gather_local(values, agreed));
        return std::any(std::move(out));
      });
  if (!r.ok()) return r.status();
  return std::any_cast<const std::vector<Array>&>(*r)[local_id_];
}

StatusOr<IndexedSlices> ReplicaContext::all_reduce(ReduceOp op, const IndexedSlices& value) {
  Strategy* s = strategy_;
  StatusOr<std::any> r =
      meet("all_reduce of IndexedSlices", std::any(std::make_pair(op, value)),
           [s](std::vector<std::any>& args) -> StatusOr<std::any> {
             const ReduceOp agreed =
                 std::any_cast<const std::pair<ReduceOp, IndexedSlices>&>(args[0]).first;
             std::vector<IndexedSlices> values;
             for (size_t i = 0; i < args.size(); ++i) {
               auto& [o, v] = std::any_cast<std::pair<ReduceOp, IndexedSlices>&>(args[i]);
               if (o != agreed) {
                 return invalid_argument(fmt::format(
                     "all_reduce: replica 0 passed {} but replica {} passed {}; every replica must "
                     "all_reduce with the same op",
                     op_text(agreed), i, op_text(o)));
               }
               values.push_back(std::move(v));
             }
             TRIBUTARY_ASSIGN_OR_RETURN(std::vector<IndexedSlices> out,
                                        s->all_reduce_slices_local(agreed, values));
             return std::any(std::move(out));
           });
  if (!r.ok()) return r.status();
  return std::any_cast<const std::vector<IndexedSlices>&>(*r)[local_id_];
}

// --- Strategy: cross-replica
// -------------------------------------------------------------------------

StatusOr<Array> Strategy::reduce(ReduceOp op, const PerReplica<Array>& value,
                                 std::optional<int> axis) {
  return told(*this, [&]() -> StatusOr<Array> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("reduce"));
    TRIBUTARY_RETURN_IF_ERROR(check_per_replica(*this, value.values(), "reduce"));
    if (!axis) {
      TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> r, all_reduce_local(op, value.values()));
      return r[0].to_device(Device::cpu());
    }
    if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
      return invalid_argument(fmt::format(
          "reduce with an axis supports ReduceOp SUM and MEAN (as tf.distribute), not {}",
          reduce_op_name(op)));
    }
    std::vector<Array> numer, denom;
    for (const Array& v : value) {
      TRIBUTARY_ASSIGN_OR_RETURN(const int a, normalize_axis(*axis, v.rank()));
      TRIBUTARY_ASSIGN_OR_RETURN(const Array host, v.to_device(Device::cpu()));  // GPU replicas
      TRIBUTARY_ASSIGN_OR_RETURN(Array s, reduce_sum(host, a));
      numer.push_back(std::move(s));
      denom.push_back(Array::scalar(static_cast<double>(v.shape()[a])));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> total, all_reduce_local(ReduceOp::kSum, numer));
    if (op == ReduceOp::kSum) return total[0].to_device(Device::cpu());
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> count, all_reduce_local(ReduceOp::kSum, denom));
    TRIBUTARY_ASSIGN_OR_RETURN(Array n, count[0].to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(Array sum, total[0].to_device(Device::cpu()));
    std::vector<double> q = sum.to_doubles();
    for (double& x : q) x /= n.at(0);  // 0/0 is NaN, as TF's division of an empty batch
    return Array::from_doubles(true_division_dtype(sum.dtype()), q, sum.shape());
  }());
}

StatusOr<IndexedSlices> Strategy::reduce(ReduceOp op, const PerReplica<IndexedSlices>& value) {
  return told(*this, [&]() -> StatusOr<IndexedSlices> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("reduce"));
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<IndexedSlices> r,
                               all_reduce_slices_local(op, value.values()));
    return r[0].to_device(Device::cpu());
  }());
}

// A value that is not distributed, on a strategy of several workers: TF's MultiWorkerMirrored
// (_reduce_to) hands it to its collective as one component per worker, so SUM adds the workers'
// values and MEAN divides by the number of workers. Here each local replica brings the value (MIN,
// MAX), or replica 0 the value and the others the op's identity (SUM, PROD, MEAN; with an axis, an
// empty slice along it, so that a MEAN with an axis divides by the global count along it).
StatusOr<IndexedSlices> Strategy::reduce_across_workers(ReduceOp op, const IndexedSlices& value) {
  Shape no_rows = value.values().shape();
  no_rows[0] = 0;
  TRIBUTARY_ASSIGN_OR_RETURN(Array no_values, Array::zeros(value.dtype(), no_rows));
  TRIBUTARY_ASSIGN_OR_RETURN(Array no_indices, Array::zeros(value.indices().dtype(), {0}));
  TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices nothing,
                             IndexedSlices::make(no_values, no_indices, value.dense_shape()));
  std::vector<IndexedSlices> parts(static_cast<size_t>(num_local_replicas()), nothing);
  parts[0] = value;
  TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices all,
                             reduce(ReduceOp::kSum, PerReplica<IndexedSlices>(std::move(parts))));
  if (op == ReduceOp::kSum) return all;
  TRIBUTARY_ASSIGN_OR_RETURN(
      Array mean, scale(cast(all.values(), true_division_dtype(all.dtype())), 1.0 / num_workers()));
  return IndexedSlices::make(std::move(mean), all.indices(), all.dense_shape());
}

StatusOr<Array> Strategy::reduce_across_workers(ReduceOp op, const Array& value,
                                                std::optional<int> axis) {
  const auto n = static_cast<size_t>(num_local_replicas());
  if (axis) {
    TRIBUTARY_ASSIGN_OR_RETURN(const int a, normalize_axis(*axis, value.rank()));
    Shape empty = value.shape();
    empty[a] = 0;
    TRIBUTARY_ASSIGN_OR_RETURN(Array nothing, Array::zeros(value.dtype(), empty));
    std::vector<Array> parts(n, nothing);
    parts[0] = value;
    return reduce(op, PerReplica<Array>(std::move(parts)), a);
  }
  std::vector<Array> parts(n, value);
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) return reduce(op, PerReplica<Array>(parts));
  // SUM, PROD, MEAN: the op's identity on the other local replicas; MEAN is the workers' SUM
  // divided by their number (not n copies of each value summed: an integer sum could overflow).
  TRIBUTARY_ASSIGN_OR_RETURN(Array identity, Array::zeros(value.dtype(), value.shape()));
  if (op == ReduceOp::kProd) {
    std::vector<double> ones(static_cast<size_t>(value.num_elements()), 1.0);
    TRIBUTARY_ASSIGN_OR_RETURN(identity, Array::from_doubles(value.dtype(), ones, value.shape()));
  }
  for (size_t i = 1; i < n; ++i) parts[i] = identity;
  const ReduceOp across = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  TRIBUTARY_ASSIGN_OR_RETURN(Array r, reduce(across, PerReplica<Array>(std::move(parts))));
  if (op != ReduceOp::kMean) return r;
  return scale(cast(r, true_division_dtype(r.dtype())), 1.0 / num_workers());
}

StatusOr<IndexedSlices> Strategy::reduce(ReduceOp op, const IndexedSlices& value) {
  TRIBUTARY_RETURN_IF_ERROR(check_sparse_reduce_op(op));  // alike on every worker: not told
  return told(*this, [&]() -> StatusOr<IndexedSlices> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("reduce"));
    if (num_workers() > 1) return reduce_across_workers(op, value);
    TRIBUTARY_RETURN_IF_ERROR(
        check_non_distributed_reduce(op, value.to_string(), num_replicas_in_sync()));
    return value;
  }());
}

StatusOr<Array> Strategy::reduce(ReduceOp op, const Array& value, std::optional<int> axis) {
  return told(*this, [&]() -> StatusOr<Array> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("reduce"));
    if (num_workers() > 1) return reduce_across_workers(op, value, axis);
    if (!axis && all_zero(value)) return value;
    TRIBUTARY_RETURN_IF_ERROR(
        check_non_distributed_reduce(op, value.to_string(), num_replicas_in_sync()));
    if (!axis) return value;
    if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
      return invalid_argument(fmt::format(
          "reduce with an axis supports ReduceOp SUM and MEAN (as tf.distribute), not {}",
          reduce_op_name(op)));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(const int a, normalize_axis(*axis, value.rank()));
    TRIBUTARY_ASSIGN_OR_RETURN(const Array host, value.to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(Array total, reduce_sum(host, a));
    if (op == ReduceOp::kSum) return total;
    std::vector<double> q = total.to_doubles();
    for (double& x : q) x /= static_cast<double>(value.shape()[a]);
    return Array::from_doubles(true_division_dtype(total.dtype()), q, total.shape());
  }());
}

StatusOr<Array> Strategy::gather(const PerReplica<Array>& value, int axis) {
  return told(*this, [&]() -> StatusOr<Array> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("gather"));
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> r, all_gather_local(value.values(), axis));
    return r[0].to_device(Device::cpu());
  }());
}

StatusOr<Array> Strategy::gather(const Array& value, int axis) {
  return told(*this, [&]() -> StatusOr<Array> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("gather"));
    if (num_workers() == 1) return value;  // TF: the one component there is, as it is
    TRIBUTARY_ASSIGN_OR_RETURN(const int a, normalize_axis(axis, value.rank()));
    // This worker's part, local replica 0 bringing it and the others an empty slice.
    Shape empty = value.shape();
    empty[a] = 0;
    TRIBUTARY_ASSIGN_OR_RETURN(Array nothing, Array::zeros(value.dtype(), empty));
    std::vector<Array> parts(static_cast<size_t>(num_local_replicas()), nothing);
    parts[0] = value;
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> r, all_gather_local(parts, a));
    return r[0].to_device(Device::cpu());
  }());
}

StatusOr<PerReplica<Array>> Strategy::distribute_values_from_function(
    const std::function<StatusOr<Array>(const ValueContext&)>& value_fn) {
  TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("distribute_values_from_function"));
  std::vector<Array> out;
  for (int i = 0; i < num_local_replicas(); ++i) {
    ValueContext ctx{worker_index() * num_local_replicas() + i, num_replicas_in_sync()};
    StatusOr<Array> v = value_fn(ctx);
    if (!v.ok())
      return v.status().with_context(fmt::format("replica {}", ctx.replica_id_in_sync_group));
    TRIBUTARY_ASSIGN_OR_RETURN(Array placed, v->to_device(parts_.devices[i]));
    out.push_back(std::move(placed));
  }
  return PerReplica<Array>(std::move(out));
}

StatusOr<Mirrored<Array>> Strategy::reduce_to(ReduceOp op, const PerReplica<Array>& value,
                                              const Variable& destination) {
  if (!destination.valid()) return invalid_argument("reduce_to: the destination variable is empty");
  return reduce_to(op, value, destination.devices());
}

StatusOr<Mirrored<Array>> Strategy::reduce_to(ReduceOp op, const PerReplica<Array>& value,
                                              const std::vector<Device>& destinations) {
  return told(*this, [&]() -> StatusOr<Mirrored<Array>> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("reduce_to"));
    if (destinations.empty()) return invalid_argument("destinations can not be empty");
    if (value.empty()) return invalid_argument("`per_replica_value` must be non-empty");
    std::vector<Device> value_devices;
    for (const Array& v : value) value_devices.push_back(v.device());
    // TF's shortcut: one worker, one component already where it is going: returned as is.
    if (num_workers() == 1 && value.size() == 1 && value_devices == destinations) {
      return Mirrored<Array>({value[0]});
    }
    // Destinations off the replica devices (the host, for GPU replicas) are reduced into the first
    // replica device and copied there, as TF falls back to reducing to one device: a backend may
    // only take its own devices (nccl: GPU memory).
    const bool on_replicas = std::all_of(destinations.begin(), destinations.end(), [&](auto& d) {
      return std::find(worker_devices().begin(), worker_devices().end(), d) !=
             worker_devices().end();
    });
    const std::vector<Device> into =
        on_replicas ? destinations : std::vector<Device>{worker_devices()[0]};
    std::vector<Array> outs;
    for (const Device& d : into) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(value[0].dtype(), value[0].shape(), d));
      outs.push_back(std::move(out));
    }
    std::vector<Tensor> dst;
    for (const Array& a : outs) dst.push_back(a.tensor());
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> placed, place(*this, value.values()));
    TRIBUTARY_RETURN_IF_ERROR(wait(
        parts_.cross_device_ops->reduce(op, tensors_of(placed), Mirrored<Tensor>(std::move(dst)))));
    if (on_replicas) return Mirrored<Array>(std::move(outs));
    std::vector<Array> copies;
    for (const Device& d : destinations) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array c, outs[0].to_device(d));
      copies.push_back(std::move(c));
    }
    return Mirrored<Array>(std::move(copies));
  }());
}

StatusOr<std::vector<Mirrored<Array>>> Strategy::batch_reduce_to(
    ReduceOp op, std::span<const PerReplica<Array>> values) {
  return told(*this, [&]() -> StatusOr<std::vector<Mirrored<Array>>> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("batch_reduce_to"));
    std::vector<ReducePair> pairs;
    std::vector<std::vector<Array>> inputs;
    std::vector<std::vector<Array>> outs(values.size());
    for (size_t k = 0; k < values.size(); ++k) {
      TRIBUTARY_RETURN_IF_ERROR(check_per_replica(*this, values[k].values(), "batch_reduce_to"));
      std::vector<Tensor> dst;
      for (size_t i = 0; i < values[k].size(); ++i) {
        const Array& v = values[k][i];
        TRIBUTARY_ASSIGN_OR_RETURN(Array out,
                                   Array::zeros(v.dtype(), v.shape(), parts_.devices[i]));
        dst.push_back(out.tensor());
        outs[k].push_back(std::move(out));
      }
      TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Array> placed, place(*this, values[k].values()));
      pairs.push_back(ReducePair{tensors_of(placed), Mirrored<Tensor>(std::move(dst))});
      inputs.push_back(std::move(placed));  // alive until the collective is done
    }
    if (pairs.empty()) return std::vector<Mirrored<Array>>{};
    TRIBUTARY_RETURN_IF_ERROR(wait(parts_.cross_device_ops->batch_reduce(op, pairs)));
    std::vector<Mirrored<Array>> result;
    for (auto& o : outs) result.emplace_back(std::move(o));
    return result;
  }());
}

StatusOr<Mirrored<Array>> Strategy::broadcast_to(const Array& value, const Variable& destination) {
  return told(*this, [&]() -> StatusOr<Mirrored<Array>> {
    TRIBUTARY_RETURN_IF_ERROR(require_cross_replica("broadcast_to"));
    if (!destination.valid())
      return invalid_argument("broadcast_to: the destination variable is empty");
    std::vector<Array> outs;
    std::vector<Tensor> dst;
    for (const Device& d : destination.devices()) {
      TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(value.dtype(), value.shape(), d));
      dst.push_back(out.tensor());
      outs.push_back(std::move(out));
    }
    // The source where the first destination is, as a backend of that device takes it.
    TRIBUTARY_ASSIGN_OR_RETURN(Array source, value.to_device(outs[0].device()));
    TRIBUTARY_RETURN_IF_ERROR(wait(
        parts_.cross_device_ops->broadcast(source.tensor(), Mirrored<Tensor>(std::move(dst)), 0)));
    return Mirrored<Array>(std::move(outs));
  }());
}

}  // namespace tributary
