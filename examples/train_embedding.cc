// train_embedding: parameter-server training of a small embedding model, as in TF's
// "Parameter server training with ParameterServerStrategy" tutorial, in C++.
//
// The model: an example is a bag of `--bag` token ids from a vocabulary of `--vocab`; its label is
// the sum of a hidden score per token, plus noise (so the best loss is about 0.01). The model
// averages the tokens' rows of an embedding table [vocab, dim] (sharded across the ps tasks by a
// partitioner) and applies a dense layer (kernel [dim, 1], bias []) to the average: yhat =
// mean_j(E[id_j]) . w + b, with mean squared error. Each worker step reads the dense layer, gathers
// its batch's rows, computes the loss and gradients, and applies them on the parameter servers
// (assign_sub for the dense layer, scatter_sub for the embedding rows): asynchronous SGD, each
// worker on its own data.
//
// The cluster: 1 chief (this process, the coordinator), `--workers` workers and `--ps` parameter
// servers. Without TF_CONFIG, this program is its own launcher: it starts the workers and ps tasks
// as child processes of the same binary with a fresh random secret, each serving on a loopback
// port this launcher bound and handed to it (TRIBUTARY_STORE_FD, so that no other process can take
// the port first), and coordinates them. With TF_CONFIG (a cluster started by hand or by a
// scheduler), a "worker" or "ps" task serves (run_server()) and the "chief" trains.
//
// Failure: `--kill-worker-at-epoch E` kills worker 1 with SIGKILL halfway through scheduling epoch
// E; its in-flight step is re-scheduled on another worker, and `--restart-after-epochs N` starts
// it again N epochs later, when it rejoins. Training still converges.
//
// The run succeeds (exit 0) when the held-out loss falls below `--target-loss`; it prints the loss
// per epoch and the held-out loss before and after.
//
//   train_embedding [--workers 2] [--ps 2] [--epochs 8] [--steps-per-epoch 100]
//                   [--kill-worker-at-epoch 3] [--target-loss 0.05]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tributary/tributary.h"

using namespace tributary;

namespace {

struct Flags {
  int workers = 2;
  int ps = 2;
  int64_t vocab = 200;
  int64_t dim = 8;
  int64_t bag = 4;
  int64_t batch = 32;
  int epochs = 8;
  int steps_per_epoch = 100;
  double lr = 0.2;
  double target_loss = 0.05;
  int kill_worker_at_epoch = 0;  // 0: no failure
  int restart_after_epochs = 1;  // 0: the killed worker stays dead
  double timeout_s = 30;
  std::string checkpoint;  // save the variables here at the end
};

int fail(const Status& s) {
  std::fprintf(stderr, "train_embedding: %s\n", s.to_string().c_str());
  return 1;
}

std::optional<int> parse(int argc, char** argv, Flags& f) {
  CLI::App app("Parameter-server training of a small embedding model (sharded table + dense layer) "
               "with ParameterServerStrategy and ClusterCoordinator.",
               "train_embedding");
  app.add_option("--workers", f.workers, "worker tasks (launcher mode)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--ps", f.ps, "parameter-server tasks (launcher mode)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--vocab", f.vocab, "rows of the embedding table")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--dim", f.dim, "embedding width")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--bag", f.bag, "token ids per example")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", f.batch, "examples per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-e,--epochs", f.epochs, "epochs (a join and a report each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps-per-epoch", f.steps_per_epoch, "steps scheduled per epoch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--target-loss", f.target_loss,
                 "held-out loss the run must reach to succeed")
      ->capture_default_str();
  app.add_option("--kill-worker-at-epoch", f.kill_worker_at_epoch,
                 "kill worker 1 (SIGKILL) halfway through this epoch; 0 = never (launcher mode)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--restart-after-epochs", f.restart_after_epochs,
                 "start the killed worker again this many epochs later; 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--timeout", f.timeout_s, "deadline of every remote call, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--checkpoint", f.checkpoint,
                 "save the variables here at the end (save_checkpoint); restore with "
                 "restore_checkpoint");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

// --- The data: deterministic, so every process agrees on the hidden scores -------------------------

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1): the hidden score of token `id`.
float score(int64_t id) {
  return static_cast<float>(static_cast<double>(mix(static_cast<uint64_t>(id) ^ 0x5eedull) >> 11) /
                                static_cast<double>(1ull << 52) -
                            1.0);
}

// Example `i` of stream `stream`: `bag` token ids and their label.
void make_example(const Flags& f, int64_t stream, int64_t i, int64_t* ids, float* label) {
  float y = 0;
  for (int64_t j = 0; j < f.bag; ++j) {
    const uint64_t h = mix(mix(static_cast<uint64_t>(stream) * 1000003ull + static_cast<uint64_t>(i)) +
                           static_cast<uint64_t>(j));
    ids[j] = static_cast<int64_t>(h % static_cast<uint64_t>(f.vocab));
    y += score(ids[j]);
  }
  // Label noise of standard deviation 0.1 (uniform): no model does better than a loss of 0.01.
  const uint64_t h = mix(static_cast<uint64_t>(stream) * 7919ull + static_cast<uint64_t>(i) + 0xabcull);
  const double u = static_cast<double>(h >> 11) / static_cast<double>(1ull << 52) - 1.0;
  *label = y + static_cast<float>(0.1 * std::sqrt(3.0) * u);
}

// A worker's pipeline (TF's dataset_fn(input_context)): an endless stream of batches of
// (ids int64 [batch, bag], labels float32 [batch]), different on each worker. As in TF, every
// worker of a ParameterServerStrategy gets the same InputContext (one pipeline, id 0), so the
// stream is told apart by the worker's own task index in its TF_CONFIG, where a TF user would
// shuffle without a fixed seed.
Dataset examples_dataset(const Flags& f, const InputContext& /*ic*/) {
  auto task = resolve_cluster_spec(Config::from_environment());
  const int64_t stream = task.ok() ? task->task_index : 0;
  return Dataset::range(INT64_MAX)
      .map(
          [f, stream](Element e) -> StatusOr<Element> {
            const int64_t i = static_cast<int64_t>(e[0].at(0));
            std::vector<int64_t> ids(static_cast<size_t>(f.bag));
            float label = 0;
            make_example(f, stream, i, ids.data(), &label);
            TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::from_vector(ids, {f.bag}));
            return Element{a, Array::scalar(label)};
          },
          ElementSpec{{DType::kInt64, {f.bag}}, {DType::kFloat32, {}}})
      .batch(f.batch, /*drop_remainder=*/true)
      .prefetch(2);
}

// --- The model ------------------------------------------------------------------------------------

struct Forward {
  Array pooled;  // [B, dim]: each example's mean embedding
  Array residual;  // [B]: yhat - y
  Array loss;      // []: mean squared error
};

StatusOr<Forward> forward(const Array& rows, const Array& w, const Array& b, const Array& labels,
                          int64_t batch, int64_t bag, int64_t dim) {
  Forward out;
  TRIBUTARY_ASSIGN_OR_RETURN(Array bagged, rows.reshape({batch, bag, dim}));
  TRIBUTARY_ASSIGN_OR_RETURN(out.pooled, reduce_mean(bagged, 1));
  TRIBUTARY_ASSIGN_OR_RETURN(Array yhat, matmul(out.pooled, w));  // [B, 1]
  TRIBUTARY_ASSIGN_OR_RETURN(yhat, yhat.reshape({batch}));
  TRIBUTARY_ASSIGN_OR_RETURN(yhat, add(yhat, b));
  TRIBUTARY_ASSIGN_OR_RETURN(out.residual, subtract(yhat, labels));
  TRIBUTARY_ASSIGN_OR_RETURN(Array squared, square(out.residual));
  out.loss = reduce_mean_all(squared);
  return out;
}

// One asynchronous SGD step on a worker; returns the batch's loss (before the update) and the
// worker's index.
StatusOr<std::vector<Array>> train_step(const Flags& f, WorkerContext& ctx,
                                        std::span<const RemoteArg> args) {
  TRIBUTARY_ASSIGN_OR_RETURN(Element batch, ctx.next(std::get<PerWorkerIterator>(args[0])));
  const Array& ids = batch[0];
  const Array& labels = batch[1];
  const int64_t n = ids.shape()[0];
  TRIBUTARY_ASSIGN_OR_RETURN(PSVariable table, ctx.variable("embedding"));
  TRIBUTARY_ASSIGN_OR_RETURN(PSVariable kernel, ctx.variable("dense/kernel"));
  TRIBUTARY_ASSIGN_OR_RETURN(PSVariable bias, ctx.variable("dense/bias"));
  const std::vector<int64_t> rows = ids.to_vector<int64_t>();
  TRIBUTARY_ASSIGN_OR_RETURN(Array embedded, table.gather(rows));  // [B * bag, dim]
  TRIBUTARY_ASSIGN_OR_RETURN(Array w, kernel.read());               // [dim, 1]
  TRIBUTARY_ASSIGN_OR_RETURN(Array b, bias.read());                 // []
  TRIBUTARY_ASSIGN_OR_RETURN(Forward fw, forward(embedded, w, b, labels, n, f.bag, f.dim));

  // d loss / d yhat = 2 (yhat - y) / B.
  TRIBUTARY_ASSIGN_OR_RETURN(Array g, scale(fw.residual, 2.0 / static_cast<double>(n)));
  TRIBUTARY_ASSIGN_OR_RETURN(Array g_col, g.reshape({n, 1}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array grad_w, matmul(fw.pooled, g_col, /*transpose_a=*/true));
  const Array grad_b = reduce_sum_all(g);
  // Every token of example i gets g_i * w / bag: [B, 1, 1] * [1, 1, dim] * [1, bag, 1].
  TRIBUTARY_ASSIGN_OR_RETURN(Array g3, g.reshape({n, 1, 1}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array w3, w.reshape({1, 1, f.dim}));
  TRIBUTARY_ASSIGN_OR_RETURN(
      Array spread, Array::from_vector(std::vector<float>(static_cast<size_t>(f.bag),
                                                          static_cast<float>(1.0 / f.bag)),
                                       {1, f.bag, 1}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array gw3, multiply(g3, w3));
  TRIBUTARY_ASSIGN_OR_RETURN(Array grad_rows, multiply(gw3, spread));  // [B, bag, dim]
  TRIBUTARY_ASSIGN_OR_RETURN(grad_rows, grad_rows.reshape({n * f.bag, f.dim}));

  TRIBUTARY_ASSIGN_OR_RETURN(Array step_rows, scale(grad_rows, f.lr));
  TRIBUTARY_ASSIGN_OR_RETURN(Array step_w, scale(grad_w, f.lr));
  TRIBUTARY_ASSIGN_OR_RETURN(Array step_b, scale(grad_b, f.lr));
  TRIBUTARY_RETURN_IF_ERROR(table.scatter_sub(rows, step_rows));  // repeated rows add up
  TRIBUTARY_RETURN_IF_ERROR(kernel.assign_sub(step_w));
  TRIBUTARY_RETURN_IF_ERROR(bias.assign_sub(step_b));
  return std::vector<Array>{fw.loss, Array::scalar<int32_t>(ctx.worker_index())};
}

// The held-out loss of the variables' current values, on the chief (a stream no worker reads).
StatusOr<double> evaluate(const Flags& f, ParameterServerStrategy& strategy) {
  const int64_t n = 2000;
  std::vector<int64_t> ids(static_cast<size_t>(n * f.bag));
  std::vector<float> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) make_example(f, /*stream=*/-1, i, &ids[i * f.bag], &labels[i]);
  const std::vector<PSVariable>& vars = strategy.variables();
  TRIBUTARY_ASSIGN_OR_RETURN(Array rows, vars[0].gather(ids));
  TRIBUTARY_ASSIGN_OR_RETURN(Array w, vars[1].read());
  TRIBUTARY_ASSIGN_OR_RETURN(Array b, vars[2].read());
  TRIBUTARY_ASSIGN_OR_RETURN(Array y, Array::from_vector(labels, {n}));
  TRIBUTARY_ASSIGN_OR_RETURN(Forward fw, forward(rows, w, b, y, n, f.bag, f.dim));
  return fw.loss.at(0);
}

// Registered in every process before it serves or coordinates (the same names everywhere).
Status register_model(const Flags& f) {
  TRIBUTARY_RETURN_IF_ERROR(register_worker_function(
      "train_step",
      [f](WorkerContext& ctx, std::span<const RemoteArg> args) { return train_step(f, ctx, args); }));
  return register_dataset_function(
      "examples", [f](const InputContext& ic) { return examples_dataset(f, ic); });
}

// --- The launcher (no TF_CONFIG): child tasks of this binary on loopback ---------------------------

// A socket listening on `port` of every interface (0: a free port), close-on-exec, as a task's
// server would bind it; -1 and `error` set on failure. The launcher hands it to the task it starts
// (TRIBUTARY_STORE_FD), so that the port is never free for another process between the launcher
// choosing it and the task serving on it.
int listen_on(uint16_t port, std::string* error) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  const int one = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
    *error = "cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

class Launcher {
 public:
  Status start(const Flags& f, char** argv) {
    argv_ = argv;
    // A socket for each task, held until it is handed over (spawn). The chief serves nothing: its
    // port only has to be distinct in TF_CONFIG, so its socket is closed once every port is bound.
    std::vector<std::string> addr;
    int chief = -1;
    for (int i = 0; i < 1 + f.workers + f.ps; ++i) {
      std::string error;
      const int fd = listen_on(0, &error);
      if (fd < 0) {
        if (chief >= 0) ::close(chief);
        return internal_error("train_embedding: " + error);
      }
      const uint16_t port = port_of(fd);
      if (i == 0) {
        chief = fd;
      } else {
        const std::string type = i <= f.workers ? "worker" : "ps";
        sockets_[type].push_back(fd);
        ports_[type].push_back(port);
      }
      addr.push_back("\"127.0.0.1:" + std::to_string(port) + "\"");
    }
    ::close(chief);
    auto list = [&](int from, int n) {
      std::string s = "[";
      for (int i = 0; i < n; ++i) s += (i ? ", " : "") + addr[static_cast<size_t>(from + i)];
      return s + "]";
    };
    cluster_ = "{\"chief\": " + list(0, 1) + ", \"worker\": " + list(1, f.workers) +
               ", \"ps\": " + list(1 + f.workers, f.ps) + "}";
    // The job's secret: every connection authenticated, every frame sealed. Passed to the tasks
    // through the environment (not the command line, which `ps` shows).
    if (std::getenv("TRIBUTARY_SECRET") == nullptr && std::getenv("TRIBUTARY_SECRET_FILE") == nullptr) {
      std::ifstream urandom("/dev/urandom", std::ios::binary);
      unsigned char raw[16];
      if (!urandom.read(reinterpret_cast<char*>(raw), sizeof raw)) {
        return internal_error("could not read /dev/urandom for the job's secret");
      }
      std::string hex;
      for (unsigned char c : raw) {
        static const char* digits = "0123456789abcdef";
        hex += digits[c >> 4];
        hex += digits[c & 15];
      }
      ::setenv("TRIBUTARY_SECRET", hex.c_str(), 1);
    }
    ::setenv("TF_CONFIG", tf_config("chief", 0).c_str(), 1);
    for (int i = 0; i < f.ps; ++i) pids_["ps"].push_back(spawn("ps", i));
    for (int i = 0; i < f.workers; ++i) pids_["worker"].push_back(spawn("worker", i));
    return ok_status();
  }

  void kill_task(const std::string& type, int index) {
    pid_t& pid = pids_[type][static_cast<size_t>(index)];
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  // The task is started again on its TF_CONFIG port, bound again here first.
  void restart(const std::string& type, int index) {
    kill_task(type, index);
    std::string error;
    int& fd = sockets_[type][static_cast<size_t>(index)];
    fd = listen_on(ports_[type][static_cast<size_t>(index)], &error);
    if (fd < 0)
      std::fprintf(stderr, "train_embedding: restarting %s %d: %s\n", type.c_str(), index,
                   error.c_str());
    pids_[type][static_cast<size_t>(index)] = spawn(type, index);
  }

  // After shutdown_servers(): the tasks exit by themselves; what is left after 10 s is killed.
  // Returns false when a task exited with an error.
  bool wait_all() {
    bool clean = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (auto& [type, pids] : pids_) {
      for (pid_t& pid : pids) {
        if (pid <= 0) continue;
        int status = 0;
        while (::waitpid(pid, &status, WNOHANG) == 0) {
          if (std::chrono::steady_clock::now() > deadline) {
            std::fprintf(stderr, "train_embedding: %s task (pid %d) did not exit; killing it\n",
                         type.c_str(), pid);
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) clean = false;
        pid = -1;
      }
    }
    return clean;
  }
  ~Launcher() {
    for (auto& [type, pids] : pids_) {
      for (size_t i = 0; i < pids.size(); ++i) kill_task(type, static_cast<int>(i));
    }
    for (auto& [type, fds] : sockets_) {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
    }
  }

 private:
  std::string tf_config(const std::string& type, int index) const {
    return "{\"cluster\": " + cluster_ + ", \"task\": {\"type\": \"" + type +
           "\", \"index\": " + std::to_string(index) + "}}";
  }
  // Starts the task with its server's socket (TRIBUTARY_STORE_FD: the task serves on it), and
  // closes the launcher's copy: the port is the task's from then on, so that once it is gone a
  // connection to it is refused rather than left waiting in a backlog nobody reads.
  // The environment is built before fork(): the chief has threads by the time it restarts a task,
  // and the child may only make system calls until it execs.
  pid_t spawn(const std::string& type, int index) {
    int& fd = sockets_[type][static_cast<size_t>(index)];
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view kv(*e);
      const std::string_view key = kv.substr(0, kv.find('='));
      if (key != "TF_CONFIG" && key != "TRIBUTARY_STORE_FD") env.emplace_back(kv);
    }
    env.push_back("TF_CONFIG=" + tf_config(type, index));
    if (fd >= 0) env.push_back("TRIBUTARY_STORE_FD=" + std::to_string(fd));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    static constexpr char kExecFailed[] = "train_embedding: cannot exec a task\n";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // A task never outlives its launcher.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(1);
      if (fd >= 0 && ::fcntl(fd, F_SETFD, 0) != 0) _exit(126);  // inherited across exec
      ::execve("/proc/self/exe", argv_, envp.data());
      [[maybe_unused]] const ssize_t n = ::write(2, kExecFailed, sizeof kExecFailed - 1);
      _exit(127);
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    return pid;
  }

  char** argv_ = nullptr;
  std::string cluster_;
  std::map<std::string, std::vector<pid_t>> pids_;
  std::map<std::string, std::vector<int>> sockets_;  // held until spawn hands each over; -1 after
  std::map<std::string, std::vector<uint16_t>> ports_;  // of each task, in TF_CONFIG
};

// --- The chief ------------------------------------------------------------------------------------

int train(const Flags& f, Launcher* launcher) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  auto partitioner = fixed_shards_partitioner(2 * std::max(1, f.ps));
  if (!partitioner.ok()) return fail(partitioner.status());
  ParameterServerStrategyOptions options;
  options.variable_partitioner = *partitioner;
  options.timeout = timeout;
  auto strategy_or = ParameterServerStrategy::create(options);
  if (!strategy_or.ok()) return fail(strategy_or.status());
  ParameterServerStrategy& strategy = **strategy_or;

  // Variables, in this order (evaluate() relies on it): the table is sharded, the dense layer is
  // too small to be (a partitioner leaves a [dim, 1] kernel in min(shards, dim) parts; keep it
  // whole, as a MinSizePartitioner would).
  std::vector<float> init(static_cast<size_t>(f.vocab * f.dim));
  for (size_t i = 0; i < init.size(); ++i) {
    init[i] = 0.1f * score(static_cast<int64_t>(i) + 7777);  // small, fixed
  }
  auto table = strategy.create_variable("embedding", *Array::from_vector(init, {f.vocab, f.dim}));
  if (!table.ok()) return fail(table.status());
  std::vector<float> w0(static_cast<size_t>(f.dim), 0.1f);
  auto kernel = strategy.create_variable("dense/kernel", *Array::from_vector(w0, {f.dim, 1}),
                                         /*partition=*/false);
  if (!kernel.ok()) return fail(kernel.status());
  auto bias = strategy.create_variable("dense/bias", Array::scalar(0.0f));
  if (!bias.ok()) return fail(bias.status());
  std::printf("# %d worker(s), %d ps task(s); embedding [%lld, %lld] in %zu shards on ps",
              strategy.num_workers(), strategy.num_ps(), (long long)f.vocab, (long long)f.dim,
              table->shards().size());
  for (const PSVariableShard& s : table->shards()) std::printf(" %d", s.ps_task);
  std::printf("; dense/kernel on ps %d, dense/bias on ps %d\n", kernel->shards()[0].ps_task,
              bias->shards()[0].ps_task);

  auto initial = evaluate(f, strategy);
  if (!initial.ok()) return fail(initial.status());
  std::printf("held-out loss before training: %.5f\n", *initial);
  std::fflush(stdout);

  auto coordinator_or = ClusterCoordinator::create(strategy);
  if (!coordinator_or.ok()) return fail(coordinator_or.status());
  ClusterCoordinator& coordinator = **coordinator_or;
  auto dataset = coordinator.create_per_worker_dataset("examples");
  if (!dataset.ok()) return fail(dataset.status());
  const PerWorkerIterator iterator = dataset->iterator();

  int restart_at_epoch = 0;
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    if (launcher != nullptr && restart_at_epoch == epoch) {
      launcher->restart("worker", 1);
      std::printf("epoch %d: worker 1 started again\n", epoch);
    }
    std::vector<RemoteValue> losses;
    for (int step = 0; step < f.steps_per_epoch; ++step) {
      if (launcher != nullptr && epoch == f.kill_worker_at_epoch && step == f.steps_per_epoch / 2) {
        launcher->kill_task("worker", 1);
        std::printf("epoch %d: killed worker 1 (SIGKILL) after scheduling %d steps\n", epoch, step);
        if (f.restart_after_epochs > 0) restart_at_epoch = epoch + f.restart_after_epochs;
      }
      auto v = coordinator.schedule("train_step", {iterator});
      if (!v.ok()) return fail(v.status());
      losses.push_back(*v);
    }
    Status joined = coordinator.join();
    if (!joined.ok()) return fail(joined);
    double total = 0;
    std::vector<int> by_worker(static_cast<size_t>(strategy.num_workers()), 0);
    for (const RemoteValue& v : losses) {
      auto got = v.fetch();
      if (!got.ok()) return fail(got.status());
      total += got->at(0).at(0);
      ++by_worker[static_cast<size_t>(got->at(1).at(0))];
    }
    const double mean = total / static_cast<double>(losses.size());
    std::string split;
    for (size_t w = 0; w < by_worker.size(); ++w) {
      split += (w ? " " : "") + std::to_string(w) + ":" + std::to_string(by_worker[w]);
    }
    std::printf("epoch %d: mean training loss %.5f (steps by worker %s; %lld re-scheduled so far)\n",
                epoch, mean, split.c_str(), (long long)coordinator.rescheduled());
    std::fflush(stdout);
    if (!std::isfinite(mean)) {
      return fail(failed_precondition("training diverged (the loss is not finite); lower --lr"));
    }
  }

  auto final_loss = evaluate(f, strategy);
  if (!final_loss.ok()) return fail(final_loss.status());
  std::printf("held-out loss after training: %.5f (target < %g)\n", *final_loss, f.target_loss);
  if (!f.checkpoint.empty()) {
    Status saved = save_checkpoint(f.checkpoint, strategy.variables());
    if (!saved.ok()) return fail(saved);
    std::printf("saved %s\n", f.checkpoint.c_str());
  }
  const int64_t rescheduled = coordinator.rescheduled();
  if (f.kill_worker_at_epoch > 0) {
    std::printf("steps re-scheduled after the worker failure: %lld\n", (long long)rescheduled);
  }
  Status shut = coordinator.shutdown_servers();
  if (!shut.ok()) return fail(shut);
  if (launcher != nullptr && !launcher->wait_all()) {
    std::fprintf(stderr, "train_embedding: a task did not exit cleanly\n");
    return 1;
  }
  if (!(*final_loss < f.target_loss)) {
    std::fprintf(stderr, "train_embedding: the held-out loss %.5f did not fall below %g\n",
                 *final_loss, f.target_loss);
    return 1;
  }
  std::printf("converged\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> code = parse(argc, argv, f)) return *code;
  Status registered = register_model(f);
  if (!registered.ok()) return fail(registered);

  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr || *tf_config == '\0') {
    if (f.kill_worker_at_epoch > 0 && f.workers < 2) {
      return fail(invalid_argument("--kill-worker-at-epoch needs at least 2 workers"));
    }
    Launcher launcher;
    Status started = launcher.start(f, argv);
    if (!started.ok()) return fail(started);
    return train(f, &launcher);
  }
  // A task of a cluster someone else started: serve, or coordinate.
  auto cluster = resolve_cluster_spec(Config::from_environment());
  if (!cluster.ok()) return fail(cluster.status());
  if (cluster->task_type == "worker" || cluster->task_type == "ps") {
    ServerOptions o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
    Status served = run_server(o);
    return served.ok() ? 0 : fail(served);
  }
  if (f.kill_worker_at_epoch > 0) {
    return fail(invalid_argument("--kill-worker-at-epoch needs the built-in launcher (no TF_CONFIG)"));
  }
  return train(f, nullptr);
}
