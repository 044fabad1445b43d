#include "bench/report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/cpus.h"

namespace tributary::bench {
namespace {

std::string fmt_num(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string wrong_text(int64_t w) { return w < 0 ? "N/A" : std::to_string(w); }

// A gnuplot double-quoted string.
std::string gp_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

}  // namespace

double bus_factor(int n) { return n <= 1 ? 0.0 : 2.0 * (n - 1) / n; }

double BackendResult::avg_busbw() const {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const Row& r : rows) sum += r.busbw[0] + r.busbw[1];
  return sum / (2.0 * static_cast<double>(rows.size()));
}

int64_t BackendResult::total_wrong() const {
  int64_t w = 0;
  for (const Row& r : rows) {
    for (int k = 0; k < 2; ++k) w += r.wrong[k] > 0 ? r.wrong[k] : 0;
  }
  return w;
}

Machine Machine::probe() {
  Machine m;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) m.host = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  m.cores = internal::usable_cpus();
  m.online = internal::online_cpus();
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) m.memory_gib = static_cast<double>(pages) * page / (1 << 30);
  return m;
}

namespace {

// "float32" or "float32,float64,..." (the -d list); the same for ops.
std::string dtype_list(const BenchOptions& o) {
  std::string s;
  for (DType d : o.dtypes) s += (s.empty() ? "" : ",") + std::string(dtype_name(d));
  return s;
}
std::string op_list(const BenchOptions& o) {
  std::string s;
  for (ReduceOp op : o.ops) s += (s.empty() ? "" : ",") + std::string(reduce_op_name(op));
  return s;
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/bin:/bin";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";
    if (access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return false;
}

std::string time_text(double us) {
  // nccl-tests' width; fewer decimals once the figure is large, so that the columns stay aligned.
  return fmt_num(us >= 1e5 ? "%7.0f" : us >= 1e4 ? "%7.1f" : "%7.2f", us);
}

}  // namespace

Status check_output_path(std::string_view flag, const std::string& path) {
  if (path.empty()) return Status();
  const std::string what = std::string(flag) + " file '" + path + "'";
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalid_argument("cannot write " + what + ": it is a folder");
    if (access(path.c_str(), W_OK) != 0) {
      return invalid_argument("cannot write " + what + ": " + std::strerror(errno));
    }
    return Status();
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return invalid_argument("cannot write " + what + ": the folder '" + dir +
                            "' does not exist; create it first (nothing was measured)");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument("cannot write " + what + ": the folder '" + dir +
                            "' is not writable (" + std::strerror(errno) + ")");
  }
  return Status();
}

Status check_output_paths(const BenchOptions& o) {
  TRIBUTARY_RETURN_IF_ERROR(check_output_path("-J/--json", o.json_path));
  TRIBUTARY_RETURN_IF_ERROR(check_output_path("--csv", o.csv_path));
  TRIBUTARY_RETURN_IF_ERROR(check_output_path("--plot", o.plot_path));
  if (!o.plot_path.empty() && !on_path("gnuplot")) {
    return invalid_argument(
        "--plot needs gnuplot, which is not on the PATH (Debian: gnuplot-nox); "
        "nothing was measured");
  }
  return Status();
}

std::string format_header(const Report& r) {
  const BenchOptions& o = r.options;
  std::string s = "# tributary-bench " + std::string(version()) + ": all_reduce " + dtype_list(o) +
                  " " + op_list(o) + ", " + std::to_string(r.processes) + " process(es) x " +
                  std::to_string(o.replicas) + " replica(s), ";
  s += o.target_seconds > 0 ? "~" + fmt_num("%g", o.target_seconds * 1e3) + " ms per size"
                            : std::to_string(o.iters) + " iters";
  if (o.repeat > 1) {
    s += (o.target_seconds > 0 ? " over " : " in each of ") + std::to_string(o.repeat) +
         " rounds (lines rotated; median shown)";
  }
  s += ", " + std::to_string(o.warmup_iters) + " warmup" +
       (o.warmup_iters > 0 && o.warmup_seconds > 0
            ? " (at least " + fmt_num("%g", o.warmup_seconds * 1e3) + " ms)"
            : std::string()) +
       ", check " +
       (o.check > 0 ? std::to_string(o.check) : std::string("off")) + ", time: " +
       (o.average == AverageMode::kRank0  ? "rank 0's"
        : o.average == AverageMode::kMean ? "the ranks' mean"
        : o.average == AverageMode::kMin  ? "the fastest rank's"
                                          : "the slowest rank's") +
       (o.local_register == 1   ? ", buffers registered (-R 1)"
        : o.local_register == 2 ? ", buffers shareable and registered (-R 2)"
                                : "") +
       "\n";
  // nccl-tests' parameter line, for scripts that read it.
  s += "# nThread " + std::to_string(o.threads) + " nGpus " + std::to_string(o.gpus) +
       " minBytes " + std::to_string(o.min_bytes) + " maxBytes " + std::to_string(o.max_bytes) +
       " step: " +
       (o.step_factor > 1 ? fmt_num("%g", o.step_factor) + "(factor)"
                          : std::to_string(o.step_bytes) + "(bytes)") +
       " warmup iters: " + std::to_string(o.warmup_iters) + " iters: " + std::to_string(o.iters) +
       " agg iters: " + std::to_string(o.agg_iters) + " validation: " + std::to_string(o.check) +
       " graph: 0\n";
  if (o.root_given) {
    s += "# -r/--root: all_reduce has no root; the root column shows -1, as nccl-tests' "
         "all_reduce_perf prints it (replicas per process are -t/--replicas)\n";
  }
  s += "# host " + r.machine.host + ": " + r.machine.cpu + ", " + std::to_string(r.machine.cores) +
       " cores" +
       (r.machine.online > r.machine.cores
            ? " (of " + std::to_string(r.machine.online) + " online: this process's affinity)"
            : std::string()) +
       ", " + fmt_num("%.0f", r.machine.memory_gib) + " GiB\n";
  const int n = r.processes * o.replicas;
  if (o.gpus > 0 && r.ceiling.memcpy_gbps > 0) {
    if (r.ceiling.device_error.empty()) {
      s += "# ceiling: GPU:0 copies " + fmt_num("%.1f", r.ceiling.device_copy_gbps) +
           " GB/s device to device (bytes read + written); pinned host to device " +
           fmt_num("%.1f", r.ceiling.to_device_gbps) + " GB/s, device to host " +
           fmt_num("%.1f", r.ceiling.to_host_gbps) +
           " GB/s (what a host backend's staging copies move)\n";
    } else {
      s += "# ceiling: the GPU was not measured: " + r.ceiling.device_error + "\n";
    }
    s += "# ceiling: host memcpy " + fmt_num("%.2f", r.ceiling.memcpy_gbps) + " GB/s on " +
         std::to_string(r.ceiling.cores) + " cores\n";
  } else if (r.ceiling.tcp_gbps > 0) {
    s += "# ceiling: loopback TCP " + fmt_num("%.2f", r.ceiling.tcp_gbps) +
         " GB/s each way with traffic both ways; an all-reduce sends and receives 2(n-1)/n of the "
         "message through each rank's link, so busbw <= " +
         fmt_num("%.2f", r.ceiling.busbw) + " GB/s over the network (intra_host=net, tcp)\n";
    s += "# ceiling: memcpy " + fmt_num("%.2f", r.ceiling.memcpy_gbps) + " GB/s on " +
         std::to_string(r.ceiling.cores) + " cores (" +
         fmt_num("%.2f", r.ceiling.memcpy_one_core_gbps) +
         " GB/s on one, on buffers beyond the caches); ranks on one host exchanging through "
         "shared memory (ring's and ucx's default there) read and write every byte once, so at "
         "the better of the two busbw <= " +
         fmt_num("%.2f", r.ceiling.shm_busbw) +
         " GB/s for messages beyond the caches (smaller ones may go past it)\n";
  } else if (r.ceiling.memcpy_gbps > 0) {
    s += "# ceiling: memcpy " + fmt_num("%.2f", r.ceiling.memcpy_gbps) + " GB/s on " +
         std::to_string(r.ceiling.cores) + " cores (" +
         fmt_num("%.2f", r.ceiling.memcpy_one_core_gbps) +
         " GB/s on one; bytes read + written, on buffers beyond the caches); an in-process "
         "all-reduce over " +
         std::to_string(n) +
         " replicas reads and writes every byte once, so at the better of the two algbw <= " +
         fmt_num("%.2f", r.ceiling.algbw) + " GB/s, busbw <= " + fmt_num("%.2f", r.ceiling.busbw) +
         " GB/s for messages beyond the caches (smaller ones may go past it)\n";
  }
  return s;
}

std::string format_table(const Report& r, const BackendResult& b) {
  std::string s = std::string("#\n# ") + (b.reference ? "reference: " : "backend: ") + b.spec +
                  "  (" + std::to_string(b.processes) + " process(es) x " +
                  std::to_string(b.replicas) + " replica(s) = " + std::to_string(b.in_sync()) +
                  " in sync)\n";
  if (!b.skipped.empty()) return s + "# skipped: " + b.skipped + "\n";
  for (const std::string& note : b.notes) s += "# skipped " + note + "\n";
  char line[256];
  std::snprintf(line, sizeof line,
                "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
                "in-place\n",
                "", "", "", "", "");
  s += line;
  std::snprintf(line, sizeof line,
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
  s += line;
  std::snprintf(line, sizeof line,
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  s += line;
  const bool out_of_place = !r.options.in_place_only;
  for (const Row& row : b.rows) {
    std::snprintf(line, sizeof line, "%12llu  %12lld  %8s  %6s  %6d",
                  static_cast<unsigned long long>(row.bytes), static_cast<long long>(row.count),
                  std::string(dtype_name(row.dtype)).c_str(),
                  std::string(reduce_op_name(row.op)).c_str(), -1);
    s += line;
    for (int k = out_of_place ? 0 : 1; k < 2; ++k) {
      std::snprintf(line, sizeof line, "  %7s  %6.2f  %6.2f  %5s",
                    time_text(row.time_us[k]).c_str(), row.algbw[k], row.busbw[k],
                    wrong_text(row.wrong[k]).c_str());
      s += line;
    }
    s += "\n";
  }
  const int64_t wrong = b.total_wrong();
  s += "# Out of bounds values : " + std::to_string(wrong) + (wrong > 0 ? " FAILED" : " OK") + "\n";
  s += "# Avg bus bandwidth    : " + fmt_num("%g", b.avg_busbw()) + "\n";
  return s;
}

std::string format_summary(const Report& r) {
  std::string s =
      "#\n# Summary (average busbw in GB/s over all sizes, out-of-place and in-place):\n";
  for (const BackendResult& b : r.results) {
    if (!b.skipped.empty()) {
      s += "#   " + b.spec + ": skipped (" + b.skipped + ")\n";
    } else {
      s += "#   " + fmt_num("%8.3f", b.avg_busbw()) + "  " + b.spec + "\n";
    }
  }
  return s;
}

Status write_json(const Report& r, const std::string& path) {
  using nlohmann::json;
  json doc;
  doc["tool"] = "tributary-bench";
  doc["version"] = std::string(version());
  doc["collective"] = "all_reduce";
  doc["dtype"] = dtype_list(r.options);  // one name, or the -d list (each row names its own)
  doc["op"] = op_list(r.options);
  doc["options"] = {{"nthreads", r.options.threads},
                    {"ngpus", r.options.gpus},
                    {"replicas", r.options.replicas},
                    {"iters", r.options.iters},
                    {"repeat", r.options.repeat},
                    {"warmup_iters", r.options.warmup_iters},
                    {"warmup_seconds", r.options.warmup_seconds},
                    {"agg_iters", r.options.agg_iters},
                    {"check", r.options.check},
                    {"average", static_cast<int>(r.options.average)},
                    {"local_register", r.options.local_register},
                    {"root", -1}};
  doc["machine"] = {{"host", r.machine.host},
                    {"cpu", r.machine.cpu},
                    {"cores", r.machine.cores},
                    {"memory_gib", r.machine.memory_gib}};
  if (r.ceiling.memcpy_gbps > 0) {
    doc["ceiling"] = {{"memcpy_gbps", r.ceiling.memcpy_gbps},
                      {"memcpy_one_core_gbps", r.ceiling.memcpy_one_core_gbps},
                      {"cores", r.ceiling.cores},
                      {"loopback_tcp_gbps", r.ceiling.tcp_gbps},
                      {"allreduce_algbw_gbps", r.ceiling.algbw},
                      {"allreduce_busbw_gbps", r.ceiling.busbw},
                      {"shm_allreduce_algbw_gbps", r.ceiling.shm_algbw},
                      {"shm_allreduce_busbw_gbps", r.ceiling.shm_busbw}};
    if (r.options.gpus > 0) {
      doc["ceiling"]["device_copy_gbps"] = r.ceiling.device_copy_gbps;
      doc["ceiling"]["pinned_to_device_gbps"] = r.ceiling.to_device_gbps;
      doc["ceiling"]["pinned_to_host_gbps"] = r.ceiling.to_host_gbps;
      if (!r.ceiling.device_error.empty()) doc["ceiling"]["device_error"] = r.ceiling.device_error;
    }
  }
  json backends = json::array();
  for (const BackendResult& b : r.results) {
    json jb = {{"requested", b.requested}, {"kind", b.reference ? "reference" : "backend"},
               {"spec", b.spec},           {"processes", b.processes},
               {"replicas", b.replicas},   {"in_sync", b.in_sync()},
               {"skipped", b.skipped},     {"avg_busbw_gbps", b.avg_busbw()},
               {"notes", b.notes}};
    json rows = json::array();
    for (const Row& row : b.rows) {
      for (int k = 0; k < 2; ++k) {
        if (k == 0 && r.options.in_place_only) continue;
        rows.push_back({{"dtype", std::string(dtype_name(row.dtype))},
                        {"op", std::string(reduce_op_name(row.op))},
                        {"root", -1},
                        {"bytes", row.bytes},
                        {"count", row.count},
                        {"in_place", k == 1},
                        {"iters", row.iters},
                        {"time_us", row.time_us[k]},
                        {"algbw_gbps", row.algbw[k]},
                        {"busbw_gbps", row.busbw[k]},
                        {"wrong", row.wrong[k]}});
        if (!row.rounds_us[k].empty()) rows.back()["time_us_rounds"] = row.rounds_us[k];
      }
    }
    jb["rows"] = std::move(rows);
    backends.push_back(std::move(jb));
  }
  doc["backends"] = std::move(backends);
  std::ofstream out(path);
  if (!out) return unavailable("cannot write --json file '" + path + "'");
  out << doc.dump(2) << "\n";
  return out ? Status() : unavailable("writing '" + path + "' failed");
}

Status write_csv(const Report& r, const std::string& path) {
  std::ofstream out(path);
  if (!out) return unavailable("cannot write --csv file '" + path + "'");
  out << "backend,processes,replicas,dtype,op,bytes,count,in_place,iters,time_us,algbw_gbps,"
         "busbw_gbps,wrong,version,host\n";
  for (const BackendResult& b : r.results) {
    for (const Row& row : b.rows) {
      for (int k = 0; k < 2; ++k) {
        out << '"' << b.spec << "\"," << b.processes << ',' << b.replicas << ','
            << dtype_name(row.dtype) << ',' << reduce_op_name(row.op) << ',' << row.bytes << ','
            << row.count << ',' << (k == 1 ? "true" : "false") << ',' << row.iters << ','
            << row.time_us[k] << ',' << row.algbw[k] << ',' << row.busbw[k] << ',' << row.wrong[k]
            << ',' << version() << ',' << r.machine.host << "\n";
      }
    }
  }
  return out ? Status() : unavailable("writing '" + path + "' failed");
}

Status write_plot(const Report& r, const std::string& path) {
  std::string data_path = path + ".dat";
  std::ofstream data(data_path);
  if (!data) return unavailable("cannot write '" + data_path + "'");
  // With -d/-o lists, the first pair only: one line per backend stays readable.
  const DType dtype = r.options.dtypes.front();
  const ReduceOp op = r.options.ops.front();
  std::vector<const BackendResult*> drawn;
  for (const BackendResult& b : r.results) {
    if (!b.skipped.empty()) continue;
    bool any = false;
    for (const Row& row : b.rows) {
      if (row.dtype != dtype || row.op != op) continue;
      data << row.bytes << ' ' << row.busbw[0] << ' ' << row.busbw[1] << "\n";
      any = true;
    }
    if (!any) continue;
    data << "\n\n";  // gnuplot data blocks, one per backend
    drawn.push_back(&b);
  }
  data.close();
  if (drawn.empty()) return failed_precondition("no backend produced figures to plot");
  std::ostringstream g;
  g << "set terminal pngcairo size 1100,650 font ',10'\n"
    << "set output " << gp_quote(path) << "\n"
    << "set title 'tributary-bench all_reduce " << dtype_name(dtype) << " " << reduce_op_name(op)
    << ", " << r.processes << " process(es) x " << r.options.replicas << " replicas, "
    << r.machine.host << "' noenhanced\n"
    << "set xlabel 'message size (bytes)'\nset ylabel 'bus bandwidth, "
    << (r.options.in_place_only ? "in-place" : "out-of-place") << " (GB/s)'\n"
    << "set logscale x 2\nset format x '%.0b%B'\nset grid\nset key left top noenhanced\n"
    << "set yrange [0:*]\n";
  if (r.ceiling.memcpy_gbps > 0) {
    g << "set arrow from graph 0, first " << r.ceiling.busbw << " to graph 1, first "
      << r.ceiling.busbw << " nohead dashtype 2 lc rgb 'gray40'\n"
      << "set label '"
      << (r.ceiling.tcp_gbps > 0 ? "ceiling (loopback TCP)"
                                 : "ceiling beyond the caches (memcpy bound)")
      << " " << fmt_num("%.2f", r.ceiling.busbw) << " GB/s' at graph 0.02, first "
      << r.ceiling.busbw << " offset 0,0.7 tc rgb 'gray40'\n";
    if (r.ceiling.shm_busbw > 0) {
      g << "set arrow from graph 0, first " << r.ceiling.shm_busbw << " to graph 1, first "
        << r.ceiling.shm_busbw << " nohead dashtype 3 lc rgb 'gray40'\n"
        << "set label 'ceiling beyond the caches (one host, shared memory: memcpy bound) "
        << fmt_num("%.2f", r.ceiling.shm_busbw) << " GB/s' at graph 0.02, first "
        << r.ceiling.shm_busbw << " offset 0,0.7 tc rgb 'gray40'\n";
    }
  }
  g << "plot ";
  for (size_t i = 0; i < drawn.size(); ++i) {
    // The spec as the user wrote it: the resolved one (every option) makes a key too wide for
    // gnuplot to draw at all.
    std::string title = drawn[i]->requested.empty() ? drawn[i]->spec : drawn[i]->requested;
    if (drawn[i]->reference) title += " (reference)";
    g << (i ? ", " : "") << gp_quote(data_path) << " index " << i
      << " using 1:2 with linespoints lw 2 title " << gp_quote(title);
  }
  g << "\n";
  std::string script_path = path + ".gp";
  {
    std::ofstream script(script_path);
    script << g.str();
  }
  std::string cmd = "gnuplot " + shell_quote(script_path) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return unavailable("cannot run gnuplot");
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int rc = pclose(p);
  if (rc != 0) {
    return unavailable("gnuplot failed (is it installed? Debian: gnuplot-nox): " + out);
  }
  std::remove(script_path.c_str());
  std::remove(data_path.c_str());
  return Status();
}

}  // namespace tributary::bench
