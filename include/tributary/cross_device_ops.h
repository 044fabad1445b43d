// CrossDeviceOps: the interface every collective backend implements, shaped after
// tf.distribute.CrossDeviceOps and torch.distributed's ProcessGroup.
//
// One instance serves a fixed group: the local replicas of this process (one device each, in
// replica order) times the processes of the cluster (rank / world size). `num_replicas_in_sync()` is
// the product. Every call takes one tensor per *local* replica.
//
// Front door: the public methods are non-virtual. They validate the arguments (replica count,
// dtypes, element counts, devices, null data, overlapping buffers, capabilities), assign a sequence
// number, time, log and record the call (flight recorder, stall report, timeline: see
// core/flight_recorder.h and the README), and only then call the backend's *_impl. A call that fails
// validation returns a completed Work carrying an InvalidArgument/Unimplemented Status and touches
// no buffer. All processes must issue collectives in the same order: in a multi-process group a
// call refused for its arguments (InvalidArgument) on one rank fails the group (its peers are told at once, instead of waiting for
// their timeout), and the instance is then unusable.
//
// Semantics (differences from TF are noted):
//  - reduce: reduce the per-replica values and write the result to every destination tensor
//    (TF's destinations are devices; in C++ the caller passes the output buffers, one per device).
//  - batch_reduce: several reduce's at once; backends may fuse them (packing).
//  - all_reduce: reduce and write replica i's result into outputs[i]; outputs[i] may be inputs[i]
//    (in place) but must not overlap any other buffer.
//  - broadcast: copy `source` (on process `root`) to every destination tensor on every process.
//  - all_gather: outputs[i] = concatenation of every replica's input along axis 0, in global replica
//    order (process-major). In place when inputs[i] is the slice of outputs[i] at its own position.
//  - reduce_scatter: outputs[i] = reduction of the inputs' slice at position i (global replica id);
//    inputs hold num_replicas_in_sync * outputs-count elements.
//  - MEAN divides once, after the sum, by num_replicas_in_sync (for reduce/batch_reduce, by the number
//    of values reduced across all processes, as TF does).
// Threading: calls on one instance must be made from one thread at a time (issue order is the
// collective order). Work handles may be waited on from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tributary/config.h"
#include "tributary/device.h"
#include "tributary/dtype.h"
#include "tributary/export.h"
#include "tributary/options.h"
#include "tributary/status.h"
#include "tributary/tensor.h"
#include "tributary/values.h"
#include "tributary/work.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class Collective : uint8_t {
  kReduce,
  kBatchReduce,
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  // Not a data collective (all_collectives() leaves it out; Capabilities never list it): the
  // collective step of register_buffers, which takes a sequence number like the others.
  kRegisterBuffers
};
std::string_view collective_name(Collective c);
std::span<const Collective> all_collectives();

// What a backend can do. An unsupported call is an Unimplemented error naming the backend.
struct Capabilities {
  std::vector<DeviceType> device_types;
  std::vector<DType> dtypes;
  std::vector<ReduceOp> ops;
  std::vector<Collective> collectives;
  bool multi_process = false;  // spans processes (world size > 1)

  bool supports(DeviceType t) const;
  bool supports(DType t) const;
  bool supports(ReduceOp op) const;
  bool supports(Collective c) const;
  std::string to_string() const;  // one line
};

class Store;
class CrossDeviceOps;
namespace internal {
class FlightRecorder;
// For multi-process backends: the instance's store scope, where its ranks publish their progress
// for the stall report (core/flight_recorder.h).
void attach_progress_store(CrossDeviceOps& ops, std::shared_ptr<Store> scope);
}  // namespace internal

// Where an instance runs and with whom. For one process, the defaults and a device list are all
// there is to it; for several, make_backend_context() (registry.h) fills in the rest from the
// cluster spec (TF_CONFIG, torchrun or Slurm variables, ...).
struct BackendContext {
  std::vector<Device> devices = {Device::cpu(0)};  // local replicas, in order
  int rank = 0;        // this process
  int world_size = 1;  // processes
  Config config;       // environment/config snapshot (options, log level)
  // Rendezvous of multi-process backends (null for one process). Each multi-process backend
  // created takes the next instance number (below), so that every rank, creating its backends in
  // the same order, meets its peers under the same keys.
  // Declared before the store so that the store's client closes (withdrawing its last will) before
  // the server it talks to, when one context holds both.
  std::shared_ptr<void> keep_alive;  // what the store needs alive (the chief's store server)
  std::shared_ptr<Store> store;
  std::string coordinator_host;      // the store's host, to pick the interface that reaches it
  std::string cluster_id;            // differs between jobs; peers of another job are refused
  // The store key that lists the job's lost ranks ("" when the store cannot tell): each process
  // leaves a last will there (Store::set_last_will), so that when one dies every survivor's error
  // names it first. make_backend_context sets it up with its TcpStore.
  std::string lost_key;
  // The numbering of multi-process backends and of their meetings before setup
  // (BackendRegistry::create). With a store it is kept there, one counter per rank, so that every
  // context of the job in this process shares it; these two count only for a context without one.
  std::shared_ptr<uint64_t> instances = std::make_shared<uint64_t>(0);
  std::shared_ptr<uint64_t> setups = std::make_shared<uint64_t>(0);
};

// One value and where its reduction goes, for reduce/batch_reduce.
struct ReducePair {
  PerReplica<Tensor> value;
  Mirrored<Tensor> destinations;
};

// Passed to every *_impl: what the front door established about the call.
struct CallInfo {
  uint64_t sequence = 0;  // 1, 2, ... per instance, in issue order
  Collective collective = Collective::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kFloat32;
  int64_t count = 0;  // elements per local input
  std::chrono::nanoseconds timeout{0};
  std::chrono::steady_clock::time_point start;  // when the front door issued it
  std::string describe() const;  // "all_reduce #17 (4 MiB float32, sum)"
};

namespace internal {
struct Registrations;
}  // namespace internal

// A registration of persistent buffers (CrossDeviceOps::register_buffers). Move-only. It ends on
// this rank when destroyed or released; ending it after its backend is gone does nothing.
class BufferRegistration {
 public:
  BufferRegistration() = default;
  BufferRegistration(BufferRegistration&& other) noexcept;
  BufferRegistration& operator=(BufferRegistration&& other) noexcept;
  BufferRegistration(const BufferRegistration&) = delete;
  BufferRegistration& operator=(const BufferRegistration&) = delete;
  ~BufferRegistration();

  // 1, 2, ... per backend instance, in registration order (0: none).
  uint64_t id() const { return id_; }
  // Registered and not yet released (false as well once the backend is gone).
  bool active() const;
  // Ends the registration on this rank now (see register_buffers for when).
  void release();

 private:
  friend class CrossDeviceOps;
  BufferRegistration(std::weak_ptr<internal::Registrations> owner, uint64_t id)
      : owner_(std::move(owner)), id_(id) {}
  std::weak_ptr<internal::Registrations> owner_;
  uint64_t id_ = 0;
};

class CrossDeviceOps {
 public:
  virtual ~CrossDeviceOps();
  CrossDeviceOps(const CrossDeviceOps&) = delete;
  CrossDeviceOps& operator=(const CrossDeviceOps&) = delete;

  Work reduce(ReduceOp op, const PerReplica<Tensor>& value, const Mirrored<Tensor>& destinations);
  Work batch_reduce(ReduceOp op, std::span<const ReducePair> pairs);
  Work all_reduce(ReduceOp op, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs);
  Work broadcast(const Tensor& source, const Mirrored<Tensor>& destinations, int root = 0);
  Work all_gather(const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs);
  Work reduce_scatter(ReduceOp op, const PerReplica<Tensor>& inputs,
                      const PerReplica<Tensor>& outputs);

  // Persistent buffers, as NCCL's ncclCommRegister and nccl-tests' -R: a trainer whose results go
  // to the same buffers every step (gradient buckets) registers them once, one per local replica
  // (same dtype and count, on the replicas' devices, not overlapping), and a backend may prepare
  // state bound to them. An all_reduce or reduce whose first output (destination) is exactly the
  // first registered tensor then uses it (ring: an all_gather's output, a broadcast's destination
  // and a reduce_scatter's input too). What it changes per backend:
  //   gloo  (several processes) runs its classic algorithm on the first registered buffer itself,
  //         built on first use for each op: no copy in or out (with several local replicas, they
  //         are reduced into it first) and, with verify=false, no exchange among the ranks before
  //         the call (without registration, a buffer is bound to an instance only after the
  //         ranks agree on it, a round trip per call, only with one local replica, and below
  //         1 MiB with verify=false it is copied instead).
  //   ring  (processes of one host, shared memory) where every rank's buffer comes from
  //         Buffer::allocate_shareable: every rank maps every rank's buffer at registration, and
  //         an all-reduce of more than 16 KiB on it then reduces each rank's 1/n share straight
  //         from all the buffers and writes the result into all of them, with no copy through
  //         slots or the kernel (the direct path; NCCL's symmetric registration of ncclMemAlloc
  //         memory). An all_gather whose output, or a broadcast whose destination, is the
  //         registered buffer takes it too (each rank copies its peers' blocks straight from
  //         their buffers into its own, or its 1/n share of the root's buffer into every other
  //         rank's), and so does a reduce_scatter whose input is, with one local replica per
  //         process (each rank reduces its block straight from every rank's input into its
  //         output). Out of place, an all-reduce's
  //         input that is itself registered (a second registration, as nccl-tests registers send
  //         and receive buffers) is read where it is; any other input is first copied into the
  //         registered output. Where some rank's buffer is ordinary memory or cannot be mapped, no
  //         rank takes it (the info log says why), and the usual path runs. Registering and then
  //         using another buffer (or another registration's) as the output on one rank fails
  //         every rank with a mismatch naming the rule; a buffer freed while registered is
  //         FailedPrecondition at its next collective on it.
  //   every other backend: nothing; the call is checked and counted, and the buffers work as any.
  // Registration is collective, as TF's and NCCL's setup calls are: every rank registers at the
  // same point of its call sequence (it takes a sequence number; a backend that prepares state
  // checks that every rank registered the same count and dtype, else every rank fails, naming
  // both). Collectives on registered buffers must be issued on registered buffers on every rank,
  // and a registration must end (release() or destruction) at the same point on every rank: with
  // gloo's verify=true (the default) a rank that differs fails every rank, naming the call; with
  // verify=false it is the caller's promise, and a rank that breaks it fails at the timeout.
  // The buffers must stay valid while registered. Errors: as a collective's (InvalidArgument for
  // bad buffers, FailedPrecondition on a broken instance, the backend's failure otherwise).
  StatusOr<BufferRegistration> register_buffers(const PerReplica<Tensor>& buffers);

  const std::string& name() const { return name_; }
  // The full spec this instance was made from, every option resolved: "name:key=value,...".
  std::string spec() const;
  const Options& options() const { return options_; }
  const Capabilities& capabilities() const { return capabilities_; }
  const std::vector<Device>& devices() const { return context_.devices; }
  int num_local_replicas() const { return static_cast<int>(context_.devices.size()); }
  int rank() const { return context_.rank; }
  int world_size() const { return context_.world_size; }
  int num_replicas_in_sync() const { return num_local_replicas() * context_.world_size; }
  uint64_t last_sequence() const { return sequence_; }
  // The timeout every collective of this instance runs under (option "timeout").
  std::chrono::nanoseconds timeout() const { return timeout_; }
  // OK, or the first failure of a collective (a dead or silent peer, a mismatch): after one, this
  // instance refuses every further collective with FailedPrecondition quoting it.
  Status broken() const;
  // Gives up on the group: this process will not issue the collective its peers may be waiting in
  // (e.g. the caller found bad input on this rank only). In a multi-process group the peers are
  // told at once, so that they fail now rather than at their timeout; this instance is broken from
  // here on (broken() returns `why`). In one process it only marks the instance broken.
  // Thread-safe, as ncclCommAbort is: a watchdog, a signal's handler thread or a job controller may
  // call it while another thread is inside a collective of this instance. That collective then
  // fails with `why` (ring, ucx, gloo: "rank R refused its part: why") within milliseconds instead
  // of waiting for its peers until the timeout, and tells the peers before it returns; a
  // collective whose waits were all done may still complete, and one that had not passed the
  // front door fails with FailedPrecondition. ring (TCP, shared memory), ucx, nccl and the tuned
  // and host-staged composites wake every wait so. Exceptions: gloo wakes only the exchange before
  // each collective (verify=true, the default), where a rank waits for a peer that has not issued
  // it; one inside Gloo's own algorithm ends when that does, or at the timeout. A shared-memory
  // rank that fails in the middle of a direct or single-copy all-reduce still waits, at most until
  // the timeout, for a peer that is writing into its buffers (never a buffer changed after its
  // return). abort() does not wait for the collective to return, but the instance must outlive
  // the abort() call. A second abort does nothing.
  void abort(const Status& why);

 protected:
  CrossDeviceOps(std::string name, BackendContext context, Options options,
                 Capabilities capabilities);

  virtual Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                           const Mirrored<Tensor>& destinations) = 0;
  // Default: one reduce_impl per pair, in order (TF's ReductionToOneDevice behaviour).
  virtual Work batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                 std::span<const ReducePair> pairs);
  virtual Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                               const PerReplica<Tensor>& outputs) = 0;
  virtual Work broadcast_impl(const CallInfo& call, const Tensor& source,
                              const Mirrored<Tensor>& destinations, int root) = 0;
  virtual Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                               const PerReplica<Tensor>& outputs) = 0;
  virtual Work reduce_scatter_impl(const CallInfo& call, ReduceOp op,
                                   const PerReplica<Tensor>& inputs,
                                   const PerReplica<Tensor>& outputs) = 0;

  // register_buffers' backend step: prepare for collectives whose outputs are exactly `buffers`
  // (registration `id`), checking with the other ranks where that matters. Default: nothing.
  virtual Status register_buffers_impl(const CallInfo& call, uint64_t id,
                                       const PerReplica<Tensor>& buffers);
  // Registration `id` ended on this rank: drop what was prepared for it. Default: nothing.
  virtual void release_buffers_impl(uint64_t id) { (void)id; }

  const BackendContext& context() const { return context_; }
  // The instance's scope of the job's store (internal::attach_progress_store), null when none.
  const std::shared_ptr<Store>& instance_store() const { return scope_; }
  // Publishes why this rank refuses its part (under the instance's store scope), before the
  // backend's abandon() breaks the connections, so that the peers' errors can say why. Backends
  // call it too for failures they detect alike on every rank (a mismatch).
  void publish_refusal(const Status& why) const;
  // Called when this rank refuses a call that its peers will issue (a multi-process backend should
  // tell them, e.g. by aborting its transport with `why`), never while a public collective call of
  // this instance is in flight (a registration's release, and the completion of asynchronous
  // Works, are not such calls). Default: nothing.
  virtual void abandon(const Status& why) { (void)why; }
  // Called by abort() on another thread while a call of this instance is in flight (concurrently
  // with it): make that call's waits end soon with `why`, e.g. by waking its transport; the call's
  // thread then fails and breaks the group as for any failure (abandon() follows when it returns).
  // Must be safe from any thread and must not block for long. Default: nothing (the call ends at
  // its timeout, and its peers are told then).
  virtual void interrupt(const Status& why) { (void)why; }
  // For composites whose every call is calls on member backends (the tuned backend, host staging):
  // the members record their collectives, report stalls and dump their flight recorders, and this
  // instance does not, so that each collective shows once.
  void leave_recording_to_members();
  // Logs at debug level with the "[rank r/name]" prefix; cheap when the level is off.
  void log_debug(const std::string& message) const;
  void log_info(const std::string& message) const;
  void log_warning(const std::string& message) const;

 private:
  Work all_reduce_front(ReduceOp op, const PerReplica<Tensor>& inputs,
                        const PerReplica<Tensor>& outputs);
  Work reduce_front(ReduceOp op, const PerReplica<Tensor>& value,
                    const Mirrored<Tensor>& destinations);
  Work batch_reduce_front(ReduceOp op, std::span<const ReducePair> pairs);
  Work broadcast_front(const Tensor& source, const Mirrored<Tensor>& destinations, int root);
  Work all_gather_front(const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs);
  Work reduce_scatter_front(ReduceOp op, const PerReplica<Tensor>& inputs,
                            const PerReplica<Tensor>& outputs);
  Work register_front(const PerReplica<Tensor>& buffers, uint64_t* id);
  Work screened(Work work);
  class CallScope;  // marks every public call in flight, for abort() from another thread
  CallInfo begin(Collective c, ReduceOp op, DType dtype, int64_t count);
  Work finish(const CallInfo& call, Work work);
  // Root cause for failed collective `sequence` of a multi-process job: a reason a peer published
  // when it refused its part, else a rank the store saw lost (internal::name_lost_ranks), else the
  // ranks that stayed silent (name_silent_ranks); else `failure`. First of all it reports this
  // rank's failure under "failed/<rank>" in the instance's store scope (the roll call).
  Status explain_failure(Status failure, uint64_t sequence) const;
  Status find_root_cause(Status failure, uint64_t sequence) const;  // explain_failure's search
  // The roll call's verdict: the peers that have reported no failure by `until` are alive (no will
  // fired for them) yet silent: stopped, hung or starved. Named first, as lost ranks are. A peer
  // that `failure` already reports as exited or closed is not silent: its message stands.
  Status name_silent_ranks(Status failure, uint64_t sequence,
                           std::chrono::steady_clock::time_point until) const;
  Status check_supported(Collective c, ReduceOp op, DType dtype) const;
  Status check_device(const Tensor& t, std::string_view name, int index = -1, int pair = -1) const;

  std::string name_;
  BackendContext context_;
  Options options_;
  Capabilities capabilities_;
  std::chrono::nanoseconds timeout_{0};
  uint64_t sequence_ = 0;
  int log_level_ = 0;
  std::string log_prefix_;
  struct Health;
  std::shared_ptr<Health> health_;
  bool validating_ = false;  // between a public call's start and its begin()
  // The last collectives, the stall report and the timeline (null when
  // TRIBUTARY_FLIGHT_RECORDER_SIZE=0).
  std::shared_ptr<internal::FlightRecorder> recorder_;
  // The instance's store scope (attach_progress_store; null for in-process backends).
  std::shared_ptr<Store> scope_;
  // Live registrations, shared with their handles (which may outlive the instance).
  std::shared_ptr<internal::Registrations> registrations_;
  friend class BufferRegistration;
  friend void internal::attach_progress_store(CrossDeviceOps& ops, std::shared_ptr<Store> scope);
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
