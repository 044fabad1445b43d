// The library's version, and what this build has and sees (for tributary-info and bug reports).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tributary/export.h"

TRIBUTARY_BEGIN_PUBLIC_API
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
  // How this library was built: what the configure step found, with the versions of the headers
  // compiled against ("" when left out, or when the package does not say).
  std::string build_type;     // "RelWithDebInfo"
  std::string compiler;       // "GNU 12.2.0"
  std::string cuda_toolkit;   // "13.0.88", the toolkit compiled against
  bool nccl = false;          // the nccl backend is built in
  std::string nccl_version;   // "2.28.9"
  bool ucx = false;           // the ucx backend is built in
  std::string ucx_version;    // "1.13.1"
  bool gloo = false;          // the gloo backend is built in
  std::string gloo_version;   // "0.5.0"
};
BuildInfo build_info();
}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
