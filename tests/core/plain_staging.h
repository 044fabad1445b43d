// A StagingDevice (core/host_staging.h) for tests of the host-staging layer without a GPU: it
// stages CPU tensors through malloc'd twins, with plain copies, and counts what it does. It stands
// in for CUDA's copies, below the layer under test; the backends under the wrapper are real.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/host_staging.h"

namespace tributary::fakes {

// Stages CPU tensors through malloc'd twins, counting what it does.
class PlainStaging final : public internal::StagingDevice {
 public:
  bool stages(const Device& device) const override { return device.is_cpu(); }
  StatusOr<void*> allocate(size_t bytes) override {
    ++live;
    return std::malloc(bytes);
  }
  void free(void* host) noexcept override {
    --live;
    std::free(host);
  }
  Status copy(const internal::StagingPlan& plan, const std::vector<size_t>& slots, std::byte* block,
              bool to_host) override {
    if (to_host && !fail_to_host.ok()) return fail_to_host;
    if (!to_host && !fail_to_device.ok()) return fail_to_device;
    for (size_t slot : slots) {
      const Tensor& t = plan.device_tensor(slot);
      std::byte* host = plan.host_data(slot, block);
      (to_host ? bytes_in : bytes_out) += t.nbytes();
      if (!to_host && !copy_back) continue;
      if (to_host) {
        std::memcpy(host, t.data(), t.nbytes());
      } else {
        std::memcpy(t.data(), host, t.nbytes());
      }
    }
    return Status();
  }

  std::atomic<int> live{0};
  std::atomic<size_t> bytes_in{0};
  std::atomic<size_t> bytes_out{0};
  bool copy_back = true;
  Status fail_to_host;    // what copies to the host return, when set
  Status fail_to_device;  // what copies back return, when set
};

}  // namespace tributary::fakes
