// Flight recorder, stall report and timeline (see flight_recorder.h).
#include "core/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/logging.h"
#include "core/strings.h"
#include "tributary/options.h"

namespace tributary::internal {
namespace {

using Clock = FlightRecorder::Clock;
using Json = nlohmann::json;

constexpr size_t kMaxCapacity = 1 << 20;
constexpr size_t kLogEntries = 16;
constexpr size_t kMaxErrorBytes = 1000;

std::string_view state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kIssued: return "pending";
    case FlightRecorder::State::kCompleted: return "completed";
    case FlightRecorder::State::kFailed: return "failed";
  }
  return "?";
}

// "25 us", "1.2 ms", "3.1 s"
std::string span_text(Clock::duration d) {
  const double us = std::chrono::duration<double, std::micro>(d).count();
  if (us < 1000) return fmt::format("{:.0f} us", us);
  if (us < 1e6) return fmt::format("{:.1f} ms", us / 1e3);
  return fmt::format("{:.1f} s", us / 1e6);
}

int64_t micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

CallInfo call_of(const FlightRecorder::Entry& e) {
  CallInfo c;
  c.sequence = e.sequence;
  c.collective = e.collective;
  c.op = e.op;
  c.dtype = e.dtype;
  c.count = e.count;
  return c;
}

bool has_op(Collective c) { return c != Collective::kBroadcast && c != Collective::kAllGather; }

// Writes `text` to `path` through a temporary file, so a reader never sees half a dump.
Status write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    return unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return unavailable("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
  return Status();
}

}  // namespace

// One timeline file of the process, shared by every instance that names it.
class TimelineFile {
 public:
  explicit TimelineFile(FILE* f) : f_(f) { buffer_ = "[\n"; }

  void add(const std::string& event) {
    std::lock_guard lock(mu_);
    if (f_ == nullptr) return;
    if (events_++ > 0) buffer_ += ",\n";
    buffer_ += event;
    if (buffer_.size() > (1 << 20)) flush_locked();
  }
  void flush() {
    std::lock_guard lock(mu_);
    flush_locked();
  }
  void close() {
    std::lock_guard lock(mu_);
    if (f_ == nullptr) return;
    buffer_ += "\n]\n";
    flush_locked();
    std::fclose(f_);
    f_ = nullptr;
  }

 private:
  void flush_locked() {
    if (f_ == nullptr || buffer_.empty()) return;
    std::fwrite(buffer_.data(), 1, buffer_.size(), f_);
    std::fflush(f_);
    buffer_.clear();
  }
  std::mutex mu_;
  FILE* f_;
  std::string buffer_;
  uint64_t events_ = 0;
};

namespace {

// The process's timeline files by path. Leaked on purpose: the monitor thread and atexit use it.
// TRIBUTARY_FLIGHT_RECORDER_FILE's folder must take the dump (written atomically: a temporary
// file there, renamed); a warning once per path when it cannot.
void warn_if_unwritable(const std::string& path) {
  static std::mutex mu;
  static auto* warned = new std::set<std::string>();
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (::access(dir.c_str(), W_OK | X_OK) == 0) return;
  const std::string why = std::strerror(errno);
  std::lock_guard lock(mu);
  if (!warned->insert(path).second) return;
  write_log_line(LogLevel::kWarning, "tributary",
                 "TRIBUTARY_FLIGHT_RECORDER_FILE: cannot write " + path + " (its folder " + dir +
                     ": " + why + "); a failure's flight record will be logged only");
}

struct Timelines {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<TimelineFile>> files;

  static Timelines& get() {
    static Timelines* t = new Timelines();
    return *t;
  }
  TimelineFile* open(const std::string& path) {
    std::lock_guard lock(mu);
    auto it = files.find(path);
    if (it != files.end()) return it->second.get();
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      write_log_line(LogLevel::kWarning, "tributary",
                     "TRIBUTARY_TIMELINE: cannot write " + path + ": " + std::strerror(errno) +
                         "; no timeline is recorded");
      files.emplace(path, nullptr);
      return nullptr;
    }
    auto* file = new TimelineFile(f);
    files.emplace(path, std::unique_ptr<TimelineFile>(file));
    return file;
  }
  void flush_all() {
    std::lock_guard lock(mu);
    for (auto& [_, f] : files) {
      if (f) f->flush();
    }
  }
  void close_all() {
    std::lock_guard lock(mu);
    for (auto& [_, f] : files) {
      if (f) f->close();
    }
  }
};

std::atomic<bool> g_dump_requested{false};
std::atomic<int> g_wake_fd{-1};

void on_sigusr1(int) {
  const int saved = errno;
  g_dump_requested.store(true);
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char c = 'u';
    [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);
  }
  errno = saved;
}

// The monitor thread of the process: stall checks, progress reports, SIGUSR1 dumps and timeline
// flushes for every live recorder. Leaked on purpose (see Timelines).
class Monitor {
 public:
  static Monitor& get() {
    static Monitor* m = new Monitor();
    return *m;
  }

  void add(const std::shared_ptr<FlightRecorder>& r, Clock::duration tick) {
    std::lock_guard lock(mu_);
    recorders_.push_back(r);
    tick_ = std::min(tick_, tick);
    if (!thread_) start_locked();
    wake();
  }

  void remove(const FlightRecorder* r) {
    std::lock_guard lock(mu_);
    std::erase_if(recorders_, [r](const std::weak_ptr<FlightRecorder>& w) {
      auto s = w.lock();
      return !s || s.get() == r;
    });
    // With nothing left to watch the thread sleeps until the next instance (or SIGUSR1) wakes it.
    // It is not stopped: backends made and dropped in a loop must not start a thread each.
    if (recorders_.empty()) tick_ = std::chrono::seconds(1);
  }

  std::vector<std::shared_ptr<FlightRecorder>> live() {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<FlightRecorder>> out;
    for (auto& w : recorders_) {
      if (auto s = w.lock()) out.push_back(std::move(s));
    }
    return out;
  }

 private:
  Monitor() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
      read_fd_ = fds[0];
      g_wake_fd.store(fds[1]);
    }
    // SIGUSR1 dumps every recorder, unless the application handles (or ignores) SIGUSR1 itself.
    struct sigaction current {};
    if (::sigaction(SIGUSR1, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      struct sigaction sa {};
      sa.sa_handler = on_sigusr1;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      ::sigaction(SIGUSR1, &sa, nullptr);
    }
    std::atexit([] { Monitor::get().stop_at_exit(); });
    ::pthread_atfork([] { Monitor::get().before_fork(); }, [] { Monitor::get().after_fork(); },
                     [] { Monitor::get().after_fork_in_child(); });
  }

  // fork() in another thread: the child gets a copy of every lock as it was, and none of the
  // threads, so the monitor is brought to a point where it holds none of its locks (mu_, the
  // timelines' list) and is not starting. A thread still starting may be inside the allocator:
  // glibc's malloc is locked around fork, but the sanitizers' allocator (clang 14's ASan) is not,
  // and a child forked while the new thread was in it found the allocator locked for good
  // (gloo_test under ASan in CI: both ranks of the test right after the first gloo instance of the
  // parent hung in their own threads' start). The wait for a starting thread is bounded (1 s).
  void before_fork() {
    for (int i = 0; i < 1000 && starting_.load(std::memory_order_acquire); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    mu_.lock();
    Timelines::get().mu.lock();
  }
  void after_fork() {
    Timelines::get().mu.unlock();
    mu_.unlock();
  }

  void wake() {
    const int fd = g_wake_fd.load();
    if (fd >= 0) {
      const char c = 'w';
      [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);
    }
  }

  void start_locked() {
    {
      std::lock_guard lock(exit_mu_);
      thread_exited_ = false;
    }
    stop_ = std::make_shared<std::atomic<bool>>(false);
    starting_.store(true, std::memory_order_release);
    thread_ = std::make_unique<std::thread>([this, stop = stop_] {
      starting_.store(false, std::memory_order_release);
      run(stop);
    });
  }

  // The child of a fork has no monitor thread; the next instance it creates starts one.
  void after_fork_in_child() {
    (void)thread_.release();  // the parent's thread does not exist here: never join or detach it
    if (stop_) *stop_ = true;
    stop_.reset();
    Timelines::get().mu.unlock();
    mu_.unlock();
    std::lock_guard lock(mu_);
    std::erase_if(recorders_, [](auto& w) { return w.expired(); });
    if (!recorders_.empty()) start_locked();
  }

  // Stops the thread and closes the timelines. A thread busy in a tick (a store call to a server
  // that is gone) gets a second to finish; exit never waits longer for it.
  void stop_at_exit() {
    std::unique_ptr<std::thread> t;
    {
      std::lock_guard lock(mu_);
      if (stop_) *stop_ = true;
      t = std::move(thread_);
      wake();
    }
    if (t && t->joinable()) {
      std::unique_lock lock(exit_mu_);
      if (exited_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return thread_exited_; })) {
        lock.unlock();
        t->join();
      } else {
        t->detach();
      }
    }
    Timelines::get().close_all();
  }

  void run(std::shared_ptr<std::atomic<bool>> stop) {
    while (!*stop) {
      int timeout_ms = -1;  // idle: only a new instance, SIGUSR1 or exit wakes the thread
      {
        std::lock_guard lock(mu_);
        if (!recorders_.empty()) {
          timeout_ms =
              static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(tick_).count());
        }
      }
      struct pollfd p {};
      p.fd = read_fd_;
      p.events = POLLIN;
      ::poll(&p, read_fd_ >= 0 ? 1 : 0, read_fd_ >= 0 ? timeout_ms : 1000);
      char drain[64];
      while (read_fd_ >= 0 && ::read(read_fd_, drain, sizeof drain) > 0) {
      }
      if (*stop) break;
      const bool dump = g_dump_requested.exchange(false);
      const Clock::time_point now = Clock::now();
      for (const auto& r : live()) {
        if (dump) r->dump("SIGUSR1");
        r->tick(now);
      }
      Timelines::get().flush_all();
    }
    std::lock_guard lock(exit_mu_);
    thread_exited_ = true;
    exited_cv_.notify_all();
  }

  std::mutex mu_;
  std::vector<std::weak_ptr<FlightRecorder>> recorders_;
  Clock::duration tick_ = std::chrono::seconds(1);
  std::unique_ptr<std::thread> thread_;
  std::atomic<bool> starting_{false};  // thread_ was made and has not run its body yet
  std::shared_ptr<std::atomic<bool>> stop_;
  int read_fd_ = -1;
  std::mutex exit_mu_;
  std::condition_variable exited_cv_;
  bool thread_exited_ = false;
};

std::atomic<uint64_t> g_next_recorder_id{1};

}  // namespace

StatusOr<FlightSettings> FlightSettings::from(const Config& config) {
  FlightSettings s;
  // Where a value came from ("environment", "file <path>"), for its error.
  const auto from = [&](const char* key) { return " (" + config.find(key)->source + ")"; };
  if (auto v = config.get("TRIBUTARY_FLIGHT_RECORDER_SIZE")) {
    long long n = 0;
    if (!parse_int64(trim(*v), &n) || n < 0 || static_cast<size_t>(n) > kMaxCapacity) {
      return invalid_argument("TRIBUTARY_FLIGHT_RECORDER_SIZE='" + excerpt(*v) + "'" +
                              from("TRIBUTARY_FLIGHT_RECORDER_SIZE") +
                              " is not a number of collectives in [0, " +
                              std::to_string(kMaxCapacity) + "] (0 turns the recorder off)");
    }
    s.capacity = static_cast<size_t>(n);
  }
  if (auto v = config.get("TRIBUTARY_STALL_CHECK_TIME")) {
    const std::string t = to_lower(trim(*v));
    if (t == "off" || t == "0") {
      s.stall_check = std::chrono::nanoseconds(0);
    } else {
      auto d = parse_duration(t);
      if (!d.ok() || d->count() < 0) {
        return invalid_argument("TRIBUTARY_STALL_CHECK_TIME='" + excerpt(*v) + "'" +
                                from("TRIBUTARY_STALL_CHECK_TIME") +
                                " is not a duration (e.g. 60s, 5m; 0 or off turns the stall "
                                "report off)");
      }
      s.stall_check = *d;
    }
  }
  if (auto v = config.get("TRIBUTARY_FLIGHT_RECORDER_FILE")) s.dump_path = *v;
  if (auto v = config.get("TRIBUTARY_TIMELINE")) s.timeline_path = *v;
  return s;
}

std::string rank_path(const std::string& path, int rank, int world_size) {
  const std::string r = std::to_string(rank);
  std::string out = path;
  bool replaced = false;
  for (size_t pos = out.find("{rank}"); pos != std::string::npos; pos = out.find("{rank}", pos)) {
    out.replace(pos, 6, r);
    pos += r.size();
    replaced = true;
  }
  if (!replaced && world_size > 1) out += "." + r;
  return out;
}

FlightRecorder::FlightRecorder(std::string backend, int rank, int world_size,
                               const FlightSettings& settings)
    : backend_(std::move(backend)),
      label_("rank " + std::to_string(rank) + "/" + backend_),
      rank_(rank),
      world_size_(world_size),
      settings_(settings),
      id_(g_next_recorder_id.fetch_add(1)),
      epoch_steady_(Clock::now()),
      epoch_wall_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count()),
      capacity_(std::max<size_t>(1, settings.capacity)),
      slots_(new Slot[capacity_]),
      errors_(capacity_) {
  if (!settings_.dump_path.empty()) {
    // Said now, not at the first failure, when the dump is wanted: as the timeline's file is.
    warn_if_unwritable(rank_path(settings_.dump_path, rank_, world_size_));
  }
  if (!settings_.timeline_path.empty()) {
    timeline_ = Timelines::get().open(rank_path(settings_.timeline_path, rank_, world_size_));
    if (timeline_ != nullptr) {
      timeline_->add(Json{{"name", "process_name"}, {"ph", "M"}, {"pid", rank_},
                          {"args", {{"name", "rank " + std::to_string(rank_)}}}}
                         .dump());
      timeline_->add(Json{{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", id_},
                          {"args", {{"name", backend_ + " #" + std::to_string(id_)}}}}
                         .dump());
    }
  }
}

FlightRecorder::~FlightRecorder() = default;

namespace {

uint64_t pack(const FlightRecorder::Entry& e) {
  return static_cast<uint64_t>(e.collective) | static_cast<uint64_t>(e.op) << 8 |
         static_cast<uint64_t>(e.dtype) << 16 | static_cast<uint64_t>(e.state) << 24;
}

void unpack(uint64_t meta, FlightRecorder::Entry* e) {
  e->collective = static_cast<Collective>(meta & 0xff);
  e->op = static_cast<ReduceOp>((meta >> 8) & 0xff);
  e->dtype = static_cast<DType>((meta >> 16) & 0xff);
  e->state = static_cast<FlightRecorder::State>((meta >> 24) & 0xff);
}

constexpr uint64_t kStateMask = uint64_t{0xff} << 24;

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point time_of(int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }

}  // namespace

void FlightRecorder::issued(const CallInfo& call) {
  Slot& slot = slots_[call.sequence % capacity_];
  Entry e;
  e.collective = call.collective;
  e.op = call.op;
  e.dtype = call.dtype;
  e.state = State::kIssued;
  slot.sequence.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.meta.store(pack(e), std::memory_order_relaxed);
  slot.count.store(call.count, std::memory_order_relaxed);
  slot.issued_ns.store(ns_of(call.start), std::memory_order_relaxed);
  slot.ended_ns.store(0, std::memory_order_relaxed);
  slot.sequence.store(call.sequence, std::memory_order_release);
  last_issued_.store(call.sequence, std::memory_order_relaxed);
}

bool FlightRecorder::read_slot(size_t index, Entry* out) const {
  const Slot& slot = slots_[index];
  const uint64_t seq = slot.sequence.load(std::memory_order_acquire);
  if (seq == 0) return false;
  unpack(slot.meta.load(std::memory_order_acquire), out);
  out->count = slot.count.load(std::memory_order_relaxed);
  out->issued = time_of(slot.issued_ns.load(std::memory_order_relaxed));
  out->ended = time_of(slot.ended_ns.load(std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.sequence.load(std::memory_order_relaxed) != seq) return false;  // being rewritten
  out->sequence = seq;
  if (out->state == State::kFailed) {
    std::lock_guard lock(mu_);
    out->error = errors_[index];
  }
  return true;
}

void FlightRecorder::ended(uint64_t sequence, const Status& status) {
  record_end(sequence, status);
  report_end(sequence, status);
}

void FlightRecorder::record_end(uint64_t sequence, const Status& status) {
  const size_t index = sequence % capacity_;
  Slot& slot = slots_[index];
  if (slot.sequence.load(std::memory_order_acquire) != sequence) return;  // left the ring
  const uint64_t meta = slot.meta.load(std::memory_order_relaxed);
  if (((meta & kStateMask) >> 24) != static_cast<uint64_t>(State::kIssued)) return;
  const State state = status.ok() ? State::kCompleted : State::kFailed;
  if (!status.ok()) {
    std::lock_guard lock(mu_);
    errors_[index] = excerpt(status.to_string(), kMaxErrorBytes);
  }
  slot.ended_ns.store(ns_of(Clock::now()), std::memory_order_relaxed);
  slot.meta.store((meta & ~kStateMask) | static_cast<uint64_t>(state) << 24,
                  std::memory_order_release);
}

void FlightRecorder::report_end(uint64_t sequence, const Status& status) {
  if (timeline_ == nullptr && status.ok()) return;  // nothing to report (every call's fast path)
  Entry copy;
  // Only an entry record_end() marked (one that left the ring since is not reported).
  if (!read_slot(sequence % capacity_, &copy) || copy.sequence != sequence ||
      copy.state == State::kIssued) {
    return;
  }
  if (timeline_ != nullptr) {
    const CallInfo c = call_of(copy);
    Json args = {{"sequence", copy.sequence},
                 {"bytes", static_cast<uint64_t>(copy.count) * dtype_size(copy.dtype)},
                 {"dtype", dtype_name(copy.dtype)},
                 {"status", status.ok() ? std::string("ok") : copy.error}};
    if (has_op(copy.collective)) args["op"] = reduce_op_name(copy.op);
    timeline_->add(Json{{"name", collective_name(c.collective)},
                        {"cat", backend_},
                        {"ph", "X"},
                        {"pid", rank_},
                        {"tid", id_},
                        {"ts", epoch_wall_us_ + micros(copy.issued - epoch_steady_)},
                        {"dur", micros(copy.ended - copy.issued)},
                        {"args", std::move(args)}}
                       .dump());
  }
  if (!status.ok() && !dumped_on_failure_.exchange(true)) {
    dump("the first failed collective of this instance");
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::snapshot() const {
  std::vector<Entry> out;
  for (size_t i = 0; i < capacity_; ++i) {
    Entry e;
    if (read_slot(i, &e)) out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.sequence < b.sequence; });
  return out;
}

uint64_t FlightRecorder::last_issued() const {
  return last_issued_.load(std::memory_order_relaxed);
}

std::string FlightRecorder::text(size_t max_entries, std::string_view reason) const {
  const std::vector<Entry> all = snapshot();
  const Clock::time_point now = Clock::now();
  const size_t first = all.size() > max_entries ? all.size() - max_entries : 0;
  std::string s = fmt::format("flight recorder ({}): {} of {} collectives, oldest first", reason,
                              all.size() - first, last_issued());
  if (all.empty()) s += "; none was issued";
  for (size_t i = first; i < all.size(); ++i) {
    const Entry& e = all[i];
    s += "\n  " + call_of(e).describe() + ": ";
    switch (e.state) {
      case State::kIssued: s += "pending for " + span_text(now - e.issued); break;
      case State::kCompleted:
        s += "completed in " + span_text(e.ended - e.issued) + ", " + span_text(now - e.ended) +
             " ago";
        break;
      case State::kFailed:
        s += "failed after " + span_text(e.ended - e.issued) + ": " + e.error;
        break;
    }
  }
  if (!settings_.dump_path.empty()) {
    s += "\n  (every entry, as JSON: " + rank_path(settings_.dump_path, rank_, world_size_) + ")";
  }
  return s;
}

std::string FlightRecorder::json(std::string_view reason) const {
  const std::vector<Entry> all = snapshot();
  const Clock::time_point now = Clock::now();
  nlohmann::json entries = nlohmann::json::array();
  for (const Entry& e : all) {
    nlohmann::json j = {{"sequence", e.sequence},
                        {"collective", collective_name(e.collective)},
                        {"dtype", dtype_name(e.dtype)},
                        {"count", e.count},
                        {"bytes", static_cast<uint64_t>(e.count) * dtype_size(e.dtype)},
                        {"state", state_name(e.state)},
                        {"issued_us_ago", micros(now - e.issued)}};
    if (has_op(e.collective)) j["op"] = reduce_op_name(e.op);
    if (e.state != State::kIssued) j["duration_us"] = micros(e.ended - e.issued);
    if (e.state == State::kFailed) j["error"] = e.error;
    entries.push_back(std::move(j));
  }
  nlohmann::json doc = {{"rank", rank_},
                        {"world_size", world_size_},
                        {"backend", backend_},
                        {"reason", reason},
                        {"last_issued", last_issued()},
                        {"capacity", capacity_},
                        {"entries", std::move(entries)}};
  return doc.dump(1) + "\n";
}

void FlightRecorder::dump(std::string_view reason) const {
  write_log_line(LogLevel::kWarning, label_, text(kLogEntries, reason));
  if (settings_.dump_path.empty()) return;
  const std::string path = rank_path(settings_.dump_path, rank_, world_size_);
  if (Status s = write_file_atomically(path, json(reason)); !s.ok()) {
    write_log_line(LogLevel::kWarning, label_,
                   "TRIBUTARY_FLIGHT_RECORDER_FILE: " + s.message());
  }
}

void FlightRecorder::report_progress_to(std::shared_ptr<Store> scope) {
  std::lock_guard lock(mu_);
  progress_ = std::move(scope);
}

void FlightRecorder::tick(Clock::time_point now) {
  if (settings_.stall_check.count() <= 0) return;
  {
    std::lock_guard lock(mu_);
    store_ = progress_;  // set once, after construction; read here by the monitor thread only
  }
  if (store_ && world_size_ > 1) publish_progress(now);
  check_stall(now);
}

void FlightRecorder::publish_progress(Clock::time_point now) {
  const uint64_t seq = last_issued();
  if (seq == published_ || now - last_publish_ < settings_.stall_check / 4) return;
  // A failed set (the store is gone at shutdown) is retried at the next change.
  if (store_->set("progress/" + std::to_string(rank_), std::to_string(seq)).ok()) {
    published_ = seq;
    last_publish_ = now;
  }
}

void FlightRecorder::check_stall(Clock::time_point now) {
  std::optional<Entry> oldest;
  for (size_t i = 0; i < capacity_; ++i) {
    Entry e;
    if (read_slot(i, &e) && e.state == State::kIssued &&
        (!oldest || e.sequence < oldest->sequence)) {
      oldest = std::move(e);
    }
  }
  if (!oldest || oldest->sequence == stall_warned_ ||
      now - oldest->issued < settings_.stall_check) {
    return;
  }
  stall_warned_ = oldest->sequence;
  write_log_line(LogLevel::kWarning, label_, stall_report(*oldest, now));
}

std::string FlightRecorder::stall_report(const Entry& e, Clock::time_point now) {
  const uint64_t seq = e.sequence;
  std::string s = call_of(e).describe() + " has waited " + span_text(now - e.issued) +
                  " without completing (stall check " + format_duration(settings_.stall_check) +
                  ")";
  if (!store_ || world_size_ <= 1) return s + ".";
  // The last sequence number `r` issued at its last report; 0 when it has not reported.
  auto progress_of = [&](int r) -> uint64_t {
    if (r == rank_) return last_issued();
    auto v = store_->get("progress/" + std::to_string(r), std::chrono::milliseconds(0));
    long long n = 0;
    return v.ok() && parse_int64(*v, &n) && n > 0 ? static_cast<uint64_t>(n) : 0;
  };
  auto last_text = [](uint64_t p) {
    return p == 0 ? std::string("none issued") : "last issued #" + std::to_string(p);
  };
  if (rank_ != 0) {
    const uint64_t p0 = progress_of(0);
    if (p0 < seq) {
      return s + ". Rank 0 had not issued it at its last progress report (" + last_text(p0) +
             "); every rank must issue the same collectives in the same order.";
    }
    return s + ". Rank 0's stall report names the ranks that have not issued it.";
  }
  std::vector<std::string> behind;
  size_t count = 0;
  for (int r = 0; r < world_size_; ++r) {
    const uint64_t p = progress_of(r);
    if (p >= seq) continue;
    if (++count <= 16) behind.push_back(std::to_string(r) + " (" + last_text(p) + ")");
  }
  if (count == 0) {
    return s + ". Every rank has issued it: a peer may be stopped or starved inside it, or the "
               "network is congested.";
  }
  if (count > behind.size()) behind.push_back("and " + std::to_string(count - behind.size()) +
                                              " more");
  return s + ". At their last progress report, " + std::string(count == 1 ? "rank " : "ranks ") +
         join(behind, ", ") + " had" +
         " not issued it: stuck, dead, slower than the others, or issuing other collectives. "
         "Every rank must issue the same collectives in the same order.";
}

std::shared_ptr<FlightRecorder> make_recorder(const std::string& backend, int rank, int world_size,
                                              const Config& config) {
  auto settings = FlightSettings::from(config);
  if (!settings.ok() || settings->capacity == 0) return nullptr;
  auto r = std::make_shared<FlightRecorder>(backend, rank, world_size, *settings);
  Clock::duration tick = std::chrono::seconds(1);
  if (settings->stall_check.count() > 0) {
    tick = std::clamp<Clock::duration>(settings->stall_check / 4, std::chrono::milliseconds(10),
                                       std::chrono::seconds(1));
  }
  Monitor::get().add(r, tick);
  return r;
}

void release_recorder(const std::shared_ptr<FlightRecorder>& recorder) {
  if (!recorder) return;
  Monitor::get().remove(recorder.get());
  // What the instance recorded reaches the file now, not at the next tick or at exit (a process
  // that ends with _exit, or is killed later, keeps it).
  Timelines::get().flush_all();
}

void dump_all_recorders(std::string_view reason) {
  for (const auto& r : Monitor::get().live()) r->dump(reason);
}

}  // namespace tributary::internal
