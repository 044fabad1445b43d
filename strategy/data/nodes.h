// The node graph behind Dataset (internal to strategy/data).
//
// Each Dataset points at a sink Node; a Node knows its inputs and can be cloned with other inputs
// (with_inputs), which is all the graph rewrites (auto_shard) need. Nodes are immutable after
// construction, except for ShuffleNode's count of iterators made, which is atomic.
//
// Errors at build time: the factories below validate their arguments and return an error node (or
// their failed input) instead of failing, so that Dataset chains stay fluent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/status.h"
#include "tributary/strategy/dataset.h"

namespace tributary::data_internal {

class Node;
class FileReaderNode;
using NodePtr = std::shared_ptr<const Node>;

class Node {
 public:
  explicit Node(std::vector<NodePtr> inputs = {}) : inputs_(std::move(inputs)) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::vector<NodePtr>& inputs() const { return inputs_; }
  const NodePtr& input() const { return inputs_.at(0); }

  // TF's op name ("BatchDataset"), used in messages and debug_string().
  virtual std::string name() const = 0;
  // Arguments for debug_string ("4, drop_remainder=true"); empty by default.
  virtual std::string args() const { return {}; }
  // The same op over other inputs (as many as inputs()).
  virtual NodePtr with_inputs(std::vector<NodePtr> inputs) const = 0;

  virtual Status status() const { return ok_status(); }
  virtual ElementSpec element_spec() const = 0;
  virtual int64_t cardinality() const = 0;
  virtual StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const = 0;

  // How compute_batch_size (static_batch_size) treats this node.
  enum class BatchRole {
    kOpaque,       // stop: the batch size cannot be inferred through this op
    kPassThrough,  // keeps its input's batch size (map, prefetch, shuffle, repeat, take, shard)
    kBatch,        // sets it to batch_size()
    kEveryInput,   // the batch size all of its inputs agree on (zip, concatenate)
  };
  virtual BatchRole batch_role() const { return BatchRole::kOpaque; }
  virtual int64_t batch_size() const { return -1; }

  // auto_shard hooks.
  virtual const FileReaderNode* as_file_reader() const { return nullptr; }
  virtual bool is_prefetch() const { return false; }
  // What DATA sharding replaces this node with (RebatchDatasetV2 -> legacy RebatchDataset).
  virtual NodePtr for_data_sharding() const { return nullptr; }

 private:
  std::vector<NodePtr> inputs_;
};

// A source that reads a list of files, which FILE sharding can split.
class FileReaderNode : public Node {
 public:
  explicit FileReaderNode(std::vector<std::string> files) : files_(std::move(files)) {}
  const std::vector<std::string>& files() const { return files_; }
  virtual NodePtr with_files(std::vector<std::string> files) const = 0;
  NodePtr with_inputs(std::vector<NodePtr> inputs) const override;
  int64_t cardinality() const override { return kUnknownCardinality; }
  std::string args() const override;

 private:
  std::vector<std::string> files_;
};

// Gives iterators TF's end and error behaviour: once next() has returned nullopt or an error,
// get_next() repeats that without calling next() again.
class IteratorBase : public DatasetIterator {
 public:
  StatusOr<std::optional<Element>> get_next() final;

 protected:
  virtual StatusOr<std::optional<Element>> next() = 0;

 private:
  Status error_;
  bool done_ = false;
};

struct DatasetAccess {
  static Dataset wrap(NodePtr node) { return Dataset(std::move(node)); }
  static const NodePtr& node(const Dataset& dataset) { return dataset.node_; }
};

// A node whose status() is `status` (not OK) and whose iterator returns it.
NodePtr error_node(Status status);
// An InvalidArgument error node. Messages are TF's texts verbatim (no op-name prefix), so that
// users can search for them.
inline NodePtr invalid(std::string message) {
  return error_node(invalid_argument(std::move(message)));
}

// Factories (sources.cc, transforms.cc, compose.cc, prefetch.cc, rebatch.cc, files.cc, csv.cc).
NodePtr tensor_slices_node(std::vector<Array> components);
NodePtr tensors_node(std::vector<Array> components);
NodePtr range_node(int64_t start, int64_t stop, int64_t step);
NodePtr tfrecord_node(std::vector<std::string> files);
NodePtr fixed_length_node(std::vector<std::string> files, int64_t record_bytes,
                          int64_t header_bytes, int64_t footer_bytes);
NodePtr generator_node(std::function<StatusOr<Generator>()> make, ElementSpec output_spec);
NodePtr csv_node(std::vector<std::string> files, std::vector<DType> column_types, bool header);

NodePtr batch_node(NodePtr input, int64_t batch_size, bool drop_remainder);
NodePtr repeat_node(NodePtr input, int64_t count);
NodePtr shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle);
NodePtr shard_node(NodePtr input, int64_t num_shards, int64_t index);
NodePtr map_node(NodePtr input, MapFn fn, std::optional<ElementSpec> output_spec);
NodePtr take_node(NodePtr input, int64_t count);
NodePtr prefetch_node(NodePtr input, int64_t buffer_size);
NodePtr rebatch_node(NodePtr input, std::vector<int64_t> batch_sizes, bool drop_remainder);
NodePtr legacy_rebatch_node(NodePtr input, int64_t num_replicas);
NodePtr skip_node(NodePtr input, int64_t count);
NodePtr filter_node(NodePtr input, FilterFn predicate);
NodePtr unbatch_node(NodePtr input);
NodePtr padded_batch_node(NodePtr input, int64_t batch_size,
                          std::optional<std::vector<Shape>> padded_shapes,
                          std::vector<double> padding_values, bool drop_remainder);
NodePtr zip_node(std::vector<NodePtr> inputs);
NodePtr concatenate_node(NodePtr first, NodePtr second);

// An element checked against a declared spec (map's output_spec, from_generator's): `what`
// starts the message ("the map function returned"), `spec_name` names the declaration.
Status check_against_spec(const Element& out, const ElementSpec& spec, std::string_view what,
                          std::string_view spec_name);

// TF's ComputeBatchSize from `sink` through the graph (Dataset::static_batch_size's walk).
int64_t batch_size_from(const Node& sink);

// Shared helpers.
std::string shape_or_none(const Shape& shape);  // "(None, 3)"
// The spec of `element` (for sources that know their elements).
ElementSpec spec_of(const Element& element);
// Elements [begin, end) of dimension 0 of every component.
StatusOr<Element> slice_rows(const Element& element, int64_t begin, int64_t end);

}  // namespace tributary::data_internal
