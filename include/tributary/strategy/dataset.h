// Dataset: a tf.data-like input pipeline for the strategy layer, with TensorFlow's rules for
// batching, rebatching across replicas (RebatchDatasetV2 and the legacy RebatchDataset) and
// auto-sharding across workers (AutoShardPolicy).
//
// Contract:
//  * A Dataset is an immutable description of a pipeline (a shared graph of nodes); copies are
//    cheap and share the graph. Building never fails loudly: a transformation given a bad argument
//    (or applied to a failed Dataset) returns a Dataset whose status() is the error, so chains stay
//    fluent; its iterator's first get_next() returns that error.
//  * Work happens in iterators. Files are opened and read lazily, map functions run, and prefetch
//    threads start when an iterator is made. Each iterator is independent (one per epoch or per
//    consumer) and is used by one thread at a time; a Dataset may be shared by many threads.
//  * get_next() returns an element, std::nullopt at the end of data, or an error. After the end it
//    keeps returning nullopt; after an error it keeps returning that error.
//  * End of data, two spellings on purpose, as in TF: DatasetIterator is the pipeline's own
//    interface (every source and transformation implements it, and each one meets the end of its
//    input on every epoch), so the end is a value, nullopt, never an error to be told apart from
//    real ones. The strategy-facing iterators follow TF's Python API:
//    DistributedIterator::get_next() and WorkerContext::next() (parameter_server.h) return
//    kOutOfRange at the end, as TF raises OutOfRangeError, which ends a step on every replica or a
//    scheduled function with a status that says why; DistributedIterator::get_next_as_optional()
//    gives nullopt, TF's get_next_as_optional(). So: a plain Dataset's iterator ends with nullopt;
//    a distributed or per-worker one ends with OutOfRange unless you ask for the optional.
//  * Elements are tuples of CPU Arrays that share storage with whatever produced them; treat them
//    as immutable (as Array says).
//  * element_spec() may hold -1 for a dimension that is not known statically (TF's None). It is
//    empty when the structure is unknown: after map() without an output spec, or for a failed
//    Dataset.
//  * Destroying an iterator stops its prefetch threads; it waits at most for the element each of
//    them is producing at that moment (chained prefetches stop in turn, the last first).
//  * A user function that throws (a map function, say) is an error in the stream, kInternal with
//    the exception's text, repeated by every later get_next(), as TF turns a Python exception
//    into an error; nothing throws out of get_next().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

namespace data_internal {
class Node;
struct DatasetAccess;
}  // namespace data_internal

// One element: a tuple of components.
using Element = std::vector<Array>;

// The static type of one component; -1 in `shape` is an unknown dimension.
struct TensorSpec {
  DType dtype = DType::kFloat32;
  Shape shape;
  // "TensorSpec(shape=(None, 3), dtype=float32)", as TF prints it.
  std::string to_string() const;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};
using ElementSpec = std::vector<TensorSpec>;
// "(TensorSpec(...), TensorSpec(...))"; "<unknown>" for an empty spec.
std::string element_spec_to_string(const ElementSpec& spec);

// TF's cardinality constants (tf.data.INFINITE_CARDINALITY / UNKNOWN_CARDINALITY).
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;
// prefetch(kAutotune) picks the buffer size itself (TF's tf.data.AUTOTUNE).
inline constexpr int64_t kAutotune = -1;

class DatasetIterator {
 public:
  virtual ~DatasetIterator();
  virtual StatusOr<std::optional<Element>> get_next() = 0;
};

using MapFn = std::function<StatusOr<Element>(Element)>;
using FilterFn = std::function<StatusOr<bool>(const Element&)>;
// One element per call, nullopt at the end (from_generator).
using Generator = std::function<StatusOr<std::optional<Element>>()>;

class Dataset {
 public:
  // A Dataset with no source: its status() is FailedPrecondition.
  Dataset();

  // --- sources -------------------------------------------------------------------------------
  // One element per row of dimension 0 (which all components must share; scalars are an error).
  static Dataset from_tensor_slices(std::vector<Array> components);
  // The single element `components`.
  static Dataset from_tensors(std::vector<Array> components);
  // int64 scalars start, start+step, ... up to (excluding) stop; step must not be 0.
  static Dataset range(int64_t stop);
  static Dataset range(int64_t start, int64_t stop, int64_t step = 1);
  // Elements from a generator (TF's from_generator): each iterator calls `make` for a fresh
  // generator (so every epoch starts over), then calls that for each element until it returns
  // nullopt. Its errors and exceptions surface in get_next, as map's. `output_spec` declares the
  // elements (each one is checked against it; empty: unknown, nothing checked). The cardinality is
  // unknown, and the source cannot be sharded by file (AUTO shards it by data).
  static Dataset from_generator(std::function<StatusOr<Generator>()> make,
                                ElementSpec output_spec = {});
  // One uint8 [n] element per TFRecord record; both CRCs of each record are checked (DataLoss on a
  // mismatch or a truncated record, naming the file and byte offset).
  static Dataset tfrecord(std::vector<std::string> files);
  // uint8 [record_bytes] elements; each file is header, records, footer. A body that is not a
  // multiple of record_bytes is an error.
  static Dataset fixed_length_records(std::vector<std::string> files, int64_t record_bytes,
                                      int64_t header_bytes = 0, int64_t footer_bytes = 0);
  // One scalar per column, parsed as column_types[i]; blank lines are skipped; fields may be quoted
  // ("a ""b"""). A wrong field count or an unparsable field is an error naming file:line.
  static Dataset csv(std::vector<std::string> files, std::vector<DType> column_types,
                     bool header = false);

  // --- transformations -----------------------------------------------------------------------
  // Stacks n consecutive elements (the last batch may be smaller unless drop_remainder).
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // count < 0: forever. As TF, an input whose first epoch is empty ends the sequence (repeated
  // forever it would spin); for a count too, where TF runs through the count's empty epochs.
  // Later empty epochs do not end it (TF's rule): a file source that becomes empty after its
  // first epoch, repeated forever, reopens its files forever.
  Dataset repeat(int64_t count = -1) const;
  // TF's buffered shuffle; the order is a function of seed and of how many iterators this Dataset
  // (or a copy) has made before, unless reshuffle_each_iteration is false.
  Dataset shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration = true) const;
  // Elements whose position p satisfies p % num_shards == index.
  Dataset shard(int64_t num_shards, int64_t index) const;
  // `fn` runs in get_next (on the prefetch thread when a prefetch follows); its errors surface
  // there. `output_spec` declares what fn returns (each element is checked against it: a
  // different number of components, dtype, rank or known dimension is kInvalidArgument); without
  // it, or with an empty one, element_spec() becomes unknown.
  Dataset map(MapFn fn, std::optional<ElementSpec> output_spec = std::nullopt) const;
  // The first `count` elements (count < 0: all).
  Dataset take(int64_t count) const;
  // Every element after the first `count` (count < 0: none, as TF's skip(-1)).
  Dataset skip(int64_t count) const;
  // The elements for which `predicate` returns true (it runs as map's function does; its errors
  // and exceptions surface in get_next). The cardinality becomes unknown, as TF's.
  Dataset filter(FilterFn predicate) const;
  // One element per row of dimension 0 (TF's unbatch): every component must have rank >= 1 and
  // the same size there ("Input element must have the same batch size in each component...").
  Dataset unbatch() const;
  // batch() for elements whose shapes differ (TF's padded_batch): component c of every element is
  // padded at the end of each dimension to padded_shapes[c] (-1: the longest in the batch), with
  // padding_values[c] (0 when empty). Without padded_shapes every dimension pads to the longest
  // in the batch (TF's default; the element spec must then be known). An element larger than its
  // padded shape is TF's "Attempted to pad to a smaller size than the input element".
  Dataset padded_batch(int64_t batch_size,
                       std::optional<std::vector<Shape>> padded_shapes = std::nullopt,
                       std::vector<double> padding_values = {}, bool drop_remainder = false) const;
  // This Dataset's elements, then `other`'s (opened when this one ends). The element specs must
  // agree in components and dtypes (TF's "Incompatible dataset elements"); dimensions that differ
  // become unknown, and ranks that differ make the whole spec unknown (TF: an unknown rank).
  Dataset concatenate(const Dataset& other) const;
  // Element k of every input side by side (TF's zip; the components are flattened into one
  // tuple, in order): it ends with the shortest input.
  static Dataset zip(std::vector<Dataset> datasets);
  // A background thread keeps up to buffer_size elements ready (0: no thread; kAutotune: 2).
  Dataset prefetch(int64_t buffer_size) const;
  // TF's RebatchDatasetV2: output i takes the next batch_sizes[i % size] rows, spanning input
  // batches; a final non-empty partial batch is kept unless drop_remainder; a size of 0 gives an
  // empty batch.
  Dataset rebatch(std::vector<int64_t> batch_sizes, bool drop_remainder = false) const;
  // TF's legacy RebatchDataset: each input batch of b rows becomes num_replicas slices of
  // ceil(b / num_replicas) rows (the last ones may be short or empty).
  Dataset legacy_rebatch(int64_t num_replicas) const;

  // --- introspection -------------------------------------------------------------------------
  Status status() const;
  ElementSpec element_spec() const;
  // Number of elements, kInfiniteCardinality, or kUnknownCardinality (TF's rules: file sources
  // and rebatch() are unknown, and so is a failed Dataset; a range up to INT64_MAX, empty or not,
  // is infinite, as TF's enumerate() relies on).
  int64_t cardinality() const;
  // TF's compute_batch_size: the common static dimension 0 of the element spec when every
  // component has one, else the size of the first batch() or padded_batch() reached from the end
  // through map/filter/prefetch/shuffle/repeat/take/skip/shard (through zip and concatenate, the
  // size all of their inputs agree on); -1 when there is none or another op is in the way.
  int64_t static_batch_size() const;
  // The pipeline as text, sink first ("PrefetchDataset <- BatchDataset(4) <- RangeDataset").
  std::string debug_string() const;
  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const;

 private:
  friend struct data_internal::DatasetAccess;
  explicit Dataset(std::shared_ptr<const data_internal::Node> node);
  std::shared_ptr<const data_internal::Node> node_;
};

// Writes `records` as a TFRecord file (with both CRCs), replacing `path`.
Status write_tfrecord(const std::string& path, std::span<const std::string> records);

// TF's batch_sizes_for_worker: the per-replica batch sizes RebatchDatasetV2 cycles through on
// worker `worker_index` so that every global step consumes exactly global_batch rows, sizes differ
// by at most one, and consecutive workers continue where the previous one stopped. Empty when the
// arguments make no sense (no replicas, a negative batch, worker_index out of range).
std::vector<int64_t> batch_sizes_for_worker(int64_t global_batch, int num_workers,
                                            int replicas_per_worker, int worker_index);

// tf.data.experimental.AutoShardPolicy (HINT is not supported).
enum class AutoShardPolicy { kOff = -1, kAuto = 0, kFile = 1, kData = 2 };

// TF's auto-shard rewrite for worker `worker_index` of `num_workers`:
//  * kOff, or one worker: `dataset` unchanged.
//  * kFile: the file reader reached from the end through single-input ops reads files
//    [worker_index::num_workers]. Fewer files than workers: InvalidArgument. A range /
//    from_tensors / from_tensor_slices source: NotFound ("Found an unshardable source dataset").
//  * kData: shard(num_workers, worker_index) at the end, before trailing prefetches; a rebatch()
//    right there becomes legacy_rebatch(batch_sizes.size()), as TF does, since RebatchDatasetV2's
//    spanning batches do not survive sharding by element.
//  * kAuto: kFile, falling back to kData when FILE gives NotFound.
StatusOr<Dataset> auto_shard(const Dataset& dataset, int num_workers, int worker_index,
                             AutoShardPolicy policy);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
