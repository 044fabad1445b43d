// What the in-process backends share: their capabilities. (Header-only; each backend folder still
// has its own ops and register files.)
#pragma once

#include <vector>

#include "tributary/cross_device_ops.h"

namespace tributary::backends {

inline Capabilities in_process_cpu_capabilities() {
  Capabilities c;
  c.device_types = {DeviceType::kCpu};
  c.dtypes.assign(all_dtypes().begin(), all_dtypes().end());
  c.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  c.collectives.assign(all_collectives().begin(), all_collectives().end());
  c.multi_process = false;
  return c;
}

}  // namespace tributary::backends
