// make_backend_context: from a cluster spec to a context with a rendezvous store.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/rendezvous.h"
#include "core/strings.h"
#include "tributary/cluster.h"
#include "tributary/options.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {

std::optional<std::chrono::milliseconds> spec_timeout(const std::vector<std::string>& specs) {
  std::optional<std::chrono::milliseconds> longest;
  for (const std::string& text : specs) {
    auto spec = BackendSpec::parse(text);
    if (!spec.ok()) continue;
    for (const auto& [key, value] : spec->options) {
      if (key != "timeout") continue;
      auto d = parse_duration(value);
      if (!d.ok() || d->count() <= 0) continue;
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*d);
      if (!longest || ms > *longest) longest = ms;
    }
  }
  return longest;
}

namespace {

// The job connections of this process's contexts, by job and rank, so that a second context for
// the same job shares the first one's store (and, on the chief, its server) instead of starting
// another server on the coordinator port, which the first still holds. The connection is weak: it
// ends with the last context (or backend, or Work) that holds it, and the next context connects
// afresh. (The numbering of backends and setups is kept in the store: internal::take_number.)
struct JobLink {
  std::mutex connecting;  // held while a context of this job connects: one connection, not two
  pid_t pid = 0;          // a fork()ed child's links are its parent's connections: not its own
  std::weak_ptr<void> server;
  bool has_server = false;
  std::weak_ptr<Store> store;
  std::string lost_key;
};
std::mutex job_links_mu;  // the map; each link's fields are guarded by its `connecting`

// The link for `key` (coordinator, world size, rank, secret), made on first use.
std::shared_ptr<JobLink> job_link(const std::string& key) {
  static auto* links = new std::map<std::string, std::shared_ptr<JobLink>>();  // never destroyed
  std::lock_guard lock(job_links_mu);
  std::shared_ptr<JobLink>& link = (*links)[key];
  if (!link || link->pid != ::getpid()) {
    link = std::make_shared<JobLink>();
    link->pid = ::getpid();
  }
  return link;
}

// Fills in `ctx`'s connection from `link` when it is alive; false when it is not. Under
// link.connecting.
bool join_live_link(JobLink& link, BackendContext& ctx) {
  std::shared_ptr<Store> store = link.store.lock();
  std::shared_ptr<void> server = link.server.lock();
  if (!store || (link.has_server && !server)) return false;
  ctx.keep_alive = std::move(server);
  ctx.store = std::move(store);
  ctx.lost_key = link.lost_key;
  return true;
}

}  // namespace

StatusOr<BackendContext> make_backend_context(std::vector<Device> devices, Config config,
                                              std::optional<std::chrono::milliseconds> timeout) {
  if (devices.empty()) return invalid_argument("make_backend_context: the device list is empty");
  if (!timeout) {
    if (std::optional<std::string> spec = config.get("TRIBUTARY_CROSS_DEVICE_OPS")) {
      timeout = spec_timeout({*spec});
    }
  }
  if (!timeout) {
    timeout = std::chrono::minutes(5);
    if (const Config::Entry* e = config.find("TRIBUTARY_TIMEOUT")) {
      const std::string* text = &e->value;
      auto d = parse_duration(*text);
      if (!d.ok() || d->count() <= 0) {
        // From a config file, the user set "timeout" there: say where.
        return invalid_argument("TRIBUTARY_TIMEOUT='" + *text + "' (" + e->source +
                                ") is not a positive duration (e.g. 30s, 5m)");
      }
      timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
    }
  }
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec cluster, resolve_cluster_spec(config));
  if (cluster.task_type == "ps") {
    return invalid_argument(
        "this process is task ps:" + std::to_string(cluster.task_index) +
        " of TF_CONFIG, and \"ps\" tasks take part in no collective: a parameter server serves "
        "variables for ParameterServerStrategy. Start it with tributary::run_server() "
        "(tributary/strategy/parameter_server.h), or give this process a \"worker\" task");
  }
  BackendContext ctx;
  ctx.devices = std::move(devices);
  ctx.config = std::move(config);
  ctx.rank = cluster.rank;
  ctx.world_size = cluster.world_size;
  if (cluster.world_size <= 1) return ctx;
  ctx.coordinator_host = cluster.coordinator_host;
  ctx.cluster_id = cluster.coordinator_address() + "/" + std::to_string(cluster.world_size);
  StoreOptions options;
  options.timeout = *timeout;
  options.connect_timeout = *timeout;
  // The job's secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE) guards the store too: without it
  // nobody can read or change the keys the ranks meet by.
  TRIBUTARY_ASSIGN_OR_RETURN(options.secret, internal::read_secret(ctx.config, ""));
  const std::shared_ptr<JobLink> link =
      job_link(ctx.cluster_id + "#" + std::to_string(cluster.rank) + "#" +
               std::to_string(std::hash<std::string>{}(options.secret)));
  std::lock_guard connecting(link->connecting);
  if (join_live_link(*link, ctx)) return ctx;
  if (cluster.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.secret = options.secret;
    server_options.max_connections =
        std::max<size_t>(1024, 16 * static_cast<size_t>(cluster.world_size));
    // A chief that fails before every rank has connected (a spec value only the world size
    // refuses, found by create()) keeps the store for the ranks still starting, so that they meet
    // the same error instead of an unreachable store after their whole timeout.
    server_options.expected_clients = static_cast<size_t>(cluster.world_size);
    server_options.linger_for_absent =
        std::min<std::chrono::milliseconds>(*timeout, std::chrono::seconds(5));
    server_options.listen_fd = internal::inherited_listener(ctx.config, cluster.coordinator_port);
    auto server = TcpStore::create_server(
        "0.0.0.0", static_cast<uint16_t>(cluster.coordinator_port), server_options);
    if (!server.ok()) {
      const std::string held =
          internal::held_port_trouble(ctx.config, cluster.coordinator_port,
                                      "start the job with tributary-run --release-master-port");
      return server.status().with_context(
          "the chief could not start the rendezvous store on port " +
          std::to_string(cluster.coordinator_port) +
          (held.empty() ? " (is another job using it? set MASTER_PORT)" : held));
    }
    ctx.keep_alive = std::shared_ptr<TcpStoreServer>(std::move(server).value());
  }
  auto client = TcpStore::connect(cluster.coordinator_host,
                                  static_cast<uint16_t>(cluster.coordinator_port), options);
  if (!client.ok()) {
    return client.status().with_context("rank " + std::to_string(cluster.rank) +
                                        " could not reach the rendezvous store (" +
                                        cluster.describe() + ")");
  }
  // Root cause to every rank: if this process dies, the store lists it, and the survivors' errors
  // name it (internal::name_lost_ranks). A store that cannot keep the will only loses that.
  if ((*client)
          ->set_last_will(internal::kLostRanksKey, internal::lost_rank_text(cluster.rank))
          .ok()) {
    ctx.lost_key = internal::kLostRanksKey;
  }
  ctx.store = std::shared_ptr<Store>(std::move(client).value());
  link->server = ctx.keep_alive;
  link->has_server = ctx.keep_alive != nullptr;
  link->store = ctx.store;
  link->lost_key = ctx.lost_key;
  return ctx;
}

Status internal::refuse_everywhere(const std::vector<Device>& devices, const Config& config,
                                   std::string_view spec, const Status& refused) {
  if (refused.ok() || devices.empty()) return refused;
  auto cluster = resolve_cluster_spec(config);
  if (!cluster.ok() || cluster->world_size <= 1 || cluster->task_type == "ps") return refused;
  std::string text(spec);
  if (text.empty()) text = config.get("TRIBUTARY_CROSS_DEVICE_OPS").value_or("auto");
  auto parsed = BackendSpec::parse(text);
  const std::string name = parsed.ok() ? parsed->name : internal::excerpt(text, 40);
  // Long enough for a chief that is still loading its model; not so long that a late rank of a
  // job whose chief already left (the same refusal everywhere) waits for long to say its own.
  auto context = make_backend_context(devices, config, std::chrono::seconds(15));
  if (context.ok()) (void)internal::announce_setup_failure(*context, name, refused);
  return refused;
}

}  // namespace tributary
