// UcxTransport: the Transport of the `ucx` backend, over UCX's UCP tag-matching API (Debian's
// libucx-dev). UCX picks the wire per peer from the transports it is allowed (`tls`): shared memory
// (posix/sysv mappings; the single-copy transports cma, knem and xpmem are left out, see
// without_single_copy in ucx_transport.cc) between processes of a host, TCP between hosts, and
// RDMA verbs (rc, ud, dc) where the hosts have InfiniBand or RoCE adapters and UCX was built with
// them. Only shared memory and TCP can be tested here; the RDMA paths are UCX's own.
//
// Setup (through the store, keys under the store's own prefix):
//  1. every rank creates one UCP context and worker (single-threaded: the thread that waits drives
//     progress) and publishes "addr/<rank>" = its worker address and a fresh 32-byte nonce (hex);
//  2. every rank creates an endpoint to every peer. Peers on other hosts use UCX's peer
//     error-handling mode: one that dies or becomes unreachable fails the endpoint (UCX's
//     keepalive, 1 s unless UCX_KEEPALIVE_INTERVAL says otherwise) instead of leaving a wait to the
//     deadline. Peers on this host (same host id, see core/rendezvous.h) use UCX's "none" mode:
//     UCX's shared-memory transports do not support peer mode (UCX 1.13 refuses them in it), and
//     over TCP loopback it halves the bandwidth of large transfers. This transport watches them
//     instead: their process (a pidfd) is checked every millisecond of a wait, and its exit fails
//     the wait naming the rank (a stopped peer ends in the deadline, as everywhere);
//  3. every rank sends every peer a hello: protocol version, world size, rank, a hash of the
//     cluster id, the layout text (options every rank must share) and, with a secret, the proof
//     HMAC-SHA256(secret, cluster | sender | receiver | the receiver's nonce). The receiver checks
//     each: another job, a different layout (both texts named) or a missing or wrong proof refuses
//     the group on both sides. The proof is bound to the receiver's fresh nonce, so a recorded
//     hello cannot be replayed into another job.
//  4. unless `tls` leaves shared memory out, every rank sends every peer on this host one round of
//     UCX's shared-memory FIFO (FIFO_SIZE, 64 by default; the smaller of the pair's, carried in
//     the hellos) of 4 KiB control messages and receives as many: the FIFO's descriptors are
//     fresh memory until it has gone round once, and their page faults would otherwise fall on
//     the first collectives (2 processes: the first 60-65 4 KiB all-reduces 8-11 us each instead
//     of 3; UcxSetup::warm_up in the .cc). A peer that exits meanwhile fails it naming the rank;
//  5. with a secret (and authenticate_frames), each direction of each pair gets its own key:
//     HMAC-SHA256(secret, cluster | sender | receiver | both ranks' nonces).
//
// Data: one UCP tag message per Transport message, straight from and into the caller's buffers (UCX
// chooses eager copies or zero-copy rendezvous by size). The 64-bit UCP tag carries the sender's
// rank and the MessageTag's fingerprint: the collective, op and dtype, the low bits of the sequence
// number and a hash of the whole tag and the message size. A receive matches the next message from
// its peer whatever its tag (UCX keeps the messages of one sender in order), then compares the tag
// and the length with what it posted: ranks that issue different collectives fail with
// "collective mismatch: rank 1 sent ... but rank 0 expects ...", never with mixed-up data. A
// message longer than the posted buffer is truncated by UCX and reported the same way.
//
// Authenticated data (a secret and authenticate_frames): every data message carries a 16-byte GMAC
// tag (AES-256-GCM, nothing encrypted) under its direction's key, over the UCP tag, the length and
// the bytes, with the message's number in its direction as the nonce (both sides number messages
// in the order they are posted, which is the order UCX matches them in). Messages up to
// kInlineMacBytes travel with their tag in one UCP message, staged through a copy on both sides,
// so a small message is checked before its bytes reach the caller's buffer; larger ones go
// straight between the caller's buffers, followed by their tag in a control message of their own.
// A tag that does not match fails the receive ("failed authentication", naming the sender) before
// the collective completes: no rank gets a changed result, and the transport fails as on any
// error. Abort notices carry no tag: a forged one can stop the job, never change a result.
//
// Failure: any error (a peer's endpoint failing, a mismatch, a deadline) fails the whole transport.
// It then sends every peer a short abort notice with the reason (a control tag every rank listens
// for from setup on), cancels its posted receives and closes its endpoints; the peers fail at once
// with "rank N gave up: <reason>" instead of at their deadline. UCX's status codes are translated
// to tributary's in one place (ucx_status below), keeping UCX's text.
//
// Destruction after a clean run is a handshake: every rank sends every peer a goodbye (a control
// message) and waits for theirs, at most min(timeout, 10 s) (a rank that destroys its transport
// late holds the others that long, as Gloo's closing barrier does); then nothing is in flight and
// the endpoints close at once. Without every goodbye it flushes (5 s at most) and closes
// gracefully. After a failure the worker is destroyed without progress (see shutdown()).
//
// Waits: progress is polled for `poll_before_sleep` (with sched_yield() between polls after the
// first 20 us unless it is kPollAlways, so that a peer the scheduler put on this core can answer),
// then with sched_yield() between polls for `yield_before_sleep` (more ranks than cores), then the
// thread sleeps on the worker's event descriptor (UCP wakeup) in slices of at most 100 ms, checking
// the deadline between slices.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "algorithms/transport.h"
#include "tributary/store.h"

namespace tributary::backends {

struct UcxTransportOptions {
  std::string tls;          // UCX_TLS for this transport ("sm", "tcp", "rc,sm"); "" = UCX's choice
  std::string net_devices;  // UCX_NET_DEVICES ("eth0", "mlx5_0:1"); "" = UCX's choice
  std::string secret;       // "" = no authentication
  std::string cluster_id;   // ranks of different jobs refuse each other
  std::string layout;       // what every rank must agree on, compared at setup (both named)
  std::string host_id;      // internal::host_id(): peers with the same one share memory
  std::chrono::nanoseconds timeout{std::chrono::minutes(5)};  // setup deadline
  std::chrono::nanoseconds poll_before_sleep{std::chrono::microseconds(1000)};
  std::chrono::nanoseconds yield_before_sleep{0};  // then polls with sched_yield() this long
  bool authenticate_frames = true;  // with a secret: a MAC on every data message
  // Fault injection for this transport's own tests: called on a copy of every outgoing data
  // message's bytes after its MAC was computed, as a relay on the wire would change them.
  std::function<void(int peer, std::span<std::byte> bytes)> tamper_for_test;
  // Called at setup right before the warm-up (step 4 of setup, above), for this transport's own
  // tests.
  std::function<void()> before_warm_up_for_test;
};

class UcxTransport final : public algorithms::Transport {
 public:
  static StatusOr<std::unique_ptr<UcxTransport>> create(Store& store, int rank, int size,
                                                        const UcxTransportOptions& options);
  ~UcxTransport() override;

  int rank() const override;
  int size() const override;
  StatusOr<Request> isend(int peer, const algorithms::MessageTag& tag,
                          std::span<const std::byte> data) override;
  StatusOr<Request> irecv(int peer, const algorithms::MessageTag& tag,
                          std::span<std::byte> data) override;
  Status wait(Request request, algorithms::Deadline deadline) override;
  void abort(const Status& why) override;
  // Signals the worker (ucp_worker_signal), which ends the wait's sleep; it fails with `why`.
  void interrupt(const Status& why) override;
  Status error() const override;
  // Over TCP alone (tls without shared memory): a chunk of up to 1 MiB whole, else segments of
  // 1 MiB (each message costs UCX a protocol exchange; measurements in the .cc); 0 (the
  // algorithms' rule) otherwise.
  size_t preferred_segment_bytes(size_t chunk_bytes) const override;

  // What UCX chose to reach `peer` ("tcp/lo", "posix/memory cma/memory"), for describe() and logs.
  std::string transports_to(int peer) const;
  // How many messages setup exchanged with `peer` each way to warm UCX's shared-memory FIFO
  // (step 4 above): UCX's FIFO_SIZE for a peer on this host, 0 for others or when `tls` leaves
  // shared memory out.
  int warm_up_messages(int peer) const;

  struct Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary::backends
