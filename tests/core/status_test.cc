#include "tributary/status.h"

#include <gtest/gtest.h>

namespace tributary {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = invalid_argument("bad thing");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid_argument: bad thing");
  EXPECT_EQ(s.with_context("while parsing").message(), "while parsing: bad thing");
  EXPECT_TRUE(Status().with_context("x").ok());
}

StatusOr<int> half(int x) {
  if (x % 2) return invalid_argument("odd");
  return x / 2;
}

Status use_macros(int x, int* out) {
  TRIBUTARY_ASSIGN_OR_RETURN(int h, half(x));
  TRIBUTARY_RETURN_IF_ERROR(h > 10 ? out_of_range("too big") : Status());
  *out = h;
  return Status();
}

TEST(StatusOr, ValueOrError) {
  auto a = half(4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 2);
  auto b = half(3);
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "odd");
  StatusOr<int> from_ok{Status()};
  EXPECT_FALSE(from_ok.ok());
  EXPECT_EQ(from_ok.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, Macros) {
  int out = 0;
  EXPECT_TRUE(use_macros(8, &out).ok());
  EXPECT_EQ(out, 4);
  EXPECT_EQ(use_macros(7, &out).message(), "odd");
  EXPECT_EQ(use_macros(40, &out).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace tributary
