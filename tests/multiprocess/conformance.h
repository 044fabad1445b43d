// The multi-process conformance suite. A multi-process backend joins it with one line in its own
// test file (as TensorPipe's channel tests do):
//
//   TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxTcp, "ucx:tls=tcp");       // replicas on CPU devices
//   TRIBUTARY_MULTIPROCESS_CONFORMANCE_GPU(Nccl, "nccl");             // replicas on GPU devices
//
// Every case forks `world` real processes (1 to 5) with 1 or 2 local replicas each; the ranks meet
// through a FileStore, and run every collective x op x dtype x size (0, 1, odd, not divisible by
// any world size, several segments) x in-place/out-of-place, with results checked exactly against
// small-integer inputs of each global replica. An op or dtype the backend does not support must be
// refused with Unimplemented.
//
// Devices (DeviceKind): on CPU, rank r's replicas are CPU:0 .. CPU:local-1. On GPU, rank r's
// replica k is GPU:(r x local + k), so a case needs world x local visible GPUs (kGpuShared and
// kMixed need `local`) (counted in a forked probe, so
// that the test process itself never initialises CUDA before forking its ranks); with fewer, or
// without CUDA, the case is a visible skip that says how many it needs and why none are there.
// Inputs are written to host shadows and uploaded, results downloaded before they are checked.
//
// A backend that is not built in (every rank's create() says NotFound) is a visible skip.
//
// Several hosts: TRIBUTARY_MULTIHOST_CONFORMANCE(name, HostsParam{...}, ...) runs the same matrix
// with the ranks spread over Linux network namespaces joined by a bridge, each namespace a "host"
// with its own host id; where namespaces cannot be made (not root, no iproute2) it is a skip that
// says why.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>

namespace tributary {
class CrossDeviceOps;
}  // namespace tributary

namespace tributary::testing {

// kCpu: rank r's replica k is CPU:k. kGpu: GPU:(r x local + k), a GPU of its own per replica.
// kGpuShared: GPU:k on every rank, processes sharing GPUs (backends that stage through host memory
// allow it; NCCL does not). kMixed: GPU:k where r + k is even, else CPU:k, so ranks with GPU and
// CPU replicas meet in one group, and a process may hold both.
// kCpuShareable: CPU:k; the buffers of all-reduces, all-gathers and broadcasts, and
// reduce-scatters' inputs, from Buffer::allocate_shareable; the outputs of the first three (and
// out-of-place all-reduces' and every reduce-scatter's inputs) registered (register_buffers)
// before the call and released after it; for ring on one host a registration over 16 KiB must
// take shared memory's direct path (every rank maps every rank's buffer), and so must each such
// call (reduce-scatters with one local replica per process).
enum class DeviceKind { kCpu, kGpu, kGpuShared, kMixed, kCpuShareable };
inline void PrintTo(DeviceKind kind, std::ostream* os) {
  *os << (kind == DeviceKind::kGpu           ? "GPU"
          : kind == DeviceKind::kGpuShared   ? "GPU shared"
          : kind == DeviceKind::kMixed       ? "mixed"
          : kind == DeviceKind::kCpuShareable ? "CPU shareable"
                                             : "CPU");
}

// spec, device kind, world size, local replicas per process
using MultiProcessParam = std::tuple<std::string, DeviceKind, int, int>;
class MultiProcessConformance : public ::testing::TestWithParam<MultiProcessParam> {};
std::string multiprocess_param_name(const ::testing::TestParamInfo<MultiProcessParam>& info);

// spec, hosts, processes per host, local replicas per process (CPU devices)
using HostsParam = std::tuple<std::string, int, int, int>;
class MultiHostConformance : public ::testing::TestWithParam<HostsParam> {};
std::string multihost_param_name(const ::testing::TestParamInfo<HostsParam>& info);
// A spec as a test name: "ucx:hierarchy=off" -> "ucx_hierarchy_off".
std::string identifier_for_test(const std::string& spec);

// Several hosts, a rank killed (SIGKILL) in the middle of all-reduces on another host than some
// survivors: every survivor fails within the timeout, naming the killed rank by its global number.
// The parameter is the spec; the layout is 2 hosts x 2 processes.
class MultiHostFaults : public ::testing::TestWithParam<std::string> {};

// The whole matrix on one rank's backend, for tests that make their backend by hand (a wrapper);
// every rank of the group calls it. Returns the number of failed checks (printed to stderr).
int run_conformance_matrix(CrossDeviceOps& ops, const std::string& spec);

// The matrix runs what a backend's capabilities() list and expects the rest refused, so it cannot
// see a backend that stops listing something. A backend's own test pins its set with this: the
// registered capabilities, and those of an instance made from `spec` in one process, cover CPU
// devices, every dtype, every op and every collective.
void expect_every_cpu_capability(const std::string& spec);

}  // namespace tributary::testing

#define TRIBUTARY_MULTIPROCESS_CONFORMANCE_ON_(name, spec, kind)                              \
  namespace tributary::testing {                                                              \
  INSTANTIATE_TEST_SUITE_P(name, MultiProcessConformance,                                     \
                           ::testing::Combine(::testing::Values(std::string(spec)),           \
                                              ::testing::Values(kind),                        \
                                              ::testing::Values(1, 2, 3, 4, 5),               \
                                              ::testing::Values(1, 2)),                       \
                           multiprocess_param_name);                                          \
  }                                                                                           \
  static_assert(true, "")

// Replicas on CPU devices.
#define TRIBUTARY_MULTIPROCESS_CONFORMANCE(name, spec) \
  TRIBUTARY_MULTIPROCESS_CONFORMANCE_ON_(name, spec, ::tributary::testing::DeviceKind::kCpu)
// Replicas on GPU devices (world x local of them).
#define TRIBUTARY_MULTIPROCESS_CONFORMANCE_GPU(name, spec) \
  TRIBUTARY_MULTIPROCESS_CONFORMANCE_ON_(name, spec, ::tributary::testing::DeviceKind::kGpu)
// Replicas on CPU devices, buffers shareable and all-reduce outputs registered; 2 to 4 processes.
#define TRIBUTARY_MULTIPROCESS_CONFORMANCE_SHAREABLE(name, spec)                                \
  namespace tributary::testing {                                                              \
  INSTANTIATE_TEST_SUITE_P(                                                                   \
      name, MultiProcessConformance,                                                          \
      ::testing::Combine(::testing::Values(std::string(spec)),                                \
                         ::testing::Values(DeviceKind::kCpuShareable),                        \
                         ::testing::Values(2, 3, 4), ::testing::Values(1, 2)),                \
      multiprocess_param_name);                                                               \
  }                                                                                           \
  static_assert(true, "")
// Host backends on GPU tensors (staged through host memory): processes sharing GPUs, and GPU and
// CPU replicas mixed (with 2 replicas a process holds both); 2 and 3 processes.
#define TRIBUTARY_MULTIPROCESS_CONFORMANCE_STAGED(name, spec)                                   \
  namespace tributary::testing {                                                              \
  INSTANTIATE_TEST_SUITE_P(                                                                   \
      name, MultiProcessConformance,                                                          \
      ::testing::Combine(::testing::Values(std::string(spec)),                                \
                         ::testing::Values(DeviceKind::kGpuShared, DeviceKind::kMixed),       \
                         ::testing::Values(2, 3), ::testing::Values(1, 2)),                   \
      multiprocess_param_name);                                                               \
  }                                                                                           \
  static_assert(true, "")

// Several hosts: one case per HostsParam given.
#define TRIBUTARY_MULTIHOST_CONFORMANCE(name, ...)                                         \
  namespace tributary::testing {                                                           \
  INSTANTIATE_TEST_SUITE_P(name, MultiHostConformance, ::testing::Values(__VA_ARGS__),     \
                           multihost_param_name);                                          \
  }                                                                                        \
  static_assert(true, "")

// Several hosts, a killed rank: one case per spec given.
#define TRIBUTARY_MULTIHOST_FAULTS(name, ...)                                                 \
  namespace tributary::testing {                                                           \
  INSTANTIATE_TEST_SUITE_P(name, MultiHostFaults, ::testing::Values(__VA_ARGS__),          \
                           [](const auto& info) { return identifier_for_test(info.param); }); \
  }                                                                                        \
  static_assert(true, "")
