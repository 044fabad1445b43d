// tributary-bench and tributary-tune: the command line (CLI11) and the parsed run description.
//
// The flags are nccl-tests' where nccl-tests has one, with nccl-tests' meaning (-b -e -f -i -n -w
// -m -c -d -o -r -a -z -T -J -t -g), so that its users' habits and scripts carry over; tributary's
// own settings have long names (--backend, --reference, --replicas, --time-per-size, --np, ...).
// How nccl-tests' process/thread/GPU model maps onto replicas: every rank nccl-tests would run
// inside one process is one local replica here, so a process has -t x -g replicas (-t threads,
// each driving -g GPUs), CPU replicas when -g is not given.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tributary/tributary.h"

namespace tributary::bench {

// How the ranks' times combine into the reported one (nccl-tests' -a).
enum class AverageMode { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

struct BenchOptions {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64ull << 20;
  double step_factor = 2;  // > 1: multiply; 1: add step_bytes (nccl-tests' -f / -i)
  uint64_t step_bytes = 1 << 20;
  std::vector<uint64_t> sizes;  // explicit --sizes overrides the sweep
  int iters = 20;
  int warmup_iters = 5;
  // After -w's iterations, more until the warm-up has lasted this long (agreed across ranks); 0:
  // -w alone, as nccl-tests.
  double warmup_seconds = 0.005;
  int agg_iters = 1;          // -m: all-reduces per timed iteration
  double target_seconds = 0;  // > 0: size the iteration count per size to about this long
  // --repeat: rounds per size, the lines in a rotated order each round; the median time is
  // reported (tributary-bench only).
  int repeat = 1;
  std::vector<DType> dtypes = {DType::kFloat32};  // -d, in order; "all" is every dtype
  std::vector<ReduceOp> ops = {ReduceOp::kSum};   // -o, in order; "all" is every op
  std::vector<std::string> backends;              // specs, in the order given
  std::vector<std::string> references;  // reference lines (lines.h); empty: the default set
                                        // when no backend is named either
  int replicas = 2;                     // local replicas per process (= threads x GPUs with -t/-g)
  int threads = 1;  // -t, as nccl-tests' threads per process (each one replica, or -g GPUs)
  int gpus = 0;     // -g N: N GPU replicas per thread (GPU:0..) instead of CPU ones
  int np = 1;
  std::string bind_to = "none";  // --bind-to, passed to tributary-run with --np (none or core)
  int check = 1;  // -c: checked all-reduces per size and placement; 0 = no check
  int root = 0;   // -r: accepted as nccl-tests does; all_reduce has none (-1 in the table)
  bool root_given = false;
  AverageMode average = AverageMode::kMax;  // -a; nccl-tests defaults to 1 (mean)
  bool blocking = false;                    // -z: wait for each all-reduce (GPU lines)
  // -R 1: register each backend line's output buffers first; -R 2: and allocate the CPU buffers
  // shareable (Buffer::allocate_shareable).
  int local_register = 0;
  std::chrono::milliseconds timeout{0};     // -T: 0 = the backends' own (TRIBUTARY_TIMEOUT)
  bool quiet = false;
  bool ceiling = false;
  bool in_place_only = false;  // tributary-tune: the out-of-place columns stay empty
  double min_busbw = 0;        // GB/s; 0 = no gate
  std::string json_path, csv_path, plot_path;

  // tributary-tune's own.
  std::string tune_out = "tributary-tuning.json";
  std::vector<std::string> tune_candidates;
  int tune_passes = 2;
};

enum class Tool { kBench, kTune };

// Parses argv for `tool`. An error is InvalidArgument with a one-line message that names the flag
// (an unknown flag, a bad value, an nccl-tests flag with no meaning here and why). When -h/--help
// is given, `help` receives the text and the returned options are the defaults.
StatusOr<BenchOptions> parse_command_line(Tool tool, int argc, char** argv, std::string* help);

// The sizes to measure for `dtype` (bytes, each a multiple of the dtype size, ascending, no
// duplicates).
StatusOr<std::vector<uint64_t>> bench_sizes(const BenchOptions& o, DType dtype);
inline StatusOr<std::vector<uint64_t>> bench_sizes(const BenchOptions& o) {
  return bench_sizes(o, o.dtypes.front());
}

}  // namespace tributary::bench
