#include <cstdlib>
#include <fstream>
#include <thread>
#include <memory>
#include <sstream>

#include "backends/ring/ring_ops.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

// The secret_file option, else TRIBUTARY_SECRET, else the file TRIBUTARY_SECRET_FILE names
// (explicit option > environment); "" = no authentication.
StatusOr<std::string> read_secret(const Config& config, const std::string& secret_file) {
  std::string path = secret_file;
  if (path.empty()) {
    if (auto s = config.get("TRIBUTARY_SECRET"); s && !s->empty()) return *s;
    path = config.get("TRIBUTARY_SECRET_FILE").value_or("");
  }
  if (path.empty()) return std::string();
  std::ifstream in(path);
  if (!in) return not_found("cannot read the secret file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string secret = ss.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return invalid_argument("the secret file '" + path + "' is empty");
  return secret;
}

// Ranks on this host: the launcher's LOCAL_WORLD_SIZE, else all of them when the coordinator is
// this host's loopback, else one.
int local_ranks(const BackendContext& context) {
  for (const char* key : {"TRIBUTARY_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (auto v = context.config.get(key)) {
      int n = std::atoi(v->c_str());
      if (n > 0) return n;
    }
  }
  const std::string& h = context.coordinator_host;
  return h == "localhost" || h.rfind("127.", 0) == 0 ? context.world_size : 1;
}

std::chrono::nanoseconds poll_duration(const std::string& mode, const BackendContext& context) {
  const auto on = std::chrono::microseconds(50);
  if (mode == "on") return on;
  if (mode == "off") return std::chrono::nanoseconds(0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return local_ranks(context) <= cores ? std::chrono::nanoseconds(on) : std::chrono::nanoseconds(0);
}

}  // namespace

Status register_ring(BackendRegistry& registry) {
  BackendInfo info;
  info.name = "ring";
  info.summary = "across processes and hosts over TCP (Boost.Asio): ring and halving-doubling "
                 "all-reduce, tree broadcast, ring all-gather and reduce-scatter";
  info.options = {
      {.name = "algorithm",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "all-reduce algorithm: auto (the cost model picks by size and world), ring "
               "(bandwidth-optimal), halving_doubling (latency-optimal)",
       .choices = {"auto", "ring", "halving_doubling"}},
      {.name = "segment_bytes",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "ring steps move their chunk in segments of this size, so that receiving the next "
               "segment overlaps reducing this one; 0 = auto (a quarter of the chunk, 256KiB to "
               "1MiB)",
       .min = 0},
      {.name = "bytes_per_pack",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "batch_reduce packs tensors into groups of at least this many bytes (TF's rule); "
               "0 = one pack per dtype"},
      {.name = "poll",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "whether a wait polls 50 us before sleeping: on (lowest latency), off, or auto (on "
               "unless this host runs more ranks than it has cores, where polling steals the CPU "
               "from the peers)",
       .choices = {"auto", "on", "off"}},
      {.name = "sockets_per_peer",
       .type = OptionType::kInt,
       .default_value = "1",
       .help = "TCP connections to each peer; messages of 64 KiB or more are striped across "
               "them, which helps where one TCP stream cannot fill the link (long fat pipes, "
               "per-flow limits, bonded NICs); every process must use the same value",
       .min = 1,
       .max = 16},
      {.name = "host",
       .type = OptionType::kString,
       .default_value = "",
       .help = "address this process listens on and publishes (default: the interface that "
               "reaches the coordinator)"},
      {.name = "secret_file",
       .type = OptionType::kString,
       .default_value = "",
       .help = "file holding the shared secret peers must prove (else TRIBUTARY_SECRET, then "
               "the file TRIBUTARY_SECRET_FILE names; none = no authentication)"},
  };
  Capabilities caps;
  caps.device_types = {DeviceType::kCpu};
  caps.dtypes.assign(all_dtypes().begin(), all_dtypes().end());
  caps.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  caps.collectives.assign(all_collectives().begin(), all_collectives().end());
  caps.multi_process = true;
  info.capabilities = caps;
  info.auto_priority = 8;  // below the in-process backends, which "auto" prefers for one process
  info.create = [caps](const BackendContext& context, Options options)
      -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    if (const uint64_t seg = options.get_size("segment_bytes"); seg != 0 && seg < 4096) {
      return invalid_argument("backend 'ring': segment_bytes must be 0 (auto) or at least 4KiB, not " +
                              options.find("segment_bytes")->text);
    }
    std::unique_ptr<algorithms::Transport> transport;
    if (context.world_size > 1) {
      if (!context.store) {
        return failed_precondition(
            "backend 'ring' across " + std::to_string(context.world_size) +
            " processes needs a rendezvous store; create the context with "
            "make_backend_context() (it reads TF_CONFIG, RANK/WORLD_SIZE/MASTER_ADDR, Slurm...)");
      }
      TRIBUTARY_ASSIGN_OR_RETURN(std::string secret,
                                 read_secret(context.config, options.get_string("secret_file")));
      backends::TcpTransportOptions t;
      t.host = options.get_string("host");
      t.coordinator = context.coordinator_host;
      t.secret = std::move(secret);
      t.cluster_id = context.cluster_id;
      t.layout = "local_replicas=" + std::to_string(context.devices.size()) +
                 ",algorithm=" + options.get_string("algorithm") +
                 ",segment_bytes=" + options.find("segment_bytes")->text +
                 ",bytes_per_pack=" + options.find("bytes_per_pack")->text +
                 ",sockets_per_peer=" + options.find("sockets_per_peer")->text;
      t.timeout = options.get_duration("timeout");
      t.poll_before_sleep = poll_duration(options.get_string("poll"), context);
      t.sockets_per_peer = static_cast<int>(options.get_int("sockets_per_peer"));
      const uint64_t instance = (*context.instances)++;
      PrefixStore store("ring/" + std::to_string(instance), context.store);
      auto made = backends::TcpTransport::create(store, context.rank, context.world_size, t);
      if (!made.ok()) return made.status();
      transport = std::move(made).value();
    } else {
      auto made = backends::TcpTransport::create(*std::make_shared<MemoryStore>(), 0, 1, {});
      if (!made.ok()) return made.status();
      transport = std::move(made).value();
    }
    return std::unique_ptr<CrossDeviceOps>(std::make_unique<backends::RingOps>(
        context, std::move(options), caps, std::move(transport)));
  };
  return registry.add(std::move(info));
}

}  // namespace tributary
