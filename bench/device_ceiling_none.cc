// tributary-bench without CUDA: no device ceiling to measure.
#include "bench/device_ceiling.h"

namespace tributary::bench {

StatusOr<DeviceCeiling> measure_device_ceiling(int) {
  return unimplemented("--ceiling on GPUs: this tributary-bench was built without CUDA");
}

}  // namespace tributary::bench
