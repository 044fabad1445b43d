// Variables (reference §5): creation checks, the ON_WRITE/ON_READ update matrix of §5.5, reads in
// each context, extended.update, all-or-nothing updates, and checkpoints.
#include "tributary/strategy/variable.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "strategy/checkpoint_format.h"
#include "tributary/strategy/strategies.h"

namespace tributary {
namespace {

using testing::HasSubstr;
using VS = VariableSynchronization;
using VA = VariableAggregation;

std::unique_ptr<Strategy> mirrored(int n, std::string backend = "reduction_to_one_device") {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  auto s = make_mirrored_strategy({devices, std::move(backend), nullptr});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

float scalar_of(const Array& a) { return a.to_vector<float>().at(0); }

std::vector<float> components(const Variable& v) {
  std::vector<float> out;
  for (const Array& a : v.values()) out.push_back(scalar_of(a));
  return out;
}

struct MatrixCase {
  VS sync;
  VA aggregation;
  std::vector<float> after;                 // per-component values
  std::optional<float> cross_replica_read;  // nullopt = error
};

// Reference §5.5: 2 replicas, initial 0.0, replica r calls assign_add(r + 1) in replica context.
class UpdateMatrixTest : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(UpdateMatrixTest, AssignAddInReplicaContext) {
  const MatrixCase& c = GetParam();
  auto s = mirrored(2);
  auto v = s->create_variable(Array::scalar(0.0f), {"v", c.sync, c.aggregation});
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  Status st = s->run([&](ReplicaContext& ctx) {
    return v->assign_add(Array::scalar(static_cast<float>(ctx.local_replica_id() + 1)));
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(components(*v), c.after);
  auto read = v->read();
  if (c.cross_replica_read) {
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(scalar_of(*read), *c.cross_replica_read);
  } else {
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(),
                HasSubstr("Could not convert from `tf.VariableAggregation` NONE "
                          "to`tf.distribute.ReduceOp` type"));
  }
  // In replica context every replica reads its own copy.
  auto local = s->run([&](ReplicaContext&) { return v->read(); });
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(scalar_of((*local)[0]), c.after[0]);
  EXPECT_EQ(scalar_of((*local)[1]), c.after[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Reference55, UpdateMatrixTest,
    ::testing::Values(MatrixCase{VS::kOnWrite, VA::kNone, {1, 2}, 1.0f},
                      MatrixCase{VS::kAuto, VA::kSum, {3, 3}, 3.0f},
                      MatrixCase{VS::kOnWrite, VA::kMean, {1.5, 1.5}, 1.5f},
                      MatrixCase{VS::kOnWrite, VA::kOnlyFirstReplica, {1, 1}, 1.0f},
                      MatrixCase{VS::kOnRead, VA::kSum, {1, 2}, 3.0f},
                      MatrixCase{VS::kOnRead, VA::kMean, {1, 2}, 1.5f},
                      MatrixCase{VS::kOnRead, VA::kOnlyFirstReplica, {1, 2}, 1.0f},
                      MatrixCase{VS::kOnRead, VA::kNone, {1, 2}, std::nullopt}));

TEST(VariableTest, CreationChecksAndInitialValuesOnEveryReplica) {
  auto s = mirrored(3);
  auto none = s->create_variable(Array::scalar(1.0f), {"w", VS::kNone, VA::kNone});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(),
              HasSubstr("`NONE` variable synchronization mode is not supported with tf.distribute "
                        "strategy. Please change the `synchronization` for variable: w"));
  auto mean_int = s->create_variable(Array::scalar<int32_t>(1), {"steps", VS::kOnWrite, VA::kMean});
  EXPECT_THAT(mean_int.status().message(),
              HasSubstr("creating distributed tf.Variable with aggregation=MEAN and a non-floating "
                        "dtype is not supported"));
  auto v = s->create_variable(*Array::from_vector<float>({1, 2}), {"w"});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->synchronization(), VS::kOnWrite);  // AUTO
  ASSERT_EQ(v->values().size(), 3u);
  for (const Array& a : v->values()) EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(v->devices(), (std::vector<Device>{Device::cpu(0), Device::cpu(1), Device::cpu(2)}));
  // Not from replica context.
  Status st =
      s->run([&](ReplicaContext&) { return s->create_variable(Array::scalar(0.0f)).status(); });
  EXPECT_THAT(st.message(), HasSubstr("Method requires being in cross-replica context"));
}

TEST(VariableTest, CrossReplicaAssignRules) {
  auto s = mirrored(2);
  auto on_write = *s->create_variable(Array::scalar(1.0f), {"a", VS::kOnWrite, VA::kSum});
  ASSERT_TRUE(on_write.assign_add(Array::scalar(2.0f)).ok());
  EXPECT_EQ(components(on_write), (std::vector<float>{3, 3}));
  // ON_READ SUM: assign(x) gives each copy x / N, so the aggregated read is x.
  auto sum = *s->create_variable(Array::scalar(0.0f), {"s", VS::kOnRead, VA::kSum});
  ASSERT_TRUE(sum.assign(Array::scalar(8.0f)).ok());
  EXPECT_EQ(components(sum), (std::vector<float>{4, 4}));
  EXPECT_EQ(scalar_of(*sum.read()), 8.0f);
  Status add = sum.assign_add(Array::scalar(1.0f));
  EXPECT_EQ(add.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(add.message(), HasSubstr("SyncOnReadVariable does not support `assign_add` in "
                                       "cross-replica context when aggregation is set to "
                                       "`tf.VariableAggregation.SUM`."));
  EXPECT_THAT(sum.assign_sub(Array::scalar(1.0f)).message(), HasSubstr("`assign_sub`"));
  EXPECT_EQ(components(sum), (std::vector<float>{4, 4}));  // untouched
  // ON_READ MEAN: assign_add applies to every copy.
  auto mean = *s->create_variable(Array::scalar(1.0f), {"m", VS::kOnRead, VA::kMean});
  ASSERT_TRUE(mean.assign_add(Array::scalar(1.0f)).ok());
  EXPECT_EQ(components(mean), (std::vector<float>{2, 2}));
  // dtype/shape mismatches change nothing.
  Status bad = on_write.assign(*Array::from_vector<float>({1, 2}));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("variable 'a'"));
  EXPECT_EQ(components(on_write), (std::vector<float>{3, 3}));
}

// TF's variable_sync_on_read_context() docstring: ON_READ SUM, 1.0 per replica on 2 replicas: the
// replica reads 1 (its copy) outside the context and 2 (the sum) inside it.
TEST(VariableTest, SyncOnReadContextReadsTheAggregateInReplicaContext) {
  auto s = mirrored(2);
  auto sum = *s->create_variable(Array::scalar(0.0f), {"sum", VS::kOnRead, VA::kSum});
  auto mean = *s->create_variable(Array::scalar(0.0f), {"mean", VS::kOnRead, VA::kMean});
  auto first = *s->create_variable(Array::scalar(0.0f), {"first", VS::kOnRead, VA::kOnlyFirstReplica});
  auto none = *s->create_variable(Array::scalar(0.0f), {"none", VS::kOnRead, VA::kNone});
  auto on_write = *s->create_variable(Array::scalar(5.0f), {"w", VS::kOnWrite, VA::kSum});
  auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<std::vector<float>> {
    const float mine = 1.0f + 2.0f * static_cast<float>(ctx.local_replica_id());  // 1, 3
    for (Variable* v : {&sum, &mean, &first}) {
      TRIBUTARY_RETURN_IF_ERROR(v->assign(Array::scalar(mine)));
    }
    std::vector<float> out;
    TRIBUTARY_ASSIGN_OR_RETURN(Array own, sum.read());
    out.push_back(scalar_of(own));
    EXPECT_FALSE(in_variable_sync_on_read_context());
    {
      auto sync = variable_sync_on_read_context();
      EXPECT_TRUE(in_variable_sync_on_read_context());
      for (Variable* v : {&sum, &mean, &first, &on_write}) {
        TRIBUTARY_ASSIGN_OR_RETURN(Array a, v->read());
        out.push_back(scalar_of(a));
      }
      StatusOr<Array> bad = none.read();
      EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(bad.status().message(), HasSubstr("variable_sync_on_read_context()"));
    }
    EXPECT_FALSE(in_variable_sync_on_read_context());
    TRIBUTARY_ASSIGN_OR_RETURN(Array after, sum.read());
    out.push_back(scalar_of(after));
    return out;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // own copy, SUM, MEAN, ONLY_FIRST_REPLICA, ON_WRITE (its copy, unchanged), own copy again.
  EXPECT_EQ((*r)[0], (std::vector<float>{1, 4, 2, 1, 5, 1}));
  EXPECT_EQ((*r)[1], (std::vector<float>{3, 4, 2, 1, 5, 3}));
  // Nothing changed the copies.
  EXPECT_EQ(components(sum), (std::vector<float>{1, 3}));
}

TEST(VariableTest, AReplicaThatSkipsASynchronizedUpdateLeavesEveryCopyUnchanged) {
  auto s = mirrored(2);
  auto v = *s->create_variable(Array::scalar(5.0f), {"v", VS::kOnWrite, VA::kSum});
  Status st = s->run([&](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 1) return invalid_argument("no gradient on this replica");
    return v.assign_add(Array::scalar(1.0f));
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("replica 1: no gradient on this replica"));
  EXPECT_EQ(components(v), (std::vector<float>{5, 5}));
  // A wrong shape on one replica is caught before the meeting; the other replica is released.
  st = s->run([&](ReplicaContext& ctx) -> Status {
    if (ctx.local_replica_id() == 0) return v.assign_add(*Array::from_vector<float>({1, 1}));
    return v.assign_add(Array::scalar(1.0f));
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              HasSubstr("assign_add on variable 'v' (float32[]): the value is float32[2]"));
  EXPECT_EQ(components(v), (std::vector<float>{5, 5}));
}

TEST(VariableTest, ExtendedUpdateAndReduceToVariable) {
  auto s = mirrored(2);
  auto v = *s->create_variable(Array::scalar(0.0f), {"v"});
  // TF's docstring: in merge_fn, reduce_to(SUM, 1.0 per replica, var) then update -> 2.0 on both.
  auto r = s->run([&](ReplicaContext& ctx) -> Status {
    std::function<StatusOr<int>(Strategy&, const PerReplica<Array>&)> merge =
        [&](Strategy& strategy, const PerReplica<Array>& value) -> StatusOr<int> {
      TRIBUTARY_ASSIGN_OR_RETURN(Mirrored<Array> reduced,
                                 strategy.reduce_to(ReduceOp::kSum, value, v));
      TRIBUTARY_RETURN_IF_ERROR(strategy.update(v, [&](int i, const Array&) -> StatusOr<Array> {
        return reduced[static_cast<size_t>(i)];
      }));
      return 0;
    };
    return ctx.merge_call(merge, Array::scalar(1.0f)).status();
  });
  ASSERT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(components(v), (std::vector<float>{2, 2}));
  // update is all or nothing: a failure on component 1 leaves component 0 unchanged too.
  Status st = s->update(v, [](int i, const Array& cur) -> StatusOr<Array> {
    if (i == 1) return invalid_argument("nope");
    return add(cur, Array::scalar(1.0f));
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(components(v), (std::vector<float>{2, 2}));
  // broadcast_to
  auto b = s->broadcast_to(Array::scalar(7.0f), v);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(scalar_of((*b)[1]), 7.0f);
}

// TF's StrategyExtended.update in replica context is _replica_ctx_update: a merge_call whose
// function calls update in cross-replica context, each component with its replica's arguments.
TEST(VariableTest, ExtendedUpdateInReplicaContextIsAMergeCall) {
  auto s = mirrored(2);
  auto v = *s->create_variable(Array::scalar(1.0f), {"v"});
  auto r = s->run([&](ReplicaContext& ctx) -> StatusOr<float> {
    const float mine = 10.0f * static_cast<float>(ctx.local_replica_id() + 1);  // 10, 20
    TRIBUTARY_RETURN_IF_ERROR(s->update(v, [mine](int component, const Array& cur) {
      return add(cur, Array::scalar(mine + static_cast<float>(component)));
    }));
    // Every replica sees the update once it returns.
    TRIBUTARY_ASSIGN_OR_RETURN(Array own, v.read());
    return scalar_of(own);
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Component 0 by replica 0's fn (1 + 10 + 0), component 1 by replica 1's (1 + 20 + 1).
  EXPECT_EQ(components(v), (std::vector<float>{11, 22}));
  EXPECT_EQ(r->values(), (std::vector<float>{11, 22}));
  // A failure in any replica's fn changes no component and reaches every replica.
  Status st = s->run([&](ReplicaContext& ctx) {
    const bool fail = ctx.local_replica_id() == 1;
    return s->update(v, [fail](int, const Array& cur) -> StatusOr<Array> {
      if (fail) return invalid_argument("replica 1 says no");
      return add(cur, Array::scalar(1.0f));
    });
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("replica 1 says no"));
  EXPECT_EQ(components(v), (std::vector<float>{11, 22}));
  // Replicas updating different variables are told.
  auto w = *s->create_variable(Array::scalar(0.0f), {"w"});
  st = s->run([&](ReplicaContext& ctx) {
    Variable& target = ctx.local_replica_id() == 0 ? v : w;
    return s->update(target, [](int, const Array& cur) -> StatusOr<Array> { return cur; });
  });
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("replica 0 called update on variable 'v' but replica 1 "
                                      "called update on variable 'w'"));
  // CentralStorage's one copy is computed by replica 0's fn (TF's primary).
  CentralStorageStrategyOptions o;
  o.compute_devices = {Device::cpu(0), Device::cpu(1)};
  auto central = make_central_storage_strategy(o);
  ASSERT_TRUE(central.ok());
  auto c = *(*central)->create_variable(Array::scalar(0.0f), {"c", VS::kOnWrite, VA::kSum});
  ASSERT_TRUE((*central)
                  ->run([&](ReplicaContext& ctx) {
                    const float mine = static_cast<float>(ctx.local_replica_id() + 5);
                    return (*central)->update(c, [mine](int, const Array&) -> StatusOr<Array> {
                      return Array::scalar(mine);
                    });
                  })
                  .ok());
  EXPECT_EQ(components(c), std::vector<float>{5});
}

// TF's default strategy and OneDevice._create_variable call next_creator: plain tf.Variables,
// "exactly as code written without any strategy", so no distributed-variable rule applies.
TEST(VariableTest, DefaultAndOneDeviceVariablesArePlain) {
  auto one_device = make_one_device_strategy(Device::cpu(0));
  ASSERT_TRUE(one_device.ok());
  for (Strategy* s : {one_device->get(), &default_strategy()}) {
    SCOPED_TRACE(s->describe());
    auto scope = s->scope();
    ASSERT_TRUE(scope.ok());
    auto none = s->create_variable(Array::scalar(1.0f), {"n", VS::kNone, VA::kNone});
    ASSERT_TRUE(none.ok()) << none.status().to_string();
    EXPECT_EQ(none->synchronization(), VS::kNone);
    ASSERT_TRUE(none->assign_add(Array::scalar(2.0f)).ok());
    EXPECT_EQ(scalar_of(*none->read()), 3.0f);
    auto int_mean =
        s->create_variable(Array::scalar<int32_t>(1), {"steps", VS::kOnWrite, VA::kMean});
    ASSERT_TRUE(int_mean.ok()) << int_mean.status().to_string();
    auto sum = s->create_variable(Array::scalar(1.0f), {"sum", VS::kOnRead, VA::kSum});
    ASSERT_TRUE(sum.ok());
    Status add = sum->assign_add(Array::scalar(1.0f));
    ASSERT_TRUE(add.ok()) << add.to_string();
    EXPECT_EQ(scalar_of(*sum->read()), 2.0f);
    ASSERT_TRUE(sum->assign(Array::scalar(8.0f)).ok());  // not divided by the replica count
    EXPECT_EQ(components(*sum), std::vector<float>{8});
    auto on_read_none = s->create_variable(Array::scalar(4.0f), {"rn", VS::kOnRead, VA::kNone});
    ASSERT_TRUE(on_read_none.ok());
    auto read = on_read_none->read();
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(scalar_of(*read), 4.0f);
    // In replica context too, whatever the aggregation.
    auto r = s->run([&](ReplicaContext&) -> StatusOr<int32_t> {
      TRIBUTARY_RETURN_IF_ERROR(int_mean->assign_add(Array::scalar<int32_t>(2)));
      TRIBUTARY_RETURN_IF_ERROR(sum->assign_add(Array::scalar(1.0f)));
      auto sync = variable_sync_on_read_context();
      TRIBUTARY_ASSIGN_OR_RETURN(Array n, on_read_none->read());
      EXPECT_EQ(scalar_of(n), 4.0f);
      TRIBUTARY_ASSIGN_OR_RETURN(Array steps, int_mean->read());
      return steps.to_vector<int32_t>()[0];
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)[0], 3);
    EXPECT_EQ(components(*sum), std::vector<float>{9});
  }
}

TEST(VariableTest, CentralStorageKeepsOneCopyAndAggregatesReplicaUpdates) {
  CentralStorageStrategyOptions o;
  o.compute_devices = {Device::cpu(0), Device::cpu(1)};
  auto s = make_central_storage_strategy(o);
  ASSERT_TRUE(s.ok());
  auto v = *(*s)->create_variable(Array::scalar(0.0f), {"w", VS::kOnWrite, VA::kSum});
  EXPECT_EQ(v.devices(), std::vector<Device>{Device::cpu(0)});
  ASSERT_TRUE((*s)->run([&](ReplicaContext& ctx) {
                    return v.assign_add(
                        Array::scalar(static_cast<float>(ctx.local_replica_id() + 1)));
                  })
                  .ok());
  EXPECT_EQ(components(v), std::vector<float>{3});
  auto none = *(*s)->create_variable(Array::scalar(0.0f), {"n", VS::kOnWrite, VA::kNone});
  Status st = (*s)->run([&](ReplicaContext& ctx) {
    return none.assign_add(Array::scalar(static_cast<float>(ctx.local_replica_id() + 1)));
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(
      st.message(),
      HasSubstr("You must specify an aggregation method to update a variable in Replica Context"));
  EXPECT_EQ(components(none), std::vector<float>{0});
  ASSERT_TRUE(none.assign_add(Array::scalar(5.0f)).ok());  // cross-replica context is fine
  EXPECT_EQ(components(none), std::vector<float>{5});
  // TF's reduce_to docstring: CentralStorage with 2 compute devices -> 2.0.
  auto r = (*s)->reduce_to(ReduceOp::kSum,
                           PerReplica<Array>({Array::scalar(1.0f), Array::scalar(1.0f)}), v);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(scalar_of((*r)[0]), 2.0f);
}

TEST(VariableTest, OneDeviceReduceToVariable) {
  auto s = make_one_device_strategy(Device::cpu(0));
  auto v = *(*s)->create_variable(Array::scalar(0.0f));
  auto r = (*s)->reduce_to(ReduceOp::kSum, PerReplica<Array>({Array::scalar(1.0f)}), v);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(scalar_of((*r)[0]), 1.0f);  // TF: OneDevice -> 1.0
}

class CheckpointTest : public ::testing::Test {
 protected:
  std::string path_ = (std::filesystem::temp_directory_path() /
                       ("tributary_ckpt_" + std::to_string(::getpid()) + ".bin"))
                          .string();
  void TearDown() override { std::remove(path_.c_str()); }
};

TEST_F(CheckpointTest, RoundTripWithTfsOnReadSumRule) {
  auto s = mirrored(2);
  auto w = *s->create_variable(*Array::from_vector<float>({1, 2}), {"w"});
  auto count = *s->create_variable(Array::scalar(0.0f), {"count", VS::kOnRead, VA::kSum});
  auto mean = *s->create_variable(Array::scalar(0.0f), {"mean", VS::kOnRead, VA::kMean});
  ASSERT_TRUE(
      s->run([&](ReplicaContext& ctx) -> Status {
         TRIBUTARY_RETURN_IF_ERROR(
             count.assign_add(Array::scalar(static_cast<float>(ctx.local_replica_id() + 1))));
         return mean.assign(Array::scalar(static_cast<float>(10 * (ctx.local_replica_id() + 1))));
       }).ok());
  std::vector<Variable> vars = {w, count, mean};
  ASSERT_TRUE(save_checkpoint(path_, vars).ok());
  // The mode of any new file (its temporary file was mkstemp's 0600).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat file {};
  ASSERT_EQ(::stat(path_.c_str(), &file), 0);
  EXPECT_EQ(file.st_mode & 0777, 0666 & ~mask);
  // Change everything, then restore into a fresh strategy's variables of the same names.
  auto s2 = mirrored(2);
  auto w2 = *s2->create_variable(*Array::from_vector<float>({0, 0}), {"w"});
  auto count2 = *s2->create_variable(Array::scalar(5.0f), {"count", VS::kOnRead, VA::kSum});
  auto mean2 = *s2->create_variable(Array::scalar(5.0f), {"mean", VS::kOnRead, VA::kMean});
  std::vector<Variable> vars2 = {w2, count2, mean2};
  Status st = restore_checkpoint(path_, vars2);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(w2.values()[1].to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(components(count2), (std::vector<float>{1.5, 1.5}));  // saved 3, split over 2
  EXPECT_EQ(scalar_of(*count2.read()), 3.0f);
  EXPECT_EQ(components(mean2), (std::vector<float>{15, 15}));  // saved mean 15, assigned to each
}

TEST_F(CheckpointTest, BadFilesAndMismatchesChangeNothing) {
  auto s = mirrored(2);
  auto w = *s->create_variable(*Array::from_vector<float>({1, 2}), {"w"});
  std::vector<Variable> vars = {w};
  Status missing = restore_checkpoint(path_ + ".absent", vars);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  ASSERT_TRUE(save_checkpoint(path_, vars).ok());
  auto other = *s->create_variable(*Array::from_vector<float>({9, 9, 9}), {"w"});
  std::vector<Variable> wrong_shape = {other};
  Status shape = restore_checkpoint(path_, wrong_shape);
  EXPECT_THAT(shape.message(), HasSubstr("variable 'w' was saved as float32[2]"));
  auto x = *s->create_variable(Array::scalar(0.0f), {"x"});
  std::vector<Variable> two = {w, x};
  Status absent = restore_checkpoint(path_, two);
  EXPECT_THAT(absent.message(), HasSubstr("has no variable 'x' (it has: w)"));
  // Corrupt one byte of data: refused.
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x7f');
  }
  ASSERT_TRUE(w.assign(*Array::from_vector<float>({4, 4})).ok());
  Status corrupt = restore_checkpoint(path_, vars);
  EXPECT_THAT(corrupt.message(), HasSubstr("corrupt or truncated"));
  EXPECT_EQ(w.values()[0].to_vector<float>(), (std::vector<float>{4, 4}));
  std::vector<Variable> dup = {w, w};
  EXPECT_THAT(save_checkpoint(path_, dup).message(), HasSubstr("two variables are named 'w'"));
}

// Saves of one path from two threads at once each leave a whole checkpoint (they shared one
// temporary file, and an interleaved one could be renamed into place by the save that reported ok).
TEST_F(CheckpointTest, ConcurrentSavesOfOnePathLeaveAWholeFile) {
  auto a = make_one_device_strategy(Device::cpu(0));
  auto b = make_one_device_strategy(Device::cpu(0));
  ASSERT_TRUE(a.ok() && b.ok());
  auto wa = *(*a)->create_variable(*Array::from_vector(std::vector<float>(1 << 20, 1.0f)), {"w"});
  auto wb = *(*b)->create_variable(*Array::from_vector(std::vector<float>(1 << 20, 2.0f)), {"w"});
  for (int round = 0; round < 5; ++round) {
    Status sa, sb;
    std::thread ta([&] { sa = save_checkpoint(path_, std::vector<Variable>{wa}); });
    std::thread tb([&] { sb = save_checkpoint(path_, std::vector<Variable>{wb}); });
    ta.join();
    tb.join();
    ASSERT_TRUE(sa.ok()) << sa.to_string();
    ASSERT_TRUE(sb.ok()) << sb.to_string();
    auto c = make_one_device_strategy(Device::cpu(0));
    auto wc = *(*c)->create_variable(*Array::from_vector(std::vector<float>(1 << 20, 0.0f)), {"w"});
    Status restored = restore_checkpoint(path_, std::vector<Variable>{wc});
    ASSERT_TRUE(restored.ok()) << restored.to_string();
    const std::vector<float> got = wc.read()->to_vector<float>();
    EXPECT_TRUE(got == std::vector<float>(1 << 20, 1.0f) ||
                got == std::vector<float>(1 << 20, 2.0f));
  }
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path_).parent_path())) {
    EXPECT_EQ(e.path().string().rfind(path_ + ".tmp", 0), std::string::npos) << "left " << e.path();
  }
}

// A file whose entries were tampered with (and its checksum recomputed, as anyone can) is refused
// before anything is allocated from it; so are duplicates, trailing bytes and another format.
TEST_F(CheckpointTest, CraftedFilesAreRefused) {
  auto fnv = [](std::string_view b) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
    return h;
  };
  auto seal = [&](std::string body) {  // the file's checksum over `body`
    const uint64_t h = fnv(body);
    body.append(reinterpret_cast<const char*>(&h), 8);
    return body;
  };
  auto write = [&](const std::string& bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto s = make_one_device_strategy(Device::cpu(0));
  auto w = *(*s)->create_variable(Array::scalar(5.0f), {"w"});
  std::vector<Variable> vars = {w};
  auto refused = [&](std::string_view why) {
    Status r = restore_checkpoint(path_, vars);
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << r.to_string();
    EXPECT_THAT(r.message(), HasSubstr(std::string(why)));
    EXPECT_EQ(w.read()->to_vector<float>(), std::vector<float>{5.0f});
  };
  // float32[2^40] claimed, 0 bytes of data.
  std::string body = "TRIBUTARY-CKPT-1\n";
  auto put = [&](auto v) { body.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t{1});
  put(uint32_t{1});
  body += "w";
  put(static_cast<uint8_t>(DType::kFloat32));
  put(uint8_t{1});
  put(int64_t{1} << 40);
  put(uint64_t{0});
  write(seal(body));
  refused("entry 'w' claims float32[1099511627776] but holds 0 bytes");  // before allocating
  // Two entries named w.
  const std::string one = checkpoint_internal::encode({{"w", Array::scalar(1.0f)}});
  const std::string two =
      checkpoint_internal::encode({{"w", Array::scalar(1.0f)}, {"w", Array::scalar(2.0f)}});
  write(two);
  refused("two entries named 'w'");
  // Bytes after the last entry.
  write(seal(one.substr(0, one.size() - 8) + "junk"));
  refused("bytes after the last entry");
  // Another format version: said so, not "corrupt".
  write("TRIBUTARY-CKPT-2\n" + one.substr(17));
  Status newer = restore_checkpoint(path_, vars);
  EXPECT_EQ(newer.code(), StatusCode::kUnimplemented) << newer.to_string();
  EXPECT_THAT(newer.message(), HasSubstr("format '2'"));
  // Damage to the first line is damage, not another format.
  write("TRIBUTARY-CKPT-1\r\n" + one.substr(17));
  refused("corrupt or truncated");
}

TEST_F(CheckpointTest, PathErrorsSayWhatIsWrong) {
  auto s = make_one_device_strategy(Device::cpu(0));
  auto w = *(*s)->create_variable(Array::scalar(5.0f), {"w"});
  std::vector<Variable> vars = {w};
  const std::string dir = std::filesystem::temp_directory_path().string();
  Status is_dir = restore_checkpoint(dir, vars);
  EXPECT_EQ(is_dir.code(), StatusCode::kInvalidArgument) << is_dir.to_string();
  EXPECT_THAT(is_dir.message(), HasSubstr("is a directory"));
  const std::string nowhere = dir + "/no-such-dir-" + std::to_string(::getpid()) + "/model.ckpt";
  Status missing_dir = save_checkpoint(nowhere, vars);
  EXPECT_EQ(missing_dir.code(), StatusCode::kNotFound) << missing_dir.to_string();
  EXPECT_THAT(missing_dir.message(), HasSubstr("cannot create checkpoint '" + nowhere + "'"));
  Status none = save_checkpoint(path_, {});
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument) << none.to_string();
  EXPECT_THAT(none.message(), HasSubstr("no variables given"));
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
}  // namespace tributary
