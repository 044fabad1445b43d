// Host layout and the hierarchy rule (algorithms/host_layout.h): ranks as threads meeting on a
// MemoryStore, each told its host by TRIBUTARY_HOST_ID. The compositions themselves run on real
// processes and network namespaces in the backends' multi-host conformance cases.
#include "algorithms/host_layout.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collectives.h"
#include "core/cpus.h"
#include "core/kernel_id.h"
#include "core/strings.h"

namespace tributary::algorithms {
namespace {

using namespace std::chrono_literals;

// Every rank's learn_hosts() result, rank r on host hosts[r] with agreement agreements[r].
std::vector<StatusOr<HostLayout>> learn_all(const std::vector<std::string>& hosts,
                                            const std::vector<std::string>& agreements,
                                            std::chrono::nanoseconds timeout = 5s) {
  auto store = std::make_shared<MemoryStore>();
  const int world = static_cast<int>(hosts.size());
  std::vector<StatusOr<HostLayout>> out(static_cast<size_t>(world),
                                        StatusOr<HostLayout>(internal_error("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      BackendContext ctx;
      ctx.rank = r;
      ctx.world_size = world;
      ctx.config.set("TRIBUTARY_HOST_ID", hosts[static_cast<size_t>(r)]);
      out[static_cast<size_t>(r)] =
          learn_hosts(*store, ctx, "test", agreements[static_cast<size_t>(r)], timeout);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

HostLayout layout_of(std::vector<std::vector<int>> members) {
  HostLayout l;
  l.members = std::move(members);
  int world = 0;
  for (const auto& m : l.members) world += static_cast<int>(m.size());
  l.host_of.resize(static_cast<size_t>(world));
  for (size_t h = 0; h < l.members.size(); ++h) {
    for (int r : l.members[h]) l.host_of[static_cast<size_t>(r)] = static_cast<int>(h);
  }
  return l;
}

TEST(HostLayout, HostsAreNumberedByTheirLowestRankAndListTheirRanks) {
  const auto got = learn_all({"b", "a", "b", "c", "a"}, std::vector<std::string>(5, "x"));
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->host_of, (std::vector<int>{0, 1, 0, 2, 1}));
    EXPECT_EQ(g->members, (std::vector<std::vector<int>>{{0, 2}, {1, 4}, {3}}));
    EXPECT_FALSE(g->uniform());
  }
}

TEST(HostLayout, ARankThatDisagreesFailsEveryRankThatReadsItNamingBoth) {
  const auto got =
      learn_all({"a", "a", "b"}, {"hierarchy=auto", "hierarchy=off", "hierarchy=auto"});
  for (int r : {0, 2}) {
    const auto& g = got[static_cast<size_t>(r)];
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("rank 1 uses hierarchy=off but rank " + std::to_string(r) +
                                        " hierarchy=auto"),
              std::string::npos)
        << g.status().message();
  }
  ASSERT_FALSE(got[1].ok());  // it reads ranks 0 and 2
}

TEST(HostLayout, ARankThatNeverJoinsIsNamedAtTheDeadline) {
  auto store = std::make_shared<MemoryStore>();
  BackendContext ctx;
  ctx.rank = 0;
  ctx.world_size = 2;
  ctx.config.set("TRIBUTARY_HOST_ID", "a");
  const auto got = learn_hosts(*store, ctx, "test", "x", 200ms);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("rank 1 did not join"), std::string::npos)
      << got.status().message();
}

TEST(HostLayout, AutoTakesTheHierarchyOnlyForSeveralHostsOfSeveralProcessesEach) {
  auto use = [](const std::string& mode, std::vector<std::vector<int>> members) {
    auto r = use_hierarchy("test", mode, layout_of(std::move(members)));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() && *r;
  };
  EXPECT_TRUE(use("auto", {{0, 1}, {2, 3}}));
  EXPECT_TRUE(use("auto", {{0, 2, 4}, {1, 3, 5}, {6, 7, 8}}));
  EXPECT_FALSE(use("auto", {{0, 1, 2, 3}}));       // one host
  EXPECT_FALSE(use("auto", {{0}, {1}, {2}}));      // one process per host
  EXPECT_FALSE(use("auto", {{0, 1}, {2, 3, 4}}));  // uneven
  EXPECT_FALSE(use("off", {{0, 1}, {2, 3}}));
  EXPECT_TRUE(use("on", {{0, 1, 2, 3}}));
  EXPECT_TRUE(use("on", {{0}, {1}}));
}

TEST(HostLayout, OnWithUnevenHostsIsRefusedNamingTheCounts) {
  const auto r = use_hierarchy("ucx", "on", layout_of({{0, 1}, {2, 3, 4}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("backend 'ucx': hierarchy=on needs the same number of "
                                      "processes on every host, but the hosts run 2, 3"),
            std::string::npos)
      << r.status().message();
}

// Every rank learns every rank's kernel: here, threads of one process, one kernel on every "host".
TEST(HostLayout, EveryRankLearnsEveryRanksKernel) {
  const auto got = learn_all({"a", "b", "a"}, std::vector<std::string>(3, "x"));
  const std::string mine = internal::kernel_id();
  ASSERT_FALSE(mine.empty()) << "no /proc/sys/kernel/random/boot_id here";
  for (const auto& r : got) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->kernel_of, std::vector<std::string>(3, mine));
    EXPECT_EQ(r->host_of, (std::vector<int>{0, 1, 0}));  // the kernel does not merge hosts
    // Two "hosts" of one kernel (network namespaces of one machine): sliced, as within a host.
    EXPECT_EQ(ring_slice_bytes(0, *r, {0, 1}), 0u);
    // And they share its cores: threads of this process, each with this process's CPUs.
    EXPECT_EQ(r->cpus_of,
              std::vector<std::string>(3, internal::cpu_list_text(internal::affinity_cpus())));
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(r->machine_of(rank).ranks, 3);
      EXPECT_EQ(r->machine_of(rank).cpus, internal::usable_cpus());
    }
  }
}

// slice_bytes=0 (auto) slices a ring whose ranks share one host or one kernel and no other; a
// configured size holds anywhere.
TEST(HostLayout, RingSlicesByDefaultOnlyWithinOneHostOrKernel) {
  const HostLayout two_hosts = layout_of({{0, 1}, {2, 3}});
  EXPECT_EQ(ring_slice_bytes(0, two_hosts, {0, 1}), 0u);  // a host's local group: auto
  EXPECT_EQ(ring_slice_bytes(0, two_hosts, {2, 3}), 0u);
  EXPECT_EQ(ring_slice_bytes(0, two_hosts, {0, 2}), kNoSlices);  // across hosts: whole
  EXPECT_EQ(ring_slice_bytes(0, two_hosts, {0, 1, 2, 3}), kNoSlices);
  EXPECT_EQ(ring_slice_bytes(0, layout_of({{0, 1, 2}}), {0, 1, 2}), 0u);
  EXPECT_EQ(ring_slice_bytes(size_t{1} << 20, two_hosts, {0, 2}), size_t{1} << 20);
  // Kernels known: hosts on one kernel slice, on two do not, and an unknown kernel never matches.
  HostLayout namespaces = two_hosts;
  namespaces.kernel_of = {"k", "k", "k", "k"};
  EXPECT_EQ(ring_slice_bytes(0, namespaces, {0, 2}), 0u);
  EXPECT_EQ(ring_slice_bytes(0, namespaces, {0, 1, 2, 3}), 0u);
  HostLayout machines = two_hosts;
  machines.kernel_of = {"k", "k", "m", "m"};
  EXPECT_EQ(ring_slice_bytes(0, machines, {0, 2}), kNoSlices);
  EXPECT_EQ(ring_slice_bytes(0, machines, {0, 1}), 0u);
  HostLayout unknown = two_hosts;
  unknown.kernel_of = {"", "", "", ""};
  EXPECT_EQ(ring_slice_bytes(0, unknown, {0, 2}), kNoSlices);
}

// The ranks that share a rank's cores: those of its kernel when known, else those of its host.
TEST(HostLayout, RanksOnAKernelAreCountedByKernelElseByHost) {
  HostLayout l = layout_of({{0, 1}, {2, 3, 4}});
  EXPECT_EQ(l.machine_of(0).ranks, 2);  // kernels not learned: the host
  EXPECT_EQ(l.machine_of(3).ranks, 3);
  l.kernel_of = {"k", "k", "k", "m", "m"};  // rank 2 is on host 1 but on kernel k
  EXPECT_EQ(l.machine_of(0).ranks, 3);
  EXPECT_EQ(l.machine_of(2).ranks, 3);
  EXPECT_EQ(l.machine_of(4).ranks, 2);
  l.kernel_of = {"", "", "", "", ""};
  EXPECT_EQ(l.machine_of(4).ranks, 3);
}

// A machine's CPUs are the union of its ranks' affinities: ranks under one taskset share them,
// ranks bound to a core each add theirs. Unknown (or unreadable) for any of them: unknown.
TEST(HostLayout, AMachinesCpusAreTheUnionOfItsRanksAffinities) {
  HostLayout l = layout_of({{0, 1}, {2, 3, 4}});
  l.kernel_of = {"k", "k", "k", "m", "m"};
  l.cpus_of = {"0", "0", "0-1", "4", "5"};
  EXPECT_EQ(l.machine_of(0).cpus, 2);  // {0} + {0} + {0, 1}
  EXPECT_EQ(l.machine_of(2).cpus, 2);
  EXPECT_EQ(l.machine_of(3).cpus, 2);  // bound to a core each: {4} + {5}
  l.cpus_of = {"0", "0", "0", "4", "4"};
  EXPECT_EQ(l.machine_of(1).cpus, 1);  // three ranks under one `taskset -c 0`
  l.cpus_of = {"0", "", "0", "4", "5"};
  EXPECT_EQ(l.machine_of(0).cpus, 0);
  EXPECT_EQ(l.machine_of(3).cpus, 2);  // the other machine's ranks are all known
  l.cpus_of = {"0", "x", "0", "4", "5"};
  EXPECT_EQ(l.machine_of(0).cpus, 0);
  l.cpus_of.clear();  // not learned
  EXPECT_EQ(l.machine_of(0), (internal::MachineShare{3, 0}));
}

// A rank that publishes no CPUs (an older tributary: "agreement|kernel|host", its host id holding a
// '|' or not), or CPUs that are no cpulist, fails the setup with a message saying so and showing
// no more than an excerpt of what it published.
TEST(HostLayout, AnEntryWithoutAValidCpuListIsRefusedNamingTheRank) {
  const std::string kernel = internal::kernel_id();
  for (const std::string& entry :
       {"x|" + kernel + "|a", "x|" + kernel + "|a|b", "x|" + kernel + "|0-|a",
        "x|" + kernel + "|" + std::string(100000, '1') + "|a",
        "x|" + kernel + "|" + std::string(70000, ',') + "|a"}) {
    MemoryStore store;
    ASSERT_TRUE(store.set("host/1", entry).ok());
    BackendContext ctx;
    ctx.rank = 0;
    ctx.world_size = 2;
    ctx.config.set("TRIBUTARY_HOST_ID", "a");
    const auto got = learn_hosts(store, ctx, "test", "x", 5s);
    ASSERT_FALSE(got.ok()) << internal::excerpt(entry);
    EXPECT_NE(got.status().message().find("rank 1 published"), std::string::npos)
        << got.status().message();
    EXPECT_NE(got.status().message().find("same version of tributary"), std::string::npos);
    EXPECT_LT(got.status().message().size(), 600u);
  }
}

// The per-peer flags a backend hands its TCP transport: same kernel, by position in `members`.
TEST(HostLayout, SameKernelFlagsFollowTheMembersOrder) {
  HostLayout l = layout_of({{0, 1}, {2, 3, 4}});
  EXPECT_EQ(l.same_kernel_as(0, {0, 2, 4}), (std::vector<bool>{false, false, false}));  // unknown
  l.kernel_of = {"k", "k", "k", "m", "m"};
  EXPECT_EQ(l.same_kernel_as(0, {0, 2, 4}), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(l.same_kernel_as(3, {2, 3, 4}), (std::vector<bool>{false, true, true}));
  l.kernel_of = {"", "", "", "", ""};
  EXPECT_EQ(l.same_kernel_as(0, {0, 1}), (std::vector<bool>{false, false}));
}

}  // namespace
}  // namespace tributary::algorithms
