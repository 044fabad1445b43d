#include "tributary/work.h"

#include <gtest/gtest.h>

#include <atomic>
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

// A device-side Work: wait() polls the backend's probe on the waiting thread.
TEST(Work, WaitPollsTheCompletionProbeAndCompletesOnceItSaysDone) {
  Work w;
  std::atomic<int> probes{0};
  std::atomic<int> callbacks{0};
  w.on_complete([&](const Status& s) {
    EXPECT_TRUE(s.ok());
    callbacks++;
  });
  w.set_completion_probe([&] { return ++probes >= 5; });
  EXPECT_FALSE(w.test());  // test() does not run the probe
  EXPECT_EQ(probes.load(), 0);
  EXPECT_TRUE(w.wait(10s).ok());
  EXPECT_EQ(probes.load(), 5);
  EXPECT_TRUE(w.test());
  EXPECT_EQ(callbacks.load(), 1);
  w.complete(unavailable("late"));  // the backend's own completion afterwards is ignored
  EXPECT_TRUE(w.error().ok());
  EXPECT_EQ(probes.load(), 5);  // a completed Work never probes again
}

TEST(Work, ABackendErrorEndsAWaitWhoseProbeNeverSaysDone) {
  Work w;
  w.set_completion_probe([] { return false; });
  std::thread t([w] {
    std::this_thread::sleep_for(5ms);  // past the close polling, into the sleeps
    w.complete(unavailable("peer died"));
  });
  EXPECT_EQ(w.wait(10s).code(), StatusCode::kUnavailable);
  t.join();
}

TEST(Work, AProbedWaitStillTimesOut) {
  Work w;
  w.set_completion_probe([] { return false; });
  EXPECT_EQ(w.wait(20ms).code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(w.test());
  EXPECT_TRUE(w.error().ok());
}

TEST(Work, AnErrorBeforeTheProbeSaysDoneWins) {
  Work w;
  std::atomic<bool> done{false};
  w.set_completion_probe([&] { return done.load(); });
  w.complete(aborted("aborted"));
  done = true;
  EXPECT_EQ(w.wait(10s).code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace tributary
