// The concrete strategies: selections of devices, a backend spec and a variable placement.
#include "tributary/strategy/strategies.h"

#include <algorithm>
#include <set>

#include "core/gpu.h"
#include "core/logging.h"
#include "core/strings.h"
#include "fmt/format.h"
#include "tributary/cluster.h"

namespace tributary {
namespace {

std::vector<Device> default_devices() {
  std::vector<Device> d;
  for (int i = 0; i < cuda_device_count(); ++i) d.push_back(Device::cuda(i));
  if (d.empty()) d.push_back(Device::cpu(0));
  return d;
}

Status check_devices(const std::vector<Device>& devices, std::string_view argument) {
  if (devices.empty()) {
    return invalid_argument(
        fmt::format("Got an empty `{}` list and unable to recognize any local devices.", argument));
  }
  std::set<Device> seen;
  for (const Device& d : devices) {
    if (!seen.insert(d).second) {
      std::string list;
      for (const Device& x : devices) list += (list.empty() ? "" : ", ") + x.to_string();
      return invalid_argument(
          fmt::format("No duplicates allowed in `{}` argument: [{}]", argument, list));
    }
  }
  return ok_status();
}

bool all_gpus(const std::vector<Device>& devices) {
  return std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cuda(); });
}

const BackendRegistry& registry_or_builtin(const BackendRegistry* r) {
  static const BackendRegistry builtin = builtin_backends();
  return r ? *r : builtin;
}

StatusOr<std::unique_ptr<CrossDeviceOps>> create_backend(const BackendRegistry& registry,
                                                         const std::string& spec,
                                                         const BackendContext& context) {
  StatusOr<std::unique_ptr<CrossDeviceOps>> ops = registry.create(spec, context);
  if (!ops.ok()) return ops.status().with_context("creating the strategy's cross_device_ops");
  return ops;
}

StrategyParts parts_of(StrategyKind kind, std::string name, std::vector<Device> devices,
                       std::unique_ptr<CrossDeviceOps> ops) {
  StrategyParts parts;
  parts.kind = kind;
  parts.name = std::move(name);
  parts.devices = std::move(devices);
  parts.cross_device_ops = std::move(ops);
  return parts;
}

StatusOr<std::unique_ptr<Strategy>> single_replica(StrategyKind kind, std::string name,
                                                   Device device, bool default_handle = false) {
  BackendContext context;
  context.devices = {device};
  TRIBUTARY_ASSIGN_OR_RETURN(
      auto ops, create_backend(registry_or_builtin(nullptr), "reduction_to_one_device", context));
  StrategyParts parts = parts_of(kind, std::move(name), {device}, std::move(ops));
  parts.parameter_device = device;
  parts.default_handle = default_handle;
  return std::make_unique<Strategy>(std::move(parts));
}

}  // namespace

Strategy& default_strategy() {
  static Strategy* const instance = [] {
    StatusOr<std::unique_ptr<Strategy>> s =
        single_replica(StrategyKind::kDefault, "DefaultStrategy", Device::cpu(0));
    assert(s.ok());       // CPU reduction_to_one_device is always built in
    return s->release();  // lives for the whole program, like TF's singleton
  }();
  return *instance;
}

// TF's rule for an explicit NCCL request that cannot be met: MultiWorkerMirroredStrategy with
// CommunicationImplementation.NCCL on a worker without GPUs warns "Enabled NCCL communication but no
// GPUs detected/specified." and runs RING. The same holds here for MirroredStrategy with an nccl
// spec (falling back to its CPU default), and for a build without the nccl backend. A spec naming
// nccl ("nccl", "NCCL", "nccl:opts") becomes `fallback` (nccl's options do not carry over); any
// other spec is returned as it is.
static std::string nccl_or_fallback(const std::string& spec, const std::vector<Device>& devices,
                                    const BackendRegistry& registry,
                                    const std::string& fallback, const internal::Logger& log) {
  StatusOr<BackendSpec> parsed = BackendSpec::parse(spec);
  if (!parsed.ok() || internal::to_lower(parsed->name) != "nccl") return spec;
  if (!all_gpus(devices)) {
    log.log(internal::LogLevel::kWarning,
            "Enabled NCCL communication but no GPUs detected/specified. Using '{}' instead of "
            "'{}'.",
            fallback, spec);
    return fallback;
  }
  if (!registry.find("nccl")) {
    log.log(internal::LogLevel::kWarning,
            "Nccl kernel is not found, not using nccl allreduce: this build has no nccl backend "
            "(configure with -DTRIBUTARY_WITH_NCCL=ON). Using '{}' instead of '{}'.",
            fallback, spec);
    return fallback;
  }
  return "nccl" + spec.substr(parsed->name.size());
}

StatusOr<std::unique_ptr<Strategy>> make_one_device_strategy(Device device) {
  return single_replica(StrategyKind::kOneDevice, "OneDeviceStrategy", std::move(device));
}

StatusOr<std::unique_ptr<Strategy>> make_mirrored_strategy(MirroredStrategyOptions options) {
  std::vector<Device> devices = options.devices.empty() ? default_devices() : options.devices;
  TRIBUTARY_RETURN_IF_ERROR(check_devices(devices, "devices"));
  const BackendRegistry& registry = registry_or_builtin(options.registry);
  std::string spec = options.cross_device_ops;
  if (!spec.empty()) {
    spec = nccl_or_fallback(spec, devices, registry, "reduction_to_one_device",
                            internal::Logger(internal::log_level_from(Config::from_environment()),
                                             "MirroredStrategy"));
  }
  if (spec.empty()) {
    // TF's select_cross_device_ops: NCCL only when every device is a GPU and NCCL exists, with
    // TF's warnings when it falls back.
    spec = all_gpus(devices) && registry.find("nccl") ? "nccl" : "reduction_to_one_device";
    const bool any_gpu = std::any_of(devices.begin(), devices.end(),
                                     [](const Device& d) { return d.is_cuda(); });
    const internal::Logger log(internal::log_level_from(Config::from_environment()),
                               "MirroredStrategy");
    if (any_gpu && !all_gpus(devices)) {
      log.log(internal::LogLevel::kWarning,
              "There are non-GPU devices in `tf.distribute.Strategy`, not using nccl allreduce.");
    } else if (any_gpu && !registry.find("nccl")) {
      log.log(internal::LogLevel::kWarning, "Nccl kernel is not found, not using nccl allreduce.");
    } else if (any_gpu && gpu::virtual_per_physical() > 1) {
      log.log(internal::LogLevel::kWarning,
              "NCCL is not supported when using virtual GPUs, falling back to reduction to one "
              "device");
      spec = "reduction_to_one_device";
    }
  }
  BackendContext context;
  context.devices = devices;
  context.config = Config::from_environment();
  TRIBUTARY_ASSIGN_OR_RETURN(auto ops, create_backend(registry, spec, context));
  if (ops->world_size() != 1) {
    return invalid_argument("MirroredStrategy is single-worker; use MultiWorkerMirroredStrategy");
  }
  StrategyParts parts =
      parts_of(StrategyKind::kMirrored, "MirroredStrategy", std::move(devices), std::move(ops));
  return std::make_unique<Strategy>(std::move(parts));
}

StatusOr<std::unique_ptr<Strategy>> make_multi_worker_mirrored_strategy(
    MultiWorkerMirroredStrategyOptions options) {
  std::vector<Device> devices = options.context           ? options.context->devices
                                : options.devices.empty() ? default_devices()
                                                          : options.devices;
  TRIBUTARY_RETURN_IF_ERROR(check_devices(devices, "devices"));
  Config config = options.config ? *options.config : Config::from_environment();
  ClusterSpec cluster;
  if (options.context) {
    cluster.rank = options.context->rank;
    cluster.task_index = options.context->rank;
    cluster.world_size = options.context->world_size;
  } else {
    TRIBUTARY_ASSIGN_OR_RETURN(cluster, resolve_cluster_spec(config));
  }
  const BackendRegistry& registry = registry_or_builtin(options.registry);
  const CommunicationOptions& comm = options.communication;
  if (comm.bytes_per_pack < 0) {
    return invalid_argument(
        fmt::format("bytes_per_pack must be non-negative, not {}", comm.bytes_per_pack));
  }
  std::string spec = comm.implementation.empty() ? "auto" : comm.implementation;
  // TF's CommunicationImplementation names, in any case; any other spec as written.
  if (internal::iequals(spec, "auto")) {
    spec = all_gpus(devices) && registry.find("nccl") ? "nccl" : "ring";
  } else if (internal::iequals(spec, "ring")) {
    spec = "ring";
  } else if (internal::iequals(spec, "nccl")) {
    spec = "nccl";
  }
  spec = nccl_or_fallback(spec, devices, registry, "ring",
                          internal::Logger(internal::log_level_from(config),
                                           "MultiWorkerMirroredStrategy"));
  // The communication options become backend options, where the backend has them.
  TRIBUTARY_ASSIGN_OR_RETURN(BackendSpec parsed, BackendSpec::parse(spec));
  std::vector<std::string> extra;
  if (comm.timeout.count() > 0) extra.push_back(fmt::format("timeout={}ms", comm.timeout.count()));
  if (comm.bytes_per_pack > 0) {
    const BackendInfo* info = registry.find(parsed.name);
    bool has = false;
    if (info) {
      for (const OptionDef& o : registry.options_of(*info)) has = has || o.name == "bytes_per_pack";
    }
    if (!has) {
      return invalid_argument(
          fmt::format("communication bytes_per_pack={} is not an option of backend '{}'",
                      comm.bytes_per_pack, parsed.name));
    }
    extra.push_back(fmt::format("bytes_per_pack={}", comm.bytes_per_pack));
  }
  for (const std::string& e : extra) spec += (spec.find(':') == std::string::npos ? ":" : ",") + e;

  BackendContext context;
  if (options.context) {
    context = *options.context;
  } else {
    // Checked before the rendezvous, so that a bad spec ends every worker at once (registry.h).
    if (Status s = registry.check_everywhere(spec, config, devices); !s.ok()) {
      return s.with_context("creating the strategy's cross_device_ops");
    }
    TRIBUTARY_ASSIGN_OR_RETURN(
        context, make_backend_context(devices, config,
                                      options.startup_timeout ? options.startup_timeout
                                                              : spec_timeout({spec})));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(auto ops, create_backend(registry, spec, context));
  StrategyParts parts = parts_of(StrategyKind::kMultiWorkerMirrored, "MultiWorkerMirroredStrategy",
                                 std::move(devices), std::move(ops));
  parts.worker_index = cluster.rank;
  parts.num_workers = cluster.world_size;
  parts.is_chief = cluster.is_chief();
  return std::make_unique<Strategy>(std::move(parts));
}

StatusOr<std::unique_ptr<Strategy>> make_central_storage_strategy(
    CentralStorageStrategyOptions options) {
  std::vector<Device> devices =
      options.compute_devices.empty() ? default_devices() : options.compute_devices;
  TRIBUTARY_RETURN_IF_ERROR(check_devices(devices, "compute_devices"));
  Device parameter = Device::cpu(0);
  if (options.parameter_device) {
    parameter = *options.parameter_device;
  } else if (devices.size() == 1 && devices[0].is_cuda()) {
    parameter = devices[0];  // TF: with one GPU, variables live on it too
  }
  const BackendRegistry& registry = registry_or_builtin(options.registry);
  BackendContext context;
  context.devices = devices;
  context.config = Config::from_environment();
  const std::string spec =
      options.cross_device_ops.empty() ? "reduction_to_one_device" : options.cross_device_ops;
  TRIBUTARY_ASSIGN_OR_RETURN(auto ops, create_backend(registry, spec, context));
  StrategyParts parts = parts_of(StrategyKind::kCentralStorage, "CentralStorageStrategy",
                                 std::move(devices), std::move(ops));
  parts.central_variables = true;
  parts.parameter_device = parameter;
  return std::make_unique<Strategy>(std::move(parts));
}

StatusOr<std::unique_ptr<Strategy>> make_strategy(std::string_view name, int replicas,
                                                  std::string backend) {
  if (replicas < 1) return invalid_argument(fmt::format("replicas must be >= 1, not {}", replicas));
  std::vector<Device> cpus;
  for (int i = 0; i < replicas; ++i) cpus.push_back(Device::cpu(i));
  if (name == "default") {
    // TF forbids a second default strategy, and a unique_ptr cannot hold the singleton: this is a
    // handle on default_strategy() (strategy.h).
    return single_replica(StrategyKind::kDefault, "DefaultStrategy", Device::cpu(0),
                          /*default_handle=*/true);
  }
  if (name == "one_device") return make_one_device_strategy(Device::cpu(0));
  if (name == "mirrored") return make_mirrored_strategy({cpus, backend, nullptr});
  if (name == "multi_worker_mirrored") {
    MultiWorkerMirroredStrategyOptions o;
    o.devices = cpus;
    if (!backend.empty()) o.communication.implementation = backend;
    return make_multi_worker_mirrored_strategy(std::move(o));
  }
  if (name == "central_storage") {
    CentralStorageStrategyOptions o;
    o.compute_devices = cpus;
    o.cross_device_ops = backend;
    return make_central_storage_strategy(std::move(o));
  }
  return not_found(fmt::format(
      "unknown strategy '{}'; valid: default, one_device, mirrored, multi_worker_mirrored, "
      "central_storage",
      name));
}

}  // namespace tributary
