// Array's element-wise math: broadcasting as TF and NumPy do it, dtype rules, TF's error texts.
#include "tributary/strategy/array.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tributary/strategy/strategy.h"
#include "tributary/strategy/variable.h"

namespace tributary {
namespace {

Array f32(std::vector<float> v, Shape shape) { return *Array::from_vector(v, std::move(shape)); }

std::vector<double> values(const StatusOr<Array>& a) {
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? a->to_doubles() : std::vector<double>{};
}

TEST(ArrayMath, BinaryOpsBroadcastAsTfDoes) {
  const Array m = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Array row = f32({10, 20, 30}, {3});
  const Array col = f32({100, 200}, {2, 1});
  EXPECT_EQ(values(add(m, row)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(values(add(row, m)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(values(subtract(m, col)), (std::vector<double>{-99, -98, -97, -196, -195, -194}));
  EXPECT_EQ(values(multiply(m, Array::scalar(2.f))), (std::vector<double>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(values(divide(m, Array::scalar(2.f))), (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}));
  // [2, 1] x [1, 3] -> [2, 3] (an outer product).
  const StatusOr<Array> outer = multiply(col, f32({1, 2, 3}, {1, 3}));
  ASSERT_TRUE(outer.ok());
  EXPECT_EQ(outer->shape(), (Shape{2, 3}));
  EXPECT_EQ(outer->to_doubles(), (std::vector<double>{100, 200, 300, 200, 400, 600}));
  EXPECT_EQ(values(maximum(m, Array::scalar(3.5f))), (std::vector<double>{3.5, 3.5, 3.5, 4, 5, 6}));
  EXPECT_EQ(values(minimum(m, Array::scalar(3.5f))), (std::vector<double>{1, 2, 3, 3.5, 3.5, 3.5}));
  EXPECT_EQ(values(squared_difference(m, row)),
            (std::vector<double>{81, 324, 729, 36, 225, 576}));
  // The broadcast shape is the output's even when a is the smaller one.
  EXPECT_EQ(add(row, m)->shape(), (Shape{2, 3}));
}

TEST(ArrayMath, IncompatibleShapesAndDtypesAreRefusedWithTfsWords) {
  const StatusOr<Array> r = add(f32({1, 2, 3, 4, 5, 6}, {2, 3}), f32({1, 2, 3, 4}, {4}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Incompatible shapes: [2,3] vs. [4]"), std::string::npos)
      << r.status().message();
  const StatusOr<Array> d = multiply(Array::scalar(1.f), Array::scalar(1.0));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cast() one of them first"), std::string::npos);
}

TEST(ArrayMath, IntegerDivisionTruncatesAndRefusesZero) {
  const Array a = *Array::from_vector<int32_t>({7, -7, 6}, {3});
  EXPECT_EQ(values(divide(a, Array::scalar<int32_t>(2))), (std::vector<double>{3, -3, 3}));
  const StatusOr<Array> z = divide(a, Array::scalar<int32_t>(0));
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("Integer division by zero"), std::string::npos);
  // Floating division by zero is IEEE's.
  const std::vector<double> inf = values(divide(Array::scalar(1.f), Array::scalar(0.f)));
  ASSERT_EQ(inf.size(), 1u);
  EXPECT_TRUE(std::isinf(inf[0]));
}

// Integers are computed exactly, as TF's integer kernels: int64 beyond 2^53 (a double would drop
// the last bits), and narrow types wrap around.
TEST(ArrayMath, IntegerOpsAreExactAndWrapAsTf) {
  const int64_t big = (int64_t{1} << 53) + 1;
  auto sum = add(*Array::from_vector<int64_t>({big}), Array::scalar<int64_t>(1));
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->to_vector<int64_t>(), std::vector<int64_t>{big + 1});
  auto product = multiply(*Array::from_vector<int64_t>({big}), Array::scalar<int64_t>(3));
  ASSERT_TRUE(product.ok());
  EXPECT_EQ(product->to_vector<int64_t>(), std::vector<int64_t>{3 * big});
  auto wrapped = add(*Array::from_vector<int8_t>({127, -128}), Array::scalar<int8_t>(1));
  ASSERT_TRUE(wrapped.ok());
  EXPECT_EQ(wrapped->to_vector<int8_t>(), (std::vector<int8_t>{-128, -127}));
  auto under = subtract(*Array::from_vector<uint8_t>({3}), Array::scalar<uint8_t>(5));
  ASSERT_TRUE(under.ok());
  EXPECT_EQ(under->to_vector<uint8_t>(), std::vector<uint8_t>{254});
  auto v = default_strategy().create_variable(Array::scalar<int64_t>(big));
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->assign_add(Array::scalar<int64_t>(1)).ok());
  EXPECT_EQ(v->values()[0].to_vector<int64_t>(), std::vector<int64_t>{big + 1});
}

TEST(ArrayMath, UnaryOps) {
  const Array a = f32({-2, 0, 1, 4}, {2, 2});
  EXPECT_EQ(values(negative(a)), (std::vector<double>{2, 0, -1, -4}));
  EXPECT_EQ(values(abs(a)), (std::vector<double>{2, 0, 1, 4}));
  EXPECT_EQ(values(square(a)), (std::vector<double>{4, 0, 1, 16}));
  EXPECT_EQ(values(sqrt(f32({0, 1, 4, 9}, {4}))), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_NEAR(values(exp(Array::scalar(1.f)))[0], std::exp(1.0), 1e-6);
  EXPECT_NEAR(values(log(Array::scalar(std::exp(2.f))))[0], 2.0, 1e-6);
  EXPECT_EQ(values(sigmoid(Array::scalar(0.f)))[0], 0.5);
  EXPECT_EQ(sigmoid(a)->shape(), (Shape{2, 2}));
  // Integer arrays: the arithmetic ones work, the transcendental ones are refused.
  EXPECT_EQ(values(square(Array::scalar<int64_t>(-3))), (std::vector<double>{9}));
  const StatusOr<Array> bad = sqrt(Array::scalar<int32_t>(4));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs a floating dtype"), std::string::npos);
}

TEST(ArrayMath, MatmulAndMeans) {
  const Array a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Array b = f32({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(values(matmul(a, b)), (std::vector<double>{4, 5, 10, 11}));
  EXPECT_EQ(matmul(a, b)->shape(), (Shape{2, 2}));
  // a^T a: [3, 3].
  const StatusOr<Array> ata = matmul(a, a, /*transpose_a=*/true);
  ASSERT_TRUE(ata.ok());
  EXPECT_EQ(ata->shape(), (Shape{3, 3}));
  EXPECT_EQ(ata->to_doubles(), (std::vector<double>{17, 22, 27, 22, 29, 36, 27, 36, 45}));
  // a a^T: [2, 2].
  EXPECT_EQ(values(matmul(a, a, false, /*transpose_b=*/true)), (std::vector<double>{14, 32, 32, 77}));
  const StatusOr<Array> bad = matmul(a, a);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Matrix size-incompatible: In[0]: [2,3], In[1]: [2,3]"),
            std::string::npos)
      << bad.status().message();
  EXPECT_EQ(values(reduce_mean(a, 0)), (std::vector<double>{2.5, 3.5, 4.5}));
  EXPECT_EQ(values(reduce_mean(a, 1)), (std::vector<double>{2, 5}));
  EXPECT_EQ(reduce_mean_all(a).to_doubles(), (std::vector<double>{3.5}));
  EXPECT_TRUE(std::isnan(reduce_mean_all(f32({}, {0})).at(0)));
}

TEST(ArrayMath, ArraysOfAnyCpuReplicaWork) {
  // Replica functions hold arrays labelled CPU:i; they are ordinary host memory.
  const Array a = *f32({1, 2}, {2}).to_device(Device::cpu(1));
  EXPECT_EQ(values(multiply(a, a)), (std::vector<double>{1, 4}));
}

}  // namespace
}  // namespace tributary
