#include "tests/conformance/conformance.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

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
  std::unique_ptr<CrossDeviceOps> ops;
  std::string skip_reason;
};

Replicas make_backend(const std::string& spec, int replicas) {
  Replicas r;
  r.ctx.devices.clear();
  for (int i = 0; i < replicas; ++i) r.ctx.devices.push_back(Device::cpu(i));
  auto made = builtin_backends().create(spec, r.ctx);
  if (!made.ok()) {
    r.skip_reason = made.status().to_string();
  } else {
    r.ops = std::move(made).value();
  }
  return r;
}

// Per-replica buffers of `count` elements.
struct Buffers {
  std::vector<Buffer> owned;
  PerReplica<Tensor> views;

  Buffers(DType t, int64_t count, const std::vector<Device>& devices) {
    for (const Device& d : devices) {
      auto b = Buffer::allocate(t, Shape{count}, d);
      EXPECT_TRUE(b.ok());
      views.values().push_back(b->tensor());
      owned.push_back(std::move(b).value());
    }
  }
  const Tensor& operator[](size_t i) const { return views[i]; }
};

void fill_poison(const Tensor& t) { std::memset(t.data(), 0x5a, t.nbytes()); }

#define SKIP_IF_UNAVAILABLE(r)                                                               \
  if (!(r).ops) {                                                                            \
    GTEST_SKIP() << "backend '" << spec << "' not available here: " << (r).skip_reason;      \
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
  Buffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) store(dtype, in[k].data(), i, exact_value(op, k, i));
    fill_poison(out[k]);
  }
  const PerReplica<Tensor>& dst = in_place ? in.views : out.views;
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kAllReduce, op, dtype,
                                r.ops->all_reduce(op, in.views, dst));
  ASSERT_TRUE(r.ops->all_reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  Checker check(dtype, "all_reduce");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int64_t i = 0; i < count; ++i) {
    for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i);
    double want = reference(op, dtype, xs);
    for (int k = 0; k < replicas; ++k) check.expect(dst[k], i, want, 0, k);
  }
  if (!in_place) {  // inputs untouched
    Checker inputs(dtype, "all_reduce input");
    for (int k = 0; k < replicas; ++k) {
      for (int64_t i = 0; i < count; ++i) inputs.expect(in[k], i, exact_value(op, k, i), 0, k);
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
  Buffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  std::mt19937 rng(static_cast<uint32_t>(count * 131 + replicas));
  std::uniform_real_distribution<double> real(op == ReduceOp::kProd ? 0.5 : -1.0, 1.0);
  std::uniform_int_distribution<int> small(0, 3);
  std::vector<std::vector<double>> xs(static_cast<size_t>(count),
                                      std::vector<double>(static_cast<size_t>(replicas)));
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      double v = dtype_is_floating(dtype) ? real(rng) : small(rng);
      store(dtype, in[k].data(), i, v);
      xs[static_cast<size_t>(i)][static_cast<size_t>(k)] = load(dtype, in[k].data(), i);
    }
  }
  const PerReplica<Tensor>& dst = in_place ? in.views : out.views;
  ASSERT_TRUE(r.ops->all_reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
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
    for (int k = 0; k < replicas; ++k) check.expect(dst[k], i, want, tol, k);
  }
}

TEST_P(ReduceConformance, ReduceToDestinations) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  Buffers in(dtype, count, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) store(dtype, in[k].data(), i, exact_value(op, k, i));
    fill_poison(out[k]);
  }
  // In place: the result lands in replica 0's own buffer; else in one fresh destination on the
  // last replica's device plus one on the first.
  Mirrored<Tensor> dst = in_place ? Mirrored<Tensor>{in[0]}
                                  : Mirrored<Tensor>{out[static_cast<size_t>(replicas - 1)], out[0]};
  if (!in_place && replicas == 1) dst = Mirrored<Tensor>{out[0]};
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kReduce, op, dtype,
                                r.ops->reduce(op, in.views, dst));
  ASSERT_TRUE(r.ops->reduce(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  Checker check(dtype, "reduce");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int64_t i = 0; i < count; ++i) {
    for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i);
    double want = reference(op, dtype, xs);
    for (size_t d = 0; d < dst.size(); ++d) check.expect(dst[d], i, want, 0, static_cast<int>(d));
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
  std::vector<Buffers> ins, outs;
  for (int j = 0; j < 3; ++j) {
    ins.emplace_back(types[j], sizes[j], r.ctx.devices);
    outs.emplace_back(types[j], sizes[j], r.ctx.devices);
    for (int k = 0; k < replicas; ++k) {
      for (int64_t i = 0; i < sizes[j]; ++i) {
        store(types[j], ins[j][k].data(), i, exact_value(op, k, i + j));
      }
      fill_poison(outs[j][k]);
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
    Checker check(types[j], "batch_reduce");
    for (int64_t i = 0; i < sizes[j]; ++i) {
      for (int k = 0; k < replicas; ++k) xs[static_cast<size_t>(k)] = exact_value(op, k, i + j);
      double want = reference(op, types[j], xs);
      for (int k = 0; k < replicas; ++k) check.expect(pairs[j].destinations[k], i, want, 0, k);
    }
  }
}

TEST_P(ReduceConformance, ReduceScatter) {
  const auto& [spec, op, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  const int64_t total = count * replicas;
  Buffers in(dtype, total, r.ctx.devices), out(dtype, count, r.ctx.devices);
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < total; ++i) store(dtype, in[k].data(), i, exact_value(op, k, i));
    fill_poison(out[k]);
  }
  PerReplica<Tensor> dst = out.views;
  if (in_place) {
    for (int k = 0; k < replicas; ++k) dst[static_cast<size_t>(k)] = in[k].slice(k * count, count);
  }
  EXPECT_REFUSED_IF_UNSUPPORTED(r, Collective::kReduceScatter, op, dtype,
                                r.ops->reduce_scatter(op, in.views, dst));
  ASSERT_TRUE(r.ops->reduce_scatter(op, in.views, dst).wait(std::chrono::seconds(60)).ok());
  Checker check(dtype, "reduce_scatter");
  std::vector<double> xs(static_cast<size_t>(replicas));
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      for (int j = 0; j < replicas; ++j) {
        xs[static_cast<size_t>(j)] = exact_value(op, j, k * count + i);
      }
      check.expect(dst[static_cast<size_t>(k)], i, reference(op, dtype, xs), 0, k);
    }
  }
}

TEST_P(MoveConformance, Broadcast) {
  const auto& [spec, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  Buffers out(dtype, count, r.ctx.devices);
  auto src_buf = Buffer::allocate(dtype, Shape{count}, r.ctx.devices[0]);
  ASSERT_TRUE(src_buf.ok());
  Tensor src = in_place ? out[0] : src_buf->tensor();
  for (int k = 0; k < replicas; ++k) fill_poison(out[k]);
  for (int64_t i = 0; i < count; ++i) store(dtype, src.data(), i, exact_value(ReduceOp::kMax, 3, i));
  const auto& caps = r.ops->capabilities();
  if (!caps.supports(Collective::kBroadcast) || !caps.supports(dtype)) {
    EXPECT_EQ(r.ops->broadcast(src, Mirrored<Tensor>(out.views.values())).wait().code(),
              StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(r.ops->broadcast(src, Mirrored<Tensor>(out.views.values()))
                  .wait(std::chrono::seconds(60))
                  .ok());
  Checker check(dtype, "broadcast");
  for (int k = 0; k < replicas; ++k) {
    for (int64_t i = 0; i < count; ++i) {
      check.expect(out[k], i, exact_value(ReduceOp::kMax, 3, i), 0, k);
    }
  }
}

TEST_P(MoveConformance, AllGather) {
  const auto& [spec, dtype, count, in_place, replicas] = GetParam();
  Replicas r = make_backend(spec, replicas);
  SKIP_IF_UNAVAILABLE(r);
  Buffers in(dtype, count, r.ctx.devices), out(dtype, count * replicas, r.ctx.devices);
  PerReplica<Tensor> src = in.views;
  for (int k = 0; k < replicas; ++k) {
    fill_poison(out[k]);
    if (in_place) src[static_cast<size_t>(k)] = out[k].slice(k * count, count);
    for (int64_t i = 0; i < count; ++i) {
      store(dtype, src[static_cast<size_t>(k)].data(), i, exact_value(ReduceOp::kMax, k, i));
    }
  }
  const auto& caps = r.ops->capabilities();
  if (!caps.supports(Collective::kAllGather) || !caps.supports(dtype)) {
    EXPECT_EQ(r.ops->all_gather(src, out.views).wait().code(), StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(r.ops->all_gather(src, out.views).wait(std::chrono::seconds(60)).ok());
  Checker check(dtype, "all_gather");
  for (int k = 0; k < replicas; ++k) {
    for (int j = 0; j < replicas; ++j) {
      for (int64_t i = 0; i < count; ++i) {
        check.expect(out[k], j * count + i, exact_value(ReduceOp::kMax, j, i), 0, k);
      }
    }
  }
}

}  // namespace tributary::conformance
