#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "algorithms/host_layout.h"
#include "algorithms/process_group_ops.h"
#include "core/crypto/crypto.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "transports/shm/shm_group.h"
#include "transports/tcp/congestion.h"
#include "transports/tcp/tcp_transport.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

using algorithms::parse_algorithm;

using algorithms::HostLayout;

// What every rank must agree on, as text (checked by the transports' handshakes).
std::string layout_text(const BackendContext& context, const Options& options) {
  return algorithms::transport_group_layout(context, options) +
         ",sockets_per_peer=" + options.find("sockets_per_peer")->text +
         ",shm_chunk_bytes=" + options.find("shm_chunk_bytes")->text +
         ",shm_single_copy=" + options.get_string("shm_single_copy") +
         ",hierarchy=" + options.get_string("hierarchy") +
         ",authenticate_frames=" + options.find("authenticate_frames")->text;
}

// Ranks `rank` of `size` over TCP, meeting under `store` (the whole world, or a subgroup under its
// own prefix); `slice_bytes` for its ring all-reduce (algorithms::ring_slice_bytes).
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> tcp_group(
    Store& store, int rank, int size, const BackendContext& context, const Options& options,
    size_t slice_bytes, internal::MachineShare machine, std::vector<bool> same_kernel) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::string secret, internal::read_secret(context.config, options.get_string("secret_file")));
  transports::TcpTransportOptions t;
  t.host = options.get_string("host");
  t.coordinator = context.coordinator_host;
  t.secret = std::move(secret);
  t.cluster_id = context.cluster_id;
  t.layout = layout_text(context, options);
  t.timeout = options.get_duration("timeout");
  t.poll_before_sleep =
      internal::poll_duration(options.get_string("poll"), context, internal::kPollOn, machine);
  t.yield_before_sleep = internal::yield_duration(options.get_string("poll"), context, machine);
  t.sockets_per_peer = static_cast<int>(options.get_int("sockets_per_peer"));
  t.authenticate_frames = options.get_bool("authenticate_frames");
  t.congestion = options.get_string("tcp_congestion");
  t.same_kernel = std::move(same_kernel);
  const std::string zero_copy = options.get_string("zero_copy");
  t.zero_copy = zero_copy != "off";
  if (zero_copy == "on") t.zero_copy_min_message = 0;
  TRIBUTARY_ASSIGN_OR_RETURN(auto transport, transports::TcpTransport::create(store, rank, size, t));
  return std::unique_ptr<algorithms::ProcessGroup>(std::make_unique<algorithms::TransportGroup>(
      std::move(transport), parse_algorithm(options.get_string("algorithm")),
      options.get_size("segment_bytes"), slice_bytes, "tcp"));
}

// Every rank on this host, through shared memory.
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> shm_group(Store& store,
                                                              const BackendContext& context,
                                                              const Options& options,
                                                              const std::vector<int>& members,
                                                              internal::MachineShare machine) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::string secret, internal::read_secret(context.config, options.get_string("secret_file")));
  transports::shm::ShmGroupOptions o;
  const uint64_t chunk = options.get_size("shm_chunk_bytes");
  if (chunk != 0) o.slot_bytes = o.single_copy_block_bytes = chunk;
  const std::string single_copy = options.get_string("shm_single_copy");
  o.timeout = options.get_duration("timeout");
  const std::string poll = options.get_string("poll");
  // From the layout alone, which every rank of this machine learned alike (LOCAL_WORLD_SIZE is each
  // process's own setting): the single-copy threshold below must agree.
  machine.ranks = std::max(machine.ranks, static_cast<int>(members.size()));
  const bool oversubscribed = internal::oversubscribed(machine);
  // The waits, as TCP's and ucx's (core/rendezvous.h; each rank decides alone, so a launcher's
  // LOCAL_WORLD_SIZE counts too): with more ranks than cores no busy polling, but the core yielded
  // for up to a millisecond before sleeping; the rank being waited for usually runs within that,
  // and a futex wake-up would cost tens of microseconds per step (4 ranks on 2 cores, 4 KiB: 62 us
  // with futexes, 13 us so).
  o.spin = internal::poll_duration(poll, context, internal::kPollOn, machine);
  o.yield = internal::yield_duration(poll, context, machine);
  // shm_single_copy=auto: every all-reduce over the latency path's 16 KiB where every process may
  // reach its peers' memory, or from 256 KiB with more ranks than cores. Measured on a 2-vCPU Intel
  // Xeon VM, float32 sum, interleaved with the slots (README, "The ring backend"): with 2 processes
  // ahead at every size from 64 KiB to 256 MiB (1.4x at 64 KiB, 2.4x at 1 MiB, 1.2-1.3x at 256
  // MiB); oversubscribed (4 processes on the 2 cores, or 2 under `taskset -c 0`), behind at 128 KiB
  // and below; from 256 KiB ahead by 1.2-1.6x where the buffers are 2 MiB pages, and with 4 processes
  // on 4 KiB pages level, but for 7-14% behind at 256 KiB in place and 4-7% at 1 MiB out of place
  // (2 under taskset ahead either way).
  if (single_copy == "on") o.single_copy_min_bytes = 0;
  if (single_copy == "auto") o.single_copy_min_bytes = oversubscribed ? size_t{256} << 10 : 0;
  o.single_copy_required = single_copy == "on";
  o.single_copy_measure = single_copy == "auto";
  o.global_ranks = members;
  // The secret is not sent anywhere: a digest of it (with the cluster) must match, so that a
  // process without it cannot join, as over TCP.
  std::string proof = "none";
  if (!secret.empty()) {
    const internal::Digest d = internal::hmac_sha256(secret, "shm:" + context.cluster_id);
    proof = internal::hex(d.data(), d.size());
  }
  // With auto's threshold, which every rank of this machine derives from the same layout (its
  // ranks and their CPUs): a rank that still differs (another tributary, say) fails setup naming
  // it, instead of every all-reduce of 16-256 KiB.
  o.layout = layout_text(context, options) + ",cluster=" + context.cluster_id + ",secret=" + proof +
             ",single_copy_from=" +
             (o.single_copy_min_bytes == SIZE_MAX ? std::string("never")
                                                  : std::to_string(o.single_copy_min_bytes)) +
             (o.single_copy_measure ? ",measured" : "");
  const int local =
      static_cast<int>(std::find(members.begin(), members.end(), context.rank) - members.begin());
  TRIBUTARY_ASSIGN_OR_RETURN(auto group, transports::shm::ShmGroup::create(
                                             store, local, static_cast<int>(members.size()), o));
  return std::unique_ptr<algorithms::ProcessGroup>(std::move(group));
}

// The composition for this layout (see the `hierarchy` option): shared memory (or TCP with
// intra_host=net) inside each host and TCP across hosts among the processes of the same local rank
// (host_layout.h); else one flat group, shared memory when every rank is on this host.
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> make_group(const std::shared_ptr<Store>& store,
                                                               const BackendContext& context,
                                                               const Options& options,
                                                               const HostLayout& hosts) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      const bool hierarchical,
      algorithms::use_hierarchy("ring", options.get_string("hierarchy"), hosts));
  const bool shm = options.get_string("intra_host") == "shm";
  // Whether waits may poll: by the ranks on this machine and the CPUs they may use (network
  // namespaces of one machine share its cores, whatever each one's LOCAL_WORLD_SIZE says).
  const internal::MachineShare machine = hosts.machine_of(context.rank);
  auto tcp = [&](Store& scope, int index, const std::vector<int>& members) {
    return tcp_group(scope, index, static_cast<int>(members.size()), context, options,
                     algorithms::ring_slice_bytes(options.get_size("slice_bytes"), hosts, members),
                     machine, hosts.same_kernel_as(context.rank, members));
  };
  if (hierarchical) {
    auto local = [&](Store& scope, int index, const std::vector<int>& members) {
      return shm ? shm_group(scope, context, options, members, machine)
                 : tcp(scope, index, members);
    };
    return algorithms::hierarchical_group(store, context, hosts, local, tcp);
  }
  if (shm && hosts.hosts() == 1) {
    return shm_group(*store, context, options, hosts.members[0], machine);
  }
  std::vector<int> everyone(static_cast<size_t>(context.world_size));
  std::iota(everyone.begin(), everyone.end(), 0);
  return tcp(*store, context.rank, everyone);
}

}  // namespace

Status register_ring(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "ring";
  info.summary =
      "across processes and hosts: shared memory inside a host, TCP (Boost.Asio) between "
      "hosts, hierarchical with several processes on each; ring and halving-doubling "
      "all-reduce, tree broadcast, ring all-gather and reduce-scatter";
  info.options = algorithms::transport_group_options();
  info.options.insert(
      info.options.end(),
      {
          {.name = "sockets_per_peer",
           .type = OptionType::kInt,
           .default_value = "1",
           .help = "TCP connections to each peer; messages of 64 KiB or more are striped across "
                   "them, which helps where one TCP stream cannot fill the link (long fat pipes, "
                   "per-flow limits, bonded NICs); every process must use the same value",
           .min = 1,
           .max = 16},
          {.name = "intra_host",
           .type = OptionType::kEnum,
           .default_value = "shm",
           .help =
               "how processes on the same host exchange data: shm (shared memory; hosts are told "
               "apart by hostname, boot id and namespaces, or by TRIBUTARY_HOST_ID) or net (TCP "
               "like every other peer, for comparison); every process must use the same",
           .choices = {"shm", "net"}},
          algorithms::hierarchy_option(
              "one flat group: shared memory on one host, else TCP between every pair"),
          {.name = "shm_chunk_bytes",
           .type = OptionType::kSize,
           .default_value = "0",
           .help = "shared memory: collectives move through each process's slots in chunks of this "
                   "size, and single copy reads and writes blocks of this size; 0 = auto "
                   "(512KiB slots, 256KiB blocks)",
           .min = 0},
          {.name = "shm_single_copy",
           .type = OptionType::kEnum,
           .default_value = "auto",
           .help =
               "shared memory: all-reduces read each peer's share of the input straight "
               "from its process and write the results straight into its output "
               "(process_vm_readv/writev, as Open MPI's vader and UCX's cma do) instead of "
               "going through the slots, so that each byte crosses between processes once "
               "instead of twice: auto for every all-reduce over 16KiB (from 256KiB with more "
               "processes than the CPUs they may run on) where every process may reach its peers' "
               "memory (same user, and Yama's ptrace_scope 0 or CAP_SYS_PTRACE; else the slots), "
               "but only from twice the last-level cache (16MiB-1GiB) where some process timed "
               "the kernel's copies between processes at over 3x memcpy's time at setup; on for "
               "every all-reduce over 16KiB (setup fails where it is refused), off never; every "
               "process must use the same",
           .choices = {"auto", "on", "off"}},
          {.name = "authenticate_frames",
           .type = OptionType::kBool,
           .default_value = "true",
           .help = "with a shared secret, put a MAC (GMAC, keyed per connection from the secret) "
                   "on every TCP frame and check it before data is used; false authenticates only "
                   "the handshake, which is faster but lets a relay on the path change data; "
                   "every process must use the same value"},
          {.name = "zero_copy",
           .type = OptionType::kEnum,
           .default_value = "auto",
           .help = "TCP: send the ring's segments of 64 KiB or more from the caller's memory "
                   "without copying them into the kernel (vmsplice and splice; the receivers "
                   "confirm at the end of each collective), where frames are not authenticated: "
                   "auto for messages of 2 MiB or more (below, the confirmation's round trip "
                   "costs more than the copy saves), on for every message, off never",
           .choices = {"auto", "on", "off"}},
          {.name = "host",
           .type = OptionType::kString,
           .default_value = "",
           .help = "address this process listens on and publishes (default: the interface that "
                   "reaches the coordinator)"},
          {.name = "tcp_congestion",
           .type = OptionType::kString,
           .default_value = "auto",
           .help = "TCP congestion control of the data connections: auto (a connection that "
                   "stays in this machine's kernel, between two addresses of this host or to a "
                   "process with the same kernel boot id, such as another container or network "
                   "namespace, and that would use bbr uses reno instead: BBR paces it to its "
                   "estimate of the path, which held 2 processes at half speed on loopback and "
                   "at a third across namespaces; every other connection keeps the system's "
                   "choice) or an "
                   "algorithm's name (reno, cubic, bbr, ...: one of "
                   "/proc/sys/net/ipv4/tcp_allowed_congestion_control without CAP_NET_ADMIN)"},
      });
  const Capabilities caps = algorithms::process_group_capabilities();
  info.capabilities = caps;
  info.auto_priority = 8;  // below the in-process backends, which "auto" prefers for one process
  info.check_options = [](const Options& options) -> Status {
    TRIBUTARY_RETURN_IF_ERROR(algorithms::check_transport_group_options("ring", options));
    TRIBUTARY_RETURN_IF_ERROR(
        internal::check_listen_address(options.get_string("host"), "backend 'ring'"));
    if (const std::string why =
            transports::check_congestion_control(options.get_string("tcp_congestion"));
        !why.empty()) {
      return invalid_argument("backend 'ring': tcp_congestion=" +
                              options.get_string("tcp_congestion") + ": " + why);
    }
    if (const uint64_t c = options.get_size("shm_chunk_bytes"); c != 0 && c < 4096) {
      return invalid_argument(
          "backend 'ring': shm_chunk_bytes must be 0 (auto) or at least 4KiB, "
          "not " +
          options.find("shm_chunk_bytes")->text);
    }
    return Status();
  };
  info.create = [caps](const BackendContext& context,
                       Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    std::unique_ptr<algorithms::ProcessGroup> group;
    std::shared_ptr<Store> scope;
    if (context.world_size > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto store, internal::instance_store(context, "ring"));
      scope = store;
      const std::string intra_host = options.get_string("intra_host");
      TRIBUTARY_ASSIGN_OR_RETURN(
          HostLayout hosts,
          algorithms::learn_hosts(
              *store, context, "ring",
              "intra_host=" + intra_host + ",hierarchy=" + options.get_string("hierarchy"),
              options.get_duration("timeout")));
      TRIBUTARY_ASSIGN_OR_RETURN(group, make_group(store, context, options, hosts));
    }
    const uint64_t bytes_per_pack = options.get_size("bytes_per_pack");
    std::unique_ptr<CrossDeviceOps> ops = std::make_unique<algorithms::ProcessGroupOps>(
        "ring", context, std::move(options), caps, std::move(group), bytes_per_pack);
    internal::attach_progress_store(*ops, std::move(scope));
    return ops;
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
