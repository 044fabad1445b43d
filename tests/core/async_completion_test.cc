// What the front door does when an asynchronous collective ends after the call returned: a failure
// makes the backend unusable (before the caller's own callbacks run), the flight recorder records
// the end, and a Work that outlives its backend still completes safely.
#include <gtest/gtest.h>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "recording_ops.h"
#include "tributary/cross_device_ops.h"

namespace tributary {
namespace {

// The recording fake, except that its all-reduces stay pending until the test completes them.
class PendingOps final : public fakes::RecordingOps {
 public:
  PendingOps(BackendContext ctx, Capabilities caps)
      : RecordingOps("pending", std::move(ctx), Options(), std::move(caps),
                     [](const CrossDeviceOps&, const CallInfo&) {}) {}
  std::vector<Work> issued;

 protected:
  Work all_reduce_impl(const CallInfo&, ReduceOp, const PerReplica<Tensor>&,
                       const PerReplica<Tensor>&) override {
    Work w;
    issued.push_back(w);
    return w;
  }
};

class AsyncCompletion : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendContext ctx;
    ctx.devices = {Device::cpu(0)};
    Capabilities caps;
    caps.device_types = {DeviceType::kCpu};
    caps.dtypes = {DType::kFloat32};
    caps.ops = {ReduceOp::kSum};
    caps.collectives = {Collective::kAllReduce};
    ops_ = std::make_unique<PendingOps>(ctx, caps);
    data_.assign(8, 1.0f);
  }
  Work call() {
    Tensor t(data_.data(), DType::kFloat32, 8, Device::cpu(0));
    return ops_->all_reduce(ReduceOp::kSum, {t}, {t});
  }

  std::unique_ptr<PendingOps> ops_;
  std::vector<float> data_;
};

TEST_F(AsyncCompletion, SuccessLeavesTheBackendUsable) {
  Work w = call();
  ASSERT_FALSE(w.test());
  ASSERT_EQ(ops_->issued.size(), 1u);
  ops_->issued[0].complete(Status());
  EXPECT_TRUE(w.wait(std::chrono::seconds(1)).ok());
  EXPECT_TRUE(ops_->broken().ok());
  EXPECT_FALSE(call().test()) << "a second call should reach the backend";
}

// A waiter that a backend thread wakes with an error finds the backend already refusing its next
// call with that error: the front door records the failure before the Work reads as complete.
// (The backend's fault tests saw the next call reach the backend now and then under load.) To make
// the old order lose every time, the completing thread runs on the waiter's CPU at the lowest
// priority (SCHED_IDLE), so the woken waiter runs before it can go on.
#if defined(__linux__)
// Pins the calling thread to the CPU it is on, and gives it back its CPUs when it goes (also when
// an ASSERT returns early).
class PinnedHere {
 public:
  PinnedHere() {
    pinned_ = sched_getaffinity(0, sizeof original_, &original_) == 0;
    cpu_set_t here;
    CPU_ZERO(&here);
    CPU_SET(sched_getcpu(), &here);
    pinned_ = pinned_ && sched_setaffinity(0, sizeof here, &here) == 0;
  }
  ~PinnedHere() {
    if (pinned_) (void)sched_setaffinity(0, sizeof original_, &original_);
  }
  PinnedHere(const PinnedHere&) = delete;
  PinnedHere& operator=(const PinnedHere&) = delete;
  bool pinned() const { return pinned_; }

 private:
  cpu_set_t original_;
  bool pinned_ = false;
};
#endif

TEST_F(AsyncCompletion, AWaiterWokenByAFailureFindsTheBackendRefusing) {
  for (int round = 0; round < 20; ++round) {
    SetUp();
    Work w = call();
    ASSERT_EQ(ops_->issued.size(), 1u);
#if defined(__linux__)
    PinnedHere pin;  // this thread, for the round
    ASSERT_TRUE(pin.pinned());
#endif
    const Work issued = ops_->issued[0];  // a copy: a call that reaches the backend adds to `issued`
    std::thread completer([issued] {
#if defined(__linux__)
      sched_param lowest{};
      (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &lowest);
#endif
      issued.complete(unavailable("peer 1 is gone"));
    });
    const Status first = w.wait(std::chrono::seconds(10));
    const Status again = ops_->broken();
    Work next = call();
    completer.join();
    EXPECT_EQ(first.code(), StatusCode::kUnavailable);
    EXPECT_EQ(again.code(), StatusCode::kUnavailable) << "round " << round;
    EXPECT_TRUE(next.test()) << "round " << round << ": the next call reached the backend";
    EXPECT_EQ(next.error().code(), StatusCode::kFailedPrecondition) << next.error().to_string();
    EXPECT_NE(next.error().message().find("peer 1 is gone"), std::string::npos);
  }
}

// The first failure's flight-recorder dump goes to the log sink, which is user code (the C API's
// log callback; a Python one takes the GIL): it runs after the waiters woke, so a waiter holding
// what the sink wants cannot deadlock with it. Here the sink holds the completing thread until the
// waiter has returned; were the dump run before the Work reads as complete, the wait would time out.
TEST_F(AsyncCompletion, TheFirstFailuresDumpDoesNotHoldTheWaiter) {
  std::atomic<bool> waiter_returned{false};
  std::atomic<bool> sink_called{false};
  internal::set_log_sink([&](internal::LogLevel, std::string_view, std::string_view) {
    sink_called.store(true);
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!waiter_returned.load() && std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  Work w = call();
  ASSERT_EQ(ops_->issued.size(), 1u);
  const Work issued = ops_->issued[0];
  std::thread completer([issued] { issued.complete(unavailable("peer 1 is gone")); });
  const Status got = w.wait(std::chrono::seconds(3));
  waiter_returned.store(true);
  completer.join();
  internal::set_log_sink(nullptr);
  EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got.to_string();
  EXPECT_TRUE(sink_called.load()) << "the failure was not dumped to the log sink";
  // And the failure was recorded before the waiter woke.
  EXPECT_EQ(call().error().code(), StatusCode::kFailedPrecondition);
}

TEST_F(AsyncCompletion, ALateFailureBreaksTheBackendBeforeTheCallersCallbacksRun) {
  Work first = call();
  Work second = call();
  ASSERT_EQ(ops_->issued.size(), 2u);
  Status broken_in_callback;
  int callbacks = 0;
  first.on_complete([&](const Status& s) {
    ++callbacks;
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    broken_in_callback = ops_->broken();
  });
  ops_->issued[0].complete(unavailable("peer 1 is gone"));
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(broken_in_callback.code(), StatusCode::kUnavailable) << broken_in_callback.to_string();
  EXPECT_NE(broken_in_callback.message().find("peer 1 is gone"), std::string::npos);
  // Only the first failure is kept; a later one does not replace it.
  ops_->issued[1].complete(internal_error("second failure"));
  EXPECT_NE(ops_->broken().message().find("peer 1 is gone"), std::string::npos)
      << ops_->broken().to_string();
  // Completing again changes nothing and runs nothing twice.
  ops_->issued[0].complete(Status());
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(first.error().code(), StatusCode::kUnavailable);
  Status refused = call().wait(std::chrono::seconds(1));
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_NE(refused.message().find("unusable after an earlier failure"), std::string::npos)
      << refused.message();
  EXPECT_EQ(ops_->issued.size(), 2u) << "a broken backend must not be called";
}

TEST_F(AsyncCompletion, AWorkThatOutlivesItsBackendStillCompletes) {
  Work w = call();
  Work pending = ops_->issued[0];
  ops_.reset();
  // The flight recorder, which the Work keeps alive, still records the end: its dump of the first
  // failure names it.
  ::testing::internal::CaptureStderr();
  pending.complete(unavailable("ended after the backend"));
  const std::string dump = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(w.wait(std::chrono::seconds(1)).code(), StatusCode::kUnavailable);
  EXPECT_NE(dump.find("all_reduce #1"), std::string::npos) << dump;
  EXPECT_NE(dump.find("failed after"), std::string::npos) << dump;
  EXPECT_NE(dump.find("ended after the backend"), std::string::npos) << dump;
}

}  // namespace
}  // namespace tributary
