#include "backends/reduction_to_one_device/reduction_to_one_device_ops.h"

#include <string>

#include "algorithms/local_collectives.h"

namespace tributary::backends {

ReductionToOneDeviceOps::ReductionToOneDeviceOps(BackendContext context, Options options,
                                                 Capabilities caps,
                                                 std::optional<Device> reduce_to_device)
    : CrossDeviceOps("reduction_to_one_device", std::move(context), std::move(options),
                     std::move(caps)),
      reduce_to_device_(std::move(reduce_to_device)) {}

Work ReductionToOneDeviceOps::reduce_impl(const CallInfo& call, ReduceOp op,
                                          const PerReplica<Tensor>& value,
                                          const Mirrored<Tensor>& destinations) {
  const Device& target = reduce_to_device_ ? *reduce_to_device_ : destinations[0].device();
  log_debug("reduce to " + target.to_string() + " then broadcast to " +
            std::to_string(destinations.size()) + " destination(s): " + call.describe());
  return Work::completed(algorithms::local_reduce(op, value.values(), destinations.values(),
                                                  static_cast<int64_t>(value.size()),
                                                  reduce_to_device_));
}

Work ReductionToOneDeviceOps::all_reduce_impl(const CallInfo& call, ReduceOp op,
                                              const PerReplica<Tensor>& inputs,
                                              const PerReplica<Tensor>& outputs) {
  (void)call;
  // As TF's reduce_implementation, which all-reduce goes through: on reduce_to_device when set.
  return Work::completed(algorithms::local_reduce(op, inputs.values(), outputs.values(),
                                                  num_replicas_in_sync(), reduce_to_device_));
}

Work ReductionToOneDeviceOps::broadcast_impl(const CallInfo&, const Tensor& source,
                                             const Mirrored<Tensor>& destinations, int) {
  return Work::completed(algorithms::local_copy(source, destinations.values()));
}

Work ReductionToOneDeviceOps::all_gather_impl(const CallInfo&, const PerReplica<Tensor>& inputs,
                                              const PerReplica<Tensor>& outputs) {
  return Work::completed(algorithms::local_all_gather(inputs.values(), outputs.values()));
}

Work ReductionToOneDeviceOps::reduce_scatter_impl(const CallInfo&, ReduceOp op,
                                                  const PerReplica<Tensor>& inputs,
                                                  const PerReplica<Tensor>& outputs) {
  return Work::completed(algorithms::local_reduce_scatter(op, inputs.values(), outputs.values(),
                                                          num_replicas_in_sync()));
}

}  // namespace tributary::backends
