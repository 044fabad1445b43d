#include "tributary/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tributary {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(all_dtypes().size(), 8u);
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kUInt8), 1u);
  for (DType d : all_dtypes()) {
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed.ok()) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
  }
}

TEST(DType, Aliases) {
  EXPECT_EQ(*parse_dtype("FP16"), DType::kFloat16);
  EXPECT_EQ(*parse_dtype(" bf16 "), DType::kBFloat16);
  EXPECT_EQ(*parse_dtype("double"), DType::kFloat64);
  EXPECT_EQ(*parse_dtype("int"), DType::kInt32);
}

TEST(DType, UnknownListsValid) {
  auto r = parse_dtype("complex64");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'complex64'"), std::string::npos);
  EXPECT_NE(r.status().message().find("bfloat16"), std::string::npos);
}

TEST(ReduceOp, ParseCaseInsensitive) {
  EXPECT_EQ(*parse_reduce_op("SUM"), ReduceOp::kSum);
  EXPECT_EQ(*parse_reduce_op("Mean"), ReduceOp::kMean);
  EXPECT_EQ(*parse_reduce_op("avg"), ReduceOp::kMean);
  EXPECT_EQ(*parse_reduce_op("prod"), ReduceOp::kProd);
  EXPECT_FALSE(parse_reduce_op("xor").ok());
  for (ReduceOp op : all_reduce_ops()) EXPECT_EQ(*parse_reduce_op(reduce_op_name(op)), op);
}

// Out-of-range values wrap modulo 2^bits (as integer reductions do) instead of being undefined
// behaviour; NaN and infinities give 0; fractions truncate toward zero.
TEST(DType, IntegerStoresWrapAndTruncate) {
  EXPECT_EQ(dtype_round(DType::kInt8, 162), -94);
  EXPECT_EQ(dtype_round(DType::kInt8, -129), 127);
  EXPECT_EQ(dtype_round(DType::kUInt8, -1), 255);
  EXPECT_EQ(dtype_round(DType::kUInt8, 256.75), 0);
  EXPECT_EQ(dtype_round(DType::kInt32, 2147483648.0), -2147483648.0);
  EXPECT_EQ(dtype_round(DType::kInt32, -2.9), -2);
  EXPECT_EQ(dtype_round(DType::kInt64, 9223372036854775808.0), -9223372036854775808.0);
  EXPECT_EQ(dtype_round(DType::kInt64, 1e30),
            dtype_round(DType::kInt64, std::fmod(1e30, 18446744073709551616.0)));
  EXPECT_EQ(dtype_round(DType::kInt32, std::nan("")), 0);
  EXPECT_EQ(dtype_round(DType::kUInt8, -INFINITY), 0);
}

}  // namespace
}  // namespace tributary
