#include "core/rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "core/cpus.h"
#include "core/kernel_id.h"
#include "core/logging.h"
#include "core/store/store_common.h"
#include "core/store/tcp_store_protocol.h"
#include "core/strings.h"

namespace tributary::internal {
namespace {

std::string link_text(const char* path) {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool is_loopback_name(const std::string& h) {
  return h.empty() || h == "localhost" || h.rfind("127.", 0) == 0 || h == "::1" || h == "[::1]";
}

std::string address_text(const sockaddr* a) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      a->sa_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr);
  return inet_ntop(a->sa_family, raw, text, sizeof text) ? std::string(text) : std::string();
}

bool address_is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& x = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&x) || IN6_IS_ADDR_LINKLOCAL(&x);
  }
  return true;
}

// The first non-loopback address of `family` on this host, or "".
std::string first_real_address(int family) {
  ifaddrs* list = nullptr;
  std::string found;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
    if (!address_is_loopback(i->ifa_addr)) found = address_text(i->ifa_addr);
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

Status check_listen_address(const std::string& host, const std::string& who) {
  if (host.empty()) return Status();
  const std::string shown = host.size() > 64 ? host.substr(0, 64) + "..." : host;
  sockaddr_storage at{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&at);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&at);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof *v4;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof *v6;
  } else {
    return invalid_argument(who + ": host '" + shown +
                            "' is not an IP address; give an address of this machine (such as "
                            "10.0.0.5 or ::1), or leave host unset to listen on the interface "
                            "that reaches the coordinator");
  }
  const int fd = ::socket(at.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable(who + ": cannot open a socket: " + std::strerror(errno));
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&at), len) == 0;
  const int err = errno;
  ::close(fd);
  if (!bound) {
    return invalid_argument(who + ": host '" + shown + "' is not an address of this machine (" +
                            std::strerror(err) +
                            "); give one of its addresses, or leave host unset to listen on the "
                            "interface that reaches the coordinator");
  }
  return Status();
}

StatusOr<std::string> read_secret(const Config& config, const std::string& secret_file) {
  std::string path = secret_file;
  if (path.empty()) {
    if (auto s = config.get("TRIBUTARY_SECRET")) {
      // Set but empty reads as a secret that was meant to be there (a variable exported from
      // nothing): running unauthenticated instead would go unnoticed. As an empty secret file.
      if (s->empty()) {
        return invalid_argument(
            "TRIBUTARY_SECRET is set but empty; give every process the job's secret, or unset "
            "it to run without one (peers and the store are then not authenticated)");
      }
      return *s;
    }
    path = config.get("TRIBUTARY_SECRET_FILE").value_or("");
  }
  if (path.empty()) return std::string();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string secret,
                             read_settings_file(path, size_t{64} << 10, "secret file"));
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return invalid_argument("the secret file '" + path + "' is empty");
  return secret;
}

OptionDef secret_file_option() {
  return {.name = "secret_file",
          .type = OptionType::kString,
          .default_value = "",
          .help =
              "file holding the shared secret peers must prove (else TRIBUTARY_SECRET, then "
              "the file TRIBUTARY_SECRET_FILE names; none = no authentication); every rank "
              "must hold the same one, or none"};
}

int local_ranks(const BackendContext& context) {
  for (const char* key : {"TRIBUTARY_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (auto v = context.config.get(key)) {
      const int n = std::atoi(v->c_str());
      if (n > 0) return n;
    }
  }
  return is_loopback_name(context.coordinator_host) ? context.world_size : 1;
}

bool oversubscribed(MachineShare machine) {
  return machine.ranks > (machine.cpus > 0 ? machine.cpus : online_cpus());
}

namespace {
// For the waits: a launcher's LOCAL_WORLD_SIZE counts too (each rank decides alone).
bool waits_oversubscribed(const BackendContext& context, MachineShare machine) {
  return oversubscribed({std::max(local_ranks(context), machine.ranks), machine.cpus});
}
}  // namespace

std::chrono::nanoseconds poll_duration(const std::string& mode, const BackendContext& context,
                                       std::chrono::nanoseconds on, MachineShare machine) {
  if (mode == "on") return on;
  if (mode == "off") return std::chrono::nanoseconds(0);
  if (mode == "always") return kPollAlways;
  return waits_oversubscribed(context, machine) ? std::chrono::nanoseconds(0) : on;
}

std::chrono::nanoseconds yield_duration(const std::string& mode, const BackendContext& context,
                                        MachineShare machine) {
  return mode == "auto" && waits_oversubscribed(context, machine) ? std::chrono::milliseconds(1)
                                                                  : std::chrono::nanoseconds(0);
}

std::string interface_towards(const std::string& coordinator) {
  if (coordinator == "::1" || coordinator == "[::1]") return "::1";
  if (is_loopback_name(coordinator)) return "127.0.0.1";
  std::string host = coordinator;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "1", &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  const int family = found->ai_family;
  std::string chosen;
  bool loopback = true;
  const int fd = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      chosen = address_text(reinterpret_cast<const sockaddr*>(&local));
      loopback = address_is_loopback(reinterpret_cast<const sockaddr*>(&local));
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  const std::string fallback = family == AF_INET6 ? "::1" : "127.0.0.1";
  if (chosen.empty()) return fallback;
  if (!loopback) return chosen;
  // The coordinator's name resolves to loopback here: publishing that would keep other hosts out.
  const std::string real = first_real_address(family);
  return real.empty() ? chosen : real;
}

std::string host_id(const Config& config) {
  if (auto v = config.get("TRIBUTARY_HOST_ID"); v && !v->empty()) return *v;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return std::string(name) + "/" + kernel_id() + "/" + link_text("/proc/self/ns/pid") + "/" +
         link_text("/proc/self/ns/ipc");
}

namespace {
StatusOr<uint64_t> count(const BackendContext& context, Numbering which, int64_t delta) {
  const std::shared_ptr<uint64_t>& local =
      which == Numbering::kInstances ? context.instances : context.setups;
  if (!context.store) {
    std::atomic_ref<uint64_t> n(*local);
    return delta == 0 ? n.load() : n.fetch_add(static_cast<uint64_t>(delta)) + 1;
  }
  const std::string key = std::string("tributary/numbering/") +
                          (which == Numbering::kInstances ? "instances/" : "setups/") +
                          std::to_string(context.rank);
  TRIBUTARY_ASSIGN_OR_RETURN(const int64_t now, context.store->add(key, delta));
  return static_cast<uint64_t>(now);
}
}  // namespace

StatusOr<uint64_t> take_number(const BackendContext& context, Numbering which) {
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t now, count(context, which, 1));
  return now - 1;
}

StatusOr<uint64_t> numbers_taken(const BackendContext& context, Numbering which) {
  return count(context, which, 0);
}

StatusOr<std::shared_ptr<PrefixStore>> instance_store(const BackendContext& context,
                                                      const std::string& backend) {
  if (!context.store) {
    return failed_precondition(
        "backend '" + backend + "' across " + std::to_string(context.world_size) +
        " processes needs a rendezvous store; create the context with make_backend_context() "
        "(it reads TF_CONFIG, RANK/WORLD_SIZE/MASTER_ADDR, Slurm...)");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t instance, take_number(context, Numbering::kInstances));
  return std::make_shared<PrefixStore>(backend + "/" + std::to_string(instance), context.store);
}

std::string lost_rank_text(int rank) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(::getpid()) + " on host " +
         name + ")";
}

namespace {
constexpr std::string_view kLostMarker = " was lost: ";
constexpr std::string_view kStoreGoneMarker = "which hosts the job's store, is unreachable";
}  // namespace

Status name_lost_ranks(const BackendContext& context, Status failure,
                       std::chrono::milliseconds grace) {
  if (failure.ok() || context.world_size <= 1 || !context.store || context.lost_key.empty()) {
    return failure;
  }
  const StatusCode code = failure.code();
  if (code != StatusCode::kUnavailable && code != StatusCode::kAborted &&
      code != StatusCode::kDeadlineExceeded) {
    return failure;  // about this rank's own input or state, not about its peers
  }
  const std::string& said = failure.message();
  if (said.find(kLostMarker) != std::string::npos ||
      said.find(" were lost: ") != std::string::npos ||
      said.find(kStoreGoneMarker) != std::string::npos ||
      said.find(" did not fail with the others") != std::string::npos) {
    return failure;  // named already (a composite backend's inner front door)
  }
  const std::string here = "what rank " + std::to_string(context.rank) + " saw: ";
  auto lost = context.store->get(context.lost_key, grace);
  if (lost.ok()) {
    std::vector<std::string> who;
    std::istringstream lines(*lost);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && std::find(who.begin(), who.end(), line) == who.end()) {
        who.push_back(line);
      }
    }
    if (who.empty()) return failure;
    std::string names = who[0];
    for (size_t i = 1; i < who.size(); ++i)
      names += (i + 1 == who.size() ? " and " : ", ") + who[i];
    return Status(
        code, names + (who.size() > 1 ? " were lost: their processes" : " was lost: its process") +
                  " ended, or the connection dropped, while the job ran (the job's store "
                  "saw it go); see the log and exit status there for why, then restart "
                  "the job. " +
                  here + said);
  }
  if (lost.status().code() == StatusCode::kUnavailable && context.rank != 0) {
    return Status(code, std::string("rank 0, ") + std::string(kStoreGoneMarker) + " (" +
                            lost.status().message() +
                            "): its process has probably ended; see its log and exit status, then "
                            "restart the job. " +
                            here + said);
  }
  if (code == StatusCode::kDeadlineExceeded) {
    // A peer that never came may have been refused by the store for the secret. This rank keeps
    // waiting even so (a stranger with a wrong secret must not be able to end the job), but at the
    // deadline it says so.
    auto refused = context.store->get(wire::kRefusedClientsKey, std::chrono::milliseconds(0));
    if (refused.ok() && !refused->empty()) {
      std::string lines;
      std::istringstream each(*refused);
      for (std::string line; std::getline(each, line);) {
        if (!line.empty()) lines += (lines.empty() ? "" : "; ") + line;
      }
      return Status(code, said + ". Meanwhile the job's store refused connections for the secret (" +
                              lines +
                              "): a process started with a different secret, or none, is kept "
                              "out; give every rank the same TRIBUTARY_SECRET or "
                              "TRIBUTARY_SECRET_FILE");
    }
  }
  return failure;  // nobody lost within the grace: what this rank saw is the best account
}

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

// Sockets a server of this process took (inherited_listener), by identity: a descriptor number
// can name another socket later, an identity cannot (socket inodes are not reused while open).
std::mutex g_taken_mu;
std::set<uint64_t> g_taken_sockets;

std::optional<uint64_t> socket_identity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

int inherited_listener(const Config& config, int port) {
  const std::optional<std::string> text = config.get("TRIBUTARY_STORE_FD");
  if (!text) return -1;
  const internal::Logger log(internal::log_level_from(config), "store");
  const int fd = store_fd_variable(config);
  if (fd < 0) {
    log.log(internal::LogLevel::kWarning,
            "TRIBUTARY_STORE_FD=\"{}\" is not a descriptor number; binding port {} instead", *text,
            port);
    return -1;
  }
  if (internal::listening_tcp_port(fd) != port) return -1;
  const std::optional<uint64_t> socket = socket_identity(fd);
  if (!socket) return -1;
  {
    std::lock_guard lock(g_taken_mu);
    if (!g_taken_sockets.insert(*socket).second) return -1;  // a server of this process has it
  }
  log.log(internal::LogLevel::kInfo,
          "serving on the socket the launcher bound (TRIBUTARY_STORE_FD={}, port {})", fd, port);
  return fd;
}

std::string held_port_trouble(const Config& config, int port, const std::string& hint) {
  const int fd = store_fd_variable(config);
  if (fd < 0 || internal::listening_tcp_port(fd) != port) return "";
  const std::string named = "TRIBUTARY_STORE_FD=" + std::to_string(fd);
  const std::optional<uint64_t> socket = socket_identity(fd);
  bool taken = false;
  if (socket) {
    std::lock_guard lock(g_taken_mu);
    taken = g_taken_sockets.contains(*socket);
  }
  if (taken) {
    return " (this process already serves on the port: a server it started earlier took the "
           "socket its launcher handed down, " +
           named + ", and is still running; start one server on the port at a time)";
  }
  return " (this process holds the port itself: its launcher handed it a socket listening there, " +
         named +
         ", but the Config given here lacks TRIBUTARY_STORE_FD (Config::from_environment() has "
         "it)" +
         (hint.empty() ? std::string() : "; or " + hint) + ")";
}

}  // namespace tributary::internal
