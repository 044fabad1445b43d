// Measured selection: a tuning file maps all-reduce message sizes to the backend spec that was
// fastest for them on this cluster layout, and `auto` follows it.
//
// `tributary-tune` writes the file: it measures every candidate spec over a size sweep in one run
// (interleaved, as tributary-bench does), keeps each size's fastest, and merges neighbouring sizes
// with the same winner into ranges. As NCCL's tuner plugins, UCC's score maps and Open MPI's rules
// files do, the file states the figures behind each choice (the winner's time and the runner-up's).
//
//   {
//     "tributary_tuning": 1,                      format version
//     "library_version": "0.1.0",                 the library that measured it
//     "layout": {"processes": 2, "local_replicas": 1, "processes_per_host": 2, "device": "CPU"},
//     "dtype": "float32", "op": "sum", "host": "node7", "created": "2026-11-24T12:00:00Z",
//     "rules": [                                  ascending; the last has max_bytes null (the rest)
//       {"max_bytes": 49152, "spec": "ring:algorithm=recursive_doubling", "time_us": 9.8,
//        "runner_up": "ring", "runner_up_time_us": 12.1, "measured_bytes": [4096, 32768]},
//       {"max_bytes": null, "spec": "ring", ...}],
//     "measurements": [{"bytes": 4096, "time_us": {"ring": 12.1, ...}}, ...]
//   }
//
// How `auto` uses it (BackendRegistry::create):
//  - The file comes from `auto:tuning_file=PATH`, else TRIBUTARY_TUNING_FILE (environment, or
//    "tuning_file" in the config file). `auto:tuning_file=none` ignores any file.
//  - A file that cannot be read or parsed, or whose rules name an unknown backend, is an error.
//  - A file for another layout or library version: named explicitly in the spec, an error; from the
//    environment or config file, a warning, and `auto` falls back to its cost model (a job-wide
//    variable must not break a job of another shape).
//  - One spec for every size: `auto` creates that backend. Several: a `tuned` backend that holds
//    one instance of each and dispatches every collective by the bytes of one replica's input
//    (rules are measured on all-reduce; the other collectives follow the same size ranges).
//    Sizes are bytes: a file measured with one dtype and op (the "dtype" and "op" it records;
//    tributary-tune's -d and -o, float32 sum by default) serves every dtype and op, as NCCL's tuner
//    plugins are asked by collective and bytes alone. Where a trainer's gradients are of another
//    type (float16, say), measure with that one: the reduction's cost per byte differs.
//    Every rank must make the same choice: across processes, `auto` first compares through the
//    store what each rank follows (the rules' digest, or the cost model's pick), before any
//    backend connects, and a difference is an error on every rank naming both sides.
//  - At log level info, `auto` says what it follows: the file and its rules, or its cost model.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

struct TuningLayout {
  int processes = 1;
  int local_replicas = 1;
  int processes_per_host = 0;  // 0: unknown (no cluster spec says)
  std::string device = "CPU";  // the local replicas' device type

  bool operator==(const TuningLayout&) const = default;
  std::string to_string() const;  // "2 process(es) (2 per host) x 1 CPU replica(s)"
};

// The layout a backend created from `context` serves.
TuningLayout tuning_layout_of(const BackendContext& context);

struct TuningRule {
  static constexpr uint64_t kRest = std::numeric_limits<uint64_t>::max();
  uint64_t max_bytes = kRest;  // this rule serves messages of at most this many bytes
  std::string spec;
  double time_us = 0;  // the winner's time at the sizes measured in range
  std::string runner_up;
  double runner_up_time_us = 0;
  std::vector<uint64_t> measured_bytes;
};

struct TuningMeasurement {
  uint64_t bytes = 0;
  std::vector<std::pair<std::string, double>> time_us;  // spec -> in-place time, as measured
  // spec -> the slowest of tributary-tune's passes (time_us holds the fastest); empty when only
  // one pass was made. A lead smaller than the leader's own pass-to-pass spread is noise.
  std::vector<std::pair<std::string, double>> worst_us;
};

struct TuningTable {
  std::string library_version;
  TuningLayout layout;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::string host, created;
  std::vector<TuningRule> rules;  // ascending max_bytes, the last kRest
  std::vector<TuningMeasurement> measurements;
  std::string source;  // the file it was loaded from (load()), for messages; not written

  // From measurements: per size, the fastest spec, where specs within 5% of it (or within the
  // fastest's own spread between passes, when the measurement has worst_us) count as tied and
  // ties go to `preferred` (the cost model's own choice, so that the file departs from it only for
  // a real gain), then to the current range's spec; neighbouring sizes with one spec merge into a
  // range, and boundaries between two measured sizes lie at their geometric mean. Fails when no
  // size has a figure.
  static StatusOr<TuningTable> from_measurements(TuningLayout layout, DType dtype, ReduceOp op,
                                                 std::vector<TuningMeasurement> measurements,
                                                 const std::string& preferred = "");
  static StatusOr<TuningTable> parse(std::string_view json, std::string_view origin);
  static StatusOr<TuningTable> load(const std::string& path);
  std::string to_json() const;
  Status save(const std::string& path) const;

  const TuningRule& rule_for(uint64_t bytes) const;
  // The distinct specs, in the order of their first rule.
  std::vector<std::string> specs() const;
  // Why this table does not serve `layout` with this library, or OK.
  Status check_applies(const TuningLayout& layout) const;
  // "<= 48 KiB: ring:algorithm=recursive_doubling; rest: ring".
  std::string summary() const;
  // A digest of the rules (what selection depends on), equal on ranks that read the same rules.
  uint64_t digest() const;
};

namespace internal {
// The `tuned` backend over `members` (one per distinct spec of `table`, in table.specs() order,
// created from `context`).
StatusOr<std::unique_ptr<CrossDeviceOps>> make_tuned_ops(
    const BackendContext& context, TuningTable table, std::string origin,
    std::vector<std::unique_ptr<CrossDeviceOps>> members);
}  // namespace internal

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
