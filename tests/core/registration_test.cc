// CrossDeviceOps::register_buffers at the front door: validation, sequence numbers, the backend's
// register/release steps and the handle's lifetime, with a recording fake backend (the layer above
// backends may be tested with a fake), and with a real in-process backend, for which registration
// changes nothing. The gloo backend's use of it is tested with real processes in gloo_test.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/core/recording_ops.h"
#include "tributary/registry.h"

namespace tributary {
namespace {

struct Log {
  std::vector<CallInfo> calls;     // every *_impl, registrations included
  std::vector<uint64_t> released;  // release_buffers_impl's ids, in order
  Status fail_registration;        // what register_buffers_impl returns
  std::vector<const void*> registered_data;
};

// The recording fake, with registration hooks that log what they are given.
class RegisteringOps final : public fakes::RecordingOps {
 public:
  RegisteringOps(BackendContext ctx, Capabilities caps, Log* log)
      : RecordingOps("registering", std::move(ctx), Options(), std::move(caps),
                     [log](const CrossDeviceOps&, const CallInfo& c) { log->calls.push_back(c); }),
        log_(log) {}

 protected:
  Status register_buffers_impl(const CallInfo& c, uint64_t id,
                               const PerReplica<Tensor>& buffers) override {
    (void)id;
    log_->calls.push_back(c);
    for (const Tensor& t : buffers) log_->registered_data.push_back(t.data());
    return log_->fail_registration;
  }
  void release_buffers_impl(uint64_t id) override { log_->released.push_back(id); }

 private:
  Log* log_;
};

class Registration : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendContext ctx;
    ctx.devices = {Device::cpu(0), Device::cpu(1)};
    Capabilities caps;
    caps.device_types = {DeviceType::kCpu};
    caps.dtypes = {DType::kFloat32, DType::kInt32};
    caps.ops = {ReduceOp::kSum};
    caps.collectives = {Collective::kAllReduce};
    ops_ = std::make_unique<RegisteringOps>(ctx, caps, &log_);
    for (auto& b : data_) b.assign(16, 1.0f);
  }
  Tensor t(int r, int64_t n = 8) {
    return Tensor(data_[r].data(), DType::kFloat32, n, Device::cpu(r));
  }
  PerReplica<Tensor> both() { return PerReplica<Tensor>{t(0), t(1)}; }

  Log log_;
  std::unique_ptr<CrossDeviceOps> ops_;
  std::vector<float> data_[2];
};

TEST_F(Registration, BadBuffersAreRefusedLikeACollectivesAndReachNoBackend) {
  auto expect_refused = [&](const PerReplica<Tensor>& buffers, StatusCode code,
                            std::string_view fragment) {
    StatusOr<BufferRegistration> r = ops_->register_buffers(buffers);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  };
  expect_refused(PerReplica<Tensor>{t(0)}, StatusCode::kInvalidArgument,
                 "register_buffers: buffers has 1 values but this backend serves 2 local replicas");
  expect_refused(PerReplica<Tensor>{t(0), t(1, 4)}, StatusCode::kInvalidArgument,
                 "buffers[1] has 4 elements");
  const Tensor overlapping(data_[0].data() + 4, DType::kFloat32, int64_t{8}, Device::cpu(1));
  expect_refused(PerReplica<Tensor>{t(0), overlapping}, StatusCode::kInvalidArgument,
                 "buffers[0] and buffers[1] overlap");
  const Tensor on_wrong_device(data_[1].data(), DType::kFloat32, int64_t{8}, Device::cpu(0));
  expect_refused(PerReplica<Tensor>{t(0), on_wrong_device}, StatusCode::kInvalidArgument,
                 "buffers[1] is on CPU:0 but local replica 1 is CPU:1");
  std::vector<double> d0(8), d1(8);
  expect_refused(PerReplica<Tensor>{Tensor(d0.data(), DType::kFloat64, int64_t{8}, Device::cpu(0)),
                                    Tensor(d1.data(), DType::kFloat64, int64_t{8}, Device::cpu(1))},
                 StatusCode::kUnimplemented, "does not support dtype float64");
  EXPECT_TRUE(log_.calls.empty());
  EXPECT_EQ(ops_->last_sequence(), 0u);
}

TEST_F(Registration, TakesASequenceNumberBetweenCollectives) {
  ASSERT_TRUE(ops_->all_reduce(ReduceOp::kSum, both(), both()).wait().ok());
  StatusOr<BufferRegistration> r = ops_->register_buffers(both());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(ops_->all_reduce(ReduceOp::kSum, both(), both()).wait().ok());
  ASSERT_EQ(log_.calls.size(), 3u);
  const CallInfo& reg = log_.calls[1];
  EXPECT_EQ(reg.sequence, 2u);
  EXPECT_EQ(reg.collective, Collective::kRegisterBuffers);
  EXPECT_EQ(reg.dtype, DType::kFloat32);
  EXPECT_EQ(reg.count, 8);
  EXPECT_EQ(reg.describe(), "register_buffers #2 (32B float32)");
  EXPECT_EQ(log_.calls[2].sequence, 3u);
  EXPECT_EQ(log_.registered_data, (std::vector<const void*>{data_[0].data(), data_[1].data()}));
  EXPECT_EQ(r->id(), 1u);
  EXPECT_TRUE(r->active());
  // Not a capability: no backend lists it, and all_collectives() stays the six data collectives.
  for (Collective c : all_collectives()) EXPECT_NE(c, Collective::kRegisterBuffers);
}

TEST_F(Registration, EndsOnceByReleaseDestructionOrMove) {
  StatusOr<BufferRegistration> a = ops_->register_buffers(both());
  StatusOr<BufferRegistration> b = ops_->register_buffers(both());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id(), 1u);
  EXPECT_EQ(b->id(), 2u);
  a->release();
  EXPECT_FALSE(a->active());
  a->release();  // the second time does nothing
  EXPECT_EQ(log_.released, std::vector<uint64_t>{1});
  {
    BufferRegistration moved = std::move(*b);
    EXPECT_FALSE(b->active());  // NOLINT(bugprone-use-after-move): moved-from is inactive
    EXPECT_EQ(b->id(), 0u);
    EXPECT_TRUE(moved.active());
    EXPECT_EQ(moved.id(), 2u);
  }  // destroyed: ends registration 2
  EXPECT_EQ(log_.released, (std::vector<uint64_t>{1, 2}));
  // Assigning over a live registration ends it first.
  StatusOr<BufferRegistration> c = ops_->register_buffers(both());
  StatusOr<BufferRegistration> d = ops_->register_buffers(both());
  ASSERT_TRUE(c.ok() && d.ok());
  *c = std::move(*d);
  EXPECT_EQ(log_.released, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(c->id(), 4u);
}

TEST_F(Registration, AHandleMayOutliveItsBackend) {
  StatusOr<BufferRegistration> r = ops_->register_buffers(both());
  ASSERT_TRUE(r.ok());
  ops_.reset();
  EXPECT_FALSE(r->active());
  r->release();  // nothing to call: the backend is gone
  EXPECT_TRUE(log_.released.empty());
}

TEST_F(Registration, ABackendsFailureIsReturnedAndBreaksTheInstanceAsACollectivesWould) {
  log_.fail_registration = aborted("rank 1 registered 16 elements, rank 0 8");
  StatusOr<BufferRegistration> r = ops_->register_buffers(both());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("rank 1 registered 16 elements"), std::string::npos);
  EXPECT_FALSE(ops_->broken().ok());
  StatusOr<BufferRegistration> again = ops_->register_buffers(both());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status().to_string();
  EXPECT_NE(again.status().message().find("register_buffers: backend 'registering' is unusable"),
            std::string::npos)
      << again.status().message();
}

// A real backend that prepares nothing for registered buffers: the call is accepted and counted,
// and collectives on the registered buffers compute as on any others.
TEST(RegistrationInProcess, ChangesNothingForBackendsWithoutUseForIt) {
  for (const char* spec : {"reduction_to_one_device", "hierarchical_copy"}) {
    SCOPED_TRACE(spec);
    BackendContext ctx;
    ctx.devices = {Device::cpu(0), Device::cpu(1)};
    auto made = builtin_backends().create(spec, ctx);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
    PerReplica<Tensor> v{Tensor(a.data(), DType::kFloat32, int64_t{1000}, Device::cpu(0)),
                         Tensor(b.data(), DType::kFloat32, int64_t{1000}, Device::cpu(1))};
    StatusOr<BufferRegistration> r = (*made)->register_buffers(v);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*made)->last_sequence(), 1u);
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE((*made)->all_reduce(ReduceOp::kSum, v, v).wait().ok());
    }
    EXPECT_EQ(a[999], 12.0f);  // 1 + 2 = 3, then 3 + 3 = 6, then 12
    EXPECT_EQ(b[0], a[0]);
    r->release();
    ASSERT_TRUE((*made)->all_reduce(ReduceOp::kSum, v, v).wait().ok());
    EXPECT_EQ(a[0], 24.0f);
  }
}

}  // namespace
}  // namespace tributary
