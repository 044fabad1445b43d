// tributary-bench results and how they are written: nccl-tests-style tables, JSON, CSV, a plot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_options.h"

namespace tributary::bench {

// One message size of one backend; index 0 is out-of-place, 1 is in-place.
struct Row {
  uint64_t bytes = 0;
  int64_t count = 0;
  int iters = 0;
  double time_us[2] = {0, 0};
  double algbw[2] = {0, 0};  // GB/s, GB = 1e9
  double busbw[2] = {0, 0};
  int64_t wrong[2] = {-1, -1};  // -1: not checked
};

struct BackendResult {
  std::string requested;  // as given on the command line
  std::string spec;       // resolved, every option
  std::string skipped;    // why it did not run, or empty
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
  int cores = 0;
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

std::string format_header(const Report& r);
std::string format_table(const Report& r, const BackendResult& b);
std::string format_summary(const Report& r);
Status write_json(const Report& r, const std::string& path);
Status write_csv(const Report& r, const std::string& path);
// Draws busbw against size with gnuplot (one line per backend, log x, the ceiling if measured).
Status write_plot(const Report& r, const std::string& path);

}  // namespace tributary::bench
