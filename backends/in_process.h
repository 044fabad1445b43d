// What the in-process backends share: their capabilities. (Header-only; each backend folder still
// has its own ops and register files.)
#pragma once

#include <vector>

#include "algorithms/device_reduce.h"
#include "tributary/cross_device_ops.h"

namespace tributary::backends {

// CPUs, and CUDA GPUs when tributary was built with its device kernels (any mix of the two).
inline Capabilities in_process_capabilities() {
  Capabilities c;
  c.device_types = {DeviceType::kCpu};
  if (algorithms::device_kernels_built()) c.device_types.push_back(DeviceType::kCuda);
  c.dtypes.assign(all_dtypes().begin(), all_dtypes().end());
  c.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  c.collectives.assign(all_collectives().begin(), all_collectives().end());
  c.multi_process = false;
  return c;
}

}  // namespace tributary::backends
