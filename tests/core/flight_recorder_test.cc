// The flight recorder, the stall report and the timeline of one process (the multi-process stall
// report, which names the late rank, is in tests/multiprocess/fault_test.cc).
#include "core/flight_recorder.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/sanitizers.h"
#include "tributary/registry.h"

namespace tributary::internal {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

std::string temp_path(const std::string& name) {
  static int n = 0;
  return ::testing::TempDir() + "/fr_" + std::to_string(::getpid()) + "_" + std::to_string(++n) +
         "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits up to 5 s for `path` to exist with content.
std::string wait_for_file(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    std::string s = read_file(path);
    if (!s.empty()) return s;
    std::this_thread::sleep_for(10ms);
  }
  return "";
}

CallInfo call(uint64_t seq, int64_t count = 1024) {
  CallInfo c;
  c.sequence = seq;
  c.collective = Collective::kAllReduce;
  c.count = count;
  c.start = std::chrono::steady_clock::now();
  return c;
}

TEST(FlightSettings, DefaultsAndErrorsNameTheVariable) {
  auto d = FlightSettings::from(Config());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->capacity, 256u);
  EXPECT_EQ(d->stall_check, std::chrono::seconds(60));
  EXPECT_TRUE(d->dump_path.empty());
  EXPECT_TRUE(d->timeline_path.empty());

  auto off = FlightSettings::from(Config::from_map(
      {{"TRIBUTARY_FLIGHT_RECORDER_SIZE", "0"}, {"TRIBUTARY_STALL_CHECK_TIME", "off"}}));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->capacity, 0u);
  EXPECT_EQ(off->stall_check.count(), 0);

  auto bad_size = FlightSettings::from(Config::from_map({{"TRIBUTARY_FLIGHT_RECORDER_SIZE", "-3"}}));
  EXPECT_EQ(bad_size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_size.status().message().find("TRIBUTARY_FLIGHT_RECORDER_SIZE='-3'"),
            std::string::npos);
  auto bad_stall = FlightSettings::from(Config::from_map({{"TRIBUTARY_STALL_CHECK_TIME", "soon"}}));
  EXPECT_NE(bad_stall.status().message().find("TRIBUTARY_STALL_CHECK_TIME='soon'"),
            std::string::npos);

  // The registry refuses them before any backend is made.
  BackendContext ctx;
  ctx.config = Config::from_map({{"TRIBUTARY_STALL_CHECK_TIME", "soon"}});
  auto made = builtin_backends().create("reduction_to_one_device", ctx);
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("TRIBUTARY_STALL_CHECK_TIME"), std::string::npos);
}

TEST(FlightSettings, RankPathsNeverCollide) {
  EXPECT_EQ(rank_path("/tmp/fr-{rank}.json", 3, 4), "/tmp/fr-3.json");
  EXPECT_EQ(rank_path("/tmp/fr.json", 3, 4), "/tmp/fr.json.3");
  EXPECT_EQ(rank_path("/tmp/fr.json", 0, 1), "/tmp/fr.json");
  EXPECT_EQ(rank_path("{rank}/{rank}", 12, 16), "12/12");
}

TEST(FlightRecorder, KeepsTheLastEntriesOldestFirst) {
  FlightSettings settings;
  settings.capacity = 4;
  FlightRecorder r("test", 0, 1, settings);
  for (uint64_t s = 1; s <= 6; ++s) {
    r.issued(call(s));
    if (s != 5) r.ended(s, Status());
  }
  r.ended(1, unavailable("late"));  // left the ring long ago: ignored
  auto all = r.snapshot();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].sequence, 3u);
  EXPECT_EQ(all[3].sequence, 6u);
  EXPECT_EQ(all[2].state, FlightRecorder::State::kIssued);  // #5 never ended
  EXPECT_EQ(all[3].state, FlightRecorder::State::kCompleted);
  EXPECT_EQ(r.last_issued(), 6u);
  const std::string text = r.text(16, "test");
  EXPECT_NE(text.find("4 of 6 collectives"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce #5 (4KiB float32, sum): pending for"), std::string::npos)
      << text;
  EXPECT_NE(text.find("all_reduce #6 (4KiB float32, sum): completed in"), std::string::npos)
      << text;
}

TEST(FlightRecorder, TheFirstFailureDumpsEveryEntryToTheFile) {
  FlightSettings settings;
  settings.capacity = 8;
  settings.dump_path = temp_path("fail-{rank}.json");
  FlightRecorder r("test", 2, 3, settings);
  r.issued(call(1));
  r.ended(1, Status());
  r.issued(call(2, 4));
  ::testing::internal::CaptureStderr();
  r.ended(2, deadline_exceeded("rank 1 did not answer within 2s"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("flight recorder (the first failed collective of this instance)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("all_reduce #2 (16B float32, sum): failed after"), std::string::npos) << log;

  const std::string path = rank_path(settings.dump_path, 2, 3);
  Json doc = Json::parse(read_file(path));
  EXPECT_EQ(doc["rank"], 2);
  EXPECT_EQ(doc["backend"], "test");
  EXPECT_EQ(doc["last_issued"], 2);
  ASSERT_EQ(doc["entries"].size(), 2u);
  EXPECT_EQ(doc["entries"][0]["state"], "completed");
  EXPECT_EQ(doc["entries"][1]["state"], "failed");
  EXPECT_EQ(doc["entries"][1]["bytes"], 16);
  EXPECT_NE(doc["entries"][1]["error"].get<std::string>().find("rank 1 did not answer"),
            std::string::npos);

  // Later failures do not dump again.
  std::remove(path.c_str());
  r.issued(call(3));
  r.ended(3, aborted("again"));
  EXPECT_TRUE(read_file(path).empty());
}

// A dump file that cannot be written is said when the recorder is made (as the timeline's is),
// not first at the failure it was meant to record; once per path.
TEST(FlightRecorder, AnUnwritableDumpFileIsSaidAtOnce) {
  FlightSettings settings;
  settings.dump_path = "/nonexistent-tributary-dir/fr-{rank}.json";
  ::testing::internal::CaptureStderr();
  { FlightRecorder r("test", 0, 2, settings); }
  { FlightRecorder again("test", 0, 2, settings); }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string said =
      "TRIBUTARY_FLIGHT_RECORDER_FILE: cannot write "
      "/nonexistent-tributary-dir/fr-0.json";
  const size_t at = log.find(said);
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(said, at + 1), std::string::npos) << "said twice: " << log;
}

TEST(FlightRecorder, AStalledCollectiveIsReportedOnce) {
  FlightSettings settings;
  settings.capacity = 8;
  settings.stall_check = 50ms;
  FlightRecorder r("test", 0, 1, settings);
  r.issued(call(1));
  ::testing::internal::CaptureStderr();
  r.tick(std::chrono::steady_clock::now());  // too early
  r.tick(std::chrono::steady_clock::now() + 60ms);
  r.tick(std::chrono::steady_clock::now() + 120ms);  // already reported
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("all_reduce #1 (4KiB float32, sum) has waited"), std::string::npos) << log;
  EXPECT_EQ(log.find("has waited"), log.rfind("has waited")) << log;
}

class BackendObservability : public ::testing::Test {
 protected:
  std::unique_ptr<CrossDeviceOps> make(const std::map<std::string, std::string>& settings) {
    BackendContext ctx;
    ctx.devices = {Device::cpu(0), Device::cpu(1)};
    ctx.config = Config::from_map(settings);
    auto made = builtin_backends().create("reduction_to_one_device", ctx);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }
  void all_reduce(CrossDeviceOps& ops, int times) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    PerReplica<Tensor> v({Tensor(a.data(), DType::kFloat32, 100, Device::cpu(0)),
                          Tensor(b.data(), DType::kFloat32, 100, Device::cpu(1))});
    for (int i = 0; i < times; ++i) ASSERT_TRUE(ops.all_reduce(ReduceOp::kSum, v, v).wait().ok());
  }
};

TEST_F(BackendObservability, SigusrDumpsEveryLiveInstance) {
  const std::string path = temp_path("sig.json");
  auto ops = make({{"TRIBUTARY_FLIGHT_RECORDER_FILE", path}});
  ASSERT_TRUE(ops);
  all_reduce(*ops, 3);
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(::raise(SIGUSR1), 0);  // would kill the process without the recorder's handler
  const std::string dumped = wait_for_file(path);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(dumped.empty()) << "no dump at " << path;
  Json doc = Json::parse(dumped);
  EXPECT_EQ(doc["reason"], "SIGUSR1");
  EXPECT_EQ(doc["backend"], "reduction_to_one_device");
  ASSERT_EQ(doc["entries"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(doc["entries"][i]["sequence"], i + 1);
    EXPECT_EQ(doc["entries"][i]["state"], "completed");
    EXPECT_EQ(doc["entries"][i]["bytes"], 400);
  }
  EXPECT_NE(log.find("flight recorder (SIGUSR1)"), std::string::npos) << log;
}

TEST_F(BackendObservability, TheTimelineHasOneEventPerCollective) {
  const std::string path = temp_path("timeline.json");
  {
    auto ops = make({{"TRIBUTARY_TIMELINE", path}});
    ASSERT_TRUE(ops);
    all_reduce(*ops, 5);
  }  // the instance's events are flushed when it goes away
  const std::string text = read_file(path);
  ASSERT_FALSE(text.empty());
  // The closing bracket is written at exit; Chrome's trace viewer reads the file without it.
  Json events = Json::parse(text + "]");
  int collectives = 0;
  bool named = false;
  int64_t last_ts = 0;
  for (const Json& e : events) {
    if (e["ph"] == "M" && e["name"] == "process_name") named = e["args"]["name"] == "rank 0";
    if (e["ph"] != "X") continue;
    ++collectives;
    EXPECT_EQ(e["name"], "all_reduce");
    EXPECT_EQ(e["cat"], "reduction_to_one_device");
    EXPECT_EQ(e["args"]["sequence"], collectives);
    EXPECT_EQ(e["args"]["bytes"], 400);
    EXPECT_EQ(e["args"]["status"], "ok");
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    EXPECT_GE(e["ts"].get<int64_t>(), last_ts);
    last_ts = e["ts"].get<int64_t>();
  }
  EXPECT_EQ(collectives, 5);
  EXPECT_TRUE(named);
}

TEST_F(BackendObservability, SizeZeroRecordsNothing) {
  const std::string path = temp_path("off.json");
  auto ops = make({{"TRIBUTARY_FLIGHT_RECORDER_SIZE", "0"},
                   {"TRIBUTARY_FLIGHT_RECORDER_FILE", path},
                   {"TRIBUTARY_TIMELINE", path + ".timeline"}});
  ASSERT_TRUE(ops);
  all_reduce(*ops, 2);
  dump_all_recorders("test");
  EXPECT_TRUE(read_file(path).empty());
  EXPECT_TRUE(read_file(path + ".timeline").empty());
}

// fork() while the monitor thread works (a live instance with a timeline: it flushes on every tick)
// and while it is just starting (the child's own monitor starts as the child makes its instance):
// every child can still make an instance, record, write its timeline and exit. A child forked
// while the monitor held a lock of its own, or was inside the allocator (under ASan, whose
// allocator is not locked around fork), would hang instead: the parent gives each child 10 s.
TEST_F(BackendObservability, ForkedChildrenCanRecordWhileTheMonitorWorks) {
#ifdef TRIBUTARY_UNDER_TSAN
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads in the child of a "
                  "multi-threaded fork (it dies); run in the main suite and under ASan";
#endif
  const std::string path = temp_path("fork_timeline.json");
  auto ops = make({{"TRIBUTARY_TIMELINE", path}, {"TRIBUTARY_STALL_CHECK_TIME", "1ms"}});
  ASSERT_TRUE(ops);
  all_reduce(*ops, 2);
  for (int i = 0; i < 40; ++i) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);
      // A grandchild forked at once, while this child's monitor starts for the instance below.
      auto mine = make({{"TRIBUTARY_TIMELINE", path + "." + std::to_string(i)}});
      const pid_t grandchild = ::fork();
      if (grandchild == 0) {
        ::alarm(10);
        auto theirs = make({{"TRIBUTARY_TIMELINE", path + ".g" + std::to_string(i)}});
        if (theirs) all_reduce(*theirs, 1);
        ::_exit(theirs && !::testing::Test::HasFailure() ? 0 : 1);
      }
      if (mine) all_reduce(*mine, 1);
      int status = 1;
      const bool grandchild_ok = grandchild > 0 &&
                                 ::waitpid(grandchild, &status, 0) == grandchild &&
                                 WIFEXITED(status) && WEXITSTATUS(status) == 0;
      ::_exit(mine && grandchild_ok && !::testing::Test::HasFailure() ? 0 : 1);
    }
    all_reduce(*ops, 1);  // the parent goes on recording meanwhile
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << i << " ended with status " << status << " (a hang ends by SIGALRM: 14)";
  }
}

}  // namespace
}  // namespace tributary::internal
