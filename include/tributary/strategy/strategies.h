// The concrete strategies: each is a selection of placement policy + CrossDeviceOps + input policy
// (strategy.h), built here. Backends are chosen by spec through a BackendRegistry (by default
// builtin_backends()), so any backend a program registers can serve any strategy.
//
//   DefaultStrategy             one replica on CPU:0; what code sees outside any scope.
//   OneDeviceStrategy(d)        one replica on `d`; reduce returns its input.
//   MirroredStrategy            one replica per local device (default: every visible GPU, else
//                               CPU:0). cross_device_ops: any backend spec; when empty, TF's choice
//                               adapted: "nccl" when every device is a GPU and the nccl backend is
//                               built in, else "reduction_to_one_device".
//   MultiWorkerMirroredStrategy one replica per local device on every worker of the cluster
//                               resolved from the config (TF_CONFIG, torchrun, Slurm, ...; see
//                               cluster.h), chief by TF's rule. communication.implementation:
//                               "auto" (nccl for all-GPU devices when built in, else ring, as TF's
//                               AUTO picks RING on CPUs), "ring", "nccl", or any backend spec.
//   CentralStorageStrategy      compute replicas on `compute_devices` (default: every GPU, else
//                               CPU:0), variables once on `parameter_device` (default CPU:0, or the
//                               GPU when there is exactly one), gradients reduced to it.
// Errors (an empty or duplicated device list, an unknown backend, a malformed cluster spec) are
// InvalidArgument/NotFound with TF's wording where TF has one.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tributary/config.h"
#include "tributary/export.h"
#include "tributary/registry.h"
#include "tributary/strategy/strategy.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

StatusOr<std::unique_ptr<Strategy>> make_one_device_strategy(Device device);

struct MirroredStrategyOptions {
  std::vector<Device> devices;                // empty = every visible GPU, else CPU:0
  std::string cross_device_ops;               // a backend spec; empty = TF's default choice (above)
  const BackendRegistry* registry = nullptr;  // null = builtin_backends()
};
StatusOr<std::unique_ptr<Strategy>> make_mirrored_strategy(MirroredStrategyOptions options = {});

// TF's tf.distribute.experimental.CommunicationOptions.
struct CommunicationOptions {
  std::string implementation = "auto";   // "auto", "ring", "nccl" or any backend spec
  int64_t bytes_per_pack = 0;            // 0 = the backend's default packing
  std::chrono::milliseconds timeout{0};  // 0 = the backend's default (TRIBUTARY_TIMEOUT, 5 min)
};

struct MultiWorkerMirroredStrategyOptions {
  std::vector<Device> devices;  // local replicas; empty = every visible GPU, else CPU:0
  CommunicationOptions communication;
  std::optional<Config> config;  // the environment to resolve the cluster from; unset = process env
  const BackendRegistry* registry = nullptr;
  // How long to wait for every worker at rendezvous; unset = TRIBUTARY_TIMEOUT, else 5 minutes.
  std::optional<std::chrono::milliseconds> startup_timeout;
  // For trainers with their own rendezvous: an already-made context (its devices, rank, world
  // size and store are used; `devices` and `config` are then ignored). Chief = rank 0.
  std::optional<BackendContext> context;
};
StatusOr<std::unique_ptr<Strategy>> make_multi_worker_mirrored_strategy(
    MultiWorkerMirroredStrategyOptions options = {});

struct CentralStorageStrategyOptions {
  std::vector<Device> compute_devices;
  std::optional<Device> parameter_device;
  std::string cross_device_ops;  // empty = "reduction_to_one_device"
  const BackendRegistry* registry = nullptr;
};
StatusOr<std::unique_ptr<Strategy>> make_central_storage_strategy(
    CentralStorageStrategyOptions options = {});

// By name, for flags and config files: "default", "one_device", "mirrored",
// "multi_worker_mirrored", "central_storage". `replicas` CPU replicas (CPU:0..n-1) where the
// strategy takes a device list; `backend` is the cross-device ops / communication spec ("" =
// default). An unknown name lists the valid ones. "default" gives a handle on default_strategy()
// (there is one default strategy, as in TF; strategy.h): its run(), scope(), variables and context
// checks are the default strategy's, and `replicas` and `backend` are ignored.
StatusOr<std::unique_ptr<Strategy>> make_strategy(std::string_view name, int replicas = 1,
                                                  std::string backend = "");

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
