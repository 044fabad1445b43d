// Strategy, ReplicaContext and the context rules (reference §4), against the real in-process
// backends (parameterised) and, for what the layer asks of its backend, a fake CrossDeviceOps.
#include "tributary/strategy/strategy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "tests/strategy/strategy_test_util.h"
#include "tributary/strategy/strategies.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace {

using testing::HasSubstr;

class MirroredTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Strategy> make(int replicas) {
    std::vector<Device> devices;
    for (int i = 0; i < replicas; ++i) devices.push_back(Device::cpu(i));
    auto s = make_mirrored_strategy({devices, GetParam(), nullptr});
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return std::move(*s);
  }
};

TEST_P(MirroredTest, RunCallsEveryReplicaOnItsOwnThreadWithItsContext) {
  auto s = make(3);
  EXPECT_EQ(s->num_replicas_in_sync(), 3);
  std::vector<std::thread::id> ids(3);
  auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<int> {
    ids[ctx.local_replica_id()] = std::this_thread::get_id();
    EXPECT_EQ(get_replica_context(), &ctx);
    EXPECT_FALSE(in_cross_replica_context());
    EXPECT_EQ(&get_strategy(), s.get());
    EXPECT_TRUE(has_strategy());
    EXPECT_EQ(ctx.num_replicas_in_sync(), 3);
    EXPECT_EQ(ctx.device(), Device::cpu(ctx.local_replica_id()));
    return ctx.replica_id_in_sync_group() * 10;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->values(), (std::vector<int>{0, 10, 20}));
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], std::this_thread::get_id());
  // The threads persist across run() calls.
  std::vector<std::thread::id> again(3);
  ASSERT_TRUE(s->run([&](ReplicaContext& ctx) {
                 again[ctx.local_replica_id()] = std::this_thread::get_id();
               }).ok());
  EXPECT_EQ(ids, again);
}

TEST_P(MirroredTest, RunUnwrapsPerReplicaArgumentsAndPassesOthersWhole) {
  auto s = make(2);
  PerReplica<int> per({5, 7});
  Mirrored<int> mirrored({1, 1});
  int plain = 100;
  auto r =
      s->run([](ReplicaContext&, int a, int b, int c) { return a + b + c; }, per, mirrored, plain);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->values(), (std::vector<int>{106, 108}));
}

TEST_P(MirroredTest, AllReduceSumAndMeanInReplicaContext) {
  auto s = make(3);
  auto r = s->run([](ReplicaContext& ctx) -> StatusOr<Array> {
    const double id = ctx.replica_id_in_sync_group();
    TRIBUTARY_ASSIGN_OR_RETURN(Array v, Array::from_vector<float>({float(id + 1), float(2 * id)}));
    TRIBUTARY_ASSIGN_OR_RETURN(Array sum, ctx.all_reduce(ReduceOp::kSum, v));
    TRIBUTARY_ASSIGN_OR_RETURN(Array mean, ctx.all_reduce(ReduceOp::kMean, v));
    return concat(std::vector<Array>{sum, mean}, 0);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Array& a : *r) EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{6, 6, 2, 2}));
}

TEST_P(MirroredTest, AllReduceOfSeveralValuesAtOnce) {
  auto s = make(2);
  auto r = s->run([](ReplicaContext& ctx) -> StatusOr<std::vector<Array>> {
    std::vector<Array> values = {Array::scalar<int32_t>(ctx.local_replica_id() + 1),
                                 *Array::from_vector<double>({1.5, -1})};
    return ctx.all_reduce(ReduceOp::kSum, values);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const auto& v : *r) {
    EXPECT_EQ(v[0].to_vector<int32_t>(), std::vector<int32_t>{3});
    EXPECT_EQ(v[1].to_vector<double>(), (std::vector<double>{3, -2}));
  }
}

TEST_P(MirroredTest, AllGatherAlongAnyAxisWithUnequalSizes) {
  auto s = make(2);
  auto r = s->run([](ReplicaContext& ctx) -> StatusOr<std::vector<Array>> {
    // replica 0: [[0,1]] (1x2); replica 1: [[10,11],[12,13]] (2x2)
    Array rows = ctx.local_replica_id() == 0 ? *Array::from_vector<float>({0, 1}, {1, 2})
                                             : *Array::from_vector<float>({10, 11, 12, 13}, {2, 2});
    TRIBUTARY_ASSIGN_OR_RETURN(Array g0, ctx.all_gather(rows, 0));
    // Axis 1: replica 0 has [2,1], replica 1 [2,2].
    Array cols = ctx.local_replica_id() == 0 ? *Array::from_vector<float>({0, 1}, {2, 1})
                                             : *Array::from_vector<float>({10, 11, 12, 13}, {2, 2});
    TRIBUTARY_ASSIGN_OR_RETURN(Array g1, ctx.all_gather(cols, 1));
    return std::vector<Array>{g0, g1};
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const auto& v : *r) {
    EXPECT_EQ(v[0].shape(), (Shape{3, 2}));
    EXPECT_EQ(v[0].to_vector<float>(), (std::vector<float>{0, 1, 10, 11, 12, 13}));
    EXPECT_EQ(v[1].shape(), (Shape{2, 3}));
    EXPECT_EQ(v[1].to_vector<float>(), (std::vector<float>{0, 10, 11, 1, 12, 13}));
  }
}

TEST_P(MirroredTest, ReduceAcrossReplicasAndAlongAxisWithPartialBatches) {
  auto s = make(2);
  // TF's docstring: per-replica batches of 4 and 2 rows; axis=0 MEAN uses the true count (6).
  PerReplica<Array> v({*Array::from_vector<float>({1, 2, 3, 4}, {4, 1}),
                       *Array::from_vector<float>({5, 6}, {2, 1})});
  auto mean = s->reduce(ReduceOp::kMean, v, 0);
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ(mean->to_vector<float>(), std::vector<float>{3.5f});
  auto sum = s->reduce(ReduceOp::kSum, v, 0);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->to_vector<float>(), std::vector<float>{21});
  // axis none: replica values reduced element-wise (shapes must match).
  PerReplica<Array> same({*Array::from_vector<float>({1, 2}), *Array::from_vector<float>({3, 5})});
  EXPECT_EQ(s->reduce(ReduceOp::kSum, same)->to_vector<float>(), (std::vector<float>{4, 7}));
  EXPECT_EQ(s->reduce(ReduceOp::kMean, same)->to_vector<float>(), (std::vector<float>{2, 3.5}));
  // An empty replica batch (a zero-size partial batch) counts zero rows.
  PerReplica<Array> empty(
      {*Array::from_vector<float>({2, 4}, {2, 1}), *Array::zeros(DType::kFloat32, {0, 1})});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, empty, 0)->to_vector<float>(), std::vector<float>{3});
  // An integer mean is a float64 (TF's truediv).
  PerReplica<Array> ints({*Array::from_vector<int32_t>({1, 2}), *Array::from_vector<int32_t>({4})});
  auto int_mean = s->reduce(ReduceOp::kMean, ints, 0);
  ASSERT_TRUE(int_mean.ok()) << int_mean.status().to_string();
  EXPECT_EQ(int_mean->dtype(), DType::kFloat64);
  EXPECT_EQ(int_mean->to_vector<double>(), std::vector<double>{7.0 / 3});
  // Errors
  auto bad_axis = s->reduce(ReduceOp::kSum, v, 2);
  EXPECT_THAT(bad_axis.status().message(),
              HasSubstr("`axis` = 2 out of range for `value` with rank 2"));
  auto wrong_count = s->reduce(ReduceOp::kSum, PerReplica<Array>({Array::scalar(1.0f)}));
  EXPECT_THAT(wrong_count.status().message(), HasSubstr("one value per local replica (2)"));
}

TEST_P(MirroredTest, ReduceOfANonDistributedValueFollowsTf) {
  auto s = make(2);
  Array x = *Array::from_vector<float>({1, 2});
  EXPECT_TRUE(s->reduce(ReduceOp::kMean, x)->equals(x));
  auto sum = s->reduce(ReduceOp::kSum, x);
  EXPECT_EQ(sum.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(sum.status().message(),
              HasSubstr("A non-DistributedValues value float32[2]{1, 2} cannot be reduced with the "
                        "given reduce op ReduceOp.SUM."));
  // TF's shortcut for zero; MIN and MAX of the same value on every replica are that value.
  Array zero = *Array::from_vector<float>({0, 0});
  EXPECT_TRUE(s->reduce(ReduceOp::kSum, zero)->equals(zero));
  EXPECT_TRUE(s->reduce(ReduceOp::kMax, x)->equals(x));
  EXPECT_EQ(s->reduce(ReduceOp::kProd, x).status().code(), StatusCode::kInvalidArgument);
  // Gathered, it is the one component there is, as it is (TF wraps it as one).
  EXPECT_TRUE(s->gather(x, 0)->equals(x));
  EXPECT_TRUE(s->gather(Array::scalar(5.0f), 0)->equals(Array::scalar(5.0f)));
}

TEST_P(MirroredTest, GatherConcatenatesInReplicaOrder) {
  auto s = make(3);
  PerReplica<Array> v({*Array::from_vector<int32_t>({0}, {1, 1}),
                       *Array::from_vector<int32_t>({1, 2}, {2, 1}),
                       *Array::from_vector<int32_t>({3}, {1, 1})});
  auto g = s->gather(v, 0);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->shape(), (Shape{4, 1}));
  EXPECT_EQ(g->to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3}));
  auto scalar =
      s->gather(PerReplica<Array>({Array::scalar(1), Array::scalar(2), Array::scalar(3)}), 0);
  EXPECT_THAT(scalar.status().message(), HasSubstr("non-zero rank"));
}

// merge_call takes a lambda as it is (no std::function spelled out), returning R, StatusOr<R> or
// Status.
TEST_P(MirroredTest, MergeCallTakesLambdas) {
  auto s = make(2);
  auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<int> {
    // R: a plain value.
    StatusOr<int> sum = ctx.merge_call(
        [](Strategy&, const PerReplica<int>& v) { return v[0] + v[1]; }, ctx.local_replica_id() + 1);
    if (!sum.ok()) return sum.status();
    // StatusOr<R>.
    StatusOr<std::string> joined = ctx.merge_call(
        [](Strategy&, const PerReplica<std::string>& v) -> StatusOr<std::string> {
          return v[0] + v[1];
        },
        std::string(1, static_cast<char>('a' + ctx.local_replica_id())));
    if (!joined.ok()) return joined.status();
    EXPECT_EQ(*joined, "ab");
    // Status only.
    Status st = ctx.merge_call([](Strategy&, const PerReplica<Array>& v) { return v.size() == 2
                                                                                  ? ok_status()
                                                                                  : internal_error("size"); },
                               Array::scalar(1.f));
    if (!st.ok()) return st;
    return *sum;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0], 3);
  EXPECT_EQ((*r)[1], 3);
  // A merge function's error fails the run on every replica.
  auto bad = s->run([&](ReplicaContext& ctx) -> Status {
    return ctx
        .merge_call([](Strategy&, const PerReplica<int>&) -> StatusOr<int> {
          return invalid_argument("merge says no");
        }, 0)
        .status();
  });
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("merge says no"));
}

TEST_P(MirroredTest, MergeCallRunsOnceInCrossReplicaContextWithEveryArgument) {
  auto s = make(3);
  std::atomic<int> calls{0};
  auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<int> {
    std::function<StatusOr<int>(Strategy&, const PerReplica<int>&)> merge =
        [&](Strategy& strategy, const PerReplica<int>& args) -> StatusOr<int> {
      ++calls;
      EXPECT_EQ(&strategy, s.get());
      EXPECT_TRUE(in_cross_replica_context());
      EXPECT_EQ(get_replica_context(), nullptr);
      // Cross-replica methods work here.
      EXPECT_TRUE(strategy.reduce(ReduceOp::kMean, Array::scalar(1.0f)).ok());
      int total = 0;
      for (int a : args) total += a;
      return total;
    };
    return ctx.merge_call(merge, ctx.local_replica_id() + 1);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(r->values(), (std::vector<int>{6, 6, 6}));
}

TEST_P(MirroredTest, CrossReplicaMethodsFromReplicaContextFailWithTfsMessage) {
  auto s = make(2);
  Status st = s->run([&](ReplicaContext& ctx) -> Status {
    PerReplica<Array> v({Array::scalar(1.0f), Array::scalar(2.0f)});
    auto reduced = ctx.strategy().reduce(ReduceOp::kSum, v);
    EXPECT_EQ(reduced.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(reduced.status().message(),
                HasSubstr("Method requires being in cross-replica context, use "
                          "get_replica_context().merge_call()"));
    auto gathered = ctx.strategy().gather(v, 0);
    EXPECT_THAT(gathered.status().message(),
                HasSubstr("tf.distribute.Strategy.gather method requires cross-replica context, "
                          "use get_replica_context().all_gather() instead"));
    auto nested = ctx.strategy().run([](ReplicaContext&) {});
    EXPECT_EQ(nested.code(), StatusCode::kFailedPrecondition);
    return ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST_P(MirroredTest, ReplicaCollectivesFromCrossReplicaContextFail) {
  auto s = make(2);
  ReplicaContext* leaked = nullptr;
  ASSERT_TRUE(s->run([&](ReplicaContext& ctx) {
                 if (ctx.local_replica_id() == 0) leaked = &ctx;
               }).ok());
  auto r = leaked->all_reduce(ReduceOp::kSum, Array::scalar(1.0f));
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("must be called in replica context"));
}

TEST_P(MirroredTest, ReplicasMakingDifferentNumbersOfCallsFailInsteadOfHanging) {
  auto s = make(3);
  Status st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 1) return ok_status();  // skips the all_reduce
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("Some replicas made a different number of "
                                      "replica_context().merge_call() calls"));
  EXPECT_THAT(st.message(), HasSubstr("replica 1 returned"));
  // The strategy stays usable.
  auto ok = s->run(
      [](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)); });
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)[2].to_vector<float>(), std::vector<float>{3});
}

TEST_P(MirroredTest, ReplicasMakingDifferentCallsAreTold) {
  auto s = make(2);
  Status st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 0)
      return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
    return ctx.all_gather(*Array::from_vector<float>({1}), 0).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(),
              HasSubstr("replica 0 called all_reduce but replica 1 called all_gather"));
}

TEST_P(MirroredTest, AFailureOnOneReplicaSurfacesAndReleasesTheOthers) {
  auto s = make(3);
  Status st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 2) return invalid_argument("bad batch on this replica");
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("replica 2: bad batch on this replica"));
  // An exception is converted, with the replica named.
  st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 0) throw std::runtime_error("boom");
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_THAT(st.message(), HasSubstr("replica 0 threw an exception: boom"));
}

TEST_P(MirroredTest, ScopesAndMixingStrategies) {
  auto a = make(2);
  auto b = make(2);
  EXPECT_EQ(&get_strategy(), &default_strategy());
  EXPECT_FALSE(has_strategy());
  EXPECT_NE(get_replica_context(), nullptr);  // the default replica context
  {
    auto scope = a->scope();
    ASSERT_TRUE(scope.ok());
    EXPECT_EQ(&get_strategy(), a.get());
    EXPECT_TRUE(in_cross_replica_context());
    {
      auto again = a->scope();  // re-entering the same strategy is counted
      ASSERT_TRUE(again.ok());
    }
    EXPECT_EQ(&get_strategy(), a.get());
    auto other = b->scope();
    EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(other.status().message(), HasSubstr("Must not nest tf.distribute.Strategy scopes"));
    PerReplica<Array> v({Array::scalar(1.0f), Array::scalar(2.0f)});
    auto mixed = b->reduce(ReduceOp::kSum, v);
    EXPECT_THAT(mixed.status().message(),
                HasSubstr("Mixing different tf.distribute.Strategy objects"));
    EXPECT_TRUE(a->reduce(ReduceOp::kSum, v).ok());
  }
  EXPECT_EQ(&get_strategy(), &default_strategy());
  // Strategy B's method inside strategy A's run.
  Status st = a->run([&](ReplicaContext&) -> Status {
    PerReplica<Array> v({Array::scalar(1.0f), Array::scalar(2.0f)});
    return b->reduce(ReduceOp::kSum, v).status();
  });
  EXPECT_THAT(st.message(), HasSubstr("Mixing different tf.distribute.Strategy objects"));
}

TEST_P(MirroredTest, DistributeValuesFromFunctionAndLocalResults) {
  auto s = make(2);
  auto v = s->distribute_values_from_function([](const ValueContext& ctx) -> StatusOr<Array> {
    return Array::scalar(
        static_cast<float>(ctx.replica_id_in_sync_group + 10 * ctx.num_replicas_in_sync));
  });
  ASSERT_TRUE(v.ok());
  auto local = s->local_results(*v);
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].to_vector<float>(), std::vector<float>{20});
  EXPECT_EQ(local[1].to_vector<float>(), std::vector<float>{21});
  EXPECT_EQ(local[1].device(), Device::cpu(1));
}

TEST_P(MirroredTest, BatchReduceToAndReduceToDevices) {
  auto s = make(2);
  std::vector<PerReplica<Array>> values = {
      PerReplica<Array>({Array::scalar(1.0f), Array::scalar(2.0f)}),
      PerReplica<Array>(
          {*Array::from_vector<int64_t>({1, 2}), *Array::from_vector<int64_t>({3, 4})})};
  auto r = s->batch_reduce_to(ReduceOp::kSum, values);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0][1].to_vector<float>(), std::vector<float>{3});
  EXPECT_EQ((*r)[1][0].to_vector<int64_t>(), (std::vector<int64_t>{4, 6}));
  auto to_host = s->reduce_to(ReduceOp::kMean, values[0], std::vector<Device>{Device::cpu(0)});
  ASSERT_TRUE(to_host.ok()) << to_host.status().to_string();
  ASSERT_EQ(to_host->size(), 1u);
  EXPECT_EQ((*to_host)[0].to_vector<float>(), std::vector<float>{1.5});
  // Destinations off the replica devices: reduced on the first replica's, then copied there.
  auto off =
      s->reduce_to(ReduceOp::kSum, values[1], std::vector<Device>{Device::cpu(5), Device::cpu(1)});
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  ASSERT_EQ(off->size(), 2u);
  EXPECT_EQ((*off)[0].device(), Device::cpu(5));
  EXPECT_EQ((*off)[1].device(), Device::cpu(1));
  EXPECT_EQ((*off)[1].to_vector<int64_t>(), (std::vector<int64_t>{4, 6}));
  auto none = s->reduce_to(ReduceOp::kSum, values[0], std::vector<Device>{});
  EXPECT_THAT(none.status().message(), HasSubstr("destinations can not be empty"));
}

// A PerReplica or Mirrored argument must have one component per local replica: run() refuses
// it before select_replica indexes a component that is not there.
TEST_P(MirroredTest, RunRefusesDistributedArgumentsOfTheWrongSize) {
  auto s = make(2);
  std::atomic<int> calls{0};
  auto fewer = s->run(
      [&](ReplicaContext&, int a) {
        ++calls;
        return a;
      },
      PerReplica<int>({5}));
  EXPECT_EQ(fewer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(fewer.status().message(),
              HasSubstr("argument 1 is a PerReplica of 1 component(s) but " + s->describe() +
                        " has 2 local replica(s)"));
  Status more = s->run(
      [&](ReplicaContext&, int, int) -> Status {
        ++calls;
        return ok_status();
      },
      7, Mirrored<int>({1, 2, 3}));
  EXPECT_EQ(more.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(more.message(), HasSubstr("argument 2 is a Mirrored of 3 component(s)"));
  auto arrays = s->run([&](ReplicaContext&, const Array& a) { return a; },
                       PerReplica<Array>({Array::scalar(1.0f)}));
  EXPECT_EQ(arrays.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls.load(), 0);  // no replica ran
  // The right size still runs.
  auto ok = s->run([](ReplicaContext&, int a) { return a; }, PerReplica<int>({5, 6}));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->values(), (std::vector<int>{5, 6}));
}

// TF runs threads[0].merge_fn: the merge function that runs is replica 0's whichever replica
// arrives last.
TEST_P(MirroredTest, MergeCallRunsReplicaZerosFunction) {
  auto s = make(3);
  for (int slow : {-1, 0, 1, 2}) {
    auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<std::string> {
      const int me = ctx.local_replica_id();
      // Replica 0 arrives first unless it is the slow one; the others arrive in turn.
      const int delay = me == slow ? 60 : (slow == -1 ? 20 * me : 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      const std::string tag = "merge_fn of replica " + std::to_string(me);
      return ctx.merge_call([&tag](Strategy&, const PerReplica<int>&) { return tag; }, me);
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (const std::string& got : *r) EXPECT_EQ(got, "merge_fn of replica 0") << "slow " << slow;
  }
}

// Replicas that make the same collective with different arguments fail, every one of them,
// instead of one replica's op or axis being used for all.
TEST_P(MirroredTest, ReplicasPassingDifferentOpsAxesOrShapesFailEveryReplica) {
  auto s = make(2);
  auto every_replica_fails = [&](const std::function<Status(ReplicaContext&)>& call,
                                 const std::string& expected) {
    std::vector<Status> seen(2);
    Status st = s->run([&](ReplicaContext& ctx) -> Status {
      seen[ctx.local_replica_id()] = call(ctx);
      return ok_status();
    });
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_THAT(st.message(), HasSubstr(expected));
    for (const Status& one : seen) {
      EXPECT_EQ(one.code(), StatusCode::kInvalidArgument) << one.to_string();
      EXPECT_THAT(one.message(), HasSubstr(expected));
    }
  };
  every_replica_fails(
      [](ReplicaContext& ctx) {
        const ReduceOp op = ctx.local_replica_id() == 0 ? ReduceOp::kSum : ReduceOp::kMax;
        return ctx.all_reduce(op, Array::scalar(float(ctx.local_replica_id() + 1))).status();
      },
      "all_reduce: replica 0 passed ReduceOp.SUM but replica 1 passed ReduceOp.MAX");
  every_replica_fails(
      [](ReplicaContext& ctx) {
        if (ctx.local_replica_id() == 0)
          return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
        return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0)).status();
      },
      "all_reduce: replica 1 has float64[] but replica 0 has float32[] (value 0)");
  every_replica_fails(
      [](ReplicaContext& ctx) {
        return ctx.all_gather(*Array::from_vector<float>({1, 2}, {1, 2}), ctx.local_replica_id())
            .status();
      },
      "all_gather: replica 0 passed axis 0 but replica 1 passed axis 1");
  // The strategy stays usable.
  auto ok = s->run(
      [](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kMax, Array::scalar(2.0f)); });
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
}

// TF's MEAN is a true division: an integer mean is a float64, with or without an axis, in
// cross-replica and replica context alike.
TEST_P(MirroredTest, IntegerMeanIsAFloat64) {
  auto s = make(2);
  PerReplica<Array> v({*Array::from_vector<int32_t>({1, 4}), *Array::from_vector<int32_t>({2, 7})});
  auto mean = s->reduce(ReduceOp::kMean, v);
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ(mean->dtype(), DType::kFloat64);
  EXPECT_EQ(mean->to_vector<double>(), (std::vector<double>{1.5, 5.5}));
  auto along = s->reduce(ReduceOp::kMean, v, 0);
  ASSERT_TRUE(along.ok()) << along.status().to_string();
  EXPECT_EQ(along->dtype(), DType::kFloat64);
  EXPECT_EQ(along->to_vector<double>(), std::vector<double>{3.5});
  // SUM keeps the dtype.
  EXPECT_EQ(s->reduce(ReduceOp::kSum, v)->to_vector<int32_t>(), (std::vector<int32_t>{3, 11}));
  auto r = s->run([](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kMean, Array::scalar<int64_t>(ctx.local_replica_id() + 1));
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (int i = 0; i < 2; ++i) {
    const Array& a = (*r)[static_cast<size_t>(i)];
    EXPECT_EQ(a.dtype(), DType::kFloat64);
    EXPECT_EQ(a.to_vector<double>(), std::vector<double>{1.5});
    EXPECT_EQ(a.device(), Device::cpu(i));
  }
}

// TF's reduce accepts axis < 0 (axis + rank); [-rank, rank) is the range.
TEST_P(MirroredTest, ReduceAcceptsNegativeAxes) {
  auto s = make(2);
  PerReplica<Array> v({*Array::from_vector<float>({1, 2, 3, 4}, {2, 2}),
                       *Array::from_vector<float>({5, 6}, {1, 2})});
  auto one = s->reduce(
      ReduceOp::kSum,
      PerReplica<Array>({*Array::from_vector<float>({1, 2}), *Array::from_vector<float>({3})}), -1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->to_vector<float>(), std::vector<float>{6});
  auto mean = s->reduce(ReduceOp::kMean, v, -2);  // axis 0: 3 rows in all
  ASSERT_TRUE(mean.ok()) << mean.status().to_string();
  EXPECT_EQ(mean->to_vector<float>(), (std::vector<float>{3, 4}));
  auto bad = s->reduce(ReduceOp::kSum, v, -3);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("`axis` = -3 out of range for `value` with rank 2"));
  // A value that is not distributed, too.
  Array x = *Array::from_vector<float>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(s->reduce(ReduceOp::kMean, x, -1)->to_vector<float>(), (std::vector<float>{1.5, 3.5}));
  EXPECT_THAT(s->reduce(ReduceOp::kMean, x, 2).status().message(),
              HasSubstr("`axis` = 2 out of range for `value` with rank 2"));
}

// scope() inside run() is TF's error: the running strategy's needs cross-replica context, another
// strategy's is mixing strategies.
TEST_P(MirroredTest, ScopeInsideRunIsRefusedAsTfRefusesIt) {
  auto a = make(2);
  auto b = make(2);
  Status st = a->run([&](ReplicaContext& ctx) -> Status {
    auto same = a->scope();
    EXPECT_EQ(same.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(same.status().message(),
                HasSubstr("Method requires being in cross-replica context, use "
                          "get_replica_context().merge_call()"));
    auto other = b->scope();
    EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(other.status().message(),
                HasSubstr("Mixing different tf.distribute.Strategy objects: " + b->describe() +
                          " is not " + a->describe()));
    auto default_scope = default_strategy().scope();
    EXPECT_THAT(default_scope.status().message(),
                HasSubstr("Must not nest tf.distribute.Strategy scopes."));
    // Nothing changed: still this replica's context.
    EXPECT_EQ(get_replica_context(), &ctx);
    EXPECT_EQ(&get_strategy(), a.get());
    return ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  // In a merge function (cross-replica context) the running strategy's scope is fine.
  auto merged = a->run([&](ReplicaContext& ctx) {
    return ctx.merge_call(
        [](Strategy& s, const PerReplica<int>&) { return s.scope().ok() ? 1 : 0; }, 0);
  });
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_EQ((*merged)[0], 1);
  EXPECT_FALSE(has_strategy());
}

// Two strategies of one class are told apart in messages.
TEST_P(MirroredTest, DescribeTellsInstancesApart) {
  auto a = make(2);
  auto b = make(2);
  EXPECT_NE(a->describe(), b->describe());
  EXPECT_EQ(b->instance(), a->instance() + 1);
  EXPECT_THAT(a->describe(), HasSubstr("MirroredStrategy#" + std::to_string(a->instance()) +
                                       "(devices=[CPU:0, CPU:1]"));
  auto scope = a->scope();
  ASSERT_TRUE(scope.ok());
  auto mixed =
      b->reduce(ReduceOp::kSum, PerReplica<Array>({Array::scalar(1.f), Array::scalar(2.f)}));
  EXPECT_THAT(mixed.status().message(),
              HasSubstr("Mixing different tf.distribute.Strategy objects: " + b->describe() +
                        " is not " + a->describe()));
}

INSTANTIATE_TEST_SUITE_P(InProcessBackends, MirroredTest,
                         ::testing::Values("reduction_to_one_device", "hierarchical_copy", "ring"),
                         [](const auto& info) { return info.param; });

std::unique_ptr<Strategy> mirrored_with_timeout(int n, const std::string& timeout) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  auto s = make_mirrored_strategy({devices, "reduction_to_one_device:timeout=" + timeout, nullptr});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

TEST(MeetingTest, ASlowMergeIsNotATimeoutButAMissingReplicaIs) {
  auto s = mirrored_with_timeout(2, "300ms");
  // Every replica arrives; the merge takes longer than the timeout: no false alarm.
  auto r = s->run([](ReplicaContext& ctx) {
    std::function<StatusOr<int>(Strategy&, const PerReplica<int>&)> slow =
        [](Strategy&, const PerReplica<int>&) -> StatusOr<int> {
      std::this_thread::sleep_for(std::chrono::milliseconds(900));
      return 7;
    };
    return ctx.merge_call(slow, 0);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->values(), (std::vector<int>{7, 7}));
  // Replica 1 is stuck elsewhere: replica 0 fails after the timeout, naming it.
  auto start = std::chrono::steady_clock::now();
  Status st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      return ok_status();
    }
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("replica(s) 1 did not reach all_reduce"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // And the strategy is usable again.
  auto again = s->run(
      [](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, Array::scalar(2.0f)); });
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ((*again)[1].to_vector<float>(), std::vector<float>{4});
}

TEST(MeetingTest, RunInsideAMergeFunctionIsRefused) {
  auto s = mirrored_with_timeout(2, "5s");
  Status nested;
  auto r = s->run([&](ReplicaContext& ctx) {
    std::function<StatusOr<int>(Strategy&, const PerReplica<int>&)> merge =
        [&](Strategy& strategy, const PerReplica<int>&) -> StatusOr<int> {
      nested = strategy.run([](ReplicaContext&) {});
      return 1;
    };
    return ctx.merge_call(merge, 0);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(nested.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(nested.message(),
              HasSubstr("run() was called from inside a function given to run() or merge_call()"));
  EXPECT_TRUE(s->run([](ReplicaContext&) {}).ok());
}

TEST(DefaultStrategyTest, PassThrough) {
  Strategy& d = default_strategy();
  EXPECT_EQ(d.num_replicas_in_sync(), 1);
  EXPECT_EQ(d.kind(), StrategyKind::kDefault);
  auto r = d.run([](ReplicaContext& ctx) -> StatusOr<Array> {
    EXPECT_EQ(ctx.replica_id_in_sync_group(), 0);
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(5.0f));
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].to_vector<float>(), std::vector<float>{5});
  // reduce returns its input (SUM allowed: one replica in sync).
  Array x = *Array::from_vector<float>({1, 2, 3});
  EXPECT_TRUE(d.reduce(ReduceOp::kSum, x)->equals(x));
  EXPECT_EQ(d.reduce(ReduceOp::kSum, x, 0)->to_vector<float>(), std::vector<float>{6});
  // Outside any scope, the default replica context accepts collectives directly.
  ReplicaContext* ctx = get_replica_context();
  ASSERT_NE(ctx, nullptr);
  auto direct = ctx->all_reduce(ReduceOp::kMean, Array::scalar(4.0f));
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();
  EXPECT_EQ(direct->to_vector<float>(), std::vector<float>{4});
}

TEST(OneDeviceStrategyTest, ReduceReturnsTheValueOrItsAxisReduction) {
  auto s = make_one_device_strategy(Device::cpu(0));
  ASSERT_TRUE(s.ok());
  // TF's docstring: t = range(10); reduce(SUM, t, axis=None) -> t; axis=0 -> 45.
  std::vector<int32_t> ten = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  Array t = *Array::from_vector(ten);
  auto none = (*s)->reduce(ReduceOp::kSum, PerReplica<Array>({t}));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->equals(t));
  EXPECT_EQ((*s)->reduce(ReduceOp::kSum, PerReplica<Array>({t}), 0)->to_vector<int32_t>(),
            std::vector<int32_t>{45});
  EXPECT_EQ((*s)->num_replicas_in_sync(), 1);
}

TEST(StrategyFactoryTest, BadDeviceListsAndBackends) {
  auto empty_dup = make_mirrored_strategy({{Device::cpu(0), Device::cpu(0)}, "", nullptr});
  EXPECT_THAT(empty_dup.status().message(),
              HasSubstr("No duplicates allowed in `devices` argument"));
  auto unknown =
      make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "no_such_backend", nullptr});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no_such_backend"));
  auto by_name = make_strategy("mirrorred", 2);
  EXPECT_THAT(by_name.status().message(),
              HasSubstr("unknown strategy 'mirrorred'; valid: default"));
  // TF's default choice on CPUs: reduction_to_one_device.
  auto m = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "", nullptr});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->cross_device_ops().name(), "reduction_to_one_device");
  EXPECT_THAT((*m)->describe(), HasSubstr("MirroredStrategy#"));
  EXPECT_THAT((*m)->describe(), HasSubstr("(devices=[CPU:0, CPU:1]"));
}

// TF: NCCL asked for where there is no GPU warns "Enabled NCCL communication but no GPUs
// detected/specified." and runs the CPU implementation (MultiWorkerMirroredStrategy: RING).
TEST(StrategyFactoryTest, NcclWithoutGpusWarnsAndFallsBack) {
  for (const char* asked : {"nccl", "NCCL"}) {
    MultiWorkerMirroredStrategyOptions o;
    o.devices = {Device::cpu(0)};
    o.communication.implementation = asked;
    o.config = Config::from_map({});  // one worker, no cluster
    ::testing::internal::CaptureStderr();
    auto s = make_multi_worker_mirrored_strategy(o);
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(s.ok()) << asked << ": " << s.status().to_string();
    EXPECT_EQ((*s)->cross_device_ops().name(), "ring") << asked;
    EXPECT_THAT(log, HasSubstr("Enabled NCCL communication but no GPUs detected/specified."));
    EXPECT_THAT(log, HasSubstr("MultiWorkerMirroredStrategy"));
  }
  // MirroredStrategy given an nccl spec (with options) on CPU devices: its CPU default.
  ::testing::internal::CaptureStderr();
  auto m = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "nccl:num_packs=2", nullptr});
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->cross_device_ops().name(), "reduction_to_one_device");
  EXPECT_THAT(log, HasSubstr("Enabled NCCL communication but no GPUs detected/specified. Using "
                             "'reduction_to_one_device' instead of 'nccl:num_packs=2'."));
  auto r = (*m)->reduce(ReduceOp::kSum,
                        PerReplica<Array>({Array::scalar(1.f), Array::scalar(2.f)}), std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->at(0), 3.0);
  // Any other spec is left alone: an unknown backend is still an error, not a fallback.
  auto bad = make_mirrored_strategy({{Device::cpu(0)}, "ncl", nullptr});
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
}

TEST(FakeBackendTest, BatchReduceToIsOneFusedBackendCall) {
  FakeBackend fake;
  auto s = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "fake", &fake.registry});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::vector<PerReplica<Array>> values(
      3, PerReplica<Array>({Array::scalar(1.0f), Array::scalar(2.0f)}));
  ASSERT_TRUE((*s)->batch_reduce_to(ReduceOp::kSum, values).ok());
  EXPECT_EQ(fake.log(), std::vector<std::string>{"batch_reduce sum x3"});
  // A replica-context all_reduce of two values is one meeting and one collective per value.
  fake.clear();
  ASSERT_TRUE((*s)->run([](ReplicaContext& ctx) {
                    std::vector<Array> v = {Array::scalar(1.0f), Array::scalar(2.0f)};
                    return ctx.all_reduce(ReduceOp::kMean, v).status();
                  })
                  .ok());
  EXPECT_EQ(fake.log(), (std::vector<std::string>{"all_reduce mean", "all_reduce mean"}));
}

TEST(FakeBackendTest, ABackendFailureReachesEveryReplica) {
  FakeBackend fake;
  auto s = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "fake", &fake.registry});
  ASSERT_TRUE(s.ok());
  fake.fail_next(unavailable("peer 3 is gone"));
  Status st = (*s)->run([](ReplicaContext& ctx) {
    return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
  });
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("peer 3 is gone"));
}

// TF's _DefaultDistributionContext pushes no context: inside the default strategy's scope the
// default replica context stays current, and another strategy may be entered and used.
TEST(DefaultStrategyTest, ItsScopeChangesNothing) {
  auto a = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "", nullptr});
  ASSERT_TRUE(a.ok());
  {
    auto d = default_strategy().scope();
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(get_replica_context(), default_strategy().default_replica_context());
    EXPECT_FALSE(in_cross_replica_context());
    EXPECT_FALSE(has_strategy());
    auto again = default_strategy().scope();
    EXPECT_TRUE(again.ok());
    PerReplica<Array> v({Array::scalar(1.0f), Array::scalar(2.0f)});
    auto reduced = (*a)->reduce(ReduceOp::kSum, v);
    ASSERT_TRUE(reduced.ok()) << reduced.status().to_string();
    EXPECT_EQ(reduced->to_vector<float>(), std::vector<float>{3});
    {
      auto inner = (*a)->scope();
      ASSERT_TRUE(inner.ok()) << inner.status().to_string();
      EXPECT_EQ(&get_strategy(), a->get());
      EXPECT_TRUE(in_cross_replica_context());
    }
    EXPECT_EQ(&get_strategy(), &default_strategy());
    EXPECT_FALSE(in_cross_replica_context());
  }
  // Inside another strategy's scope the default strategy's is TF's error.
  auto scope = (*a)->scope();
  ASSERT_TRUE(scope.ok());
  auto nested = default_strategy().scope();
  EXPECT_EQ(nested.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(nested.status().message(), HasSubstr("Must not nest tf.distribute.Strategy scopes."));
}

// There is one default strategy (TF forbids a second): make_strategy("default") is a handle on it.
TEST(DefaultStrategyTest, MakeStrategyDefaultIsAHandleOnTheOneDefaultStrategy) {
  auto d = make_strategy("default");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  Strategy& handle = **d;
  EXPECT_EQ(handle.kind(), StrategyKind::kDefault);
  EXPECT_EQ(handle.describe(), default_strategy().describe());
  {
    auto scope = handle.scope();
    ASSERT_TRUE(scope.ok());
    EXPECT_EQ(&get_strategy(), &default_strategy());
    auto r = default_strategy().reduce(ReduceOp::kSum, PerReplica<Array>({Array::scalar(1.0f)}));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    auto h = handle.reduce(ReduceOp::kSum, PerReplica<Array>({Array::scalar(1.0f)}));
    EXPECT_TRUE(h.ok()) << h.status().to_string();
  }
  auto ran = handle.run([&](ReplicaContext& ctx) {
    EXPECT_EQ(&ctx.strategy(), &default_strategy());
    EXPECT_EQ(&get_strategy(), &default_strategy());
    // The default strategy's method is this strategy's method: no "Mixing" error.
    return default_strategy().reduce(ReduceOp::kSum, Array::scalar(1.0f)).status().code();
  });
  ASSERT_TRUE(ran.ok()) << ran.status().to_string();
  EXPECT_EQ((*ran)[0], StatusCode::kFailedPrecondition);  // cross-replica method in replica context
  auto v = handle.create_variable(Array::scalar(1.0f));
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(&v->strategy(), &default_strategy());
}

TEST(OneDeviceStrategyTest, IntegerMeanReturnsTheValue) {
  // TF's OneDevice and default _reduce_to return the value itself (no division, no cast).
  auto s = make_one_device_strategy(Device::cpu(0));
  ASSERT_TRUE(s.ok());
  Array t = *Array::from_vector<int32_t>({1, 2});
  auto none = (*s)->reduce(ReduceOp::kMean, PerReplica<Array>({t}));
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_TRUE(none->equals(t));
  auto r = default_strategy().run(
      [&](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kMean, t); });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE((*r)[0].equals(t));
  // With an axis the mean is TF's true division.
  auto along = (*s)->reduce(ReduceOp::kMean, PerReplica<Array>({t}), -1);
  ASSERT_TRUE(along.ok()) << along.status().to_string();
  EXPECT_EQ(along->dtype(), DType::kFloat64);
  EXPECT_EQ(along->to_vector<double>(), std::vector<double>{1.5});
  // So does any strategy with one replica in sync: TF's CrossDeviceOps.reduce shortcut.
  MirroredStrategyOptions o;
  o.devices = {Device::cpu(0)};
  auto one = make_mirrored_strategy(o);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto m = (*one)->reduce(ReduceOp::kMean, PerReplica<Array>({t}));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->equals(t)) << dtype_name(m->dtype());
  auto mr = (*one)->run([&](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kMean, t); });
  ASSERT_TRUE(mr.ok()) << mr.status().to_string();
  EXPECT_TRUE((*mr)[0].equals(t));
}

// Only make_strategy("default") makes a handle: a Strategy built from StrategyParts of kind
// kDefault by hand is a strategy of its own, on its own devices.
TEST(DefaultStrategyTest, OnlyMakeStrategyMakesAHandle) {
  StrategyParts parts;
  parts.devices = {Device::cpu(1)};
  BackendContext context;
  context.devices = parts.devices;
  auto ops = builtin_backends().create("reduction_to_one_device", context);
  ASSERT_TRUE(ops.ok()) << ops.status().to_string();
  parts.cross_device_ops = std::move(*ops);
  Strategy own(std::move(parts));
  auto ran = own.run([](ReplicaContext& ctx) { return &ctx.strategy(); });
  ASSERT_TRUE(ran.ok()) << ran.status().to_string();
  EXPECT_EQ((*ran)[0], &own);
  EXPECT_EQ(own.worker_devices(), std::vector<Device>{Device::cpu(1)});
}

// run() ends with the first replica error in time (TF's Coordinator keeps the first
// request_stop), not the lowest-numbered failing replica's.
TEST(MeetingTest, RunReturnsTheFirstErrorInTime) {
  auto s = mirrored_with_timeout(3, "5s");
  Status st = s->run([](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return invalid_argument("replica zero's own error");
    }
    if (ctx.local_replica_id() == 2) return invalid_argument("replica two's own error");
    return ok_status();
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("replica 2: replica two's own error"));
}

}  // namespace
}  // namespace tributary
