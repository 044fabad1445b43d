// The point-to-point transport every multi-process algorithm is written against: tagged,
// asynchronous send and receive of byte spans between ranks (like Gloo's transport::Pair and
// UCC's TL interface). Implementations: LoopbackTransport (ranks as threads in one process, for
// algorithm tests) and the TCP transport of the ring backend (Boost.Asio).
//
// Contract:
//  - Messages between two ranks are matched in the order they were posted: the n-th isend from A to
//    B is received by the n-th irecv that B posts for A. Every message carries a MessageTag; the
//    receiver checks it against the tag it posted and fails with a mismatch error that names both
//    sides (e.g. "rank 1 sent all_reduce #5 (8 KiB float32 sum) but this rank expects all_reduce #5
//    (4 KiB float32 sum)"), so ranks that issue different collectives never corrupt data.
//  - A receive takes exactly the posted number of bytes: a frame of another size is a mismatch,
//    and no memory is allocated on the sender's say-so.
//  - Buffers must stay valid until their request completes.
//  - wait() drives progress; it returns by `deadline` with DeadlineExceeded naming the peer and
//    the message if the request has not completed. After any error the transport is broken: it
//    closes its connections (so peers fail fast instead of waiting for their timeout) and every
//    later call returns that first error.
//  - One thread at a time per transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "tributary/cross_device_ops.h"
#include "tributary/status.h"

namespace tributary::algorithms {

using Deadline = std::chrono::steady_clock::time_point;

// What a message belongs to: the collective (its sequence number and fingerprint) and the step.
struct MessageTag {
  static constexpr uint32_t kFenceStep = 0xFFFFFFF0u;  // the step of Transport::fence's messages

  uint64_t sequence = 0;
  uint32_t step = 0;
  Collective collective = Collective::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kFloat32;
  int64_t count = 0;  // elements per rank of the whole collective
  int32_t root = -1;  // broadcast: the root every rank named (-1 for collectives without one)

  static MessageTag of(const CallInfo& call, uint32_t step = 0);
  MessageTag at_step(uint32_t s) const {
    MessageTag t = *this;
    t.step = s;
    return t;
  }
  // Same collective (sequence and fingerprint)?
  bool same_collective(const MessageTag& o) const;
  std::string describe() const;  // "all_reduce #5 (4KiB float32, sum) step 3"
  std::string describe_call() const;  // the collective alone: "all_reduce #5 (4KiB float32, sum)"
};

class Transport {
 public:
  using Request = uint64_t;

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual StatusOr<Request> isend(int peer, const MessageTag& tag,
                                  std::span<const std::byte> data) = 0;
  virtual StatusOr<Request> irecv(int peer, const MessageTag& tag, std::span<std::byte> data) = 0;
  virtual Status wait(Request request, Deadline deadline) = 0;

  // Zero-copy sends. Like isend, but the transport may send straight from `data` without copying
  // it (TCP: vmsplice and splice, so the kernel reads the caller's pages), and so may still read
  // `data` after the request has completed, until fence() returns on this rank. Until then the
  // caller must leave `data` unchanged, except by writing into it what it received, after the
  // request, from a rank that took this message first (as a ring all-reduce writes the reduced
  // block over the one it sent: the block comes back only after the next rank has reduced it).
  // The default copies, as isend does.
  virtual StatusOr<Request> isend_zero_copy(int peer, const MessageTag& tag,
                                            std::span<const std::byte> data) {
    return isend(peer, tag, data);
  }
  // Returns once every rank has taken every message this rank sent it with isend_zero_copy since
  // the last fence(), and this rank has told every rank it took such a message from. Every rank of
  // the transport calls it at the same point of the same collective (its end); `tag` names the
  // collective. It sends and waits for nothing when no zero-copy message went either way.
  virtual Status fence(const MessageTag& tag, Deadline deadline) {
    (void)tag;
    (void)deadline;
    return Status();
  }
  // Fails the transport with `why` (if not failed already) and closes its connections.
  virtual void abort(const Status& why) = 0;
  // ProcessGroup::interrupt's contract: safe from any thread at any time; the wait in progress (or
  // the next one) fails within milliseconds with `why`, on the waiting thread, which then fails the
  // transport as abort() does. Default: nothing (waits end at their deadline).
  virtual void interrupt(const Status& why) { (void)why; }
  // The first error, or OK.
  virtual Status error() const = 0;

  // The segment size for a ring or pairwise step of `chunk_bytes` when the backend leaves it to
  // the algorithms (segment_bytes = 0): a transport whose cost changes with the message size (a
  // protocol switch, such as UCX's rendezvous) says so here; 0 = the algorithms' rule.
  virtual size_t preferred_segment_bytes(size_t chunk_bytes) const {
    (void)chunk_bytes;
    return 0;
  }

  // Convenience: both directions at once, then wait for both.
  Status sendrecv(int send_peer, std::span<const std::byte> send, int recv_peer,
                  std::span<std::byte> recv, const MessageTag& tag, Deadline deadline);
};

}  // namespace tributary::algorithms
