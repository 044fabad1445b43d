// LaunchGate: keeps a backend from freeing its communicators under a thread that is inside the
// library that owns them (NCCL), while a failure found on another thread (the watchdog) still ends
// every call promptly.
//
// The gate is made with the backend's `teardown` (NCCL: abort the communicators). A thread that
// hands a collective to the library does so inside a Launch:
//
//   LaunchGate::Launch launch(gate, &call);
//   if (launch.may_proceed()) { ... calls into the library ... }
//   if (launch.finish()) { /* the gate failed, before or during the launch: report it */ }
//
// A failure goes through fail(): it raises the flag first, then
//  - when no thread is inside a Launch, it takes the launch lock (a launch that starts now sees the
//    flag and touches nothing) and runs `teardown` itself (kTornDown);
//  - when a thread is inside, it leaves `teardown` to that thread, which runs it in finish() (or
//    in its destructor) as it leaves, under the launch lock; fail() returns kDeferred so that the
//    caller can make the library return (NCCL: revoke the communicators).
// So `teardown` runs once, never while a thread is inside a Launch. Why no failure is missed: a
// Launch publishes itself under `mu_` before it reads the flag, and fail() raises the flag before
// it reads, under `mu_`, whether a launch is published; so either fail() sees the launch (which
// then reads the flag, in finish() at the latest, after fail() raised it) or the launch sees the
// flag as it begins. Launches are serialised: one thread at a time is inside.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace tributary {
struct CallInfo;
}

namespace tributary::internal {

class LaunchGate {
 public:
  enum class Failed { kTornDown, kDeferred, kAlreadyFailed };

  explicit LaunchGate(std::function<void()> teardown) : teardown_(std::move(teardown)) {}
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;

  class Launch {
   public:
    // Blocks while another thread is inside a Launch, or while fail() tears down.
    Launch(LaunchGate& gate, const CallInfo* call);
    ~Launch();
    Launch(const Launch&) = delete;
    Launch& operator=(const Launch&) = delete;

    // False when the gate had failed as the launch began: then nothing may be handed to the
    // library.
    bool may_proceed() const { return proceed_; }
    // Leaves the launch. When the gate has failed (before or during it), runs the teardown if it
    // has not run, still holding the launch lock, and returns true. The destructor calls it when it
    // was not called.
    bool finish();

   private:
    LaunchGate& gate_;
    std::unique_lock<std::mutex> hold_;
    bool proceed_ = false;
    bool finished_ = false;
  };

  // Raises the flag, then tears down now or leaves it to the thread inside a Launch (above).
  // kAlreadyFailed: an earlier fail() raised the flag, and nothing else is done. Must not be called
  // by a thread inside a Launch. tear_down() runs the teardown, unless it has run, once no thread
  // is inside (for a backend's destructor).
  Failed fail();
  void tear_down();

  bool failed() const { return failed_->load(std::memory_order_acquire); }
  // The flag itself, for what may outlive the gate (a Work's completion probe).
  std::shared_ptr<const std::atomic<bool>> flag() const { return failed_; }

  // Calls `f` with the call of the thread inside a Launch (null when none), under the lock that
  // keeps it alive.
  template <typename F>
  auto with_launching(F f) const {
    std::lock_guard lock(mu_);
    return f(launching_);
  }

 private:
  // Runs the teardown unless it has run: under launch_mu_, which the caller holds.
  void teardown_once();

  const std::function<void()> teardown_;
  std::mutex launch_mu_;   // held by the thread inside a Launch, and by fail() while it tears down
  mutable std::mutex mu_;  // inside_, launching_
  bool inside_ = false;
  const CallInfo* launching_ = nullptr;
  bool torn_down_ = false;  // under launch_mu_
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace tributary::internal
