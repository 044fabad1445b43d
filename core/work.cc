#include "tributary/work.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tributary {

struct Work::State {
  mutable std::mutex mu;
  std::condition_variable cv;
  // complete() claims the Work (and sets `status` and `end`), runs the observer's ending(), then
  // marks it done: no waiter sees it done before the front door has recorded how it ended.
  bool claimed = false;
  bool done = false;
  // Set (release) after `status` and `end`, which never change again: a completed Work is read
  // without the lock, so a synchronous collective's test(), error() and wait() cost no lock and no
  // clock read.
  std::atomic<bool> finished{false};
  Status status;
  Clock::time_point start = Clock::now();
  Clock::time_point end{};
  std::vector<std::function<void(const Status&)>> callbacks;
  // The front door's bookkeeping (observe()), run before the callbacks.
  std::shared_ptr<Observer> observer;
  uint64_t observed_sequence = 0;
  // A collective that completes on a device: checked by wait() and test(), and what wait_stream()
  // makes a stream wait for. Null once complete.
  std::shared_ptr<const DeviceCompletion> device;
};

namespace {
Status wait_timed_out(std::chrono::milliseconds timeout) {
  return deadline_exceeded("the collective did not complete within the " +
                           std::to_string(timeout.count()) +
                           " ms this wait allowed; it is still pending (its own timeout is the "
                           "backend's timeout= option)");
}
}  // namespace

Work::Work() : state_(std::make_shared<State>()) {}

Work Work::completed(Status status) {
  if (status.ok()) {
    // Every successful synchronous collective returns this: one shared, completed state, so that
    // a small message pays no allocation here. Nothing changes a completed state (complete() is
    // ignored, callbacks run at once), so sharing it is safe. Never destroyed: Works may outlive
    // static destruction.
    static const std::shared_ptr<State>* const kDone = [] {
      auto state = std::make_shared<State>();
      state->claimed = true;
      state->done = true;
      state->end = state->start;
      state->finished.store(true, std::memory_order_release);
      return new std::shared_ptr<State>(std::move(state));
    }();
    Work w(*kDone);
    return w;
  }
  Work w;
  w.complete(std::move(status));
  return w;
}

Status Work::wait(std::chrono::milliseconds timeout) const {
  if (state_->finished.load(std::memory_order_acquire)) return state_->status;
  std::unique_lock lock(state_->mu);
  if (state_->device && !state_->done) {
    // A device-side collective: poll it on this thread, closely for the first millisecond (a
    // collective on a GPU takes microseconds), then between short sleeps that the backend's own
    // completion also ends.
    const std::shared_ptr<const DeviceCompletion> device = state_->device;
    lock.unlock();
    const auto begin = Clock::now();
    const auto deadline = begin + timeout;
    for (;;) {
      if (state_->finished.load(std::memory_order_acquire)) return state_->status;
      if (device->done()) {
        complete(Status());  // ignored if the backend completed it first, with whatever status
        return finish_completing();
      }
      const auto now = Clock::now();
      if (now >= deadline) return wait_timed_out(timeout);
      if (now - begin < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        lock.lock();
        state_->cv.wait_for(lock, std::min<Clock::duration>(std::chrono::microseconds(200),
                                                            deadline - now),
                            [&] { return state_->done; });
        lock.unlock();
      }
    }
  }
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    return wait_timed_out(timeout);
  }
  return state_->status;
}

bool Work::test() const {
  if (state_->finished.load(std::memory_order_acquire)) return true;
  std::shared_ptr<const DeviceCompletion> device;
  {
    std::lock_guard lock(state_->mu);
    if (state_->done) return true;
    device = state_->device;
  }
  if (device && device->done()) {
    complete(Status());  // ignored if the backend completed it first
    (void)finish_completing();
    return true;
  }
  return false;
}

Status Work::finish_completing() const {
  if (state_->finished.load(std::memory_order_acquire)) return state_->status;
  // Claimed by another thread (the backend's), whose observer is running: it is done in moments.
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

bool Work::completed_on_host() const {
  if (state_->finished.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

Status Work::error() const {
  if (state_->finished.load(std::memory_order_acquire)) return state_->status;
  std::lock_guard lock(state_->mu);
  return state_->done ? state_->status : Status();
}

std::chrono::nanoseconds Work::elapsed() const {
  std::lock_guard lock(state_->mu);
  return state_->done ? state_->end - state_->start : std::chrono::nanoseconds(0);
}

void Work::complete(Status status) const {
  std::shared_ptr<Observer> observer;
  uint64_t sequence = 0;
  {
    std::lock_guard lock(state_->mu);
    if (state_->claimed) return;  // completed, or being completed, already
    state_->claimed = true;
    state_->status = std::move(status);  // final: written by this thread only, now
    state_->end = Clock::now();
    observer.swap(state_->observer);
    sequence = state_->observed_sequence;
  }
  // The front door's bookkeeping (the instance's first failure, the flight recorder's entry) runs
  // before any waiter can see the Work complete: a caller whose wait() returned an error finds the
  // instance refusing its next call with that error, whichever thread completed the Work. What
  // may call user code (the recorder's dump) runs after the waiters woke.
  if (observer) observer->ending(sequence, state_->status);
  std::vector<std::function<void(const Status&)>> callbacks;
  {
    std::lock_guard lock(state_->mu);
    state_->done = true;
    callbacks.swap(state_->callbacks);
    state_->device = nullptr;
    state_->finished.store(true, std::memory_order_release);
  }
  state_->cv.notify_all();
  if (observer) observer->ended(sequence, state_->status);
  for (auto& fn : callbacks) fn(state_->status);
}

void Work::observe(std::shared_ptr<Observer> observer, uint64_t sequence) const {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->claimed) {
      state_->observer = std::move(observer);
      state_->observed_sequence = sequence;
      return;
    }
  }
  // Claimed: the status is final (and the completing thread, which found no observer, does not
  // run it).
  observer->ending(sequence, state_->status);
  observer->ended(sequence, state_->status);
}

Status Work::wait_stream(void* cuda_stream, std::chrono::milliseconds timeout) const {
  std::shared_ptr<const DeviceCompletion> device;
  {
    std::lock_guard lock(state_->mu);
    device = state_->device;
    if (state_->claimed) device = nullptr;  // its status is final: wait() returns it in moments
  }
  if (!device) return wait(timeout);
  Status blocked = device->block_stream(cuda_stream);
  if (!blocked.ok()) {
    // The device completion refuses when its backend has failed (its events may have been ended
    // by an abort); the Work's own error, once the backend has set it, says what happened.
    bool failed = false;
    {
      std::lock_guard lock(state_->mu);
      failed = state_->claimed && !state_->status.ok();
    }
    if (failed) return finish_completing();
  }
  return blocked;
}

void Work::set_device_completion(std::shared_ptr<const DeviceCompletion> completion) const {
  std::lock_guard lock(state_->mu);
  if (!state_->done) state_->device = std::move(completion);
}

void Work::on_complete(std::function<void(const Status&)> fn) const {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(fn));
      return;
    }
  }
  fn(state_->status);
}

}  // namespace tributary
