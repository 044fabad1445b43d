// tributary-bench: the all-reduce microbenchmark. See bench_options.cc for the flags and report.cc
// for the output formats; the conventions (algbw, busbw, #wrong, in-place and out-of-place) are
// nccl-tests'.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_options.h"
#include "bench/device_ceiling.h"
#include "bench/lines.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "transports/tcp/congestion.h"
#include "tributary/tributary.h"

namespace tributary::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kTool = "tributary-bench";

// memcpy bandwidth of this machine, counting bytes read and written, on buffers beyond the caches,
// with `threads` threads copying their share of the buffer at once.
double measure_memcpy_gbps(int threads) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const size_t part = bytes / static_cast<size_t>(threads) / 4096 * 4096;
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t off = part * static_cast<size_t>(t);
        std::memcpy(b.data() + off, a.data() + off, t + 1 == threads ? bytes - off : part);
      });
    }
    std::memcpy(b.data(), a.data(), threads == 1 ? bytes : part);
    for (std::thread& t : pool) t.join();
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
    std::swap(a, b);
  }
  return best;
}

// How a loopback trial drives its connection's two ends.
enum class Drive {
  kBlocking,     // per end, a thread sending and one receiving, with blocking send() and recv()
  kNonblocking,  // the same threads, waiting in poll() when the socket is full or empty
  kOneThread,    // per end, one thread both sending and receiving (tcp-direct's exchange, lines.h)
  kOneThreadSpliced,  // the same, sending through a pipe (vmsplice + splice), as ring's zero-copy
};

// One trial of loopback TCP each way with both directions busy: a connection of two sockets, each
// sending `total` bytes and receiving as many, in 1 MiB calls, driven as `drive` says. 0 when no
// connection could be made.
double loopback_tcp_trial(Drive drive, size_t total) {
  const bool nonblocking = drive == Drive::kNonblocking;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    close(listener);
    return 0;
  }
  int a = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(listener);
    close(a);
    return 0;
  }
  int b = accept(listener, nullptr, nullptr);
  close(listener);
  if (b < 0) {
    close(a);
    return 0;
  }
  // What ring's connections between ranks of one host get: TCP_NODELAY and the congestion
  // control of congestion.h.
  for (int fd : {a, b}) {
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)transports::apply_congestion_control(fd, "auto");
  }
  constexpr size_t kChunk = size_t{1} << 20;
  const int flags = nonblocking ? MSG_DONTWAIT : 0;
  // A call that would block waits in poll() for `events`; false on an error or a closed peer.
  auto wait_for = [&](int fd, ssize_t n, short events) {
    if (n > 0) return true;
    if (n == 0 || !nonblocking || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    }
    pollfd p{fd, events, 0};
    return poll(&p, 1, 10'000) > 0;
  };
  auto sender = [&](int fd) {
    std::vector<char> buf(kChunk, 1);
    size_t at = 0;
    for (size_t sent = 0; sent < total;) {
      const size_t want = std::min(kChunk - at, total - sent);
      const ssize_t n = send(fd, buf.data() + at, want, flags | MSG_NOSIGNAL);
      if (!wait_for(fd, n, POLLOUT)) return;
      if (n > 0) {
        sent += static_cast<size_t>(n);
        at = (at + static_cast<size_t>(n)) % kChunk;
      }
    }
  };
  auto receiver = [&](int fd) {
    std::vector<char> buf(kChunk);
    for (size_t got = 0; got < total;) {
      const ssize_t n = recv(fd, buf.data(), kChunk, flags);
      if (!wait_for(fd, n, POLLIN)) return;
      if (n > 0) got += static_cast<size_t>(n);
    }
  };
  std::vector<std::byte> out_a(kChunk, std::byte{1}), out_b(kChunk, std::byte{1});
  std::vector<std::byte> in_a(kChunk), in_b(kChunk);
  std::atomic<bool> exchanged{true};
  auto both_ways = [&](int fd, const std::vector<std::byte>& from, std::vector<std::byte>& into) {
    int pipe_fds[2] = {-1, -1};
    size_t capacity = 0;
    if (drive == Drive::kOneThreadSpliced) {
      if (pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        exchanged.store(false);
        return;
      }
      (void)fcntl(pipe_fds[1], F_SETPIPE_SZ, 1 << 20);
      capacity = static_cast<size_t>(std::max(0, fcntl(pipe_fds[1], F_GETPIPE_SZ)));
    }
    if (!internal::tcp_exchange({.out = fd,
                                 .in = fd,
                                 .from = from.data(),
                                 .into = into.data(),
                                 .span = kChunk,
                                 .total = total,
                                 .pipe_read = pipe_fds[0],
                                 .pipe_write = pipe_fds[1],
                                 .pipe_capacity = capacity},
                                std::chrono::seconds(10))
             .ok()) {
      exchanged.store(false);
    }
    for (int p : pipe_fds) {
      if (p >= 0) close(p);
    }
  };
  // Both ends once, driven as `drive` says; in threads of this process (`b`'s end too, or only
  // `a`'s when `b`'s runs in a child process).
  auto exchange = [&](bool far_end_too) {
    if (drive == Drive::kOneThread || drive == Drive::kOneThreadSpliced) {
      if (!far_end_too) {
        both_ways(a, out_a, in_a);
        return;
      }
      std::thread t1(both_ways, a, std::cref(out_a), std::ref(in_a));
      both_ways(b, out_b, in_b);
      t1.join();
      return;
    }
    std::thread t1(sender, a), t2(receiver, a), t3(sender, b), t4(receiver, b);
    t1.join();
    t2.join();
    t3.join();
    t4.join();
  };
  // The one-thread ways run the far end in a process of its own, as two ranks are: in threads of
  // one process a spliced connection moved 25% less than between two processes (4.7-4.8 GB/s
  // against 6.3-6.5 on this project's 2-vCPU VM, 2026-12-06). Every way exchanges twice on the
  // connection and times the second: a fresh connection's first 256 MiB (slow start, buffers still
  // growing) moved a third less than the next, so that one trial read 3.9-4.0 GB/s while
  // tcp-direct's warm connection moved 6.0-6.6 in the same runs, and ring beat the bound. Even so
  // a trial reads anywhere from 1.3 to 6.1 GB/s on that VM, hence the best of several.
  const bool far_child = drive == Drive::kOneThread || drive == Drive::kOneThreadSpliced;
  const pid_t child = far_child ? fork() : -1;
  if (child == 0) {
    close(a);
    both_ways(b, out_b, in_b);
    both_ways(b, out_b, in_b);
    _exit(exchanged.load() ? 0 : 1);
  }
  exchange(child < 0);
  const auto start = Clock::now();
  exchange(child < 0);
  if (child > 0) {
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      exchanged.store(false);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  close(a);
  close(b);
  return exchanged.load() ? static_cast<double>(total) / seconds / 1e9 : 0;
}

// Loopback TCP throughput each way with both directions busy, as a 2-rank ring uses a link: the
// best of three trials of each way of driving it. On this project's 2-vCPU VM (2026-11-29) the
// first trial after a pause read 0.8-1.0 GB/s and the next ones 2.4-3.9, either way of driving the
// connection, while ring's 256 MiB all-reduce moved 1.9-2.8 GB/s each way: a single trial was a
// bound that the backends beat, which bounds nothing, so the best trial counts. One thread per end
// doing both (as tcp-direct drives a rank's link, lines.h) is tried too: with only the four-thread
// ways this figure read 3.3-3.9 GB/s within the hour in which tcp-direct moved 4.0-5.9 between two
// processes. Since ring sends its large segments zero-copy (tcp_writer.h), sending through a pipe
// is tried too: on the same VM it moved 10-25% more than send() (2026-12-02).
double measure_loopback_tcp_gbps() {
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    for (Drive drive :
         {Drive::kBlocking, Drive::kNonblocking, Drive::kOneThread, Drive::kOneThreadSpliced}) {
      best = std::max(best, loopback_tcp_trial(drive, size_t{256} << 20));
    }
  }
  return best;
}

}  // namespace
}  // namespace tributary::bench

int main(int argc, char** argv) {
  using namespace tributary;
  using namespace tributary::bench;
  std::string help;
  auto parsed = parse_command_line(Tool::kBench, argc, argv, &help);
  if (!parsed.ok()) return fail(kTool, parsed.status().message(), 2);
  if (!help.empty()) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  const BenchOptions& o = *parsed;
  for (DType d : o.dtypes) {
    if (auto sizes = bench_sizes(o, d); !sizes.ok())
      return fail(kTool, sizes.status().message(), 2);
  }
  // Before anything is measured (and before --np starts the ranks): a typo in an output path
  // costs seconds, not the sweep. Files are written by rank 0, the launching process's first.
  if (first_rank()) {
    if (Status s = check_output_paths(o); !s.ok()) return fail(kTool, s.message(), 2);
  }
  if (o.np > 1 && !launched_as_rank()) return relaunch(kTool, o.np, o.bind_to, argc, argv);

  Report report;
  report.options = o;
  report.machine = Machine::probe();
  Runner runner(o);
  if (Status s = runner.setup(&report); !s.ok()) return fail(kTool, s.message(), 2);
  const bool leader = report.rank == 0;
  if (o.ceiling && leader) {
    const int n = report.processes * o.replicas;
    report.ceiling.memcpy_one_core_gbps = measure_memcpy_gbps(1);
    report.ceiling.cores = report.machine.cores;
    report.ceiling.memcpy_gbps = measure_memcpy_gbps(std::max(1, report.machine.cores));
    // The bound is the better of the two: where the cores contend for memory, all of them together
    // can copy less than one alone (this project's 2-vCPU VM, 2026-11-29: 24-29 GB/s on both
    // against 29-33 on one), and the machine still moves what one core does.
    const double memcpy_bound =
        std::max(report.ceiling.memcpy_gbps, report.ceiling.memcpy_one_core_gbps);
    if (o.gpus > 0) {
      // GPU replicas: what the device's memory and its host link move. Their all-reduce bound
      // depends on the links between the GPUs, which this does not measure, so none is drawn.
      auto device = measure_device_ceiling(0);
      if (device.ok()) {
        report.ceiling.device_copy_gbps = device->copy_gbps;
        report.ceiling.to_device_gbps = device->to_device_gbps;
        report.ceiling.to_host_gbps = device->to_host_gbps;
      } else {
        report.ceiling.device_error = device.status().message();
      }
    } else if (report.processes == 1) {
      // All-reduce of S bytes over n in-process replicas moves at least 2nS bytes (read every
      // input, write every output): time >= 2nS / memcpy (every core copying), so algbw = S / time
      // <= memcpy / (2n).
      report.ceiling.algbw = memcpy_bound / (2.0 * n);
      report.ceiling.busbw = report.ceiling.algbw * bus_factor(n);
    } else {
      // Across processes each rank sends and receives 2(n-1)/n x S through its link at best, so
      // busbw <= the link's bandwidth each way with traffic both ways at once.
      report.ceiling.tcp_gbps = measure_loopback_tcp_gbps();
      report.ceiling.busbw = report.ceiling.tcp_gbps;
      report.ceiling.algbw = n > 1 ? report.ceiling.busbw / bus_factor(n) : 0;
      // Ranks on one host over shared memory: the in-process bound, every input read and every
      // output written once by the host's cores together.
      report.ceiling.shm_algbw = memcpy_bound / (2.0 * n);
      report.ceiling.shm_busbw = report.ceiling.shm_algbw * bus_factor(n);
    }
  }
  if (!leader) {
    // Other ranks take part silently; errors still reach stderr.
    Status s = runner.run(&report);
    if (!s.ok()) return fail(kTool, "rank " + std::to_string(report.rank) + ": " + s.message(), 1);
    return 0;
  }
  std::fputs(format_header(report).c_str(), stdout);
  for (const BackendResult& b : report.results) {
    if (!b.skipped.empty()) {
      std::printf("# skipping %s: %s\n", b.spec.c_str(), b.skipped.c_str());
    }
  }
  std::fflush(stdout);
  if (Status s = runner.run(&report); !s.ok()) return fail(kTool, s.message(), 1);
  for (const BackendResult& b : report.results) std::fputs(format_table(report, b).c_str(), stdout);
  std::fputs(format_summary(report).c_str(), stdout);

  int rc = 0;
  if (!o.json_path.empty()) {
    if (Status s = write_json(report, o.json_path); !s.ok()) rc = fail(kTool, s.message(), 1);
  }
  if (!o.csv_path.empty()) {
    if (Status s = write_csv(report, o.csv_path); !s.ok()) rc = fail(kTool, s.message(), 1);
  }
  if (!o.plot_path.empty()) {
    if (Status s = write_plot(report, o.plot_path); !s.ok()) {
      rc = fail(kTool, s.message(), 1);
    } else {
      std::printf("# plot written to %s\n", o.plot_path.c_str());
    }
  }
  int64_t wrong = 0;
  for (const BackendResult& b : report.results) wrong += b.total_wrong();
  if (wrong > 0)
    rc = fail(kTool, std::to_string(wrong) + " wrong element(s); see the #wrong columns", 1);
  if (o.min_busbw > 0) {
    for (const BackendResult& b : report.results) {
      if (b.skipped.empty() && b.avg_busbw() < o.min_busbw) {
        rc = fail(kTool,
                  b.spec + ": average busbw " + std::to_string(b.avg_busbw()) +
                      " GB/s is below --min-busbw " + std::to_string(o.min_busbw),
                  1);
      }
    }
  }
  return rc;
}
