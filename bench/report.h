// tributary-bench results and how they are written: nccl-tests-style tables, JSON, CSV, a plot.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_options.h"

namespace tributary::bench {

// One message size of one line, for one dtype and op; index 0 is out-of-place, 1 is in-place.
struct Row {
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t bytes = 0;
  int64_t count = 0;
  int iters = 0;
  double time_us[2] = {0, 0};
  double algbw[2] = {0, 0};  // GB/s, GB = 1e9
  double busbw[2] = {0, 0};
  int64_t wrong[2] = {-1, -1};  // -1: not checked
  std::vector<double> rounds_us[2];  // --repeat K > 1: every round's time, in round order
};

struct BackendResult {
  std::string requested;  // as given on the command line
  std::string spec;       // resolved, every option
  std::string skipped;    // why it did not run at all, or empty
  std::vector<std::string>
      notes;               // "<dtype> <op>: why" for each pair it could not run (-d/-o lists)
  bool reference = false;  // a reference line (lines.h), not a tributary backend
  int processes = 1;
  int replicas = 1;  // per process
  std::vector<Row> rows;

  int in_sync() const { return processes * replicas; }
  double avg_busbw() const;  // over every row, both placements
  int64_t total_wrong() const;
};

struct Machine {
  std::string host, cpu;
  int cores = 0;   // the CPUs this process may run on (its affinity, core/cpus.h)
  int online = 0;  // the machine's online CPUs
  double memory_gib = 0;
  static Machine probe();
};

struct Ceiling {
  double memcpy_gbps = 0;           // bytes read + written per second / 1e9, every core copying
  double memcpy_one_core_gbps = 0;  // the same with one thread
  int cores = 0;
  double tcp_gbps = 0;  // loopback TCP, each way with traffic both ways at once (multi-process)
  double algbw = 0;     // the all-reduce bound they imply
  double busbw = 0;
  // Multi-process: the memory bound of ranks on one host exchanging through shared memory (ring's
  // and ucx's default there), beside the loopback TCP bound above (intra_host=net, tcp transports).
  double shm_algbw = 0;
  double shm_busbw = 0;
  // With -g N: GPU:0's device-to-device copy (bytes read + written) and its pinned host copies each
  // way (bench/device_ceiling.h); `device_error` says why they were not measured.
  double device_copy_gbps = 0;
  double to_device_gbps = 0;
  double to_host_gbps = 0;
  std::string device_error;
};

struct Report {
  BenchOptions options;
  int processes = 1;  // ranks in this run
  int rank = 0;       // this process (only rank 0 prints and writes files)
  Machine machine;
  std::vector<BackendResult> results;
  Ceiling ceiling;  // memcpy_gbps == 0 when not measured
};

// busbw = algbw * 2(n-1)/n, as nccl-tests does for all-reduce.
double bus_factor(int n);

// Fails, naming the flag and the path, when an output file (-J/--json, --csv, --plot) could not be
// written: its folder is missing or not writable, or the path is a folder. Run before the sweep, so
// that a typo costs seconds, not the whole run. --plot also needs gnuplot on the PATH.
Status check_output_paths(const BenchOptions& o);
// The same check for one file, named in the error as `flag` (tributary-tune's --out).
Status check_output_path(std::string_view flag, const std::string& path);

// The header: tributary's description of the run, then nccl-tests' parameter line.
std::string format_header(const Report& r);
// One line's section: a '#' comment naming it, nccl-tests' column headings and rows (size count
// type redop root, then time algbw busbw #wrong out of place and in place; root is -1, as
// nccl-tests prints it for all_reduce), "# Out of bounds values : N OK|FAILED" and
// "# Avg bus bandwidth    : X" (GB/s, the number last, so that awk '{print $NF}' reads it).
std::string format_table(const Report& r, const BackendResult& b);
std::string format_summary(const Report& r);
Status write_json(const Report& r, const std::string& path);
Status write_csv(const Report& r, const std::string& path);
// Draws busbw against size with gnuplot (one line per backend, log x, the ceiling if measured).
Status write_plot(const Report& r, const std::string& path);

}  // namespace tributary::bench
