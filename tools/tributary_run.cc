// tributary-run: starts the worker processes of a job with their cluster spec set, with mpirun's
// and torchrun's habits.
//
//   tributary-run -np 4 [-x VAR[=VALUE]]... [--timeout 5m] [--no-prefix] [--] prog args
//   tributary-run --nproc-per-node 4 --nnodes 2 --node-rank 1 --master-addr HOST --master-port P
//                 -- prog args                                        (one launcher per host)
//
// This file is the command line (CLI11, as every tool of tributary); tools/launcher.{h,cc} start
// the workers, relay output and signals, and decide the exit status (see launcher.h for the
// contract); tools/node_join.{h,cc} is the meeting of the launchers of a multi-host job.
#include <CLI/CLI.hpp>
#include <netdb.h>
#include <sys/socket.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/launcher.h"

namespace {

using tributary::tools::LaunchOptions;

// torchrun's default rendezvous port, for multi-node jobs that name none.
constexpr int kDefaultMasterPort = 29500;

const char kUsage[] = R"(usage: tributary-run [options] [--] program [args...]
Starts the worker processes of `program` on this host, each with its cluster spec in the
environment (rank r of W, local index i on this host):
  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them)
  TRIBUTARY_RANK, TRIBUTARY_WORLD_SIZE, TRIBUTARY_LOCAL_RANK, TRIBUTARY_LOCAL_WORLD_SIZE,
  TRIBUTARY_MASTER_ADDR, TRIBUTARY_MASTER_PORT
  TF_CONFIG={"cluster": {"worker": ["127.0.0.1:P0", ...]}, "task": {"type": "worker", "index": i}}
    (single-node jobs only)
  TRIBUTARY_STORE_FD (rank 0 of a single-node job of 2 or more workers, unless
    --release-master-port): the socket listening on MASTER_PORT, bound by the launcher, on which
    tributary serves the rendezvous store
A job on several hosts runs one tributary-run per host, torchrun's way: node k of --nnodes N starts
ranks k*M .. k*M+M-1 (M = --nproc-per-node); all point at node 0's --master-addr/--master-port,
where rank 0 keeps the rendezvous store. The launchers meet there first, so a node that does not
come fails the others after --join-timeout, before any worker starts.
Each output line is copied with the prefix "[rank r] ". When a rank fails, the others on this
node are stopped and tributary-run exits with the failing rank's status (128+signal if it was
killed by one); the ranks on other nodes fail through their collectives.
)";

const char kFooter[] = R"(Values may follow an option as the next argument or after '=' (--np=4), and short ones
directly (-n4). -np N is mpirun's spelling of --np N; -x VAR passes this launcher's VAR on to every
worker, -x VAR=VALUE sets it (both mpirun's). SIGINT, SIGTERM and SIGHUP are forwarded to every
rank. SIGUSR1 is passed on to every rank and stops nothing: each rank's flight recorder dumps its
last collectives to its log (kill -USR1 PID of tributary-run, when a job seems stuck). Workers
read stdin from /dev/null.
)";

// The help text: our usage and description, then CLI11's option list.
class Help : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    return std::string(kUsage) + "\n" + make_groups(app, mode) + make_footer(app);
  }
};

int usage_error(std::string message) {
  for (char& c : message) {
    if (c == '\n') c = ' ';  // one line, for scripts and logs
  }
  std::fprintf(stderr, "tributary-run: %s (see --help)\n", message.c_str());
  return 2;
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

bool valid_variable_name(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  for (char c : key) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

// What the command line says, as written; checked and turned into LaunchOptions afterwards.
struct Flags {
  int nproc = 1;
  std::string nnodes = "1";
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;  // 0: not given
  std::string timeout, grace = "5s", join_timeout = "5m";
  std::vector<std::string> env, exports;
  bool no_prefix = false;
  std::string bind_to = "none";
  bool report_bindings = false;
  bool release_master_port = false;
};

void define(CLI::App& app, Flags& f) {
  app.formatter(std::make_shared<Help>());
  app.get_formatter()->column_width(34);
  app.set_help_flag("-h,--help", "show this help and exit");
  app.add_option("-n,--np,--nproc,--nproc-per-node,--nproc_per_node", f.nproc,
                 "workers on this node (at most 1024); -np N as mpirun")
      ->check(CLI::Range(1, tributary::tools::kMaxLocalWorkers))
      ->type_name("N");
  app.add_option("--nnodes", f.nnodes, "nodes (hosts) of the job, one tributary-run on each")
      ->type_name("N");
  app.add_option("--node-rank,--node_rank", f.node_rank, "this node's rank, 0 .. nnodes-1")
      ->check(CLI::NonNegativeNumber)
      ->type_name("K");
  app.add_option("--master-addr,--master_addr", f.master_addr,
                 "node 0's address, reachable from every node (default 127.0.0.1)")
      ->type_name("HOST");
  app.add_option("--master-port,--master_port", f.master_port,
                 "port of rank 0's rendezvous store (default: a free one on a single node, "
                 "29500 on several)")
      ->check(CLI::Range(1, 65535))
      ->type_name("PORT");
  app.add_flag("--release-master-port", f.release_master_port,
               "on one node, release MASTER_PORT before the workers start instead of handing "
               "its listening socket to rank 0 (TRIBUTARY_STORE_FD), for a rank 0 that binds the "
               "port itself (torch.distributed's env:// outside torchrun); another process can "
               "then take the port before rank 0 binds it")
      ->disable_flag_override();
  app.add_option("--join-timeout", f.join_timeout,
                 "how long the launchers of a multi-node job wait for each other (default 5m)")
      ->type_name("DURATION");
  app.add_option("--timeout", f.timeout,
                 "stop the job and exit 124 if it runs longer (e.g. 90s, 5m, 1h)")
      ->type_name("DURATION");
  app.add_option("--grace", f.grace,
                 "how long ranks get to exit after SIGTERM before SIGKILL (default 5s)")
      ->type_name("DURATION");
  app.add_option("--env", f.env, "set KEY for every worker (repeatable)")->type_name("KEY=VALUE");
  app.add_option("-x", f.exports,
                 "as mpirun: pass VAR from this environment, or set VAR=VALUE (repeatable)")
      ->type_name("VAR[=VALUE]");
  app.add_flag("--no-prefix", f.no_prefix, "copy output lines without the \"[rank r] \" prefix")
      ->disable_flag_override();
  app.add_option("--bind-to", f.bind_to,
                 "none (default): workers run on any of this launcher's CPUs; core: worker i on "
                 "the i-th core, as mpirun (helps single-threaded ranks, hurts ring's shared "
                 "memory)")
      ->type_name("none|core");
  app.add_flag("--report-bindings", f.report_bindings,
               "say on stderr which CPUs each worker is bound to, as mpirun")
      ->disable_flag_override();
}

// Splits argv into the launcher's arguments and the program's, by the options `app` defines:
// the program starts at "--" or at the first argument that is neither an option nor an option's
// value. mpirun's "-np" becomes "--np" on the way (CLI11 would read it as -n with the value "p").
std::optional<int> split(CLI::App& app, int argc, char** argv, std::vector<std::string>& ours,
                         std::vector<std::string>& program) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      program.assign(argv + i + 1, argv + argc);
      return std::nullopt;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      program.assign(argv + i, argv + argc);
      return std::nullopt;
    }
    if (arg == "-np") arg = "--np";
    const bool is_long = arg.starts_with("--");
    const size_t eq = arg.find('=');
    const std::string name = is_long ? arg.substr(0, eq) : arg.substr(0, 2);
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt == nullptr) return usage_error("unknown option '" + arg + "'");
    ours.push_back(arg);
    const bool attached = is_long ? eq != std::string::npos : arg.size() > 2;
    if (!attached && opt->get_items_expected_max() > 0 && i + 1 < argc &&
        std::string_view(argv[i + 1]) != "--") {
      ours.push_back(argv[++i]);
    }
  }
  return std::nullopt;
}

// Adds KEY=VALUE to `env`, replacing an earlier KEY; returns an error message or "".
std::string add_variable(std::vector<std::string>& env, const std::string& key,
                         const std::string& entry, const char* option) {
  if (!valid_variable_name(key)) {
    return "bad variable name '" + key + "' for " + option + "; expected letters, digits and _";
  }
  if (tributary::tools::is_launcher_variable(key)) {
    return std::string(option) + " cannot set " + key + "; tributary-run sets it";
  }
  if (key == "TRIBUTARY_SECRET" && entry.size() > key.size()) {
    std::fprintf(stderr,
                 "tributary-run: warning: %s TRIBUTARY_SECRET=... puts the secret on this command "
                 "line, where every user of this machine can read it (ps); export "
                 "TRIBUTARY_SECRET (and pass -x TRIBUTARY_SECRET), or set TRIBUTARY_SECRET_FILE "
                 "to a file only you can read, instead\n",
                 option);
  }
  std::erase_if(env, [&](const std::string& e) { return e.substr(0, e.find('=')) == key; });
  env.push_back(entry);
  return "";
}

// Checks what CLI11 parsed and fills `o`; returns an error message or "".
std::string finish(const Flags& f, LaunchOptions& o) {
  o.nproc = f.nproc;
  char* end = nullptr;
  const long nnodes = std::strtol(f.nnodes.c_str(), &end, 10);
  if (f.nnodes.find(':') != std::string::npos) {
    return "--nnodes " + f.nnodes + ": elastic ranges (MIN:MAX) are not supported; give a count";
  }
  if (f.nnodes.empty() || *end != '\0' || nnodes < 1 || nnodes > 65536) {
    return "bad value '" + f.nnodes + "' for --nnodes; expected 1 to 65536";
  }
  o.nnodes = static_cast<int>(nnodes);
  if (f.node_rank >= o.nnodes) {
    return "--node-rank " + std::to_string(f.node_rank) + " is out of range for --nnodes " +
           f.nnodes + "; expected 0 to " + std::to_string(o.nnodes - 1);
  }
  if (static_cast<long long>(o.nnodes) * o.nproc > (1 << 30)) return "the job has too many ranks";
  o.node_rank = f.node_rank;
  o.master_addr = f.master_addr;
  if (o.nnodes > 1 && o.master_addr.empty()) {
    if (o.node_rank != 0) {
      return "--node-rank " + std::to_string(o.node_rank) +
             " needs --master-addr: the address of node 0, where the job meets";
    }
    o.master_addr = "127.0.0.1";  // torchrun's default too; right for nodes on one host only
  }
  if (!f.master_addr.empty()) {
    // Every rank resolves it to reach the store: a name that does not resolve would end them one
    // by one at their timeout (5 minutes by default), with the store's connect error.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(f.master_addr.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (rc != 0) {
      return "cannot resolve --master-addr '" + f.master_addr + "' (" + ::gai_strerror(rc) +
             "); give node 0's IP address or a hostname every node resolves";
    }
  }
  if (f.master_port != 0) o.master_port = f.master_port;
  o.hand_over_store_socket = !f.release_master_port;
  if (o.nnodes > 1 && !o.master_port) o.master_port = kDefaultMasterPort;
  struct Duration {
    const char* name;
    const std::string& text;
    bool set;
  };
  for (const Duration& d : {Duration{"--timeout", f.timeout, !f.timeout.empty()},
                            Duration{"--grace", f.grace, true},
                            Duration{"--join-timeout", f.join_timeout, true}}) {
    if (!d.set) continue;
    auto ms = parse_duration(d.text);
    if (!ms) {
      return "bad value '" + d.text + "' for " + d.name +
             "; expected a positive duration such as 500ms, 30s, 5m or 1h";
    }
    if (d.name == std::string_view("--timeout")) {
      o.timeout = *ms;
      o.timeout_text = d.text;
    } else if (d.name == std::string_view("--grace")) {
      o.grace = *ms;
      o.grace_text = d.text;
    } else {
      o.join_timeout = *ms;
      o.join_timeout_text = d.text;
    }
  }
  o.prefix = !f.no_prefix;
  if (f.bind_to != "none" && f.bind_to != "core") {
    return "bad value '" + f.bind_to + "' for --bind-to; expected none or core";
  }
  o.bind_to_core = f.bind_to == "core";
  o.report_bindings = f.report_bindings;
  for (const std::string& e : f.env) {
    const size_t eq = e.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return "bad value '" + e + "' for --env; expected KEY=VALUE";
    }
    if (std::string why = add_variable(o.env, e.substr(0, eq), e, "--env"); !why.empty()) {
      return why;
    }
  }
  for (const std::string& x : f.exports) {
    const size_t eq = x.find('=');
    const std::string key = x.substr(0, eq);
    std::string entry = x;
    if (eq == std::string::npos) {
      const char* value = std::getenv(key.c_str());
      if (value == nullptr) {
        if (valid_variable_name(key) && !tributary::tools::is_launcher_variable(key)) {
          std::fprintf(stderr, "tributary-run: warning: -x %s: %s is not set here; not passed on\n",
                       key.c_str(), key.c_str());
          continue;
        }
      } else {
        entry = key + "=" + value;
      }
    }
    if (std::string why = add_variable(o.env, key, entry, "-x"); !why.empty()) return why;
  }
  return "";
}

// Returns the exit status when the command line says to exit now (help, or an error).
std::optional<int> parse_args(int argc, char** argv, LaunchOptions& o) {
  CLI::App app("", "tributary-run");
  Flags f;
  define(app, f);
  std::vector<std::string> ours;
  if (auto code = split(app, argc, argv, ours, o.command)) return code;
  std::vector<std::string> reversed(ours.rbegin(), ours.rend());  // CLI11 takes them backwards
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (std::string why = finish(f, o); !why.empty()) return usage_error(why);
  if (o.command.empty()) return usage_error("missing program to run");
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions options;
  if (auto code = parse_args(argc, argv, options)) return *code;
  return tributary::tools::launch(std::move(options));
}
