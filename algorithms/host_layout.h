// Where the processes of a group run, and the hierarchical composition built on it, shared by every
// multi-process backend whose groups are ProcessGroups (ring, ucx).
//
//  - learn_hosts(): every rank publishes its host id (core/rendezvous.h: hostname, boot id and
//    namespaces, or TRIBUTARY_HOST_ID), its kernel's boot id (never overridden) and the CPUs it may
//    run on (its affinity, core/cpus.h) with the settings every rank must share (`agreement`, e.g.
//    "intra_host=shm,hierarchy=auto") as "agreement|kernel|cpus|host" under "host/<rank>" of the
//    backend instance's store, and reads every rank's. Hosts are numbered in the order of their
//    lowest rank; a rank whose agreement differs fails the setup on every rank that reads it,
//    naming both.
//  - use_hierarchy(): the `hierarchy` option's rule. auto takes the hierarchy when there are
//    several hosts and every host runs the same number of processes, more than one. That is what
//    the alpha-beta cost model gives at every size: against a flat ring over all H x L ranks, the
//    hierarchy moves 1/L of the bytes across hosts per process, and its H-host steps are fewer
//    than the flat ring's H x L, so both terms are smaller (the same-host stages are on shared
//    memory or the host's loopback, cheaper than the network in both). on forces it (an uneven
//    layout is an error naming the counts); off never takes it.
//  - hierarchical_group(): the HierarchicalGroup (hierarchical_group.h) of this layout, its local
//    group among this host's processes (under the store prefix "host<h>/") and its cross group
//    among the processes of this local rank, one per host (under "cross<l>/"), each made by the
//    backend's own maker. A group of one rank is not made.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/process_group.h"
#include "core/rendezvous.h"
#include "tributary/options.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary::algorithms {

struct HostLayout {
  std::vector<int> host_of;  // host index per rank (hosts in order of their lowest rank)
  std::vector<std::vector<int>> members;  // ranks per host, ascending
  // Each rank's kernel (internal::kernel_id(), core/kernel_id.h; "" unknown): ranks on different
  // hosts with the same one are containers or network namespaces of one machine, whose TCP
  // connections never leave its memory. Empty when not learned.
  std::vector<std::string> kernel_of;
  // Each rank's CPUs (its affinity as a cpulist, "0-3,8"; "" unknown). Empty when not learned.
  std::vector<std::string> cpus_of;
  int hosts() const { return static_cast<int>(members.size()); }
  // Every host runs the same number of processes.
  bool uniform() const;
  // How many ranks share `rank`'s machine, and so its cores (those with its kernel when that is
  // known, else those of its host), and the CPUs they may run on between them (the union of their
  // affinities; 0 when any of them is unknown), for the oversubscription rule
  // (internal::oversubscribed): ranks started under one `taskset -c 0` share one CPU, ranks bound
  // to a core each do not.
  internal::MachineShare machine_of(int rank) const;
  // For each of `members` (global ranks): whether it runs on `rank`'s kernel (false when either
  // kernel is unknown).
  std::vector<bool> same_kernel_as(int rank, const std::vector<int>& members) const;
};

// What this process publishes under "host/<rank>": "agreement|kernel|cpus|host".
std::string host_entry(const Config& config, const std::string& agreement);

StatusOr<HostLayout> learn_hosts(Store& store, const BackendContext& context,
                                 const std::string& backend, const std::string& agreement,
                                 std::chrono::nanoseconds timeout);

// The `hierarchy` option (auto, on, off), for a backend's option list.
// `flat`: what off means for this backend, e.g. "one flat group: shared memory on one host, else
// TCP between every pair".
OptionDef hierarchy_option(const std::string& flat);

// Whether `layout` takes the hierarchy under the option's `mode`; an error for on with an uneven
// layout.
StatusOr<bool> use_hierarchy(const std::string& backend, const std::string& mode,
                             const HostLayout& layout);

// AlgorithmContext::slice_bytes for a ring among `members` (global ranks) from the `slice_bytes`
// option: a configured size as it is; auto (0) slices only when every member is on one host, or on
// one machine's kernel (network namespaces or containers of one machine, whose TCP moves through
// memory), where the gain is in the caches and each slice's extra round trips are cheap
// (collectives.h), and otherwise takes every message whole (kNoSlices). Unsliced, a ring of 2
// namespaces of one 2-vCPU VM moved 1.0-1.3 GB/s at 16 and 64 MiB, sliced 2.8-3.9.
size_t ring_slice_bytes(uint64_t configured, const HostLayout& layout,
                        const std::vector<int>& members);

// Makes the group of the processes `members` (global ranks, in group-rank order), this process
// being members[index], meeting under `store`.
using GroupMaker = std::function<StatusOr<std::unique_ptr<ProcessGroup>>(
    Store& store, int index, const std::vector<int>& members)>;

StatusOr<std::unique_ptr<ProcessGroup>> hierarchical_group(const std::shared_ptr<Store>& store,
                                                           const BackendContext& context,
                                                           const HostLayout& layout,
                                                           const GroupMaker& make_local,
                                                           const GroupMaker& make_cross);

}  // namespace tributary::algorithms
