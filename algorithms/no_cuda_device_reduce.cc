// device_reduce.h for builds without CUDA: no device kernels, and every call says so.
#include <cstddef>
#include <cstdint>

#include "algorithms/device_reduce.h"
#include "tributary/status.h"

namespace tributary::algorithms {
namespace {

Status no_cuda() {
  return unimplemented(
      "tributary was built without CUDA (configure with -DTRIBUTARY_WITH_CUDA=ON and the CUDA "
      "toolkit installed)");
}

}  // namespace

bool device_kernels_built() { return false; }

Status device_reduce_n(ReduceOp, DType, const void* const*, size_t, void* const*, size_t, size_t,
                       int64_t, int, void*) {
  return no_cuda();
}

Status device_divide(DType, void*, size_t, int64_t, int, void*) { return no_cuda(); }

}  // namespace tributary::algorithms
