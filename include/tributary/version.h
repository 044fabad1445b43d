// The library's version, and what this build has and sees (for tributary-info and bug reports).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tributary {
std::string_view version();  // "0.1.0"

struct BuildInfo {
  std::string version;
  bool cuda = false;          // built with CUDA
  std::string cuda_runtime;   // "13.0" (the runtime linked in), "" without CUDA
  std::string cuda_driver;    // the newest CUDA the driver supports, "" without a driver
  std::vector<std::string> gpus;  // "GPU:0 NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, 132 SMs, ..."
  std::string gpu_error;      // why no GPU is visible, when none is
  std::string visible_devices;  // "CUDA_VISIBLE_DEVICES=..." or "... is unset"
  int virtual_gpus_per_gpu = 1;  // TRIBUTARY_VIRTUAL_GPUS
};
BuildInfo build_info();
}  // namespace tributary
