// What the front door does when an asynchronous collective ends after the call returned: a failure
// makes the backend unusable (before the caller's own callbacks run), the flight recorder records
// the end, and a Work that outlives its backend still completes safely.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "recording_ops.h"
#include "tributary/cross_device_ops.h"

namespace tributary {
namespace {

// The recording fake, except that its all-reduces stay pending until the test completes them.
class PendingOps final : public fakes::RecordingOps {
 public:
  PendingOps(BackendContext ctx, Capabilities caps)
      : RecordingOps("pending", std::move(ctx), Options(), std::move(caps),
                     [](const CrossDeviceOps&, const CallInfo&) {}) {}
  std::vector<Work> issued;

 protected:
  Work all_reduce_impl(const CallInfo&, ReduceOp, const PerReplica<Tensor>&,
                       const PerReplica<Tensor>&) override {
    Work w;
    issued.push_back(w);
    return w;
  }
};

class AsyncCompletion : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendContext ctx;
    ctx.devices = {Device::cpu(0)};
    Capabilities caps;
    caps.device_types = {DeviceType::kCpu};
    caps.dtypes = {DType::kFloat32};
    caps.ops = {ReduceOp::kSum};
    caps.collectives = {Collective::kAllReduce};
    ops_ = std::make_unique<PendingOps>(ctx, caps);
    data_.assign(8, 1.0f);
  }
  Work call() {
    Tensor t(data_.data(), DType::kFloat32, 8, Device::cpu(0));
    return ops_->all_reduce(ReduceOp::kSum, {t}, {t});
  }

  std::unique_ptr<PendingOps> ops_;
  std::vector<float> data_;
};

TEST_F(AsyncCompletion, SuccessLeavesTheBackendUsable) {
  Work w = call();
  ASSERT_FALSE(w.test());
  ASSERT_EQ(ops_->issued.size(), 1u);
  ops_->issued[0].complete(Status());
  EXPECT_TRUE(w.wait(std::chrono::seconds(1)).ok());
  EXPECT_TRUE(ops_->broken().ok());
  EXPECT_FALSE(call().test()) << "a second call should reach the backend";
}

TEST_F(AsyncCompletion, ALateFailureBreaksTheBackendBeforeTheCallersCallbacksRun) {
  Work first = call();
  Work second = call();
  ASSERT_EQ(ops_->issued.size(), 2u);
  Status broken_in_callback;
  int callbacks = 0;
  first.on_complete([&](const Status& s) {
    ++callbacks;
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    broken_in_callback = ops_->broken();
  });
  ops_->issued[0].complete(unavailable("peer 1 is gone"));
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(broken_in_callback.code(), StatusCode::kUnavailable) << broken_in_callback.to_string();
  EXPECT_NE(broken_in_callback.message().find("peer 1 is gone"), std::string::npos);
  // Only the first failure is kept; a later one does not replace it.
  ops_->issued[1].complete(internal_error("second failure"));
  EXPECT_NE(ops_->broken().message().find("peer 1 is gone"), std::string::npos)
      << ops_->broken().to_string();
  // Completing again changes nothing and runs nothing twice.
  ops_->issued[0].complete(Status());
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(first.error().code(), StatusCode::kUnavailable);
  Status refused = call().wait(std::chrono::seconds(1));
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_NE(refused.message().find("unusable after an earlier failure"), std::string::npos)
      << refused.message();
  EXPECT_EQ(ops_->issued.size(), 2u) << "a broken backend must not be called";
}

TEST_F(AsyncCompletion, AWorkThatOutlivesItsBackendStillCompletes) {
  Work w = call();
  Work pending = ops_->issued[0];
  ops_.reset();
  // The flight recorder, which the Work keeps alive, still records the end: its dump of the first
  // failure names it.
  ::testing::internal::CaptureStderr();
  pending.complete(unavailable("ended after the backend"));
  const std::string dump = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(w.wait(std::chrono::seconds(1)).code(), StatusCode::kUnavailable);
  EXPECT_NE(dump.find("all_reduce #1"), std::string::npos) << dump;
  EXPECT_NE(dump.find("failed after"), std::string::npos) << dump;
  EXPECT_NE(dump.find("ended after the backend"), std::string::npos) << dump;
}

}  // namespace
}  // namespace tributary
