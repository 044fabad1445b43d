// The host-staging layer (core/host_staging.h) over real host backends in real processes, without a
// GPU: fakes::PlainStaging stages the CPU tensors of the even ranks through twins in other memory,
// as CUDA's copies stage GPU tensors, while the odd ranks call their backend directly. Every
// collective, op and dtype of the multi-process conformance suite must come out exact, on ranks
// that stage and ranks that do not in one group, and a registration of staged buffers must work as
// one of plain ones (gloo runs its registered instances on the twins). The same on GPU tensors,
// with CUDA's copies, is tests/gpu/staged_test.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>

#include "core/host_staging.h"
#include "tests/core/plain_staging.h"
#include "tests/multiprocess/conformance.h"
#include "tests/multiprocess/harness.h"
#include "tributary/registry.h"

namespace tributary::testing {
namespace {

// spec, world, local replicas
using StagedParam = std::tuple<std::string, int, int>;
class StagedHost : public ::testing::TestWithParam<StagedParam> {};

// Rank `rank`'s backend: staged on even ranks, plain on odd ones. A staged rank's replicas are
// CPU:10, CPU:11, ... while its backend is made for CPU:0, CPU:1, ..., as a GPU replica's backend
// is made for a CPU device of its own: the wrapper relabels what it hands over.
StatusOr<std::unique_ptr<CrossDeviceOps>> make(const std::string& spec, int rank, int world,
                                               int local, const std::string& dir,
                                               std::shared_ptr<fakes::PlainStaging> staging) {
  TRIBUTARY_ASSIGN_OR_RETURN(BackendContext ctx, group_context(rank, world, local, dir));
  TRIBUTARY_ASSIGN_OR_RETURN(auto ops, builtin_backends().create(spec + ",timeout=60s", ctx));
  if (rank % 2 == 1) return ops;
  BackendContext outer = ctx;
  for (int k = 0; k < local; ++k) outer.devices[static_cast<size_t>(k)] = Device::cpu(10 + k);
  return internal::make_host_staged_ops(outer, std::move(ops), std::move(staging));
}

TEST_P(StagedHost, EveryCollectiveOnStagedAndPlainRanks) {
  const std::string spec = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  const int local = std::get<2>(GetParam());
  const std::string dir = make_temp_dir("staged_host");
  GroupResult g = run_group(world, std::chrono::seconds(240), [&](int rank) {
    auto staging = std::make_shared<fakes::PlainStaging>();
    auto ops = make(spec, rank, world, local, dir, staging);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    const int failures = run_conformance_matrix(**ops, spec);
    // The even ranks really staged: bytes went to the twins and came back.
    if (rank % 2 == 0 && (staging->bytes_in.load() == 0 || staging->bytes_out.load() == 0)) {
      std::fprintf(stderr, "[rank %d] nothing was staged\n", rank);
      return kChildFailed;
    }
    return failures == 0 ? kChildOk : kChildFailed;
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

std::string name_of(const ::testing::TestParamInfo<StagedParam>& info) {
  std::string s = std::get<0>(info.param);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s + "_w" + std::to_string(std::get<1>(info.param)) + "_l" +
         std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, StagedHost,
                         ::testing::Values(StagedParam{"ring:intra_host=shm", 2, 2},
                                           StagedParam{"ring:intra_host=net", 3, 1},
                                           StagedParam{"gloo:verify=true", 2, 1},
                                           StagedParam{"gloo:verify=false", 3, 2},
                                           StagedParam{"ucx:tls=tcp", 2, 1}),
                         name_of);

// A registration of staged buffers, used in place with changing inputs by all_reduce and by a
// batch_reduce of one value (which gloo runs on its registered instance too), then released: gloo
// binds its registered instances to the twins on the staged ranks and to the buffers on the plain
// one, and the ranks must stay in step, with the fingerprint check (verify=true) and without it.
class StagedHostRegistration : public ::testing::TestWithParam<std::string> {};

TEST_P(StagedHostRegistration, RegisteredBuffersOnGloo) {
  constexpr int kWorld = 3;
  const std::string spec = GetParam();
  const std::string dir = make_temp_dir("staged_registered");
  GroupResult g = run_group(kWorld, std::chrono::seconds(120), [&](int rank) {
    auto staging = std::make_shared<fakes::PlainStaging>();
    auto ops = make(spec, rank, kWorld, 1, dir, staging);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    const Device device = (*ops)->devices()[0];
    std::vector<float> data(40001);
    const Tensor t(data.data(), DType::kFloat32, static_cast<int64_t>(data.size()), device);
    auto reg = (*ops)->register_buffers({t});
    if (!reg.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, reg.status().to_string().c_str());
      return kChildFailed;
    }
    for (int step = 0; step < 8; ++step) {
      if (step == 6) reg->release();
      for (size_t i = 0; i < data.size(); ++i) {
        data[i] = static_cast<float>((rank + 1) * (step + 1) + static_cast<int>(i % 5));
      }
      // Odd steps: a batch_reduce of the one value into the registered buffer.
      const std::vector<ReducePair> pair = {{{t}, {t}}};
      Status s = step % 2 == 0 ? (*ops)->all_reduce(ReduceOp::kSum, {t}, {t}).wait()
                               : (*ops)->batch_reduce(ReduceOp::kSum, pair).wait();
      if (!s.ok()) {
        std::fprintf(stderr, "[rank %d] step %d: %s\n", rank, step, s.to_string().c_str());
        return kChildFailed;
      }
      for (size_t i = 0; i < data.size(); ++i) {
        const float want = static_cast<float>(6 * (step + 1) + kWorld * static_cast<int>(i % 5));
        if (data[i] != want) {
          std::fprintf(stderr, "[rank %d] step %d: element %zu is %g, want %g\n", rank, step, i,
                       static_cast<double>(data[i]), static_cast<double>(want));
          return kChildFailed;
        }
      }
    }
    return kChildOk;
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) GTEST_SKIP() << "gloo is not built into this tributary";
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

INSTANTIATE_TEST_SUITE_P(Verify, StagedHostRegistration,
                         ::testing::Values("gloo:verify=true", "gloo:verify=false"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "gloo:verify=true" ? std::string("verify")
                                                                   : std::string("no_verify");
                         });

}  // namespace
}  // namespace tributary::testing
