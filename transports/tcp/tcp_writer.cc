#include "transports/tcp/tcp_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tributary::transports {

TcpWriter::TcpWriter(size_t sockets, std::function<void()> wake)
    : queues_(sockets),
      busy_(sockets, 0),
      fds_(sockets, -1),
      macs_(sockets),
      pipes_(sockets),
      wake_(std::move(wake)) {
  thread_ = std::jthread([this](std::stop_token st) { loop(st); });
}

TcpWriter::~TcpWriter() {
  stop();
  for (Pipe& p : pipes_) {
    if (p.read >= 0) ::close(p.read);
    if (p.write >= 0) ::close(p.write);
  }
}

// 1 MiB (the unprivileged maximum by default, /proc/sys/fs/pipe-max-size) holds a whole segment;
// where the system refuses, the pipe keeps what it has (64 KiB by default).
bool TcpWriter::open_pipe(size_t socket) {
  Pipe& p = pipes_[socket];
  if (p.read >= 0) return true;
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return false;
  (void)::fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  const int capacity = ::fcntl(fds[1], F_GETPIPE_SZ);
  if (capacity <= 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  p = {fds[0], fds[1], static_cast<size_t>(capacity)};
  return true;
}

void TcpWriter::set_fd(int socket, int fd, const internal::Digest* mac_key) {
  // Every call here is non-blocking, but splice() can be told so only for its pipe: the socket
  // itself must be O_NONBLOCK, or a full one would block the call (and a caller's thread in
  // submit(), holding mu_).
  if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0 && (flags & O_NONBLOCK) == 0) {
    (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
  fds_[static_cast<size_t>(socket)] = fd;
  if (mac_key != nullptr) macs_[static_cast<size_t>(socket)] = internal::FrameMac(*mac_key);
}

void TcpWriter::seal(int socket, std::string& frame) {
  std::lock_guard lock(mu_);
  internal::FrameMac* mac = mac_of(static_cast<size_t>(socket));
  if (mac == nullptr) return;
  const internal::FrameMac::Tag tag = mac->of(frame.data(), frame.size());
  frame.append(reinterpret_cast<const char*>(tag.data()), tag.size());
}

bool TcpWriter::submit(int socket, Op op) {
  const size_t s = static_cast<size_t>(socket);
  std::lock_guard lock(mu_);
  auto& q = queues_[s];
  if (stopping_) {
    done_.push_back({op.id, socket, ECANCELED, wire::tag_of(op.header)});
    return false;
  }
  op.mac = macs_[s].enabled();
  if (op.splice && (op.mac || !open_pipe(s))) op.splice = false;
  if (q.empty()) {
    int err = op.splice ? push_spliced_here(s, op) : push_any(s, op);
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
    // A frame the MAC has started on is kept too: dropping it would put the MAC's frame count
    // ahead of the receiver's, and the abort frame after it would fail authentication.
    const size_t keep =
        !q.empty() && (busy_[s] || q.front().sent > 0 || q.front().maced > 0 || q.front().sealed)
            ? 1
            : 0;
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

// How far the MAC runs ahead of the bytes handed to the kernel: big enough to keep a socket
// buffer full, small enough to stay in cache until it is sent.
constexpr size_t kMacSlice = size_t{256} << 10;

// Non-blocking sendmsg calls for what is left of `op`, until it is sent or the socket is full; 0 or
// an errno. With `mac`, the payload is sent only as far as it has been fed to the MAC, and the tag
// once all of it has.
int TcpWriter::push(int fd, Op& op, internal::FrameMac* mac) {
  constexpr size_t kHeader = sizeof op.header;
  if (mac != nullptr && op.sent == 0 && op.maced == 0 && !op.sealed) {
    mac->begin();
    mac->update(&op.header, kHeader);
  }
  while (op.sent < op.total()) {
    if (mac != nullptr && !op.sealed) {
      const size_t payload_sent = op.sent > kHeader ? op.sent - kHeader : 0;
      const size_t want = std::min(op.length, std::max(op.maced, payload_sent) + kMacSlice);
      if (want > op.maced) mac->update(op.data + op.maced, want - op.maced);
      op.maced = want;
      if (op.maced == op.length) {
        op.tag = mac->finish();
        op.sealed = true;
      }
    }
    const size_t payload_ready = mac != nullptr ? op.maced : op.length;
    iovec iov[3];
    int n = 0;
    if (op.sent < kHeader) {
      iov[n++] = {reinterpret_cast<char*>(&op.header) + op.sent, kHeader - op.sent};
    }
    const size_t off = op.sent > kHeader ? op.sent - kHeader : 0;
    if (off < payload_ready) {
      iov[n++] = {const_cast<std::byte*>(op.data) + off, payload_ready - off};
    }
    if (op.sealed) {
      const size_t tag_off = op.sent > kHeader + op.length ? op.sent - kHeader - op.length : 0;
      iov[n++] = {op.tag.data() + tag_off, op.tag.size() - tag_off};
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

// splice() cannot be told MSG_NOSIGNAL: on the caller's thread, SIGPIPE is blocked around it (the
// writer thread blocks it for good), and one it raised is taken back before the mask is restored.
int TcpWriter::push_spliced_here(size_t socket, Op& op) {
  sigset_t pipe_only, before;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
  const int err = push_spliced(fds_[socket], op, pipes_[socket]);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return err;
}

// Non-blocking calls for what is left of a zero-copy `op`: the header by send(), then the payload's
// pages into the pipe (vmsplice) and from the pipe into the socket (splice), a pipe's capacity at a
// time; 0 or an errno. Bytes left in the pipe when the socket is full stay there for the next call,
// and no other frame starts on the socket before they are out (the op stays at the queue's front).
int TcpWriter::push_spliced(int fd, Op& op, const Pipe& pipe) {
  constexpr size_t kHeader = sizeof op.header;
  while (op.sent < kHeader) {
    const ssize_t w = ::send(fd, reinterpret_cast<char*>(&op.header) + op.sent, kHeader - op.sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == EWOULDBLOCK ? EAGAIN : errno;
    }
    op.sent += static_cast<size_t>(w);
  }
  while (op.sent < kHeader + op.length) {
    const size_t next = op.sent - kHeader + op.in_pipe;  // the first byte not yet in the pipe
    if (next < op.length && op.in_pipe < pipe.capacity) {
      iovec iov{const_cast<std::byte*>(op.data) + next,
                std::min(op.length - next, pipe.capacity - op.in_pipe)};
      const ssize_t v = ::vmsplice(pipe.write, &iov, 1, SPLICE_F_NONBLOCK);
      if (v > 0) {
        op.in_pipe += static_cast<size_t>(v);
      } else if (v < 0 && errno != EAGAIN && errno != EINTR) {
        return errno;
      }
    }
    if (op.in_pipe == 0) return EPIPE;  // an empty pipe that takes nothing: cannot go on
    // More to come (not yet in the pipe): let the kernel fill whole segments; the last piece goes
    // without the hint, so it is not held back.
    const bool more = op.sent - kHeader + op.in_pipe < op.length;
    const ssize_t w = ::splice(pipe.read, nullptr, fd, nullptr, op.in_pipe,
                               SPLICE_F_NONBLOCK | (more ? SPLICE_F_MORE : 0u));
    if (w < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EPIPE) {  // the SIGPIPE it raised is blocked on this thread: take it back
        const timespec now{0, 0};
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        while (::sigtimedwait(&pipe_only, nullptr, &now) == SIGPIPE) {
        }
      }
      return err == EWOULDBLOCK ? EAGAIN : err;
    }
    if (w == 0) return EPIPE;
    op.sent += static_cast<size_t>(w);
    op.in_pipe -= static_cast<size_t>(w);
  }
  return 0;
}

// Round-robin over the sockets with work, each pushed until its kernel buffer is full; the thread
// sleeps in poll() only when no socket could take a byte.
void TcpWriter::loop(std::stop_token st) {
  // splice() has no MSG_NOSIGNAL: a write to a closed connection must be an EPIPE, not a signal.
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);
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
      const int err = push_any(s, *op);
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

}  // namespace tributary::transports
