// CrossDeviceOps::abort from another thread, at the front door: while a call is in flight the
// backend is interrupted (never abandoned under the call's feet), and the call's thread abandons
// it as the call returns; with none in flight the aborting thread abandons it at once; either way
// the peers are told exactly once. A fake backend stands in (the layer above the backends may be
// tested with one); each real multi-process backend's interrupt() is tested with real processes in
// fault_test (AbortFromAnotherThread). ThreadSanitizer runs these (scripts/sanitize.sh thread).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/core/recording_ops.h"

namespace tributary {
namespace {

using namespace std::chrono_literals;

// A fake of a two-process backend whose all-reduce, when `block` is set, waits until interrupted
// (at most 20 s) and then fails with the interrupt's reason, as a transport's wait does.
class AbortableOps final : public fakes::RecordingOps {
 public:
  explicit AbortableOps(bool block)
      : RecordingOps("abortable", two_processes(), Options(), capabilities(),
                     [](const CrossDeviceOps&, const CallInfo&) {}),
        block_(block) {}

  // Waits (at most 20 s) until a call is inside the backend.
  bool wait_until_entered() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 20s, [&] { return entered_; });
  }

  std::atomic<int> interrupts{0};
  std::atomic<int> abandons{0};
  std::atomic<bool> abandoned_during_a_call{false};
  Status abandoned_with() {
    std::lock_guard lock(mu_);
    return abandoned_with_;
  }

 protected:
  Work all_reduce_impl(const CallInfo&, ReduceOp, const PerReplica<Tensor>&,
                       const PerReplica<Tensor>&) override {
    in_call_.store(true);
    Status s;
    if (block_) {
      std::unique_lock lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, 20s, [&] { return !interrupted_.ok(); });
      s = interrupted_.ok() ? deadline_exceeded("the fake's own timeout") : interrupted_;
    }
    in_call_.store(false);
    return Work::completed(s);
  }
  void interrupt(const Status& why) override {
    ++interrupts;
    {
      std::lock_guard lock(mu_);
      interrupted_ = why;
    }
    cv_.notify_all();
  }
  void abandon(const Status& why) override {
    if (in_call_.load()) abandoned_during_a_call.store(true);
    ++abandons;
    std::lock_guard lock(mu_);
    abandoned_with_ = why;
  }

 private:
  static BackendContext two_processes() {
    BackendContext ctx;
    ctx.rank = 0;
    ctx.world_size = 2;
    return ctx;
  }
  static Capabilities capabilities() {
    Capabilities caps;
    caps.device_types = {DeviceType::kCpu};
    caps.dtypes = {DType::kFloat32};
    caps.ops = {ReduceOp::kSum};
    caps.collectives = {Collective::kAllReduce};
    return caps;
  }

  const bool block_;
  std::atomic<bool> in_call_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  Status interrupted_;
  Status abandoned_with_;
};

struct Data {
  std::vector<float> v = std::vector<float>(8, 1.0f);
  PerReplica<Tensor> x{Tensor(v.data(), DType::kFloat32, int64_t{8})};
};

TEST(AbortFromAnotherThread, InterruptsTheCallInFlightAndAbandonsOnceItReturned) {
  AbortableOps ops(/*block=*/true);
  Data d;
  Status result;
  std::thread caller([&] { result = ops.all_reduce(ReduceOp::kSum, d.x, d.x).wait(30s); });
  ASSERT_TRUE(ops.wait_until_entered());
  ops.abort(aborted("the watchdog gave up"));
  caller.join();
  EXPECT_EQ(ops.interrupts.load(), 1);
  EXPECT_EQ(ops.abandons.load(), 1);
  EXPECT_FALSE(ops.abandoned_during_a_call.load());
  EXPECT_EQ(ops.abandoned_with().message(), "the watchdog gave up");
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.to_string();
  EXPECT_NE(result.message().find("the watchdog gave up"), std::string::npos) << result.message();
  EXPECT_EQ(ops.broken().message(), "the watchdog gave up");
  // A second abort changes nothing; later calls are refused, quoting the first.
  ops.abort(aborted("another reason"));
  EXPECT_EQ(ops.interrupts.load(), 1);
  EXPECT_EQ(ops.abandons.load(), 1);
  const Status later = ops.all_reduce(ReduceOp::kSum, d.x, d.x).wait(1s);
  EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(later.message().find("the watchdog gave up"), std::string::npos) << later.message();
}

TEST(AbortFromAnotherThread, WithNoCallInFlightAbandonsAtOnce) {
  AbortableOps ops(/*block=*/false);
  Data d;
  ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, d.x, d.x).wait(1s).ok());
  std::thread([&] { ops.abort(aborted("stop")); }).join();
  EXPECT_EQ(ops.interrupts.load(), 0);
  EXPECT_EQ(ops.abandons.load(), 1);
  EXPECT_EQ(ops.broken().message(), "stop");
}

// Aborts that race with calls that return at once: however they interleave, the backend is
// abandoned exactly once, never during a call, and an interrupt comes only while a call holds it.
TEST(AbortFromAnotherThread, RacingCallsAbandonExactlyOnceAndNeverDuringACall) {
  for (int i = 0; i < 300; ++i) {
    AbortableOps ops(/*block=*/false);
    Data d;
    std::atomic<bool> go{false};
    std::thread caller([&] {
      while (!go.load()) std::this_thread::yield();
      for (int k = 0; k < 20; ++k) (void)ops.all_reduce(ReduceOp::kSum, d.x, d.x).wait(1s);
    });
    std::thread aborter([&] {
      while (!go.load()) std::this_thread::yield();
      for (int k = 0; k < i % 7; ++k) std::this_thread::yield();
      ops.abort(aborted("raced"));
    });
    go.store(true);
    caller.join();
    aborter.join();
    ASSERT_EQ(ops.abandons.load(), 1) << "iteration " << i;
    ASSERT_FALSE(ops.abandoned_during_a_call.load()) << "iteration " << i;
    ASSERT_LE(ops.interrupts.load(), 1) << "iteration " << i;
    ASSERT_EQ(ops.abandoned_with().message(), "raced");
  }
}

}  // namespace
}  // namespace tributary
