// The `ucx` backend: the algorithms of algorithms/collectives.h (ring, halving-doubling, tree
// broadcast, ring all-gather and reduce-scatter) over UCX (ucx_transport.h), composed with the
// local replicas by ProcessGroupOps like every multi-process backend. With several processes on
// each of several hosts, the all-reduce is hierarchical (algorithms/host_layout.h): a UCX group
// inside each host (UCX's shared memory) and one across hosts per local rank (UCX's network).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/host_layout.h"
#include "algorithms/process_group_ops.h"
#include "backends/ucx/ucx_transport.h"
#include "core/rendezvous.h"
#include "tributary/registry.h"

namespace tributary {
namespace {

// How long a ucx wait polls before it sleeps on the worker's event descriptor, for poll=on and for
// auto when the host has a core per rank: 1 ms, not the 50 us of ring. A transfer over UCX moves
// in protocol steps (a rendezvous's request, its answer, the data in fragments), and a rank asleep
// on the descriptor pays a wake-up for each; over TCP a 512 KiB message takes 200-400 us, so a
// 50 us poll slept through most of them. Measured (tributary-ucx-probe, N=2 on this 2-core VM,
// ucx:tls=tcp, one 512 KiB message each way per step, medians of 6 alternating rounds): 1.58 GB/s
// with 50 us, 2.07 with 200 us, 2.60 with 1 ms, 2.57 when always polling, 2.56 for raw UCP calls
// that always poll. A wait that outlasts the poll still sleeps, so a rank held up by a slow peer
// burns at most 1 ms of a core per wait.
constexpr std::chrono::microseconds kUcxPollOn{1000};

}  // namespace

Status register_ucx(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "ucx";
  info.summary =
      "across processes and hosts over UCX (shared memory, TCP, RDMA verbs: whatever UCX finds "
      "or tls allows): ring and halving-doubling all-reduce, tree broadcast, ring all-gather and "
      "reduce-scatter";
  info.options = {
      {.name = "tls",
       .type = OptionType::kString,
       .default_value = "",
       .help = "UCX transports to use, as UCX_TLS: e.g. sm (shared memory), tcp, rc,sm (RDMA and "
               "shared memory); default: UCX_TLS, else UCX picks from what the hosts have; every "
               "process must use the same"},
      {.name = "net_devices",
       .type = OptionType::kString,
       .default_value = "",
       .help = "network devices UCX may use, as UCX_NET_DEVICES (e.g. eth0 or mlx5_0:1); default: "
               "UCX_NET_DEVICES, else all"},
      {.name = "authenticate_frames",
       .type = OptionType::kBool,
       .default_value = "true",
       .help = "with a shared secret, put a MAC (GMAC, keyed per pair and direction from the "
               "secret) on every message and check it before data is used; false authenticates "
               "only the hello, which is faster but lets a relay on the path change data; every "
               "process must use the same value"},
  };
  info.options.push_back(algorithms::hierarchy_option(
      "one flat group: UCX picks the transport between every pair, shared memory on one host"));
  for (OptionDef& d : algorithms::transport_group_options()) info.options.push_back(std::move(d));
  const Capabilities caps = algorithms::process_group_capabilities();
  info.capabilities = caps;
  info.auto_priority = 6;  // below ring: "auto" keeps ring's shared memory and TCP paths
  info.check_options = [](const Options& options) {
    return algorithms::check_transport_group_options("ucx", options);
  };
  info.create = [caps](const BackendContext& context,
                       Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    std::unique_ptr<algorithms::ProcessGroup> group;
    std::shared_ptr<Store> scope;
    if (context.world_size > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto store, internal::instance_store(context, "ucx"));
      scope = store;
      backends::UcxTransportOptions t;
      t.tls = options.get_string("tls");
      t.net_devices = options.get_string("net_devices");
      TRIBUTARY_ASSIGN_OR_RETURN(
          t.secret, internal::read_secret(context.config, options.get_string("secret_file")));
      t.cluster_id = context.cluster_id;
      t.host_id = internal::host_id(context.config);
      t.authenticate_frames = options.get_bool("authenticate_frames");
      t.layout = algorithms::transport_group_layout(context, options) + ",tls=" + t.tls +
                 ",authenticate_frames=" + options.find("authenticate_frames")->text +
                 ",hierarchy=" + options.get_string("hierarchy");
      t.timeout = options.get_duration("timeout");
      const std::string hierarchy = options.get_string("hierarchy");
      TRIBUTARY_ASSIGN_OR_RETURN(
          const algorithms::HostLayout hosts,
          algorithms::learn_hosts(*store, context, "ucx", "hierarchy=" + hierarchy,
                                  options.get_duration("timeout")));
      // Whether waits may poll: by the ranks on this machine and their CPUs (see ring's
      // make_group).
      const internal::MachineShare machine = hosts.machine_of(context.rank);
      t.poll_before_sleep =
          internal::poll_duration(options.get_string("poll"), context, kUcxPollOn, machine);
      t.yield_before_sleep = internal::yield_duration(options.get_string("poll"), context, machine);
      // A UCX group among `members` (global ranks), this process being members[index].
      auto ucx_group = [&](Store& at, int index, const std::vector<int>& members)
          -> StatusOr<std::unique_ptr<algorithms::ProcessGroup>> {
        TRIBUTARY_ASSIGN_OR_RETURN(
            auto transport,
            backends::UcxTransport::create(at, index, static_cast<int>(members.size()), t));
        return std::unique_ptr<algorithms::ProcessGroup>(
            std::make_unique<algorithms::TransportGroup>(
                std::move(transport), algorithms::parse_algorithm(options.get_string("algorithm")),
                options.get_size("segment_bytes"),
                algorithms::ring_slice_bytes(options.get_size("slice_bytes"), hosts, members),
                "ucx"));
      };
      TRIBUTARY_ASSIGN_OR_RETURN(const bool hierarchical,
                                 algorithms::use_hierarchy("ucx", hierarchy, hosts));
      if (hierarchical) {
        TRIBUTARY_ASSIGN_OR_RETURN(
            group, algorithms::hierarchical_group(store, context, hosts, ucx_group, ucx_group));
      } else {
        std::vector<int> everyone(static_cast<size_t>(context.world_size));
        for (int r = 0; r < context.world_size; ++r) everyone[static_cast<size_t>(r)] = r;
        TRIBUTARY_ASSIGN_OR_RETURN(group, ucx_group(*store, context.rank, everyone));
      }
    }
    const uint64_t bytes_per_pack = options.get_size("bytes_per_pack");
    std::unique_ptr<CrossDeviceOps> ops = std::make_unique<algorithms::ProcessGroupOps>(
        "ucx", context, std::move(options), caps, std::move(group), bytes_per_pack);
    internal::attach_progress_store(*ops, std::move(scope));
    return ops;
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
