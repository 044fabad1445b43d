// tributary-tune: measures the candidate backend specs for this cluster layout over a size sweep
// and writes the tuning file that `auto` follows (tributary/tuning.h). The measuring is
// tributary-bench's (runner.h): interleaved, checked, the slowest rank's time; in place only, and
// each figure the best of --passes sweeps, so that one noisy moment does not decide a range, and
// the slowest kept beside it: a lead smaller than the leader's own spread between passes is a tie.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_options.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "tributary/tributary.h"

namespace tributary::bench {
namespace {

constexpr const char* kTool = "tributary-tune";

// The default candidates: every backend serving the layout, plus the algorithm variants of the
// one the cost model picks (the choice the file is most likely to refine), plus, where the layout
// is hierarchical (several hosts, several processes on each), the flat `hierarchy=off` variant of
// every backend that has the option (the rule takes the hierarchy; a measurement may not), plus,
// where the ring crosses hosts over TCP, the copying `zero_copy=off` variant of every backend that
// has that option: whether vmsplice beats copying depends on the machine (on loopback it was
// 15-35% faster on one 2-vCPU Intel VM and about 10% slower on a 2-vCPU AMD EPYC one, where the
// spliced link itself was slower than send()), so `auto` (zero-copy from 2 MiB) is a guess that
// the file may correct; plus, where processes share a host, the `shm_single_copy=on` and `=off`
// variants of every backend that has that option: whether reaching the peers' buffers beats the
// slots, and from which size, depends on the machine's caches (`auto` takes every all-reduce over
// 16 KiB, from 256 KiB with more processes than the CPUs they may run on, as measured on one
// 2-vCPU Intel VM). Not ring's algorithm variants when every process is on this host: ring then
// moves everything through shared memory, and `algorithm` (the TCP algorithm) changes nothing, so
// its variants would differ only by noise and split the file into ranges for nothing; `note` says
// so. `launched_here`: this
// tool started every rank itself (--np), so all are on this host.
std::vector<std::string> default_candidates(const BackendContext& ctx, bool launched_here,
                                            std::string* note) {
  BackendRegistry registry = builtin_backends();
  std::vector<std::string> out;
  auto chosen = registry.choose_auto(ctx);
  const bool one_host =
      ctx.world_size > 1 &&
      (launched_here || tuning_layout_of(ctx).processes_per_host == ctx.world_size);
  const int per_host = tuning_layout_of(ctx).processes_per_host;
  const bool hierarchical = !launched_here && per_host > 1 && per_host < ctx.world_size;
  for (const BackendInfo& b : registry.backends()) {
    if (b.capabilities.multi_process != (ctx.world_size > 1)) continue;
    out.push_back(b.name);
    const auto options = registry.options_of(b);
    auto has = [&](std::string_view name) {
      return std::any_of(options.begin(), options.end(),
                         [&](const OptionDef& d) { return d.name == name; });
    };
    if (hierarchical && has("hierarchy")) out.push_back(b.name + ":hierarchy=off");
    if (!one_host && has("zero_copy")) out.push_back(b.name + ":zero_copy=off");
    if ((one_host || per_host > 1) && has("shm_single_copy")) {
      out.push_back(b.name + ":shm_single_copy=on");
      out.push_back(b.name + ":shm_single_copy=off");
    }
    if (!chosen.ok() || *chosen != b.name) continue;
    if (b.name == "ring" && one_host) {
      *note = "ring's algorithm variants left out: every process is on this host, where ring uses "
              "shared memory and algorithm= (TCP) does not apply (name them with --candidate to "
              "measure them anyway)";
      continue;
    }
    for (const OptionDef& d : registry.options_of(b)) {
      if (d.name != "algorithm") continue;
      for (const std::string& choice : d.choices) {
        if (choice != "auto") out.push_back(b.name + ":algorithm=" + choice);
      }
    }
  }
  return out;
}

int run(int argc, char** argv) {
  std::string help;
  auto parsed = parse_command_line(Tool::kTune, argc, argv, &help);
  if (!parsed.ok()) return fail(kTool, parsed.status().message(), 2);
  if (!help.empty()) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  BenchOptions o = *parsed;
  const std::string& out_path = o.tune_out;
  const int passes = o.tune_passes;
  std::vector<std::string> candidates = o.tune_candidates;
  std::string candidates_note;
  o.in_place_only = true;
  o.references = {"none"};
  for (const std::string& c : candidates) {
    auto spec = BackendSpec::parse(c);
    if (!spec.ok()) return fail(kTool, spec.status().message(), 2);
    if (spec->name == "auto") {
      return fail(kTool, "'auto' is what the file tunes; name backends as candidates", 2);
    }
  }
  // A candidate named twice is measured once (else it would be its own runner-up).
  {
    std::vector<std::string> once;
    for (const std::string& c : candidates) {
      if (std::find(once.begin(), once.end(), c) == once.end()) once.push_back(c);
    }
    if (once.size() != candidates.size()) {
      candidates_note = "a candidate named more than once is measured once";
      candidates = std::move(once);
    }
  }
  if (out_path.empty()) return fail(kTool, "--out needs a file name (the tuning file to write)", 2);
  auto sizes = bench_sizes(o);
  if (!sizes.ok()) return fail(kTool, sizes.status().message(), 2);
  if (first_rank()) {
    if (Status s = check_output_path("--out", out_path); !s.ok())
      return fail(kTool, s.message(), 2);
  }
  if (o.np > 1 && !launched_as_rank()) return relaunch(kTool, o.np, o.bind_to, argc, argv);

  // The default candidates need the layout; a first runner with no lines would join the cluster
  // twice, so ask the cluster spec directly.
  if (candidates.empty()) {
    auto config = Config::load();
    if (!config.ok()) return fail(kTool, config.status().message(), 2);
    BackendContext probe;
    probe.config = *config;
    probe.devices.clear();
    for (int r = 0; r < o.replicas; ++r) probe.devices.push_back(Device::cpu(r));
    if (auto spec = resolve_cluster_spec(*config); spec.ok()) probe.world_size = spec->world_size;
    candidates = default_candidates(probe, o.np > 1, &candidates_note);
  }
  o.backends = candidates;

  Report report;
  report.options = o;
  report.machine = Machine::probe();
  Runner runner(o);
  if (Status s = runner.setup(&report); !s.ok()) return fail(kTool, s.message(), 2);
  const bool leader = report.rank == 0;
  if (leader) {
    std::printf("# tributary-tune %s: %s, %zu candidate(s), %zu size(s), %d pass(es)\n",
                std::string(version()).c_str(),
                tuning_layout_of(runner.context()).to_string().c_str(), candidates.size(),
                sizes->size(), passes);
    std::string list;
    for (const std::string& c : candidates) list += (list.empty() ? "" : ", ") + c;
    std::printf("# candidates: %s\n", list.c_str());
    if (!candidates_note.empty()) std::printf("# %s\n", candidates_note.c_str());
    for (const BackendResult& b : report.results) {
      if (!b.skipped.empty())
        std::printf("# skipping %s: %s\n", b.requested.c_str(), b.skipped.c_str());
    }
    std::fflush(stdout);
  }
  for (int p = 0; p < passes; ++p) {
    if (Status s = runner.run(&report); !s.ok()) {
      return fail(kTool, "rank " + std::to_string(report.rank) + ": " + s.message(), 1);
    }
  }
  int64_t wrong = 0;
  for (const BackendResult& b : report.results) wrong += b.total_wrong();
  if (wrong > 0) {
    return fail(kTool,
                std::to_string(wrong) +
                    " wrong element(s): no tuning file written; run "
                    "tributary-bench with the same candidates to see which",
                1);
  }
  if (!leader) return 0;

  std::vector<TuningMeasurement> measurements;
  for (uint64_t bytes : *sizes) {
    TuningMeasurement m;
    m.bytes = bytes;
    for (const BackendResult& b : report.results) {
      double best = 0, worst = 0;
      int figures = 0;
      for (const Row& row : b.rows) {
        if (row.bytes != bytes || row.time_us[1] <= 0) continue;
        ++figures;
        if (best == 0 || row.time_us[1] < best) best = row.time_us[1];
        worst = std::max(worst, row.time_us[1]);
      }
      if (best > 0) m.time_us.emplace_back(b.requested, best);
      if (figures > 1) m.worst_us.emplace_back(b.requested, worst);
    }
    measurements.push_back(std::move(m));
  }
  // Ties go to what the cost model would pick, when it is a candidate.
  std::string preferred;
  if (auto chosen = builtin_backends().choose_auto(runner.context()); chosen.ok()) {
    if (std::find(candidates.begin(), candidates.end(), *chosen) != candidates.end()) {
      preferred = *chosen;
    }
  }
  auto table = TuningTable::from_measurements(tuning_layout_of(runner.context()), o.dtypes[0],
                                              o.ops[0], std::move(measurements), preferred);
  if (!table.ok()) return fail(kTool, table.status().message(), 1);

  std::printf("#\n# %12s  %-44s %10s  %-30s %10s\n", "size (B)", "fastest", "time (us)",
              "runner-up", "time (us)");
  for (const TuningMeasurement& m : table->measurements) {
    std::vector<std::pair<std::string, double>> sorted = m.time_us;
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    if (sorted.empty()) continue;
    std::printf("  %12llu  %-44s %10.2f  %-30s %10.2f\n", static_cast<unsigned long long>(m.bytes),
                sorted[0].first.c_str(), sorted[0].second,
                sorted.size() > 1 ? sorted[1].first.c_str() : "-",
                sorted.size() > 1 ? sorted[1].second : 0.0);
  }
  if (Status s = table->save(out_path); !s.ok()) return fail(kTool, s.message(), 1);
  std::printf("#\n# rules: %s\n# written to %s; 'auto' follows it with TRIBUTARY_TUNING_FILE=%s\n",
              table->summary().c_str(), out_path.c_str(), out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace tributary::bench

int main(int argc, char** argv) { return tributary::bench::run(argc, argv); }
