// The nccl backend and GPU tensors through the front door: what runs without a GPU (refusals with
// their reasons, the topology grouping), and what needs one (NCCL's setup deadline, Work completion
// on CUDA events, wait_stream, strategies on GPUs). Without a visible GPU the GPU cases are skips
// that say why. The collectives' results are checked by gpu_conformance_test.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/hierarchical_copy/hierarchical_copy_ops.h"
#include "core/gpu.h"
#include "tests/gpu/skip.h"
#include "tests/multiprocess/conformance.h"
#include "tributary/registry.h"
#include "tributary/store.h"
#include "tributary/strategy/distributed_input.h"
#include "tributary/strategy/strategies.h"

#if defined(TRIBUTARY_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tributary {
namespace {

#define SKIP_WITHOUT_NCCL(r)                                                                  \
  if ((r).find("nccl") == nullptr) {                                                          \
    GTEST_SKIP() << "tributary was built without NCCL (-DTRIBUTARY_WITH_NCCL)";               \
  }

TEST(GpuRuntime, InfoSaysWhatWasBuiltAndWhatIsVisible) {
  gpu::RuntimeInfo info = gpu::runtime_info();
#if defined(TRIBUTARY_HAVE_CUDA)
  EXPECT_TRUE(info.built);
  EXPECT_GE(info.runtime_version, 12000);
#else
  EXPECT_FALSE(info.built);
#endif
  EXPECT_EQ(info.device_count, cuda_device_count());
  EXPECT_EQ(static_cast<int>(info.devices.size()), info.device_count);
  if (info.device_count == 0) {
    EXPECT_FALSE(info.error.empty());
  }
}

TEST(GpuRuntime, AGpuTheProcessCannotSeeIsAClearError) {
  const Device beyond = Device::cuda(cuda_device_count());
  Status s = gpu::check_visible(beyond);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(beyond.to_string() + " is not usable"), std::string::npos)
      << s.message();
  auto b = Buffer::allocate(DType::kFloat32, Shape{4}, beyond);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(gpu::check_visible(Device::cpu(0)).ok());
}

TEST(Nccl, RefusesWhenNoGpuIsVisible) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: the refusal cannot happen here";
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  auto made = r.create("nccl", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(made.status().message().find("no CUDA device is visible"), std::string::npos)
      << made.status().message();
  EXPECT_NE(made.status().message().find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST(Nccl, AnUnknownLaunchModeIsRefusedWithTheChoices) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  auto made = r.create("nccl:launch=eager", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << made.status().message();
  EXPECT_NE(made.status().message().find("launch"), std::string::npos) << made.status().message();
  EXPECT_NE(made.status().message().find("nonblocking"), std::string::npos)
      << made.status().message();
  EXPECT_NE(made.status().message().find("blocking"), std::string::npos)
      << made.status().message();
}

TEST(Nccl, RefusesCpuDevicesNamingTheDeviceType) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  BackendContext ctx;
  ctx.devices = {Device::cpu(0)};
  auto made = r.create("nccl", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("does not support CPU devices"), std::string::npos)
      << made.status().message();
}

// --- topology grouping (no GPU needed) -----------------------------------------------------------

std::vector<std::vector<backends::GpuLink>> links_of(int n, auto fast, int fast_rank = 0,
                                                     int slow_rank = 1, bool slow_access = true) {
  std::vector<std::vector<backends::GpuLink>> l(static_cast<size_t>(n),
                                                std::vector<backends::GpuLink>(static_cast<size_t>(n)));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      auto& x = l[static_cast<size_t>(i)][static_cast<size_t>(j)];
      if (fast(i, j)) {
        x = {true, fast_rank};
      } else {
        x = {slow_access, slow_rank};
      }
    }
  }
  return l;
}

TEST(HierarchicalCopyTopology, Dgx1GivesTheTwoNvlinkQuads) {
  auto l = links_of(8, [](int i, int j) { return i / 4 == j / 4; });
  EXPECT_EQ(backends::groups_from_topology(l),
            (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(HierarchicalCopyTopology, PairsOfNvlinkedGpus) {
  auto l = links_of(6, [](int i, int j) { return i / 2 == j / 2; });
  EXPECT_EQ(backends::groups_from_topology(l),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
}

TEST(HierarchicalCopyTopology, InterleavedLinksStillGroupByClique) {
  // Even GPUs link to even ones fast, odd to odd.
  auto l = links_of(5, [](int i, int j) { return i % 2 == j % 2; });
  EXPECT_EQ(backends::groups_from_topology(l), (std::vector<std::vector<int>>{{0, 2, 4}, {1, 3}}));
}

TEST(HierarchicalCopyTopology, NoPeerAccessGivesOneGroupPerGpu) {
  auto l = links_of(3, [](int, int) { return false; }, 0, -1, false);
  EXPECT_EQ(backends::groups_from_topology(l), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
}

TEST(HierarchicalCopyTopology, UniformLinksGiveOneGroup) {
  auto l = links_of(4, [](int, int) { return true; });
  EXPECT_EQ(backends::groups_from_topology(l), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(backends::groups_from_topology({}), (std::vector<std::vector<int>>{}));
}

// --- with a GPU ----------------------------------------------------------------------------------

TEST(Nccl, NumPacksBelowZeroIsTfsError) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  auto made = r.create("nccl:num_packs=-1", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find(
                "NCCL all-reduce requires num_packs >= 0, but -1 is specified"),
            std::string::npos)
      << made.status().message();
}

TEST(Nccl, VirtualGpusAreRefusedAsTfRefusesThem) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  if (gpu::virtual_per_physical() < 2) GTEST_SKIP() << "run with TRIBUTARY_VIRTUAL_GPUS=2 or more";
  SKIP_WITHOUT_GPUS(2);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0), Device::cuda(1)};
  auto made = r.create("nccl", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("NCCL is not supported when using virtual GPUs"),
            std::string::npos)
      << made.status().message();
}

// A peer that registers with the store but never starts NCCL: setup must end at the timeout, with
// the communicator aborted, not hang.
TEST(Nccl, APeerThatNeverInitialisesEndsInTheSetupDeadline) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  ctx.rank = 0;
  ctx.world_size = 2;
  ctx.store = std::make_shared<MemoryStore>();
  // Rank 1's half of the store handshake (it reached the setup, BackendRegistry::create's
  // meeting, and said its GPUs), then silence.
  ASSERT_TRUE(ctx.store->set("setup/0/1", "=nccl").ok());
  ASSERT_TRUE(ctx.store->set("nccl/0/gpus/1", "1").ok());
  const auto start = std::chrono::steady_clock::now();
  auto made = r.create("nccl:timeout=3s", ctx);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kDeadlineExceeded) << made.status().message();
  EXPECT_NE(made.status().message().find("NCCL communicator setup"), std::string::npos)
      << made.status().message();
  EXPECT_LT(took, std::chrono::seconds(30));
}

TEST(Nccl, AMissingPeerIsNamedWhileWaitingInTheStore) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  ctx.rank = 0;
  ctx.world_size = 2;
  ctx.store = std::make_shared<MemoryStore>();
  ASSERT_TRUE(ctx.store->set("setup/0/1", "=nccl").ok());  // rank 1 reached the setup, no further
  auto made = r.create("nccl:timeout=1s", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("rank 1 did not join"), std::string::npos)
      << made.status().message();
}

#if defined(TRIBUTARY_HAVE_CUDA)
// Checks the Work of `spec` (an nccl spec) on GPU:0; the caller skips without a GPU.
void check_work_completes_on_the_device(BackendRegistry& r, const std::string& spec) {
  BackendContext ctx;
  ctx.devices = {Device::cuda(0)};
  auto ops = r.create(spec, ctx);
  ASSERT_TRUE(ops.ok()) << ops.status().message();
  const int64_t n = 1 << 20;
  auto in = Buffer::allocate(DType::kFloat32, Shape{n}, Device::cuda(0));
  auto out = Buffer::allocate(DType::kFloat32, Shape{n}, Device::cuda(0));
  ASSERT_TRUE(in.ok() && out.ok());
  std::vector<float> host(static_cast<size_t>(n), 2.5f);
  ASSERT_EQ(cudaMemcpy(in->data(), host.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  // Many in a row, then the user's stream waits for the last without blocking the host.
  Work last;
  for (int i = 0; i < 20; ++i) {
    last = (*ops)->all_reduce(ReduceOp::kMean, PerReplica<Tensor>{in->tensor()},
                              PerReplica<Tensor>{out->tensor()});
  }
  EXPECT_TRUE(last.wait_stream(user).ok());
  std::vector<float> back(static_cast<size_t>(n), 0.f);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), out->data(), static_cast<size_t>(n) * 4,
                            cudaMemcpyDeviceToHost, user),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(user), cudaSuccess);
  EXPECT_EQ(back[0], 2.5f);
  EXPECT_EQ(back[static_cast<size_t>(n - 1)], 2.5f);
  EXPECT_TRUE(last.wait(std::chrono::seconds(30)).ok());
  EXPECT_TRUE(last.test());
  // After completion wait_stream returns the status at once.
  EXPECT_TRUE(last.wait_stream(user).ok());
  cudaStreamDestroy(user);
  // How long setup and teardown take (reported, not asserted: speed is the benchmarks' business).
  const auto t0 = std::chrono::steady_clock::now();
  ops->reset();
  const auto t1 = std::chrono::steady_clock::now();
  auto again = r.create(spec, ctx);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(again.ok()) << again.status().message();
  std::printf("%s: destroyed in %.1f ms, created in %.1f ms\n", spec.c_str(),
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());
}

TEST(Nccl, WorkCompletesOnTheDeviceAndAUserStreamCanWaitForIt) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  check_work_completes_on_the_device(r, "nccl");
}

// launch=blocking: collectives on a blocking communicator split from the setup one.
TEST(Nccl, BlockingLaunchWorkCompletesOnTheDevice) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  check_work_completes_on_the_device(r, "nccl:launch=blocking");
}

// Every call leaves the calling thread's current CUDA device as it was, though it switches devices
// inside (one NCCL group over two GPUs; an in-process reduction with peer copies).
TEST(GpuRuntime, CallsLeaveTheCallersCurrentDevice) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_GPUS(2);
  BackendContext ctx;
  ctx.devices = {Device::cuda(0), Device::cuda(1)};
  auto a = Buffer::allocate(DType::kFloat32, Shape{1024}, Device::cuda(0));
  auto b = Buffer::allocate(DType::kFloat32, Shape{1024}, Device::cuda(1));
  auto c = Buffer::allocate(DType::kFloat32, Shape{1024}, Device::cuda(0));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (const char* spec : {"nccl", "nccl:launch=blocking", "reduction_to_one_device"}) {
    if (std::string(spec).rfind("nccl", 0) == 0 && r.find("nccl") == nullptr) continue;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    auto ops = r.create(spec, ctx);
    ASSERT_TRUE(ops.ok()) << spec << ": " << ops.status().message();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 1) << spec << ": made";
    for (int caller : {1, 0}) {
      ASSERT_EQ(cudaSetDevice(caller), cudaSuccess);
      Work w = (*ops)->all_reduce(ReduceOp::kSum, PerReplica<Tensor>{a->tensor(), b->tensor()},
                                  PerReplica<Tensor>{a->tensor(), b->tensor()});
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, caller) << spec << ": all_reduce";
      EXPECT_TRUE(w.wait(std::chrono::seconds(30)).ok()) << spec;
      w = (*ops)->reduce(ReduceOp::kSum, PerReplica<Tensor>{a->tensor(), b->tensor()},
                         Mirrored<Tensor>{b->tensor(), c->tensor()});
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, caller) << spec << ": reduce to the other GPU";
      EXPECT_TRUE(w.wait(std::chrono::seconds(30)).ok()) << spec;
    }
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ops->reset();
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 1) << spec << ": destroyed";
  }
}
#endif

TEST(GpuStrategies, MirroredOnGpusDefaultsToNccl) {
  BackendRegistry r = builtin_backends();
  SKIP_WITHOUT_NCCL(r);
  SKIP_WITHOUT_GPUS(1);
  MirroredStrategyOptions o;
  o.devices = {Device::cuda(0)};
  auto s = make_mirrored_strategy(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((*s)->cross_device_ops().name(), "nccl");
}

TEST(GpuStrategies, MixedCpuAndGpuFallsBackToReductionToOneDevice) {
  SKIP_WITHOUT_GPUS(1);
  MirroredStrategyOptions o;
  o.devices = {Device::cuda(0), Device::cpu(0)};
  auto s = make_mirrored_strategy(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((*s)->cross_device_ops().name(), "reduction_to_one_device");
}

// TF's InputOptions.experimental_fetch_to_device: elements on each replica's GPU by default, in
// host memory when false.
TEST(GpuStrategies, FetchToDeviceFalseKeepsElementsInHostMemory) {
  SKIP_WITHOUT_GPUS(1);
  MirroredStrategyOptions o;
  o.devices = {Device::cuda(0)};
  auto s = make_mirrored_strategy(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  for (bool fetch : {true, false}) {
    InputOptions options;
    options.fetch_to_device = fetch;
    auto dd = distribute_dataset(**s, Dataset::range(8).batch(4), options);
    ASSERT_TRUE(dd.ok()) << dd.status().message();
    auto it = dd->make_iterator();
    ASSERT_TRUE(it.ok()) << it.status().message();
    auto batch = it->get_next();
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    const Array& a = (*batch)[0][0];
    EXPECT_EQ(a.device(), fetch ? Device::cuda(0) : Device::cpu()) << a.device().to_string();
    auto host = a.to_device(Device::cpu());
    ASSERT_TRUE(host.ok());
    EXPECT_EQ(host->to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  }
}

}  // namespace
}  // namespace tributary

// The multi-process conformance suite on GPU devices: one NCCL rank per process, each process
// driving 1 or 2 GPUs (GPU:rank x local + k), so world x local GPUs per case; with fewer visible it
// is a skip that says how many it needs.
TRIBUTARY_MULTIPROCESS_CONFORMANCE_GPU(Nccl, "nccl");
TRIBUTARY_MULTIPROCESS_CONFORMANCE_GPU(NcclBlockingLaunch, "nccl:launch=blocking");
