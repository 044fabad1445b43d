#include "algorithms/parallel.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/reduce_kernels.h"
#include "core/cpus.h"
#include "core/logging.h"
#include "tributary/config.h"

namespace tributary::algorithms {
namespace {

class WorkerPool {
 public:
  WorkerPool() {
    // The CPUs this process may run on (core/cpus.h), not the machine's: a container given 2 of
    // 64 would otherwise wake 63 threads per job to share 2 CPUs.
    auto n = static_cast<unsigned>(internal::usable_cpus());
    if (const char* e = std::getenv("TRIBUTARY_NUM_THREADS"); e && *e) {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(e, &end, 10);
      if (errno == 0 && end && *end == '\0' && v >= 1 && v <= 1024) {
        n = static_cast<unsigned>(v);
      } else {
        // Once per process (the pool is made once), at its first use.
        internal::Logger(internal::log_level_from(Config::from_environment()), "tributary")
            .log(internal::LogLevel::kWarning,
                 "TRIBUTARY_NUM_THREADS='{}' is not a number of threads from 1 to 1024; using {} "
                 "(the CPUs this process may run on)",
                 std::string_view(e).substr(0, 64), n);
      }
    }
    for (unsigned i = 1; i < n; ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  int threads() const { return static_cast<int>(threads_.size()) + 1; }
  uint64_t jobs() const { return jobs_.load(std::memory_order_relaxed); }

  void run(size_t tasks, const std::function<void(size_t)>& fn) {
    std::unique_lock<std::mutex> one_job(job_, std::try_to_lock);
    if (!one_job.owns_lock() || threads_.empty() || tasks <= 1) {
      for (size_t i = 0; i < tasks; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      ++generation_;
    }
    jobs_.fetch_add(1, std::memory_order_relaxed);
    wake_.notify_all();
    take(fn, tasks);
    // Every worker that joined this job has left it before the job's state can change again.
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void take(const std::function<void(size_t)>& fn, size_t tasks) {
    for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < tasks;) fn(i);
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (fn_ == nullptr) continue;  // that job is over already
      const std::function<void(size_t)>* fn = fn_;
      const size_t tasks = tasks_;
      ++active_;
      lk.unlock();
      take(*fn, tasks);
      lk.lock();
      if (--active_ == 0) done_.notify_all();
    }
  }

  std::mutex job_;  // one job at a time; a second caller runs its tasks itself
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> jobs_{0};
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

WorkerPool& pool() {
  static WorkerPool* p = new WorkerPool();  // never destroyed: callers may run at exit
  return *p;
}

// Blocks of `elem`-sized elements for `bytes` of output: about four per thread, within
// kParallelBlockBytes and kParallelMaxBlockBytes, a multiple of 4 KiB.
size_t block_elements(size_t count, size_t elem) {
  const size_t bytes = count * elem;
  const size_t per = bytes / (static_cast<size_t>(parallel_threads()) * 4);
  const size_t block =
      std::clamp((per + 4095) / 4096 * 4096, kParallelBlockBytes, kParallelMaxBlockBytes);
  return std::max<size_t>(1, block / elem);
}

}  // namespace

void parallel_for(size_t tasks, const std::function<void(size_t)>& fn) { pool().run(tasks, fn); }

int parallel_threads() { return pool().threads(); }

uint64_t parallel_jobs() { return pool().jobs(); }

void parallel_reduce(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                     std::span<void* const> dsts, size_t count, int64_t mean_divisor) {
  const size_t elem = dtype_size(dtype);
  if (count * elem * srcs.size() < kParallelReduceMinBytes || parallel_threads() == 1 ||
      dsts.empty() || srcs.size() > 64 || dsts.size() > 64) {
    reduce(op, dtype, srcs, dsts, count, mean_divisor);
    return;
  }
  // As reduce() decides for one call of the whole size: stream the outputs that are not sources.
  uint64_t streaming = 0;
  if (count * elem >= kStreamingStoreMinBytes) {
    for (size_t j = 0; j < dsts.size(); ++j) {
      if (std::find(srcs.begin(), srcs.end(), dsts[j]) == srcs.end()) streaming |= uint64_t{1} << j;
    }
  }
  const size_t block = block_elements(count, elem);
  const size_t tasks = (count + block - 1) / block;
  parallel_for(tasks, [&](size_t t) {
    const size_t begin = t * block, n = std::min(block, count - begin);
    const void* s[64];
    void* d[64];
    for (size_t i = 0; i < srcs.size(); ++i)
      s[i] = static_cast<const std::byte*>(srcs[i]) + begin * elem;
    for (size_t j = 0; j < dsts.size(); ++j) d[j] = static_cast<std::byte*>(dsts[j]) + begin * elem;
    reduce_streaming(op, dtype, std::span<const void* const>(s, srcs.size()),
                     std::span<void* const>(d, dsts.size()), n, mean_divisor, streaming);
  });
}

void parallel_copy(void* dst, const void* src, size_t bytes) {
  const CopyJob one{dst, src, bytes};
  parallel_copies(std::span<const CopyJob>(&one, 1));
}

void parallel_copies(std::span<const CopyJob> copies) {
  size_t total = 0;
  for (const CopyJob& c : copies) total += c.bytes;
  if (total < kParallelMinBytes || parallel_threads() == 1) {
    for (const CopyJob& c : copies) {
      if (c.bytes != 0) std::memcpy(c.dst, c.src, c.bytes);  // an empty one may hold nullptr
    }
    return;
  }
  // Task t is block t - first[i] of copy i, where first[i] <= t < first[i + 1].
  const size_t block = block_elements(total, 1);
  std::vector<size_t> first(copies.size() + 1, 0);
  for (size_t i = 0; i < copies.size(); ++i) {
    first[i + 1] = first[i] + (copies[i].bytes + block - 1) / block;
  }
  parallel_for(first.back(), [&](size_t t) {
    const size_t i =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), t) - first.begin()) - 1;
    const size_t begin = (t - first[i]) * block;
    std::memcpy(static_cast<std::byte*>(copies[i].dst) + begin,
                static_cast<const std::byte*>(copies[i].src) + begin,
                std::min(block, copies[i].bytes - begin));
  });
}

}  // namespace tributary::algorithms
