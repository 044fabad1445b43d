// Fault tests of the multi-process backends, with real processes: a worker killed mid-collective, a
// silent worker, mismatched collectives, wrong or missing secrets, garbage and truncated bytes on
// the listening port, an unreachable store. Every surviving rank must end with an error that names
// what happened, within the timeout; the watchdog turns a hang into a failure.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "core/crypto/crypto.h"
#include "algorithms/host_layout.h"
#include "algorithms/process_group_ops.h"
#include "tests/multiprocess/harness.h"
#include "transports/shm/shm_group.h"
#include "transports/tcp/tcp_wire.h"
#include "tributary/store.h"

namespace tributary::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kChildSawError = 3;

void write_note(const std::string& dir, int rank, const std::string& text) {
  std::ofstream(dir + "/note" + std::to_string(rank)) << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_note(const std::string& dir, int rank) {
  return read_file(dir + "/note" + std::to_string(rank));
}

void append_note(const std::string& dir, int rank, const std::string& text) {
  std::ofstream(dir + "/note" + std::to_string(rank), std::ios::app) << text;
}

// Each of the group's first `ranks` children exited with `exit_code` and wrote a note that says
// every one of `says`.
void expect_every_rank(const GroupResult& g, const std::string& dir, int ranks, int exit_code,
                       std::initializer_list<std::string_view> says) {
  for (int r = 0; r < ranks; ++r) {
    const std::string note = read_note(dir, r);
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, exit_code)
        << "rank " << r << ": " << note << "\n"
        << g.describe();
    for (std::string_view want : says) {
      EXPECT_NE(note.find(want), std::string::npos)
          << "rank " << r << " should say '" << want << "': " << note;
    }
  }
}

// ---- The harness's watchdog -----------------------------------------------------------------

// A rank that hangs is killed by the watchdog, and its threads' stacks are printed first, so that a
// hang met once in CI says where it waited. (Needs gdb, which the sanitizer and CI machines have.)
[[gnu::noinline]] void a_rank_waiting_forever() {
  for (;;) ::pause();
}

TEST(Harness, TheWatchdogPrintsAHungRanksStacksBeforeKillingIt) {
  if (std::system("command -v gdb >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gdb is not installed, so the watchdog prints no stacks";
  }
  ::testing::internal::CaptureStderr();
  GroupResult g = run_group(2, 3s, [](int rank) {
    if (rank == 1) a_rank_waiting_forever();
    return kChildOk;
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[0].exit_code, kChildOk) << g.describe();
  EXPECT_EQ(g.children[1].signal, SIGKILL) << g.describe();
  EXPECT_NE(err.find("[watchdog] rank 1, still running after 3 s"), std::string::npos) << err;
  EXPECT_NE(err.find("a_rank_waiting_forever"), std::string::npos) << err;
  EXPECT_EQ(err.find("[watchdog] rank 0"), std::string::npos) << err;
}

// ---- What a failed group may leave behind ----------------------------------------------------
// Shared-memory segments mapped by this process: ring's memfds ("tributary-shm"), POSIX segments
// (/dev/shm, UCX's posix transport) and SysV ones ("/SYSV", UCX's sysv transport).
size_t segment_mappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("tributary-shm") != std::string::npos ||
         line.find("/dev/shm/") != std::string::npos || line.find("/SYSV") != std::string::npos;
  }
  return n;
}

// Notes the segments this process maps while it holds the instance ("mapped_during=N"), then
// drops the instance and notes what is still mapped ("mapped_after=N").
void drop_and_note_mappings(std::unique_ptr<CrossDeviceOps>& ops, const std::string& dir,
                            int rank) {
  const size_t during = segment_mappings();
  ops.reset();
  append_note(dir, rank,
              "\nmapped_during=" + std::to_string(during) +
                  "\nmapped_after=" + std::to_string(segment_mappings()));
}

std::vector<std::string> dev_shm_entries() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Whether any process maps /dev/shm/<name> or holds it open (a segment of a test running beside
// this one, not a leak).
bool held_by_some_process(const std::string& name) {
  const std::string path = "/dev/shm/" + name;
  std::error_code ec;
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream maps(proc.path() / "maps");
    for (std::string line; std::getline(maps, line);) {
      if (line.find(path) != std::string::npos) return true;
    }
    std::error_code ec2;
    for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", ec2)) {
      std::error_code ec3;
      if (std::filesystem::read_symlink(fd.path(), ec3).string().rfind(path, 0) == 0) return true;
    }
  }
  return false;
}

// What the processes of `g` left behind once they are all gone, "" if nothing: entries of /dev/shm
// that were not there `before` and that no process holds, and SysV segments that one of them
// created (/proc/sysvipc/shm's cpid), which nothing removes once their creator is gone.
std::string segments_left(const std::vector<std::string>& before, const GroupResult& g) {
  std::string left;
  for (const std::string& name : dev_shm_entries()) {
    if (!std::binary_search(before.begin(), before.end(), name) && !held_by_some_process(name))
      left += " /dev/shm/" + name;
  }
  std::ifstream sysv("/proc/sysvipc/shm");
  std::string line;
  std::getline(sysv, line);  // the header
  while (std::getline(sysv, line)) {
    std::istringstream in(line);
    long long key = 0, id = 0, perms = 0, size = 0;
    int cpid = 0;
    if (!(in >> key >> id >> perms >> size >> cpid)) continue;
    for (const ChildResult& c : g.children) {
      if (c.pid == cpid) left += " SysV segment " + std::to_string(id) + " of rank pid " +
                                 std::to_string(cpid);
    }
  }
  return left;
}

// Runs all-reduces until one fails; notes the error and the time it took, checks that the instance
// then refuses more collectives, and returns kChildSawError (kChildOk if none failed).
int all_reduce_until_error(CrossDeviceOps& ops, const std::string& dir, int iterations,
                           int64_t count, int die_at = -1, int die_signal = SIGKILL) {
  std::vector<float> a(static_cast<size_t>(count), 1.0f), b(static_cast<size_t>(count), 2.0f);
  PerReplica<Tensor> v;
  v.values().emplace_back(a.data(), DType::kFloat32, count, ops.devices()[0]);
  if (ops.num_local_replicas() > 1)
    v.values().emplace_back(b.data(), DType::kFloat32, count, ops.devices()[1]);
  for (int i = 0; i < iterations; ++i) {
    if (i == die_at) raise(die_signal);
    const auto start = Clock::now();
    Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(std::chrono::seconds(120));
    if (!s.ok()) {
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      Status again = ops.all_reduce(ReduceOp::kSum, v, v).wait(1s);
      write_note(
          dir, ops.rank(),
          s.to_string() + "\nseconds=" + std::to_string(took) + "\nagain=" + again.to_string());
      return kChildSawError;
    }
  }
  return kChildOk;
}

double seconds_in(const std::string& note) {
  auto pos = note.find("seconds=");
  return pos == std::string::npos ? 1e9 : std::stod(note.substr(pos + 8));
}

// Rank 1 of `g` was killed with SIGKILL in the middle of all-reduces: every rank of `survivors`
// failed within `within` seconds with an error naming rank 1 and the all-reduce, its note holds
// every string of `also` (what it noted of its mappings), and no segment is left in /dev/shm.
void expect_survivors_name_killed_rank_1(const GroupResult& g, const std::string& dir,
                                         std::initializer_list<int> survivors, double within,
                                         std::initializer_list<const char*> also,
                                         const std::vector<std::string>& dev_shm_before,
                                         const std::string& collective = "all_reduce") {
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[1].signal, SIGKILL) << g.describe();
  for (int r : survivors) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    const std::string note = read_note(dir, r);
    EXPECT_NE(note.find("rank 1"), std::string::npos) << note;
    EXPECT_NE(note.find(collective + " #"), std::string::npos) << note;
    EXPECT_LT(seconds_in(note), within) << note;
    for (const char* text : also) EXPECT_NE(note.find(text), std::string::npos) << note;
  }
  EXPECT_EQ(segments_left(dev_shm_before, g), "");
}

// Writes a call's outcome in `rank`'s note ("<status>\nseconds=<since start>") and returns the
// child's exit code for it: kChildOk when it succeeded, else kChildSawError.
int note_outcome(const std::string& dir, int rank, const Status& s, Clock::time_point start) {
  write_note(dir, rank,
             s.to_string() + "\nseconds=" +
                 std::to_string(std::chrono::duration<double>(Clock::now() - start).count()));
  return s.ok() ? kChildOk : kChildSawError;
}

// Runs `body(rank, ops)` in `n` processes, each with a `spec` backend made from the group's
// context (a child whose backend cannot be made fails with kChildFailed); 60 s watchdog.
template <typename Body>
GroupResult run_backend_group(int n, const std::string& dir, const std::string& spec, Body body) {
  return run_group(n, 60s, [&](int rank) {
    auto ctx = group_context(rank, n, 1, dir);
    auto ops = builtin_backends().create(spec, *ctx);
    if (!ops.ok()) return kChildFailed;
    return body(rank, **ops);
  });
}

// A backend that is not built in (ucx without UCX) is a visible skip, not a failure.
class RingFaults : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string name = GetParam().substr(0, GetParam().find(':'));
    if (builtin_backends().find(name) == nullptr) {
      GTEST_SKIP() << "backend '" << name << "' is not built into this tributary";
    }
    if (GetParam().find("shm_single_copy=on") != std::string::npos &&
        !why_siblings_cannot_read_each_other().empty()) {
      GTEST_SKIP() << why_siblings_cannot_read_each_other();
    }
  }
};

// After each fault case, nothing is left behind: no survivor still maps a segment once it drops
// the instance, and no segment outlives the group (segments_left).
TEST_P(RingFaults, KilledWorkerFailsEverySurvivorWithinTheTimeout) {
  const std::string spec = GetParam() + ",timeout=8s";
  for (int die_at : {0, 3}) {
    const std::string dir = make_temp_dir("kill");
    const std::vector<std::string> before = dev_shm_entries();
    GroupResult g = run_group(4, 60s, [&](int rank) {
      auto ctx = group_context(rank, 4, 1, dir);
      auto ops = builtin_backends().create(spec, *ctx);
      if (!ops.ok()) return kChildFailed;
      const int result =
          all_reduce_until_error(**ops, dir, 1000, 1 << 18, rank == 1 ? die_at : -1);
      drop_and_note_mappings(*ops, dir, rank);
      return result;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    EXPECT_EQ(g.children[1].signal, SIGKILL) << g.describe();
    for (int r : {0, 2, 3}) {
      EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
      const std::string note = read_note(dir, r);
      EXPECT_NE(note.find("rank 1"), std::string::npos) << note;  // the killed one
      // Which exited, or closed its connections, as the transport says: not a rank that stayed
      // silent (stopped, hung), which is what the roll call would add without wills.
      EXPECT_EQ(note.find("did not fail with the others"), std::string::npos) << note;
      EXPECT_NE(note.find("all_reduce #"), std::string::npos) << note;
      EXPECT_LT(seconds_in(note), 8.0 + 4.0) << note;
      EXPECT_NE(note.find("again=failed_precondition"), std::string::npos) << note;
      EXPECT_NE(note.find("mapped_after=0"), std::string::npos) << note;
      // On shared memory the check above has something to find.
      if (GetParam().find("shm") != std::string::npos || GetParam() == "ucx:tls=sm") {
        EXPECT_EQ(note.find("mapped_during=0"), std::string::npos) << note;
      }
    }
    EXPECT_EQ(segments_left(before, g), "") << "die_at " << die_at;
  }
}

TEST_P(RingFaults, SilentWorkerIsADeadlineNamingIt) {
  const std::string spec = GetParam() + ",timeout=2s";
  const std::string dir = make_temp_dir("silent");
  GroupResult g = run_backend_group(3, dir, spec, [&](int rank, CrossDeviceOps& ops) {
    if (rank == 1) {
      std::this_thread::sleep_for(6s);  // alive, connected, but never joins the collective
      return kChildOk;
    }
    return all_reduce_until_error(ops, dir, 1, 1024);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  // Every survivor names the silent rank; at least one (the rank that waited on it) says it was a
  // deadline, which the other may receive passed on.
  bool deadline = false;
  for (int r : {0, 2}) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    const std::string note = read_note(dir, r);
    EXPECT_LT(seconds_in(note), 2.0 + 3.0) << note;
    EXPECT_NE(note.find("rank 1"), std::string::npos) << "rank " << r << ": " << note;
    deadline = deadline || note.find("deadline_exceeded") != std::string::npos;
  }
  EXPECT_TRUE(deadline) << read_note(dir, 0) << "\n" << read_note(dir, 2);
}

TEST_P(RingFaults, MismatchedCollectivesFailOnEveryRank) {
  const std::string spec = GetParam() + ",timeout=5s";
  struct Variant {
    const char* name;
    ReduceOp op;
    DType dtype;
    int64_t count;
    int64_t others = 64;  // the count of the other ranks
  };
  // The last one is past the striping threshold when there are several sockets per peer.
  for (Variant v :
       {Variant{"op", ReduceOp::kMax, DType::kFloat32, 64},
        Variant{"dtype", ReduceOp::kSum, DType::kInt32, 64},
        Variant{"count", ReduceOp::kSum, DType::kFloat32, 65},
        Variant{"large count", ReduceOp::kSum, DType::kFloat32, (1 << 18) + 16, 1 << 18}}) {
    const std::string dir = make_temp_dir("mismatch");
    const std::vector<std::string> before = dev_shm_entries();
    GroupResult g = run_group(3, 60s, [&](int rank) {
      auto ctx = group_context(rank, 3, 1, dir);
      auto ops = builtin_backends().create(spec, *ctx);
      if (!ops.ok()) return kChildFailed;
      const bool odd = rank == 1;
      const DType t = odd ? v.dtype : DType::kFloat32;
      const int64_t count = odd ? v.count : v.others;
      auto buf = Buffer::allocate(t, Shape{count});
      std::memset(buf->data(), 0, buf->nbytes());
      PerReplica<Tensor> x{buf->tensor()};
      Status s = (*ops)->all_reduce(odd ? v.op : ReduceOp::kSum, x, x).wait(30s);
      write_note(dir, rank, s.to_string());
      drop_and_note_mappings(*ops, dir, rank);
      return s.ok() ? kChildOk : kChildSawError;
    });
    ASSERT_FALSE(g.watchdog_fired) << v.name << ": " << g.describe();
    // Every rank fails, and names the mismatch (the ranks that did not see it get the reason
    // passed on). Except with large messages: a rank still sending a megabyte into a peer that
    // closed may get the reset first, and a reset discards the reason waiting in its socket.
    const bool large = v.others > 64;
    int named = 0;
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError)
          << v.name << ": " << g.describe();
      const bool names = read_note(dir, r).find("collective mismatch") != std::string::npos;
      named += names ? 1 : 0;
      if (!large) {
        EXPECT_TRUE(names) << v.name << " rank " << r << ": " << read_note(dir, r);
      }
    }
    EXPECT_GE(named, 1) << v.name << ": " << read_note(dir, 0) << read_note(dir, 1)
                        << read_note(dir, 2);
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(read_note(dir, r).find("mapped_after=0"), std::string::npos)
          << v.name << " rank " << r << ": " << read_note(dir, r);
    }
    EXPECT_EQ(segments_left(before, g), "") << v.name;
  }
}

// A broadcast where one rank names another root fails on every rank, naming the roots (it used
// to succeed everywhere over TCP, leaving the ranks disagreeing).
TEST_P(RingFaults, BroadcastWithAnotherRootFailsOnEveryRank) {
  const std::string spec = GetParam() + ",timeout=5s";
  const std::string dir = make_temp_dir("root");
  GroupResult g = run_backend_group(3, dir, spec, [&](int rank, CrossDeviceOps& ops) {
    std::vector<float> v(64, static_cast<float>(rank));
    Tensor t(v.data(), DType::kFloat32, Shape{64});
    const int root = rank == 2 ? 1 : 0;
    Status s = ops.broadcast(t, Mirrored<Tensor>({t}), root).wait(30s);
    write_note(dir, rank, s.to_string());
    return s.ok() ? kChildOk : kChildSawError;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 3, kChildSawError, {"collective mismatch", "root"});
}

// A rank that ends early and cleanly (its last collective done, its backend destroyed, its process
// gone) fails the peers still waiting on it at once, naming it, not at their timeout: on TCP its
// connections close, on shared memory its process exits, on UCX its goodbye arrives (which the
// peers took for nothing until their timeout, as a fault audit found).
TEST_P(RingFaults, RankThatFinishesEarlyFailsThePeersQuickly) {
  const std::string spec = GetParam() + ",timeout=30s";
  const std::string dir = make_temp_dir("early");
  GroupResult g = run_group(3, 90s, [&](int rank) {
    auto ctx = group_context(rank, 3, 1, dir);
    auto ops = builtin_backends().create(spec, *ctx);
    if (!ops.ok()) return kChildFailed;
    if (rank == 2) {
      std::vector<float> v(1024, 1.0f);
      PerReplica<Tensor> x{Tensor(v.data(), DType::kFloat32, int64_t{1024})};
      for (int i = 0; i < 2; ++i) {
        if (!(*ops)->all_reduce(ReduceOp::kSum, x, x).wait(30s).ok()) return kChildFailed;
      }
      ops->reset();  // done: the backend closes, and the process ends
      return kChildOk;
    }
    return all_reduce_until_error(**ops, dir, 1000, 1024);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (int r : {0, 1}) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    const std::string note = read_note(dir, r);
    EXPECT_NE(note.find("rank 2"), std::string::npos) << "rank " << r << ": " << note;
    EXPECT_LT(seconds_in(note), 10.0) << "rank " << r << ": " << note;  // the timeout is 30 s
  }
}

// A call one rank refuses (bad arguments) fails the group at once, not at the peers' timeout.
TEST_P(RingFaults, CallRefusedOnOneRankFailsThePeersQuickly) {
  const std::string spec = GetParam() + ",timeout=30s";
  const std::string dir = make_temp_dir("refused");
  GroupResult g = run_group(3, 60s, [&](int rank) {
    auto ctx = group_context(rank, 3, 1, dir);
    auto ops = builtin_backends().create(spec, *ctx);
    if (!ops.ok()) {
      write_note(dir, rank, "setup failed: " + ops.status().to_string());
      return kChildFailed;
    }
    std::vector<float> in(64, 1.0f), out(rank == 1 ? 63 : 64);  // rank 1's output is too small
    PerReplica<Tensor> x{Tensor(in.data(), DType::kFloat32, int64_t{64})};
    PerReplica<Tensor> y{Tensor(out.data(), DType::kFloat32, static_cast<int64_t>(out.size()))};
    const auto start = Clock::now();
    Status s = (*ops)->all_reduce(ReduceOp::kSum, x, y).wait(60s);
    return note_outcome(dir, rank, s, start);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_NE(read_note(dir, 1).find("invalid_argument: all_reduce: outputs[0] has 63 elements"),
            std::string::npos)
      << read_note(dir, 1);
  for (int r : {0, 2}) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    EXPECT_NE(read_note(dir, r).find("rank 1 refused its part: all_reduce: outputs[0] has 63"),
              std::string::npos)
        << read_note(dir, r);
    // Rank 1 gave up on purpose: it is not named as a silent rank.
    EXPECT_EQ(read_note(dir, r).find("did not fail with the others"), std::string::npos)
        << read_note(dir, r);
    EXPECT_LT(seconds_in(read_note(dir, r)), 5.0) << read_note(dir, r);
  }
}

// Shared memory: a same-host peer killed with SIGKILL in the middle of collectives fails every
// survivor within the timeout, naming it, and leaves nothing behind: no file in /dev/shm (the
// segments are anonymous memfds) and, once the survivors drop the instance, no mapping of any
// segment in their address space.
TEST(SharedMemoryFaults, KilledPeerFailsTheOthersAndLeavesNoSegment) {
  const std::vector<std::string> before = dev_shm_entries();
  const std::string dir = make_temp_dir("shmkill");
  GroupResult g = run_group(3, 60s, [&](int rank) {
    auto ctx = group_context(rank, 3, 1, dir);
    auto ops = builtin_backends().create("ring:intra_host=shm,timeout=8s", *ctx);
    if (!ops.ok()) return kChildFailed;
    const size_t mapped = segment_mappings();
    const int result = all_reduce_until_error(**ops, dir, 1000, 1 << 20, rank == 1 ? 5 : -1);
    const std::string note = read_note(dir, rank);
    ops->reset();
    write_note(dir, rank,
               note + "\nmapped_during=" + std::to_string(mapped) +
                   "\nmapped_after=" + std::to_string(segment_mappings()));
    return result;
  });
  // Within the timeout (8 s) and the roll call's grace; its own segment and 2 peers' were mapped.
  expect_survivors_name_killed_rank_1(g, dir, {0, 2}, 8.0 + 4.0,
                                      {"mapped_during=3", "mapped_after=0"}, before);
}

// Makes every call `nr` (process_vm_readv or process_vm_writev) of this process fail with EPERM, as
// the kernel answers where Yama or a missing CAP_SYS_PTRACE forbids reaching a peer's memory (a
// seccomp filter, which may also refuse one call alone: tests run as root here, where the kernel
// itself would allow it).
bool refuse_reaching_other_processes(long nr) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// The calls single copy needs, each refused alone below.
struct RefusedCall {
  long nr;
  const char* name;
};
const RefusedCall kRefusedCalls[] = {{__NR_process_vm_readv, "process_vm_readv"},
                                     {__NR_process_vm_writev, "process_vm_writev"}};

// Shared memory's single copy where one rank may not read (or may not write) its peers' memory:
// with `auto` every rank keeps the slots (a rank that took the single-copy path alone would be a
// mismatch, and one that read or wrote anyway an error), so an all-reduce inside auto's range is
// right everywhere; with `on` every rank fails at setup at once, rank 1 with the kernel's
// refusal and the others naming rank 1.
TEST(SharedMemorySingleCopy, ARankThatMayNotReadItsPeersKeepsEveryRankOnTheSlots) {
  if (!why_siblings_cannot_read_each_other().empty()) {
    GTEST_SKIP() << why_siblings_cannot_read_each_other();
  }
  for (const RefusedCall& refused : kRefusedCalls) {
    SCOPED_TRACE(refused.name);
    const std::string dir = make_temp_dir("single_copy_auto");
    GroupResult g = run_group(3, 60s, [&](int rank) {
      if (rank == 1 && !refuse_reaching_other_processes(refused.nr)) return kChildFailed;
      auto ctx = group_context(rank, 3, 1, dir);
      auto ops = builtin_backends().create("ring:shm_single_copy=auto,timeout=10s", *ctx);
      if (!ops.ok()) {
        write_note(dir, rank, ops.status().to_string());
        return kChildFailed;
      }
      // Inside auto's range also where the kernel's copies were timed slow at setup (64 MiB with
      // a 32 MiB last-level cache; shm_group.h), up to 256 MiB.
      const size_t bytes = std::min(
          transports::shm::single_copy_slow_from(transports::shm::last_level_cache_bytes()),
          size_t{256} << 20);
      const int64_t count = static_cast<int64_t>(bytes / sizeof(float));
      std::vector<float> x(static_cast<size_t>(count), static_cast<float>(rank + 1));
      PerReplica<Tensor> v{Tensor(x.data(), DType::kFloat32, Shape{count})};
      const Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(30s);
      write_note(dir, rank,
                 s.to_string() + " first=" + std::to_string(x.front()) +
                     " last=" + std::to_string(x.back()));
      return s.ok() && x.front() == 6.0f && x.back() == 6.0f ? kChildOk : kChildFailed;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    expect_every_rank(g, dir, 3, kChildOk, {});
  }
}

TEST(SharedMemorySingleCopy, OnFailsEveryRankAtSetupWhereOneMayNotReadItsPeers) {
  if (!why_siblings_cannot_read_each_other().empty()) {
    GTEST_SKIP() << why_siblings_cannot_read_each_other();
  }
  for (const RefusedCall& refused : kRefusedCalls) {
    SCOPED_TRACE(refused.name);
    const std::string dir = make_temp_dir("single_copy_on");
    GroupResult g = run_group(3, 60s, [&](int rank) {
      if (rank == 1 && !refuse_reaching_other_processes(refused.nr)) return kChildFailed;
      auto ctx = group_context(rank, 3, 1, dir);
      const auto start = Clock::now();
      auto ops = builtin_backends().create("ring:shm_single_copy=on,timeout=20s", *ctx);
      write_note(dir, rank,
                 ops.status().to_string() + "\nseconds=" +
                     std::to_string(std::chrono::duration<double>(Clock::now() - start).count()));
      return ops.ok() ? kChildOk : kChildSawError;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
      const std::string note = read_note(dir, r);
      EXPECT_NE(note.find("failed_precondition"), std::string::npos) << note;
      EXPECT_NE(note.find("shm_single_copy=on"), std::string::npos) << note;
      EXPECT_LT(seconds_in(note), 10.0) << note;  // at once, not at the 20 s timeout
      if (r == 1) {
        EXPECT_NE(
            note.find(std::string("with ") + refused.name + " failed: Operation not permitted"),
            std::string::npos)
            << note;
        EXPECT_NE(note.find("ptrace_scope"), std::string::npos) << note;
      } else {
        EXPECT_NE(note.find("rank 1 may not read and write the memory of its peers"),
                  std::string::npos)
            << note;
      }
    }
  }
}

// A peer killed while the others may be reading its buffers: 16 MiB single-copy all-reduces back to
// back, rank 1 killed by a thread of its own 300 ms in, so that the kill lands inside a call (in a
// read of its memory, ESRCH, or in a wait, its pidfd). Every survivor fails within the timeout
// naming rank 1, and nothing is left mapped or in /dev/shm.
TEST(SharedMemorySingleCopy, PeerKilledInTheMiddleFailsTheOthersNamingIt) {
  if (!why_siblings_cannot_read_each_other().empty()) {
    GTEST_SKIP() << why_siblings_cannot_read_each_other();
  }
  const std::vector<std::string> before = dev_shm_entries();
  const std::string dir = make_temp_dir("single_copy_kill");
  GroupResult g = run_group(3, 60s, [&](int rank) {
    auto ctx = group_context(rank, 3, 1, dir);
    auto ops = builtin_backends().create("ring:shm_single_copy=on,timeout=8s", *ctx);
    if (!ops.ok()) return kChildFailed;
    if (rank == 1) {
      std::thread([] {
        std::this_thread::sleep_for(300ms);
        raise(SIGKILL);
      }).detach();
    }
    const int result = all_reduce_until_error(**ops, dir, 100000, int64_t{1} << 22);
    drop_and_note_mappings(*ops, dir, rank);
    return result;
  });
  // The error says rank 1 exited, so the roll call does not wait its 2 s grace (timeout / 4) for
  // rank 1's report before returning it (the FileStore keeps no wills to tell it sooner).
  expect_survivors_name_killed_rank_1(g, dir, {0, 2}, 1.5, {"mapped_after=0"}, before);
}

// ---- Shared memory's direct path: registered buffers from Buffer::allocate_shareable ----------

// Mappings of shareable buffers (memfds named "tributary-shareable") in this process: its own
// allocations and the peers' it maps for a registration.
size_t shareable_mappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("tributary-shareable") != std::string::npos;
  }
  return n;
}

// The shared-memory group under a ring backend whose processes share a host; null otherwise.
const transports::shm::ShmGroup* shm_group_of(const CrossDeviceOps& ops) {
  const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(&ops);
  return pg ? dynamic_cast<const transports::shm::ShmGroup*>(pg->group()) : nullptr;
}

// A float32 buffer of `count` from Buffer::allocate_shareable, every element `value`.
Buffer shareable_filled(int64_t count, float value) {
  auto b = Buffer::allocate_shareable(DType::kFloat32, Shape{count});
  if (!b.ok()) std::abort();
  std::fill_n(b->data_as<float>(), count, value);
  return std::move(b).value();
}

// A peer killed while the others write into its buffer or read from it: 16 MiB direct
// all-reduces, all-gathers (16/3 MiB per rank), broadcasts or reduce-scatters (from the buffer into
// ordinary memory) back to back, rank 1 killed by a thread
// of its own 300 ms in. Every survivor fails within the timeout naming rank 1 (the kill is seen in
// a wait, through its pidfd), and once the registration and the instance are gone nothing is left
// mapped: not rank 1's buffer (the survivors' mappings of it were the last), nor any segment.
class SharedMemoryDirectKill : public ::testing::TestWithParam<std::string> {};

TEST_P(SharedMemoryDirectKill, PeerKilledInTheMiddleFailsTheOthersNamingIt) {
  const std::string collective = GetParam();
  const std::vector<std::string> before = dev_shm_entries();
  const std::string dir = make_temp_dir("direct_kill_" + collective);
  GroupResult g = run_group(3, 60s, [&](int rank) {
    auto ctx = group_context(rank, 3, 1, dir);
    auto ops = builtin_backends().create("ring:timeout=8s", *ctx);
    if (!ops.ok()) return kChildFailed;
    const int64_t count = int64_t{1} << 22;
    {
      Buffer x = shareable_filled(count, 1.0f);
      PerReplica<Tensor> v{x.tensor()};
      auto reg = (*ops)->register_buffers(v);
      if (!reg.ok()) return kChildFailed;
      const size_t mapped_registered = shareable_mappings();
      const transports::shm::ShmGroup* shm = shm_group_of(**ops);
      if (shm == nullptr || !shm->registered_direct(reg->id())) return kChildFailed;
      if (rank == 1) {
        std::thread([] {
          std::this_thread::sleep_for(300ms);
          raise(SIGKILL);
        }).detach();
      }
      // All-gather in place: this rank's block of the buffer is its input; reduce-scatter from
      // the buffer into ordinary memory.
      PerReplica<Tensor> block{x.tensor().slice(rank * (count / 3), count / 3)};
      PerReplica<Tensor> gathered{x.tensor().slice(0, count / 3 * 3)};
      auto scattered = Buffer::allocate(DType::kFloat32, Shape{count / 3});
      if (!scattered.ok()) return kChildFailed;
      PerReplica<Tensor> into{scattered->tensor()};
      int result = kChildOk;
      for (int i = 0; i < 100000 && result == kChildOk; ++i) {
        const auto start = Clock::now();
        Status s = collective == "all_reduce"   ? (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(120s)
                   : collective == "all_gather" ? (*ops)->all_gather(block, gathered).wait(120s)
                   : collective == "reduce_scatter"
                       ? (*ops)->reduce_scatter(ReduceOp::kSum, gathered, into).wait(120s)
                       : (*ops)->broadcast(x.tensor(), Mirrored<Tensor>{x.tensor()}, 0).wait(120s);
        if (!s.ok()) {
          write_note(dir, rank,
                     s.to_string() + "\nseconds=" +
                         std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) +
                         "\nmapped_registered=" + std::to_string(mapped_registered));
          result = kChildSawError;
        }
        std::fill_n(x.data_as<float>(), count, 1.0f);  // every sum stays 3
      }
      reg->release();
      if (result != kChildSawError) return result;
    }
    drop_and_note_mappings(*ops, dir, rank);
    append_note(dir, rank, "\nshareable_after=" + std::to_string(shareable_mappings()));
    return kChildSawError;
  });
  // An exit is seen at once, not at the timeout; its own buffer and 2 peers' were mapped.
  expect_survivors_name_killed_rank_1(
      g, dir, {0, 2}, 1.5, {"mapped_registered=3", "mapped_after=0", "shareable_after=0"}, before,
      collective);
}

INSTANTIATE_TEST_SUITE_P(Collectives, SharedMemoryDirectKill,
                         ::testing::Values("all_reduce", "all_gather", "broadcast",
                                           "reduce_scatter"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A rank that falls silent on the direct path: the others fail at the timeout naming it, and when
// it wakes and issues the call they gave up on, it finds them gone before it writes a byte into
// their buffers (each checks, before every block, whether a peer gave up): what they got back
// stays as it was.
TEST(SharedMemoryDirect, ALateRankNeverWritesIntoBuffersItsPeersGotBack) {
  const std::string dir = make_temp_dir("direct_late");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=2s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = int64_t{1} << 20;  // 4 MiB
    Buffer x = shareable_filled(count, 1.0f);
    PerReplica<Tensor> v{x.tensor()};
    auto reg = ops.register_buffers(v);
    if (!reg.ok()) return kChildFailed;
    const auto start = Clock::now();
    for (int i = 0; i < 3; ++i) {
      if (rank == 1 && i == 2) std::this_thread::sleep_for(4s);
      std::fill_n(x.data_as<float>(), count, static_cast<float>(rank + 1));
      const Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(30s);
      if (s.ok()) continue;
      // What this rank got back, then again once the late rank has surely run its call.
      double before = 0;
      for (int64_t k = 0; k < count; ++k) before += x.data_as<float>()[k];
      if (rank != 1) std::this_thread::sleep_until(start + 8s);
      double after = 0;
      for (int64_t k = 0; k < count; ++k) after += x.data_as<float>()[k];
      write_note(dir, rank,
                 s.to_string() + "\ncall=" + std::to_string(i) +
                     "\nunchanged=" + std::to_string(before == after));
      return kChildSawError;
    }
    return kChildOk;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    const std::string note = read_note(dir, r);
    EXPECT_NE(note.find("call=2"), std::string::npos) << note;
    EXPECT_NE(note.find("unchanged=1"), std::string::npos) << note;
    if (r != 1) {
      EXPECT_NE(note.find("rank 1"), std::string::npos) << note;
    }
  }
  EXPECT_NE(read_note(dir, 1).find("gave up"), std::string::npos) << read_note(dir, 1);
}

// A rank that all-reduces another buffer while its peers all-reduce the registered one breaks the
// rule that registered buffers are used on every rank: every rank fails with a mismatch that names
// both calls, at once, not at the timeout.
TEST(SharedMemoryDirect, ARankOffTheRegisteredBufferIsAMismatchOnEveryRank) {
  const std::string dir = make_temp_dir("direct_mismatch");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = int64_t{1} << 18;  // 1 MiB
    Buffer x = shareable_filled(count, 1.0f);
    Buffer other = shareable_filled(count, 1.0f);
    PerReplica<Tensor> v{x.tensor()};
    auto reg = ops.register_buffers(v);
    if (!reg.ok()) return kChildFailed;
    PerReplica<Tensor> w{rank == 2 ? other.tensor() : x.tensor()};
    const auto start = Clock::now();
    const Status s = ops.all_reduce(ReduceOp::kSum, w, w).wait(60s);
    return note_outcome(dir, rank, s, start);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 3, kChildSawError,
                    {"collective mismatch", "on the registered shareable buffer of registration #1",
                     "must be used on every rank"});
  for (int r = 0; r < 3; ++r) EXPECT_LT(seconds_in(read_note(dir, r)), 10.0) << read_note(dir, r);
}

// Two registrations of the same size, and one rank all-reducing the other one: the headers name
// the registration, so every rank fails with a mismatch naming both, rather than each reading and
// writing buffers its peers are not using.
TEST(SharedMemoryDirect, RanksOnDifferentRegistrationsAreAMismatch) {
  const std::string dir = make_temp_dir("direct_two");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = int64_t{1} << 18;
    Buffer x = shareable_filled(count, 1.0f), y = shareable_filled(count, 1.0f);
    PerReplica<Tensor> vx{x.tensor()}, vy{y.tensor()};
    auto rx = ops.register_buffers(vx);
    auto ry = ops.register_buffers(vy);
    if (!rx.ok() || !ry.ok()) return kChildFailed;
    const PerReplica<Tensor>& v = rank == 2 ? vy : vx;
    const Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(60s);
    write_note(dir, rank, s.to_string());
    return s.ok() ? kChildOk : kChildSawError;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 3, kChildSawError,
                    {"collective mismatch", "registration #1", "registration #2"});
}

// A registered buffer freed before its registration ends: the next all-reduce on its address is
// an error that says so, on every rank, not writes into memory its owner no longer holds.
TEST(SharedMemoryDirect, ABufferFreedWhileRegisteredIsAnError) {
  const std::string dir = make_temp_dir("direct_freed");
  GroupResult g = run_backend_group(2, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = int64_t{1} << 18;
    Buffer x = shareable_filled(count, 1.0f);
    PerReplica<Tensor> v{x.tensor()};
    auto reg = ops.register_buffers(v);
    if (!reg.ok()) return kChildFailed;
    if (!ops.all_reduce(ReduceOp::kSum, v, v).wait(60s).ok()) return kChildFailed;
    x = Buffer();  // freed; the registration still names its address (never read: refused)
    const Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(60s);
    write_note(dir, rank, s.to_string());
    return s.ok() ? kChildOk : kChildSawError;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 2, kChildSawError, {"was freed while registered"});
}

// Out of place on the direct path, where each rank's input is may differ: ranks 0 and 2 read from
// a registered input (the peers read it where it is), rank 1 from ordinary memory (copied into its
// output first; its registered input holds 100s, so a peer that read it there would sum wrong).
// Every result is right, on the direct path, and every input is unchanged.
TEST(SharedMemoryDirect, OutOfPlaceFromRegisteredAndOrdinaryInputsIsRight) {
  const std::string dir = make_temp_dir("direct_inputs");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = (int64_t{1} << 18) + 5;
    Buffer x = shareable_filled(count, rank == 1 ? 100.0f : static_cast<float>(rank + 1));
    Buffer y = shareable_filled(count, -1.0f);
    auto z = Buffer::allocate(DType::kFloat32, Shape{count});
    if (!z.ok()) return kChildFailed;
    std::fill_n(z->data_as<float>(), count, static_cast<float>(rank + 1));
    PerReplica<Tensor> vx{x.tensor()}, vy{y.tensor()}, vz{z->tensor()};
    auto rx = ops.register_buffers(vx);
    auto ry = ops.register_buffers(vy);
    const transports::shm::ShmGroup* shm = shm_group_of(ops);
    if (!rx.ok() || !ry.ok() || shm == nullptr) return kChildFailed;
    const PerReplica<Tensor>& in = rank == 1 ? vz : vx;
    const Status s = ops.all_reduce(ReduceOp::kSum, in, vy).wait(60s);
    const float* out = y.data_as<float>();
    const float* kept = in[0].data_as<float>();
    const bool inputs_kept = std::all_of(kept, kept + count, [&](float v) { return v == rank + 1; }) &&
                             x.data_as<float>()[count - 1] == (rank == 1 ? 100.0f : rank + 1.0f);
    const bool right = std::all_of(out, out + count, [](float v) { return v == 6.0f; });
    write_note(dir, rank,
               s.to_string() + " direct=" + std::to_string(shm->registered_direct(rx->id())) +
                   std::to_string(shm->registered_direct(ry->id())) +
                   " right=" + std::to_string(right) + " inputs_kept=" + std::to_string(inputs_kept));
    return s.ok() && right && inputs_kept ? kChildOk : kChildFailed;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 3, kChildOk, {"direct=11"});
}

// A rank that released its input's registration before its peers did, then all-reduces out of
// place from that buffer: the peers name a registration it no longer maps, so it cannot read their
// inputs; every rank fails (that rank naming the rule) instead of reading unmapped memory.
TEST(SharedMemoryDirect, AnInputRegistrationReleasedOnOneRankIsAnErrorOnEveryRank) {
  const std::string dir = make_temp_dir("direct_released_input");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = int64_t{1} << 18;
    Buffer x = shareable_filled(count, 1.0f), y = shareable_filled(count, 0.0f);
    PerReplica<Tensor> vx{x.tensor()}, vy{y.tensor()};
    auto rx = ops.register_buffers(vx);
    auto ry = ops.register_buffers(vy);
    if (!rx.ok() || !ry.ok()) return kChildFailed;
    if (rank == 2) rx->release();
    const auto start = Clock::now();
    const Status s = ops.all_reduce(ReduceOp::kSum, vx, vy).wait(60s);
    return note_outcome(dir, rank, s, start);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    EXPECT_LT(seconds_in(read_note(dir, r)), 10.0) << read_note(dir, r);
  }
  const std::string note = read_note(dir, 2);
  EXPECT_NE(note.find("rank 0 reads its input from registration #1, which rank 2 does not hold"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("released at the same point on every rank"), std::string::npos) << note;
}

// Registration where one rank's buffer is ordinary memory: no rank takes the direct path (one
// that did alone would be a mismatch), and every result is right.
TEST(SharedMemoryDirect, OneRankWithOrdinaryMemoryKeepsEveryRankOnTheUsualPath) {
  const std::string dir = make_temp_dir("direct_mixed");
  GroupResult g = run_backend_group(3, dir, "ring:timeout=20s", [&](int rank, CrossDeviceOps& ops) {
    const int64_t count = (int64_t{1} << 20) + 3;
    auto x = rank == 1 ? Buffer::allocate(DType::kFloat32, Shape{count})
                       : Buffer::allocate_shareable(DType::kFloat32, Shape{count});
    if (!x.ok()) return kChildFailed;
    std::fill_n(x->data_as<float>(), count, static_cast<float>(rank + 1));
    PerReplica<Tensor> v{x->tensor()};
    auto reg = ops.register_buffers(v);
    if (!reg.ok()) return kChildFailed;
    const transports::shm::ShmGroup* shm = shm_group_of(ops);
    if (shm == nullptr) return kChildFailed;
    const Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(60s);
    const float* p = x->data_as<float>();
    write_note(dir, rank,
               s.to_string() + " direct=" + std::to_string(shm->registered_direct(reg->id())) +
                   " note=" + shm->describe_registration(reg->id()) +
                   " first=" + std::to_string(p[0]) + " last=" + std::to_string(p[count - 1]));
    return s.ok() && !shm->registered_direct(reg->id()) && p[0] == 6.0f && p[count - 1] == 6.0f
               ? kChildOk
               : kChildFailed;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  expect_every_rank(g, dir, 3, kChildOk,
                    {"the buffer of rank 1 is not from Buffer::allocate_shareable"});
}

// Root cause to every rank: the group meets through a real TcpStore (make_backend_context), rank
// `victim` is killed with SIGKILL in the middle of all-reduces, and every survivor's error must name
// the victim first, whichever connection broke for it (the victim's neighbours see the death, the
// others only a live peer giving up). Rank 0 hosts the store, so its death is named through the
// store going silent.
std::string with_timeout(const std::string& spec, const std::string& timeout) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + "timeout=" + timeout;
}

// A job of `world` processes meeting through rank 0's TcpStore (wills kept), all-reducing 256 KiB
// in a loop with `spec`, where rank `victim` raises `sig` (SIGKILL or SIGSTOP) at its sixth
// collective. A stopped victim is killed 15 s later by a helper it forked, after the survivors are
// done. Notes go to `dir`; a backend that is not built in makes every rank exit with kChildSkip.
GroupResult run_job_signalling_one(const std::string& spec, int world, int victim, int sig,
                                   const std::string& dir) {
  HeldStorePort store_port;
  return run_group(
      world, 90s,
      [&](int rank) {
        auto ctx = tcp_group_context(rank, world, 1, store_port.port(), store_port.take(rank));
        if (!ctx.ok()) {
          write_note(dir, rank, ctx.status().to_string());
          return kChildFailed;
        }
        auto ops = builtin_backends().create(spec, *ctx);
        if (!ops.ok() && ops.status().code() == StatusCode::kNotFound) return kChildSkip;
        if (!ops.ok()) {
          write_note(dir, rank, ops.status().to_string());
          return kChildFailed;
        }
        if (rank == victim && sig == SIGSTOP) {
          const pid_t self = getpid();
          if (fork() == 0) {
            std::this_thread::sleep_for(15s);
            kill(self, SIGKILL);
            _exit(0);
          }
        }
        const int result =
            all_reduce_until_error(**ops, dir, 100000, 1 << 16, rank == victim ? 5 : -1, sig);
        drop_and_note_mappings(*ops, dir, rank);
        return result;
      },
      [&] { store_port.release(); });
}

// Every rank but `victim` failed by itself within `within` seconds, its error leading with `named`
// and then saying what this rank saw.
void expect_survivors_name(const GroupResult& g, const std::string& dir, int victim,
                           const std::string& named, double within) {
  for (int r = 0; r < static_cast<int>(g.children.size()); ++r) {
    if (r == victim) continue;
    const std::string note = read_note(dir, r);
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
    EXPECT_EQ(note.find(named), note.find(':') + 2) << "rank " << r << ": " << note;
    EXPECT_NE(note.find("what rank " + std::to_string(r) + " saw: "), std::string::npos) << note;
    EXPECT_LT(seconds_in(note), within) << note;
  }
}

// "ring_net_kill2", "ucx_tcp_stop0": the backend of a (spec, victim) case and what befell the victim.
std::string signal_case_name(const std::tuple<std::string, int>& param, const std::string& what) {
  std::string name = std::get<0>(param);
  name = name.substr(0, name.find(':')) + (name.find("tls") != std::string::npos ? "_tcp" : "") +
         (name.find("intra_host") != std::string::npos ? "_net" : "");
  return name + "_" + what + std::to_string(std::get<1>(param));
}

class LostRank : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(LostRank, EverySurvivorNamesTheKilledRank) {
  const std::string spec = with_timeout(std::get<0>(GetParam()), "10s");
  const int victim = std::get<1>(GetParam());
  constexpr int kWorld = 4;
  const std::string dir = make_temp_dir("lost");
  const std::vector<std::string> before = dev_shm_entries();
  GroupResult g = run_job_signalling_one(spec, kWorld, victim, SIGKILL, dir);
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  if (g.children[static_cast<size_t>((victim + 1) % kWorld)].exit_code == kChildSkip) {
    GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  }
  EXPECT_EQ(g.children[static_cast<size_t>(victim)].signal, SIGKILL) << g.describe();
  expect_survivors_name(g, dir, victim,
                        victim == 0 ? "rank 0, which hosts the job's store, is unreachable"
                                    : "rank " + std::to_string(victim) + " (pid ",
                        10.0 + 5.0);
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    EXPECT_NE(read_note(dir, r).find("mapped_after=0"), std::string::npos) << read_note(dir, r);
  }
  EXPECT_EQ(segments_left(before, g), "");
}

INSTANTIATE_TEST_SUITE_P(
    Backends, LostRank,
    ::testing::Combine(::testing::Values("ring:intra_host=net", "ring", "gloo", "ucx:tls=tcp"),
                       ::testing::Values(2, 0)),
    [](const auto& info) { return signal_case_name(info.param, "kill"); });

// A rank that stops (SIGSTOP) in the middle of all-reduces stays alive and connected, so no will
// fires for it: the roll call names it. Every survivor's error must lead with the stopped rank,
// within the timeout and the roll call's grace. A stopped rank 0 also stops the job's store, and is
// named as the store host that does not answer.
class StoppedRank : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(StoppedRank, EverySurvivorNamesTheStoppedRank) {
  const std::string spec = with_timeout(std::get<0>(GetParam()), "4s");
  const int victim = std::get<1>(GetParam());
  constexpr int kWorld = 3;
  const std::string dir = make_temp_dir("stopped");
  GroupResult g = run_job_signalling_one(spec, kWorld, victim, SIGSTOP, dir);
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  if (g.children[static_cast<size_t>((victim + 1) % kWorld)].exit_code == kChildSkip) {
    GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  }
  expect_survivors_name(g, dir, victim,
                        "rank " + std::to_string(victim) + " did not fail with the others",
                        4.0 + 5.0);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, StoppedRank,
    ::testing::Combine(::testing::Values("ring:intra_host=net", "ring", "gloo", "ucx:tls=tcp"),
                       ::testing::Values(2, 0)),
    [](const auto& info) { return signal_case_name(info.param, "stop"); });

INSTANTIATE_TEST_SUITE_P(Ring, RingFaults,
                         ::testing::Values("ring:intra_host=net,algorithm=ring",
                                           "ring:intra_host=net,algorithm=ring,zero_copy=on",
                                           "ring:intra_host=net,algorithm=halving_doubling",
                                           "ring:intra_host=net,algorithm=ring,sockets_per_peer=2,"
                                           "zero_copy=on",
                                           "ring:intra_host=shm",
                                           "ring:intra_host=shm,shm_single_copy=on", "ucx:tls=sm",
                                           "ucx:tls=tcp"),
                         [](const auto& info) -> std::string {
                           if (info.param == "ucx:tls=sm") return "UcxSharedMemory";
                           if (info.param.find("single_copy") != std::string::npos) {
                             return "SharedMemorySingleCopy";
                           }
                           if (info.param == "ucx:tls=tcp") return "UcxTcp";
                           if (info.param.find("shm") != std::string::npos) return "SharedMemory";
                           if (info.param.find("sockets") != std::string::npos) return "TwoSockets";
                           if (info.param.find("zero_copy") != std::string::npos) {
                             return "RingZeroCopy";
                           }
                           return info.param.find("halving") != std::string::npos
                                      ? "HalvingDoubling"
                                      : "Ring";
                         });

// poll=always (Open MPI's way: a wait polls until it ends, never sleeping): the results are right,
// and a peer that stays connected but silent still ends in a deadline naming it, within the
// timeout. Two ranks, so that the polling rank has a core of its own.
class PollAlways : public ::testing::TestWithParam<std::string> {};

TEST_P(PollAlways, ResultsAreRightAndASilentPeerIsStillADeadline) {
  const std::string spec = GetParam() + ",poll=always,timeout=2s";
  if (!builtin_backends().find(spec.substr(0, spec.find(':')))) {
    GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  }
  const std::string dir = make_temp_dir("poll_always");
  GroupResult g = run_backend_group(2, dir, spec, [&](int rank, CrossDeviceOps& ops) {
    for (int call = 0; call < 20; ++call) {
      const int64_t count = call % 2 ? 4096 : (1 << 18) + 3;
      std::vector<float> x(static_cast<size_t>(count), static_cast<float>(rank + 1 + call));
      PerReplica<Tensor> v{Tensor(x.data(), DType::kFloat32, Shape{count})};
      const Status s = ops.all_reduce(ReduceOp::kSum, v, v).wait(30s);
      const float want = static_cast<float>(3 + 2 * call);
      if (!s.ok() || x.front() != want || x.back() != want) {
        write_note(dir, rank, "call " + std::to_string(call) + ": " + s.to_string() +
                                  ", got " + std::to_string(x.front()));
        return kChildFailed;
      }
    }
    if (rank == 1) {
      std::this_thread::sleep_for(5s);  // alive, connected, but never joins the next collective
      return kChildOk;
    }
    return all_reduce_until_error(ops, dir, 1, 1024);
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[1].exit_code, kChildOk) << g.describe() << read_note(dir, 1);
  ASSERT_EQ(g.children[0].exit_code, kChildSawError) << g.describe() << read_note(dir, 0);
  const std::string note = read_note(dir, 0);
  EXPECT_NE(note.find("deadline_exceeded"), std::string::npos) << note;
  EXPECT_NE(note.find("rank 1"), std::string::npos) << note;
  EXPECT_LT(seconds_in(note), 2.0 + 3.0) << note;
  EXPECT_NE(note.find("again=failed_precondition"), std::string::npos) << note;
}

INSTANTIATE_TEST_SUITE_P(Transports, PollAlways,
                         ::testing::Values("ring:intra_host=net", "ring:intra_host=shm",
                                           "ucx:tls=tcp"),
                         [](const auto& info) -> std::string {
                           if (info.param == "ucx:tls=tcp") return "UcxTcp";
                           return info.param.find("shm") != std::string::npos ? "SharedMemory"
                                                                              : "Tcp";
                         });

// ---- abort() from another thread ----------------------------------------------------------------
// CrossDeviceOps::abort is thread-safe, as ncclCommAbort is (a watchdog's tool). In flight:
// rank 0's all-reduce waits for rank 1, which has not issued it, and another thread of rank 0
// aborts the instance 300 ms in; the all-reduce returns with the abort's reason long before the 60 s timeout,
// and rank 1, which issues all-reduces once rank 0's has returned, fails at once, naming rank 0
// and the reason. Idle: the other thread aborts while rank 0 issues nothing and rank 1 waits in
// its all-reduce; rank 1 fails at once, alike.
class AbortFromAnotherThread : public RingFaults {};

// Waits (at most 60 s) until `rank`'s note exists.
void wait_for_note(const std::string& dir, int rank) {
  const auto until = Clock::now() + 60s;
  while (read_note(dir, rank).empty() && Clock::now() < until) std::this_thread::sleep_for(10ms);
}

TEST_P(AbortFromAnotherThread, EndsTheCollectiveInFlightAndTellsThePeers) {
  const std::string spec = with_timeout(GetParam(), "60s");
  for (const bool in_flight : {true, false}) {
    SCOPED_TRACE(in_flight ? "abort while rank 0 waits in an all-reduce" : "abort while idle");
    const std::string dir = make_temp_dir("abort_thread");
    GroupResult g = run_group(2, 120s, [&](int rank) {
      auto ctx = group_context(rank, 2, 1, dir);
      auto ops = builtin_backends().create(spec, *ctx);
      if (!ops.ok()) {
        write_note(dir, rank, "setup failed: " + ops.status().to_string());
        return kChildFailed;
      }
      CrossDeviceOps& o = **ops;
      std::vector<float> v(size_t{1} << 16, 1.0f);
      PerReplica<Tensor> x{Tensor(v.data(), DType::kFloat32, int64_t{1} << 16)};
      // The group works before the abort.
      if (!o.all_reduce(ReduceOp::kSum, x, x).wait(60s).ok()) return kChildFailed;
      if (rank == 1 && in_flight) wait_for_note(dir, 0);  // rank 0's all-reduce has returned
      std::thread watchdog;
      if (rank == 0) {
        watchdog = std::thread([&] {
          std::this_thread::sleep_for(300ms);
          o.abort(aborted("the watchdog gave up on this step"));
        });
      }
      int result = kChildOk;
      if (rank == 0 && in_flight) {
        const auto start = Clock::now();
        result = note_outcome(dir, 0, o.all_reduce(ReduceOp::kSum, x, x).wait(60s), start);
      } else if (rank == 1) {
        // What rank 0 sent before the abort may complete rank 1's first all-reduce (rightly: it
        // is rank 0's input); the next one cannot.
        Status s;
        const auto start = Clock::now();
        for (int i = 0; i < 3 && s.ok(); ++i) s = o.all_reduce(ReduceOp::kSum, x, x).wait(60s);
        result = note_outcome(dir, 1, s, start);
      }
      if (watchdog.joinable()) watchdog.join();
      if (rank == 0) {
        if (!in_flight) write_note(dir, 0, "idle: " + o.broken().to_string());
        wait_for_note(dir, 1);  // the store's files and the reason stay until rank 1 has read them
      }
      return result;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    const std::string note0 = read_note(dir, 0), note1 = read_note(dir, 1);
    if (in_flight) {
      EXPECT_EQ(g.children[0].exit_code, kChildSawError) << g.describe();
      EXPECT_NE(note0.find("the watchdog gave up on this step"), std::string::npos) << note0;
      EXPECT_LT(seconds_in(note0), 20.0) << note0;  // the timeout is 60 s
    } else {
      EXPECT_EQ(g.children[0].exit_code, kChildOk) << g.describe();
      EXPECT_NE(note0.find("idle: aborted: the watchdog gave up on this step"), std::string::npos)
          << note0;
    }
    EXPECT_EQ(g.children[1].exit_code, kChildSawError) << g.describe();
    EXPECT_NE(note1.find("rank 0"), std::string::npos) << note1;
    EXPECT_NE(note1.find("the watchdog gave up on this step"), std::string::npos) << note1;
    EXPECT_LT(seconds_in(note1), 20.0) << note1;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AbortFromAnotherThread,
                         ::testing::Values("ring:intra_host=net", "ring:intra_host=shm",
                                           "ucx:tls=tcp", "ucx:tls=sm", "gloo", "gloo:mode=sync"),
                         [](const auto& info) -> std::string {
                           const std::string& p = info.param;
                           if (p == "ucx:tls=tcp") return "UcxTcp";
                           if (p == "ucx:tls=sm") return "UcxSharedMemory";
                           if (p == "gloo") return "Gloo";
                           if (p == "gloo:mode=sync") return "GlooSync";
                           return p.find("shm") != std::string::npos ? "SharedMemory" : "Tcp";
                         });

// The connected TCP sockets of this process, lowest descriptor first (with a FileStore, the ring's
// connections are the only ones: to each peer in socket order).
std::vector<int> connected_sockets() {
  std::vector<int> fds;
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) fds.push_back(fd);
  }
  return fds;
}

// With several sockets per peer, trouble on a socket that only carries stripes (garbage, or the
// peer closing just that one while it stays alive) fails the collective at once, naming the peer
// and the socket, and never lands in the posted buffer as data.
TEST(RingSockets, TroubleOnAStripeSocketFailsTheRankNamingIt) {
  for (bool garbage : {true, false}) {
    const std::string dir = make_temp_dir("stripes");
    GroupResult g = run_group(2, 60s, [&](int rank) {
      auto ctx = group_context(rank, 2, 1, dir);
      auto ops =
          builtin_backends().create("ring:intra_host=net,sockets_per_peer=2,timeout=10s", *ctx);
      if (!ops.ok()) {
        write_note(dir, rank, ops.status().to_string());
        return kChildFailed;
      }
      if (rank == 1) {
        std::vector<int> fds = connected_sockets();
        if (fds.size() != 2) return kChildFailed;
        if (garbage) {
          const std::string junk(4096, 'x');
          (void)!write(fds[1], junk.data(), junk.size());
        } else {
          shutdown(fds[1], SHUT_RDWR);
        }
        std::this_thread::sleep_for(5s);  // alive, but never joins the collective
        return kChildOk;
      }
      return all_reduce_until_error(**ops, dir, 1, 1 << 18);  // 1 MiB: striped
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    EXPECT_EQ(g.children[0].exit_code, kChildSawError) << g.describe() << read_note(dir, 0);
    const std::string note = read_note(dir, 0);
    EXPECT_NE(note.find("rank 1 (socket 1 of 2)"), std::string::npos) << note;
    if (garbage) {
      EXPECT_NE(note.find("not a tributary frame"), std::string::npos) << note;
    } else {  // the receive or the send on that socket notices first
      EXPECT_TRUE(note.find("closed the connection") != std::string::npos ||
                  note.find("failed: Broken pipe") != std::string::npos ||
                  note.find("failed: Connection reset") != std::string::npos)
          << note;
    }
    EXPECT_LT(seconds_in(note), 5.0) << note;
  }
}

// Secrets: a process without the right secret cannot join; with the same secret everyone does.
TEST(RingSecurity, SecretsMustMatch) {
  struct Case {
    const char* name;
    const char* secret0;
    const char* secret1;
    bool joins;
  };
  for (const std::string path : {"net", "shm", "ucx"})
    for (Case c :
         {Case{"same", "s3cret", "s3cret", true}, Case{"different", "s3cret", "other", false},
          Case{"missing", "s3cret", "", false}}) {
      SCOPED_TRACE("intra_host=" + path);
      const std::string dir = make_temp_dir("secret");
      GroupResult g = run_group(2, 60s, [&](int rank) {
        const char* secret = rank == 0 ? c.secret0 : c.secret1;
        Config config;
        if (*secret) config = Config::from_map({{"TRIBUTARY_SECRET", secret}});
        auto ctx = group_context(rank, 2, 1, dir, config);
        auto ops = builtin_backends().create(
            path == "ucx" ? "ucx:timeout=3s" : "ring:timeout=3s,intra_host=" + path, *ctx);
        if (!ops.ok() && ops.status().code() == StatusCode::kNotFound) return kChildSkip;
        write_note(dir, rank, ops.ok() ? "ok" : ops.status().to_string());
        return ops.ok() ? kChildOk : kChildSawError;
      });
      ASSERT_FALSE(g.watchdog_fired) << c.name << ": " << g.describe();
      if (path == "ucx" && g.children[0].exit_code == kChildSkip) {
        GTEST_SKIP() << "backend 'ucx' is not built into this tributary (the last case)";
      }
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, c.joins ? kChildOk : kChildSawError)
            << c.name << " rank " << r << ": " << read_note(dir, r);
      }
      if (!c.joins && path == "net") {
        EXPECT_NE(read_note(dir, 1).find("authentication failed"), std::string::npos)
            << read_note(dir, 1);
        EXPECT_NE(read_note(dir, 0).find("rejected"), std::string::npos) << read_note(dir, 0);
      }
      if (!c.joins && path == "shm") {  // a digest of the secret is compared: both ranks refuse
        for (int r = 0; r < 2; ++r) {
          EXPECT_NE(read_note(dir, r).find("same secret"), std::string::npos) << read_note(dir, r);
        }
      }
      if (!c.joins && path == "ucx") {  // each checks the other's proof: both ranks refuse
        for (int r = 0; r < 2; ++r) {
          EXPECT_NE(read_note(dir, r).find("authentication failed"), std::string::npos)
              << read_note(dir, r);
        }
      }
    }
}

// Ranks laid out differently (local replica counts, ring options) refuse each other at setup: MEAN
// would otherwise divide by different counts on different ranks.
TEST(RingSetup, DifferentLayoutsAreRefusedNamingThem) {
  // What rank 1 does differently: nothing (rank 0 has two local replicas), or an option.
  for (const std::string path : {"net", "shm", "ucx"})
    for (std::string option : {"", ",segment_bytes=64KiB", ",sockets_per_peer=2"}) {
      if (path == "ucx" && option.find("sockets") != std::string::npos) continue;
      SCOPED_TRACE("intra_host=" + path + option);
      const std::string dir = make_temp_dir("layout");
      GroupResult g = run_group(2, 60s, [&](int rank) {
        const int local = option.empty() && rank == 0 ? 2 : 1;
        auto ctx = group_context(rank, 2, local, dir);
        auto ops = builtin_backends().create(
            (path == "ucx" ? "ucx:timeout=5s" : "ring:timeout=5s,intra_host=" + path) +
                (rank == 1 ? option : ""),
            *ctx);
        if (!ops.ok() && ops.status().code() == StatusCode::kNotFound) return kChildSkip;
        write_note(dir, rank, ops.ok() ? "ok" : ops.status().to_string());
        return ops.ok() ? kChildOk : kChildSawError;
      });
      ASSERT_FALSE(g.watchdog_fired) << g.describe();
      if (path == "ucx" && g.children[0].exit_code == kChildSkip) {
        GTEST_SKIP() << "backend 'ucx' is not built into this tributary (the last case)";
      }
      for (int r = 0; r < 2; ++r) {
        const std::string note = read_note(dir, r);
        EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError) << g.describe();
        EXPECT_NE(note.find("is set up differently"), std::string::npos) << note;
        if (option.find("sockets") != std::string::npos) {  // both values, on both sides
          // TCP says both settings; shared memory, which has both layouts, the entry that differs.
          const bool tcp_says = note.find("sockets_per_peer=1") != std::string::npos &&
                                note.find("sockets_per_peer=2") != std::string::npos;
          const bool shm_says =
              note.find(r == 0 ? "sockets_per_peer: '1' here, '2' at rank 1"
                               : "sockets_per_peer: '2' here, '1' at rank 0") != std::string::npos;
          EXPECT_TRUE(tcp_says || shm_says) << note;
        }
        if (path == "shm" && !option.empty()) {  // the entry that differs, not both layouts
          EXPECT_NE(note.find(option.substr(1, option.find('=') - 1) + ": '"), std::string::npos)
              << note;
        }
      }
    }
}

// Says in the store, for ranks 1 .. world-1, where they run, as they will say it themselves: rank 0
// publishes its address only once every rank has, so an outsider that must act before some ranks
// join speaks for them.
void speak_for_ranks(Store& store, int world) {
  for (int r = 1; r < world; ++r) {
    (void)store.set("setup/0/" + std::to_string(r), "=ring");  // BackendRegistry::create's meeting
    (void)store.set("ring/0/host/" + std::to_string(r),
                    algorithms::host_entry(Config(), "intra_host=net,hierarchy=auto"));
  }
}

// An outsider with access to the store: speaks for ranks 1.., waits for rank 0's address, and opens
// `connections` to it, each sent `bytes`. Returns the sockets, still open; -1 entries failed.
std::vector<int> connect_to_rank0(const std::string& dir, int world, int connections,
                                  const std::string& bytes) {
  auto store = FileStore::open(dir);
  speak_for_ranks(**store, world);
  std::vector<int> fds;
  auto addr = (*store)->get("ring/0/addr/0", 20s);
  if (!addr.ok()) return fds;
  const std::string host = addr->substr(0, addr->rfind(':'));
  const int port = std::stoi(addr->substr(addr->rfind(':') + 1));
  for (int i = 0; i < connections; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      (void)!write(fd, bytes.data(), bytes.size());
      fds.push_back(fd);
    } else {
      close(fd);
      fds.push_back(-1);
    }
  }
  (void)(*store)->set("outsider/done", "1");
  return fds;
}

// Ranks 1.. of a ring group wait for the outsider before they join (rank 0 is already listening).
bool wait_for_outsider(const std::string& dir) {
  auto store = FileStore::open(dir);
  return (*store)->get("outsider/done", 30s).ok();
}

// Three ranks and an outsider (process 3) that connects to rank 0 first and sends `junk`, then
// closes (`hold` = 0) or keeps the connections open for `hold`. The group, configured with
// `config`, must form and compute.
GroupResult ring_with_outsider(const std::string& dir, const std::string& junk, int connections,
                               std::chrono::seconds hold, const std::string& spec,
                               const Config& config = Config()) {
  return run_group(4, 60s, [&](int p) {
    if (p == 3) {
      std::vector<int> fds = connect_to_rank0(dir, 3, connections, junk);
      if (fds.empty()) return kChildFailed;
      std::this_thread::sleep_for(hold);
      for (int fd : fds) {
        if (fd >= 0) close(fd);
      }
      return std::count(fds.begin(), fds.end(), -1) == 0 ? kChildOk : kChildFailed;
    }
    if (p > 0 && !wait_for_outsider(dir)) return kChildFailed;
    auto ctx = group_context(p, 3, 1, dir, config);
    auto ops = builtin_backends().create(spec, *ctx);
    if (!ops.ok()) {
      write_note(dir, p, ops.status().to_string());
      return kChildFailed;
    }
    float x = static_cast<float>(p + 1);
    PerReplica<Tensor> v{Tensor(&x, DType::kFloat32, int64_t{1})};
    Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(30s);
    write_note(dir, p, s.ok() ? std::to_string(x) : s.to_string());
    return s.ok() && x == 6.0f ? kChildOk : kChildFailed;
  });
}

TEST(RingSecurity, GarbageAndTruncatedHandshakesAreDroppedAndTheGroupForms) {
  for (std::string junk : {std::string("GET / HTTP/1.1\r\n\r\n") + std::string(200, 'x'),
                           std::string("TRBH", 4), std::string()}) {
    const std::string dir = make_temp_dir("garbage");
    GroupResult g = ring_with_outsider(dir, junk, 1, 0s, "ring:intra_host=net,timeout=20s");
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    for (const ChildResult& c : g.children)
      EXPECT_EQ(c.exit_code, kChildOk) << g.describe() << read_note(dir, 0);
  }
}

// A stranger without the secret that sends a well-formed hello (this job's cluster, a free rank)
// claiming another layout or socket count, then a proof it cannot make, is dropped like any other:
// a difference of setup ends the setup only once the peer has proved the secret. (Found by
// fuzz_ring_handshake: rank 0 used to end its setup on the claim, before reading the proof.)
TEST(RingSecurity, UnprovenHelloClaimingAnotherSetupCannotEndIt) {
  for (const bool other_sockets : {false, true}) {
    SCOPED_TRACE(other_sockets ? "another socket count" : "another layout");
    const std::string dir = make_temp_dir("unproven");
    transports::wire::Hello hello;
    hello.cluster = internal::digest64(dir);  // the harness's cluster id is the store's path
    hello.layout = other_sockets ? 0 : 42;
    hello.world = 3;
    hello.rank = 2;
    hello.sockets = other_sockets ? 2 : 1;
    const transports::wire::Auth proof;  // all zeros: it cannot compute the real one
    std::string bytes(reinterpret_cast<const char*>(&hello), sizeof hello);
    bytes.append(reinterpret_cast<const char*>(&proof), sizeof proof);
    GroupResult g = ring_with_outsider(dir, bytes, 1, 1s, "ring:intra_host=net,timeout=20s",
                                       Config::from_map({{"TRIBUTARY_SECRET", "s3cret"}}));
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(g.children[static_cast<size_t>(p)].exit_code, kChildOk)
          << "process " << p << ": " << read_note(dir, p) << "; " << g.describe();
    }
  }
}

// Silent connections cost no one anything: handshakes run concurrently, each under its own
// deadline, so three that never say a word do not hold up a setup whose whole timeout is shorter
// than one handshake's deadline (they used to be served one at a time, 10 s each).
TEST(RingSecurity, SilentConnectionsDoNotDelaySetup) {
  const std::string dir = make_temp_dir("silent");
  const auto start = Clock::now();
  GroupResult g = ring_with_outsider(dir, "", 3, 12s, "ring:intra_host=net,timeout=6s");
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(g.children[static_cast<size_t>(p)].exit_code, kChildOk)
        << "process " << p << ": " << read_note(dir, p) << "; " << g.describe();
  }
  EXPECT_GE(Clock::now() - start, 12s);  // the outsider held its connections through setup
}

// A man in the middle: takes rank 0's place in the store, passes the handshake through untouched
// (it cannot forge it without the secret) and then flips one byte of the first data frame's
// payload from rank 1 to rank 0. Returns when either side closes or after `limit`.
void tampering_relay(const std::string& dir, std::chrono::seconds limit) {
  auto store = FileStore::open(dir);
  speak_for_ranks(**store, 2);  // rank 1 joins only once the relay is in place
  auto addr = (*store)->get("ring/0/addr/0", 20s);
  if (!addr.ok()) return;
  const std::string host = addr->substr(0, addr->rfind(':'));
  sockaddr_in real{};
  real.sin_family = AF_INET;
  real.sin_port = htons(static_cast<uint16_t>(std::stoi(addr->substr(addr->rfind(':') + 1))));
  inet_pton(AF_INET, host.c_str(), &real.sin_addr);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in mine{};
  mine.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &mine.sin_addr);
  socklen_t len = sizeof mine;
  if (bind(lfd, reinterpret_cast<sockaddr*>(&mine), sizeof mine) != 0 || listen(lfd, 4) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&mine), &len) != 0) {
    return;
  }
  (void)(*store)->set("ring/0/addr/0", host + ":" + std::to_string(ntohs(mine.sin_port)));
  (void)(*store)->set("relay/ready", "1");
  pollfd accept_wait{lfd, POLLIN, 0};
  if (poll(&accept_wait, 1, static_cast<int>(limit.count() * 1000)) != 1) return;
  const int client = accept(lfd, nullptr, nullptr);
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0 || connect(server, reinterpret_cast<sockaddr*>(&real), sizeof real) != 0) return;
  // The client's handshake (hello, proof), then a frame header: the next byte is payload.
  const size_t target = sizeof(transports::wire::Hello) + sizeof(transports::wire::Auth) +
                        sizeof(transports::wire::FrameHeader);
  size_t upstream = 0;
  const auto until = Clock::now() + limit;
  char buf[65536];
  while (Clock::now() < until) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) return;
      if (i == 0) {
        if (upstream <= target && target < upstream + static_cast<size_t>(n)) {
          buf[target - upstream] ^= 0x40;
        }
        upstream += static_cast<size_t>(n);
      }
      if (write(fds[1 - i].fd, buf, static_cast<size_t>(n)) != n) return;
    }
  }
}

// With a secret, a relay that rewrites data frames is caught on the frame it changed: the rank that
// received it fails saying why, no rank gets a wrong result, and the job stops (a rank that got
// only intact data may finish that collective, but not the next). Without frame authentication (the
// control), the same relay silently changes the result, which is what the MAC is for.
TEST(RingSecurity, TamperedFramesAreRejectedNotReduced) {
  for (const bool authenticate : {true, false}) {
    SCOPED_TRACE(authenticate ? "authenticate_frames=true" : "authenticate_frames=false");
    const std::string dir = make_temp_dir("relay");
    GroupResult g = run_group(3, 90s, [&](int rank) {
      if (rank == 2) {
        tampering_relay(dir, 30s);
        return kChildOk;
      }
      if (rank == 1) {  // only once the relay has taken rank 0's place
        auto store = FileStore::open(dir);
        if (!(*store)->get("relay/ready", 20s).ok()) return kChildFailed;
      }
      auto ctx = group_context(rank, 2, 1, dir, Config::from_map({{"TRIBUTARY_SECRET", "s3cret"}}));
      auto ops = builtin_backends().create(
          std::string("ring:intra_host=net,timeout=20s,authenticate_frames=") +
              (authenticate ? "true" : "false"),
          *ctx);
      if (!ops.ok()) {
        write_note(dir, rank, "setup: " + ops.status().to_string());
        return kChildFailed;
      }
      std::vector<float> x(1024, static_cast<float>(rank + 1));
      PerReplica<Tensor> v{Tensor(x.data(), DType::kFloat32, int64_t{1024})};
      Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(30s);
      if (!s.ok()) {
        write_note(dir, rank, s.to_string());
        return kChildSawError;
      }
      const bool right = std::all_of(x.begin(), x.end(), [](float f) { return f == 3.0f; });
      if (!right) {
        write_note(dir, rank, "wrong");
        return kChildFailed;
      }
      // A rank whose own data arrived intact may finish the collective with the right result; the
      // job must still stop at the next one.
      s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(30s);
      write_note(dir, rank, "right, then " + s.to_string());
      return s.ok() ? kChildOk : kChildSawError;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    if (authenticate) {
      expect_every_rank(g, dir, 2, kChildSawError, {});
      EXPECT_NE(read_note(dir, 0).find("failed authentication"), std::string::npos)
          << read_note(dir, 0);
    } else {
      EXPECT_EQ(read_note(dir, 0), "wrong") << "the relay did not change the data: " << g.describe();
    }
  }
}

// The rendezvous store (a real TcpStore started by rank 0) serves only processes with the job's
// secret: a rank with another secret or none is refused at once, saying so, and the chief's
// backend then fails within its timeout naming the rank that never came.
TEST(RendezvousSecurity, TheStoreRefusesRanksWithoutTheSecret) {
  for (const char* other : {"wrong", ""}) {
    SCOPED_TRACE(std::string("rank 1's secret: '") + other + "'");
    const std::string dir = make_temp_dir("store_secret");
    HeldStorePort store_port;
    GroupResult g = run_group(
        2, 60s,
        [&](int rank) {
          std::map<std::string, std::string> env = store_port.take(rank);
          env["TRIBUTARY_RANK"] = std::to_string(rank);
          env["TRIBUTARY_WORLD_SIZE"] = "2";
          env["TRIBUTARY_MASTER_ADDR"] = "127.0.0.1";
          env["TRIBUTARY_MASTER_PORT"] = std::to_string(store_port.port());
          const std::string secret = rank == 0 ? "right" : other;
          if (!secret.empty()) env["TRIBUTARY_SECRET"] = secret;
          auto ctx = make_backend_context({Device::cpu(0)}, Config::from_map(env), 5s);
          if (!ctx.ok()) {
            write_note(dir, rank, ctx.status().to_string());
            return kChildSawError;
          }
          auto ops = builtin_backends().create("ring:timeout=3s", *ctx);
          write_note(dir, rank, ops.ok() ? "ok" : ops.status().to_string());
          return ops.ok() ? kChildOk : kChildSawError;
        },
        [&] { store_port.release(); });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    expect_every_rank(g, dir, 2, kChildSawError, {});
    const std::string refused = read_note(dir, 1);
    EXPECT_NE(refused.find(*other ? "authentication failed" : "requires the job's shared secret"),
              std::string::npos)
        << refused;
    // Rank 0 waits out its timeout (a stranger without the secret must not be able to end the
    // job), then says that the store refused a connection for the secret, and why.
    const std::string waited = read_note(dir, 0);
    EXPECT_NE(waited.find("rank 1"), std::string::npos) << waited;
    EXPECT_NE(waited.find("the job's store refused connections for the secret (127.0.0.1:"),
              std::string::npos)
        << waited;
    EXPECT_NE(waited.find(*other ? ": said hello, never proved the secret" : ": no secret)"),
              std::string::npos)
        << waited;
  }
}

TEST(Rendezvous, UnreachableStoreIsAnErrorNamingTheAddress) {
  const ReservedPort reserved;  // nobody listens on it
  const int port = reserved.port();
  ASSERT_NE(port, 0);
  Config config = Config::from_map({{"TRIBUTARY_RANK", "1"},
                                    {"TRIBUTARY_WORLD_SIZE", "2"},
                                    {"TRIBUTARY_MASTER_ADDR", "127.0.0.1"},
                                    {"TRIBUTARY_MASTER_PORT", std::to_string(port)}});
  const auto start = Clock::now();
  auto ctx = make_backend_context({Device::cpu(0)}, config, std::chrono::milliseconds(1500));
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kUnavailable) << ctx.status().to_string();
  EXPECT_NE(ctx.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << ctx.status().message();
  EXPECT_LT(took, 1.5 + 3.0);
}

// Observability across processes: rank 2 is 3 s late for all_reduce #2, then leaves before #3. The
// stall report of rank 0 names it; every survivor's first failure dumps its flight recorder; every
// rank writes its own timeline.
TEST(Observability, StallReportNamesTheLateRankAndFailuresDumpTheRecorder) {
  const std::string dir = make_temp_dir("observe");
  GroupResult g = run_group(3, 60s, [&](int rank) {
    if (std::freopen((dir + "/err" + std::to_string(rank)).c_str(), "w", stderr) == nullptr) {
      return kChildFailed;
    }
    Config config = Config::from_map({{"TRIBUTARY_STALL_CHECK_TIME", "1s"},
                                      {"TRIBUTARY_FLIGHT_RECORDER_FILE", dir + "/fr-{rank}.json"},
                                      {"TRIBUTARY_TIMELINE", dir + "/timeline.json"}});
    auto ctx = group_context(rank, 3, 1, dir, config);
    if (!ctx.ok()) return kChildFailed;
    auto ops = builtin_backends().create("ring:timeout=10s", *ctx);
    if (!ops.ok()) return kChildFailed;
    std::vector<float> a(1024, 1.0f);
    PerReplica<Tensor> v;
    v.values().emplace_back(a.data(), DType::kFloat32, 1024, Device::cpu(0));
    for (int i = 0; i < 3; ++i) {
      if (rank == 2 && i == 1) std::this_thread::sleep_for(3s);
      if (rank == 2 && i == 2) return kChildOk;  // never issues #3
      Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(30s);
      if (!s.ok()) {
        write_note(dir, rank, s.to_string());
        return i == 2 ? kChildSawError : kChildFailed;
      }
    }
    return kChildOk;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[2].exit_code, kChildOk) << g.describe();
  std::string logs[3];
  for (int r = 0; r < 3; ++r) logs[r] = read_file(dir + "/err" + std::to_string(r));
  EXPECT_NE(logs[0].find("all_reduce #2"), std::string::npos) << logs[0];
  EXPECT_NE(logs[0].find("rank 2 (last issued #1) had not issued it"), std::string::npos)
      << logs[0];
  EXPECT_NE(logs[1].find("Rank 0's stall report names the ranks"), std::string::npos) << logs[1];
  for (int r : {0, 1}) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildSawError)
        << g.describe() << "\n" << logs[r];
    EXPECT_NE(logs[r].find("flight recorder (the first failed collective of this instance)"),
              std::string::npos)
        << logs[r];
    const std::string dump = read_file(dir + "/fr-" + std::to_string(r) + ".json");
    EXPECT_NE(dump.find("\"last_issued\": 3"), std::string::npos) << dump;
    EXPECT_NE(dump.find("\"state\": \"failed\""), std::string::npos) << dump;
    EXPECT_NE(dump.find("\"backend\": \"ring\""), std::string::npos) << dump;
  }
  for (int r = 0; r < 3; ++r) {
    const std::string timeline = read_file(dir + "/timeline.json." + std::to_string(r));
    size_t events = 0;
    for (size_t pos = timeline.find("\"ph\":\"X\""); pos != std::string::npos;
         pos = timeline.find("\"ph\":\"X\"", pos + 1)) {
      ++events;
    }
    EXPECT_EQ(events, r == 2 ? 2u : 3u) << timeline;
    EXPECT_NE(timeline.find("\"pid\":" + std::to_string(r)), std::string::npos) << timeline;
  }
}

}  // namespace
}  // namespace tributary::testing
