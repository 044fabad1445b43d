// Rebatching for replicas: TF's RebatchDatasetV2 (rebatch) and legacy RebatchDataset
// (legacy_rebatch), from tensorflow/core/kernels/data/experimental/rebatch_dataset_op.cc.
//
// V2 treats the input as one stream of rows and cuts it into the requested sizes, so an output may
// join the tail of one input batch to the head of the next; this is what keeps every global step
// at exactly the global batch size. V1 cuts each input batch on its own into num_replicas
// near-equal slices and never joins batches.
#include <algorithm>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

int64_t rows_of(const Element& e) { return e.empty() ? 0 : e[0].shape()[0]; }

// Both kernels require batched components that agree on dimension 0.
Status check_batched(const Element& e, const char* scalar_message) {
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i].rank() == 0) return invalid_argument(scalar_message);
  }
  for (size_t i = 1; i < e.size(); ++i) {
    if (e[i].shape()[0] != e[0].shape()[0]) {
      return invalid_argument(
          "Input element must have the same batch size in each component. Component 0 had size " +
          std::to_string(e[0].shape()[0]) + " but component " + std::to_string(i) + " had size " +
          std::to_string(e[i].shape()[0]) + ".");
    }
  }
  return ok_status();
}

constexpr char kV2ScalarMessage[] = "Input element must have a non-scalar value in each component.";
constexpr char kV1ScalarMessage[] =
    "Cannot rebatch dataset: All components must have at least one dimension. Perhaps your input "
    "dataset is not batched?";

// --- RebatchDatasetV2
// -----------------------------------------------------------------------------

class RebatchIterator final : public IteratorBase {
 public:
  RebatchIterator(std::unique_ptr<DatasetIterator> in, std::vector<int64_t> sizes, bool drop,
                  ElementSpec spec)
      : in_(std::move(in)), sizes_(std::move(sizes)), drop_(drop), spec_(std::move(spec)) {}

  StatusOr<std::optional<Element>> next() override {
    if (input_done_) return std::optional<Element>();
    const int64_t desired = sizes_[index_];
    index_ = (index_ + 1) % sizes_.size();
    if (desired == 0) return empty_batch();

    std::vector<Element> pieces;
    int64_t got = 0;
    while (got < desired) {
      if (!current_) {
        TRIBUTARY_RETURN_IF_ERROR(fetch());
        if (input_done_) break;
      }
      const int64_t rows = rows_of(*current_);
      const int64_t take = std::min(desired - got, rows - offset_);
      if (take > 0) {
        TRIBUTARY_ASSIGN_OR_RETURN(Element piece, slice_rows(*current_, offset_, offset_ + take));
        pieces.push_back(std::move(piece));
        got += take;
        offset_ += take;
      }
      if (offset_ == rows) current_.reset();
    }
    if (got == 0 || (got < desired && drop_)) return std::optional<Element>();
    if (pieces.size() == 1) return std::optional<Element>(std::move(pieces[0]));
    Element out;
    for (size_t c = 0; c < pieces[0].size(); ++c) {
      std::vector<Array> parts;
      for (const Element& p : pieces) parts.push_back(p[c]);
      TRIBUTARY_ASSIGN_OR_RETURN(Array joined, concat(parts, 0));
      out.push_back(std::move(joined));
    }
    return std::optional<Element>(std::move(out));
  }

 private:
  Status fetch() {
    TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
    if (!e) {
      input_done_ = true;
      return ok_status();
    }
    TRIBUTARY_RETURN_IF_ERROR(check_batched(*e, kV2ScalarMessage));
    template_ = *e;
    current_ = std::move(e);
    offset_ = 0;
    return ok_status();
  }

  // A requested size of 0 gives zero rows of each component. Shapes come from the last input
  // batch seen, else from the static spec (unknown dimensions become 0, as TF does); when neither
  // is known the next input batch is read early to learn them.
  StatusOr<std::optional<Element>> empty_batch() {
    if (!template_ && spec_.empty()) {
      TRIBUTARY_RETURN_IF_ERROR(fetch());
      if (input_done_) return std::optional<Element>();
    }
    Element out;
    if (template_) {
      for (const Array& a : *template_) {
        TRIBUTARY_ASSIGN_OR_RETURN(Array r, a.rows(0, 0));
        out.push_back(std::move(r));
      }
    } else {
      for (const TensorSpec& t : spec_) {
        if (t.shape.empty()) return invalid_argument(kV2ScalarMessage);
        Shape s = t.shape;
        for (int64_t& d : s) d = std::max<int64_t>(d, 0);
        s[0] = 0;
        TRIBUTARY_ASSIGN_OR_RETURN(Array z, Array::zeros(t.dtype, std::move(s)));
        out.push_back(std::move(z));
      }
    }
    return std::optional<Element>(std::move(out));
  }

  std::unique_ptr<DatasetIterator> in_;
  std::vector<int64_t> sizes_;
  bool drop_;
  ElementSpec spec_;
  size_t index_ = 0;
  std::optional<Element> current_;   // the input batch being cut
  int64_t offset_ = 0;               // rows of current_ already handed out
  std::optional<Element> template_;  // the last input batch, for empty outputs
  bool input_done_ = false;
};

class RebatchNode final : public Node {
 public:
  RebatchNode(NodePtr input, std::vector<int64_t> sizes, bool drop)
      : Node({std::move(input)}), sizes_(std::move(sizes)), drop_(drop) {}
  std::string name() const override { return "RebatchDatasetV2"; }
  std::string args() const override {
    std::string s = "[";
    for (size_t i = 0; i < sizes_.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes_[i]);
    return s + "]" + (drop_ ? ", drop_remainder=true" : "");
  }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<RebatchNode>(std::move(in.at(0)), sizes_, drop_);
  }
  ElementSpec element_spec() const override {
    // Only a stream of equal, never partial batches has a static size.
    const bool uniform = drop_ && std::all_of(sizes_.begin(), sizes_.end(),
                                              [&](int64_t s) { return s == sizes_[0]; });
    ElementSpec spec = input()->element_spec();
    for (TensorSpec& t : spec) {
      if (!t.shape.empty()) t.shape[0] = uniform ? sizes_[0] : -1;
    }
    return spec;
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    return n == kInfiniteCardinality ? n : kUnknownCardinality;
  }
  NodePtr for_data_sharding() const override {
    return legacy_rebatch_node(input(), static_cast<int64_t>(sizes_.size()));
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(
        std::make_unique<RebatchIterator>(std::move(in), sizes_, drop_, input()->element_spec()));
  }

 private:
  std::vector<int64_t> sizes_;
  bool drop_;
};

// --- legacy RebatchDataset
// ------------------------------------------------------------------------

class LegacyRebatchIterator final : public IteratorBase {
 public:
  LegacyRebatchIterator(std::unique_ptr<DatasetIterator> in, int64_t n)
      : in_(std::move(in)), n_(n) {}

  StatusOr<std::optional<Element>> next() override {
    if (slice_ == 0) {
      TRIBUTARY_ASSIGN_OR_RETURN(current_, in_->get_next());
      if (!current_) return std::optional<Element>();
      TRIBUTARY_RETURN_IF_ERROR(check_batched(*current_, kV1ScalarMessage));
      per_slice_ = (rows_of(*current_) + n_ - 1) / n_;
    }
    const int64_t rows = rows_of(*current_);
    const int64_t begin = std::min(slice_ * per_slice_, rows);
    const int64_t end = std::min(begin + per_slice_, rows);
    TRIBUTARY_ASSIGN_OR_RETURN(Element out, slice_rows(*current_, begin, end));
    slice_ = (slice_ + 1) % n_;
    return std::optional<Element>(std::move(out));
  }

 private:
  std::unique_ptr<DatasetIterator> in_;
  int64_t n_;
  int64_t slice_ = 0;
  int64_t per_slice_ = 0;
  std::optional<Element> current_;
};

class LegacyRebatchNode final : public Node {
 public:
  LegacyRebatchNode(NodePtr input, int64_t n) : Node({std::move(input)}), n_(n) {}
  std::string name() const override { return "RebatchDataset"; }
  std::string args() const override { return std::to_string(n_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<LegacyRebatchNode>(std::move(in.at(0)), n_);
  }
  ElementSpec element_spec() const override {
    ElementSpec spec = input()->element_spec();
    for (TensorSpec& t : spec) {
      if (t.shape.empty()) continue;
      int64_t& d = t.shape[0];
      d = (d >= 0 && d % n_ == 0) ? d / n_ : -1;
    }
    return spec;
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    return n < 0 ? n : n * n_;
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(
        std::make_unique<LegacyRebatchIterator>(std::move(in), n_));
  }

 private:
  int64_t n_;
};

}  // namespace

NodePtr rebatch_node(NodePtr input, std::vector<int64_t> batch_sizes, bool drop_remainder) {
  if (!input->status().ok()) return input;
  if (batch_sizes.empty()) return invalid("batch_sizes must contain at least one element.");
  for (size_t i = 0; i < batch_sizes.size(); ++i) {
    if (batch_sizes[i] < 0) {
      return invalid("batch_sizes[" + std::to_string(i) + "] must be non-negative, got " +
                     std::to_string(batch_sizes[i]) + ".");
    }
  }
  for (const TensorSpec& t : input->element_spec()) {
    if (t.shape.empty()) return invalid(kV2ScalarMessage);
  }
  return std::make_shared<RebatchNode>(std::move(input), std::move(batch_sizes), drop_remainder);
}

NodePtr legacy_rebatch_node(NodePtr input, int64_t num_replicas) {
  if (!input->status().ok()) return input;
  if (num_replicas <= 0) {
    return invalid("num_replicas must be greater than zero (currently num_replicas = " +
                   std::to_string(num_replicas) + ").");
  }
  return std::make_shared<LegacyRebatchNode>(std::move(input), num_replicas);
}

}  // namespace tributary::data_internal
