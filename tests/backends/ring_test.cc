// The ring backend (TCP between hosts, shared memory between the processes of one host) in the
// multi-process conformance suite, on one host and on several (network namespaces). Its failure
// paths are in tests/multiprocess/fault_test.cc.
#include "tests/multiprocess/conformance.h"

// What the suite expects ring to run, rather than what ring says it runs.
TEST(RingCapabilities, EveryCollectiveOpAndDtypeOnCpu) {
  tributary::testing::expect_every_cpu_capability("ring");
}

// Every process here is on one host: "ring" goes through shared memory, intra_host=net through TCP.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(Ring, "ring");
// The slots for every collective (auto's all-reduces over 16 KiB take single copy), in chunks of
// 4 KiB.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingShmSmallChunks,
                                   "ring:shm_chunk_bytes=4KiB,shm_single_copy=off");
// Every all-reduce over 16 KiB reads the peers' inputs and writes into their outputs (auto does so
// only from 256 KiB where the suite's ranks outnumber the cores), in blocks of 4 KiB: many blocks
// per piece, and short last pieces.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingShmSingleCopy, "ring:shm_single_copy=on,shm_chunk_bytes=4KiB");
// Buffers from Buffer::allocate_shareable, every all-reduce's outputs registered: the direct path
// (each rank reduces its piece from every rank's buffer and writes it into all), in blocks of 4 KiB.
TRIBUTARY_MULTIPROCESS_CONFORMANCE_SHAREABLE(RingShmDirect, "ring:shm_chunk_bytes=4KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingNet, "ring:intra_host=net");
// Every segment of 64 KiB or more sent from the caller's pages (zero_copy=auto, the default, does
// so only from 2 MiB messages, larger than the suite's).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingNetZeroCopy, "ring:intra_host=net,zero_copy=on");
// Small segments and slices: a 65537-element all-reduce runs as several slices of several segments.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingForcedRing,
                                   "ring:intra_host=net,algorithm=ring,segment_bytes=4KiB,"
                                   "slice_bytes=16KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingHalvingDoubling,
                                   "ring:intra_host=net,algorithm=halving_doubling");
// Striped and authenticated: every frame of every stripe carries a MAC.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingThreeSocketsAuthenticated,
                                   "ring:intra_host=net,sockets_per_peer=3,"
                                   "authenticate_frames=true");

// Several hosts: hierarchical by default where a host runs several processes (shared memory inside
// a host, TCP between hosts), flat where it is forced off or each host runs one, and hierarchical
// again where forced on: one process per host (no group inside a host), or one host (no group
// across hosts).
TRIBUTARY_MULTIHOST_CONFORMANCE(
    Ring, HostsParam{"ring:algorithm=auto", 2, 2, 1}, HostsParam{"ring:hierarchy=on", 2, 1, 2},
    HostsParam{"ring:hierarchy=on", 1, 3, 1}, HostsParam{"ring:algorithm=auto", 2, 2, 2},
    HostsParam{"ring:intra_host=net", 2, 2, 1}, HostsParam{"ring:algorithm=ring", 3, 2, 1},
    HostsParam{"ring:hierarchy=off", 2, 2, 1}, HostsParam{"ring:algorithm=auto", 2, 1, 1});

// A rank killed on another "host", flat and hierarchical.
TRIBUTARY_MULTIHOST_FAULTS(Ring, "ring", "ring:hierarchy=off");

// ---- batch_reduce's packs over shared memory ---------------------------------------------------
// Where the processes share a host, ring stages batch_reduce's packs in shareable memory registered
// with its group (registered anew as it grows), so that a pack over 16 KiB takes the direct path:
// every rank reduces its share of the pack straight from every rank's staging buffer. Checked here
// on packs that grow across calls (2 then 3 tensors, so the staging buffer is registered twice),
// with results exact on 3 processes x 2 replicas.
#include <sched.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "algorithms/process_group_ops.h"
#include "core/cpus.h"
#include "tests/multiprocess/harness.h"
#include "transports/shm/shm_group.h"

namespace tributary::testing {
namespace {

TEST(RingBatchReduce, PacksOverSharedMemoryTakeTheDirectPath) {
  const std::string dir = make_temp_dir("ring_packs");
  GroupResult g = run_group(3, std::chrono::seconds(120), [&](int rank) {
    auto ctx = group_context(rank, 3, 2, dir);
    if (!ctx.ok()) return kChildFailed;
    auto ops = builtin_backends().create("ring:timeout=60s", *ctx);
    if (!ops.ok()) return kChildFailed;
    const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(ops->get());
    const auto* shm = pg ? dynamic_cast<const transports::shm::ShmGroup*>(pg->group()) : nullptr;
    if (shm == nullptr) return kChildFailed;
    const int64_t count = 100003;
    int wrong = 0;
    for (int tensors : {2, 3}) {
      // values[t][k]: tensor t of local replica k, every element global replica + t + 1.
      std::vector<std::vector<std::vector<float>>> values(static_cast<size_t>(tensors));
      std::vector<std::vector<float>> results(static_cast<size_t>(tensors),
                                              std::vector<float>(static_cast<size_t>(count)));
      std::vector<ReducePair> pairs;
      for (int t = 0; t < tensors; ++t) {
        PerReplica<Tensor> v;
        for (int k = 0; k < 2; ++k) {
          values[static_cast<size_t>(t)].emplace_back(static_cast<size_t>(count),
                                                      static_cast<float>(rank * 2 + k + t + 1));
          v.values().emplace_back(values[static_cast<size_t>(t)].back().data(), DType::kFloat32,
                                  count, ctx->devices[static_cast<size_t>(k)]);
        }
        pairs.push_back(ReducePair{
            v, Mirrored<Tensor>{Tensor(results[static_cast<size_t>(t)].data(), DType::kFloat32,
                                       count, ctx->devices[0])}});
      }
      const Status s = (*ops)->batch_reduce(ReduceOp::kSum, pairs).wait(std::chrono::seconds(60));
      if (!s.ok()) {
        std::fprintf(stderr, "[rank %d] %s\n", rank, s.to_string().c_str());
        return kChildFailed;
      }
      for (int t = 0; t < tensors; ++t) {
        const float want = static_cast<float>(21 + 6 * t);  // sum of g + t + 1 over g = 0..5
        for (float x : results[static_cast<size_t>(t)]) wrong += x != want;
      }
      if (!shm->registered_direct(~uint64_t{0})) {
        std::fprintf(stderr, "[rank %d] %d tensors: the packs did not take the direct path (%s)\n",
                     rank, tensors, shm->describe_registration(~uint64_t{0}).c_str());
        return kChildFailed;
      }
    }
    if (wrong != 0) std::fprintf(stderr, "[rank %d] %d wrong elements\n", rank, wrong);
    return wrong == 0 ? kChildOk : kChildFailed;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

// ---- shm_single_copy=auto follows the CPUs the ranks may run on -------------------------------
// Every rank publishes its affinity at setup, and the union over the machine's ranks counts: two
// ranks pinned to one CPU (as under `taskset -c 0`) are oversubscribed and take single copy from
// 256 KiB, two pinned to two CPUs take it over 16 KiB, whatever the machine's CPU count. Each rank
// pins itself to cpus[rank] and checks that its shared-memory group says `want`. Auto also times
// the kernel's copies at setup: where they were slow (as on this project's AMD VM), the group
// says so and that it took single copy from past the caches instead of `want`, which it still
// names; either way, every rank must report the same measurement, and all-reduces of 1 MiB (in
// auto's range or not, by what was measured) must agree: a rank on another threshold than its
// peer would fail them with a mismatch.
void expect_single_copy_threshold(const std::vector<int>& cpus, const std::string& want) {
  const std::string dir = make_temp_dir("ring_threshold");
  GroupResult g = run_group(2, std::chrono::seconds(120), [&](int rank) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(cpus[static_cast<size_t>(rank)], &mask);
    if (sched_setaffinity(0, sizeof mask, &mask) != 0) return kChildFailed;
    auto ctx = group_context(rank, 2, 1, dir);
    if (!ctx.ok()) return kChildFailed;
    auto ops = builtin_backends().create("ring:timeout=60s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return kChildFailed;
    }
    const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(ops->get());
    const auto* shm = pg ? dynamic_cast<const transports::shm::ShmGroup*>(pg->group()) : nullptr;
    if (shm == nullptr) return kChildFailed;
    const int64_t count = int64_t{1} << 18;  // 1 MiB of float32
    std::vector<float> x(static_cast<size_t>(count), static_cast<float>(rank + 1));
    PerReplica<Tensor> v{Tensor(x.data(), DType::kFloat32, Shape{count})};
    for (int i = 0; i < 2; ++i) {
      const Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(std::chrono::seconds(60));
      if (!s.ok() || x.front() != 3.0f * static_cast<float>(1 << i) || x.back() != x.front()) {
        std::fprintf(stderr, "[rank %d] all-reduce %d: %s, %g\n", rank, i, s.to_string().c_str(),
                     static_cast<double>(x.front()));
        return kChildFailed;
      }
    }
    const std::string text = shm->describe();
    const size_t measured = text.find("the kernel's copies between processes took ");
    const bool slow =
        text.find("single copy only for buffers past the caches") != std::string::npos;
    const std::string named = slow ? "instead of " + want : "all-reduces " + want;
    if (measured != std::string::npos && text.find(named) != std::string::npos) {
      // Each rank leaves what it says for the parent, which compares them.
      const std::string mine = text.substr(measured);
      const std::string path = dir + "/described" + std::to_string(rank);
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fputs(mine.c_str(), f);
        std::fclose(f);
        return kChildOk;
      }
    }
    std::fprintf(stderr, "[rank %d] want the measurement and '%s' in: %s\n", rank, named.c_str(),
                 text.c_str());
    return kChildFailed;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
  auto read = [&](int rank) {
    std::ifstream in(dir + "/described" + std::to_string(rank));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_FALSE(read(0).empty());
  EXPECT_EQ(read(0), read(1)) << "the ranks took different single-copy thresholds";
}

// This process's CPUs, or why the test cannot run (a reason to skip).
std::vector<int> cpus_for_threshold_test(size_t needed, std::string& why) {
  if (why = why_siblings_cannot_read_each_other(); !why.empty()) {
    why = "single copy is refused here: " + why;
    return {};
  }
  std::vector<int> cpus = internal::affinity_cpus(&why);
  if (!cpus.empty() && cpus.back() >= CPU_SETSIZE) why = "a CPU is past cpu_set_t";
  if (why.empty() && cpus.size() < needed) {
    why = "this process may run on " + std::to_string(cpus.size()) + " CPU(s), the test needs " +
          std::to_string(needed);
  }
  return why.empty() ? cpus : std::vector<int>{};
}

TEST(RingSingleCopy, TwoRanksOnOneCpuTakeItFrom256KiB) {
  std::string why;
  const std::vector<int> cpus = cpus_for_threshold_test(1, why);
  if (!why.empty()) GTEST_SKIP() << why;
  expect_single_copy_threshold({cpus[0], cpus[0]}, "from 256KiB");
}

TEST(RingSingleCopy, TwoRanksOnTwoCpusTakeItOver16KiB) {
  std::string why;
  const std::vector<int> cpus = cpus_for_threshold_test(2, why);
  if (!why.empty()) GTEST_SKIP() << why;
  expect_single_copy_threshold({cpus[0], cpus[1]}, "over 16KiB");
}

}  // namespace
}  // namespace tributary::testing
