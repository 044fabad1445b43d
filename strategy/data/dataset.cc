// Dataset's front door: each method forwards to a node factory (which validates), plus the pieces
// shared by every node (specs, error nodes, the sticky iterator base) and compute_batch_size.
#include "tributary/strategy/dataset.h"

#include <cxxabi.h>

#include <exception>
#include <string>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary {

using data_internal::DatasetAccess;
using data_internal::Node;
using data_internal::NodePtr;

namespace data_internal {

namespace {

class ErrorNode final : public Node {
 public:
  explicit ErrorNode(Status status) : status_(std::move(status)) {}
  std::string name() const override { return "ErrorDataset"; }
  std::string args() const override { return status_.to_string(); }
  NodePtr with_inputs(std::vector<NodePtr>) const override { return error_node(status_); }
  Status status() const override { return status_; }
  ElementSpec element_spec() const override { return {}; }
  int64_t cardinality() const override { return kUnknownCardinality; }
  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      explicit It(Status s) : s_(std::move(s)) {}
      StatusOr<std::optional<Element>> next() override { return s_; }

     private:
      Status s_;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(status_));
  }

 private:
  Status status_;
};

}  // namespace

NodePtr error_node(Status status) {
  if (status.ok()) status = internal_error("error_node made from an OK status");
  return std::make_shared<ErrorNode>(std::move(status));
}

StatusOr<std::optional<Element>> IteratorBase::get_next() {
  if (!error_.ok()) return error_;
  if (done_) return std::optional<Element>();
  // User code below (a map function, a dataset function) may throw: an error in the stream, as
  // TF's, not an exception through the pipeline, and one that stays (the next call repeats it).
  StatusOr<std::optional<Element>> r = std::optional<Element>();
  try {
    r = next();
  } catch (const std::exception& e) {
    r = internal_error(std::string("the input pipeline threw: ") + e.what());
  } catch (abi::__forced_unwind&) {
    throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
  } catch (...) {
    r = internal_error("the input pipeline threw a non-standard exception");
  }
  if (!r.ok()) {
    error_ = r.status();
  } else if (!r->has_value()) {
    done_ = true;
  }
  return r;
}

NodePtr FileReaderNode::with_inputs(std::vector<NodePtr>) const { return with_files(files_); }

std::string FileReaderNode::args() const {
  std::string s = std::to_string(files_.size()) + " file(s)";
  if (!files_.empty()) s += ": " + files_[0] + (files_.size() > 1 ? ", ..." : "");
  return s;
}

std::string shape_or_none(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? "None" : std::to_string(shape[i]);
  }
  // Python prints a 1-tuple as "(3,)".
  if (shape.size() == 1) s += ",";
  return s + ")";
}

ElementSpec spec_of(const Element& element) {
  ElementSpec spec;
  spec.reserve(element.size());
  for (const Array& a : element) spec.push_back({a.dtype(), a.shape()});
  return spec;
}

StatusOr<Element> slice_rows(const Element& element, int64_t begin, int64_t end) {
  Element out;
  out.reserve(element.size());
  for (const Array& a : element) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array r, a.rows(begin, end));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace data_internal

std::string TensorSpec::to_string() const {
  return "TensorSpec(shape=" + data_internal::shape_or_none(shape) +
         ", dtype=" + std::string(dtype_name(dtype)) + ")";
}

std::string element_spec_to_string(const ElementSpec& spec) {
  if (spec.empty()) return "<unknown>";
  if (spec.size() == 1) return spec[0].to_string();
  std::string s = "(";
  for (size_t i = 0; i < spec.size(); ++i) s += (i ? ", " : "") + spec[i].to_string();
  return s + ")";
}

DatasetIterator::~DatasetIterator() = default;

Dataset::Dataset()
    : node_(data_internal::error_node(
          failed_precondition("this Dataset was default-constructed and has no source; build "
                              "one with Dataset::range, from_tensor_slices, tfrecord, ..."))) {}

Dataset::Dataset(NodePtr node) : node_(std::move(node)) {}

Dataset Dataset::from_tensor_slices(std::vector<Array> components) {
  return Dataset(data_internal::tensor_slices_node(std::move(components)));
}
Dataset Dataset::from_generator(std::function<StatusOr<Generator>()> make,
                                ElementSpec output_spec) {
  return Dataset(data_internal::generator_node(std::move(make), std::move(output_spec)));
}
Dataset Dataset::from_tensors(std::vector<Array> components) {
  return Dataset(data_internal::tensors_node(std::move(components)));
}
Dataset Dataset::range(int64_t stop) { return range(0, stop, 1); }
Dataset Dataset::range(int64_t start, int64_t stop, int64_t step) {
  return Dataset(data_internal::range_node(start, stop, step));
}
Dataset Dataset::tfrecord(std::vector<std::string> files) {
  return Dataset(data_internal::tfrecord_node(std::move(files)));
}
Dataset Dataset::fixed_length_records(std::vector<std::string> files, int64_t record_bytes,
                                      int64_t header_bytes, int64_t footer_bytes) {
  return Dataset(
      data_internal::fixed_length_node(std::move(files), record_bytes, header_bytes, footer_bytes));
}
Dataset Dataset::csv(std::vector<std::string> files, std::vector<DType> column_types, bool header) {
  return Dataset(data_internal::csv_node(std::move(files), std::move(column_types), header));
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  return Dataset(data_internal::batch_node(node_, batch_size, drop_remainder));
}
Dataset Dataset::repeat(int64_t count) const {
  return Dataset(data_internal::repeat_node(node_, count));
}
Dataset Dataset::shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration) const {
  return Dataset(data_internal::shuffle_node(node_, buffer_size, seed, reshuffle_each_iteration));
}
Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  return Dataset(data_internal::shard_node(node_, num_shards, index));
}
Dataset Dataset::map(MapFn fn, std::optional<ElementSpec> output_spec) const {
  return Dataset(data_internal::map_node(node_, std::move(fn), std::move(output_spec)));
}
Dataset Dataset::skip(int64_t count) const {
  return Dataset(data_internal::skip_node(node_, count));
}
Dataset Dataset::filter(FilterFn predicate) const {
  return Dataset(data_internal::filter_node(node_, std::move(predicate)));
}
Dataset Dataset::unbatch() const { return Dataset(data_internal::unbatch_node(node_)); }
Dataset Dataset::padded_batch(int64_t batch_size, std::optional<std::vector<Shape>> padded_shapes,
                              std::vector<double> padding_values, bool drop_remainder) const {
  return Dataset(data_internal::padded_batch_node(node_, batch_size, std::move(padded_shapes),
                                                  std::move(padding_values), drop_remainder));
}
Dataset Dataset::concatenate(const Dataset& other) const {
  return Dataset(data_internal::concatenate_node(node_, other.node_));
}
Dataset Dataset::zip(std::vector<Dataset> datasets) {
  std::vector<NodePtr> nodes;
  for (Dataset& d : datasets) nodes.push_back(std::move(d.node_));
  return Dataset(data_internal::zip_node(std::move(nodes)));
}
Dataset Dataset::take(int64_t count) const {
  return Dataset(data_internal::take_node(node_, count));
}
Dataset Dataset::prefetch(int64_t buffer_size) const {
  return Dataset(data_internal::prefetch_node(node_, buffer_size));
}
Dataset Dataset::rebatch(std::vector<int64_t> batch_sizes, bool drop_remainder) const {
  return Dataset(data_internal::rebatch_node(node_, std::move(batch_sizes), drop_remainder));
}
Dataset Dataset::legacy_rebatch(int64_t num_replicas) const {
  return Dataset(data_internal::legacy_rebatch_node(node_, num_replicas));
}

Status Dataset::status() const { return node_->status(); }
ElementSpec Dataset::element_spec() const { return node_->element_spec(); }
int64_t Dataset::cardinality() const { return node_->cardinality(); }

int64_t Dataset::static_batch_size() const {
  // TF first trusts the element spec: when every component has a known, equal dimension 0 that is
  // the answer (even for data that was never batched, e.g. from_tensors of a [8, 3] array).
  const ElementSpec spec = element_spec();
  bool all_known = !spec.empty();
  for (const TensorSpec& t : spec) all_known = all_known && !t.shape.empty() && t.shape[0] >= 0;
  if (all_known) {
    for (const TensorSpec& t : spec) {
      if (t.shape[0] != spec[0].shape[0]) return -1;
    }
    return spec[0].shape[0];
  }
  // Otherwise TF's ComputeBatchSize walks the graph from the sink to the first batch.
  return data_internal::batch_size_from(*node_);
}

namespace data_internal {

Status check_against_spec(const Element& out, const ElementSpec& spec, std::string_view what,
                          std::string_view spec_name) {
  auto shape_text = [](const Shape& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); ++i) {
      t += (i ? ", " : "") + (s[i] < 0 ? std::string("None") : std::to_string(s[i]));
    }
    return t + (s.size() == 1 ? ",)" : ")");
  };
  bool match = out.size() == spec.size();
  for (size_t c = 0; match && c < out.size(); ++c) {
    const Shape& want = spec[c].shape;
    const Shape& got = out[c].shape();
    match = out[c].dtype() == spec[c].dtype && got.size() == want.size();
    for (size_t d = 0; match && d < want.size(); ++d) match = want[d] < 0 || want[d] == got[d];
  }
  if (match) return ok_status();
  std::string got = "(", want = "(";
  for (size_t c = 0; c < out.size(); ++c) {
    got += (c ? ", " : "") + std::string(dtype_name(out[c].dtype())) + " " +
           shape_text(out[c].shape());
  }
  for (size_t c = 0; c < spec.size(); ++c) {
    want +=
        (c ? ", " : "") + std::string(dtype_name(spec[c].dtype)) + " " + shape_text(spec[c].shape);
  }
  return invalid_argument(std::string(what) + " " + got + ") where its " + std::string(spec_name) +
                          " declares " + want + "); fix the function or the spec");
}

int64_t batch_size_from(const Node& sink) {
  for (const Node* n = &sink; n != nullptr;) {
    switch (n->batch_role()) {
      case Node::BatchRole::kBatch:
        return n->batch_size();
      case Node::BatchRole::kOpaque:
        return -1;
      case Node::BatchRole::kPassThrough:
        n = n->inputs().size() == 1 ? n->input().get() : nullptr;
        break;
      case Node::BatchRole::kEveryInput: {
        // TF's multi-input ops (zip, concatenate): the batch size every input agrees on.
        int64_t common = -1;
        for (size_t i = 0; i < n->inputs().size(); ++i) {
          const int64_t b = batch_size_from(*n->inputs()[i]);
          if (b < 0 || (i > 0 && b != common)) return -1;
          common = b;
        }
        return common;
      }
    }
  }
  return -1;
}

}  // namespace data_internal

std::string Dataset::debug_string() const {
  std::string s;
  for (const Node* n = node_.get(); n != nullptr;) {
    if (!s.empty()) s += " <- ";
    s += n->name();
    if (std::string a = n->args(); !a.empty()) s += "(" + a + ")";
    n = n->inputs().empty() ? nullptr : n->inputs()[0].get();
  }
  return s;
}

StatusOr<std::unique_ptr<DatasetIterator>> Dataset::make_iterator() const {
  return node_->make_iterator();
}

std::vector<int64_t> batch_sizes_for_worker(int64_t global_batch, int num_workers,
                                            int replicas_per_worker, int worker_index) {
  const int64_t n = static_cast<int64_t>(num_workers) * replicas_per_worker;
  if (n <= 0 || global_batch < 0 || worker_index < 0 || worker_index >= num_workers) return {};
  const int64_t floor = global_batch / n;
  const int64_t num_ceil = global_batch - n * floor;
  std::vector<int64_t> worker0(static_cast<size_t>(n), floor);
  for (int64_t i = 0; i < num_ceil; ++i) worker0[static_cast<size_t>(i)] = floor + 1;
  // Rotating by w*R makes worker w's first replica continue where worker w-1's last one stopped,
  // so each global step hands out every "ceil" share exactly once.
  const int64_t shift = static_cast<int64_t>(worker_index) * replicas_per_worker % n;
  std::vector<int64_t> out;
  out.reserve(worker0.size());
  for (int64_t i = 0; i < n; ++i) out.push_back(worker0[static_cast<size_t>((i + shift) % n)]);
  return out;
}

}  // namespace tributary
