// tributary-run: starts N local worker processes with their cluster spec set, like torchrun or
// mpirun for one host.
//
//   tributary-run -n 4 [--master-port P] [--timeout 5m] [--env K=V]... [--no-prefix] -- prog args
//
// This file is the command line; tools/launcher.{h,cc} start the workers, relay output and
// signals, and decide the exit status (see launcher.h for the contract).
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "tools/launcher.h"

namespace {

using tributary::tools::LaunchOptions;

const char kUsage[] = R"(usage: tributary-run -n N [options] [--] program [args...]
Starts N local worker processes of `program`, each with its cluster spec in the environment:
  TF_CONFIG={"cluster": {"worker": ["127.0.0.1:P0", ...]}, "task": {"type": "worker", "index": i}}
  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them)
  TRIBUTARY_RANK, TRIBUTARY_WORLD_SIZE, TRIBUTARY_LOCAL_RANK, TRIBUTARY_MASTER_ADDR,
  TRIBUTARY_MASTER_PORT
Each output line is copied with the prefix "[rank i] ". When a rank fails, the others are stopped
and tributary-run exits with the failing rank's status (128+signal if it was killed by one).

options:
  -n, --nproc N         number of workers (default 1, at most 1024)
  --master-port P       use port P for MASTER_PORT instead of a free one
  --timeout DURATION    stop the job and exit 124 if it runs longer (e.g. 90s, 5m, 1h)
  --grace DURATION      how long ranks get to exit after SIGTERM before SIGKILL (default 5s)
  --env KEY=VALUE       set KEY for every worker (repeatable)
  --no-prefix           copy output lines without the "[rank i] " prefix
  -h, --help            show this help
SIGINT, SIGTERM and SIGHUP are forwarded to every rank. SIGUSR1 is passed on to every rank and
stops nothing: each rank's flight recorder dumps its last collectives to its log (kill -USR1 PID
of tributary-run, when a job seems stuck). Workers read stdin from /dev/null.
)";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "tributary-run: %s (see --help)\n", message.c_str());
  return 2;
}

std::optional<long> parse_long(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

// "500ms", "30s", "1.5m", "2h"; a bare number is seconds.
std::optional<std::chrono::milliseconds> parse_duration(const std::string& text) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.')) {
    return std::nullopt;
  }
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  std::string_view unit(end);
  double scale;
  if (unit.empty() || unit == "s") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1;
  } else if (unit == "m") {
    scale = 60e3;
  } else if (unit == "h") {
    scale = 3600e3;
  } else {
    return std::nullopt;
  }
  double ms = std::ceil(v * scale);
  if (!std::isfinite(ms) || ms <= 0 || ms > 366.0 * 24 * 3600e3) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

// Returns the exit status when the command line says to exit now (help, or an error).
std::optional<int> parse_args(int argc, char** argv, LaunchOptions& o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      o.command.assign(argv + i + 1, argv + argc);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {  // the program; the rest are its arguments
      o.command.assign(argv + i, argv + argc);
      break;
    }
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    } else if (arg.starts_with("-n") && arg.size() > 2) {
      name = "-n";
      inline_value = arg.substr(2);
    }
    auto value = [&]() -> std::optional<std::string> {
      if (inline_value) return inline_value;
      if (i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    auto missing = [&] { return usage_error("option '" + name + "' needs a value"); };

    if (name == "-h" || name == "--help" || name == "--no-prefix") {
      if (inline_value) return usage_error("option '" + name + "' takes no value");
      if (name == "--no-prefix") {
        o.prefix = false;
        continue;
      }
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "-n" || name == "--nproc" || name == "--nproc-per-node") {
      auto v = value();
      if (!v) return missing();
      auto n = parse_long(*v);
      if (!n || *n < 1 || *n > tributary::tools::kMaxLocalWorkers) {
        return usage_error("bad value '" + *v + "' for " + name + "; expected 1 to " +
                           std::to_string(tributary::tools::kMaxLocalWorkers));
      }
      o.nproc = static_cast<int>(*n);
    } else if (name == "--master-port") {
      auto v = value();
      if (!v) return missing();
      auto p = parse_long(*v);
      if (!p || *p < 1 || *p > 65535) {
        return usage_error("bad value '" + *v + "' for --master-port; expected 1 to 65535");
      }
      o.master_port = static_cast<int>(*p);
    } else if (name == "--timeout" || name == "--grace") {
      auto v = value();
      if (!v) return missing();
      auto d = parse_duration(*v);
      if (!d) {
        return usage_error("bad value '" + *v + "' for " + name +
                           "; expected a positive duration such as 500ms, 30s, 5m or 1h");
      }
      if (name == "--timeout") {
        o.timeout = *d;
        o.timeout_text = *v;
      } else {
        o.grace = *d;
        o.grace_text = *v;
      }
    } else if (name == "--env") {
      auto v = value();
      if (!v) return missing();
      size_t eq = v->find('=');
      if (eq == 0 || eq == std::string::npos) {
        return usage_error("bad value '" + *v + "' for --env; expected KEY=VALUE");
      }
      std::string key = v->substr(0, eq);
      if (tributary::tools::is_launcher_variable(key)) {
        return usage_error("--env cannot set " + key + "; tributary-run sets it for each rank");
      }
      if (key == "TRIBUTARY_SECRET") {
        std::fprintf(stderr,
                     "tributary-run: warning: --env TRIBUTARY_SECRET puts the secret on this "
                     "command line, where every user of this machine can read it (ps); export "
                     "TRIBUTARY_SECRET, or set TRIBUTARY_SECRET_FILE to a file only you can read, "
                     "instead\n");
      }
      o.env.push_back(*v);
    } else {
      return usage_error("unknown option '" + arg + "'");
    }
  }
  if (o.command.empty()) return usage_error("missing program to run");
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions options;
  if (auto code = parse_args(argc, argv, options)) return *code;
  return tributary::tools::launch(std::move(options));
}
