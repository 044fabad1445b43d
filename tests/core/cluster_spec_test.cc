#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/hostlist.h"
#include "core/rendezvous.h"
#include "tests/sockets.h"
#include "tributary/cluster.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

using Env = std::map<std::string, std::string>;
using Strings = std::vector<std::string>;

StatusOr<ClusterSpec> resolve(const Env& env) {
  return resolve_cluster_spec(Config::from_map(env));
}

// The error of `r`, which must be InvalidArgument, and must contain every one of `parts`.
template <typename T>
void expect_invalid(const StatusOr<T>& r, const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.ok()) << "expected an error containing \"" << parts.front() << "\"";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "message: " << r.status().message() << "\nmissing: " << p;
  }
}

const char* const kChiefAndWorkers =
    R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
        "task": {"type": "%s", "index": %d}})";

std::string chief_and_workers(const std::string& type, int index) {
  char buf[512];
  std::snprintf(buf, sizeof buf, kChiefAndWorkers, type.c_str(), index);
  return buf;
}

// ---------------------------------------------------------------- single process and explicit

TEST(ClusterSpec, NothingSetIsASingleProcess) {
  auto s = resolve({});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "single-process");
  EXPECT_EQ(s->rank, 0);
  EXPECT_EQ(s->world_size, 1);
  EXPECT_EQ(s->local_rank, 0);
  EXPECT_EQ(s->local_world_size, 1);
  EXPECT_TRUE(s->is_chief());
  EXPECT_EQ(s->coordinator_address(), "");
  EXPECT_EQ(s->describe(),
            "source=single-process task=worker:0 rank=0/1 local=0/1 chief=yes coordinator=none");
  // Unrelated variables change nothing.
  auto t = resolve({{"HOME", "/root"}, {"TRIBUTARY_LOG_LEVEL", "info"}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, *s);
}

TEST(ClusterSpec, Explicit) {
  auto s = resolve({{"TRIBUTARY_RANK", "2"},
                    {"TRIBUTARY_WORLD_SIZE", "4"},
                    {"TRIBUTARY_LOCAL_RANK", "0"},
                    {"TRIBUTARY_LOCAL_WORLD_SIZE", "2"},
                    {"TRIBUTARY_MASTER_ADDR", "10.0.0.1"},
                    {"TRIBUTARY_MASTER_PORT", "1234"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "explicit");
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->task_index, 2);
  EXPECT_EQ(s->task_type, "worker");
  EXPECT_EQ(s->world_size, 4);
  EXPECT_EQ(s->local_rank, 0);
  EXPECT_EQ(s->local_world_size, 2);
  EXPECT_EQ(s->coordinator_host, "10.0.0.1");
  EXPECT_EQ(s->coordinator_port, 1234);
  EXPECT_FALSE(s->is_chief());
  EXPECT_TRUE(s->jobs.empty());
  EXPECT_EQ(s->describe(),
            "source=explicit task=worker:2 rank=2/4 local=0/2 chief=no coordinator=10.0.0.1:1234");
}

TEST(ClusterSpec, ExplicitDefaultsAndSingleWorld) {
  // Port defaults; local values unknown when not given.
  auto s = resolve(
      {{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "2"}, {"TRIBUTARY_MASTER_ADDR", "h"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->coordinator_address(), "h:29500");
  EXPECT_EQ(s->local_rank, std::nullopt);
  EXPECT_EQ(s->local_world_size, std::nullopt);
  EXPECT_TRUE(s->is_chief());
  EXPECT_NE(s->describe().find("local=?/?"), std::string::npos);
  // A world of one needs no coordinator.
  auto one = resolve({{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "1"}});
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->coordinator_host, "");
  EXPECT_EQ(one->source, "explicit");
}

TEST(ClusterSpec, ExplicitErrors) {
  expect_invalid(resolve({{"TRIBUTARY_RANK", "1"}}),
                 {"TRIBUTARY_RANK=1 is set but TRIBUTARY_WORLD_SIZE is not"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "4"}, {"TRIBUTARY_WORLD_SIZE", "4"}}),
                 {"TRIBUTARY_RANK=4 is not below TRIBUTARY_WORLD_SIZE=4", "from 0 to 3"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "-1"}, {"TRIBUTARY_WORLD_SIZE", "4"}}),
                 {"TRIBUTARY_RANK=\"-1\" is not a non-negative whole number"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "one"}, {"TRIBUTARY_WORLD_SIZE", "4"}}),
                 {"TRIBUTARY_RANK=\"one\""});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "0"}}),
                 {"TRIBUTARY_WORLD_SIZE=\"0\" is not a positive whole number"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "2"}}),
                 {"TRIBUTARY_MASTER_ADDR is not; set it to the host of rank 0"});
  // Torchrun's MASTER_ADDR is not the explicit provider's.
  expect_invalid(
      resolve({{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
      {"TRIBUTARY_MASTER_ADDR is not"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "0"},
                          {"TRIBUTARY_WORLD_SIZE", "2"},
                          {"TRIBUTARY_MASTER_ADDR", "h"},
                          {"TRIBUTARY_MASTER_PORT", "65536"}}),
                 {"TRIBUTARY_MASTER_PORT=\"65536\" is out of range", "1 to 65535"});
  expect_invalid(
      resolve(
          {{"TRIBUTARY_RANK", "0"}, {"TRIBUTARY_WORLD_SIZE", "2"}, {"TRIBUTARY_MASTER_ADDR", ""}}),
      {"TRIBUTARY_MASTER_ADDR=\"\" is empty"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "0"},
                          {"TRIBUTARY_WORLD_SIZE", "4"},
                          {"TRIBUTARY_LOCAL_RANK", "2"},
                          {"TRIBUTARY_LOCAL_WORLD_SIZE", "2"},
                          {"TRIBUTARY_MASTER_ADDR", "h"}}),
                 {"TRIBUTARY_LOCAL_RANK=2 is not below TRIBUTARY_LOCAL_WORLD_SIZE=2"});
  expect_invalid(resolve({{"TRIBUTARY_RANK", "0"},
                          {"TRIBUTARY_WORLD_SIZE", "2"},
                          {"TRIBUTARY_LOCAL_WORLD_SIZE", "3"},
                          {"TRIBUTARY_MASTER_ADDR", "h"}}),
                 {"TRIBUTARY_LOCAL_WORLD_SIZE=3 is more than TRIBUTARY_WORLD_SIZE=2"});
  // Half an explicit spec is a mistake, not something to ignore.
  expect_invalid(resolve({{"TRIBUTARY_WORLD_SIZE", "4"}, {"RANK", "0"}, {"WORLD_SIZE", "4"}}),
                 {"TRIBUTARY_WORLD_SIZE=\"4\" is set but TRIBUTARY_RANK is not"});
}

// ---------------------------------------------------------------- TF_CONFIG

TEST(ClusterSpec, TfConfigChiefAndWorkers) {
  // TF's id_in_cluster: chief 0, worker i -> i + 1; world = #chief + #worker.
  struct Case {
    std::string type;
    int index, rank;
    bool chief;
  };
  for (const Case& c :
       {Case{"chief", 0, 0, true}, Case{"worker", 0, 1, false}, Case{"worker", 1, 2, false}}) {
    auto s = resolve({{"TF_CONFIG", chief_and_workers(c.type, c.index)}});
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->source, "TF_CONFIG");
    EXPECT_EQ(s->task_type, c.type);
    EXPECT_EQ(s->task_index, c.index);
    EXPECT_EQ(s->rank, c.rank);
    EXPECT_EQ(s->world_size, 3);
    EXPECT_EQ(s->is_chief(), c.chief) << c.type << " " << c.index;
    EXPECT_EQ(s->coordinator_host, "host0");  // the chief is the collective leader
    EXPECT_EQ(s->coordinator_port, 2222);
    EXPECT_EQ(s->local_rank, 0);  // every task on its own host
    EXPECT_EQ(s->local_world_size, 1);
    EXPECT_EQ(s->jobs.at("worker"), (Strings{"host1:2222", "host2:2222"}));
    EXPECT_EQ(s->jobs.at("chief"), Strings{"host0:2222"});
  }
  auto w1 = resolve({{"TF_CONFIG", chief_and_workers("worker", 1)}});
  EXPECT_EQ(w1->describe(),
            "source=TF_CONFIG task=worker:1 rank=2/3 local=0/1 chief=no coordinator=host0:2222 "
            "jobs={chief:1, worker:2}");
}

TEST(ClusterSpec, TfConfigWorkersOnly) {
  const char* cluster = R"({"cluster": {"worker": ["a:1000", "b:1001", "c:1002"]},
                           "task": {"type": "worker", "index": %d}})";
  for (int i = 0; i < 3; ++i) {
    char buf[256];
    std::snprintf(buf, sizeof buf, cluster, i);
    auto s = resolve({{"TF_CONFIG", buf}});
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->rank, i);
    EXPECT_EQ(s->world_size, 3);
    EXPECT_EQ(s->is_chief(), i == 0);               // no chief job: worker 0 is the chief
    EXPECT_EQ(s->coordinator_address(), "a:1000");  // and the collective leader
  }
}

TEST(ClusterSpec, TfConfigEvaluatorIsItsOwnWorld) {
  auto s = resolve({{"TF_CONFIG", R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"],
                                                  "evaluator": ["e:1"]},
                                      "task": {"type": "evaluator", "index": 0}})"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->task_type, "evaluator");
  EXPECT_EQ(s->rank, 0);
  EXPECT_EQ(s->world_size, 1);
  EXPECT_TRUE(s->is_chief());
  EXPECT_EQ(s->coordinator_address(), "");  // TF: no collective leader for the evaluator
  // The trainers do not count the evaluator.
  auto w = resolve({{"TF_CONFIG", R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"],
                                                  "evaluator": ["e:1"]},
                                      "task": {"type": "worker", "index": 0}})"}});
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->rank, 1);
  EXPECT_EQ(w->world_size, 2);
  EXPECT_FALSE(w->is_chief());  // there is a chief job
}

// ParameterServerStrategy's clusters: "ps" jobs are accepted; the trainers do not count them, and a
// ps task is a world of its own that make_backend_context refuses.
TEST(ClusterSpec, TfConfigPsJobsAreAcceptedAndNotCounted) {
  const std::string cluster =
      R"("cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]})";
  auto task = [&](const char* type, int index) {
    return resolve({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": ")" + type +
                                      R"(", "index": )" + std::to_string(index) + "}}"}});
  };
  auto w1 = task("worker", 1);
  ASSERT_TRUE(w1.ok()) << w1.status().message();
  EXPECT_EQ(w1->rank, 2);
  EXPECT_EQ(w1->world_size, 3);
  EXPECT_EQ(w1->jobs.at("ps").size(), 2u);
  auto p1 = task("ps", 1);
  ASSERT_TRUE(p1.ok()) << p1.status().message();
  EXPECT_EQ(p1->task_type, "ps");
  EXPECT_EQ(p1->task_index, 1);
  EXPECT_EQ(p1->rank, 0);
  EXPECT_EQ(p1->world_size, 1);
  EXPECT_FALSE(p1->is_chief());
  EXPECT_EQ(p1->coordinator_address(), "");
  expect_invalid(task("ps", 2), {"The `task_id` 2 exceeds the maximum id of ps."});

  auto ctx = make_backend_context(
      {Device::cpu()},
      Config::from_map({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "ps", "index": 0}})"}}));
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("\"ps\" tasks take part in no collective"),
            std::string::npos)
      << ctx.status().message();
}

TEST(ClusterSpec, TfConfigLocalRanksFromHosts) {
  // Two hosts, two tasks each, in rank order: chief on a, worker 0 on a, workers 1-2 on b.
  const std::string cluster = R"("cluster": {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2"]})";
  auto task = [&](const char* type, int index) {
    return resolve({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": ")" + type +
                                      R"(", "index": )" + std::to_string(index) + "}}"}});
  };
  auto c = task("chief", 0), w0 = task("worker", 0), w1 = task("worker", 1), w2 = task("worker", 2);
  ASSERT_TRUE(c.ok() && w0.ok() && w1.ok() && w2.ok());
  EXPECT_EQ(c->local_rank, 0);
  EXPECT_EQ(w0->local_rank, 1);
  EXPECT_EQ(w1->local_rank, 0);
  EXPECT_EQ(w2->local_rank, 1);
  for (const auto* s : {&c, &w0, &w1, &w2}) EXPECT_EQ((*s)->local_world_size, 2);
}

TEST(ClusterSpec, TfConfigDetails) {
  // IPv6 leader, string index (TF's int()), extra keys ignored as in TF.
  auto s = parse_tf_config(R"({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]},
                               "task": {"type": "worker", "index": "1"},
                               "rpc_layer": "grpc", "environment": "cloud"})");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->coordinator_host, "::1");
  EXPECT_EQ(s->coordinator_address(), "[::1]:2222");
  EXPECT_EQ(s->local_world_size, 2);
  // Overrides replace the JSON's task, each on its own.
  auto o = parse_tf_config(chief_and_workers("worker", 0), "chief", std::nullopt);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->task_type, "chief");
  EXPECT_EQ(o->rank, 0);
  auto i = parse_tf_config(chief_and_workers("worker", 0), std::nullopt, 1);
  ASSERT_TRUE(i.ok()) << i.status().message();
  EXPECT_EQ(i->rank, 2);
  auto n = parse_tf_config(R"({"cluster": {"worker": ["a:1"]}})", "worker", 0);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_TRUE(n->is_chief());
}

TEST(ClusterSpec, TfConfigWithoutClusterIsLocal) {
  // TF reads an empty cluster as local training; parse_tf_config says so...
  auto s = parse_tf_config("{}");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "TF_CONFIG");
  EXPECT_EQ(s->world_size, 1);
  EXPECT_TRUE(s->jobs.empty());
  auto t = parse_tf_config(R"({"task": {"type": "worker", "index": 3}})");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->rank, 0);
  // ...and resolution goes on to the next provider.
  auto r = resolve({{"TF_CONFIG", "{}"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, "single-process");
  auto tr = resolve({{"TF_CONFIG", R"({"cluster": {}})"},
                     {"RANK", "1"},
                     {"WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "m"}});
  ASSERT_TRUE(tr.ok()) << tr.status().message();
  EXPECT_EQ(tr->source, "torchrun");
}

TEST(ClusterSpec, TfConfigErrors) {
  auto tf = [](const std::string& json) { return resolve({{"TF_CONFIG", json}}); };
  expect_invalid(tf("{\"cluster\": "), {"TF_CONFIG is not valid JSON",
                                        "{\"cluster\": ", "column 13", "it should look like"});
  expect_invalid(tf(""), {"TF_CONFIG is not valid JSON: \"\""});
  expect_invalid(tf("[1]"), {"TF_CONFIG must be a JSON object, not [1]"});
  expect_invalid(tf(R"({"cluster": ["a:1"]})"), {"\"cluster\" must be an object"});
  expect_invalid(tf(R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})"),
                 {"job \"worker\" must be a list", "\"a:1\""});
  expect_invalid(tf(R"({"cluster": {"worker": [1]}, "task": {"type": "worker", "index": 0}})"),
                 {"job \"worker\" has the address 1"});
  expect_invalid(tf(R"({"cluster": {"chef": ["a:1"]}, "task": {"type": "chef", "index": 0}})"),
                 {"unknown job \"chef\""});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}})"),
                 {"When `cluster_spec` is given, you must also specify `task_type` and `task_id`.",
                  "but no \"task\""});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})"),
                 {"its \"task\" lacks \"type\""});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})"),
                 {"lacks \"index\""});
  expect_invalid(tf(chief_and_workers("master", 0)),
                 {"Unrecognized task_type: 'master', valid task types are: \"chief\", "
                  "\"worker\", \"evaluator\" and \"ps\"."});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})"),
                 {"`task_type` 'chief' not found in cluster_spec."});
  expect_invalid(tf(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief",
                        "index": 0}})"),
                 {"There must be at most one 'chief' job."});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "f:1"]},
                        "task": {"type": "worker", "index": 0}})"),
                 {"There must be at most one 'evaluator' job."});
  expect_invalid(tf(chief_and_workers("worker", 2)),
                 {"The `task_id` 2 exceeds the maximum id of worker.", "from 0 to 1"});
  // An empty job: not "task.index runs from 0 to -1".
  expect_invalid(tf(R"({"cluster": {"chief": ["a:1"], "worker": []},
                        "task": {"type": "worker", "index": 0}})"),
                 {"the \"worker\" job of the cluster lists no address"});
  expect_invalid(tf(chief_and_workers("worker", -1)),
                 {"task.index -1 is not a non-negative whole number"});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker",
                        "index": "x"}})"),
                 {"task.index \"x\""});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": 3, "index": 0}})"),
                 {"task.type 3 must be a string"});
  expect_invalid(tf(R"({"cluster": {"evaluator": ["e:1"]},
                        "task": {"type": "evaluator", "index": 0}})"),
                 {"has no \"chief\" or \"worker\" tasks"});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:1", "a:1"]},
                        "task": {"type": "worker", "index": 0}})"),
                 {"the address \"a:1\" appears more than once"});
  expect_invalid(tf(R"({"cluster": {"worker": ["a", "b:1"]}, "task": {"type": "worker",
                        "index": 1}})"),
                 {"the address of worker 0 (the rendezvous leader) \"a\" has no port"});
  expect_invalid(tf(R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker",
                        "index": 0}})"),
                 {"\"a:99999\" has a bad port"});
  expect_invalid(tf(R"({"cluster": {"worker": ["::1:5"]}, "task": {"type": "worker",
                        "index": 0}})"),
                 {"write an IPv6 address in brackets"});
  expect_invalid(parse_tf_config(chief_and_workers("worker", 0), std::nullopt, -2),
                 {"task index -2 is negative"});
}

// ---------------------------------------------------------------- torchrun

TEST(ClusterSpec, Torchrun) {
  auto s = resolve({{"RANK", "3"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "3"},
                    {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "node0"},
                    {"MASTER_PORT", "29400"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "torchrun");
  EXPECT_EQ(s->rank, 3);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 3);
  EXPECT_EQ(s->local_world_size, 4);
  EXPECT_EQ(s->coordinator_address(), "node0:29400");
  EXPECT_FALSE(s->is_chief());
  // No MASTER_PORT: the default. TRIBUTARY_MASTER_* win over MASTER_*.
  auto d = resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->coordinator_port, kDefaultCoordinatorPort);
  EXPECT_TRUE(d->is_chief());
  auto o = resolve({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "node0"},
                    {"MASTER_PORT", "1"},
                    {"TRIBUTARY_MASTER_ADDR", "fast0"},
                    {"TRIBUTARY_MASTER_PORT", "2"}});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->coordinator_address(), "fast0:2");
  // A world of one needs no MASTER_ADDR.
  auto one = resolve({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->source, "torchrun");
}

TEST(ClusterSpec, TorchrunErrors) {
  expect_invalid(resolve({{"RANK", "0"}}), {"RANK=0 is set but WORLD_SIZE is not"});
  expect_invalid(resolve({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}}),
                 {"RANK=2 is not below WORLD_SIZE=2"});
  expect_invalid(resolve({{"RANK", "0"}, {"WORLD_SIZE", "-2"}, {"MASTER_ADDR", "m"}}),
                 {"WORLD_SIZE=\"-2\" is not a positive whole number"});
  expect_invalid(resolve({{"RANK", "0"}, {"WORLD_SIZE", "2x"}, {"MASTER_ADDR", "m"}}),
                 {"WORLD_SIZE=\"2x\""});
  expect_invalid(resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
                 {"MASTER_ADDR is not; set MASTER_ADDR to the host of rank 0"});
  expect_invalid(
      resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "70000"}}),
      {"MASTER_PORT=\"70000\" is out of range; use a free TCP port from 1 to 65535"});
  expect_invalid(
      resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "0"}}),
      {"MASTER_PORT=\"0\" is out of range"});
  expect_invalid(
      resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "http"}}),
      {"MASTER_PORT=\"http\" is not a port number"});
  expect_invalid(resolve({{"RANK", "0"},
                          {"WORLD_SIZE", "2"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "1"},
                          {"MASTER_ADDR", "m"}}),
                 {"LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"});
  expect_invalid(
      resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}, {"MASTER_ADDR", "m"}}),
      {"LOCAL_RANK=\"-1\""});
}

// ---------------------------------------------------------------- Slurm

TEST(ClusterSpec, Slurm) {
  // 9 tasks on n1 n2 (3 each), m5 (2) and o3 (1); this is task 4, the second on n2.
  Env env{{"SLURM_PROCID", "4"},
          {"SLURM_NTASKS", "9"},
          {"SLURM_JOB_NODELIST", "n[1-2],m5,o3"},
          {"SLURM_TASKS_PER_NODE", "3(x2),2,1"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"}};
  auto s = resolve(env);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "slurm");
  EXPECT_EQ(s->rank, 4);
  EXPECT_EQ(s->world_size, 9);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->local_world_size, 3);
  EXPECT_EQ(s->coordinator_address(), "m5:29500");  // first host in sorted order
  EXPECT_FALSE(s->is_chief());
  // m5 has 2 tasks.
  env["SLURM_NODEID"] = "2";
  env["SLURM_LOCALID"] = "0";
  auto m = resolve(env);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->local_world_size, 2);
  // TRIBUTARY_MASTER_PORT sets the port, MASTER_ADDR the host.
  env["TRIBUTARY_MASTER_PORT"] = "4000";
  EXPECT_EQ(resolve(env)->coordinator_address(), "m5:4000");
  env["MASTER_ADDR"] = "login1";
  EXPECT_EQ(resolve(env)->coordinator_address(), "login1:4000");
}

TEST(ClusterSpec, SlurmSortsHostsNumerically) {
  auto s = resolve(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "n[10-11],n9"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->coordinator_host, "n9");  // n9 < n10, as Slurm sorts
  EXPECT_TRUE(s->is_chief());
  EXPECT_EQ(s->local_rank, std::nullopt);
  EXPECT_EQ(s->local_world_size, std::nullopt);
  EXPECT_TRUE(internal::slurm_host_less("n9", "n10"));
  EXPECT_FALSE(internal::slurm_host_less("n10", "n9"));
  EXPECT_TRUE(internal::slurm_host_less("a100", "b1"));
  EXPECT_TRUE(internal::slurm_host_less("n1", "n1-ib"));
  EXPECT_FALSE(internal::slurm_host_less("n1", "n1"));
}

TEST(ClusterSpec, SlurmPrefersStepVariables) {
  // An srun step with fewer tasks than the job: the step's variables describe this process.
  auto s = resolve({{"SLURM_PROCID", "1"},
                    {"SLURM_NTASKS", "8"},
                    {"SLURM_STEP_NUM_TASKS", "2"},
                    {"SLURM_JOB_NODELIST", "a[1-4]"},
                    {"SLURM_STEP_NODELIST", "a[3-4]"},
                    {"SLURM_TASKS_PER_NODE", "2(x4)"},
                    {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_LOCALID", "0"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->world_size, 2);
  EXPECT_EQ(s->local_world_size, 1);
  EXPECT_EQ(s->coordinator_host, "a3");
}

TEST(ClusterSpec, SlurmErrors) {
  expect_invalid(resolve({{"SLURM_PROCID", "0"}}), {"neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS",
                                                    "Not running inside a SLURM "
                                                    "step?"});
  expect_invalid(resolve({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                 {"SLURM_PROCID=4 is not below SLURM_NTASKS=4"});
  expect_invalid(resolve({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}}), {"SLURM_PROCID=\"x\""});
  expect_invalid(resolve({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
                 {"SLURM_JOB_NODELIST", "host of rank 0 is unknown", "MASTER_ADDR"});
  expect_invalid(resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "6"},
                          {"SLURM_JOB_NODELIST", "n[1-3]"},
                          {"SLURM_TASKS_PER_NODE", "2(x2),1"}}),
                 {"SLURM_TASKS_PER_NODE=\"2(x2),1\" adds up to 5 tasks but SLURM_NTASKS=6"});
  expect_invalid(resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "6"},
                          {"SLURM_JOB_NODELIST", "n[1-2]"},
                          {"SLURM_TASKS_PER_NODE", "2(x3)"}}),
                 {"lists 3 nodes but SLURM_JOB_NODELIST has 2 hosts (n[1-2])"});
  expect_invalid(
      resolve({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[3-1]"}}),
      {"SLURM_JOB_NODELIST: Invalid hostlist format \"n[3-1]\""});
  expect_invalid(resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_JOB_NODELIST", "n1"},
                          {"SLURM_TASKS_PER_NODE", "2(x)"}}),
                 {"SLURM_TASKS_PER_NODE: Invalid tasks-per-node list format \"2(x)\""});
  expect_invalid(resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_JOB_NODELIST", "n[1-2]"},
                          {"SLURM_TASKS_PER_NODE", "2(x2)"},
                          {"SLURM_NODEID", "2"}}),
                 {"SLURM_NODEID=2 is not below the job's 2 nodes"});
  expect_invalid(resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_JOB_NODELIST", "n[1-2]"},
                          {"SLURM_TASKS_PER_NODE", "2(x2)"},
                          {"SLURM_NODEID", "0"},
                          {"SLURM_LOCALID", "2"}}),
                 {"SLURM_LOCALID=2 is not below the 2 tasks"});
}

// ---------------------------------------------------------------- Open MPI

TEST(ClusterSpec, OpenMpi) {
  Env env{{"OMPI_COMM_WORLD_RANK", "5"},
          {"OMPI_COMM_WORLD_SIZE", "6"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  expect_invalid(resolve(env),
                 {"Open MPI started 6 processes", "set MASTER_ADDR", "TRIBUTARY_MASTER_ADDR"});
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "7000";
  auto s = resolve(env);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "openmpi");
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 6);
  EXPECT_EQ(s->local_rank, 2);
  EXPECT_EQ(s->local_world_size, 3);
  EXPECT_EQ(s->coordinator_address(), "head:7000");
  auto t = resolve({{"OMPI_COMM_WORLD_RANK", "0"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"TRIBUTARY_MASTER_ADDR", "head2"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->coordinator_address(), "head2:29500");
  EXPECT_TRUE(t->is_chief());
  auto one = resolve({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  ASSERT_TRUE(one.ok()) << one.status().message();
  expect_invalid(resolve({{"OMPI_COMM_WORLD_RANK", "0"}}),
                 {"OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not"});
  expect_invalid(resolve({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
                 {"OMPI_COMM_WORLD_RANK=3 is not below OMPI_COMM_WORLD_SIZE=2"});
}

// ---------------------------------------------------------------- precedence

TEST(ClusterSpec, Precedence) {
  Env env{{"TRIBUTARY_RANK", "1"},
          {"TRIBUTARY_WORLD_SIZE", "2"},
          {"TRIBUTARY_MASTER_ADDR", "x"},
          {"TF_CONFIG", chief_and_workers("worker", 0)},
          {"RANK", "2"},
          {"WORLD_SIZE", "3"},
          {"MASTER_ADDR", "t"},
          {"OMPI_COMM_WORLD_RANK", "3"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"SLURM_PROCID", "4"},
          {"SLURM_NTASKS", "5"},
          {"SLURM_JOB_NODELIST", "s[1-5]"}};
  auto expect_source = [&](const std::string& source, int rank) {
    auto s = resolve(env);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->source, source);
    EXPECT_EQ(s->rank, rank);
  };
  expect_source("explicit", 1);
  env.erase("TRIBUTARY_RANK");
  env.erase("TRIBUTARY_WORLD_SIZE");
  expect_source("TF_CONFIG", 1);
  // TRIBUTARY_MASTER_ADDR still overrides the TF_CONFIG leader's host, keeping its port.
  EXPECT_EQ(resolve(env)->coordinator_address(), "x:2222");
  env.erase("TRIBUTARY_MASTER_ADDR");
  EXPECT_EQ(resolve(env)->coordinator_address(), "host0:2222");
  env.erase("TF_CONFIG");
  expect_source("torchrun", 2);
  env.erase("RANK");
  expect_source("openmpi", 3);  // mpirun inside a Slurm allocation: the MPI ranks are the truth
  env.erase("OMPI_COMM_WORLD_RANK");
  expect_source("slurm", 4);
  EXPECT_EQ(resolve(env)->coordinator_host, "t");  // Slurm honours MASTER_ADDR
  env.erase("SLURM_PROCID");
  expect_source("single-process", 0);
  // A bad higher-priority provider is an error, not a reason to fall through.
  env["TF_CONFIG"] = "{oops";
  expect_invalid(resolve(env), {"TF_CONFIG is not valid JSON"});
}

// ---------------------------------------------------------------- hostlist expansion

TEST(SlurmHostlist, Expands) {
  auto e = [](std::string_view text) {
    auto r = expand_slurm_hostlist(text);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : Strings{};
  };
  EXPECT_EQ(e("n[1-2],m5,o[3-4,6,7-9]"),
            (Strings{"n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"}));
  EXPECT_EQ(e("host"), Strings{"host"});
  EXPECT_EQ(e("a,b.example.com"), (Strings{"a", "b.example.com"}));
  EXPECT_EQ(e("n[08-11]"), (Strings{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(e("n[5]"), Strings{"n5"});
  EXPECT_EQ(e("n[1-2]-ib"), (Strings{"n1-ib", "n2-ib"}));
  EXPECT_EQ(e("r[1-2]n[1-2]"), (Strings{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(e("gpu-[001-002],cpu[9-10]"), (Strings{"gpu-001", "gpu-002", "cpu9", "cpu10"}));
}

TEST(SlurmHostlist, Errors) {
  struct Case {
    std::string text, why;
  };
  for (const Case& c : {
           Case{"n[3-1]", "range \"3-1\" runs backwards; write it low-high, e.g. \"1-3\""},
           Case{"n[1-", "\"[\" at position 1 is never closed"},
           Case{"n]1", "\"]\" at position 1 has no matching \"[\""},
           Case{"n[1[2]]", "\"[\" at position 3 is inside another \"[\""},
           Case{"", "it is empty"},
           Case{"a,,b", "empty host name at position 2"},
           Case{"a,", "empty host name at position 2"},
           Case{",a", "empty host name at position 0"},
           Case{"n[a-b]", "range \"a-b\" is not a number or a range"},
           Case{"n[1-2-3]", "range \"1-2-3\""},
           Case{"n[-3]", "range \"-3\""},
           Case{"n[]", "empty brackets"},
           Case{"n[1,,2]", "empty entry in \"[1,,2]\""},
           Case{"n[1-2], m1", "whitespace at position 7"},
           Case{"[1-2]", "has no host name before \"[\""},
           Case{"n[0-99999999]", "expands to more than"},
           Case{"n[99999999999999999999]", "too large"},
       }) {
    auto r = expand_slurm_hostlist(c.text);
    expect_invalid(r, {"Invalid hostlist format \"" + c.text + "\": ", c.why});
  }
}

TEST(SlurmTasksPerNode, Expands) {
  auto e = [](std::string_view text) {
    auto r = expand_slurm_tasks_per_node(text);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::vector<int>{};
  };
  EXPECT_EQ(e("3(x2),2,1"), (std::vector<int>{3, 3, 2, 1}));
  EXPECT_EQ(e("4"), std::vector<int>{4});
  EXPECT_EQ(e("2(x3)"), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(e("1,2(x1),3"), (std::vector<int>{1, 2, 3}));
}

TEST(SlurmTasksPerNode, Errors) {
  struct Case {
    std::string text, why;
  };
  for (const Case& c : {
           Case{"", "it is empty"},
           Case{"3(x0)", "repeat count in \"3(x0)\" must be at least 1"},
           Case{"3(x2", "\"3(x2\" is not N or N(xR)"},
           Case{"3(2)", "\"3(2)\" is not N or N(xR)"},
           Case{"x", "\"x\" is not N or N(xR)"},
           Case{"-1", "\"-1\" is not N or N(xR)"},
           Case{"3,,2", "\"\" is not N or N(xR)"},
           Case{"3(x-1)", "\"3(x-1)\""},
           Case{"1(x2000000)", "more than"},
       }) {
    auto r = expand_slurm_tasks_per_node(c.text);
    expect_invalid(r, {"Invalid tasks-per-node list format \"" + c.text + "\": ", c.why});
  }
}

// ---------------------------------------------------------------- the environment snapshot

TEST(ClusterSpec, EnvironmentSnapshotCapturesLauncherVariables) {
  const Env vars{{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29555"},
                 {"SLURM_PROCID", "1"},
                 {"SLURM_JOB_NODELIST", "n[1-2]"},
                 {"OMPI_COMM_WORLD_RANK", "1"},
                 {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                 {"TRIBUTARY_CLUSTER_TEST", "x"}};
  for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  ::setenv("RANKING_NOT_A_LAUNCHER_VAR", "7", 1);
  Config c = Config::from_environment();
  for (const auto& [k, v] : vars) ::unsetenv(k.c_str());
  ::unsetenv("RANKING_NOT_A_LAUNCHER_VAR");
  for (const auto& [k, v] : vars) {
    EXPECT_EQ(c.get(k), v) << k;
    if (c.find(k) != nullptr) {
      EXPECT_EQ(c.find(k)->source, "environment");
    }
  }
  EXPECT_EQ(c.get("RANKING_NOT_A_LAUNCHER_VAR"), std::nullopt);
  auto s = resolve_cluster_spec(c);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->source, "torchrun");
  EXPECT_EQ(s->coordinator_address(), "127.0.0.1:29555");
}

}  // namespace
}  // namespace tributary

namespace tributary {
namespace {

// A rank whose chief never comes up gives up after TRIBUTARY_TIMEOUT, not after 5 minutes.
TEST(MakeBackendContext, StoreConnectHonoursTributaryTimeout) {
  const testing::ReservedPort reserved;  // nobody listens there
  ASSERT_NE(reserved.port(), 0);
  const std::string port = std::to_string(reserved.port());
  Config config = Config::from_map({{"TRIBUTARY_RANK", "1"},
                                    {"TRIBUTARY_WORLD_SIZE", "2"},
                                    {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                    {"TRIBUTARY_MASTER_PORT", port},
                                    {"TRIBUTARY_TIMEOUT", "1s"}});
  const auto start = std::chrono::steady_clock::now();
  auto ctx = make_backend_context({Device::cpu(0)}, config);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("could not reach the rendezvous store"), std::string::npos)
      << ctx.status().to_string();
  EXPECT_LT(seconds, 10.0) << ctx.status().to_string();

  config.set("TRIBUTARY_TIMEOUT", "soon");
  auto bad = make_backend_context({Device::cpu(0)}, config);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("TRIBUTARY_TIMEOUT='soon'"), std::string::npos);
}

// A backend whose peer never joins fails at its timeout=, naming the rank, on the rank that hosts
// the job's store (which keeps wills): not 2 s later, as when the wait for a lost rank's name
// followed every failure of a setup.
TEST(BackendSetup, APeerThatNeverJoinsFailsAtTheBackendsTimeout) {
  const testing::ReservedPort reserved;  // the store of rank 0 listens there next
  ASSERT_NE(reserved.port(), 0);
  const std::string port = std::to_string(reserved.port());
  auto ctx = make_backend_context({Device::cpu(0)},
                                  Config::from_map({{"TRIBUTARY_RANK", "0"},
                                                    {"TRIBUTARY_WORLD_SIZE", "2"},
                                                    {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                                    {"TRIBUTARY_MASTER_PORT", port}}));
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const BackendRegistry registry = builtin_backends();
  for (const char* spec : {"ring:intra_host=net,timeout=1s", "ring:timeout=1s"}) {
    const auto start = std::chrono::steady_clock::now();
    auto ops = registry.create(spec, *ctx);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(ops.ok()) << spec;
    EXPECT_EQ(ops.status().code(), StatusCode::kDeadlineExceeded) << ops.status().to_string();
    EXPECT_NE(ops.status().message().find("rank 1 did not join"), std::string::npos)
        << ops.status().to_string();
    EXPECT_GE(seconds, 0.9) << spec;
    // The wait is 1 s; it took 3 s with the grace.
    EXPECT_LT(seconds, 2.5) << spec << ": " << ops.status().to_string();
  }
}

// Before a multi-process backend connects, its ranks meet in the store: a rank whose own settings
// its backend refuses, or that creates another backend, fails every rank at once, named, instead
// of leaving them to wait out the timeout (60 s here) for a peer that never connects.
TEST(BackendSetup, RanksThatCannotMeetFailEveryRankAtOnce) {
  const BackendRegistry registry = builtin_backends();
  struct Case {
    std::string spec0, spec1;
    std::map<std::string, std::string> config1;  // rank 1's own settings
    std::string says0, says1;                    // what each rank's error must say
  };
  std::vector<Case> cases = {
      {"ring:timeout=60s",
       "ring:timeout=60s",
       {{"TRIBUTARY_RING_ALGORITHM", "bogus"}},
       "rank 1 could not create its backend (ring: backend 'ring': bad value 'bogus' for option "
       "algorithm",
       "bad value 'bogus' for option algorithm"}};
  if (registry.find("gloo") != nullptr) {
    cases.push_back({"ring:timeout=60s",
                     "gloo:timeout=60s",
                     {},
                     "rank 1 creates backend 'gloo' where rank 0 creates 'ring'",
                     "rank 1 creates backend 'gloo' where rank 0 creates 'ring'"});
  }
  for (const Case& c : cases) {
    auto store = std::make_shared<MemoryStore>();
    StatusOr<std::unique_ptr<CrossDeviceOps>> made[2] = {Status(), Status()};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        BackendContext ctx;
        ctx.rank = r;
        ctx.world_size = 2;
        ctx.store = store;
        if (r == 1) ctx.config = Config::from_map(c.config1);
        made[r] = registry.create(r == 0 ? c.spec0 : c.spec1, ctx);
      });
    }
    for (std::thread& t : ranks) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(made[r].ok()) << c.spec1 << ": rank " << r;
      EXPECT_NE(made[r].status().message().find(r == 0 ? c.says0 : c.says1), std::string::npos)
          << "rank " << r << ": " << made[r].status().to_string();
    }
    EXPECT_LT(seconds, 30) << "the ranks waited for each other: " << c.spec1;
  }
}

// A rank whose settings check_everywhere refuses before it joins (the tools, the C API, Python and
// the strategies call it first) still tells the others, which fail at once naming it: here under
// 'auto', whose ranks first agree on what it follows.
TEST(BackendSetup, ARankRefusedBeforeJoiningTellsTheOthers) {
  const testing::ReservedPort reserved;
  ASSERT_NE(reserved.port(), 0);
  const std::string port = std::to_string(reserved.port());
  auto config = [&](int rank) {
    std::map<std::string, std::string> vars{{"TRIBUTARY_RANK", std::to_string(rank)},
                                            {"TRIBUTARY_WORLD_SIZE", "2"},
                                            {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                            {"TRIBUTARY_MASTER_PORT", port},
                                            {"TRIBUTARY_TIMEOUT", "60s"}};
    if (rank == 1) vars["TRIBUTARY_TIMEOUT"] = "abc";  // rank 1's own environment
    return Config::from_map(vars);
  };
  const BackendRegistry registry = builtin_backends();
  Status result[2];
  const auto start = std::chrono::steady_clock::now();
  std::thread rank1(
      [&] { result[1] = registry.check_everywhere("auto", config(1), {Device::cpu(0)}); });
  {
    auto ctx = make_backend_context({Device::cpu(0)}, config(0));
    result[0] = ctx.ok() ? registry.create("auto", *ctx).status() : ctx.status();
  }
  rank1.join();  // (no ASSERT before this: the thread must be joined)
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result[1].message().find("bad value 'abc' for option timeout"), std::string::npos)
      << result[1].to_string();
  EXPECT_EQ(result[0].code(), StatusCode::kFailedPrecondition) << result[0].to_string();
  EXPECT_NE(result[0].message().find("rank 1 could not create its backend"), std::string::npos)
      << result[0].to_string();
  EXPECT_LT(seconds, 30) << "rank 0 waited for rank 1 (timeout 60 s)";
}

// A socket listening on a free port of every interface (as tributary-run binds MASTER_PORT), or -1.
int listening_socket(std::string* port) {
  std::uint16_t p = 0;
  const int fd = testing::listening_socket(&p);
  *port = std::to_string(p);
  return fd;
}

// The chief serves the store on the socket a launcher bound for it (TRIBUTARY_STORE_FD): the port
// was never released, so nothing could take it, and binding it again would fail.
TEST(MakeBackendContext, ChiefServesTheStoreOnTheLaunchersSocket) {
  std::string port;
  const int fd = listening_socket(&port);
  ASSERT_GE(fd, 0);
  auto config = [&](int rank) {
    return Config::from_map({{"TRIBUTARY_RANK", std::to_string(rank)},
                             {"TRIBUTARY_WORLD_SIZE", "2"},
                             {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                             {"TRIBUTARY_MASTER_PORT", port},
                             {"TRIBUTARY_STORE_FD", std::to_string(fd)},
                             {"TRIBUTARY_TIMEOUT", "20s"}});
  };
  // Rank 1 first: it waits in the socket's backlog until the chief serves.
  StatusOr<BackendContext> one = invalid_argument("not run");
  std::thread rank1([&] { one = make_backend_context({Device::cpu(0)}, config(1)); });
  auto zero = make_backend_context({Device::cpu(0)}, config(0));
  rank1.join();
  ASSERT_TRUE(zero.ok()) << zero.status().to_string();
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_TRUE(zero->store->set("from 0", "hello").ok());
  auto got = one->store->get("from 0", std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, "hello");
}

// The socket a launcher handed down, when the chief cannot take it: the port is held by this very
// process, and the error says so (instead of blaming another job), and why. Only in the
// environment, not in the context's Config: the Config lacks the variable. Taken already by a
// running server: this process serves on the port. A context for another port first takes
// nothing and leaves the socket for the one it was meant for.
TEST(MakeBackendContext, AChiefThatCannotTakeTheHandedSocketSaysWhy) {
  std::string port;
  const int fd = listening_socket(&port);
  ASSERT_GE(fd, 0);
  const std::string named = "TRIBUTARY_STORE_FD=" + std::to_string(fd);
  auto chief = [&](const std::string& on, bool in_config, const char* world = "2") {
    std::map<std::string, std::string> vars{{"TRIBUTARY_RANK", "0"},
                                            {"TRIBUTARY_WORLD_SIZE", world},
                                            {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                            {"TRIBUTARY_MASTER_PORT", on},
                                            {"TRIBUTARY_TIMEOUT", "1s"}};
    if (in_config) vars["TRIBUTARY_STORE_FD"] = std::to_string(fd);
    return make_backend_context({Device::cpu(0)}, Config::from_map(vars));
  };

  ::setenv("TRIBUTARY_STORE_FD", std::to_string(fd).c_str(), 1);
  auto lacking = chief(port, false);
  ::unsetenv("TRIBUTARY_STORE_FD");
  ASSERT_FALSE(lacking.ok());
  const std::string& m = lacking.status().message();
  EXPECT_NE(m.find("this process holds the port itself"), std::string::npos) << m;
  EXPECT_NE(m.find(named), std::string::npos) << m;
  EXPECT_NE(m.find("lacks TRIBUTARY_STORE_FD"), std::string::npos) << m;
  EXPECT_NE(m.find("--release-master-port"), std::string::npos) << m;
  EXPECT_EQ(::fcntl(fd, F_GETFD), 0) << "the socket was closed or changed";

  const testing::ReservedPort reserved;
  ASSERT_NE(reserved.port(), 0);
  const std::string other = std::to_string(reserved.port());
  EXPECT_TRUE(chief(other, true).ok()) << "a context on another port";
  auto first = chief(port, true);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  // A second context of the same job shares the first one's connection (make_backend_context);
  // one of another job (here another world size) would need a server of its own on the port.
  auto same = chief(port, true);
  ASSERT_TRUE(same.ok()) << same.status().to_string();
  EXPECT_EQ(same->store, first->store);
  auto second = chief(port, true, "3");
  ASSERT_FALSE(second.ok());
  const std::string& n = second.status().message();
  EXPECT_NE(n.find("this process already serves on the port"), std::string::npos) << n;
  EXPECT_NE(n.find(named), std::string::npos) << n;
}

// Several contexts of one job in one process (the C API's and Python's backend(), each strategy):
// the later ones share the first one's connection, its server and its instance numbers, until
// every holder is gone; another rank of the job, in the same process as tests run ranks, has its
// own.
TEST(MakeBackendContext, ContextsOfOneJobInOneProcessShareItsConnection) {
  const testing::ReservedPort reserved;
  ASSERT_NE(reserved.port(), 0);
  const std::string port = std::to_string(reserved.port());
  auto make = [&](const std::string& rank, Device device) {
    return make_backend_context({device}, Config::from_map({{"TRIBUTARY_RANK", rank},
                                                            {"TRIBUTARY_WORLD_SIZE", "2"},
                                                            {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                                            {"TRIBUTARY_MASTER_PORT", port},
                                                            {"TRIBUTARY_TIMEOUT", "1s"}}));
  };
  auto a = make("0", Device::cpu(0));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = make("0", Device::cpu(1));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->store, b->store);
  EXPECT_EQ(a->keep_alive, b->keep_alive);
  // One numbering of backends for the job's rank, whichever context makes them (in the store).
  using internal::Numbering;
  // The number, or 99 when the store did not answer.
  const auto number = [](const StatusOr<uint64_t>& n) { return n.ok() ? *n : uint64_t{99}; };
  ASSERT_EQ(number(internal::take_number(*a, Numbering::kInstances)), 0u);
  ASSERT_EQ(number(internal::take_number(*b, Numbering::kInstances)), 1u);
  EXPECT_EQ(number(internal::numbers_taken(*a, Numbering::kInstances)), 2u);
  EXPECT_EQ(number(internal::numbers_taken(*a, Numbering::kSetups)), 0u);
  ASSERT_EQ(b->devices.size(), 1u);
  EXPECT_EQ(b->devices[0], Device::cpu(1)) << "each context keeps its own devices";
  auto other_rank = make("1", Device::cpu(0));
  ASSERT_TRUE(other_rank.ok()) << other_rank.status().to_string();
  EXPECT_NE(other_rank->store, a->store);
  EXPECT_EQ(number(internal::numbers_taken(*other_rank, Numbering::kInstances)), 0u);
  // Every holder gone: the next context starts a server of its own on the port, now free, and
  // with it the numbering starts again (as it does on ranks restarted against it).
  const std::weak_ptr<Store> old_store = a->store;
  *other_rank = BackendContext();
  *b = BackendContext();
  *a = BackendContext();
  EXPECT_TRUE(old_store.expired());
  auto fresh = make("0", Device::cpu(0));
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  EXPECT_NE(fresh->keep_alive, nullptr);
  EXPECT_NE(fresh->store, nullptr);
  EXPECT_EQ(number(internal::numbers_taken(*fresh, Numbering::kInstances)), 0u);
}

// An empty secret is an error, not a job without one: set from nothing by mistake, it would turn
// authentication off unnoticed (before, TRIBUTARY_SECRET="" ran unauthenticated).
TEST(MakeBackendContext, AnEmptySecretIsRefused) {
  const testing::ReservedPort reserved;
  ASSERT_NE(reserved.port(), 0);
  const std::string file = ::testing::TempDir() + "empty_secret";
  { std::ofstream(file) << "\n"; }
  const std::pair<const char*, std::string> cases[] = {
      {"TRIBUTARY_SECRET", "TRIBUTARY_SECRET is set but empty"},
      {"TRIBUTARY_SECRET_FILE", "the secret file '" + file + "' is empty"}};
  for (const auto& [key, says] : cases) {
    auto ctx = make_backend_context(
        {Device::cpu(0)},
        Config::from_map({{"TRIBUTARY_RANK", "0"},
                          {"TRIBUTARY_WORLD_SIZE", "2"},
                          {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                          {"TRIBUTARY_MASTER_PORT", std::to_string(reserved.port())},
                          {key, std::string(key) == "TRIBUTARY_SECRET" ? "" : file},
                          {"TRIBUTARY_TIMEOUT", "1s"}}));
    ASSERT_FALSE(ctx.ok()) << key;
    EXPECT_EQ(ctx.status().code(), StatusCode::kInvalidArgument) << ctx.status().to_string();
    EXPECT_NE(ctx.status().message().find(says), std::string::npos) << ctx.status().to_string();
  }
  std::remove(file.c_str());
}

// A TRIBUTARY_STORE_FD that names no socket listening on the port (a variable inherited without
// the descriptor, say) is ignored, and the descriptor under that number is left alone.
TEST(MakeBackendContext, AStoreDescriptorThatIsNotTheListenerIsIgnored) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const testing::ReservedPort reserved;
  ASSERT_NE(reserved.port(), 0);
  const std::string port = std::to_string(reserved.port());
  for (const std::string& value : {std::to_string(p[0]), std::string("x")}) {
    auto ctx = make_backend_context({Device::cpu(0)},
                                    Config::from_map({{"TRIBUTARY_RANK", "0"},
                                                      {"TRIBUTARY_WORLD_SIZE", "2"},
                                                      {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                                      {"TRIBUTARY_MASTER_PORT", port},
                                                      {"TRIBUTARY_STORE_FD", value},
                                                      {"TRIBUTARY_TIMEOUT", "1s"}}));
    ASSERT_TRUE(ctx.ok()) << value << ": " << ctx.status().to_string();
  }
  EXPECT_EQ(::write(p[1], "k", 1), 1) << "the pipe was closed";
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace tributary
