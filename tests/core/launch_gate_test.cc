// LaunchGate (core/launch_gate.h): a failure never runs the teardown while a thread is inside a
// launch, runs it exactly once, and is never missed by a launch. Real threads; the stress cases
// also run under ThreadSanitizer in CI (core_test is in its stage).
#include "core/launch_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tributary/cross_device_ops.h"

namespace tributary::internal {
namespace {

// Waits for `flag` for at most 10 s (so that a broken gate fails the test instead of hanging it).
bool wait_for(const std::atomic<bool>& flag) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(LaunchGate, AFailureWithNoLaunchTearsDownAtOnce) {
  int teardowns = 0;
  LaunchGate gate([&] { ++teardowns; });
  EXPECT_FALSE(gate.failed());
  EXPECT_EQ(gate.fail(), LaunchGate::Failed::kTornDown);
  EXPECT_EQ(teardowns, 1);
  EXPECT_TRUE(gate.failed());
  EXPECT_TRUE(gate.flag()->load());
  EXPECT_EQ(gate.fail(), LaunchGate::Failed::kAlreadyFailed);
  gate.tear_down();
  EXPECT_EQ(teardowns, 1);
}

TEST(LaunchGate, ALaunchAfterAFailureMayNotProceed) {
  int teardowns = 0;
  LaunchGate gate([&] { ++teardowns; });
  (void)gate.fail();
  CallInfo call;
  LaunchGate::Launch launch(gate, &call);
  EXPECT_FALSE(launch.may_proceed());
  EXPECT_TRUE(launch.finish());
  EXPECT_EQ(teardowns, 1);
}

TEST(LaunchGate, AFailureDuringALaunchIsLeftToTheLaunchingThread) {
  int teardowns = 0;
  LaunchGate gate([&] { ++teardowns; });
  CallInfo call;
  call.sequence = 7;
  std::atomic<bool> inside{false};
  std::atomic<bool> failed{false};
  bool finish_said_failed = false;
  std::thread launcher([&] {
    LaunchGate::Launch launch(gate, &call);
    EXPECT_TRUE(launch.may_proceed());
    inside = true;
    EXPECT_TRUE(wait_for(failed));  // "inside the library" until the failure
    EXPECT_EQ(teardowns, 0);        // not torn down under this thread
    finish_said_failed = launch.finish();
    EXPECT_EQ(teardowns, 1);  // by this thread, as it left
  });
  ASSERT_TRUE(wait_for(inside));
  EXPECT_EQ(gate.with_launching([](const CallInfo* c) { return c ? c->sequence : -1; }), 7);
  EXPECT_EQ(gate.fail(), LaunchGate::Failed::kDeferred);
  EXPECT_EQ(teardowns, 0);
  failed = true;
  launcher.join();
  EXPECT_TRUE(finish_said_failed);
  EXPECT_EQ(teardowns, 1);
  EXPECT_EQ(gate.with_launching([](const CallInfo* c) { return c == nullptr; }), true);
  gate.tear_down();
  EXPECT_EQ(teardowns, 1);
}

TEST(LaunchGate, TheDestructorOfALaunchRunsADeferredTeardown) {
  int teardowns = 0;
  LaunchGate gate([&] { ++teardowns; });
  std::atomic<bool> inside{false};
  std::atomic<bool> failed{false};
  std::thread launcher([&] {
    LaunchGate::Launch launch(gate, nullptr);  // a launch with no call to describe still counts
    inside = true;
    EXPECT_TRUE(wait_for(failed));
  });
  ASSERT_TRUE(wait_for(inside));
  EXPECT_EQ(gate.fail(), LaunchGate::Failed::kDeferred);
  failed = true;
  launcher.join();
  EXPECT_EQ(teardowns, 1);
}

TEST(LaunchGate, AHealthyLaunchFinishesWithoutTeardown) {
  int teardowns = 0;
  LaunchGate gate([&] { ++teardowns; });
  for (int i = 0; i < 3; ++i) {
    LaunchGate::Launch launch(gate, nullptr);
    EXPECT_TRUE(launch.may_proceed());
    EXPECT_FALSE(launch.finish());
  }
  EXPECT_EQ(teardowns, 0);
  EXPECT_FALSE(gate.failed());
}

// Launches racing one failure, many times over: the teardown runs exactly once and never while a
// launch that proceeded is inside; a launch that begins after fail() returned does not proceed; and
// a launch inside when fail() returned is told so by finish().
TEST(LaunchGate, RacingFailuresAndLaunchesKeepTheInvariants) {
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> inside{0};
    std::atomic<int> teardowns{0};
    std::atomic<bool> torn_down_while_inside{false};
    LaunchGate gate([&] {
      if (inside.load() != 0) torn_down_while_inside = true;
      teardowns.fetch_add(1);
    });
    std::atomic<bool> go{false};
    std::atomic<bool> fail_returned{false};
    std::atomic<int> proceeded_after_failure{0};
    std::atomic<int> failure_not_reported{0};
    std::vector<std::thread> launchers;
    for (int t = 0; t < 2; ++t) {
      launchers.emplace_back([&] {
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 20; ++i) {
          const bool after = fail_returned.load();
          LaunchGate::Launch launch(gate, nullptr);
          bool seen_inside = false;
          if (launch.may_proceed()) {
            if (after) proceeded_after_failure.fetch_add(1);
            inside.fetch_add(1);
            std::this_thread::yield();  // "in the library"
            seen_inside = fail_returned.load();
            inside.fetch_sub(1);
          }
          if (!launch.finish() && seen_inside) failure_not_reported.fetch_add(1);
        }
      });
    }
    std::thread failer([&] {
      while (!go) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(round % 50));
      (void)gate.fail();
      fail_returned = true;
    });
    go = true;
    for (auto& t : launchers) t.join();
    failer.join();
    gate.tear_down();  // a teardown deferred to a launch has run by now; this must not add one
    EXPECT_EQ(teardowns.load(), 1) << "round " << round;
    EXPECT_FALSE(torn_down_while_inside.load()) << "round " << round;
    EXPECT_EQ(proceeded_after_failure.load(), 0) << "round " << round;
    EXPECT_EQ(failure_not_reported.load(), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace tributary::internal
