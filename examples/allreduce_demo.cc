// allreduce_demo: all-reduces float32 tensors across N CPU replicas with a backend chosen by spec,
// checks the result and prints what it did.
//
//   allreduce_demo [-b|--backend SPEC] [-r|--replicas N] [--count ELEMENTS]
//                  [--op sum|mean|min|max|prod] [--iterations K]
// (CLI11: --replicas=4, -r4 and -r 4 are the same.)
// --iterations repeats the all-reduce K times (the inputs refilled each time) and checks the last;
// scripts/kill_trials.sh uses it to keep a job busy while it kills one of its ranks.
// Without --backend the spec comes from TRIBUTARY_CROSS_DEVICE_OPS (or a config file named by
// TRIBUTARY_CONFIG_FILE), else "auto".
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tributary/tributary.h"

using namespace tributary;

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "allreduce_demo: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec;
  int replicas = 4;
  long long count = 1 << 20;
  std::string op_text = "sum";
  long long iterations = 1;
  CLI::App app("All-reduces float32 tensors across CPU replicas with a backend chosen by spec, "
               "checks the result and prints what it did. Under tributary-run (or TF_CONFIG, "
               "torchrun, Slurm, Open MPI variables) every process takes part.",
               "allreduce_demo");
  app.add_option("-b,--backend", spec,
                 "backend spec (default: TRIBUTARY_CROSS_DEVICE_OPS, else auto)");
  app.add_option("-r,--replicas", replicas, "local CPU replicas")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--count", count, "float32 elements per replica")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--op", op_text, "sum, mean, min, max or prod")->capture_default_str();
  app.add_option("--iterations", iterations, "all-reduces to run; the last is checked")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto op = parse_reduce_op(op_text);
  if (!op.ok()) return fail(op.status().message());

  auto config = Config::load();
  if (!config.ok()) return fail(config.status().message());
  // The cluster (one process, or several under tributary-run / TF_CONFIG / torchrun variables).
  std::vector<Device> devices;
  for (int r = 0; r < replicas; ++r) devices.push_back(Device::cpu(r));
  // The spec is checked first, so that a bad one ends every process at once (a process that meets
  // it only when creating the backend ends alone, and the chief's end takes the rendezvous store
  // with it). Its timeout= bounds the rendezvous too.
  BackendRegistry registry = builtin_backends();
  if (Status s = registry.check(spec, *config); !s.ok()) return fail(s.message());
  auto context = make_backend_context(
      devices, *config, spec.empty() ? std::nullopt : spec_timeout({spec}));
  if (!context.ok()) return fail(context.status().message());
  BackendContext& ctx = *context;

  auto ops = spec.empty() ? registry.create_from_config(ctx) : registry.create(spec, ctx);
  if (!ops.ok()) return fail(ops.status().message());
  CrossDeviceOps& cdo = **ops;

  // Global replica g holds g + 1 everywhere, so every reduction has a known exact answer.
  std::vector<Buffer> buffers;
  PerReplica<Tensor> values;
  for (int r = 0; r < replicas; ++r) {
    auto b = Buffer::allocate(DType::kFloat32, Shape{count}, ctx.devices[r]);
    if (!b.ok()) return fail(b.status().message());
    values.values().push_back(b->tensor());
    buffers.push_back(std::move(b).value());
  }
  auto fill = [&] {
    for (int r = 0; r < replicas; ++r) {
      float* p = buffers[static_cast<size_t>(r)].data_as<float>();
      const int global = ctx.rank * replicas + r;
      for (long long i = 0; i < count; ++i) p[i] = static_cast<float>(global + 1);
    }
  };
  const int in_sync = cdo.num_replicas_in_sync();
  double n = in_sync;
  double expected = 0;
  switch (*op) {
    case ReduceOp::kSum: expected = n * (n + 1) / 2; break;
    case ReduceOp::kMean: expected = (n + 1) / 2; break;
    case ReduceOp::kMin: expected = 1; break;
    case ReduceOp::kMax: expected = n; break;
    case ReduceOp::kProd: {
      expected = 1;
      for (int r = 1; r <= in_sync; ++r) expected *= r;
      break;
    }
  }

  std::chrono::duration<double, std::micro> us{0};
  for (long long k = 0; k < iterations; ++k) {
    fill();
    auto start = std::chrono::steady_clock::now();
    Work work = cdo.all_reduce(*op, values, values);  // in place
    Status s = work.wait(std::chrono::duration_cast<std::chrono::milliseconds>(cdo.timeout()));
    us = std::chrono::steady_clock::now() - start;
    if (!s.ok()) return fail(s.to_string());
  }

  // Exact while every partial result is an integer float32 holds exactly (below 2^24); past that,
  // float32 rounds each addition, in an order that depends on the backend: allow n roundings.
  const double tolerance =
      std::fabs(expected) < 16777216.0 ? 0.0 : std::fabs(expected) * n * std::ldexp(1.0, -24);
  long long wrong = 0;
  for (const Buffer& b : buffers) {
    const float* p = b.data_as<float>();
    for (long long i = 0; i < count; ++i) wrong += std::fabs(p[i] - expected) > tolerance;
  }
  std::printf("backend:  %s\n", cdo.spec().c_str());
  std::printf("rank:     %d of %d process(es)\n", ctx.rank, ctx.world_size);
  std::printf("replicas: %d local (", replicas);
  for (int r = 0; r < replicas; ++r) std::printf("%s%s", r ? ", " : "", ctx.devices[r].to_string().c_str());
  std::printf("), %d in sync\n", in_sync);
  std::printf("all_reduce %s of %lld float32 (%s) per replica, in place: %.1f us\n",
              std::string(reduce_op_name(*op)).c_str(), count,
              format_size(static_cast<uint64_t>(count) * 4).c_str(), us.count());
  std::printf("result:   every element = %g on every replica: %s\n", expected,
              wrong == 0 ? "correct" : "WRONG");
  if (wrong != 0) return fail(std::to_string(wrong) + " wrong elements");
  return 0;
}
