// The C API: a shell over the C++ API. It converts Status to codes plus a thread-local message,
// catches anything thrown (e.g. std::bad_alloc) so that nothing crosses into C, and gives each
// backend an executor, so that C callers get asynchronous collectives even from the backends whose
// collectives run on the calling thread (the multi-process ones: ProcessGroupOps).
#include "tributary/c_api.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/shareable_memory.h"
#include "tributary/store.h"
#include "tributary/tributary.h"

using namespace tributary;

namespace {

using Task = std::function<Status(CrossDeviceOps&)>;

// Runs one backend's collectives one at a time, in issue order. A task is a collective issued and
// waited for, so each completes before the next starts: collectives complete in issue order and
// the CrossDeviceOps is used by one thread at a time, as its contract asks. A synchronous call
// with nothing queued or running runs on the caller's thread (no thread switch on the common
// path); everything else runs on a worker thread, started at the first asynchronous call.
class Executor {
 public:
  explicit Executor(CrossDeviceOps& ops) : ops_(ops) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  // Runs what was issued before stopping: the peers expect this process's part in it.
  ~Executor() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      worker_.request_stop();
    }
    cv_.notify_all();
    worker_.join();
  }

  // Issues `task` behind everything issued before. With `may_run_here` and nothing queued or
  // running, runs it now on this thread and returns a completed Work.
  Work issue(Task task, bool may_run_here) {
    Work done;
    {
      std::unique_lock lock(mu_);
      if (may_run_here && queue_.empty() && !busy_) {
        busy_ = true;
        lock.unlock();
        done.complete(execute(task));
        lock.lock();
        busy_ = false;
        lock.unlock();
        cv_.notify_all();  // a task queued meanwhile by another thread waits for !busy_
        return done;
      }
      // The worker first: a thread that cannot be started (it throws) must not leave the task
      // queued, to run later, out of order, on buffers its caller was told had failed.
      if (!worker_.joinable()) {
        worker_ = std::jthread([this](std::stop_token stop) { loop(stop); });
      }
      queue_.emplace_back(std::move(task), done);
    }
    cv_.notify_all();
    return done;
  }

 private:
  void loop(const std::stop_token& stop) {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] {
        return (!queue_.empty() && !busy_) || (stop.stop_requested() && queue_.empty());
      });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      auto [task, done] = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      done.complete(execute(task));
      lock.lock();
      busy_ = false;
    }
  }

  Status execute(const Task& task) noexcept {
    try {
      return task(ops_);
    } catch (const std::exception& e) {
      return internal_error(std::string("unexpected exception: ") + e.what());
    } catch (...) {
      return internal_error("unexpected exception");
    }
  }

  CrossDeviceOps& ops_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Task, Work>> queue_;
  bool busy_ = false;  // a task is running (here or on the worker)
  std::jthread worker_;
};

}  // namespace

struct trib_backend {
  std::unique_ptr<CrossDeviceOps> ops;
  std::string spec;
  // Declared after `ops`, so destroyed first: it completes what was issued while ops lives.
  // Shared with the registrations, which may outlive the backend (then they find it gone).
  std::shared_ptr<Executor> executor;
};

struct trib_registration {
  BufferRegistration registration;
  std::weak_ptr<Executor> executor;  // its backend's; expired once the backend is destroyed
};

struct trib_work {
  Work done;  // completed by the executor once the collective has completed
};

namespace {

static_assert(TRIB_INTERNAL == static_cast<int>(StatusCode::kInternal) &&
                  TRIB_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss) &&
                  TRIB_ABORTED == static_cast<int>(StatusCode::kAborted),
              "trib_status mirrors StatusCode");
static_assert(TRIB_UINT8 + 1 == 8 && TRIB_PROD + 1 == 5,
              "C enums mirror all_dtypes/all_reduce_ops");

thread_local std::string last_error;
// Said instead of last_error when there was no memory to say more (nothing here may throw).
thread_local const char* last_error_fixed = nullptr;

void set_last_error(std::string_view text) noexcept {
  try {
    last_error.assign(text);
    last_error_fixed = nullptr;
  } catch (...) {
    last_error.clear();
    last_error_fixed = "out of memory (while reporting an error)";
  }
}

trib_status to_code(const Status& s) noexcept {
  set_last_error(s.ok() ? std::string_view() : std::string_view(s.message()));
  return static_cast<trib_status>(static_cast<int>(s.code()));
}

trib_status out_of_memory() noexcept {
  last_error.clear();
  last_error_fixed = "out of memory";
  return TRIB_RESOURCE_EXHAUSTED;
}

// Runs `fn`, whose exceptions become statuses: none crosses into C.
template <typename Fn>
trib_status guarded(Fn&& fn) noexcept {
  try {
    return to_code(fn());
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  } catch (const std::exception& e) {
    try {
      return to_code(internal_error(std::string("unexpected exception: ") + e.what()));
    } catch (...) {
      return out_of_memory();
    }
  } catch (...) {
    last_error.clear();
    last_error_fixed = "unexpected exception";
    return TRIB_INTERNAL;
  }
}

// What the queries answer for a NULL backend, with the reason for trib_last_error.
template <typename T>
T null_backend(const char* fn, T value) noexcept {
  try {
    set_last_error(std::string(fn) + ": backend is NULL");
  } catch (...) {
    (void)out_of_memory();
  }
  return value;
}

std::string str(int64_t v) { return std::to_string(v); }

StatusOr<DType> to_dtype(trib_dtype d, const std::string& what) {
  const int v = static_cast<int>(d);
  if (v < 0 || v >= static_cast<int>(all_dtypes().size())) {
    return invalid_argument(what + " " + str(v) +
                            " is not a trib_dtype (TRIB_FLOAT32 .. TRIB_UINT8)");
  }
  return all_dtypes()[static_cast<size_t>(v)];
}

StatusOr<ReduceOp> to_op(trib_reduce_op o) {
  const int v = static_cast<int>(o);
  if (v < 0 || v >= static_cast<int>(all_reduce_ops().size())) {
    return invalid_argument("op " + str(v) + " is not a trib_reduce_op (TRIB_SUM .. TRIB_PROD)");
  }
  return all_reduce_ops()[static_cast<size_t>(v)];
}

Status check_count(int64_t count, const std::string& what) {
  if (count < 0) return invalid_argument(what + " is negative (" + str(count) + ")");
  return Status();
}

// count * factor elements of up to 8 bytes, or an error when that does not fit in int64.
StatusOr<int64_t> times(int64_t count, int64_t factor) {
  if (factor > 0 && count > std::numeric_limits<int64_t>::max() / 8 / factor) {
    return invalid_argument("count " + str(count) + " times " + str(factor) +
                            " replicas in sync is too large");
  }
  return count * factor;
}

// One view per local replica over the caller's pointers.
StatusOr<PerReplica<Tensor>> views(const CrossDeviceOps& ops, const void* const* ptrs, DType dtype,
                                   int64_t count, const std::string& what) {
  if (ptrs == nullptr) return invalid_argument(what + " is NULL");
  PerReplica<Tensor> v;
  for (size_t i = 0; i < ops.devices().size(); ++i) {
    v.values().emplace_back(const_cast<void*>(ptrs[i]), dtype, count, ops.devices()[i]);
  }
  return v;
}

// The destinations of a reduce: buffers on the local replicas that destination_replicas names.
StatusOr<Mirrored<Tensor>> destinations(const CrossDeviceOps& ops, void* const* ptrs,
                                        const int* replicas, int n, DType dtype, int64_t count,
                                        const std::string& where) {
  const int local = ops.num_local_replicas();
  if (ptrs == nullptr) return invalid_argument(where + "destinations is NULL");
  if (n < 1) {
    return invalid_argument(where + "num_destinations is " + str(n) +
                            "; pass at least one destination");
  }
  if (replicas == nullptr && n > local) {
    return invalid_argument(where + "num_destinations " + str(n) + " is more than the " +
                            str(local) +
                            " local replicas; say in destination_replicas which holds each");
  }
  Mirrored<Tensor> m;
  for (int j = 0; j < n; ++j) {
    const int r = replicas == nullptr ? j : replicas[j];
    if (r < 0 || r >= local) {
      return invalid_argument(where + "destination_replicas[" + str(j) + "] = " + str(r) +
                              " is not a local replica index in [0, " + str(local) + ")");
    }
    m.values().emplace_back(ptrs[j], dtype, count, ops.devices()[static_cast<size_t>(r)]);
  }
  return m;
}

// --- preparing a collective: the C arguments checked and turned into a task ---------------

StatusOr<Task> prepare_all_reduce(const CrossDeviceOps& ops, trib_reduce_op op, trib_dtype dtype,
                                  const void* const* inputs, void* const* outputs, int64_t count) {
  TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
  TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
  TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(ops, inputs, t, count, "inputs"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(ops, outputs, t, count, "outputs"));
  return Task([o, in = std::move(in), out = std::move(out)](CrossDeviceOps& x) {
    return x.all_reduce(o, in, out).wait();
  });
}

StatusOr<Task> prepare_reduce(const CrossDeviceOps& ops, trib_reduce_op op, trib_dtype dtype,
                              const void* const* inputs, int64_t count, void* const* dests,
                              const int* dest_replicas, int num_dests) {
  TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
  TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
  TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(ops, inputs, t, count, "inputs"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto out,
                             destinations(ops, dests, dest_replicas, num_dests, t, count, ""));
  return Task([o, in = std::move(in), out = std::move(out)](CrossDeviceOps& x) {
    return x.reduce(o, in, out).wait();
  });
}

StatusOr<Task> prepare_batch_reduce(const CrossDeviceOps& ops, trib_reduce_op op,
                                    const trib_reduce_pair* pairs, int num_pairs) {
  TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
  if (pairs == nullptr) return invalid_argument("pairs is NULL");
  if (num_pairs < 1) {
    return invalid_argument("num_pairs is " + str(num_pairs) + "; pass at least one pair");
  }
  std::vector<ReducePair> batch;
  for (int p = 0; p < num_pairs; ++p) {
    const trib_reduce_pair& pair = pairs[p];
    const std::string where = "pairs[" + str(p) + "].";
    TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(pair.dtype, where + "dtype"));
    TRIBUTARY_RETURN_IF_ERROR(check_count(pair.count, where + "count"));
    TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(ops, pair.inputs, t, pair.count, where + "inputs"));
    TRIBUTARY_ASSIGN_OR_RETURN(auto out,
                               destinations(ops, pair.destinations, pair.destination_replicas,
                                            pair.num_destinations, t, pair.count, where));
    batch.push_back(ReducePair{std::move(in), std::move(out)});
  }
  return Task(
      [o, batch = std::move(batch)](CrossDeviceOps& x) { return x.batch_reduce(o, batch).wait(); });
}

StatusOr<Task> prepare_broadcast(const CrossDeviceOps& ops, trib_dtype dtype, const void* source,
                                 void* const* outputs, int64_t count, int root) {
  TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
  TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
  if (root < 0 || root >= ops.world_size()) {
    return invalid_argument("root " + str(root) + " is not a process rank in [0, " +
                            str(ops.world_size()) + ")");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(ops, outputs, t, count, "outputs"));
  Tensor src(const_cast<void*>(source), t, count, ops.devices()[0]);
  return Task([src, out = Mirrored<Tensor>(std::move(out.values())), root](CrossDeviceOps& x) {
    return x.broadcast(src, out, root).wait();
  });
}

StatusOr<Task> prepare_all_gather(const CrossDeviceOps& ops, trib_dtype dtype,
                                  const void* const* inputs, void* const* outputs, int64_t count) {
  TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
  TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
  TRIBUTARY_ASSIGN_OR_RETURN(int64_t gathered, times(count, ops.num_replicas_in_sync()));
  TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(ops, inputs, t, count, "inputs"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(ops, outputs, t, gathered, "outputs"));
  return Task([in = std::move(in), out = std::move(out)](CrossDeviceOps& x) {
    return x.all_gather(in, out).wait();
  });
}

StatusOr<Task> prepare_reduce_scatter(const CrossDeviceOps& ops, trib_reduce_op op,
                                      trib_dtype dtype, const void* const* inputs,
                                      void* const* outputs, int64_t count) {
  TRIBUTARY_ASSIGN_OR_RETURN(ReduceOp o, to_op(op));
  TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
  TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
  TRIBUTARY_ASSIGN_OR_RETURN(int64_t scattered, times(count, ops.num_replicas_in_sync()));
  TRIBUTARY_ASSIGN_OR_RETURN(auto in, views(ops, inputs, t, scattered, "inputs"));
  TRIBUTARY_ASSIGN_OR_RETURN(auto out, views(ops, outputs, t, count, "outputs"));
  return Task([o, in = std::move(in), out = std::move(out)](CrossDeviceOps& x) {
    return x.reduce_scatter(o, in, out).wait();
  });
}

// Issues a collective: `prepare` checks the C arguments and makes the task. Synchronous when
// `work` is not given (async false), else the task runs behind the others and *work tracks it.
// A call refused for its arguments is, across processes, a call the peers will wait for in vain:
// the group is told at once, as the C++ front door does with the arguments it refuses.
template <typename Prepare>
trib_status collective(const char* fn, trib_backend* b, bool async, trib_work** work,
                       Prepare&& prepare) {
  return guarded([&]() -> Status {
    if (async && work != nullptr) *work = nullptr;
    if (b == nullptr || !b->ops) return invalid_argument(std::string(fn) + ": backend is NULL");
    StatusOr<Task> task = async && work == nullptr
                              ? StatusOr<Task>(invalid_argument("work is NULL"))
                              : prepare(static_cast<const CrossDeviceOps&>(*b->ops));
    if (!task.ok()) {
      Status why = task.status().with_context(fn);
      if (b->ops->world_size() > 1) {
        b->executor->issue(
            [why](CrossDeviceOps& ops) {
              ops.abort(why);
              return Status();
            },
            /*may_run_here=*/true);
      }
      return why;
    }
    if (!async) return b->executor->issue(std::move(task).value(), true).wait();
    auto w = std::make_unique<trib_work>();
    w->done = b->executor->issue(std::move(task).value(), false);
    *work = w.release();
    return Status();
  });
}

// --- creation ----------------------------------------------------------------------------

// The settings of a backend: `settings` over the environment (when used), over the config file
// either names.
StatusOr<Config> load_config(const trib_backend_options& o) {
  if (o.num_settings < 0) return invalid_argument("num_settings is negative");
  if (o.num_settings > 0 && o.settings == nullptr) {
    return invalid_argument("settings is NULL with num_settings " + str(o.num_settings));
  }
  Config given;
  for (int i = 0; i < o.num_settings; ++i) {
    const char* s = o.settings[i];
    if (s == nullptr) return invalid_argument("settings[" + str(i) + "] is NULL");
    const std::string text(s);
    const size_t eq = text.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return invalid_argument("settings[" + str(i) + "] '" + text + "' is not KEY=VALUE");
    }
    given.set(text.substr(0, eq), text.substr(eq + 1), "trib_backend_options.settings");
  }
  Config config = o.use_environment ? given.merged_over(Config::from_environment()) : given;
  if (std::optional<std::string> file = config.get("TRIBUTARY_CONFIG_FILE")) {
    TRIBUTARY_ASSIGN_OR_RETURN(Config from_file, Config::from_file(*file));
    config = config.merged_over(from_file);
  }
  return config;
}

StatusOr<std::vector<Device>> parse_devices(const char* const* devices, int num_devices) {
  if (devices == nullptr || num_devices <= 0) {
    return invalid_argument("devices is an empty replica list (num_devices " + str(num_devices) +
                            "); pass one device per replica");
  }
  std::vector<Device> parsed;
  for (int i = 0; i < num_devices; ++i) {
    if (devices[i] == nullptr) return invalid_argument("devices[" + str(i) + "] is NULL");
    TRIBUTARY_ASSIGN_OR_RETURN(Device d, Device::parse(devices[i]));
    parsed.push_back(d);
  }
  return parsed;
}

// join_timeout_ms bounds the wait for the other processes, and the backend's own set-up (bounded
// by its timeout=) should not be what waits for them: so every process first announces itself in
// the context's store and waits, at most `timeout`, for all the others to do so.
Status wait_for_every_process(const BackendContext& context, std::chrono::milliseconds timeout) {
  // Per backend: a later one may share the job's store with an earlier one (make_backend_context),
  // whose keys are there already. Its number is the same on every rank (created in one order).
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t n,
                             internal::numbers_taken(context, internal::Numbering::kInstances));
  const std::string prefix = "capi/joined/" + str(static_cast<int64_t>(n)) + "/";
  TRIBUTARY_RETURN_IF_ERROR(context.store->set(prefix + str(context.rank), "1"));
  std::vector<std::string> keys;
  for (int r = 0; r < context.world_size; ++r) keys.push_back(prefix + str(r));
  // A process refused before joining says why at the backends' next meeting (check_everywhere):
  // looked for between slices of the wait, so that the others fail at once.
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t setups,
                             internal::numbers_taken(context, internal::Numbering::kSetups));
  const auto refusal = [&]() -> Status {
    for (int r = 0; r < context.world_size; ++r) {
      auto said = context.store->get("setup/" + str(static_cast<int64_t>(setups)) + "/" + str(r),
                                     std::chrono::milliseconds(0));
      if (said.ok() && said->starts_with("!")) {
        return failed_precondition("rank " + str(r) + " could not create its backend (" +
                                   said->substr(1) + "), so it will not join");
      }
    }
    return Status();
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status joined;
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    joined = context.store->wait(
        keys, std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(250)));
    if (joined.ok() || joined.code() != StatusCode::kDeadlineExceeded) return joined;
    TRIBUTARY_RETURN_IF_ERROR(refusal());
    if (left <= std::chrono::milliseconds(250)) break;
  }
  std::string missing;
  for (int r = 0; r < context.world_size; ++r) {
    auto there = context.store->check({keys[static_cast<size_t>(r)]});
    if (there.ok() && !*there) missing += (missing.empty() ? "" : ", ") + str(r);
  }
  return deadline_exceeded(
      "rank(s) " + (missing.empty() ? std::string("?") : missing) + " of " +
      str(context.world_size) + " did not join within join_timeout_ms=" +
      str(static_cast<int64_t>(timeout.count())) +
      "; is every process started, with the same TRIBUTARY_MASTER_ADDR and "
      "TRIBUTARY_MASTER_PORT? (" + joined.message() + ")");
}

StatusOr<std::unique_ptr<trib_backend>> create(const trib_backend_options& o) {
  if (o.struct_size != sizeof(trib_backend_options)) {
    return invalid_argument("options.struct_size is " + str(static_cast<int64_t>(o.struct_size)) +
                            ", not sizeof(trib_backend_options) = " +
                            str(static_cast<int64_t>(sizeof(trib_backend_options))) +
                            "; initialise the options with trib_backend_options_init");
  }
  if (o.join_timeout_ms < 0) {
    return invalid_argument("join_timeout_ms is negative (" + str(o.join_timeout_ms) + ")");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<Device> devices, parse_devices(o.devices, o.num_devices));
  TRIBUTARY_ASSIGN_OR_RETURN(Config config, load_config(o));
  const std::string spec = o.spec == nullptr ? "" : o.spec;
  // As the C++ programs do: the spec's timeout= bounds the rendezvous too.
  std::optional<std::chrono::milliseconds> join_timeout;
  if (o.join_timeout_ms > 0) {
    join_timeout = std::chrono::milliseconds(o.join_timeout_ms);
  } else if (!spec.empty()) {
    join_timeout = spec_timeout({spec});
  }
  // A bad spec ends every process here, before the rendezvous (registry.h).
  BackendRegistry registry = builtin_backends();
  // Refused here, before joining; with several processes it still joins to say so, so that the
  // others fail at once instead of waiting for it.
  TRIBUTARY_RETURN_IF_ERROR(registry.check_everywhere(spec, config, devices));
  TRIBUTARY_ASSIGN_OR_RETURN(
      BackendContext context,
      make_backend_context(std::move(devices), std::move(config), join_timeout));
  if (o.join_timeout_ms > 0 && context.world_size > 1 && context.store) {
    TRIBUTARY_RETURN_IF_ERROR(wait_for_every_process(context, *join_timeout));
  }
  auto made = spec.empty() ? registry.create_from_config(context) : registry.create(spec, context);
  if (!made.ok()) return made.status();
  auto b = std::make_unique<trib_backend>();
  b->ops = std::move(made).value();
  b->spec = b->ops->spec();
  b->executor = std::make_shared<Executor>(*b->ops);
  return b;
}

}  // namespace

extern "C" {

const char* trib_version(void) {
  try {
    static const std::string v(version());
    return v.c_str();
  } catch (...) {
    return "";  // no memory for the first call's copy; a later call tries again
  }
}

const char* trib_last_error(void) {
  return last_error_fixed != nullptr ? last_error_fixed : last_error.c_str();
}

const char* trib_status_name(trib_status status) {
  static const char* const kNames[] = {"OK",
                                       "INVALID_ARGUMENT",
                                       "NOT_FOUND",
                                       "UNIMPLEMENTED",
                                       "FAILED_PRECONDITION",
                                       "DEADLINE_EXCEEDED",
                                       "UNAVAILABLE",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "RESOURCE_EXHAUSTED",
                                       "INTERNAL",
                                       "DATA_LOSS"};
  const int v = static_cast<int>(status);
  return v >= 0 && v < static_cast<int>(std::size(kNames)) ? kNames[v] : "UNKNOWN";
}

const char* trib_backend_names(void) {
  try {
    static const std::string names = [] {
      std::string s;
      for (const std::string& n : builtin_backends().names()) s += (s.empty() ? "" : ",") + n;
      return s;
    }();
    return names.c_str();
  } catch (...) {
    return "";  // as trib_version
  }
}

trib_status trib_set_log_callback(trib_log_callback callback, void* user_data) {
  return guarded([&]() -> Status {
    static_assert(static_cast<int>(internal::LogLevel::kTrace) == TRIB_LOG_TRACE &&
                      static_cast<int>(internal::LogLevel::kError) == TRIB_LOG_ERROR,
                  "trib_log_level mirrors LogLevel");
    if (callback == nullptr) {
      internal::set_log_sink(nullptr);
      return Status();
    }
    internal::set_log_sink([callback, user_data](internal::LogLevel level, std::string_view prefix,
                                                 std::string_view message) {
      std::string line;
      line.reserve(prefix.size() + message.size() + 3);
      line.append("[").append(prefix).append("] ").append(message);
      callback(static_cast<trib_log_level>(static_cast<int>(level)), line.c_str(), user_data);
    });
    return Status();
  });
}

void trib_backend_options_init(trib_backend_options* options) {
  if (options == nullptr) return;
  *options = trib_backend_options{};
  options->struct_size = sizeof(trib_backend_options);
  options->use_environment = 1;
}

trib_status trib_backend_create_with_options(const trib_backend_options* options,
                                             trib_backend** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return invalid_argument("trib_backend_create: out is NULL");
    *out = nullptr;
    if (options == nullptr) return invalid_argument("trib_backend_create: options is NULL");
    TRIBUTARY_ASSIGN_OR_RETURN(std::unique_ptr<trib_backend> b, create(*options));
    *out = b.release();
    return Status();
  });
}

trib_status trib_backend_create(const char* spec, const char* const* devices, int num_devices,
                                trib_backend** out) {
  trib_backend_options options;
  trib_backend_options_init(&options);
  options.spec = spec;
  options.devices = devices;
  options.num_devices = num_devices;
  return trib_backend_create_with_options(&options, out);
}

void trib_backend_destroy(trib_backend* backend) {
  try {
    delete backend;
  } catch (...) {
    // Destructors do not throw; nothing may cross into C if one did.
  }
}

const char* trib_backend_spec(const trib_backend* b) {
  return b == nullptr ? null_backend("trib_backend_spec", "") : b->spec.c_str();
}

int trib_backend_rank(const trib_backend* b) {
  return b == nullptr ? null_backend("trib_backend_rank", -1) : b->ops->rank();
}

int trib_backend_world_size(const trib_backend* b) {
  return b == nullptr ? null_backend("trib_backend_world_size", -1) : b->ops->world_size();
}

int trib_backend_num_local_replicas(const trib_backend* b) {
  return b == nullptr ? null_backend("trib_backend_num_local_replicas", -1)
                      : b->ops->num_local_replicas();
}

int trib_backend_num_replicas_in_sync(const trib_backend* b) {
  return b == nullptr ? null_backend("trib_backend_num_replicas_in_sync", -1)
                      : b->ops->num_replicas_in_sync();
}

int64_t trib_backend_timeout_ms(const trib_backend* b) {
  if (b == nullptr) return null_backend("trib_backend_timeout_ms", int64_t{-1});
  return std::chrono::ceil<std::chrono::milliseconds>(b->ops->timeout()).count();
}

trib_status trib_backend_abort(trib_backend* b, const char* reason) {
  return guarded([&]() -> Status {
    if (b == nullptr) return invalid_argument("trib_backend_abort: backend is NULL");
    b->ops->abort(aborted(reason != nullptr ? reason : "aborted by the caller"));
    return Status();
  });
}

// --- persistent buffers -----------------------------------------------------------------

trib_status trib_register_buffers(trib_backend* b, trib_dtype dtype, void* const* buffers,
                                  int64_t count, trib_registration** out) {
  if (out != nullptr) *out = nullptr;
  std::shared_ptr<BufferRegistration> slot;
  if (const trib_status made = guarded([&]() -> Status {
        slot = std::make_shared<BufferRegistration>();
        return Status();
      });
      made != TRIB_OK) {
    return made;
  }
  const trib_status st = collective(
      "trib_register_buffers", b, false, nullptr,
      [&](const CrossDeviceOps& ops) -> StatusOr<Task> {
        if (out == nullptr) return invalid_argument("out is NULL");
        TRIBUTARY_ASSIGN_OR_RETURN(DType t, to_dtype(dtype, "dtype"));
        TRIBUTARY_RETURN_IF_ERROR(check_count(count, "count"));
        TRIBUTARY_ASSIGN_OR_RETURN(auto v, views(ops, buffers, t, count, "buffers"));
        return Task([v = std::move(v), slot](CrossDeviceOps& x) -> Status {
          StatusOr<BufferRegistration> r = x.register_buffers(v);
          if (!r.ok()) return r.status();
          *slot = std::move(r).value();
          return Status();
        });
      });
  if (st != TRIB_OK) return st;
  return guarded([&]() -> Status {
    *out = new trib_registration{std::move(*slot), b->executor};
    return Status();
  });
}

trib_status trib_alloc_shareable(size_t bytes, void** out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&]() -> Status {
    if (out == nullptr) return invalid_argument("trib_alloc_shareable: out is NULL");
    TRIBUTARY_ASSIGN_OR_RETURN(void* p,
                               internal::shareable_allocator()->allocate(Device::cpu(), bytes));
    *out = p;
    return Status();
  });
}

void trib_free_shareable(void* ptr) {
  if (ptr != nullptr) internal::shareable_allocator()->deallocate(Device::cpu(), ptr, 0);
}

void trib_registration_release(trib_registration* r) {
  if (r == nullptr) return;
  try {
    // In issue order: after the collectives issued before it, which may use the buffers.
    if (std::shared_ptr<Executor> executor = r->executor.lock()) {
      (void)executor
          ->issue(
              [r](CrossDeviceOps&) {
                r->registration.release();
                return Status();
              },
              /*may_run_here=*/true)
          .wait();
    }
    delete r;  // a registration whose backend is gone ends with nothing to do
  } catch (...) {
    // Nothing may cross into C.
  }
}

// --- collectives -------------------------------------------------------------------------

trib_status trib_all_reduce(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                            const void* const* inputs, void* const* outputs, int64_t count) {
  return collective("trib_all_reduce", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_all_reduce(ops, op, dtype, inputs, outputs, count);
  });
}

trib_status trib_all_reduce_async(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                                  const void* const* inputs, void* const* outputs, int64_t count,
                                  trib_work** work) {
  return collective("trib_all_reduce_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_all_reduce(ops, op, dtype, inputs, outputs, count);
  });
}

trib_status trib_reduce(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                        const void* const* inputs, int64_t count, void* const* dests,
                        const int* dest_replicas, int num_dests) {
  return collective("trib_reduce", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_reduce(ops, op, dtype, inputs, count, dests, dest_replicas, num_dests);
  });
}

trib_status trib_reduce_async(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                              const void* const* inputs, int64_t count, void* const* dests,
                              const int* dest_replicas, int num_dests, trib_work** work) {
  return collective("trib_reduce_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_reduce(ops, op, dtype, inputs, count, dests, dest_replicas, num_dests);
  });
}

trib_status trib_batch_reduce(trib_backend* b, trib_reduce_op op, const trib_reduce_pair* pairs,
                              int num_pairs) {
  return collective("trib_batch_reduce", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_batch_reduce(ops, op, pairs, num_pairs);
  });
}

trib_status trib_batch_reduce_async(trib_backend* b, trib_reduce_op op,
                                    const trib_reduce_pair* pairs, int num_pairs,
                                    trib_work** work) {
  return collective("trib_batch_reduce_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_batch_reduce(ops, op, pairs, num_pairs);
  });
}

trib_status trib_broadcast(trib_backend* b, trib_dtype dtype, const void* source,
                           void* const* outputs, int64_t count, int root) {
  return collective("trib_broadcast", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_broadcast(ops, dtype, source, outputs, count, root);
  });
}

trib_status trib_broadcast_async(trib_backend* b, trib_dtype dtype, const void* source,
                                 void* const* outputs, int64_t count, int root, trib_work** work) {
  return collective("trib_broadcast_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_broadcast(ops, dtype, source, outputs, count, root);
  });
}

trib_status trib_all_gather(trib_backend* b, trib_dtype dtype, const void* const* inputs,
                            void* const* outputs, int64_t count) {
  return collective("trib_all_gather", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_all_gather(ops, dtype, inputs, outputs, count);
  });
}

trib_status trib_all_gather_async(trib_backend* b, trib_dtype dtype, const void* const* inputs,
                                  void* const* outputs, int64_t count, trib_work** work) {
  return collective("trib_all_gather_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_all_gather(ops, dtype, inputs, outputs, count);
  });
}

trib_status trib_reduce_scatter(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                                const void* const* inputs, void* const* outputs, int64_t count) {
  return collective("trib_reduce_scatter", b, false, nullptr, [&](const CrossDeviceOps& ops) {
    return prepare_reduce_scatter(ops, op, dtype, inputs, outputs, count);
  });
}

trib_status trib_reduce_scatter_async(trib_backend* b, trib_reduce_op op, trib_dtype dtype,
                                      const void* const* inputs, void* const* outputs,
                                      int64_t count, trib_work** work) {
  return collective("trib_reduce_scatter_async", b, true, work, [&](const CrossDeviceOps& ops) {
    return prepare_reduce_scatter(ops, op, dtype, inputs, outputs, count);
  });
}

// --- works -------------------------------------------------------------------------------

trib_status trib_work_wait(trib_work* work, int64_t timeout_ms) {
  return guarded([&]() -> Status {
    if (work == nullptr) return invalid_argument("trib_work_wait: work is NULL");
    // Negative: no limit. A year stands for that (and keeps the clock arithmetic in range).
    constexpr int64_t kYear = int64_t{366} * 24 * 3600 * 1000;
    const int64_t ms = timeout_ms < 0 ? kYear : std::min(timeout_ms, kYear);
    (void)work->done.wait(std::chrono::milliseconds(ms));
    // The work's own status once it is complete (also when it completed just as the wait timed
    // out), so that every later wait or test returns the same.
    if (work->done.test()) return work->done.error();
    return deadline_exceeded("trib_work_wait: the collective is still pending after " +
                             str(timeout_ms) +
                             " ms; the work stays valid: wait for it again, or test it");
  });
}

trib_status trib_work_test(trib_work* work, int* done) {
  return guarded([&]() -> Status {
    if (work == nullptr) return invalid_argument("trib_work_test: work is NULL");
    if (done == nullptr) return invalid_argument("trib_work_test: done is NULL");
    // One look: an error the work reached after test() said pending would pair an error with
    // *done = 0, where the header promises TRIB_OK while pending.
    const bool complete = work->done.test();
    *done = complete ? 1 : 0;
    return complete ? work->done.error() : Status();
  });
}

void trib_work_destroy(trib_work* work) {
  if (work == nullptr) return;
  try {
    (void)work->done.wait();  // the buffers are the caller's again only once it completes
    delete work;
  } catch (...) {
    // Nothing crosses into C.
  }
}

}  // extern "C"
