// The worker pool and the reductions split across it: results bit-identical to the single-threaded
// kernel for every dtype and op, in place and not, across block boundaries; every task runs exactly
// once; concurrent callers (the later ones work alone) and nested use are safe.
#include "algorithms/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "algorithms/reduce_kernels.h"

namespace tributary::algorithms {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed, DType dtype) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  const size_t elem = dtype_size(dtype);
  for (size_t i = 0; i < n / elem; ++i) {
    // Small integers in every dtype (exact sums, no NaN), stored through dtype_store.
    dtype_store(dtype, v.data(), static_cast<int64_t>(i), static_cast<double>(rng() % 7) - 3);
  }
  return v;
}

TEST(Parallel, EveryTaskRunsOnce) {
  for (size_t tasks : {0, 1, 2, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(tasks);
    parallel_for(tasks, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < tasks; ++i) EXPECT_EQ(hits[i].load(), 1) << i << " of " << tasks;
  }
}

TEST(Parallel, ReduceMatchesTheSingleThreadedKernel) {
  // Past kParallelReduceMinBytes for three inputs of two bytes or more (int8's stay on one
  // thread), with a count that does not divide into whole blocks.
  const size_t count = (kParallelReduceMinBytes / 4) + 12345;
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                  DType::kInt32, DType::kInt8}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kProd}) {
      const size_t bytes = count * dtype_size(t);
      auto a = random_bytes(bytes, 1, t), b = random_bytes(bytes, 2, t),
           c = random_bytes(bytes, 3, t);
      std::vector<std::byte> want(bytes), got(bytes), got2(bytes);
      const void* srcs[3] = {a.data(), b.data(), c.data()};
      void* w[1] = {want.data()};
      reduce(op, t, srcs, w, count, 3);
      void* g[2] = {got.data(), got2.data()};
      parallel_reduce(op, t, srcs, g, count, 3);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0)
          << dtype_name(t) << " " << reduce_op_name(op);
      EXPECT_EQ(std::memcmp(want.data(), got2.data(), bytes), 0) << dtype_name(t);
      // In place: the output is the first source.
      void* in_place[1] = {a.data()};
      parallel_reduce(op, t, srcs, in_place, count, 3);
      EXPECT_EQ(std::memcmp(want.data(), a.data(), bytes), 0) << dtype_name(t) << " in place";
    }
  }
}

TEST(Parallel, SeveralThreadsTakeTheTasksOfOneJob) {
  if (parallel_threads() == 1) GTEST_SKIP() << "one CPU usable here: the pool has no workers";
  // Each task waits (up to 30 s, for a loaded machine) until two threads have run tasks: a worker
  // must take one of the tasks the caller has not reached while it waits.
  std::mutex mu;
  std::condition_variable two;
  std::set<std::thread::id> ran_on;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  parallel_for(8, [&](size_t) {
    std::unique_lock<std::mutex> lock(mu);
    ran_on.insert(std::this_thread::get_id());
    two.notify_all();
    two.wait_until(lock, deadline, [&] { return ran_on.size() > 1; });
  });
  EXPECT_GT(ran_on.size(), 1u);
}

TEST(Parallel, SmallWorkStaysOnTheCallingThread) {
  if (parallel_threads() == 1) GTEST_SKIP() << "one CPU usable here: the pool has no workers";
  std::vector<float> a(kParallelReduceMinBytes / sizeof(float), 1.0f), b(a.size(), 2.0f);
  const uint64_t before = parallel_jobs();
  // 4 KiB: a reduction, a copy, and a list of copies that stays under kParallelMinBytes.
  const void* s[2] = {a.data(), b.data()};
  void* d[1] = {a.data()};
  parallel_reduce(ReduceOp::kSum, DType::kFloat32, s, d, 1024);
  parallel_copy(b.data(), a.data(), 4096);
  const CopyJob small[2] = {{b.data(), a.data(), kParallelMinBytes / 2 - 1},
                            {b.data() + a.size() / 2, a.data(), kParallelMinBytes / 2}};
  parallel_copies(small);
  EXPECT_EQ(parallel_jobs(), before);
  // Past the thresholds, each goes to the workers.
  parallel_reduce(ReduceOp::kSum, DType::kFloat32, s, d, a.size());
  EXPECT_EQ(parallel_jobs(), before + 1);
  parallel_copy(b.data(), a.data(), kParallelMinBytes);
  EXPECT_EQ(parallel_jobs(), before + 2);
}

TEST(Parallel, CopiesOfEverySizeLandWhereTheyBelong) {
  // Copies that do not divide into blocks, an empty one, and ones far smaller than a block, in one
  // job past kParallelMinBytes: each destination gets its source, and nothing past its end moves.
  const size_t sizes[] = {
      kParallelMaxBlockBytes + 12345, 0, 1, 4095, 3 * kParallelMaxBlockBytes + 7,
      kParallelBlockBytes - 1};
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<CopyJob> copies;
  uint32_t seed = 1;
  for (size_t n : sizes) {
    src.push_back(random_bytes(n, seed++, DType::kInt8));
    dst.emplace_back(n + 64, std::byte{0x5a});
  }
  for (size_t i = 0; i < src.size(); ++i)
    copies.push_back({dst[i].data(), src[i].data(), sizes[i]});
  parallel_copies(copies);
  for (size_t i = 0; i < src.size(); ++i) {
    if (sizes[i] != 0) {  // an empty vector's data() may be nullptr
      EXPECT_EQ(std::memcmp(dst[i].data(), src[i].data(), sizes[i]), 0) << "copy " << i;
    }
    for (size_t k = sizes[i]; k < dst[i].size(); ++k) {
      ASSERT_EQ(dst[i][k], std::byte{0x5a}) << "copy " << i << " wrote past its end at " << k;
    }
  }
}

TEST(Parallel, ConcurrentCallersAllFinishCorrectly) {
  const size_t count = kParallelMinBytes;  // float32: 4x the threshold
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      std::vector<float> x(count, 1.0f + c), y(count, 2.0f), out(count);
      for (int rep = 0; rep < 20; ++rep) {
        const void* s[2] = {x.data(), y.data()};
        void* d[1] = {out.data()};
        parallel_reduce(ReduceOp::kSum, DType::kFloat32, s, d, count);
        for (size_t i = 0; i < count; i += 4099) wrong += out[i] != 3.0f + c;
        parallel_copy(y.data(), out.data(), count * sizeof(float));
        for (size_t i = 0; i < count; i += 4099) wrong += y[i] != 3.0f + c;
        std::fill(y.begin(), y.end(), 2.0f);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace tributary::algorithms
