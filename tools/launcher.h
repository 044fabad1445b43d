// The launcher behind tributary-run: starts the worker processes of one program on this host,
// each with its cluster spec in the environment, relays their output and signals, and stops the
// job when a rank fails. POSIX and the C++ standard library only; nothing of tributary's own.
//
// A job spans LaunchOptions::nnodes hosts with one launcher on each (torchrun's static
// rendezvous): node k starts global ranks k*nproc .. k*nproc+nproc-1. With more than one node the
// launchers first meet on the master port (node_join.h), so a node that never comes is an error
// on the others within LaunchOptions::join_timeout, before any worker starts.
//
// What the worker with global rank r (local index i on this node) of W = nnodes*nproc gets:
//  - RANK=r, WORLD_SIZE=W, LOCAL_RANK=i, LOCAL_WORLD_SIZE=nproc, MASTER_ADDR, MASTER_PORT as
//    torchrun sets them, and TRIBUTARY_RANK, TRIBUTARY_WORLD_SIZE, TRIBUTARY_LOCAL_RANK,
//    TRIBUTARY_MASTER_ADDR, TRIBUTARY_MASTER_PORT (the ones tributary reads first). The master is
//    node 0's --master-addr (127.0.0.1 by default); MASTER_PORT is the same for all ranks: rank 0's
//    rendezvous store listens there;
//  - on a single node of 2 or more workers (unless LaunchOptions::hand_over_store_socket is false),
//    rank 0 also TRIBUTARY_STORE_FD: the launcher binds and listens on MASTER_PORT itself before
//    any worker starts, and rank 0 inherits that socket, on which tributary serves the store. So no
//    other process can take the port between the launcher choosing it and rank 0 binding it, and a
//    --master-port in use fails here, before any worker starts; but a rank 0 that binds
//    MASTER_PORT itself (torch.distributed outside torchrun) finds it taken, as under torchrun,
//    whose agent holds the port too. The launcher closes its own copy once rank 0 has started. An
//    inherited TRIBUTARY_STORE_FD (a launcher under a launcher) is not passed on, and the socket
//    it names is closed on exec;
//  - on a single node also TF_CONFIG={"cluster": {"worker": ["127.0.0.1:P0", ...]}, "task":
//    {"type": "worker", "index": i}}, with N distinct ports that were free when the job started
//    and none of them MASTER_PORT. A multi-node job sets no TF_CONFIG (and passes on none): one
//    launcher cannot know the ports of the others;
//  - the launcher's environment plus LaunchOptions::env otherwise; stdin from /dev/null;
//  - its own process group (so signals reach what it starts) and, on Linux, PR_SET_PDEATHSIG, so
//    it dies with a launcher that was SIGKILLed;
//  - with LaunchOptions::bind_to_core, the CPUs of one core as its affinity (tools/cpu_binding.h);
//    otherwise the launcher's.
//
// Output: each line a worker writes to stdout (stderr) goes whole to our stdout (stderr) after
// the prefix "[rank r] " (the global rank); a last line without '\n' is completed with one. The
// launcher's own messages go to stderr as "tributary-run: ...".
//
// Exit status of launch(): 0 when every rank of this node exits 0; otherwise that of the first
// failure seen: a rank's exit status, or 128+signal for a rank killed by a signal; 128+signal when
// the launcher receives SIGINT, SIGTERM or SIGHUP (which it forwards to every rank); 124 when the
// job outlives LaunchOptions::timeout; 1 when the launcher itself fails (no free port, fork fails,
// the nodes did not join). On a failure every remaining rank gets SIGTERM (the received signal,
// when forwarding), then SIGKILL after LaunchOptions::grace. Every wait is bounded, including on
// processes a rank leaves behind holding its output and on a reader of our output that stops
// reading. The launchers of other nodes learn of a failure through their own ranks (tributary's
// collectives fail on every rank when one is lost).
//
// SIGUSR1 is passed on to each rank's own process (not its group) and stops nothing: tributary
// dumps the flight recorders of that rank on it (core/flight_recorder.h).
//
// launch() installs process-wide handlers for SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE and SIGUSR1
// (a signal ignored on entry stays ignored, so nohup works): call it once, from a single-threaded
// process.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tributary::tools {

inline constexpr int kMaxLocalWorkers = 1024;
inline constexpr int kTimeoutExitStatus = 124;  // as timeout(1) exits

struct LaunchOptions {
  int nproc = 1;                   // workers on this node
  int nnodes = 1;                  // nodes (hosts) of the job, one launcher each
  int node_rank = 0;               // this node's place among them, 0 .. nnodes-1
  std::string master_addr;         // node 0's address; "" = 127.0.0.1 (one node only)
  std::optional<int> master_port;  // else a free port (one node only)
  std::chrono::milliseconds join_timeout{std::chrono::minutes(5)};  // for the nodes to meet
  std::string join_timeout_text = "5m";
  bool prefix = true;              // "[rank i] " before each line
  bool bind_to_core = false;       // --bind-to core: each worker on one core (cpu_binding.h)
  bool report_bindings = false;    // a line on stderr per worker: the CPUs it is bound to
  // One node, 2 or more workers: bind MASTER_PORT here and hand its socket to rank 0
  // (TRIBUTARY_STORE_FD); false: pick a free port and release it (--release-master-port).
  bool hand_over_store_socket = true;
  std::optional<std::chrono::milliseconds> timeout;
  std::string timeout_text;  // as the user wrote it, for messages
  std::chrono::milliseconds grace{5000};
  std::string grace_text = "5s";
  std::vector<std::string> env;      // KEY=VALUE for every worker; no launcher variable
  std::vector<std::string> command;  // program and arguments, searched in PATH; not empty
};

// True for the variables launch() sets per rank (RANK, TF_CONFIG, ...), which env may not set.
bool is_launcher_variable(std::string_view key);

// Runs the job to the end; returns the status tributary-run exits with (see above).
int launch(LaunchOptions options);

}  // namespace tributary::tools
