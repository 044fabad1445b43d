// What a stuck or failed job leaves behind to debug it: a flight recorder per backend instance, a
// stall report, and a timeline. Internal to tributary; the front door of CrossDeviceOps feeds it.
//
// - Flight recorder (torch's NCCL flight recorder): the last TRIBUTARY_FLIGHT_RECORDER_SIZE
//   collectives (default 256; 0 turns recording, the stall report and the timeline off) with their
//   sequence number, kind, size, dtype, op, state and timings. It is dumped when a collective of
//   the instance first fails (timeout, dead peer, mismatch), and on SIGUSR1 (every live instance of
//   the process). A dump goes to the log (stderr, the last 16 entries as text), and also, when
//   TRIBUTARY_FLIGHT_RECORDER_FILE is set, to that file as JSON with every entry.
// - Stall report (Horovod's stall inspector): a collective still pending after
//   TRIBUTARY_STALL_CHECK_TIME (default 60s; 0 = off) is logged once as a warning on the rank that
//   waits. In a multi-process instance every rank publishes the last sequence number it issued to
//   the rendezvous store (when it changed, at most every quarter of the stall time), and rank 0's
//   warning names the ranks that had not issued the stalled collective at their last report; the
//   other ranks' warnings say whether rank 0 had.
// - Timeline (Horovod's timeline): TRIBUTARY_TIMELINE=path writes every collective of the process
//   as a Chrome trace event ("ph":"X"; open it in chrome://tracing or Perfetto). pid is the rank,
//   tid the backend instance; ts is wall-clock time, so ranks on one host line up.
//
// Paths may contain "{rank}", replaced by the process's rank; a path without it gets ".<rank>"
// appended when the job has several processes, so ranks never write the same file.
//
// One monitor thread per process serves every instance. It runs only while an instance that needs
// it exists (stall checks, progress, SIGUSR1, timeline flushing). The SIGUSR1 handler is installed
// only when SIGUSR1 still has its default action (which would kill the process), so an application
// that handles SIGUSR1 itself keeps its handler.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tributary/config.h"
#include "tributary/cross_device_ops.h"
#include "tributary/status.h"
#include "tributary/store.h"

namespace tributary::internal {

struct FlightSettings {
  size_t capacity = 256;                              // TRIBUTARY_FLIGHT_RECORDER_SIZE
  std::string dump_path;                              // TRIBUTARY_FLIGHT_RECORDER_FILE
  std::chrono::nanoseconds stall_check{std::chrono::seconds(60)};  // TRIBUTARY_STALL_CHECK_TIME
  std::string timeline_path;                          // TRIBUTARY_TIMELINE

  // Reads the four settings; a malformed value is an InvalidArgument naming the variable.
  static StatusOr<FlightSettings> from(const Config& config);
};

// `path` with "{rank}" replaced, or ".<rank>" appended in a job of several processes.
std::string rank_path(const std::string& path, int rank, int world_size);

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State : uint8_t { kIssued, kCompleted, kFailed };
  struct Entry {
    uint64_t sequence = 0;  // 0: an empty slot
    Collective collective = Collective::kAllReduce;
    ReduceOp op = ReduceOp::kSum;
    DType dtype = DType::kFloat32;
    int64_t count = 0;
    State state = State::kIssued;
    Clock::time_point issued;
    Clock::time_point ended;  // when completed or failed
    std::string error;        // when failed
  };

  // `label` is "rank r/backend"; `settings.capacity` must be > 0.
  FlightRecorder(std::string backend, int rank, int world_size, const FlightSettings& settings);
  ~FlightRecorder();

  // The front door: a collective was issued / completed. ended() of a sequence number that has
  // already left the ring is ignored. The first failure dumps the recorder.
  void issued(const CallInfo& call);
  void ended(uint64_t sequence, const Status& status);
  // ended() in its two halves, for a Work completed on another thread: record_end() only marks the
  // entry (cheap, no I/O, run before the Work's waiters wake); report_end() writes the timeline
  // event and the first failure's dump (log sink, files: run after they woke, so that a waiter
  // never waits on user code).
  void record_end(uint64_t sequence, const Status& status);
  void report_end(uint64_t sequence, const Status& status);

  // Oldest first.
  std::vector<Entry> snapshot() const;
  uint64_t last_issued() const;
  // The dump as the log shows it (at most `max_entries`, the newest) and as JSON (every entry).
  std::string text(size_t max_entries, std::string_view reason) const;
  std::string json(std::string_view reason) const;
  // Writes the dump to the log, and to the dump file when one is configured.
  void dump(std::string_view reason) const;

  // Multi-process instances: publish progress under "progress/<rank>" of `scope` (the instance's
  // store scope), which the stall report of rank 0 reads.
  void report_progress_to(std::shared_ptr<Store> scope);

  // The monitor thread, once per tick.
  void tick(Clock::time_point now);

  const std::string& label() const { return label_; }
  int rank() const { return rank_; }

 private:
  bool read_slot(size_t index, Entry* out) const;
  void publish_progress(Clock::time_point now);
  void check_stall(Clock::time_point now);
  std::string stall_report(const Entry& entry, Clock::time_point now);

  const std::string backend_;
  const std::string label_;
  const int rank_;
  const int world_size_;
  const FlightSettings settings_;
  const uint64_t id_;  // this instance in the timeline (tid)
  // Wall-clock time of `epoch_steady_`: steady time points become timeline timestamps.
  const Clock::time_point epoch_steady_;
  const int64_t epoch_wall_us_;

  // The ring, written without a lock: the front door issues from one thread at a time, and a
  // collective ends on whichever thread completes it. Each field is an atomic; `sequence` is
  // cleared while a slot is rewritten and published last, so a reader that sees the same sequence
  // before and after reading the other fields has a consistent entry (a seqlock).
  struct Slot {
    std::atomic<uint64_t> sequence{0};
    std::atomic<uint64_t> meta{0};  // collective | op << 8 | dtype << 16 | state << 24
    std::atomic<int64_t> count{0};
    std::atomic<int64_t> issued_ns{0};  // steady clock
    std::atomic<int64_t> ended_ns{0};
  };
  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> last_issued_{0};
  std::atomic<bool> dumped_on_failure_{false};

  mutable std::mutex mu_;              // guards errors_ and progress_
  std::vector<std::string> errors_;    // per slot, for failed entries
  std::shared_ptr<Store> progress_;

  // Touched by the monitor thread only.
  std::shared_ptr<Store> store_;  // a copy of progress_
  uint64_t published_ = 0;
  Clock::time_point last_publish_{};
  uint64_t stall_warned_ = 0;
  class TimelineFile* timeline_ = nullptr;  // owned by the process-wide registry
};

// Creates the recorder of a new instance (null when TRIBUTARY_FLIGHT_RECORDER_SIZE is 0 or the
// settings are malformed: the registry reports those before an instance is made) and registers it
// with the monitor thread; release_recorder() unregisters it when the instance goes away.
std::shared_ptr<FlightRecorder> make_recorder(const std::string& backend, int rank, int world_size,
                                              const Config& config);
void release_recorder(const std::shared_ptr<FlightRecorder>& recorder);

// Dumps every live recorder of the process, as SIGUSR1 does (for tests and tools).
void dump_all_recorders(std::string_view reason);

}  // namespace tributary::internal
