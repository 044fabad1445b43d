// FifoRing<T>: a first-in first-out queue on a ring that allocates only when it grows, for hot
// paths where std::deque's block allocations show (the nccl backend's calls in flight: a deque
// allocated a block every few calls on the issuing thread and freed it on the watchdog thread).
// Empty slots hold no T (std::optional), so T needs no default constructor and a popped element is
// destroyed at once. Not thread-safe: the owner locks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace tributary::internal {

template <typename T>
class FifoRing {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return ring_.size(); }
  // Both need a non-empty ring.
  T& front() { return *ring_[head_]; }
  T& back() { return *ring_[(head_ + size_ - 1) % ring_.size()]; }
  void push_back(T value) {
    if (size_ == ring_.size()) {
      std::vector<std::optional<T>> bigger(std::max<size_t>(16, 2 * ring_.size()));
      for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(ring_[(head_ + i) % ring_.size()]);
      ring_.swap(bigger);
      head_ = 0;
    }
    ring_[(head_ + size_) % ring_.size()].emplace(std::move(value));
    ++size_;
  }
  // Needs a non-empty ring; destroys the front element.
  void pop_front() {
    ring_[head_].reset();
    head_ = (head_ + 1) % ring_.size();
    --size_;
  }

 private:
  std::vector<std::optional<T>> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace tributary::internal
