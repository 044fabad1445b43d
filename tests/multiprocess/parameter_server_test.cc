// ParameterServerStrategy and ClusterCoordinator with real processes: this process is the chief
// (coordinator); workers and ps tasks are forked children running run_server() on their TF_CONFIG
// addresses. Partitioners are checked against TF's documented examples.
#include "tributary/strategy/parameter_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/multiprocess/harness.h"

namespace tributary {
namespace {

using namespace std::chrono_literals;

// --- Partitioners (TF's docstring examples) --------------------------------------------------------

std::vector<int64_t> parts(const StatusOr<VariablePartitioner>& p, Shape shape) {
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? (*p)(shape, DType::kFloat32) : std::vector<int64_t>{};
}

TEST(Partitioners, AsTfDocumentsThem) {
  EXPECT_EQ(parts(fixed_shards_partitioner(2), {10, 3}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(parts(fixed_shards_partitioner(20), {10, 3}), (std::vector<int64_t>{10, 1}));
  EXPECT_EQ(parts(min_size_partitioner(4, 2), {6, 1}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(parts(min_size_partitioner(4, 10), {6, 1}), (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(parts(max_size_partitioner(4), {6, 1}), (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(parts(max_size_partitioner(4, 2), {6, 1}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(parts(max_size_partitioner(1024), {6, 1}), (std::vector<int64_t>{1, 1}));
  // MinSizePartitioner rounds up, as TF's min_max_variable_partitioner: ceil(bytes / min).
  EXPECT_EQ(parts(min_size_partitioner(16, 10), {10}), (std::vector<int64_t>{3}));
  EXPECT_EQ(parts(min_size_partitioner(32, 8), {3, 5}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(parts(min_size_partitioner(5, 10), {6, 1}), (std::vector<int64_t>{5, 1}));
  for (auto bad : {fixed_shards_partitioner(0), min_size_partitioner(0), max_size_partitioner(-1)}) {
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("must be positive"), std::string::npos)
        << bad.status().message();
  }
}

// --- A cluster of forked tasks ---------------------------------------------------------------------

// Functions every task knows (registered before any fork, so children inherit them).
void register_functions() {
  static bool done = false;
  if (done) return;
  done = true;
  // Adds 1 to "counter" after `args[0]` milliseconds; returns the worker's index.
  ASSERT_TRUE(register_worker_function(
                  "count", [](WorkerContext& ctx, std::span<const RemoteArg> args)
                               -> StatusOr<std::vector<Array>> {
                    const auto ms = static_cast<int>(std::get<Array>(args[0]).at(0));
                    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
                    TRIBUTARY_ASSIGN_OR_RETURN(PSVariable counter, ctx.variable("counter"));
                    TRIBUTARY_RETURN_IF_ERROR(counter.assign_add(Array::scalar<float>(1)));
                    return std::vector<Array>{Array::scalar<int32_t>(ctx.worker_index())};
                  })
                  .ok());
  // Embedding step: gathers rows args[0] of "table", adds 1 to each through scatter_add.
  ASSERT_TRUE(register_worker_function(
                  "embed", [](WorkerContext& ctx, std::span<const RemoteArg> args)
                               -> StatusOr<std::vector<Array>> {
                    const std::vector<int64_t> rows = std::get<Array>(args[0]).to_vector<int64_t>();
                    TRIBUTARY_ASSIGN_OR_RETURN(PSVariable table, ctx.variable("table"));
                    TRIBUTARY_ASSIGN_OR_RETURN(Array got, table.gather(rows));
                    TRIBUTARY_ASSIGN_OR_RETURN(
                        Array ones, Array::zeros(DType::kFloat32, got.shape()));
                    for (int64_t i = 0; i < ones.num_elements(); ++i) ones.mutable_data<float>()[i] = 1;
                    TRIBUTARY_RETURN_IF_ERROR(table.scatter_add(rows, ones));
                    return std::vector<Array>{got};
                  })
                  .ok());
  // Reads the next element of the per-worker iterator args[0].
  ASSERT_TRUE(register_worker_function(
                  "next", [](WorkerContext& ctx, std::span<const RemoteArg> args)
                              -> StatusOr<std::vector<Array>> {
                    TRIBUTARY_ASSIGN_OR_RETURN(Element e,
                                               ctx.next(std::get<PerWorkerIterator>(args[0])));
                    return std::vector<Array>{e[0], Array::scalar<int32_t>(ctx.worker_index())};
                  })
                  .ok());
  // Three elements that say the InputContext: 1000 * num_input_pipelines + 100 * input_pipeline_id
  // + 10 * num_replicas_in_sync + 0..2.
  ASSERT_TRUE(register_dataset_function("three", [](const InputContext& ic) {
                const int64_t base = 1000 * ic.num_input_pipelines() +
                                     100 * ic.input_pipeline_id() + 10 * ic.num_replicas_in_sync();
                return Dataset::range(base, base + 3);
              }).ok());
  // Adds 1 to "counter", then returns `args[0]` float32 zeros.
  ASSERT_TRUE(
      register_worker_function(
          "count_and_return",
          [](WorkerContext& ctx, std::span<const RemoteArg> args) -> StatusOr<std::vector<Array>> {
            TRIBUTARY_ASSIGN_OR_RETURN(PSVariable counter, ctx.variable("counter"));
            TRIBUTARY_RETURN_IF_ERROR(counter.assign_add(Array::scalar<float>(1)));
            const auto n = static_cast<int64_t>(std::get<Array>(args[0]).at(0));
            TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(DType::kFloat32, {n}));
            return std::vector<Array>{std::move(out)};
          })
          .ok());
}

class Cluster {
 public:
  Cluster(int workers, int ps, std::string secret = "", std::string task_secret = "")
      : secret_(std::move(secret)) {
    register_functions();
    // Each worker and ps task gets the socket of its port, held until it starts (start()). The
    // chief serves nothing: its port, picked while the tasks' are held, only has to be distinct.
    ports_.push_back(0);
    for (int i = 0; i < workers + ps; ++i) {
      std::uint16_t port = 0;
      const int fd = testing::listening_socket(&port);
      EXPECT_GE(fd, 0) << "cannot listen for a task: " << std::strerror(errno);
      ports_.push_back(port);
      sockets_[i < workers ? "worker" : "ps"].push_back(fd);
    }
    ports_[0] = testing::free_port();
    auto list = [&](int from, int n) {
      std::string s = "[";
      for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::string("\"127.0.0.1:") +
             std::to_string(ports_[static_cast<size_t>(from + i)]) + "\"";
      }
      return s + "]";
    };
    cluster_ = R"({"chief": )" + list(0, 1) + R"(, "worker": )" + list(1, workers) +
               R"(, "ps": )" + list(1 + workers, ps) + "}";
    for (int w = 0; w < workers; ++w) pids_["worker"].push_back(start("worker", w, task_secret));
    for (int p = 0; p < ps; ++p) pids_["ps"].push_back(start("ps", p, task_secret));
  }
  ~Cluster() {
    for (auto& [job, pids] : pids_) {
      for (pid_t& pid : pids) kill_task(pid);
    }
    for (auto& [job, fds] : sockets_) {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
    }
  }

  Config config(const std::string& type, int index, const std::string& secret) const {
    std::map<std::string, std::string> m{
        {"TF_CONFIG", R"({"cluster": )" + cluster_ + R"(, "task": {"type": ")" + type +
                          R"(", "index": )" + std::to_string(index) + "}}"},
        {"TRIBUTARY_TIMEOUT", "5s"}};
    if (!secret.empty()) m["TRIBUTARY_SECRET"] = secret;
    return Config::from_map(m);
  }
  Config chief_config() const { return config("chief", 0, secret_); }

  // Starts the task on the socket held for it (TRIBUTARY_STORE_FD: the server must take it, since
  // it holds the port) and closes this process's copy.
  pid_t start(const std::string& type, int index, const std::string& secret) {
    Config c = config(type, index, secret.empty() ? secret_ : secret);
    int& fd = sockets_[type][static_cast<size_t>(index)];
    if (fd >= 0) c.set("TRIBUTARY_STORE_FD", std::to_string(fd));
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(120);
      // The sockets of the other tasks are theirs: a copy here would keep a killed task's port
      // answering.
      for (auto& [job, fds] : sockets_) {
        for (int other : fds) {
          if (other >= 0 && other != fd) ::close(other);
        }
      }
      ServerOptions o;
      o.config = c;
      Status s = run_server(o);
      if (!s.ok()) fprintf(stderr, "%s:%d: %s\n", type.c_str(), index, s.to_string().c_str());
      _exit(s.ok() ? 0 : 1);
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    return pid;
  }
  // The task again, on its port, which is bound again here first.
  void restart(const std::string& type, int index) {
    pid_t& pid = pids_[type][static_cast<size_t>(index)];
    kill_task(pid);
    std::uint16_t port = port_of(type, index);
    sockets_[type][static_cast<size_t>(index)] = testing::listening_socket(&port);
    pid = start(type, index, "");
  }
  void kill_task(pid_t& pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  pid_t& pid(const std::string& type, int index) { return pids_[type][static_cast<size_t>(index)]; }
  std::uint16_t port_of(const std::string& type, int index) const {
    const size_t workers = sockets_.count("worker") ? sockets_.at("worker").size() : 0;
    return ports_[1 + (type == "ps" ? workers : 0) + static_cast<size_t>(index)];
  }

 private:
  std::string secret_;
  std::vector<uint16_t> ports_;  // chief, workers, ps tasks
  std::string cluster_;
  std::map<std::string, std::vector<pid_t>> pids_;
  std::map<std::string, std::vector<int>> sockets_;  // held until start(); -1 after
};

// errno of a TCP connection to 127.0.0.1:`port` (0 when it is accepted).
int connect_errno(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const int e = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  ::close(fd);
  return e;
}

std::unique_ptr<ParameterServerStrategy> make_strategy(const Cluster& c,
                                                       VariablePartitioner partitioner = {}) {
  ParameterServerStrategyOptions o;
  o.config = c.chief_config();
  o.variable_partitioner = std::move(partitioner);
  auto s = ParameterServerStrategy::create(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(ParameterServer, PlacementShardsScheduleJoinFetch) {
  Cluster cluster(2, 2, "job-secret");
  auto fixed = fixed_shards_partitioner(4);
  ASSERT_TRUE(fixed.ok());
  auto strategy = make_strategy(cluster, *fixed);
  ASSERT_TRUE(strategy);
  EXPECT_EQ(strategy->num_workers(), 2);
  EXPECT_EQ(strategy->num_ps(), 2);

  // Round-robin placement; a scalar is never partitioned; 10 rows in 4 shards are 3, 3, 2, 2.
  auto counter = strategy->create_variable("counter", Array::scalar<float>(0));
  ASSERT_TRUE(counter.ok()) << counter.status().to_string();
  ASSERT_EQ(counter->shards().size(), 1u);
  EXPECT_EQ(counter->shards()[0].ps_task, 0);
  std::vector<float> init(10 * 2);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i);
  auto table = strategy->create_variable("table", *Array::from_vector(init, {10, 2}));
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  ASSERT_TRUE(table->is_sharded());
  std::vector<int64_t> sizes, places;
  std::vector<std::string> names;
  for (const PSVariableShard& s : table->shards()) {
    sizes.push_back(s.row_end - s.row_begin);
    places.push_back(s.ps_task);
    names.push_back(s.name);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(places, (std::vector<int64_t>{1, 0, 1, 0}));  // after "counter" on ps 0
  EXPECT_EQ(names[3], "table/part_3");
  auto whole = table->read();
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(whole->to_vector<float>(), init);
  auto again = strategy->create_variable("table", Array::scalar<float>(0));
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);

  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  ClusterCoordinator& co = **coordinator;
  std::vector<RemoteValue> values;
  for (int i = 0; i < 12; ++i) {
    auto v = co.schedule("count", {Array::scalar<float>(30)});
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    values.push_back(*v);
  }
  EXPECT_FALSE(*co.done());
  Status joined_all = co.join();
  ASSERT_TRUE(joined_all.ok()) << joined_all.to_string();
  EXPECT_TRUE(*co.done());
  std::set<int> workers_used;
  for (const RemoteValue& v : values) {
    ASSERT_TRUE(v.ready());
    auto got = v.fetch();
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    workers_used.insert(static_cast<int>(got->at(0).at(0)));
  }
  EXPECT_EQ(workers_used, (std::set<int>{0, 1}));  // both workers took functions
  EXPECT_EQ(counter->read()->at(0), 12.0);

  // Embedding rows spanning shards: gathered in the order asked, updated where they live.
  auto e = co.schedule("embed", {*Array::from_vector<int64_t>({9, 0, 4, 9})});
  ASSERT_TRUE(e.ok());
  auto rows = e->fetch();
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_EQ(rows->at(0).to_vector<float>(), (std::vector<float>{18, 19, 0, 1, 8, 9, 18, 19}));
  auto after = table->read();
  ASSERT_TRUE(after.ok());
  std::vector<float> want = init;
  for (int r : {9, 0, 4, 9}) want[r * 2] += 1, want[r * 2 + 1] += 1;  // row 9 twice
  EXPECT_EQ(after->to_vector<float>(), want);

  // A function's own error comes back from join() and fetch(), naming it and the worker.
  auto bad = co.schedule("embed", {*Array::from_vector<int64_t>({10})});
  ASSERT_TRUE(bad.ok());
  Status joined = co.join();
  EXPECT_EQ(joined.code(), StatusCode::kInvalidArgument) << joined.to_string();
  EXPECT_NE(joined.message().find("function 'embed' failed on worker:"), std::string::npos);
  EXPECT_NE(joined.message().find("row 10"), std::string::npos) << joined.message();
  EXPECT_FALSE(bad->fetch().ok());
  EXPECT_TRUE(co.join().ok());  // reported once
  // done() reports it too (TF's done() raises it), once what ran has ended; then true again.
  ASSERT_TRUE(co.schedule("embed", {*Array::from_vector<int64_t>({11})}).ok());
  StatusOr<bool> finished = false;
  for (int i = 0; i < 200 && finished.ok() && !*finished; ++i) {
    finished = co.done();
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(finished.status().code(), StatusCode::kInvalidArgument)
      << finished.status().to_string();
  EXPECT_NE(finished.status().message().find("row 11"), std::string::npos)
      << finished.status().message();
  ASSERT_TRUE(co.done().ok());
  EXPECT_TRUE(*co.done());
  EXPECT_EQ(co.schedule("no_such_function").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(co.shutdown_servers().ok());
}

TEST(ParameterServer, PerWorkerDatasetsAndEndOfData) {
  Cluster cluster(2, 1);
  auto strategy = make_strategy(cluster);
  ASSERT_TRUE(strategy);
  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  auto dataset = (*coordinator)->create_per_worker_dataset("three");
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  PerWorkerIterator it = dataset->iterator();
  std::vector<RemoteValue> values;
  for (int i = 0; i < 2; ++i) values.push_back(*(*coordinator)->schedule("next", {it}));
  ASSERT_TRUE((*coordinator)->join().ok());
  for (const RemoteValue& v : values) {
    auto got = v.fetch();
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const int64_t element = static_cast<int64_t>(got->at(0).at(0));
    // TF's InputContext for ParameterServerStrategy: (1 pipeline, id 0, 1 replica in sync) on
    // every worker, each reading the whole pipeline.
    EXPECT_GE(element, 1010);
    EXPECT_LT(element, 1013);
  }
  // Seven more calls: six elements in all, so a pipeline runs out: TF's OutOfRangeError.
  Status end;
  for (int i = 0; i < 7 && end.ok(); ++i) {
    auto v = (*coordinator)->schedule("next", {it});
    if (!v.ok()) end = v.status();
  }
  if (end.ok()) end = (*coordinator)->join();
  EXPECT_EQ(end.code(), StatusCode::kOutOfRange) << end.to_string();
  EXPECT_EQ((*coordinator)->create_per_worker_dataset("none").status().code(),
            StatusCode::kNotFound);
}

TEST(ParameterServer, KilledWorkerIsRescheduledAndRejoins) {
  Cluster cluster(2, 1);
  auto strategy = make_strategy(cluster);
  ASSERT_TRUE(strategy);
  auto counter = strategy->create_variable("counter", Array::scalar<float>(0));
  ASSERT_TRUE(counter.ok());
  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  ClusterCoordinator& co = **coordinator;
  std::vector<RemoteValue> values;
  for (int i = 0; i < 10; ++i) values.push_back(*co.schedule("count", {Array::scalar<float>(300)}));
  std::this_thread::sleep_for(450ms);  // both workers are inside a function
  cluster.kill_task(cluster.pid("worker", 1));
  ASSERT_TRUE(co.join().ok());
  for (const RemoteValue& v : values) {
    auto got = v.fetch();
    ASSERT_TRUE(got.ok()) << got.status().to_string();
  }
  EXPECT_GE(co.rescheduled(), 1);
  EXPECT_GE(counter->read()->at(0), 10.0);  // at least once each

  // Worker 1 comes back and is sent work again.
  cluster.restart("worker", 1);
  std::set<int> used;
  for (int round = 0; round < 10 && !used.contains(1); ++round) {
    std::vector<RemoteValue> more;
    for (int i = 0; i < 4; ++i) more.push_back(*co.schedule("count", {Array::scalar<float>(100)}));
    ASSERT_TRUE(co.join().ok());
    for (const RemoteValue& v : more) used.insert(static_cast<int>(v.fetch()->at(0).at(0)));
  }
  EXPECT_TRUE(used.contains(1)) << "the restarted worker was never sent work";
}

// A failure that would come back on any worker is the function's error, reported once: not a
// worker failure to retry elsewhere (TF retries only on a worker's unavailability). A result above
// the frame limit (the worker answers the error) and an argument above it (refused before
// sending) each fail at once, and the function ran at most once.
TEST(ParameterServer, ErrorsThatAreNotAWorkersFailureAreNotRetried) {
  Cluster cluster(2, 1);
  auto strategy = make_strategy(cluster);
  ASSERT_TRUE(strategy);
  auto counter = strategy->create_variable("counter", Array::scalar<float>(0));
  ASSERT_TRUE(counter.ok());
  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  ClusterCoordinator& co = **coordinator;
  const int64_t over = (int64_t{68} << 20) / 4;  // 68 MiB of float32: above the 64 MiB frame
  auto big = co.schedule("count_and_return", {Array::scalar<float>(static_cast<float>(over))});
  ASSERT_TRUE(big.ok());
  Status joined = co.join();
  EXPECT_EQ(joined.code(), StatusCode::kResourceExhausted) << joined.to_string();
  EXPECT_NE(joined.message().find("function 'count_and_return' could not run on worker:"),
            std::string::npos)
      << joined.message();
  EXPECT_FALSE(big->fetch().ok());
  EXPECT_EQ(co.rescheduled(), 0);
  EXPECT_EQ(counter->read()->at(0), 1.0);

  auto huge_arg = Array::zeros(DType::kFloat32, {over});
  ASSERT_TRUE(huge_arg.ok());
  ASSERT_TRUE(co.schedule("count", {*huge_arg}).ok());
  joined = co.join();
  EXPECT_EQ(joined.code(), StatusCode::kInvalidArgument) << joined.to_string();
  EXPECT_NE(joined.message().find("above the limit"), std::string::npos) << joined.message();
  EXPECT_EQ(co.rescheduled(), 0);
  EXPECT_EQ(counter->read()->at(0), 1.0);
  // The workers stay in service.
  auto fine = co.schedule("count_and_return", {Array::scalar<float>(4)});
  ASSERT_TRUE(fine.ok());
  ASSERT_TRUE(co.join().ok());
  EXPECT_EQ(fine->fetch()->at(0).num_elements(), 4);
}

// A function that outlasts 1.5 x the timeout on a worker that still answers is the function's
// error (it would do the same anywhere), not a lost worker to retry elsewhere forever.
TEST(ParameterServer, AFunctionPastItsTimeOnALiveWorkerIsItsError) {
  Cluster cluster(1, 1);
  ParameterServerStrategyOptions o;
  Config chief = cluster.chief_config();
  chief.set("TRIBUTARY_TIMEOUT", "1s");  // the chief's: 1.5 s for a function
  o.config = chief;
  auto strategy = ParameterServerStrategy::create(o);
  ASSERT_TRUE(strategy.ok()) << strategy.status().to_string();
  auto counter = (*strategy)->create_variable("counter", Array::scalar<float>(0));
  ASSERT_TRUE(counter.ok());
  auto coordinator = ClusterCoordinator::create(**strategy);
  ASSERT_TRUE(coordinator.ok());
  ClusterCoordinator& co = **coordinator;
  ASSERT_TRUE(co.schedule("count", {Array::scalar<float>(3000)}).ok());
  Status joined = co.join();
  EXPECT_EQ(joined.code(), StatusCode::kDeadlineExceeded) << joined.to_string();
  EXPECT_NE(joined.message().find("raise TRIBUTARY_TIMEOUT"), std::string::npos)
      << joined.message();
  EXPECT_EQ(co.rescheduled(), 0);
}

// TF's check of what a partitioner returns: a list, its first entry non-zero, the others 1.
TEST(ParameterServer, MalformedPartitionsAreRefused) {
  Cluster cluster(1, 1);
  for (std::vector<int64_t> bad : {std::vector<int64_t>{}, std::vector<int64_t>{0},
                                   std::vector<int64_t>{-1, 1}, std::vector<int64_t>{2, 2}}) {
    auto strategy = make_strategy(cluster, [bad](const Shape&, DType) { return bad; });
    ASSERT_TRUE(strategy);
    auto v = strategy->create_variable("v", *Array::from_vector<float>({1, 2, 3, 4}, {4, 1}));
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << bad.size();
    EXPECT_NE(v.status().message().find("variable_partitioner must return"), std::string::npos)
        << v.status().message();
  }
}

TEST(ParameterServer, KilledParameterServerIsAClearErrorNotAHang) {
  Cluster cluster(1, 2);
  auto strategy = make_strategy(cluster);
  ASSERT_TRUE(strategy);
  ASSERT_TRUE(strategy->create_variable("other", Array::scalar<float>(0)).ok());    // ps 0
  ASSERT_TRUE(strategy->create_variable("counter", Array::scalar<float>(0)).ok());  // ps 1
  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  cluster.kill_task(cluster.pid("ps", 1));
  // Nothing else holds the killed task's port (the socket it was handed was its alone): a
  // connection is refused at once, rather than left in a backlog that nobody reads.
  EXPECT_EQ(connect_errno(cluster.port_of("ps", 1)), ECONNREFUSED);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*coordinator)->schedule("count", {Array::scalar<float>(0)}).ok());
  Status s = (*coordinator)->join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("parameter server ps:1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("is not recovered"), std::string::npos) << s.message();
  // schedule() after the failure was reported works again, and fails the same way.
  ASSERT_TRUE((*coordinator)->schedule("count", {Array::scalar<float>(0)}).ok());
  EXPECT_FALSE((*coordinator)->join().ok());
}

// With every worker gone, a fetch() without join() ends: what is queued fails once no worker has
// answered for the timeout (5 s here), schedule() refuses until join() has reported it, and after
// that a schedule() is taken again.
TEST(ParameterServer, FetchWithoutWorkersFailsInsteadOfWaitingForever) {
  Cluster cluster(1, 1);
  // Declared before the coordinator, so destroyed after it: should fetch() hang, the coordinator's
  // destructor cancels the function and the failed test ends instead of waiting for it.
  std::future<StatusOr<std::vector<Array>>> fetched;
  auto strategy = make_strategy(cluster);
  ASSERT_TRUE(strategy);
  ASSERT_TRUE(strategy->create_variable("counter", Array::scalar<float>(0)).ok());
  auto coordinator = ClusterCoordinator::create(*strategy);
  ASSERT_TRUE(coordinator.ok());
  ClusterCoordinator& co = **coordinator;
  cluster.kill_task(cluster.pid("worker", 0));
  auto value = co.schedule("count", {Array::scalar<float>(0)});
  ASSERT_TRUE(value.ok()) << value.status().to_string();
  fetched = std::async(std::launch::async, [&] { return value->fetch(); });
  // The timeout is 5 s; 10 s more for a loaded machine, and a fetch() still waiting fails here.
  ASSERT_EQ(fetched.wait_for(15s), std::future_status::ready)
      << "fetch() without workers waits far past its 5 s timeout";
  const auto got = fetched.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().to_string();
  EXPECT_NE(got.status().message().find("no worker has answered"), std::string::npos)
      << got.status().message();
  auto refused = co.schedule("count", {Array::scalar<float>(0)});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();
  Status joined = co.join();
  EXPECT_EQ(joined.code(), StatusCode::kUnavailable) << joined.to_string();
  EXPECT_NE(joined.message().find("no worker has answered"), std::string::npos) << joined.message();
  EXPECT_TRUE(co.schedule("count", {Array::scalar<float>(0)}).ok());
}

TEST(ParameterServer, TasksWithoutTheJobsSecretAreRefused) {
  Cluster cluster(1, 1, "right", "wrong");
  ParameterServerStrategyOptions o;
  o.config = cluster.chief_config();
  auto s = ParameterServerStrategy::create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("authentication failed"), std::string::npos)
      << s.status().message();
}

// A checkpoint restores into the same variables, and into another partitioning on another
// cluster (the way back from a ps failure); bad files and mismatches change nothing.
TEST(ParameterServer, CheckpointsRestoreAcrossPartitionings) {
  const std::string path = ::testing::TempDir() + "ps_checkpoint_" + std::to_string(::getpid());
  std::vector<float> init(7 * 2);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i);
  {
    Cluster cluster(1, 2);
    auto strategy = make_strategy(cluster, *fixed_shards_partitioner(3));
    ASSERT_TRUE(strategy);
    auto table = strategy->create_variable("table", *Array::from_vector(init, {7, 2}));
    auto step = strategy->create_variable("step", Array::scalar<int64_t>(41));
    ASSERT_TRUE(table.ok() && step.ok());
    ASSERT_EQ(table->shards().size(), 3u);
    ASSERT_TRUE(step->assign_add(Array::scalar<int64_t>(1)).ok());
    ASSERT_TRUE(save_checkpoint(path, strategy->variables()).ok());
    // Changed, then restored.
    ASSERT_TRUE(table->assign(*Array::zeros(DType::kFloat32, {7, 2})).ok());
    Status restored = restore_checkpoint(path, strategy->variables());
    ASSERT_TRUE(restored.ok()) << restored.to_string();
    EXPECT_EQ(table->read()->to_vector<float>(), init);
    EXPECT_EQ(step->read()->at(0), 42.0);
  }
  // Another cluster: one ps, the table in 2 shards, plus a variable the file does not have.
  Cluster cluster(1, 1);
  auto strategy = make_strategy(cluster, *fixed_shards_partitioner(2));
  ASSERT_TRUE(strategy);
  auto table = strategy->create_variable("table", *Array::zeros(DType::kFloat32, {7, 2}));
  auto step = strategy->create_variable("step", Array::scalar<int64_t>(0));
  auto extra = strategy->create_variable("extra", Array::scalar<float>(5));
  ASSERT_TRUE(table.ok() && step.ok() && extra.ok());
  ASSERT_EQ(table->shards().size(), 2u);
  Status missing = restore_checkpoint(path, strategy->variables());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("has no variable 'extra' (it has: step, table)"),
            std::string::npos)
      << missing.message();
  EXPECT_EQ(step->read()->at(0), 0.0);  // nothing assigned
  const std::vector<PSVariable> both = {*table, *step};
  Status restored = restore_checkpoint(path, both);
  ASSERT_TRUE(restored.ok()) << restored.to_string();
  EXPECT_EQ(table->read()->to_vector<float>(), init);
  EXPECT_EQ(step->read()->at(0), 42.0);
  // A corrupt file and a missing one are refused (the shared file checks, shape mismatches
  // included, are tested with the strategies' variables).
  auto other = strategy->create_variable("other", *Array::zeros(DType::kFloat32, {3}));
  ASSERT_TRUE(other.ok());
  const std::vector<PSVariable> just_other = {*other};
  ASSERT_TRUE(save_checkpoint(path + ".other", just_other).ok());
  {
    std::ofstream f(path + ".other", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(30);
    f.put('\x7f');
  }
  Status corrupt = restore_checkpoint(path + ".other", just_other);
  EXPECT_EQ(corrupt.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(corrupt.message().find("corrupt or truncated"), std::string::npos) << corrupt.message();
  EXPECT_EQ(restore_checkpoint(path + ".absent", both).code(), StatusCode::kNotFound);
  std::remove(path.c_str());
  std::remove((path + ".other").c_str());
}

TEST(ParameterServer, WrongTasksAreToldWhatToRun) {
  Cluster cluster(1, 1);
  ParameterServerStrategyOptions o;
  o.config = cluster.config("worker", 0, "");
  auto s = ParameterServerStrategy::create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("call run_server()"), std::string::npos);
  ServerOptions so;
  so.config = cluster.chief_config();
  auto server = Server::start(so);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("ClusterCoordinator"), std::string::npos);
}

}  // namespace
}  // namespace tributary
