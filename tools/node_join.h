// How the tributary-run launchers of a multi-host job meet before any worker starts (torchrun's
// static rendezvous, reduced to a check). POSIX and the C++ standard library only.
//
// Node 0 listens on the master port; every other node connects to --master-addr:--master-port and
// sends one line, "tributary-run/1 node_rank=K nnodes=N nproc_per_node=M". Node 0 answers each
// with "ok" once all N-1 nodes are there and agree (same nnodes and nproc_per_node, distinct node
// ranks), else with "error <why>", and then closes the port, which the chief's rendezvous store
// (rank 0's) takes over. A node that never comes, a node 0 that is not there, and a peer that says
// nothing all end in an error naming what is missing within JoinOptions::timeout: nothing waits
// without a bound.
//
// The handshake carries only these counts; it is not authenticated (the workers' store is, with
// TRIBUTARY_SECRET). A stranger who connects first can make the join fail, not join the job.
#pragma once

#include <chrono>
#include <string>

namespace tributary::tools {

struct JoinOptions {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr;  // host name or address of node 0
  int master_port = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string timeout_text = "5m";  // as the user wrote it, for messages
};

// Blocks until every node has joined (true), or fails with `error` set to one line that says what
// is missing and what to do.
bool join_nodes(const JoinOptions& options, std::string& error);

}  // namespace tributary::tools
