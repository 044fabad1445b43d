#include <memory>

#include "backends/in_process.h"
#include "backends/reduction_to_one_device/reduction_to_one_device_ops.h"
#include "core/gpu.h"
#include "tributary/registry.h"

namespace tributary {

Status register_reduction_to_one_device(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "reduction_to_one_device";
  info.summary = "in-process: reduce on one device, then copy the result to every destination "
                 "(TF's ReductionToOneDevice)";
  info.options = {
      {.name = "reduce_to_device",
       .type = OptionType::kString,
       .default_value = "",
       .help = "device to reduce on, e.g. CPU:0 (default: the first destination's device)"},
  };
  info.capabilities = backends::in_process_capabilities();
  info.auto_priority = 10;  // TF's choice for anything that is not all-GPU with NCCL
  info.create = [caps = info.capabilities](const BackendContext& context, Options options)
      -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    std::optional<Device> target;
    if (const std::string& text = options.get_string("reduce_to_device"); !text.empty()) {
      auto device = Device::parse(text);
      if (!device.ok()) {
        return device.status().with_context("backend 'reduction_to_one_device' option "
                                            "reduce_to_device");
      }
      if (!caps.supports(device->type())) {
        return unimplemented("backend 'reduction_to_one_device': reduce_to_device " +
                             device->to_string() + " is not a supported device type");
      }
      // A GPU this process cannot see is refused now, not at the first collective.
      if (Status visible = gpu::check_visible(*device); !visible.ok()) {
        return visible.with_context("backend 'reduction_to_one_device': reduce_to_device");
      }
      target = *device;
    }
    return std::unique_ptr<CrossDeviceOps>(std::make_unique<backends::ReductionToOneDeviceOps>(
        context, std::move(options), caps, target));
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
