#include "tributary/options.h"

#include <gtest/gtest.h>

#include "core/strings.h"

namespace tributary {
namespace {

using namespace std::chrono_literals;

TEST(ParseSize, Units) {
  EXPECT_EQ(*parse_size("512"), 512u);
  EXPECT_EQ(*parse_size("4MiB"), 4u << 20);
  EXPECT_EQ(*parse_size("4M"), 4u << 20);
  EXPECT_EQ(*parse_size("64K"), 64u << 10);
  EXPECT_EQ(*parse_size("1GiB"), 1u << 30);
  EXPECT_EQ(*parse_size("1.5KiB"), 1536u);
  EXPECT_EQ(*parse_size("1kB"), 1000u);
  EXPECT_EQ(*parse_size("2 MB"), 2000000u);
  for (auto bad : {"", "MiB", "4QB", "-1", "abc", "1e400"}) {
    EXPECT_FALSE(parse_size(bad).ok()) << bad;
  }
  EXPECT_EQ(format_size(4u << 20), "4MiB");
  EXPECT_EQ(format_size(1000), "1000B");
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*parse_duration("30s"), 30s);
  EXPECT_EQ(*parse_duration("30"), 30s);
  EXPECT_EQ(*parse_duration("500ms"), 500ms);
  EXPECT_EQ(*parse_duration("2m"), 120s);
  EXPECT_EQ(*parse_duration("1h"), 3600s);
  EXPECT_EQ(*parse_duration("100us"), 100us);
  EXPECT_EQ(*parse_duration("1.5s"), 1500ms);
  EXPECT_FALSE(parse_duration("5 fortnights").ok());
  EXPECT_FALSE(parse_duration("s").ok());
  EXPECT_EQ(format_duration(90s), "90s");
  EXPECT_EQ(format_duration(120s), "2m");
  EXPECT_EQ(format_duration(250ms), "250ms");
}

TEST(BackendSpec, Grammar) {
  auto s = BackendSpec::parse("ring:chunk_bytes=4MiB, timeout = 30s");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->name, "ring");
  ASSERT_EQ(s->options.size(), 2u);
  EXPECT_EQ(s->options[0].first, "chunk_bytes");
  EXPECT_EQ(s->options[0].second, "4MiB");
  EXPECT_EQ(s->options[1].second, "30s");
  EXPECT_EQ(s->to_string(), "ring:chunk_bytes=4MiB,timeout=30s");
  auto bare = BackendSpec::parse(" NCCL ");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->name, "nccl");
  EXPECT_TRUE(bare->options.empty());
  auto device_value = BackendSpec::parse("reduction_to_one_device:reduce_to_device=CPU:1");
  ASSERT_TRUE(device_value.ok());
  EXPECT_EQ(device_value->options[0].second, "CPU:1");
}

TEST(BackendSpec, Errors) {
  for (auto bad : {"", ":a=1", "ring:", "ring:chunk", "ring:a=1,a=2", "ring:a=b=c", "ri ng",
                   "ring:=3", "ring:a=1,,b=2"}) {
    auto s = BackendSpec::parse(bad);
    EXPECT_FALSE(s.ok()) << "'" << bad << "' parsed";
    if (!s.ok()) {
      EXPECT_NE(s.status().message().find("name[:key=value"), std::string::npos);
    }
  }
}

std::vector<OptionDef> schema() {
  return {
      {.name = "chunk_bytes", .type = OptionType::kSize, .default_value = "1MiB", .help = "chunk"},
      {.name = "num_packs", .type = OptionType::kInt, .default_value = "1", .help = "packs",
       .min = 0},
      {.name = "algorithm", .type = OptionType::kEnum, .default_value = "auto", .help = "alg",
       .choices = {"auto", "ring", "halving_doubling"}},
      {.name = "nodelay", .type = OptionType::kBool, .default_value = "true", .help = "nodelay"},
      {.name = "timeout", .type = OptionType::kDuration, .default_value = "5m", .help = "t",
       .shared = true},
  };
}

TEST(Options, DefaultsEnvironmentAndSpecPrecedence) {
  Config env = Config::from_map({{"TRIBUTARY_RING_CHUNK_BYTES", "2MiB"},
                                 {"TRIBUTARY_TIMEOUT", "10s"},
                                 {"TRIBUTARY_RING_NUM_PACKS", "3"}});
  auto o = Options::resolve("ring", schema(), {{"num_packs", "4"}}, env);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->get_size("chunk_bytes"), 2u << 20);  // environment over default
  EXPECT_EQ(o->get_int("num_packs"), 4);            // spec over environment
  EXPECT_EQ(o->get_duration("timeout"), 10s);       // shared variable
  EXPECT_EQ(o->get_string("algorithm"), "auto");    // default
  EXPECT_TRUE(o->get_bool("nodelay"));
  EXPECT_EQ(o->find("num_packs")->source, "spec");
  EXPECT_EQ(o->find("chunk_bytes")->source, "code TRIBUTARY_RING_CHUNK_BYTES");
  EXPECT_EQ(o->find("algorithm")->source, "default");
  Config scoped = Config::from_map({{"TRIBUTARY_TIMEOUT", "10s"}, {"TRIBUTARY_RING_TIMEOUT", "1s"}});
  EXPECT_EQ(Options::resolve("ring", schema(), {}, scoped)->get_duration("timeout"), 1s);
}

TEST(Options, UnknownKeyListsOptionsWithTypes) {
  auto o = Options::resolve("ring", schema(), {{"chunk", "1"}}, Config());
  ASSERT_FALSE(o.ok());
  const std::string& m = o.status().message();
  EXPECT_NE(m.find("backend 'ring' has no option 'chunk'"), std::string::npos) << m;
  EXPECT_NE(m.find("chunk_bytes (size, default 1MiB)"), std::string::npos) << m;
  EXPECT_NE(m.find("algorithm (enum: auto|ring|halving_doubling"), std::string::npos) << m;
}

// A huge bad value is quoted in part, with its size, not echoed whole.
TEST(Options, HugeBadValuesAreQuotedInPart) {
  const std::string huge(1 << 20, 'x');
  auto o = Options::resolve("ring", schema(), {{"num_packs", huge}}, Config());
  ASSERT_FALSE(o.ok());
  EXPECT_LT(o.status().message().size(), 1000u) << o.status().message().substr(0, 200);
  EXPECT_NE(o.status().message().find("... (1048576 bytes)"), std::string::npos);
}

TEST(Options, BadValuesNameTheOptionAndRule) {
  struct Case {
    const char* key;
    const char* value;
    const char* expect;
  };
  for (Case c : {Case{"num_packs", "-1", "out of range"}, Case{"num_packs", "two", "integer"},
                 Case{"chunk_bytes", "4XB", "unknown size unit"},
                 Case{"algorithm", "tree", "expected one of auto, ring, halving_doubling"},
                 Case{"nodelay", "maybe", "true or false"}, Case{"timeout", "soon", "duration"}}) {
    auto o = Options::resolve("ring", schema(), {{c.key, c.value}}, Config());
    ASSERT_FALSE(o.ok()) << c.key << "=" << c.value;
    EXPECT_NE(o.status().message().find(c.key), std::string::npos) << o.status().message();
    EXPECT_NE(o.status().message().find(c.expect), std::string::npos) << o.status().message();
  }
  // A bad environment value is reported with its source.
  auto env = Options::resolve("ring", schema(), {}, Config::from_map({{"TRIBUTARY_TIMEOUT", "x"}}));
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("TRIBUTARY_TIMEOUT"), std::string::npos);
}

TEST(Options, CanonicalText) {
  auto o = Options::resolve("ring", schema(), {{"chunk_bytes", "4096K"}, {"algorithm", "RING"}},
                            Config());
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->to_string(),
            "algorithm=ring,chunk_bytes=4MiB,nodelay=true,num_packs=1,timeout=5m");
}

}  // namespace

// What "rank 1 is set up differently" shows: the entries that differ, not both whole layouts.
TEST(LayoutDifference, NamesTheEntriesThatDiffer) {
  using internal::layout_difference;
  EXPECT_EQ(layout_difference("local_replicas=1,algorithm=ring,measured",
                              "local_replicas=1,algorithm=halving_doubling,measured", "rank 1"),
            "algorithm: 'ring' here, 'halving_doubling' at rank 1");
  EXPECT_EQ(layout_difference("a=1,b=2", "a=1", "rank 0"), "b: '2' here, (none) at rank 0");
  EXPECT_EQ(layout_difference("a=1", "a=1,c=3", "rank 2"), "c: (none) here, '3' at rank 2");
  EXPECT_EQ(layout_difference("a=1,b=2", "a=9,b=8", "rank 1"),
            "a: '1' here, '9' at rank 1; b: '2' here, '8' at rank 1");
  // The same entries in another order: nothing differs by key, so both layouts are shown.
  EXPECT_EQ(layout_difference("a=1,b=2", "b=2,a=1", "rank 1"),
            "this rank: a=1,b=2; rank 1: b=2,a=1");
}

}  // namespace tributary
