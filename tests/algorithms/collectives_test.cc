// The transport-agnostic algorithms over the loopback transport: ranks as threads.
#include "algorithms/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/loopback_transport.h"

namespace tributary::algorithms {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, transport) on n threads; returns each rank's status.
std::vector<Status> run_ranks(int n, const std::function<Status(int, Transport&)>& fn) {
  auto hub = std::make_shared<LoopbackHub>(n);
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport t(hub, r);
      Status s = fn(r, t);
      if (!s.ok()) t.abort(s);
      out[static_cast<size_t>(r)] = s;
    });
  }
  for (auto& th : threads) th.join();
  return out;
}

MessageTag tag_for(int64_t count, DType dtype = DType::kInt32, ReduceOp op = ReduceOp::kSum) {
  MessageTag t;
  t.sequence = 1;
  t.count = count;
  t.dtype = dtype;
  t.op = op;
  return t;
}

int64_t value(int rank, int64_t i) { return (i * 3 + rank * 5) % 7; }

using Param = std::tuple<AllReduceAlgorithm, int, int64_t>;
class AllReduceAlgorithms : public ::testing::TestWithParam<Param> {};

TEST_P(AllReduceAlgorithms, SumMeanMaxExact) {
  // Not a structured binding: clang 14 cannot capture one in the lambda below.
  const AllReduceAlgorithm algorithm = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  const int64_t count = std::get<2>(GetParam());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    std::vector<std::vector<int32_t>> data(static_cast<size_t>(n));
    auto statuses = run_ranks(n, [&](int r, Transport& t) {
      auto& d = data[static_cast<size_t>(r)];
      d.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        d[static_cast<size_t>(i)] = static_cast<int32_t>(value(r, i));
      std::vector<std::byte> scratch;
      // Small segments so that ring steps pipeline several segments.
      AlgorithmContext ctx{t, tag_for(count, DType::kInt32, op),
                           std::chrono::steady_clock::now() + 20s, 64, &scratch};
      return all_reduce(ctx, algorithm, d.data(), count, DType::kInt32, op, n);
    });
    for (int r = 0; r < n; ++r)
      ASSERT_TRUE(statuses[static_cast<size_t>(r)].ok())
          << statuses[static_cast<size_t>(r)].message();
    for (int64_t i = 0; i < count; ++i) {
      int64_t want = op == ReduceOp::kMax ? 0 : 0;
      for (int r = 0; r < n; ++r) {
        want = op == ReduceOp::kMax ? std::max(want, value(r, i)) : want + value(r, i);
      }
      if (op == ReduceOp::kMean) want /= n;
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], want)
            << reduce_op_name(op) << " rank " << r << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Loopback, AllReduceAlgorithms,
    ::testing::Combine(
        ::testing::Values(AllReduceAlgorithm::kRing, AllReduceAlgorithm::kHalvingDoubling,
                          AllReduceAlgorithm::kRecursiveDoubling, AllReduceAlgorithm::kAuto),
        ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8), ::testing::Values<int64_t>(0, 1, 7, 1001)),
    [](const auto& info) {
      return std::string(all_reduce_algorithm_name(std::get<0>(info.param))) + "_n" +
             std::to_string(std::get<1>(info.param)) + "_c" +
             std::to_string(std::get<2>(info.param));
    });

TEST(TreeAndRing, BroadcastReduceGatherScatter) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (int root : {0, n - 1}) {
      std::vector<std::vector<int64_t>> data(static_cast<size_t>(n));
      auto st = run_ranks(n, [&](int r, Transport& t) {
        auto& d = data[static_cast<size_t>(r)];
        d.assign(5, r == root ? 42 : -1);
        std::vector<std::byte> scratch;
        AlgorithmContext ctx{t, tag_for(5, DType::kInt64), std::chrono::steady_clock::now() + 20s,
                             1 << 20, &scratch};
        return tree_broadcast(ctx, d.data(), 5 * sizeof(int64_t), root);
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[static_cast<size_t>(r)].ok());
        EXPECT_EQ(data[static_cast<size_t>(r)], std::vector<int64_t>(5, 42)) << "bcast n=" << n;
      }
      auto st2 = run_ranks(n, [&](int r, Transport& t) {
        auto& d = data[static_cast<size_t>(r)];
        d.assign(3, r + 1);
        std::vector<std::byte> scratch;
        AlgorithmContext ctx{t, tag_for(3, DType::kInt64), std::chrono::steady_clock::now() + 20s,
                             1 << 20, &scratch};
        return tree_reduce(ctx, d.data(), 3, DType::kInt64, ReduceOp::kSum, 1, root);
      });
      for (int r = 0; r < n; ++r) ASSERT_TRUE(st2[static_cast<size_t>(r)].ok());
      EXPECT_EQ(data[static_cast<size_t>(root)], std::vector<int64_t>(3, n * (n + 1) / 2));
    }
    // all-gather: block r holds r; reduce-scatter: block b reduced over ranks.
    std::vector<std::vector<int32_t>> g(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    auto st3 = run_ranks(n, [&](int r, Transport& t) {
      auto& d = g[static_cast<size_t>(r)];
      d.assign(static_cast<size_t>(2 * n), -1);
      d[static_cast<size_t>(2 * r)] = r;
      d[static_cast<size_t>(2 * r + 1)] = 100 + r;
      std::vector<std::byte> scratch;
      AlgorithmContext ctx{t, tag_for(2), std::chrono::steady_clock::now() + 20s, 4, &scratch};
      TRIBUTARY_RETURN_IF_ERROR(ring_all_gather(ctx, d.data(), 2 * sizeof(int32_t)));
      std::vector<int32_t> rs(static_cast<size_t>(2 * n));
      for (int i = 0; i < 2 * n; ++i) rs[static_cast<size_t>(i)] = i + r;
      out[static_cast<size_t>(r)].assign(2, 0);
      ctx.tag.sequence = 2;
      return ring_reduce_scatter(ctx, rs.data(), out[static_cast<size_t>(r)].data(), 2,
                                 DType::kInt32, ReduceOp::kSum, 1);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st3[static_cast<size_t>(r)].ok()) << st3[static_cast<size_t>(r)].message();
      for (int b = 0; b < n; ++b) {
        EXPECT_EQ(g[static_cast<size_t>(r)][static_cast<size_t>(2 * b)], b);
        EXPECT_EQ(g[static_cast<size_t>(r)][static_cast<size_t>(2 * b + 1)], 100 + b);
      }
      const int sum_r = n * (n - 1) / 2;
      EXPECT_EQ(out[static_cast<size_t>(r)][0], n * (2 * r) + sum_r);
      EXPECT_EQ(out[static_cast<size_t>(r)][1], n * (2 * r + 1) + sum_r);
    }
  }
}

TEST(Failures, MismatchedCountsFailEveryRankNamingBothSides) {
  auto st = run_ranks(3, [&](int r, Transport& t) {
    const int64_t count = r == 1 ? 8 : 16;  // rank 1 issues a different collective
    std::vector<float> d(static_cast<size_t>(count), 1.0f);
    std::vector<std::byte> scratch;
    AlgorithmContext ctx{t, tag_for(count, DType::kFloat32), std::chrono::steady_clock::now() + 10s,
                         1 << 20, &scratch};
    return ring_all_reduce(ctx, d.data(), count, DType::kFloat32, ReduceOp::kSum, 3);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(st[static_cast<size_t>(r)].ok()) << "rank " << r;
  }
  bool named = false;
  for (const Status& s : st) {
    named = named || (s.message().find("collective mismatch") != std::string::npos &&
                      s.message().find("32B float32") != std::string::npos &&
                      s.message().find("64B float32") != std::string::npos);
  }
  EXPECT_TRUE(named) << st[0].message();
}

TEST(Failures, SilentPeerIsADeadlineNamingIt) {
  auto st = run_ranks(2, [&](int r, Transport& t) {
    if (r == 1) return Status();  // never takes part
    std::vector<float> d(4, 1.0f);
    std::vector<std::byte> scratch;
    AlgorithmContext ctx{t, tag_for(4, DType::kFloat32), std::chrono::steady_clock::now() + 200ms,
                         1 << 20, &scratch};
    return ring_all_reduce(ctx, d.data(), 4, DType::kFloat32, ReduceOp::kSum, 2);
  });
  EXPECT_EQ(st[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st[0].message().find("rank 1"), std::string::npos) << st[0].message();
}

TEST(CostModel, PicksLatencyOptimalForSmallAndRingForLarge) {
  CostModel m;
  EXPECT_EQ(m.choose(4096, 8), AllReduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(m.choose(4096, 2), AllReduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(m.choose(size_t{256} << 10, 8), AllReduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(m.choose(size_t{256} << 20, 6), AllReduceAlgorithm::kRing);
  // Pairwise exchanges only while their messages stay within pairwise_max_bytes (4 MiB).
  EXPECT_EQ(m.choose(size_t{8} << 20, 4), AllReduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(m.choose((size_t{8} << 20) + 64, 4), AllReduceAlgorithm::kRing);
  EXPECT_EQ(m.choose(size_t{16} << 20, 8), AllReduceAlgorithm::kRing);
  EXPECT_LT(m.all_reduce_seconds(AllReduceAlgorithm::kRing, 1 << 20, 2),
            m.all_reduce_seconds(AllReduceAlgorithm::kRing, 1 << 21, 2));
}

// A transport that prefers a segment size (as UCX over TCP does) and records the largest message
// it was given to send.
class PreferringTransport final : public Transport {
 public:
  PreferringTransport(std::shared_ptr<LoopbackHub> hub, int rank, size_t preferred)
      : inner_(std::move(hub), rank), preferred_(preferred) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  StatusOr<Request> isend(int peer, const MessageTag& tag,
                          std::span<const std::byte> data) override {
    largest_sent = std::max(largest_sent, data.size());
    largest_step = std::max(largest_step, tag.step);
    return inner_.isend(peer, tag, data);
  }
  StatusOr<Request> irecv(int peer, const MessageTag& tag, std::span<std::byte> data) override {
    return inner_.irecv(peer, tag, data);
  }
  Status wait(Request request, Deadline deadline) override {
    return inner_.wait(request, deadline);
  }
  void abort(const Status& why) override { inner_.abort(why); }
  Status error() const override { return inner_.error(); }
  size_t preferred_segment_bytes(size_t) const override { return preferred_; }

  size_t largest_sent = 0;
  uint32_t largest_step = 0;

 private:
  LoopbackTransport inner_;
  size_t preferred_;
};

// segment_bytes = 0 leaves the segment to the transport's preference, else to the algorithms'
// rule (a quarter of the chunk, from 256 KiB); a configured size wins over both.
TEST(Segments, TransportPreferenceAppliesOnlyWhenNotConfigured) {
  constexpr int64_t kCount = int64_t{1} << 20;  // 4 MiB of int32: 2 MiB ring chunks at N=2
  struct Case {
    size_t preferred, configured, want_largest;
  };
  for (const Case& c :
       {Case{64 << 10, 0, 64 << 10}, Case{0, 0, 512 << 10}, Case{64 << 10, 128 << 10, 128 << 10}}) {
    auto hub = std::make_shared<LoopbackHub>(2);
    std::vector<std::vector<int32_t>> data(2, std::vector<int32_t>(kCount));
    std::vector<size_t> largest(2);
    std::vector<Status> out(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        PreferringTransport t(hub, r, c.preferred);
        auto& d = data[static_cast<size_t>(r)];
        for (int64_t i = 0; i < kCount; ++i)
          d[static_cast<size_t>(i)] = static_cast<int32_t>(i % 5 + r);
        std::vector<std::byte> scratch;
        AlgorithmContext ctx{t, tag_for(kCount), std::chrono::steady_clock::now() + 20s,
                             c.configured, &scratch};
        out[static_cast<size_t>(r)] = all_reduce(ctx, AllReduceAlgorithm::kRing, d.data(), kCount,
                                                 DType::kInt32, ReduceOp::kSum, 2);
        largest[static_cast<size_t>(r)] = t.largest_sent;
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(out[static_cast<size_t>(r)].ok()) << out[static_cast<size_t>(r)].message();
      EXPECT_EQ(largest[static_cast<size_t>(r)], c.want_largest)
          << "preferred " << c.preferred << ", configured " << c.configured << ", rank " << r;
      for (int64_t i = 0; i < kCount; i += 4099) {
        ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], 2 * (i % 5) + 1);
      }
    }
  }
}

// A message larger than slice_bytes is all-reduced a slice at a time, 2(n-1) steps each, with the
// same result as a whole ring, in place and out of place, for every op (MEAN divides each slice
// once); a message within one slice, or with slicing turned off by a larger slice, is one ring.
TEST(Slices, RingAllReduceBySlicesIsExactInAndOutOfPlace) {
  constexpr size_t kSlice = 4096;  // 1024 int32
  struct Case {
    int n;
    int64_t count;
    size_t slice;
    uint32_t want_largest_step;
  };
  for (const Case& c : {Case{2, 10007, kSlice, 10 * 2 - 1},  // 9 whole slices and a part
                        Case{3, 3072, kSlice, 3 * 4 - 1},    // 3 exact slices
                        Case{5, 1024, kSlice, 4 * 2 - 1},    // one slice: a whole ring
                        Case{4, 10007, size_t{1} << 20, 5},  // slicing off
                        Case{2, 3, kSlice, 1},               // fewer elements than ranks
                        Case{3, 10007, kNoSlices, 3},        // kNoSlices: a whole ring
                        Case{3, 10, 8, 4 * 4 - 1}}) {        // a slice below n elements: n each
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      for (bool in_place : {true, false}) {
        auto hub = std::make_shared<LoopbackHub>(c.n);
        std::vector<std::vector<int32_t>> out(static_cast<size_t>(c.n));
        std::vector<uint32_t> largest_step(static_cast<size_t>(c.n));
        std::vector<Status> st(static_cast<size_t>(c.n));
        std::vector<std::thread> threads;
        for (int r = 0; r < c.n; ++r) {
          threads.emplace_back([&, r] {
            PreferringTransport t(hub, r, 0);
            std::vector<int32_t> in(static_cast<size_t>(c.count));
            for (int64_t i = 0; i < c.count; ++i)
              in[static_cast<size_t>(i)] = static_cast<int32_t>(value(r, i));
            auto& d = out[static_cast<size_t>(r)];
            d = in_place ? in : std::vector<int32_t>(static_cast<size_t>(c.count), -99);
            std::vector<std::byte> scratch;
            AlgorithmContext ctx{t,
                                 tag_for(c.count, DType::kInt32, op),
                                 std::chrono::steady_clock::now() + 20s,
                                 256,
                                 &scratch,
                                 c.slice};
            st[static_cast<size_t>(r)] = ring_all_reduce(ctx, d.data(), c.count, DType::kInt32, op,
                                                         c.n, in_place ? nullptr : in.data());
            if (!st[static_cast<size_t>(r)].ok()) t.abort(st[static_cast<size_t>(r)]);
            largest_step[static_cast<size_t>(r)] = t.largest_step;
          });
        }
        for (auto& th : threads) th.join();
        const std::string what = "n=" + std::to_string(c.n) + " count=" + std::to_string(c.count) +
                                 " " + std::string(reduce_op_name(op)) +
                                 (in_place ? " in place" : " out of place");
        for (int r = 0; r < c.n; ++r) {
          ASSERT_TRUE(st[static_cast<size_t>(r)].ok())
              << what << ": " << st[static_cast<size_t>(r)].message();
          EXPECT_EQ(largest_step[static_cast<size_t>(r)], c.want_largest_step)
              << what << " rank " << r;
          for (int64_t i = 0; i < c.count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < c.n; ++q)
              want = op == ReduceOp::kMax ? std::max(want, value(q, i)) : want + value(q, i);
            if (op == ReduceOp::kMean) want /= c.n;
            ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], want)
                << what << " rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

// Uneven blocks with automatic segments: every rank must cut a block into the same segments,
// whichever blocks it sends and receives itself. 786442 float32 over 3 ranks are blocks of
// 262148, 262147 and 262147 elements, whose quarters (the auto segment) differ: a rank that sized
// its segments from its own pair of blocks sent 65536-element segments where its next rank
// expected 65537, and the collective failed as a mismatch.
TEST(Segments, UnevenBlocksAreCutTheSameWayOnEveryRank) {
  for (const int64_t count : {int64_t{786442}, int64_t{786443}, int64_t{3 * 262144 + 2}}) {
    auto hub = std::make_shared<LoopbackHub>(3);
    std::vector<std::vector<float>> data(3);
    std::vector<Status> st(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        LoopbackTransport t(hub, r);
        auto& d = data[static_cast<size_t>(r)];
        d.resize(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i)
          d[static_cast<size_t>(i)] = static_cast<float>(value(r, i));
        std::vector<std::byte> scratch;
        AlgorithmContext ctx{t, tag_for(count, DType::kFloat32),
                             std::chrono::steady_clock::now() + 20s, 0, &scratch};
        st[static_cast<size_t>(r)] = all_reduce(ctx, AllReduceAlgorithm::kRing, d.data(), count,
                                                DType::kFloat32, ReduceOp::kSum, 3);
        if (!st[static_cast<size_t>(r)].ok()) t.abort(st[static_cast<size_t>(r)]);
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(st[static_cast<size_t>(r)].ok())
          << "count " << count << " rank " << r << ": " << st[static_cast<size_t>(r)].message();
      for (int64_t i = 0; i < count; i += 997) {
        ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)],
                  static_cast<float>(value(0, i) + value(1, i) + value(2, i)))
            << "count " << count << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(Slices, AutoIsTwoMiBPerRankAndAConfiguredSizeWins) {
  EXPECT_EQ(slice_bytes_for(0, 2), size_t{4} << 20);
  EXPECT_EQ(slice_bytes_for(0, 4), size_t{8} << 20);
  EXPECT_EQ(slice_bytes_for(size_t{1} << 20, 4), size_t{1} << 20);
}

}  // namespace
}  // namespace tributary::algorithms
