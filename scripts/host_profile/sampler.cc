// A sampling profiler to LD_PRELOAD where `perf` is missing (the lent GPU machine): SIGPROF asked
// for every 100 us of the process's CPU time (Linux delivers it at its scheduler tick, so in
// practice every 3-4 ms: about 1000 samples in a 3 s run on the H100 machine; the shares hold,
// runs must be long enough), the stack of whichever thread it lands on (backtrace()), kept
// in memory and written at exit, with /proc/self/maps, to $SAMPLER_OUT.<pid>. symbolize.py turns
// that into per-thread profiles against unstripped copies of the binaries.
//   g++ -O2 -shared -fPIC scripts/host_profile/sampler.cc -o sampler.so
//   SAMPLER_OUT=/tmp/prof LD_PRELOAD=$PWD/sampler.so PROGRAM ...
// Without SAMPLER_OUT it does nothing. A process that ends with _exit() or a signal writes nothing.
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kDepth = 24;
constexpr int kMaxSamples = 400000;

struct Sample {
  int tid;
  int depth;
  void* pc[kDepth];
};

Sample* g_samples = nullptr;
std::atomic<int> g_count{0};

void on_sigprof(int, siginfo_t*, void*) {
  const int i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  Sample& s = g_samples[i];
  s.tid = static_cast<int>(syscall(SYS_gettid));
  s.depth = backtrace(s.pc, kDepth);
}

__attribute__((constructor)) void start() {
  if (std::getenv("SAMPLER_OUT") == nullptr) return;
  g_samples = static_cast<Sample*>(std::calloc(kMaxSamples, sizeof(Sample)));
  if (g_samples == nullptr) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  itimerval every{{0, 100}, {0, 100}};
  setitimer(ITIMER_PROF, &every, nullptr);
}

__attribute__((destructor)) void stop() {
  const char* out = std::getenv("SAMPLER_OUT");
  if (out == nullptr || g_samples == nullptr) return;
  itimerval off{};
  setitimer(ITIMER_PROF, &off, nullptr);
  char path[4096];
  std::snprintf(path, sizeof path, "%s.%d", out, static_cast<int>(getpid()));
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  const int n = std::min(g_count.load(), kMaxSamples);
  for (int i = 0; i < n; ++i) {
    std::fprintf(f, "S %d", g_samples[i].tid);
    for (int j = 0; j < g_samples[i].depth; ++j) std::fprintf(f, " %p", g_samples[i].pc[j]);
    std::fputc('\n', f);
  }
  if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, maps) != nullptr) std::fprintf(f, "M %s", line);
    std::fclose(maps);
  }
  std::fclose(f);
}

}  // namespace
