// The multi-process conformance suite (see conformance.h): the matrix each rank runs, the cases on
// one host and on several (network namespaces).
#include "tests/multiprocess/conformance.h"

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/process_group_ops.h"
#include "core/gpu.h"
#include "tests/conformance/device_buffers.h"
#include "tests/conformance/values.h"
#include "tests/multiprocess/harness.h"
#include "transports/shm/shm_group.h"

namespace tributary::testing {
namespace {

using conformance::DeviceBuffers;
using conformance::exact_value;
using conformance::expected_at;

// Element counts per rank: empty, one, odd, not divisible by any world size, several segments.
std::vector<int64_t> counts_for(const std::string& spec) {
  // Several sockets per peer: fewer sizes (the others take the one-socket path, which the plain
  // specs cover), and a larger one, so that every world size has messages past the striping
  // threshold (64 KiB) next to small ones on the same sockets.
  if (spec.find("sockets_per_peer") != std::string::npos) return {0, 7, 131075};
  return {0, 1, 7, 1001, 65537};
}

// Runs every collective on `ops` and counts wrong results; each rank runs it in its own process,
// so failures are printed (the first 8) and counted rather than reported through gtest.
class Matrix {
 public:
  // `shareable`: buffers from Buffer::allocate_shareable, all-reduce outputs registered; with
  // `direct`, a registration over shared memory's small_bytes must take its direct path.
  Matrix(CrossDeviceOps& ops, std::vector<int64_t> counts, bool shareable = false,
         bool direct = false)
      : ops_(ops), counts_(std::move(counts)), shareable_(shareable), direct_(direct) {}
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
  bool run_or_refused(const std::string& what, Collective c, ReduceOp op, DType t, Work w) {
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
  // Host shadows to the devices (or device results back); false, with the failure counted, when
  // a copy fails.
  bool moved(const std::string& what, const ::testing::AssertionResult& r) {
    if (!r) fail(what, r.message());
    return static_cast<bool>(r);
  }
  void check(const std::string& what, const Tensor& t, int64_t i, double want) {
    double got = dtype_load(t.dtype(), t.data(), i);
    if (got != want)
      fail(what, "element " + std::to_string(i) + " is " + std::to_string(got) + ", want " +
                     std::to_string(want));
  }
  // Shareable: registers `b` (one buffer per replica), and checks that a registration over 16 KiB
  // takes the direct path where it should. False (a failure noted) when registration fails.
  bool register_shareable(const std::string& what, const DeviceBuffers& b,
                          std::vector<BufferRegistration>* out) {
    if (!shareable_) return true;
    StatusOr<BufferRegistration> r = ops_.register_buffers(b.views);
    if (!r.ok()) {
      fail(what, "register_buffers: " + r.status().to_string());
      return false;
    }
    out->push_back(std::move(r).value());
    if (direct_ && b.views[0].nbytes() > (size_t{16} << 10) &&
        !takes_direct_path(out->back().id())) {
      fail(what, "the registration of shareable buffers did not take the direct path");
    }
    return true;
  }
  const transports::shm::ShmGroup* shm_group() const {
    const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(&ops_);
    return pg ? dynamic_cast<const transports::shm::ShmGroup*>(pg->group()) : nullptr;
  }
  bool takes_direct_path(uint64_t id) const {
    return shm_group() != nullptr && shm_group()->registered_direct(id);
  }
  uint64_t direct_calls() const { return shm_group() ? shm_group()->direct_calls() : 0; }
  // Where the direct path is expected (`takes`, and over 16 KiB): that the call counted from
  // `before` took it, rather than the slots.
  void expect_direct_call(const std::string& what, uint64_t before, size_t bytes, bool takes) {
    if (direct_ && takes && bytes > (size_t{16} << 10) && direct_calls() == before) {
      fail(what, "the call on registered shareable buffers did not take the direct path");
    }
  }
  static std::string name(const char* c, ReduceOp op, DType t, int64_t n, bool in_place) {
    return std::string(c) + " " + std::string(reduce_op_name(op)) + " " +
           std::string(dtype_name(t)) + " n=" + std::to_string(n) + (in_place ? " in place" : "");
  }
  static void poison(const DeviceBuffers& b) {
    for (const Tensor& h : b.hosts) std::memset(h.data(), 0x5a, h.nbytes());
  }
  // Each replica's input (its exact values for `op`) and poisoned outputs, on the devices.
  bool staged(const std::string& what, ReduceOp op, const DeviceBuffers& in,
              const DeviceBuffers& out) {
    for (size_t k = 0; k < in.hosts.size(); ++k) {
      const Tensor& h = in.host(k);
      for (int64_t i = 0; i < h.num_elements(); ++i)
        dtype_store(h.dtype(), h.data(), i, exact_value(op, global(k), i));
    }
    poison(out);
    return moved(what, in.upload()) && moved(what, out.upload());
  }

  void all_reduce(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("all_reduce", op, t, count, in_place);
    DeviceBuffers in(t, count, ops_.devices(), shareable_),
        out(t, count, ops_.devices(), shareable_);
    if (!staged(what, op, in, out)) return;
    const DeviceBuffers& dst = in_place ? in : out;
    // Shareable: the output registered, and out of place the input too (read where it is).
    std::vector<BufferRegistration> registrations;
    if (!register_shareable(what, dst, &registrations) ||
        (!in_place && !register_shareable(what, in, &registrations))) {
      return;
    }
    const uint64_t direct_before = direct_calls();
    if (!run_or_refused(what, Collective::kAllReduce, op, t,
                        ops_.all_reduce(op, in.views, dst.views)))
      return;
    expect_direct_call(what, direct_before, dst.views[0].nbytes(), true);
    if (!moved(what, dst.download())) return;
    const int n = ops_.num_replicas_in_sync();
    for (int64_t i = 0; i < count; ++i) {
      const double want = expected_at(op, t, n, i);
      for (const Tensor& d : dst.hosts) check(what, d, i, want);
    }
    // Out of place, the inputs are as they were (the peers may read them where they are).
    if (in_place || !moved(what, in.download())) return;
    for (size_t k = 0; k < in.hosts.size(); ++k) {
      for (int64_t i = 0; i < count; ++i) {
        check(what + " (its input)", in.host(k), i, exact_value(op, global(k), i));
      }
    }
  }

  void reduce(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("reduce", op, t, count, in_place);
    DeviceBuffers in(t, count, ops_.devices()), out(t, count, ops_.devices());
    if (!staged(what, op, in, out)) return;
    // In place: the first replica's input is the one destination.
    Mirrored<Tensor> dst =
        in_place ? Mirrored<Tensor>{in.views[0]} : Mirrored<Tensor>(out.views.values());
    if (!run_or_refused(what, Collective::kReduce, op, t, ops_.reduce(op, in.views, dst))) return;
    const DeviceBuffers& result = in_place ? in : out;
    if (!moved(what, result.download())) return;
    const size_t checked = in_place ? 1 : result.hosts.size();
    const int n = ops_.num_replicas_in_sync();
    for (int64_t i = 0; i < count; ++i) {
      const double want = expected_at(op, t, n, i);
      for (size_t k = 0; k < checked; ++k) check(what, result.host(k), i, want);
    }
  }

  void reduce_scatter(ReduceOp op, DType t, int64_t count, bool in_place) {
    const std::string what = name("reduce_scatter", op, t, count, in_place);
    const int n = ops_.num_replicas_in_sync();
    DeviceBuffers in(t, count * n, ops_.devices(), shareable_), out(t, count, ops_.devices());
    if (!staged(what, op, in, out)) return;
    // Shareable: the input registered (ring reads every rank's where it is, with one local
    // replica per process).
    std::vector<BufferRegistration> registrations;
    if (!register_shareable(what, in, &registrations)) return;
    PerReplica<Tensor> dst = out.views;
    for (size_t k = 0; k < in.views.size(); ++k) {
      // In place: each replica's own block of its input.
      if (in_place) dst[k] = in.views[k].slice(global(k) * count, count);
    }
    const uint64_t direct_before = direct_calls();
    if (!run_or_refused(what, Collective::kReduceScatter, op, t,
                        ops_.reduce_scatter(op, in.views, dst)))
      return;
    expect_direct_call(what, direct_before, in.views[0].nbytes(), ops_.devices().size() == 1);
    const DeviceBuffers& result = in_place ? in : out;
    if (!moved(what, result.download())) return;
    for (size_t k = 0; k < dst.size(); ++k) {
      const int64_t at = in_place ? global(k) * count : 0;
      for (int64_t i = 0; i < count; ++i)
        check(what, result.host(k), at + i, expected_at(op, t, n, global(k) * count + i));
    }
    // Out of place, the inputs are as they were (the group may read them where they are).
    if (in_place || !moved(what, in.download())) return;
    for (size_t k = 0; k < in.hosts.size(); ++k) {
      for (int64_t i = 0; i < count * n; ++i) {
        check(what + " (its input)", in.host(k), i, exact_value(op, global(k), i));
      }
    }
  }

  void batch_reduce(ReduceOp op, DType t, int64_t count) {
    const std::string what = name("batch_reduce", op, t, count, false);
    DeviceBuffers a(t, count, ops_.devices()), b(t, 5, ops_.devices());
    for (size_t k = 0; k < a.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, a.host(k).data(), i, exact_value(op, global(k), i));
      for (int64_t i = 0; i < 5; ++i)
        dtype_store(t, b.host(k).data(), i, exact_value(op, global(k), i + 3));
    }
    if (!moved(what, a.upload()) || !moved(what, b.upload())) return;
    std::vector<ReducePair> pairs = {{a.views, Mirrored<Tensor>(a.views.values())},
                                     {b.views, Mirrored<Tensor>(b.views.values())}};
    if (!run_or_refused(what, Collective::kBatchReduce, op, t, ops_.batch_reduce(op, pairs)))
      return;
    if (!moved(what, a.download()) || !moved(what, b.download())) return;
    const int n = ops_.num_replicas_in_sync();
    for (size_t k = 0; k < a.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i) check(what, a.host(k), i, expected_at(op, t, n, i));
      for (int64_t i = 0; i < 5; ++i) check(what, b.host(k), i, expected_at(op, t, n, i + 3));
    }
    // One pair (a pack of one value, which backends may run as a reduce), out of place.
    const std::string one = name("batch_reduce of one pair", op, t, count, false);
    DeviceBuffers c(t, count, ops_.devices()), d(t, count, ops_.devices());
    poison(d);
    for (size_t k = 0; k < c.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, c.host(k).data(), i, exact_value(op, global(k), i));
    }
    if (!moved(one, c.upload()) || !moved(one, d.upload())) return;
    std::vector<ReducePair> single = {{c.views, Mirrored<Tensor>(d.views.values())}};
    if (!run_or_refused(one, Collective::kBatchReduce, op, t, ops_.batch_reduce(op, single))) {
      return;
    }
    if (!moved(one, d.download())) return;
    for (size_t k = 0; k < d.views.size(); ++k) {
      for (int64_t i = 0; i < count; ++i) check(one, d.host(k), i, expected_at(op, t, n, i));
    }
  }

  void broadcast(DType t, int64_t count, bool in_place) {
    const std::string what = name("broadcast", ReduceOp::kSum, t, count, in_place);
    const int root = ops_.world_size() - 1;
    DeviceBuffers out(t, count, ops_.devices(), shareable_), src(t, count, {ops_.devices()[0]});
    poison(out);
    std::vector<BufferRegistration> registrations;
    if (!register_shareable(what, out, &registrations)) return;
    // In place: the source is the root's first destination.
    const Tensor& source_host = in_place ? out.host(0) : src.host(0);
    if (ops_.rank() == root) {
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, source_host.data(), i, exact_value(ReduceOp::kMax, 3, i));
    }
    if (!moved(what, out.upload()) || !moved(what, src.upload())) return;
    const Tensor source = in_place ? out.views[0] : src.views[0];
    const uint64_t direct_before = direct_calls();
    if (!run_or_refused(what, Collective::kBroadcast, ReduceOp::kSum, t,
                        ops_.broadcast(source, Mirrored<Tensor>(out.views.values()), root))) {
      return;
    }
    expect_direct_call(what, direct_before, out.views[0].nbytes(), true);
    if (!moved(what, out.download())) return;
    for (const Tensor& o : out.hosts) {
      for (int64_t i = 0; i < count; ++i) check(what, o, i, exact_value(ReduceOp::kMax, 3, i));
    }
  }

  void all_gather(DType t, int64_t count, bool in_place) {
    const std::string what = name("all_gather", ReduceOp::kSum, t, count, in_place);
    const int n = ops_.num_replicas_in_sync();
    DeviceBuffers in(t, count, ops_.devices()), out(t, count * n, ops_.devices(), shareable_);
    poison(out);
    std::vector<BufferRegistration> registrations;
    if (!register_shareable(what, out, &registrations)) return;
    PerReplica<Tensor> src = in.views;
    for (size_t k = 0; k < src.size(); ++k) {
      // In place: each replica's input is its own block of its output.
      const int64_t at = in_place ? global(k) * count : 0;
      const Tensor& host = in_place ? out.host(k) : in.host(k);
      if (in_place) src[k] = out.views[k].slice(at, count);
      for (int64_t i = 0; i < count; ++i)
        dtype_store(t, host.data(), at + i, exact_value(ReduceOp::kMax, global(k), i));
    }
    if (!moved(what, in.upload()) || !moved(what, out.upload())) return;
    const uint64_t direct_before = direct_calls();
    if (!run_or_refused(what, Collective::kAllGather, ReduceOp::kSum, t,
                        ops_.all_gather(src, out.views)))
      return;
    expect_direct_call(what, direct_before, out.views[0].nbytes(), true);
    if (!moved(what, out.download())) return;
    for (const Tensor& o : out.hosts) {
      for (int g = 0; g < n; ++g) {
        for (int64_t i = 0; i < count; ++i)
          check(what, o, g * count + i, exact_value(ReduceOp::kMax, g, i));
      }
    }
  }

  CrossDeviceOps& ops_;
  std::vector<int64_t> counts_;
  bool shareable_ = false, direct_ = false;
  int failures_ = 0;
};

// How many CUDA devices a forked process sees, and why none when none: counted in a child, so that
// this process never initialises CUDA (a CUDA context does not survive fork into the ranks).
struct GpuProbe {
  int count = 0;
  std::string why_none;
};
GpuProbe probe_gpus() {
  const std::string file = make_temp_dir("gpu_probe") + "/probe";
  GroupResult g = run_group(1, std::chrono::seconds(60), [&](int) {
    std::ofstream out(file);
    out << cuda_device_count() << "\n"
        << gpu::visible_devices_text() << "; " << gpu::runtime_info().error << "\n";
    return out.good() ? kChildOk : kChildFailed;
  });
  GpuProbe p;
  std::ifstream in(file);
  std::string count;
  if (g.children.empty() || g.children[0].exit_code != kChildOk || !std::getline(in, count) ||
      !std::getline(in, p.why_none)) {
    p.why_none = "the probe process failed (" + g.describe() + ")";
    return p;
  }
  p.count = std::atoi(count.c_str());
  return p;
}

// The devices of `rank`'s `local` replicas.
std::vector<Device> devices_of(DeviceKind kind, int rank, int local) {
  std::vector<Device> d;
  for (int k = 0; k < local; ++k) {
    switch (kind) {
      case DeviceKind::kGpu:
        d.push_back(Device::cuda(rank * local + k));
        break;
      case DeviceKind::kGpuShared:
        d.push_back(Device::cuda(k));
        break;
      case DeviceKind::kMixed:
        d.push_back((rank + k) % 2 == 0 ? Device::cuda(k) : Device::cpu(k));
        break;
      case DeviceKind::kCpu:
      case DeviceKind::kCpuShareable:
        d.push_back(Device::cpu(k));
        break;
    }
  }
  return d;
}

std::string identifier(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

// --- several hosts: Linux network namespaces ----------------------------------------------------
// Each "host" is a network namespace with its own host id (TRIBUTARY_HOST_ID), joined to the others
// by a veth pair into a bridge, as separate machines on a switch: processes of a host share memory,
// hosts reach each other only through their own network stacks (TCP over the veths). Needs root and
// iproute2 (`ip`); elsewhere the tests are skipped, saying why.
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
    // A name of its own per instance: the kernel tears down a deleted namespace's veth pair in the
    // background, so the next test's "ip link add" of the same name could meet the old one (tests
    // of one binary skipped at random, "cannot create network namespaces here").
    static int instances = 0;
    tag_ = "tb" + std::to_string(::getpid() % 100000) + "x" + std::to_string(instances++ % 100);
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
    // Once namespaces were made in this process, failing to make more is a fault of the tests
    // (a name still in use, say), not of the machine: a failure, not a skip.
    static bool made_before = false;
    if (std::system(("(" + script + ") >/dev/null 2>&1").c_str()) != 0) {
      why_not_ = "cannot create network namespaces here (ip netns add / veth / bridge failed)";
      broken_ = made_before;
    } else {
      made_before = true;
    }
  }
  ~Hosts() {
    std::string script = "ip link del " + tag_ + "br;";
    for (int h = 0; h < created_; ++h) {
      script +=
          " ip link del " + tag_ + "v" + std::to_string(h) + "; ip netns del " + name(h) + ";";
    }
    if (!tag_.empty()) (void)!std::system(("(" + script + ") >/dev/null 2>&1").c_str());
  }
  const std::string& why_not() const { return why_not_; }
  // True when this process made namespaces before and could not now (see the constructor).
  bool broken() const { return broken_; }
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
  bool broken_ = false;
  int created_ = 0;
};

}  // namespace

int run_conformance_matrix(CrossDeviceOps& ops, const std::string& spec) {
  Matrix m(ops, counts_for(spec));
  m.run();
  return m.failures();
}

// A test file may instantiate one of the two suites only.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiProcessConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiHostConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiHostFaults);

std::string identifier_for_test(const std::string& spec) { return identifier(spec); }

std::string multiprocess_param_name(const ::testing::TestParamInfo<MultiProcessParam>& info) {
  const auto& [spec, kind, world, local] = info.param;
  const char* prefix = kind == DeviceKind::kGpu         ? "gpu_"
                       : kind == DeviceKind::kGpuShared ? "gpushared_"
                       : kind == DeviceKind::kMixed     ? "mixed_"
                       : kind == DeviceKind::kCpuShareable ? "shareable_"
                                                        : "";
  return prefix + identifier(spec) + "_w" +
         std::to_string(world) + "_l" + std::to_string(local);
}

std::string multihost_param_name(const ::testing::TestParamInfo<HostsParam>& info) {
  const auto& [spec, hosts, per_host, local] = info.param;
  return identifier(spec) + "_h" + std::to_string(hosts) + "_p" + std::to_string(per_host) +
         "_l" + std::to_string(local);
}

TEST_P(MultiProcessConformance, EveryCollective) {
  // Named copies, not a structured binding: the lambda below captures them (clang 14 cannot).
  const std::string spec = std::get<0>(GetParam());
  const DeviceKind kind = std::get<1>(GetParam());
  const int world = std::get<2>(GetParam());
  const int local = std::get<3>(GetParam());
  const bool cpu = kind == DeviceKind::kCpu || kind == DeviceKind::kCpuShareable;
  if (!cpu) {
    const GpuProbe gpus = probe_gpus();
    const int needed = kind == DeviceKind::kGpu ? world * local : local;
    if (gpus.count < needed) {
      GTEST_SKIP() << "needs " << needed << " GPUs ("
                   << (kind == DeviceKind::kGpu ? std::to_string(world) + " processes x " : "")
                   << local << " replicas); " << gpus.count << " visible (" << gpus.why_none
                   << ")";
    }
  }
  const bool single_copy = spec.find("shm_single_copy=on") != std::string::npos;
  if (single_copy && !why_siblings_cannot_read_each_other().empty()) {
    GTEST_SKIP() << why_siblings_cannot_read_each_other();
  }
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
    ctx->devices = devices_of(kind, rank, local);
    auto ops = builtin_backends().create(
        spec + (spec.find(':') == std::string::npos ? ":" : ",") + "timeout=60s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    // ring's default on one host is its shared memory, never TCP behind the user's back.
    const bool ring_shm = cpu && world > 1 && spec.rfind("ring", 0) == 0 &&
                          spec.find("intra_host=net") == std::string::npos;
    if (ring_shm) {
      const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(ops->get());
      const std::string group = pg && pg->group() ? pg->group()->describe() : "";
      if (group.rfind("shared memory", 0) != 0) {
        std::fprintf(stderr, "[rank %d] '%s' on one host runs over '%s', not shared memory\n", rank,
                     spec.c_str(), group.c_str());
        return kChildFailed;
      }
      // And with single copy asked for, its all-reduces read and write the peers' buffers.
      if (single_copy && group.find("(single copy)") == std::string::npos) {
        std::fprintf(stderr, "[rank %d] '%s' runs over '%s', without single copy\n", rank,
                     spec.c_str(), group.c_str());
        return kChildFailed;
      }
    }
    Matrix m(**ops, counts_for(spec), kind == DeviceKind::kCpuShareable,
             kind == DeviceKind::kCpuShareable && ring_shm);
    m.run();
    return m.failures() == 0 ? kChildOk : kChildFailed;
  });
  bool skipped = true;
  for (const ChildResult& c : g.children) skipped = skipped && c.exit_code == kChildSkip;
  if (skipped) GTEST_SKIP() << "backend '" << spec << "' is not built into this tributary";
  for (const ChildResult& c : g.children) EXPECT_EQ(c.exit_code, kChildOk) << g.describe();
}

TEST_P(MultiHostConformance, EveryCollective) {
  // Named copies, not a structured binding: lambdas below capture them (clang 14 cannot capture
  // bindings).
  const std::string spec = std::get<0>(GetParam());
  const int hosts = std::get<1>(GetParam());
  const int per_host = std::get<2>(GetParam());
  const int local = std::get<3>(GetParam());
  Hosts net(hosts);
  ASSERT_FALSE(net.broken()) << net.why_not() << ", after earlier tests of this run made some";
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
    const std::string backend = spec.substr(0, spec.find(':'));
    auto ops = builtin_backends().create(
        spec + (spec.find(':') == std::string::npos ? ":" : ",") + "timeout=60s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    const auto* pg = dynamic_cast<const algorithms::ProcessGroupOps*>(ops->get());
    const std::string layout = pg && pg->group() ? pg->group()->describe() : "";
    // auto takes the hierarchy on several hosts of several processes each (the suite's hosts all
    // run per_host); hierarchy=on forces it.
    const bool hierarchical =
        spec.find("hierarchy=on") != std::string::npos ||
        (hosts > 1 && per_host > 1 && spec.find("hierarchy=off") == std::string::npos);
    // Flat: one group of every rank, whatever the backend calls its transport ("tcp (4 ranks",
    // "ucx (4 ranks").
    const std::string want = hierarchical ? "hierarchical (" + std::to_string(hosts) + " hosts x " +
                                                std::to_string(per_host) + " processes"
                                          : " (" + std::to_string(world) + " ranks";
    // Flat across hosts is never one shared-memory group: the "hosts" share /dev/shm.
    if (layout.find(want) == std::string::npos ||
        (!hierarchical && (layout.find("hierarchical") != std::string::npos ||
                           layout.starts_with("shared memory")))) {
      std::fprintf(stderr, "[rank %d] group is '%s', want '%s...'\n", rank, layout.c_str(),
                   want.c_str());
      return kChildFailed;
    }
    // ring's local group is its own shared memory (ucx's is UCX's, which picks it by itself).
    if (hierarchical && per_host > 1 && backend == "ring" &&
        spec.find("intra_host=net") == std::string::npos &&
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

TEST_P(MultiHostFaults, KilledRankOnAnotherHostFailsEverySurvivorNamingIt) {
  const std::string spec = GetParam();
  constexpr int kHosts = 2, kPerHost = 2, kWorld = kHosts * kPerHost, kVictim = 3;
  Hosts net(kHosts);
  ASSERT_FALSE(net.broken()) << net.why_not() << ", after earlier tests of this run made some";
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  const std::string dir = make_temp_dir("hostkill");
  GroupResult g = run_group(kWorld, std::chrono::seconds(90), [&](int rank) {
    const int h = rank % kHosts;  // ranks 0 and 2 on host 0, 1 and 3 on host 1
    if (!net.enter(h)) return kChildFailed;
    auto ctx = group_context(rank, kWorld, 1, dir,
                             Config::from_map({{"TRIBUTARY_HOST_ID", net.name(h)}}));
    if (!ctx.ok()) return kChildFailed;
    ctx->coordinator_host = "10.77.0.254";
    auto ops = builtin_backends().create(
        spec + (spec.find(':') == std::string::npos ? ":" : ",") + "timeout=6s", *ctx);
    if (!ops.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, ops.status().to_string().c_str());
      return ops.status().code() == StatusCode::kNotFound ? kChildSkip : kChildFailed;
    }
    std::vector<float> data(1 << 16, 1.0f);
    PerReplica<Tensor> v{Tensor(data.data(), DType::kFloat32, static_cast<int64_t>(data.size()),
                                (*ops)->devices()[0])};
    for (int i = 0; i < 100000; ++i) {
      if (rank == kVictim && i == 5) ::raise(SIGKILL);
      const auto start = std::chrono::steady_clock::now();
      const Status s = (*ops)->all_reduce(ReduceOp::kSum, v, v).wait(std::chrono::seconds(60));
      if (!s.ok()) {
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::ofstream(dir + "/note" + std::to_string(rank))
            << s.to_string() << "\nseconds=" << took;
        return 3;
      }
    }
    return kChildOk;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  if (g.children[0].exit_code == kChildSkip) GTEST_SKIP() << spec << " is not built in";
  EXPECT_EQ(g.children[kVictim].signal, SIGKILL) << g.describe();
  bool keyed = false;  // a subgroup's error translated to the job's rank numbers
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    std::ifstream in(dir + "/note" + std::to_string(r));
    std::stringstream note;
    note << in.rdbuf();
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, 3) << g.describe();
    const std::string text = note.str();
    const auto at = text.find("seconds=");
    ASSERT_NE(at, std::string::npos) << "rank " << r << ": " << text;
    EXPECT_LT(std::stod(text.substr(at + 8)), 6.0 + 5.0) << "rank " << r << ": " << text;
    EXPECT_NE(text.find("rank " + std::to_string(kVictim)), std::string::npos)
        << "rank " << r << ": " << text;
    keyed = keyed || text.find(" of the job)") != std::string::npos;
  }
  // Hierarchical: some survivor learnt of the death from a TCP or UCX subgroup, which numbers its
  // ranks its own way; the error gives the key ("its ranks 0, 1 are ranks 2, 3 of the job").
  if (spec.find("hierarchy=off") == std::string::npos) {
    EXPECT_TRUE(keyed);
  }
}

void expect_every_cpu_capability(const std::string& spec) {
  const BackendRegistry registry = builtin_backends();  // find() points into it: keep it alive
  const std::string name = spec.substr(0, spec.find(':'));
  const BackendInfo* info = registry.find(name);
  if (info == nullptr) GTEST_SKIP() << "backend '" << name << "' is not built into this tributary";
  BackendContext ctx;
  auto made = registry.create(spec, ctx);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  for (const Capabilities* caps : {&info->capabilities, &(*made)->capabilities()}) {
    const char* whose = caps == &info->capabilities ? "registered" : "instance";
    EXPECT_TRUE(caps->supports(DeviceType::kCpu)) << whose << ": " << caps->to_string();
    EXPECT_TRUE(caps->multi_process) << whose << ": " << caps->to_string();
    for (DType t : all_dtypes()) {
      EXPECT_TRUE(caps->supports(t))
          << whose << ": " << dtype_name(t) << " missing from " << caps->to_string();
    }
    for (ReduceOp op : all_reduce_ops()) {
      EXPECT_TRUE(caps->supports(op))
          << whose << ": " << reduce_op_name(op) << " missing from " << caps->to_string();
    }
    for (Collective c : all_collectives()) {
      EXPECT_TRUE(caps->supports(c))
          << whose << ": " << collective_name(c) << " missing from " << caps->to_string();
    }
  }
}

}  // namespace tributary::testing
