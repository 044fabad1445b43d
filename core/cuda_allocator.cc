// The CUDA allocator: cudaMalloc/cudaFree and cudaMemcpy, errors converted to Status where they
// first appear.
#include <cuda_runtime.h>

#include <string>

#include "tributary/tensor.h"

namespace tributary {
namespace {

Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status();
  return internal_error(what + " failed: " + cudaGetErrorString(err));
}

class CudaAllocator final : public Allocator {
 public:
  StatusOr<void*> allocate(const Device& device, size_t bytes) override {
    if (!device.is_cuda()) return invalid_argument("CUDA allocator asked for " + device.to_string());
    TRIBUTARY_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device.index()),
                                          "cudaSetDevice(" + std::to_string(device.index()) + ")"));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
      return resource_exhausted("cudaMalloc of " + std::to_string(bytes) + " bytes on " +
                                device.to_string() + " failed: " + cudaGetErrorString(err));
    }
    return p;
  }
  void deallocate(const Device& device, void* ptr, size_t) noexcept override {
    (void)cudaSetDevice(device.index());
    (void)cudaFree(ptr);
  }
  Status copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
              size_t bytes) override {
    if (bytes == 0 || dst == src) return Status();
    cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing picks the direction
    return cuda_status(cudaMemcpy(dst, src, bytes, kind),
                       "cudaMemcpy " + src_device.to_string() + " -> " + dst_device.to_string());
  }
};

}  // namespace

Allocator* cuda_allocator() {
  static CudaAllocator allocator;
  return &allocator;
}

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace tributary
