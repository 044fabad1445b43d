// The worker pool and the reductions split across it: results bit-identical to the single-threaded
// kernel for every dtype and op, in place and not, across block boundaries; every task runs exactly
// once; concurrent callers (the later ones work alone) and nested use are safe.
#include "algorithms/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
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
