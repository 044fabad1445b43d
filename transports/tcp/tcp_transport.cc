#include "transports/tcp/tcp_transport.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/crypto/crypto.h"
#include "core/rendezvous.h"
#include "transports/tcp/congestion.h"
#include "transports/tcp/tcp_wire.h"
#include "transports/tcp/tcp_writer.h"

namespace tributary::transports {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using algorithms::Deadline;
using algorithms::MessageTag;
using Request = algorithms::Transport::Request;
using wire::FrameHeader;

std::array<uint8_t, 32> random_nonce() {
  std::array<uint8_t, 32> n;
  internal::random_bytes(n.data(), n.size());
  return n;
}

std::array<uint8_t, 32> proof(const std::string& secret, char role,
                              const std::array<uint8_t, 32>& nonce, int from, int to) {
  if (secret.empty()) return {};
  std::string msg(1, role);
  msg.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  msg += ":" + std::to_string(from) + ":" + std::to_string(to);
  return internal::hmac_sha256(secret, msg);
}

// The key of the frames `from` sends to `to` on connection `socket`: bound to this connection by
// both handshake nonces, so that frames cannot be moved between connections or sessions.
internal::Digest frame_key(const std::string& secret, const std::array<uint8_t, 32>& hello_nonce,
                           const std::array<uint8_t, 32>& ack_nonce, int from, int to,
                           int socket) {
  std::string msg = "tributary-ring-frames|";
  msg.append(reinterpret_cast<const char*>(hello_nonce.data()), hello_nonce.size());
  msg.append(reinterpret_cast<const char*>(ack_nonce.data()), ack_nonce.size());
  msg += "|" + std::to_string(from) + ">" + std::to_string(to) + "|" + std::to_string(socket);
  return internal::hmac_sha256(secret, msg);
}

std::string endpoint_text(const tcp::endpoint& e) {
  return e.address().to_string() + ":" + std::to_string(e.port());
}

// The header of stripe `k` of `stripes` of a message of `bytes`.
FrameHeader stripe_header(const MessageTag& tag, size_t bytes, int stripes, int k) {
  FrameHeader h = wire::header_for(tag, wire::stripe_of(bytes, stripes, k).length);
  h.message = bytes;
  h.stripe = static_cast<uint32_t>(k);
  return h;
}

}  // namespace

struct TcpTransport::Impl {
  struct RequestState {
    bool done = false;
    Status status;
    int peer = -1;
    bool is_send = false;
    MessageTag tag;
    int pending = 1;  // frames (stripes) not yet sent or received
  };
  // A frame a connection is to receive: a whole message, or one stripe of it.
  struct RecvPart {
    Request id;
    MessageTag tag;
    std::byte* data;
    size_t length;   // of this frame
    size_t message;  // of the whole message
    uint32_t stripe;
  };
  // One socket to a peer; connection c belongs to peer c / sockets_per_peer.
  struct Connection {
    std::unique_ptr<tcp::socket> socket;
    std::deque<RecvPart> recvs;
    size_t got = 0;  // bytes of the frame being read (header, payload, tag)
    FrameHeader incoming;
    // Authenticated frames (a secret and authenticate_frames): the keys of both directions, set by
    // the handshake, and the receiving MAC with the tag being read.
    bool authenticated = false;
    internal::Digest send_key{}, recv_key{};
    internal::FrameMac recv_mac;
    internal::FrameMac::Tag incoming_tag{};
    bool zero_copy = false;  // the frame being read was sent zero-copy
  };

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  int rank = 0, size = 1;
  int sockets_per_peer = 1;
  std::vector<Connection> conns;  // size x sockets_per_peer (this rank's own stay empty)
  std::unordered_map<Request, RequestState> requests;
  Request next_request = 1;
  Status error;
  std::string abort_frame;
  bool settled = false;
  std::unique_ptr<TcpWriter> writer;  // after the sockets are connected
  // Zero-copy (TcpTransportOptions::zero_copy): per peer, since the last fence, whether this rank
  // sent it a zero-copy frame (it is to confirm) or took one from it (this rank is to confirm).
  bool zero_copy = true;
  size_t zero_copy_min_message = 0;
  std::vector<char> confirm_due_from, confirm_owed_to;

  ~Impl() {
    if (writer) writer->stop();  // before the sockets it writes to close
    for (Connection& c : conns) close(c);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  int conn_index(int peer, int k) const { return peer * sockets_per_peer + k; }
  Connection& conn(int peer, int k) { return conns[static_cast<size_t>(conn_index(peer, k))]; }
  int peer_of(int c) const { return c / sockets_per_peer; }
  // "rank 2", or "rank 2 (socket 1 of 3)" when there are several.
  std::string link_name(int c) const {
    std::string s = "rank " + std::to_string(peer_of(c));
    if (sockets_per_peer > 1) {
      s += " (socket " + std::to_string(c % sockets_per_peer) + " of " +
           std::to_string(sockets_per_peer) + ")";
    }
    return s;
  }

  void start_writer() {
    writer = std::make_unique<TcpWriter>(conns.size(), [this] { wake(); });
    for (size_t c = 0; c < conns.size(); ++c) {
      Connection& x = conns[c];
      if (!x.socket) continue;
      writer->set_fd(static_cast<int>(c), x.socket->native_handle(),
                     x.authenticated ? &x.send_key : nullptr);
      if (x.authenticated) x.recv_mac = internal::FrameMac(x.recv_key);
    }
  }

  bool between_frames(int c) { return !writer || writer->between_frames(c); }

  // Takes the writer's completions (waiting thread only).
  void absorb() {
    if (!writer) return;
    for (const TcpWriter::Done& d : writer->take()) {
      const int peer = peer_of(d.socket);
      Status st;
      if (d.error == ECANCELED) {
        st = error.ok() ? aborted("send cancelled") : error;
      } else if (d.error != 0) {
        st = abort_reason_from(peer, "sent " + d.tag.describe());
        if (st.ok()) {
          st = unavailable("sending " + d.tag.describe() + " to " + link_name(d.socket) +
                           " failed: " + std::strerror(d.error) + " (did rank " +
                           std::to_string(peer) + " exit or fail? see its log)");
        }
      }
      complete(d.id, st);
      if (!st.ok()) fail(st);
    }
  }

  static void close(Connection& c) {
    if (c.socket && c.socket->is_open()) {
      boost::system::error_code ignored;
      c.socket->shutdown(tcp::socket::shutdown_both, ignored);
      c.socket->close(ignored);
    }
  }

  // Fails the transport and tells every peer why, so that they report the cause ("rank 1 gave up:
  // collective mismatch ...") rather than just a closed connection. A socket between frames gets
  // the reason and is closed at once; one in the middle of a frame is finished first by settle().
  void fail(const Status& s) {
    if (!error.ok()) return;
    error = s;
    std::string reason = s.message().substr(0, wire::kMaxAbortReason);
    FrameHeader h;
    h.magic = wire::kAbortMagic;
    h.length = reason.size();
    abort_frame.assign(reinterpret_cast<const char*>(&h), sizeof h);
    abort_frame += reason;
    if (writer) writer->quiesce();
    for (size_t c = 0; c < conns.size(); ++c) {
      if (between_frames(static_cast<int>(c))) send_abort_and_close(static_cast<int>(c));
    }
  }

  void send_abort_and_close(int c) {
    Connection& x = conns[static_cast<size_t>(c)];
    if (x.socket && x.socket->is_open()) {
      std::string frame = abort_frame;
      if (writer) writer->seal(c, frame);
      (void)::send(x.socket->native_handle(), frame.data(), frame.size(),
                   MSG_DONTWAIT | MSG_NOSIGNAL);
      if (confirm_due_from[static_cast<size_t>(peer_of(c))]) {  // see linger_for_zero_copy
        ::shutdown(x.socket->native_handle(), SHUT_WR);
        return;
      }
    }
    close(x);
  }

  // A failed transport that sent zero-copy frames a peer has not confirmed: TCP may still read
  // them from this process's pages, which the caller is free to change once the error is back.
  // Before it returns, the transport ends its side of those connections, behind the abort frame,
  // and waits until each holds no byte that the peer's kernel has not acknowledged (SIOCOUTQ: a
  // network will not need them again, and on one host they and the abort frame behind them are in
  // the peer's queue, where the peer's sender_gave_up() sees the abort after the frames), or until
  // the peer closed, reading and dropping what it sends, for at most kZeroCopyLinger: a peer that
  // stopped reading with its window full holds the rest in this process's queue until then.
  static constexpr auto kZeroCopyLinger = std::chrono::seconds(1);
  void linger_for_zero_copy() {
    std::vector<int> open;
    for (size_t c = 0; c < conns.size(); ++c) {
      Connection& x = conns[c];
      if (x.socket && x.socket->is_open() &&
          confirm_due_from[static_cast<size_t>(peer_of(static_cast<int>(c)))]) {
        open.push_back(static_cast<int>(c));
      }
    }
    // Our end first: a peer still waiting for the rest of a frame sees the stream end and fails.
    for (int c : open) ::shutdown(conns[static_cast<size_t>(c)].socket->native_handle(), SHUT_WR);
    const Deadline until = Clock::now() + kZeroCopyLinger;
    std::vector<std::byte> sink(size_t{64} << 10);
    while (!open.empty() && Clock::now() < until) {
      std::vector<pollfd> fds;
      for (int c : open)
        fds.push_back({conns[static_cast<size_t>(c)].socket->native_handle(), POLLIN, 0});
      (void)::poll(fds.data(), fds.size(), 10);
      std::erase_if(open, [&](int c) {
        const int fd = conns[static_cast<size_t>(c)].socket->native_handle();
        int unacknowledged = 0;
        if (::ioctl(fd, SIOCOUTQ, &unacknowledged) == 0 && unacknowledged == 0) return true;
        for (;;) {
          const ssize_t r = ::recv(fd, sink.data(), sink.size(), MSG_DONTWAIT);
          if (r > 0) continue;
          if (r < 0 && errno == EINTR) continue;
          return !(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));  // closed, or an error
        }
      });
    }
    std::fill(confirm_due_from.begin(), confirm_due_from.end(), 0);
  }

  // After a failure, outside any handler: lets frames in flight finish (briefly), then sends the
  // reason on those sockets too and closes everything.
  void settle() {
    if (settled || error.ok()) return;
    settled = true;
    const Deadline until = Clock::now() + std::chrono::milliseconds(500);
    while (writer && !writer->idle() && Clock::now() < until) {
      absorb();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<char> clean(conns.size());
    for (size_t c = 0; c < conns.size(); ++c) clean[c] = between_frames(static_cast<int>(c));
    if (writer) writer->stop();
    absorb();
    for (size_t c = 0; c < conns.size(); ++c) {
      if (clean[c]) send_abort_and_close(static_cast<int>(c));
    }
    linger_for_zero_copy();
    for (Connection& x : conns) close(x);
  }

  // One frame of request `id` is done (sent or received): the request is when all are, or at the
  // first that failed.
  void complete(Request id, Status s) {
    auto it = requests.find(id);
    if (it == requests.end() || it->second.done) return;
    RequestState& r = it->second;
    if (!s.ok()) {
      r.done = true;
      r.status = std::move(s);
    } else if (--r.pending <= 0) {
      r.done = true;
    }
  }

  // When a peer gave up it sent its reason on each of its sockets before closing; a send that fails
  // finds it here if it is the next thing on one (non-blocking; OK when there is none).
  Status abort_reason_from(int peer, const std::string& doing) {
    for (int k = 0; k < sockets_per_peer; ++k) {
      Connection& c = conn(peer, k);
      if (!c.socket || !c.socket->is_open()) continue;
      const int fd = c.socket->native_handle();
      FrameHeader h;
      if (::recv(fd, &h, sizeof h, MSG_DONTWAIT | MSG_PEEK) != static_cast<ssize_t>(sizeof h) ||
          h.magic != wire::kAbortMagic || h.length > wire::kMaxAbortReason) {
        continue;
      }
      const size_t tag = c.authenticated ? internal::FrameMac::kTagBytes : 0;
      std::string frame(sizeof h + h.length + tag, '\0');
      const ssize_t got = ::recv(fd, frame.data(), frame.size(), MSG_DONTWAIT);
      if (got != static_cast<ssize_t>(frame.size())) continue;
      std::string reason = frame.substr(sizeof h, h.length);
      if (tag != 0 && !abort_authentic(c, frame.data(), sizeof h + h.length,
                                       frame.data() + sizeof h + h.length)) {
        reason = unauthenticated_abort(reason);
      }
      return aborted("rank " + std::to_string(peer) + " gave up while rank " +
                     std::to_string(rank) + " " + doing + ": " + reason);
    }
    return Status();
  }

  // An abort frame's tag (its frame number is the next one on the connection).
  static bool abort_authentic(Connection& c, const void* frame, size_t n, const void* tag) {
    const internal::FrameMac::Tag want = c.recv_mac.of(frame, n);
    return internal::bytes_equal(want.data(), tag, want.size());
  }
  static std::string unauthenticated_abort(const std::string& reason) {
    return "(the reason given failed authentication: it was not sent by a process with the "
           "secret, or was changed on the way) \"" +
           reason.substr(0, 200) + "\"";
  }

  Status frame_forged(int c, const MessageTag& tag) const {
    return aborted("a frame of " + tag.describe() + " from " + link_name(c) +
                   " failed authentication: it was changed on the way or sent by a process "
                   "without the secret (a tampering relay or a misrouted connection on the "
                   "network); the data was rejected and this collective failed");
  }

  // --- receiving ---------------------------------------------------------------------------------
  // After the handshakes, frames are read without Asio: each connection with a receive posted reads
  // with one non-blocking recvmsg() into the header, the posted buffer and the tag at once, so that
  // a small frame costs one system call (on a virtual machine a call costs about a microsecond, and
  // at 4 KiB a reactor round per piece was most of the time). The header is checked as soon as it
  // is in; a frame that is not the one posted (a mismatch, an abort) fails the transport, so bytes
  // read past it do not matter, except an abort's reason, gathered from where it landed.
  static constexpr size_t kHeader = sizeof(FrameHeader);
  // The most payload one recvmsg() takes: a bound on how long one copy runs before the kernel
  // updates the window. Under BBR (which used to pace same-host connections, congestion.h) 64 KiB
  // was best at N=2 over loopback (busbw, medians of 6 interleaved passes at 1, 2, 8 MiB: unbounded
  // 1.73/1.67/1.78 GB/s, 64 KiB 2.0/1.97/2.1). Under reno, 1 MiB reads: three interleaved passes,
  // in place, 1 MiB 7.58/7.45/4.42 against 64 KiB's 6.21/6.53/3.78, 4 MiB 7.69/7.60/4.50 against
  // 4.50/6.56/3.80, 16 MiB 5.2/5.2/4.3 against 4.6/4.4/3.2, 256 MiB 3.3/3.8/2.3 against
  // 2.8/2.9/2.8; unbounded reads were no better than 1 MiB.
  static constexpr size_t kMaxRead = size_t{1} << 20;

  Status peer_closed(int c, const RecvPart& part, int err) {
    if (err == 0 || err == ECONNRESET) {
      return unavailable(link_name(c) + " closed the connection while rank " +
                         std::to_string(rank) + " waited for " + part.tag.describe() +
                         "; it may have exited or failed (see its log)");
    }
    return unavailable("receiving " + part.tag.describe() + " from " + link_name(c) +
                       " failed: " + std::strerror(err));
  }

  // Ends the frame being read on connection `c` with `s` (an error): fails the request and the
  // transport.
  void read_failed(int c, Status s) {
    Connection& x = conns[static_cast<size_t>(c)];
    if (!error.ok()) s = error;
    if (!x.recvs.empty()) complete(x.recvs.front().id, s);
    fail(s);
  }

  // Checks a frame header against the part posted for it; OK or why not.
  Status check_header(int c, const FrameHeader& h, const RecvPart& part) const {
    const int peer = peer_of(c);
    if (h.magic != wire::kFrameMagic) {
      return aborted(link_name(c) +
                     " sent bytes that are not a tributary frame while this rank "
                     "waited for " +
                     part.tag.describe() + "; the stream is corrupt");
    }
    MessageTag got = wire::tag_of(h);
    if (!got.same_collective(part.tag) || got.step != part.tag.step || h.message != part.message) {
      return aborted("collective mismatch: rank " + std::to_string(peer) + " sent " +
                     got.describe() + " (" + std::to_string(h.message) + " bytes) but rank " +
                     std::to_string(rank) + " expects " + part.tag.describe() + " (" +
                     std::to_string(part.message) +
                     " bytes); every rank must issue the same collectives in the same order, "
                     "with the same backend options");
    }
    // Same message, so the same cut: anything else is a broken sender, not a user error.
    if (h.stripe != part.stripe || h.length != part.length) {
      return aborted(link_name(c) + " sent stripe " + std::to_string(h.stripe) + " (" +
                     std::to_string(h.length) + " bytes) of " + part.tag.describe() +
                     " where stripe " + std::to_string(part.stripe) + " (" +
                     std::to_string(part.length) + " bytes) belongs; the stream is corrupt");
    }
    return Status();
  }

  // Connection `c` brought an abort frame (header in x.incoming) where `part` was posted: its
  // reason (and tag) are the `got` bytes already read after the header, which landed in the posted
  // buffer and then the tag buffer, and the rest, still in the socket (the sender wrote the whole
  // frame at once before closing: a second is plenty).
  void read_abort_reason(int c, const RecvPart& part, size_t got) {
    Connection& x = conns[static_cast<size_t>(c)];
    const size_t length = x.incoming.length;
    const size_t tag = x.authenticated ? internal::FrameMac::kTagBytes : 0;
    std::string frame(reinterpret_cast<const char*>(&x.incoming), kHeader);
    const size_t in_data = std::min(got, part.length);
    frame.append(reinterpret_cast<const char*>(part.data), in_data);
    frame.append(reinterpret_cast<const char*>(x.incoming_tag.data()), got - in_data);
    frame.resize(std::min(frame.size(), kHeader + length + tag));
    const Deadline until = Clock::now() + std::chrono::seconds(1);
    const int fd = x.socket->native_handle();
    while (frame.size() < kHeader + length + tag && Clock::now() < until) {
      char buf[512];
      const size_t want = std::min(sizeof buf, kHeader + length + tag - frame.size());
      const ssize_t r = ::recv(fd, buf, want, MSG_DONTWAIT);
      if (r > 0) {
        frame.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;
      } else {
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, 10);
      }
    }
    std::string reason;
    if (frame.size() < kHeader + length + tag) {
      reason = "(no reason received)";
    } else {
      reason = frame.substr(kHeader, length);
      if (tag != 0 && !abort_authentic(x, frame.data(), kHeader + length,
                                       frame.data() + kHeader + length)) {
        reason = unauthenticated_abort(reason);
      }
    }
    read_failed(c, aborted("rank " + std::to_string(peer_of(c)) + " gave up while rank " +
                           std::to_string(rank) + " waited for " + part.tag.describe() + ": " +
                           reason));
  }

  // Reads what has arrived on connection `c` for its posted receives, without blocking; true when
  // a byte came or a receive ended.
  bool pump(int c) {
    Connection& x = conns[static_cast<size_t>(c)];
    bool progress = false;
    while (!x.recvs.empty() && error.ok()) {
      const RecvPart& part = x.recvs.front();
      const size_t tag = x.authenticated ? internal::FrameMac::kTagBytes : 0;
      const size_t total = kHeader + part.length + tag;
      iovec iov[3];
      size_t n = 0;
      if (x.got < kHeader) {
        iov[n++] = {reinterpret_cast<char*>(&x.incoming) + x.got, kHeader - x.got};
      }
      const size_t off = x.got > kHeader ? x.got - kHeader : 0;
      const size_t piece = std::min(part.length - std::min(off, part.length), kMaxRead);
      if (piece > 0) iov[n++] = {part.data + off, piece};
      const size_t tag_off = x.got > kHeader + part.length ? x.got - kHeader - part.length : 0;
      if (tag_off < tag && off + piece >= part.length) {
        iov[n++] = {x.incoming_tag.data() + tag_off, tag - tag_off};
      }
      size_t asked = 0;
      for (size_t i = 0; i < n; ++i) asked += iov[i].iov_len;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      const ssize_t r = ::recvmsg(x.socket->native_handle(), &msg, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      progress = true;
      if (r <= 0) {
        read_failed(c, error.ok() ? peer_closed(c, part, r == 0 ? 0 : errno) : error);
        break;
      }
      const size_t before = x.got;
      x.got += static_cast<size_t>(r);
      if (before < kHeader && x.got >= kHeader) {
        const FrameHeader& h = x.incoming;
        if (h.magic == wire::kAbortMagic && h.length <= wire::kMaxAbortReason) {
          read_abort_reason(c, part, x.got - kHeader);
          break;
        }
        if (Status bad = check_header(c, h, part); !bad.ok()) {
          read_failed(c, std::move(bad));
          break;
        }
        if ((h.flags & wire::kFrameZeroCopy) != 0) {
          confirm_owed_to[static_cast<size_t>(peer_of(c))] = 1;
        }
        x.zero_copy = (h.flags & wire::kFrameZeroCopy) != 0;
        if (tag != 0) {
          x.recv_mac.begin();
          x.recv_mac.update(&h, kHeader);
        }
      }
      if (tag != 0 && x.got > kHeader) {  // the payload that came, into the MAC
        const size_t from = std::min(std::max(before, kHeader) - kHeader, part.length);
        const size_t to = std::min(x.got - kHeader, part.length);
        if (to > from) x.recv_mac.update(part.data + from, to - from);
      }
      if (x.got < total) {
        if (static_cast<size_t>(r) < asked) break;  // drained: the rest is on its way
        continue;
      }
      if (tag != 0) {
        const auto want = x.recv_mac.finish();
        if (!internal::bytes_equal(want.data(), x.incoming_tag.data(), want.size())) {
          read_failed(c, frame_forged(c, part.tag));
          break;
        }
      }
      if (x.zero_copy && sender_gave_up(c)) {
        // Read again in place of the frame: the abort frame or the end of the stream fails this
        // receive with the sender's reason, as if it had come instead.
        x.got = 0;
        x.zero_copy = false;
        continue;
      }
      const Request id = part.id;
      x.recvs.pop_front();
      x.got = 0;
      complete(id, Status());
    }
    return progress;
  }

  // A zero-copy frame was read from the sender's pages, which its caller may change once the
  // sender's call has failed, and before that call returns the sender puts its abort frame (or the
  // end of the stream) behind every frame it sent (fail(), settle(), linger_for_zero_copy()). So
  // when neither follows the frame by the time it has been read, the sender's call had not
  // returned while it was read, and the bytes are the ones it sent; when one does, they may not be.
  bool sender_gave_up(int c) {
    uint32_t magic = 0;
    const ssize_t r = ::recv(conns[static_cast<size_t>(c)].socket->native_handle(), &magic,
                             sizeof magic, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r == static_cast<ssize_t>(sizeof magic) && magic == wire::kAbortMagic);
  }

  // Reads on every connection with a receive posted; true on any progress.
  bool pump_all() {
    bool progress = false;
    for (size_t c = 0; c < conns.size() && error.ok(); ++c) {
      if (!conns[c].recvs.empty()) progress = pump(static_cast<int>(c)) || progress;
    }
    return progress;
  }

  // --- driving -----------------------------------------------------------------------------------
  // Runs Asio's handlers (the handshakes) until `done()` or the deadline; false on timeout.
  template <typename Done>
  bool run_until(Deadline deadline, Done&& done) {
    while (!done()) {
      if (io.stopped()) io.restart();
      if (io.run_one_until(deadline) == 0 && Clock::now() >= deadline) return done();
    }
    return true;
  }

  // Reads and takes the writer's completions until `done()` or the deadline; false on timeout.
  // Polls without sleeping for `spin` first (yielding between looks after kPollAlone, unless
  // poll=always): a message is often only microseconds away, and waking from poll() costs more
  // than that. Then, with more ranks than cores, polls with sched_yield() for `yield`. Then sleeps
  // in poll() on the sockets with receives posted and the writer's eventfd, until the deadline.
  template <typename Done>
  bool progress_until(Deadline deadline, Done&& wanted) {
    // Every look at `wanted` also takes another thread's interrupt(): it fails the transport here,
    // on the waiting thread, which `wanted` then sees.
    const auto done = [&] {
      if (interrupted.load(std::memory_order_relaxed)) [[unlikely]] {
        take_interrupt();
      }
      return wanted();
    };
    pump_all();
    if (done()) return true;
    // Not while the writer thread has work: on a busy link it needs the core more than we do.
    const bool writer_busy = writer && !writer->idle();
    const auto start = Clock::now();
    const Deadline spin_until = writer_busy ? start : std::min(deadline, start + spin);
    for (auto now = start; now < spin_until; now = Clock::now()) {
      pump_all();
      if (done()) return true;
      if (spin != internal::kPollAlways && now - start >= internal::kPollAlone) {
        sched_yield();  // see kPollAlone; poll=always is a pure poll
      }
    }
    if (yield.count() > 0 && !writer_busy) {
      const Deadline yield_until = std::min(deadline, Clock::now() + yield);
      while (Clock::now() < yield_until) {
        sched_yield();
        pump_all();
        if (done()) return true;
      }
    }
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_fd, POLLIN, 0});
      for (const Connection& x : conns) {
        if (!x.recvs.empty() && x.socket && x.socket->is_open())
          fds.push_back({x.socket->native_handle(), POLLIN, 0});
      }
      sleeping.store(true);
      if (done()) {
        sleeping.store(false);
        return true;
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        sleeping.store(false);
        return done();
      }
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      sleeping.store(false);
      if (fds[0].revents != 0) {
        uint64_t drained;
        (void)!::read(wake_fd, &drained, sizeof drained);
      }
      pump_all();
      if (done()) return true;
    }
  }
  // Called by the writer thread after a completion: wakes progress_until() from poll().
  void wake() {
    if (sleeping.load()) {
      const uint64_t one = 1;
      (void)!::write(wake_fd, &one, sizeof one);
    }
  }
  // Another thread's interrupt() (any time): the wait in progress, or the next, fails with `why`.
  void interrupt(const Status& why) {
    {
      std::lock_guard lock(interrupt_mu);
      if (!interrupt_why.ok()) return;
      interrupt_why = why;
    }
    interrupted.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
  void take_interrupt() {
    Status why;
    {
      std::lock_guard lock(interrupt_mu);
      why = interrupt_why;
    }
    fail(why);  // nothing if failed already
  }
  std::chrono::nanoseconds spin{std::chrono::microseconds(50)};
  std::chrono::nanoseconds yield{0};
  int wake_fd = -1;  // an eventfd
  std::atomic<bool> sleeping{false};
  std::atomic<bool> interrupted{false};
  std::mutex interrupt_mu;
  Status interrupt_why;
};

// --- setup ---------------------------------------------------------------------------------------
namespace {

// Reads (kWrite false) or writes all of `buf` on `s` by `deadline`; `what` names it in errors.
template <bool kWrite, typename Impl, typename Buffer>
Status transfer_exact(Impl& impl, tcp::socket& s, Buffer buf, Deadline deadline, const char* what) {
  bool done = false;
  boost::system::error_code result;
  auto handler = [&](const boost::system::error_code& ec, size_t) {
    result = ec;
    done = true;
  };
  if constexpr (kWrite) {
    asio::async_write(s, buf, handler);
  } else {
    asio::async_read(s, buf, handler);
  }
  const std::string verb = kWrite ? "writing the " : "reading the ";
  if (!impl.run_until(deadline, [&] { return done; })) {
    s.cancel();
    impl.run_until(Clock::now() + std::chrono::seconds(1), [&] { return done; });
    return deadline_exceeded("timed out " + verb + what);
  }
  if (result) return unavailable(verb + what + " failed: " + result.message());
  return Status();
}

template <typename Impl, typename Buffer>
Status read_exact(Impl& impl, tcp::socket& s, Buffer buf, Deadline deadline, const char* what) {
  return transfer_exact<false>(impl, s, buf, deadline, what);
}

template <typename Impl, typename Buffer>
Status write_exact(Impl& impl, tcp::socket& s, Buffer buf, Deadline deadline, const char* what) {
  return transfer_exact<true>(impl, s, buf, deadline, what);
}

// TCP_NODELAY, and the congestion control (congestion.h): `congestion` was checked when the
// backend was made, so a refusal here (a connection of another family) keeps the kernel's choice.
void tune(tcp::socket& s, const std::string& congestion) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  (void)apply_congestion_control(s.native_handle(), congestion);
}

// The steps of TcpTransport::create, each its own function: listen and publish, connect to every
// lower rank (the client side of the handshake), accept every higher rank (the server side).
class TcpSetup {
 public:
  TcpSetup(TcpTransport::Impl& impl, Store& store, const TcpTransportOptions& options)
      : impl_(impl),
        store_(store),
        options_(options),
        deadline_(Clock::now() + options.timeout),
        cluster_(internal::digest64(options.cluster_id)),
        layout_(internal::digest64(options.layout)),
        who_("ring transport (rank " + std::to_string(impl.rank) + " of " +
             std::to_string(impl.size) + ")"),
        acceptor_(impl.io) {}

  const std::string& who() const { return who_; }

  Status listen_and_publish() {
    boost::system::error_code ec;
    const std::string host =
        options_.host.empty() ? internal::interface_towards(options_.coordinator) : options_.host;
    tcp::endpoint bind_at(asio::ip::make_address(host, ec), 0);
    if (ec) {
      return invalid_argument(who_ + ": host '" + host + "' is not an IP address: " + ec.message());
    }
    acceptor_.open(bind_at.protocol(), ec);
    // Not inherited by the processes this one starts, which would keep the port.
    if (!ec) ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
    if (!ec) acceptor_.bind(bind_at, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return unavailable(who_ + ": cannot listen on " + host + ": " + ec.message() +
                         "; set host= in the ring spec to an address of this machine");
    }
    return store_.set("addr/" + std::to_string(impl_.rank),
                      endpoint_text(acceptor_.local_endpoint()));
  }

  // Under congestion auto, every connection to a peer that the caller says is on this kernel
  // (TcpTransportOptions::same_kernel: another container or network namespace of this machine,
  // which the addresses do not reveal) gets the same-host treatment of congestion.h.
  void tune_same_kernel_peers() {
    if (!(options_.congestion.empty() || options_.congestion == "auto")) return;
    const int known =
        static_cast<int>(std::min(options_.same_kernel.size(), static_cast<size_t>(impl_.size)));
    for (int peer = 0; peer < known; ++peer) {
      if (peer == impl_.rank || !options_.same_kernel[static_cast<size_t>(peer)]) continue;
      for (int k = 0; k < impl_.sockets_per_peer; ++k) {
        if (auto& s = impl_.conn(peer, k).socket) {
          (void)apply_congestion_control(s->native_handle(), options_.congestion, true);
        }
      }
    }
  }

  Status connect_lower() {
    for (int peer = 0; peer < impl_.rank; ++peer) {
      const auto remaining = std::chrono::duration_cast<Store::Duration>(deadline_ - Clock::now());
      auto address = store_.get("addr/" + std::to_string(peer), remaining);
      if (!address.ok()) {
        return address.status().with_context(who_ + ": waiting for rank " + std::to_string(peer));
      }
      TRIBUTARY_ASSIGN_OR_RETURN(tcp::endpoint target, parse_address(peer, *address));
      for (int k = 0; k < impl_.sockets_per_peer; ++k) {
        TRIBUTARY_RETURN_IF_ERROR(connect_one(peer, k, target, *address));
      }
    }
    return Status();
  }

  // Files every higher rank's connections by the socket index of their hello; those that fail the
  // handshake are dropped and we go on. Handshakes run concurrently, each under its own short
  // deadline, so a silent or slow connection delays no one: accepting goes on while it waits.
  Status accept_higher() {
    expected_ = (impl_.size - 1 - impl_.rank) * impl_.sockets_per_peer;
    if (expected_ > 0) start_accept();
    const bool finished = impl_.run_until(deadline_, [&] { return expected_ <= 0 || !fatal_.ok(); });
    // Whatever is still in flight ends here: its handlers refer to this object.
    boost::system::error_code ignored;
    acceptor_.cancel(ignored);
    for (const auto& h : pending_) {
      h->timer.cancel();
      if (h->socket) h->socket->close(ignored);
    }
    impl_.run_until(Clock::now() + std::chrono::seconds(2), [&] { return in_flight_ == 0; });
    pending_.clear();
    if (!fatal_.ok()) return fatal_;
    if (!finished) {
      return deadline_exceeded(
          who_ + ": " + std::to_string(expected_) +
          " connection(s) from higher ranks did not arrive before the timeout" +
          (rejected_.empty() ? "" : "; rejected: " + rejected_));
    }
    return Status();
  }

 private:
  std::string layout_advice() const {
    return "every process must use the same number of local replicas and the same backend options "
           "(this rank: " +
           options_.layout + ")";
  }
  // The socket count is in the layout too; checked first, so that the message names both values.
  Status sockets_differ(const std::string& ctx, int peer, int theirs) const {
    return invalid_argument(
        ctx + ": rank " + std::to_string(peer) +
        " is set up differently: it uses sockets_per_peer=" + std::to_string(theirs) +
        ", this rank sockets_per_peer=" + std::to_string(impl_.sockets_per_peer) + "; " +
        layout_advice());
  }

  StatusOr<tcp::endpoint> parse_address(int peer, const std::string& text) const {
    const size_t colon = text.rfind(':');
    unsigned port = 0;
    const char* port_begin = text.data() + (colon == std::string::npos ? text.size() : colon + 1);
    auto [end, perr] = std::from_chars(port_begin, text.data() + text.size(), port);
    boost::system::error_code ec;
    if (colon != std::string::npos && perr == std::errc() && end == text.data() + text.size() &&
        port >= 1 && port <= 65535) {
      auto address = asio::ip::make_address(text.substr(0, colon), ec);
      if (!ec) return tcp::endpoint(address, static_cast<uint16_t>(port));
    }
    return internal_error(who_ + ": rank " + std::to_string(peer) + " published a bad address '" +
                          text + "' (is another program using the same store key?)");
  }

  // Opens connection `k` to `peer` and runs the client side of the handshake.
  Status connect_one(int peer, int k, const tcp::endpoint& target, const std::string& text) {
    const int sockets = impl_.sockets_per_peer;
    const std::string ctx = who_ + ": handshake with rank " + std::to_string(peer) + " at " + text +
                            (sockets > 1 ? " (socket " + std::to_string(k) + ")" : "");
    auto socket = std::make_unique<tcp::socket>(impl_.io);
    bool connected = false;
    boost::system::error_code cec;
    socket->async_connect(target, [&](const boost::system::error_code& e) {
      cec = e;
      connected = true;
    });
    if (!impl_.run_until(deadline_, [&] { return connected; })) {
      return deadline_exceeded(who_ + ": could not connect to rank " + std::to_string(peer) +
                               " at " + text + " before the timeout");
    }
    if (cec) {
      return unavailable(who_ + ": connecting to rank " + std::to_string(peer) + " at " + text +
                         " failed: " + cec.message() + "; is it running and reachable?");
    }
    tune(*socket, options_.congestion);
    wire::Hello hello;
    hello.cluster = cluster_;
    hello.layout = layout_;
    hello.world = impl_.size;
    hello.rank = impl_.rank;
    hello.sockets = sockets;
    hello.socket = k;
    hello.nonce = random_nonce();
    TRIBUTARY_RETURN_IF_ERROR(
        write_exact(impl_, *socket, asio::buffer(&hello, sizeof hello), deadline_, "hello")
            .with_context(ctx));
    wire::HelloAck ack;
    TRIBUTARY_RETURN_IF_ERROR(
        read_exact(impl_, *socket, asio::buffer(&ack, sizeof ack), deadline_, "hello answer")
            .with_context(ctx));
    TRIBUTARY_RETURN_IF_ERROR(check_peer(ctx, peer, ack));
    // A different setup is reported only once the peer has proved the secret (a stranger without
    // it must not end this setup), so the proof goes first either way.
    const Status differs = check_setup(ctx, peer, k, ack);
    wire::Auth auth;
    auth.mac = proof(options_.secret, 'C', ack.nonce, impl_.rank, peer);
    TRIBUTARY_RETURN_IF_ERROR(
        write_exact(impl_, *socket, asio::buffer(&auth, sizeof auth), deadline_, "authentication")
            .with_context(ctx));
    wire::Verdict verdict;
    TRIBUTARY_RETURN_IF_ERROR(
        read_exact(impl_, *socket, asio::buffer(&verdict, sizeof verdict), deadline_, "verdict")
            .with_context(ctx));
    const bool peer_proved =
        internal::digest_equal(ack.mac, proof(options_.secret, 'A', hello.nonce, peer, impl_.rank));
    if (!verdict.accepted || !peer_proved) {
      return unavailable(ctx +
                         ": authentication failed; every process must be given the same "
                         "secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE), or none");
    }
    TRIBUTARY_RETURN_IF_ERROR(differs);
    TcpTransport::Impl::Connection& x = impl_.conn(peer, k);
    x.socket = std::move(socket);
    if (authenticate_frames()) {
      x.authenticated = true;
      x.send_key = frame_key(options_.secret, hello.nonce, ack.nonce, impl_.rank, peer, k);
      x.recv_key = frame_key(options_.secret, hello.nonce, ack.nonce, peer, impl_.rank, k);
    }
    return Status();
  }

  bool authenticate_frames() const {
    return !options_.secret.empty() && options_.authenticate_frames;
  }

  // The answer is from a tributary rank `peer` of this job.
  Status check_peer(const std::string& ctx, int peer, const wire::HelloAck& ack) const {
    if (ack.magic != wire::kHelloMagic || ack.version != wire::kProtocolVersion) {
      return unavailable(ctx + ": the peer does not speak tributary's protocol version " +
                         std::to_string(wire::kProtocolVersion));
    }
    if (ack.cluster != cluster_ || ack.world != impl_.size || ack.rank != peer) {
      return unavailable(ctx +
                         ": the process there belongs to another job (cluster, world size "
                         "or rank differ); check the cluster spec");
    }
    return Status();
  }

  // The peer is set up as this rank is (sockets per peer, layout) and filed this connection as
  // socket `k`.
  Status check_setup(const std::string& ctx, int peer, int k, const wire::HelloAck& ack) const {
    if (ack.sockets != impl_.sockets_per_peer) return sockets_differ(ctx, peer, ack.sockets);
    if (ack.layout != layout_) {
      return invalid_argument(ctx + ": rank " + std::to_string(peer) + " is set up differently; " +
                              layout_advice());
    }
    if (ack.socket != k) {
      return internal_error(ctx + ": the peer filed this connection as socket " +
                            std::to_string(ack.socket));
    }
    return Status();
  }

  // --- the server side of the handshake, one state machine per accepted connection ---------------
  struct Pending {
    explicit Pending(asio::io_context& io) : timer(io) {}
    std::unique_ptr<tcp::socket> socket;
    asio::steady_timer timer;
    std::string from;
    wire::Hello hello;
    wire::HelloAck ack;
    wire::Auth auth;
    wire::Verdict verdict;
    bool same_sockets = true;
  };

  void start_accept() {
    auto socket = std::make_unique<tcp::socket>(impl_.io);
    tcp::socket& target = *socket;
    ++in_flight_;
    acceptor_.async_accept(target, [this, s = std::shared_ptr<tcp::socket>(std::move(socket))](
                                       const boost::system::error_code& ec) mutable {
      --in_flight_;
      if (expected_ <= 0 || !fatal_.ok() || ec == asio::error::operation_aborted) return;
      if (ec) {
        fatal_ = unavailable(who_ + ": accept failed: " + ec.message());
        return;
      }
      tune(*s, options_.congestion);
      auto h = std::make_shared<Pending>(impl_.io);
      h->socket = std::make_unique<tcp::socket>(std::move(*s));
      boost::system::error_code pec;
      h->from = endpoint_text(h->socket->remote_endpoint(pec));
      pending_.push_back(h);
      // A short deadline per handshake, so that a silent client holds only its own connection.
      h->timer.expires_at(std::min(deadline_, Clock::now() + std::chrono::seconds(10)));
      ++in_flight_;
      h->timer.async_wait([this, h](const boost::system::error_code& e) {
        --in_flight_;
        boost::system::error_code ignored;
        if (!e && h->socket) h->socket->close(ignored);  // its pending read or write fails
      });
      read_hello(h);
      start_accept();
    });
  }

  // Runs `step` once `n` bytes at `p` have been read (or written) on h's socket; a failure (the
  // handshake's deadline included) drops the connection.
  template <typename Step>
  void io_step(const std::shared_ptr<Pending>& h, bool write, void* p, size_t n, const char* what,
               Step step) {
    ++in_flight_;
    auto done = [this, h, what, step](const boost::system::error_code& ec, size_t) {
      --in_flight_;
      if (ec == asio::error::operation_aborted) {
        return drop(h, std::string("timed out waiting for the ") + what);
      }
      if (ec) return drop(h, std::string("the ") + what + " failed: " + ec.message());
      if (!fatal_.ok() || expected_ <= 0) return drop(h, "setup is over");
      step();
    };
    if (write) {
      asio::async_write(*h->socket, asio::buffer(p, n), std::move(done));
    } else {
      asio::async_read(*h->socket, asio::buffer(p, n), std::move(done));
    }
  }

  void drop(const std::shared_ptr<Pending>& h, const std::string& why) {
    if (!h->socket) return;
    rejected_ += (rejected_.empty() ? "" : "; ") + h->from + " (" + why + ")";
    boost::system::error_code ignored;
    h->socket->close(ignored);
    h->socket.reset();
    h->timer.cancel();
    forget(h);
  }

  void forget(const std::shared_ptr<Pending>& h) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), h), pending_.end());
  }

  void read_hello(const std::shared_ptr<Pending>& h) {
    io_step(h, false, &h->hello, sizeof h->hello, "hello", [this, h] { answer_hello(h); });
  }

  void answer_hello(const std::shared_ptr<Pending>& h) {
    const wire::Hello& hello = h->hello;
    const int sockets = impl_.sockets_per_peer;
    if (hello.magic != wire::kHelloMagic || hello.version != wire::kProtocolVersion) {
      return drop(h, "not a tributary peer (bad magic or version)");
    }
    if (hello.cluster != cluster_ || hello.world != impl_.size || hello.rank <= impl_.rank ||
        hello.rank >= impl_.size) {
      return drop(h, "a peer of another job (rank " + std::to_string(hello.rank) + ")");
    }
    h->same_sockets = hello.sockets == sockets;
    if (h->same_sockets && (hello.socket < 0 || hello.socket >= sockets ||
                            impl_.conn(hello.rank, hello.socket).socket)) {
      return drop(h, "a duplicate or bad connection: rank " + std::to_string(hello.rank) +
                         " socket " + std::to_string(hello.socket));
    }
    wire::HelloAck& ack = h->ack;
    ack.cluster = cluster_;
    ack.layout = layout_;
    ack.world = impl_.size;
    ack.rank = impl_.rank;
    ack.sockets = sockets;
    ack.socket = hello.socket;
    ack.nonce = random_nonce();
    ack.mac = proof(options_.secret, 'A', hello.nonce, impl_.rank, hello.rank);
    io_step(h, true, &h->ack, sizeof h->ack, "hello answer", [this, h] {
      io_step(h, false, &h->auth, sizeof h->auth, "authentication", [this, h] { judge(h); });
    });
  }

  void judge(const std::shared_ptr<Pending>& h) {
    const bool ok = internal::digest_equal(
        h->auth.mac, proof(options_.secret, 'C', h->ack.nonce, h->hello.rank, impl_.rank));
    h->verdict.accepted = ok ? 1 : 0;
    io_step(h, true, &h->verdict, sizeof h->verdict, "verdict", [this, h, ok] {
      if (!ok) return drop(h, "failed authentication");
      // A rank that proved the secret but is set up differently: the group cannot form, so this
      // ends the setup (the answer carried ours, so that the other side names the difference
      // too). Only after the proof: a stranger claiming another layout is merely dropped.
      if (!h->same_sockets) {
        fatal_ = sockets_differ(who_, h->hello.rank, h->hello.sockets);
        return drop(h, "set up differently");
      }
      if (h->hello.layout != layout_) {
        fatal_ = invalid_argument(who_ + ": rank " + std::to_string(h->hello.rank) +
                                  " is set up differently; " + layout_advice());
        return drop(h, "set up differently");
      }
      const wire::Hello& hello = h->hello;
      TcpTransport::Impl::Connection& x = impl_.conn(hello.rank, hello.socket);
      if (x.socket) return drop(h, "a duplicate connection");  // two raced for one place
      h->timer.cancel();
      x.socket = std::move(h->socket);
      if (authenticate_frames()) {
        x.authenticated = true;
        x.send_key = frame_key(options_.secret, hello.nonce, h->ack.nonce, impl_.rank, hello.rank,
                               hello.socket);
        x.recv_key = frame_key(options_.secret, hello.nonce, h->ack.nonce, hello.rank, impl_.rank,
                               hello.socket);
      }
      forget(h);
      --expected_;
    });
  }

  TcpTransport::Impl& impl_;
  Store& store_;
  const TcpTransportOptions& options_;
  const Deadline deadline_;
  const uint64_t cluster_;
  const uint64_t layout_;
  const std::string who_;
  tcp::acceptor acceptor_;
  std::string rejected_;
  // Accepting: connections still to be filed, the first error that ends setup, the handshakes in
  // progress, and the asynchronous operations not yet completed.
  int expected_ = 0;
  Status fatal_;
  std::vector<std::shared_ptr<Pending>> pending_;
  int in_flight_ = 0;
};

}  // namespace

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpTransport::~TcpTransport() = default;

StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::create(Store& store, int rank, int size,
                                                             const TcpTransportOptions& options) {
  const int sockets = options.sockets_per_peer;
  if (sockets < 1 || sockets > wire::kMaxSocketsPerPeer) {
    return invalid_argument("ring transport (rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + "): sockets_per_peer must be 1 to " +
                            std::to_string(wire::kMaxSocketsPerPeer) + ", not " +
                            std::to_string(sockets));
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->spin = options.poll_before_sleep;
  impl->yield = options.yield_before_sleep;
  impl->sockets_per_peer = sockets;
  impl->zero_copy = options.zero_copy;
  impl->zero_copy_min_message = options.zero_copy_min_message;
  impl->confirm_due_from.assign(static_cast<size_t>(size), 0);
  impl->confirm_owed_to.assign(static_cast<size_t>(size), 0);
  impl->conns.resize(static_cast<size_t>(size) * static_cast<size_t>(sockets));
  if (size > 1) {
    TcpSetup setup(*impl, store, options);
    TRIBUTARY_RETURN_IF_ERROR(setup.listen_and_publish());
    TRIBUTARY_RETURN_IF_ERROR(setup.connect_lower());
    TRIBUTARY_RETURN_IF_ERROR(setup.accept_higher());
    setup.tune_same_kernel_peers();
  }
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) {
    return unavailable("ring transport (rank " + std::to_string(rank) +
                       "): eventfd failed: " + std::strerror(errno));
  }
  impl->start_writer();
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

int TcpTransport::rank() const { return impl_->rank; }
int TcpTransport::size() const { return impl_->size; }

StatusOr<Request> TcpTransport::isend(int peer, const MessageTag& tag,
                                      std::span<const std::byte> data) {
  return send(peer, tag, data, false);
}

StatusOr<Request> TcpTransport::isend_zero_copy(int peer, const MessageTag& tag,
                                                std::span<const std::byte> data) {
  const Impl& m = *impl_;
  const auto message = static_cast<size_t>(std::max<int64_t>(tag.count, 0)) * dtype_size(tag.dtype);
  return send(peer, tag, data, m.zero_copy && message >= m.zero_copy_min_message);
}

StatusOr<Request> TcpTransport::send(int peer, const MessageTag& tag,
                                     std::span<const std::byte> data, bool zero_copy) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (peer < 0 || peer >= m.size || peer == m.rank) {
    return invalid_argument("ring transport: bad peer " + std::to_string(peer));
  }
  Request id = m.next_request++;
  const int stripes = wire::stripes_for(data.size(), m.sockets_per_peer);
  m.requests[id] = Impl::RequestState{false, Status(), peer, true, tag, stripes};
  for (int k = 0; k < stripes; ++k) {
    const wire::Stripe part = wire::stripe_of(data.size(), stripes, k);
    TcpWriter::Op op{id, stripe_header(tag, data.size(), stripes, k), data.data() + part.offset,
                     part.length};
    const int c = m.conn_index(peer, k);
    if (zero_copy && part.length >= wire::kZeroCopyMinBytes &&
        !m.conns[static_cast<size_t>(c)].authenticated) {
      op.splice = true;
      op.header.flags |= wire::kFrameZeroCopy;
      m.confirm_due_from[static_cast<size_t>(peer)] = 1;
    }
    if (m.writer->submit(m.conn_index(peer, k), op)) m.complete(id, Status());
  }
  return id;
}

StatusOr<Request> TcpTransport::irecv(int peer, const MessageTag& tag, std::span<std::byte> data) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (peer < 0 || peer >= m.size || peer == m.rank) {
    return invalid_argument("ring transport: bad peer " + std::to_string(peer));
  }
  Request id = m.next_request++;
  const int stripes = wire::stripes_for(data.size(), m.sockets_per_peer);
  m.requests[id] = Impl::RequestState{false, Status(), peer, false, tag, stripes};
  for (int k = 0; k < stripes; ++k) {
    const wire::Stripe part = wire::stripe_of(data.size(), stripes, k);
    m.conn(peer, k).recvs.push_back(Impl::RecvPart{id, tag, data.data() + part.offset, part.length,
                                                   data.size(), static_cast<uint32_t>(k)});
  }
  return id;
}

Status TcpTransport::wait(Request request, Deadline deadline) {
  Impl& m = *impl_;
  auto it = m.requests.find(request);
  if (it == m.requests.end()) {
    return m.error.ok() ? invalid_argument("ring transport: unknown request") : m.error;
  }
  const bool finished = m.progress_until(deadline, [&] {
    m.absorb();
    return it->second.done || !m.error.ok();
  });
  if (!finished) {
    const Impl::RequestState& r = it->second;
    // Names both ends: which rank waited matters once the failure layer has merged the reports.
    const std::string me = "rank " + std::to_string(m.rank);
    Status s = deadline_exceeded(
        "rank " + std::to_string(r.peer) + " did not " +
        (r.is_send ? "take " + r.tag.describe() + " from " + me
                   : "send " + r.tag.describe() + " to " + me) +
        " within the timeout; is it still running? (raise timeout= in the backend spec to wait "
        "longer)");
    m.fail(s);
    m.settle();
    m.requests.erase(it);
    return s;
  }
  Status s = it->second.done ? it->second.status : m.error;
  m.requests.erase(it);
  if (!m.error.ok()) m.settle();
  return s;
}

// Each confirmation is an empty frame tagged with the collective and MessageTag::kFenceStep: sent
// to every rank this one took a zero-copy frame from, received from every rank it sent one to. The
// frames of a collective come in order, so a confirmation follows every frame it confirms; and a
// rank sends its confirmations before it waits for its own, so two ranks that both sent never wait
// for each other.
Status TcpTransport::fence(const MessageTag& tag, algorithms::Deadline deadline) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  const MessageTag confirm = tag.at_step(MessageTag::kFenceStep);
  std::vector<Request> pending;
  for (int peer = 0; peer < m.size; ++peer) {
    if (!std::exchange(m.confirm_owed_to[static_cast<size_t>(peer)], 0)) continue;
    TRIBUTARY_ASSIGN_OR_RETURN(Request r, isend(peer, confirm, {}));
    pending.push_back(r);
  }
  for (int peer = 0; peer < m.size; ++peer) {
    if (!m.confirm_due_from[static_cast<size_t>(peer)]) continue;
    TRIBUTARY_ASSIGN_OR_RETURN(Request r, irecv(peer, confirm, {}));
    pending.push_back(r);
  }
  for (Request r : pending) TRIBUTARY_RETURN_IF_ERROR(wait(r, deadline));
  std::fill(m.confirm_due_from.begin(), m.confirm_due_from.end(), 0);
  return Status();
}

void TcpTransport::abort(const Status& why) {
  impl_->fail(why);
  impl_->settle();
}

void TcpTransport::interrupt(const Status& why) { impl_->interrupt(why); }

Status TcpTransport::error() const { return impl_->error; }

}  // namespace tributary::transports
