// StreamProgress<Marker>: how far a backend's device streams have got, with completion markers
// (CUDA events) recorded lazily, when someone asks, instead of one per call.
//
// A GPU backend hands out a Work per collective, enqueued on its own streams, in issue order. To
// say when call #s is done it used to record an event after every call: a driver call (and the
// stream's lock) on the issuing thread, per collective, that NCCL's own users do not pay. Here the
// issuing thread only publishes the newest sequence it has finished enqueueing (an atomic store).
// A marker is recorded when a question needs one: the watchdog polling what is pending, or a
// caller's wait(), test() or wait_stream(). A marker recorded after reading `enqueued` = S follows
// every call up to S on every stream, so once it fires all of them are done; it may also follow
// later calls that were enqueued meanwhile, so a stream made to wait on it (wait_stream) may wait
// for those too: correct, at worst later than needed. One marker answers for every call it covers,
// so a burst of calls costs one record per question, not one per call.
//
// Marker is a movable type with
//   Status record();                   // on every stream, now
//   StatusOr<bool> query() const;      // fired on every stream (an error the device reported)
//   Status block(void* stream) const;  // makes `stream` wait for it on the device
// and `make` creates a new one (markers are recycled once fired). Calls must be enqueued in
// sequence order by one thread at a time (the backend's launch lock), sequences starting at 1.
// Thread-safe otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "core/fifo_ring.h"
#include "tributary/status.h"

namespace tributary::internal {

template <typename Marker>
class StreamProgress {
 public:
  explicit StreamProgress(std::function<StatusOr<Marker>()> make) : make_(std::move(make)) {}
  StreamProgress(const StreamProgress&) = delete;
  StreamProgress& operator=(const StreamProgress&) = delete;

  // The issuing thread: every call up to `sequence` is on the streams.
  void enqueued(uint64_t sequence) { enqueued_.store(sequence, std::memory_order_release); }

  // Every call up to this one has finished on the device, as far as a marker has shown.
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }

  // True once call `sequence` (enqueued) has finished on the device. When no marker in flight
  // covers it, records one and asks it at once (the stream may be idle already: a caller that
  // waits right after the call then needs no second look). Never sleeps on this class's lock:
  // when another thread holds it (the watchdog and a waiting caller may ask at once), the answer
  // is false for now, and the asker asks again.
  StatusOr<bool> reached(uint64_t sequence) {
    if (completed() >= sequence) return true;
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    TRIBUTARY_RETURN_IF_ERROR(retire());
    if (completed() >= sequence) return true;
    if (closed_) return false;
    if (in_flight_.empty() || in_flight_.back().covers < sequence) {
      TRIBUTARY_RETURN_IF_ERROR(record(sequence).status());
      TRIBUTARY_RETURN_IF_ERROR(retire());
    }
    return completed() >= sequence;
  }

  // Makes `stream` wait on the device until call `sequence` has finished (nothing to do when it
  // has). Recording a marker for it when none in flight covers it.
  Status block(uint64_t sequence, void* stream) {
    if (completed() >= sequence) return Status();
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < in_flight_.size(); ++i) {
      if (in_flight_[i].covers >= sequence) return in_flight_[i].marker.block(stream);
    }
    if (closed_) {
      return failed_precondition(
          "the backend that ran this collective is gone; its streams cannot be waited for");
    }
    TRIBUTARY_ASSIGN_OR_RETURN(const Marker* m, record(sequence));
    return m->block(stream);
  }

  // No marker is recorded after this (the streams are about to be destroyed); questions are then
  // answered from what markers already showed.
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }

  // Markers recorded and not yet seen to fire, and markers kept for reuse (for tests).
  size_t in_flight() const {
    std::lock_guard lock(mu_);
    return in_flight_.size();
  }
  size_t spare() const {
    std::lock_guard lock(mu_);
    return spare_.size();
  }

 private:
  struct InFlight {
    Marker marker;
    uint64_t covers;  // every call up to this one precedes the marker on every stream
  };

  // Queries the markers in flight, oldest first, up to the first that has not fired; a fired one
  // moves `completed` to what it covers and goes back to the spares.
  Status retire() {
    while (!in_flight_.empty()) {
      TRIBUTARY_ASSIGN_OR_RETURN(const bool fired, in_flight_.front().marker.query());
      if (!fired) break;
      completed_.store(in_flight_.front().covers, std::memory_order_release);
      spare_.push_back(std::move(in_flight_.front().marker));
      in_flight_.pop_front();
    }
    return Status();
  }

  // Records a marker after everything enqueued so far, which must include `sequence`.
  StatusOr<const Marker*> record(uint64_t sequence) {
    const uint64_t covers = enqueued_.load(std::memory_order_acquire);
    if (covers < sequence) {
      return internal_error("a completion was asked for collective #" + std::to_string(sequence) +
                            " before it was enqueued (the newest enqueued is #" +
                            std::to_string(covers) + ")");
    }
    if (spare_.empty()) {
      TRIBUTARY_ASSIGN_OR_RETURN(Marker fresh, make_());
      spare_.push_back(std::move(fresh));
    }
    Marker m = std::move(spare_.back());
    spare_.pop_back();
    if (Status s = m.record(); !s.ok()) {
      spare_.push_back(std::move(m));
      return s;
    }
    in_flight_.push_back(InFlight{std::move(m), covers});
    return &in_flight_.back().marker;
  }

  const std::function<StatusOr<Marker>()> make_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  mutable std::mutex mu_;  // in_flight_, spare_, closed_, and every record and query
  FifoRing<InFlight> in_flight_;  // oldest first; their `covers` increase
  std::vector<Marker> spare_;
  bool closed_ = false;
};

}  // namespace tributary::internal
