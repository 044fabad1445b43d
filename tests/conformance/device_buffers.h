// Per-replica test buffers on any device, shared by the in-process and multi-process conformance
// suites. The collectives see the device tensors (operator[], views); the test writes inputs into
// and checks results in the host tensors (host()). On a CPU device the host tensor is the buffer
// itself and upload()/download() do nothing; on a GPU it is a host shadow that upload() copies to
// the device buffer and download() copies back, each buffer whole in one copy.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tributary/tensor.h"
#include "tributary/values.h"

namespace tributary::conformance {

// Copies `bytes` between a device buffer and its host shadow, synchronously.
::testing::AssertionResult copy_bytes(void* dst, const Device& dst_device, const void* src,
                                      const Device& src_device, size_t bytes);

struct DeviceBuffers {
  std::vector<Buffer> owned;    // on the replicas' devices
  std::vector<Buffer> shadows;  // host shadows of the non-CPU buffers (none for CPU devices)
  PerReplica<Tensor> views;     // device tensors
  std::vector<Tensor> hosts;    // per replica: the shadow, or on CPU the buffer itself
  // The first allocation failure. The replicas keep their indices (a host stand-in takes the place
  // of a buffer that could not be allocated), and upload() and download() fail with this status.
  Status status;

  // `shareable`: CPU buffers from Buffer::allocate_shareable (memory other processes can map).
  DeviceBuffers(DType t, int64_t count, const std::vector<Device>& devices,
                bool shareable = false);
  const Tensor& operator[](size_t i) const { return views[i]; }
  const Tensor& host(size_t i) const { return hosts[i]; }

  // Host shadows -> device buffers.
  ::testing::AssertionResult upload() const;
  // Device buffers -> host shadows.
  ::testing::AssertionResult download() const;
};

}  // namespace tributary::conformance
