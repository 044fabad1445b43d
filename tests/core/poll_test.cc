// The `poll` option of the multi-process backends (ring, ucx): how long a wait polls before
// sleeping, for each mode, on a host with a core per rank and on an oversubscribed one.
#include <gtest/gtest.h>

#include <string>

#include "core/cpus.h"
#include "core/rendezvous.h"
#include "tributary/cross_device_ops.h"

namespace tributary::internal {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

BackendContext with_local_ranks(int n) {
  BackendContext c;
  c.world_size = n;
  c.config = Config::from_map({{"TRIBUTARY_LOCAL_WORLD_SIZE", std::to_string(n)}});
  return c;
}

TEST(Poll, EachModeOnAHostWithACorePerRank) {
  const BackendContext one = with_local_ranks(1);
  EXPECT_EQ(poll_duration("on", one), microseconds(50));
  EXPECT_EQ(poll_duration("off", one), nanoseconds(0));
  EXPECT_EQ(poll_duration("auto", one), microseconds(50));
  EXPECT_EQ(poll_duration("always", one), kPollAlways);
  EXPECT_GE(kPollAlways, std::chrono::hours(24));  // longer than any timeout a user sets
  for (const char* mode : {"on", "off", "auto", "always"}) {
    EXPECT_EQ(yield_duration(mode, one), nanoseconds(0)) << mode;
  }
}

// A backend may poll longer when on (ucx: 1 ms, since a rank asleep on UCX's event descriptor pays
// a wake-up per protocol step); auto follows it with a core per rank and still stops polling on an
// oversubscribed host.
TEST(Poll, TheBackendsOwnDurationForOn) {
  const BackendContext one = with_local_ranks(1);
  const int cores = online_cpus();
  const BackendContext many = with_local_ranks(cores + 1);
  EXPECT_EQ(poll_duration("on", one, milliseconds(1)), milliseconds(1));
  EXPECT_EQ(poll_duration("auto", one, milliseconds(1)), milliseconds(1));
  EXPECT_EQ(poll_duration("auto", many, milliseconds(1)), nanoseconds(0));
  EXPECT_EQ(poll_duration("off", one, milliseconds(1)), nanoseconds(0));
  EXPECT_EQ(poll_duration("always", one, milliseconds(1)), kPollAlways);
}

// More ranks than cores: auto stops polling and yields the core for up to 1 ms instead; the
// explicit modes do what they say.
TEST(Poll, EachModeOnAnOversubscribedHost) {
  const int cores = online_cpus();
  const BackendContext many = with_local_ranks(cores + 1);
  EXPECT_EQ(poll_duration("auto", many), nanoseconds(0));
  EXPECT_EQ(yield_duration("auto", many), milliseconds(1));
  EXPECT_EQ(poll_duration("on", many), microseconds(50));
  EXPECT_EQ(poll_duration("always", many), kPollAlways);
  EXPECT_EQ(yield_duration("always", many), nanoseconds(0));
}

// A host's launcher counts only its own ranks (LOCAL_WORLD_SIZE), but network namespaces or
// containers of one machine share its cores: the ranks a backend found on this kernel count too.
TEST(Poll, RanksOnThisMachinesKernelCountLikeLocalRanks) {
  const int cores = online_cpus();
  const BackendContext one = with_local_ranks(1);
  const MachineShare full{.ranks = cores}, over{.ranks = cores + 1};
  EXPECT_EQ(poll_duration("auto", one, microseconds(50), full), microseconds(50));
  EXPECT_EQ(yield_duration("auto", one, full), nanoseconds(0));
  EXPECT_EQ(poll_duration("auto", one, microseconds(50), over), nanoseconds(0));
  EXPECT_EQ(yield_duration("auto", one, over), milliseconds(1));
  // The explicit modes still do what they say.
  EXPECT_EQ(poll_duration("on", one, microseconds(50), over), microseconds(50));
  EXPECT_EQ(yield_duration("on", one, over), nanoseconds(0));
}

// The CPUs the machine's ranks may run on (their affinities' union), when known, count instead of
// the machine's: two ranks under `taskset -c 0` are oversubscribed on any machine, and as many
// ranks as the CPUs they were given are not.
TEST(Poll, TheRanksCpusCountWhenKnown) {
  const BackendContext two = with_local_ranks(2);
  EXPECT_TRUE(oversubscribed({.ranks = 2, .cpus = 1}));
  EXPECT_EQ(poll_duration("auto", two, microseconds(50), {.ranks = 2, .cpus = 1}), nanoseconds(0));
  EXPECT_EQ(yield_duration("auto", two, {.ranks = 2, .cpus = 1}), milliseconds(1));
  EXPECT_FALSE(oversubscribed({.ranks = 2, .cpus = 2}));
  EXPECT_EQ(poll_duration("auto", two, microseconds(50), {.ranks = 2, .cpus = 2}),
            microseconds(50));
  // Unknown CPUs: the machine's.
  EXPECT_TRUE(oversubscribed({.ranks = online_cpus() + 1}));
  EXPECT_FALSE(oversubscribed({.ranks = online_cpus()}));
  // The waits count LOCAL_WORLD_SIZE too: 3 ranks on this host's 2 CPUs, whatever the layout found.
  EXPECT_EQ(poll_duration("auto", with_local_ranks(3), microseconds(50), {.ranks = 2, .cpus = 2}),
            nanoseconds(0));
  EXPECT_EQ(yield_duration("auto", with_local_ranks(3), {.ranks = 2, .cpus = 2}), milliseconds(1));
}

}  // namespace
}  // namespace tributary::internal
