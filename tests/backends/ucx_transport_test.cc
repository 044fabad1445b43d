// The ucx backend's transport, with real processes and real UCX (over TCP loopback): authenticated
// messages. A relay on UCX's wire cannot be built here (UCX's own TCP framing and worker
// addresses), so the bytes are changed at the sender's side of the wire instead, after their MAC
// was computed (UcxTransportOptions::tamper_for_test), which is what a relay on the path would do.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/ucx/ucx_transport.h"
#include "tests/multiprocess/conformance.h"
#include "tests/multiprocess/harness.h"
#include "tributary/store.h"

namespace tributary::testing {
namespace {

using namespace std::chrono_literals;
using algorithms::MessageTag;

constexpr int kChildSawError = 3;

void write_note(const std::string& dir, int rank, const std::string& text) {
  std::ofstream(dir + "/note" + std::to_string(rank)) << text;
}

std::string read_note(const std::string& dir, int rank) {
  std::ifstream in(dir + "/note" + std::to_string(rank));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A sender stays (up to 10 s) until rank 0 noted its finding, as a peer in a collective would.
void linger_until_noted(const std::string& dir) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!std::ifstream(dir + "/note0") && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
}

backends::UcxTransportOptions options(bool authenticate) {
  backends::UcxTransportOptions o;
  o.tls = "tcp";
  o.secret = "s3cret";
  o.cluster_id = "ucx-transport-test";
  o.layout = "test";
  o.host_id = "this-host";
  o.timeout = 20s;
  o.authenticate_frames = authenticate;
  return o;
}

MessageTag tag_of(uint64_t sequence, int64_t count) {
  MessageTag t;
  t.sequence = sequence;
  t.count = count;
  return t;
}

// Rank 1 sends rank 0 two messages of `count` floats (1.0 and 2.0); the second is changed on the
// way. Rank 0 notes what it got.
void tampered_exchange(const std::string& dir, bool authenticate, int64_t count) {
  GroupResult g = run_group(2, 60s, [&](int rank) {
    auto store = FileStore::open(dir + "/store");
    if (!store.ok()) return kChildFailed;
    backends::UcxTransportOptions o = options(authenticate);
    int sent = 0;
    if (rank == 1) {
      o.tamper_for_test = [&sent](int, std::span<std::byte> bytes) {
        if (sent++ == 1 && !bytes.empty()) bytes[bytes.size() / 2] ^= std::byte{0x40};
      };
    }
    auto t = backends::UcxTransport::create(**store, rank, 2, o);
    if (!t.ok()) {
      write_note(dir, rank, "setup: " + t.status().to_string());
      return kChildFailed;
    }
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    std::string note;
    for (uint64_t m = 0; m < 2; ++m) {
      std::vector<float> x(static_cast<size_t>(count), rank == 1 ? static_cast<float>(m + 1) : 0.0f);
      const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(x.data()), x.size() * 4);
      auto r = rank == 1 ? (*t)->isend(0, tag_of(m, count), bytes)
                         : (*t)->irecv(1, tag_of(m, count), bytes);
      Status s = r.ok() ? (*t)->wait(*r, deadline) : r.status();
      if (rank == 1) {  // the sender's view is not what is tested; it lingers as a live peer would
        if (m == 1) linger_until_noted(dir);
        continue;
      }
      if (!s.ok()) {
        const bool untouched =
            std::all_of(x.begin(), x.end(), [](float f) { return f == 0.0f; });
        write_note(dir, 0, note + "error: " + s.to_string() +
                               (untouched ? " [buffer untouched]" : " [buffer written]"));
        return kChildSawError;
      }
      const bool right = std::all_of(x.begin(), x.end(), [&](float f) { return f == m + 1.0f; });
      note += right ? "right; " : "wrong; ";
    }
    if (rank == 0) write_note(dir, 0, note);
    return kChildOk;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[0].exit_code, authenticate ? kChildSawError : kChildOk)
      << g.describe() << ": " << read_note(dir, 0) << " / " << read_note(dir, 1);
}

// With a secret, a changed message fails its receive saying why, after an intact one was delivered
// right; small messages (tag inline, staged) are rejected before the caller's buffer sees them.
// Without the MAC (the control), the same change reaches the result, which is what the MAC is for.
TEST(UcxSecurity, ChangedMessagesFailAuthenticationNotTheResult) {
  for (const int64_t count : {int64_t{1024}, int64_t{1} << 18}) {  // 4 KiB inline, 1 MiB separate
    for (const bool authenticate : {true, false}) {
      SCOPED_TRACE(std::to_string(count * 4) + " bytes, authenticate_frames=" +
                   (authenticate ? "true" : "false"));
      const std::string dir = make_temp_dir("ucx_tamper");
      tampered_exchange(dir, authenticate, count);
      const std::string note = read_note(dir, 0);
      if (authenticate) {
        EXPECT_EQ(note.rfind("right; error: ", 0), 0u) << note;
        EXPECT_NE(note.find("failed authentication"), std::string::npos) << note;
        EXPECT_NE(note.find("from rank 1"), std::string::npos) << note;
        if (count * 4 <= 16 * 1024) {
          EXPECT_NE(note.find("[buffer untouched]"), std::string::npos) << note;
        }
      } else {
        EXPECT_EQ(note, "right; wrong; ") << "the change did not reach the data";
      }
    }
  }
}

// With the MAC on, ranks that disagree on a message's size still fail with the mismatch (never a
// wait for a tag that will not come), whichever side sends the small (inline) message.
TEST(UcxSecurity, MismatchedSizesWithTheMacAreAMismatchOnBothPaths) {
  for (const bool small_sender : {true, false}) {
    SCOPED_TRACE(small_sender ? "4 KiB sent, 1 MiB expected" : "1 MiB sent, 4 KiB expected");
    const std::string dir = make_temp_dir("ucx_mac_mismatch");
    GroupResult g = run_group(2, 60s, [&](int rank) {
      auto store = FileStore::open(dir + "/store");
      if (!store.ok()) return kChildFailed;
      auto t = backends::UcxTransport::create(**store, rank, 2, options(true));
      if (!t.ok()) {
        write_note(dir, rank, "setup: " + t.status().to_string());
        return kChildFailed;
      }
      const int64_t count = (rank == 1) == small_sender ? 1024 : int64_t{1} << 18;
      std::vector<float> x(static_cast<size_t>(count), 1.0f);
      const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(x.data()), x.size() * 4);
      const auto start = std::chrono::steady_clock::now();
      auto r = rank == 1 ? (*t)->isend(0, tag_of(0, count), bytes)
                         : (*t)->irecv(1, tag_of(0, count), bytes);
      const Status s = r.ok() ? (*t)->wait(*r, start + 15s) : r.status();
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      write_note(dir, rank, s.to_string() + "\nseconds=" + std::to_string(took));
      if (rank == 1) linger_until_noted(dir);
      return s.ok() ? kChildOk : kChildSawError;
    });
    ASSERT_FALSE(g.watchdog_fired) << g.describe();
    EXPECT_EQ(g.children[0].exit_code, kChildSawError) << read_note(dir, 0);
    EXPECT_NE(read_note(dir, 0).find("collective mismatch"), std::string::npos)
        << read_note(dir, 0);
    // Found when the message arrives, not at the wait's 15 s deadline.
    const std::string note = read_note(dir, 0);
    const size_t at = note.find("seconds=");
    ASSERT_NE(at, std::string::npos) << note;
    EXPECT_LT(std::stod(note.substr(at + 8)), 5.0) << note;
  }
}

// A transport or device UCX does not have is an error at setup that keeps UCX's text and names
// what was asked for, never a hang waiting for peers (UCX fails before any exchange).
// Over TCP alone a ring step's chunk goes whole up to 1 MiB and in 1 MiB segments above (each
// message costs UCX a protocol exchange); with shared memory allowed the algorithms' rule stays.
TEST(UcxSegments, OverTcpChunksGoWholeUpTo1MiB) {
  MemoryStore store;
  backends::UcxTransportOptions o = options(false);
  o.secret.clear();
  auto tcp = backends::UcxTransport::create(store, 0, 1, o);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  constexpr size_t KiB = 1024, MiB = 1024 * 1024;
  EXPECT_EQ((*tcp)->preferred_segment_bytes(100 * KiB), 100 * KiB);
  EXPECT_EQ((*tcp)->preferred_segment_bytes(512 * KiB), 512 * KiB);
  EXPECT_EQ((*tcp)->preferred_segment_bytes(MiB), MiB);
  EXPECT_EQ((*tcp)->preferred_segment_bytes(MiB + 4), MiB);
  EXPECT_EQ((*tcp)->preferred_segment_bytes(64 * MiB), MiB);
  EXPECT_EQ((*tcp)->preferred_segment_bytes(0), MiB);  // never 0, which would mean "no view"
  o.tls = "sm";
  auto sm = backends::UcxTransport::create(store, 0, 1, o);
  ASSERT_TRUE(sm.ok()) << sm.status().to_string();
  EXPECT_EQ((*sm)->preferred_segment_bytes(2 * MiB), 0u);
}

// Setup warms UCX's shared-memory FIFO toward every peer on this host with one round of it, as
// UCX's configuration sizes it (here through the environment), and nothing of the warm-up reaches
// the messages that follow; over TCP alone there is nothing to warm.
// `posix`: both ranks' UCX posix FIFO_SIZE; `sysv0`, `sysv1`: rank 0's and rank 1's sysv one.
void expect_warm_up(const std::string& tls, const char* posix, const char* sysv0, const char* sysv1,
                    int want) {
  const std::string dir = make_temp_dir("ucx_warm_up");
  GroupResult g = run_group(2, 60s, [&](int rank) {
    setenv("UCX_POSIX_FIFO_SIZE", posix, 1);
    setenv("UCX_SYSV_FIFO_SIZE", rank == 0 ? sysv0 : sysv1, 1);
    auto store = FileStore::open(dir + "/store");
    if (!store.ok()) return kChildFailed;
    backends::UcxTransportOptions o = options(true);
    o.tls = tls;
    auto t = backends::UcxTransport::create(**store, rank, 2, o);
    if (!t.ok()) {
      write_note(dir, rank, "setup: " + t.status().to_string());
      return kChildFailed;
    }
    const int peer = 1 - rank;
    if ((*t)->warm_up_messages(peer) != want || (*t)->warm_up_messages(rank) != 0) {
      write_note(dir, rank,
                 "warmed " + std::to_string((*t)->warm_up_messages(peer)) + " toward the peer, " +
                     std::to_string((*t)->warm_up_messages(rank)) + " toward itself");
      return kChildFailed;
    }
    // More messages than the FIFO holds, each of the warm-up's size, each way.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (uint64_t m = 0; m < 100; ++m) {
      std::vector<float> out(1024, static_cast<float>(rank * 1000 + m)), in(1024, -1.0f);
      auto r = (*t)->irecv(peer, tag_of(m, 1024),
                           std::span(reinterpret_cast<std::byte*>(in.data()), in.size() * 4));
      auto w = (*t)->isend(peer, tag_of(m, 1024),
                           std::span(reinterpret_cast<std::byte*>(out.data()), out.size() * 4));
      Status s = r.ok() ? (*t)->wait(*r, deadline) : r.status();
      if (s.ok()) s = w.ok() ? (*t)->wait(*w, deadline) : w.status();
      const float sent = static_cast<float>(peer * 1000 + m);
      if (!s.ok() || !std::all_of(in.begin(), in.end(), [&](float f) { return f == sent; })) {
        write_note(dir, rank,
                   "message " + std::to_string(m) + ": " +
                       (s.ok() ? std::string("wrong bytes") : s.to_string()));
        return kChildFailed;
      }
    }
    return kChildOk;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(g.children[static_cast<size_t>(r)].exit_code, kChildOk)
        << "tls=" << tls << ", FIFO_SIZE posix " << posix << ", sysv " << sysv0 << "/" << sysv1
        << ": " << g.describe() << ": " << read_note(dir, r);
  }
}

void expect_warm_up(const std::string& tls, const char* fifo_size, int want) {
  expect_warm_up(tls, fifo_size, fifo_size, fifo_size, want);
}

TEST(UcxSetup, PeersOnThisHostWarmOneRoundOfUcxsSharedMemoryFifo) {
  expect_warm_up("sm", "16", 16);
  expect_warm_up("sm", "32", 32);  // UCX takes powers of two
  expect_warm_up("tcp", "16", 0);
  // Where one rank counts a larger FIFO (a sysv one that tls=posix leaves unused), the pair agrees
  // on the smaller round instead of one waiting for messages the other never sends.
  expect_warm_up("posix", "16", "256", "16", 16);
}

// A same-host peer that exits before its warm-up messages come fails the rank waiting for them at
// once, naming it, not at the setup deadline.
TEST(UcxSetup, APeerThatExitsBeforeTheWarmUpIsNamedAtOnce) {
  const std::string dir = make_temp_dir("ucx_warm_up_exit");
  const auto start = std::chrono::steady_clock::now();
  GroupResult g = run_group(2, 60s, [&](int rank) {
    auto store = FileStore::open(dir + "/store");
    if (!store.ok()) return kChildFailed;
    backends::UcxTransportOptions o = options(false);
    o.tls = "sm";
    o.timeout = 30s;
    if (rank == 1) o.before_warm_up_for_test = [] { _exit(kChildOk); };
    auto t = backends::UcxTransport::create(**store, rank, 2, o);
    write_note(dir, rank, t.ok() ? std::string("set up") : t.status().to_string());
    return t.ok() ? kChildFailed : kChildSawError;
  });
  ASSERT_FALSE(g.watchdog_fired) << g.describe();
  EXPECT_EQ(g.children[0].exit_code, kChildSawError) << g.describe();
  const std::string note = read_note(dir, 0);
  EXPECT_NE(note.find("rank 1"), std::string::npos) << note;
  EXPECT_NE(note.find("exited"), std::string::npos) << note;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << note;
}

TEST(UcxSetup, UnknownTransportsAndDevicesAreErrorsNamingThem) {
  for (const auto& [tls, devices] : {std::pair<std::string, std::string>{"bogus", ""},
                                     std::pair<std::string, std::string>{"tcp", "nosuchnic0"}}) {
    MemoryStore store;
    backends::UcxTransportOptions o = options(false);
    o.tls = tls;
    o.net_devices = devices;
    o.timeout = 5s;
    const auto start = std::chrono::steady_clock::now();
    auto t = backends::UcxTransport::create(store, 0, 2, o);
    ASSERT_FALSE(t.ok()) << tls << " " << devices;
    const std::string m = t.status().message();
    EXPECT_NE(m.find("(UCX)"), std::string::npos) << m;  // UCX's own status text
    EXPECT_NE(m.find(devices.empty() ? "tls=bogus" : "net_devices=nosuchnic0"), std::string::npos)
        << m;
    EXPECT_NE(m.find("ucx_info -d"), std::string::npos) << m;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s) << m;
  }
}

}  // namespace
}  // namespace tributary::testing

// What the suite expects ucx to run, rather than what ucx says it runs.
TEST(UcxCapabilities, EveryCollectiveOpAndDtypeOnCpu) {
  tributary::testing::expect_every_cpu_capability("ucx");
}

// The multi-process conformance suite (every collective x op x dtype, world sizes 1 to 5) over
// UCX's shared memory and TCP transports, and with every message authenticated (a MAC inline up to
// 16 KiB, a tag message of its own above).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxSharedMemory, "ucx:tls=sm");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxTcp, "ucx:tls=tcp");
// Authenticated, and the ring all-reduce in slices (65537 elements of every dtype are several).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(UcxTcpAuthenticated,
                                   "ucx:tls=tcp,authenticate_frames=true,algorithm=ring,"
                                   "slice_bytes=16KiB");

// Several hosts (network namespaces joined by a bridge; a skip that says why where they cannot be
// made): hierarchical by default where a host runs several processes (a UCX group inside each host,
// one across hosts per local rank), flat where it is forced off or each host runs one. Peers on
// other hosts are in UCX's peer error-handling mode, which no one-host case reaches.
TRIBUTARY_MULTIHOST_CONFORMANCE(Ucx, HostsParam{"ucx", 2, 2, 1},
                                HostsParam{"ucx:tls=tcp,algorithm=ring", 2, 2, 2},
                                HostsParam{"ucx:hierarchy=off", 2, 2, 1},
                                HostsParam{"ucx", 3, 1, 1},
                                HostsParam{"ucx:hierarchy=on", 2, 1, 1});
// A rank killed on another "host": UCX's peer error-handling mode (keepalive) is what tells the
// survivors across hosts, flat and hierarchical.
TRIBUTARY_MULTIHOST_FAULTS(Ucx, "ucx", "ucx:hierarchy=off");
