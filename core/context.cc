// make_backend_context: from a cluster spec to a context with a rendezvous store.
#include <fcntl.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>

#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/store/store_common.h"
#include "tributary/cluster.h"
#include "tributary/options.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

// The descriptor TRIBUTARY_STORE_FD names (tools/launcher.h: the socket tributary-run bound on
// MASTER_PORT and handed to rank 0), from `config`, else from the environment; -1 when unset or not
// a number.
int store_fd_variable(const Config& config) {
  std::optional<std::string> text = config.get("TRIBUTARY_STORE_FD");
  if (!text) {
    const char* env = std::getenv("TRIBUTARY_STORE_FD");
    if (env == nullptr) return -1;
    text = env;
  }
  int fd = -1;
  const char* end = text->data() + text->size();
  if (std::from_chars(text->data(), end, fd).ptr != end || fd < 0) return -1;
  return fd;
}

// The socket to serve the store on: the one `config`'s TRIBUTARY_STORE_FD names when it is a TCP
// socket listening on the coordinator's `port` that is still inheritable (close-on-exec clear: as
// the launcher passed it; the server sets the flag when it takes a socket, so no live server's is
// taken twice); else -1, and the port is bound as usual (a process that inherited the variable
// without the socket, or with another descriptor under that number). A listener it names and does
// not take is made close-on-exec, so that the processes this one starts do not hold its port.
int inherited_store_socket(const Config& config, int port) {
  const std::optional<std::string> text = config.get("TRIBUTARY_STORE_FD");
  if (!text) return -1;
  const internal::Logger log(internal::log_level_from(config), "rank 0/store");
  const int fd = store_fd_variable(config);
  if (fd < 0) {
    log.log(internal::LogLevel::kWarning,
            "TRIBUTARY_STORE_FD=\"{}\" is not a descriptor number; binding the store's port "
            "instead",
            *text);
    return -1;
  }
  const int bound = internal::listening_tcp_port(fd);
  if (bound < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFD);
  if (bound != port || flags < 0 || (flags & FD_CLOEXEC) != 0) {
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    return -1;
  }
  log.log(internal::LogLevel::kInfo,
          "serving the rendezvous store on the socket the launcher bound (descriptor {}, port {})",
          fd, port);
  return fd;
}

// Why a chief's store could not listen on `port`, for its error: this process itself may hold the
// port, in the socket tributary-run handed down.
std::string store_port_trouble(const Config& config, int port) {
  const int fd = store_fd_variable(config);
  if (fd >= 0 && internal::listening_tcp_port(fd) == port) {
    return " (this process holds the port itself: tributary-run handed rank 0 a socket listening "
           "on it, TRIBUTARY_STORE_FD=" +
           std::to_string(fd) +
           ", which this context did not take; give it a Config that has TRIBUTARY_STORE_FD "
           "(Config::from_environment()), create one rank-0 context at a time, or start the "
           "job with tributary-run --release-master-port)";
  }
  return " (is another job using it? set MASTER_PORT)";
}

}  // namespace

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
    if (std::optional<std::string> text = config.get("TRIBUTARY_TIMEOUT")) {
      auto d = parse_duration(*text);
      if (!d.ok() || d->count() <= 0) {
        return invalid_argument("TRIBUTARY_TIMEOUT='" + *text +
                                "' is not a positive duration (e.g. 30s, 5m)");
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
    server_options.listen_fd = inherited_store_socket(ctx.config, cluster.coordinator_port);
    auto server = TcpStore::create_server(
        "0.0.0.0", static_cast<uint16_t>(cluster.coordinator_port), server_options);
    if (!server.ok()) {
      return server.status().with_context(
          "the chief could not start the rendezvous store on port " +
          std::to_string(cluster.coordinator_port) +
          store_port_trouble(ctx.config, cluster.coordinator_port));
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
  return ctx;
}

}  // namespace tributary
