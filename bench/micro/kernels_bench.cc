// Micro-benchmarks of the CPU reduction kernels and of packing, against a memcpy baseline.
//
// Bytes/s count every byte read plus every byte written, so that a kernel that streams at memory
// speed reads about the same as memcpy: memcpy of S bytes counts 2S, a 2-source reduction of S
// bytes per buffer counts 3S. Each case runs on buffers beyond the caches (64 MiB each) and on
// cache-resident ones (256 KiB each).
//
//   kernels_bench --benchmark_filter='memcpy|reduce/float32/sum' --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/packing.h"
#include "algorithms/reduce_kernels.h"
#include "tributary/dtype.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {
namespace {

constexpr size_t kLargeBytes = size_t{64} << 20;
constexpr size_t kSmallBytes = size_t{256} << 10;

// A zero-filled, 64-byte-aligned host buffer (every page touched before timing).
struct alignas(64) CacheLine {
  std::byte bytes[64];
};
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes) : lines_((bytes + 63) / 64) {
    std::memset(lines_.data(), 0, lines_.size() * sizeof(CacheLine));
  }
  void* data() { return lines_.data(); }

 private:
  std::vector<CacheLine> lines_;
};

// Small integers are exact in every dtype and avoid denormal or NaN slow paths.
void fill_ones(void* data, DType dtype, size_t count) {
  auto fill = [&](auto value) {
    auto* p = static_cast<decltype(value)*>(data);
    for (size_t i = 0; i < count; ++i) p[i] = value;
  };
  switch (dtype) {
    case DType::kFloat32:
      return fill(1.0f);
    case DType::kFloat64:
      return fill(1.0);
    case DType::kFloat16:
      return fill(float_to_half(1.0f));
    case DType::kBFloat16:
      return fill(float_to_bfloat16(1.0f));
    case DType::kInt32:
      return fill(int32_t{1});
    case DType::kInt64:
      return fill(int64_t{1});
    case DType::kInt8:
      return fill(int8_t{1});
    case DType::kUInt8:
      return fill(uint8_t{1});
  }
}

std::string size_label(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + "MiB"
                                    : std::to_string(bytes >> 10) + "KiB";
}

void bm_memcpy(benchmark::State& state, size_t bytes) {
  HostBuffer src(bytes), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

// reduce(2 sources -> 1 destination), out of place or with dst == srcs[0].
void bm_reduce(benchmark::State& state, ReduceOp op, DType dtype, size_t bytes, bool in_place) {
  const size_t count = bytes / dtype_size(dtype);
  HostBuffer a(bytes), b(bytes), c(bytes);
  fill_ones(a.data(), dtype, count);
  fill_ones(b.data(), dtype, count);
  const void* srcs[] = {a.data(), b.data()};
  void* dsts[] = {in_place ? a.data() : c.data()};
  for (auto _ : state) {
    // MIN/MAX keep inputs unchanged in place; SUM/PROD/MEAN grow them, harmlessly for timing.
    reduce(op, dtype, srcs, dsts, count, /*mean_divisor=*/2);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
}

// Packs 1024 float32 tensors of `bytes / 1024` each into one buffer, or unpacks it.
void bm_pack(benchmark::State& state, size_t bytes, bool unpacking) {
  constexpr size_t kTensors = 1024;
  const int64_t elements = static_cast<int64_t>(bytes / kTensors / sizeof(float));
  HostBuffer storage(bytes), packed(bytes);
  std::vector<Tensor> tensors;
  auto* base = static_cast<float*>(storage.data());
  for (size_t i = 0; i < kTensors; ++i) {
    tensors.emplace_back(base + i * elements, DType::kFloat32, elements);
  }
  for (auto _ : state) {
    if (unpacking) {
      unpack(packed.data(), tensors);
    } else {
      pack(tensors, packed.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

void register_all() {
  for (size_t bytes : {kLargeBytes, kSmallBytes}) {
    const std::string size = size_label(bytes);
    benchmark::RegisterBenchmark(("memcpy/" + size).c_str(), bm_memcpy, bytes)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (DType dtype : all_dtypes()) {
      for (ReduceOp op : all_reduce_ops()) {
        const std::string name = "reduce/" + std::string(dtype_name(dtype)) + "/" +
                                 std::string(reduce_op_name(op)) + "/" + size;
        benchmark::RegisterBenchmark(name.c_str(), bm_reduce, op, dtype, bytes, false)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
      const std::string in_place =
          "reduce_in_place/" + std::string(dtype_name(dtype)) + "/sum/" + size;
      benchmark::RegisterBenchmark(in_place.c_str(), bm_reduce, ReduceOp::kSum, dtype, bytes, true)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("pack/float32x1024/" + size).c_str(), bm_pack, bytes, false)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("unpack/float32x1024/" + size).c_str(), bm_pack, bytes, true)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace tributary::algorithms

int main(int argc, char** argv) {
  tributary::algorithms::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
