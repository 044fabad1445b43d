// Cluster resolution: the providers of tributary/cluster.h, asked in order.
#include <algorithm>
#include <climits>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/hostlist.h"
#include "core/strings.h"
#include "tributary/cluster.h"

namespace tributary {
namespace {

using nlohmann::json;

// TF_CONFIG's example, for messages that have to say what a good one looks like.
constexpr std::string_view kTfConfigExample =
    R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]}, )"
    R"("task": {"type": "worker", "index": 0}})";

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

// Long JSON is cut in messages; the start is enough to recognise it.
std::string abbreviated(std::string_view s) {
  constexpr size_t kMax = 160;
  if (s.size() <= kMax) return std::string(s);
  return std::string(s.substr(0, kMax)) + "...";
}

// KEY="value" as messages quote a variable.
std::string var(std::string_view key, std::string_view value) {
  return std::string(key) + "=" + in_quotes(value);
}

// An optional integer variable that must be >= min; `hint` says what it means.
StatusOr<std::optional<int>> get_int(const Config& config, std::string_view key, int min,
                                     std::string_view hint) {
  std::optional<std::string> text = config.get(key);
  if (!text) return std::optional<int>();
  long long n = 0;
  if (!internal::parse_int64(*text, &n) || n < min || n > INT_MAX) {
    return invalid_argument(var(key, *text) + " is not " +
                            (min > 0 ? "a positive" : "a non-negative") + " whole number; " +
                            std::string(hint));
  }
  return std::optional<int>(static_cast<int>(n));
}

StatusOr<int> require_int(const Config& config, std::string_view key, int min,
                          std::string_view hint, std::string_view missing) {
  TRIBUTARY_ASSIGN_OR_RETURN(std::optional<int> v, get_int(config, key, min, hint));
  if (!v) return invalid_argument(std::string(missing));
  return *v;
}

StatusOr<int> parse_port(std::string_view key, std::string_view text) {
  long long n = 0;
  if (!internal::parse_int64(text, &n)) {
    return invalid_argument(var(key, text) +
                            " is not a port number; use a free TCP port from 1 to 65535");
  }
  if (n < 1 || n > 65535) {
    return invalid_argument(var(key, text) +
                            " is out of range; use a free TCP port from 1 to 65535");
  }
  return static_cast<int>(n);
}

// "host:port" or "[v6]:port" -> host and port; `what` names the address in messages.
Status split_host_port(std::string_view address, std::string_view what, std::string* host,
                       int* port) {
  auto fail = [&](std::string_view why) {
    return invalid_argument(std::string(what) + " " + in_quotes(address) + " " + std::string(why));
  };
  size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == address.size()) {
    return fail("has no port; write it as \"host:port\"");
  }
  std::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string_view::npos) {
    return fail("is ambiguous; write an IPv6 address in brackets, as \"[::1]:2222\"");
  }
  if (h.empty()) return fail("has no host; write it as \"host:port\"");
  StatusOr<int> p = parse_port("port", address.substr(colon + 1));
  if (!p.ok()) return fail("has a bad port; use a TCP port from 1 to 65535");
  *host = std::string(h);
  *port = *p;
  return ok_status();
}

std::string host_of(std::string_view address) {
  std::string host;
  int port = 0;
  if (split_host_port(address, "", &host, &port).ok()) return host;
  return std::string(address);
}

// Fills the coordinator: TRIBUTARY_MASTER_* over (when `use_master_vars`) MASTER_* over the
// provider's own host and port. `no_host` is the error when a multi-process world has no host.
Status set_coordinator(const Config& config, bool use_master_vars, std::string host,
                       std::optional<int> port, std::string_view no_host, ClusterSpec* spec) {
  std::vector<std::string_view> addr_keys{"TRIBUTARY_MASTER_ADDR"};
  std::vector<std::string_view> port_keys{"TRIBUTARY_MASTER_PORT"};
  if (use_master_vars) {
    addr_keys.insert(addr_keys.begin(), "MASTER_ADDR");
    port_keys.insert(port_keys.begin(), "MASTER_PORT");
  }
  // Later keys win; every key that is set is checked, even when a later one overrides it.
  for (std::string_view key : addr_keys) {
    if (std::optional<std::string> v = config.get(key)) {
      std::string_view h = internal::trim(*v);
      if (h.empty()) {
        return invalid_argument(var(key, *v) +
                                " is empty; set it to the host name or IP address of rank 0, "
                                "or unset it");
      }
      if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
      host = std::string(h);
    }
  }
  for (std::string_view key : port_keys) {
    if (std::optional<std::string> v = config.get(key)) {
      TRIBUTARY_ASSIGN_OR_RETURN(int p, parse_port(key, *v));
      port = p;
    }
  }
  if (host.empty()) {
    if (spec->world_size > 1) return invalid_argument(std::string(no_host));
    spec->coordinator_host.clear();
    spec->coordinator_port = 0;
    return ok_status();
  }
  spec->coordinator_host = std::move(host);
  spec->coordinator_port = port.value_or(kDefaultCoordinatorPort);
  return ok_status();
}

// The rank / local-rank consistency every launcher-variable provider shares.
struct RankKeys {
  std::string_view rank, world, local_rank, local_world;
};

Status check_ranks(const ClusterSpec& s, const RankKeys& k) {
  if (s.rank >= s.world_size) {
    return invalid_argument(std::string(k.rank) + "=" + std::to_string(s.rank) + " is not below " +
                            std::string(k.world) + "=" + std::to_string(s.world_size) +
                            "; ranks run from 0 to " + std::to_string(s.world_size - 1) +
                            ". Check that every process was started with the same " +
                            std::string(k.world));
  }
  if (s.local_world_size && *s.local_world_size > s.world_size) {
    return invalid_argument(std::string(k.local_world) + "=" + std::to_string(*s.local_world_size) +
                            " is more than " + std::string(k.world) + "=" +
                            std::to_string(s.world_size) +
                            "; a host cannot run more processes than the whole job");
  }
  if (s.local_rank && s.local_world_size && *s.local_rank >= *s.local_world_size) {
    return invalid_argument(std::string(k.local_rank) + "=" + std::to_string(*s.local_rank) +
                            " is not below " + std::string(k.local_world) + "=" +
                            std::to_string(*s.local_world_size) + "; local ranks run from 0 to " +
                            std::to_string(*s.local_world_size - 1));
  }
  return ok_status();
}

// Rank variables named by `k` (the explicit, torchrun and Open MPI providers share this shape).
StatusOr<ClusterSpec> rank_variables(const Config& config, const RankKeys& k,
                                     std::string_view source) {
  ClusterSpec s;
  s.source = std::string(source);
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.rank, require_int(config, k.rank, 0,
                          std::string("it is this process's rank, 0 <= ") + std::string(k.rank) +
                              " < " + std::string(k.world),
                          ""));
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.world_size, require_int(config, k.world, 1, "it is the number of processes in the job",
                                std::string(k.rank) + "=" + *config.get(k.rank) + " is set but " +
                                    std::string(k.world) + " is not; set " + std::string(k.world) +
                                    " to the number of processes in the job on every process"));
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.local_rank, get_int(config, k.local_rank, 0, "it is this process's index on its host"));
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.local_world_size,
      get_int(config, k.local_world, 1, "it is the number of processes on this host"));
  s.task_index = s.rank;
  TRIBUTARY_RETURN_IF_ERROR(check_ranks(s, k));
  return s;
}

StatusOr<ClusterSpec> from_explicit(const Config& config) {
  const RankKeys keys{"TRIBUTARY_RANK", "TRIBUTARY_WORLD_SIZE", "TRIBUTARY_LOCAL_RANK",
                      "TRIBUTARY_LOCAL_WORLD_SIZE"};
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec s, rank_variables(config, keys, "explicit"));
  TRIBUTARY_RETURN_IF_ERROR(set_coordinator(
      config, /*use_master_vars=*/false, "", std::nullopt,
      "TRIBUTARY_RANK=" + std::to_string(s.rank) +
          " and TRIBUTARY_WORLD_SIZE=" + std::to_string(s.world_size) +
          " are set but TRIBUTARY_MASTER_ADDR is not; set it to the host of rank 0 on every "
          "process (and TRIBUTARY_MASTER_PORT to a free port; default " +
          std::to_string(kDefaultCoordinatorPort) + ")",
      &s));
  return s;
}

StatusOr<ClusterSpec> from_torchrun(const Config& config) {
  const RankKeys keys{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec s, rank_variables(config, keys, "torchrun"));
  TRIBUTARY_RETURN_IF_ERROR(set_coordinator(
      config, /*use_master_vars=*/true, "", std::nullopt,
      "RANK=" + std::to_string(s.rank) + " and WORLD_SIZE=" + std::to_string(s.world_size) +
          " are set (torchrun style) but MASTER_ADDR is not; set MASTER_ADDR to the host of rank "
          "0 and MASTER_PORT to a free port (torchrun sets both), or TRIBUTARY_MASTER_ADDR and "
          "TRIBUTARY_MASTER_PORT",
      &s));
  return s;
}

StatusOr<ClusterSpec> from_openmpi(const Config& config) {
  const RankKeys keys{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE"};
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec s, rank_variables(config, keys, "openmpi"));
  TRIBUTARY_RETURN_IF_ERROR(set_coordinator(
      config, /*use_master_vars=*/true, "", std::nullopt,
      "Open MPI started " + std::to_string(s.world_size) +
          " processes (OMPI_COMM_WORLD_SIZE) but does not say where rank 0 runs: set MASTER_ADDR "
          "to the host of rank 0 and MASTER_PORT to a free port for every rank (e.g. mpirun -x "
          "MASTER_ADDR=host0 -x MASTER_PORT=" +
          std::to_string(kDefaultCoordinatorPort) +
          " ...), or TRIBUTARY_MASTER_ADDR and TRIBUTARY_MASTER_PORT",
      &s));
  return s;
}

// The first of `keys` that is set, with its name.
std::optional<std::pair<std::string_view, std::string>> first_set(
    const Config& config, std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) {
    if (std::optional<std::string> v = config.get(key)) return std::pair(key, *v);
  }
  return std::nullopt;
}

StatusOr<ClusterSpec> from_slurm(const Config& config) {
  ClusterSpec s;
  s.source = "slurm";
  s.local_rank.reset();
  s.local_world_size.reset();
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.rank, require_int(config, "SLURM_PROCID", 0, "Slurm sets it to the task's rank", ""));
  s.task_index = s.rank;
  auto ntasks = first_set(config, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  if (!ntasks) {
    return invalid_argument("SLURM_PROCID=" + std::to_string(s.rank) +
                            " is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is. Not "
                            "running inside a SLURM step? Launch the processes with srun, or set "
                            "TRIBUTARY_RANK and TRIBUTARY_WORLD_SIZE");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.world_size, require_int(config, ntasks->first, 1, "it is the number of tasks", ""));
  const std::string world_key(ntasks->first);
  TRIBUTARY_RETURN_IF_ERROR(check_ranks(s, {"SLURM_PROCID", world_key, "", ""}));

  std::vector<std::string> hosts;
  std::string_view hosts_key;
  if (auto nodelist =
          first_set(config, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    hosts_key = nodelist->first;
    StatusOr<std::vector<std::string>> h = expand_slurm_hostlist(nodelist->second);
    if (!h.ok()) return h.status().with_context(hosts_key);
    hosts = std::move(h).value();
  }
  std::vector<int> per_node;
  if (auto tpn = first_set(config, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    StatusOr<std::vector<int>> t = expand_slurm_tasks_per_node(tpn->second);
    if (!t.ok()) return t.status().with_context(tpn->first);
    per_node = std::move(t).value();
    long long sum = 0;
    for (int n : per_node) sum += n;
    if (sum != s.world_size) {
      return invalid_argument(var(tpn->first, tpn->second) + " adds up to " + std::to_string(sum) +
                              " tasks but " + world_key + "=" + std::to_string(s.world_size) +
                              "; they must agree (do they come from the same job step?)");
    }
    if (!hosts.empty() && hosts.size() != per_node.size()) {
      return invalid_argument(var(tpn->first, tpn->second) + " lists " +
                              std::to_string(per_node.size()) + " nodes but " +
                              std::string(hosts_key) + " has " + std::to_string(hosts.size()) +
                              " hosts (" + *config.get(hosts_key) +
                              "); they must agree (do they come from the same job step?)");
    }
  }
  TRIBUTARY_ASSIGN_OR_RETURN(
      s.local_rank, get_int(config, "SLURM_LOCALID", 0, "it is the task's index on its node"));
  TRIBUTARY_ASSIGN_OR_RETURN(
      std::optional<int> node_id,
      get_int(config, "SLURM_NODEID", 0, "it is the node's index in the job"));
  if (node_id) {
    size_t nodes = !per_node.empty() ? per_node.size() : hosts.size();
    if (nodes > 0 && static_cast<size_t>(*node_id) >= nodes) {
      return invalid_argument("SLURM_NODEID=" + std::to_string(*node_id) +
                              " is not below the job's " + std::to_string(nodes) +
                              " nodes; do the SLURM_* variables come from the same job step?");
    }
    if (!per_node.empty()) s.local_world_size = per_node[static_cast<size_t>(*node_id)];
  }
  if (s.local_rank && s.local_world_size && *s.local_rank >= *s.local_world_size) {
    return invalid_argument(
        "SLURM_LOCALID=" + std::to_string(*s.local_rank) + " is not below the " +
        std::to_string(*s.local_world_size) +
        " tasks that the tasks-per-node list gives node SLURM_NODEID=" + std::to_string(*node_id) +
        "; do the SLURM_* variables come from the same job step?");
  }

  std::string first_host;
  if (!hosts.empty()) {
    first_host = *std::min_element(hosts.begin(), hosts.end(), [](const auto& a, const auto& b) {
      return internal::slurm_host_less(a, b);
    });
  }
  TRIBUTARY_RETURN_IF_ERROR(set_coordinator(
      config, /*use_master_vars=*/true, first_host, std::nullopt,
      "Slurm started " + std::to_string(s.world_size) +
          " tasks but none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and SLURM_NODELIST is set, "
          "so the host of rank 0 is unknown; set MASTER_ADDR (or TRIBUTARY_MASTER_ADDR) to it",
      &s));
  return s;
}

// TF_CONFIG's "index": TF accepts anything int() does; we accept whole numbers and their text.
StatusOr<int> tf_task_index(const json& v) {
  long long n = -1;
  bool ok = false;
  if (v.is_number_integer()) {
    ok = v.is_number_unsigned() ? v.get<unsigned long long>() <= INT_MAX : true;
    if (ok) n = v.get<long long>();
  } else if (v.is_string()) {
    ok = internal::parse_int64(v.get<std::string>(), &n);
  }
  if (!ok || n < 0 || n > INT_MAX) {
    return invalid_argument("TF_CONFIG: task.index " + v.dump() +
                            " is not a non-negative whole number; it is this task's position in "
                            "its job's address list, counting from 0");
  }
  return static_cast<int>(n);
}

StatusOr<ClusterSpec> parse_tf_config_impl(std::string_view text,
                                           std::optional<std::string> type_override,
                                           std::optional<int> index_override) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // out_of_range too: a number too large for any type
    // e.what() gives the column, which matters in a long one-line TF_CONFIG.
    return invalid_argument("TF_CONFIG is not valid JSON: " + in_quotes(abbreviated(text)) + " (" +
                            e.what() + "); it should look like " + std::string(kTfConfigExample));
  }
  if (!doc.is_object()) {
    return invalid_argument("TF_CONFIG must be a JSON object, not " + abbreviated(doc.dump()) +
                            "; it should look like " + std::string(kTfConfigExample));
  }
  ClusterSpec s;
  s.source = "TF_CONFIG";
  if (doc.contains("cluster") && !doc["cluster"].is_null()) {
    const json& cluster = doc["cluster"];
    if (!cluster.is_object()) {
      return invalid_argument(
          "TF_CONFIG: \"cluster\" must be an object of job name -> list of "
          "\"host:port\", not " +
          abbreviated(cluster.dump()));
    }
    for (auto it = cluster.begin(); it != cluster.end(); ++it) {
      const std::string& job = it.key();
      if (job != "chief" && job != "worker" && job != "evaluator" && job != "ps") {
        return invalid_argument("TF_CONFIG: unknown job " + in_quotes(job) +
                                " in \"cluster\"; valid jobs are \"chief\", \"worker\", "
                                "\"evaluator\" and \"ps\"");
      }
      if (!it.value().is_array()) {
        return invalid_argument("TF_CONFIG: job " + in_quotes(job) +
                                " must be a list of \"host:port\" strings, not " +
                                abbreviated(it.value().dump()));
      }
      std::vector<std::string>& addresses = s.jobs[job];
      for (const json& a : it.value()) {
        if (!a.is_string() || internal::trim(a.get<std::string>()).empty()) {
          return invalid_argument("TF_CONFIG: job " + in_quotes(job) + " has the address " +
                                  a.dump() + "; each address must be a \"host:port\" string");
        }
        addresses.push_back(a.get<std::string>());
      }
    }
  }
  if (s.jobs.empty()) {
    // TF: an empty cluster_spec means local (single-worker) training; the task is ignored.
    return s;
  }

  std::optional<std::string> task_type = std::move(type_override);
  std::optional<int> task_index = index_override;
  if (doc.contains("task") && !doc["task"].is_null()) {
    const json& task = doc["task"];
    if (!task.is_object()) {
      return invalid_argument(
          "TF_CONFIG: \"task\" must be an object like {\"type\": \"worker\", "
          "\"index\": 0}, not " +
          abbreviated(task.dump()));
    }
    if (!task_type && task.contains("type") && !task["type"].is_null()) {
      if (!task["type"].is_string()) {
        return invalid_argument("TF_CONFIG: task.type " + task["type"].dump() +
                                " must be a string: \"chief\", \"worker\" or \"evaluator\"");
      }
      task_type = task["type"].get<std::string>();
    }
    if (!task_index && task.contains("index") && !task["index"].is_null()) {
      TRIBUTARY_ASSIGN_OR_RETURN(task_index, tf_task_index(task["index"]));
    }
  }
  if (!task_type || !task_index) {
    return invalid_argument(
        "When `cluster_spec` is given, you must also specify `task_type` and "
        "`task_id`. TF_CONFIG has a \"cluster\" but " +
        std::string(!doc.contains("task") ? "no \"task\""
                    : !task_type          ? "its \"task\" lacks \"type\""
                                          : "its \"task\" lacks \"index\"") +
        "; add \"task\": {\"type\": \"worker\", \"index\": <this process's "
        "index>} to each process's TF_CONFIG");
  }
  if (*task_index < 0) {
    return invalid_argument("TF_CONFIG: task index " + std::to_string(*task_index) +
                            " is negative; it counts from 0");
  }
  s.task_type = *task_type;
  s.task_index = *task_index;

  // multi_worker_util._validate_cluster_spec, in TF's order and with TF's words.
  auto count = [&](const char* job) {
    auto it = s.jobs.find(job);
    return it == s.jobs.end() ? 0 : static_cast<int>(it->second.size());
  };
  const std::string& type = s.task_type;
  if (type != "chief" && type != "worker" && type != "evaluator" && type != "ps") {
    return invalid_argument("TF_CONFIG: Unrecognized task_type: '" + type +
                            "', valid task types are: \"chief\", \"worker\", \"evaluator\" and "
                            "\"ps\".");
  }
  if (!s.jobs.contains(type)) {
    return invalid_argument("TF_CONFIG: `task_type` '" + type +
                            "' not found in cluster_spec. Add a \"" + type +
                            "\" job to \"cluster\" or fix task.type");
  }
  if (count("chief") > 1) {
    return invalid_argument("TF_CONFIG: There must be at most one 'chief' job. \"chief\" lists " +
                            std::to_string(count("chief")) +
                            " addresses; make the others \"worker\" tasks");
  }
  if (count("evaluator") > 1) {
    return invalid_argument(
        "TF_CONFIG: There must be at most one 'evaluator' job. "
        "\"evaluator\" lists " +
        std::to_string(count("evaluator")) + " addresses");
  }
  if (count(type.c_str()) == 0) {
    return invalid_argument("TF_CONFIG: the \"" + type +
                            "\" job of the cluster lists no address, "
                            "so no task of type '" +
                            type +
                            "' can run; list this task's "
                            "host:port under \"" +
                            type + "\"");
  }
  if (s.task_index >= count(type.c_str())) {
    return invalid_argument("TF_CONFIG: The `task_id` " + std::to_string(s.task_index) +
                            " exceeds the maximum id of " + type + ". \"" + type + "\" has " +
                            std::to_string(count(type.c_str())) +
                            " task(s), so task.index runs "
                            "from 0 to " +
                            std::to_string(count(type.c_str()) - 1));
  }
  const int chiefs = count("chief");
  const int workers = chiefs + count("worker");
  if (workers == 0) {
    return invalid_argument("TF_CONFIG: the cluster " + abbreviated(doc["cluster"].dump()) +
                            " has no \"chief\" or \"worker\" tasks; list the training processes "
                            "under \"worker\" (and one under \"chief\" if you want a chief)");
  }
  // Two tasks on one address would both try to serve it.
  std::set<std::string> seen;
  for (const auto& [job, addresses] : s.jobs) {
    for (const std::string& a : addresses) {
      if (!seen.insert(a).second) {
        return invalid_argument("TF_CONFIG: the address " + in_quotes(a) +
                                " appears more than once in \"cluster\"; give every task its own "
                                "host:port");
      }
    }
  }

  if (type == "evaluator") {
    // The evaluator is a cluster of its own (TF: worker_count = #evaluator, id = task_id).
    s.rank = s.task_index;
    s.world_size = count("evaluator");
    return s;
  }
  if (type == "ps") {
    // A ps task takes part in no collective (TF's id_in_cluster has no id for it): it serves
    // variables (ParameterServerStrategy's run_server); task_index says which one it is.
    s.rank = 0;
    s.world_size = 1;
    return s;
  }
  s.rank = type == "chief" ? 0 : s.task_index + chiefs;
  s.world_size = workers;

  // The training tasks in rank order: chief, then workers.
  std::vector<std::string> in_rank_order;
  if (chiefs) in_rank_order = s.jobs.at("chief");
  if (s.jobs.contains("worker")) {
    const auto& w = s.jobs.at("worker");
    in_rank_order.insert(in_rank_order.end(), w.begin(), w.end());
  }
  const std::string my_host = host_of(in_rank_order[static_cast<size_t>(s.rank)]);
  int local_rank = 0, local_world = 0;
  for (size_t r = 0; r < in_rank_order.size(); ++r) {
    if (host_of(in_rank_order[r]) != my_host) continue;
    if (static_cast<int>(r) < s.rank) ++local_rank;
    ++local_world;
  }
  s.local_rank = local_rank;
  s.local_world_size = local_world;

  // TF's collective_leader: the chief if there is one, else worker 0.
  const std::string& leader = in_rank_order.front();
  const std::string leader_name = chiefs ? "chief 0" : "worker 0";
  TRIBUTARY_RETURN_IF_ERROR(split_host_port(
      leader, "TF_CONFIG: the address of " + leader_name + " (the rendezvous leader)",
      &s.coordinator_host, &s.coordinator_port));
  return s;
}

StatusOr<ClusterSpec> from_tf_config(const Config& config, const std::string& text) {
  TRIBUTARY_ASSIGN_OR_RETURN(ClusterSpec s, parse_tf_config(text));
  TRIBUTARY_RETURN_IF_ERROR(
      set_coordinator(config, /*use_master_vars=*/false, s.coordinator_host,
                      s.coordinator_port ? std::optional(s.coordinator_port) : std::nullopt,
                      "TF_CONFIG names no rendezvous leader", &s));
  return s;
}

}  // namespace

bool ClusterSpec::is_chief() const {
  if (task_type == "chief" || task_type == "evaluator") return true;
  return task_type == "worker" && task_index == 0 && !jobs.contains("chief");
}

std::string ClusterSpec::coordinator_address() const {
  if (coordinator_host.empty()) return "";
  const bool v6 = coordinator_host.find(':') != std::string::npos;
  return (v6 ? "[" + coordinator_host + "]" : coordinator_host) + ":" +
         std::to_string(coordinator_port);
}

std::string ClusterSpec::describe() const {
  auto opt = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("?"); };
  std::string out = "source=" + source + " task=" + task_type + ":" + std::to_string(task_index) +
                    " rank=" + std::to_string(rank) + "/" + std::to_string(world_size) +
                    " local=" + opt(local_rank) + "/" + opt(local_world_size) +
                    " chief=" + (is_chief() ? "yes" : "no") + " coordinator=" +
                    (coordinator_host.empty() ? std::string("none") : coordinator_address());
  if (!jobs.empty()) {
    std::vector<std::string> counts;
    for (const auto& [job, addresses] : jobs) {
      counts.push_back(job + ":" + std::to_string(addresses.size()));
    }
    out += " jobs={" + internal::join(counts, ", ") + "}";
  }
  return out;
}

StatusOr<ClusterSpec> parse_tf_config(std::string_view json_text,
                                      std::optional<std::string> task_type,
                                      std::optional<int> task_index) {
  // Every access above checks the type first; this only keeps a missed case from escaping.
  try {
    return parse_tf_config_impl(json_text, std::move(task_type), task_index);
  } catch (const json::exception& e) {
    return invalid_argument("TF_CONFIG could not be read (" + std::string(e.what()) +
                            "); it should look like " + std::string(kTfConfigExample));
  }
}

StatusOr<ClusterSpec> resolve_cluster_spec(const Config& config) {
  if (config.get("TRIBUTARY_RANK")) return from_explicit(config);
  for (std::string_view key :
       {"TRIBUTARY_WORLD_SIZE", "TRIBUTARY_LOCAL_RANK", "TRIBUTARY_LOCAL_WORLD_SIZE"}) {
    if (std::optional<std::string> v = config.get(key)) {
      return invalid_argument(var(key, *v) +
                              " is set but TRIBUTARY_RANK is not; set TRIBUTARY_RANK too (and "
                              "TRIBUTARY_WORLD_SIZE), or unset it to let TF_CONFIG, torchrun, "
                              "Open MPI or Slurm variables describe the cluster");
    }
  }
  if (std::optional<std::string> tf_config = config.get("TF_CONFIG")) {
    StatusOr<ClusterSpec> s = from_tf_config(config, *tf_config);
    // '{}' (or no "cluster") is TF's "not multi-worker": let the other providers speak.
    if (!s.ok() || !s->jobs.empty()) return s;
  }
  if (config.get("RANK")) return from_torchrun(config);
  if (config.get("OMPI_COMM_WORLD_RANK")) return from_openmpi(config);
  if (config.get("SLURM_PROCID")) return from_slurm(config);
  ClusterSpec single;
  TRIBUTARY_RETURN_IF_ERROR(
      set_coordinator(config, /*use_master_vars=*/false, "", std::nullopt, "", &single));
  return single;
}

}  // namespace tributary
