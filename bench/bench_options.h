// tributary-bench: command-line options and the parsed run description.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tributary/tributary.h"

namespace tributary::bench {

struct BenchOptions {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64ull << 20;
  double step_factor = 2;
  std::vector<uint64_t> sizes;  // explicit --sizes overrides the sweep
  int iters = 20;
  int warmup_iters = 5;
  double target_seconds = 0;  // > 0: size the iteration count per size to about this long
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<std::string> backends;    // specs, in the order given
  std::vector<std::string> references;  // reference lines (lines.h); empty: the default set
                                        // when no backend is named either
  int replicas = 2;
  int gpus = 0;  // -g N: N GPU replicas per process (GPU:0..N-1) instead of CPU ones
  int np = 1;
  bool check = true;
  bool quiet = false;
  bool ceiling = false;
  bool in_place_only = false;  // tributary-tune: the out-of-place columns stay empty
  double min_busbw = 0;  // GB/s; 0 = no gate
  std::string json_path, csv_path, plot_path;
};

// Parses argv; on error returns InvalidArgument with a one-line message. `help` is set for -h.
StatusOr<BenchOptions> parse_bench_options(int argc, char** argv, bool* help);
std::string bench_usage();

// The sizes to measure (bytes, each a multiple of the dtype size, ascending, no duplicates).
StatusOr<std::vector<uint64_t>> bench_sizes(const BenchOptions& o);

}  // namespace tributary::bench
