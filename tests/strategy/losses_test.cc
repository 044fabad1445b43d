// compute_average_loss and scale_regularization_loss (reference §7).
#include "tributary/strategy/losses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tributary/strategy/strategies.h"

namespace tributary {
namespace {

using testing::HasSubstr;

TEST(LossesTest, AverageOverTheGlobalBatch) {
  Array loss = *Array::from_vector<float>({1, 2, 3, 4});
  // No strategy: global batch = local batch.
  EXPECT_EQ(compute_average_loss(loss)->to_vector<float>(), std::vector<float>{2.5});
  EXPECT_EQ(compute_average_loss(loss, std::nullopt, 8)->to_vector<float>(),
            std::vector<float>{1.25});
  EXPECT_EQ(compute_average_loss(loss, Array::scalar(2.0f))->to_vector<float>(),
            std::vector<float>{5});
  Array w = *Array::from_vector<float>({1, 0, 0, 1});
  EXPECT_EQ(compute_average_loss(loss, w)->to_vector<float>(), std::vector<float>{1.25});
  // Per-example weights broadcast over a [batch, 2] loss.
  Array loss2 = *Array::from_vector<float>({1, 1, 2, 2}, {2, 2});
  Array w2 = *Array::from_vector<float>({1, 3});
  EXPECT_EQ(compute_average_loss(loss2, w2)->to_vector<float>(), std::vector<float>{7});
  // Zero global batch gives zero (div_no_nan).
  EXPECT_EQ(compute_average_loss(loss, std::nullopt, 0)->to_vector<float>(), std::vector<float>{0});
}

TEST(LossesTest, Errors) {
  auto rank0 = compute_average_loss(Array::scalar(1.0f));
  EXPECT_THAT(rank0.status().message(),
              HasSubstr("Invalid value passed for `per_example_loss`. Expected a tensor with at "
                        "least rank 1."));
  auto negative = compute_average_loss(*Array::from_vector<float>({1}), std::nullopt, -1);
  EXPECT_THAT(negative.status().message(), HasSubstr("global_batch_size must be non-negative."));
  auto s = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "", nullptr});
  auto scope = (*s)->scope();
  auto cross = compute_average_loss(*Array::from_vector<float>({1}));
  EXPECT_THAT(cross.status().message(),
              HasSubstr("You are calling `compute_average_loss` in cross replica context, while "
                        "it was expected to be called in replica context."));
  EXPECT_TRUE(compute_average_loss(*Array::from_vector<float>({1}), std::nullopt, 2).ok());
  auto reg = scale_regularization_loss(Array::scalar(1.0f));
  EXPECT_THAT(reg.status().message(), HasSubstr("You are calling `scale_regularization_loss` in "
                                                "cross replica context"));
}

// TF casts to float32 only inside scale_losses_by_sample_weight, i.e. only when a weight is given:
// without one a float64 loss keeps its precision.
TEST(LossesTest, OnlyASampleWeightGoesThroughFloat32) {
  const double a = 1.0 + 1e-9, b = 0.1;
  Array loss = *Array::from_vector<double>({a, b});
  auto avg = compute_average_loss(loss);
  ASSERT_TRUE(avg.ok()) << avg.status().to_string();
  EXPECT_EQ(avg->dtype(), DType::kFloat64);
  EXPECT_EQ(avg->to_vector<double>(), std::vector<double>{(a + b) / 2});
  EXPECT_EQ(compute_average_loss(loss, std::nullopt, 1)->to_vector<double>(),
            std::vector<double>{a + b});
  // With a weight: loss and weight multiplied in float32, then cast back to float64.
  auto weighted = compute_average_loss(loss, Array::scalar(1.0f));
  ASSERT_TRUE(weighted.ok()) << weighted.status().to_string();
  EXPECT_EQ(weighted->dtype(), DType::kFloat64);
  const double expected =
      (static_cast<double>(static_cast<float>(a)) + static_cast<double>(static_cast<float>(b))) / 2;
  EXPECT_EQ(weighted->to_vector<double>(), std::vector<double>{expected});
}

TEST(LossesTest, InReplicaContextTheDefaultIsLocalBatchTimesReplicas) {
  auto s = make_mirrored_strategy({{Device::cpu(0), Device::cpu(1)}, "", nullptr});
  auto r = (*s)->run([](ReplicaContext&) -> StatusOr<std::vector<Array>> {
    TRIBUTARY_ASSIGN_OR_RETURN(Array avg, compute_average_loss(*Array::from_vector<float>({2, 4})));
    TRIBUTARY_ASSIGN_OR_RETURN(Array reg,
                               scale_regularization_loss(*Array::from_vector<float>({1, 3})));
    return std::vector<Array>{avg, reg};
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0][0].to_vector<float>(), std::vector<float>{1.5});  // 6 / (2 * 2)
  EXPECT_EQ((*r)[1][1].to_vector<float>(), std::vector<float>{2});    // 4 / 2
}

}  // namespace
}  // namespace tributary
