// Tuning files (TuningTable) and how `auto` follows them, with recording fake backends (the layer
// above backends may be tested with fakes) and with the real in-process backends.
#include "tributary/tuning.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "tests/core/recording_ops.h"
#include "tributary/registry.h"
#include "tributary/store.h"
#include "tributary/version.h"

namespace tributary {
namespace {

struct Call {
  std::string backend;
  Collective collective;
};

BackendInfo recorder(const std::string& name, std::vector<Call>* log,
                     std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64},
                     bool multi_process = false) {
  BackendInfo info;
  info.name = name;
  info.summary = "records calls";
  info.capabilities.device_types = {DeviceType::kCpu};
  info.capabilities.dtypes = std::move(dtypes);
  info.capabilities.ops = {ReduceOp::kSum, ReduceOp::kMax};
  info.capabilities.collectives = {Collective::kAllReduce, Collective::kReduce,
                                   Collective::kBatchReduce, Collective::kBroadcast,
                                   Collective::kAllGather, Collective::kReduceScatter};
  info.capabilities.multi_process = multi_process;
  info.auto_priority = name == "small" ? 2 : 1;
  info.create = [name, log, caps = info.capabilities](const BackendContext& ctx, Options o)
      -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    return std::unique_ptr<CrossDeviceOps>(
        std::make_unique<fakes::RecordingOps>(
            name, ctx, std::move(o), caps, [log](const CrossDeviceOps& ops, const CallInfo& c) {
              log->push_back({ops.name(), c.collective});
            }));
  };
  return info;
}

BackendContext two_cpus() {
  BackendContext ctx;
  ctx.devices = {Device::cpu(0), Device::cpu(1)};
  return ctx;
}

TuningMeasurement at(uint64_t bytes, std::vector<std::pair<std::string, double>> t) {
  return TuningMeasurement{bytes, std::move(t)};
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             ("tributary-tuning-" + std::to_string(getpid()) + "-" + std::to_string(++n_) +
              ".json"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int n_ = 0;
  std::string path_;
};

TEST(TuningTable, RangesFromMeasurementsTolerateTiesAndMergeNeighbours) {
  TuningLayout layout;
  layout.local_replicas = 2;
  auto t = TuningTable::from_measurements(
      layout, DType::kFloat32, ReduceOp::kSum,
      {at(65536, {{"a", 20}, {"b", 10}}),  // out of order on purpose
       at(1024, {{"a", 1.0}, {"b", 2.0}}), at(4096, {{"a", 2.0}, {"b", 2.05}}),  // a within 3%
       at(16384, {{"a", 9.0}, {"b", 5.0}}), at(262144, {{"a", 0}, {"b", 40}})});  // a failed
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->rules.size(), 2u);
  EXPECT_EQ(t->rules[0].spec, "a");
  // Between 4096 and 16384, at their geometric mean.
  EXPECT_EQ(t->rules[0].max_bytes, 8192u);
  EXPECT_EQ(t->rules[0].measured_bytes, (std::vector<uint64_t>{1024, 4096}));
  EXPECT_EQ(t->rules[1].spec, "b");
  EXPECT_EQ(t->rules[1].max_bytes, TuningRule::kRest);
  EXPECT_EQ(t->rules[1].time_us, 40);
  EXPECT_EQ(t->rules[1].runner_up, "");
  EXPECT_EQ(t->rule_for(0).spec, "a");
  EXPECT_EQ(t->rule_for(8192).spec, "a");
  EXPECT_EQ(t->rule_for(8193).spec, "b");
  EXPECT_EQ(t->rule_for(uint64_t{1} << 40).spec, "b");
  EXPECT_EQ(t->specs(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(t->summary(), "<= 8KiB: a; rest: b");
  EXPECT_EQ(t->library_version, version());

  auto none = TuningTable::from_measurements(layout, DType::kFloat32, ReduceOp::kSum,
                                             {at(1024, {{"a", 0}})});
  EXPECT_FALSE(none.ok());

  // A size measured twice counts once (the first), so bounds stay strictly increasing and the
  // file parses back.
  auto twice = TuningTable::from_measurements(
      layout, DType::kFloat32, ReduceOp::kSum,
      {at(1024, {{"a", 1}, {"b", 2}}), at(1024, {{"a", 2}, {"b", 1}}), at(4096, {{"a", 5}, {"b", 1}})});
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(twice->summary(), "<= 2KiB: a; rest: b");
  EXPECT_TRUE(TuningTable::parse(twice->to_json(), "x").ok());
}

// Ties (within 5%) go to the cost model's choice: the file departs from it only for a real gain.
TEST(TuningTable, TiesGoToThePreferredSpec) {
  auto t = TuningTable::from_measurements(
      TuningLayout{}, DType::kFloat32, ReduceOp::kSum,
      {at(1024, {{"p", 1.04}, {"q", 1.0}}), at(4096, {{"p", 2.0}, {"q", 1.6}}),
       at(16384, {{"p", 5.0}, {"q", 5.2}})},
      "p");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->rules.size(), 3u);
  EXPECT_EQ(t->summary(), "<= 2KiB: p; <= 8KiB: q; rest: p");
  EXPECT_EQ(t->rules[1].runner_up, "p");
  EXPECT_EQ(t->rules[1].runner_up_time_us, 2.0);
  // Without a preference the first size's fastest starts the table and keeps its tied sizes.
  auto plain = TuningTable::from_measurements(
      TuningLayout{}, DType::kFloat32, ReduceOp::kSum,
      {at(1024, {{"p", 1.04}, {"q", 1.0}}), at(4096, {{"p", 2.0}, {"q", 1.6}}),
       at(16384, {{"p", 5.0}, {"q", 5.2}})});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->summary(), "every size: q");
}

// A lead smaller than the leader's own spread between passes (worst_us) is noise: a tie, which
// goes to the preferred spec; a lead that held in every pass still wins.
TEST(TuningTable, LeadWithinTheLeadersOwnSpreadIsATie) {
  TuningMeasurement noisy = at(4096, {{"p", 1.20}, {"q", 1.00}});
  noisy.worst_us = {{"p", 1.25}, {"q", 1.30}};  // q's slowest pass was slower than p's best
  TuningMeasurement real = at(16384, {{"p", 5.0}, {"q", 4.0}});
  real.worst_us = {{"p", 5.1}, {"q", 4.2}};  // q ahead in every pass
  auto t = TuningTable::from_measurements(TuningLayout{}, DType::kFloat32, ReduceOp::kSum,
                                          {noisy, real}, "p");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->summary(), "<= 8KiB: p; rest: q");
  // Without the spread (one pass), the same best figures make q win both.
  auto one_pass = TuningTable::from_measurements(
      TuningLayout{}, DType::kFloat32, ReduceOp::kSum,
      {at(4096, {{"p", 1.20}, {"q", 1.00}}), at(16384, {{"p", 5.0}, {"q", 4.0}})}, "p");
  ASSERT_TRUE(one_pass.ok());
  EXPECT_EQ(one_pass->summary(), "every size: q");
  // The spread is kept in the file and read back.
  auto back = TuningTable::parse(t->to_json(), "x");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->measurements.size(), 2u);
  EXPECT_EQ(back->measurements[0].worst_us,
            (std::vector<std::pair<std::string, double>>{{"p", 1.25}, {"q", 1.30}}));
}

TEST(TuningTable, JsonRoundTripAndDigest) {
  TuningLayout layout;
  layout.processes = 4;
  layout.processes_per_host = 2;
  auto t = TuningTable::from_measurements(layout, DType::kBFloat16, ReduceOp::kMax,
                                          {at(1024, {{"ring:algorithm=ring", 3}, {"ucx", 5}}),
                                           at(1 << 20, {{"ring:algorithm=ring", 90}, {"ucx", 50}})});
  ASSERT_TRUE(t.ok());
  auto back = TuningTable::parse(t->to_json(), "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layout, layout);
  EXPECT_EQ(back->dtype, DType::kBFloat16);
  EXPECT_EQ(back->op, ReduceOp::kMax);
  ASSERT_EQ(back->rules.size(), 2u);
  EXPECT_EQ(back->rules[0].max_bytes, t->rules[0].max_bytes);
  EXPECT_EQ(back->rules[0].runner_up, "ucx");
  EXPECT_EQ(back->rules[0].runner_up_time_us, 5);
  EXPECT_EQ(back->measurements.size(), 2u);
  EXPECT_EQ(back->digest(), t->digest());
  back->rules[0].spec = "ucx";
  EXPECT_NE(back->digest(), t->digest());
}

TEST(TuningTable, MalformedFilesAreErrorsThatSayWhat) {
  const std::string good_head =
      R"({"tributary_tuning": 1, "library_version": "0.1.0", "dtype": "float32", "op": "sum",
          "layout": {"processes": 1, "local_replicas": 2, "processes_per_host": 1, "device": "CPU"},)";
  struct Case {
    std::string text, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "is not valid JSON (parse error at line 1, column 2"},
           {R"({"rules": [)", "is not valid JSON (parse error at line 1"},
           {"[1, 2]", "is not a JSON object"},
           {R"({"tributary_tuning": 2})", "has format 2"},
           {good_head + R"("rules": []})", "'rules' must be a non-empty array"},
           {good_head + R"("rules": [{"spec": "a", "max_bytes": 10}]})",
            "the last rule's max_bytes must be null"},
           {good_head + R"("rules": [{"spec": "a", "max_bytes": 10}, {"spec": "b", "max_bytes": 5},
                                     {"spec": "c", "max_bytes": null}]})",
            "rule 1: max_bytes must be above the previous rule's (10)"},
           {good_head + R"("rules": [{"spec": "a", "max_bytes": "x"}, {"spec": "c", "max_bytes": null}]})",
            "rule 0: max_bytes must be a byte count"},
           {good_head + R"("rules": [{"spec": "auto", "max_bytes": null}]})", "not 'auto'"},
           {good_head + R"("rules": [{"spec": "ring:", "max_bytes": null}]})", "rule 0"},
           {good_head + R"("rules": [{"max_bytes": null}]})", "'spec' must be a string"},
       }) {
    auto t = TuningTable::parse(c.text, "'x.json'");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << t.status().message() << " / want " << c.expect;
    EXPECT_NE(t.status().message().find("'x.json'"), std::string::npos) << t.status().message();
  }
  auto missing = TuningTable::load("/nonexistent/tuning.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tributary-tune"), std::string::npos);
}

TEST(TuningTable, AppliesOnlyToItsLayoutAndVersion) {
  TuningLayout here;
  here.processes = 2;
  here.processes_per_host = 2;
  auto t = TuningTable::from_measurements(here, DType::kFloat32, ReduceOp::kSum,
                                          {at(1024, {{"a", 1}})});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->check_applies(here).ok());
  TuningLayout unknown_per_host = here;
  unknown_per_host.processes_per_host = 0;
  EXPECT_TRUE(t->check_applies(unknown_per_host).ok());
  TuningLayout other = here;
  other.processes_per_host = 1;  // two hosts instead of one
  Status s = t->check_applies(other);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("measured for 2 process(es) (2 per host)"), std::string::npos)
      << s.message();
  t->library_version = "0.0.1";
  s = t->check_applies(here);
  EXPECT_NE(s.message().find("measured with tributary 0.0.1"), std::string::npos) << s.message();
}

// A file for two CPU replicas in one process: `small` up to 4 KiB, `large` above.
std::string two_range_file(const std::string& version_text = std::string(version())) {
  return R"({"tributary_tuning": 1, "library_version": ")" + version_text +
         R"(", "dtype": "float32", "op": "sum",
            "layout": {"processes": 1, "local_replicas": 2, "processes_per_host": 1,
                       "device": "CPU"},
            "rules": [{"spec": "small", "max_bytes": 4096}, {"spec": "large", "max_bytes": null}]})";
}

TEST(TunedAuto, DispatchesEveryCollectiveBySize) {
  std::vector<Call> log;
  BackendRegistry r;
  ASSERT_TRUE(r.add(recorder("small", &log)).ok());
  ASSERT_TRUE(r.add(recorder("large", &log, {DType::kFloat32})).ok());
  TempFile file(two_range_file());
  auto made = r.create("auto:tuning_file=" + file.path() + ",timeout=7s", two_cpus());
  ASSERT_TRUE(made.ok()) << made.status().message();
  CrossDeviceOps& ops = **made;
  EXPECT_EQ(ops.name(), "tuned");
  EXPECT_NE(ops.spec().find("<= 4KiB: small; rest: large"), std::string::npos) << ops.spec();
  // Capabilities: what every member has.
  EXPECT_FALSE(ops.capabilities().supports(DType::kFloat64));
  EXPECT_EQ(ops.timeout(), std::chrono::seconds(7));

  std::vector<float> a(2048), b(2048), big(8192);
  auto pr = [](std::vector<float>& v, int64_t n) {
    return PerReplica<Tensor>({Tensor(v.data(), DType::kFloat32, Shape{n}, Device::cpu(0)),
                               Tensor(v.data() + n, DType::kFloat32, Shape{n}, Device::cpu(1))});
  };
  // 1024 floats (4 KiB) per replica: small. 4096 (16 KiB): large.
  ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, pr(a, 1024), pr(a, 1024)).wait().ok());
  ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, pr(big, 4096), pr(big, 4096)).wait().ok());
  ASSERT_TRUE(ops.broadcast(Tensor(a.data(), DType::kFloat32, Shape{16}, Device::cpu(0)),
                            Mirrored<Tensor>(pr(b, 16).values()))
                  .wait()
                  .ok());
  ASSERT_TRUE(ops.all_gather(pr(a, 8), pr(big, 16)).wait().ok());
  std::vector<float> c(4096);
  ASSERT_TRUE(ops.reduce_scatter(ReduceOp::kSum, pr(big, 4096), pr(c, 2048)).wait().ok());
  ASSERT_EQ(log.size(), 5u);
  EXPECT_EQ(log[0].backend, "small");
  EXPECT_EQ(log[1].backend, "large");
  EXPECT_EQ(log[2].backend, "small");
  EXPECT_EQ(log[2].collective, Collective::kBroadcast);
  EXPECT_EQ(log[3].backend, "small");
  EXPECT_EQ(log[4].backend, "large");
}

TEST(TunedAuto, OneRangeIsThatBackend) {
  BackendRegistry r = builtin_backends();
  TempFile file(R"({"tributary_tuning": 1, "library_version": ")" + std::string(version()) +
                R"(", "dtype": "float32", "op": "sum",
      "layout": {"processes": 1, "local_replicas": 2, "processes_per_host": 1, "device": "CPU"},
      "rules": [{"spec": "hierarchical_copy:num_packs=2", "max_bytes": null}]})");
  BackendContext ctx = two_cpus();
  ctx.config.set("TRIBUTARY_TUNING_FILE", file.path());
  auto made = r.create_from_config(ctx);
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ((*made)->spec(), "hierarchical_copy:group_size=0,num_packs=2,timeout=5m");
  // auto:tuning_file=none ignores it.
  auto plain = r.create("auto:tuning_file=none", ctx);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->name(), "reduction_to_one_device");
}

TEST(TunedAuto, TheConfigFilesTuningFileIsFollowed) {
  // "tuning_file" in a config file (TRIBUTARY_CONFIG_FILE) as a job would set it: followed, and a
  // warning about a file for another layout names the config file it came from.
  std::vector<Call> log;
  BackendRegistry r;
  ASSERT_TRUE(r.add(recorder("small", &log)).ok());
  ASSERT_TRUE(r.add(recorder("large", &log)).ok());
  TempFile tuning(two_range_file());
  TempFile config(R"({"tuning_file": ")" + tuning.path() + R"("})");
  auto loaded = Config::from_file(config.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  BackendContext ctx = two_cpus();
  ctx.config = *loaded;
  auto made = r.create_from_config(ctx);
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ((*made)->name(), "tuned");
  EXPECT_NE((*made)->spec().find("<= 4KiB: small; rest: large"), std::string::npos)
      << (*made)->spec();

  BackendContext three;
  three.devices = {Device::cpu(0), Device::cpu(1), Device::cpu(2)};
  three.config = *loaded;
  testing::internal::CaptureStderr();
  auto fallback = r.create_from_config(three);
  const std::string warned = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(fallback.ok()) << fallback.status().message();
  EXPECT_EQ((*fallback)->name(), "small");
  EXPECT_NE(warned.find("does not apply here"), std::string::npos) << warned;
  EXPECT_NE(warned.find(config.path()), std::string::npos) << warned;
}

TEST(TunedAuto, FileForAnotherLayoutWarnsFromConfigAndFailsWhenNamed) {
  std::vector<Call> log;
  BackendRegistry r;
  ASSERT_TRUE(r.add(recorder("small", &log)).ok());
  ASSERT_TRUE(r.add(recorder("large", &log)).ok());
  TempFile file(two_range_file());
  BackendContext three;
  three.devices = {Device::cpu(0), Device::cpu(1), Device::cpu(2)};
  three.config.set("TRIBUTARY_TUNING_FILE", file.path());
  testing::internal::CaptureStderr();
  auto fallback = r.create("auto", three);
  const std::string warned = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(fallback.ok()) << fallback.status().message();
  EXPECT_EQ((*fallback)->name(), "small");  // the cost model: the higher priority
  EXPECT_NE(warned.find("does not apply here"), std::string::npos) << warned;
  EXPECT_NE(warned.find("cost model"), std::string::npos) << warned;

  auto named = r.create("auto:tuning_file=" + file.path(), three);
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(named.status().message().find("3 CPU replica(s)"), std::string::npos)
      << named.status().message();

  TempFile old(two_range_file("0.0.0"));
  auto old_named = r.create("auto:tuning_file=" + old.path(), two_cpus());
  ASSERT_FALSE(old_named.ok());
  EXPECT_NE(old_named.status().message().find("tributary 0.0.0"), std::string::npos);
}

TEST(TunedAuto, MalformedOrUnknownBackendIsAnError) {
  BackendRegistry r = builtin_backends();
  TempFile broken("{");
  BackendContext ctx = two_cpus();
  ctx.config.set("TRIBUTARY_TUNING_FILE", broken.path());
  auto made = r.create("auto", ctx);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("TRIBUTARY_TUNING_FILE"), std::string::npos)
      << made.status().message();
  TempFile unknown(R"({"tributary_tuning": 1, "library_version": ")" + std::string(version()) +
                   R"(", "dtype": "float32", "op": "sum",
      "layout": {"processes": 1, "local_replicas": 2, "processes_per_host": 1, "device": "CPU"},
      "rules": [{"spec": "not_built_here", "max_bytes": null}]})");
  auto unknown_made = r.create("auto:tuning_file=" + unknown.path(), two_cpus());
  ASSERT_FALSE(unknown_made.ok());
  EXPECT_NE(unknown_made.status().message().find("names backend 'not_built_here'"),
            std::string::npos)
      << unknown_made.status().message();
  auto missing = r.create("auto:tuning_file=/nonexistent.json", two_cpus());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Across processes every rank must follow the same thing: ranks with different files (or one
// with none) fail before any backend connects, naming both choices. Two ranks as threads over one
// memory store, with fake multi-process backends.
TEST(TunedAuto, RanksFollowingDifferentFilesFailBeforeConnecting) {
  std::vector<Call> log0, log1;
  TempFile file(R"({"tributary_tuning": 1, "library_version": ")" + std::string(version()) +
                R"(", "dtype": "float32", "op": "sum",
      "layout": {"processes": 2, "local_replicas": 1, "processes_per_host": 0, "device": "CPU"},
      "rules": [{"spec": "small", "max_bytes": 4096}, {"spec": "large", "max_bytes": null}]})");
  for (bool same : {false, true}) {
    auto store = std::make_shared<MemoryStore>(StoreOptions{.timeout = std::chrono::seconds(5)});
    StatusOr<std::unique_ptr<CrossDeviceOps>> made[2] = {internal_error("not run"),
                                                         internal_error("not run")};
    std::thread ranks[2];
    for (int r = 0; r < 2; ++r) {
      ranks[r] = std::thread([&, r] {
        BackendRegistry reg;
        std::vector<Call>* log = r == 0 ? &log0 : &log1;
        (void)reg.add(recorder("small", log, {DType::kFloat32}, true));
        (void)reg.add(recorder("large", log, {DType::kFloat32}, true));
        BackendContext ctx;
        ctx.rank = r;
        ctx.world_size = 2;
        ctx.store = store;
        if (same || r == 0) ctx.config.set("TRIBUTARY_TUNING_FILE", file.path());
        made[r] = reg.create("auto", ctx);
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      if (same) {
        ASSERT_TRUE(made[r].ok()) << made[r].status().message();
        EXPECT_EQ((*made[r])->name(), "tuned");
      } else {
        ASSERT_FALSE(made[r].ok());
        EXPECT_EQ(made[r].status().code(), StatusCode::kFailedPrecondition);
        EXPECT_NE(made[r].status().message().find("the cost model's choice 'small'"),
                  std::string::npos)
            << made[r].status().message();
        EXPECT_NE(made[r].status().message().find("the tuning rules '<= 4KiB: small; rest: large'"),
                  std::string::npos)
            << made[r].status().message();
      }
    }
  }
}

// The real in-process backends behind a two-range file: results stay right at both sizes.
TEST(TunedAuto, RealBackendsGiveRightResults) {
  BackendRegistry r = builtin_backends();
  TempFile file(R"({"tributary_tuning": 1, "library_version": ")" + std::string(version()) +
                R"(", "dtype": "float32", "op": "sum",
      "layout": {"processes": 1, "local_replicas": 2, "processes_per_host": 1, "device": "CPU"},
      "rules": [{"spec": "hierarchical_copy", "max_bytes": 4096},
                {"spec": "reduction_to_one_device", "max_bytes": null}]})");
  auto made = r.create("auto:tuning_file=" + file.path(), two_cpus());
  ASSERT_TRUE(made.ok()) << made.status().message();
  for (int64_t n : {int64_t{100}, int64_t{100000}}) {
    std::vector<float> x(static_cast<size_t>(n), 1.5f), y(static_cast<size_t>(n), 2.0f);
    PerReplica<Tensor> v({Tensor(x.data(), DType::kFloat32, Shape{n}, Device::cpu(0)),
                          Tensor(y.data(), DType::kFloat32, Shape{n}, Device::cpu(1))});
    ASSERT_TRUE((*made)->all_reduce(ReduceOp::kSum, v, v).wait().ok());
    EXPECT_EQ(x[0], 3.5f);
    EXPECT_EQ(y[static_cast<size_t>(n - 1)], 3.5f);
  }
}

}  // namespace
}  // namespace tributary
