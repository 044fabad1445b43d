// TcpTransport: an algorithms::Transport over TCP (the ring backend's data path); Boost.Asio runs
// the setup, the data path is plain non-blocking sockets.
//
// Setup: every rank listens on an ephemeral port, publishes "host:port" in the store, connects to
// every lower rank and accepts every higher one (a full mesh), each connection opened by a
// handshake that carries a protocol version, a cluster id, a layout hash, the world size, both
// ranks, the number of sockets per peer and the index of this one (with sockets_per_peer = K, two
// ranks are joined by K connections, each with its own handshake). When a secret is configured
// (TRIBUTARY_SECRET or a secret file), both sides prove they know it with an HMAC-SHA256
// challenge-response over fresh nonces; a process without the secret cannot join, and a connection
// that fails the handshake (wrong magic, version, cluster, garbage) is dropped without disturbing
// the others. Incoming handshakes run concurrently, each under its own 10 s deadline (capped by the
// setup timeout), so silent or slow connections delay no one.
//
// Authenticated data: with a secret, each connection gets two keys (one per direction), derived
// from the secret and both nonces of its handshake, so a session is bound to its connection. Every
// frame, abort frames included, is followed by a 16-byte tag: GMAC (AES-256-GCM) under that key,
// over the header and payload, with the frame's number on the connection as the nonce. A frame
// that was changed, replayed, reordered, dropped or injected by anyone without the secret fails the
// check, and the receive (and the transport) fails instead of completing: data is never accepted
// unchecked. The sender computes the tag as it writes; the receiver as bytes arrive. Data is not
// encrypted: anyone on the path can read it (README, "Security").
//
// Data: each message is one frame, a 56-byte header (magic, collective sequence number and
// fingerprint, step, stripe, frame and message length) and the payload, written with TCP_NODELAY
// (and the congestion control of congestion.h: BBR on a connection that stays in this machine's
// kernel becomes reno: TcpTransportOptions::same_kernel names the peers that the addresses hide).
// With K > 1 sockets per peer, a message of 64 KiB or more is cut into K contiguous stripes, stripe
// k a frame on socket k (tcp_wire.h); smaller ones go whole on socket 0, so latency is as with one.
// A receive reads a frame only when one has been posted, straight into the caller's buffer: one
// non-blocking recvmsg() fills the header, the posted buffer and the tag at once (a small frame is
// one system call), and the header is checked (tag, message size, stripe index and length) before
// the frame is accepted: a peer can never make us allocate or write beyond what we posted, and a
// mismatched collective is reported naming both sides.
//
// Zero-copy (isend_zero_copy, with TcpTransportOptions::zero_copy): a frame of 64 KiB or more on a
// connection that does not authenticate frames goes from the caller's pages through a pipe into the
// socket (vmsplice, then splice: tcp_writer.h), and says so in its header. fence() then exchanges
// empty confirmations (tagged with the collective and MessageTag::kFenceStep) with the ranks such
// frames went to or came from. A transport that fails with zero-copy frames unconfirmed puts its
// abort frame and the end of the stream behind them and waits, at most 1 s, until the peer's
// kernel has acknowledged them; a receiver that finds an abort frame or the end of the stream
// right behind a zero-copy frame fails the receive rather than take bytes that the sender's
// caller may have changed since its call failed (only a peer whose window stays full for longer
// than that second could still read changed bytes).
//
// Progress: reads are driven by the thread that waits (no extra thread, no hand-off latency): it
// polls the sockets with receives posted, then (more ranks than cores) polls with sched_yield(),
// then sleeps in poll() on them and on an eventfd that the writer thread signals when a send
// completes; sends run on that writer thread (tcp_writer.h); every wait has a deadline. Any
// error on any socket (a peer closing, a reset, a deadline, a mismatch) fails the whole transport
// and closes every socket, so that the other ranks notice at once rather than at their own
// deadline. Frames are in host byte order: all ranks must share one endianness (every platform
// tributary builds on is little-endian).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/transport.h"
#include "tributary/store.h"

namespace tributary::transports {

struct TcpTransportOptions {
  std::string host;         // address to publish; "" = the interface that reaches the coordinator
  std::string coordinator;  // the store's host, used to pick the interface when host is ""
  std::string secret;       // "" = no authentication
  // With a secret: a 16-byte MAC (GMAC under a key derived from the secret and both handshake
  // nonces) follows every frame, checked before a receive completes. false authenticates only the
  // handshake (faster, but a relay on the path can then change data). Every rank must agree.
  bool authenticate_frames = true;
  std::string cluster_id;   // ranks of different jobs refuse each other
  // What every rank must agree on besides the cluster (local replica count, algorithm options):
  // ranks whose layout differs refuse each other at setup with a message naming both.
  std::string layout;
  std::chrono::nanoseconds timeout{std::chrono::minutes(5)};  // setup deadline
  // How long a wait polls before sleeping in poll(): a message is often microseconds away and
  // waking costs more, but polling steals the CPU from peers when ranks outnumber cores.
  std::chrono::nanoseconds poll_before_sleep{std::chrono::microseconds(50)};
  // Then how long it polls with sched_yield() before sleeping (more ranks than cores).
  std::chrono::nanoseconds yield_before_sleep{0};
  // TCP connections to each peer, 1 to 16; large messages are striped across them. Every rank must
  // use the same number (it is checked at setup, naming both values).
  int sockets_per_peer = 1;
  // TCP congestion control of the connections: "auto" (bbr on a connection that stays in this
  // kernel, between two addresses of this host or to a peer marked in same_kernel, becomes reno;
  // others keep the system's) or an algorithm's name (congestion.h).
  std::string congestion = "auto";
  // Per rank of this transport: whether it runs on this machine's kernel (the backend knows from
  // its host layout, algorithms::HostLayout::same_kernel_as); empty or short = unknown, where only
  // the addresses tell.
  std::vector<bool> same_kernel;
  // Frames of 64 KiB or more sent with isend_zero_copy go from the caller's pages to the socket
  // without a copy (vmsplice and splice), on connections that do not authenticate frames, when
  // their collective's message (MessageTag count x dtype) is at least zero_copy_min_message: the
  // confirmations at its end (fence) cost a round trip, which a small collective does not earn
  // back. false copies them as isend does. Ranks need not agree: each frame says how it was sent.
  bool zero_copy = true;
  size_t zero_copy_min_message = size_t{2} << 20;
};

class TcpTransport final : public algorithms::Transport {
 public:
  // Connects the full mesh through `store` (keys are written under the store's own prefix).
  static StatusOr<std::unique_ptr<TcpTransport>> create(Store& store, int rank, int size,
                                                        const TcpTransportOptions& options);
  ~TcpTransport() override;

  int rank() const override;
  int size() const override;
  StatusOr<Request> isend(int peer, const algorithms::MessageTag& tag,
                          std::span<const std::byte> data) override;
  StatusOr<Request> irecv(int peer, const algorithms::MessageTag& tag,
                          std::span<std::byte> data) override;
  StatusOr<Request> isend_zero_copy(int peer, const algorithms::MessageTag& tag,
                                    std::span<const std::byte> data) override;
  Status fence(const algorithms::MessageTag& tag, algorithms::Deadline deadline) override;
  Status wait(Request request, algorithms::Deadline deadline) override;
  void abort(const Status& why) override;
  // Wakes the wait in progress through the eventfd it sleeps on; it fails with `why` at once.
  void interrupt(const Status& why) override;
  Status error() const override;

  struct Impl;

 private:
  StatusOr<Request> send(int peer, const algorithms::MessageTag& tag,
                         std::span<const std::byte> data, bool zero_copy);
  explicit TcpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary::transports
