// The measuring loop tributary-bench and tributary-tune share: one process, or one rank of several,
// all-reduces every line (backends and references, lines.h) at every size, for every dtype and op
// asked for (dtypes outer, then ops, then sizes, lines inner), and fills a Report with the figures
// of the ranks combined as -a says (nccl-tests' conventions).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_options.h"
#include "bench/report.h"
#include "tributary/tributary.h"

namespace tributary::bench {

class Runner {
 public:
  // The sizes come from bench_sizes(o, dtype) for each dtype; the caller has checked them.
  explicit Runner(const BenchOptions& o);
  ~Runner();
  // Joins the cluster (when launched as a rank), creates the lines and the buffers; fills the
  // report's layout and one (empty, or skipped with its reason) result per line.
  Status setup(Report* report);
  // One pass over every size and line, appending a row to each line's result.
  Status run(Report* report);
  // After setup: the context the lines were created from.
  const BackendContext& context() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// True when this process is one rank of a multi-process run (launcher or cluster variables).
bool launched_as_rank();
// True unless this process is a rank other than 0 of a multi-process run.
bool first_rank();
// Runs `tool` (this executable) again as `np` ranks under tributary-run, found next to it; returns
// only on failure, with the exit code after printing why.
int relaunch(const char* tool, int np, const std::string& bind_to, int argc, char** argv);
namespace internal {
// One outcome for all ranks: this rank publishes `mine` under prefix + rank (empty when OK, else
// its message) and, when it succeeded, reads every other rank's (waiting up to the store's
// timeout); the result is `mine` when it failed, else the first failure of another rank in rank
// order, named ("rank 2: ..."), else OK. The benchmark's reference lines use it so that a line set
// up on some ranks only (a rendezvous that failed on one) is skipped everywhere rather than waited
// for at every call until the timeout.
Status outcome_everywhere(Store& store, const std::string& prefix, int rank, int world_size,
                          const Status& mine);
}  // namespace internal

// Prints "<tool>: message" on stderr and returns `code`.
int fail(const char* tool, const std::string& message, int code);

}  // namespace tributary::bench
