// Micro-benchmark of the CUDA reduction kernels (algorithms/device_reduce.h) against the device's
// own copy speed.
//
// For each size S (bytes per buffer) it times, with CUDA events after a warm-up, the median of
// --iters runs of:
//   copy   cudaMemcpyAsync device to device: the "copy ceiling", 2*S bytes moved (read + written);
//   sum    device_reduce(kSum) of 2 sources into 1 destination, 3*S bytes moved,
// for float32, bfloat16, float16 and int32, and prints GB/s (10^9 bytes/s) and the percentage of
// the copy ceiling at the same size. Exits 77 (skipped) when no CUDA device is visible.
//
//   tributary-device-kernels-bench [--bytes 256MiB]... [--iters 20] [--device 0] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/device_reduce.h"
#include "tributary/dtype.h"
#include "tributary/status.h"

namespace tributary::algorithms {
namespace {

constexpr int kWarmup = 3;

struct Options {
  std::vector<size_t> sizes;
  int iters = 20;
  int device = 0;
  std::string json;
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: tributary-device-kernels-bench [--bytes SIZE]... [--iters N] [--device N] "
               "[--json FILE]\n"
               "  --bytes SIZE  bytes per buffer, e.g. 1048576, 64KiB, 16MiB, 1GiB (repeatable;\n"
               "                default 1MiB, 16MiB and 256MiB)\n"
               "  --iters N     timed runs per case, the median reported (default 20)\n"
               "  --device N    the CUDA device (default 0)\n"
               "  --json FILE   also write the rows as JSON\n");
}

// "1048576", "64KiB", "16MiB", "1GiB" (also K/M/G, KB/MB/GB as powers of two).
bool parse_size(std::string_view text, size_t* bytes) {
  if (text.empty()) return false;
  errno = 0;
  const std::string s(text);
  char* end = nullptr;
  const unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno != 0) return false;
  const std::string_view suffix(end);
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GiB") {
    shift = 30;
  } else {
    return false;
  }
  if (n == 0 || n > (~0ULL >> shift)) return false;
  *bytes = static_cast<size_t>(n << shift);
  return true;
}

bool parse_int(std::string_view text, int lo, int* value) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || errno != 0 || v < lo || v > 1000000) return false;
  *value = static_cast<int>(v);
  return true;
}

// 0: parsed; otherwise the exit code.
int parse_args(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return -1;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: expected a value after %s\n", argv[0], argv[i]);
      usage(stderr);
      return 2;
    }
    const std::string_view value = argv[++i];
    bool ok = false;
    if (arg == "--bytes") {
      size_t bytes = 0;
      ok = parse_size(value, &bytes);
      if (ok) options->sizes.push_back(bytes);
    } else if (arg == "--iters") {
      ok = parse_int(value, 1, &options->iters);
    } else if (arg == "--device") {
      ok = parse_int(value, 0, &options->device);
    } else if (arg == "--json") {
      options->json = std::string(value);
      ok = !options->json.empty();
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i - 1]);
      usage(stderr);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], argv[i], argv[i - 1]);
      return 2;
    }
  }
  if (options->sizes.empty()) {
    options->sizes = {size_t{1} << 20, size_t{16} << 20, size_t{256} << 20};
  }
  return 0;
}

std::string size_text(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) {
    std::snprintf(buf, sizeof(buf), "%zu GiB", bytes >> 30);
  } else if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%zu MiB", bytes >> 20);
  } else if (bytes >= 1024 && bytes % 1024 == 0) {
    std::snprintf(buf, sizeof(buf), "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  }
  return buf;
}

struct Row {
  size_t bytes = 0;   // per buffer
  std::string what;   // "copy" or "sum 2->1"
  std::string dtype;  // "-" for the copy
  double median_ms = 0;
  double gbps = 0;
  double percent_of_copy = 0;
};

// Fails the run with a message naming the call.
bool cuda_ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "tributary-device-kernels-bench: %s failed: %s: %s\n", what,
               cudaGetErrorName(err), cudaGetErrorString(err));
  return false;
}

// Times `run` (which enqueues one operation on `stream`): the median of `iters` runs after the
// warm-up, in milliseconds; negative on failure.
template <typename Run>
double median_ms(cudaStream_t stream, int iters, Run run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!cuda_ok(cudaEventCreate(&start), "cudaEventCreate") ||
      !cuda_ok(cudaEventCreate(&stop), "cudaEventCreate")) {
    return -1;
  }
  std::vector<float> times;
  bool ok = true;
  for (int i = 0; ok && i < kWarmup + iters; ++i) {
    ok = cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord") && run() &&
         cuda_ok(cudaEventRecord(stop, stream), "cudaEventRecord") &&
         cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    if (ok) ok = cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (ok && i >= kWarmup) times.push_back(ms);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  if (!ok) return -1;
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2.0;
}

bool write_json(const std::string& path, const std::string& device_name,
                const std::vector<Row>& rows) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "tributary-device-kernels-bench: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  std::string name;
  for (char c : device_name) {
    if (c == '"' || c == '\\') name += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) name += c;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"rows\": [\n", name.c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "    {\"bytes\": %zu, \"what\": \"%s\", \"dtype\": \"%s\", \"median_ms\": %.6f, "
                 "\"gbps\": %.2f, \"percent_of_copy\": %.1f}%s\n",
                 r.bytes, r.what.c_str(), r.dtype.c_str(), r.median_ms, r.gbps, r.percent_of_copy,
                 i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  const bool ok = std::fclose(f) == 0;
  if (!ok) std::fprintf(stderr, "tributary-device-kernels-bench: cannot write %s\n", path.c_str());
  return ok;
}

int run(const Options& options) {
  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  if (count_err != cudaSuccess || devices == 0) {
    std::fprintf(stderr,
                 "tributary-device-kernels-bench: skipped: no CUDA device is visible (%s)\n",
                 count_err != cudaSuccess ? cudaGetErrorString(count_err)
                                          : "cudaGetDeviceCount found 0 devices");
    return 77;
  }
  if (options.device >= devices) {
    std::fprintf(stderr, "tributary-device-kernels-bench: --device %d: only %d device(s) visible\n",
                 options.device, devices);
    return 2;
  }
  if (!cuda_ok(cudaSetDevice(options.device), "cudaSetDevice")) return 1;
  cudaDeviceProp prop{};
  if (!cuda_ok(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties")) return 1;
  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  std::printf("GPU:%d %s, %d SMs; median of %d runs after %d warm-up runs\n", options.device,
              prop.name, prop.multiProcessorCount, options.iters, kWarmup);
  std::printf("%-10s %-9s %-9s %10s %10s %10s\n", "size", "what", "dtype", "median ms", "GB/s",
              "% of copy");

  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32};
  std::vector<Row> rows;
  int status = 0;
  for (size_t bytes : options.sizes) {
    void* buffers[3] = {nullptr, nullptr, nullptr};
    bool ok = true;
    for (void*& b : buffers) {
      ok = ok && cuda_ok(cudaMalloc(&b, bytes), "cudaMalloc") &&
           cuda_ok(cudaMemsetAsync(b, 0, bytes, stream), "cudaMemsetAsync");
    }
    auto print = [&](const Row& r) {
      std::printf("%-10s %-9s %-9s %10.4f %10.1f %10.1f\n", size_text(r.bytes).c_str(),
                  r.what.c_str(), r.dtype.c_str(), r.median_ms, r.gbps, r.percent_of_copy);
      std::fflush(stdout);
      rows.push_back(r);
    };
    double copy_gbps = 0;
    if (ok) {
      const double ms = median_ms(stream, options.iters, [&] {
        return cuda_ok(
            cudaMemcpyAsync(buffers[2], buffers[0], bytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
      });
      ok = ms > 0;
      if (ok) {
        copy_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
        print({bytes, "copy", "-", ms, copy_gbps, 100.0});
      }
    }
    for (DType dtype : dtypes) {
      if (!ok) break;
      const void* srcs[] = {buffers[0], buffers[1]};
      void* dsts[] = {buffers[2]};
      const size_t count = bytes / dtype_size(dtype);
      const double ms = median_ms(stream, options.iters, [&] {
        const Status s =
            device_reduce(ReduceOp::kSum, dtype, srcs, dsts, count, 1, options.device, stream);
        if (!s.ok())
          std::fprintf(stderr, "tributary-device-kernels-bench: %s\n", s.to_string().c_str());
        return s.ok();
      });
      ok = ms > 0;
      if (ok) {
        const double gbps =
            3.0 * static_cast<double>(count * dtype_size(dtype)) / (ms * 1e-3) / 1e9;
        print({bytes, "sum 2->1", std::string(dtype_name(dtype)), ms, gbps,
               100.0 * gbps / copy_gbps});
      }
    }
    for (void* b : buffers) {
      if (b != nullptr) (void)cudaFree(b);
    }
    if (!ok) {
      status = 1;
      break;
    }
  }
  (void)cudaStreamDestroy(stream);
  if (!options.json.empty() && !write_json(options.json, prop.name, rows)) status = 1;
  return status;
}

}  // namespace
}  // namespace tributary::algorithms

int main(int argc, char** argv) {
  tributary::algorithms::Options options;
  const int parsed = tributary::algorithms::parse_args(argc, argv, &options);
  if (parsed != 0) return parsed < 0 ? 0 : parsed;
  return tributary::algorithms::run(options);
}
