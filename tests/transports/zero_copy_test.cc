// Zero-copy sends of the TCP transport (TcpTransport::isend_zero_copy and fence(), on real loopback
// connections, ranks as threads): the kernel reads the sender's pages after the send completed, so
// the transport must not let the caller have them back before the receiver has taken the bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "algorithms/transport.h"
#include "transports/tcp/tcp_transport.h"
#include "transports/tcp/tcp_wire.h"
#include "tributary/store.h"

namespace tributary::transports {
namespace {

using namespace std::chrono_literals;
using algorithms::MessageTag;
using Clock = std::chrono::steady_clock;

// 1 MiB: zero-copy (>= wire::kZeroCopyMinBytes), and small enough that the send completes into
// the loopback socket's buffers before the receiver reads anything.
constexpr size_t kBytes = size_t{1} << 20;
static_assert(kBytes >= wire::kZeroCopyMinBytes);

MessageTag tag_of(uint64_t sequence) {
  MessageTag t;
  t.sequence = sequence;
  t.count = static_cast<int64_t>(kBytes / 4);
  return t;
}

struct Pair {
  std::unique_ptr<TcpTransport> t[2];
};

// zero_copy_min_message 0: every frame of 64 KiB or more goes zero-copy, whatever its collective.
Pair connect_two(bool zero_copy0 = true, bool zero_copy1 = true, size_t min_message = 0) {
  MemoryStore store;
  TcpTransportOptions o;
  o.host = "127.0.0.1";
  o.timeout = 20s;
  o.zero_copy_min_message = min_message;
  Pair p;
  std::thread other([&] {
    TcpTransportOptions mine = o;
    mine.zero_copy = zero_copy1;
    auto made = TcpTransport::create(store, 1, 2, mine);
    if (made.ok()) p.t[1] = std::move(*made);
  });
  TcpTransportOptions mine = o;
  mine.zero_copy = zero_copy0;
  auto made = TcpTransport::create(store, 0, 2, mine);
  other.join();
  EXPECT_TRUE(made.ok()) << made.status().message();
  if (made.ok()) p.t[0] = std::move(*made);
  return p;
}

std::vector<std::byte> filled(std::byte value) { return std::vector<std::byte>(kBytes, value); }

bool all_equal(const std::vector<std::byte>& v, std::byte value) {
  for (std::byte b : v) {
    if (b != value) return false;
  }
  return true;
}

// The sender overwrites its buffer as soon as fence() returns; the receiver takes the message only
// 300 ms after the send completed. fence() must wait for it, and the receiver must see the bytes
// as they were when sent. (With fence() returning at once, `taken` is still false here, and the
// receiver reads the new bytes out of the sender's pages.)
TEST(TcpZeroCopy, FenceWaitsUntilTheReceiverTookTheMessageSoTheBufferIsFreeAfter) {
  Pair p = connect_two();
  ASSERT_TRUE(p.t[0] && p.t[1]);
  std::atomic<bool> taken{false};
  std::vector<std::byte> got(kBytes);
  Status receiver;
  std::thread rank1([&] {
    std::this_thread::sleep_for(300ms);
    auto r = p.t[1]->irecv(0, tag_of(1), got);
    if (!r.ok()) {
      receiver = r.status();
      return;
    }
    receiver = p.t[1]->wait(*r, Clock::now() + 20s);
    taken = true;
    if (receiver.ok()) receiver = p.t[1]->fence(tag_of(1), Clock::now() + 20s);
  });
  std::vector<std::byte> data = filled(std::byte{0x5a});
  auto s = p.t[0]->isend_zero_copy(1, tag_of(1), data);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE(p.t[0]->wait(*s, Clock::now() + 20s).ok());
  EXPECT_FALSE(taken) << "the send was to complete before the receiver read it";
  const Status fenced = p.t[0]->fence(tag_of(1), Clock::now() + 20s);
  EXPECT_TRUE(fenced.ok()) << fenced.message();
  EXPECT_TRUE(taken) << "fence() returned before the receiver had taken the zero-copy message";
  std::memset(data.data(), 0xff, data.size());
  rank1.join();
  ASSERT_TRUE(receiver.ok()) << receiver.message();
  EXPECT_TRUE(all_equal(got, std::byte{0x5a})) << "the receiver saw bytes written after fence()";
}

// Below zero_copy_min_message (the default, 2 MiB, here against a 1 MiB collective) frames are
// copied: the send's buffer is free once it completed, and fence() waits for no one (the receiver
// here never calls it).
TEST(TcpZeroCopy, SmallCollectivesAreCopiedAndNeedNoConfirmation) {
  static_assert(kBytes < TcpTransportOptions{}.zero_copy_min_message);
  Pair p = connect_two(true, true, TcpTransportOptions{}.zero_copy_min_message);
  ASSERT_TRUE(p.t[0] && p.t[1]);
  std::atomic<bool> sent{false};
  std::vector<std::byte> got(kBytes);
  Status receiver;
  std::thread rank1([&] {
    while (!sent) std::this_thread::sleep_for(1ms);
    auto r = p.t[1]->irecv(0, tag_of(1), got);
    receiver = r.ok() ? p.t[1]->wait(*r, Clock::now() + 20s) : r.status();
  });
  std::vector<std::byte> data = filled(std::byte{0x44});
  auto s = p.t[0]->isend_zero_copy(1, tag_of(1), data);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE(p.t[0]->wait(*s, Clock::now() + 20s).ok());
  const Status fenced = p.t[0]->fence(tag_of(1), Clock::now() + 5s);
  EXPECT_TRUE(fenced.ok()) << fenced.message();
  std::memset(data.data(), 0xff, data.size());
  sent = true;
  rank1.join();
  ASSERT_TRUE(receiver.ok()) << receiver.message();
  EXPECT_TRUE(all_equal(got, std::byte{0x44}));
}

// Each frame says whether it went zero-copy, so ranks with different settings still confirm each
// other: both directions at once, several collectives in a row, every one checked.
TEST(TcpZeroCopy, RanksWithDifferentSettingsFenceEachOther) {
  for (bool zero_copy0 : {true, false}) {
    Pair p = connect_two(zero_copy0, !zero_copy0);
    ASSERT_TRUE(p.t[0] && p.t[1]);
    Status status[2];
    auto run = [&](int me) {
      TcpTransport& t = *p.t[me];
      for (uint64_t seq = 1; seq <= 5 && status[me].ok(); ++seq) {
        std::vector<std::byte> out = filled(static_cast<std::byte>(seq * 2 + me)), in(kBytes);
        auto r = t.irecv(1 - me, tag_of(seq), in);
        auto s = t.isend_zero_copy(1 - me, tag_of(seq), out);
        if (!r.ok() || !s.ok()) {
          status[me] = r.ok() ? s.status() : r.status();
          return;
        }
        status[me] = t.wait(*r, Clock::now() + 20s);
        if (status[me].ok()) status[me] = t.wait(*s, Clock::now() + 20s);
        if (status[me].ok()) status[me] = t.fence(tag_of(seq), Clock::now() + 20s);
        if (status[me].ok() && !all_equal(in, static_cast<std::byte>(seq * 2 + 1 - me))) {
          status[me] = data_loss("wrong bytes in collective " + std::to_string(seq));
        }
      }
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    EXPECT_TRUE(status[0].ok()) << status[0].message();
    EXPECT_TRUE(status[1].ok()) << status[1].message();
  }
}

// A sender that fails with zero-copy frames unconfirmed gives its caller the buffer back, and the
// caller overwrites it at once, before the peer has read the frame. The peer must then not take
// the frame as data: its receive fails with the sender's reason (the abort frame behind the frame
// says the sender gave up) or, had the frame been read before, delivers the bytes that were sent.
// (Without sender_gave_up(), the receive completes with the overwritten bytes.)
TEST(TcpZeroCopy, AReceiverNeverTakesAFrameWhoseSenderGaveUpBeforeItWasRead) {
  for (int round = 0; round < 3; ++round) {
    Pair p = connect_two();
    ASSERT_TRUE(p.t[0] && p.t[1]);
    std::atomic<bool> given_back{false};
    std::vector<std::byte> got(kBytes);
    Status first;
    std::thread rank1([&] {
      while (!given_back) std::this_thread::sleep_for(1ms);
      auto r = p.t[1]->irecv(0, tag_of(1), got);
      first = r.ok() ? p.t[1]->wait(*r, Clock::now() + 20s) : r.status();
    });
    std::vector<std::byte> data = filled(std::byte{0x33});
    auto s = p.t[0]->isend_zero_copy(1, tag_of(1), data);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_TRUE(p.t[0]->wait(*s, Clock::now() + 20s).ok());
    p.t[0]->abort(aborted("the test gave up"));
    std::memset(data.data(), 0xff, data.size());
    given_back = true;
    rank1.join();
    if (first.ok()) {
      EXPECT_TRUE(all_equal(got, std::byte{0x33})) << "the receiver took bytes written after the "
                                                      "sender's call had failed and returned";
    } else {
      EXPECT_NE(first.message().find("the test gave up"), std::string::npos) << first.message();
    }
  }
}

}  // namespace
}  // namespace tributary::transports
