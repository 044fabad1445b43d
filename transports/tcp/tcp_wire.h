// The wire format of the ring backend's TCP transport: the data frame header, the handshake
// messages, and how a large message is striped across the sockets of a peer. Internal to
// backends/ring; both sides of a connection must run the same kProtocolVersion.
//
// Frames are in host byte order: all ranks must share one endianness (every platform tributary
// builds on is little-endian).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "algorithms/transport.h"

namespace tributary::transports::wire {

inline constexpr uint32_t kFrameMagic = 0x54524246;  // "TRBF"
inline constexpr uint32_t kHelloMagic = 0x54524248;  // "TRBH"
inline constexpr uint32_t kAbortMagic = 0x54524241;  // "TRBA": the sender gave up; a reason follows
// 2: the handshake carries the socket count and index (sockets_per_peer); frames carry the stripe.
// 3: frames carry the broadcast root.
// 4: frames carry flags (kFrameZeroCopy), and zero-copy senders expect a fence (end of collective).
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr size_t kMaxAbortReason = 4096;
inline constexpr int kMaxSocketsPerPeer = 16;

// One data frame: this header, then `length` payload bytes. A message is one frame, or one stripe
// frame on each socket of the peer (see stripe_of).
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t step = 0;
  uint64_t sequence = 0;
  int64_t count = 0;
  uint8_t collective = 0, op = 0, dtype = 0;
  uint8_t flags = 0;     // kFrame* bits
  uint32_t stripe = 0;   // which stripe of the message this frame is (0 when not striped)
  uint64_t length = 0;   // payload bytes of this frame
  uint64_t message = 0;  // bytes of the whole message (= length when not striped)
  int32_t root = -1;     // broadcast: the root the sender named; -1 otherwise
  uint32_t reserved = 0;
};
static_assert(sizeof(FrameHeader) == 56);

// The sender sent this frame's payload from its caller's pages without copying it: the receiver
// tells it, at the fence that ends the collective, that it has taken it (TcpTransport::fence).
inline constexpr uint8_t kFrameZeroCopy = 1;
// Zero-copy from this frame size up: below it, a pipe's two system calls cost more than the copy.
inline constexpr size_t kZeroCopyMinBytes = size_t{64} << 10;

inline FrameHeader header_for(const algorithms::MessageTag& tag, size_t length) {
  FrameHeader h;
  h.step = tag.step;
  h.sequence = tag.sequence;
  h.count = tag.count;
  h.collective = static_cast<uint8_t>(tag.collective);
  h.op = static_cast<uint8_t>(tag.op);
  h.dtype = static_cast<uint8_t>(tag.dtype);
  h.root = tag.root;
  h.length = length;
  h.message = length;
  return h;
}

inline algorithms::MessageTag tag_of(const FrameHeader& h) {
  algorithms::MessageTag t;
  t.sequence = h.sequence;
  t.step = h.step;
  t.count = h.count;
  t.collective = static_cast<Collective>(h.collective);
  t.op = static_cast<ReduceOp>(h.op);
  t.dtype = static_cast<DType>(h.dtype);
  t.root = h.root;
  return t;
}

// Striping. Below kStripeMinBytes a message goes whole on socket 0: one frame is the lowest
// latency, and small messages gain nothing from parallel streams. From it up, with K sockets per
// peer, the message is cut into K contiguous stripes, stripe k a normal frame on socket k. Sender
// and receiver compute the same cut from the message size (the receiver from the size it posted),
// so every stripe header can be checked exactly; socket 0 carries a frame of every message, so a
// mismatch is always caught there.
inline constexpr size_t kStripeMinBytes = size_t{64} << 10;

struct Stripe {
  size_t offset = 0;
  size_t length = 0;
};

// How many frames a message of `bytes` takes with `sockets` sockets per peer.
inline int stripes_for(size_t bytes, int sockets) {
  return sockets > 1 && bytes >= kStripeMinBytes ? sockets : 1;
}

// Stripe `k` of `stripes` of a message of `bytes`: equal parts rounded up to 64 bytes (cache
// lines), the last one the rest. Never empty: bytes / stripes >= 4 KiB > 64 * (stripes - 1).
inline Stripe stripe_of(size_t bytes, int stripes, int k) {
  if (stripes <= 1) return {0, bytes};
  const size_t n = static_cast<size_t>(stripes);
  const size_t part = ((bytes + n - 1) / n + 63) / 64 * 64;
  const size_t offset = part * static_cast<size_t>(k);
  return {offset, k + 1 == stripes ? bytes - offset : part};
}

// Handshake messages (see tcp_transport.h for the exchange). Each of the K connections between two
// ranks opens with its own handshake; `socket` says which of the K it is.
struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint64_t cluster = 0;
  uint64_t layout = 0;
  int32_t world = 0;
  int32_t rank = 0;
  int32_t sockets = 1;  // sockets_per_peer of the sender
  int32_t socket = 0;   // index of this connection, 0 .. sockets - 1
  std::array<uint8_t, 32> nonce{};
};
struct HelloAck {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint64_t cluster = 0;
  uint64_t layout = 0;
  int32_t world = 0;
  int32_t rank = 0;
  int32_t sockets = 1;
  int32_t socket = 0;
  std::array<uint8_t, 32> nonce{};
  std::array<uint8_t, 32> mac{};
};
struct Auth {
  std::array<uint8_t, 32> mac{};
};
struct Verdict {
  uint32_t magic = kHelloMagic;
  uint32_t accepted = 0;
};

}  // namespace tributary::transports::wire
