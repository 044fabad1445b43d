#include "tributary/device.h"

#include <gtest/gtest.h>

namespace tributary {
namespace {

Device parse_ok(std::string_view s) {
  auto d = Device::parse(s);
  EXPECT_TRUE(d.ok()) << s << ": " << d.status().message();
  return d.ok() ? *d : Device();
}

TEST(Device, ShortForms) {
  EXPECT_EQ(parse_ok("CPU:0"), Device::cpu(0));
  EXPECT_EQ(parse_ok("cpu:3"), Device::cpu(3));
  EXPECT_EQ(parse_ok("/gpu:1"), Device::cuda(1));
  EXPECT_EQ(parse_ok("GPU"), Device::cuda(0));
  EXPECT_EQ(parse_ok("cuda:2"), Device::cuda(2));
  EXPECT_EQ(parse_ok("/device:GPU:5"), Device::cuda(5));
  EXPECT_EQ(parse_ok("/device:CPU:0").to_string(), "CPU:0");
  EXPECT_EQ(Device::cuda(1).to_string(), "GPU:1");
}

TEST(Device, FullTfForm) {
  Device d = parse_ok("/job:worker/replica:0/task:1/device:GPU:0");
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.index(), 0);
  EXPECT_EQ(d.job(), "worker");
  EXPECT_EQ(d.replica(), 0);
  EXPECT_EQ(d.task(), 1);
  EXPECT_EQ(d.to_string(), "/job:worker/replica:0/task:1/device:GPU:0");
  EXPECT_EQ(parse_ok(d.to_string()), d);
  Device legacy = parse_ok("/job:localhost/task:0/cpu:2");
  EXPECT_EQ(legacy.to_string(), "/job:localhost/task:0/device:CPU:2");
  EXPECT_NE(legacy, Device::cpu(2));  // placement is part of identity
}

TEST(Device, ErrorsQuoteInput) {
  for (std::string_view bad :
       {"", "TPU:0", "CPU:-1", "CPU:x", "/job:w/task:a/cpu:0", "CPU:0:1", "/job:w", "CPU:0/GPU:1",
        "//cpu:0", "/device:"}) {
    auto d = Device::parse(bad);
    EXPECT_FALSE(d.ok()) << "'" << bad << "' parsed";
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("'" + std::string(bad) + "'"), std::string::npos)
          << d.status().message();
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace tributary
