#include "backends/ring/tcp_writer.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

namespace tributary::backends {

TcpWriter::TcpWriter(size_t sockets, std::function<void()> wake)
    : queues_(sockets), busy_(sockets, 0), fds_(sockets, -1), wake_(std::move(wake)) {
  thread_ = std::jthread([this](std::stop_token st) { loop(st); });
}

TcpWriter::~TcpWriter() { stop(); }

void TcpWriter::set_fd(int socket, int fd) { fds_[static_cast<size_t>(socket)] = fd; }

bool TcpWriter::submit(int socket, Op op) {
  const size_t s = static_cast<size_t>(socket);
  std::lock_guard lock(mu_);
  auto& q = queues_[s];
  if (stopping_) {
    done_.push_back({op.id, socket, ECANCELED, wire::tag_of(op.header)});
    return false;
  }
  if (q.empty()) {
    int err = push(fds_[s], op);
    if (err == 0 && op.sent == op.total()) return true;
    if (err != 0 && err != EAGAIN) {
      done_.push_back({op.id, socket, err, wire::tag_of(op.header)});
      return false;
    }
  }
  q.push_back(op);
  cv_.notify_one();
  return false;
}

std::vector<TcpWriter::Done> TcpWriter::take() {
  std::lock_guard lock(mu_);
  std::vector<Done> out;
  out.swap(done_);
  return out;
}

void TcpWriter::quiesce() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  for (size_t s = 0; s < queues_.size(); ++s) {
    auto& q = queues_[s];
    const size_t keep = !q.empty() && (busy_[s] || q.front().sent > 0) ? 1 : 0;
    while (q.size() > keep) {
      done_.push_back({q.back().id, static_cast<int>(s), ECANCELED, wire::tag_of(q.back().header)});
      q.pop_back();
    }
  }
  cv_.notify_one();
}

bool TcpWriter::between_frames(int socket) {
  std::lock_guard lock(mu_);
  return queues_[static_cast<size_t>(socket)].empty();
}

bool TcpWriter::idle() {
  std::lock_guard lock(mu_);
  for (auto& q : queues_) {
    if (!q.empty()) return false;
  }
  return true;
}

void TcpWriter::stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
}

// One non-blocking sendmsg of what is left of `op`; 0 or an errno.
int TcpWriter::push(int fd, Op& op) {
  while (op.sent < op.total()) {
    iovec iov[2];
    int n = 0;
    if (op.sent < sizeof op.header) {
      iov[n++] = {reinterpret_cast<char*>(&op.header) + op.sent, sizeof op.header - op.sent};
      if (op.length) iov[n++] = {const_cast<std::byte*>(op.data), op.length};
    } else {
      const size_t off = op.sent - sizeof op.header;
      iov[n++] = {const_cast<std::byte*>(op.data) + off, op.length - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == EWOULDBLOCK ? EAGAIN : errno;
    }
    op.sent += static_cast<size_t>(w);
  }
  return 0;
}

// Round-robin over the sockets with work, each pushed until its kernel buffer is full; the thread
// sleeps in poll() only when no socket could take a byte.
void TcpWriter::loop(std::stop_token st) {
  std::vector<pollfd> waiting;
  while (!st.stop_requested()) {
    bool progress = false;
    waiting.clear();
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        if (st.stop_requested()) return true;
        for (auto& q : queues_) {
          if (!q.empty()) return true;
        }
        return false;
      });
      if (st.stop_requested()) return;
    }
    for (size_t s = 0; s < queues_.size(); ++s) {
      Op* op = nullptr;
      {
        std::lock_guard lock(mu_);
        if (!queues_[s].empty()) {
          op = &queues_[s].front();  // stays put: only this thread pops the front
          busy_[s] = 1;
        }
      }
      if (op == nullptr) continue;
      const size_t before = op->sent;
      const int err = push(fds_[s], *op);
      progress = progress || op->sent != before;
      if (err == EAGAIN) {
        std::lock_guard lock(mu_);
        busy_[s] = 0;
        waiting.push_back({fds_[s], POLLOUT, 0});
        continue;
      }
      {
        std::lock_guard lock(mu_);
        busy_[s] = 0;
        const int socket = static_cast<int>(s);
        done_.push_back({op->id, socket, err, wire::tag_of(op->header)});
        queues_[s].pop_front();
        if (err != 0) {  // the socket is dead: so is everything queued behind
          for (Op& rest : queues_[s])
            done_.push_back({rest.id, socket, err, wire::tag_of(rest.header)});
          queues_[s].clear();
        }
      }
      progress = true;
      wake_();
    }
    if (!progress && !waiting.empty()) ::poll(waiting.data(), waiting.size(), 20);
  }
}

}  // namespace tributary::backends
