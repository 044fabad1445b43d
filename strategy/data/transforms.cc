// Element-wise and counting transformations: batch, repeat, shuffle, shard, map, take.
// Validation messages and cardinality rules are TF's (batch_dataset_op.cc, repeat_dataset_op.cc,
// shuffle_dataset_op.cc, shard_dataset_op.cc, take_dataset_op.cc).
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

// TF prints shapes as "[2,3]" in kernel errors; users grep for those texts.
std::string tf_shape(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// --- batch ---------------------------------------------------------------------------------------

StatusOr<Element> stack_elements(const std::vector<Element>& parts) {
  const size_t n_components = parts[0].size();
  Element out;
  out.reserve(n_components);
  for (size_t c = 0; c < n_components; ++c) {
    std::vector<Array> column;
    column.reserve(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].size() != n_components) {
        return invalid_argument(
            "Cannot batch elements with different numbers of components. "
            "First element had " +
            std::to_string(n_components) + " and element " + std::to_string(i) + " had " +
            std::to_string(parts[i].size()) + ".");
      }
      const Array& first = parts[0][c];
      const Array& a = parts[i][c];
      if (a.shape() != first.shape()) {
        return invalid_argument("Cannot batch tensors with different shapes in component " +
                                std::to_string(c) + ". First element had shape " +
                                tf_shape(first.shape()) + " and element " + std::to_string(i) +
                                " had shape " + tf_shape(a.shape()) + ".");
      }
      if (a.dtype() != first.dtype()) {
        return invalid_argument("Cannot batch tensors with different dtypes in component " +
                                std::to_string(c) + ". First element had dtype " +
                                std::string(dtype_name(first.dtype())) + " and element " +
                                std::to_string(i) + " had dtype " +
                                std::string(dtype_name(a.dtype())) + ".");
      }
      column.push_back(a);
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Array stacked, stack(column));
    out.push_back(std::move(stacked));
  }
  return out;
}

class BatchNode final : public Node {
 public:
  BatchNode(NodePtr input, int64_t n, bool drop) : Node({std::move(input)}), n_(n), drop_(drop) {}
  std::string name() const override { return "BatchDataset"; }
  std::string args() const override {
    return std::to_string(n_) + (drop_ ? ", drop_remainder=true" : "");
  }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<BatchNode>(std::move(in.at(0)), n_, drop_);
  }
  ElementSpec element_spec() const override {
    ElementSpec spec = input()->element_spec();
    for (TensorSpec& t : spec) t.shape.insert(t.shape.begin(), drop_ ? n_ : -1);
    return spec;
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return n / n_ + (!drop_ && n % n_ != 0 ? 1 : 0);  // TF's, which cannot overflow
  }
  BatchRole batch_role() const override { return BatchRole::kBatch; }
  int64_t batch_size() const override { return n_; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, int64_t n, bool drop)
          : in_(std::move(in)), n_(n), drop_(drop) {}
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
        TRIBUTARY_ASSIGN_OR_RETURN(Element out, stack_elements(parts));
        return std::optional<Element>(std::move(out));
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      int64_t n_;
      bool drop_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), n_, drop_));
  }

 private:
  int64_t n_;
  bool drop_;
};

// --- repeat --------------------------------------------------------------------------------------

class RepeatNode final : public Node {
 public:
  RepeatNode(NodePtr input, int64_t count) : Node({std::move(input)}), count_(count) {}
  std::string name() const override { return "RepeatDataset"; }
  std::string args() const override { return std::to_string(count_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<RepeatNode>(std::move(in.at(0)), count_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (count_ < 0) return n == 0 ? 0 : kInfiniteCardinality;
    if (count_ == 0) return 0;
    if (n < 0) return n;
    int64_t total = 0;
    // TF multiplies; a product past int64 is unknown here rather than a wrapped number.
    return __builtin_mul_overflow(n, count_, &total) ? kUnknownCardinality : total;
  }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(NodePtr input, int64_t count) : input_(std::move(input)), count_(count) {}
      StatusOr<std::optional<Element>> next() override {
        for (;;) {
          if (!cur_) {
            if (count_ >= 0 && epoch_ >= count_) return std::optional<Element>();
            TRIBUTARY_ASSIGN_OR_RETURN(cur_, input_->make_iterator());
          }
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, cur_->get_next());
          if (e) {
            any_element_ = true;
            return e;
          }
          cur_.reset();
          ++epoch_;
          // TF's rule: an input whose first epoch is empty ends the sequence (repeated forever it
          // would spin here). For a count too: TF runs through its empty epochs, which for a large
          // count spins as long. Later empty epochs do not end it.
          if (!any_element_) return std::optional<Element>();
        }
      }

     private:
      NodePtr input_;
      int64_t count_;
      int64_t epoch_ = 0;
      bool any_element_ = false;
      std::unique_ptr<DatasetIterator> cur_;
    };
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(input(), count_));
  }

 private:
  int64_t count_;
};

// --- shuffle -------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class ShuffleNode final : public Node {
 public:
  ShuffleNode(NodePtr input, int64_t buffer, uint64_t seed, bool reshuffle)
      : Node({std::move(input)}), buffer_(buffer), seed_(seed), reshuffle_(reshuffle) {}
  std::string name() const override { return "ShuffleDataset"; }
  std::string args() const override {
    return std::to_string(buffer_) + ", seed=" + std::to_string(seed_) +
           (reshuffle_ ? "" : ", reshuffle_each_iteration=false");
  }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<ShuffleNode>(std::move(in.at(0)), buffer_, seed_, reshuffle_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override { return input()->cardinality(); }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, int64_t buffer, uint64_t seed)
          : in_(std::move(in)), buffer_size_(buffer), rng_(seed) {}
      StatusOr<std::optional<Element>> next() override {
        while (!input_done_ && static_cast<int64_t>(buffer_.size()) < buffer_size_) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
          if (!e) {
            input_done_ = true;
          } else {
            buffer_.push_back(std::move(*e));
          }
        }
        if (buffer_.empty()) return std::optional<Element>();
        const size_t i = static_cast<size_t>(rng_() % buffer_.size());
        Element out = std::move(buffer_[i]);
        if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
        buffer_.pop_back();
        return std::optional<Element>(std::move(out));
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      int64_t buffer_size_;
      std::mt19937_64 rng_;
      std::vector<Element> buffer_;
      bool input_done_ = false;
    };
    // Each iterator (each epoch under repeat) of a reshuffling dataset gets its own seed, derived
    // from the user's seed and the iterator's ordinal, so epochs differ yet replay identically.
    const uint64_t epoch = reshuffle_ ? iterators_made_.fetch_add(1) : 0;
    const uint64_t seed = splitmix64(seed_ ^ splitmix64(epoch));
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), buffer_, seed));
  }

 private:
  int64_t buffer_;
  uint64_t seed_;
  bool reshuffle_;
  mutable std::atomic<uint64_t> iterators_made_{0};
};

// --- shard ---------------------------------------------------------------------------------------

class ShardNode final : public Node {
 public:
  ShardNode(NodePtr input, int64_t n, int64_t index) : Node({std::move(input)}), n_(n), i_(index) {}
  std::string name() const override { return "ShardDataset"; }
  std::string args() const override { return std::to_string(n_) + ", " + std::to_string(i_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<ShardNode>(std::move(in.at(0)), n_, i_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return n / n_ + (i_ < n % n_ ? 1 : 0);
  }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, int64_t n, int64_t i)
          : in_(std::move(in)), n_(n), i_(i) {}
      StatusOr<std::optional<Element>> next() override {
        for (;;) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
          if (!e) return e;
          if (pos_++ % n_ == i_) return e;
        }
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      int64_t n_, i_, pos_ = 0;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), n_, i_));
  }

 private:
  int64_t n_, i_;
};

// --- map -----------------------------------------------------------------------------------------

class MapNode final : public Node {
 public:
  MapNode(NodePtr input, MapFn fn, std::optional<ElementSpec> spec)
      : Node({std::move(input)}), fn_(std::move(fn)), spec_(std::move(spec)) {}
  std::string name() const override { return "MapDataset"; }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<MapNode>(std::move(in.at(0)), fn_, spec_);
  }
  ElementSpec element_spec() const override { return spec_.value_or(ElementSpec{}); }
  int64_t cardinality() const override { return input()->cardinality(); }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, MapFn fn, std::optional<ElementSpec> spec)
          : in_(std::move(in)), fn_(std::move(fn)), spec_(std::move(spec)) {}
      StatusOr<std::optional<Element>> next() override {
        TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, in_->get_next());
        if (!e) return e;
        StatusOr<Element> out = internal_error("map function did not run");
        try {
          out = fn_(std::move(*e));
        } catch (const std::exception& x) {
          return internal_error(std::string("the map function threw: ") + x.what());
        } catch (abi::__forced_unwind&) {
          throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
        } catch (...) {
          return internal_error("the map function threw a non-standard exception");
        }
        if (!out.ok()) return out.status();
        // TF traces fn, so its output always has the declared structure; here the declaration is
        // checked on every element, since the spec drives batching and zero-size batches.
        if (spec_) {
          TRIBUTARY_RETURN_IF_ERROR(
              check_against_spec(*out, *spec_, "the map function returned", "output_spec"));
        }
        return std::optional<Element>(std::move(*out));
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      MapFn fn_;
      std::optional<ElementSpec> spec_;
    };
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), fn_, spec_));
  }

 private:
  MapFn fn_;
  std::optional<ElementSpec> spec_;
};

// --- take ----------------------------------------------------------------------------------------

class TakeNode final : public Node {
 public:
  TakeNode(NodePtr input, int64_t count) : Node({std::move(input)}), count_(count) {}
  std::string name() const override { return "TakeDataset"; }
  std::string args() const override { return std::to_string(count_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<TakeNode>(std::move(in.at(0)), count_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n == kUnknownCardinality) return n;
    if (n == kInfiniteCardinality) return count_ < 0 ? n : count_;
    return count_ < 0 ? n : std::min(n, count_);
  }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    class It final : public IteratorBase {
     public:
      It(std::unique_ptr<DatasetIterator> in, int64_t count) : in_(std::move(in)), left_(count) {}
      StatusOr<std::optional<Element>> next() override {
        if (left_ == 0) return std::optional<Element>();
        if (left_ > 0) --left_;
        return in_->get_next();
      }

     private:
      std::unique_ptr<DatasetIterator> in_;
      int64_t left_;
    };
    // take(0) never touches its input, as in TF.
    std::unique_ptr<DatasetIterator> in;
    if (count_ != 0) {
      TRIBUTARY_ASSIGN_OR_RETURN(in, input()->make_iterator());
    }
    return std::unique_ptr<DatasetIterator>(std::make_unique<It>(std::move(in), count_));
  }

 private:
  int64_t count_;
};

}  // namespace

NodePtr batch_node(NodePtr input, int64_t batch_size, bool drop_remainder) {
  if (!input->status().ok()) return input;
  if (batch_size <= 0) return invalid("Batch size must be greater than zero.");
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder);
}

NodePtr repeat_node(NodePtr input, int64_t count) {
  if (!input->status().ok()) return input;
  return std::make_shared<RepeatNode>(std::move(input), count < 0 ? -1 : count);
}

NodePtr shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle) {
  if (!input->status().ok()) return input;
  if (buffer_size <= 0) return invalid("buffer_size must be greater than zero.");
  return std::make_shared<ShuffleNode>(std::move(input), buffer_size, seed, reshuffle);
}

NodePtr shard_node(NodePtr input, int64_t num_shards, int64_t index) {
  if (!input->status().ok()) return input;
  if (num_shards <= 0) {
    return invalid("Number of shards must be greater than zero (currently num_shards = " +
                   std::to_string(num_shards) + ").");
  }
  if (index < 0 || index >= num_shards) {
    return invalid("Index must be between 0 and " + std::to_string(num_shards - 1) +
                   " (currently index = " + std::to_string(index) + ").");
  }
  return std::make_shared<ShardNode>(std::move(input), num_shards, index);
}

NodePtr map_node(NodePtr input, MapFn fn, std::optional<ElementSpec> output_spec) {
  if (!input->status().ok()) return input;
  if (!fn) return invalid("map: the function is empty.");
  if (output_spec && output_spec->empty()) output_spec.reset();  // empty: unknown (dataset.h)
  return std::make_shared<MapNode>(std::move(input), std::move(fn), std::move(output_spec));
}

NodePtr take_node(NodePtr input, int64_t count) {
  if (!input->status().ok()) return input;
  return std::make_shared<TakeNode>(std::move(input), count < 0 ? -1 : count);
}

}  // namespace tributary::data_internal
