#include "tests/multiprocess/harness.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "tributary/store.h"

namespace tributary::testing {

std::string GroupResult::describe() const {
  std::string s;
  for (size_t r = 0; r < children.size(); ++r) {
    if (!s.empty()) s += "; ";
    s += "rank " + std::to_string(r) + ": ";
    s += children[r].signal ? "signal " + std::to_string(children[r].signal)
                            : "exit " + std::to_string(children[r].exit_code);
  }
  if (watchdog_fired) s += " (the watchdog killed the group: a hang)";
  return s;
}

GroupResult run_group(int world, std::chrono::seconds watchdog, const std::function<int(int)>& fn,
                      const std::function<void()>& after_fork) {
  std::fflush(stdout);
  std::fflush(stderr);
  GroupResult result;
  result.children.resize(static_cast<size_t>(world));
  std::vector<pid_t> pids;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(watchdog.count() + 5));  // a backup for the parent's watchdog
      int code = kChildFailed;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "[rank %d] unknown exception\n", r);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
    result.children[static_cast<size_t>(r)].pid = pid;
  }
  if (after_fork) after_fork();
  size_t remaining = pids.size();
  while (remaining > 0) {
    int status = 0;
    pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != done) continue;
        if (WIFEXITED(status)) result.children[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) result.children[r].signal = WTERMSIG(status);
        pids[r] = -1;
        --remaining;
      }
      continue;
    }
    if (std::chrono::steady_clock::now() - start > watchdog) {
      result.watchdog_fired = true;
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] <= 0) continue;
        dump_stacks(pids[r], "rank " + std::to_string(r) + ", still running after " +
                                 std::to_string(watchdog.count()) + " s");
        kill(pids[r], SIGKILL);
      }
      watchdog = std::chrono::seconds(1000000);  // reap what is left
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void dump_stacks(int pid, const std::string& who) {
  const char* stacks = std::getenv("TEST_HANG_STACKS");
  if (stacks != nullptr && std::string(stacks) == "0") return;
  std::fprintf(stderr, "[watchdog] %s (pid %d): the stacks of its threads follow\n", who.c_str(),
               pid);
  std::fflush(stderr);
  // gdb attaches (the tests run as root, or under ptrace_scope 0), prints and detaches; `timeout`
  // bounds it, and the lines it prints about itself are dropped.
  const std::string cmd =
      "if command -v gdb >/dev/null 2>&1; then timeout 60 gdb -nx -q -batch -p " +
      std::to_string(pid) +
      " -ex 'thread apply all bt 40' 2>&1 | grep -v -e '^\\[New LWP' -e '^\\[Thread debugging' "
      "-e '^Using host libthread_db' >&2; else echo '[watchdog] gdb is not installed: no stacks' "
      ">&2; fi";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "[watchdog] gdb could not print the stacks of pid %d\n", pid);
  }
  std::fflush(stderr);
}

const std::string& why_siblings_cannot_read_each_other() {
  static const std::string why = [] {
    static volatile uint64_t mark = 0;
    constexpr uint64_t kMark = 0x7472696275746172;
    int ready[2];
    if (pipe(ready) != 0) return std::string("the probe could not make a pipe");
    const pid_t target = fork();
    if (target == 0) {
      mark = kMark;
      const char c = 'r';
      if (write(ready[1], &c, 1) != 1) _exit(1);
      pause();
      _exit(0);
    }
    char c = 0;
    const bool started = target > 0 && read(ready[0], &c, 1) == 1;
    close(ready[0]);
    close(ready[1]);
    int code = -1;
    if (started) {
      const pid_t reader = fork();
      if (reader == 0) {
        uint64_t got = 0;
        iovec to{&got, sizeof got};
        iovec from{const_cast<uint64_t*>(&mark), sizeof got};
        const ssize_t n = process_vm_readv(target, &to, 1, &from, 1, 0);
        _exit(n == static_cast<ssize_t>(sizeof got) && got == kMark ? 0 : n < 0 ? errno : 255);
      }
      int status = 0;
      if (reader > 0 && waitpid(reader, &status, 0) == reader && WIFEXITED(status)) {
        code = WEXITSTATUS(status);
      }
    }
    if (target > 0) {
      kill(target, SIGKILL);
      waitpid(target, nullptr, 0);
    }
    if (code == 0) return std::string();
    return "two processes of this user may not read each other's memory here (process_vm_readv: " +
           std::string(code > 0 && code < 255 ? std::strerror(code) : "the probe failed") +
           "), which shm_single_copy=on needs: Yama's kernel.yama.ptrace_scope must be 0, or the "
           "tests run with CAP_SYS_PTRACE (as root)";
  }();
  return why;
}

std::string make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::string dir = ::testing::TempDir() + "tributary_" + tag + "_" + std::to_string(getpid()) +
                    "_" + std::to_string(counter++);
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "cannot create " << dir;
  return dir;
}

StatusOr<BackendContext> group_context(int rank, int world, int local, const std::string& store_dir,
                                       Config config) {
  BackendContext ctx;
  ctx.devices.clear();
  for (int i = 0; i < local; ++i) ctx.devices.push_back(Device::cpu(i));
  ctx.rank = rank;
  ctx.world_size = world;
  ctx.config = std::move(config);
  ctx.coordinator_host = "127.0.0.1";
  ctx.cluster_id = store_dir;
  StoreOptions options;
  options.timeout = std::chrono::seconds(20);
  auto store = FileStore::open(store_dir, options);
  if (!store.ok()) return store.status();
  ctx.store = std::shared_ptr<Store>(std::move(store).value());
  return ctx;
}

StatusOr<BackendContext> tcp_group_context(int rank, int world, int local, std::uint16_t port,
                                           std::map<std::string, std::string> config) {
  config["RANK"] = std::to_string(rank);
  config["WORLD_SIZE"] = std::to_string(world);
  config["MASTER_ADDR"] = "127.0.0.1";
  config["MASTER_PORT"] = std::to_string(port);
  std::vector<Device> devices;
  for (int i = 0; i < local; ++i) devices.push_back(Device::cpu(i));
  return make_backend_context(std::move(devices), Config::from_map(config),
                              std::chrono::seconds(20));
}

HeldStorePort::HeldStorePort() {
  fd_ = listening_socket(&port_);
  if (fd_ < 0) {
    std::fprintf(stderr, "HeldStorePort: cannot listen (%s); rank 0 binds a free port itself\n",
                 std::strerror(errno));
    port_ = free_port();
  }
}

std::map<std::string, std::string> HeldStorePort::take(int rank) {
  if (fd_ < 0) return {};
  if (rank == 0) return {{"TRIBUTARY_STORE_FD", std::to_string(fd_)}};
  release();
  return {};
}

void HeldStorePort::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::uint16_t free_port() {
  // The kernel may hand the same ephemeral port to two binds in a row once the first socket is
  // closed, and a caller that asks for several ports (a cluster spec) must get distinct ones: a
  // port given out before by this process is never given again.
  static std::mutex mu;
  static std::set<std::uint16_t> given;
  const std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    std::uint16_t port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    if (fd >= 0) ::close(fd);
    if (port != 0 && given.insert(port).second) return port;
  }
  ADD_FAILURE() << "no free port on 127.0.0.1 that this process has not used already";
  return 0;
}

}  // namespace tributary::testing
