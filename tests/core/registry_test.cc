// The registry and the CrossDeviceOps front door, with a recording fake backend (the layer above
// backends may be tested with a fake) and with the real built-in backends.
#include "tributary/registry.h"

#include <gtest/gtest.h>

#include <vector>

#include "algorithms/device_reduce.h"
#include "core/gpu.h"
#include "tests/core/recording_ops.h"

namespace tributary {
namespace {

BackendInfo recording_info(std::vector<CallInfo>* log, int priority = 1) {
  BackendInfo info;
  info.name = "recording";
  info.summary = "records calls";
  info.capabilities.device_types = {DeviceType::kCpu};
  info.capabilities.dtypes = {DType::kFloat32};
  info.capabilities.ops = {ReduceOp::kSum};
  info.capabilities.collectives = {Collective::kAllReduce, Collective::kReduce};
  info.auto_priority = priority;
  info.create = [log, caps = info.capabilities](const BackendContext& ctx, Options o)
      -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    return std::unique_ptr<CrossDeviceOps>(
        std::make_unique<fakes::RecordingOps>(
            "recording", ctx, std::move(o), caps,
            [log](const CrossDeviceOps&, const CallInfo& c) { log->push_back(c); }));
  };
  return info;
}

BackendContext two_cpus() {
  BackendContext ctx;
  ctx.devices = {Device::cpu(0), Device::cpu(1)};
  return ctx;
}

TEST(Registry, BuiltinBackendsAreListed) {
  BackendRegistry r = builtin_backends();
  std::vector<std::string> names = r.names();
  EXPECT_NE(std::find(names.begin(), names.end(), "reduction_to_one_device"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "hierarchical_copy"), names.end());
  EXPECT_EQ(*r.choose_auto(two_cpus()), "reduction_to_one_device");
}

TEST(Registry, UnknownBackendListsAvailable) {
  BackendRegistry r = builtin_backends();
  auto made = r.create("no_such_backend", two_cpus());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kNotFound);
  // The list is what this build has; the in-process and ring backends are always there.
  std::string list;
  for (const std::string& n : r.names()) list += ", " + n;
  EXPECT_EQ(made.status().message(),
            "unknown backend 'no_such_backend'; available backends: auto" + list);
  EXPECT_NE(list.find(", reduction_to_one_device, hierarchical_copy, ring"), std::string::npos);
}

TEST(Registry, SpecOptionsReachTheBackend) {
  BackendRegistry r = builtin_backends();
  auto made = r.create("hierarchical_copy:num_packs=3,timeout=2s", two_cpus());
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ((*made)->options().get_int("num_packs"), 3);
  EXPECT_EQ((*made)->timeout(), std::chrono::seconds(2));
  EXPECT_EQ((*made)->spec(), "hierarchical_copy:group_size=0,num_packs=3,timeout=2s");
  auto bad = r.create("hierarchical_copy:num_packs=-1", two_cpus());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_packs"), std::string::npos);
  auto unknown_key = r.create("reduction_to_one_device:num_packs=2", two_cpus());
  ASSERT_FALSE(unknown_key.ok());
  EXPECT_NE(unknown_key.status().message().find("reduce_to_device (string"), std::string::npos);
  EXPECT_NE(unknown_key.status().message().find("timeout (duration"), std::string::npos);
  auto bad_device = r.create("reduction_to_one_device:reduce_to_device=TPU:0", two_cpus());
  ASSERT_FALSE(bad_device.ok());
  EXPECT_NE(bad_device.status().message().find("'TPU:0'"), std::string::npos);
  // A GPU this process cannot see is refused when the backend is made, saying so.
  if (gpu::device_count() == 0) {
    auto unseen = r.create("reduction_to_one_device:reduce_to_device=GPU:0", two_cpus());
    ASSERT_FALSE(unseen.ok());
    EXPECT_NE(unseen.status().message().find("reduce_to_device"), std::string::npos)
        << unseen.status().message();
    // Built with CUDA: no GPU is visible; without: the backend takes no GPU at all.
    const std::string& m = unseen.status().message();
    EXPECT_TRUE(m.find("GPU:0 is not usable") != std::string::npos ||
                m.find("GPU:0 is not a supported device type") != std::string::npos)
        << m;
  }
}

TEST(Registry, AutoAcceptsOnlyCommonOptions) {
  BackendRegistry r = builtin_backends();
  auto a = r.create("auto:timeout=3s", two_cpus());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ((*a)->name(), "reduction_to_one_device");
  EXPECT_EQ((*a)->timeout(), std::chrono::seconds(3));
  EXPECT_FALSE(r.create("auto:num_packs=2", two_cpus()).ok());
}

TEST(Registry, ConfigSelectsAndErrorsNameTheSource) {
  BackendRegistry r = builtin_backends();
  BackendContext ctx = two_cpus();
  ctx.config = Config::from_map({{"TRIBUTARY_CROSS_DEVICE_OPS", "hierarchical_copy"}});
  EXPECT_EQ((*r.create_from_config(ctx))->name(), "hierarchical_copy");
  ctx.config = Config::from_map({{"TRIBUTARY_CROSS_DEVICE_OPS", "bogus"}});
  auto bad = r.create_from_config(ctx);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("TRIBUTARY_CROSS_DEVICE_OPS='bogus'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("available backends"), std::string::npos);
}

// check() finds what create() would refuse in the spec itself, with create()'s words, and needs
// no context: the tools call it before the rendezvous.
TEST(Registry, CheckRefusesWhatCreateRefusesInTheSpec) {
  const BackendRegistry r = builtin_backends();
  const Config none;
  for (const char* good : {"ring", "ring:segment_bytes=64K,timeout=10s", "auto",
                           "auto:timeout=3s", "reduction_to_one_device", "nccl:num_packs=2"}) {
    const std::string name(std::string_view(good).substr(0, std::string_view(good).find(':')));
    if (name != "auto" && r.find(name) == nullptr) continue;  // not built in (nccl without CUDA)
    EXPECT_TRUE(r.check(good, none).ok()) << good << ": " << r.check(good, none).to_string();
  }
  const std::pair<const char*, const char*> bad[] = {
      {"foo", "unknown backend 'foo'; available backends: auto, "},
      {"ring:", "cannot parse backend spec 'ring:'"},
      {"ring:intra_host=net:timeout=10s", "has two '='"},
      {"ring:segment_bytes=abc", "bad value 'abc' for option segment_bytes"},
      {"ring:no_such_option=1", "no_such_option"},
      {"ring:timeout=0s", "timeout must be positive"},
      {"auto:num_packs=2", "'auto' accepts only the options every backend has"},
  };
  // What a backend refuses of its values without a context (BackendInfo::check_options).
  const std::pair<const char*, const char*> refused[] = {
      {"ring:slice_bytes=1", "slice_bytes must be 0 (auto) or at least 4KiB"},
      {"ring:shm_chunk_bytes=3", "shm_chunk_bytes must be 0 (auto) or at least 4KiB"},
      {"ring:host=999.1.1.1", "is not an IP address"},
      {"ucx:segment_bytes=1", "segment_bytes must be 0 (auto) or at least 4KiB"},
      {"gloo:reduce_scatter=halving_doubling,mode=async", "needs mode=sync or mode=busy_poll"},
      {"gloo:host=bogus.invalid", "is not an IP address"},  // Gloo's device crashed on it
      {"gloo:host=localhost", "is not an IP address"},
      {"gloo:bcube_base=1", "bcube_base=1 is not a BCube"},
      {"gloo:iface=nosuchif0", "iface 'nosuchif0' is not a network interface of this machine"},
      {"nccl:num_packs=-1", "requires num_packs >= 0"},
  };
  for (const auto& [spec, says] : refused) {
    const std::string name(std::string_view(spec).substr(0, std::string_view(spec).find(':')));
    if (r.find(name) == nullptr) continue;  // not built in
    const Status s = r.check(spec, none);
    EXPECT_NE(s.message().find(says), std::string::npos) << spec << ": " << s.to_string();
  }
  // auto's shared options are checked for their values too (create() meets them in the backend
  // auto picks, so its words differ).
  EXPECT_NE(r.check("auto:timeout=abc", none).message().find("bad value 'abc' for option timeout"),
            std::string::npos);
  EXPECT_FALSE(r.check("auto:timeout=0s", none).ok());
  EXPECT_FALSE(r.create("auto:timeout=abc", two_cpus()).ok());
  for (const auto& [spec, says] : bad) {
    const Status s = r.check(spec, none);
    EXPECT_FALSE(s.ok()) << spec;
    EXPECT_NE(s.message().find(says), std::string::npos) << spec << ": " << s.message();
    // The same words as create() (for the one-process context it can be made in).
    auto made = r.create(spec, two_cpus());
    ASSERT_FALSE(made.ok()) << spec;
    EXPECT_NE(made.status().message().find(says), std::string::npos) << made.status().message();
  }
  // An empty spec checks the config's, naming where it came from; a config's TRIBUTARY_* option
  // value is checked too.
  const Config bogus = Config::from_map({{"TRIBUTARY_CROSS_DEVICE_OPS", "bogus"}});
  const Status from_config = r.check("", bogus);
  EXPECT_NE(from_config.message().find("TRIBUTARY_CROSS_DEVICE_OPS='bogus'"), std::string::npos)
      << from_config.message();
  EXPECT_TRUE(r.check("", none).ok());  // auto
  const Config bad_value = Config::from_map({{"TRIBUTARY_RING_SEGMENT_BYTES", "lots"}});
  EXPECT_FALSE(r.check("ring", bad_value).ok());
}

TEST(Registry, GpuDevicesWithoutAVisibleGpuAreAClearError) {
  BackendRegistry r = builtin_backends();
  BackendContext gpus;
  gpus.devices = {Device::cuda(0), Device::cuda(1)};
  if (cuda_device_count() >= 2) {
    GTEST_SKIP() << cuda_device_count() << " GPUs are visible: the refusal cannot happen here";
  }
  // The host backends too: built with CUDA they serve GPU tensors through host staging, so their
  // refusal is the same as the GPU backends'.
  for (const std::string name :
       {"hierarchical_copy", "reduction_to_one_device", "nccl", "ring", "gloo", "ucx"}) {
    if (r.find(name) == nullptr) continue;  // a backend not built in
    auto made = r.create(name, gpus);
    ASSERT_FALSE(made.ok()) << name;
    const std::string& m = made.status().message();
    if (!algorithms::device_kernels_built()) {
      EXPECT_NE(m.find("does not support GPU devices"), std::string::npos) << m;
    } else {
      // Built with CUDA: the error says why the GPU is not usable, and where to look.
      EXPECT_NE(m.find("is not usable"), std::string::npos) << m;
      EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << m;
      EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition) << m;
    }
  }
  auto a = r.choose_auto(gpus);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("reduction_to_one_device: "), std::string::npos);
}

TEST(Registry, HostBackendsStageGpuTensorsWhenBuiltWithCuda) {
  BackendRegistry r = builtin_backends();
  const bool cuda = algorithms::device_kernels_built();
  for (const std::string name : {"ring", "gloo", "ucx"}) {
    if (const BackendInfo* b = r.find(name)) {
      EXPECT_EQ(stages_gpu_through_host(*b), cuda) << name;
    }
  }
  // Backends that serve GPU memory themselves do not stage.
  for (const std::string name : {"reduction_to_one_device", "hierarchical_copy", "nccl"}) {
    if (const BackendInfo* b = r.find(name)) {
      EXPECT_FALSE(stages_gpu_through_host(*b)) << name;
    }
  }
  // can_serve is the check create() makes: a GPU replica is refused for its visibility when
  // staging applies, and for the device type when it cannot.
  BackendContext mixed;
  mixed.devices = {Device::cpu(0), Device::cuda(0)};
  if (cuda_device_count() == 0) {
    Status s = can_serve(*r.find("ring"), mixed);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(cuda ? "GPU:0 is not usable" : "does not support GPU devices"),
              std::string::npos)
        << s.message();
  }
  EXPECT_TRUE(can_serve(*r.find("ring"), BackendContext()).ok());
}

TEST(Registry, InProcessBackendsRefuseMultiProcess) {
  BackendRegistry r = builtin_backends();
  BackendContext multi = two_cpus();
  multi.world_size = 2;
  EXPECT_FALSE(r.create("reduction_to_one_device", multi).ok());
}

TEST(Registry, RegistriesAreIndependentValues) {
  std::vector<CallInfo> log;
  BackendRegistry mine = builtin_backends();
  ASSERT_TRUE(mine.add(recording_info(&log, 100)).ok());
  EXPECT_FALSE(mine.add(recording_info(&log)).ok());  // duplicate name
  EXPECT_EQ(*mine.choose_auto(two_cpus()), "recording");
  EXPECT_EQ(builtin_backends().find("recording"), nullptr);
}

TEST(FrontDoor, SequenceNumbersAndNoImplCallOnInvalidInput) {
  std::vector<CallInfo> log;
  BackendRegistry r;
  ASSERT_TRUE(r.add(recording_info(&log)).ok());
  auto ops = r.create("recording", two_cpus());
  ASSERT_TRUE(ops.ok());
  float a[4] = {}, b[4] = {};
  PerReplica<Tensor> v{Tensor(a, DType::kFloat32, int64_t{4}, Device::cpu(0)),
                       Tensor(b, DType::kFloat32, int64_t{4}, Device::cpu(1))};
  ASSERT_TRUE((*ops)->all_reduce(ReduceOp::kSum, v, v).wait().ok());
  ASSERT_TRUE((*ops)->all_reduce(ReduceOp::kSum, v, v).wait().ok());
  // Unsupported op, dtype and collective: errors naming the backend; nothing reaches the impl.
  Status op = (*ops)->all_reduce(ReduceOp::kMax, v, v).wait();
  EXPECT_EQ(op.code(), StatusCode::kUnimplemented);
  EXPECT_NE(op.message().find("backend 'recording' does not support reduce op max"),
            std::string::npos);
  Status coll = (*ops)->all_gather(v, v).wait();
  EXPECT_EQ(coll.code(), StatusCode::kUnimplemented);
  EXPECT_NE(coll.message().find("all_gather is not supported by backend 'recording'"),
            std::string::npos);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].sequence, 1u);
  EXPECT_EQ(log[1].sequence, 2u);
  EXPECT_EQ(log[1].count, 4);
  EXPECT_EQ(log[1].describe(), "all_reduce #2 (16B float32, sum)");
  EXPECT_EQ((*ops)->last_sequence(), 2u);
}

}  // namespace
}  // namespace tributary
