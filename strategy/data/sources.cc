// In-memory sources: from_tensor_slices, from_tensors, range, from_generator. None of them can be
// sharded by file,
// which FILE auto-sharding reports as "Found an unshardable source dataset" (they have no inputs
// and are not FileReaderNodes).
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

class TensorSliceNode final : public Node {
 public:
  explicit TensorSliceNode(std::vector<Array> components) : components_(std::move(components)) {}
  std::string name() const override { return "TensorSliceDataset"; }
  std::string args() const override { return element_spec_to_string(element_spec()); }
  NodePtr with_inputs(std::vector<NodePtr>) const override {
    return std::make_shared<TensorSliceNode>(components_);
  }
  ElementSpec element_spec() const override {
    ElementSpec spec = spec_of(components_);
    for (TensorSpec& t : spec) t.shape.erase(t.shape.begin());
    return spec;
  }
  int64_t cardinality() const override { return components_[0].dim0(); }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      explicit It(const std::vector<Array>& c) : c_(c) {}
      StatusOr<std::optional<Element>> next() override {
        if (i_ >= c_[0].dim0()) return std::optional<Element>();
        Element e;
        for (const Array& a : c_) {
          TRIBUTARY_ASSIGN_OR_RETURN(Array row, a.rows(i_, i_ + 1));
          Shape s(row.shape().begin() + 1, row.shape().end());
          TRIBUTARY_ASSIGN_OR_RETURN(Array r, row.reshape(std::move(s)));
          e.push_back(std::move(r));
        }
        ++i_;
        return std::optional<Element>(std::move(e));
      }

     private:
      std::vector<Array> c_;
      int64_t i_ = 0;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(components_));
  }

 private:
  std::vector<Array> components_;
};

class TensorNode final : public Node {
 public:
  explicit TensorNode(std::vector<Array> components) : components_(std::move(components)) {}
  std::string name() const override { return "TensorDataset"; }
  std::string args() const override { return element_spec_to_string(element_spec()); }
  NodePtr with_inputs(std::vector<NodePtr>) const override {
    return std::make_shared<TensorNode>(components_);
  }
  ElementSpec element_spec() const override { return spec_of(components_); }
  int64_t cardinality() const override { return 1; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      explicit It(const std::vector<Array>& c) : c_(c) {}
      StatusOr<std::optional<Element>> next() override {
        if (done_) return std::optional<Element>();
        done_ = true;
        return std::optional<Element>(c_);
      }

     private:
      std::vector<Array> c_;
      bool done_ = false;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(components_));
  }

 private:
  std::vector<Array> components_;
};

class RangeNode final : public Node {
 public:
  RangeNode(int64_t start, int64_t stop, int64_t step) : start_(start), stop_(stop), step_(step) {}
  std::string name() const override { return "RangeDataset"; }
  std::string args() const override {
    return std::to_string(start_) + ", " + std::to_string(stop_) + ", " + std::to_string(step_);
  }
  NodePtr with_inputs(std::vector<NodePtr>) const override {
    return std::make_shared<RangeNode>(start_, stop_, step_);
  }
  ElementSpec element_spec() const override { return {TensorSpec{DType::kInt64, {}}}; }
  // ceil((stop - start) / step), clamped at 0, in unsigned arithmetic so that it cannot overflow
  // for start/stop near the int64 limits: up to 2^64 - 1 elements.
  uint64_t count() const {
    if (step_ > 0 && stop_ > start_) {
      const uint64_t span = static_cast<uint64_t>(stop_) - static_cast<uint64_t>(start_);
      return (span - 1) / static_cast<uint64_t>(step_) + 1;
    }
    if (step_ < 0 && stop_ < start_) {
      const uint64_t span = static_cast<uint64_t>(start_) - static_cast<uint64_t>(stop_);
      const uint64_t mag = static_cast<uint64_t>(-(step_ + 1)) + 1;
      return (span - 1) / mag + 1;
    }
    return 0;
  }
  // TF's RangeCardinality: a range up to INT64_MAX is infinite (how enumerate() and "endless"
  // ranges are written); so is one of more elements than an int64 counts.
  int64_t cardinality() const override {
    if (step_ > 0 && stop_ == INT64_MAX) return kInfiniteCardinality;
    const uint64_t n = count();
    return n > static_cast<uint64_t>(INT64_MAX) ? kInfiniteCardinality : static_cast<int64_t>(n);
  }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(int64_t start, int64_t step, uint64_t count) : next_(start), step_(step), left_(count) {}
      StatusOr<std::optional<Element>> next() override {
        if (left_ == 0) return std::optional<Element>();
        const int64_t v = next_;
        --left_;
        if (left_ > 0) next_ += step_;
        return std::optional<Element>(Element{Array::scalar<int64_t>(v)});
      }

     private:
      int64_t next_, step_;
      uint64_t left_;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(start_, step_, count()));
  }

 private:
  int64_t start_, stop_, step_;
};

class GeneratorNode final : public Node {
 public:
  GeneratorNode(std::function<StatusOr<Generator>()> make, ElementSpec spec)
      : make_(std::move(make)), spec_(std::move(spec)) {}
  std::string name() const override { return "GeneratorDataset"; }
  NodePtr with_inputs(std::vector<NodePtr>) const override {
    return std::make_shared<GeneratorNode>(make_, spec_);
  }
  ElementSpec element_spec() const override { return spec_; }
  int64_t cardinality() const override { return kUnknownCardinality; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::function<StatusOr<Generator>()> make, ElementSpec spec)
          : make_(std::move(make)), spec_(std::move(spec)) {}
      StatusOr<std::optional<Element>> next() override {
        // The generator is made on the first get_next (where a prefetch thread would call it), so
        // that making an iterator runs no user code.
        if (!generator_) {
          TRIBUTARY_ASSIGN_OR_RETURN(Generator g, make_());
          if (!g) return invalid_argument("from_generator: the generator is empty");
          generator_ = std::move(g);
        }
        TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, generator_());
        if (e && !spec_.empty()) {
          TRIBUTARY_RETURN_IF_ERROR(
              check_against_spec(*e, spec_, "the generator yielded", "output_spec"));
        }
        return e;
      }

     private:
      std::function<StatusOr<Generator>()> make_;
      ElementSpec spec_;
      Generator generator_;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(make_, spec_));
  }

 private:
  std::function<StatusOr<Generator>()> make_;
  ElementSpec spec_;
};

}  // namespace

NodePtr generator_node(std::function<StatusOr<Generator>()> make, ElementSpec output_spec) {
  if (!make) return invalid("from_generator: the generator factory is empty.");
  return std::make_shared<GeneratorNode>(std::move(make), std::move(output_spec));
}

NodePtr tensor_slices_node(std::vector<Array> components) {
  if (components.empty()) {
    return invalid("from_tensor_slices needs at least one component.");
  }
  for (size_t i = 0; i < components.size(); ++i) {
    if (components[i].rank() == 0) {
      return invalid("from_tensor_slices: component " + std::to_string(i) +
                     " is a scalar; slicing needs rank >= 1 (use from_tensors for one element).");
    }
    if (components[i].shape()[0] != components[0].shape()[0]) {
      return invalid(
          "from_tensor_slices: dimension 0 of every component must agree; component 0 "
          "has " +
          std::to_string(components[0].shape()[0]) + " rows and component " + std::to_string(i) +
          " has " + std::to_string(components[i].shape()[0]) + ".");
    }
  }
  return std::make_shared<TensorSliceNode>(std::move(components));
}

NodePtr tensors_node(std::vector<Array> components) {
  return std::make_shared<TensorNode>(std::move(components));
}

NodePtr range_node(int64_t start, int64_t stop, int64_t step) {
  if (step == 0) return invalid("step must be a non-zero integer.");
  return std::make_shared<RangeNode>(start, stop, step);
}

}  // namespace tributary::data_internal
