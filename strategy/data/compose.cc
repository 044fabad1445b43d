// Selecting, reshaping and combining transformations: skip, filter, unbatch, padded_batch, zip,
// concatenate. Validation messages and cardinality rules are TF's (skip_dataset_op.cc,
// filter_dataset_op.cc, unbatch_dataset_op.cc, padded_batch_dataset_op.cc, zip_dataset_op.cc,
// concatenate_dataset_op.cc).
#include <cxxabi.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

std::string tf_shape(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? "," : "") + (shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
  }
  return s + "]";
}

// --- skip ----------------------------------------------------------------------------------------

class SkipNode final : public Node {
 public:
  SkipNode(NodePtr input, int64_t count) : Node({std::move(input)}), count_(count) {}
  std::string name() const override { return "SkipDataset"; }
  std::string args() const override { return std::to_string(count_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<SkipNode>(std::move(in.at(0)), count_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;  // infinite or unknown, whatever the count (TF's)
    return count_ < 0 ? 0 : std::max<int64_t>(0, n - count_);
  }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, int64_t count) : in_(std::move(in)), left_(count) {}
      StatusOr<std::optional<Element>> next() override {
        // count < 0 skips everything (TF): read to the end.
        while (left_ != 0) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
          if (!e) return e;
          if (left_ > 0) --left_;
        }
        return in_->get_next();
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      int64_t left_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), count_));
  }

 private:
  int64_t count_;
};

// --- filter --------------------------------------------------------------------------------------

class FilterNode final : public Node {
 public:
  FilterNode(NodePtr input, FilterFn fn) : Node({std::move(input)}), fn_(std::move(fn)) {}
  std::string name() const override { return "FilterDataset"; }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<FilterNode>(std::move(in.at(0)), fn_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override { return kUnknownCardinality; }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, FilterFn fn)
          : in_(std::move(in)), fn_(std::move(fn)) {}
      StatusOr<std::optional<Element>> next() override {
        for (;;) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
          if (!e) return e;
          StatusOr<bool> keep = internal_error("the filter predicate did not run");
          try {
            keep = fn_(*e);
          } catch (const std::exception& x) {
            return internal_error(std::string("the filter predicate threw: ") + x.what());
          } catch (abi::__forced_unwind&) {
            throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
          } catch (...) {
            return internal_error("the filter predicate threw a non-standard exception");
          }
          if (!keep.ok()) return keep.status();
          if (*keep) return e;
        }
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      FilterFn fn_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), fn_));
  }

 private:
  FilterFn fn_;
};

// --- unbatch -------------------------------------------------------------------------------------

class UnbatchNode final : public Node {
 public:
  explicit UnbatchNode(NodePtr input) : Node({std::move(input)}) {}
  std::string name() const override { return "UnbatchDataset"; }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<UnbatchNode>(std::move(in.at(0)));
  }
  ElementSpec element_spec() const override {
    ElementSpec spec = input()->element_spec();
    for (TensorSpec& t : spec) t.shape.erase(t.shape.begin());
    return spec;
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    // TF: n times the first known dimension 0 among the components, when it is positive.
    for (const TensorSpec& t : input()->element_spec()) {
      if (!t.shape.empty() && t.shape[0] >= 0) {
        return t.shape[0] > 0 ? n * t.shape[0] : kUnknownCardinality;
      }
    }
    return kUnknownCardinality;
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      explicit It(std::unique_ptr<DatasetIterator> in) : in_(std::move(in)) {}
      StatusOr<std::optional<Element>> next() override {
        while (!current_ || row_ >= rows_) {
          TRIBUTARY_ASSIGN_OR_RETURN(current_, in_->get_next());
          if (!current_) return std::optional<Element>();
          row_ = 0;
          rows_ = -1;
          for (size_t c = 0; c < current_->size(); ++c) {
            const Array& a = (*current_)[c];
            if (a.rank() == 0) {
              return invalid_argument(
                  "Input element must have a non-scalar value in each "
                  "component.");
            }
            if (rows_ >= 0 && a.shape()[0] != rows_) {
              return invalid_argument(
                  "Input element must have the same batch size in each component. Component 0 "
                  "had size " +
                  std::to_string(rows_) + " but component " + std::to_string(c) + " had size " +
                  std::to_string(a.shape()[0]) + ".");
            }
            rows_ = a.shape()[0];
          }
        }
        Element out;
        for (const Array& a : *current_) {
          TRIBUTARY_ASSIGN_OR_RETURN(Array row, a.rows(row_, row_ + 1));
          Shape shape(a.shape().begin() + 1, a.shape().end());
          TRIBUTARY_ASSIGN_OR_RETURN(row, row.reshape(std::move(shape)));
          out.push_back(std::move(row));
        }
        ++row_;
        return std::optional<Element>(std::move(out));
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      std::optional<Element> current_;
      int64_t row_ = 0, rows_ = 0;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in)));
  }
};

// --- padded_batch --------------------------------------------------------------------------------

class PaddedBatchNode final : public Node {
 public:
  // `shapes[c]`: component c's padded shape (-1: the longest in the batch); `values[c]`: its
  // padding value.
  PaddedBatchNode(NodePtr input, int64_t n, std::vector<Shape> shapes, std::vector<double> values,
                  bool drop)
      : Node({std::move(input)}),
        n_(n),
        shapes_(std::move(shapes)),
        values_(std::move(values)),
        drop_(drop) {}
  std::string name() const override { return "PaddedBatchDataset"; }
  std::string args() const override {
    return std::to_string(n_) + (drop_ ? ", drop_remainder=true" : "");
  }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<PaddedBatchNode>(std::move(in.at(0)), n_, shapes_, values_, drop_);
  }
  ElementSpec element_spec() const override {
    ElementSpec spec = input()->element_spec();
    for (size_t c = 0; c < spec.size() && c < shapes_.size(); ++c) {
      spec[c].shape = shapes_[c];
      spec[c].shape.insert(spec[c].shape.begin(), drop_ ? n_ : -1);
    }
    return spec;
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return n / n_ + (!drop_ && n % n_ != 0 ? 1 : 0);
  }
  BatchRole batch_role() const override { return BatchRole::kBatch; }
  int64_t batch_size() const override { return n_; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, const PaddedBatchNode& node)
          : in_(std::move(in)),
            n_(node.n_),
            shapes_(node.shapes_),
            values_(node.values_),
            drop_(node.drop_) {}
      StatusOr<std::optional<Element>> next() override {
        std::vector<Element> parts;
        while (static_cast<int64_t>(parts.size()) < n_) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
          if (!e) break;
          parts.push_back(std::move(*e));
        }
        if (parts.empty() || (drop_ && static_cast<int64_t>(parts.size()) < n_)) {
          return std::optional<Element>();
        }
        Element out;
        for (size_t c = 0; c < parts[0].size(); ++c) {
          TRIBUTARY_ASSIGN_OR_RETURN(Array column, pad_column(parts, c));
          out.push_back(std::move(column));
        }
        return std::optional<Element>(std::move(out));
      }

     private:
      StatusOr<Array> pad_column(const std::vector<Element>& parts, size_t c) const {
        const Array& first = parts[0][c];
        // Without declared shapes every dimension pads to the longest (TF's default).
        Shape want = c < shapes_.size() ? shapes_[c] : Shape(first.shape().size(), -1);
        Shape target = want;
        for (size_t i = 0; i < parts.size(); ++i) {
          if (parts[i].size() != parts[0].size()) {
            return invalid_argument(
                "Cannot batch elements with different numbers of components. First element had " +
                std::to_string(parts[0].size()) + " and element " + std::to_string(i) + " had " +
                std::to_string(parts[i].size()) + ".");
          }
          const Array& a = parts[i][c];
          if (a.dtype() != first.dtype()) {
            return invalid_argument("Cannot batch tensors with different dtypes in component " +
                                    std::to_string(c) + ". First element had dtype " +
                                    std::string(dtype_name(first.dtype())) + " and element " +
                                    std::to_string(i) + " had dtype " +
                                    std::string(dtype_name(a.dtype())) + ".");
          }
          if (a.shape().size() != want.size()) {
            return invalid_argument("The padded shape " + tf_shape(want) +
                                    " is not compatible with the shape " + tf_shape(a.shape()) +
                                    " of component " + std::to_string(c) + " of element " +
                                    std::to_string(i) + ".");
          }
          for (size_t d = 0; d < want.size(); ++d) {
            if (want[d] >= 0 && a.shape()[d] > want[d]) {
              return invalid_argument(
                  "Attempted to pad to a smaller size than the input element: component " +
                  std::to_string(c) + " of element " + std::to_string(i) + " has shape " +
                  tf_shape(a.shape()) + " and the padded shape is " + tf_shape(want) + ".");
            }
            if (want[d] < 0) target[d] = std::max(i == 0 ? 0 : target[d], a.shape()[d]);
          }
        }
        Shape out_shape = target;
        out_shape.insert(out_shape.begin(), static_cast<int64_t>(parts.size()));
        TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(first.dtype(), out_shape));
        const int64_t per = shape_num_elements(target);
        const double fill = c < values_.size() ? values_[c] : 0.0;
        if (fill != 0.0) {
          for (int64_t k = 0; k < out.num_elements(); ++k) {
            dtype_store(out.dtype(), out.mutable_data<void>(), k, fill);
          }
        }
        // Copy each element's rows into the corner of its padded slot, innermost runs at a time.
        const size_t esize = dtype_size(first.dtype());
        for (size_t i = 0; i < parts.size(); ++i) {
          const Array& a = parts[i][c];
          if (a.num_elements() == 0) continue;
          const size_t rank = target.size();
          const int64_t run = rank == 0 ? 1 : a.shape()[rank - 1];
          const int64_t runs = rank == 0 ? 1 : a.num_elements() / std::max<int64_t>(run, 1);
          auto* dst = out.mutable_data<unsigned char>() + static_cast<size_t>(i * per) * esize;
          const auto* src = a.data<unsigned char>();
          std::vector<int64_t> index(rank == 0 ? 0 : rank - 1, 0);
          for (int64_t r = 0; r < runs; ++r) {
            int64_t offset = 0;
            for (size_t d = 0; d + 1 < rank; ++d) offset = offset * target[d] + index[d];
            if (rank > 0) offset *= target[rank - 1];
            std::memcpy(dst + static_cast<size_t>(offset) * esize,
                        src + static_cast<size_t>(r * run) * esize,
                        static_cast<size_t>(run) * esize);
            for (size_t d = index.size(); d-- > 0;) {
              if (++index[d] < a.shape()[d]) break;
              index[d] = 0;
            }
          }
        }
        return out;
      }

      std::unique_ptr<DatasetIterator> in_;
      int64_t n_;
      std::vector<Shape> shapes_;
      std::vector<double> values_;
      bool drop_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), *this));
  }

 private:
  int64_t n_;
  std::vector<Shape> shapes_;
  std::vector<double> values_;
  bool drop_;
};

// --- zip -----------------------------------------------------------------------------------------

class ZipNode final : public Node {
 public:
  explicit ZipNode(std::vector<NodePtr> inputs) : Node(std::move(inputs)) {}
  std::string name() const override { return "ZipDataset"; }
  BatchRole batch_role() const override { return BatchRole::kEveryInput; }
  std::string args() const override { return std::to_string(inputs().size()) + " inputs"; }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<ZipNode>(std::move(in));
  }
  ElementSpec element_spec() const override {
    ElementSpec spec;
    for (const NodePtr& in : inputs()) {
      ElementSpec part = in->element_spec();
      if (part.empty()) return {};  // one unknown structure makes the whole unknown
      spec.insert(spec.end(), part.begin(), part.end());
    }
    return spec;
  }
  int64_t cardinality() const override {
    int64_t result = kInfiniteCardinality;
    for (const NodePtr& in : inputs()) {
      const int64_t n = in->cardinality();
      if (n == kUnknownCardinality) return n;
      if (n != kInfiniteCardinality)
        result = result == kInfiniteCardinality ? n : std::min(result, n);
    }
    return result;
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      explicit It(std::vector<std::unique_ptr<DatasetIterator>> in) : in_(std::move(in)) {}
      StatusOr<std::optional<Element>> next() override {
        Element out;
        for (auto& it : in_) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, it->get_next());
          if (!e) return e;  // the shortest input ends the zip
          out.insert(out.end(), e->begin(), e->end());
        }
        return std::optional<Element>(std::move(out));
      }

     private:
      std::vector<std::unique_ptr<DatasetIterator>> in_;
    };
    std::vector<std::unique_ptr<DatasetIterator>> its;
    for (const NodePtr& in : inputs()) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto it, in->make_iterator());
      its.push_back(std::move(it));
    }
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(its)));
  }
};

// --- concatenate ---------------------------------------------------------------------------------

// The spec both inputs fit (TF's most_specific_compatible_type): dimensions that differ become
// unknown. Empty when either is unknown, and when ranks differ (our specs cannot say "unknown
// rank", which is what TF gives).
ElementSpec common_spec(const ElementSpec& a, const ElementSpec& b) {
  if (a.empty() || b.empty() || a.size() != b.size()) return {};
  ElementSpec out = a;
  for (size_t c = 0; c < a.size(); ++c) {
    if (a[c].dtype != b[c].dtype || a[c].shape.size() != b[c].shape.size()) return {};
    for (size_t d = 0; d < a[c].shape.size(); ++d) {
      if (a[c].shape[d] != b[c].shape[d]) out[c].shape[d] = -1;
    }
  }
  return out;
}

class ConcatenateNode final : public Node {
 public:
  ConcatenateNode(NodePtr first, NodePtr second) : Node({std::move(first), std::move(second)}) {}
  std::string name() const override { return "ConcatenateDataset"; }
  BatchRole batch_role() const override { return BatchRole::kEveryInput; }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<ConcatenateNode>(std::move(in.at(0)), std::move(in.at(1)));
  }
  ElementSpec element_spec() const override {
    return common_spec(inputs()[0]->element_spec(), inputs()[1]->element_spec());
  }
  int64_t cardinality() const override {
    const int64_t a = inputs()[0]->cardinality(), b = inputs()[1]->cardinality();
    if (a == kInfiniteCardinality || b == kInfiniteCardinality) return kInfiniteCardinality;
    if (a == kUnknownCardinality || b == kUnknownCardinality) return kUnknownCardinality;
    return a + b;
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> first, NodePtr second)
          : current_(std::move(first)), second_(std::move(second)) {}
      StatusOr<std::optional<Element>> next() override {
        for (;;) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, current_->get_next());
          if (e || !second_) return e;
          // The second input is opened when the first ends, as TF does.
          TRIBUTARY_ASSIGN_OR_RETURN(current_, second_->make_iterator());
          second_.reset();
        }
      }

     private:
      std::unique_ptr<DatasetIterator> current_;
      NodePtr second_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto first, inputs()[0]->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(first), inputs()[1]));
  }
};

}  // namespace

NodePtr skip_node(NodePtr input, int64_t count) {
  if (!input->status().ok()) return input;
  return std::make_shared<SkipNode>(std::move(input), count < 0 ? -1 : count);
}

NodePtr filter_node(NodePtr input, FilterFn predicate) {
  if (!input->status().ok()) return input;
  if (!predicate) return invalid("filter: the predicate is empty.");
  return std::make_shared<FilterNode>(std::move(input), std::move(predicate));
}

NodePtr unbatch_node(NodePtr input) {
  if (!input->status().ok()) return input;
  for (const TensorSpec& t : input->element_spec()) {
    if (t.shape.empty()) return invalid("Cannot unbatch an input with scalar components.");
  }
  return std::make_shared<UnbatchNode>(std::move(input));
}

NodePtr padded_batch_node(NodePtr input, int64_t batch_size,
                          std::optional<std::vector<Shape>> shapes,
                          std::vector<double> padding_values, bool drop_remainder) {
  if (!input->status().ok()) return input;
  if (batch_size <= 0) return invalid("Batch size must be greater than zero.");
  const ElementSpec spec = input->element_spec();
  std::vector<Shape> padded;
  if (shapes) {
    if (!spec.empty() && shapes->size() != spec.size()) {
      return invalid("padded_shapes has " + std::to_string(shapes->size()) +
                     " shape(s) but the input elements have " + std::to_string(spec.size()) +
                     " component(s).");
    }
    padded = *shapes;
    for (size_t c = 0; c < padded.size() && c < spec.size(); ++c) {
      const Shape& have = spec[c].shape;
      bool fits = have.size() == padded[c].size();
      for (size_t d = 0; fits && d < have.size(); ++d) {
        fits = padded[c][d] < 0 || have[d] < 0 || have[d] <= padded[c][d];
      }
      if (!fits) {
        return invalid("The padded shape " + tf_shape(padded[c]) +
                       " is not compatible with the corresponding input component shape " +
                       tf_shape(have) + ".");
      }
    }
  } else {
    // TF's default: every dimension padded to the longest in the batch; the element spec must be
    // known so that the number of dimensions is.
    if (spec.empty()) {
      return invalid(
          "padded_batch: the input's element spec is unknown (after map() without an "
          "output spec); pass padded_shapes.");
    }
    for (const TensorSpec& t : spec) padded.push_back(t.shape);
  }
  if (!padding_values.empty() && padding_values.size() != padded.size()) {
    return invalid("padding_values has " + std::to_string(padding_values.size()) +
                   " value(s) for " + std::to_string(padded.size()) + " component(s).");
  }
  return std::make_shared<PaddedBatchNode>(std::move(input), batch_size, std::move(padded),
                                           std::move(padding_values), drop_remainder);
}

NodePtr zip_node(std::vector<NodePtr> inputs) {
  if (inputs.empty()) return invalid("zip: at least one dataset is required.");
  for (const NodePtr& in : inputs) {
    if (!in->status().ok()) return in;
  }
  return std::make_shared<ZipNode>(std::move(inputs));
}

NodePtr concatenate_node(NodePtr first, NodePtr second) {
  if (!first->status().ok()) return first;
  if (!second->status().ok()) return second;
  const ElementSpec a = first->element_spec(), b = second->element_spec();
  bool compatible = a.empty() || b.empty() || a.size() == b.size();
  for (size_t c = 0; compatible && !a.empty() && !b.empty() && c < a.size(); ++c) {
    compatible = a[c].dtype == b[c].dtype;
  }
  if (!compatible) {
    return invalid("Incompatible dataset elements: " + element_spec_to_string(a) + " vs. " +
                   element_spec_to_string(b) +
                   " (concatenate needs the same number of components and the same dtypes).");
  }
  return std::make_shared<ConcatenateNode>(std::move(first), std::move(second));
}

}  // namespace tributary::data_internal
