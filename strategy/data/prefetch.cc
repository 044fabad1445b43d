// prefetch(n): a std::jthread per iterator runs the input pipeline ahead of the consumer into a
// bounded queue.
//
// Shutdown: the thread is the iterator's last member, so it is stopped and joined before the queue
// and the input iterator it uses are destroyed. It waits for queue space with a stop_token-aware
// condition variable, so a stop wakes it at once; if it is inside the input's get_next() (a slow
// map function, a file read) the destructor waits for that one element and no more.
//
// Ordering: results (elements, the end, an error) go through the queue in the order the input
// produced them; the producer stops after the end or the first error, which IteratorBase then
// repeats to the consumer.
#include <cxxabi.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stop_token>
#include <system_error>
#include <thread>
#include <utility>

#include "strategy/data/nodes.h"

namespace tributary::data_internal {

namespace {

// What kAutotune means here: TF tunes the buffer at run time; two elements keep a consumer that is
// about as fast as the producer busy without holding much memory.
constexpr int64_t kAutotuneBufferSize = 2;

using Result = StatusOr<std::optional<Element>>;

class PrefetchIterator final : public IteratorBase {
 public:
  PrefetchIterator(std::unique_ptr<DatasetIterator> in, size_t capacity)
      : in_(std::move(in)), capacity_(capacity) {}

  // Separate from the constructor so that a failure to start the thread is a Status.
  Status start() {
    try {
      thread_ = std::jthread([this](std::stop_token stop) { produce(stop); });
    } catch (const std::system_error& e) {
      return resource_exhausted(std::string("prefetch: cannot start its thread: ") + e.what());
    }
    return ok_status();
  }

  Result next() override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    Result r = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    cv_.notify_all();
    return r;
  }

 private:
  void produce(std::stop_token stop) {
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, stop, [&] { return queue_.size() < capacity_; });
        if (stop.stop_requested()) return;
      }
      Result r = pull();
      const bool last = !r.ok() || !r->has_value();
      {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(r));
      }
      cv_.notify_all();
      if (last) return;
    }
  }

  // An exception thrown by user code (a map function) must not escape the thread, where it would
  // terminate the process; it becomes an error in the stream instead.
  Result pull() {
    try {
      return in_->get_next();
    } catch (const std::exception& e) {
      return internal_error(std::string("prefetch: the input pipeline threw: ") + e.what());
    } catch (abi::__forced_unwind&) {
      throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
    } catch (...) {
      return internal_error("prefetch: the input pipeline threw a non-standard exception");
    }
  }

  std::unique_ptr<DatasetIterator> in_;
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Result> queue_;
  std::jthread thread_;  // last: stopped and joined first
};

class PrefetchNode final : public Node {
 public:
  PrefetchNode(NodePtr input, int64_t n) : Node({std::move(input)}), n_(n) {}
  std::string name() const override { return "PrefetchDataset"; }
  std::string args() const override { return n_ == kAutotune ? "AUTOTUNE" : std::to_string(n_); }
  NodePtr with_inputs(std::vector<NodePtr> in) const override {
    return std::make_shared<PrefetchNode>(std::move(in.at(0)), n_);
  }
  ElementSpec element_spec() const override { return input()->element_spec(); }
  int64_t cardinality() const override { return input()->cardinality(); }
  BatchRole batch_role() const override { return BatchRole::kPassThrough; }
  bool is_prefetch() const override { return true; }

  StatusOr<std::unique_ptr<DatasetIterator>> make_iterator() const override {
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, input()->make_iterator());
    if (n_ == 0) return in;  // TF: a zero buffer prefetches nothing
    const int64_t capacity = n_ == kAutotune ? kAutotuneBufferSize : n_;
    auto it = std::make_unique<PrefetchIterator>(std::move(in), static_cast<size_t>(capacity));
    TRIBUTARY_RETURN_IF_ERROR(it->start());
    return std::unique_ptr<DatasetIterator>(std::move(it));
  }

 private:
  int64_t n_;
};

}  // namespace

NodePtr prefetch_node(NodePtr input, int64_t buffer_size) {
  if (!input->status().ok()) return input;
  if (buffer_size < 0 && buffer_size != kAutotune) {
    return invalid("buffer_size must be >= 0 or set buffer_size to be " +
                   std::to_string(kAutotune) + " for auto-tuning");
  }
  return std::make_shared<PrefetchNode>(std::move(input), buffer_size);
}

}  // namespace tributary::data_internal
