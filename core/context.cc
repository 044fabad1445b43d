// make_backend_context: from a cluster spec to a context with a rendezvous store.
#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/rendezvous.h"
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

// The job connections of this process's live contexts, so that a second context for the same job
// and rank shares the first one's store (and, on the chief, its server) instead of starting another
// server on the coordinator port, which the first still holds. Weak: a connection ends with the
// last context (or backend) that holds it, and the next context then connects afresh.
struct JobLink {
  std::string key;  // coordinator, world size, rank and the secret's hash
  std::weak_ptr<void> server;
  bool has_server = false;
  std::weak_ptr<Store> store;
  std::weak_ptr<uint64_t> instances;
  std::weak_ptr<uint64_t> setups;
  std::string lost_key;
};
std::mutex job_links_mu;
std::vector<JobLink>& job_links() {
  static auto* links = new std::vector<JobLink>();  // never destroyed: used from exit handlers
  return *links;
}

// Fills in `ctx`'s connection from a live one with `key`; false when there is none.
bool join_live_link(const std::string& key, BackendContext& ctx) {
  std::lock_guard lock(job_links_mu);
  std::vector<JobLink>& links = job_links();
  std::erase_if(links, [](const JobLink& l) { return l.store.expired(); });
  for (const JobLink& l : links) {
    if (l.key != key) continue;
    std::shared_ptr<Store> store = l.store.lock();
    std::shared_ptr<void> server = l.server.lock();
    std::shared_ptr<uint64_t> instances = l.instances.lock();
    std::shared_ptr<uint64_t> setups = l.setups.lock();
    if (!store || !instances || !setups || (l.has_server && !server)) return false;
    ctx.keep_alive = std::move(server);
    ctx.store = std::move(store);
    ctx.instances = std::move(instances);
    ctx.setups = std::move(setups);
    ctx.lost_key = l.lost_key;
    return true;
  }
  return false;
}

void remember_link(const std::string& key, const BackendContext& ctx) {
  std::lock_guard lock(job_links_mu);
  job_links().push_back(JobLink{key, ctx.keep_alive, ctx.keep_alive != nullptr, ctx.store,
                                ctx.instances, ctx.setups, ctx.lost_key});
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
  const std::string link_key = ctx.cluster_id + "#" + std::to_string(cluster.rank) + "#" +
                               std::to_string(std::hash<std::string>{}(options.secret));
  if (join_live_link(link_key, ctx)) return ctx;
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
  remember_link(link_key, ctx);
  return ctx;
}

}  // namespace tributary
