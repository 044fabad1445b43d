// tributary-bench's logic that needs no run of the tool: the direct TCP line's exchange
// (bench/lines.h), over real sockets, and how the ranks agree on a reference line (runner.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "bench/lines.h"
#include "bench/runner.h"
#include "tributary/store.h"

namespace tributary::bench {
namespace {

using internal::ring_link_bytes;
using internal::tcp_exchange;
using internal::TcpExchange;

TEST(RingLinkBytes, IsTwiceNMinusOneOverNOfTheMessageInWholeBlocks) {
  EXPECT_EQ(ring_link_bytes(1 << 20, 2), size_t{1} << 20);   // 2 ranks: the message
  EXPECT_EQ(ring_link_bytes(1 << 20, 4), size_t{3} << 19);   // 4 ranks: 1.5x
  EXPECT_EQ(ring_link_bytes(1000, 3), size_t{2} * 2 * 333);  // whole blocks of 333
  EXPECT_EQ(ring_link_bytes(1 << 20, 1), 0u);                // no link
  EXPECT_EQ(ring_link_bytes(0, 8), 0u);
}

// A connected pair of stream sockets (both ends in this process).
struct Pair {
  int fd[2] = {-1, -1};
  Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~Pair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 7 + static_cast<size_t>(seed)) % 251);
  return v;
}

// Nothing is left on the socket: the peer sent exactly what this end took.
bool drained(int fd) {
  std::byte b;
  return ::recv(fd, &b, 1, MSG_DONTWAIT) < 0;
}

// Both ends exchange `total` bytes at once over one connection (as two ranks do), cycling over a
// `span`-byte buffer that the total does not divide: each end receives exactly `total` bytes, the
// peer's pattern, and nothing more.
TEST(TcpExchange, MovesExactlyTotalBothWaysOverOneConnection) {
  Pair p;
  const size_t span = 3001, total = 5 * span + 123;  // larger than the socket buffers
  std::vector<std::byte> from_a = pattern(span, 1), from_b = pattern(span, 2);
  std::vector<std::byte> into_a(span), into_b(span);
  Status sb;
  std::thread b([&] {
    sb = tcp_exchange({.out = p.fd[1],
                       .in = p.fd[1],
                       .from = from_b.data(),
                       .into = into_b.data(),
                       .span = span,
                       .total = total},
                      std::chrono::seconds(10));
  });
  Status sa = tcp_exchange({.out = p.fd[0],
                            .in = p.fd[0],
                            .from = from_a.data(),
                            .into = into_a.data(),
                            .span = span,
                            .total = total},
                           std::chrono::seconds(10));
  b.join();
  ASSERT_TRUE(sa.ok()) << sa.to_string();
  ASSERT_TRUE(sb.ok()) << sb.to_string();
  EXPECT_EQ(into_a, from_b);  // every position written, with the byte sent from it
  EXPECT_EQ(into_b, from_a);
  EXPECT_TRUE(drained(p.fd[0]));
  EXPECT_TRUE(drained(p.fd[1]));
}

// send=splice: the same exchange with both ends sending through a pipe (vmsplice, then splice),
// a pipe of one page (it fills and drains many times) and one of 1 MiB (each splice() asks for
// more than the socket can take: on a blocking socket both ends would block in it, neither
// reading, so the exchange must make the socket non-blocking).
TEST(TcpExchange, SplicedSendsMoveExactlyTotalBothWays) {
  for (const size_t pipe_bytes : {size_t{4096}, size_t{1} << 20}) {
    Pair p;
    const size_t span = pipe_bytes + 30001, total = 7 * span + 123;
    std::vector<std::byte> from_a = pattern(span, 1), from_b = pattern(span, 2);
    std::vector<std::byte> into_a(span), into_b(span);
    int pa[2], pb[2];
    ASSERT_EQ(::pipe2(pa, O_NONBLOCK | O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(pb, O_NONBLOCK | O_CLOEXEC), 0);
    const int got_a = ::fcntl(pa[1], F_SETPIPE_SZ, static_cast<int>(pipe_bytes));
    const int got_b = ::fcntl(pb[1], F_SETPIPE_SZ, static_cast<int>(pipe_bytes));
    ASSERT_GT(got_a, 0);
    ASSERT_GT(got_b, 0);
    Status sb;
    std::thread b([&] {
      sb = tcp_exchange({.out = p.fd[1],
                         .in = p.fd[1],
                         .from = from_b.data(),
                         .into = into_b.data(),
                         .span = span,
                         .total = total,
                         .pipe_read = pb[0],
                         .pipe_write = pb[1],
                         .pipe_capacity = static_cast<size_t>(got_b)},
                        std::chrono::seconds(10));
    });
    Status sa = tcp_exchange({.out = p.fd[0],
                              .in = p.fd[0],
                              .from = from_a.data(),
                              .into = into_a.data(),
                              .span = span,
                              .total = total,
                              .pipe_read = pa[0],
                              .pipe_write = pa[1],
                              .pipe_capacity = static_cast<size_t>(got_a)},
                             std::chrono::seconds(10));
    b.join();
    for (int fd : {pa[0], pa[1], pb[0], pb[1]}) ::close(fd);
    ASSERT_TRUE(sa.ok()) << sa.to_string();
    ASSERT_TRUE(sb.ok()) << sb.to_string();
    EXPECT_EQ(into_a, from_b);
    EXPECT_EQ(into_b, from_a);
    EXPECT_TRUE(drained(p.fd[0]));
    EXPECT_TRUE(drained(p.fd[1]));
  }
}

// Against a peer that is not the code under test (a plain writer and a counting reader): the
// exchange sends exactly `total` bytes, the pattern cycled over its span, and takes exactly the
// `total` the peer sent. Between two exchanges, a count wrong alike on both ends could pass.
TEST(TcpExchange, MovesExactlyTotalAgainstAPlainPeer) {
  Pair p;
  const size_t span = 3001, total = 7 * span + 55;
  std::vector<std::byte> from = pattern(span, 1), into(span);
  std::vector<std::byte> peer_out = pattern(span, 2);
  size_t peer_got = 0;
  bool peer_data_ok = true;
  std::thread writer([&] {
    for (size_t sent = 0; sent < total;) {
      const size_t at = sent % span;
      const ssize_t k = ::send(p.fd[1], peer_out.data() + at, std::min(span - at, total - sent), 0);
      if (k <= 0) return;
      sent += static_cast<size_t>(k);
    }
  });
  std::thread reader([&] {
    std::vector<std::byte> buf(span);
    while (peer_got < total) {
      const ssize_t k = ::recv(p.fd[1], buf.data(), std::min(span, total - peer_got), 0);
      if (k <= 0) return;
      for (ssize_t i = 0; i < k; ++i) {
        peer_data_ok = peer_data_ok && buf[static_cast<size_t>(i)] == from[(peer_got + i) % span];
      }
      peer_got += static_cast<size_t>(k);
    }
  });
  Status s = tcp_exchange({.out = p.fd[0],
                           .in = p.fd[0],
                           .from = from.data(),
                           .into = into.data(),
                           .span = span,
                           .total = total},
                          std::chrono::seconds(10));
  ::shutdown(p.fd[0], SHUT_WR);  // a reader still short of `total` sees the end instead of waiting
  writer.join();
  reader.join();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer_got, total);
  EXPECT_TRUE(peer_data_ok);
  std::byte extra;
  EXPECT_EQ(::recv(p.fd[1], &extra, 1, MSG_DONTWAIT), 0);  // the end, with nothing beyond `total`
  EXPECT_TRUE(drained(p.fd[0]));                           // and all the peer sent was taken
  EXPECT_EQ(into, peer_out);
}

// Three ranks in a ring, each sending to the next and receiving from the previous on separate
// connections (tcp-direct with n > 2).
TEST(TcpExchange, MovesExactlyTotalRoundARingOfThree) {
  Pair link[3];  // link[r]: fd[0] is rank r's end towards r+1, fd[1] rank r+1's end from r
  const size_t span = 1 << 16, total = (size_t{4} << 20) + 17;
  std::vector<std::vector<std::byte>> from, into;
  for (int r = 0; r < 3; ++r) {
    from.push_back(pattern(span, r + 1));
    into.emplace_back(span);
  }
  Status st[3];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      st[r] = tcp_exchange({.out = link[r].fd[0],
                            .in = link[(r + 2) % 3].fd[1],
                            .from = from[static_cast<size_t>(r)].data(),
                            .into = into[static_cast<size_t>(r)].data(),
                            .span = span,
                            .total = total},
                           std::chrono::seconds(10));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
    EXPECT_EQ(into[static_cast<size_t>(r)], from[static_cast<size_t>((r + 2) % 3)]) << r;
    EXPECT_TRUE(drained(link[(r + 2) % 3].fd[1])) << r;
  }
}

// A peer that never sends: the exchange ends at its timeout with an error saying how far it got,
// never waiting longer.
TEST(TcpExchange, ASilentPeerEndsAtTheTimeout) {
  Pair p;
  std::vector<std::byte> from = pattern(4096, 1), into(4096);
  const auto start = std::chrono::steady_clock::now();
  Status s = tcp_exchange({.out = p.fd[0],
                           .in = p.fd[0],
                           .from = from.data(),
                           .into = into.data(),
                           .span = 4096,
                           .total = 4096},
                          std::chrono::milliseconds(200));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("4096 of 4096 bytes sent and 0 received"), std::string::npos)
      << s.to_string();
  EXPECT_LT(took, std::chrono::seconds(2));
}

// A peer that closes: an error naming it, at once.
TEST(TcpExchange, APeerThatClosesIsAnError) {
  Pair p;
  ::close(p.fd[1]);
  p.fd[1] = -1;
  std::vector<std::byte> from = pattern(4096, 1), into(4096);
  Status s = tcp_exchange({.out = p.fd[0],
                           .in = p.fd[0],
                           .from = from.data(),
                           .into = into.data(),
                           .span = 4096,
                           .total = 1 << 20},
                          std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
}

// Ranks as threads over one store: a line made on every rank runs; one that failed on rank 1 only
// is skipped on every rank, each saying which rank and why (its own reason on rank 1).
TEST(OutcomeEverywhere, OneRanksFailureIsEveryRanks) {
  MemoryStore store;
  constexpr int kRanks = 3;
  auto run = [&](const std::string& prefix, int failing) {
    std::vector<Status> out(kRanks);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.emplace_back([&, r] {
        const Status mine = r == failing ? unavailable("no route to rank 2") : Status();
        out[static_cast<size_t>(r)] = internal::outcome_everywhere(store, prefix, r, kRanks, mine);
      });
    }
    for (std::thread& t : ranks) t.join();
    return out;
  };
  for (const Status& s : run("all/", -1)) EXPECT_TRUE(s.ok()) << s.to_string();
  std::vector<Status> one = run("one/", 1);
  EXPECT_EQ(one[1].message(), "no route to rank 2");
  for (int r : {0, 2}) {
    EXPECT_EQ(one[static_cast<size_t>(r)].code(), StatusCode::kUnavailable);
    EXPECT_EQ(one[static_cast<size_t>(r)].message(), "rank 1: no route to rank 2");
  }
}

// A rank that never says: the others end at the store's timeout with an error, never hang.
TEST(OutcomeEverywhere, ASilentRankEndsAtTheStoresTimeout) {
  StoreOptions options;
  options.timeout = std::chrono::milliseconds(200);
  MemoryStore store(options);
  Status s = internal::outcome_everywhere(store, "silent/", 0, 2, Status());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace tributary::bench
