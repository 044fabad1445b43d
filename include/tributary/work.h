// Work: the handle of an issued collective, as in torch.distributed.
//
// A Work completes exactly once, with an OK or error Status. wait() blocks up to a timeout; a wait
// that times out returns kDeadlineExceeded and leaves the Work pending (the collective itself has its
// own timeout, from the backend spec, after which it completes with an error). Buffers passed to the
// collective must stay alive until the Work has completed. Work is a cheap, copyable handle; all its
// methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

class Work {
 public:
  using Clock = std::chrono::steady_clock;

  Work();  // a pending Work; complete it with complete()
  static Work completed(Status status = Status());

  // Blocks until complete or until `timeout` passes. Returns the collective's Status, or
  // kDeadlineExceeded when the wait timed out first.
  Status wait(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) const;
  // True once the collective has completed (successfully or not). A GPU collective is checked on
  // the device (its events) by this call.
  bool test() const;
  // The error of a completed Work; OK while pending or after success.
  Status error() const;
  // Wall time from the Work's creation to its completion (zero while pending). Backends that run
  // the collective before returning hand back an already complete Work: time the call instead.
  std::chrono::nanoseconds elapsed() const;

  // For collectives on GPU memory: makes the CUDA stream `cuda_stream` (a cudaStream_t passed as
  // void*; nullptr is the legacy default stream) wait, on the device, until the collective's
  // results are written, without blocking the host: what NCCL users do after an ncclAllReduce.
  // A Work without a device-side completion (host backends, or one already complete) is waited for
  // from the host instead, up to `timeout`. Returns the collective's Status when known, else OK
  // once the stream will wait (a later failure still shows in wait() and error()).
  Status wait_stream(void* cuda_stream,
                     std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) const;

  // For backends: completes the Work (later calls are ignored) and runs the callbacks.
  void complete(Status status) const;
  // For the front door: runs `fn` on completion (at once when already complete).
  void on_complete(std::function<void(const Status&)> fn) const;
  // For backends that complete on a device (a GPU collective's CUDA events): what wait(), test()
  // and wait_stream() consult while the Work is pending.
  class DeviceCompletion {
   public:
    virtual ~DeviceCompletion() = default;
    // A cheap, thread-safe check, run by wait() and test() on the calling thread, so that a host
    // waiting for a GPU collective sees its end at once instead of being woken by the backend's
    // own thread (as cudaStreamSynchronize polls on the caller's thread). True once the results
    // are in place and no failure is known; the Work then completes with OK. Errors and timeouts
    // still come from the backend, which completes the Work itself (a later complete() is
    // ignored).
    virtual bool done() const = 0;
    // Makes `cuda_stream` wait on the device until the results are written (e.g.
    // cudaStreamWaitEvent on the collective's events). An error when that cannot be promised,
    // e.g. the backend has failed and its events may have been ended by an abort; wait_stream()
    // then returns the Work's own error when the backend has set it, else this one.
    virtual Status block_stream(void* cuda_stream) const = 0;
  };
  // One object per Work, which the backend may recycle once the Work lets go of it (use_count).
  void set_device_completion(std::shared_ptr<const DeviceCompletion> completion) const;

 private:
  friend class CrossDeviceOps;
  // Complete as far as the host knows, without checking the device (test() does): the front door
  // asks this of every Work it hands out.
  bool completed_on_host() const;
  // After a complete() that may have been ignored: waits until the Work is done (another thread
  // that claimed it first is running the observer's ending(), a few lock-free stores and one
  // short lock) and returns its status.
  Status finish_completing() const;
  // The front door's own bookkeeping at completion: one slot in the Work's state, so that an
  // asynchronous collective pays no allocation for it (a callback would allocate twice per call).
  class Observer {
   public:
    virtual ~Observer() = default;
    // Before any waiter can see the Work complete, so that a caller woken by an error finds the
    // instance already refusing its next call with it: bookkeeping only, no I/O and no user code
    // (a waiter may hold a lock such code wants, e.g. Python's GIL).
    virtual void ending(uint64_t sequence, const Status& status) = 0;
    // After the waiters are woken and before the callbacks: what may take time or call user code
    // (the flight recorder's dump on the first failure, the timeline).
    virtual void ended(uint64_t sequence, const Status& status) = 0;
  };
  void observe(std::shared_ptr<Observer> observer, uint64_t sequence) const;

  struct State;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
