#include "tributary/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace tributary {
namespace {

TEST(Tensor, ViewBasics) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  Tensor t(data, DType::kFloat32, Shape{2, 3});
  EXPECT_EQ(t.num_elements(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.to_string(), "float32[2, 3]@CPU:0");
  Tensor s = t.slice(2, 3);
  EXPECT_EQ(s.data_as<float>()[0], 3.0f);
  EXPECT_EQ(s.num_elements(), 3);
  EXPECT_TRUE(t.reshaped({3, 2}).ok());
  EXPECT_FALSE(t.reshaped({4, 2}).ok());
  EXPECT_EQ(shape_num_elements({}), 1);
  EXPECT_EQ(shape_num_elements({4, -1}), -1);
}

TEST(Buffer, AllocatesAlignedAndMoves) {
  auto b = Buffer::allocate(DType::kFloat64, Shape{1000});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  EXPECT_EQ(b->nbytes(), 8000u);
  b->data_as<double>()[999] = 7.0;
  Buffer moved = std::move(b).value();
  EXPECT_EQ(moved.data_as<double>()[999], 7.0);
  Buffer other;
  other = std::move(moved);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT: the move empties the source
  EXPECT_EQ(other.data_as<double>()[999], 7.0);
  auto empty = Buffer::allocate(DType::kInt8, Shape{0});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->nbytes(), 0u);
}

TEST(Buffer, Errors) {
  EXPECT_FALSE(Buffer::allocate(DType::kFloat32, Shape{-2}).ok());
  // Sizes whose element or byte count overflows are refused, never an empty buffer that a
  // collective then writes past.
  auto bytes_overflow = Buffer::allocate(DType::kFloat32, Shape{int64_t{1} << 62});
  ASSERT_FALSE(bytes_overflow.ok());
  EXPECT_EQ(bytes_overflow.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(bytes_overflow.status().message().find("more bytes than fit"), std::string::npos);
  auto count_overflow = Buffer::allocate(DType::kInt8, Shape{int64_t{1} << 40, int64_t{1} << 40});
  ASSERT_FALSE(count_overflow.ok());
  EXPECT_EQ(count_overflow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shape_num_elements(Shape{int64_t{1} << 40, int64_t{1} << 40}), -1);
  EXPECT_EQ(shape_num_elements(Shape{int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  if (!cuda_available()) {
    auto g = Buffer::allocate(DType::kFloat32, Shape{4}, Device::cuda(0));
    EXPECT_FALSE(g.ok());
  }
}

}  // namespace
}  // namespace tributary
