// tributary-bench --ceiling with -g N, built with CUDA (bench/device_ceiling.h).
#include "bench/device_ceiling.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace tributary::bench {
namespace {

constexpr size_t kBytes = size_t{256} << 20;
constexpr int kRounds = 10;

Status cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  return failed_precondition(std::string("--ceiling: ") + what + " failed: " + cudaGetErrorName(e) +
                             ": " + cudaGetErrorString(e));
}

// Owns what the measurement allocates, whatever path it leaves by.
struct Resources {
  void* a = nullptr;
  void* b = nullptr;
  void* host = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ~Resources() {
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    if (a != nullptr) (void)cudaFree(a);
    if (b != nullptr) (void)cudaFree(b);
    if (host != nullptr) (void)cudaFreeHost(host);
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (stop != nullptr) (void)cudaEventDestroy(stop);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
};

// Seconds that kRounds copies of kBytes from `src` to `dst` take on the stream (after one warm-up).
StatusOr<double> time_copies(Resources& r, void* dst, const void* src) {
  TRIBUTARY_RETURN_IF_ERROR(
      cuda(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, r.stream), "warm-up copy"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaEventRecord(r.start, r.stream), "cudaEventRecord"));
  for (int i = 0; i < kRounds; ++i) {
    TRIBUTARY_RETURN_IF_ERROR(
        cuda(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, r.stream), "cudaMemcpyAsync"));
  }
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaEventRecord(r.stop, r.stream), "cudaEventRecord"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaEventSynchronize(r.stop), "cudaEventSynchronize"));
  float ms = 0;
  TRIBUTARY_RETURN_IF_ERROR(
      cuda(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime"));
  if (ms <= 0) return internal_error("--ceiling: the copies took no measurable time");
  return static_cast<double>(ms) / 1e3;
}

}  // namespace

StatusOr<DeviceCeiling> measure_device_ceiling(int device) {
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaSetDevice(device), "cudaSetDevice"));
  Resources r;
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaMalloc(&r.a, kBytes), "cudaMalloc"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaMalloc(&r.b, kBytes), "cudaMalloc"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaMallocHost(&r.host, kBytes), "cudaMallocHost"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaMemset(r.a, 1, kBytes), "cudaMemset"));
  TRIBUTARY_RETURN_IF_ERROR(
      cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaEventCreate(&r.start), "cudaEventCreate"));
  TRIBUTARY_RETURN_IF_ERROR(cuda(cudaEventCreate(&r.stop), "cudaEventCreate"));
  const double moved = static_cast<double>(kBytes) * kRounds / 1e9;
  DeviceCeiling c;
  TRIBUTARY_ASSIGN_OR_RETURN(double d2d, time_copies(r, r.b, r.a));
  c.copy_gbps = 2 * moved / d2d;  // read + written, as the host memcpy figure counts
  TRIBUTARY_ASSIGN_OR_RETURN(double h2d, time_copies(r, r.a, r.host));
  c.to_device_gbps = moved / h2d;
  TRIBUTARY_ASSIGN_OR_RETURN(double d2h, time_copies(r, r.host, r.a));
  c.to_host_gbps = moved / d2h;
  return c;
}

}  // namespace tributary::bench
