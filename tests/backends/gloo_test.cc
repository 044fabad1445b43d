// The gloo backend across real processes on loopback: every all-reduce algorithm the installed Gloo
// offers, at world sizes 1 to 4 with 1 and 2 local replicas, checked exactly on small integers;
// broadcast, all-gather, reduce-scatter, reduce and batch_reduce; and failures: a peer that exits
// mid-run, a peer that goes silent, mismatched collectives, a rendezvous nobody joins, and an
// unsupported dtype. Each rank is a forked child with alarm() set; the parent waits under a
// watchdog and kills the children when it fires, so a hang fails the test instead of stalling it.
#include <arpa/inet.h>
#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_algorithms.h"
#include "backends/gloo/gloo_context.h"
#include "tests/multiprocess/conformance.h"
#include "tests/multiprocess/harness.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary {
namespace {

using Clock = std::chrono::steady_clock;

// --- processes -----------------------------------------------------------------------------------

struct Rank {
  int rank = 0;
  int world = 1;
  int local = 1;
  BackendContext context;
};

// A child's failures go to stderr (visible in the test log) and into its exit status.
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  void fail(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    char buf[2048];
    va_list args;
    va_start(args, format);
    vsnprintf(buf, sizeof(buf), format, args);
    va_end(args);
    if (failures_ < 20) fprintf(stderr, "[rank %d] FAILED: %s\n", rank_, buf);
    ++failures_;
  }
  bool ok() const { return failures_ == 0; }
  int failures() const { return failures_; }

 private:
  int rank_;
  int failures_ = 0;
};

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tributary-gloo-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* made = mkdtemp(buf.data());
  return made ? std::string(made) : std::string();
}

// Runs body(rank) in `world` forked children and returns their exit codes (128 + signal when
// killed, -1 when the watchdog had to kill it). The watchdog kills a child still running after
// child_limit_s, once its stacks are printed (dump_stacks); alarm() 30 s later is the backup.
std::vector<int> run_world(int world, int local, const std::function<int(Rank&)>& body,
                           int child_limit_s = 60) {
  const std::string dir = make_temp_dir();
  EXPECT_FALSE(dir.empty());
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(child_limit_s + 30));
      Rank me;
      me.rank = r;
      me.world = world;
      me.local = local;
      me.context.devices.clear();
      for (int i = 0; i < local; ++i) me.context.devices.push_back(Device::cpu(i));
      me.context.rank = r;
      me.context.world_size = world;
      me.context.coordinator_host = "127.0.0.1";
      me.context.cluster_id = "gloo-test";
      StoreOptions so;
      so.timeout = std::chrono::seconds(30);
      auto store = FileStore::open(dir + "/store", so);
      if (!store.ok()) {
        fprintf(stderr, "[rank %d] cannot open the file store: %s\n", r,
                store.status().message().c_str());
        _exit(3);
      }
      me.context.store = std::shared_ptr<Store>(std::move(store).value());
      int code = 1;
      // Nothing may leave the child's body but its exit code: an exception would reach the
      // child's copy of GoogleTest, which would go on running the rest of the suite.
      try {
        code = body(me);
      } catch (const std::exception& e) {
        fprintf(stderr, "[rank %d] uncaught exception: %s\n", r, e.what());
      } catch (...) {
        fprintf(stderr, "[rank %d] uncaught exception\n", r);
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<size_t>(world), -1);
  const auto deadline = Clock::now() + std::chrono::seconds(child_limit_s);
  size_t left = pids.size();
  while (left > 0 && Clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      pid_t got = waitpid(pids[i], &status, WNOHANG);
      if (got == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[i] = 0;
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) continue;
    ADD_FAILURE() << "watchdog: rank " << i << " still running after " << child_limit_s
                  << " s; killing it (its stacks are above)";
    ::tributary::testing::dump_stacks(pids[i], "rank " + std::to_string(i));
    kill(pids[i], SIGKILL);
    waitpid(pids[i], nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return codes;
}

void expect_all_zero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << " exited with " << codes[r]
                           << " (1 = failed checks, 128+n = signal n, 142 = alarm)";
  }
}

StatusOr<std::unique_ptr<CrossDeviceOps>> create(const std::string& spec, const Rank& me) {
  return builtin_backends().create(spec, me.context);
}

// --- values --------------------------------------------------------------------------------------

// Element j of global replica g: a permutation of 1..n over replicas, times 1..3, so that sums,
// means and maxima are small exact numbers and the maximum moves between replicas.
double value_of(int64_t g, int64_t j, int64_t n) {
  return static_cast<double>(((g + j) % n + 1) * (j % 3 + 1));
}

double expected_of(ReduceOp op, DType dtype, int64_t j, int64_t n) {
  double sum = 0, max = -1e300;
  for (int64_t g = 0; g < n; ++g) {
    sum += value_of(g, j, n);
    max = std::max(max, value_of(g, j, n));
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kMax:
      return max;
    case ReduceOp::kMean:
      return dtype_is_floating(dtype) ? sum / static_cast<double>(n)
                                      : std::trunc(sum / static_cast<double>(n));
    default:
      return 0;
  }
}

struct Host {
  std::vector<std::byte> bytes;
  Tensor tensor;
  Host(DType dtype, int64_t count, int device)
      : bytes(static_cast<size_t>(count) * dtype_size(dtype) + 1),
        tensor(bytes.data(), dtype, Shape{count}, Device::cpu(device)) {}
  void set(int64_t i, double v) { dtype_store(tensor.dtype(), tensor.data(), i, v); }
  double get(int64_t i) const { return dtype_load(tensor.dtype(), tensor.data(), i); }
};

const char* op_name(ReduceOp op) { return std::string_view(reduce_op_name(op)).data(); }
const char* dt_name(DType d) { return std::string_view(dtype_name(d)).data(); }

// One all-reduce, checked on every local output. In place on even calls.
void check_all_reduce(CrossDeviceOps& ops, const Rank& me, ReduceOp op, DType dtype, int64_t count,
                      bool in_place, Checker& check, const std::string& spec) {
  const int64_t n = static_cast<int64_t>(me.world) * me.local;
  std::vector<std::unique_ptr<Host>> in, out;
  std::vector<Tensor> ins, outs;
  for (int i = 0; i < me.local; ++i) {
    in.push_back(std::make_unique<Host>(dtype, count, i));
    const int64_t g = static_cast<int64_t>(me.rank) * me.local + i;
    for (int64_t j = 0; j < count; ++j) in.back()->set(j, value_of(g, j, n));
    ins.push_back(in.back()->tensor);
    if (in_place) {
      outs.push_back(in.back()->tensor);
    } else {
      out.push_back(std::make_unique<Host>(dtype, count, i));
      for (int64_t j = 0; j < count; ++j) out.back()->set(j, -7);
      outs.push_back(out.back()->tensor);
    }
  }
  Status s = ops.all_reduce(op, PerReplica<Tensor>(ins), PerReplica<Tensor>(outs)).wait();
  if (!s.ok()) {
    check.fail("%s all_reduce %s %s count %lld: %s", spec.c_str(), op_name(op), dt_name(dtype),
               static_cast<long long>(count), s.to_string().c_str());
    return;
  }
  for (int i = 0; i < me.local; ++i) {
    for (int64_t j = 0; j < count; ++j) {
      const double got = dtype_load(dtype, outs[static_cast<size_t>(i)].data(), j);
      const double want = dtype_round(dtype, expected_of(op, dtype, j, n));
      if (got != want) {
        check.fail("%s all_reduce %s %s count %lld%s: output %d element %lld is %g, want %g",
                   spec.c_str(), op_name(op), dt_name(dtype), static_cast<long long>(count),
                   in_place ? " in place" : "", i, static_cast<long long>(j), got, want);
        return;
      }
    }
  }
}

// --- all-reduce across algorithms ----------------------------------------------------------------

// world size, local replicas, Gloo's mode (async: its I/O thread; sync, busy_poll: the caller
// reads, classic algorithms only).
using WorldParam = std::tuple<int, int, std::string>;
class GlooWorld : public ::testing::TestWithParam<WorldParam> {};

TEST_P(GlooWorld, AllReduceEveryAlgorithm) {
  // Named copies: lambdas below capture them (clang 14 cannot capture structured bindings).
  const int world = std::get<0>(GetParam());
  const int local = std::get<1>(GetParam());
  const std::string mode = std::get<2>(GetParam());
  expect_all_zero(run_world(
      world, local,
      [mode](Rank& me) {
        Checker check(me.rank);
        int calls = 0;
        for (std::string algorithm : {"ring", "ring_chunked", "halving_doubling", "bcube",
                                      "unbound_ring", "unbound_bcube", "auto"}) {
          if (mode != "async" && algorithm.starts_with("unbound_")) continue;  // refused
          const std::string spec = "gloo:timeout=20s,mode=" + mode + ",algorithm=" + algorithm;
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            continue;
          }
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
            for (DType dtype : {DType::kFloat32, DType::kInt32}) {
              for (int64_t count :
                   {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{1} << 20}) {
                check_all_reduce(**made, me, op, dtype, count, (calls++ % 2) == 0, check, spec);
              }
            }
          }
        }
        return check.ok() ? 0 : 1;
      },
      240));
}

TEST_P(GlooWorld, BroadcastAllGatherReduceScatter) {
  // Named copies: lambdas below capture them (clang 14 cannot capture structured bindings).
  const int world = std::get<0>(GetParam());
  const int local = std::get<1>(GetParam());
  const std::string mode = std::get<2>(GetParam());
  expect_all_zero(run_world(
      world, local,
      [mode](Rank& me) {
        Checker check(me.rank);
        const int64_t n = static_cast<int64_t>(me.world) * me.local;
        for (const char* rs : {"halving_doubling", "all_reduce"}) {
          const std::string spec =
              "gloo:timeout=20s,mode=" + mode + ",reduce_scatter=" + std::string(rs);
          auto made = create(spec, me);
          if (mode == "async" && std::string(rs) == "halving_doubling") {
            // Refused: Gloo's ReduceScatterHalvingDoubling misplaced elements in async mode.
            if (made.ok() || made.status().code() != StatusCode::kInvalidArgument) {
              check.fail("%s should be refused", spec.c_str());
            }
            continue;
          }
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            continue;
          }
          CrossDeviceOps& ops = **made;
          // Broadcast from every root.
          for (int root = 0; root < me.world; ++root) {
            for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1001}}) {
              Host source(DType::kFloat32, count, 0);
              for (int64_t j = 0; j < count; ++j) {
                source.set(j, me.rank == root ? static_cast<double>(root * 1000 + j) : -1.0);
              }
              std::vector<std::unique_ptr<Host>> dst;
              std::vector<Tensor> dsts;
              for (int i = 0; i < me.local; ++i) {
                dst.push_back(std::make_unique<Host>(DType::kFloat32, count, i));
                dsts.push_back(dst.back()->tensor);
              }
              Status s = ops.broadcast(source.tensor, Mirrored<Tensor>(dsts), root).wait();
              if (!s.ok()) check.fail("broadcast root %d: %s", root, s.to_string().c_str());
              for (int i = 0; s.ok() && i < me.local; ++i) {
                for (int64_t j = 0; j < count; ++j) {
                  if (dst[static_cast<size_t>(i)]->get(j) != static_cast<double>(root * 1000 + j)) {
                    check.fail("broadcast root %d count %lld: destination %d element %lld is %g",
                               root, static_cast<long long>(count), i, static_cast<long long>(j),
                               dst[static_cast<size_t>(i)]->get(j));
                    break;
                  }
                }
              }
            }
          }
          // All-gather, int32.
          for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}}) {
            std::vector<std::unique_ptr<Host>> in, out;
            std::vector<Tensor> ins, outs;
            for (int i = 0; i < me.local; ++i) {
              const int64_t g = static_cast<int64_t>(me.rank) * me.local + i;
              in.push_back(std::make_unique<Host>(DType::kInt32, count, i));
              for (int64_t j = 0; j < count; ++j)
                in.back()->set(j, static_cast<double>(g * 100000 + j));
              out.push_back(std::make_unique<Host>(DType::kInt32, count * n, i));
              ins.push_back(in.back()->tensor);
              outs.push_back(out.back()->tensor);
            }
            Status s = ops.all_gather(PerReplica<Tensor>(ins), PerReplica<Tensor>(outs)).wait();
            if (!s.ok())
              check.fail("all_gather count %lld: %s", static_cast<long long>(count),
                         s.to_string().c_str());
            for (int i = 0; s.ok() && i < me.local; ++i) {
              for (int64_t k = 0; k < count * n; ++k) {
                const double want = static_cast<double>((k / count) * 100000 + k % count);
                if (out[static_cast<size_t>(i)]->get(k) != want) {
                  check.fail("all_gather count %lld: output %d element %lld is %g, want %g",
                             static_cast<long long>(count), i, static_cast<long long>(k),
                             out[static_cast<size_t>(i)]->get(k), want);
                  break;
                }
              }
            }
          }
          // Reduce-scatter: output i of replica G holds op over g of the inputs' slice G.
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
            for (DType dtype : {DType::kFloat32, DType::kInt32}) {
              for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}}) {
                std::vector<std::unique_ptr<Host>> in, out;
                std::vector<Tensor> ins, outs;
                for (int i = 0; i < me.local; ++i) {
                  const int64_t g = static_cast<int64_t>(me.rank) * me.local + i;
                  in.push_back(std::make_unique<Host>(dtype, count * n, i));
                  for (int64_t j = 0; j < count * n; ++j) in.back()->set(j, value_of(g, j, n));
                  out.push_back(std::make_unique<Host>(dtype, count, i));
                  ins.push_back(in.back()->tensor);
                  outs.push_back(out.back()->tensor);
                }
                Status s = ops.reduce_scatter(op, PerReplica<Tensor>(ins), PerReplica<Tensor>(outs))
                               .wait();
                if (!s.ok()) {
                  check.fail("%s reduce_scatter %s %s count %lld: %s", spec.c_str(), op_name(op),
                             dt_name(dtype), static_cast<long long>(count), s.to_string().c_str());
                  continue;
                }
                for (int i = 0; i < me.local; ++i) {
                  const int64_t G = static_cast<int64_t>(me.rank) * me.local + i;
                  for (int64_t k = 0; k < count; ++k) {
                    const double want =
                        dtype_round(dtype, expected_of(op, dtype, G * count + k, n));
                    if (out[static_cast<size_t>(i)]->get(k) != want) {
                      check.fail(
                          "%s reduce_scatter %s %s count %lld: output %d element %lld is %g, "
                          "want %g",
                          spec.c_str(), op_name(op), dt_name(dtype), static_cast<long long>(count),
                          i, static_cast<long long>(k), out[static_cast<size_t>(i)]->get(k), want);
                      break;
                    }
                  }
                }
              }
            }
          }
          // Reduce to one destination, and a batch of two dtypes.
          {
            const int64_t count = 33;
            std::vector<std::unique_ptr<Host>> in;
            std::vector<Tensor> ins;
            for (int i = 0; i < me.local; ++i) {
              const int64_t g = static_cast<int64_t>(me.rank) * me.local + i;
              in.push_back(std::make_unique<Host>(DType::kFloat64, count, i));
              for (int64_t j = 0; j < count; ++j) in.back()->set(j, value_of(g, j, n));
              ins.push_back(in.back()->tensor);
            }
            Host dest(DType::kFloat64, count, 0);
            Status s =
                ops.reduce(ReduceOp::kSum, PerReplica<Tensor>(ins), Mirrored<Tensor>({dest.tensor}))
                    .wait();
            if (!s.ok()) check.fail("reduce: %s", s.to_string().c_str());
            for (int64_t j = 0; s.ok() && j < count; ++j) {
              if (dest.get(j) != expected_of(ReduceOp::kSum, DType::kFloat64, j, n)) {
                check.fail("reduce: element %lld is %g", static_cast<long long>(j), dest.get(j));
                break;
              }
            }
            std::vector<std::unique_ptr<Host>> in2;
            std::vector<Tensor> ins2;
            for (int i = 0; i < me.local; ++i) {
              const int64_t g = static_cast<int64_t>(me.rank) * me.local + i;
              in2.push_back(std::make_unique<Host>(DType::kInt64, 5, i));
              for (int64_t j = 0; j < 5; ++j) in2.back()->set(j, value_of(g, j, n));
              ins2.push_back(in2.back()->tensor);
            }
            Host dest2(DType::kInt64, 5, 0);
            std::vector<ReducePair> pairs = {
                {PerReplica<Tensor>(ins), Mirrored<Tensor>({dest.tensor})},
                {PerReplica<Tensor>(ins2), Mirrored<Tensor>({dest2.tensor})}};
            s = ops.batch_reduce(ReduceOp::kMax, pairs).wait();
            if (!s.ok()) check.fail("batch_reduce: %s", s.to_string().c_str());
            for (int64_t j = 0; s.ok() && j < count; ++j) {
              if (dest.get(j) != expected_of(ReduceOp::kMax, DType::kFloat64, j, n) ||
                  (j < 5 && dest2.get(j) != expected_of(ReduceOp::kMax, DType::kInt64, j, n))) {
                check.fail("batch_reduce: element %lld is %g / %g", static_cast<long long>(j),
                           dest.get(j), j < 5 ? dest2.get(j) : 0.0);
                break;
              }
            }
          }
        }
        return check.ok() ? 0 : 1;
      },
      120));
}

std::vector<WorldParam> world_params() {
  std::vector<WorldParam> out;
  for (const char* mode : {"async", "sync"}) {
    for (int world : {1, 2, 3, 4}) {
      for (int local : {1, 2}) out.emplace_back(world, local, mode);
    }
  }
  // Spinning readers oversubscribe this 2-core machine quickly: a few shapes only.
  out.emplace_back(2, 1, "busy_poll");
  out.emplace_back(3, 2, "busy_poll");
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorld, ::testing::ValuesIn(world_params()),
                         [](const ::testing::TestParamInfo<WorldParam>& info) {
                           return std::get<2>(info.param) + "_world" +
                                  std::to_string(std::get<0>(info.param)) + "_local" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The size word a broadcast's receivers send the root: the size itself below 2 GiB; above, a hash
// with the high bit set, so that sizes apart by a multiple of 4 GiB (which share their low 32 bits)
// are told apart.
TEST(Gloo, BroadcastSizeWordTellsSizesApart) {
  EXPECT_EQ(backends::broadcast_size_word(0), 0u);
  EXPECT_EQ(backends::broadcast_size_word(4096), 4096u);
  EXPECT_EQ(backends::broadcast_size_word(0x7fffffffu), 0x7fffffffu);
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  for (const uint64_t big : {2 * kGiB, 4 * kGiB, 4 * kGiB + 4096, 8 * kGiB, 12 * kGiB + 4096}) {
    SCOPED_TRACE(big);
    EXPECT_NE(backends::broadcast_size_word(big) & 0x80000000u, 0u);
    EXPECT_NE(backends::broadcast_size_word(big), backends::broadcast_size_word(big + 1));
    EXPECT_NE(backends::broadcast_size_word(big), backends::broadcast_size_word(big + 4 * kGiB));
    if (big >= 4 * kGiB) {  // the same low 32 bits as a smaller size
      EXPECT_NE(backends::broadcast_size_word(big),
                backends::broadcast_size_word(big & 0xffffffffu));
    }
  }
}

// Broadcasts run in pieces of 4 MiB, each through the instance of its size class (a power of two
// from 4 KiB) sending the piece's bytes only: sizes around the piece and class boundaries, from
// every root, three times each with new values, every byte checked, and no byte past the message
// written. With verify=false (the ranks agree on the root with a small all-reduce before each
// call, which lines them up between calls), and 17 MiB: four whole pieces through one instance back
// to back within a call.
TEST(Gloo, BroadcastInPiecesOfSizeClasses) {
  expect_all_zero(run_world(
      3, 1,
      [](Rank& me) {
        Checker check(me.rank);
        for (const std::string mode : {"async", "sync"}) {
          const std::string spec = "gloo:timeout=60s,verify=false,mode=" + mode;
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            return 1;
          }
          int call = 0;
          for (const size_t bytes :
               {size_t{1}, size_t{4095}, size_t{4097}, size_t{100000}, (size_t{4} << 20) - 1,
                size_t{4} << 20, (size_t{4} << 20) + 4099, (size_t{17} << 20) + 1}) {
            for (int root = 0; root < me.world; ++root) {
              for (int repeat = 0; repeat < 3; ++repeat, ++call) {
                std::vector<uint8_t> buf(bytes + 64, 0xEE);
                for (size_t j = 0; j < bytes; ++j) {
                  buf[j] = me.rank == root ? static_cast<uint8_t>(j * 7 + call) : 0;
                }
                Tensor t(buf.data(), DType::kUInt8, Shape{static_cast<int64_t>(bytes)});
                Status s = (*made)->broadcast(t, Mirrored<Tensor>({t}), root).wait();
                if (!s.ok()) {
                  check.fail("%s: %zu bytes from %d: %s", spec.c_str(), bytes, root,
                             s.to_string().c_str());
                  return 1;
                }
                for (size_t j = 0; j < bytes + 64; ++j) {
                  const uint8_t want = j < bytes ? static_cast<uint8_t>(j * 7 + call) : 0xEE;
                  if (buf[j] != want) {
                    check.fail("%s: %zu bytes from %d, call %d: byte %zu is %d, want %d",
                               spec.c_str(), bytes, root, call, j, buf[j], want);
                    return 1;
                  }
                }
              }
            }
          }
        }
        return check.ok() ? 0 : 1;
      },
      240));
}

// All-gather in async mode is ClearToSendAllgather on the caller's buffer (a direct exchange up to
// kClearToSendExchangeMaxBytes of output, 699050 bytes per process with 3, a ring in halves above);
// sync mode's is AllgatherRing. On 2 processes (the ring's left and right are one peer), 3 and 4.
// Sizes around that edge and up to several MiB (sync mode: up to 100000 bytes), three times each
// with new values, then 300 all-gathers of 1 KiB and (async) 40 just above the edge back to back,
// all with verify=false so that nothing but the algorithm lines the ranks up: a peer's next run
// must not write into a result before this one has finished (Gloo's AllgatherRing does in async
// mode). Every byte is checked, and that nothing past the output is written.
TEST(Gloo, AllGatherWithClearToSend) {
  for (const int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_all_zero(run_world(
        world, 1,
        [](Rank& me) {
          Checker check(me.rank);
          for (const std::string mode : {"async", "sync"}) {
            const std::string spec = "gloo:timeout=60s,verify=false,mode=" + mode;
            auto made = create(spec, me);
            if (!made.ok()) {
              check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
              return 1;
            }
            std::vector<std::pair<size_t, int>> plan;  // bytes per process, times
            const size_t edge =
                backends::kClearToSendExchangeMaxBytes / static_cast<size_t>(me.world);
            // Sync mode's AllgatherRing only up to 100000 bytes: above the socket buffers, every
            // process writing to the next while none reads would deadlock it.
            for (const size_t bytes : {size_t{1}, size_t{2}, size_t{4097}, size_t{100000}, edge,
                                       edge + 1, (size_t{2} << 20) + 4099, (size_t{5} << 20) + 1}) {
              if (mode == "async" || bytes <= 100000) plan.emplace_back(bytes, 3);
            }
            plan.emplace_back(1024, 300);
            if (mode == "async") plan.emplace_back(edge + 1, 40);
            int call = 0;
            for (const auto& [bytes, times] : plan) {
              const size_t total = bytes * static_cast<size_t>(me.world);
              for (int repeat = 0; repeat < times; ++repeat, ++call) {
                const auto value = [&](int r, size_t j) {
                  return static_cast<uint8_t>(j * 7 + static_cast<size_t>(r) * 31 + call);
                };
                std::vector<uint8_t> in(bytes), out(total + 64, 0xEE);
                for (size_t j = 0; j < bytes; ++j) in[j] = value(me.rank, j);
                Tensor t(in.data(), DType::kUInt8, Shape{static_cast<int64_t>(bytes)});
                Tensor all(out.data(), DType::kUInt8, Shape{static_cast<int64_t>(total)});
                Status s =
                    (*made)->all_gather(PerReplica<Tensor>({t}), PerReplica<Tensor>({all})).wait();
                if (!s.ok()) {
                  check.fail("%s: %zu bytes: %s", spec.c_str(), bytes, s.to_string().c_str());
                  return 1;
                }
                for (size_t j = 0; j < total + 64; ++j) {
                  const uint8_t want =
                      j < total ? value(static_cast<int>(j / bytes), j % bytes) : uint8_t{0xEE};
                  if (out[j] != want) {
                    check.fail("%s: %zu bytes per process, call %d: byte %zu is %d, want %d",
                               spec.c_str(), bytes, call, j, out[j], want);
                    return 1;
                  }
                }
              }
            }
          }
          return check.ok() ? 0 : 1;
        },
        240));
  }
}

// unbound_bcube runs a message larger than kGlooUnboundBcubePieceBytes in pieces: two whole ones
// and a part, every element checked, in place and out of place, on 2 processes and on 3 (one bcube
// step of 3).
TEST(Gloo, UnboundBcubeRunsLargeMessagesInPieces) {
  for (const int world : {2, 3}) {
    expect_all_zero(run_world(
        world, 1,
        [](Rank& me) {
          Checker check(me.rank);
          const std::string spec = "gloo:timeout=60s,algorithm=unbound_bcube";
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            return 1;
          }
          const int64_t count =
              static_cast<int64_t>(2 * backends::kGlooUnboundBcubePieceBytes / sizeof(float)) +
              1001;
          check_all_reduce(**made, me, ReduceOp::kSum, DType::kFloat32, count, true, check, spec);
          check_all_reduce(**made, me, ReduceOp::kMax, DType::kFloat32, count, false, check, spec);
          return check.ok() ? 0 : 1;
        },
        240));
  }
}

// Classic instances run on the caller's buffer once the ranks agree which cached one is bound to
// it (GlooGroup::Binding). Six buffers of one size (more than the four places a key has) are reduced
// in place in an order that differs between ranks, so that ranks agree, disagree, reuse, replace
// and, when buffers change every call, give binding up; every result must still be right.
TEST(Gloo, BoundToCallersBuffersAcrossReuseAndReplacement) {
  for (const std::string verify : {"true", "false"}) {
    for (const std::string algorithm : {"halving_doubling", "ring_chunked"}) {
      const std::string spec = "gloo:timeout=20s,verify=" + verify + ",algorithm=" + algorithm;
      expect_all_zero(run_world(
          3, 1,
          [&](Rank& me) {
            Checker check(me.rank);
            auto made = create(spec, me);
            if (!made.ok()) {
              check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
              return 1;
            }
            const int64_t count = int64_t{1} << 20;  // 4 MiB: bound without verify too
            std::vector<std::vector<float>> bufs(6, std::vector<float>(count));
            // Rank 0 repeats one buffer (its place stays), the others cycle, some backwards.
            auto pick = [&](int call) -> std::vector<float>& {
              if (call < 12) return bufs[static_cast<size_t>(call % 2)];  // settle on two
              if (me.rank == 0) return bufs[static_cast<size_t>(call % 3)];
              const int k = me.rank == 1 ? call % 6 : 5 - call % 6;
              return bufs[static_cast<size_t>(k)];
            };
            for (int call = 0; call < 40; ++call) {
              std::vector<float>& b = pick(call);
              for (int64_t j = 0; j < count; j += 4099) {
                b[static_cast<size_t>(j)] = static_cast<float>(me.rank + call + j % 5);
              }
              for (int64_t j = 0; j < count; ++j) {
                if (j % 4099) b[static_cast<size_t>(j)] = 1.0f;
              }
              Tensor t(b.data(), DType::kFloat32, Shape{count});
              Status s =
                  (*made)
                      ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t}))
                      .wait();
              if (!s.ok()) {
                check.fail("%s call %d: %s", spec.c_str(), call, s.to_string().c_str());
                return 1;
              }
              for (int64_t j = 0; j < count; ++j) {
                const float want = j % 4099 ? 3.0f : static_cast<float>(3 * (call + j % 5) + 3);
                if (b[static_cast<size_t>(j)] != want) {
                  check.fail("%s call %d element %lld is %g, want %g", spec.c_str(), call,
                             static_cast<long long>(j), b[static_cast<size_t>(j)], want);
                  return 1;
                }
              }
            }
            return check.ok() ? 0 : 1;
          },
          120));
    }
  }
}

// How many destinations a reduce has is each rank's own choice; it must not change which Gloo
// instance runs (rank 0 passes two destinations, the others one), with verify on and off.
TEST(Gloo, ReduceToSeveralDestinationsOnOneRankOnly) {
  for (const std::string verify : {"true", "false"}) {
    const std::string spec = "gloo:timeout=20s,verify=" + verify;
    expect_all_zero(run_world(
        2, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            return 1;
          }
          const int64_t count = int64_t{1} << 20;  // 4 MiB: bound without verify too
          for (int call = 0; call < 3; ++call) {
            std::vector<float> in(count, static_cast<float>(me.rank + 1 + call));
            std::vector<float> d0(count, -1.0f), d1(count, -1.0f);
            std::vector<Tensor> dests = {Tensor(d0.data(), DType::kFloat32, Shape{count})};
            if (me.rank == 0) dests.emplace_back(d1.data(), DType::kFloat32, Shape{count});
            Status s =
                (*made)
                    ->reduce(ReduceOp::kSum,
                             PerReplica<Tensor>({Tensor(in.data(), DType::kFloat32, Shape{count})}),
                             Mirrored<Tensor>(dests))
                    .wait();
            const float want = static_cast<float>(3 + 2 * call);
            if (!s.ok()) {
              check.fail("%s call %d: %s", spec.c_str(), call, s.to_string().c_str());
              return 1;
            }
            for (const Tensor& d : dests) {
              const float* p = static_cast<const float*>(d.data());
              if (p[0] != want || p[count - 1] != want) {
                check.fail("%s call %d: got %g/%g, want %g", spec.c_str(), call, p[0], p[count - 1],
                           want);
              }
            }
          }
          return check.ok() ? 0 : 1;
        },
        60));
  }
}

// Registered buffers (register_buffers) run a classic instance bound to them, without the ranks'
// agreement per call. Two registrations of different sizes (an odd count, and 1 MiB) are used in
// turn, in place and out of place, for sum, mean and max, with contents that change every call,
// at 2 and 3 processes (3: halving-doubling's binary blocks), with every classic algorithm auto
// uses and verify on and off; then released, the buffers work as any others.
TEST(Gloo, RegisteredBuffersAcrossOpsPlacementsAndRelease) {
  for (const int world : {2, 3}) {
    expect_all_zero(run_world(
        world, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          for (const std::string verify : {"true", "false"}) {
            for (const std::string algorithm : {"auto", "halving_doubling", "ring_chunked"}) {
              const std::string spec =
                  "gloo:timeout=20s,verify=" + verify + ",algorithm=" + algorithm;
              auto made = create(spec, me);
              if (!made.ok()) {
                check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
                return 1;
              }
              CrossDeviceOps& ops = **made;
              const int64_t counts[2] = {40001, int64_t{1} << 18};
              std::vector<float> bufs[2] = {std::vector<float>(counts[0]),
                                            std::vector<float>(counts[1])};
              std::vector<float> in(counts[1]);
              std::vector<BufferRegistration> regs;
              for (int b = 0; b < 2; ++b) {
                auto r = ops.register_buffers(PerReplica<Tensor>(
                    {Tensor(bufs[b].data(), DType::kFloat32, Shape{counts[b]})}));
                if (!r.ok()) {
                  check.fail("%s: register %d: %s", spec.c_str(), b, r.status().to_string().c_str());
                  return 1;
                }
                regs.push_back(std::move(r).value());
              }
              const ReduceOp ops_in_turn[3] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax};
              for (int call = 0; call < 14; ++call) {
                if (call == 12) {
                  regs.clear();  // released on every rank: the same buffers, unregistered
                }
                const int b = call % 2;
                const int64_t count = counts[b];
                const bool in_place = (call / 2) % 2 == 0;
                const ReduceOp op = ops_in_turn[call % 3];
                std::vector<float>& out = bufs[b];
                std::vector<float>& src = in_place ? out : in;
                // Element j of rank r: r + 1 + call + j % 7; the rank with the largest value
                // changes with j.
                for (int64_t j = 0; j < count; ++j) {
                  src[static_cast<size_t>(j)] =
                      static_cast<float>((me.rank + j) % world + 1 + call + j % 7);
                }
                if (!in_place) std::fill(out.begin(), out.begin() + count, -1.0f);
                const Status s =
                    ops.all_reduce(op,
                                   PerReplica<Tensor>({Tensor(src.data(), DType::kFloat32,
                                                              Shape{count})}),
                                   PerReplica<Tensor>({Tensor(out.data(), DType::kFloat32,
                                                              Shape{count})}))
                        .wait();
                if (!s.ok()) {
                  check.fail("%s call %d: %s", spec.c_str(), call, s.to_string().c_str());
                  return 1;
                }
                for (int64_t j = 0; j < count; ++j) {
                  double sum = 0, max = 0;
                  for (int r = 0; r < world; ++r) {
                    const double v = static_cast<double>((r + j) % world + 1 + call + j % 7);
                    sum += v;
                    max = std::max(max, v);
                  }
                  const double want = op == ReduceOp::kSum    ? sum
                                      : op == ReduceOp::kMean ? sum / world
                                                              : max;
                  if (std::fabs(out[static_cast<size_t>(j)] - want) > 1e-4 * want) {
                    check.fail("%s call %d (%s, %s) element %lld is %g, want %g", spec.c_str(),
                               call, in_place ? "in place" : "out of place",
                               std::string(reduce_op_name(op)).c_str(), static_cast<long long>(j),
                               out[static_cast<size_t>(j)], want);
                    return 1;
                  }
                }
              }
            }
          }
          return check.ok() ? 0 : 1;
        },
        120));
  }
}

// With two local replicas the replicas are reduced into the first registered buffer, Gloo runs on
// it, and the result is copied to the second: sum and mean, in place and out of place.
TEST(Gloo, RegisteredBuffersWithTwoLocalReplicas) {
  expect_all_zero(run_world(
      2, 2,
      [&](Rank& me) {
        Checker check(me.rank);
        for (const std::string verify : {"true", "false"}) {
          const std::string spec = "gloo:timeout=20s,verify=" + verify;
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
            return 1;
          }
          const int64_t count = 70001;
          std::vector<float> out[2] = {std::vector<float>(count), std::vector<float>(count)};
          std::vector<float> in[2] = {std::vector<float>(count), std::vector<float>(count)};
          auto view = [&](std::vector<float>* v) {
            return PerReplica<Tensor>({Tensor(v[0].data(), DType::kFloat32, Shape{count}),
                                       Tensor(v[1].data(), DType::kFloat32, Shape{count},
                                              Device::cpu(1))});
          };
          auto reg = (*made)->register_buffers(view(out));
          if (!reg.ok()) {
            check.fail("%s: register: %s", spec.c_str(), reg.status().to_string().c_str());
            return 1;
          }
          for (int call = 0; call < 4; ++call) {
            const bool in_place = call % 2 == 0;
            const ReduceOp op = call < 2 ? ReduceOp::kSum : ReduceOp::kMean;
            std::vector<float>* src = in_place ? out : in;
            // Global replica g = 2 * rank + i holds g + 1 + call + j % 5 at element j.
            for (int i = 0; i < 2; ++i) {
              for (int64_t j = 0; j < count; ++j) {
                src[i][static_cast<size_t>(j)] = static_cast<float>(2 * me.rank + i + 1 + call + j % 5);
              }
            }
            const Status st = (*made)->all_reduce(op, view(src), view(out)).wait();
            if (!st.ok()) {
              check.fail("%s call %d: %s", spec.c_str(), call, st.to_string().c_str());
              return 1;
            }
            for (int i = 0; i < 2; ++i) {
              for (int64_t j = 0; j < count; j += 997) {
                const float sum = static_cast<float>(10 + 4 * (call + j % 5));
                const float want = op == ReduceOp::kSum ? sum : sum / 4;
                if (out[i][static_cast<size_t>(j)] != want) {
                  check.fail("%s call %d replica %d element %lld is %g, want %g", spec.c_str(),
                             call, i, static_cast<long long>(j), out[i][static_cast<size_t>(j)],
                             want);
                  return 1;
                }
              }
            }
          }
        }
        return check.ok() ? 0 : 1;
      },
      60));
}

// --- failures ------------------------------------------------------------------------------------

// Loops all-reduces of `count` floats until one fails; returns that Status and how long the
// failing call took.
std::pair<Status, double> all_reduce_until_error(CrossDeviceOps& ops, int max_calls,
                                                 int64_t count = 4096) {
  std::vector<float> buf(static_cast<size_t>(count), 1.0f);
  Tensor t(buf.data(), DType::kFloat32, Shape{count});
  for (int i = 0; i < max_calls; ++i) {
    const auto start = Clock::now();
    Status s =
        ops.all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t})).wait();
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) return {s, took};
  }
  return {Status(), 0.0};
}

// After a failure, the instance refuses further collectives, quoting the first error.
void expect_refused_after(CrossDeviceOps& ops, const Status& first, Checker& check) {
  std::vector<float> buf(16, 1.0f);
  Tensor t(buf.data(), DType::kFloat32, Shape{16});
  Status again =
      ops.all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t})).wait();
  if (again.code() != StatusCode::kFailedPrecondition ||
      again.message().find(first.message().substr(0, 40)) == std::string::npos) {
    check.fail("after '%s' the next call returned '%s'", first.to_string().c_str(),
               again.to_string().c_str());
  }
}

// Rank 2 of 3 goes away: between collectives (it exits, its sockets close) or in the middle of a
// 4 MiB all-reduce (SIGKILL). The survivors must fail with an error naming the collective, their
// rank and, where it can be told, the peer, by 7 s (the timeout is 5 s; most specs fail at once),
// and refuse every later collective.
void peer_dies(const std::string& spec, bool mid_collective) {
  const std::vector<int> codes = run_world(
      3, 1,
      [&](Rank& me) {
        Checker check(me.rank);
        auto made = create(spec, me);
        if (!made.ok()) {
          check.fail("%s", made.status().to_string().c_str());
          return 1;
        }
        const int64_t count = mid_collective ? int64_t{1} << 20 : 4096;
        if (me.rank == 2) {
          if (mid_collective) {
            std::thread([] {
              std::this_thread::sleep_for(std::chrono::milliseconds(300));
              kill(getpid(), SIGKILL);
            }).detach();
            all_reduce_until_error(**made, 1 << 30, count);
          } else {
            all_reduce_until_error(**made, 20, count);
          }
          _exit(0);  // no goodbye: the process is gone with its sockets
        }
        const auto [s, took] = all_reduce_until_error(**made, 1 << 30, count);
        if (s.ok()) {
          check.fail("no error although rank 2 is gone");
        } else {
          fprintf(stderr, "[rank %d] expected error after %.2f s: %s\n", me.rank, took,
                  s.to_string().c_str());
          if (took > 7.0) check.fail("the error took %.2f s (timeout 5 s)", took);
          // Unavailable from Gloo's connection or the control channel's; Aborted when the other
          // survivor saw it first and told this rank on the control channel why it gave up.
          const std::string& m = s.message();
          const std::string me_r = "rank " + std::to_string(me.rank);
          const bool passed_on = s.code() == StatusCode::kAborted &&
                                 m.find(" gave up while " + me_r + " waited for ") !=
                                     std::string::npos;
          if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded &&
              !passed_on) {
            check.fail("unexpected code: %s", s.to_string().c_str());
          }
          // The peer's rank is named where Gloo's message or the socket states make it clear
          // (not when two connections closed at once); the collective and this rank always
          // (Gloo's errors say "on rank r", the control channel's "while rank r waited" when a
          // peer gave up, and "did not send ... to rank r" when its wait timed out: with
          // unbound_bcube a survivor can be held in Gloo until the timeout, see
          // PeerKilledMidCollective, and the other then waits for it on the control channel).
          if (m.find("all_reduce #") == std::string::npos ||
              (m.find("on " + me_r) == std::string::npos &&
               m.find(me_r + " waited for") == std::string::npos &&
               m.find(" to " + me_r + " within the timeout") == std::string::npos &&
               m.find(" from " + me_r + " within the timeout") == std::string::npos) ||
              // A connection named, unless the error is a timeout: this rank's own, or the
              // other survivor's, passed on (with unbound_ring that survivor can be held in
              // Gloo's receive until its timeout, and may give up before this rank sees the
              // connection close).
              (s.code() != StatusCode::kDeadlineExceeded && !passed_on &&
               m.find("the connection with ") == std::string::npos &&
               m.find("closed the connection") == std::string::npos)) {
            check.fail("the message does not name the collective, this rank and the connection: %s",
                       s.message().c_str());
          }
          expect_refused_after(**made, s, check);
        }
        return check.ok() ? 0 : 1;
      },
      60);
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_TRUE(codes[2] == 0 || codes[2] == 128 + SIGKILL) << "rank 2 ended with " << codes[2];
}

// Rank 2 of 3 is killed in the middle of a stream of large collectives (`run`: 16 MiB from each
// sending rank), in the default (async) mode and in sync mode: the survivors, whose receive from it
// was under way, fail well before the 20 s timeout. Gloo's unbound gloo::broadcast and
// gloo::allgather, which async mode used, left such a receive waiting for the timeout (22 s here):
// Gloo wakes a connection's waiting receives when it fails, but not one whose message has begun to
// arrive. The kill comes after a first collective, so that every rank is past its setup.
void killed_mid_stream_is_seen_before_the_timeout(
    const std::function<Status(CrossDeviceOps&, const std::string& mode)>& run) {
  for (const std::string mode : {"async", "sync"}) {
    SCOPED_TRACE("mode=" + mode);
    const std::vector<int> codes = run_world(
        3, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create("gloo:timeout=20s,mode=" + mode, me);
          if (!made.ok()) {
            check.fail("%s", made.status().to_string().c_str());
            return 1;
          }
          Status s = run(**made, mode);
          if (!s.ok()) {
            check.fail("the first collective: %s", s.to_string().c_str());
            return 1;
          }
          if (me.rank == 2) {
            std::thread([] {
              std::this_thread::sleep_for(std::chrono::milliseconds(300));
              kill(getpid(), SIGKILL);
            }).detach();
          }
          double took = 0;
          while (s.ok()) {
            const auto start = Clock::now();
            s = run(**made, mode);
            took = std::chrono::duration<double>(Clock::now() - start).count();
          }
          if (me.rank == 2) _exit(0);  // not reached: killed
          fprintf(stderr, "[rank %d] %s: expected error after %.2f s: %s\n", me.rank, mode.c_str(),
                  took, s.to_string().c_str());
          if (took > 10.0) {
            check.fail("%s: the error took %.2f s (timeout 20 s): %s", mode.c_str(), took,
                       s.to_string().c_str());
          }
          return check.ok() ? 0 : 1;
        },
        60);
    ASSERT_EQ(codes.size(), 3u);
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[1], 0);
    EXPECT_EQ(codes[2], 128 + SIGKILL) << "rank 2 ended with " << codes[2];
  }
}

// Broadcasts of 16 MiB from rank 2.
TEST(GlooFailure, RootKilledMidBroadcastIsSeenBeforeTheTimeout) {
  std::vector<float> buf(size_t{1} << 22, 1.0f);
  killed_mid_stream_is_seen_before_the_timeout([&](CrossDeviceOps& ops, const std::string&) {
    Tensor t(buf.data(), DType::kFloat32, Shape{static_cast<int64_t>(buf.size())});
    return ops.broadcast(t, Mirrored<Tensor>({t}), 2).wait();
  });
}

// All-gathers of 16 MiB per process; 1 MiB in sync mode, whose AllgatherRing deadlocks when every
// process writes a block larger than the socket buffers to the next (16 MiB did here, under load).
TEST(GlooFailure, PeerKilledMidAllGatherIsSeenBeforeTheTimeout) {
  std::vector<float> in(size_t{1} << 22, 1.0f), out(3 * in.size());
  killed_mid_stream_is_seen_before_the_timeout([&](CrossDeviceOps& ops, const std::string& mode) {
    const int64_t count = static_cast<int64_t>(mode == "sync" ? in.size() / 16 : in.size());
    Tensor t(in.data(), DType::kFloat32, Shape{count});
    Tensor all(out.data(), DType::kFloat32, Shape{3 * count});
    return ops.all_gather(PerReplica<Tensor>({t}), PerReplica<Tensor>({all})).wait();
  });
}

// With verify=false nothing checks sizes before Gloo runs. Rank 2 of 3 runs `run` on another
// count of floats than ranks 0 and 1, for each pair in `sizes`. Gloo's I/O thread would stop a
// process on a message larger than the buffer it lands in (or, for a smaller one, leave part of
// the buffer stale); instead the clear to send carries the size, and every rank fails within the
// timeout, at least one of them naming the mismatch. With `bystander_may_finish`, rank 1 may
// instead finish (a broadcast's receiver whose size matches the root's has all it expects).
void size_mismatch_fails(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                         bool bystander_may_finish,
                         const std::function<Status(CrossDeviceOps&, int64_t count)>& run) {
  for (const auto& pair : sizes) {
    // Named copies: a lambda may not capture structured bindings (clang before 16).
    const int64_t size = pair.first;
    const int64_t odd = pair.second;
    SCOPED_TRACE(std::to_string(size) + " and " + std::to_string(odd) + " floats");
    const std::vector<int> codes = run_world(
        3, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create("gloo:timeout=5s,verify=false", me);
          if (!made.ok()) {
            check.fail("%s", made.status().to_string().c_str());
            return 1;
          }
          const auto start = Clock::now();
          Status s = run(**made, me.rank == 2 ? odd : size);
          const double took = std::chrono::duration<double>(Clock::now() - start).count();
          fprintf(stderr, "[rank %d] after %.2f s: %s\n", me.rank, took, s.to_string().c_str());
          if (s.ok() && me.rank == 1 && bystander_may_finish) return 4;
          if (s.ok()) check.fail("the collective succeeded");
          if (took > 7.0) check.fail("the error took %.2f s (timeout 5 s)", took);
          if (!check.ok()) return 1;
          return s.message().find("collective mismatch") != std::string::npos ? 0 : 3;
        },
        60);
    ASSERT_EQ(codes.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      const int code = codes[static_cast<size_t>(r)];
      EXPECT_TRUE(code == 0 || code == 3 || (code == 4 && r == 1))
          << "rank " << r << " ended with " << code;
    }
    EXPECT_TRUE(codes[0] == 0 || codes[1] == 0 || codes[2] == 0) << "no rank named the mismatch";
  }
}

// Both small (the exchange), both large (the ring), and one of each.
TEST(GlooFailure, AllGatherSizeMismatchFailsEveryRank) {
  size_mismatch_fails(
      {{1024, 2048}, {1 << 18, 1 << 19}, {1024, 1 << 19}}, false,
      [](CrossDeviceOps& ops, int64_t count) {
        std::vector<float> in(static_cast<size_t>(count), 1.0f),
            out(static_cast<size_t>(3 * count));
        Tensor t(in.data(), DType::kFloat32, Shape{count});
        Tensor all(out.data(), DType::kFloat32, Shape{3 * count});
        return ops.all_gather(PerReplica<Tensor>({t}), PerReplica<Tensor>({all})).wait();
      });
}

// From rank 0: rank 2 expects less, more, and more than one 4 MiB piece (whose first piece alone
// would match). Rank 1 expects what rank 0 sends, and may receive it before rank 0 gives up.
TEST(GlooFailure, BroadcastSizeMismatchFailsRootAndReceiver) {
  size_mismatch_fails({{2048, 1024}, {1024, 2048}, {1 << 20, 9 << 19}}, true,
                      [](CrossDeviceOps& ops, int64_t count) {
                        std::vector<float> buf(static_cast<size_t>(count), 1.0f);
                        Tensor t(buf.data(), DType::kFloat32, Shape{count});
                        return ops.broadcast(t, Mirrored<Tensor>({t}), 0).wait();
                      });
}

class GlooFault : public ::testing::TestWithParam<const char*> {};

TEST_P(GlooFault, PeerExitsBetweenCollectives) {
  peer_dies(std::string("gloo:timeout=5s,") + GetParam(), false);
}

// With algorithm=unbound_bcube a survivor can wait until the timeout (5 s) rather than fail at
// once: Gloo (Debian's 2022 version) does not wake an unbound receive whose message had begun to
// arrive when the connection fails, so the test allows up to 7 s for every spec.
TEST_P(GlooFault, PeerKilledMidCollective) {
  peer_dies(std::string("gloo:timeout=5s,") + GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Specs, GlooFault,
                         ::testing::Values("algorithm=ring_chunked", "algorithm=halving_doubling",
                                           "algorithm=unbound_ring", "algorithm=unbound_bcube",
                                           "mode=sync", "mode=busy_poll"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           return name.substr(name.find('=') + 1);
                         });

// A peer that stays alive but stops issuing collectives: the others fail within the timeout.
class GlooSilentPeer : public ::testing::TestWithParam<const char*> {};

TEST_P(GlooSilentPeer, TimesOut) {
  const std::string spec = std::string("gloo:timeout=2s,mode=") + GetParam();
  const std::vector<int> codes = run_world(
      2, 1,
      [&](Rank& me) {
        Checker check(me.rank);
        auto made = create(spec, me);
        if (!made.ok()) {
          check.fail("%s", made.status().to_string().c_str());
          return 1;
        }
        if (me.rank == 1) {
          sleep(4);  // silent, sockets open
          return 0;
        }
        const auto [s, took] = all_reduce_until_error(**made, 10);
        if (s.code() != StatusCode::kDeadlineExceeded) {
          check.fail("want deadline_exceeded, got %s", s.to_string().c_str());
        }
        if (took < 1.5 || took > 4.0)
          check.fail("the timeout fired after %.2f s (want about 2 s)", took);
        fprintf(stderr, "[rank 0] expected error after %.2f s: %s\n", took, s.to_string().c_str());
        return check.ok() ? 0 : 1;
      },
      30);
  expect_all_zero(codes);
}

INSTANTIATE_TEST_SUITE_P(Modes, GlooSilentPeer, ::testing::Values("async", "sync", "busy_poll"));

// Different collectives on different ranks: with verify on, every rank fails with a message naming
// both sides instead of exchanging mismatched data.
TEST(GlooFailure, MismatchIsAnErrorOnEveryRank) {
  const std::vector<int> codes = run_world(
      2, 1,
      [](Rank& me) {
        Checker check(me.rank);
        auto made = create("gloo:timeout=10s", me);
        if (!made.ok()) {
          check.fail("%s", made.status().to_string().c_str());
          return 1;
        }
        std::vector<float> buf(9, 1.0f);
        Tensor t(buf.data(), DType::kFloat32, Shape{me.rank == 0 ? 8 : 9});
        Status s =
            (*made)
                ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t}))
                .wait();
        if (s.code() != StatusCode::kAborted || s.message().find("mismatch") == std::string::npos ||
            s.message().find("rank " + std::to_string(1 - me.rank)) == std::string::npos) {
          check.fail("want a mismatch naming the other rank, got %s", s.to_string().c_str());
        } else {
          fprintf(stderr, "[rank %d] expected error: %s\n", me.rank, s.to_string().c_str());
        }
        return check.ok() ? 0 : 1;
      },
      30);
  expect_all_zero(codes);
}

// Options every rank must share fail every rank's setup, naming the difference, when one rank has
// another value: before, different algorithms or auto thresholds ended a process through Gloo's
// exception on its I/O thread (SIGABRT) or left the ranks waiting out the timeout, and verify=true
// against false was a timeout.
TEST(GlooFailure, OptionsThatDifferBetweenRanksFailEverySetup) {
  struct Case {
    std::string rank0, rank1;  // the options given
    std::string said0, said1;  // as each rank's message shows its own (canonical)
  };
  for (const Case& c : {Case{"algorithm=ring", "algorithm=ring_chunked", "algorithm=ring,",
                             "algorithm=ring_chunked,"},
                        Case{"auto_threshold=64K", "auto_threshold=64M", "auto_threshold=64KiB,",
                             "auto_threshold=64MiB,"},
                        Case{"verify=true", "verify=false", "verify=true,", "verify=false,"},
                        Case{"mode=async", "mode=sync", "mode=async,", "mode=sync,"}}) {
    SCOPED_TRACE(c.rank0 + " against " + c.rank1);
    const auto start = Clock::now();
    const std::vector<int> codes = run_world(
        2, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create("gloo:timeout=20s," + (me.rank == 0 ? c.rank0 : c.rank1), me);
          const std::string own = me.rank == 0 ? c.said0 : c.said1;
          if (made.ok()) {
            check.fail("set up beside a rank with other options");
          } else if (made.status().message().find("is set up differently") == std::string::npos ||
                     made.status().message().find("(this rank: ") == std::string::npos ||
                     made.status().message().find(own) == std::string::npos) {
            check.fail("want 'set up differently', showing this rank's %s, got %s", own.c_str(),
                       made.status().to_string().c_str());
          } else {
            fprintf(stderr, "[rank %d] expected error: %s\n", me.rank,
                    made.status().to_string().c_str());
          }
          return check.ok() ? 0 : 1;
        },
        40);
    expect_all_zero(codes);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // at setup, not the timeout
  }
}

// Registrations are checked across the ranks whatever verify says: different sizes fail every
// rank at the registration, naming both; and, with verify on, a collective on a registered buffer
// on one rank but not on the other is a mismatch on both, saying so, not a timeout.
TEST(GlooFailure, RegistrationsThatDifferBetweenRanksFailEveryRank) {
  for (const std::string verify : {"true", "false"}) {
    expect_all_zero(run_world(
        2, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create("gloo:timeout=20s,verify=" + verify, me);
          if (!made.ok()) {
            check.fail("%s", made.status().to_string().c_str());
            return 1;
          }
          std::vector<float> buf(200, 1.0f);
          const auto start = Clock::now();
          auto r = (*made)->register_buffers(PerReplica<Tensor>(
              {Tensor(buf.data(), DType::kFloat32, Shape{me.rank == 0 ? 100 : 200})}));
          const double took = std::chrono::duration<double>(Clock::now() - start).count();
          const std::string m = r.ok() ? "" : r.status().message();
          if (r.ok() || r.status().code() != StatusCode::kAborted ||
              m.find("mismatch") == std::string::npos ||
              m.find("register_buffers #1 (800B float32)") == std::string::npos ||
              m.find("register_buffers #1 (400B float32)") == std::string::npos || took > 10) {
            check.fail("verify=%s: want a mismatch naming both registrations within 10 s, got "
                       "after %.1f s: %s",
                       verify.c_str(), took, r.ok() ? "OK" : r.status().to_string().c_str());
          } else {
            fprintf(stderr, "[rank %d] expected error: %s\n", me.rank, m.c_str());
          }
          return check.ok() ? 0 : 1;
        },
        40));
  }
}

// Rank 0 all-reduces on buffer 0, rank 1 on buffer 1, of the same size; the first `registered`
// of the two buffers are registered first, in order, on both ranks. With verify on (the default),
// every rank must fail at once with a mismatch whose message holds each of `want`.
void expect_registered_mismatch(int registered, const std::vector<std::string>& want) {
  expect_all_zero(run_world(
      2, 1,
      [&](Rank& me) {
        Checker check(me.rank);
        auto made = create("gloo:timeout=20s", me);
        if (!made.ok()) {
          check.fail("%s", made.status().to_string().c_str());
          return 1;
        }
        std::vector<float> buffers[2] = {std::vector<float>(4096, 1.0f),
                                         std::vector<float>(4096, 1.0f)};
        std::vector<BufferRegistration> regs;
        for (int k = 0; k < registered; ++k) {
          auto r = (*made)->register_buffers(
              PerReplica<Tensor>({Tensor(buffers[k].data(), DType::kFloat32, Shape{4096})}));
          if (!r.ok()) {
            check.fail("register %d: %s", k, r.status().to_string().c_str());
            return 1;
          }
          regs.push_back(std::move(r).value());
        }
        const Tensor t(buffers[me.rank].data(), DType::kFloat32, Shape{4096});
        const auto start = Clock::now();
        const Status s =
            (*made)->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t}))
                .wait();
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        bool named = s.code() == StatusCode::kAborted && took <= 10;
        for (const std::string& w : want) named = named && s.message().find(w) != std::string::npos;
        if (!named) {
          check.fail("want a mismatch naming the registrations within 10 s, got after %.1f s: %s",
                     took, s.to_string().c_str());
        } else {
          fprintf(stderr, "[rank %d] expected error: %s\n", me.rank, s.to_string().c_str());
        }
        return check.ok() ? 0 : 1;
      },
      40));
}

TEST(GlooFailure, RegisteredBufferOnOneRankOnlyIsAMismatch) {
  expect_registered_mismatch(
      1, {"all_reduce #2 (16KiB float32, sum) on the buffer of registration #1",
          "must be used, and released, at the same point on every rank"});
}

// Two registrations of one size: rank 0 runs on the first's buffer, rank 1 on the second's. Their
// Gloo instances are not the same (each registration has its own), so with verify on this is a
// mismatch on both ranks naming both registrations, not a timeout.
TEST(GlooFailure, DifferentRegistrationsOnTheRanksAreAMismatch) {
  expect_registered_mismatch(
      2, {"all_reduce #3 (16KiB float32, sum) on the buffer of registration #1",
          "all_reduce #3 (16KiB float32, sum) on the buffer of registration #2"});
}

// A call refused on one rank (a wrong output size) fails the peers at once, with the reason the
// refusing rank gave; they do not wait out their timeout.
TEST(GlooFailure, CallRefusedOnOneRankFailsThePeersWithItsReason) {
  const std::vector<int> codes = run_world(
      3, 1,
      [](Rank& me) {
        Checker check(me.rank);
        auto made = create("gloo:timeout=20s", me);
        if (!made.ok()) {
          check.fail("%s", made.status().to_string().c_str());
          return 1;
        }
        std::vector<float> in(64, 1.0f), out(64, 0.0f);
        Tensor x(in.data(), DType::kFloat32, Shape{64});
        Tensor y(out.data(), DType::kFloat32, Shape{me.rank == 1 ? 63 : 64});
        const auto start = Clock::now();
        Status s =
            (*made)
                ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({x}), PerReplica<Tensor>({y}))
                .wait();
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (me.rank == 1) {
          if (s.code() != StatusCode::kInvalidArgument) check.fail("got %s", s.to_string().c_str());
        } else if (s.message().find("rank 1 refused its part: all_reduce: outputs[0] has 63") ==
                       std::string::npos ||
                   s.message().find("did not fail with the others") != std::string::npos ||
                   took > 10.0) {
          check.fail("want rank 1's reason first, well within the timeout; got after %.1f s: %s",
                     took, s.to_string().c_str());
        } else {
          fprintf(stderr, "[rank %d] expected error after %.2f s: %s\n", me.rank, took,
                  s.to_string().c_str());
        }
        return check.ok() ? 0 : 1;
      },
      40);
  expect_all_zero(codes);
}

// Different kinds of collective on the ranks (an all-gather against an all-reduce, a broadcast
// against an all-reduce) would meet no common Gloo exchange; their fingerprints meet on the control
// channel, so the error is the mismatch, naming both calls, at once rather than at the timeout.
TEST(GlooFailure, DifferentCollectivesAreAMismatchNotATimeout) {
  for (const char* other : {"all_gather", "broadcast"}) {
    const std::string other_kind = other;
    const std::vector<int> codes = run_world(
        2, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create("gloo:timeout=10s", me);
          if (!made.ok()) {
            check.fail("%s", made.status().to_string().c_str());
            return 1;
          }
          std::vector<float> in(16, 1.0f), out(32, 0.0f);
          Tensor x(in.data(), DType::kFloat32, Shape{16});
          Status s;
          const auto start = Clock::now();
          if (me.rank == 0) {
            s = (*made)
                    ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({x}), PerReplica<Tensor>({x}))
                    .wait();
          } else if (other_kind == "all_gather") {
            Tensor y(out.data(), DType::kFloat32, Shape{32});
            s = (*made)->all_gather(PerReplica<Tensor>({x}), PerReplica<Tensor>({y})).wait();
          } else {
            s = (*made)->broadcast(x, Mirrored<Tensor>({x}), 0).wait();
          }
          const double took = std::chrono::duration<double>(Clock::now() - start).count();
          const std::string peer_call = me.rank == 0 ? other_kind : std::string("all_reduce");
          // The control channel's frames carry the call ("rank 1 sent all_gather #1 ..."); a
          // fingerprint that differs in what the tags do not hold says "issued".
          const std::string peer = "rank " + std::to_string(1 - me.rank);
          if (s.code() != StatusCode::kAborted ||
              s.message().find("collective mismatch") == std::string::npos ||
              (s.message().find(peer + " sent " + peer_call) == std::string::npos &&
               s.message().find(peer + " issued " + peer_call) == std::string::npos) ||
              took > 5.0) {
            check.fail("want a mismatch naming rank %d's %s well within the 10 s timeout, got "
                       "after %.1f s: %s",
                       1 - me.rank, peer_call.c_str(), took, s.to_string().c_str());
          } else {
            fprintf(stderr, "[rank %d] expected error: %s\n", me.rank, s.to_string().c_str());
          }
          return check.ok() ? 0 : 1;
        },
        30);
    expect_all_zero(codes);
  }
}

// Ranks naming different broadcast roots: with verify the fingerprint carries the root; without it
// ProcessGroupOps agrees on the root first (GlooGroup::checks_roots is false then). Either way
// every rank fails with a mismatch naming the roots, and no rank returns data from another root.
TEST(GlooFailure, DifferentBroadcastRootsFailEveryRankWithOrWithoutVerify) {
  for (const char* verify : {"true", "false"}) {
    const std::string spec = std::string("gloo:timeout=10s,verify=") + verify;
    const std::vector<int> codes = run_world(
        3, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          auto made = create(spec, me);
          if (!made.ok()) {
            check.fail("%s", made.status().to_string().c_str());
            return 1;
          }
          std::vector<float> data(16, static_cast<float>(me.rank));
          Tensor x(data.data(), DType::kFloat32, Shape{16});
          const int root = me.rank == 2 ? 1 : 0;  // rank 2 names another root
          const auto start = Clock::now();
          Status s = (*made)->broadcast(x, Mirrored<Tensor>({x}), root).wait();
          const double took = std::chrono::duration<double>(Clock::now() - start).count();
          if (s.ok() || s.message().find("mismatch") == std::string::npos ||
              s.message().find("root") == std::string::npos || took > 5.0) {
            check.fail("%s: want a root mismatch well within the 10 s timeout, got after %.1f s: %s",
                       spec.c_str(), took, s.to_string().c_str());
          } else {
            fprintf(stderr, "[rank %d] expected error (%s): %s\n", me.rank, spec.c_str(),
                    s.to_string().c_str());
          }
          return check.ok() ? 0 : 1;
        },
        30);
    expect_all_zero(codes);
  }
}

// Secrets: ranks that hold different secrets, or one a secret and one none, are refused on every
// rank, naming the difference; the same secret is refused too (Gloo's transport cannot be
// authenticated) unless allow_unauthenticated=true, and then the group works.
TEST(GlooFailure, SecretsMustMatchAndAreNotSilentlyUnprotected) {
  struct Case {
    const char* secret0;
    const char* secret1;
    const char* options;
    const char* expect0;  // "" = success
    const char* expect1;
  };
  for (const Case& c : std::vector<Case>{
           {"aaa", "bbb", "", "rank 1 holds a different secret", "rank 0 holds a different secret"},
           {"aaa", "", "", "rank 1 has none", "rank 0 has a secret"},
           {"aaa", "", ",allow_unauthenticated=true", "rank 1 has none", "rank 0 has a secret"},
           {"aaa", "aaa", "", "cannot authenticate", "cannot authenticate"},
           {"aaa", "aaa", ",allow_unauthenticated=true", "", ""},
       }) {
    expect_all_zero(run_world(
        2, 1,
        [&](Rank& me) {
          Checker check(me.rank);
          const char* secret = me.rank == 0 ? c.secret0 : c.secret1;
          const std::string expect = me.rank == 0 ? c.expect0 : c.expect1;
          if (*secret) me.context.config = Config::from_map({{"TRIBUTARY_SECRET", secret}});
          const std::string spec = std::string("gloo:timeout=20s") + c.options;
          auto made = create(spec, me);
          if (expect.empty()) {
            if (!made.ok()) {
              check.fail("%s: %s", spec.c_str(), made.status().to_string().c_str());
              return 1;
            }
            std::vector<float> v(16, 1.0f);
            Tensor t(v.data(), DType::kFloat32, Shape{16});
            Status s =
                (*made)
                    ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t}))
                    .wait();
            if (!s.ok() || v[0] != 2.0f) check.fail("all_reduce: %s", s.to_string().c_str());
          } else if (made.ok()) {
            check.fail("secrets %s/%s%s: created, want an error with '%s'", c.secret0, c.secret1,
                       c.options, expect.c_str());
          } else if (made.status().message().find(expect) == std::string::npos) {
            check.fail("want '%s' in: %s", expect.c_str(), made.status().to_string().c_str());
          }
          return check.ok() ? 0 : 1;
        },
        60));
  }
}

// A rendezvous that the other rank never joins: a clear DeadlineExceeded from create().
TEST(GlooFailure, RendezvousTimeout) {
  const std::vector<int> codes = run_world(
      2, 1,
      [](Rank& me) {
        if (me.rank == 1) return 0;
        Checker check(me.rank);
        const auto start = Clock::now();
        auto made = create("gloo:timeout=2s", me);
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (made.ok()) {
          check.fail("create() succeeded without a peer");
        } else {
          fprintf(stderr, "[rank 0] expected error after %.2f s: %s\n", took,
                  made.status().to_string().c_str());
          // Rank 1 never creates its backend: the ranks' meeting before setup names it.
          if (made.status().code() != StatusCode::kDeadlineExceeded ||
              made.status().message().find("rank 1 did not join") == std::string::npos) {
            check.fail("want a deadline naming rank 1, got %s", made.status().to_string().c_str());
          }
          if (took > 6.0) check.fail("took %.2f s (timeout 2 s)", took);
        }
        return check.ok() ? 0 : 1;
      },
      30);
  expect_all_zero(codes);
}

// A store through which a rank publishes its pair addresses and then hangs (stopped, or stuck
// before it connects): it never connects its pairs, and leaves after `hang`.
class HangsAfterPublishingPairs final : public Store {
 public:
  HangsAfterPublishingPairs(std::shared_ptr<Store> base, std::chrono::seconds hang)
      : Store(base->options()), base_(std::move(base)), hang_(hang) {}
  std::string describe() const override { return base_->describe(); }

 protected:
  Status set_impl(std::string_view key, std::string_view value) override {
    Status s = base_->set(key, value);
    if (key.find("/pairs/") != std::string_view::npos) {
      std::this_thread::sleep_for(hang_);
      std::fflush(nullptr);
      _exit(0);
    }
    return s;
  }
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override {
    auto v = base_->get(key, timeout);
    if (v.ok()) return std::optional<std::string>(std::move(v).value());
    if (v.status().code() == StatusCode::kDeadlineExceeded) return std::optional<std::string>();
    return v.status();
  }
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override {
    return base_->add(key, delta);
  }
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override {
    Status s = base_->wait(keys, timeout);
    if (s.code() == StatusCode::kDeadlineExceeded) {
      for (const std::string& k : keys) {
        auto there = base_->check({k});
        if (!there.ok() || !*there) missing->push_back(k);
      }
      return Status();
    }
    return s;
  }
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override {
    return base_->check(keys);
  }
  StatusOr<bool> delete_key_impl(std::string_view key) override { return base_->delete_key(key); }

 private:
  std::shared_ptr<Store> base_;
  std::chrono::seconds hang_;
};

// A rank that published its pair addresses and never connected: Gloo waits five times its timeout
// for a pair's first connection, so a rank on the listening side of its pair with the hung rank
// (about half of them: the side goes by port) used to wait 15 s here; every rank now ends within
// the timeout, with an error naming the rank.
TEST(GlooFailure, PeerThatPublishedItsPairsAndHungEndsWithinTheTimeout) {
  const std::vector<int> codes = run_world(
      4, 1,
      [](Rank& me) {
        if (me.rank == 1) {
          me.context.store =
              std::make_shared<HangsAfterPublishingPairs>(me.context.store, std::chrono::seconds(10));
        }
        Checker check(me.rank);
        const auto start = Clock::now();
        auto made = create("gloo:timeout=3s", me);
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (made.ok()) {
          check.fail("create() succeeded with rank 1 hung");
        } else {
          fprintf(stderr, "[rank %d] expected error after %.2f s: %s\n", me.rank, took,
                  made.status().to_string().c_str());
          // "rank(s) 1" or "rank(s) 0, 1, 2": the ranks that did not connect or report.
          if (!std::regex_search(made.status().message(),
                                 std::regex(R"(rank\(s\) ([0-9]+, )*1\b)"))) {
            check.fail("the error does not name rank 1: %s", made.status().to_string().c_str());
          }
          // Gloo alone: 5 x 3 s for a listening pair. The timeout, and setting up, is far less.
          if (took > 12.0) check.fail("took %.2f s (timeout 3 s)", took);
        }
        return check.ok() ? 0 : 1;
      },
      60);
  expect_all_zero(codes);
}

// An address this machine does not have: create() fails at once with a Status that says what to
// set, on every rank, without waiting for the rendezvous.
TEST(GlooFailure, UnusableHostIsAnError) {
  const std::vector<int> codes = run_world(
      2, 1,
      [](Rank& me) {
        Checker check(me.rank);
        auto made = create("gloo:timeout=20s,host=203.0.113.7", me);
        if (made.ok()) {
          check.fail("create() succeeded on an address this machine does not have");
        } else if (made.status().message().find(
                       "host '203.0.113.7' is not an address of this machine") ==
                   std::string::npos) {
          check.fail("the message does not say what to set: %s", made.status().to_string().c_str());
        } else {
          fprintf(stderr, "[rank %d] expected error: %s\n", me.rank,
                  made.status().to_string().c_str());
        }
        return check.ok() ? 0 : 1;
      },
      30);
  expect_all_zero(codes);
}

// The TCP ports this process listens on now (sockets with SO_ACCEPTCONN among its descriptors).
std::vector<sockaddr_storage> listening_ports() {
  std::vector<sockaddr_storage> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage at{};
    socklen_t at_len = sizeof at;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&at), &at_len) != 0) continue;
    if (at.ss_family == AF_INET || at.ss_family == AF_INET6) found.push_back(at);
  }
  return found;
}

// A store whose reads take 300 ms longer (a slow network to the store), over another store.
class SlowReads final : public Store {
 public:
  explicit SlowReads(std::shared_ptr<Store> base) : Store(base->options()), base_(std::move(base)) {}
  std::string describe() const override { return "slow " + base_->describe(); }

 protected:
  Status set_impl(std::string_view key, std::string_view value) override {
    return base_->set(key, value);
  }
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto v = base_->get(key, timeout);
    if (v.ok()) return std::optional<std::string>(std::move(v).value());
    if (v.status().code() == StatusCode::kDeadlineExceeded) return std::optional<std::string>();
    return v.status();
  }
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override {
    return base_->add(key, delta);
  }
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (const std::string& k : keys) {
      if (!base_->get(k, timeout).ok()) missing->push_back(k);
    }
    return Status();
  }
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override {
    return base_->check(keys);
  }
  StatusOr<bool> delete_key_impl(std::string_view key) override { return base_->delete_key(key); }

 private:
  std::shared_ptr<Store> base_;
};

// A stranger connects to rank 0's Gloo ports before its peers do and holds the connections: Gloo
// takes the first connection to reach a pair's port as the peer, so the real peer is refused.
// The mesh is set up again on fresh ports, and the job goes on (it used to fail at once). Every
// pair connects on its own thread: with Gloo's one-after-another connectFullMesh, a rank waited
// out the whole timeout for the refused peer's later pairs in about 1 run of 4, and every rank
// failed with deadline_exceeded instead of retrying. (The stranger wins the race for the first
// attempt in most runs, not all: with one attempt allowed, 2 runs of 3 fail.)
TEST(GlooFailure, StrangerOnTheListeningPortsDoesNotStopTheJob) {
  const std::vector<int> codes = run_world(
      3, 1,
      [](Rank& me) {
        Checker check(me.rank);
        std::vector<int> held;  // the stranger's connections, open until the end
        std::thread stranger;
        if (me.rank == 0) {
          stranger = std::thread([&held] {
            // The first ports that appear are the first attempt's; connect to each once.
            const auto until = Clock::now() + std::chrono::seconds(20);
            std::vector<sockaddr_storage> ports;
            while (ports.size() < 2 && Clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
              ports = listening_ports();
            }
            for (const sockaddr_storage& at : ports) {
              const int fd = socket(at.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
              const socklen_t len =
                  at.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
              if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&at), len) == 0) {
                held.push_back(fd);
              } else if (fd >= 0) {
                close(fd);
              }
            }
          });
        } else {
          // Rank 0's ports stay open while its peers read its addresses: the stranger is first.
          me.context.store = std::make_shared<SlowReads>(me.context.store);
        }
        auto made = create("gloo:timeout=30s", me);
        if (stranger.joinable()) stranger.join();
        if (me.rank == 0 && held.empty()) check.fail("the stranger found no port to connect to");
        if (!made.ok()) {
          check.fail("create() with a stranger on the ports: %s", made.status().to_string().c_str());
          return 1;
        }
        std::vector<float> v(1000, static_cast<float>(me.rank + 1));
        Tensor t(v.data(), DType::kFloat32, Shape{1000});
        Status s = (*made)
                       ->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t}))
                       .wait();
        if (!s.ok() || v[0] != 6.0f || v[999] != 6.0f) {
          check.fail("all_reduce: %s, v[0] = %g", s.to_string().c_str(), v[0]);
        }
        for (int fd : held) close(fd);
        return check.ok() ? 0 : 1;
      },
      60);
  expect_all_zero(codes);
}

// --- capabilities --------------------------------------------------------------------------------

TEST(Gloo, RefusesBfloat16AndListsItsOptions) {
  BackendContext ctx;
  auto made = builtin_backends().create("gloo", ctx);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_FALSE((*made)->capabilities().supports(DType::kBFloat16));
  EXPECT_TRUE((*made)->capabilities().supports(DType::kFloat16));
  std::vector<uint16_t> buf(4, 0);
  Tensor t(buf.data(), DType::kBFloat16, Shape{4});
  Status s =
      (*made)->all_reduce(ReduceOp::kSum, PerReplica<Tensor>({t}), PerReplica<Tensor>({t})).wait();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  auto sync_unbound = builtin_backends().create("gloo:mode=sync,algorithm=unbound_ring", ctx);
  ASSERT_FALSE(sync_unbound.ok());
  EXPECT_EQ(sync_unbound.status().code(), StatusCode::kInvalidArgument);
  auto bad = builtin_backends().create("gloo:algorithm=tree", ctx);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("halving_doubling"), std::string::npos)
      << bad.status().message();
  // "auto" prefers ring across processes.
  const BackendRegistry registry = builtin_backends();  // find() points into it: keep it alive
  const BackendInfo* info = registry.find("gloo");
  ASSERT_NE(info, nullptr);
  ASSERT_NE(registry.find("ring"), nullptr);
  EXPECT_LT(info->auto_priority, registry.find("ring")->auto_priority);
}

// The send buffer (SO_SNDBUF) of this process's socket whose ends are "local->remote" as
// PeerDirectory::socket_of gives them, or -1.
long send_buffer_of(const std::string& ends) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage local{}, remote{};
    socklen_t llen = sizeof local, rlen = sizeof remote;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0 ||
        local.ss_family != AF_INET || remote.ss_family != AF_INET) {
      continue;
    }
    auto text = [](const sockaddr_storage& a) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      char ip[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
      return "[" + std::string(ip) + "]:" + std::to_string(ntohs(in->sin_port));
    };
    if (text(local) + "->" + text(remote) != ends) continue;
    int bytes = 0;
    socklen_t len = sizeof bytes;
    return getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &len) == 0 ? bytes : -1;
  }
  return -1;
}

long read_wmem_max() {
  long v = 0;
  if (FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
    if (std::fscanf(f, "%ld", &v) != 1) v = 0;
    std::fclose(f);
  }
  return v;
}

// In a child: gives this process a /proc/sys/net/core/wmem_max of its own that reads `value` (a
// mount namespace and a bind mount over it, as a host set up otherwise would have), or says why
// it cannot.
std::string pretend_wmem_max(const std::string& dir, long value) {
  if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + strerror(errno);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return std::string("making / private: ") + strerror(errno);
  }
  const std::string file = dir + "/wmem_max";
  if (FILE* f = std::fopen(file.c_str(), "w")) {
    std::fprintf(f, "%ld\n", value);
    std::fclose(f);
  }
  if (mount(file.c_str(), "/proc/sys/net/core/wmem_max", nullptr, MS_BIND, nullptr) != 0) {
    return std::string("bind-mounting over wmem_max: ") + strerror(errno);
  }
  return read_wmem_max() == value ? "" : "the bind mount did not take";
}

// Gloo sizes a pair's send buffer to its pinned-buffer messages, and a mesh whose first messages
// were small kept small buffers, on which larger messages waited for delayed acknowledgements
// (gloo_context.h, gloo_priming_bytes): the mesh starts with one message of
// gloo_priming_bytes(sync), so that the buffers stay large after a first collective of small
// messages: in async mode 64 KiB, after which the kernel's buffer is set to
// kGlooAsyncSendBufferBytes (larger ones made 1-4 MiB all-reduces slower); in the sync modes as
// large as SO_SNDBUF may be set. With `rank1_wmem_max`, rank 1 reads that value instead of the
// host's, as a host configured otherwise would, and sends smaller messages than rank 0 receives
// from it: both still connect.
// Of two ranks: says through the store under `prefix` that this one finished, and waits (30 s)
// until the other has too; false, saying so, when it does not.
bool both_finished(Rank& me, const std::string& prefix) {
  if (me.context.store->set(prefix + std::to_string(me.rank), "1").ok() &&
      me.context.store->get(prefix + std::to_string(1 - me.rank), std::chrono::seconds(30)).ok()) {
    return true;
  }
  std::fprintf(stderr, "[rank %d] the peer did not finish\n", me.rank);
  return false;
}

void expect_primed_send_buffers(long rank1_wmem_max, bool sync) {
  const std::string dir = make_temp_dir();
  if (rank1_wmem_max > 0) {
    // Whether a process may pretend here at all (a child, so that this process keeps its mounts).
    std::fflush(nullptr);
    const pid_t probe = fork();
    if (probe == 0) _exit(pretend_wmem_max(dir, rank1_wmem_max).empty() ? 0 : 77);
    int status = 0;
    waitpid(probe, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::filesystem::remove_all(dir);
      GTEST_SKIP() << "a process cannot read another wmem_max here (unshare(CLONE_NEWNS) and a "
                      "bind mount over /proc/sys/net/core/wmem_max need root)";
    }
  }
  expect_all_zero(run_world(2, 1, [&](Rank& me) {
    if (me.rank == 1 && rank1_wmem_max > 0) {
      if (std::string why = pretend_wmem_max(dir, rank1_wmem_max); !why.empty()) {
        std::fprintf(stderr, "[rank 1] cannot pretend another wmem_max: %s\n", why.c_str());
        return 1;
      }
    }
    // Gloo throws; nothing may leave this child's body but its exit code.
    try {
      const long wmem_max = read_wmem_max();
      // Sync mode: twice the priming (the kernel doubles what is asked for). Async mode: exactly
      // kGlooAsyncSendBufferBytes where wmem_max allows half of it, as Gloo does not raise the
      // buffer for the priming's size or less.
      const long async_bytes = static_cast<long>(backends::kGlooAsyncSendBufferBytes);
      const long want =
          sync ? 2 * std::min<long>(wmem_max, static_cast<long>(backends::gloo_priming_bytes(sync)))
               : 2 * std::min<long>(wmem_max, async_bytes / 2);
      const long most = sync ? std::numeric_limits<long>::max() : async_bytes;
      backends::GlooConnectOptions o;
      o.sync = sync;
      o.host = "127.0.0.1";
      o.coordinator = "127.0.0.1";
      o.timeout = std::chrono::seconds(30);
      auto made = backends::connect_gloo(me.rank, 2, me.context.store, o);
      if (!made.ok()) {
        std::fprintf(stderr, "[rank %d] %s\n", me.rank, made.status().to_string().c_str());
        return 1;
      }
      // A first collective's small message, on which Gloo would size the send buffer.
      gloo::Context& context = *made->context;
      std::vector<char> out(4096, 1), in(4096, 0);
      const int slot = context.nextSlot();
      auto recv = context.getPair(1 - me.rank)->createRecvBuffer(slot, in.data(), in.size());
      auto send = context.getPair(1 - me.rank)->createSendBuffer(slot, out.data(), out.size());
      send->send();
      send->waitSend();
      recv->waitRecv();
      int code = 0;
      if (in != out) {
        std::fprintf(stderr, "[rank %d] the 4 KiB message arrived changed\n", me.rank);
        code = 1;
      }
      const std::string ends = made->peers.socket_of(1 - me.rank);
      const long bytes = send_buffer_of(ends);
      if (bytes < want || bytes > most) {
        std::fprintf(stderr, "[rank %d] SO_SNDBUF of '%s' (%s mode): %ld, want %ld to %ld\n",
                     me.rank, ends.c_str(), sync ? "sync" : "async", bytes, want, most);
        code = 1;
      }
      // Neither closes its connection while the other may still read from it.
      if (!both_finished(me, "done/")) code = 1;
      return code;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] %s\n", me.rank, e.what());
      return 1;
    }
  }));
  std::filesystem::remove_all(dir);
}

TEST(Gloo, InAsyncModeTheMeshStartsWith256KiBSendBuffers) {
  if (read_wmem_max() <= 0) GTEST_SKIP() << "cannot read /proc/sys/net/core/wmem_max";
  expect_primed_send_buffers(0, false);
}

TEST(Gloo, InSyncModeTheMeshStartsWithSendBuffersAsLargeAsTheKernelAllows) {
  if (read_wmem_max() <= 0) GTEST_SKIP() << "cannot read /proc/sys/net/core/wmem_max";
  expect_primed_send_buffers(0, true);
}

// A stock kernel's 208 KiB on rank 1 against this host's setting on rank 0, in sync mode, where
// the priming follows wmem_max.
TEST(Gloo, HostsWithDifferentWmemMaxStillConnect) {
  if (read_wmem_max() <= 0) GTEST_SKIP() << "cannot read /proc/sys/net/core/wmem_max";
  if (read_wmem_max() <= 212992) GTEST_SKIP() << "this host's wmem_max is a stock kernel's already";
  expect_primed_send_buffers(212992, true);
}

// This process's threads whose scheduling policy is SCHED_BATCH.
int batch_threads() {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = std::atoi(entry.path().filename().c_str());
    if (tid > 0 && sched_getscheduler(tid) == SCHED_BATCH) ++n;
  }
  return n;
}

// Gloo's I/O thread runs as SCHED_BATCH (gloo_context.cc, BatchThreadsStartedHere): where it
// shares a core with the thread issuing collectives, its wake-ups otherwise preempted that thread
// while it held a pair's lock, and it spun on the lock for the rest of its time slice. Exactly that
// one thread changes: the calling thread keeps its policy, and the threads connecting the mesh
// keep theirs.
TEST(Gloo, ItsIoThreadRunsAsSchedBatch) {
  if (sched_getscheduler(0) != SCHED_OTHER) {
    GTEST_SKIP() << "this test runs under another scheduling policy (chrt?); the backend changes "
                    "nothing then";
  }
  expect_all_zero(run_world(2, 1, [](Rank& me) {
    try {
      const int before = batch_threads();
      backends::GlooConnectOptions o;
      o.host = "127.0.0.1";
      o.coordinator = "127.0.0.1";
      o.timeout = std::chrono::seconds(30);
      auto made = backends::connect_gloo(me.rank, 2, me.context.store, o);
      if (!made.ok()) {
        std::fprintf(stderr, "[rank %d] %s\n", me.rank, made.status().to_string().c_str());
        return 1;
      }
      int code = 0;
      const int after = batch_threads();
      if (after != before + 1) {
        std::fprintf(stderr, "[rank %d] SCHED_BATCH threads: %d before connecting, %d after\n",
                     me.rank, before, after);
        code = 1;
      }
      if (sched_getscheduler(0) != SCHED_OTHER) {
        std::fprintf(stderr, "[rank %d] the calling thread's policy changed\n", me.rank);
        code = 1;
      }
      // Neither closes its connection while the other may still use it.
      if (!both_finished(me, "batch/")) code = 1;
      return code;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] %s\n", me.rank, e.what());
      return 1;
    }
  }));
}

// Every dtype Gloo reduces, world 2, one call each (float16 through gloo::float16).
TEST(Gloo, EveryDtypeAcrossTwoProcesses) {
  // Generous deadlines: CI runs this under AddressSanitizer beside other multi-process tests on two
  // cores, where a 20 s mesh set-up once ran out (nothing here measures time).
  expect_all_zero(run_world(2, 1, [](Rank& me) {
    Checker check(me.rank);
    for (const char* algorithm : {"halving_doubling", "unbound_ring"}) {
      const std::string spec = std::string("gloo:timeout=60s,algorithm=") + algorithm;
      auto made = create(spec, me);
      if (!made.ok()) {
        check.fail("%s", made.status().to_string().c_str());
        return 1;
      }
      for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt32,
                          DType::kInt64, DType::kInt8, DType::kUInt8}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
          check_all_reduce(**made, me, op, dtype, 1001, false, check, spec);
        }
      }
    }
    return check.ok() ? 0 : 1;
  }, 180));
}

}  // namespace
}  // namespace tributary

// The multi-process conformance suite (every collective x op x dtype, world sizes 1 to 5).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(Gloo, "gloo");
