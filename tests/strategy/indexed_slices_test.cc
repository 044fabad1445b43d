// IndexedSlices (sparse gradients): construction checks, the dense form, their reduction across
// replicas (TF's concatenation) and the scatter updates of variables with TF's rules, on the real
// in-process backends.
#include "tributary/strategy/indexed_slices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tributary/strategy/strategies.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace {

using testing::HasSubstr;
using VS = VariableSynchronization;
using VA = VariableAggregation;

// Rows `indices` of a [rows, width] float32 tensor; values row-major.
IndexedSlices slices(std::vector<int64_t> indices, std::vector<float> values, int64_t rows,
                     int64_t width = 2) {
  const auto n = static_cast<int64_t>(indices.size());
  auto v = Array::from_vector(values, Shape{n, width});
  auto i = Array::from_vector(indices);
  EXPECT_TRUE(v.ok() && i.ok());
  auto s = IndexedSlices::make(*v, *i, Shape{rows, width});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return *s;
}

std::vector<int64_t> indices_of(const IndexedSlices& s) {
  return cast(s.indices(), DType::kInt64).to_vector<int64_t>();
}
std::vector<double> values_of(const IndexedSlices& s) { return s.values().to_doubles(); }

std::unique_ptr<Strategy> mirrored(int n, const std::string& backend) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  auto s = make_mirrored_strategy({devices, backend, nullptr});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

Array matrix(std::vector<float> values, int64_t rows, int64_t width = 2) {
  return *Array::from_vector(values, Shape{rows, width});
}

TEST(IndexedSlicesTest, MakeChecksEveryPart) {
  const Array values = matrix({1, 2, 3, 4}, 2);
  const Array indices = *Array::from_vector(std::vector<int64_t>{0, 3});
  auto ok = IndexedSlices::make(values, indices, Shape{4, 2});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->num_rows(), 2);
  EXPECT_EQ(ok->dense_shape(), (Shape{4, 2}));
  EXPECT_THAT(ok->to_string(), HasSubstr("dense_shape=[4, 2]"));
  auto int32_indices =
      IndexedSlices::make(values, *Array::from_vector(std::vector<int32_t>{1, 2}), Shape{4, 2});
  EXPECT_TRUE(int32_indices.ok());

  auto float_indices =
      IndexedSlices::make(values, *Array::from_vector(std::vector<float>{0, 1}), Shape{4, 2});
  EXPECT_EQ(float_indices.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(float_indices.status().message(), HasSubstr("indices must be int32 or int64"));
  auto short_indices =
      IndexedSlices::make(values, *Array::from_vector(std::vector<int64_t>{0}), Shape{4, 2});
  EXPECT_THAT(short_indices.status().message(), HasSubstr("one entry per row of values"));
  auto other_width = IndexedSlices::make(values, indices, Shape{4, 3});
  EXPECT_THAT(other_width.status().message(), HasSubstr("does not fit values"));
  auto other_rank = IndexedSlices::make(values, indices, Shape{8});
  EXPECT_EQ(other_rank.status().code(), StatusCode::kInvalidArgument);
  auto negative_rows = IndexedSlices::make(values, indices, Shape{-1, 2});
  EXPECT_EQ(negative_rows.status().code(), StatusCode::kInvalidArgument);
  auto scalar_values = IndexedSlices::make(Array::scalar(1.0f),
                                           *Array::from_vector(std::vector<int64_t>{}), Shape{});
  EXPECT_THAT(scalar_values.status().message(), HasSubstr("rank >= 1"));
}

TEST(IndexedSlicesTest, IndicesAreReadAsIntegers) {
  auto huge = IndexedSlices::make(
      matrix({1, 2}, 1), *Array::from_vector(std::vector<int64_t>{INT64_MAX}), Shape{4, 2});
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(*huge->index_values(), std::vector<int64_t>{INT64_MAX});
  EXPECT_THAT(to_dense(*huge).status().message(),
              HasSubstr("indices[0] = 9223372036854775807 is not in [0, 4)"));
  auto v = *default_strategy().create_variable(matrix({0, 0}, 1), {"v"});
  EXPECT_THAT(v.scatter_add(*huge).message(), HasSubstr("indices[0] = 9223372036854775807"));
}

TEST(IndexedSlicesTest, ToDenseSumsRepeatedRowsAndRefusesOutOfRange) {
  auto dense = to_dense(slices({2, 0, 2}, {1, 2, 3, 4, 10, 20}, 3));
  ASSERT_TRUE(dense.ok()) << dense.status().to_string();
  EXPECT_EQ(dense->shape(), (Shape{3, 2}));
  EXPECT_EQ(dense->to_vector<float>(), (std::vector<float>{3, 4, 0, 0, 11, 22}));
  auto empty = to_dense(slices({}, {}, 2));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
  auto out = to_dense(slices({1, 5}, {1, 2, 3, 4}, 3));
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("indices[1] = 5 is not in [0, 3)"));
  auto negative = to_dense(slices({-1}, {1, 2}, 3));
  EXPECT_THAT(negative.status().message(), HasSubstr("indices[0] = -1 is not in [0, 3)"));
}

class SparseReduceTest : public ::testing::TestWithParam<std::string> {};

// TF's CrossDeviceOps reduce IndexedSlices by concatenation: the result holds every replica's
// rows, in replica order, and the replicas may hold different numbers of rows (none included).
TEST_P(SparseReduceTest, AllReduceConcatenatesEveryReplicasRowsInOrder) {
  auto s = mirrored(3, GetParam());
  const std::vector<IndexedSlices> mine = {slices({4, 1}, {1, 2, 3, 4}, 5), slices({}, {}, 5),
                                           slices({1}, {10, 20}, 5)};
  auto sum = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, mine[ctx.local_replica_id()]);
  });
  ASSERT_TRUE(sum.ok()) << sum.status().to_string();
  for (const IndexedSlices& r : *sum) {
    EXPECT_EQ(indices_of(r), (std::vector<int64_t>{4, 1, 1}));
    EXPECT_EQ(values_of(r), (std::vector<double>{1, 2, 3, 4, 10, 20}));
    EXPECT_EQ(r.dense_shape(), (Shape{5, 2}));
    EXPECT_EQ(r.dtype(), DType::kFloat32);
    // Its dense form is the sum of the replicas' dense forms.
    EXPECT_EQ(to_dense(r)->to_vector<float>(),
              (std::vector<float>{0, 0, 13, 24, 0, 0, 0, 0, 1, 2}));
  }
  auto mean = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kMean, mine[ctx.local_replica_id()]);
  });
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ((*mean)[2].dtype(), DType::kFloat32);
  EXPECT_THAT(
      values_of((*mean)[2]),
      testing::Pointwise(testing::DoubleNear(1e-6),
                         std::vector<double>{1.0 / 3, 2.0 / 3, 1, 4.0 / 3, 10.0 / 3, 20.0 / 3}));
  // Cross-replica reduce of a PerReplica, the same rule.
  auto scope = s->scope();
  ASSERT_TRUE(scope.ok());
  auto reduced = s->reduce(ReduceOp::kSum, PerReplica<IndexedSlices>(mine));
  ASSERT_TRUE(reduced.ok()) << reduced.status().to_string();
  EXPECT_EQ(indices_of(*reduced), (std::vector<int64_t>{4, 1, 1}));
  EXPECT_TRUE(reduced->values().device().is_cpu());
}

TEST_P(SparseReduceTest, IntegerMeanIsFloat64AndOnlySumAndMeanAreAccepted) {
  auto s = mirrored(2, GetParam());
  auto make_int = [](int64_t row, int32_t x) {
    return *IndexedSlices::make(
        *Array::from_vector(std::vector<int32_t>{x}, Shape{1, 1}),
        *Array::from_vector(std::vector<int32_t>{static_cast<int32_t>(row)}), Shape{4, 1});
  };
  auto mean = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kMean, make_int(ctx.local_replica_id(), 3));
  });
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ((*mean)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*mean)[0].indices().dtype(), DType::kInt32);
  EXPECT_EQ(values_of((*mean)[0]), (std::vector<double>{1.5, 1.5}));
  // TF's true division of 8-bit integers is float32.
  auto mean8 = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(
        ReduceOp::kMean,
        *IndexedSlices::make(*Array::from_vector(std::vector<int8_t>{3}, Shape{1, 1}),
                             *Array::from_vector(std::vector<int64_t>{ctx.local_replica_id()}),
                             Shape{2, 1}));
  });
  ASSERT_TRUE(mean8.ok()) << mean8.status().to_string();
  EXPECT_EQ((*mean8)[0].dtype(), DType::kFloat32);
  Status max = s->run([&](ReplicaContext& ctx) -> Status {
    return ctx.all_reduce(ReduceOp::kMax, make_int(0, 1)).status();
  });
  EXPECT_EQ(max.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(max.message(), HasSubstr("`reduce_op` must be Reduce.SUM or Reduce.MEAN"));
}

TEST_P(SparseReduceTest, ReplicasThatDisagreeFailAlike) {
  auto s = mirrored(2, GetParam());
  // Another dense_shape on replica 1.
  Status shape = s->run([&](ReplicaContext& ctx) -> Status {
    return ctx.all_reduce(ReduceOp::kSum, slices({0}, {1, 2}, ctx.local_replica_id() == 0 ? 4 : 6))
        .status();
  });
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.message(), HasSubstr("replica 1 has values float32, indices int64, "
                                         "dense_shape [6, 2] but replica 0 has values float32, "
                                         "indices int64, dense_shape [4, 2]"));
  // Another op on replica 1.
  Status op = s->run([&](ReplicaContext& ctx) -> Status {
    return ctx
        .all_reduce(ctx.local_replica_id() == 0 ? ReduceOp::kSum : ReduceOp::kMean,
                    slices({0}, {1, 2}, 4))
        .status();
  });
  EXPECT_THAT(op.message(), HasSubstr("replica 0 passed ReduceOp.SUM but replica 1 passed "
                                      "ReduceOp.MEAN"));
  // The strategy still works afterwards.
  auto again = s->run([&](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, slices({0}, {1, 2}, 4));
  });
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(indices_of((*again)[1]), (std::vector<int64_t>{0, 0}));
}

INSTANTIATE_TEST_SUITE_P(Backends, SparseReduceTest,
                         ::testing::Values("reduction_to_one_device", "hierarchical_copy", "ring"));

TEST(SparseReduceTest, OneReplicaGivesTheValueBack) {
  auto s = mirrored(1, "reduction_to_one_device");
  auto scope = s->scope();
  ASSERT_TRUE(scope.ok());
  auto mean = s->reduce(ReduceOp::kMean, PerReplica<IndexedSlices>({slices({1}, {4, 6}, 2)}));
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ(values_of(*mean), (std::vector<double>{4, 6}));  // TF's shortcut: no division
}

// --- scatter updates
// ------------------------------------------------------------------------------

std::vector<std::vector<float>> copies(const Variable& v) {
  std::vector<std::vector<float>> out;
  for (const Array& a : v.values()) out.push_back(a.to_vector<float>());
  return out;
}

TEST(ScatterTest, EveryKindOnAPlainVariable) {
  struct Case {
    Status (Variable::*method)(const IndexedSlices&);
    std::vector<float> after;
  };
  // Rows 2 and 0 (row 2 twice): start {1,2 | 3,4 | 5,6}, slices row2 (2,2), row0 (4,4), row2 (3,3).
  const std::vector<Case> cases = {
      {&Variable::scatter_add, {5, 6, 3, 4, 10, 11}},
      {&Variable::scatter_sub, {-3, -2, 3, 4, 0, 1}},
      {&Variable::scatter_mul, {4, 8, 3, 4, 30, 36}},
      {&Variable::scatter_div, {0.25f, 0.5f, 3, 4, 5.0f / 6, 1}},
      {&Variable::scatter_min, {1, 2, 3, 4, 2, 2}},
      {&Variable::scatter_max, {4, 4, 3, 4, 5, 6}},
      {&Variable::scatter_update, {4, 4, 3, 4, 3, 3}},  // the last of a repeated row stays
  };
  for (const Case& c : cases) {
    auto v = default_strategy().create_variable(matrix({1, 2, 3, 4, 5, 6}, 3));
    ASSERT_TRUE(v.ok());
    Status st = ((*v).*c.method)(slices({2, 0, 2}, {2, 2, 4, 4, 3, 3}, 3));
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(copies(*v)[0], c.after);
  }
}

// Integer variables update exactly, as TF's integer kernels: int64 beyond 2^53 (where a double
// loses the last bits), truncating division, and wrap-around of narrow types.
TEST(ScatterTest, IntegerVariablesUpdateExactly) {
  const int64_t big = (int64_t{1} << 53) + 1;
  auto v = default_strategy().create_variable(*Array::from_vector<int64_t>({big, -7}, {2, 1}));
  ASSERT_TRUE(v.ok());
  auto rows = [](std::vector<int64_t> at, std::vector<int64_t> values) {
    return *IndexedSlices::make(
        *Array::from_vector(values, {static_cast<int64_t>(values.size()), 1}),
        *Array::from_vector(at), {2, 1});
  };
  ASSERT_TRUE(v->scatter_add(rows({0}, {1})).ok());
  ASSERT_TRUE(v->scatter_div(rows({1}, {2})).ok());
  EXPECT_EQ(v->values()[0].to_vector<int64_t>(), (std::vector<int64_t>{big + 1, -3}));
  ASSERT_TRUE(v->scatter_mul(rows({0}, {3})).ok());
  EXPECT_EQ(v->values()[0].to_vector<int64_t>()[0], 3 * (big + 1));
  auto u = default_strategy().create_variable(*Array::from_vector<uint8_t>({250, 3}, {2, 1}));
  ASSERT_TRUE(u.ok());
  auto narrow = [](std::vector<int64_t> at, std::vector<uint8_t> values) {
    return *IndexedSlices::make(
        *Array::from_vector(values, {static_cast<int64_t>(values.size()), 1}),
        *Array::from_vector(at), {2, 1});
  };
  ASSERT_TRUE(u->scatter_add(narrow({0}, {10})).ok());
  ASSERT_TRUE(u->scatter_sub(narrow({1}, {5})).ok());
  EXPECT_EQ(u->values()[0].to_vector<uint8_t>(), (std::vector<uint8_t>{4, 254}));
}

TEST(ScatterTest, BadUpdatesChangeNothingAndSayWhy) {
  auto v = *default_strategy().create_variable(matrix({1, 2, 3, 4, 5, 6}, 3), {"table"});
  Status range = v.scatter_add(slices({0, 3}, {1, 1, 1, 1}, 3));
  EXPECT_EQ(range.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(range.message(), HasSubstr("scatter_add on variable 'table' (float32[3, 2]): "
                                         "indices[1] = 3 is not in [0, 3)"));
  Status width = v.scatter_add(slices({0}, {1, 1, 1}, 3, 3));
  EXPECT_THAT(width.message(), HasSubstr("Must have updates.shape = indices.shape + "
                                         "params.shape[1:] or updates.shape = [], got "
                                         "updates.shape [1, 3], indices.shape [1], params.shape "
                                         "[3, 2]"));
  auto doubles = IndexedSlices::make(*Array::from_vector(std::vector<double>{1, 1}, Shape{1, 2}),
                                     *Array::from_vector(std::vector<int64_t>{0}), Shape{3, 2});
  EXPECT_THAT(v.scatter_sub(*doubles).message(), HasSubstr("the dtypes must match"));
  EXPECT_EQ(copies(v)[0], (std::vector<float>{1, 2, 3, 4, 5, 6}));

  auto counts = *default_strategy().create_variable(
      *Array::from_vector(std::vector<int32_t>{6, 7}, Shape{2, 1}), {"counts"});
  auto by = [](std::vector<int32_t> divisors) {
    return *IndexedSlices::make(
        *Array::from_vector(divisors, Shape{static_cast<int64_t>(divisors.size()), 1}),
        *Array::from_vector(std::vector<int64_t>{0, 1}), Shape{2, 1});
  };
  EXPECT_THAT(counts.scatter_div(by({2, 0})).message(), HasSubstr("Integer division by zero"));
  EXPECT_EQ(counts.values()[0].to_vector<int32_t>(), (std::vector<int32_t>{6, 7}));
  ASSERT_TRUE(counts.scatter_div(by({4, -2})).ok());
  EXPECT_EQ(counts.values()[0].to_vector<int32_t>(), (std::vector<int32_t>{1, -3}));  // truncated

  auto scalar = *default_strategy().create_variable(Array::scalar(1.0f), {"s"});
  EXPECT_THAT(scalar.scatter_add(slices({0}, {1, 1}, 1)).message(),
              HasSubstr("params must be at least 1 dimensional"));
}

// TF's MirroredVariable in replica context: SUM/MEAN aggregate every replica's slices (here the
// gradients of an embedding lookup), NONE updates the replica's own copy, ONLY_FIRST_REPLICA
// applies replica 0's.
TEST(ScatterTest, MirroredVariablesFollowTheirAggregationInReplicaContext) {
  auto s = mirrored(2, "ring");
  auto make = [&](VA aggregation) {
    auto v = s->create_variable(matrix({0, 0, 0, 0, 0, 0}, 3), {"emb", VS::kOnWrite, aggregation});
    EXPECT_TRUE(v.ok()) << v.status().to_string();
    return *v;
  };
  // Replica 0 touches rows 0 and 2, replica 1 row 2.
  auto step = [&](Variable& v, Status (Variable::*method)(const IndexedSlices&)) {
    return s->run([&](ReplicaContext& ctx) {
      return ctx.local_replica_id() == 0 ? (v.*method)(slices({0, 2}, {1, 1, 2, 2}, 3))
                                         : (v.*method)(slices({2}, {10, 10}, 3));
    });
  };
  Variable sum = make(VA::kSum);
  ASSERT_TRUE(step(sum, &Variable::scatter_add).ok());
  EXPECT_EQ(copies(sum), (std::vector<std::vector<float>>(2, {1, 1, 0, 0, 12, 12})));
  Variable mean = make(VA::kMean);
  ASSERT_TRUE(step(mean, &Variable::scatter_sub).ok());
  EXPECT_EQ(copies(mean), (std::vector<std::vector<float>>(2, {-0.5f, -0.5f, 0, 0, -6, -6})));
  Variable none = make(VA::kNone);
  ASSERT_TRUE(step(none, &Variable::scatter_add).ok());
  EXPECT_EQ(copies(none),
            (std::vector<std::vector<float>>{{1, 1, 0, 0, 2, 2}, {0, 0, 0, 0, 10, 10}}));
  Variable first = make(VA::kOnlyFirstReplica);
  ASSERT_TRUE(step(first, &Variable::scatter_update).ok());
  EXPECT_EQ(copies(first), (std::vector<std::vector<float>>(2, {1, 1, 0, 0, 2, 2})));
  // Only replica 0's slices are applied, and looked at: replica 1's row 7, int32 indices and
  // other dense_shape do not matter (TF applies replica 0's value alone).
  Status discarded = s->run([&](ReplicaContext& ctx) {
    if (ctx.local_replica_id() == 0) return first.scatter_update(slices({1}, {5, 5}, 3));
    return first.scatter_update(*IndexedSlices::make(
        matrix({9, 9}, 1), *Array::from_vector(std::vector<int32_t>{7}), Shape{8, 2}));
  });
  ASSERT_TRUE(discarded.ok()) << discarded.to_string();
  EXPECT_EQ(copies(first), (std::vector<std::vector<float>>(2, {1, 1, 5, 5, 2, 2})));

  // scatter_min/max/update need NONE or ONLY_FIRST_REPLICA, in any context (TF's
  // NotImplementedError).
  Status refused = step(sum, &Variable::scatter_update);
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(refused.message(),
              HasSubstr("scatter_update is only supported for mirrored variable (variable created "
                        "within certain `tf.distribute.Strategy` scope) with NONE or "
                        "`ONLY_FIRST_REPLICA` aggregation, got: SUM."));
  {
    auto scope = s->scope();
    ASSERT_TRUE(scope.ok());
    EXPECT_EQ(sum.scatter_max(slices({0}, {5, 5}, 3)).code(), StatusCode::kUnimplemented);
    // Cross-replica context: applied to every copy.
    ASSERT_TRUE(sum.scatter_add(slices({1}, {7, 8}, 3)).ok());
  }
  EXPECT_EQ(copies(sum), (std::vector<std::vector<float>>(2, {1, 1, 7, 8, 12, 12})));

  // A replica whose update is refused leaves every copy as it was, and fails every replica.
  Status bad = s->run([&](ReplicaContext& ctx) {
    return sum.scatter_add(slices({ctx.local_replica_id() == 0 ? 0 : 9}, {1, 1}, 3));
  });
  EXPECT_THAT(bad.message(), HasSubstr("the slices gathered from every replica, in replica order"));
  EXPECT_THAT(bad.message(), HasSubstr("indices[1] = 9 is not in [0, 3)"));
  EXPECT_EQ(copies(sum), (std::vector<std::vector<float>>(2, {1, 1, 7, 8, 12, 12})));

  auto on_read = *s->create_variable(matrix({0, 0}, 1), {"acc", VS::kOnRead, VA::kSum});
  Status unsupported = s->run([&](ReplicaContext&) {
    return on_read.scatter_add(slices({0}, {1, 1}, 1));
  });
  EXPECT_EQ(unsupported.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(unsupported.message(),
              HasSubstr("Variables with `synchronization=ON_READ` doesn't support `scatter_add`"));
}

TEST(ScatterTest, CentralStorageAppliesTheAggregateOnce) {
  CentralStorageStrategyOptions o;
  o.compute_devices = {Device::cpu(0), Device::cpu(1)};
  auto s = make_central_storage_strategy(o);
  ASSERT_TRUE(s.ok());
  auto v = *(*s)->create_variable(matrix({0, 0, 0, 0}, 2), {"emb", VS::kOnWrite, VA::kSum});
  ASSERT_TRUE((*s)->run([&](ReplicaContext& ctx) {
                    return v.scatter_add(slices({ctx.local_replica_id()}, {1, 2}, 2));
                  })
                  .ok());
  EXPECT_EQ(copies(v), (std::vector<std::vector<float>>{{1, 2, 1, 2}}));
  auto none = *(*s)->create_variable(matrix({0, 0}, 1), {"n", VS::kOnWrite, VA::kNone});
  Status st = (*s)->run([&](ReplicaContext&) { return none.scatter_add(slices({0}, {1, 1}, 1)); });
  EXPECT_THAT(st.message(),
              HasSubstr("You must specify an aggregation method to update a variable in Replica "
                        "Context"));
}

}  // namespace
}  // namespace tributary
