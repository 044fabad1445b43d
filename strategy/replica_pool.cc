// run(): persistent replica threads, and the meetings where replicas make cross-replica calls.
//
// A meeting is TF's merge_call: every local replica arrives with its argument and its merge
// function; when the last arrives, replica 0's merge function runs for all of them (TF runs
// threads[0].merge_fn, so the result never depends on arrival order) on the last arriver's thread,
// and everyone leaves with its result. What TF leaves to
// a hang (replicas that make different numbers or kinds of calls, a replica that fails while the
// others wait) is detected here: every replica is either at the meeting or finished, so when all
// are accounted for and some are missing, the waiting ones fail at once; a replica that is merely
// slow fails them after the backend's timeout.
#include <cxxabi.h>

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "fmt/format.h"
#include "strategy/internal.h"

namespace tributary {
namespace {

using strategy_internal::thread_context;

std::string describe_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return std::string("an exception: ") + ex.what();
  } catch (abi::__forced_unwind&) {
    throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
  } catch (...) {
    return "an exception of unknown type";
  }
}

// Runs fn on this thread as replica `ctx`, converting exceptions to a Status.
Status call_replica_fn(const std::function<Status(ReplicaContext&)>& fn, ReplicaContext& ctx) {
  auto& t = thread_context();
  ReplicaContext* saved = t.replica;
  t.replica = &ctx;
  Status s;
  try {
    s = fn(ctx);
  } catch (abi::__forced_unwind&) {
    throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
  } catch (...) {
    s = aborted(fmt::format("replica {} threw {}", ctx.local_replica_id(),
                            describe_exception(std::current_exception())));
  }
  t.replica = saved;
  return s;
}

// Runs a merge function on this thread in cross-replica context. A failure is this worker's
// alone until its peers are told (they may be about to wait in the collective it did not reach).
StatusOr<std::any> run_merge(Strategy& strategy, ReplicaContext::MergeFn& fn,
                             std::vector<std::any>& args) {
  auto& t = thread_context();
  Strategy* saved = t.merge;
  t.merge = &strategy;
  StatusOr<std::any> r = internal_error("merge function did not run");
  try {
    r = fn(args);
  } catch (abi::__forced_unwind&) {
    throw;  // a thread being ended (pthread_exit, Python finalizing) must unwind
  } catch (...) {
    r = aborted("a merge function threw " + describe_exception(std::current_exception()));
  }
  t.merge = saved;
  if (!r.ok()) strategy.tell_peers(r.status());
  return r;
}

}  // namespace

struct Strategy::Pool {
  explicit Pool(Strategy* s) : strategy(s), n(s->num_local_replicas()) {}

  Strategy* strategy;
  const int n;
  std::mutex mu;
  std::condition_variable cv;  // every state change below notifies it
  std::vector<std::jthread> threads;
  bool stopping = false;

  // The current run().
  uint64_t run_generation = 0;
  const std::function<Status(ReplicaContext&)>* fn = nullptr;
  std::vector<Status> results;
  int running = 0;

  // The current meeting.
  uint64_t meeting_generation = 0;
  int arrived = 0;
  int finished = 0;
  std::vector<std::any> args;
  std::vector<ReplicaContext::MergeFn*> fns;  // each waiting replica's, alive on its stack
  std::vector<std::string> whats;
  std::vector<int> calls;  // meetings each replica has joined in this run
  std::any result;
  bool merging = false;  // the last replica to arrive is running the merge function
  Status failure;        // sticky for the rest of this run
  Status first_error;    // the first replica error, which caused `failure` if any
  int first_error_replica = -1;

  void start() {
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([this, i] { loop(i); });
    }
  }

  void stop() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    threads.clear();  // joins
  }

  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(ReplicaContext&)>* job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || run_generation != seen; });
        if (stopping) return;
        seen = run_generation;
        job = fn;
      }
      Status s = call_replica_fn(*job, *strategy->contexts_[i]);
      std::lock_guard lock(mu);
      replica_finished(i, s);
      results[i] = std::move(s);
      if (--running == 0) cv.notify_all();
    }
  }

  // Called with mu held.
  void replica_finished(int i, const Status& s) {
    ++finished;
    if (!s.ok() && first_error.ok() && !(s == failure)) {
      first_error = s;
      first_error_replica = i;
    }
    if (failure.ok() && arrived > 0) {
      if (!first_error.ok()) {
        failure = aborted(fmt::format(
            "replica {} failed ({}) while replicas waited for it in {}; the collective was "
            "abandoned",
            first_error_replica, first_error.to_string(), whats[first_waiting()]));
      } else if (arrived + finished == n) {
        failure = divergence(i);
      }
    }
    cv.notify_all();
  }

  int first_waiting() const {
    for (int i = 0; i < n; ++i) {
      if (!whats[i].empty()) return i;
    }
    return 0;
  }

  Status divergence(int returned) const {
    const int w = first_waiting();
    return failed_precondition(fmt::format(
        "Some replicas made a different number of replica_context().merge_call() calls: replica "
        "{} returned from its function after {} cross-replica call(s) while replica {} waits in "
        "call #{} ({}). Every replica must make the same cross-replica calls (all_reduce, "
        "all_gather, merge_call, synchronized variable updates) in the same order",
        returned, calls[returned], w, calls[w], whats[w]));
  }

  StatusOr<std::any> meet(int i, std::string_view what, std::any arg, ReplicaContext::MergeFn& fn) {
    std::unique_lock lock(mu);
    if (!failure.ok()) return failure;
    args[i] = std::move(arg);
    fns[i] = &fn;
    whats[i] = std::string(what);
    ++calls[i];
    ++arrived;
    if (arrived == n) {
      for (int j = 1; j < n; ++j) {
        if (whats[j] != whats[0]) {
          failure = failed_precondition(fmt::format(
              "replicas made different cross-replica calls at call #{}: replica 0 called {} but "
              "replica {} called {}; every replica must make the same calls in the same order",
              calls[0], whats[0], j, whats[j]));
          cv.notify_all();
          return failure;
        }
      }
      // Everyone else is waiting: run replica 0's merge function without the lock, in
      // cross-replica context. The waiters stop counting their timeout meanwhile (the merge's
      // collectives have their own); replica 0's function is alive on its stack, where replica 0
      // waits for this meeting to end.
      merging = true;
      lock.unlock();
      StatusOr<std::any> r = run_merge(*strategy, *fns[0], args);
      lock.lock();
      merging = false;
      if (!r.ok()) {
        failure = r.status();
      } else {
        result = std::move(*r);
      }
      for (int j = 0; j < n; ++j) {
        whats[j].clear();
        args[j].reset();
        fns[j] = nullptr;
      }
      arrived = 0;
      ++meeting_generation;
      cv.notify_all();
      if (!failure.ok()) return failure;
      return result;
    }
    if (!first_error.ok()) {
      failure =
          aborted(fmt::format("replica {} failed ({}) before reaching {}; the collective was "
                              "abandoned",
                              first_error_replica, first_error.to_string(), what));
      cv.notify_all();
      return failure;
    }
    if (finished > 0 && arrived + finished == n) {
      for (int j = 0; j < n; ++j) {
        if (whats[j].empty()) {
          failure = divergence(j);
          break;
        }
      }
      cv.notify_all();
      return failure;
    }
    const uint64_t mine = meeting_generation;
    const auto timeout = strategy->cross_device_ops().timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool timed_out = false;
    while (meeting_generation == mine && failure.ok()) {
      if (merging) {
        cv.wait(lock);  // everyone arrived; the merge is bounded by its collectives' timeouts
      } else if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !merging &&
                 meeting_generation == mine && failure.ok()) {
        timed_out = true;
        break;
      }
    }
    if (meeting_generation != mine) {
      if (!failure.ok()) return failure;  // the merge function failed
      return result;
    }
    if (timed_out) {
      std::string absent;
      for (int j = 0; j < n; ++j) {
        if (!whats[j].empty()) continue;
        if (!absent.empty()) absent += ", ";
        absent += std::to_string(j);
      }
      failure = deadline_exceeded(fmt::format(
          "replica(s) {} did not reach {} (call #{}) within {} ms while the others waited; is a "
          "replica stuck outside tributary? raise the backend's timeout= to wait longer",
          absent, what, calls[i],
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()));
      cv.notify_all();
    }
    return failure;
  }
};

Status Strategy::check_run_arguments(std::span<const char* const> kinds,
                                     std::span<const size_t> sizes) {
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == nullptr || sizes[i] == static_cast<size_t>(num_local_replicas())) continue;
    Status bad = invalid_argument(fmt::format(
        "run(): argument {} is a {} of {} component(s) but {} has {} local replica(s); pass one "
        "value per local replica (e.g. from distribute_values_from_function() or a distributed "
        "dataset's get_next()), or a plain value to give every replica the same one",
        i + 1, kinds[i], sizes[i], describe(), num_local_replicas()));
    tell_peers(bad);
    return bad;
  }
  return ok_status();
}

Status Strategy::run_interruptible(const std::function<Status(ReplicaContext&)>& fn,
                                   const std::function<Status()>& interrupt_check) {
  return run_erased(fn, &interrupt_check);
}

Status Strategy::run_erased(const std::function<Status(ReplicaContext&)>& fn,
                            const std::function<Status()>* interrupt_check) {
  // A handle on the default strategy runs as the default strategy (its replica context).
  if (Strategy* s = identity(); s != this) return s->run_erased(fn, interrupt_check);
  // Multi-worker: a step that failed here (a replica's error, or its check of an update before
  // the meeting) has left this worker's collectives out of step with its peers', which may be
  // waiting in one it never reaches: they are told at once instead of at their timeout.
  Status s = run_replicas(fn, interrupt_check);
  if (!s.ok()) tell_peers(s);
  return s;
}

Status Strategy::run_replicas(const std::function<Status(ReplicaContext&)>& fn,
                              const std::function<Status()>* interrupt_check) {
  auto& t = thread_context();
  if (t.replica != nullptr || t.merge != nullptr) {
    return failed_precondition(
        "run() was called from inside a function given to run() or merge_call(); call it from "
        "cross-replica context (a scope or no scope), not from a replica thread");
  }
  Strategy* current = strategy_internal::current_strategy();
  if (current != nullptr && current != this)
    return strategy_internal::mixing_error(*this, *current);
  if (num_local_replicas() == 1) {
    // One replica: no threads, and meet() runs the merge at once.
    return call_replica_fn(fn, *contexts_[0]);
  }
  if (!pool_) {
    pool_ = std::make_unique<Pool>(this);
    pool_->start();
  }
  Pool& p = *pool_;
  std::unique_lock lock(p.mu);
  if (p.running > 0) {
    return failed_precondition(
        "run() was called while another run() of this strategy is in progress on another thread; "
        "a Strategy is driven by one thread at a time");
  }
  const int n = p.n;
  p.results.assign(n, Status());
  p.args.assign(n, {});
  p.fns.assign(n, nullptr);
  p.whats.assign(n, {});
  p.calls.assign(n, 0);
  p.failure = Status();
  p.first_error = Status();
  p.first_error_replica = -1;
  p.arrived = 0;
  p.finished = 0;
  p.running = n;
  p.fn = &fn;
  ++p.run_generation;
  p.cv.notify_all();
  Status interrupted;
  if (interrupt_check == nullptr || !*interrupt_check) {
    p.cv.wait(lock, [&] { return p.running == 0; });
  } else {
    // Called until every replica has returned, after a first error too (the binding may have
    // replicas to stop that started late). Nothing leaves here while replicas run.
    constexpr auto kPoll = std::chrono::milliseconds(50);
    while (!p.cv.wait_for(lock, kPoll, [&] { return p.running == 0; })) {
      lock.unlock();  // the check may take the binding's own lock (Python's GIL)
      Status check;
      try {
        check = (*interrupt_check)();
      } catch (abi::__forced_unwind&) {
        throw;  // a thread being ended must unwind
      } catch (const std::exception& e) {
        check = internal_error(std::string("the interrupt check threw ") + e.what());
      } catch (...) {
        check = internal_error("the interrupt check threw");
      }
      lock.lock();
      if (check.ok() || !interrupted.ok()) continue;
      interrupted = std::move(check);
      if (p.failure.ok()) p.failure = interrupted;  // replicas in or reaching a meeting fail
      p.cv.notify_all();
      // Multi-worker: a replica may be inside a collective that waits for the other workers
      // (a merge function's all-reduce); the abort ends it now (it is thread-safe) and tells
      // them, rather than when the collective ends or times out.
      lock.unlock();
      tell_peers(interrupted);
      lock.lock();
    }
  }
  if (!interrupted.ok()) return interrupted;
  if (!p.first_error.ok()) {
    return p.first_error.with_context(fmt::format("replica {}", p.first_error_replica));
  }
  if (!p.failure.ok()) return p.failure;
  for (int i = 0; i < n; ++i) {
    if (!p.results[i].ok()) return p.results[i].with_context(fmt::format("replica {}", i));
  }
  return ok_status();
}

StatusOr<std::any> ReplicaContext::meet(std::string_view what, std::any arg, MergeFn fn) {
  auto& t = thread_context();
  const bool default_context = t.replica == nullptr && t.merge == nullptr && t.scope == nullptr &&
                               strategy_ == &default_strategy();
  if (!default_context) {
    if (t.merge != nullptr || t.replica == nullptr) {
      return failed_precondition(fmt::format(
          "Need to be inside `call_for_each_replica()`: ReplicaContext::{} must be called in "
          "replica context (inside a function given to run()); in cross-replica context use the "
          "Strategy's methods (reduce, gather, ...)",
          what));
    }
    if (t.replica != this) return failed_precondition("Mismatching ReplicaContext.");
  }
  if (strategy_->num_local_replicas() == 1) {
    std::vector<std::any> args;
    args.push_back(std::move(arg));
    return run_merge(*strategy_, fn, args);
  }
  return strategy_->pool_->meet(local_id_, what, std::move(arg), fn);
}

namespace {

// The next number among the strategies called `name` in this process (1, 2, ...): an identity for
// messages, so that "Mixing different tf.distribute.Strategy objects: A is not B" names two
// different strategies differently. Only counts; nothing is looked up by it.
int next_instance(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, int> made;
  std::lock_guard lock(mu);
  return ++made[name];
}

}  // namespace

Strategy::Strategy(StrategyParts parts) : parts_(std::move(parts)) {
  if (parts_.kind != StrategyKind::kDefault) instance_ = next_instance(parts_.name);
  for (int i = 0; i < num_local_replicas(); ++i) {
    contexts_.push_back(std::unique_ptr<ReplicaContext>(new ReplicaContext(this, i)));
  }
}

Strategy::~Strategy() {
  if (pool_ && !pool_->threads.empty()) pool_->stop();
}

}  // namespace tributary
