// The host-staging layer (core/host_staging.h) without a GPU: a StagingDevice that stages CPU
// tensors through plain host memory stands in for CUDA's copies, below the layer under test, and
// the backend under the wrapper is a real in-process one or, where a test must see what the backend
// is handed, a spy. The CUDA copies themselves run in tests/gpu/staged_test.cc where a GPU is.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/host_staging.h"
#include "tests/core/plain_staging.h"
#include "tests/core/recording_ops.h"
#include "tributary/registry.h"

namespace tributary {
namespace {

using fakes::PlainStaging;

BackendContext two_cpus() {
  BackendContext ctx;
  ctx.devices = {Device::cpu(0), Device::cpu(1)};
  return ctx;
}

Tensor view(std::vector<float>& v, int replica, size_t offset = 0, int64_t n = -1) {
  return Tensor(v.data() + offset, DType::kFloat32, n < 0 ? static_cast<int64_t>(v.size()) : n,
                Device::cpu(replica));
}

class StagedInProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = builtin_backends().create("reduction_to_one_device", two_cpus());
    ASSERT_TRUE(inner.ok()) << inner.status().message();
    staging_ = std::make_shared<PlainStaging>();
    ops_ = internal::make_host_staged_ops(two_cpus(), std::move(inner).value(), staging_);
  }
  std::shared_ptr<PlainStaging> staging_;
  std::unique_ptr<CrossDeviceOps> ops_;
};

TEST_F(StagedInProcess, KeepsTheBackendsNameAndAddsGpuDevices) {
  EXPECT_EQ(ops_->name(), "reduction_to_one_device");
  EXPECT_TRUE(ops_->capabilities().supports(DeviceType::kCuda));
  EXPECT_EQ(ops_->spec().rfind("reduction_to_one_device:", 0), 0u) << ops_->spec();
}

TEST_F(StagedInProcess, EveryCollectiveComputesThroughTheTwins) {
  constexpr size_t n = 1000;
  std::vector<float> a(n), b(n), c(n), d(n);
  auto fill = [&] {
    std::iota(a.begin(), a.end(), 0.0f);
    for (size_t i = 0; i < n; ++i) b[i] = 2.0f * static_cast<float>(i);
  };
  // all_reduce in place: one copy in and one out per replica.
  fill();
  ASSERT_TRUE(ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)})
                  .wait()
                  .ok());
  EXPECT_EQ(a[10], 30.0f);
  EXPECT_EQ(b[999], 2997.0f);
  EXPECT_EQ(staging_->bytes_in.load(), 2 * n * 4);
  EXPECT_EQ(staging_->bytes_out.load(), 2 * n * 4);
  // Out of place, mean.
  fill();
  ASSERT_TRUE(ops_->all_reduce(ReduceOp::kMean, {view(a, 0), view(b, 1)}, {view(c, 0), view(d, 1)})
                  .wait()
                  .ok());
  EXPECT_EQ(c[10], 15.0f);
  EXPECT_EQ(d[4], 6.0f);
  EXPECT_EQ(a[10], 10.0f);  // inputs untouched
  // reduce to one destination.
  std::vector<float> dst(n, -1.0f);
  ASSERT_TRUE(ops_->reduce(ReduceOp::kMax, {view(a, 0), view(b, 1)}, {view(dst, 0)}).wait().ok());
  EXPECT_EQ(dst[7], 14.0f);
  // batch_reduce of two pairs.
  std::vector<float> dst2(n, -1.0f);
  std::iota(c.begin(), c.end(), 0.0f);
  std::iota(d.begin(), d.end(), 0.0f);
  std::vector<ReducePair> pairs = {{{view(a, 0), view(b, 1)}, {view(dst, 0)}},
                                   {{view(c, 0), view(d, 1)}, {view(dst2, 1)}}};
  ASSERT_TRUE(ops_->batch_reduce(ReduceOp::kSum, pairs).wait().ok());
  EXPECT_EQ(dst[3], 9.0f);
  EXPECT_EQ(dst2[3], 6.0f);
  // broadcast, the source also a destination (in place on its device).
  fill();
  ASSERT_TRUE(ops_->broadcast(view(a, 0), {view(a, 0), view(d, 1)}).wait().ok());
  EXPECT_EQ(d[123], 123.0f);
  EXPECT_EQ(a[123], 123.0f);
  // all_gather in place: each input is its own slice of the output.
  std::vector<float> g0(2 * n), g1(2 * n);
  fill();
  std::copy(a.begin(), a.end(), g0.begin());
  std::copy(b.begin(), b.end(), g1.begin() + n);
  ASSERT_TRUE(ops_->all_gather({view(g0, 0, 0, n), view(g1, 1, n, n)}, {view(g0, 0), view(g1, 1)})
                  .wait()
                  .ok());
  EXPECT_EQ(g0[n + 5], 10.0f);
  EXPECT_EQ(g1[5], 5.0f);
  // reduce_scatter: replica i gets the sum of slice i.
  std::vector<float> s0(n / 2), s1(n / 2);
  ASSERT_TRUE(
      ops_->reduce_scatter(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(s0, 0), view(s1, 1)})
          .wait()
          .ok());
  EXPECT_EQ(s0[1], 3.0f);
  EXPECT_EQ(s1[0], 1500.0f);
}

TEST_F(StagedInProcess, ResultsReachTheCallersBuffersOnlyThroughTheCopyBack) {
  std::vector<float> a(64, 1.0f), b(64, 2.0f);
  staging_->copy_back = false;
  ASSERT_TRUE(ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)})
                  .wait()
                  .ok());
  // The backend computed 3 in the twins; without the copy back the caller's buffers keep theirs.
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(b[0], 2.0f);
}

TEST_F(StagedInProcess, BlocksAreReusedAndFreedWithTheBackend) {
  std::vector<float> a(4096, 1.0f), b(4096, 1.0f);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)})
                    .wait()
                    .ok());
  }
  EXPECT_EQ(a[0], 1024.0f);
  EXPECT_EQ(staging_->live.load(), 1);  // one block, reused ten times
  ops_.reset();
  EXPECT_EQ(staging_->live.load(), 0);
}

// A spy backend: records the tensors it is handed; its Works complete when the test says so.
struct Spy {
  std::vector<PerReplica<Tensor>> inputs, outputs, registered;
  std::vector<uint64_t> released;
  std::vector<Work> pending;
  Status result;
};

class SpyOps final : public fakes::RecordingOps {
 public:
  SpyOps(BackendContext ctx, Spy* spy)
      : RecordingOps("spy", std::move(ctx), Options(), caps(),
                     [](const CrossDeviceOps&, const CallInfo&) {}),
        spy_(spy) {}
  static Capabilities caps() {
    Capabilities c;
    c.device_types = {DeviceType::kCpu};
    c.dtypes = {DType::kFloat32};
    c.ops = {ReduceOp::kSum};
    c.collectives = {Collective::kAllReduce, Collective::kAllGather};
    c.multi_process = true;
    return c;
  }

 protected:
  Work all_reduce_impl(const CallInfo&, ReduceOp, const PerReplica<Tensor>& in,
                       const PerReplica<Tensor>& out) override {
    return hold(in, out);
  }
  Work all_gather_impl(const CallInfo&, const PerReplica<Tensor>& in,
                       const PerReplica<Tensor>& out) override {
    return hold(in, out);
  }
  Status register_buffers_impl(const CallInfo&, uint64_t,
                               const PerReplica<Tensor>& buffers) override {
    spy_->registered.push_back(buffers);
    return Status();
  }
  void release_buffers_impl(uint64_t id) override { spy_->released.push_back(id); }

 private:
  Work hold(const PerReplica<Tensor>& in, const PerReplica<Tensor>& out) {
    spy_->inputs.push_back(in);
    spy_->outputs.push_back(out);
    for (const Tensor& t : out.values()) {
      std::fill_n(t.data_as<float>(), t.num_elements(), 7.0f);
    }
    Work w;
    spy_->pending.push_back(w);
    return w;
  }
  Spy* spy_;
};

class StagedSpy : public ::testing::Test {
 protected:
  void SetUp() override {
    staging_ = std::make_shared<PlainStaging>();
    // The backend's devices differ from the wrapper's, as GPU replicas' host devices do, so that
    // the tests see the wrapper relabel what it hands over.
    BackendContext host;
    host.devices = {Device::cpu(5), Device::cpu(6)};
    auto spy = std::make_unique<SpyOps>(host, &spy_);
    spy_ops_ = spy.get();
    ops_ = internal::make_host_staged_ops(two_cpus(), std::move(spy), staging_);
  }
  Spy spy_;
  SpyOps* spy_ops_ = nullptr;  // owned by ops_
  std::shared_ptr<PlainStaging> staging_;
  std::unique_ptr<CrossDeviceOps> ops_;
};

TEST_F(StagedSpy, OneBackendCallPerCallAliasingKeptAndCopiedBackOnlyAfterItCompletes) {
  std::vector<float> a(100, 1.0f), b(100, 1.0f);
  Work w = ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)});
  ASSERT_EQ(spy_.inputs.size(), 1u);
  const auto& in = spy_.inputs[0];
  const auto& out = spy_.outputs[0];
  // In place stays in place, on twins, labelled with the backend's devices.
  EXPECT_EQ(in[0].data(), out[0].data());
  EXPECT_EQ(in[1].data(), out[1].data());
  EXPECT_NE(in[0].data(), static_cast<void*>(a.data()));
  EXPECT_NE(in[0].data(), in[1].data());
  EXPECT_EQ(in[0].device(), Device::cpu(5));
  EXPECT_EQ(in[1].device(), Device::cpu(6));
  // Pending: nothing copied back, the caller's Work pending too.
  EXPECT_FALSE(w.test());
  EXPECT_EQ(staging_->bytes_out.load(), 0u);
  EXPECT_EQ(a[0], 1.0f);
  spy_.pending[0].complete(Status());
  ASSERT_TRUE(w.wait(std::chrono::seconds(5)).ok());
  EXPECT_EQ(a[0], 7.0f);
  EXPECT_EQ(b[99], 7.0f);

  // An in-place all_gather: each input stays its slice of its output's twin.
  std::vector<float> g0(200), g1(200);
  Work g =
      ops_->all_gather({view(g0, 0, 0, 100), view(g1, 1, 100, 100)}, {view(g0, 0), view(g1, 1)});
  ASSERT_EQ(spy_.inputs.size(), 2u);
  EXPECT_EQ(spy_.inputs[1][0].data(), spy_.outputs[1][0].data());
  EXPECT_EQ(spy_.inputs[1][1].data_as<float>(), spy_.outputs[1][1].data_as<float>() + 100);
  spy_.pending[1].complete(Status());
  EXPECT_TRUE(g.wait(std::chrono::seconds(5)).ok());
}

TEST_F(StagedSpy, ABackendFailureFailsTheCallWithoutCopyingBack) {
  std::vector<float> a(10, 1.0f), b(10, 1.0f);
  Work w = ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)});
  spy_.pending[0].complete(unavailable("rank 1 closed the connection"));
  Status s = w.wait(std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 closed the connection"), std::string::npos) << s.message();
  EXPECT_EQ(staging_->bytes_out.load(), 0u);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_FALSE(ops_->broken().ok());
}

TEST_F(StagedSpy, AFailedCopyInIssuesNothingAndBreaksTheBackend) {
  std::vector<float> a(10, 1.0f), b(10, 1.0f);
  staging_->fail_to_host = internal_error("cudaMemcpyAsync GPU:0 -> CPU:0 (40B) failed: injected");
  Status s =
      ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)}).wait();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("staging GPU tensors through host memory"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.message();
  EXPECT_TRUE(spy_.inputs.empty());  // the backend was never called
  EXPECT_FALSE(ops_->broken().ok());
  // ... and was given up on, which is what tells its peers not to wait for this rank.
  EXPECT_NE(spy_ops_->broken().message().find("injected"), std::string::npos)
      << spy_ops_->broken().message();
}

TEST_F(StagedSpy, AFailedCopyBackFailsTheCallAndGivesUpOnTheBackend) {
  std::vector<float> a(10, 1.0f), b(10, 1.0f);
  staging_->fail_to_device =
      internal_error("cudaMemcpyAsync CPU:0 -> GPU:0 (40B) failed: injected");
  Work w = ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)});
  ASSERT_EQ(spy_.pending.size(), 1u);
  EXPECT_TRUE(spy_ops_->broken().ok());
  spy_.pending[0].complete(Status());  // the collective itself succeeded everywhere
  Status s = w.wait(std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("copying the results back to the GPUs"), std::string::npos)
      << s.message();
  EXPECT_FALSE(ops_->broken().ok());
  // The peers are told at once instead of waiting for this rank in the next collective.
  EXPECT_NE(spy_ops_->broken().message().find("injected"), std::string::npos)
      << spy_ops_->broken().message();
}

TEST_F(StagedSpy, ARegistrationGetsTwinsOfItsOwnThatItsCallsRunOn) {
  std::vector<float> a(100, 1.0f), b(100, 1.0f), other(100), other1(100);
  {
    auto reg = ops_->register_buffers({view(a, 0), view(b, 1)});
    ASSERT_TRUE(reg.ok()) << reg.status().message();
    ASSERT_EQ(spy_.registered.size(), 1u);
    const PerReplica<Tensor>& twins = spy_.registered[0];
    EXPECT_NE(twins[0].data(), static_cast<void*>(a.data()));
    EXPECT_EQ(twins[1].device(), Device::cpu(6));
    EXPECT_EQ(staging_->live.load(), 2);
    // A call on the registered buffers runs on their twins.
    Work w = ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)});
    EXPECT_EQ(spy_.outputs[0][0].data(), twins[0].data());
    EXPECT_EQ(spy_.outputs[0][1].data(), twins[1].data());
    spy_.pending[0].complete(Status());
    EXPECT_TRUE(w.wait(std::chrono::seconds(5)).ok());
    EXPECT_EQ(a[0], 7.0f);
    // Other buffers do not.
    Work o = ops_->all_reduce(ReduceOp::kSum, {view(other, 0), view(other1, 1)},
                              {view(other, 0), view(other1, 1)});
    EXPECT_NE(spy_.outputs[1][0].data(), twins[0].data());
    spy_.pending[1].complete(Status());
    EXPECT_TRUE(o.wait(std::chrono::seconds(5)).ok());
    // A call in flight keeps the twins alive past the release.
    Work late =
        ops_->all_reduce(ReduceOp::kSum, {view(a, 0), view(b, 1)}, {view(a, 0), view(b, 1)});
    reg->release();
    EXPECT_EQ(spy_.released, std::vector<uint64_t>{1});
    EXPECT_EQ(staging_->live.load(), 3);  // two twins (in flight) and the block
    spy_.pending[2].complete(Status());
    EXPECT_TRUE(late.wait(std::chrono::seconds(5)).ok());
  }
  EXPECT_EQ(staging_->live.load(), 1);  // the pool's block
}

}  // namespace
}  // namespace tributary
