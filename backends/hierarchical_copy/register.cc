#include <memory>

#include "backends/hierarchical_copy/hierarchical_copy_ops.h"
#include "backends/in_process.h"
#include "tributary/registry.h"

namespace tributary {

Status register_hierarchical_copy(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "hierarchical_copy";
  info.summary = "in-process: reduce within groups of devices, then across the group leaders, then "
                 "copy back (TF's HierarchicalCopyAllReduce, correct for any replica count)";
  info.options = {
      {.name = "num_packs",
       .type = OptionType::kInt,
       .default_value = "1",
       .help = "batch_reduce concatenates tensors and splits them into this many packs; 0 reduces "
               "tensor by tensor",
       .min = 0},
      {.name = "group_size",
       .type = OptionType::kInt,
       .default_value = "0",
       .help = "replicas per group; 0: on GPUs the groups the topology gives (peer access, NVLink "
               "first), on CPUs ceil(replicas / 2), i.e. two groups as on a DGX-1",
       .min = 0},
  };
  info.capabilities = backends::in_process_capabilities();
  info.auto_priority = 5;
  info.create = [caps = info.capabilities](const BackendContext& context, Options options)
      -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    return std::unique_ptr<CrossDeviceOps>(
        std::make_unique<backends::HierarchicalCopyOps>(context, std::move(options), caps));
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
