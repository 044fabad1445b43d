#include "tests/conformance/conformance.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tests/conformance/device_buffers.h"
#include "tests/conformance/values.h"
#include "tributary/registry.h"

namespace tributary::conformance {
namespace {

double load(DType t, const void* p, int64_t i) { return dtype_load(t, p, i); }
void store(DType t, void* p, int64_t i, double v) { dtype_store(t, p, i, v); }

double epsilon(DType t) {
  switch (t) {
    case DType::kFloat32: return std::numeric_limits<float>::epsilon();
    case DType::kFloat64: return std::numeric_limits<double>::epsilon();
    case DType::kFloat16: return 1.0 / 1024;
    case DType::kBFloat16: return 1.0 / 128;
    default: return 0;
  }
}

struct Replicas {
  BackendContext ctx;
  std::shared_ptr<CrossDeviceOps> ops;
  std::string backend_spec;   // the spec without the device-kind prefix
  std::string device_kind;    // "CPU" or "GPU"
  std::string missing_gpus;   // set (and no backend made) when fewer GPUs than replicas are visible
  std::string skip_reason;
};

// `spec` is a backend spec (CPU devices) or kGpuSpecPrefix + a backend spec (GPU devices).
Replicas make_backend(const std::string& spec, int replicas) {
  Replicas r;
  const std::string_view gpu_prefix(kGpuSpecPrefix);
  const bool gpu = spec.starts_with(gpu_prefix);
  r.backend_spec = gpu ? spec.substr(gpu_prefix.size()) : spec;
  r.device_kind = gpu ? "GPU" : "CPU";
  if (gpu) {
    const int visible = cuda_device_count();
    if (visible < replicas) {
      r.missing_gpus = "needs " + std::to_string(replicas) + " GPUs; " + std::to_string(visible) +
                       " visible (TRIBUTARY_VIRTUAL_GPUS=N splits each GPU into N virtual ones)";
      return r;
    }
  }
  r.ctx.devices.clear();
  for (int i = 0; i < replicas; ++i) {
    r.ctx.devices.push_back(gpu ? Device::cuda(i) : Device::cpu(i));
  }
  // GPU backends are kept for the next case with the same spec and replica count while they stay
  // healthy: an NCCL communicator takes about half a second to tear down, which over thousands of
  // cases would dwarf the collectives under test. CPU backends are made fresh for every case.
  // (Never destroyed: the kept backends live until the process exits.)
  static auto& kept = *new std::map<std::pair<std::string, int>, std::shared_ptr<CrossDeviceOps>>();
  const auto key = std::make_pair(r.backend_spec, replicas);
  if (gpu) {
    auto it = kept.find(key);
    if (it != kept.end() && it->second->broken().ok()) {
      r.ops = it->second;
      return r;
    }
    kept.erase(key);
  }
  auto made = builtin_backends().create(r.backend_spec, r.ctx);
  if (!made.ok()) {
    r.skip_reason = made.status().to_string();
  } else {
    r.ops = std::move(made).value();
    if (gpu) kept[key] = r.ops;
  }
  return r;
}

// Writes the poison pattern to a host tensor (upload it before the collective).
void fill_poison(const Tensor& t) { std::memset(t.data(), 0x5a, t.nbytes()); }

#define SKIP_IF_UNAVAILABLE(r)                                                               \
  if (!(r).missing_gpus.empty()) {                                                           \
    GTEST_SKIP() << (r).missing_gpus;                                                        \
  }                                                                                          \
  if (!(r).ops) {                                                                            \
    GTEST_SKIP() << "backend '" << (r).backend_spec << "' not available here"                \
                 << ((r).device_kind == "GPU" ? " on GPU devices" : "") << ": "              \
                 << (r).skip_reason;                                                         \
  }

// Unsupported combinations must be refused with Unimplemented; the test then ends.
#define EXPECT_REFUSED_IF_UNSUPPORTED(r, collective, op, dtype, call)                            \
  if (!(r).ops->capabilities().supports(collective) ||                                       \
      !(r).ops->capabilities().supports(dtype) || !(r).ops->capabilities().supports(op)) {   \
    EXPECT_EQ((call).wait().code(), StatusCode::kUnimplemented);                              \
    return;                                                                                  \
  }

class Checker {
 public:
  Checker(DType t, const char* what) : t_(t), what_(what) {}
  void expect(const Tensor& out, int64_t i, double want, double tol, int replica) {
    double got = load(t_, out.data(), i);
    bool ok = tol == 0 ? (got == want || (std::isnan(got) && std::isnan(want)))
                       : std::fabs(got - want) <= tol;
    if (!ok && failures_++ < 5) {
      ADD_FAILURE() << what_ << ": replica " << replica << " element " << i << ": got " << got
                    << ", want " << want << " (tolerance " << tol << ")";
    }
  }
  ~Checker() {
    if (failures_ > 5) ADD_FAILURE() << what_ << ": " << failures_ << " wrong elements in all";
  }

 private:
  DType t_;
  const char* what_;
  int failures_ = 0;
};

}  // namespace

std::string reduce_param_name(const ::testing::TestParamInfo<ReduceParam>& info) {
  const auto& [spec, op, dtype, count, in_place, replicas] = info.param;
  return std::string(reduce_op_name(op)) + "_" + std::string(dtype_name(dtype)) + "_n" +
         std::to_string(count) + (in_place ? "_inplace" : "_outofplace") + "_r" +
         std::to_string(replicas);
}

std::string move_param_name(const ::testing::TestParamInfo<MoveParam>& info) {
  const auto& [spec, dtype, count, in_place, replicas] = info.param;
  return std::string(dtype_name(dtype)) + "_n" + std::to_string(count) +
         (in_place ? "_inplace" : "_outofplace") + "_r" + std::to_string(replicas);
}

TEST_P(ReduceConformance, AllReduceExact) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  DeviceBuffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      store(dtype, in.host(k).data(), i, exact_value(op, k, i));
    }
    fill_poison(out.host(k));
  }
  ASSERT_TRUE(in.upload());
  if (!in_place) {  // in place, `out` is not used
    ASSERT_TRUE(out.upload());
  }
  DeviceBuffers& dst_buffers = in_place ? in : out;
  const PerReplica<Tensor>& dst = dst_buffers.views;
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kAllReduce, op, dtype,
                                r.ops->all_reduce(op, in.views, dst));
  ASSERT_TRUE(r.ops->all_reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  ASSERT_TRUE(dst_buffers.download());
  Checker check(dtype, "all_reduce");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int64_t i = 0; i < count; ++i) {
    for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i);
    double want = reference(op, dtype, xs);
    for (int k = 0; k < replicas; ++k) check.expect(dst_buffers.host(k), i, want, 0, k);
  }
  if (!in_place) {  // inputs untouched
    ASSERT_TRUE(in.download());
    Checker inputs(dtype, "all_reduce input");
    for (int k = 0; k < replicas; ++k) {
      for (int64_t i = 0; i < count; ++i) {
        inputs.expect(in.host(k), i, exact_value(op, k, i), 0, k);
      }
    }
  }
}

TEST_P(ReduceConformance, AllReduceRandom) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  if (!r.ops->capabilities().supports(dtype) || !r.ops->capabilities().supports(op)) {
    GTEST_SKIP() << "refusal checked by AllReduceExact";
  }
  DeviceBuffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  std::mt19937 rng(static_cast<uint32_t>(count * 131 + replicas));
  std::uniform_real_distribution<double> real(op == ReduceOp::kProd ? 0.5 : -1.0, 1.0);
  std::uniform_int_distribution<int> small(0, 3);
  std::vector<std::vector<double>> xs(static_cast<size_t>(count),
                                      std::vector<double>(static_cast<size_t>(replicas)));
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      double v = dtype_is_floating(dtype) ? real(rng) : small(rng);
      store(dtype, in.host(k).data(), i, v);
      xs[static_cast<size_t>(i)][static_cast<size_t>(k)] = load(dtype, in.host(k).data(), i);
    }
  }
  ASSERT_TRUE(in.upload());
  DeviceBuffers& dst_buffers = in_place ? in : out;
  const PerReplica<Tensor>& dst = dst_buffers.views;
  ASSERT_TRUE(r.ops->all_reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  ASSERT_TRUE(dst_buffers.download());
  Checker check(dtype, "all_reduce (random)");
  const double eps = epsilon(dtype);
  for (int64_t i = 0; i < count; ++i) {
    const std::vector<double>& v = xs[static_cast<size_t>(i)];
    double want = reference(op, dtype, v);
    double magnitude = 1;
    for (double x : v) magnitude += std::fabs(x);
    // Sums round once per partial result; min/max are exact; products round per step.
    double tol = (op == ReduceOp::kMin || op == ReduceOp::kMax)
                     ? 0
                     : 2.0 * (replicas + 1) * eps * magnitude;
    for (int k = 0; k < replicas; ++k) check.expect(dst_buffers.host(k), i, want, tol, k);
  }
}

TEST_P(ReduceConformance, ReduceToDestinations) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  DeviceBuffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      store(dtype, in.host(k).data(), i, exact_value(op, k, i));
    }
    fill_poison(out.host(k));
  }
  ASSERT_TRUE(in.upload());
  if (!in_place) {  // in place, `out` is not used
    ASSERT_TRUE(out.upload());
  }
  // In place: the result lands in replica 0's own buffer; else in one fresh destination on the
  // last replica's device plus one on the first. dst_host holds the same tensors' host views.
  const size_t last = static_cast<size_t>(replicas - 1);
  Mirrored<Tensor> dst = in_place ? Mirrored<Tensor>{in[0]} : Mirrored<Tensor>{out[last], out[0]};
  std::vector<Tensor> dst_host = in_place ? std::vector<Tensor>{in.host(0)}
                                          : std::vector<Tensor>{out.host(last), out.host(0)};
  if (!in_place && replicas == 1) {
    dst = Mirrored<Tensor>{out[0]};
    dst_host = {out.host(0)};
  }
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kReduce, op, dtype,
                                r.ops->reduce(op, in.views, dst));
  ASSERT_TRUE(r.ops->reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  ASSERT_TRUE((in_place ? in : out).download());
  Checker check(dtype, "reduce");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int64_t i = 0; i < count; ++i) {
    for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i);
    double want = reference(op, dtype, xs);
    for (size_t d = 0; d < dst_host.size(); ++d) {
      check.expect(dst_host[d], i, want, 0, static_cast<int>(d));
    }
  }
}

TEST_P(ReduceConformance, BatchReduce) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  // Three tensors of different sizes per replica, one of them of another dtype when possible.
  const int64_t sizes[3] = {count, 5, count / 2 + 3};
  const DType second = dtype == DType::kFloat32 ? DType::kInt32 : DType::kFloat32;
  const DType types[3] = {dtype, dtype, second};
  std::vector<DeviceBuffers> ins, outs;
  for (int j = 0; j < 3; ++j) {
    ins.emplace_back(types[j], sizes[j], r.ctx.devices);
    outs.emplace_back(types[j], sizes[j], r.ctx.devices);
    for (int k = 0; k < replicas; ++k) {
      for (int64_t i = 0; i < sizes[j]; ++i) {
        store(types[j], ins[j].host(k).data(), i, exact_value(op, k, i + j));
      }
      fill_poison(outs[j].host(k));
    }
    ASSERT_TRUE(ins[j].upload());
    if (!in_place) {  // in place, `outs` are not used
      ASSERT_TRUE(outs[j].upload());
    }
  }
  std::vector<ReducePair> pairs;
  for (int j = 0; j < 3; ++j) {
    const PerReplica<Tensor>& d = in_place ? ins[j].views : outs[j].views;
    pairs.push_back(ReducePair{ins[j].views, Mirrored<Tensor>(d.values())});
  }
  const auto& caps = r.ops->capabilities();
  if (!caps.supports(Collective::kBatchReduce) || !caps.supports(op) || !caps.supports(dtype) ||
      !caps.supports(second)) {
    EXPECT_EQ(r.ops->batch_reduce(op, pairs).wait().code(), StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(r.ops->batch_reduce(op, pairs).wait(std::chrono::seconds(60)).ok());
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int j = 0; j < 3; ++j) {
    // pairs[j].destinations are these buffers' device tensors.
    const DeviceBuffers& dst_buffers = in_place ? ins[j] : outs[j];
    ASSERT_TRUE(dst_buffers.download());
    Checker check(types[j], "batch_reduce");
    for (int64_t i = 0; i < sizes[j]; ++i) {
      for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i + j);
      double want = reference(op, types[j], xs);
      for (int k = 0; k < replicas; ++k) check.expect(dst_buffers.host(k), i, want, 0, k);
    }
  }
}

TEST_P(ReduceConformance, ReduceScatter) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  const int64_t total = count * replicas;
  DeviceBuffers in(dtype, total, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < total; ++i) {
      store(dtype, in.host(k).data(), i, exact_value(op, k, i));
    }
    fill_poison(out.host(k));
  }
  ASSERT_TRUE(in.upload());
  if (!in_place) {  // in place, `out` is not used
    ASSERT_TRUE(out.upload());
  }
  // dst_host: the host views of dst's tensors.
  PerReplica<Tensor> dst = out.views;
  std::vector<Tensor> dst_host = out.hosts;
  if (in_place) {
    for (int k = 0; k < replicas; ++k) {
      dst[static_cast<size_t>(k)] = in[k].slice(k * count, count);
      dst_host[static_cast<size_t>(k)] = in.host(k).slice(k * count, count);
    }
  }
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kReduceScatter, op, dtype,
                                r.ops->reduce_scatter(op, in.views, dst));
  ASSERT_TRUE(r.ops->reduce_scatter(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  ASSERT_TRUE((in_place ? in : out).download());
  Checker check(dtype, "reduce_scatter");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      for (int j = 0; j < replicas; ++j) {
        xs[static_cast<size_t>(j)] = exact_value(op, j, k * count + i);
      }
      check.expect(dst_host[static_cast<size_t>(k)], i, reference(op, dtype, xs), 0, k);
    }
  }
}

TEST_P(MoveConformance, Broadcast) {
  const auto& [spec, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  DeviceBuffers out(dtype, count, r.ctx.devices);
  DeviceBuffers src_buf(dtype, count, {r.ctx.devices[0]});
  ASSERT_TRUE(src_buf.status.ok());
  Tensor src = in_place ? out[0] : src_buf[0];
  Tensor src_host = in_place ? out.host(0) : src_buf.host(0);
  for (int k = 0; k < replicas; ++k) fill_poison(out.host(k));
  for (int64_t i = 0; i < count; ++i) {
    store(dtype, src_host.data(), i, exact_value(ReduceOp::kMax, 3, i));
  }
  ASSERT_TRUE(out.upload());
  if (!in_place) {
    ASSERT_TRUE(src_buf.upload());
  }
  const auto& caps = r.ops->capabilities();
  if (!caps.supports(Collective::kBroadcast) || !caps.supports(dtype)) {
    EXPECT_EQ(r.ops->broadcast(src, Mirrored<Tensor>(out.views.values())).wait().code(),
              StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(r.ops->broadcast(src, Mirrored<Tensor>(out.views.values()))
                  .wait(std::chrono::seconds(60))
                  .ok());
  ASSERT_TRUE(out.download());
  Checker check(dtype, "broadcast");
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      check.expect(out.host(k), i, exact_value(ReduceOp::kMax, 3, i), 0, k);
    }
  }
}

TEST_P(MoveConformance, AllGather) {
  const auto& [spec, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  DeviceBuffers in(dtype, count, r.ctx.devices), out(dtype, count * replicas, r.ctx.devices);
  PerReplica<Tensor> src = in.views;
  for (int k = 0; k < replicas; ++k) {
    fill_poison(out.host(k));
    Tensor src_host = in.host(k);
    if (in_place) {
      src[static_cast<size_t>(k)] = out[k].slice(k * count, count);
      src_host = out.host(k).slice(k * count, count);
    }
    for (int64_t i = 0; i < count; ++i) {
      store(dtype, src_host.data(), i, exact_value(ReduceOp::kMax, k, i));
    }
  }
  if (!in_place) {
    ASSERT_TRUE(in.upload());
  }
  ASSERT_TRUE(out.upload());
  const auto& caps = r.ops->capabilities();
  if (!caps.supports(Collective::kAllGather) || !caps.supports(dtype)) {
    EXPECT_EQ(r.ops->all_gather(src, out.views).wait().code(), StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(r.ops->all_gather(src, out.views).wait(std::chrono::seconds(60)).ok());
  ASSERT_TRUE(out.download());
  Checker check(dtype, "all_gather");
  for (int k = 0; k < replicas; ++k) {
    for (int j = 0; j < replicas; ++j) {
      for (int64_t i = 0; i < count; ++i) {
        check.expect(out.host(k), j * count + i, exact_value(ReduceOp::kMax, j, i), 0, k);
      }
    }
  }
}

}  // namespace tributary::conformance
