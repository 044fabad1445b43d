// What every multi-process backend does before its transport exists, written once: the shared
// secret, how many ranks share this host, whether waits should poll, which local address reaches
// the coordinator, this host's identity, and the store scope of a backend instance. Internal to
// tributary (backends use it; it is not part of the public API).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/config.h"
#include "tributary/cross_device_ops.h"
#include "tributary/options.h"
#include "tributary/status.h"
#include "tributary/store.h"

namespace tributary::internal {

// The secret_file option, else TRIBUTARY_SECRET, else the file TRIBUTARY_SECRET_FILE names
// (explicit option > environment); "" = no authentication. An unreadable or empty file is an error.
StatusOr<std::string> read_secret(const Config& config, const std::string& secret_file);
// The `secret_file` option every authenticating multi-process backend offers (read by read_secret).
OptionDef secret_file_option();

// Ranks on this host: the launcher's TRIBUTARY_LOCAL_WORLD_SIZE or LOCAL_WORLD_SIZE, else all of
// them when the coordinator is this host's loopback, else one.
int local_ranks(const BackendContext& context);

// The ranks a backend found on this process's machine and the CPUs they may run on between them
// (algorithms::HostLayout::machine_of): the ranks on this kernel, since network namespaces or
// containers of one machine count only their own ranks in LOCAL_WORLD_SIZE but share its cores,
// and the union of those ranks' affinities (core/cpus.h), since taskset, a cgroup cpuset or a
// launcher's binding may give them fewer CPUs than the machine has. 0 = unknown.
struct MachineShare {
  int ranks = 0;
  int cpus = 0;
  bool operator==(const MachineShare&) const = default;
};
// Whether `machine.ranks` outnumber `machine.cpus` (unknown: the machine's online CPUs). Every rank
// of one machine that learned the same layout gets the same answer (shared memory's single-copy
// threshold depends on it and must agree).
bool oversubscribed(MachineShare machine);

// How long a wait polls before sleeping, from a backend's `poll` option: "on" `on` (50 us unless
// the backend says otherwise), "off" none, "auto" `on` unless this host is oversubscribed() with
// the larger of local_ranks() and `machine.ranks` as its ranks (polling would then steal the CPU
// from the peers), "always" the whole wait (kPollAlways: Open MPI's and Gloo busy_poll's way, one
// core per waiting rank).
inline constexpr std::chrono::nanoseconds kPollAlways = std::chrono::hours(24 * 365);
inline constexpr std::chrono::nanoseconds kPollOn = std::chrono::microseconds(50);
// How long a poll looks without pause before it calls sched_yield() between looks. A rank woken by
// its peer is often placed on the peer's core by the scheduler (wake-affine), where it cannot run
// while the peer polls for its answer: every step of a collective then costs the peer's whole poll,
// until the load balancer moves one of them milliseconds later. Measured on a 2-vCPU VM, 2
// processes, in the 20 timed iterations that follow a line that slept (tributary-bench's raw Gloo
// line), 4 KiB all-reduces took 60-70 us over shared memory and TCP with 50 us of pure poll (about
// 150 with a poll let grow to 250 us) against 2 and 7 alone; yielding after 2 us, 4.5-11 and about
// 20 where the trap was met, and no change alone (six interleaved runs each, 2026-12-06); both
// ranks pinned to one core (taskset -c 0), 4.8 us against 62. A yield lets a peer on this core run
// at once; alone on its core it returns at once. Shared memory's and TCP's waits do this; ucx's
// wait 20 us first, since yields within its short waits cost more than they saved (4 KiB 13-17 us
// against 6-8 with 2 us); on one core ucx then takes 26-34 us per 4 KiB all-reduce instead of 1 ms.
// poll=always (kPollAlways) polls without yielding, as it says.
inline constexpr std::chrono::nanoseconds kPollAlone = std::chrono::microseconds(2);
std::chrono::nanoseconds poll_duration(const std::string& mode, const BackendContext& context,
                                       std::chrono::nanoseconds on = kPollOn,
                                       MachineShare machine = {});
// How long a wait then polls with sched_yield() before sleeping: 1 ms when `mode` is "auto" and
// this host runs more ranks than it has cores (the rank being waited for gets the core, and no
// wake-up is paid when it answers, as Open MPI does when oversubscribed), else none.
std::chrono::nanoseconds yield_duration(const std::string& mode, const BackendContext& context,
                                        MachineShare machine = {});

// The local address (IPv4 or IPv6, as text) of the interface that routes to `coordinator`; no
// packet is sent. Loopback coordinators ("", "localhost", 127.x, "::1") give the loopback of their
// family. When the coordinator's name resolves to this host's loopback (Debian maps its own name to
// 127.0.1.1), the first non-loopback address of the same family is taken instead, so that other
// hosts can reach what is published.
std::string interface_towards(const std::string& coordinator);
// A backend's host= option: empty (the default), or an IP address of this machine, checked by
// binding to it, so that a typo fails at creation on every path (with shared memory only, the
// address would otherwise never be used). `who` starts the message ("backend 'ring'").
Status check_listen_address(const std::string& host, const std::string& who);

// This host's identity, compared at rendezvous to find the peers that can share memory: the
// TRIBUTARY_HOST_ID setting when given (tests give each "host" its own), else hostname + kernel
// boot id + the PID and IPC namespaces (processes that cannot see each other's /proc or memory are
// on different "hosts" for this purpose, even on one machine).
std::string host_id(const Config& config);

// For a process that will not create the backend it was to create (`backend`, e.g. "ring"): says
// so at the next meeting of the job's backends (BackendRegistry::create), so that the others fail
// at once naming this rank and `failure`, rather than waiting for it until their timeout. Returns
// `failure`.
Status announce_setup_failure(const BackendContext& context, const std::string& backend,
                              const Status& failure);
// The same for a process whose spec or settings `spec` was refused before it joined the job
// (BackendRegistry::check, which the tools and strategies call first): with several processes, it
// joins (waiting at most 15 s for the store) only to announce the refusal. Returns `refused`.
Status refuse_everywhere(const std::vector<Device>& devices, const Config& config,
                         std::string_view spec, const Status& refused);

// The numbering of a context's multi-process backends (instance_store) and of their meetings
// before setup (BackendRegistry::create): 0, 1, 2, ... per process, in creation order. Kept in the
// job's store (a counter per rank), so that it starts again with a fresh store (a job restarted
// against a long-lived rank 0 starts from 0 on every rank) and is shared by every context of the
// job in this process, however long each is kept; without a store, in the context.
enum class Numbering { kInstances, kSetups };
StatusOr<uint64_t> take_number(const BackendContext& context, Numbering which);
// How many were taken, without taking one.
StatusOr<uint64_t> numbers_taken(const BackendContext& context, Numbering which);

// The store scope of the next instance of `backend` created from `context`: "<backend>/<n>/", n
// counting the multi-process instances made from this context, so that every rank, creating its
// backends in the same order, meets its peers under the same keys. Fails when the context has no
// store (a world of several processes needs one).
StatusOr<std::shared_ptr<PrefixStore>> instance_store(const BackendContext& context,
                                                      const std::string& backend);

// The store key under which the job's store lists lost ranks: each process's TcpStore client
// leaves a last will (Store::set_last_will) that appends "rank R (pid P on host H)" to it when the
// process dies or its connection drops. make_backend_context sets it up.
inline constexpr char kLostRanksKey[] = "tributary/lost";
// The value of this process's will.
std::string lost_rank_text(int rank);

// Root cause to every rank. When a collective or a backend's setup failed in a job of several
// processes with a store that keeps wills (context.lost_key), asks the store whether any rank was
// lost, waiting up to `grace` for the store to learn of it. If so, returns `failure` with the lost
// ranks named first ("rank 3 (pid ... on host ...) was lost ...; what rank 1 saw: ..."), so that
// every survivor blames the rank that died, not the neighbour whose connection broke second. If the
// store itself no longer answers, names rank 0, which hosts it. Anything else (an error that is
// not about peers, a message that already names a lost rank, no wills) returns `failure` as is.
Status name_lost_ranks(const BackendContext& context, Status failure,
                       std::chrono::milliseconds grace = std::chrono::seconds(2));

// The listening socket a launcher bound for this process's server and handed down
// (TRIBUTARY_STORE_FD in `config`; tools/launcher.h: the socket tributary-run binds on MASTER_PORT
// for rank 0's rendezvous store, and a parameter-server task's), to pass as
// TcpStoreServerOptions::listen_fd; or -1, and the server binds `port` as usual. Taken at most once
// per socket in this process, and only when it is a TCP socket listening on `port`; -1 for a
// process that inherited the variable without the socket, or with another descriptor under that
// number, or whose server took it already. Nothing is changed on a socket it does not take.
int inherited_listener(const Config& config, int port);
// For the error of a server that could not listen on `port`: why, when this process holds the
// port itself in the socket TRIBUTARY_STORE_FD (of `config`, else of the environment) names: "
// (this process already serves on the port: ...)" when one of its servers took it, else " (this
// process holds the port itself: ...; or `hint`)"; "" when it holds no such socket.
std::string held_port_trouble(const Config& config, int port, const std::string& hint);

}  // namespace tributary::internal
