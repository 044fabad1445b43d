#include "bench/bench_options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace tributary::bench {
namespace {

Status flag_error(std::string_view flag, std::string_view value, const std::string& why) {
  return invalid_argument("bad value '" + std::string(value) + "' for " + std::string(flag) +
                          ": " + why);
}

StatusOr<int> parse_positive_int(std::string_view flag, std::string_view v, int min) {
  char* end = nullptr;
  std::string s(v);
  long x = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || x < min || x > 1'000'000'000) {
    return flag_error(flag, v, "expected an integer >= " + std::to_string(min));
  }
  return static_cast<int>(x);
}

StatusOr<double> parse_number(std::string_view flag, std::string_view v) {
  char* end = nullptr;
  std::string s(v);
  double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x)) return flag_error(flag, v, "expected a number");
  return x;
}

StatusOr<uint64_t> parse_bytes(std::string_view flag, std::string_view v) {
  auto b = parse_size(v);
  if (!b.ok()) return flag_error(flag, v, b.status().message());
  return *b;
}

}  // namespace

std::string bench_usage() {
  return R"(usage: tributary-bench [options]
Measures all-reduce across replicas with one or more backends, nccl-tests style.

What to measure:
  --backend SPEC          a backend spec; repeat to compare several in one run (interleaved)
                          default: every in-process backend built in; with --np, every
                          multi-process one, and ring:intra_host=net (TCP) beside ring
  --reference SPEC        a line that does the same work without tributary, to measure what a
                          backend costs: yardstick[:threads=N] (one process: a plain threaded
                          sum), gloo[:algorithm=A,mode=M] (processes: Gloo called directly);
                          repeat for several; 'none' for none. Default when no --backend is
                          named: yardstick (one process), gloo (several)
  -r, --replicas N        local replicas per process (CPU devices), default 2
  -g, --gpus N            N GPUs per process as the replicas (GPU:0..N-1), as nccl-tests' -g; the
                          buffers live on the GPUs and the default reference is nccl (direct)
  --np N                  processes (multi-process runs need the multi-worker backends)
  -d, --datatype T        float32 (default), float64, float16, bfloat16, int32, int64, int8, uint8
  -o, --op OP             sum (default), mean, min, max, prod
Sizes:
  -b, --minbytes SIZE     smallest message, default 8 (sizes take K/M/G: 64K, 4M, 1G)
  -e, --maxbytes SIZE     largest message, default 64M
  -f, --stepfactor F      multiply the size by F each step, default 2
  --sizes S1,S2,...       explicit list of sizes instead of the sweep
Iterations:
  -n, --iters N           timed iterations per size, default 20
  -w, --warmup_iters N    untimed iterations first, default 5
  -t, --time-per-size D   instead of -n: about this long per size (e.g. 200ms)
Checking and output:
  -c, --check 0|1         verify every result (default 1); any wrong element fails the run
  --json FILE             every figure, the machine, the specs and the library version
  --csv FILE              the same rows as CSV
  --plot FILE.png         busbw against size, one line per backend (gnuplot)
  --ceiling               measure memcpy bandwidth and print the all-reduce bound it implies
  --min-busbw GB/s        exit non-zero if any backend's average busbw is below this
  -q, --quiet             no progress line on stderr
  -h, --help              this text
)";
}

StatusOr<BenchOptions> parse_bench_options(int argc, char** argv, bool* help) {
  BenchOptions o;
  *help = false;
  bool iters_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string_view inline_value;
    bool has_inline = false;
    if (a.starts_with("--") && a.find('=') != std::string_view::npos) {
      inline_value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_inline = true;
    }
    auto value = [&]() -> StatusOr<std::string_view> {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) return invalid_argument(std::string(a) + " needs a value");
      return std::string_view(argv[++i]);
    };
#define TB_VALUE(var)                      \
  auto var##_or = value();                 \
  if (!var##_or.ok()) return var##_or.status(); \
  std::string_view var = *var##_or
    if (a == "-h" || a == "--help") {
      *help = true;
      return o;
    } else if (a == "--backend") {
      TB_VALUE(v);
      auto spec = BackendSpec::parse(v);
      if (!spec.ok()) return spec.status();
      o.backends.emplace_back(v);
    } else if (a == "--reference") {
      TB_VALUE(v);
      if (v == "none") {
        o.references = {"none"};
        continue;
      }
      auto spec = BackendSpec::parse(v);
      if (!spec.ok()) return spec.status();
      if (spec->name != "yardstick" && spec->name != "gloo" && spec->name != "nccl") {
        return flag_error(a, v,
                          "unknown reference '" + spec->name + "' (yardstick, gloo, nccl, none)");
      }
      std::erase(o.references, "none");
      o.references.emplace_back(v);
    } else if (a == "-r" || a == "--replicas") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.replicas, parse_positive_int(a, v, 1));
    } else if (a == "-g" || a == "--gpus") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.gpus, parse_positive_int(a, v, 1));
      o.replicas = o.gpus;
    } else if (a == "--np") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.np, parse_positive_int(a, v, 1));
    } else if (a == "-d" || a == "--datatype") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.dtype, parse_dtype(v));
    } else if (a == "-o" || a == "--op") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.op, parse_reduce_op(v));
    } else if (a == "-b" || a == "--minbytes") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.min_bytes, parse_bytes(a, v));
    } else if (a == "-e" || a == "--maxbytes") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.max_bytes, parse_bytes(a, v));
    } else if (a == "-f" || a == "--stepfactor") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.step_factor, parse_number(a, v));
      if (o.step_factor <= 1) return flag_error(a, v, "the step factor must be > 1");
    } else if (a == "--sizes") {
      TB_VALUE(v);
      o.sizes.clear();
      size_t start = 0;
      std::string list(v);
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        std::string item = list.substr(start, comma == std::string::npos ? std::string::npos
                                                                          : comma - start);
        TRIBUTARY_ASSIGN_OR_RETURN(uint64_t b, parse_bytes(a, item));
        o.sizes.push_back(b);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "-n" || a == "--iters") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.iters, parse_positive_int(a, v, 1));
      iters_given = true;
    } else if (a == "-w" || a == "--warmup_iters") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.warmup_iters, parse_positive_int(a, v, 0));
    } else if (a == "-t" || a == "--time-per-size") {
      TB_VALUE(v);
      auto d = parse_duration(v);
      if (!d.ok()) return flag_error(a, v, d.status().message());
      o.target_seconds = std::chrono::duration<double>(*d).count();
      if (o.target_seconds <= 0) return flag_error(a, v, "must be positive");
    } else if (a == "-c" || a == "--check") {
      TB_VALUE(v);
      auto b = parse_bool(v);
      if (!b.ok()) return flag_error(a, v, "expected 0 or 1");
      o.check = *b;
    } else if (a == "--json") {
      TB_VALUE(v);
      o.json_path = v;
    } else if (a == "--csv") {
      TB_VALUE(v);
      o.csv_path = v;
    } else if (a == "--plot") {
      TB_VALUE(v);
      o.plot_path = v;
    } else if (a == "--ceiling") {
      o.ceiling = true;
    } else if (a == "--min-busbw") {
      TB_VALUE(v);
      TRIBUTARY_ASSIGN_OR_RETURN(o.min_busbw, parse_number(a, v));
    } else if (a == "-q" || a == "--quiet") {
      o.quiet = true;
    } else {
      return invalid_argument("unknown argument '" + std::string(argv[i]) +
                              "'; run tributary-bench --help for the options");
    }
#undef TB_VALUE
  }
  if (iters_given && o.target_seconds > 0) {
    return invalid_argument("give either -n/--iters or -t/--time-per-size, not both");
  }
  return o;
}

StatusOr<std::vector<uint64_t>> bench_sizes(const BenchOptions& o) {
  const uint64_t elem = dtype_size(o.dtype);
  std::vector<uint64_t> out;
  auto add = [&](uint64_t bytes) {
    uint64_t rounded = bytes / elem * elem;
    if (rounded == 0) rounded = elem;
    if (std::find(out.begin(), out.end(), rounded) == out.end()) out.push_back(rounded);
  };
  if (!o.sizes.empty()) {
    for (uint64_t s : o.sizes) add(s);
  } else {
    if (o.min_bytes > o.max_bytes) {
      return invalid_argument("the size range is empty: --minbytes " + format_size(o.min_bytes) +
                              " is larger than --maxbytes " + format_size(o.max_bytes));
    }
    double s = static_cast<double>(std::max<uint64_t>(o.min_bytes, 1));
    while (s <= static_cast<double>(o.max_bytes) * (1 + 1e-9)) {
      add(static_cast<uint64_t>(s));
      s *= o.step_factor;
    }
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) return invalid_argument("no message size to measure");
  return out;
}

}  // namespace tributary::bench
