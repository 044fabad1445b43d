#include "bench/bench_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string_view>

namespace tributary::bench {
namespace {

Status flag_error(std::string_view flag, std::string_view value, std::string_view why) {
  return invalid_argument("bad value '" + std::string(value) + "' for " + std::string(flag) + ": " +
                          std::string(why));
}

StatusOr<int> parse_int(std::string_view flag, std::string_view v, int min, int max,
                        std::string_view hint = "") {
  char* end = nullptr;
  std::string s(v);
  errno = 0;
  long x = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || x < min || x > max) {
    std::string why =
        "expected an integer from " + std::to_string(min) + " to " + std::to_string(max);
    if (!hint.empty()) why += "; " + std::string(hint);
    return flag_error(flag, v, why);
  }
  return static_cast<int>(x);
}

StatusOr<double> parse_number(std::string_view flag, std::string_view v) {
  char* end = nullptr;
  std::string s(v);
  double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x))
    return flag_error(flag, v, "expected a number");
  return x;
}

StatusOr<uint64_t> parse_bytes(std::string_view flag, std::string_view v) {
  auto b = parse_size(v);
  if (!b.ok()) return flag_error(flag, v, b.status().message());
  return *b;
}

// A comma-separated list, or "all" for every value (nccl-tests' -d all, -o all).
template <typename T, typename Parse, typename All>
StatusOr<std::vector<T>> parse_list(std::string_view flag, const std::string& v, Parse parse,
                                    All all) {
  std::vector<T> out;
  if (v == "all") {
    for (T x : all()) out.push_back(x);
    return out;
  }
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    const std::string item =
        v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto x = parse(item);
    if (!x.ok()) return flag_error(flag, v, std::string(x.status().message()) + ", or all");
    if (std::find(out.begin(), out.end(), *x) == out.end()) out.push_back(*x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// CLI11 does not wrap help text: wrap it to 100 columns (CLI11 indents an option's continuation
// lines under its help column itself).
constexpr size_t kHelpColumn = 34;
std::string wrap(const std::string& text, size_t indent = kHelpColumn) {
  const size_t width = 100 - indent;
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  return out + line;
}

// nccl-tests flags with nothing to drive here: their users learn why rather than "unknown".
struct Unsupported {
  std::string_view short_name, long_name, why;
};
constexpr Unsupported kUnsupported[] = {
    {"-p", "--parallel_init", "the backends set up their ranks themselves"},
    {"-y", "--stream_null", "the bench does not choose CUDA streams"},
    {"-G", "--cudagraph", "all-reduces are not captured into CUDA graphs"},
    {"-C", "--report_cputime", "the time reported is always wall-clock time"},
    {"-O", "--out_of_place", "both placements are always measured"},
    {"-u", "--unalign", "buffers are always aligned"},
    {"-S", "--report_timestamps", "rows carry no timestamps"},
    {"-N", "--run_cycles", "run the command again instead"},
    {"-x", "--cta_policy", "NCCL's CTA policy is not set by the bench"},
};

// tributary-bench's flags that tributary-tune refuses (it picks its lines and writes one file).
constexpr std::string_view kBenchOnly[] = {"--backend",     "--reference", "--json", "-J",
                                           "--output_file", "--csv",       "--plot", "--ceiling",
                                           "--min-busbw",   "-r",          "--root"};

class Parser {
 public:
  explicit Parser(Tool tool) : tool_(tool) {
    const bool bench = tool == Tool::kBench;
    app_.name(bench ? "tributary-bench" : "tributary-tune");
    app_.description(wrap(
        bench ? "Measures all-reduce across replicas with one or more backends, with nccl-tests' "
                "flags, columns and formulas."
              : "Measures all-reduce with every candidate backend spec over a size sweep, on "
                "this cluster layout, and writes a tuning file that 'auto' then follows "
                "(TRIBUTARY_TUNING_FILE=FILE, or the spec auto:tuning_file=FILE): size ranges "
                "mapped to the fastest spec. Specs within 5% of the fastest count as tied; ties "
                "go to what 'auto' picks without the file.",
        0));
    app_.set_help_flag("-h,--help", "this text");
    app_.allow_extras();  // reported by us, with the reason where nccl-tests has the flag
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.get_formatter()->column_width(kHelpColumn);
    if (bench) {
      add_bench_lines();
    } else {
      add_tune();
    }
    add_layout();
    add_sizes();
    add_iterations();
    add_checking();
    if (bench) add_outputs();
    app_.footer(wrap(
        bench
            ? "Every result is checked unless -c 0. The table has nccl-tests' columns (size count "
              "type redop root, then time algbw busbw #wrong out of place and in place), one "
              "section per line, headed by a '#' comment naming it; each section ends with "
              "'# Avg bus bandwidth    : X' (GB/s, the number last)."
            : "The file is for this layout (processes, processes per host, replicas, device) and "
              "this library version; 'auto' ignores it elsewhere with a warning. tributary-info "
              "shows what 'auto' chooses.",
        0));
  }

  StatusOr<BenchOptions> parse(int argc, char** argv, std::string* help) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      *help = app_.help();
      return BenchOptions{};
    } catch (const CLI::ParseError& e) {
      return invalid_argument(std::string(e.what()) + "; run " + app_.get_name() +
                              " --help for the options");
    }
    TRIBUTARY_RETURN_IF_ERROR(check_extras());
    return convert();
  }

 private:
  // A value option; its text is converted after parsing, so that every error names the flag.
  CLI::Option* value(const std::string& names, const std::string& type, const std::string& help) {
    std::string display = names;
    std::replace(display.begin(), display.end(), ',', '/');
    const std::string key = names.substr(names.rfind(',') + 1);
    display_[key] = display;
    CLI::Option* opt =
        app_.add_option(names, values_[key], wrap(help))->type_name(type)->group(group_);
    options_[key] = opt;
    return opt;
  }
  CLI::Option* flag(const std::string& names, bool* target, const std::string& help) {
    const std::string key = names.substr(names.rfind(',') + 1);
    CLI::Option* opt = app_.add_flag(names, *target, wrap(help))->group(group_);
    options_[key] = opt;
    return opt;
  }
  CLI::Option* list(const std::string& names, std::vector<std::string>* target,
                    const std::string& type, const std::string& help) {
    const std::string key = names.substr(names.rfind(',') + 1);
    CLI::Option* opt = app_.add_option(names, *target, wrap(help))
                           ->type_name(type)
                           ->group(group_)
                           ->allow_extra_args(false)  // one value per occurrence; repeat it
                           ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    options_[key] = opt;
    return opt;
  }
  bool given(const std::string& key) const {
    auto it = options_.find(key);
    return it != options_.end() && it->second->count() > 0;
  }
  const std::string& text(const std::string& key) { return values_[key]; }
  const std::string& name(const std::string& key) { return display_[key]; }

  void add_bench_lines() {
    group_ = "What to measure";
    list("--backend", &o_.backends, "SPEC",
         "a backend spec; repeat to compare several in one run (interleaved). Default: every "
         "in-process backend built in; with --np, every multi-process one, and "
         "ring:intra_host=net (TCP) beside ring; with -g, every backend that serves GPUs");
    list("--reference", &references_, "SPEC",
         "a line that does the same work without tributary: yardstick[:threads=N] (one process: a "
         "plain threaded sum), gloo[:algorithm=A,mode=M] (processes: Gloo called directly), "
         "nccl (GPUs: NCCL called directly), tcp (processes, one replica each: plain sockets "
         "moving a ring all-reduce's link traffic, no reduction: what the link alone moves); "
         "repeat for several; 'none' for none. Default when no "
         "--backend is named: the one that suits the layout");
  }

  void add_tune() {
    group_ = "What to tune";
    app_.add_option("--out", o_.tune_out,
                    wrap("where to write the tuning file (default tributary-tuning.json; its "
                         "folder is checked before the sweep)"))
        ->type_name("FILE")
        ->group(group_);
    list("--candidate", &o_.tune_candidates, "SPEC",
         "a spec to consider; repeat for several. Default: every backend that serves the layout, "
         "and the algorithm variants of the one 'auto' would pick");
    value("--passes", "N", "sweeps; each figure is the best of them (default 2)");
  }

  void add_layout() {
    group_ = "Layout (nccl-tests: a process runs -t threads x -g GPUs; here each is a replica)";
    value("-t,--nthreads", "N",
          "replicas per process, as nccl-tests' threads per process: -t N runs N CPU replicas, or "
          "N x -g GPU replicas (default: 2 CPU replicas; see --replicas)");
    value("-g,--ngpus", "N",
          "GPUs per thread as the replicas (GPU:0.., N x -t per process): buffers on the GPUs, "
          "default reference nccl (direct)");
    value("--replicas", "N", "local CPU replicas per process (default 2; the same as -t N)");
    value("--np", "N", "run as N local processes under tributary-run (multi-process backends)");
    value("--bind-to", "none|core",
          "with --np: none (default) or core, each rank on a core of its own (tributary-run "
          "--bind-to, as mpirun binds its ranks)");
  }

  void add_sizes() {
    group_ = "Sizes";
    value("-b,--minbytes", "SIZE", "smallest message, default 8 (sizes take K/M/G: 64K, 4M, 1G)");
    value("-e,--maxbytes", "SIZE", "largest message, default 64M");
    value("-f,--stepfactor", "F", "multiply the size by F each step, default 2; 1: add -i");
    value("-i,--stepbytes", "SIZE", "add this each step instead (when -f is 1 or not given)");
    value("--sizes", "S1,S2,...", "an explicit list of sizes instead of the sweep");
  }

  void add_iterations() {
    group_ = "Iterations";
    value("-n,--iters", "N", "timed iterations per size, default 20");
    value("-w,--warmup_iters", "N", "untimed iterations first, default 5");
    value("-m,--agg_iters", "N",
          "all-reduces per timed iteration, default 1; the time is per all-reduce (there is no "
          "group call to fuse them into: -m N times -n x N calls back to back, on GPUs without "
          "waiting in between)");
    value("--time-per-size", "DURATION", "instead of -n: about this long per size (e.g. 200ms)");
    if (tool_ == Tool::kBench) {
      value("--repeat", "K",
            "measure every size in K rounds, the lines in a rotated order (round r starts with "
            "line r, so that no line always runs first after a change of size), and report each "
            "line's median time per placement; each round runs -n iterations, or its share of "
            "--time-per-size; only the first round is checked, and its iteration count is the one "
            "reported; JSON rows add every round's time (time_us_rounds). Default 1. On a shared "
            "machine one run of a line can be far off the next");
    }
    value("--warmup-time", "DURATION",
          "after -w iterations, more until the warm-up has lasted this long on the slowest rank "
          "(in up to 8 agreed rounds), so that the scheduler settles the ranks after the line "
          "before; default 5ms; 0, or -w 0: -w iterations alone, as nccl-tests");
    value("-a,--average", "0|1|2|3",
          "across processes, report rank 0's time (0), the mean (1), the fastest (2) or the "
          "slowest (3, default; nccl-tests' default is 1)");
    value("-z,--blocking", "0|1", "1: wait for each all-reduce before the next (GPU lines)");
    value("-R,--local_register", "0|1|2",
          "1: register the buffers the results go to (and out of place the CPU inputs) with each "
          "backend line before its warm-up (CrossDeviceOps::register_buffers, as nccl-tests' -R "
          "registers its send and receive buffers with NCCL; gloo then "
          "runs on them without a per-call agreement); 2: also allocate every CPU buffer with "
          "Buffer::allocate_shareable (as nccl-tests' -R 2 allocates with ncclMemAlloc), so that "
          "ring's shared memory all-reduces them in place without copies; reference lines are "
          "unaffected");
    value("-T,--timeout", "SECONDS",
          "fail an all-reduce (and the rendezvous) that takes longer; 0 (default) keeps the "
          "backends' own (timeout= in a spec, else TRIBUTARY_TIMEOUT, else 5 minutes)");
  }

  void add_checking() {
    group_ = "What to reduce and checking";
    value("-d,--datatype", "TYPE|all",
          "float32 (default; also float), float64 (double), float16 (half), bfloat16, int32, "
          "int64, int8, uint8; a comma-separated list, or all");
    value("-o,--op", "OP|all", "sum (default), mean (avg), min, max, prod; a list, or all");
    value("-c,--check", "N", "checked all-reduces per size and placement (default 1); 0: no check");
    if (tool_ == Tool::kBench) {
      value("-r,--root", "N",
            "accepted as nccl-tests does; all_reduce has no root, so the root column shows -1");
    }
    flag("-q,--quiet", &o_.quiet, "no progress line on stderr");
  }

  void add_outputs() {
    group_ = "Output (paths are checked before the sweep starts)";
    value("-J,--json,--output_file", "FILE",
          "every figure, the machine, the specs and the library version, as JSON");
    value("--csv", "FILE", "the same rows as CSV");
    value("--plot", "FILE.png", "busbw against size, one line per backend (gnuplot)");
    flag("--ceiling", &o_.ceiling,
         "measure memcpy bandwidth and print the all-reduce bound (with -g: the GPU's copy "
         "bandwidth and its pinned host copies)");
    value("--min-busbw", "GB/s", "exit non-zero if any line's average busbw is below this");
  }

  Status check_extras() {
    const std::vector<std::string> extras = app_.remaining();
    if (extras.empty()) return Status();
    const std::string& first = extras.front();
    const std::string flag = first.substr(0, first.find('='));
    const std::string tool = app_.get_name();
    for (const Unsupported& u : kUnsupported) {
      if (flag == u.short_name || flag == u.long_name) {
        return invalid_argument("nccl-tests' " + std::string(u.short_name) + "/" +
                                std::string(u.long_name) + " is not supported by " + tool + ": " +
                                std::string(u.why));
      }
    }
    if (tool_ == Tool::kTune && (flag == "-r" || flag == "--root")) {
      return invalid_argument(flag +
                              " is nccl-tests' root, which tributary-tune has no use for "
                              "(all_reduce has none); replicas per process are --replicas "
                              "or -t");
    }
    if (tool_ == Tool::kTune &&
        std::find(std::begin(kBenchOnly), std::end(kBenchOnly), flag) != std::end(kBenchOnly)) {
      return invalid_argument(flag +
                              " is tributary-bench's; tributary-tune takes --candidate and "
                              "--out (see --help)");
    }
    if (!flag.starts_with("-")) {
      return invalid_argument("unexpected argument '" + first + "' (" + tool +
                              " takes no positional arguments); run " + tool +
                              " --help for the options");
    }
    return invalid_argument("unknown argument '" + first + "'; run " + tool +
                            " --help for the options");
  }

  template <typename T>
  Status set_int(const std::string& key, T* out, int min, int max, std::string_view hint = "") {
    if (!given(key)) return Status();
    TRIBUTARY_ASSIGN_OR_RETURN(int v, parse_int(name(key), text(key), min, max, hint));
    *out = static_cast<T>(v);
    return Status();
  }
  Status set_bytes(const std::string& key, uint64_t* out) {
    if (!given(key)) return Status();
    TRIBUTARY_ASSIGN_OR_RETURN(*out, parse_bytes(name(key), text(key)));
    return Status();
  }

  StatusOr<BenchOptions> convert() {
    constexpr int kMaxInt = 1'000'000'000;
    TRIBUTARY_RETURN_IF_ERROR(convert_lines());
    TRIBUTARY_RETURN_IF_ERROR(convert_layout());
    TRIBUTARY_RETURN_IF_ERROR(convert_sizes());
    TRIBUTARY_RETURN_IF_ERROR(set_int("--iters", &o_.iters, 1, kMaxInt));
    TRIBUTARY_RETURN_IF_ERROR(set_int("--warmup_iters", &o_.warmup_iters, 0, kMaxInt));
    if (given("--warmup-time")) {
      const std::string& v = text("--warmup-time");
      auto d = parse_duration(v);
      if (!d.ok()) return flag_error("--warmup-time", v, d.status().message());
      o_.warmup_seconds = std::chrono::duration<double>(*d).count();
    }
    TRIBUTARY_RETURN_IF_ERROR(set_int("--agg_iters", &o_.agg_iters, 1, 1'000'000));
    if (given("--time-per-size")) {
      auto d = parse_duration(text("--time-per-size"));
      const std::string& v = text("--time-per-size");
      if (!d.ok()) return flag_error("--time-per-size", v, d.status().message());
      o_.target_seconds = std::chrono::duration<double>(*d).count();
      if (o_.target_seconds <= 0) return flag_error("--time-per-size", v, "must be positive");
      if (given("--iters")) {
        return invalid_argument("give either -n/--iters or --time-per-size, not both");
      }
    } else if (tool_ == Tool::kTune && !given("--iters")) {
      o_.target_seconds = 0.1;  // tributary-tune: about 100 ms per size and spec
    }
    if (tool_ == Tool::kBench) TRIBUTARY_RETURN_IF_ERROR(set_int("--repeat", &o_.repeat, 1, 1000));
    TRIBUTARY_RETURN_IF_ERROR(set_int("--average", &o_.average, 0, 3));
    bool blocking = false;
    TRIBUTARY_RETURN_IF_ERROR(set_int("--blocking", &blocking, 0, 1));
    o_.blocking = blocking;
    TRIBUTARY_RETURN_IF_ERROR(set_int("--local_register", &o_.local_register, 0, 2));
    if (given("--timeout")) {
      const std::string& v = text("--timeout");
      auto seconds = parse_number(name("--timeout"), v);
      if (seconds.ok()) {
        if (*seconds < 0) return flag_error(name("--timeout"), v, "must be 0 or more seconds");
        o_.timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
      } else {
        auto d = parse_duration(v);  // also "30s", "2m"
        if (!d.ok()) return flag_error(name("--timeout"), v, "expected seconds (or 30s, 2m)");
        o_.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
      }
    }
    TRIBUTARY_RETURN_IF_ERROR(convert_checking());
    TRIBUTARY_RETURN_IF_ERROR(convert_outputs());
    if (tool_ == Tool::kTune) {
      TRIBUTARY_RETURN_IF_ERROR(set_int("--passes", &o_.tune_passes, 1, 100));
      if (o_.dtypes.size() > 1 || o_.ops.size() > 1) {
        return invalid_argument(
            "tributary-tune measures one dtype and one op (a tuning file is "
            "for one pair); name one with -d and -o");
      }
    }
    return o_;
  }

  Status convert_lines() {
    for (const std::string& b : o_.backends) {
      auto spec = BackendSpec::parse(b);
      if (!spec.ok()) return spec.status();
    }
    for (const std::string& v : references_) {
      if (v == "none") {
        o_.references = {"none"};
        continue;
      }
      auto spec = BackendSpec::parse(v);
      if (!spec.ok()) return spec.status();
      if (spec->name != "yardstick" && spec->name != "gloo" && spec->name != "nccl" &&
          spec->name != "tcp") {
        return flag_error("--reference", v,
                          "unknown reference '" + spec->name +
                              "' (yardstick, gloo, nccl, tcp, none)");
      }
      std::erase(o_.references, "none");
      o_.references.push_back(v);
    }
    return Status();
  }

  Status convert_layout() {
    constexpr int kMax = 4096;
    TRIBUTARY_RETURN_IF_ERROR(set_int("--nthreads", &o_.threads, 1, kMax,
                                      "-t is nccl-tests' threads (here: replicas) per process; "
                                      "for a time per size use --time-per-size"));
    TRIBUTARY_RETURN_IF_ERROR(set_int("--ngpus", &o_.gpus, 1, kMax));
    TRIBUTARY_RETURN_IF_ERROR(set_int("--np", &o_.np, 1, kMax));
    if (given("--bind-to")) {
      o_.bind_to = text("--bind-to");
      if (o_.bind_to != "none" && o_.bind_to != "core") {
        return flag_error("--bind-to", o_.bind_to, "expected none or core");
      }
      if (o_.bind_to == "core" && !given("--np")) {
        return invalid_argument(
            "--bind-to core binds the ranks that --np starts, and there is no --np; under another "
            "launcher, bind with it (tributary-run --bind-to core, mpirun --bind-to core)");
      }
    }
    if (given("--replicas")) {
      if (given("--nthreads") || given("--ngpus")) {
        return invalid_argument(
            "--replicas and -t/-g both set the replicas per process; give "
            "--replicas N, or -t N (CPU), or -g N [-t T] (GPUs)");
      }
      TRIBUTARY_RETURN_IF_ERROR(set_int("--replicas", &o_.replicas, 1, kMax));
    } else if (given("--nthreads") || given("--ngpus")) {
      o_.replicas = o_.threads * std::max(o_.gpus, 1);
    }
    if (o_.gpus == 0) o_.threads = o_.replicas;  // on CPUs each replica is one nccl-tests thread
    return Status();
  }

  Status convert_sizes() {
    const bool sweep_given = given("--minbytes") || given("--maxbytes") || given("--stepfactor") ||
                             given("--stepbytes") || given("--sizes");
    if (tool_ == Tool::kTune && !sweep_given) {
      o_.min_bytes = 1024;  // tributary-tune's default sweep: 1K to 64M, factor 4
      o_.max_bytes = 64ull << 20;
      o_.step_factor = 4;
    }
    TRIBUTARY_RETURN_IF_ERROR(set_bytes("--minbytes", &o_.min_bytes));
    TRIBUTARY_RETURN_IF_ERROR(set_bytes("--maxbytes", &o_.max_bytes));
    TRIBUTARY_RETURN_IF_ERROR(set_bytes("--stepbytes", &o_.step_bytes));
    if (given("--stepbytes") && o_.step_bytes == 0) {
      return flag_error(name("--stepbytes"), text("--stepbytes"), "the step must be > 0");
    }
    if (given("--stepfactor")) {
      TRIBUTARY_ASSIGN_OR_RETURN(o_.step_factor,
                                 parse_number(name("--stepfactor"), text("--stepfactor")));
      if (o_.step_factor < 1) {
        return flag_error(name("--stepfactor"), text("--stepfactor"),
                          "the step factor must be > 1 (or 1, to add -i bytes each step)");
      }
    } else if (given("--stepbytes")) {
      o_.step_factor = 1;  // nccl-tests: -i steps when the factor is not above 1
    }
    if (given("--sizes")) {
      const std::string& list = text("--sizes");
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const std::string item =
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        TRIBUTARY_ASSIGN_OR_RETURN(uint64_t b, parse_bytes("--sizes", item));
        o_.sizes.push_back(b);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
    return Status();
  }

  Status convert_checking() {
    if (given("--datatype")) {
      TRIBUTARY_ASSIGN_OR_RETURN(
          o_.dtypes,
          parse_list<DType>(name("--datatype"), text("--datatype"), parse_dtype, all_dtypes));
    }
    if (given("--op")) {
      TRIBUTARY_ASSIGN_OR_RETURN(o_.ops, parse_list<ReduceOp>(name("--op"), text("--op"),
                                                              parse_reduce_op, all_reduce_ops));
    }
    if (given("--check")) {
      const std::string& v = text("--check");
      auto words = parse_bool(v);  // the earlier 0|1|true|false spelling
      if (words.ok() && v != "0" && v != "1") {
        o_.check = *words ? 1 : 0;
      } else {
        TRIBUTARY_RETURN_IF_ERROR(set_int("--check", &o_.check, 0, 1'000'000));
      }
    }
    if (given("--root")) {
      const std::string& v = text("--root");
      if (v != "all") {
        TRIBUTARY_RETURN_IF_ERROR(set_int("--root", &o_.root, 0, 1'000'000));
      }
      o_.root_given = true;
    }
    return Status();
  }

  Status convert_outputs() {
    if (tool_ != Tool::kBench) return Status();
    o_.json_path = text("--output_file");
    o_.csv_path = text("--csv");
    o_.plot_path = text("--plot");
    for (const char* key : {"--output_file", "--csv", "--plot"}) {
      if (given(key) && text(key).empty()) {
        return flag_error(name(key), "", "expected a file name");
      }
    }
    if (given("--min-busbw")) {
      TRIBUTARY_ASSIGN_OR_RETURN(o_.min_busbw, parse_number("--min-busbw", text("--min-busbw")));
    }
    return Status();
  }

  Tool tool_;
  CLI::App app_;
  std::string group_;
  BenchOptions o_;
  std::vector<std::string> references_;
  std::map<std::string, std::string> values_;   // long name -> the text given
  std::map<std::string, std::string> display_;  // long name -> "-n/--iters"
  std::map<std::string, CLI::Option*> options_;
};

}  // namespace

StatusOr<BenchOptions> parse_command_line(Tool tool, int argc, char** argv, std::string* help) {
  help->clear();
  Parser parser(tool);
  return parser.parse(argc, argv, help);
}

StatusOr<std::vector<uint64_t>> bench_sizes(const BenchOptions& o, DType dtype) {
  const uint64_t elem = dtype_size(dtype);
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
      return invalid_argument("the size range is empty: -b/--minbytes " + format_size(o.min_bytes) +
                              " is larger than -e/--maxbytes " + format_size(o.max_bytes));
    }
    if (o.step_factor > 1) {
      double s = static_cast<double>(std::max<uint64_t>(o.min_bytes, 1));
      while (s <= static_cast<double>(o.max_bytes) * (1 + 1e-9)) {
        add(static_cast<uint64_t>(s));
        s *= o.step_factor;
      }
    } else {
      constexpr size_t kMaxSteps = 100'000;
      for (uint64_t s = o.min_bytes; s <= o.max_bytes; s += o.step_bytes) {
        add(s);
        if (out.size() > kMaxSteps) {
          return invalid_argument("-i/--stepbytes " + format_size(o.step_bytes) + " from " +
                                  format_size(o.min_bytes) + " to " + format_size(o.max_bytes) +
                                  " makes more than 100000 sizes; raise -i or use -f");
        }
        if (o.max_bytes - s < o.step_bytes) break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) return invalid_argument("no message size to measure");
  return out;
}

}  // namespace tributary::bench
