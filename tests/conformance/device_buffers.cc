#include "tests/conformance/device_buffers.h"

#include <cstdlib>
#include <utility>

namespace tributary::conformance {

::testing::AssertionResult copy_bytes(void* dst, const Device& dst_device, const void* src,
                                      const Device& src_device, size_t bytes) {
  const Device& device = dst_device.is_cpu() ? src_device : dst_device;
  auto allocator = allocator_for(device);
  if (!allocator.ok()) {
    return ::testing::AssertionFailure() << "no allocator for " << device.to_string() << ": "
                                         << allocator.status().to_string();
  }
  Status s = (*allocator)->copy(dst, dst_device, src, src_device, bytes);
  if (!s.ok()) {
    return ::testing::AssertionFailure() << "copy " << src_device.to_string() << " -> "
                                         << dst_device.to_string() << " (" << bytes
                                         << " bytes): " << s.to_string();
  }
  return ::testing::AssertionSuccess();
}

DeviceBuffers::DeviceBuffers(DType t, int64_t count, const std::vector<Device>& devices,
                             bool shareable) {
  for (const Device& d : devices) {
    auto b = shareable && d.is_cpu() ? Buffer::allocate_shareable(t, Shape{count}, d)
                                     : Buffer::allocate(t, Shape{count}, d);
    if (!b.ok()) {
      if (status.ok()) {
        status = Status(b.status().code(), "allocating " + std::to_string(count) + " x " +
                                               std::string(dtype_name(t)) + " on " +
                                               d.to_string() + ": " + b.status().message());
      }
      b = Buffer::allocate(t, Shape{count}, Device::cpu());
      if (!b.ok()) std::abort();
    }
    views.values().push_back(b->tensor());
    if (d.is_cpu()) {
      hosts.push_back(b->tensor());
    } else {
      auto shadow = Buffer::allocate(t, Shape{count}, Device::cpu());
      if (!shadow.ok()) std::abort();
      hosts.push_back(shadow->tensor());
      shadows.push_back(std::move(shadow).value());
    }
    owned.push_back(std::move(b).value());
  }
}

::testing::AssertionResult DeviceBuffers::upload() const {
  if (!status.ok()) return ::testing::AssertionFailure() << status.to_string();
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].device().is_cpu()) continue;
    auto copied = copy_bytes(views[i].data(), views[i].device(), hosts[i].data(), Device::cpu(),
                             views[i].nbytes());
    if (!copied) return copied;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult DeviceBuffers::download() const {
  if (!status.ok()) return ::testing::AssertionFailure() << status.to_string();
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].device().is_cpu()) continue;
    auto copied = copy_bytes(hosts[i].data(), Device::cpu(), views[i].data(), views[i].device(),
                             views[i].nbytes());
    if (!copied) return copied;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tributary::conformance
