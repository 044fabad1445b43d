// distribute_dataset / distribute_datasets_from_function and the DistributedIterator
// (input_lib.py, input_util.py).
#include "tributary/strategy/distributed_input.h"

#include "fmt/format.h"
#include "strategy/internal.h"

namespace tributary {

struct DistributedDataset::Pipelines {
  std::vector<Dataset> datasets;  // one per worker (PER_WORKER) or one per local replica
  bool per_replica = false;
  ElementSpec spec;              // per replica
  bool partial_batches = false;  // TF's enable_get_next_as_optional
  bool fetch_to_device = true;   // false: elements stay in host memory (InputOptions)
};

struct DistributedIterator::Impl {
  Strategy* strategy = nullptr;
  std::shared_ptr<const DistributedDataset::Pipelines> pipelines;
  std::vector<std::unique_ptr<DatasetIterator>> iterators;
  std::vector<bool> exhausted;
  bool finished = false;
  // The components of the last real batch seen here (dimension 0 aside): the shape of the
  // zero-size batches once this worker's data runs out, when the element spec does not say it.
  ElementSpec seen;
};

namespace {

bool all_static(const ElementSpec& spec) {
  if (spec.empty()) return false;
  for (const TensorSpec& t : spec) {
    for (int64_t d : t.shape) {
      if (d < 0) return false;
    }
  }
  return true;
}

// A zero-size batch shaped like this step's real batches, else like the element spec (TF's dummy
// tensors: dimension 0 is 0, unknown dimensions are 0 too), else, when map() left the spec
// unknown, like the last real batch this worker saw.
StatusOr<Element> empty_batch(const ElementSpec& spec, const ElementSpec& seen,
                              const std::vector<std::optional<Element>>& step) {
  const Element* real = nullptr;
  for (const auto& e : step) {
    if (e) real = &*e;
  }
  const ElementSpec& known = spec.empty() ? seen : spec;
  if (!real && known.empty()) {
    return failed_precondition(
        "this worker has no data for a step at which other workers do, and the element spec is "
        "unknown (a map() without its output ElementSpec), so it cannot give its replicas "
        "zero-size batches of the right shape: pass the ElementSpec to map()");
  }
  Element out;
  const size_t n = real ? real->size() : known.size();
  for (size_t c = 0; c < n; ++c) {
    Shape shape;
    DType dtype;
    if (real) {
      shape = (*real)[c].shape();
      dtype = (*real)[c].dtype();
    } else {
      shape = known[c].shape;
      dtype = known[c].dtype;
      for (int64_t& d : shape) d = std::max<int64_t>(d, 0);
    }
    if (shape.empty()) {
      return invalid_argument(
          "a distributed dataset's elements must be batches (rank >= 1) to "
          "give an empty batch to a replica without data");
    }
    shape[0] = 0;
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::zeros(dtype, shape));
    out.push_back(std::move(a));
  }
  return out;
}

Status check_options(const InputOptions& o) {
  if (o.place_dataset_on_device && o.replication_mode != InputReplicationMode::kPerReplica) {
    return invalid_argument(
        "When `experimental_place_dataset_on_device` is set for dataset placement, you must also "
        "specify `PER_REPLICA` for the replication mode");
  }
  if (o.place_dataset_on_device && o.fetch_to_device &&
      o.replication_mode == InputReplicationMode::kPerReplica) {
    return invalid_argument(
        "`experimental_place_dataset_on_device` can not be set to True when "
        "experimental_fetch_to_device is True and replication mode is set to `PER_REPLICA`");
  }
  if (o.per_replica_buffer_size < 0) {
    return invalid_argument(
        fmt::format("per_replica_buffer_size must be >= 0, not {}", o.per_replica_buffer_size));
  }
  return ok_status();
}

std::shared_ptr<DistributedDataset::Pipelines> finish(std::vector<Dataset> datasets,
                                                      bool per_replica, const Strategy& s,
                                                      const InputOptions& options) {
  auto p = std::make_shared<DistributedDataset::Pipelines>();
  p->per_replica = per_replica;
  p->fetch_to_device = options.fetch_to_device;
  p->spec = datasets[0].element_spec();
  bool finite = true;
  for (const Dataset& d : datasets) finite = finite && d.cardinality() != kInfiniteCardinality;
  p->partial_batches = finite && (!all_static(p->spec) || s.num_workers() > 1);
  if (p->partial_batches) {
    for (TensorSpec& t : p->spec) {
      if (!t.shape.empty()) t.shape[0] = -1;
    }
  }
  p->datasets = std::move(datasets);
  return p;
}

// Where a replica's elements go: its device, or with fetch_to_device=false host memory (TF: "each
// replica's device becomes the host CPU"; CPU replicas are in host memory already).
Device element_device(const Device& replica, bool fetch_to_device) {
  return fetch_to_device || replica.is_cpu() ? replica : Device::cpu();
}

}  // namespace

StatusOr<int64_t> InputContext::get_per_replica_batch_size(int64_t global_batch_size) const {
  if (num_replicas_in_sync_ <= 0 || global_batch_size % num_replicas_in_sync_ != 0) {
    return invalid_argument(
        fmt::format("The `global_batch_size` {} is not divisible by `num_replicas_in_sync` {} ",
                    global_batch_size, num_replicas_in_sync_));
  }
  return global_batch_size / num_replicas_in_sync_;
}

std::string InputContext::to_string() const {
  return fmt::format("tf.distribute.InputContext(input pipeline id {}, total: {})",
                     input_pipeline_id_, num_input_pipelines_);
}

DistributedDataset::DistributedDataset(Strategy* strategy,
                                       std::shared_ptr<const Pipelines> pipelines)
    : strategy_(strategy), pipelines_(std::move(pipelines)) {}

ElementSpec DistributedDataset::element_spec() const { return pipelines_->spec; }

StatusOr<DistributedIterator> DistributedDataset::make_iterator() const {
  auto impl = std::make_unique<DistributedIterator::Impl>();
  impl->strategy = strategy_;
  impl->pipelines = pipelines_;
  for (const Dataset& d : pipelines_->datasets) {
    TRIBUTARY_ASSIGN_OR_RETURN(auto it, d.make_iterator());
    impl->iterators.push_back(std::move(it));
    impl->exhausted.push_back(false);
  }
  return DistributedIterator(std::move(impl));
}

DistributedIterator::DistributedIterator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DistributedIterator::~DistributedIterator() = default;
DistributedIterator::DistributedIterator(DistributedIterator&&) noexcept = default;
DistributedIterator& DistributedIterator::operator=(DistributedIterator&&) noexcept = default;

const ElementSpec& DistributedIterator::element_spec() const { return impl_->pipelines->spec; }

StatusOr<PerReplica<Element>> DistributedIterator::get_next() {
  TRIBUTARY_ASSIGN_OR_RETURN(std::optional<PerReplica<Element>> next, get_next_as_optional());
  if (!next) return out_of_range("End of sequence: the distributed dataset has no more data");
  return std::move(*next);
}

StatusOr<std::optional<PerReplica<Element>>> DistributedIterator::get_next_as_optional() {
  const auto& t = strategy_internal::thread_context();
  if (t.replica != nullptr && t.merge == nullptr) {
    return invalid_argument(
        "next(iterator) should be called from outside of replica_fn. e.g. "
        "strategy.run(replica_fn, args=(next(iterator),))");
  }
  Impl& m = *impl_;
  if (m.finished) return std::optional<PerReplica<Element>>();
  Strategy& s = *m.strategy;
  const int R = s.num_local_replicas();
  std::vector<std::optional<Element>> step(R);
  Status local_error;
  int with_data = 0;
  for (int i = 0; i < R && local_error.ok(); ++i) {
    const size_t p = m.pipelines->per_replica ? static_cast<size_t>(i) : 0;
    if (m.exhausted[p]) continue;
    StatusOr<std::optional<Element>> e = m.iterators[p]->get_next();
    if (!e.ok()) {
      local_error = e.status();
    } else if (!*e) {
      m.exhausted[p] = true;
    } else {
      step[i] = std::move(**e);
      ++with_data;
    }
  }
  // The zero-size batches for replicas without data, made before the real batches are moved out
  // of `step` and before the workers agree, so that a worker that cannot make them says so there.
  std::optional<Element> empty;
  Status fill_error;
  if (with_data < R && local_error.ok()) {
    StatusOr<Element> e = empty_batch(m.pipelines->spec, m.seen, step);
    if (e.ok())
      empty = std::move(*e);
    else
      fill_error = e.status();
  }
  for (const auto& e : step) {
    if (!e) continue;
    m.seen.clear();
    for (const Array& a : *e) m.seen.push_back(TensorSpec{a.dtype(), a.shape()});
    break;
  }
  int64_t global = with_data;
  if (s.num_workers() > 1 && m.pipelines->partial_batches) {
    // Every worker learns how many replicas anywhere have data, whether a pipeline failed and
    // whether a worker cannot fill its replicas without data, so that all of them end (or fail)
    // at the same step.
    std::vector<Array> in, out;
    for (int i = 0; i < R; ++i) {
      std::vector<int64_t> v = {i == 0 ? with_data : 0, i == 0 && !local_error.ok() ? 1 : 0,
                                i == 0 && !fill_error.ok() ? 1 : 0};
      TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::from_vector(v));
      TRIBUTARY_ASSIGN_OR_RETURN(Array placed, a.to_device(s.worker_devices()[i]));
      TRIBUTARY_ASSIGN_OR_RETURN(Array o,
                                 Array::zeros(DType::kInt64, Shape{3}, s.worker_devices()[i]));
      in.push_back(std::move(placed));
      out.push_back(std::move(o));
    }
    std::vector<Tensor> ti, to;
    for (int i = 0; i < R; ++i) {
      ti.push_back(in[i].tensor());
      to.push_back(out[i].tensor());
    }
    Status agreed = s.cross_device_ops()
                        .all_reduce(ReduceOp::kSum, PerReplica<Tensor>(std::move(ti)),
                                    PerReplica<Tensor>(std::move(to)))
                        .wait();
    if (!agreed.ok()) {
      return agreed.with_context("agreeing across workers on whether the input has data");
    }
    if (!local_error.ok()) return local_error;
    TRIBUTARY_ASSIGN_OR_RETURN(const Array counts, out[0].to_device(Device::cpu()));  // GPU:i too
    const int64_t* count = counts.data<int64_t>();
    if (count[1] > 0) {
      return aborted(
          "the input pipeline failed on another worker (see its log); every worker "
          "stops at this step");
    }
    global = count[0];
    if (global > 0 && fill_error.ok() && count[2] > 0) {
      return failed_precondition(
          "another worker has no data for this step and cannot give its replicas zero-size "
          "batches (see its error); every worker stops at this step");
    }
  } else if (!local_error.ok()) {
    return local_error;
  }
  if (m.pipelines->partial_batches ? global == 0 : with_data < R) {
    m.finished = true;
    return std::optional<PerReplica<Element>>();
  }
  if (!fill_error.ok()) return fill_error;
  std::vector<Element> batches;
  for (int i = 0; i < R; ++i) {
    Element e = step[i] ? std::move(*step[i]) : *empty;
    const Device to = element_device(s.worker_devices()[i], m.pipelines->fetch_to_device);
    for (Array& a : e) {
      TRIBUTARY_ASSIGN_OR_RETURN(a, a.to_device(to));
    }
    batches.push_back(std::move(e));
  }
  return std::optional<PerReplica<Element>>(PerReplica<Element>(std::move(batches)));
}

StatusOr<DistributedDataset> distribute_dataset(Strategy& strategy, const Dataset& dataset,
                                                InputOptions options) {
  TRIBUTARY_RETURN_IF_ERROR(strategy.require_cross_replica("distribute_dataset"));
  TRIBUTARY_RETURN_IF_ERROR(check_options(options));
  if (options.replication_mode == InputReplicationMode::kPerReplica) {
    return unimplemented(
        "InputReplicationMode.PER_REPLICA is only supported in "
        "`distribute_datasets_from_function`.");
  }
  TRIBUTARY_RETURN_IF_ERROR(dataset.status());
  const int R = strategy.num_local_replicas();
  const int W = strategy.num_workers();
  const int N = strategy.num_replicas_in_sync();
  Dataset d = dataset;
  if (N > 1) {
    const int64_t global_batch = d.static_batch_size();
    if (global_batch < 0) {
      return invalid_argument(fmt::format(
          "Call the `batch` method on the input Dataset in order to be able to split your input "
          "across {} replicas.\n Please see the tf.distribute.Strategy guide. (The pipeline: {})",
          N, d.debug_string()));
    }
    d = d.rebatch(batch_sizes_for_worker(global_batch, W, R, strategy.worker_index()));
  }
  if (W > 1) {
    StatusOr<Dataset> sharded =
        auto_shard(d, W, strategy.worker_index(), options.auto_shard_policy);
    if (!sharded.ok()) return sharded.status();
    d = std::move(*sharded);
  }
  if (options.per_replica_buffer_size > 0 && N > 1) {
    d = d.prefetch(static_cast<int64_t>(R) * options.per_replica_buffer_size);
  }
  TRIBUTARY_RETURN_IF_ERROR(d.status());
  return DistributedDataset(&strategy, finish({d}, false, strategy, options));
}

StatusOr<DistributedDataset> distribute_datasets_from_function(
    Strategy& strategy, const std::function<StatusOr<Dataset>(const InputContext&)>& dataset_fn,
    InputOptions options) {
  TRIBUTARY_RETURN_IF_ERROR(strategy.require_cross_replica("distribute_datasets_from_function"));
  TRIBUTARY_RETURN_IF_ERROR(check_options(options));
  std::vector<Dataset> datasets;
  if (options.replication_mode == InputReplicationMode::kPerReplica) {
    if (strategy.kind() != StrategyKind::kMirrored) {
      return unimplemented(fmt::format(
          "InputReplicationMode.PER_REPLICA is only supported by MirroredStrategy, not {}",
          strategy.name()));
    }
    const int R = strategy.num_local_replicas();
    for (int i = 0; i < R; ++i) {
      StatusOr<Dataset> d = dataset_fn(InputContext(R, i, R));
      if (!d.ok()) return d.status().with_context(fmt::format("dataset_fn for replica {}", i));
      TRIBUTARY_RETURN_IF_ERROR(d->status());
      // TF's per-device buffer (OwnedMultiDeviceIterator's max_buffer_size).
      if (options.per_replica_buffer_size > 0 && R > 1) {
        *d = d->prefetch(options.per_replica_buffer_size);
      }
      datasets.push_back(std::move(*d));
    }
    return DistributedDataset(&strategy, finish(std::move(datasets), true, strategy, options));
  }
  InputContext context(strategy.num_workers(), strategy.worker_index(),
                       strategy.num_replicas_in_sync());
  StatusOr<Dataset> d = dataset_fn(context);
  if (!d.ok()) return d.status().with_context("dataset_fn");
  TRIBUTARY_RETURN_IF_ERROR(d->status());
  // Each local replica's buffer, as distribute_dataset's (TF's per-device buffer).
  const int R = strategy.num_local_replicas();
  if (options.per_replica_buffer_size > 0 && strategy.num_replicas_in_sync() > 1) {
    *d = d->prefetch(static_cast<int64_t>(R) * options.per_replica_buffer_size);
  }
  datasets.push_back(std::move(*d));
  return DistributedDataset(&strategy, finish(std::move(datasets), false, strategy, options));
}

}  // namespace tributary
