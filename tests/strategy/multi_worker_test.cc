// MultiWorkerMirroredStrategy across real processes (forked, meeting through a file store), over
// the real ring and gloo backends: chief broadcast of initial values, variable rules across
// workers, cross-replica reduce/gather, uneven data that must not hang, auto-sharding, checkpoints,
// and a worker that dies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "tests/multiprocess/harness.h"
#include "tributary/strategy/distributed_input.h"
#include "tributary/strategy/strategies.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace {

using testing::kChildFailed;
using testing::kChildOk;
using testing::kChildSkip;

// In a child: a failed check prints and ends the child with kChildFailed.
#define CHILD_CHECK(cond)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", rank, __FILE__, __LINE__, #cond); \
      return kChildFailed;                                                                         \
    }                                                                                              \
  } while (0)
#define CHILD_OK(expr)                                                       \
  do {                                                                       \
    Status _s = (expr);                                                      \
    if (!_s.ok()) {                                                          \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, \
                   _s.to_string().c_str());                                  \
      return kChildFailed;                                                   \
    }                                                                        \
  } while (0)

class MultiWorkerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!builtin_backends().find(GetParam()))
      GTEST_SKIP() << "backend " << GetParam() << " is not built in";
  }
  StatusOr<std::unique_ptr<Strategy>> make(int rank, int world, int local) {
    TRIBUTARY_ASSIGN_OR_RETURN(BackendContext ctx,
                               testing::group_context(rank, world, local, dir_));
    MultiWorkerMirroredStrategyOptions o;
    o.context = std::move(ctx);
    o.communication.implementation = GetParam();
    o.communication.timeout = std::chrono::seconds(20);
    return make_multi_worker_mirrored_strategy(std::move(o));
  }
  void expect_all_ok(int world, const std::function<int(int)>& fn) {
    auto r = testing::run_group(world, std::chrono::seconds(60), fn);
    EXPECT_FALSE(r.watchdog_fired) << r.describe();
    for (const auto& c : r.children) {
      if (c.exit_code == kChildSkip) GTEST_SKIP() << "skipped in a child";
      EXPECT_EQ(c.exit_code, kChildOk) << r.describe();
    }
  }
  std::string dir_ = testing::make_temp_dir("multi_worker_strategy");
};

TEST_P(MultiWorkerTest, ChiefBroadcastsInitialValuesAndVariablesFollowTfAcrossWorkers) {
  expect_all_ok(3, [&](int rank) {
    auto s = make(rank, 3, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    CHILD_CHECK(st.num_replicas_in_sync() == 6);
    CHILD_CHECK(st.is_chief() == (rank == 0));
    // Every worker proposes a different initial value; the chief's wins everywhere.
    auto w =
        st.create_variable(Array::scalar(static_cast<float>(rank * 10 + 1)),
                           {"w", VariableSynchronization::kOnWrite, VariableAggregation::kSum});
    CHILD_OK(w.status());
    for (const Array& c : w->values()) CHILD_CHECK(c.to_vector<float>()[0] == 1.0f);
    auto count = st.create_variable(Array::scalar(0.0f), {"count", VariableSynchronization::kOnRead,
                                                          VariableAggregation::kSum});
    CHILD_OK(count.status());
    // Replica g (global id) adds g + 1: ON_WRITE SUM gives 1 + 21 everywhere; ON_READ keeps its
    // own.
    CHILD_OK(st.run([&](ReplicaContext& ctx) -> Status {
      const float g = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
      TRIBUTARY_RETURN_IF_ERROR(w->assign_add(Array::scalar(g)));
      return count->assign_add(Array::scalar(g));
    }));
    for (const Array& c : w->values()) CHILD_CHECK(c.to_vector<float>()[0] == 22.0f);
    CHILD_CHECK(count->values()[1].to_vector<float>()[0] == static_cast<float>(rank * 2 + 2));
    auto total = count->read();  // an all-reduce: every worker reads together
    CHILD_OK(total.status());
    CHILD_CHECK(total->to_vector<float>()[0] == 21.0f);
    // ONLY_FIRST_REPLICA: global replica 0's value (the chief's) wins on every worker.
    auto first = st.create_variable(
        Array::scalar(0.0f),
        {"first", VariableSynchronization::kOnWrite, VariableAggregation::kOnlyFirstReplica});
    CHILD_OK(first.status());
    CHILD_OK(st.run([&](ReplicaContext& ctx) {
      return first->assign(Array::scalar(static_cast<float>(100 + ctx.replica_id_in_sync_group())));
    }));
    for (const Array& c : first->values()) CHILD_CHECK(c.to_vector<float>()[0] == 100.0f);
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, ReduceAndGatherSpanWorkersWithPartialBatches) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    // Global replica g holds g + 1 rows of value g: rows 1 + 2 + 3 + 4 = 10, sum 0+2+6+12 = 20.
    std::vector<Array> local;
    for (int i = 0; i < 2; ++i) {
      const int g = rank * 2 + i;
      std::vector<float> rows(static_cast<size_t>(g + 1), static_cast<float>(g));
      local.push_back(*Array::from_vector(rows, {g + 1, 1}));
    }
    PerReplica<Array> v(local);
    auto mean = st.reduce(ReduceOp::kMean, v, 0);
    CHILD_OK(mean.status());
    CHILD_CHECK(mean->to_vector<float>()[0] == 2.0f);
    auto gathered = st.gather(v, 0);
    CHILD_OK(gathered.status());
    CHILD_CHECK((gathered->to_vector<float>() == std::vector<float>{0, 1, 1, 2, 2, 2, 3, 3, 3, 3}));
    auto in_replica = st.run([&](ReplicaContext& ctx) {
      return ctx.all_gather(local[static_cast<size_t>(ctx.local_replica_id())], 0);
    });
    CHILD_OK(in_replica.status());
    CHILD_CHECK((*in_replica)[1].shape() == (Shape{10, 1}));
    return kChildOk;
  });
}

// A value that is not distributed is this worker's part, as in TF's collective strategy: SUM adds
// the workers' values (not once per local replica), MEAN divides by the workers, an axis counts
// the global rows along it; gather and sparse values concatenate in worker order.
TEST_P(MultiWorkerTest, NonDistributedValuesReduceAcrossWorkers) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    const float w = static_cast<float>(rank + 1);
    Array mine = *Array::from_vector<float>({w, 10 * w});
    auto sum = st.reduce(ReduceOp::kSum, mine);
    CHILD_OK(sum.status());
    CHILD_CHECK((sum->to_vector<float>() == std::vector<float>{3, 30}));
    auto mean = st.reduce(ReduceOp::kMean, mine);
    CHILD_OK(mean.status());
    CHILD_CHECK((mean->to_vector<float>() == std::vector<float>{1.5f, 15}));
    // Integers: TF's true division, float64.
    auto int_mean = st.reduce(ReduceOp::kMean, *Array::from_vector<int32_t>({rank}));
    CHILD_OK(int_mean.status());
    CHILD_CHECK(int_mean->dtype() == DType::kFloat64 && int_mean->to_vector<double>()[0] == 0.5);
    // Worker 0 holds 1 row, worker 1 holds 3: the sum along axis 0 of all 4, and their mean.
    std::vector<float> rows(static_cast<size_t>(2 * rank + 1), w);
    Array batch = *Array::from_vector(rows, {2 * rank + 1, 1});
    auto axis_sum = st.reduce(ReduceOp::kSum, batch, 0);
    CHILD_OK(axis_sum.status());
    CHILD_CHECK(axis_sum->to_vector<float>() == std::vector<float>{7});
    auto axis_mean = st.reduce(ReduceOp::kMean, batch, -2);
    CHILD_OK(axis_mean.status());
    CHILD_CHECK(axis_mean->to_vector<float>() == std::vector<float>{1.75f});
    // Sparse: worker w's row w, value 10 * (w + 1).
    auto slices = IndexedSlices::make(*Array::from_vector<float>({10 * w}, {1, 1}),
                                      *Array::from_vector<int64_t>({rank}), {4, 1});
    CHILD_OK(slices.status());
    auto sparse_sum = st.reduce(ReduceOp::kSum, *slices);
    CHILD_OK(sparse_sum.status());
    CHILD_CHECK((sparse_sum->indices().to_vector<int64_t>() == std::vector<int64_t>{0, 1}));
    CHILD_CHECK((sparse_sum->values().to_vector<float>() == std::vector<float>{10, 20}));
    auto sparse_mean = st.reduce(ReduceOp::kMean, *slices);
    CHILD_OK(sparse_mean.status());
    CHILD_CHECK((sparse_mean->values().to_vector<float>() == std::vector<float>{5, 10}));
    auto gathered = st.gather(batch, 0);  // worker 0's row, then worker 1's three
    CHILD_OK(gathered.status());
    CHILD_CHECK((gathered->to_vector<float>() == std::vector<float>{1, 2, 2, 2}));
    // MAX and PROD, which TF lacks, across the workers too; sparse values are SUM and MEAN only,
    // refused alike on every worker before any collective (the strategy stays usable).
    auto max = st.reduce(ReduceOp::kMax, mine);
    CHILD_OK(max.status());
    CHILD_CHECK((max->to_vector<float>() == std::vector<float>{2, 20}));
    auto prod = st.reduce(ReduceOp::kProd, mine);
    CHILD_OK(prod.status());
    CHILD_CHECK((prod->to_vector<float>() == std::vector<float>{2, 200}));
    auto sparse_max = st.reduce(ReduceOp::kMax, *slices);
    CHILD_CHECK(sparse_max.status().code() == StatusCode::kInvalidArgument);
    CHILD_OK(st.reduce(ReduceOp::kSum, mine).status());
    return kChildOk;
  });
}

// Each worker's part reduced across the workers for every op, with one local replica (the common
// layout, where Python's run() gives the value itself) and with three; an int32 MEAN does not
// overflow on the way (each worker's value is summed once, not once per local replica).
TEST_P(MultiWorkerTest, WorkerPartsReduceForEveryOpWithOneOrSeveralLocalReplicas) {
  for (int local : {1, 3}) {
    expect_all_ok(2, [&](int rank) {
      auto s = make(rank, 2, local);
      CHILD_OK(s.status());
      Strategy& st = **s;
      Array mine = *Array::from_vector<float>({static_cast<float>(rank + 2)});  // 2 and 3
      const std::vector<std::pair<ReduceOp, float>> want = {{ReduceOp::kSum, 5},
                                                            {ReduceOp::kMean, 2.5f},
                                                            {ReduceOp::kMax, 3},
                                                            {ReduceOp::kMin, 2},
                                                            {ReduceOp::kProd, 6}};
      for (const auto& [op, value] : want) {
        auto r = st.reduce(op, mine);
        CHILD_OK(r.status());
        CHILD_CHECK(r->to_vector<float>() == std::vector<float>{value});
      }
      auto mean = st.reduce(ReduceOp::kMean, *Array::from_vector<int32_t>({1000000000}));
      CHILD_OK(mean.status());
      CHILD_CHECK(mean->to_vector<double>() == std::vector<double>{1000000000});
      return kChildOk;
    });
  }
}

// Sparse gradients (IndexedSlices) across workers: every replica's rows, in global replica order,
// whatever their number; scatter updates of an embedding table agree on every worker; replicas
// that disagree on the dense shape fail every worker with the same message.
TEST_P(MultiWorkerTest, SparseValuesConcatenateAcrossWorkers) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    // Global replica g touches rows 0 .. g-1 of a [4, 1] table, each with value 10 * g + row.
    auto mine = [](int g, int64_t dense_rows) {
      std::vector<float> values;
      std::vector<int64_t> indices;
      for (int row = 0; row < g; ++row) {
        values.push_back(static_cast<float>(10 * g + row));
        indices.push_back(row);
      }
      return IndexedSlices::make(
          *Array::from_vector(values, {static_cast<int64_t>(values.size()), 1}),
          *Array::from_vector(indices), {dense_rows, 1});
    };
    auto reduced = st.run([&](ReplicaContext& ctx) -> StatusOr<IndexedSlices> {
      TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices v, mine(ctx.replica_id_in_sync_group(), 4));
      return ctx.all_reduce(ReduceOp::kSum, v);
    });
    CHILD_OK(reduced.status());
    for (const IndexedSlices& r : *reduced) {
      CHILD_CHECK((r.indices().to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 0, 1, 2}));
      CHILD_CHECK((r.values().to_vector<float>() == std::vector<float>{10, 20, 21, 30, 31, 32}));
    }
    auto table =
        st.create_variable(*Array::zeros(DType::kFloat32, {4, 1}),
                           {"emb", VariableSynchronization::kOnWrite, VariableAggregation::kSum});
    CHILD_OK(table.status());
    CHILD_OK(st.run([&](ReplicaContext& ctx) -> Status {
      TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices v, mine(ctx.replica_id_in_sync_group(), 4));
      return table->scatter_add(v);
    }));
    for (const Array& c : table->values()) {
      CHILD_CHECK((c.to_vector<float>() == std::vector<float>{60, 52, 32, 0}));
    }
    // ONLY_FIRST_REPLICA: global replica 0's rows (its row 0, 100) on every worker; the others'
    // rows are neither applied nor checked (replica 3's row 9 is out of range).
    auto first = st.create_variable(
        *Array::zeros(DType::kFloat32, {4, 1}),
        {"first", VariableSynchronization::kOnWrite, VariableAggregation::kOnlyFirstReplica});
    CHILD_OK(first.status());
    CHILD_OK(st.run([&](ReplicaContext& ctx) -> Status {
      const int g = ctx.replica_id_in_sync_group();
      return first->scatter_update(*IndexedSlices::make(
          *Array::from_vector(std::vector<float>{static_cast<float>(100 + g)}, {1, 1}),
          *Array::from_vector(std::vector<int64_t>{g == 3 ? 9 : g}), {4, 1}));
    }));
    for (const Array& c : first->values()) {
      CHILD_CHECK((c.to_vector<float>() == std::vector<float>{100, 0, 0, 0}));
    }
    // Worker 1's replicas claim 5 dense rows: every worker fails, naming global replica 2.
    Status bad = st.run([&](ReplicaContext& ctx) -> Status {
      TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices v,
                                 mine(ctx.replica_id_in_sync_group(), rank == 0 ? 4 : 5));
      return ctx.all_reduce(ReduceOp::kSum, v).status();
    });
    CHILD_CHECK(bad.code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(bad.message().find("replica 2 has values float32, indices int64, dense_shape "
                                   "[5, 1] but replica 0 has values float32, indices int64, "
                                   "dense_shape [4, 1]") != std::string::npos);
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, UnevenDataAcrossWorkersEndsTogetherWithoutHanging) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    // Worker 0 has 10 elements, worker 1 only 4 (per-replica batches of 2).
    auto dd =
        distribute_datasets_from_function(st, [](const InputContext& ctx) -> StatusOr<Dataset> {
          return Dataset::range(ctx.input_pipeline_id() == 0 ? 10 : 4).batch(2);
        });
    CHILD_OK(dd.status());
    auto it = dd->make_iterator();
    CHILD_OK(it.status());
    std::vector<int64_t> global_rows;
    for (int step = 0; step < 10; ++step) {
      auto batch = it->get_next();
      if (batch.status().code() == StatusCode::kOutOfRange) break;
      CHILD_OK(batch.status());
      // A training step: every replica takes part in an all-reduce, empty batch or not.
      auto rows = st.run(
          [](ReplicaContext& ctx, const Element& e) -> StatusOr<Array> {
            return ctx.all_reduce(ReduceOp::kSum, Array::scalar(static_cast<float>(e[0].dim0())));
          },
          *batch);
      CHILD_OK(rows.status());
      global_rows.push_back(static_cast<int64_t>((*rows)[0].to_vector<float>()[0]));
    }
    // Step 1: 4 + 4 rows; step 2: 4 + 0 (worker 1 is out); step 3: 2 + 0; then both end.
    CHILD_CHECK((global_rows == std::vector<int64_t>{8, 4, 2}));
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, AutoShardByDataAndByFile) {
  // Two TFRecord files of six int64 records each (TF's tutorial: file1 = 0..5, file2 = 6..11).
  std::vector<std::string> files;
  for (int f = 0; f < 2; ++f) {
    std::vector<std::string> records;
    for (int64_t v = f * 6; v < f * 6 + 6; ++v)
      records.emplace_back(reinterpret_cast<const char*>(&v), 8);
    files.push_back(dir_ + "/part" + std::to_string(f) + ".tfrecord");
    ASSERT_TRUE(write_tfrecord(files.back(), records).ok());
  }
  auto as_int64 = [](Element e) -> StatusOr<Element> {
    int64_t v;
    std::memcpy(&v, e[0].data<void>(), 8);
    return Element{Array::scalar(v)};
  };
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 1);
    CHILD_OK(s.status());
    Strategy& st = **s;
    auto steps = [&](const Dataset& ds,
                     AutoShardPolicy policy) -> StatusOr<std::vector<std::vector<int64_t>>> {
      InputOptions o;
      o.auto_shard_policy = policy;
      TRIBUTARY_ASSIGN_OR_RETURN(DistributedDataset dd, distribute_dataset(st, ds, o));
      TRIBUTARY_ASSIGN_OR_RETURN(DistributedIterator it, dd.make_iterator());
      std::vector<std::vector<int64_t>> out;
      for (;;) {
        auto b = it.get_next();
        if (b.status().code() == StatusCode::kOutOfRange) return out;
        if (!b.ok()) return b.status();
        out.push_back((*b)[0][0].to_vector<int64_t>());
      }
    };
    // DATA over one source: worker 0 [0,1],[4,5],[8,9]; worker 1 [2,3],[6,7],[10,11].
    auto data = steps(Dataset::range(12).batch(4), AutoShardPolicy::kAuto);
    CHILD_OK(data.status());
    if (rank == 0)
      CHILD_CHECK((*data == std::vector<std::vector<int64_t>>{{0, 1}, {4, 5}, {8, 9}}));
    if (rank == 1)
      CHILD_CHECK((*data == std::vector<std::vector<int64_t>>{{2, 3}, {6, 7}, {10, 11}}));
    // FILE: each worker reads its own file; V2 rebatching gives [0,1],[2,3],[4,5] on worker 0.
    auto by_file = steps(Dataset::tfrecord(files).map(as_int64).batch(4), AutoShardPolicy::kFile);
    CHILD_OK(by_file.status());
    if (rank == 0)
      CHILD_CHECK((*by_file == std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4, 5}}));
    if (rank == 1)
      CHILD_CHECK((*by_file == std::vector<std::vector<int64_t>>{{6, 7}, {8, 9}, {10, 11}}));
    // OFF: every worker reads everything.
    auto off = steps(Dataset::range(4).batch(4), AutoShardPolicy::kOff);
    CHILD_OK(off.status());
    CHILD_CHECK((*off == std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}}));
    // Fewer files than workers: TF's error, on both workers.
    auto one_file =
        steps(Dataset::tfrecord({files[0]}).map(as_int64).batch(4), AutoShardPolicy::kFile);
    CHILD_CHECK(one_file.status().code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(one_file.status().message().find("Could not apply FILE based sharding") !=
                std::string::npos);
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, CheckpointWrittenByTheChiefRestoredEverywhereByBroadcast) {
  const std::string path = dir_ + "/model.ckpt";
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    auto w = st.create_variable(*Array::from_vector<float>({1, 2}), {"w"});
    auto count = st.create_variable(Array::scalar(0.0f), {"count", VariableSynchronization::kOnRead,
                                                          VariableAggregation::kSum});
    CHILD_OK(w.status());
    CHILD_OK(count.status());
    CHILD_OK(st.run([&](ReplicaContext&) { return count->assign_add(Array::scalar(2.0f)); }));
    std::vector<Variable> vars = {*w, *count};
    CHILD_OK(save_checkpoint(path, vars));  // count saved as 8 (4 replicas x 2)
    CHILD_CHECK(std::filesystem::exists(path));
    CHILD_OK(w->assign(*Array::from_vector<float>({0, 0})));
    CHILD_OK(count->assign(Array::scalar(0.0f)));
    // Only the chief reads the file: the other worker passes a path that does not exist.
    CHILD_OK(restore_checkpoint(rank == 0 ? path : path + ".not-here", vars));
    CHILD_CHECK((w->values()[1].to_vector<float>() == std::vector<float>{1, 2}));
    CHILD_CHECK(count->values()[0].to_vector<float>()[0] == 2.0f);  // 8 split over 4 replicas
    // A missing file fails on every worker with the chief's message, nothing changed.
    Status missing = restore_checkpoint(dir_ + "/absent.ckpt", vars);
    CHILD_CHECK(missing.code() == StatusCode::kNotFound);
    CHILD_CHECK(missing.message().find("absent.ckpt") != std::string::npos);
    CHILD_CHECK((w->values()[0].to_vector<float>() == std::vector<float>{1, 2}));
    return kChildOk;
  });
}

// The collective timeout in these tests is 20 s: failing well before it shows the peers were told.
constexpr auto kPromptly = std::chrono::seconds(8);

// Workers that pass different lists (here, the same variables in another order) would restore one
// variable's value into another: every worker refuses, naming the workers. A worker's own error
// (two variables of one name) reaches the others at once, with its reason.
TEST_P(MultiWorkerTest, CheckpointsRefuseWorkersThatDisagree) {
  const std::string path = dir_ + "/order.ckpt";
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 1);
    CHILD_OK(s.status());
    Strategy& st = **s;
    auto a = st.create_variable(*Array::from_vector<float>({1, 2}), {"a"});
    auto b = st.create_variable(*Array::from_vector<float>({3, 4}), {"b"});
    CHILD_OK(a.status());
    CHILD_OK(b.status());
    CHILD_OK(save_checkpoint(path, std::vector<Variable>{*a, *b}));
    std::vector<Variable> mine =
        rank == 0 ? std::vector<Variable>{*a, *b} : std::vector<Variable>{*b, *a};
    Status order = restore_checkpoint(path, mine);
    CHILD_CHECK(order.code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(order.message().find("worker(s) 1 passed other variables") != std::string::npos);
    // The same names with another shape: the chief's broadcast would not fit.
    auto a3 = st.create_variable(*Array::from_vector<float>({1, 2, 3}), {"a"});
    CHILD_OK(a3.status());
    std::vector<Variable> shaped =
        rank == 0 ? std::vector<Variable>{*a, *b} : std::vector<Variable>{*a3, *b};
    Status shape = restore_checkpoint(path, shaped);
    CHILD_CHECK(shape.code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(shape.message().find("(names, dtypes or shapes)") != std::string::npos);
    // An empty handle on one worker: it fails, and tells the others.
    std::vector<Variable> holey =
        rank == 1 ? std::vector<Variable>{Variable(), *b} : std::vector<Variable>{*a, *b};
    Status hole = restore_checkpoint(path, holey);
    CHILD_CHECK(hole.message().find("an empty Variable handle") != std::string::npos);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Variable> dup =
        rank == 1 ? std::vector<Variable>{*a, *a} : std::vector<Variable>{*a, *b};
    Status twice = save_checkpoint(path, dup);
    CHILD_CHECK(!twice.ok());
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    CHILD_CHECK(twice.message().find("two variables are named 'a'") != std::string::npos);
    if (rank == 0) CHILD_CHECK(twice.message().find("on worker 1") != std::string::npos);
    CHILD_CHECK((a->values()[0].to_vector<float>() == std::vector<float>{1, 2}));
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, AWorkerThatDiesFailsTheOthersInsteadOfHangingThem) {
  auto r = testing::run_group(2, std::chrono::seconds(60), [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    if (rank == 1) _exit(3);  // dies before the first collective
    const auto start = std::chrono::steady_clock::now();
    Status st = (*s)->run([](ReplicaContext& ctx) {
      return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
    });
    CHILD_CHECK(!st.ok());
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    std::fprintf(stderr, "rank 0 got, as expected: %s\n", st.to_string().c_str());
    return kChildOk;
  });
  EXPECT_FALSE(r.watchdog_fired) << r.describe();
  EXPECT_EQ(r.children[0].exit_code, kChildOk) << r.describe();
  EXPECT_EQ(r.children[1].exit_code, 3) << r.describe();
}

// The same with an element spec that map() leaves unknown: a worker that ran out gives its
// replicas zero-size batches shaped like the last batch it saw. A worker without any data from the
// start cannot know their shape: every worker fails that step, saying so, rather than handing out
// elements without components.
TEST_P(MultiWorkerTest, UnevenDataWithAnUnknownElementSpec) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    auto identity = [](Element e) -> StatusOr<Element> { return e; };
    for (int64_t worker1_rows : {4, 0}) {
      auto dd =
          distribute_datasets_from_function(st, [&](const InputContext& ctx) -> StatusOr<Dataset> {
            return Dataset::range(ctx.input_pipeline_id() == 0 ? 10 : worker1_rows)
                .map(identity)
                .batch(2);
          });
      CHILD_OK(dd.status());
      CHILD_CHECK(dd->element_spec().empty());
      auto it = dd->make_iterator();
      CHILD_OK(it.status());
      std::vector<int64_t> global_rows;
      Status ended;
      for (int step = 0; step < 10 && ended.ok(); ++step) {
        auto batch = it->get_next();
        if (batch.status().code() == StatusCode::kOutOfRange) break;
        ended = batch.status();
        if (!ended.ok()) break;
        for (const Element& e : batch->values()) CHILD_CHECK(e.size() == 1);
        auto rows = st.run(
            [](ReplicaContext& ctx, const Element& e) -> StatusOr<Array> {
              if (e.size() != 1 || e[0].rank() != 1) return internal_error("not a batch");
              return ctx.all_reduce(ReduceOp::kSum, Array::scalar(static_cast<float>(e[0].dim0())));
            },
            *batch);
        CHILD_OK(rows.status());
        global_rows.push_back(static_cast<int64_t>((*rows)[0].to_vector<float>()[0]));
      }
      if (worker1_rows == 4) {
        CHILD_OK(ended);
        CHILD_CHECK((global_rows == std::vector<int64_t>{8, 4, 2}));
      } else {
        CHILD_CHECK(global_rows.empty());
        CHILD_CHECK(ended.code() == StatusCode::kFailedPrecondition);
        CHILD_CHECK(ended.message().find(rank == 1
                                             ? "pass the ElementSpec to map()"
                                             : "another worker has no data") != std::string::npos);
      }
    }
    return kChildOk;
  });
}

// Sparse all-reduces whose ops differ between workers: every worker fails, naming the op (the
// all-gathers underneath would not notice).
TEST_P(MultiWorkerTest, SparseOpsThatDifferAcrossWorkersFailEveryWorker) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Status other_op = (*s)->run([&](ReplicaContext& ctx) -> Status {
      auto v = IndexedSlices::make(*Array::from_vector(std::vector<float>{1}, {1, 1}),
                                   *Array::from_vector(std::vector<int64_t>{0}), {4, 1});
      return ctx.all_reduce(rank == 0 ? ReduceOp::kSum : ReduceOp::kMean, *v).status();
    });
    CHILD_CHECK(other_op.message().find("replica 0 passed ReduceOp.SUM but replica 2 passed "
                                        "ReduceOp.MEAN") != std::string::npos);
    return kChildOk;
  });
}

// A scatter whose slices are bad on one worker only (an index out of range): checked once
// gathered, so every worker fails at once with the same message, and no copy changes.
TEST_P(MultiWorkerTest, ABadSparseUpdateOnOneWorkerFailsEveryWorkerAlike) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    Strategy& st = **s;
    auto table =
        st.create_variable(*Array::zeros(DType::kFloat32, {4, 1}),
                           {"emb", VariableSynchronization::kOnWrite, VariableAggregation::kSum});
    CHILD_OK(table.status());
    const auto start = std::chrono::steady_clock::now();
    Status bad = st.run([&](ReplicaContext& ctx) -> Status {
      const bool odd = rank == 1 && ctx.local_replica_id() == 1;
      return table->scatter_add(
          *IndexedSlices::make(*Array::from_vector(std::vector<float>{1}, {1, 1}),
                               *Array::from_vector(std::vector<int64_t>{odd ? 9 : 0}), {4, 1}));
    });
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    CHILD_CHECK(bad.code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(bad.message().find("indices[3] = 9 is not in [0, 4)") != std::string::npos);
    for (const Array& c : table->values()) {
      CHILD_CHECK((c.to_vector<float>() == std::vector<float>{0, 0, 0, 0}));
    }
    return kChildOk;
  });
}

// A replica function that fails on one worker only, before a collective its peers wait in:
// every worker fails at once (the failing worker tells its peers), not at the timeout.
TEST_P(MultiWorkerTest, AStepThatFailsOnOneWorkerFailsEveryWorkerPromptly) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    const auto start = std::chrono::steady_clock::now();
    Status st = (*s)->run([&](ReplicaContext& ctx) -> Status {
      if (rank == 1) return invalid_argument("worker 1's input was bad");
      return ctx.all_reduce(ReduceOp::kSum, Array::scalar(1.0f)).status();
    });
    CHILD_CHECK(!st.ok());
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    std::fprintf(stderr, "rank %d got, as expected: %s\n", rank, st.to_string().c_str());
    // Worker 1 stays alive until worker 0 has checked: its exit must not be what tells worker 0.
    const std::string checked = dir_ + "/worker0_checked";
    if (rank == 0) {
      std::FILE* f = std::fopen(checked.c_str(), "w");
      if (f) std::fclose(f);
    } else {
      for (int i = 0; i < 300 && !std::filesystem::exists(checked); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, BadInputOnOneWorkerOnlyFailsEveryWorkerPromptly) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    const auto start = std::chrono::steady_clock::now();
    // On worker 1, replica 1 all-reduces a different shape: refused there before the collective.
    Status st = (*s)->run([&](ReplicaContext& ctx) -> Status {
      const bool odd = rank == 1 && ctx.local_replica_id() == 1;
      Array v =
          odd ? *Array::from_vector<float>({1, 2}, {1, 2}) : *Array::from_vector<float>({1, 2});
      return ctx.all_reduce(ReduceOp::kSum, v).status();
    });
    CHILD_CHECK(!st.ok());
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    if (rank == 1)
      CHILD_CHECK(st.message().find("every replica must reduce the same shape") !=
                  std::string::npos);
    std::fprintf(stderr, "rank %d got, as expected: %s\n", rank, st.to_string().c_str());
    // Cross-replica context too: a bad reduce on worker 0 only, with a fresh strategy.
    return kChildOk;
  });
}

TEST_P(MultiWorkerTest, BadCrossReplicaCallOnOneWorkerOnlyFailsEveryWorkerPromptly) {
  expect_all_ok(2, [&](int rank) {
    auto s = make(rank, 2, 2);
    CHILD_OK(s.status());
    const auto start = std::chrono::steady_clock::now();
    PerReplica<Array> v({Array::scalar(1.0f), Array::scalar(2.0f)});
    // Worker 0 asks for an axis its scalars do not have; worker 1 makes the valid call.
    auto r = (*s)->reduce(ReduceOp::kSum, v, rank == 0 ? std::optional<int>(0) : std::nullopt);
    CHILD_CHECK(!r.ok());
    CHILD_CHECK(std::chrono::steady_clock::now() - start < kPromptly);
    std::fprintf(stderr, "rank %d got, as expected: %s\n", rank, r.status().to_string().c_str());
    return kChildOk;
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiWorkerTest, ::testing::Values("ring", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tributary
