#include <net/if.h>

#include <exception>
#include <memory>
#include <string>

#include "algorithms/process_group.h"
#include "algorithms/process_group_ops.h"
#include "backends/gloo/gloo_group.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "transports/tcp/tcp_transport.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {

Status register_gloo(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "gloo";
  info.summary =
      "across processes and hosts with Gloo's own algorithms and TCP transport "
      "(ring, ring_chunked, halving_doubling, bcube all-reduce; rendezvous through "
      "the store)";
  std::vector<std::string> algorithms;
  for (std::string_view a : backends::gloo_algorithm_names()) algorithms.emplace_back(a);
  info.options = {
      {.name = "algorithm",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "all-reduce algorithm: auto (halving_doubling below auto_threshold, ring_chunked "
               "from there), ring (gloo/allreduce_ring.h: P-1 steps, whole buffer each), "
               "ring_chunked (2S bytes, double-buffered chunks), halving_doubling (2 lg P steps), "
               "bcube (base = smallest divisor of P), unbound_ring / unbound_bcube "
               "(gloo::allreduce, gloo/allreduce.h, on the caller's buffers; faster, but a peer "
               "that dies while its message arrives is seen only at the timeout)",
       .choices = algorithms},
      {.name = "auto_threshold",
       .type = OptionType::kSize,
       .default_value = "4MiB",
       .help = "with algorithm=auto, messages of fewer bytes use halving_doubling (fewest steps), "
               "larger ones ring_chunked (pipelined chunks)"},
      {.name = "reduce_scatter",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "reduce-scatter across processes: halving_doubling (Gloo's "
               "ReduceScatterHalvingDoubling), all_reduce (all-reduce, keep this process's "
               "slice), auto (= all_reduce). halving_doubling needs mode=sync or busy_poll: "
               "in async mode it returned misplaced elements here (2 processes x 2 replicas, "
               "odd counts)",
       .choices = {"auto", "halving_doubling", "all_reduce"}},
      {.name = "bytes_per_pack",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "batch_reduce packs tensors into groups of at least this many bytes (TF's rule); "
               "0 = one pack per dtype"},
      {.name = "cache_bytes",
       .type = OptionType::kSize,
       .default_value = "1GiB",
       .help = "memory for reusable Gloo algorithm instances (one per algorithm, dtype, op and "
               "count, each with its own buffer); least recently used ones are dropped beyond it"},
      {.name = "verify",
       .type = OptionType::kBool,
       .default_value = "true",
       .help = "exchange a fingerprint (sequence, collective, op, dtype, count) before each "
               "collective over the backend's control channel (tributary's TCP transport beside "
               "Gloo's mesh), so that ranks issuing different collectives fail at once with an "
               "error naming both; false saves that round trip (it is still made, from 1 MiB, "
               "where an all-reduce runs Gloo on the caller's buffer), but all-reduces of "
               "different sizes then reach Gloo unchecked, which stops the process below 1 MiB "
               "(broadcast and async all-gather check sizes on their own)"},
      {.name = "mode",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "how Gloo waits for data: async (its I/O thread reads and wakes the caller; every "
               "algorithm), sync (the calling thread reads its sockets: lower latency, classic "
               "algorithms only, all-gather through AllgatherRing), busy_poll (sync, spinning: "
               "lowest latency, a core busy while "
               "waiting), auto (= async). The sync modes can deadlock when messages exceed the "
               "socket buffers (both ranks blocked sending): use them for small messages only",
       .choices = {"auto", "async", "sync", "busy_poll"}},
      {.name = "host",
       .type = OptionType::kString,
       .default_value = "",
       .help = "IP address of this machine that Gloo listens on and publishes (default: the "
               "interface that reaches the coordinator, 127.0.0.1 without one)"},
      {.name = "iface",
       .type = OptionType::kString,
       .default_value = "",
       .help = "network interface Gloo listens on (e.g. eth0); overrides host"},
      internal::secret_file_option(),
      {.name = "allow_unauthenticated",
       .type = OptionType::kBool,
       .default_value = "false",
       .help = "with a shared secret set, run anyway: Gloo's TCP transport cannot authenticate "
               "its connections or data, so without this the backend refuses (ring and ucx "
               "authenticate). Ranks still prove they hold the same secret"},
      {.name = "bcube_base",
       .type = OptionType::kInt,
       .default_value = "0",
       .help = "peers per bcube step, 2 or more; must divide the number of processes (0: the "
               "smallest divisor >= 2)",
       .min = 0},
  };
  Capabilities caps;
  caps.device_types = {DeviceType::kCpu};
  caps.dtypes = backends::gloo_dtypes();  // no bfloat16: Gloo has no such type
  caps.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  caps.collectives.assign(all_collectives().begin(), all_collectives().end());
  caps.multi_process = true;
  info.capabilities = caps;
  info.auto_priority = 6;  // below ring (8): "auto" prefers our own TCP backend
  info.check_options = [](const Options& options) -> Status {
    // Gloo's TCP device resolves a name itself and crashed (SIGSEGV in CreateDeviceAttr) on one
    // that does not resolve; the control channel takes addresses only. So: an address, checked.
    TRIBUTARY_RETURN_IF_ERROR(
        internal::check_listen_address(options.get_string("host"), "backend 'gloo'"));
    // An interface this machine lacks: said here, on this rank, rather than as Gloo's failure to
    // make its device after the others have met (then read as the store's host gone).
    if (const std::string& iface = options.get_string("iface");
        !iface.empty() && ::if_nametoindex(iface.c_str()) == 0) {
      return invalid_argument("backend 'gloo': iface '" + internal::excerpt(iface, 40) +
                              "' is not a network interface of this machine (`ip link` lists "
                              "them); name one, or set host= to one of its addresses");
    }
    // Gloo's BCube with one peer per step never reaches the other processes (it failed in the
    // first collective with "cannot create std::vector larger than max_size()").
    if (options.get_int("bcube_base") == 1) {
      return invalid_argument(
          "backend 'gloo': bcube_base=1 is not a BCube (each step must exchange with at least "
          "one peer); use 0 (the smallest divisor of the number of processes >= 2) or a divisor "
          ">= 2");
    }
    const std::string& algorithm = options.get_string("algorithm");
    const std::string mode = backends::resolve_gloo_mode(options.get_string("mode"), algorithm);
    if (options.get_string("reduce_scatter") == "halving_doubling" && mode == "async") {
      return invalid_argument(
          "backend 'gloo': reduce_scatter=halving_doubling needs mode=sync or mode=busy_poll "
          "(Gloo's ReduceScatterHalvingDoubling misplaced elements in async mode here); use "
          "reduce_scatter=all_reduce, or pick a sync mode for small messages");
    }
    if (mode != "async" && algorithm.rfind("unbound_", 0) == 0) {
      return invalid_argument("backend 'gloo': algorithm=" + algorithm +
                              " (gloo::allreduce) needs Gloo's I/O thread, which mode=" + mode +
                              " turns off; use mode=async, or a classic algorithm (ring, "
                              "ring_chunked, halving_doubling, bcube, auto)");
    }
    return Status();
  };
  info.create = [caps](const BackendContext& context,
                       Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    if (context.world_size < 1 || context.rank < 0 || context.rank >= context.world_size) {
      return invalid_argument("backend 'gloo': rank " + std::to_string(context.rank) +
                              " is not in a world of " + std::to_string(context.world_size) +
                              " process(es)");
    }
    const std::string& algorithm = options.get_string("algorithm");
    const std::string mode = backends::resolve_gloo_mode(options.get_string("mode"), algorithm);
    std::unique_ptr<algorithms::ProcessGroup> group;
    std::shared_ptr<Store> scope;
    if (context.world_size > 1) {
      backends::GlooConnectOptions c;
      c.host = options.get_string("host");
      c.iface = options.get_string("iface");
      c.coordinator = context.coordinator_host;
      c.timeout = std::chrono::ceil<std::chrono::milliseconds>(options.get_duration("timeout"));
      c.bcube_base = static_cast<int>(options.get_int("bcube_base"));
      c.sync = mode != "async";
      c.busy_poll = mode == "busy_poll";
      if (c.bcube_base > 0 && context.world_size % c.bcube_base != 0) {
        return invalid_argument("backend 'gloo': bcube_base=" + std::to_string(c.bcube_base) +
                                " does not divide the number of processes (" +
                                std::to_string(context.world_size) + ")");
      }
      TRIBUTARY_ASSIGN_OR_RETURN(c.secret,
                                 internal::read_secret(context.config,
                                                       options.get_string("secret_file")));
      c.allow_unauthenticated = options.get_bool("allow_unauthenticated");
      c.cluster_id = context.cluster_id;
      TRIBUTARY_ASSIGN_OR_RETURN(std::shared_ptr<Store> store,
                                 internal::instance_store(context, "gloo"));
      scope = store;
      auto made = backends::connect_gloo(context.rank, context.world_size, store, c);
      if (!made.ok()) return made.status();
      // The control channel (gloo_group.h): fingerprints only, over tributary's TCP transport.
      transports::TcpTransportOptions t;
      t.host = c.host;
      t.coordinator = context.coordinator_host;
      t.secret = c.secret;
      t.cluster_id = context.cluster_id;
      // What every process must agree on, compared when the channel connects: a process with
      // another algorithm, threshold, mode or verify setting fails every rank's setup naming the
      // difference. (Met in a collective instead, Gloo's sizes disagree on its I/O thread, where
      // its exception ends the process, or the ranks wait for messages that never come.)
      t.layout = "gloo-control,local_replicas=" + std::to_string(context.devices.size());
      for (const char* agreed : {"algorithm", "reduce_scatter", "auto_threshold", "bcube_base",
                                 "mode", "verify", "bytes_per_pack", "cache_bytes"}) {
        t.layout += std::string(",") + agreed + "=" + options.find(agreed)->text;
      }
      t.timeout = options.get_duration("timeout");
      // Sleeping at once: Gloo's I/O threads share the cores, and a wait that spins or yields
      // takes the core from them (4 processes on 2 cores, verify=true, 16 bytes: 0.4-1.0 ms a
      // collective so, 1.6-2.0 ms with the ring's oversubscribed polling).
      t.poll_before_sleep = std::chrono::nanoseconds(0);
      t.yield_before_sleep = std::chrono::nanoseconds(0);
      PrefixStore control_store("control/", store);
      auto transport =
          transports::TcpTransport::create(control_store, context.rank, context.world_size, t);
      if (!transport.ok()) {
        return transport.status().with_context("backend 'gloo': its control channel (TCP)");
      }
      auto control = std::make_unique<algorithms::TransportGroup>(
          std::move(transport).value(), algorithms::AllReduceAlgorithm::kRecursiveDoubling, 0, 0,
          "tcp (control)");
      backends::GlooGroupSettings g;
      g.algorithm = backends::parse_gloo_algorithm(algorithm);
      const std::string& rs = options.get_string("reduce_scatter");
      g.reduce_scatter = rs == "halving_doubling" ? backends::GlooReduceScatter::kHalvingDoubling
                         : rs == "all_reduce"     ? backends::GlooReduceScatter::kAllReduce
                                                  : backends::GlooReduceScatter::kAuto;
      g.auto_threshold = options.get_size("auto_threshold");
      g.cache_bytes = options.get_size("cache_bytes");
      g.verify = options.get_bool("verify");
      g.sync = mode != "async";
      g.local_replicas = static_cast<int>(context.devices.size());
      g.timeout = c.timeout;
      try {
        // Registers the all-gather's clear-to-send buffers with Gloo's pairs.
        group =
            std::make_unique<backends::GlooGroup>(std::move(made).value(), std::move(control), g);
      } catch (const std::exception& e) {
        return unavailable(std::string("gloo: setting up the group's buffers failed: ") + e.what());
      }
    }
    // Everything around Gloo (local replicas, packing, copies, failure) is ProcessGroupOps', as
    // for ring and ucx (gloo_group.h).
    const uint64_t bytes_per_pack = options.get_size("bytes_per_pack");
    std::unique_ptr<CrossDeviceOps> ops = std::make_unique<algorithms::ProcessGroupOps>(
        "gloo", context, std::move(options), caps, std::move(group), bytes_per_pack);
    internal::attach_progress_store(*ops, std::move(scope));
    return ops;
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
