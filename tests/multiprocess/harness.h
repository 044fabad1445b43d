// Multi-process tests: every rank a real forked process, meeting through a FileStore in a fresh
// directory, each guarded by alarm() and the parent by a watchdog, so that a hang fails the test
// instead of stalling CI.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/sockets.h"
#include "tributary/registry.h"

namespace tributary::testing {

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  int pid = 0;  // the process it ran in (reaped by the time run_group returns)
};

struct GroupResult {
  std::vector<ChildResult> children;
  bool watchdog_fired = false;
  double seconds = 0;
  std::string describe() const;  // "rank 0: exit 0; rank 1: signal 9; ..."
};

// Exit codes children use.
inline constexpr int kChildOk = 0;
inline constexpr int kChildFailed = 1;
inline constexpr int kChildSkip = 77;  // the backend is not available here

// Forks `world` processes running fn(rank) (its return value is the exit code) and waits for all of
// them, killing every one that is still running after `watchdog` (after dump_stacks()).
// `after_fork`, if given, runs in the parent once every child is forked.
GroupResult run_group(int world, std::chrono::seconds watchdog, const std::function<int(int)>& fn,
                      const std::function<void()>& after_fork = {});

// Prints every thread's stack of process `pid` (a hung rank, before a watchdog kills it) to stderr,
// through gdb when it is installed (`who` names the process in the output), so that a hang seen
// once in CI says where it waited. TEST_HANG_STACKS=0 turns it off; gdb gets 60 s.
void dump_stacks(int pid, const std::string& who);

// A fresh directory under the test temp dir.
std::string make_temp_dir(const std::string& tag);

// The context of `rank` in a group of `world` processes with `local` CPU replicas each.
StatusOr<BackendContext> group_context(int rank, int world, int local, const std::string& store_dir,
                                       Config config = {});

// The same through make_backend_context, as a real job meets: rank 0 serves a TcpStore on `port`
// (free_port()) of 127.0.0.1, and every rank's store client leaves its last will there. `config`
// adds settings; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set here.
StatusOr<BackendContext> tcp_group_context(int rank, int world, int local, std::uint16_t port,
                                           std::map<std::string, std::string> config = {});

// Why two processes of this user, neither an ancestor of the other (as a job's ranks are), cannot
// read each other's memory with process_vm_readv here (Yama's ptrace_scope 1 or more without
// CAP_SYS_PTRACE, a seccomp policy); empty when they can. What shm_single_copy=on needs: its tests
// skip with this reason. Probed once per process, with two forked siblings.
const std::string& why_siblings_cannot_read_each_other();

// A TCP port that was free a moment ago on 127.0.0.1, and never one this process was given before
// (so the ports of one cluster spec differ).
std::uint16_t free_port();

// For a server a test starts in a forked child, testing::listening_socket (tests/sockets.h): the
// child gets the socket through TRIBUTARY_STORE_FD (internal::inherited_listener) and serves on
// it, so the port is never free for another process (a parallel test) to take between the test
// choosing it and the child serving, as it is with free_port(). The parent closes its copy after
// fork().
//
// HeldStorePort does that for rank 0's store in a run_group job, as tributary-run holds
// MASTER_PORT: made in the parent before run_group, take(rank) in every child (rank 0 gets the
// TRIBUTARY_STORE_FD entry for its Config, every other rank closes its copy, so that rank 0's death
// leaves no one listening), and release() as run_group's after_fork. Where no socket can be made it
// says so on stderr and falls back to free_port().
class HeldStorePort {
 public:
  HeldStorePort();
  ~HeldStorePort() { release(); }
  HeldStorePort(const HeldStorePort&) = delete;
  HeldStorePort& operator=(const HeldStorePort&) = delete;

  std::uint16_t port() const { return port_; }
  std::map<std::string, std::string> take(int rank);
  void release();

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace tributary::testing
