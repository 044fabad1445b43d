// The `nccl` backend's entry in the registry: options, capabilities, and what it needs to serve.
#include <memory>
#include <string>

#include "backends/nccl/nccl_ops.h"
#include "core/gpu.h"
#include "core/rendezvous.h"
#include "fmt/format.h"
#include "tributary/registry.h"

namespace tributary {

Status register_nccl(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "nccl";
  info.summary = "NVIDIA NCCL " + backends::nccl_runtime_version() +
                 " on CUDA GPUs, one process or many (TF's NcclAllReduce): every collective, "
                 "with NCCL's own algorithms over NVLink, PCIe, shared memory and the network";
  info.options = {
      {.name = "num_packs",
       .type = OptionType::kInt,
       .default_value = "1",
       .help = "batch_reduce packs the values into this many pieces before all-reducing them "
               "(TF's NcclAllReduce(num_packs)); 0 reduces each value on its own"},
      {.name = "launch",
       .type = OptionType::kEnum,
       .default_value = "nonblocking",
       .help = "how collectives are handed to NCCL (setup is non-blocking with a deadline either "
               "way): nonblocking (NCCL's non-blocking communicator: across ranks NCCL starts a "
               "helper thread for every call, and the calling thread never waits inside NCCL) or "
               "blocking (a blocking communicator split from the setup one, as nccl-tests and "
               "torch's default use: no helper thread per call; a call that waits inside NCCL for "
               "a peer, as at the first collective of each kind while NCCL connects, is ended by "
               "the watchdog after `timeout`; needs NCCL 2.28 or later). Measured only at one "
               "rank, where NCCL starts no thread either way: the same speed",
       .choices = {"nonblocking", "blocking"}},
  };
  Capabilities caps;
  caps.device_types = {DeviceType::kCuda};
  caps.dtypes.assign(all_dtypes().begin(), all_dtypes().end());
  caps.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  caps.collectives.assign(all_collectives().begin(), all_collectives().end());
  caps.multi_process = true;
  info.capabilities = caps;
  info.auto_priority = 20;  // TF's default when every device is a GPU
  info.check_available = [](const BackendContext& context) -> Status {
    // TF: "NCCL is not supported when using virtual GPUs"; NCCL refuses two ranks on one GPU.
    for (size_t i = 0; i < context.devices.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        const int a = gpu::physical_device(context.devices[i].index());
        if (a == gpu::physical_device(context.devices[j].index())) {
          return failed_precondition(fmt::format(
              "NCCL is not supported when using virtual GPUs: {} and {} are both physical GPU {} "
              "(TRIBUTARY_VIRTUAL_GPUS={}); NCCL needs a GPU of its own per replica. Use "
              "reduction_to_one_device or hierarchical_copy",
              context.devices[j].to_string(), context.devices[i].to_string(), a,
              gpu::virtual_per_physical()));
        }
      }
    }
    return Status();
  };
  info.check_options = [](const Options& options) -> Status {
    if (const int64_t num_packs = options.get_int("num_packs"); num_packs < 0) {
      // TF's words.
      return invalid_argument(fmt::format(
          "NCCL all-reduce requires num_packs >= 0, but {} is specified", num_packs));
    }
    return Status();
  };
  info.create = [caps](const BackendContext& context,
                       Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    std::shared_ptr<Store> scope;
    if (context.world_size > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto store, internal::instance_store(context, "nccl"));
      scope = store;
    }
    return backends::make_nccl_ops(context, std::move(options), caps, std::move(scope));
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
