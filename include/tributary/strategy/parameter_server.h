// ParameterServerStrategy and ClusterCoordinator: TF's parameter-server training
// (parameter_server_strategy_v2.py, cluster_coordinator.py) in C++ shape.
//
// The cluster (TF_CONFIG, as TF defines it): one "chief" task, the coordinator, which creates the
// variables and schedules functions; "worker" tasks, which run the functions; "ps" tasks, which
// hold the variables. Every task runs the same binary: workers and ps tasks call run_server() (TF's
// tf.distribute.Server(...).join()), the chief makes a ParameterServerStrategy and a
// ClusterCoordinator.
//
// Where C++ differs from TF (keeping the meaning):
//  - Functions cannot be shipped, so they are registered by name in every process
//    (register_worker_function, register_dataset_function) before the servers start, and
//    schedule() names them. A worker function gets a WorkerContext (its variables, its
//    per-worker iterators) and the scheduled arguments, and returns Arrays.
//  - ParameterServerStrategy is not a Strategy (strategy.h): TF's can only be used through a
//    ClusterCoordinator in a custom loop (its NotImplementedError otherwise), so its surface here
//    is variable creation, and the coordinator's.
//  - Variables are PSVariables: one handle type for a variable on one ps task and for TF's
//    ShardedVariable (several shards along dimension 0, on ps tasks round-robin), which reads and
//    updates as one. Sparse row access (gather, scatter_*) is what embedding lookups and their
//    gradients use (tf.nn.embedding_lookup, IndexedSlices updates).
//
// Semantics, as TF's:
//  - Placement: variable k (in creation order, shards counted one by one) goes to ps task
//    k % num_ps. A variable_partitioner, when set, splits dimension 0 of every variable of rank >=
//    1 into min(partitions[0], shape[0]) shards, the first shape[0] % n shards one row longer (10
//    rows in 4 shards: 3, 3, 2, 2); shards are named "<name>/part_<i>".
//  - Updates (assign, assign_add, assign_sub, scatter_*) are applied atomically on the ps task
//    that holds the shard; different workers' updates interleave (asynchronous training).
//  - schedule() returns at once with a RemoteValue; the function runs on some worker, one function
//    at a time per worker. join() waits for everything scheduled, done() asks without waiting,
//    RemoteValue::fetch() waits for one result. A function's error (one it returns, or one the
//    worker answers, such as a result above the frame limit) is not retried: join() and done()
//    report it (done() returns it instead of false/true, as TF's done() raises it).
//  - Worker failure: a worker that dies, or does not answer within the timeout, has its in-flight
//    function re-scheduled on another worker (so a function may run more than once, and updates it
//    made before the failure stay: at-least-once, as in TF); the coordinator keeps asking the
//    worker and sends it work again when it comes back (its per-worker iterators start afresh).
//    When no worker has answered for the whole timeout, the queued functions fail (a fetch()
//    waiting for one returns the error), and join() and schedule() fail.
//  - Parameter-server failure is not recovered (TF's behaviour): the function that met it fails,
//    and join()/schedule() return an error naming the ps task; restart the job, and
//    restore_checkpoint() what save_checkpoint() saved (below).
//  - A function that fails (its own error, or end of data: OutOfRange) makes join() return the
//    first such error; the functions still queued are cancelled (their RemoteValues fail with
//    kAborted, "cancelled: ...") and schedule() returns the error until join() has reported it, as
//    in TF.
//  - Every remote call has a deadline: the strategy's timeout (TRIBUTARY_TIMEOUT, else 5 minutes).
//  - With a secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE) every connection is authenticated
//    and every frame sealed; a task without the job's secret is refused.
//
// Wire protocol: each server is a TcpStoreServer (store.h) listening on its TF_CONFIG address, and
// every request is a TcpStore::call (tcp_store_protocol.h: length-prefixed frames, bounded to
// kMaxStoreValueBytes, HMAC handshake and sealed frames with a secret). Methods and payloads
// (integers little-endian, strings and arrays length-prefixed; an array is dtype:u8 rank:u32
// dims:i64... bytes:str):
//   ps.create  name dtype shape bytes            creates or replaces a variable
//   ps.read    name                              -> array
//   ps.update  name kind:u8 array                kind: assign, add, sub -> nothing
//   ps.gather  name count:u32 rows:i64...        -> array of those rows
//   ps.scatter name kind:u8 count:u32 rows:i64... array
//   worker.run fn args directory iterators       -> code:u8 message:str count:u32 arrays
//   *.ping                                       -> task type and index
//   *.shutdown                                   run_server() returns
// A variable larger than one frame must be sharded (a partitioner): its reads fail with a message
// that says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "tributary/cluster.h"
#include "tributary/config.h"
#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"
#include "tributary/strategy/dataset.h"
#include "tributary/strategy/distributed_input.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

namespace ps_internal {
class PsClient;
struct CoordinatorState;
struct WorkerCall;
}  // namespace ps_internal

// --- Partitioners (TF's tf.distribute.experimental.partitioners)
// ---------------------------------- A partitioner gets a variable's shape and dtype and returns
// how many parts each dimension is cut into; the list must not be empty, its first entry must be at
// least 1 and every other entry 1 (TF's ValueError otherwise).
using VariablePartitioner = std::function<std::vector<int64_t>(const Shape& shape, DType dtype)>;
// min(num_shards, shape[0]) shards. num_shards must be positive.
StatusOr<VariablePartitioner> fixed_shards_partitioner(int num_shards);
// ceil(total bytes / min_shard_bytes) shards, at most max_shards and shape[0] (TF's
// min_max_variable_partitioner; a shard may come out smaller than min_shard_bytes).
StatusOr<VariablePartitioner> min_size_partitioner(int64_t min_shard_bytes = 256 << 10,
                                                   int max_shards = 1,
                                                   int64_t bytes_per_string = 16);
// As few shards as keep each at most max_shard_bytes, at most max_shards (0 = no limit).
StatusOr<VariablePartitioner> max_size_partitioner(int64_t max_shard_bytes, int max_shards = 0,
                                                   int64_t bytes_per_string = 16);

// --- Variables ------------------------------------------------------------------------------------
struct PSVariableShard {
  int ps_task = 0;       // index in the "ps" job
  std::string name;      // the name on the ps task ("<name>" or "<name>/part_<i>")
  int64_t row_begin = 0;  // rows [row_begin, row_end) of dimension 0 (0, 1 for a scalar)
  int64_t row_end = 0;
};

class PSVariable {
 public:
  PSVariable() = default;
  bool valid() const { return client_ != nullptr; }
  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<PSVariableShard>& shards() const { return shards_; }
  // TF's ShardedVariable: more than one shard.
  bool is_sharded() const { return shards_.size() > 1; }

  StatusOr<Array> read() const;  // the whole value (shards concatenated)
  Status assign(const Array& value);
  Status assign_add(const Array& delta);
  Status assign_sub(const Array& delta);
  // Rows of dimension 0 (an embedding lookup): [rows.size(), shape[1:]...]. Rows out of range are
  // kInvalidArgument.
  StatusOr<Array> gather(std::span<const int64_t> rows) const;
  // Row updates: `updates` is [rows.size(), shape[1:]...]; repeated rows add up for add/sub.
  Status scatter_add(std::span<const int64_t> rows, const Array& updates);
  Status scatter_sub(std::span<const int64_t> rows, const Array& updates);
  Status scatter_update(std::span<const int64_t> rows, const Array& updates);

  // For the library: a handle from its description.
  PSVariable(std::shared_ptr<ps_internal::PsClient> client, std::string name, DType dtype,
             Shape shape, std::vector<PSVariableShard> shards);

 private:
  enum class Kind : uint8_t { kAssign = 0, kAdd = 1, kSub = 2 };
  Status update(Kind kind, const Array& value);
  Status scatter(Kind kind, std::span<const int64_t> rows, const Array& updates);
  std::shared_ptr<ps_internal::PsClient> client_;
  std::string name_;
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::vector<PSVariableShard> shards_;
};

// --- Checkpoints (on the chief) ---------------------------------------------------------------------
// The variables' whole values (a sharded variable concatenated, so a checkpoint restores into any
// partitioning and any number of ps tasks), in the file format of save_checkpoint(Variable)
// (variable.h): self-describing, checksummed, written to a temporary file and renamed.
// For a consistent snapshot save after ClusterCoordinator::join(): each shard is read atomically, but
// updates still running land between shards. restore_checkpoint reads and checks everything (names,
// dtypes, shapes) before assigning anything, so a missing variable, a mismatch or a corrupt file
// changes nothing; a ps task that fails during the assignments leaves the variables partly restored
// and says so. This is how a job recovers from a parameter-server failure (not recovered, as in TF):
// restart every task, recreate the variables, restore.
Status save_checkpoint(const std::string& path, std::span<const PSVariable> variables);
Status restore_checkpoint(const std::string& path, std::span<const PSVariable> variables);

// --- Functions by name ----------------------------------------------------------------------------
// A per-worker iterator (TF's PerWorkerDistributedIterator): pass it to schedule(); on the worker,
// WorkerContext::next() reads from that worker's own iterator of the dataset.
struct PerWorkerIterator {
  int64_t id = -1;
};
using RemoteArg = std::variant<Array, PerWorkerIterator>;

class WorkerContext {
 public:
  int worker_index() const { return worker_index_; }
  int num_workers() const { return num_workers_; }
  // A variable the coordinator created, by name.
  StatusOr<PSVariable> variable(const std::string& name) const;
  // The next element of this worker's iterator; OutOfRange at the end of data (TF's
  // OutOfRangeError, which ends the function and is reported by join()).
  StatusOr<Element> next(const PerWorkerIterator& iterator);

 private:
  friend struct ps_internal::WorkerCall;
  WorkerContext() = default;
  ps_internal::WorkerCall* call_ = nullptr;
  int worker_index_ = 0;
  int num_workers_ = 1;
};

using WorkerFunction =
    std::function<StatusOr<std::vector<Array>>(WorkerContext&, std::span<const RemoteArg> args)>;
// TF's dataset_fn(input_context), called on each worker. As TF's ParameterServerStrategy, with no
// synchronisation beyond a worker: InputContext(num_input_pipelines=1, input_pipeline_id=0,
// num_replicas_in_sync=1), so shard() on it does nothing and every worker reads the whole
// pipeline (shuffle it to give workers different orders).
using DatasetFunction = std::function<Dataset(const InputContext&)>;

// Registers in this process (every task of the job must register the same names). A name
// registered twice is kInvalidArgument.
Status register_worker_function(const std::string& name, WorkerFunction fn);
Status register_dataset_function(const std::string& name, DatasetFunction fn);

// --- Servers (workers and ps tasks) ----------------------------------------------------------------
struct ServerOptions {
  std::optional<Config> config;  // the environment TF_CONFIG is resolved from; unset = process env
  // Deadline of this server's own remote calls (a worker's calls to the ps tasks); 0 =
  // TRIBUTARY_TIMEOUT, else 5 minutes.
  std::chrono::milliseconds timeout{0};
};

class Server {
 public:
  // Starts serving this task's TF_CONFIG address (the port; every interface). The task must be a
  // "worker" or a "ps" task. A launcher may bind the port itself and hand the listening socket down
  // (its descriptor in TRIBUTARY_STORE_FD, inheritable), so that no other process can take the port
  // before the task serves: the server then serves on that socket.
  static StatusOr<std::unique_ptr<Server>> start(ServerOptions options = {});
  ~Server();
  // Blocks until the coordinator's shutdown_servers() or stop().
  void join();
  void stop();
  int port() const;
  const ClusterSpec& cluster() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
// Server::start then join (TF's tf.distribute.Server(...).join()). Like TF's, it returns when the
// chief shuts the servers down, and has no time limit of its own: a chief that dies without doing so
// leaves the task serving until its launcher ends it (tributary-run ends the job when a rank fails).
Status run_server(ServerOptions options = {});

// --- The strategy and its coordinator (the chief) -------------------------------------------------
struct ParameterServerStrategyOptions {
  std::optional<Config> config;  // the environment TF_CONFIG is resolved from; unset = process env
  VariablePartitioner variable_partitioner;  // null: no partitioning
  std::chrono::milliseconds timeout{0};      // remote calls; 0 = TRIBUTARY_TIMEOUT, else 5 min
};

class ParameterServerStrategy {
 public:
  // On the chief of a cluster with "worker" and "ps" jobs. Connects to every ps task (waiting up to
  // the timeout for them to start).
  static StatusOr<std::unique_ptr<ParameterServerStrategy>> create(
      ParameterServerStrategyOptions options = {});
  ~ParameterServerStrategy();

  // Creates `name` (unique) from `initial` on the ps tasks, partitioned by the strategy's
  // partitioner unless `partition` is false.
  StatusOr<PSVariable> create_variable(const std::string& name, const Array& initial,
                                       bool partition = true);
  int num_workers() const;
  int num_ps() const;
  const ClusterSpec& cluster() const;
  std::chrono::milliseconds timeout() const;
  // Every variable created, in creation order.
  const std::vector<PSVariable>& variables() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit ParameterServerStrategy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What schedule() returns. fetch() waits until the function ran, failed or was cancelled (kAborted):
// each try is bounded by the strategy's timeout, and what cannot run because no worker has answered
// for the timeout fails (kUnavailable), whether or not anyone calls join().
class RemoteValue {
 public:
  RemoteValue() = default;
  StatusOr<std::vector<Array>> fetch() const;
  bool ready() const;
  struct State;
  explicit RemoteValue(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

class PerWorkerDataset {
 public:
  // TF's iter(per_worker_dataset): a new iterator on every worker.
  PerWorkerIterator iterator();

 private:
  friend class ClusterCoordinator;
  std::shared_ptr<ps_internal::CoordinatorState> state_;
  std::string function;
};

class ClusterCoordinator {
 public:
  // Starts one dispatcher thread per worker. The strategy must outlive the coordinator.
  static StatusOr<std::unique_ptr<ClusterCoordinator>> create(ParameterServerStrategy& strategy);
  ~ClusterCoordinator();  // cancels what is still queued and waits for the functions in flight

  StatusOr<RemoteValue> schedule(const std::string& function, std::vector<RemoteArg> args = {});
  Status join();
  // TF's done(): whether every scheduled function has finished. When one failed, its error
  // (after what was in flight has ended and the queue was cancelled, as join()); reported once.
  StatusOr<bool> done();
  StatusOr<PerWorkerDataset> create_per_worker_dataset(const std::string& dataset_function);
  // Tells every worker and ps task to stop serving (run_server() returns there).
  Status shutdown_servers();
  // For tests and logs: how many times a function was sent again after a worker failed.
  int64_t rescheduled() const;

 private:
  explicit ClusterCoordinator(std::shared_ptr<ps_internal::CoordinatorState> state);
  std::shared_ptr<ps_internal::CoordinatorState> state_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
