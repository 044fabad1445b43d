#include "tributary/work.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

namespace tributary {
namespace {

using namespace std::chrono_literals;

TEST(Work, CompletedWork) {
  Work w = Work::completed();
  EXPECT_TRUE(w.test());
  EXPECT_TRUE(w.wait(0ms).ok());
  Work e = Work::completed(aborted("peer 2 died"));
  EXPECT_EQ(e.wait(1ms).code(), StatusCode::kAborted);
  EXPECT_EQ(e.error().message(), "peer 2 died");
}

// Successful completed Works share one state: nothing done to one may show in another.
TEST(Work, CompletedOkWorksStayOk) {
  Work a = Work::completed();
  a.complete(aborted("late"));  // ignored: already complete
  int calls = 0;
  a.on_complete([&](const Status& s) {
    EXPECT_TRUE(s.ok());
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  Work b = Work::completed();
  EXPECT_TRUE(a.error().ok());
  EXPECT_TRUE(b.wait(0ms).ok());
  EXPECT_EQ(b.elapsed().count(), 0);
  EXPECT_EQ(Work::completed(aborted("x")).error().message(), "x");
  EXPECT_TRUE(Work::completed().error().ok());
}

TEST(Work, WaitTimesOutWhilePending) {
  Work w;
  EXPECT_FALSE(w.test());
  Status s = w.wait(20ms);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(w.error().ok());  // still pending, no error yet
  w.complete(Status());
  EXPECT_TRUE(w.wait(0ms).ok());
}

TEST(Work, CompletesFromAnotherThreadOnceAndRunsCallbacks) {
  Work w;
  std::atomic<int> calls{0};
  w.on_complete([&](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    calls++;
  });
  std::thread t([w] {
    w.complete(unavailable("x"));
    w.complete(Status());  // ignored
  });
  EXPECT_EQ(w.wait(10s).code(), StatusCode::kUnavailable);
  t.join();
  EXPECT_EQ(calls.load(), 1);
  w.on_complete([&](const Status&) { calls++; });  // already complete: runs at once
  EXPECT_EQ(calls.load(), 2);
  EXPECT_GT(w.elapsed().count(), 0);
}

// A stand-in for a backend's device completion (CUDA events): done() says what `ready` says.
class FakeDevice : public Work::DeviceCompletion {
 public:
  explicit FakeDevice(std::function<bool()> ready) : ready_(std::move(ready)) {}
  bool done() const override {
    ++checks;
    return ready_();
  }
  Status block_stream(void* stream) const override {
    if (refuse) return refuse();
    blocked = stream;
    return Status();
  }
  mutable std::atomic<int> checks{0};
  mutable void* blocked = nullptr;
  std::function<Status()> refuse;  // set: block_stream() runs it and returns its error

 private:
  std::function<bool()> ready_;
};

// A device-side Work: wait() polls the device on the waiting thread.
TEST(Work, WaitPollsTheDeviceAndCompletesOnceItSaysDone) {
  Work w;
  std::atomic<int> callbacks{0};
  w.on_complete([&](const Status& s) {
    EXPECT_TRUE(s.ok());
    callbacks++;
  });
  auto counted = std::make_shared<std::atomic<int>>(0);
  auto dev = std::make_shared<FakeDevice>([counted] { return ++*counted >= 5; });
  w.set_device_completion(dev);
  EXPECT_TRUE(w.wait(10s).ok());
  EXPECT_EQ(counted->load(), 5);
  EXPECT_TRUE(w.test());
  EXPECT_EQ(callbacks.load(), 1);
  w.complete(unavailable("late"));  // the backend's own completion afterwards is ignored
  EXPECT_TRUE(w.error().ok());
  EXPECT_EQ(counted->load(), 5);  // a completed Work never checks the device again
  EXPECT_EQ(dev.use_count(), 1);  // and has let go of it (the backend may recycle it)
}

// test() checks the device too (as torch's Work.is_completed() queries the CUDA events): a Work
// nobody waits for is seen complete without the backend's own thread.
TEST(Work, TestChecksTheDevice) {
  Work w;
  std::atomic<bool> ready{false};
  std::atomic<int> callbacks{0};
  w.on_complete([&](const Status&) { callbacks++; });
  auto dev = std::make_shared<FakeDevice>([&] { return ready.load(); });
  w.set_device_completion(dev);
  EXPECT_FALSE(w.test());
  EXPECT_EQ(dev->checks.load(), 1);
  ready = true;
  EXPECT_TRUE(w.test());
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_TRUE(w.error().ok());
  EXPECT_TRUE(w.test());
  EXPECT_EQ(dev->checks.load(), 2);
}

TEST(Work, WaitStreamBlocksTheStreamWhilePendingAndNotAfter) {
  Work w;
  auto dev = std::make_shared<FakeDevice>([] { return false; });
  w.set_device_completion(dev);
  int stream_stand_in = 0;
  EXPECT_TRUE(w.wait_stream(&stream_stand_in, 10ms).ok());
  EXPECT_EQ(dev->blocked, &stream_stand_in);
  dev->blocked = nullptr;
  w.complete(aborted("aborted"));
  EXPECT_EQ(w.wait_stream(&stream_stand_in, 10ms).code(), StatusCode::kAborted);
  EXPECT_EQ(dev->blocked, nullptr);
}

// A device completion that refuses to block a stream (its backend failed, as nccl's events do
// once the communicators are aborted): wait_stream() reports the Work's own error when the backend
// set it meanwhile, else the refusal; never OK.
TEST(Work, WaitStreamReportsARefusalWithTheWorksOwnError) {
  Work w;
  auto dev = std::make_shared<FakeDevice>([] { return false; });
  w.set_device_completion(dev);
  int stream_stand_in = 0;
  dev->refuse = [] { return aborted("the backend failed"); };
  EXPECT_EQ(w.wait_stream(&stream_stand_in, 10ms).message(), "the backend failed");
  Work* const work = &w;  // the backend fails the Work while the stream was being blocked
  dev->refuse = [work] {
    work->complete(unavailable("rank 1 died"));
    return aborted("the backend failed");
  };
  const Status s = w.wait_stream(&stream_stand_in, 10ms);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "rank 1 died");
  EXPECT_EQ(dev->blocked, nullptr);
}

TEST(Work, ABackendErrorEndsAWaitWhoseDeviceNeverSaysDone) {
  Work w;
  w.set_device_completion(std::make_shared<FakeDevice>([] { return false; }));
  std::thread t([w] {
    std::this_thread::sleep_for(5ms);  // past the close polling, into the sleeps
    w.complete(unavailable("peer died"));
  });
  EXPECT_EQ(w.wait(10s).code(), StatusCode::kUnavailable);
  t.join();
}

TEST(Work, ADeviceWaitStillTimesOut) {
  Work w;
  w.set_device_completion(std::make_shared<FakeDevice>([] { return false; }));
  EXPECT_EQ(w.wait(20ms).code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(w.test());
  EXPECT_TRUE(w.error().ok());
}

TEST(Work, AnErrorBeforeTheDeviceSaysDoneWins) {
  Work w;
  std::atomic<bool> done{false};
  w.set_device_completion(std::make_shared<FakeDevice>([&] { return done.load(); }));
  w.complete(aborted("aborted"));
  done = true;
  EXPECT_EQ(w.wait(10s).code(), StatusCode::kAborted);
  EXPECT_TRUE(w.test());
}

}  // namespace
}  // namespace tributary
