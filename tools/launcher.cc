// The machinery of tributary-run (see launcher.h for the contract).
//
// One thread, one poll() loop: the worker pipes, a self-pipe that signal handlers write to, and
// our own stdout/stderr when output is queued. Our output is written only when poll() says it can
// take more, so a reader that stops reading slows the workers (we stop draining their pipes) but
// never blocks the launcher: signals, deadlines and exits are still handled.
//
// Workers are reaped only at the very end (exits are observed with waitid(WNOWAIT)), so a process
// group id we signal can never have been recycled for an unrelated process.
#include "tools/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/cpus.h"
#include "tools/cpu_binding.h"
#include "tools/fd.h"
#include "tools/node_join.h"

extern char** environ;

namespace tributary::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// After the last rank exits, how long processes it left behind may keep its output open.
constexpr Millis kLinger{1000};
// After SIGKILL, how long we wait for exits and end-of-file before giving up on a process.
constexpr Millis kKillWait{2000};
// A safety net: poll wakes at least this often even if a wake-up byte was lost.
constexpr Millis kMaxPollWait{500};
constexpr size_t kMaxLine = 64 * 1024;      // a longer line without '\n' is cut here
constexpr size_t kMaxQueued = 1024 * 1024;  // stop reading workers while this much is unwritten

// The variables launch() sets for each rank.
// clang-format off
constexpr std::string_view kLauncherVariables[] = {
    "TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TRIBUTARY_RANK", "TRIBUTARY_WORLD_SIZE", "TRIBUTARY_LOCAL_RANK",
    "TRIBUTARY_LOCAL_WORLD_SIZE", "TRIBUTARY_MASTER_ADDR", "TRIBUTARY_MASTER_PORT",
    "TRIBUTARY_STORE_FD"};
// clang-format on
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// ---------------------------------------------------------------------------------------------
// Small POSIX helpers

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string describe_signal(int sig) {
  static constexpr std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"},
  };
  for (const auto& [number, name] : kNames) {
    if (number == sig) return name;
  }
  return "signal " + std::to_string(sig);
}

// A close-on-exec pipe. (pipe2 is not everywhere; we have one thread, so fork cannot race us.)
bool make_pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  read_end = Fd(fds[0]);
  write_end = Fd(fds[1]);
  return ::fcntl(fds[0], F_SETFD, FD_CLOEXEC) == 0 && ::fcntl(fds[1], F_SETFD, FD_CLOEXEC) == 0;
}

// Binds `count` sockets to 127.0.0.1:0 at the same time, so the kernel hands out distinct free
// ports, then releases them for the workers. Another process could take one in between; torchrun
// and mpirun accept the same short window.
std::optional<std::vector<int>> free_ports(int count, int avoid, std::string& error) {
  std::vector<Fd> held;
  std::vector<int> ports;
  while (static_cast<int>(ports.size()) < count) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));  // closed before any fork
    if (!s.open()) {
      error = errno_text("cannot create a socket to find a free port");
      return std::nullopt;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      error = errno_text("cannot bind 127.0.0.1:0 to find a free port");
      return std::nullopt;
    }
    int port = ntohs(addr.sin_port);
    if (port != avoid) ports.push_back(port);
    held.push_back(std::move(s));
  }
  return ports;
}

// The rendezvous store's listening socket for rank 0 (one node): bound to 0.0.0.0:`port` (0 = a
// free one), as the store would bind it, and listening, so that the port is never released between
// the launcher choosing it and rank 0 serving on it (another process's bind could take it in that
// window: a job that then failed at once with "Address already in use"). Rank 0 inherits it and
// tributary serves the store on it (TRIBUTARY_STORE_FD); the ranks that connect before rank 0 is up
// wait in its backlog. Close-on-exec: only rank 0's child clears that flag.
Fd listen_for_store(int port, std::string& error) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.open()) {
    error = errno_text("cannot create the rendezvous store's socket");
    return Fd();
  }
  const int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(s.get(), 4096) != 0) {
    const std::string what =
        "cannot listen on 0.0.0.0:" + std::to_string(port) + " for the rendezvous store";
    error = errno_text(what.c_str()) +
            (port != 0 ? "; is another job using that port? choose another --master-port" : "");
    return Fd();
  }
  return s;
}

// The port a bound socket has, or -1.
int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  return ntohs(addr.sin_port);
}

// In a forked child before exec: writes `prefix`, the text of `err` and a newline to standard
// error with write() alone, allocating nothing (the text was built before fork()).
void child_failed(const std::string& prefix, int err) {
  const char* text = std::strerror(err);
  [[maybe_unused]] ssize_t n = ::write(2, prefix.data(), prefix.size());
  n = ::write(2, text, std::strlen(text));
  n = ::write(2, "\n", 1);
}

// ---------------------------------------------------------------------------------------------
// Signals: the handler only records the signal and wakes poll() through a pipe.

volatile sig_atomic_t g_stop_count = 0;    // SIGINT/SIGTERM/SIGHUP received so far
volatile sig_atomic_t g_stop_signal = 0;   // the latest of them
volatile sig_atomic_t g_child_exited = 0;  // SIGCHLD since the last scan
volatile sig_atomic_t g_dump_count = 0;    // SIGUSR1 received so far (forwarded to the ranks)
int g_wake_fd = -1;                        // write end of the wake-up pipe

extern "C" void on_signal(int sig) {
  int saved = errno;
  if (sig == SIGCHLD) {
    g_child_exited = 1;
  } else if (sig == SIGUSR1) {
    g_dump_count = g_dump_count + 1;
  } else {
    g_stop_signal = sig;
    g_stop_count = g_stop_count + 1;
  }
  char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(g_wake_fd, &byte, 1);  // a full pipe already wakes poll
  errno = saved;
}

// ---------------------------------------------------------------------------------------------
// The launcher

// One of our output streams (stdout or stderr), written only when poll says it can take more, so
// a reader that stops reading cannot block the launcher.
struct Sink {
  int fd = -1;
  bool regular = false;  // a regular file never blocks: write everything at once
  bool broken = false;   // the reader went away; drop further output
  std::string queue;
  size_t head = 0;
  size_t pending() const { return queue.size() - head; }
};

struct Stream {
  Fd fd;
  std::string partial;  // the bytes after the last '\n'
  int sink = 1;         // our fd that receives its lines
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also the process group id
  std::string prefix;
  std::vector<int> cpus;  // its affinity (--bind-to core); empty: the launcher's
  Stream out, err;
  bool exited = false;
  bool abandoned = false;
  bool open() const { return out.fd.open() || err.fd.open(); }
};

enum class Stage { kRunning, kTerminating, kKilling };

class Launcher {
 public:
  explicit Launcher(LaunchOptions o) : opt_(std::move(o)) {}
  int run();

 private:
  bool setup(std::string& error);
  // `inherit`: a descriptor the child keeps open across exec (-1: none).
  bool spawn(Worker& w, std::vector<std::string> env, int inherit, std::string& error);
  void loop();
  void check_exits();
  void on_exit(Worker& w, const siginfo_t& info);
  void check_signals();
  int handled_dumps_ = 0;
  void check_deadlines();
  void begin_stop(int sig);
  void send_kill();
  void signal_targets(int sig);
  void read_stream(Worker& w, Stream& s, int max_reads);
  void emit(const Worker& w, int sink, std::string_view line);
  void note(const std::string& message);
  void flush_some(Sink& s);
  void flush_final();
  void fail(int status) {
    if (!status_) status_ = status;
  }
  bool done() const;
  std::string rank_list(bool (*pred)(const Worker&)) const;
  static Millis time_until(Clock::time_point t) {
    return std::chrono::duration_cast<Millis>(t - Clock::now());
  }

  LaunchOptions opt_;
  std::vector<Worker> workers_;
  Sink sinks_[3];  // indexed by our fd: 1 and 2
  Fd wake_read_, wake_write_, dev_null_;
  struct sigaction original_[NSIG] = {};
  sigset_t original_mask_{};
  sigset_t handled_{};
  pid_t self_ = 0;
  Stage stage_ = Stage::kRunning;
  Clock::time_point start_, stage_deadline_;
  std::optional<Clock::time_point> linger_deadline_;
  Clock::time_point last_exit_scan_;
  int handled_stops_ = 0;
  std::optional<int> status_;
};

bool Launcher::setup(std::string& error) {
  // With fd 0, 1 or 2 closed a pipe could land there and be clobbered by the dup2s in a worker.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && ::open("/dev/null", O_RDWR) != fd) {
      error = errno_text("cannot open /dev/null");
      return false;
    }
  }
  // A launcher started as rank 0 of another one: the store socket handed down to it is not its
  // workers' (they get no TRIBUTARY_STORE_FD of it either), so it must not reach them.
  if (const char* inherited = std::getenv("TRIBUTARY_STORE_FD")) {
    char* end = nullptr;
    const long fd = std::strtol(inherited, &end, 10);
    int listening = 0;
    socklen_t size = sizeof(listening);
    if (end != inherited && *end == '\0' && fd > 2 && fd <= INT_MAX &&
        ::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 &&
        listening != 0) {
      ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    }
  }
  dev_null_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null_.open() || !make_pipe(wake_read_, wake_write_)) {
    error = errno_text("cannot set up");
    return false;
  }
  ::fcntl(wake_read_.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(wake_write_.get(), F_SETFL, O_NONBLOCK);
  g_wake_fd = wake_write_.get();
  for (int fd : {1, 2}) {
    struct stat st {};
    sinks_[fd].fd = fd;
    sinks_[fd].regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  }

  // A signal ignored when we start stays ignored, for us and for the workers (nohup works).
  sigprocmask(SIG_SETMASK, nullptr, &original_mask_);
  sigemptyset(&handled_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGUSR1}) {
    sigaction(sig, nullptr, &original_[sig]);
    sigaddset(&handled_, sig);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_mask = handled_;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  for (int sig : kStopSignals) {
    if (original_[sig].sa_handler != SIG_IGN) sigaction(sig, &sa, nullptr);
  }
  // SIGUSR1 is passed on to every rank, whose flight recorders dump (it stops nothing).
  if (original_[SIGUSR1].sa_handler != SIG_IGN) sigaction(SIGUSR1, &sa, nullptr);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, nullptr);  // a closed stdout reader becomes EPIPE
  sigprocmask(SIG_UNBLOCK, &handled_, nullptr);
  self_ = ::getpid();
  return true;
}

bool Launcher::spawn(Worker& w, std::vector<std::string> env, int inherit, std::string& error) {
  Fd out_read, out_write, err_read, err_write;
  if (!make_pipe(out_read, out_write) || !make_pipe(err_read, err_write)) {
    error = errno_text("cannot create a pipe");
    if (errno == EMFILE) error += "; raise the open-file limit (ulimit -n) or start fewer ranks";
    return false;
  }

  // Everything the child needs is built before fork().
  std::vector<char*> argv, envp;
  for (std::string& a : opt_.command) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string exec_error = "tributary-run: cannot run '" + opt_.command[0] + "': ";
  const std::string inherit_error =
      "tributary-run: cannot pass the rendezvous store's socket to rank " + std::to_string(w.rank) +
      ": ";
#if defined(__linux__)
  const CpuMask cpus = cpu_mask(w.cpus);  // made before fork: the child only calls the kernel
  const std::string bind_error = "tributary-run: cannot bind rank " + std::to_string(w.rank) +
                                 " to CPUs " + internal::cpu_list_text(w.cpus) + ": ";
#endif

  sigset_t blocked;
  sigprocmask(SIG_BLOCK, &handled_, &blocked);  // no handler of ours may run in the child
  pid_t pid = ::fork();
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGUSR1}) {
      sigaction(sig, &original_[sig], nullptr);
    }
    sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    ::setpgid(0, 0);
#if defined(__linux__)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != self_) ::_exit(1);  // the launcher died before prctl took effect
#endif
    if (::dup2(dev_null_.get(), 0) < 0 || ::dup2(out_write.get(), 1) < 0 ||
        ::dup2(err_write.get(), 2) < 0) {
      ::_exit(126);
    }
    if (inherit >= 0 && ::fcntl(inherit, F_SETFD, 0) != 0) {
      child_failed(inherit_error, errno);
      ::_exit(126);
    }
#if defined(__linux__)
    if (!w.cpus.empty() &&
        (cpus.set ? ::sched_setaffinity(0, cpus.bytes, cpus.set.get()) : (errno = ENOMEM, -1)) != 0) {
      child_failed(bind_error, errno);
      ::_exit(126);
    }
#endif
    environ = envp.data();
    ::execvp(argv[0], argv.data());
    const int code = errno == ENOENT ? 127 : 126;
    child_failed(exec_error, errno);
    ::_exit(code);
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &blocked, nullptr);
  if (pid < 0) {
    errno = fork_errno;
    error = errno_text("cannot fork") + (fork_errno == EAGAIN ? "; too many processes?" : "");
    return false;
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  w.pid = pid;
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  w.out.fd = std::move(out_read);
  w.out.sink = 1;
  w.err.fd = std::move(err_read);
  w.err.sink = 2;
  return true;
}

int Launcher::run() {
  std::string error;
  const bool multi_node = opt_.nnodes > 1;
  if (multi_node) {
    // Before anything else: a node that is missing or misconfigured fails here, with no worker
    // started anywhere.
    JoinOptions join{opt_.nnodes,      opt_.node_rank,    opt_.nproc,
                     opt_.master_addr, *opt_.master_port, opt_.join_timeout,
                     opt_.join_timeout_text};
    if (!join_nodes(join, error)) {
      std::fprintf(stderr, "tributary-run: node %d of %d: %s\n", opt_.node_rank, opt_.nnodes,
                   error.c_str());
      return 1;
    }
  }
  if (!setup(error)) {
    std::fprintf(stderr, "tributary-run: %s\n", error.c_str());
    return 1;
  }
  const int n = opt_.nproc;
  const int first_rank = opt_.node_rank * n;
  const std::string master_addr = opt_.master_addr.empty() ? "127.0.0.1" : opt_.master_addr;
  // One node: the store's socket on MASTER_PORT (given, or a free one), held until rank 0 has it,
  // and a free port per worker for TF_CONFIG.
  std::vector<int> ports;
  Fd store_socket;
  if (!multi_node) {
    // A world of one has no store; a rank 0 that binds the port itself asked for it released.
    if (n > 1 && opt_.hand_over_store_socket) {
      store_socket = listen_for_store(opt_.master_port.value_or(0), error);
      const int port = store_socket.open() ? bound_port(store_socket.get()) : -1;
      if (port < 0) {
        if (error.empty()) error = errno_text("cannot read the rendezvous store's port");
        std::fprintf(stderr, "tributary-run: %s\n", error.c_str());
        return 1;
      }
      opt_.master_port = port;
    }
    auto found = free_ports(opt_.master_port ? n : n + 1, opt_.master_port.value_or(-1), error);
    if (!found) {
      std::fprintf(stderr, "tributary-run: %s\n", error.c_str());
      return 1;
    }
    ports = std::move(*found);
  }
  const int master_port = opt_.master_port ? *opt_.master_port : ports.back();
  std::string cluster = "{\"cluster\": {\"worker\": [";
  for (int i = 0; i < n && !multi_node; ++i) {
    cluster += (i ? ", \"127.0.0.1:" : "\"127.0.0.1:") + std::to_string(ports[i]) + "\"";
  }
  cluster += "]}, \"task\": {\"type\": \"worker\", \"index\": ";

  // The inherited environment, less what we set, then LaunchOptions::env, then the cluster spec.
  std::vector<std::string> base;
  auto overridden = [&](std::string_view kv) {
    std::string_view key = kv.substr(0, kv.find('='));
    if (is_launcher_variable(key)) return true;
    return std::any_of(opt_.env.begin(), opt_.env.end(), [&](const std::string& e) {
      return std::string_view(e).substr(0, e.find('=')) == key;
    });
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!overridden(*e)) base.emplace_back(*e);
  }
  base.insert(base.end(), opt_.env.begin(), opt_.env.end());
  const std::string ws = std::to_string(n * opt_.nnodes), mp = std::to_string(master_port);
  for (const char* k : {"WORLD_SIZE=", "TRIBUTARY_WORLD_SIZE="}) base.push_back(k + ws);
  // TRIBUTARY_* come first in the cluster-spec order: without TRIBUTARY_LOCAL_WORLD_SIZE the ranks
  // did not know how many of them share this host.
  for (const char* k : {"LOCAL_WORLD_SIZE=", "TRIBUTARY_LOCAL_WORLD_SIZE="}) {
    base.push_back(k + std::to_string(n));
  }
  for (const char* k : {"MASTER_ADDR=", "TRIBUTARY_MASTER_ADDR="}) base.push_back(k + master_addr);
  for (const char* k : {"MASTER_PORT=", "TRIBUTARY_MASTER_PORT="}) base.push_back(k + mp);

  std::vector<std::vector<int>> binding;
  if (opt_.bind_to_core) {
    const std::vector<std::vector<int>> cores = group_cores(allowed_cpus(error));
    if (cores.empty()) {
      std::fprintf(stderr, "tributary-run: --bind-to core: %s\n", error.c_str());
      return 1;
    }
    if (static_cast<size_t>(n) > cores.size()) {
      std::fprintf(stderr,
                   "tributary-run: warning: --bind-to core with %d workers on %zu cores: some "
                   "workers share a core (--bind-to none lets the kernel place them)\n",
                   n, cores.size());
    }
    binding = plan_core_binding(cores, n);
  }

  start_ = Clock::now();
  workers_.resize(n);
  for (int i = 0; i < n; ++i) {
    Worker& w = workers_[i];
    w.rank = first_rank + i;
    const std::string r = std::to_string(w.rank), local = std::to_string(i);
    w.prefix = opt_.prefix ? "[rank " + r + "] " : "";
    if (!binding.empty()) w.cpus = binding[static_cast<size_t>(i)];
    if (opt_.report_bindings) {
      std::fprintf(
          stderr, "tributary-run: rank %s bound to CPUs %s\n", r.c_str(),
          w.cpus.empty() ? "(not bound: the launcher's)" : internal::cpu_list_text(w.cpus).c_str());
    }
    std::vector<std::string> env = base;
    for (const char* k : {"RANK=", "TRIBUTARY_RANK="}) env.push_back(k + r);
    for (const char* k : {"LOCAL_RANK=", "TRIBUTARY_LOCAL_RANK="}) env.push_back(k + local);
    if (!multi_node) env.push_back("TF_CONFIG=" + cluster + local + "}}");
    const bool serves_store = w.rank == 0 && store_socket.open();
    if (serves_store) env.push_back("TRIBUTARY_STORE_FD=" + std::to_string(store_socket.get()));
    if (!spawn(w, std::move(env), serves_store ? store_socket.get() : -1, error)) {
      note("cannot start rank " + r + ": " + error);
      for (int j = i; j < n; ++j) workers_[j].exited = true;  // never started
      fail(1);
      begin_stop(SIGTERM);
      break;
    }
    // Rank 0 has the store's socket now (or never will): the launcher's copy would keep the port
    // and queue connections after rank 0 is gone.
    if (w.rank == 0) store_socket.reset();
  }
  store_socket.reset();
  loop();
  flush_final();
  for (const Worker& w : workers_) {
    if (w.pid > 0 && w.exited && !w.abandoned) ::waitpid(w.pid, nullptr, WNOHANG);
  }
  return status_.value_or(0);
}

bool Launcher::done() const {
  return std::all_of(workers_.begin(), workers_.end(),
                     [](const Worker& w) { return w.exited && !w.open(); });
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> streams;
  for (;;) {
    check_signals();
    // Scan on SIGCHLD, and now and then in case a wake-up was lost.
    if (g_child_exited || Clock::now() - last_exit_scan_ >= kMaxPollWait) {
      g_child_exited = 0;
      last_exit_scan_ = Clock::now();
      check_exits();
    }
    check_deadlines();
    if (done()) return;

    fds.clear();
    streams.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    if (sinks_[1].pending() + sinks_[2].pending() < kMaxQueued) {
      for (Worker& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (!s->fd.open()) continue;
          fds.push_back({s->fd.get(), POLLIN, 0});
          streams.emplace_back(&w, s);
        }
      }
    }
    const size_t sink_base = fds.size();
    for (int fd : {1, 2}) {
      if (sinks_[fd].pending() > 0) fds.push_back({fd, POLLOUT, 0});
    }
    Clock::time_point wake = Clock::now() + kMaxPollWait;
    if (stage_ != Stage::kRunning) wake = std::min(wake, stage_deadline_);
    if (stage_ == Stage::kRunning && opt_.timeout) wake = std::min(wake, start_ + *opt_.timeout);
    if (stage_ == Stage::kRunning && linger_deadline_) wake = std::min(wake, *linger_deadline_);
    int wait_ms = static_cast<int>(std::max<long long>(0, time_until(wake).count() + 1));
    int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready <= 0) continue;  // timeout, or EINTR from a signal: both handled at the top
    if (fds[0].revents != 0) {
      char buf[256];
      while (::read(wake_read_.get(), buf, sizeof(buf)) > 0) {
      }
    }
    for (size_t k = 0; k < streams.size(); ++k) {
      if (fds[k + 1].revents != 0) read_stream(*streams[k].first, *streams[k].second, 1);
    }
    for (size_t k = sink_base; k < fds.size(); ++k) {
      if (fds[k].revents != 0) flush_some(sinks_[fds[k].fd]);
    }
  }
}

void Launcher::check_signals() {
  if (const int dumps = g_dump_count; dumps != handled_dumps_) {
    handled_dumps_ = dumps;
    note("received SIGUSR1; forwarding it to every rank (their flight recorders dump)");
    for (const Worker& w : workers_) {
      // The rank's own process only: a shell or helper in its group could die of SIGUSR1.
      if (w.pid > 0 && !w.exited && !w.abandoned) ::kill(w.pid, SIGUSR1);
    }
  }
  int count = g_stop_count;
  if (count == handled_stops_) return;
  handled_stops_ = count;
  const int sig = g_stop_signal;
  fail(128 + sig);
  if (stage_ == Stage::kRunning) {
    note("received " + describe_signal(sig) + "; forwarding it to every rank");
    begin_stop(sig);
  } else if (stage_ == Stage::kTerminating) {
    note("received " + describe_signal(sig) + " again; sending SIGKILL to every rank");
    send_kill();
  }
}

void Launcher::check_exits() {
  for (Worker& w : workers_) {
    if (w.exited) continue;
    siginfo_t info{};
    // WNOWAIT leaves the zombie in place: its pid, and so its process group id, stays ours.
    if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != w.pid) {
      continue;
    }
    w.exited = true;
    // Read what it wrote before dying, so its last lines come before our report.
    read_stream(w, w.out, 16);
    read_stream(w, w.err, 16);
    on_exit(w, info);
  }
  if (stage_ == Stage::kRunning && !linger_deadline_ &&
      std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exited; })) {
    linger_deadline_ = Clock::now() + kLinger;
  }
}

void Launcher::on_exit(Worker& w, const siginfo_t& info) {
  const bool killed = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
  if (!killed && info.si_status == 0) return;
  if (stage_ != Stage::kRunning) return;  // a consequence of our stopping the job, not news
  const std::string r = "rank " + std::to_string(w.rank);
  if (killed) {
    note(r + " was killed by signal " + describe_signal(info.si_status) +
         (info.si_code == CLD_DUMPED ? " (core dumped)" : ""));
    fail(128 + info.si_status);
  } else {
    note(r + " exited with status " + std::to_string(info.si_status));
    fail(info.si_status);
  }
  int running = static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& o) { return !o.exited; }));
  if (running > 0) {
    note("stopping the other " + std::to_string(running) + (running == 1 ? " rank" : " ranks") +
         " (SIGTERM, then SIGKILL after " + opt_.grace_text + ")");
  }
  begin_stop(SIGTERM);
}

void Launcher::check_deadlines() {
  const auto now = Clock::now();
  if (stage_ == Stage::kRunning && opt_.timeout && now >= start_ + *opt_.timeout) {
    note("the job did not finish within --timeout " + opt_.timeout_text + "; stopping every rank");
    fail(kTimeoutExitStatus);
    begin_stop(SIGTERM);
  } else if (stage_ == Stage::kRunning && linger_deadline_ && now >= *linger_deadline_) {
    // Every rank exited, but something they started still holds their output open.
    std::string ranks = rank_list([](const Worker& w) { return w.open(); });
    linger_deadline_.reset();
    if (!ranks.empty()) {
      note(ranks + " exited, but processes started there still hold the output; stopping them");
      begin_stop(SIGTERM);
    }
  } else if (stage_ == Stage::kTerminating && now >= stage_deadline_) {
    std::string ranks = rank_list([](const Worker& w) { return !w.exited || w.open(); });
    if (!ranks.empty()) {
      note(ranks + " still running " + opt_.grace_text + " after the stop signal; sending SIGKILL");
    }
    send_kill();
  } else if (stage_ == Stage::kKilling && now >= stage_deadline_) {
    // Stuck in the kernel (or holding a pipe from outside our process groups): give up on it
    // rather than hang.
    for (Worker& w : workers_) {
      if (!w.exited) {
        note("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
             ") did not exit after SIGKILL; leaving it");
        w.exited = w.abandoned = true;
        fail(1);
      }
      for (Stream* s : {&w.out, &w.err}) {
        if (!s->fd.open()) continue;
        if (!s->partial.empty()) emit(w, s->sink, s->partial);
        s->fd.reset();
      }
    }
  }
}

void Launcher::begin_stop(int sig) {
  stage_ = Stage::kTerminating;
  stage_deadline_ = Clock::now() + opt_.grace;
  signal_targets(sig);
}

void Launcher::send_kill() {
  stage_ = Stage::kKilling;
  stage_deadline_ = Clock::now() + kKillWait;
  signal_targets(SIGKILL);
}

void Launcher::signal_targets(int sig) {
  for (const Worker& w : workers_) {
    // An exited worker is still an unreaped zombie, so its group id cannot have been reused.
    if (w.pid <= 0 || w.abandoned || (w.exited && !w.open())) continue;
    ::kill(-w.pid, sig);
    // A stopped process would hold the signal until continued; SIGKILL needs no help.
    if (sig != SIGKILL) ::kill(-w.pid, SIGCONT);
  }
}

std::string Launcher::rank_list(bool (*pred)(const Worker&)) const {
  std::string ranks;
  int count = 0;
  for (const Worker& w : workers_) {
    if (!pred(w)) continue;
    ranks += (count++ ? ", " : "") + std::to_string(w.rank);
  }
  if (count == 0) return "";
  return (count == 1 ? "rank " : "ranks ") + ranks;
}

void Launcher::read_stream(Worker& w, Stream& s, int max_reads) {
  char buf[64 * 1024];
  for (int reads = 0; reads < max_reads && s.fd.open(); ++reads) {
    ssize_t n = ::read(s.fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // end of file, or an error that ends the stream all the same
      if (!s.partial.empty()) emit(w, s.sink, s.partial);
      s.partial.clear();
      s.fd.reset();
      return;
    }
    const size_t scanned = s.partial.size();  // holds no '\n'
    s.partial.append(buf, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t nl = s.partial.find('\n', scanned); nl != std::string::npos;
         begin = nl + 1, nl = s.partial.find('\n', begin)) {
      emit(w, s.sink, std::string_view(s.partial).substr(begin, nl - begin));
    }
    s.partial.erase(0, begin);
    if (s.partial.size() >= kMaxLine) {  // bound memory on output without newlines
      emit(w, s.sink, s.partial);
      s.partial.clear();
    }
  }
}

void Launcher::emit(const Worker& w, int sink, std::string_view line) {
  Sink& s = sinks_[sink];
  if (s.broken) return;
  s.queue += w.prefix;
  s.queue += line;
  s.queue += '\n';
}

void Launcher::note(const std::string& message) {
  Sink& s = sinks_[2];
  if (!s.broken) s.queue += "tributary-run: " + message + "\n";
}

void Launcher::flush_some(Sink& s) {
  if (s.pending() == 0) return;
  // PIPE_BUF bytes always fit once poll reports a pipe writable, so this write does not block.
  size_t chunk = s.regular ? s.pending() : std::min<size_t>(s.pending(), PIPE_BUF);
  ssize_t n = ::write(s.fd, s.queue.data() + s.head, chunk);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return;
    s.broken = true;  // EPIPE and the like: nobody is reading any more
    s.queue.clear();
    s.head = 0;
    return;
  }
  s.head += static_cast<size_t>(n);
  if (s.head == s.queue.size()) {
    s.queue.clear();
    s.head = 0;
  } else if (s.head > kMaxQueued / 4 && s.head > s.queue.size() / 2) {
    s.queue.erase(0, s.head);
    s.head = 0;
  }
}

// Writes what is still queued, for at most the grace period.
void Launcher::flush_final() {
  const auto deadline = Clock::now() + opt_.grace;
  while (sinks_[1].pending() + sinks_[2].pending() > 0 && Clock::now() < deadline) {
    pollfd fds[2];
    nfds_t count = 0;
    for (int fd : {1, 2}) {
      if (sinks_[fd].pending() > 0) fds[count++] = {fd, POLLOUT, 0};
    }
    int wait_ms = static_cast<int>(std::max<long long>(0, time_until(deadline).count() + 1));
    if (::poll(fds, count, wait_ms) <= 0) continue;
    for (nfds_t k = 0; k < count; ++k) {
      if (fds[k].revents != 0) flush_some(sinks_[fds[k].fd]);
    }
  }
}

}  // namespace

bool is_launcher_variable(std::string_view key) {
  return std::find(std::begin(kLauncherVariables), std::end(kLauncherVariables), key) !=
         std::end(kLauncherVariables);
}

int launch(LaunchOptions options) {
  Launcher launcher(std::move(options));
  return launcher.run();
}

}  // namespace tributary::tools
