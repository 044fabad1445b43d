// Distributed input: a Dataset split across a strategy's replicas and workers (tf.distribute's
// experimental_distribute_dataset / distribute_datasets_from_function, input_lib.py).
//
// distribute_dataset(strategy, dataset): `dataset` is batched by the GLOBAL batch size. With more
// than one replica in sync it is rebatched with TF's current rule, RebatchDatasetV2 (
// batch_sizes_for_worker: per-replica sizes differ by at most one, element order is preserved, and
// each step's per-replica batches add up to the global batch), then auto-sharded across workers by
// options.auto_shard_policy (AUTO: by file when the source is a file reader, else by data; DATA
// rewrites the rebatch to TF's legacy rule, as TF does; fewer files than workers under FILE is
// TF's error). A dataset without a batch() it can find is TF's error. Within a worker, replica i
// gets the worker's elements i, i+R, i+2R, ... (R local replicas).
//
// distribute_datasets_from_function(strategy, fn): `fn(InputContext)` builds each input pipeline,
// batched by the PER-REPLICA batch size; no rebatching or sharding (shard with the context).
// PER_WORKER: one pipeline per worker, context (num_workers, worker_index, num_replicas_in_sync).
// PER_REPLICA (single-worker strategies only): one pipeline per replica, context (R, i, R).
//
// DistributedIterator::get_next() returns one batch per local replica, or kOutOfRange at the end of
// data (a distinct status; the loop ends there). Partial batches: when the data ends mid-step,
// replicas without data get zero-size batches (dimension 0 of every component is 0) while any
// replica anywhere still has data; in multi-worker runs the workers agree on that with an
// all-reduce of "how many replicas have data" each step (so every worker must call get_next the
// same number of times, as TF requires), which means a worker that ran out keeps producing empty
// batches until every worker has, and no worker hangs on an uneven last batch. As in TF this is
// on when the dataset's size is finite and (its shapes are not all static or there are several
// workers); otherwise a step that cannot give every replica a batch ends the data. The zero-size
// batches take their shapes from a real batch of the same step, else the element spec, else (a
// map() without its output ElementSpec) the last batch this worker saw; a worker with none of these
// (no data from the start and a map() without its output ElementSpec) fails the step on every
// worker with kFailedPrecondition, saying so. Both APIs buffer per_replica_buffer_size elements per
// local replica (TF's per-device buffer; 0: none) when more than one replica is in sync.
// get_next() from inside run() is TF's error. An iterator is used by one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/dataset.h"
#include "tributary/strategy/strategy.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class InputReplicationMode { kPerWorker, kPerReplica };

// TF's tf.distribute.InputOptions, plus the auto-shard policy TF sets through tf.data.Options.
struct InputOptions {
  // TF's experimental_fetch_to_device: true puts each replica's elements on its device; false
  // keeps them in host memory (CPU arrays, also for GPU replicas). CPU replicas are in host
  // memory either way.
  bool fetch_to_device = true;
  InputReplicationMode replication_mode = InputReplicationMode::kPerWorker;
  bool place_dataset_on_device = false;
  int per_replica_buffer_size = 1;  // elements prefetched per replica (0: no prefetch)
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
};

// TF's tf.distribute.InputContext.
class InputContext {
 public:
  InputContext(int num_input_pipelines = 1, int input_pipeline_id = 0, int num_replicas_in_sync = 1)
      : num_input_pipelines_(num_input_pipelines),
        input_pipeline_id_(input_pipeline_id),
        num_replicas_in_sync_(num_replicas_in_sync) {}
  int num_input_pipelines() const { return num_input_pipelines_; }
  int input_pipeline_id() const { return input_pipeline_id_; }
  int num_replicas_in_sync() const { return num_replicas_in_sync_; }
  // global_batch_size / num_replicas_in_sync; TF's error when it does not divide.
  StatusOr<int64_t> get_per_replica_batch_size(int64_t global_batch_size) const;
  // "tf.distribute.InputContext(input pipeline id 0, total: 2)"
  std::string to_string() const;

 private:
  int num_input_pipelines_, input_pipeline_id_, num_replicas_in_sync_;
};

class DistributedIterator {
 public:
  ~DistributedIterator();
  DistributedIterator(DistributedIterator&&) noexcept;
  DistributedIterator& operator=(DistributedIterator&&) noexcept;

  // One batch per local replica, or kOutOfRange at the end of data.
  StatusOr<PerReplica<Element>> get_next();
  // nullopt at the end of data (TF's get_next_as_optional).
  StatusOr<std::optional<PerReplica<Element>>> get_next_as_optional();
  // The per-replica element spec (dimension 0 is -1 when batches may be partial).
  const ElementSpec& element_spec() const;

  struct Impl;
  explicit DistributedIterator(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

class DistributedDataset {
 public:
  // A new iterator from the start (one per epoch).
  StatusOr<DistributedIterator> make_iterator() const;
  ElementSpec element_spec() const;
  Strategy& strategy() const { return *strategy_; }

  struct Pipelines;  // what each local pipeline reads
  DistributedDataset(Strategy* strategy, std::shared_ptr<const Pipelines> pipelines);

 private:
  Strategy* strategy_;
  std::shared_ptr<const Pipelines> pipelines_;
};

StatusOr<DistributedDataset> distribute_dataset(Strategy& strategy, const Dataset& dataset,
                                                InputOptions options = {});
StatusOr<DistributedDataset> distribute_datasets_from_function(
    Strategy& strategy, const std::function<StatusOr<Dataset>(const InputContext&)>& dataset_fn,
    InputOptions options = {});

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
