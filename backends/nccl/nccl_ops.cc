#include "backends/nccl/nccl_ops.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/device_reduce.h"
#include "algorithms/packing.h"
#include "core/fifo_ring.h"
#include "core/gpu.h"
#include "core/launch_gate.h"
#include "core/rendezvous.h"
#include "fmt/format.h"

namespace tributary::backends {
namespace {

using Clock = std::chrono::steady_clock;

// NCCL's result codes become Status here, once, keeping NCCL's text and its last error message.
Status nccl_status(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status();
  std::string text = fmt::format("{} failed: {}", what, ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  if (last != nullptr && std::strstr(last, "Duplicate GPU") != nullptr) {
    text +=
        "; NCCL needs a GPU of its own for each rank: give each process its own device "
        "(CUDA_VISIBLE_DEVICES, or GPU:<local rank>), or use ring, gloo or ucx, which stage GPU "
        "tensors through host memory and let processes share a GPU";
  }
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return invalid_argument(text);
    case ncclRemoteError:
      return unavailable(text + "; a peer process failed or disconnected");
    case ncclSystemError:
      return unavailable(text + "; a system call or the network failed (NCCL_DEBUG=INFO says more)");
    case ncclUnhandledCudaError:
      return internal_error(text + "; a CUDA call inside NCCL failed");
    default:
      return internal_error(text);
  }
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

// The NCCL op for `op`, and whether a division by the replica count follows on the device.
std::pair<ncclRedOp_t, bool> nccl_op(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::kSum: return {ncclSum, false};
    case ReduceOp::kProd: return {ncclProd, false};
    case ReduceOp::kMin: return {ncclMin, false};
    case ReduceOp::kMax: return {ncclMax, false};
    case ReduceOp::kMean:
      if (dtype_is_floating(t)) return {ncclSum, true};
      return {ncclAvg, false};
  }
  return {ncclSum, false};
}

cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

std::string nanos_text(std::chrono::nanoseconds d) {
  return fmt::format("{:.3g} s", std::chrono::duration<double>(d).count());
}

// One local GPU: its communicators and stream.
struct Local {
  Device device;
  gpu::Stream stream;
  ncclComm_t comm = nullptr;  // set up non-blocking, against a deadline
  // What collectives are issued on: `comm` itself (launch=nonblocking), or a blocking communicator
  // split from it (launch=blocking).
  ncclComm_t data = nullptr;
  // Orders `stream` against another GPU's stream around a copy between the two (copy_between()).
  gpu::Event order;
};

// NCCL forbids concurrent calls on one communicator, and ncclCommGetAsyncError is not read-only
// (it completes and clears the communicator's pending group job). So the thread handing a call to
// NCCL holds the turn (kWait) for as long as it may call NCCL, and the watchdog polls
// ncclCommGetAsyncError only when it can take the turn at once (kTry): it never makes a launch wait
// for its cadence, only, at most, for the few atomic loads of one poll.
class NcclTurn {
 public:
  enum Mode { kWait, kTry };
  NcclTurn(std::atomic<bool>& busy, Mode mode) : busy_(busy) {
    held_ = !busy_.exchange(true, std::memory_order_acquire);
    for (int spins = 0; !held_ && mode == kWait; ++spins) {
      if (spins > 64) std::this_thread::yield();
      held_ = !busy_.load(std::memory_order_relaxed) &&
              !busy_.exchange(true, std::memory_order_acquire);
    }
  }
  ~NcclTurn() {
    if (held_) busy_.store(false, std::memory_order_release);
  }
  NcclTurn(const NcclTurn&) = delete;
  NcclTurn& operator=(const NcclTurn&) = delete;
  bool held() const { return held_; }

 private:
  std::atomic<bool>& busy_;
  bool held_ = false;
};

Status failed_before_the_stream_waited() {
  return aborted(
      "nccl: the backend failed before the stream could be made to wait for this collective, "
      "whose results may not have been written; Work::wait() or error() gives the first error");
}

// The events of one collective, one per local GPU: its Work's device completion. A failure
// raises the gate's flag before the communicators are aborted, so events that an abort completed
// never read as success.
class EventSet final : public Work::DeviceCompletion {
 public:
  EventSet(std::vector<gpu::Event> events, std::shared_ptr<const std::atomic<bool>> failed)
      : events_(std::move(events)), failed_(std::move(failed)) {}
  const std::vector<gpu::Event>& events() const { return events_; }
  // True once every event has fired; an error the device reported, as such.
  StatusOr<bool> query() const {
    for (const gpu::Event& e : events_) {
      TRIBUTARY_ASSIGN_OR_RETURN(const bool fired, e.query());
      if (!fired) return false;
    }
    return true;
  }
  bool done() const override {
    if (failed_->load(std::memory_order_acquire)) return false;
    const StatusOr<bool> fired = query();
    return fired.ok() && *fired && !failed_->load(std::memory_order_acquire);
  }
  // Refuses once the backend has failed: an event that an abort ended would let the stream run on
  // with results that were never written.
  Status block_stream(void* stream) const override {
    if (failed_->load(std::memory_order_acquire)) return failed_before_the_stream_waited();
    for (const gpu::Event& e : events_) TRIBUTARY_RETURN_IF_ERROR(e.block_stream(stream));
    if (failed_->load(std::memory_order_acquire)) return failed_before_the_stream_waited();
    return Status();
  }

 private:
  std::vector<gpu::Event> events_;
  std::shared_ptr<const std::atomic<bool>> failed_;
};

// A collective in flight: the events that say it is done on each local GPU.
struct Pending {
  CallInfo call;  // described only when it fails
  Work work;
  std::shared_ptr<const EventSet> events;
  Clock::time_point deadline;
};

// Recycled event sets, one per collective in flight: creating events costs microseconds per call,
// and so would a fresh allocation. A set is free again when the pool holds its only reference (the
// Work and the watchdog have let go), so taking one allocates nothing once the pool has grown to
// the number of collectives in flight.
class EventPool {
 public:
  EventPool(std::vector<int> devices, std::shared_ptr<const std::atomic<bool>> failed)
      : devices_(std::move(devices)), failed_(std::move(failed)) {}
  StatusOr<std::shared_ptr<const EventSet>> take() {
    std::lock_guard lock(mu_);
    // Round robin from where the last search stopped: collectives complete in order, so the
    // next set is usually free.
    for (size_t tried = 0; tried < sets_.size(); ++tried) {
      next_ = next_ + 1 < sets_.size() ? next_ + 1 : 0;
      if (sets_[next_].use_count() == 1) {
        std::atomic_thread_fence(std::memory_order_acquire);  // after the last holder's release
        return sets_[next_];
      }
    }
    std::vector<gpu::Event> events;
    for (int d : devices_) {
      TRIBUTARY_ASSIGN_OR_RETURN(gpu::Event e, gpu::Event::create(d));
      events.push_back(std::move(e));
    }
    sets_.push_back(std::make_shared<const EventSet>(std::move(events), failed_));
    next_ = sets_.size() - 1;
    return sets_.back();
  }

 private:
  const std::vector<int> devices_;
  const std::shared_ptr<const std::atomic<bool>> failed_;
  std::mutex mu_;
  std::vector<std::shared_ptr<const EventSet>> sets_;
  size_t next_ = 0;
};

// Device scratch on one GPU, freed (stream-ordered) when the call's enqueueing is over.
class Scratch {
 public:
  ~Scratch() {
    for (auto& [ptr, device, stream] : blocks_) (void)gpu::free_async(ptr, device, stream);
  }
  StatusOr<void*> get(size_t bytes, int device, void* stream) {
    TRIBUTARY_ASSIGN_OR_RETURN(void* p, gpu::allocate_async(bytes, device, stream));
    blocks_.push_back({p, device, stream});
    return p;
  }

 private:
  struct Block {
    void* ptr;
    int device;
    void* stream;
  };
  std::vector<Block> blocks_;
};

class NcclOps final : public CrossDeviceOps {
 public:
  NcclOps(BackendContext context, Options options, Capabilities caps)
      : CrossDeviceOps("nccl", std::move(context), std::move(options), std::move(caps)),
        blocking_launch_(this->options().get_string("launch") == "blocking"),
        gate_([this] { abort_communicators(); }) {}

  ~NcclOps() override {
    gpu::CurrentDeviceGuard keep_callers_device;
    // Let what is in flight finish (bounded), then stop the watchdog and free the communicators:
    // healthy and idle, finalized (NCCL flushes what it still sends to peers) and destroyed;
    // otherwise aborted (never waits for peers), so that no kernel runs on past the backend.
    const auto until =
        Clock::now() + std::min<std::chrono::nanoseconds>(timeout(), std::chrono::seconds(10));
    bool drained = false;
    for (;;) {
      std::unique_lock lock(mu_);
      drained = pending_.empty();
      if (drained || Clock::now() > until) break;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (failure().ok() && drained) destroy_communicators();
    (void)gate_.fail();  // raises the flag the Works' probes read, and aborts what is left
    gate_.tear_down();   // also after an earlier failure
    fail_pending(aborted("nccl: the backend was destroyed while this collective was in flight"));
  }

  Status init(const std::shared_ptr<Store>& scope) {
    gpu::CurrentDeviceGuard keep_callers_device;
    if (blocking_launch_) TRIBUTARY_RETURN_IF_ERROR(blocking_launch_supported());
    const int G = num_local_replicas();
    const int nranks = num_replicas_in_sync();
    locals_.resize(static_cast<size_t>(G));
    for (int i = 0; i < G; ++i) {
      Local& l = locals_[static_cast<size_t>(i)];
      l.device = devices()[static_cast<size_t>(i)];
      TRIBUTARY_ASSIGN_OR_RETURN(l.stream, gpu::Stream::create(l.device.index()));
      TRIBUTARY_ASSIGN_OR_RETURN(l.order, gpu::Event::create(l.device.index()));
    }
    const auto deadline = Clock::now() + timeout();
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (world_size() == 1) {
      TRIBUTARY_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    } else {
      TRIBUTARY_RETURN_IF_ERROR(exchange_id(*scope, id, deadline));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // initialisation and collectives return at once; we poll with a deadline
    Status s = nccl_status(ncclGroupStart(), nullptr, "ncclGroupStart");
    for (int i = 0; i < G && s.ok(); ++i) {
      Local& l = locals_[static_cast<size_t>(i)];
      s = gpu::set_device(l.device.index());
      if (s.ok()) {
        s = nccl_status(ncclCommInitRankConfig(&l.comm, nranks, id, rank() * G + i, &config),
                        l.comm, fmt::format("ncclCommInitRankConfig (rank {} of {}, {})",
                                            rank() * G + i, nranks, l.device.to_string()));
      }
    }
    Status end = nccl_status(ncclGroupEnd(), nullptr, "ncclGroupEnd (communicator setup)");
    if (s.ok()) s = end;
    if (s.ok()) s = settle(&Local::comm, deadline, "the NCCL communicator setup");
    if (s.ok() && blocking_launch_) s = split_blocking(deadline);
    for (Local& l : locals_) {
      if (!blocking_launch_) l.data = l.comm;
    }
    if (!s.ok()) {
      abort_communicators();
      return s.with_context(fmt::format(
          "backend 'nccl' (rank {} of {} processes, {} GPU(s) each)", rank(), world_size(), G));
    }
    std::vector<int> event_devices;
    for (const Local& l : locals_) event_devices.push_back(l.device.index());
    events_ = std::make_unique<EventPool>(std::move(event_devices), gate_.flag());
    watchdog_ = std::thread([this] { watch(); });
    return Status();
  }

 protected:
  Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    const auto [nop, divide] = nccl_op(op, call.dtype);
    return launch(call, [&](Scratch&) -> Status {
      Status s = group([&](size_t i, Local& l) {
        return nccl_status(ncclAllReduce(inputs[i].data(), outputs[i].data(),
                                         static_cast<size_t>(call.count), nccl_type(call.dtype),
                                         nop, l.data, cuda(l.stream.get())),
                           l.data, "ncclAllReduce");
      });
      if (s.ok() && divide) {
        for (size_t i = 0; i < locals_.size() && s.ok(); ++i) s = divide_on(i, outputs[i], call.count);
      }
      return s;
    });
  }

  Work reduce_scatter_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override {
    const auto [nop, divide] = nccl_op(op, call.dtype);
    const int64_t recv = outputs[0].num_elements();
    return launch(call, [&](Scratch&) -> Status {
      Status s = group([&](size_t i, Local& l) {
        return nccl_status(ncclReduceScatter(inputs[i].data(), outputs[i].data(),
                                             static_cast<size_t>(recv), nccl_type(call.dtype), nop,
                                             l.data, cuda(l.stream.get())),
                           l.data, "ncclReduceScatter");
      });
      if (s.ok() && divide) {
        for (size_t i = 0; i < locals_.size() && s.ok(); ++i) s = divide_on(i, outputs[i], recv);
      }
      return s;
    });
  }

  Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    return launch(call, [&](Scratch&) -> Status {
      return group([&](size_t i, Local& l) {
        return nccl_status(ncclAllGather(inputs[i].data(), outputs[i].data(),
                                         static_cast<size_t>(call.count), nccl_type(call.dtype),
                                         l.data, cuda(l.stream.get())),
                           l.data, "ncclAllGather");
      });
    });
  }

  Work broadcast_impl(const CallInfo& call, const Tensor& source,
                      const Mirrored<Tensor>& destinations, int root) override {
    const size_t bytes = source.nbytes();
    return launch(call, [&](Scratch& scratch) -> Status {
      // Each local GPU receives into its first destination, else into scratch.
      std::vector<void*> recv(locals_.size(), nullptr);
      for (size_t i = 0; i < locals_.size(); ++i) {
        recv[i] = on_device(destinations.values(), locals_[i].device);
        if (recv[i] == nullptr) {
          TRIBUTARY_ASSIGN_OR_RETURN(recv[i], scratch.get(bytes, locals_[i].device.index(),
                                                          locals_[i].stream.get()));
        }
      }
      // NCCL's root: the root process's first GPU, which sends from the source (copied there when
      // the source lives on another local GPU).
      const void* send = nullptr;
      if (rank() == root) {
        send = source.data();
        if (source.device() != locals_[0].device) {
          TRIBUTARY_RETURN_IF_ERROR(
              copy_between(recv[0], locals_[0].device, source.data(), source.device(), bytes, 0));
          send = recv[0];
        }
      }
      const int nccl_root = root * num_local_replicas();
      TRIBUTARY_RETURN_IF_ERROR(group([&](size_t i, Local& l) {
        const bool is_root = rank() == root && i == 0;
        return nccl_status(ncclBroadcast(is_root ? send : recv[i], recv[i],
                                         static_cast<size_t>(call.count), nccl_type(call.dtype),
                                         nccl_root, l.data, cuda(l.stream.get())),
                           l.data, "ncclBroadcast");
      }));
      return copy_out(destinations.values(), recv, bytes);
    });
  }

  Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override {
    return launch(call, [&](Scratch& scratch) { return enqueue_reduce(call, op, value, destinations, scratch); });
  }

  Work batch_reduce_impl(const CallInfo& call, ReduceOp op,
                         std::span<const ReducePair> pairs) override {
    const int64_t num_packs = options().get_int("num_packs");
    bool own_devices = true;  // every destination set is exactly the local devices, in order
    bool one_dtype = true;
    for (const ReducePair& p : pairs) {
      own_devices = own_devices && p.destinations.size() == locals_.size();
      for (size_t i = 0; own_devices && i < p.destinations.size(); ++i) {
        own_devices = p.destinations[i].device() == locals_[i].device;
      }
      one_dtype = one_dtype && p.value[0].dtype() == pairs[0].value[0].dtype();
    }
    return launch(call, [&](Scratch& scratch) -> Status {
      if (!own_devices || num_packs == 0 || !one_dtype) {
        // One reduce per pair, all enqueued before the Work is returned.
        for (const ReducePair& p : pairs) {
          CallInfo one = call;
          one.collective = Collective::kReduce;
          one.dtype = p.value[0].dtype();
          one.count = p.value[0].num_elements();
          TRIBUTARY_RETURN_IF_ERROR(enqueue_reduce(one, op, p.value, p.destinations, scratch));
        }
        return Status();
      }
      return enqueue_packed(op, pairs, num_packs, scratch);
    });
  }

  void abandon(const Status& why) override {
    // This rank will not issue the collective its peers wait in: abort the communicators so that
    // NCCL's peers fail now (their proxies see the connections close).
    fail_all(why);
  }
  // abort() from another thread while a call is being handed to NCCL or is in flight on the GPUs:
  // fail_all() is made for that (the watchdog calls it so): a thread inside a launch aborts the
  // communicators as it leaves NCCL (a blocking launch is revoked), and pending Works fail now.
  void interrupt(const Status& why) override { fail_all(why); }

 private:
  // --- enqueueing -----------------------------------------------------------------------------

  // Runs `one` for every local GPU inside one NCCL group. On non-blocking communicators, when
  // ncclGroupEnd says ncclInProgress (across ranks NCCL enqueues on a helper thread it starts for
  // the group), then waits for it (bounded); ncclSuccess means that everything is enqueued, as
  // after a blocking group (a communicator of one rank enqueues at once).
  template <typename Fn>
  Status group(Fn one) {
    Status s = nccl_status(ncclGroupStart(), nullptr, "ncclGroupStart");
    for (size_t i = 0; i < locals_.size() && s.ok(); ++i) {
      s = gpu::set_device(locals_[i].device.index());
      if (s.ok()) s = one(i, locals_[i]);
    }
    const ncclResult_t ended = ncclGroupEnd();
    Status end = nccl_status(ended, nullptr, "ncclGroupEnd");
    if (s.ok()) s = end;
    if (s.ok() && !blocking_launch_ && ended == ncclInProgress) {
      s = settle(&Local::data, Clock::now() + timeout(), "enqueueing the collective");
    }
    return s;
  }

  // launch=blocking relies on ncclCommRevoke to end a call that waits inside NCCL.
  static Status blocking_launch_supported() {
#ifdef NCCL_REVOKE_DEFAULT
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess && v >= 22800) return Status();
    return failed_precondition(fmt::format(
        "nccl: launch=blocking needs NCCL 2.28 or later at run time (ncclCommRevoke ends a call "
        "that waits inside NCCL); the NCCL loaded is {}. Use launch=nonblocking",
        nccl_runtime_version()));
#else
    return failed_precondition(
        "nccl: launch=blocking needs NCCL 2.28 or later (ncclCommRevoke ends a call that waits "
        "inside NCCL), and tributary was built against an older nccl.h. Use launch=nonblocking");
#endif
  }

  // launch=blocking: one blocking communicator per local GPU, split from the setup one. The split
  // runs as its parent is configured, non-blocking, so it is polled against the setup deadline (an
  // abort of the parent also ends a split in progress); only the child is blocking. splitShare=0:
  // the parent runs no collective, so it never connects to its peers (NCCL connects at first use).
  Status split_blocking(Clock::time_point deadline) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    config.splitShare = 0;
    const int G = num_local_replicas();
    Status s = nccl_status(ncclGroupStart(), nullptr, "ncclGroupStart");
    for (int i = 0; i < G && s.ok(); ++i) {
      Local& l = locals_[static_cast<size_t>(i)];
      s = gpu::set_device(l.device.index());
      if (s.ok()) {
        s = nccl_status(ncclCommSplit(l.comm, 0, rank() * G + i, &l.data, &config), l.comm,
                        fmt::format("ncclCommSplit (the blocking communicator of {})",
                                    l.device.to_string()));
      }
    }
    Status end = nccl_status(ncclGroupEnd(), nullptr, "ncclGroupEnd (communicator split)");
    if (s.ok()) s = end;
    if (s.ok()) s = settle(&Local::comm, deadline, "splitting the blocking NCCL communicators");
    for (size_t i = 0; i < locals_.size() && s.ok(); ++i) {
      if (locals_[i].data == nullptr) {
        s = internal_error(fmt::format("ncclCommSplit gave no communicator for {}",
                                       locals_[i].device.to_string()));
      }
    }
    return s;
  }

  // Polls every communicator (`which` of each Local) until non-blocking work is no longer in
  // progress. Gives up at once when another thread has failed the backend.
  Status settle(ncclComm_t Local::*which, Clock::time_point deadline, const std::string& what) {
    for (Local& l : locals_) {
      ncclComm_t comm = l.*which;
      for (int spins = 0;; ++spins) {
        ncclResult_t state = ncclSuccess;
        Status s = nccl_status(ncclCommGetAsyncError(comm, &state), comm, "ncclCommGetAsyncError");
        if (!s.ok()) return s;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress) {
          return nccl_status(state, comm, what + " on " + l.device.to_string());
        }
        if (gate_.failed()) return failure();
        if (Clock::now() > deadline) {
          return deadline_exceeded(fmt::format(
              "{} on {} did not complete within {} (timeout=); rank {} of {} processes waited. Are "
              "all processes running, each with the same number of GPUs? NCCL_DEBUG=INFO shows "
              "what NCCL is waiting for",
              what, l.device.to_string(), nanos_text(timeout()), rank(), world_size()));
        }
        if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    return Status();
  }

  // The first tensor of `ts` on `device`, or null.
  static void* on_device(std::span<const Tensor> ts, const Device& device) {
    for (const Tensor& t : ts) {
      if (t.device() == device) return t.data();
    }
    return nullptr;
  }

  size_t local_index(const Device& d) const {
    for (size_t i = 0; i < locals_.size(); ++i) {
      if (locals_[i].device == d) return i;
    }
    return locals_.size();
  }

  Status divide_on(size_t i, const Tensor& t, int64_t count) {
    return algorithms::device_divide(t.dtype(), t.data(), static_cast<size_t>(count),
                                     num_replicas_in_sync(),
                                     gpu::physical_device(locals_[i].device.index()),
                                     locals_[i].stream.get());
  }

  // Copies buffers[i] (on local GPU i) to every destination that is not that buffer: from the
  // buffer on the destination's own GPU when it is local, else from buffers[0] (ordered against
  // the destination's GPU, copy_between()).
  Status copy_out(std::span<const Tensor> destinations, const std::vector<void*>& buffers,
                  size_t bytes) {
    for (const Tensor& d : destinations) {
      size_t i = local_index(d.device());
      if (i == locals_.size()) i = 0;
      if (d.data() == buffers[i]) continue;
      TRIBUTARY_RETURN_IF_ERROR(
          copy_between(d.data(), d.device(), buffers[i], locals_[i].device, bytes, i));
    }
    return Status();
  }

  // The stream and ordering event of GPU `d`: a local GPU's own, else a stream and an event made
  // for that GPU on its first use (only the launching thread, inside the gate, comes here).
  using Side = std::pair<void*, const gpu::Event*>;
  StatusOr<Side> side_of(const Device& d) {
    const size_t i = local_index(d);
    if (i < locals_.size()) return Side(locals_[i].stream.get(), &locals_[i].order);
    auto it = peers_.find(d.index());
    if (it == peers_.end()) {
      Peer p;
      TRIBUTARY_ASSIGN_OR_RETURN(p.stream, gpu::Stream::create(d.index()));
      TRIBUTARY_ASSIGN_OR_RETURN(p.order, gpu::Event::create(d.index()));
      it = peers_.emplace(d.index(), std::move(p)).first;
    }
    return Side(it->second.stream.get(), &it->second.order);
  }

  // Makes `waiter` wait for what is queued on `stream` so far (`event` is of `stream`'s GPU). The
  // event may be recorded again at once: a wait keeps the record it was given.
  static Status order(const gpu::Event& event, void* stream, void* waiter) {
    TRIBUTARY_RETURN_IF_ERROR(event.record(stream));
    return event.block_stream(waiter);
  }

  // A copy on local GPU `on`'s stream that may read or write another GPU, ordered on both sides:
  // after the work pending on the other GPU (its stream of ours is an ordinary stream, so it also
  // follows the caller's work on that GPU's legacy default stream), and before what is queued on
  // the destination's GPU afterwards (the next collective's stream there, and through it the
  // caller's legacy default stream). Between two places on `on`'s own GPU, a plain copy.
  Status copy_between(void* dst, const Device& dst_device, const void* src,
                      const Device& src_device, size_t bytes, size_t on) {
    const Device& here = locals_[on].device;
    void* stream = locals_[on].stream.get();
    if (src_device.is_cuda() && src_device != here) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto side, side_of(src_device));
      TRIBUTARY_RETURN_IF_ERROR(order(*side.second, side.first, stream));
    }
    const bool other_dst = dst_device.is_cuda() && dst_device != here;
    if (other_dst && dst_device != src_device) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto side, side_of(dst_device));
      TRIBUTARY_RETURN_IF_ERROR(order(*side.second, side.first, stream));
    }
    TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(dst, dst_device, src, src_device, bytes, stream));
    if (other_dst) {
      TRIBUTARY_ASSIGN_OR_RETURN(auto side, side_of(dst_device));
      TRIBUTARY_RETURN_IF_ERROR(order(locals_[on].order, stream, side.first));
    }
    return Status();
  }

  Status enqueue_reduce(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                        const Mirrored<Tensor>& destinations, Scratch& scratch) {
    const auto [nop, divide] = nccl_op(op, call.dtype);
    const size_t bytes = value[0].nbytes();
    const auto count = static_cast<size_t>(call.count);
    const ncclDataType_t type = nccl_type(call.dtype);
    if (world_size() == 1) {
      // ncclReduce to the local GPU of the first destination (GPU 0's when it is not local).
      size_t root = local_index(destinations[0].device());
      if (root == locals_.size()) root = 0;
      void* target = on_device(destinations.values(), locals_[root].device);
      if (target == nullptr) {
        TRIBUTARY_ASSIGN_OR_RETURN(target, scratch.get(bytes, locals_[root].device.index(),
                                                       locals_[root].stream.get()));
      }
      TRIBUTARY_RETURN_IF_ERROR(group([&](size_t i, Local& l) {
        return nccl_status(ncclReduce(value[i].data(), i == root ? target : nullptr, count, type,
                                      nop, static_cast<int>(root), l.data, cuda(l.stream.get())),
                           l.data, "ncclReduce");
      }));
      if (divide) {
        TRIBUTARY_RETURN_IF_ERROR(divide_on(root, Tensor(target, call.dtype, call.count,
                                                         locals_[root].device), call.count));
      }
      for (const Tensor& d : destinations.values()) {
        if (d.data() == target) continue;
        TRIBUTARY_RETURN_IF_ERROR(
            copy_between(d.data(), d.device(), target, locals_[root].device, bytes, root));
      }
      return Status();
    }
    // Across processes every process needs the value: an all-reduce, into a destination on each
    // local GPU where there is one.
    std::vector<void*> buffers(locals_.size(), nullptr);
    for (size_t i = 0; i < locals_.size(); ++i) {
      // NCCL reduces in place when a destination is the replica's own input.
      buffers[i] = on_device(destinations.values(), locals_[i].device);
      if (buffers[i] == nullptr) {
        TRIBUTARY_ASSIGN_OR_RETURN(buffers[i], scratch.get(bytes, locals_[i].device.index(),
                                                           locals_[i].stream.get()));
      }
    }
    TRIBUTARY_RETURN_IF_ERROR(group([&](size_t i, Local& l) {
      return nccl_status(ncclAllReduce(value[i].data(), buffers[i], count, type, nop, l.data,
                                       cuda(l.stream.get())),
                         l.data, "ncclAllReduce");
    }));
    if (divide) {
      for (size_t i = 0; i < locals_.size(); ++i) {
        TRIBUTARY_RETURN_IF_ERROR(
            divide_on(i, Tensor(buffers[i], call.dtype, call.count, locals_[i].device), call.count));
      }
    }
    return copy_out(destinations.values(), buffers, bytes);
  }

  // TF's _ConcatAndSplitPacker: concatenate every value per GPU, split into num_packs pieces,
  // all-reduce each piece, then copy the slices back to the destinations.
  Status enqueue_packed(ReduceOp op, std::span<const ReducePair> pairs, int64_t num_packs,
                        Scratch& scratch) {
    const DType dtype = pairs[0].value[0].dtype();
    const auto [nop, divide] = nccl_op(op, dtype);
    const size_t esize = dtype_size(dtype);
    int64_t total = 0;
    for (const ReducePair& p : pairs) total += p.value[0].num_elements();
    TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> packs,
                               algorithms::split_num_packs(total, num_packs));
    std::vector<void*> flat(locals_.size());
    for (size_t i = 0; i < locals_.size(); ++i) {
      const Local& l = locals_[i];
      TRIBUTARY_ASSIGN_OR_RETURN(flat[i], scratch.get(static_cast<size_t>(total) * esize,
                                                      l.device.index(), l.stream.get()));
      size_t offset = 0;
      for (const ReducePair& p : pairs) {
        const Tensor& v = p.value[i];
        TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(static_cast<char*>(flat[i]) + offset, l.device,
                                                  v.data(), v.device(), v.nbytes(),
                                                  l.stream.get()));
        offset += v.nbytes();
      }
    }
    TRIBUTARY_RETURN_IF_ERROR(group([&](size_t i, Local& l) {
      size_t offset = 0;
      for (int64_t n : packs) {
        char* at = static_cast<char*>(flat[i]) + offset;
        if (n > 0) {
          TRIBUTARY_RETURN_IF_ERROR(nccl_status(
              ncclAllReduce(at, at, static_cast<size_t>(n), nccl_type(dtype), nop, l.data,
                            cuda(l.stream.get())),
              l.data, "ncclAllReduce (pack)"));
        }
        offset += static_cast<size_t>(n) * esize;
      }
      return Status();
    }));
    for (size_t i = 0; i < locals_.size(); ++i) {
      const Local& l = locals_[i];
      if (divide) {
        TRIBUTARY_RETURN_IF_ERROR(divide_on(i, Tensor(flat[i], dtype, total, l.device), total));
      }
      size_t offset = 0;
      for (const ReducePair& p : pairs) {
        const Tensor& d = p.destinations[i];
        TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(d.data(), d.device(),
                                                  static_cast<char*>(flat[i]) + offset, l.device,
                                                  d.nbytes(), l.stream.get()));
        offset += d.nbytes();
      }
    }
    return Status();
  }

  // Enqueues with `body`, records an event per local GPU, and hands the Work to the watchdog.
  template <typename Body>
  Work launch(const CallInfo& call, Body body) {
    if (gate_.failed()) return Work::completed(failure());
    gpu::CurrentDeviceGuard keep_callers_device;  // group() and the events switch devices
    Status s;
    bool failed = false;
    {
      // While this thread may be inside NCCL, a failure on another thread leaves the abort to it
      // (core/launch_gate.h): finish() runs it.
      internal::LaunchGate::Launch inside(gate_, &call);
      if (inside.may_proceed()) {
        NcclTurn turn(in_nccl_, NcclTurn::kWait);  // no NCCL call of the watchdog's meanwhile
        Scratch scratch;  // freed in stream order once everything is enqueued
        s = body(scratch);
      }
      failed = inside.finish();
    }
    if (failed) {
      // ... and fails what was pending, now that NCCL has stopped (outside the launch: a Work's
      // callbacks may issue collectives).
      fail_pending(failure());
      return Work::completed(failure());
    }
    std::shared_ptr<const EventSet> events;
    if (s.ok()) {
      auto taken = events_->take();
      if (taken.ok()) {
        events = std::move(taken).value();
      } else {
        s = taken.status();
      }
    }
    for (size_t i = 0; i < locals_.size() && s.ok(); ++i) {
      s = events->events()[i].record(locals_[i].stream.get());
    }
    if (!s.ok()) {
      // Half-enqueued: the group is in an unknown state. Abort so that the peers fail too.
      Status failed = s.with_context("nccl: " + call.describe());
      fail_all(failed);
      return Work::completed(failed);
    }
    // wait() and test() poll the events on the calling thread, wait_stream() makes a stream wait
    // for them; errors and timeouts stay the watchdog's.
    Work work;
    work.set_device_completion(events);
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      // A failure raises the gate's flag before it fails what is pending: a Work added after that
      // must not wait for a watchdog that has already given up on the communicators.
      if (gate_.failed()) return Work::completed(failure());
      pending_.push_back(Pending{call, work, std::move(events), call.start + call.timeout});
      wake = sleeping_;
    }
    if (wake) cv_.notify_one();  // a futex call only when the watchdog sleeps
    return work;
  }

  // launch=blocking: the call being enqueued, when it is still inside NCCL past its deadline (NCCL
  // waits there for peers while it connects, at the first collective of each kind). After a
  // failure nothing: fail_all() revoked the communicators then.
  Status overdue_launch() {
    return gate_.with_launching([&](const CallInfo* call) -> Status {
      if (call == nullptr || gate_.failed()) return Status();
      if (Clock::now() <= call->start + call->timeout) return Status();
      return deadline_exceeded(fmt::format(
          "{} was still being handed to NCCL after {} (timeout=): with launch=blocking the call "
          "waits inside NCCL while NCCL connects to its peers (at the first collective of each "
          "kind), and a peer process is dead, stalled, or issued a different collective; rank {} "
          "revoked its NCCL communicators",
          call->describe(), nanos_text(timeout()), rank()));
    });
  }

  // --- the watchdog -----------------------------------------------------------------------------

  void watch() {
    // Every CUDA call here (event queries, an abort) runs on a device of ours: a thread with none
    // would create a context on GPU 0 at its first call.
    (void)gpu::set_device(locals_[0].device.index());
    auto idle_since = Clock::now();
    auto next_launch_check = idle_since;
    std::vector<Work> ended;  // a burst of collectives found done, completed outside the lock
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (blocking_launch_ && Clock::now() >= next_launch_check) {
        next_launch_check = Clock::now() + std::chrono::milliseconds(10);
        lock.unlock();
        // The launching thread sits inside NCCL past its deadline, waiting for peers: fail_all()
        // revokes the communicators so that NCCL returns (it then aborts them).
        if (Status late = overdue_launch(); !late.ok()) fail_all(late);
        lock.lock();
        if (stop_) break;
      }
      if (pending_.empty()) {
        // Idle. Short naps first, which a launch does not end: it would cost the launching thread
        // a futex call (several microseconds on a VM) for every collective of a busy loop. After
        // a while, a long sleep that the next launch ends with a signal.
        if (Clock::now() - idle_since < std::chrono::milliseconds(10)) {
          cv_.wait_for(lock, std::chrono::milliseconds(1));
        } else {
          sleeping_ = true;
          cv_.wait_for(lock, std::chrono::milliseconds(100));
          sleeping_ = false;
        }
        continue;
      }
      Pending head = pending_.front();
      // Collectives complete in issue order (one thread issues at a time, each GPU's on one
      // stream), so once the newest is done, all are: one query then ends a whole burst of calls.
      std::shared_ptr<const EventSet> newest;
      uint64_t newest_sequence = 0;
      if (pending_.size() > 1) {
        newest = pending_.back().events;
        newest_sequence = pending_.back().call.sequence;
      }
      lock.unlock();
      if (newest) {
        const StatusOr<bool> all = newest->query();
        if (all.ok() && *all && async_errors().ok()) {
          lock.lock();
          while (!pending_.empty() && pending_.front().call.sequence <= newest_sequence) {
            ended.push_back(std::move(pending_.front().work));
            pending_.pop_front();
          }
          lock.unlock();
          // Aborted kernels leave their events complete too: after a failure, not a success.
          const Status result = gate_.failed() ? failure() : Status();
          for (Work& w : ended) w.complete(result);
          ended.clear();
          idle_since = Clock::now();
          lock.lock();
          continue;
        }
        // Not all done (or an error, which the oldest's query below reports).
      }
      const StatusOr<bool> fired = head.events->query();
      Status s = fired.status();
      const bool done = fired.ok() && *fired;
      if (s.ok()) s = async_errors();
      if (s.ok() && !done && Clock::now() > head.deadline) {
        s = deadline_exceeded(fmt::format(
            "{} did not complete within {} (timeout=): a peer process is dead, stalled, or issued "
            "a different collective; rank {} aborted its NCCL communicators",
            head.call.describe(), nanos_text(timeout()), rank()));
      }
      if (!s.ok()) {
        const std::string what = head.call.describe();
        fail_all(s.message().find(what) == std::string::npos ? s.with_context("nccl: " + what)
                                                             : s);
        // Deferred to a thread inside a launch, what is pending stays until it leaves: meanwhile
        // look again at the watchdog's cadence, not in a busy loop.
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
        continue;
      }
      if (done) {
        lock.lock();
        if (!pending_.empty() && pending_.front().call.sequence == head.call.sequence) {
          pending_.pop_front();
        }
        lock.unlock();
        // Aborted kernels leave their events complete too: after a failure, not a success.
        head.work.complete(gate_.failed() ? failure() : Status());
        idle_since = Clock::now();
        lock.lock();
        continue;
      }
      // In flight: look again shortly. Not closely: a host that waits polls the events itself
      // (wait() and test()), and this thread's CUDA and NCCL queries contend with the thread that
      // enqueues the next call (a yielding loop here cost the launching thread a microsecond a
      // call). So what this thread does (callbacks, timeouts, NCCL's asynchronous errors) lags the
      // device by about 50 us.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
  }

  // NCCL's asynchronous errors, unless a launch is calling NCCL (NcclTurn): then nothing is known
  // this time, and the launch's own calls (settle()) report them.
  Status async_errors() {
    NcclTurn turn(in_nccl_, NcclTurn::kTry);
    if (!turn.held()) return Status();
    std::lock_guard lock(comm_mu_);
    if (aborted_) return Status();
    for (Local& l : locals_) {
      ncclResult_t state = ncclSuccess;
      Status s =
          nccl_status(ncclCommGetAsyncError(l.data, &state), l.data, "ncclCommGetAsyncError");
      if (!s.ok()) return s;
      if (state != ncclSuccess && state != ncclInProgress) {
        return nccl_status(state, l.data, "NCCL on " + l.device.to_string());
      }
    }
    return Status();
  }

  Status failure() const {
    std::lock_guard lock(comm_mu_);
    return failure_;
  }

  // Aborts the communicators and fails every pending Work with `why` (the first failure's). Never
  // called by a thread inside a launch.
  void fail_all(const Status& why) {
    {
      std::lock_guard lock(comm_mu_);
      if (failure_.ok()) failure_ = why;
    }
    switch (gate_.fail()) {
      case internal::LaunchGate::Failed::kTornDown:
        fail_pending(why);
        break;
      case internal::LaunchGate::Failed::kDeferred:
        // Another thread is inside a launch: it aborts the communicators when it leaves NCCL, then
        // fails what is pending. A non-blocking call returns at once (settle() sees the flag). A
        // blocking one may wait inside NCCL for peers that will never come (the failure may be
        // theirs): the communicators are revoked (ncclCommRevoke), so that NCCL stops what is in
        // flight, on the device too, and that call returns; what is pending fails now. The one
        // NCCL call made while another thread is inside NCCL, since without it that thread would
        // stay there until its own deadline (overdue_launch()), up to a whole timeout later.
        if (blocking_launch_ && revoke_communicators()) fail_pending(why);
        break;
      case internal::LaunchGate::Failed::kAlreadyFailed:
        break;  // the first failure ends what is pending
    }
  }

  // launch=blocking: stops what NCCL has in flight on the blocking communicators without freeing
  // them (ncclCommRevoke, NCCL 2.28 and later; init() refuses launch=blocking without it), for a
  // thread that is inside NCCL. False when they were already aborted or revoked.
  bool revoke_communicators() {
#ifdef NCCL_REVOKE_DEFAULT
    gpu::CurrentDeviceGuard keep_callers_device;
    std::lock_guard lock(comm_mu_);
    if (aborted_ || revoked_) return false;
    revoked_ = true;
    for (Local& l : locals_) {
      if (l.data != nullptr) {
        (void)gpu::set_device(l.device.index());
        (void)ncclCommRevoke(l.data, NCCL_REVOKE_DEFAULT);
      }
    }
    return true;
#else
    return false;
#endif
  }

  void fail_pending(const Status& why) {
    std::vector<Work> failed;
    {
      std::lock_guard lock(mu_);
      failed.reserve(pending_.size());
      while (!pending_.empty()) {
        failed.push_back(std::move(pending_.front().work));
        pending_.pop_front();
      }
    }
    for (Work& w : failed) w.complete(why);
  }

  // Healthy and idle: the setup communicators are finalized (non-blocking, polled for at most 5 s)
  // and destroyed; any that does not finalize in time is left to abort_communicators(). Their
  // finalize waits in the intra-node barrier that the blocking communicators' finalize would wait
  // in, for the same ranks, and that one cannot be interrupted without freeing the communicators
  // under the thread inside it: so the blocking communicators are finalized (destroy_blocking())
  // only after every setup communicator has, and otherwise left to abort_communicators(), where no
  // thread is inside NCCL.
  void destroy_communicators() {
    gpu::CurrentDeviceGuard keep_callers_device;
    std::lock_guard lock(comm_mu_);
    if (aborted_) return;
    for (Local& l : locals_) {
      if (l.comm == nullptr) continue;
      (void)gpu::set_device(l.device.index());
      (void)ncclCommFinalize(l.comm);
    }
    const auto until = Clock::now() + std::chrono::seconds(5);
    std::vector<char> finalized(locals_.size(), 0);
    bool all_finalized = true;
    for (size_t i = 0; i < locals_.size(); ++i) {
      Local& l = locals_[i];
      if (l.comm == nullptr) continue;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(l.comm, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      finalized[i] = state == ncclSuccess;
      all_finalized = all_finalized && finalized[i];
    }
    if (blocking_launch_ && all_finalized) destroy_blocking(std::chrono::seconds(5));
    for (size_t i = 0; i < locals_.size(); ++i) {
      Local& l = locals_[i];
      if (!finalized[i]) continue;
      (void)gpu::set_device(l.device.index());
      (void)ncclCommDestroy(l.comm);
      if (l.data == l.comm) l.data = nullptr;
      l.comm = nullptr;
    }
  }

  // launch=blocking, healthy, once the setup communicators have finalized: the blocking
  // communicators are finalized (NCCL flushes what it still sends to peers) and destroyed inside
  // the call, so on a helper thread, waited for at most `bound`. Past it they are left to finish on
  // their own, with a warning: not aborted, since ncclCommAbort would free them under the helper,
  // which is inside NCCL (NCCL has no way to interrupt a blocking finalize short of freeing).
  void destroy_blocking(std::chrono::nanoseconds bound) {
    std::vector<std::pair<ncclComm_t, int>> comms;
    for (Local& l : locals_) {
      if (l.data != nullptr && l.data != l.comm) comms.emplace_back(l.data, l.device.index());
      l.data = nullptr;
    }
    if (comms.empty()) return;
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread helper([comms, done] {
      (void)ncclGroupStart();  // one process's communicators finalize together
      for (const auto& [comm, device] : comms) {
        (void)gpu::set_device(device);
        (void)ncclCommFinalize(comm);
      }
      (void)ncclGroupEnd();
      for (const auto& [comm, device] : comms) {
        (void)gpu::set_device(device);
        (void)ncclCommDestroy(comm);
      }
      done->store(true, std::memory_order_release);
    });
    const auto until = Clock::now() + bound;
    while (!done->load(std::memory_order_acquire) && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (done->load(std::memory_order_acquire)) {
      helper.join();
      return;
    }
    helper.detach();
    log_warning(fmt::format(
        "nccl: the blocking communicators did not finalize within {} although the setup "
        "communicators did (a peer may have stopped since); they are left to finish in the "
        "background",
        nanos_text(bound)));
  }

  // The setup communicators first: aborting one also ends a split in progress (and waits for it),
  // so that `data` is final when it is read below.
  void abort_communicators() {
    gpu::CurrentDeviceGuard keep_callers_device;
    std::lock_guard lock(comm_mu_);
    if (aborted_) return;
    aborted_ = true;
    for (Local& l : locals_) {
      if (l.data == l.comm) l.data = nullptr;
      if (l.comm != nullptr) {
        (void)gpu::set_device(l.device.index());
        (void)ncclCommAbort(l.comm);
        l.comm = nullptr;
      }
    }
    for (Local& l : locals_) {
      if (l.data != nullptr) {
        (void)gpu::set_device(l.device.index());
        (void)ncclCommAbort(l.data);
        l.data = nullptr;
      }
    }
  }

  // Rank 0 makes the unique id; every rank checks that all use the same number of GPUs (NCCL would
  // otherwise wait forever for ranks that never come).
  Status exchange_id(Store& store, ncclUniqueId& id, Clock::time_point deadline) {
    const int G = num_local_replicas();
    TRIBUTARY_RETURN_IF_ERROR(store.set(fmt::format("gpus/{}", rank()), std::to_string(G)));
    if (rank() == 0) {
      TRIBUTARY_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
      TRIBUTARY_RETURN_IF_ERROR(
          store.set("unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
    }
    auto left = [&] {
      return std::chrono::duration_cast<Store::Duration>(
          std::max(Clock::duration::zero(), deadline - Clock::now()));
    };
    for (int r = 0; r < world_size(); ++r) {
      auto got = store.get(fmt::format("gpus/{}", r), left());
      if (!got.ok()) {
        return got.status().with_context(fmt::format(
            "backend 'nccl' (rank {}): rank {} did not join (is it running?)", rank(), r));
      }
      if (*got != std::to_string(G)) {
        return invalid_argument(fmt::format(
            "backend 'nccl': rank {} drives {} GPU(s) but rank {} drives {}; every process must "
            "use the same number of GPUs",
            r, *got, rank(), G));
      }
    }
    if (rank() != 0) {
      auto got = store.get("unique_id", left());
      if (!got.ok()) {
        return got.status().with_context(
            fmt::format("backend 'nccl' (rank {}): waiting for rank 0's NCCL unique id", rank()));
      }
      if (got->size() != sizeof(id)) {
        return data_loss(fmt::format("backend 'nccl': the NCCL unique id in the store has {} "
                                     "bytes, not {}; do all processes use the same NCCL?",
                                     got->size(), sizeof(id)));
      }
      std::memcpy(&id, got->data(), sizeof(id));
    }
    return Status();
  }

  const bool blocking_launch_;  // launch=blocking
  std::vector<Local> locals_;
  // A stream and an ordering event for each GPU that is not local but that a copy reads or writes
  // (copy_between()); only the launching thread, inside the gate, uses them.
  struct Peer {
    gpu::Stream stream;
    gpu::Event order;
  };
  std::map<int, Peer> peers_;
  std::atomic<bool> in_nccl_{false};  // NcclTurn: a thread of ours is calling NCCL
  // Keeps a failure from aborting the communicators under a thread that is inside NCCL; its flag,
  // raised before the communicators are aborted, is read by the Works' completion probes (which
  // may outlive this backend). Its lock is taken before comm_mu_.
  internal::LaunchGate gate_;
  std::mutex mu_;  // pending_, stop_
  std::condition_variable cv_;
  internal::FifoRing<Pending> pending_;  // oldest first; allocates only as it grows
  bool stop_ = false;
  bool sleeping_ = false;  // the watchdog waits on cv_ (nothing pending)
  std::unique_ptr<EventPool> events_;
  mutable std::mutex comm_mu_;  // aborted_, failure_, and the communicators' teardown
  bool aborted_ = false;
  bool revoked_ = false;
  Status failure_;
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<CrossDeviceOps>> make_nccl_ops(BackendContext context, Options options,
                                                        Capabilities caps,
                                                        std::shared_ptr<Store> scope) {
  auto ops = std::make_unique<NcclOps>(std::move(context), std::move(options), std::move(caps));
  TRIBUTARY_RETURN_IF_ERROR(ops->init(scope));
  std::unique_ptr<CrossDeviceOps> out = std::move(ops);
  if (scope) internal::attach_progress_store(*out, scope);
  return out;
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown (ncclGetVersion failed)";
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace tributary::backends
