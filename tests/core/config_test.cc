#include "tributary/cluster.h"
#include "tributary/config.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace tributary {
namespace {

TEST(Config, FromJsonMapsOntoKeys) {
  auto c = Config::from_json(R"({
      "cross_device_ops": {"name": "hierarchical_copy", "options": {"num_packs": 2}},
      "log_level": "info",
      "timeout": "30s",
      "backends": {"ring": {"chunk_bytes": "4MiB", "nodelay": true}}})",
                             "test.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->get("TRIBUTARY_CROSS_DEVICE_OPS"), "hierarchical_copy:num_packs=2");
  EXPECT_EQ(c->get("TRIBUTARY_LOG_LEVEL"), "info");
  EXPECT_EQ(c->get("TRIBUTARY_TIMEOUT"), "30s");
  EXPECT_EQ(c->get("TRIBUTARY_RING_CHUNK_BYTES"), "4MiB");
  EXPECT_EQ(c->get("TRIBUTARY_RING_NODELAY"), "true");
  EXPECT_EQ(c->find("TRIBUTARY_TIMEOUT")->source, "file test.json");
  auto s = Config::from_json(R"({"cross_device_ops": "ring:timeout=1s"})", "s");
  EXPECT_EQ(s->get("TRIBUTARY_CROSS_DEVICE_OPS"), "ring:timeout=1s");
}

TEST(Config, MalformedFilesAreErrors) {
  auto bad_json = Config::from_json("{ not json", "a.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("a.json is not valid JSON"), std::string::npos);
  auto unknown = Config::from_json(R"({"crossdeviceops": "x"})", "b.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'crossdeviceops' is not a known key"),
            std::string::npos);
  EXPECT_NE(unknown.status().message().find("cross_device_ops"), std::string::npos);
  EXPECT_FALSE(Config::from_json("[1,2]", "c").ok());
  EXPECT_FALSE(Config::from_json(R"({"backends": {"ring": 3}})", "d").ok());
  EXPECT_FALSE(Config::from_json(R"({"timeout": [1]})", "e").ok());
  EXPECT_FALSE(Config::from_json(R"({"cross_device_ops": {"options": {}}})", "f").ok());
  EXPECT_EQ(Config::from_file("/nonexistent/x.json").status().code(), StatusCode::kNotFound);
}

// Settings files are read only when they are regular files of sane size: /dev/zero used to abort
// with std::bad_alloc, and a FIFO blocked forever.
TEST(Config, FilesThatAreNotSmallRegularFilesAreErrors) {
  auto zero = Config::from_file("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("not a regular file"), std::string::npos)
      << zero.status().message();
  const std::string fifo = ::testing::TempDir() + "/tributary_config_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = Config::from_file(fifo);  // returns at once, no writer needed
  ::unlink(fifo.c_str());
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_NE(from_fifo.status().message().find("not a regular file"), std::string::npos);
  EXPECT_FALSE(Config::from_file(::testing::TempDir()).ok());  // a directory
  const std::string big = ::testing::TempDir() + "/tributary_config_big.json";
  {
    std::ofstream f(big);
    f << std::string((size_t{1} << 20) + 1, ' ');
  }
  auto too_big = Config::from_file(big);
  ::unlink(big.c_str());
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("at most 1048576"), std::string::npos)
      << too_big.status().message();
}

TEST(Config, EnvironmentWinsOverFile) {
  std::string path = ::testing::TempDir() + "/tributary_config_test.json";
  {
    std::ofstream f(path);
    f << R"({"cross_device_ops": "hierarchical_copy", "log_level": "debug"})";
  }
  ::setenv("TRIBUTARY_CONFIG_FILE", path.c_str(), 1);
  ::setenv("TRIBUTARY_CROSS_DEVICE_OPS", "reduction_to_one_device", 1);
  auto c = Config::load();
  ::unsetenv("TRIBUTARY_CONFIG_FILE");
  ::unsetenv("TRIBUTARY_CROSS_DEVICE_OPS");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->get("TRIBUTARY_CROSS_DEVICE_OPS"), "reduction_to_one_device");
  EXPECT_EQ(c->find("TRIBUTARY_CROSS_DEVICE_OPS")->source, "environment");
  EXPECT_EQ(c->get("TRIBUTARY_LOG_LEVEL"), "debug");
  EXPECT_NE(c->dump().find("TRIBUTARY_LOG_LEVEL=debug  (file " + path + ")"), std::string::npos);
}

TEST(Config, DumpHidesSecrets) {
  Config c = Config::from_map({{"TRIBUTARY_SECRET", "hunter2"}});
  EXPECT_EQ(c.dump().find("hunter2"), std::string::npos);
}

TEST(Config, NumbersTooLargeForAnyTypeAreAnErrorNotAnAbort) {
  // Found by fuzz_config: nlohmann throws out_of_range (not parse_error) for this number.
  auto c = Config::from_json(R"({"timeout": 6660e0000733})", "big.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("big.json"), std::string::npos) << c.status().message();
  auto tf = parse_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 1e999}})");
  ASSERT_FALSE(tf.ok());
  EXPECT_EQ(tf.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tributary
