// The strategy layer with its replicas on GPUs: variables, checkpoints, reductions with an axis or
// to the host, losses with weights on the GPU, and MultiWorkerMirrored over workers whose replica
// is a GPU (the input's agreement across workers, the chief's broadcasts, checkpoints). Each reads
// or writes values that live in GPU memory, which host code must reach through copies. Without a
// visible GPU every case is a skip that says why.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "tests/gpu/skip.h"
#include "tests/multiprocess/harness.h"
#include "tributary/registry.h"
#include "tributary/strategy/distributed_input.h"
#include "tributary/strategy/losses.h"
#include "tributary/strategy/strategies.h"
#include "tributary/strategy/variable.h"

#if defined(TRIBUTARY_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tributary {
namespace {

std::vector<float> host_floats(const Array& a) {
  auto host = a.to_device(Device::cpu());
  return host.ok() ? host->to_vector<float>() : std::vector<float>{};
}

TEST(GpuStrategyValues, VariablesCheckpointsAndReductionsOnAGpu) {
  SKIP_WITHOUT_GPUS(1);
  MirroredStrategyOptions o;
  o.devices = {Device::cuda(0)};
  auto made = make_mirrored_strategy(o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Strategy& s = **made;
  auto scope = s.scope();
  ASSERT_TRUE(scope.ok());
  auto w = s.create_variable(*Array::from_vector<float>({1, 2}),
                             {"w", VariableSynchronization::kOnWrite, VariableAggregation::kSum});
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->values()[0].device(), Device::cuda(0));
  ASSERT_TRUE(s.run([&](ReplicaContext&) {
                 return w->assign_add(*Array::from_vector<float>({10, 20}));
               }).ok());
  auto read = w->read();
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(host_floats(*read), (std::vector<float>{11, 22}));

  // A checkpoint of a GPU variable, restored over a changed value.
  const std::string path = testing::make_temp_dir("gpu_checkpoint") + "/ckpt";
  ASSERT_TRUE(save_checkpoint(path, std::vector<Variable>{*w}).ok());
  ASSERT_TRUE(w->assign(*Array::from_vector<float>({0, 0})).ok());
  Status restored = restore_checkpoint(path, std::vector<Variable>{*w});
  ASSERT_TRUE(restored.ok()) << restored.message();
  EXPECT_EQ(host_floats(w->values()[0]), (std::vector<float>{11, 22}));

  // Reductions of GPU values: along an axis (host math on a copy), and to the host.
  auto on_gpu = Array::from_vector<float>({1, 2, 3, 6}, {4, 1})->to_device(Device::cuda(0));
  ASSERT_TRUE(on_gpu.ok());
  PerReplica<Array> v({*on_gpu});
  auto mean = s.reduce(ReduceOp::kMean, v, 0);
  ASSERT_TRUE(mean.ok()) << mean.status().message();
  EXPECT_EQ(host_floats(*mean), (std::vector<float>{3}));
  auto to_host = s.reduce_to(ReduceOp::kSum, v, std::vector<Device>{Device::cpu()});
  ASSERT_TRUE(to_host.ok()) << to_host.status().message();
  EXPECT_EQ((*to_host)[0].device(), Device::cpu());
  EXPECT_EQ((*to_host)[0].to_vector<float>(), (std::vector<float>{1, 2, 3, 6}));
  auto spread = s.broadcast_to(*Array::from_vector<float>({5, 6}), *w);
  ASSERT_TRUE(spread.ok()) << spread.status().message();
  EXPECT_EQ(host_floats((*spread)[0]), (std::vector<float>{5, 6}));

  // Helpers that return no Status work on GPU arrays through host copies.
  Array summed = reduce_sum_all(*on_gpu);
  EXPECT_EQ(summed.device(), Device::cuda(0));
  EXPECT_EQ(host_floats(summed), (std::vector<float>{12}));
  Array wide = cast(*on_gpu, DType::kFloat64);
  EXPECT_EQ(wide.device(), Device::cuda(0));

  // A loss weighted by weights that came to the replica's GPU with the batch.
  auto weights = Array::from_vector<float>({1, 0})->to_device(Device::cuda(0));
  ASSERT_TRUE(weights.ok());
  auto loss = s.run([&](ReplicaContext&) -> StatusOr<Array> {
    return compute_average_loss(*Array::from_vector<float>({4, 8}), *weights, 2);
  });
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_EQ(host_floats((*loss)[0]), (std::vector<float>{2}));
}

#if defined(TRIBUTARY_HAVE_CUDA)
// A copy from GPU:0 to GPU:1 right after work queued on GPU:0's default stream sees that work's
// result (the copy waits for an event recorded after it, on the source GPU).
TEST(GpuCopies, APeerCopyWaitsForTheSourceGpusWork) {
  SKIP_WITHOUT_GPUS(2);
  constexpr int64_t kBytes = int64_t{256} << 20;
  auto a = Array::zeros(DType::kUInt8, {kBytes}, Device::cuda(0));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (int k = 1; k <= 8; ++k) {  // long enough to be still running when the copy is asked for
    ASSERT_EQ(cudaMemsetAsync(a->tensor().data(), k, static_cast<size_t>(kBytes), nullptr),
              cudaSuccess);
  }
  auto b = a->to_device(Device::cuda(1));
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto host = b->to_device(Device::cpu());
  ASSERT_TRUE(host.ok()) << host.status().message();
  const auto* bytes = host->data<uint8_t>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < kBytes; ++i) wrong += bytes[i] != 8;
  EXPECT_EQ(wrong, 0) << "bytes copied before GPU:0's memsets had finished";
}
#endif

// MultiWorkerMirrored over 2 processes whose replica is a GPU: `ring` with both sharing GPU:0
// (staged through host memory), `nccl` with GPU:rank (two GPUs). A finite dataset with a partial
// batch (the workers agree on it through a collective whose result is on the GPU), variables from
// the chief, ONLY_FIRST_REPLICA updates, checkpoints, values that are not distributed.
class GpuMultiWorker : public ::testing::TestWithParam<std::string> {};

// CUDA must not be initialised in the parent before the fork: the children look for the GPUs
// (run it alone, as scripts/gpu_run.sh does).
TEST_P(GpuMultiWorker, DataVariablesAndCheckpointsAcrossGpuWorkers) {
  const bool nccl = GetParam() == "nccl";
  const int gpus = nccl ? 2 : 1;
  if (!builtin_backends().find(GetParam())) GTEST_SKIP() << GetParam() << " is not built in";
  const std::string dir = testing::make_temp_dir("gpu_multi_worker");
  const std::string path = dir + "/ckpt";
  auto result = testing::run_group(2, std::chrono::seconds(120), [&](int rank) -> int {
    auto fail = [&](int line, const Status& st) {
      std::fprintf(stderr, "rank %d: line %d: %s\n", rank, line, st.to_string().c_str());
      return testing::kChildFailed;
    };
    if (cuda_device_count() < gpus) return testing::kChildSkip;
    auto ctx = testing::group_context(rank, 2, 1, dir);
    if (!ctx.ok()) return fail(__LINE__, ctx.status());
    ctx->devices = {Device::cuda(nccl ? rank : 0)};
    MultiWorkerMirroredStrategyOptions o;
    o.context = std::move(*ctx);
    o.communication.implementation = GetParam();
    o.communication.timeout = std::chrono::seconds(60);
    auto made = make_multi_worker_mirrored_strategy(std::move(o));
    if (!made.ok()) return fail(__LINE__, made.status());
    Strategy& s = **made;
    auto w = s.create_variable(Array::scalar(static_cast<float>(rank + 1)),
                               {"w", VariableSynchronization::kOnWrite, VariableAggregation::kSum});
    if (!w.ok()) return fail(__LINE__, w.status());
    auto first = s.create_variable(Array::scalar(0.0f), {"first", VariableSynchronization::kOnWrite,
                                                         VariableAggregation::kOnlyFirstReplica});
    if (!first.ok()) return fail(__LINE__, first.status());
    Status step = s.run([&](ReplicaContext& c) -> Status {
      TRIBUTARY_RETURN_IF_ERROR(w->assign_add(Array::scalar(10.0f)));
      return first->assign(Array::scalar(static_cast<float>(100 + c.replica_id_in_sync_group())));
    });
    if (!step.ok()) return fail(__LINE__, step);
    // The chief's 1, plus 10 from each of the two replicas.
    if (host_floats(*w->read()) != std::vector<float>{21})
      return fail(__LINE__, internal_error("w"));
    if (host_floats(*first->read()) != std::vector<float>{100}) {
      return fail(__LINE__, internal_error("first"));
    }
    // 10 elements in global batches of 4: 2 full steps and a partial one, on every worker.
    auto dd = distribute_dataset(s, Dataset::range(10).batch(4));
    if (!dd.ok()) return fail(__LINE__, dd.status());
    auto it = dd->make_iterator();
    if (!it.ok()) return fail(__LINE__, it.status());
    int steps = 0;
    for (;;) {
      auto batch = it->get_next();
      if (!batch.ok() && batch.status().code() == StatusCode::kOutOfRange) break;
      if (!batch.ok()) return fail(__LINE__, batch.status());
      ++steps;
    }
    if (steps != 3) return fail(__LINE__, internal_error(std::to_string(steps) + " steps"));
    if (!save_checkpoint(path, std::vector<Variable>{*w}).ok()) {
      return fail(__LINE__, internal_error("save"));
    }
    if (Status a = w->assign(Array::scalar(0.0f)); !a.ok()) return fail(__LINE__, a);
    if (Status r = restore_checkpoint(path, std::vector<Variable>{*w}); !r.ok()) {
      return fail(__LINE__, r);
    }
    if (host_floats(*w->read()) != std::vector<float>{21}) {
      return fail(__LINE__, internal_error("restored"));
    }
    auto total = s.reduce(ReduceOp::kSum, Array::scalar(static_cast<float>(rank + 1)));
    if (!total.ok()) return fail(__LINE__, total.status());
    if (total->to_vector<float>() != std::vector<float>{3}) {
      return fail(__LINE__, internal_error("reduce"));
    }
    return testing::kChildOk;
  });
  EXPECT_FALSE(result.watchdog_fired) << result.describe();
  for (const auto& c : result.children) {
    if (c.exit_code == testing::kChildSkip) {
      GTEST_SKIP() << "needs " << gpus << " CUDA device(s) in each worker; fewer visible ("
                   << gpu::visible_devices_text() << ")";
    }
    EXPECT_EQ(c.exit_code, testing::kChildOk) << result.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuMultiWorker, ::testing::Values("ring", "nccl"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tributary
