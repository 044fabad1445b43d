// FifoRing (core/fifo_ring.h), the nccl backend's queue of calls in flight, which CI cannot run:
// order across wrap-around and growth, and that a popped element is destroyed at once.
#include "core/fifo_ring.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace tributary::internal {
namespace {

TEST(FifoRing, KeepsOrderAcrossWrapAroundAndGrowth) {
  FifoRing<int> q;
  EXPECT_TRUE(q.empty());
  int next_in = 0, next_out = 0;
  // Fill and drain in uneven steps, so that the head wraps around and the ring grows while its
  // elements straddle the end.
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 7 + round % 5; ++k) q.push_back(next_in++);
    ASSERT_EQ(q.back(), next_in - 1);
    for (int k = 0; k < 5; ++k) {
      ASSERT_EQ(q.front(), next_out++);
      q.pop_front();
    }
    ASSERT_EQ(q.size(), static_cast<size_t>(next_in - next_out));
  }
  EXPECT_GT(q.capacity(), 16u) << "the ring should have grown past its first size";
  while (!q.empty()) {
    ASSERT_EQ(q.front(), next_out++);
    q.pop_front();
  }
  EXPECT_EQ(next_out, next_in);
}

TEST(FifoRing, GrowsOnlyWhenFull) {
  FifoRing<int> q;
  for (int i = 0; i < 16; ++i) q.push_back(i);
  const size_t capacity = q.capacity();
  for (int i = 0; i < 1000; ++i) {  // steady state: one in, one out
    q.pop_front();
    q.push_back(16 + i);
  }
  EXPECT_EQ(q.capacity(), capacity);
  EXPECT_EQ(q.front(), 1000);
  EXPECT_EQ(q.back(), 1015);
}

TEST(FifoRing, PopDestroysTheElementAtOnceAndHoldsMoveOnlyTypes) {
  auto shared = std::make_shared<int>(7);
  FifoRing<std::shared_ptr<int>> held;
  held.push_back(shared);
  EXPECT_EQ(shared.use_count(), 2);
  held.pop_front();
  EXPECT_EQ(shared.use_count(), 1) << "a popped element must not linger in its slot";
  FifoRing<std::unique_ptr<int>> q;
  for (int i = 0; i < 40; ++i) q.push_back(std::make_unique<int>(i));
  EXPECT_EQ(*q.front(), 0);
  EXPECT_EQ(*q.back(), 39);
}

}  // namespace
}  // namespace tributary::internal
