// StreamProgress (core/stream_progress.h): the nccl backend's lazily recorded completion markers,
// tested on CPU with a simulated stream, since CI never runs the nccl code that uses them.
#include "core/stream_progress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace tributary::internal {
namespace {

// A stand-in for a device stream: calls are submitted in order and executed in order, later.
struct FakeStream {
  std::atomic<uint64_t> submitted{0};  // calls on the stream
  std::atomic<uint64_t> executed{0};   // calls the device has finished
  std::atomic<int> records{0};
  std::atomic<int> made{0};
  std::atomic<bool> fail_queries{false};
  std::vector<std::pair<void*, uint64_t>> blocked;  // (stream, position) per block()
};

// A marker (a CUDA event): fires once the device has executed what preceded its record.
class FakeMarker {
 public:
  explicit FakeMarker(FakeStream* s) : s_(s) {}
  Status record() {
    position_ = s_->submitted.load();
    s_->records++;
    return Status();
  }
  StatusOr<bool> query() const {
    if (s_->fail_queries.load()) return internal_error("an illegal memory access (fake)");
    return s_->executed.load() >= position_;
  }
  Status block(void* stream) const {
    s_->blocked.emplace_back(stream, position_);
    return Status();
  }

 private:
  FakeStream* s_;
  uint64_t position_ = 0;
};

std::unique_ptr<StreamProgress<FakeMarker>> make_progress(FakeStream& s) {
  return std::make_unique<StreamProgress<FakeMarker>>([&s]() -> StatusOr<FakeMarker> {
    s.made++;
    return FakeMarker(&s);
  });
}

// What a backend's launch does: the call goes on the stream, then is published as enqueued.
void launch(FakeStream& s, StreamProgress<FakeMarker>& p, uint64_t sequence) {
  s.submitted.store(sequence);
  p.enqueued(sequence);
}

TEST(StreamProgress, EnqueueingRecordsNothingAQuestionRecordsOneMarker) {
  FakeStream s;
  auto p = make_progress(s);
  for (uint64_t i = 1; i <= 10; ++i) launch(s, *p, i);
  EXPECT_EQ(s.records.load(), 0);  // the point: no marker per call
  EXPECT_FALSE(*p->reached(4));
  EXPECT_EQ(s.records.load(), 1);
  EXPECT_FALSE(*p->reached(10));  // the marker already covers #10: no second record
  EXPECT_EQ(s.records.load(), 1);
  s.executed = 9;
  EXPECT_FALSE(*p->reached(4));  // the marker follows #10, so #4 is not known done yet
  EXPECT_EQ(p->completed(), 0u);
  s.executed = 10;
  EXPECT_TRUE(*p->reached(4));
  EXPECT_EQ(p->completed(), 10u);
  EXPECT_TRUE(*p->reached(10));
  EXPECT_EQ(s.records.load(), 1);
}

TEST(StreamProgress, AMarkerCoversOnlyWhatWasEnqueuedBeforeIt) {
  FakeStream s;
  auto p = make_progress(s);
  launch(s, *p, 1);
  launch(s, *p, 2);
  EXPECT_FALSE(*p->reached(2));
  launch(s, *p, 3);
  EXPECT_FALSE(*p->reached(3));  // not covered by the first marker: a second one
  EXPECT_EQ(s.records.load(), 2);
  EXPECT_EQ(p->in_flight(), 2u);
  s.executed = 2;
  EXPECT_FALSE(*p->reached(3));
  EXPECT_EQ(p->completed(), 2u);  // the first marker fired
  EXPECT_TRUE(*p->reached(2));
  s.executed = 3;
  EXPECT_TRUE(*p->reached(3));
  EXPECT_EQ(p->in_flight(), 0u);
}

// A marker is asked at once after it is recorded: on an idle stream the first question answers.
TEST(StreamProgress, AQuestionAboutAFinishedCallAnswersAtOnce) {
  FakeStream s;
  auto p = make_progress(s);
  launch(s, *p, 1);
  s.executed = 1;
  EXPECT_TRUE(*p->reached(1));
  EXPECT_EQ(s.records.load(), 1);
  EXPECT_EQ(p->in_flight(), 0u);
}

TEST(StreamProgress, FiredMarkersAreReused) {
  FakeStream s;
  auto p = make_progress(s);
  for (uint64_t i = 1; i <= 100; ++i) {
    launch(s, *p, i);
    EXPECT_FALSE(*p->reached(i));
    s.executed = i;
    EXPECT_TRUE(*p->reached(i));
  }
  EXPECT_EQ(s.records.load(), 100);
  EXPECT_EQ(s.made.load(), 1);  // one marker, recycled
  EXPECT_EQ(p->spare(), 1u);
}

TEST(StreamProgress, BlockWaitsOnTheEarliestMarkerThatCoversTheCall) {
  FakeStream s;
  auto p = make_progress(s);
  int stream = 0;
  launch(s, *p, 1);
  launch(s, *p, 2);
  EXPECT_FALSE(*p->reached(1));  // a marker after #2
  launch(s, *p, 3);
  ASSERT_TRUE(p->block(2, &stream).ok());
  ASSERT_EQ(s.blocked.size(), 1u);
  EXPECT_EQ(s.blocked[0].second, 2u);  // the existing marker, not a new one
  EXPECT_EQ(s.records.load(), 1);
  ASSERT_TRUE(p->block(3, &stream).ok());  // none covers #3: recorded after it
  ASSERT_EQ(s.blocked.size(), 2u);
  EXPECT_EQ(s.blocked[1].second, 3u);
  EXPECT_EQ(s.records.load(), 2);
  s.executed = 3;
  EXPECT_TRUE(*p->reached(3));
  ASSERT_TRUE(p->block(3, &stream).ok());  // done: nothing to wait for
  EXPECT_EQ(s.blocked.size(), 2u);
}

TEST(StreamProgress, AfterCloseNothingIsRecorded) {
  FakeStream s;
  auto p = make_progress(s);
  launch(s, *p, 1);
  EXPECT_FALSE(*p->reached(1));
  launch(s, *p, 2);
  p->close();
  int stream = 0;
  EXPECT_FALSE(*p->reached(2));
  EXPECT_EQ(s.records.load(), 1);
  EXPECT_TRUE(p->block(1, &stream).ok());  // the marker in flight still serves
  EXPECT_EQ(p->block(2, &stream).code(), StatusCode::kFailedPrecondition);
  s.executed = 2;
  EXPECT_TRUE(*p->reached(1));  // what was recorded still answers
  EXPECT_FALSE(*p->reached(2));
}

TEST(StreamProgress, ADeviceErrorIsReportedNotTakenForProgress) {
  FakeStream s;
  auto p = make_progress(s);
  launch(s, *p, 1);
  EXPECT_FALSE(*p->reached(1));
  s.executed = 1;
  s.fail_queries = true;
  const StatusOr<bool> r = p->reached(1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("illegal memory access"), std::string::npos);
  EXPECT_EQ(p->completed(), 0u);
}

TEST(StreamProgress, AQuestionAboutACallNotYetEnqueuedIsAnError) {
  FakeStream s;
  auto p = make_progress(s);
  launch(s, *p, 1);
  const StatusOr<bool> r = p->reached(2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_EQ(s.records.load(), 0);
}

// One thread launches, one plays the device, two ask (a waiting caller and the watchdog), all at
// once: no call is ever reported done before the device
// has executed it, and every call is reported done in the end.
TEST(StreamProgress, NoCallIsReportedDoneBeforeTheDeviceRanIt) {
  FakeStream s;
  auto p = make_progress(s);
  constexpr uint64_t kCalls = 5000;
  std::atomic<uint64_t> published{0};  // what the launcher has handed out Works for
  std::atomic<bool> stop{false};
  std::atomic<int> early{0};
  std::atomic<int> errors{0};
  std::atomic<uint64_t> asked{0};
  std::thread launcher([&] {
    for (uint64_t i = 1; i <= kCalls; ++i) {
      launch(s, *p, i);
      published.store(i);
      std::this_thread::yield();  // let the others run between calls (the point is interleaving)
    }
  });
  std::thread device([&] {
    while (s.executed.load() < kCalls) {
      const uint64_t next = s.executed.load() + 1;
      if (next <= s.submitted.load()) s.executed.store(next);
      if (next % 64 == 0) std::this_thread::yield();
    }
  });
  auto asker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load()) {
      const uint64_t newest = published.load();
      if (newest == 0) continue;
      const uint64_t seq = 1 + rng() % newest;
      const StatusOr<bool> r = p->reached(seq);
      asked++;
      if (!r.ok()) errors++;
      if (r.ok() && *r && s.executed.load() < seq) early++;
      std::this_thread::yield();
    }
  };
  std::thread a(asker, 1), b(asker, 2);
  launcher.join();
  device.join();
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(asked.load(), 0u);
  std::printf("%llu questions, %d markers for %d calls\n",
              static_cast<unsigned long long>(asked.load()), s.records.load(),
              static_cast<int>(kCalls));
  // A waiter's question records a marker after the last call if none covers it; another thread
  // may hold the lock at first, so ask until it answers.
  bool done = false;
  for (int i = 0; i < 100000 && !done; ++i) {
    const StatusOr<bool> r = p->reached(kCalls);
    ASSERT_TRUE(r.ok());
    done = *r;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(p->completed(), kCalls);
}

}  // namespace
}  // namespace tributary::internal
