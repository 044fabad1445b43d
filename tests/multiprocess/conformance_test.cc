// The multi-process backends join the conformance suite as real processes on loopback: world sizes
// 1 to 5 with 1 and 2 local replicas each, every collective x op x dtype x size x in-place, results
// checked exactly against small-integer inputs of each global replica.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithms/process_group_ops.h"
#include "tests/conformance/values.h"
#include "tests/multiprocess/harness.h"

namespace tributary::testing {
namespace {

using conformance::exact_value;
using conformance::expected_at;

struct Buffers {
  std::vector<Buffer> owned;
  PerReplica<Tensor> views;
  Buffers(DType t, int64_t count, const std::vector<Device>& devices) {
    for (const Device& d : devices) {
      auto b = Buffer::allocate(t, Shape{count}, d);
      views.values().push_back(b->tensor());
      owned.push_back(std::move(b).value());
    }
  }
};

// Element counts per rank: empty, one, odd, not divisible by any world size, several segments.
std::vector<int64_t> counts_for(const std::string& spec) {
  // Several sockets per peer: fewer sizes (the others take the one-socket path, which the plain
  // specs cover), and a larger one, so that every world size has messages past the striping
  // threshold (64 KiB) next to small ones on the same sockets.
  if (spec.find("sockets_per_peer") != std::string::npos) return {0, 7, 131075};
  return {0, 1, 7, 1001, 65537};
}

class Matrix {
 public:
  Matrix(CrossDeviceOps& ops, std::vector<int64_t> counts)
      : ops_(ops), counts_(std::move(counts)) {}
  int failures() const { return failures_; }

  void run() {
    for (ReduceOp op : all_reduce_ops()) {
      for (DType t : all_dtypes()) {
        for (int64_t count : counts_) {
          for (bool in_place : {false, true}) {
            all_reduce(op, t, count, in_place);
            reduce(op, t, count, in_place);
            reduce_scatter(op, t, count, in_place);
          }
          batch_reduce(op, t, count);
        }
      }
    }
    for (DType t : all_dtypes()) {
      for (int64_t count : counts_) {
        for (bool in_place : {false, true}) {
          broadcast(t, count, in_place);
          all_gather(t, count, in_place);
        }
      }
    }
  }

 private:
  int global(size_t k) const {
    return ops_.rank() * ops_.num_local_replicas() + static_cast<int>(k);
  }
  bool supported(Collective c, ReduceOp op, DType t) const {
    const Capabilities& caps = ops_.capabilities();
    return caps.supports(c) && caps.supports(t) &&
           (c == Collective::kBroadcast || c == Collective::kAllGather || caps.supports(op));
  }
  // An unsupported combination must be refused; false then (nothing more to check).
  bool run_or_refused(const char* what, Collective c, ReduceOp op, DType t, Work w) {
    Status s = w.wait(std::chrono::seconds(60));
    if (!supported(c, op, t)) {
      if (s.code() != StatusCode::kUnimplemented) fail(what, "should be refused: " + s.to_string());
      return false;
    }
    if (!s.ok()) {
      fail(what, s.to_string());
      return false;
    }
    return true;
  }
  void fail(const std::string& what, const std::string& why) {
    if (failures_++ < 8) {
      std::fprintf(stderr, "[rank %d] %s (%s): %s\n", ops_.rank(), what.c_str(),
                   ops_.spec().c_str(), why.c_str());
    }
  }
  void check(const std::string& what, const Tensor& t, int64_t i, double want) {
    double got = dtype_load(t.dtype(), t.data(), i);
    if (got != want)
      fail(what, "element " + std::to_string(i) + " is " + std::to_string(got) + ", want " +
                     std::to_string(want));
  }
  static std::string name(const char* c, ReduceOp op, DType t, int64_t n, bool in_place) {
    return std::string(c) + " " + std::string(reduce_op_name(op)) + " " +
           std::string(dtype_name(t)) + " n=" + std::to_string(n) + (in_place ? " in place" : "");
  }

  void all_reduce(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("all_reduce", op, t, count, in_place);
    Buffers in(t, count, ops_.devices()), out(t, count, ops_.devices());
    for (size_t k = 0; k < in.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, in.views[k].data(), i, exact_value(op, global(k), i));
    }
    const PerReplica<Tensor>& dst = in_place ? in.views : out.views;
    if (!run_or_refused(what.c_str(), Collective::kAllReduce, op, t,
                        ops_.all_reduce(op, in.views, dst)))
      return;
    const int n = ops_.num_replicas_in_sync();
    for (int64_t i = 0; i < count; ++i) {
      const double want = expected_at(op, t, n, i);
      for (const Tensor& d : dst) check(what, d, i, want);
    }
  }

  void reduce(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("reduce", op, t, count, in_place);
    Buffers in(t, count, ops_.devices()), out(t, count, ops_.devices());
    for (size_t k = 0; k < in.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, in.views[k].data(), i, exact_value(op, global(k), i));
    }
    Mirrored<Tensor> dst =
        in_place ? Mirrored<Tensor>{in.views[0]} : Mirrored<Tensor>(out.views.values());
    if (!run_or_refused(what.c_str(), Collective::kReduce, op, t, ops_.reduce(op, in.views, dst)))
      return;
    const int n = ops_.num_replicas_in_sync();
    for (int64_t i = 0; i < count; ++i) {
      const double want = expected_at(op, t, n, i);
      for (const Tensor& d : dst) check(what, d, i, want);
    }
  }

  void reduce_scatter(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("reduce_scatter", op, t, count, in_place);
    const int n = ops_.num_replicas_in_sync();
    Buffers in(t, count * n, ops_.devices()), out(t, count, ops_.devices());
    PerReplica<Tensor> dst = out.views;
    for (size_t k = 0; k < in.views.size(); ++k) {
      for (int64_t i = 0; i < count * n; ++i)
        dtype_store(t, in.views[k].data(), i, exact_value(op, global(k), i));
      if (in_place) dst[k] = in.views[k].slice(global(k) * count, count);
    }
    if (!run_or_refused(what.c_str(), Collective::kReduceScatter, op, t,
                        ops_.reduce_scatter(op, in.views, dst)))
      return;
    for (size_t k = 0; k < dst.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        check(what, dst[k], i, expected_at(op, t, n, global(k) * count + i));
    }
  }

  void batch_reduce(ReduceOp op, DType t, int64_t count) {
    const std::string what = name("batch_reduce", op, t, count, false);
    Buffers a(t, count, ops_.devices()), b(t, 5, ops_.devices());
    for (size_t k = 0; k < a.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, a.views[k].data(), i, exact_value(op, global(k), i));
      for (int64_t i = 0; i < 5; ++i)
        dtype_store(t, b.views[k].data(), i, exact_value(op, global(k), i + 3));
    }
    std::vector<ReducePair> pairs = {{a.views, Mirrored<Tensor>(a.views.values())},
                                     {b.views, Mirrored<Tensor>(b.views.values())}};
    if (!run_or_refused(what.c_str(), Collective::kBatchReduce, op, t,
                        ops_.batch_reduce(op, pairs)))
      return;
    const int n = ops_.num_replicas_in_sync();
    for (size_t k = 0; k < a.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i) check(what, a.views[k], i, expected_at(op, t, n, i));
      for (int64_t i = 0; i < 5; ++i) check(what, b.views[k], i, expected_at(op, t, n, i + 3));
    }
  }

  void broadcast(DType t, int64_t count, bool in_place) {
    const std::string what = name("broadcast", ReduceOp::kSum, t, count, in_place);
    const int root = ops_.world_size() - 1;
    Buffers out(t, count, ops_.devices()), src(t, count, {ops_.devices()[0]});
    Tensor source = in_place ? out.views[0] : src.views[0];
    for (const Tensor& o : out.views) std::memset(o.data(), 0x5a, o.nbytes());
    if (ops_.rank() == root) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, source.data(), i, exact_value(ReduceOp::kMax, 3, i));
    }
    if (!run_or_refused(what.c_str(), Collective::kBroadcast, ReduceOp::kSum, t,
                        ops_.broadcast(source, Mirrored<Tensor>(out.views.values()), root))) {
      return;
    }
    for (const Tensor& o : out.views) {
      for (int64_t i = 0; i < count; ++i) check(what, o, i, exact_value(ReduceOp::kMax, 3, i));
    }
  }

  void all_gather(DType t, int64_t count, bool in_place) {
    const std::string what = name("all_gather", ReduceOp::kSum, t, count, in_place);
    const int n = ops_.num_replicas_in_sync();
    Buffers in(t, count, ops_.devices()), out(t, count * n, ops_.devices());
    PerReplica<Tensor> src = in.views;
    for (size_t k = 0; k < src.size(); ++k) {
      if (in_place) src[k] = out.views[k].slice(global(k) * count, count);
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, src[k].data(), i, exact_value(ReduceOp::kMax, global(k), i));
    }
    if (!run_or_refused(what.c_str(), Collective::kAllGather, ReduceOp::kSum, t,
                        ops_.all_gather(src, out.views)))
      return;
    for (const Tensor& o : out.views) {
      for (int g = 0; g < n; ++g) {
        for (int64_t i = 0; i < count; ++i)
          check(what, o, g * count + i, exact_value(ReduceOp::kMax, g, i));
      }
    }
  }

  CrossDeviceOps& ops_;
  std::vector<int64_t> counts_;
  int failures_ = 0;
};

using Param = std::tuple<std::string, int, int>;  // spec, world, local replicas
class MultiProcessConformance : public ::testing::TestWithParam<Param> {};

TEST_P(MultiProcessConformance, EveryCollective) {
  // Named copies, not a structured binding: the lambda below captures them (clang 14 cannot).
  const std::string spec = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  const int local = std::get<2>(GetParam());
  const std::string dir = make_temp_dir("conformance");
  GroupResult g = run_group(world, std::chrono::seconds(240), [&](int rank) {
    // A spec that asks for authenticated frames gets a secret to authenticate them with.
    Config config;
    if (spec.find("authenticate_frames=true") != std::string::npos) {
      config = Config::from_map({{"TRIBUTARY_SECRET", "conformance secret"}});
    }
    auto ctx = group_context(rank, world, local, dir, config);
    if (!ctx.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ctx.status().to_string().c_str());
      return kChildFailed;
    }
    auto ops = builtin_backends().create(
        spec + (spec.find(':') == std::string::npos ? ":" : ",") + "timeout=60s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    Matrix m(**ops, counts_for(spec));
    m.run();
    return m.failures() == 0 ? kChildOk : kChildFailed;
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string spec = std::get<0>(info.param);
  for (char& c : spec) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return spec + "_w" + std::to_string(std::get<1>(info.param)) + "_l" +
         std::to_string(std::get<2>(info.param));
}

// A backend joins with one line.
#define TRIBUTARY_MULTIPROCESS_CONFORMANCE(name, spec)                                           \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      name, MultiProcessConformance,                                                             \
      ::testing::Combine(::testing::Values(std::string(spec)), ::testing::Values(1, 2, 3, 4, 5), \
                         ::testing::Values(1, 2)),                                               \
      param_name)

// Every process here is on one host: "ring" goes through shared memory, intra_host=net through TCP.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(Ring, "ring");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingShmSmallChunks, "ring:shm_chunk_bytes=4KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingNet, "ring:intra_host=net");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingForcedRing,
                                   "ring:intra_host=net,algorithm=ring,segment_bytes=4KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingHalvingDoubling,
                                   "ring:intra_host=net,algorithm=halving_doubling");
// Striped and authenticated: every frame of every stripe carries a MAC.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingThreeSocketsAuthenticated,
                                   "ring:intra_host=net,sockets_per_peer=3,"
                                   "authenticate_frames=true");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(Gloo, "gloo");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxSharedMemory, "ucx:tls=sm");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxTcp, "ucx:tls=tcp");
// Every message carries a MAC (inline up to 16 KiB, a tag message of its own above).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxTcpAuthenticated, "ucx:tls=tcp,authenticate_frames=true");

// --- several hosts: Linux network namespaces
// ------------------------------------------------------- Each "host" is a network namespace with
// its own host id (TRIBUTARY_HOST_ID), joined to the others by a veth pair into a bridge, as
// separate machines on a switch: processes of a host share memory, hosts reach each other only
// through their own network stacks (TCP over the veths). Needs root and iproute2 (`ip`); elsewhere
// the tests are skipped, saying why.
class Hosts {
 public:
  explicit Hosts(int hosts) {
    if (::geteuid() != 0) {
      why_not_ = "creating network namespaces needs root";
      return;
    }
    if (std::system("ip -V >/dev/null 2>&1") != 0) {
      why_not_ = "iproute2's `ip` is not installed";
      return;
    }
    tag_ = "tb" + std::to_string(::getpid() % 100000);
    std::string script =
        "set -e; ip link add " + tag_ + "br type bridge; ip link set " + tag_ + "br up;";
    for (int h = 0; h < hosts; ++h) {
      const std::string ns = name(h), veth = tag_ + "v" + std::to_string(h);
      script += " ip netns add " + ns + "; ip link add " + veth +
                " type veth peer name eth0 netns " + ns + "; ip link set " + veth + " master " +
                tag_ + "br up; ip -n " + ns + " addr add " + address(h) + "/24 dev eth0; ip -n " +
                ns + " link set eth0 up; ip -n " + ns + " link set lo up;";
      created_ = h + 1;
    }
    if (std::system(("(" + script + ") >/dev/null 2>&1").c_str()) != 0) {
      why_not_ = "cannot create network namespaces here (ip netns add / veth / bridge failed)";
    }
  }
  ~Hosts() {
    std::string script = "ip link del " + tag_ + "br;";
    for (int h = 0; h < created_; ++h) script += " ip netns del " + name(h) + ";";
    if (!tag_.empty()) (void)!std::system(("(" + script + ") >/dev/null 2>&1").c_str());
  }
  const std::string& why_not() const { return why_not_; }
  std::string name(int h) const { return tag_ + "h" + std::to_string(h); }
  static std::string address(int h) { return "10.77.0." + std::to_string(h + 1); }

  // In a child: moves this process into host h's network stack.
  bool enter(int h) const {
    const int fd = ::open(("/run/netns/" + name(h)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return ok;
  }

 private:
  std::string tag_;
  std::string why_not_;
  int created_ = 0;
};

using HostsParam = std::tuple<std::string, int, int, int>;  // spec, hosts, processes/host, replicas
class MultiHostConformance : public ::testing::TestWithParam<HostsParam> {};

// Ranks are dealt to hosts round-robin (rank r on host r % hosts), so that a host's processes are
// not consecutive ranks; every collective, op and dtype is checked as on one host, and the group
// must be the composition the layout calls for.
TEST_P(MultiHostConformance, EveryCollective) {
  // Named copies, not a structured binding: lambdas below capture them (clang 14 cannot capture
  // bindings).
  const std::string spec = std::get<0>(GetParam());
  const int hosts = std::get<1>(GetParam());
  const int per_host = std::get<2>(GetParam());
  const int local = std::get<3>(GetParam());
  Hosts net(hosts);
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  const int world = hosts * per_host;
  const std::string dir = make_temp_dir("hosts");
  GroupResult g = run_group(world, std::chrono::seconds(300), [&](int rank) {
    const int h = rank % hosts;
    if (!net.enter(h)) return kChildFailed;
    auto ctx = group_context(rank, world, local, dir,
                             Config::from_map({{"TRIBUTARY_HOST_ID", net.name(h)}}));
    if (!ctx.ok()) return kChildFailed;
    ctx->coordinator_host = "10.77.0.254";  // a peer's subnet: each rank publishes its eth0
    auto ops = builtin_backends().create(spec + ",timeout=60s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(ops->get());
    const std::string layout = pg && pg->group() ? pg->group()->describe() : "";
    const bool hierarchical = per_host > 1 && spec.find("hierarchy=off") == std::string::npos;
    const std::string want = hierarchical ? "hierarchical (" + std::to_string(hosts) + " hosts x " +
                                                std::to_string(per_host) + " processes"
                                          : "tcp (" + std::to_string(world) + " ranks";
    if (layout.find(want) == std::string::npos) {
      std::fprintf(stderr, "[rank %d] group is '%s', want '%s...'\n", rank, layout.c_str(),
                   want.c_str());
      return kChildFailed;
    }
    if (hierarchical && spec.find("intra_host=net") == std::string::npos &&
        layout.find("within a host: shared memory") == std::string::npos) {
      std::fprintf(stderr, "[rank %d] no shared memory inside the host: %s\n", rank,
                   layout.c_str());
      return kChildFailed;
    }
    Matrix m(**ops, {0, 1, 7, 1001, 65537});
    m.run();
    return m.failures() == 0 ? kChildOk : kChildFailed;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

INSTANTIATE_TEST_SUITE_P(Ring, MultiHostConformance,
                         ::testing::Values(HostsParam{"ring:algorithm=auto", 2, 2, 1},
                                           HostsParam{"ring:algorithm=auto", 2, 2, 2},
                                           HostsParam{"ring:intra_host=net", 2, 2, 1},
                                           HostsParam{"ring:algorithm=ring", 3, 2, 1},
                                           HostsParam{"ring:hierarchy=off", 2, 2, 1},
                                           HostsParam{"ring:algorithm=auto", 2, 1, 1}),
                         [](const ::testing::TestParamInfo<HostsParam>& info) {
                           std::string spec = std::get<0>(info.param);
                           for (char& c : spec) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return spec + "_h" + std::to_string(std::get<1>(info.param)) + "_p" +
                                  std::to_string(std::get<2>(info.param)) + "_l" +
                                  std::to_string(std::get<3>(info.param));
                         });

}  // namespace
}  // namespace tributary::testing
