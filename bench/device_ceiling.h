// tributary-bench --ceiling with -g N: what one GPU's memory moves, measured with CUDA events.
#pragma once

#include "tributary/status.h"

namespace tributary::bench {

struct DeviceCeiling {
  double copy_gbps = 0;       // device-to-device copy on the GPU, bytes read + written per second
  double to_device_gbps = 0;  // pinned host -> device (what staging copies in)
  double to_host_gbps = 0;    // device -> pinned host (what staging copies out)
};

// Measures GPU `device` (a CUDA ordinal) with 256 MiB copies; Unimplemented without CUDA.
StatusOr<DeviceCeiling> measure_device_ceiling(int device);

}  // namespace tributary::bench
