// Host backends (ring, gloo, ucx) on GPU tensors, staged through pinned host memory
// (core/host_staging.h). Every case forks real ranks and needs a visible GPU; without one it is a
// skip that says why. The bookkeeping that needs no GPU is tested in core_test (HostStaging*,
// StagingPlan*), and the refusal without a GPU in
// Registry.GpuDevicesWithoutAVisibleGpuAreAClearError.
//
// The suites' names contain "MultiProcessConformance" so that they run in gpu_test's forking entry
// (gpu_multiprocess_conformance): CUDA must not be initialised in the process that forks the ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "tests/conformance/device_buffers.h"
#include "tests/multiprocess/conformance.h"
#include "tests/multiprocess/harness.h"
#include "tributary/registry.h"

namespace tributary::testing {
namespace {

// In a rank: a registration of GPU:0 buffers on `spec`, used for several in-place all-reduces
// whose inputs change every time, then released and the buffers used unregistered. Rank r's
// replica is GPU:0, or CPU:0 on odd ranks when `mixed`.
int registered_rank(const std::string& spec, int rank, int world, bool mixed,
                    const std::string& dir) {
  if (cuda_device_count() < 1) return kChildSkip;
  auto ctx = group_context(rank, world, 1, dir);
  if (!ctx.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, ctx.status().to_string().c_str());
    return kChildFailed;
  }
  const Device device = mixed && rank % 2 == 1 ? Device::cpu(0) : Device::cuda(0);
  ctx->devices = {device};
  auto ops = builtin_backends().create(spec + ":timeout=60s", *ctx);
  if (!ops.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
    return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
  }
  constexpr int64_t kCount = 40001;
  conformance::DeviceBuffers buf(DType::kFloat32, kCount, {device});
  if (!buf.status.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, buf.status.to_string().c_str());
    return kChildFailed;
  }
  int failures = 0;
  // One in-place all-reduce of inputs that depend on the step; false on any failure.
  auto round = [&](int step, const char* what) {
    float* host = buf.host(0).data_as<float>();
    for (int64_t i = 0; i < kCount; ++i) {
      host[i] = static_cast<float>((rank + 1) * (step + 1) + i % 7);
    }
    if (!buf.upload()) return false;
    Status s = (*ops)->all_reduce(ReduceOp::kSum, buf.views, buf.views).wait();
    if (!s.ok()) {
      std::fprintf(stderr, "[rank %d] %s step %d: %s\n", rank, what, step, s.to_string().c_str());
      return false;
    }
    if (!buf.download()) return false;
    const float ranks = static_cast<float>(world * (world + 1) / 2);
    for (int64_t i = 0; i < kCount; ++i) {
      const float want = ranks * static_cast<float>(step + 1) + static_cast<float>(world * (i % 7));
      if (host[i] != want) {
        std::fprintf(stderr, "[rank %d] %s step %d: element %lld is %g, want %g\n", rank, what,
                     step, static_cast<long long>(i), static_cast<double>(host[i]),
                     static_cast<double>(want));
        return false;
      }
    }
    return true;
  };
  auto reg = (*ops)->register_buffers(buf.views);
  if (!reg.ok()) {
    std::fprintf(stderr, "[rank %d] register_buffers: %s\n", rank,
                 reg.status().to_string().c_str());
    return kChildFailed;
  }
  for (int step = 0; step < 4; ++step) failures += round(step, "registered") ? 0 : 1;
  reg->release();
  for (int step = 4; step < 6; ++step) failures += round(step, "released") ? 0 : 1;
  return failures == 0 ? kChildOk : kChildFailed;
}

void expect_registered(const std::string& spec, int world, bool mixed) {
  const std::string dir = make_temp_dir("staged_registered");
  GroupResult g = run_group(world, std::chrono::seconds(120), [&](int rank) {
    return registered_rank(spec, rank, world, mixed, dir);
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) {
    GTEST_SKIP() << "needs a visible CUDA device and backend '" << spec
                 << "' built in; the ranks saw none or not the backend ("
                 << gpu::visible_devices_text() << ")";
  }
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

TEST(StagedMultiProcessConformance, RegisteredGpuBuffersOnGloo) {
  expect_registered("gloo", 2, false);
}
TEST(StagedMultiProcessConformance, RegisteredGpuBuffersOnGlooBesideACpuRank) {
  expect_registered("gloo", 3, true);
}
TEST(StagedMultiProcessConformance, RegisteredGpuBuffersOnRing) {
  expect_registered("ring", 2, true);
}

// The contrast: NCCL refuses two ranks on one GPU. Two processes that both ask for nccl on GPU:0
// must each get NCCL's own reason (found at setup, not at the timeout, whose error would not name
// it) and what to do instead.
TEST(StagedMultiProcessConformance, NcclRanksSharingAGpuFailWithAClearError) {
  const std::string dir = make_temp_dir("nccl_shared_gpu");
  GroupResult g = run_group(2, std::chrono::seconds(120), [&](int rank) {
    if (cuda_device_count() < 1) return kChildSkip;
    auto ctx = group_context(rank, 2, 1, dir);
    if (!ctx.ok()) return kChildFailed;
    ctx->devices = {Device::cuda(0)};
    const BackendRegistry registry = builtin_backends();
    if (registry.find("nccl") == nullptr) return kChildSkip;
    auto ops = registry.create("nccl:timeout=30s", *ctx);
    Status s = ops.status();
    if (ops.ok()) {
      auto b = conformance::DeviceBuffers(DType::kFloat32, 16, {Device::cuda(0)});
      s = (*ops)->all_reduce(ReduceOp::kSum, b.views, b.views).wait();
    }
    if (s.ok()) {
      std::fprintf(stderr, "[rank %d] two NCCL ranks on one GPU did not fail\n", rank);
      return kChildFailed;
    }
    const bool clear = s.message().find("Duplicate GPU") != std::string::npos &&
                       s.message().find("ring, gloo or ucx") != std::string::npos;
    if (!clear) std::fprintf(stderr, "[rank %d] unclear: %s\n", rank, s.to_string().c_str());
    return clear ? kChildOk : kChildFailed;
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) {
    GTEST_SKIP() << "needs a visible CUDA device and NCCL built in (" << gpu::visible_devices_text()
                 << ")";
  }
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

}  // namespace
}  // namespace tributary::testing

// Every collective, op and dtype on GPU tensors through the host backends: processes sharing
// GPU:0 (and GPU:1, a virtual GPU with TRIBUTARY_VIRTUAL_GPUS=2), and GPU and CPU replicas mixed.
TRIBUTARY_MULTIPROCESS_CONFORMANCE_STAGED(RingStaged, "ring");
TRIBUTARY_MULTIPROCESS_CONFORMANCE_STAGED(GlooStaged, "gloo");
TRIBUTARY_MULTIPROCESS_CONFORMANCE_STAGED(UcxStaged, "ucx");
