#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/hierarchical_group.h"
#include "algorithms/process_group_ops.h"
#include "core/crypto/crypto.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "transports/shm/shm_group.h"
#include "transports/tcp/tcp_transport.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

using algorithms::parse_algorithm;

// Where every rank runs: the host ids exchanged through the store, with every rank's intra_host
// choice (which must agree: a rank on shared memory and its neighbour on TCP would never meet).
struct HostLayout {
  std::vector<int> host_of;               // host index (order of first appearance) per rank
  std::vector<std::vector<int>> members;  // ranks per host, ascending
  int hosts() const { return static_cast<int>(members.size()); }
};

StatusOr<HostLayout> learn_hosts(Store& store, const BackendContext& context,
                                 const std::string& intra_host, std::chrono::nanoseconds timeout) {
  const std::string mine = intra_host + "|" + internal::host_id(context.config);
  TRIBUTARY_RETURN_IF_ERROR(store.set("host/" + std::to_string(context.rank), mine));
  HostLayout layout;
  std::vector<std::string> ids;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < context.world_size; ++r) {
    const auto left = std::chrono::duration_cast<Store::Duration>(std::max(
        std::chrono::steady_clock::duration::zero(), deadline - std::chrono::steady_clock::now()));
    auto got = store.get("host/" + std::to_string(r), left);
    if (!got.ok()) {
      return got.status().with_context("backend 'ring' (rank " + std::to_string(context.rank) +
                                        "): rank " + std::to_string(r) +
                                        " did not join (is it running, with the same secret?)");
    }
    std::string theirs = std::move(got).value();
    const std::string choice = theirs.substr(0, theirs.find('|'));
    if (choice != intra_host) {
      return invalid_argument("backend 'ring': rank " + std::to_string(r) + " uses " + choice +
                              " but rank " + std::to_string(context.rank) + " " + intra_host +
                              "; every process must use the same intra_host and hierarchy");
    }
    auto it = std::find(ids.begin(), ids.end(), theirs);
    if (it == ids.end()) {
      ids.push_back(theirs);
      layout.members.emplace_back();
      it = ids.end() - 1;
    }
    const int h = static_cast<int>(it - ids.begin());
    layout.host_of.push_back(h);
    layout.members[static_cast<size_t>(h)].push_back(r);
  }
  return layout;
}

// What every rank must agree on, as text (checked by the transports' handshakes).
std::string layout_text(const BackendContext& context, const Options& options) {
  return algorithms::transport_group_layout(context, options) +
         ",sockets_per_peer=" + options.find("sockets_per_peer")->text +
         ",shm_chunk_bytes=" + options.find("shm_chunk_bytes")->text +
         ",hierarchy=" + options.get_string("hierarchy") +
         ",authenticate_frames=" + options.find("authenticate_frames")->text;
}

// Ranks `rank` of `size` over TCP, meeting under `store` (the whole world, or a subgroup under its
// own prefix).
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> tcp_group(Store& store, int rank, int size,
                                                              const BackendContext& context,
                                                              const Options& options) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::string secret, internal::read_secret(context.config, options.get_string("secret_file")));
  transports::TcpTransportOptions t;
  t.host = options.get_string("host");
  t.coordinator = context.coordinator_host;
  t.secret = std::move(secret);
  t.cluster_id = context.cluster_id;
  t.layout = layout_text(context, options);
  t.timeout = options.get_duration("timeout");
  t.poll_before_sleep = internal::poll_duration(options.get_string("poll"), context);
  t.yield_before_sleep = internal::yield_duration(options.get_string("poll"), context);
  t.sockets_per_peer = static_cast<int>(options.get_int("sockets_per_peer"));
  t.authenticate_frames = options.get_bool("authenticate_frames");
  TRIBUTARY_ASSIGN_OR_RETURN(auto transport, transports::TcpTransport::create(store, rank, size, t));
  return std::unique_ptr<algorithms::ProcessGroup>(std::make_unique<algorithms::TransportGroup>(
      std::move(transport), parse_algorithm(options.get_string("algorithm")),
      options.get_size("segment_bytes"), "tcp"));
}

// Every rank on this host, through shared memory.
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> shm_group(Store& store,
                                                              const BackendContext& context,
                                                              const Options& options,
                                                              const std::vector<int>& members) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::string secret, internal::read_secret(context.config, options.get_string("secret_file")));
  transports::shm::ShmGroupOptions o;
  const uint64_t chunk = options.get_size("shm_chunk_bytes");
  if (chunk != 0) o.slot_bytes = chunk;
  o.timeout = options.get_duration("timeout");
  const std::string poll = options.get_string("poll");
  const auto cores = static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  const bool oversubscribed = members.size() > cores;
  o.spin = poll == "off" || (poll == "auto" && oversubscribed)
               ? std::chrono::nanoseconds(0)
               : std::chrono::nanoseconds(std::chrono::microseconds(50));
  // More ranks than cores: no busy polling, but yield the core for up to a millisecond before
  // sleeping; the rank being waited for usually runs within that, and a futex wake-up would cost
  // tens of microseconds per step (4 ranks on 2 cores, 4 KiB: 62 us with futexes, 13 us so).
  if (poll == "auto" && oversubscribed) o.yield = std::chrono::milliseconds(1);
  o.global_ranks = members;
  // The secret is not sent anywhere: a digest of it (with the cluster) must match, so that a
  // process without it cannot join, as over TCP.
  std::string proof = "none";
  if (!secret.empty()) {
    const internal::Digest d = internal::hmac_sha256(secret, "shm:" + context.cluster_id);
    proof = internal::hex(d.data(), d.size());
  }
  o.layout = layout_text(context, options) + ",cluster=" + context.cluster_id + ",secret=" + proof;
  const int local =
      static_cast<int>(std::find(members.begin(), members.end(), context.rank) - members.begin());
  TRIBUTARY_ASSIGN_OR_RETURN(auto group, transports::shm::ShmGroup::create(
                                             store, local, static_cast<int>(members.size()), o));
  return std::unique_ptr<algorithms::ProcessGroup>(std::move(group));
}

// Several hosts with several processes each: shared memory (or TCP with intra_host=net) inside
// each host, TCP across hosts among the processes of the same local rank (hierarchical_group.h).
// Every subgroup meets under its own prefix of the instance's store.
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> hierarchical_group(
    const std::shared_ptr<Store>& store, const BackendContext& context, const Options& options,
    const HostLayout& hosts) {
  const int h = hosts.host_of[static_cast<size_t>(context.rank)];
  const std::vector<int>& mine = hosts.members[static_cast<size_t>(h)];
  const int l = static_cast<int>(std::find(mine.begin(), mine.end(), context.rank) - mine.begin());
  const int per_host = static_cast<int>(mine.size());
  std::unique_ptr<algorithms::ProcessGroup> local, cross;
  if (per_host > 1) {
    PrefixStore scope("host" + std::to_string(h) + "/", store);
    if (options.get_string("intra_host") == "shm") {
      TRIBUTARY_ASSIGN_OR_RETURN(local, shm_group(scope, context, options, mine));
    } else {
      TRIBUTARY_ASSIGN_OR_RETURN(local, tcp_group(scope, l, per_host, context, options));
    }
  }
  if (hosts.hosts() > 1) {
    PrefixStore scope("cross" + std::to_string(l) + "/", store);
    TRIBUTARY_ASSIGN_OR_RETURN(cross, tcp_group(scope, h, hosts.hosts(), context, options));
  }
  return std::unique_ptr<algorithms::ProcessGroup>(std::make_unique<algorithms::HierarchicalGroup>(
      context.rank, hosts.members, std::move(local), std::move(cross)));
}

// The composition for this layout: see the `hierarchy` option.
StatusOr<std::unique_ptr<algorithms::ProcessGroup>> make_group(const std::shared_ptr<Store>& store,
                                                               const BackendContext& context,
                                                               const Options& options,
                                                               const HostLayout& hosts) {
  const std::string hierarchy = options.get_string("hierarchy");
  const size_t per_host = hosts.members[0].size();
  bool uniform = true;
  for (const auto& m : hosts.members) uniform = uniform && m.size() == per_host;
  if (hierarchy == "on" && !uniform) {
    std::string counts;
    for (const auto& m : hosts.members)
      counts += (counts.empty() ? "" : ", ") + std::to_string(m.size());
    return invalid_argument(
        "backend 'ring': hierarchy=on needs the same number of processes on "
        "every host, but the hosts run " +
        counts + "; use hierarchy=auto (flat TCP for such layouts)");
  }
  const bool hierarchical =
      hierarchy == "on" || (hierarchy == "auto" && uniform && hosts.hosts() > 1 && per_host > 1);
  if (hierarchical) return hierarchical_group(store, context, options, hosts);
  if (options.get_string("intra_host") == "shm" && hosts.hosts() == 1) {
    return shm_group(*store, context, options, hosts.members[0]);
  }
  return tcp_group(*store, context.rank, context.world_size, context, options);
}

}  // namespace

Status register_ring(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "ring";
  info.summary =
      "across processes and hosts over TCP (Boost.Asio): ring and halving-doubling "
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
          {.name = "hierarchy",
           .type = OptionType::kEnum,
           .default_value = "auto",
           .help =
               "hierarchical all-reduce (reduce-scatter inside each host, all-reduce across hosts "
               "among the processes of the same local rank, all-gather inside each host): auto "
               "(when there are several hosts with the same number of processes each, more than "
               "one), on (always; hosts must run the same number of processes), off (one flat "
               "group: shared memory on one host, else TCP between every pair)",
           .choices = {"auto", "on", "off"}},
          {.name = "shm_chunk_bytes",
           .type = OptionType::kSize,
           .default_value = "0",
           .help = "shared memory: collectives move through each process's slots in chunks of this "
                   "size; 0 = auto (512KiB)",
           .min = 0},
          {.name = "authenticate_frames",
           .type = OptionType::kBool,
           .default_value = "true",
           .help = "with a shared secret, put a MAC (GMAC, keyed per connection from the secret) "
                   "on every TCP frame and check it before data is used; false authenticates only "
                   "the handshake, which is faster but lets a relay on the path change data; "
                   "every process must use the same value"},
          {.name = "host",
           .type = OptionType::kString,
           .default_value = "",
           .help = "address this process listens on and publishes (default: the interface that "
                   "reaches the coordinator)"},
      });
  const Capabilities caps = algorithms::process_group_capabilities();
  info.capabilities = caps;
  info.auto_priority = 8;  // below the in-process backends, which "auto" prefers for one process
  info.create = [caps](const BackendContext& context,
                       Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    TRIBUTARY_RETURN_IF_ERROR(algorithms::check_transport_group_options("ring", options));
    TRIBUTARY_RETURN_IF_ERROR(
        internal::check_listen_address(options.get_string("host"), "backend 'ring'"));
    if (const uint64_t c = options.get_size("shm_chunk_bytes"); c != 0 && c < 4096) {
      return invalid_argument(
          "backend 'ring': shm_chunk_bytes must be 0 (auto) or at least 4KiB, "
          "not " +
          options.find("shm_chunk_bytes")->text);
    }
    std::unique_ptr<algorithms::ProcessGroup> group;
    std::shared_ptr<Store> scope;
    if (context.world_size > 1) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto store, internal::instance_store(context, "ring"));
      scope = store;
      const std::string intra_host = options.get_string("intra_host");
      TRIBUTARY_ASSIGN_OR_RETURN(
          HostLayout hosts,
          learn_hosts(*store, context,
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
