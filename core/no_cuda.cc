// Built when tributary has no CUDA: there is no CUDA allocator.
#include "tributary/tensor.h"

namespace tributary {
Allocator* cuda_allocator() { return nullptr; }
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
}  // namespace tributary
