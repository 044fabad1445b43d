#include "algorithms/loopback_transport.h"

#include <cstring>
#include <string>

namespace tributary::algorithms {

LoopbackHub::LoopbackHub(int size)
    : size_(size), channels_(static_cast<size_t>(size) * static_cast<size_t>(size)) {}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

Status LoopbackTransport::check_peer(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    return invalid_argument("loopback transport: bad peer " + std::to_string(peer));
  }
  return Status();
}

StatusOr<Transport::Request> LoopbackTransport::isend(int peer, const MessageTag& tag,
                                                      std::span<const std::byte> data) {
  TRIBUTARY_RETURN_IF_ERROR(check_peer(peer));
  std::lock_guard lock(hub_->mu_);
  if (!hub_->error_.ok()) return hub_->error_;
  auto& ch = hub_->channels_[static_cast<size_t>(rank_ * size() + peer)];
  ch.push_back({tag, std::vector<std::byte>(data.begin(), data.end())});
  hub_->cv_.notify_all();
  return Request{0};  // sends complete at once: the data was copied
}

StatusOr<Transport::Request> LoopbackTransport::irecv(int peer, const MessageTag& tag,
                                                      std::span<std::byte> data) {
  TRIBUTARY_RETURN_IF_ERROR(check_peer(peer));
  Request r = next_++;
  recvs_[r] = PendingRecv{peer, tag, data};
  return r;
}

Status LoopbackTransport::wait(Request request, Deadline deadline) {
  if (request == 0) return error();
  auto it = recvs_.find(request);
  if (it == recvs_.end()) return invalid_argument("loopback transport: unknown request");
  PendingRecv pending = it->second;
  // Receives from one peer complete in posting order: this must be the oldest for its peer.
  for (auto& [id, p] : recvs_) {
    if (id < request && p.peer == pending.peer) {
      TRIBUTARY_RETURN_IF_ERROR(wait(id, deadline));
      break;
    }
  }
  recvs_.erase(request);
  std::unique_lock lock(hub_->mu_);
  auto& ch = hub_->channels_[static_cast<size_t>(pending.peer * size() + rank_)];
  if (!hub_->cv_.wait_until(lock, deadline, [&] { return !hub_->error_.ok() || !ch.empty(); })) {
    return deadline_exceeded("rank " + std::to_string(pending.peer) +
                             " sent nothing for " + pending.tag.describe() +
                             " before the deadline; is it still running?");
  }
  if (!hub_->error_.ok()) return hub_->error_;
  LoopbackHub::Message m = std::move(ch.front());
  ch.pop_front();
  lock.unlock();
  if (!m.tag.same_collective(pending.tag) || m.tag.step != pending.tag.step ||
      m.data.size() != pending.data.size()) {
    Status s = aborted("collective mismatch: rank " + std::to_string(pending.peer) + " sent " +
                       m.tag.describe() + " (" + std::to_string(m.data.size()) +
                       " bytes) but rank " + std::to_string(rank_) + " expects " +
                       pending.tag.describe() + " (" + std::to_string(pending.data.size()) +
                       " bytes); every rank must issue the same collectives in the same order");
    abort(s);
    return s;
  }
  if (!m.data.empty()) std::memcpy(pending.data.data(), m.data.data(), m.data.size());
  return Status();
}

void LoopbackTransport::abort(const Status& why) {
  std::lock_guard lock(hub_->mu_);
  if (hub_->error_.ok()) hub_->error_ = why;
  hub_->cv_.notify_all();
}

Status LoopbackTransport::error() const {
  std::lock_guard lock(hub_->mu_);
  return hub_->error_;
}

}  // namespace tributary::algorithms
