// Bad input to the front door: every case returns a Status naming the argument and the rule, and
// leaves every buffer as it was.
#include <gtest/gtest.h>

#include <vector>

#include "tributary/registry.h"

namespace tributary {
namespace {

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendContext ctx;
    ctx.devices = {Device::cpu(0), Device::cpu(1)};
    auto made = builtin_backends().create("reduction_to_one_device", ctx);
    ASSERT_TRUE(made.ok());
    ops_ = std::move(made).value();
    for (int r = 0; r < 2; ++r) {
      in_[r].assign(16, static_cast<float>(r + 1));
      out_[r].assign(16, -1.0f);
    }
  }
  Tensor in(int r, int64_t n = 8) { return Tensor(in_[r].data(), DType::kFloat32, n, Device::cpu(r)); }
  Tensor out(int r, int64_t n = 8) {
    return Tensor(out_[r].data(), DType::kFloat32, n, Device::cpu(r));
  }
  void expect_error(const Work& w, StatusCode code, std::string_view fragment) {
    Status s = w.wait(std::chrono::seconds(5));
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
    for (int r = 0; r < 2; ++r) {
      for (float x : in_[r]) ASSERT_EQ(x, static_cast<float>(r + 1)) << "an input was modified";
      for (float x : out_[r]) ASSERT_EQ(x, -1.0f) << "an output was modified";
    }
  }

  std::unique_ptr<CrossDeviceOps> ops_;
  std::vector<float> in_[2], out_[2];
};

TEST_F(Validation, EmptyReplicaList) {
  expect_error(ops_->all_reduce(ReduceOp::kSum, {}, {}), StatusCode::kInvalidArgument,
               "all_reduce: inputs is an empty replica list");
}

TEST_F(Validation, WrongReplicaCount) {
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0)}, {out(0)}), StatusCode::kInvalidArgument,
               "inputs has 1 values but this backend serves 2 local replicas");
}

// A buffer that does not start on an element boundary (a byte offset into another buffer, NumPy's
// frombuffer(offset=1)): typed access to it is undefined on the host and a fault on a GPU.
TEST_F(Validation, ElementMisalignedBufferIsRefused) {
  Tensor shifted(reinterpret_cast<char*>(out_[1].data()) + 1, DType::kFloat32, int64_t{8},
                 Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), shifted}),
               StatusCode::kInvalidArgument,
               "all_reduce: outputs[1] is not aligned to its 4-byte elements");
  // An empty tensor is not read: its pointer need not be aligned.
  Tensor empty0(reinterpret_cast<char*>(in_[0].data()) + 1, DType::kFloat32, int64_t{0},
                Device::cpu(0));
  Tensor empty1(reinterpret_cast<char*>(in_[1].data()) + 3, DType::kFloat32, int64_t{0},
                Device::cpu(1));
  EXPECT_TRUE(ops_->all_reduce(ReduceOp::kSum, {empty0, empty1}, {empty0, empty1}).wait().ok());
  // One-byte elements are always aligned.
  std::vector<uint8_t> bytes(20, 1);
  Tensor b0(bytes.data() + 1, DType::kUInt8, int64_t{8}, Device::cpu(0));
  Tensor b1(bytes.data() + 11, DType::kUInt8, int64_t{8}, Device::cpu(1));
  EXPECT_TRUE(ops_->all_reduce(ReduceOp::kSum, {b0, b1}, {b0, b1}).wait().ok());
}

TEST_F(Validation, NullDataWithCount) {
  Tensor null(nullptr, DType::kFloat32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), null}, {out(0), out(1)}),
               StatusCode::kInvalidArgument, "inputs[1] has null data but 8 elements");
  Tensor null_empty(nullptr, DType::kFloat32, int64_t{0}, Device::cpu(1));
  Tensor empty0(in_[0].data(), DType::kFloat32, int64_t{0}, Device::cpu(0));
  EXPECT_TRUE(ops_->all_reduce(ReduceOp::kSum, {empty0, null_empty}, {empty0, null_empty})
                  .wait()
                  .ok());
}

TEST_F(Validation, DtypeMismatch) {
  Tensor as_int(in_[1].data(), DType::kInt32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), as_int}, {out(0), out(1)}),
               StatusCode::kInvalidArgument,
               "inputs[1] has dtype int32 but inputs[0] has float32; every replica must pass the "
               "same dtype");
  Tensor out_int(out_[1].data(), DType::kInt32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), out_int}),
               StatusCode::kInvalidArgument, "outputs[1] has dtype int32");
}

TEST_F(Validation, ShapeMismatch) {
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0, 8), in(1, 7)}, {out(0), out(1)}),
               StatusCode::kInvalidArgument,
               "inputs[1] has 7 elements [7] but inputs[0] has 8 [8]");
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), out(1, 9)}),
               StatusCode::kInvalidArgument, "outputs[1] has 9 elements but must have 8");
  Tensor negative(in_[0].data(), DType::kFloat32, Shape{-1}, Device::cpu(0));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {negative, in(1)}, {out(0), out(1)}),
               StatusCode::kInvalidArgument, "negative dimension");
}

TEST_F(Validation, WrongDevice) {
  Tensor on_cpu0(in_[1].data(), DType::kFloat32, int64_t{8}, Device::cpu(0));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), on_cpu0}, {out(0), out(1)}),
               StatusCode::kInvalidArgument, "inputs[1] is on CPU:0 but local replica 1 is CPU:1");
  Tensor gpu(out_[1].data(), DType::kFloat32, int64_t{8}, Device::cuda(0));
  if (!ops_->capabilities().supports(DeviceType::kCuda)) {  // built without CUDA
    expect_error(ops_->reduce(ReduceOp::kSum, {in(0), in(1)}, {gpu}), StatusCode::kUnimplemented,
                 "destinations[0] is on GPU:0 but backend 'reduction_to_one_device' does not "
                 "support GPU devices");
  } else if (cuda_device_count() == 0) {  // built with CUDA, on a machine without a GPU
    expect_error(ops_->reduce(ReduceOp::kSum, {in(0), in(1)}, {gpu}),
                 StatusCode::kFailedPrecondition,
                 "destinations[0]: GPU:0 is not usable: no CUDA device is visible");
  }
}

TEST_F(Validation, OverlappingBuffers) {
  // outputs[1] overlaps outputs[0]
  Tensor shifted(out_[0].data() + 4, DType::kFloat32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), shifted}),
               StatusCode::kInvalidArgument, "outputs[0] and outputs[1] overlap");
  // an output that is another replica's input
  Tensor other_input(in_[0].data(), DType::kFloat32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), other_input}),
               StatusCode::kInvalidArgument, "outputs[1] overlaps inputs[0]");
  // partial overlap with its own input
  Tensor partial(in_[1].data() + 1, DType::kFloat32, int64_t{8}, Device::cpu(1));
  expect_error(ops_->all_reduce(ReduceOp::kSum, {in(0), in(1)}, {out(0), partial}),
               StatusCode::kInvalidArgument, "may only be exactly its own replica's input");
}

TEST_F(Validation, ReduceAndBroadcastArguments) {
  expect_error(ops_->reduce(ReduceOp::kSum, {in(0), in(1)}, {}), StatusCode::kInvalidArgument,
               "destinations can not be empty");
  expect_error(ops_->broadcast(in(0), {out(0)}, 1), StatusCode::kInvalidArgument,
               "root 1 is not a process rank in [0, 1)");
  expect_error(ops_->batch_reduce(ReduceOp::kSum, {}), StatusCode::kInvalidArgument,
               "value_destination_pairs is empty");
  std::vector<ReducePair> pairs = {{{in(0), in(1)}, {out(0)}}, {{in(0), in(1)}, {out(0)}}};
  expect_error(ops_->batch_reduce(ReduceOp::kSum, pairs), StatusCode::kInvalidArgument,
               "overlap");
}

TEST_F(Validation, GatherAndScatterCounts) {
  expect_error(ops_->all_gather({in(0, 4), in(1, 4)}, {out(0, 4), out(1, 4)}),
               StatusCode::kInvalidArgument,
               "outputs[0] has 4 elements but must have 8 (num_replicas_in_sync (2) x the input's "
               "count)");
  expect_error(ops_->reduce_scatter(ReduceOp::kSum, {in(0, 7), in(1, 7)}, {out(0, 3), out(1, 3)}),
               StatusCode::kInvalidArgument, "not a multiple of num_replicas_in_sync (2)");
}

// Past a few dozen replicas the overlap rules are checked on sorted ranges (O(n log n)); the same
// rules hold: outputs apart, an output either apart from every input or exactly its own input.
TEST(ValidationManyReplicas, OverlapRulesHoldOnSortedRanges) {
  constexpr int kReplicas = 100;
  BackendContext ctx;
  ctx.devices.clear();
  for (int i = 0; i < kReplicas; ++i) ctx.devices.push_back(Device::cpu(i));
  auto made = builtin_backends().create("reduction_to_one_device", ctx);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  CrossDeviceOps& ops = **made;
  std::vector<float> in(kReplicas * 4, 1.0f), out(kReplicas * 4, 0.0f);
  // Replicas in reverse address order, so that sorting matters.
  // Replica `i`'s tensor at slot `at` of `v`, shifted by `offset` elements.
  auto view = [&](std::vector<float>& v, int i, int at = -1, int64_t offset = 0) {
    at = at < 0 ? i : at;
    return Tensor(v.data() + (kReplicas - 1 - at) * 4 + offset, DType::kFloat32, int64_t{4},
                  Device::cpu(i));
  };
  PerReplica<Tensor> ins, outs;
  for (int i = 0; i < kReplicas; ++i) {
    ins.values().push_back(view(in, i));
    outs.values().push_back(view(out, i));
  }
  ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, ins, outs).wait().ok());
  EXPECT_EQ(out[0], static_cast<float>(kReplicas));
  ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, ins, ins).wait().ok());  // in place
  EXPECT_EQ(in[0], static_cast<float>(kReplicas));

  PerReplica<Tensor> bad = outs;
  bad.values()[70] = view(out, 70, 71, 2);  // half of outputs[71]
  Status s = ops.all_reduce(ReduceOp::kSum, ins, bad).wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("outputs[70] and outputs[71] overlap"), std::string::npos) << s.to_string();

  bad = outs;
  bad.values()[40] = view(in, 40, 41);  // another replica's input
  s = ops.all_reduce(ReduceOp::kSum, ins, bad).wait();
  EXPECT_NE(s.message().find("outputs[40] overlaps inputs[41]"), std::string::npos) << s.to_string();

  bad = outs;
  bad.values()[9] = view(in, 9, 9, 1);  // its own input, shifted by one element
  s = ops.all_reduce(ReduceOp::kSum, ins, bad).wait();
  EXPECT_NE(s.message().find("outputs[9] overlaps inputs["), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace tributary
