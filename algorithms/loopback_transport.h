// LoopbackTransport: ranks as threads of one process, connected through a shared LoopbackHub.
// For testing the algorithms without sockets; semantics as in transport.h (FIFO matching per pair,
// tag and size checks, deadlines, abort wakes every rank with the first error).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/transport.h"

namespace tributary::algorithms {

class LoopbackHub {
 public:
  explicit LoopbackHub(int size);
  int size() const { return size_; }

 private:
  friend class LoopbackTransport;
  struct Message {
    MessageTag tag;
    std::vector<std::byte> data;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  int size_;
  std::vector<std::deque<Message>> channels_;  // [src * size + dst]
  Status error_;                               // first abort, shared by every rank
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank);

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  StatusOr<Request> isend(int peer, const MessageTag& tag, std::span<const std::byte> data) override;
  StatusOr<Request> irecv(int peer, const MessageTag& tag, std::span<std::byte> data) override;
  Status wait(Request request, Deadline deadline) override;
  void abort(const Status& why) override;
  Status error() const override;

 private:
  struct PendingRecv {
    int peer;
    MessageTag tag;
    std::span<std::byte> data;
  };
  Status check_peer(int peer) const;

  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
  Request next_ = 1;
  std::map<Request, PendingRecv> recvs_;
};

}  // namespace tributary::algorithms
