// ClusterSpec: where this process sits in a multi-process job (its rank, its peers, its chief) and
// where the key-value store for rendezvous lives, resolved from what the launcher put in the
// environment (a Config snapshot, so resolution is a pure function that tests drive with
// Config::from_map).
//
// resolve_cluster_spec() asks these providers in order; the first whose trigger is set decides:
//
//   1. "explicit"  trigger TRIBUTARY_RANK. Also TRIBUTARY_WORLD_SIZE (required),
//                  TRIBUTARY_LOCAL_RANK and TRIBUTARY_LOCAL_WORLD_SIZE (optional). Coordinator:
//                  TRIBUTARY_MASTER_ADDR (required when the world has more than one process) and
//                  TRIBUTARY_MASTER_PORT. TRIBUTARY_WORLD_SIZE, _LOCAL_RANK or _LOCAL_WORLD_SIZE
//                  without TRIBUTARY_RANK is an error rather than silently ignored.
//   2. "TF_CONFIG" trigger TF_CONFIG with a non-empty "cluster" (as in TF, '{}' or a TF_CONFIG
//                  without "cluster" means "not multi-worker" and resolution goes on). TF's rules
//                  (multi_worker_util): task types "chief", "worker", "evaluator" and "ps" (the
//                  parameter servers of ParameterServerStrategy); the task's type must be in
//                  the cluster and its index in range; at most one chief and one evaluator; at
//                  least one chief or worker. rank = TF's id_in_cluster (chief 0, worker i ->
//                  i + #chief), world_size = #chief + #worker, whatever "ps" and "evaluator" hold;
//                  an evaluator is a world of its own (rank = its index, world_size = 1), and so
//                  is a ps task (rank = its index among the ps tasks, world_size = #ps): it takes
//                  part in no collective, make_backend_context refuses it, and it runs
//                  run_server() (strategy/parameter_server.h). Coordinator = TF's collective leader: the
//                  chief's "host:port", else worker 0's. local_rank/local_world_size are derived by
//                  comparing host names textually among chief and worker addresses.
//                  Unlike TF, an unknown job name (e.g. "chef") is an error, not ignored.
//   3. "torchrun"  trigger RANK. Also WORLD_SIZE (required), LOCAL_RANK, LOCAL_WORLD_SIZE.
//                  Coordinator: MASTER_ADDR (required when world_size > 1), MASTER_PORT.
//   4. "openmpi"   trigger OMPI_COMM_WORLD_RANK. Also OMPI_COMM_WORLD_SIZE (required),
//                  OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE. Open MPI names no
//                  rendezvous host: MASTER_ADDR (or TRIBUTARY_MASTER_ADDR) is required when
//                  world_size > 1. Asked before Slurm because processes started by mpirun inside a
//                  Slurm allocation inherit the SLURM_* variables of mpirun's daemons, which
//                  describe the daemons, not the MPI ranks.
//   5. "slurm"     trigger SLURM_PROCID (the rank). World size: SLURM_STEP_NUM_TASKS, else
//                  SLURM_NTASKS (required). Hosts: SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST,
//                  else SLURM_NODELIST, a hostlist expression (expand_slurm_hostlist). Tasks per
//                  host: SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
//                  (expand_slurm_tasks_per_node); it must sum to the world size and have one entry
//                  per host. local_rank = SLURM_LOCALID; local_world_size = the tasks-per-node
//                  entry of SLURM_NODEID. Coordinator: MASTER_ADDR/MASTER_PORT when set, else the
//                  first host of the node list sorted as Slurm sorts host names (numeric parts
//                  compared as numbers, so n9 < n10: under Slurm's block and cyclic distributions
//                  that is where rank 0 runs).
//   6. "single-process"  nothing above is set: rank 0 of a world of 1, no coordinator.
//
// In every provider TRIBUTARY_MASTER_ADDR and TRIBUTARY_MASTER_PORT, when set, override the
// coordinator host and port the provider found. A coordinator host without a port gets
// kDefaultCoordinatorPort. A world of one process needs no coordinator (coordinator_host may be
// "").
//
// Errors: malformed or inconsistent input (bad JSON, an index or rank out of range, a negative or
// non-numeric number, a bad hostlist, tasks per node that do not sum to the task count, a port
// outside 1..65535, a missing required variable) is InvalidArgument, with the offending variable
// and value quoted and what to do. Nothing throws. Everything here is a value; thread-compatible.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/config.h"
#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

// The port of the rendezvous store when a provider names a host but no port (torchrun's default).
inline constexpr int kDefaultCoordinatorPort = 29500;

struct ClusterSpec {
  // TF_CONFIG-style jobs: task type ("chief", "worker", "evaluator", "ps") -> "host:port" addresses.
  // Empty for providers other than TF_CONFIG, which do not list their peers.
  std::map<std::string, std::vector<std::string>> jobs;
  // TF_CONFIG's task; other providers report ("worker", rank).
  std::string task_type = "worker";
  int task_index = 0;
  // This process's place among the world_size processes that take part in collectives.
  int rank = 0;
  int world_size = 1;
  // Processes on this host and this process's index among them; nullopt when the launcher does
  // not say.
  std::optional<int> local_rank = 0;
  std::optional<int> local_world_size = 1;
  // Rendezvous key-value store, served by the chief. Empty host / port 0 when there is none.
  std::string coordinator_host;
  int coordinator_port = 0;
  // Which provider produced this spec: "explicit", "TF_CONFIG", "torchrun", "slurm", "openmpi"
  // or "single-process".
  std::string source = "single-process";

  // TF's is_chief: the "chief" task; the evaluator (a chief on its own); worker 0 when the
  // cluster has no "chief" job (so rank 0 for providers without jobs); nobody else.
  bool is_chief() const;
  // "host:port" ("[v6addr]:port" for IPv6), or "" when there is no coordinator.
  std::string coordinator_address() const;
  // One line for logs, e.g. "source=TF_CONFIG task=worker:0 rank=1/3 local=0/1 chief=no
  // coordinator=host0:2222 jobs={chief:1, worker:2}".
  std::string describe() const;

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;
};

// Resolves the cluster from `config` (keys are environment variable names) by the precedence
// above.
StatusOr<ClusterSpec> resolve_cluster_spec(const Config& config);

// TF_CONFIG's JSON on its own. `task_type` / `task_index`, when given, replace the JSON's "task"
// fields (each independently; TF's TFConfigClusterResolver(task_type=, task_id=) arguments). An
// empty or absent "cluster" gives a world of one with source "TF_CONFIG", as TF runs locally then.
// TRIBUTARY_MASTER_* overrides are applied by resolve_cluster_spec, not here.
StatusOr<ClusterSpec> parse_tf_config(std::string_view json,
                                      std::optional<std::string> task_type = std::nullopt,
                                      std::optional<int> task_index = std::nullopt);

// A Slurm hostlist expression in the order written: "n[1-2],m5,o[3-4,6,7-9]" ->
// n1 n2 m5 o3 o4 o6 o7 o8 o9. Zero padding follows the lower bound ("n[08-10]" -> n08 n09 n10);
// several bracket groups multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Errors read
// 'Invalid hostlist format "<text>": <why>'.
StatusOr<std::vector<std::string>> expand_slurm_hostlist(std::string_view hostlist);

// Slurm's tasks-per-node list: "3(x2),2,1" -> 3 3 2 1. Errors read
// 'Invalid tasks-per-node list format "<text>": <why>'.
StatusOr<std::vector<int>> expand_slurm_tasks_per_node(std::string_view tasks_per_node);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
