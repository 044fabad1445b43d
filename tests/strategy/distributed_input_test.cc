// Distributed input in one process (reference §6): rebatching across replicas, partial batches,
// distribute_datasets_from_function, InputContext and the iterator's rules.
#include "tributary/strategy/distributed_input.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "tributary/strategy/strategies.h"

namespace tributary {
namespace {

using testing::HasSubstr;
using Steps = std::vector<std::vector<std::vector<int64_t>>>;  // step -> replica -> values

std::unique_ptr<Strategy> mirrored(int n) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  auto s = make_mirrored_strategy({devices, "", nullptr});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

Steps drain(DistributedIterator& it, int max_steps = 1000) {
  Steps steps;
  for (int k = 0; k < max_steps; ++k) {
    auto next = it.get_next();
    if (!next.ok()) {
      EXPECT_EQ(next.status().code(), StatusCode::kOutOfRange) << next.status().to_string();
      break;
    }
    std::vector<std::vector<int64_t>> step;
    for (const Element& e : next->values()) step.push_back(e[0].to_vector<int64_t>());
    steps.push_back(step);
  }
  return steps;
}

Steps distribute(int replicas, const Dataset& ds) {
  auto s = mirrored(replicas);
  auto dd = distribute_dataset(*s, ds);
  EXPECT_TRUE(dd.ok()) << dd.status().to_string();
  if (!dd.ok()) return {};
  auto it = dd->make_iterator();
  EXPECT_TRUE(it.ok());
  return drain(*it);
}

TEST(DistributeDatasetTest, TfTutorialExamplesUnderTheV2Rule) {
  // range(6).batch(4), 2 replicas -> ([0,1],[2,3]) then ([4,5],[]).
  EXPECT_EQ(distribute(2, Dataset::range(6).batch(4)), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {}}}));
  // range(4).batch(4), 5 replicas -> [0] [1] [2] [3] [].
  EXPECT_EQ(distribute(5, Dataset::range(4).batch(4)), (Steps{{{0}, {1}, {2}, {3}, {}}}));
  // range(8).batch(4), 3 replicas -> ([0,1],[2],[3]) then ([4,5],[6],[7]).
  EXPECT_EQ(distribute(3, Dataset::range(8).batch(4)),
            (Steps{{{0, 1}, {2}, {3}}, {{4, 5}, {6}, {7}}}));
}

TEST(DistributeDatasetTest, SeedDocstringRange100Batch2) {
  auto s = mirrored(2);
  auto dd = distribute_dataset(*s, Dataset::range(100).batch(2));
  ASSERT_TRUE(dd.ok());
  auto it = std::move(*dd->make_iterator());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(it.get_next().ok());
  auto sixth = it.get_next();
  ASSERT_TRUE(sixth.ok());
  EXPECT_EQ((*sixth)[0][0].to_vector<int64_t>(), std::vector<int64_t>{10});
  EXPECT_EQ((*sixth)[1][0].to_vector<int64_t>(), std::vector<int64_t>{11});
}

TEST(DistributeDatasetTest, EveryStepAddsUpToTheGlobalBatchInOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int replicas = 1 + static_cast<int>(rng() % 5);
    const int64_t global = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t total = static_cast<int64_t>(rng() % 40);
    Steps steps = distribute(replicas, Dataset::range(total).batch(global));
    std::vector<int64_t> seen;
    for (size_t k = 0; k < steps.size(); ++k) {
      int64_t in_step = 0, smallest = INT64_MAX, largest = 0;
      for (const auto& r : steps[k]) {
        in_step += static_cast<int64_t>(r.size());
        smallest = std::min<int64_t>(smallest, r.size());
        largest = std::max<int64_t>(largest, r.size());
        seen.insert(seen.end(), r.begin(), r.end());
      }
      const bool last = k + 1 == steps.size();
      if (!last || total % global == 0) {
        EXPECT_EQ(in_step, global) << "replicas " << replicas << " global " << global;
        EXPECT_LE(largest - smallest, 1);
      }
    }
    std::vector<int64_t> expected(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i) expected[i] = i;
    EXPECT_EQ(seen, expected) << "replicas " << replicas << " global " << global;
  }
}

TEST(DistributeDatasetTest, ElementSpecAndErrors) {
  auto s = mirrored(2);
  Array x = *Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {6, 1});
  auto dd = distribute_dataset(*s, Dataset::from_tensor_slices({x}).batch(4));
  ASSERT_TRUE(dd.ok());
  ASSERT_EQ(dd->element_spec().size(), 1u);
  EXPECT_EQ(dd->element_spec()[0].shape, (Shape{-1, 1}));
  auto unbatched = distribute_dataset(*s, Dataset::range(4));
  EXPECT_EQ(unbatched.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unbatched.status().message(),
              HasSubstr("Call the `batch` method on the input Dataset in order to be able to "
                        "split your input across 2 replicas."));
  InputOptions per_replica;
  per_replica.replication_mode = InputReplicationMode::kPerReplica;
  EXPECT_THAT(distribute_dataset(*s, Dataset::range(4).batch(2), per_replica).status().message(),
              HasSubstr("PER_REPLICA is only supported in `distribute_datasets_from_function`"));
  InputOptions place;
  place.place_dataset_on_device = true;
  EXPECT_THAT(distribute_dataset(*s, Dataset::range(4).batch(2), place).status().message(),
              HasSubstr("you must also specify `PER_REPLICA` for the replication mode"));
  // A batch size of 0 and a shape change mid-stream are errors from get_next, not crashes.
  auto zero = distribute_dataset(*s, Dataset::range(4).batch(0));
  EXPECT_THAT(zero.status().message(), HasSubstr("Batch size must be greater than zero."));
  Dataset ragged = Dataset::range(5)
                       .map([](Element e) -> StatusOr<Element> {
                         const int64_t n = e[0].to_vector<int64_t>()[0] < 3 ? 2 : 3;
                         TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::zeros(DType::kFloat32, {n}));
                         return Element{a};
                       })
                       .batch(4);
  auto rdd = distribute_dataset(*s, ragged);
  ASSERT_TRUE(rdd.ok()) << rdd.status().to_string();
  auto rit = std::move(*rdd->make_iterator());
  auto bad = rit.get_next();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("Cannot batch tensors with different shapes"));
}

TEST(DistributeDatasetTest, GetNextFromInsideRunIsTfsError) {
  auto s = mirrored(2);
  auto it = std::move(*distribute_dataset(*s, Dataset::range(8).batch(2))->make_iterator());
  Status st = s->run([&](ReplicaContext&) { return it.get_next().status(); });
  EXPECT_THAT(st.message(),
              HasSubstr("next(iterator) should be called from outside of replica_fn"));
}

TEST(DistributeDatasetTest, StaticShapesWithoutPartialHandlingDropAShortStep) {
  // drop_remainder makes every shape static: one worker then has no partial-batch handling, so a
  // step that cannot feed every replica ends the data (TF's _get_next_no_partial_batch_handling).
  auto s = mirrored(2);
  Array x = *Array::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto dd = distribute_dataset(*s, Dataset::from_tensor_slices({x}).batch(4, true).take(2));
  ASSERT_TRUE(dd.ok());
  auto it = std::move(*dd->make_iterator());
  EXPECT_EQ(drain(it), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}}));
}

TEST(DistributeDatasetsFromFunctionTest, TestIlUnevenBatches) {
  auto s = mirrored(2);
  for (bool drop : {false, true}) {
    std::vector<std::string> contexts;
    auto dd =
        distribute_datasets_from_function(*s, [&](const InputContext& ctx) -> StatusOr<Dataset> {
          contexts.push_back(ctx.to_string());
          EXPECT_EQ(ctx.num_replicas_in_sync(), 2);
          return Dataset::range(9).batch(2, drop);
        });
    ASSERT_TRUE(dd.ok()) << dd.status().to_string();
    EXPECT_EQ(contexts, std::vector<std::string>{
                            "tf.distribute.InputContext(input pipeline id 0, total: 1)"});
    auto it = std::move(*dd->make_iterator());
    if (drop) {
      EXPECT_EQ(drain(it), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}}));
    } else {
      EXPECT_EQ(drain(it), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}, {{8}, {}}}));
    }
  }
}

TEST(DistributeDatasetsFromFunctionTest, PerReplicaPipelinesAndInputContext) {
  auto s = mirrored(3);
  InputOptions o;
  o.replication_mode = InputReplicationMode::kPerReplica;
  auto dd = distribute_datasets_from_function(
      *s,
      [](const InputContext& ctx) -> StatusOr<Dataset> {
        EXPECT_EQ(ctx.num_input_pipelines(), 3);
        return Dataset::range(ctx.input_pipeline_id() * 100, ctx.input_pipeline_id() * 100 + 2)
            .batch(1);
      },
      o);
  ASSERT_TRUE(dd.ok()) << dd.status().to_string();
  auto it = std::move(*dd->make_iterator());
  EXPECT_EQ(drain(it), (Steps{{{0}, {100}, {200}}, {{1}, {101}, {201}}}));
  InputContext ctx(1, 0, 4);
  EXPECT_EQ(*ctx.get_per_replica_batch_size(8), 2);
  EXPECT_THAT(ctx.get_per_replica_batch_size(6).status().message(),
              HasSubstr("The `global_batch_size` 6 is not divisible by `num_replicas_in_sync` 4"));
  auto failing = distribute_datasets_from_function(
      *s,
      [](const InputContext&) -> StatusOr<Dataset> { return invalid_argument("no data here"); });
  EXPECT_THAT(failing.status().message(), HasSubstr("no data here"));
}

TEST(DistributeDatasetTest, GetNextAsOptionalEndsWithNullopt) {
  auto s = mirrored(2);
  auto it = std::move(*distribute_dataset(*s, Dataset::range(4).batch(4))->make_iterator());
  auto first = it.get_next_as_optional();
  ASSERT_TRUE(first.ok() && first->has_value());
  auto end = it.get_next_as_optional();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  EXPECT_EQ(it.get_next().status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace tributary
