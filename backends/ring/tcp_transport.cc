#include "backends/ring/tcp_transport.h"

#include <boost/asio.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <ifaddrs.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/crypto/sha256.h"

namespace tributary::backends {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using algorithms::Deadline;
using algorithms::MessageTag;
using Request = algorithms::Transport::Request;

constexpr uint32_t kFrameMagic = 0x54524246;  // "TRBF"
constexpr uint32_t kHelloMagic = 0x54524248;  // "TRBH"
constexpr uint32_t kAbortMagic = 0x54524241;  // "TRBA": the sender gave up; a reason follows
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kMaxAbortReason = 4096;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t step = 0;
  uint64_t sequence = 0;
  int64_t count = 0;
  uint8_t collective = 0, op = 0, dtype = 0, pad = 0;
  uint32_t reserved = 0;
  uint64_t length = 0;
  uint64_t reserved2 = 0;
};
static_assert(sizeof(FrameHeader) == 48);

FrameHeader header_for(const MessageTag& tag, size_t length) {
  FrameHeader h;
  h.step = tag.step;
  h.sequence = tag.sequence;
  h.count = tag.count;
  h.collective = static_cast<uint8_t>(tag.collective);
  h.op = static_cast<uint8_t>(tag.op);
  h.dtype = static_cast<uint8_t>(tag.dtype);
  h.length = length;
  return h;
}

MessageTag tag_of(const FrameHeader& h) {
  MessageTag t;
  t.sequence = h.sequence;
  t.step = h.step;
  t.count = h.count;
  t.collective = static_cast<Collective>(h.collective);
  t.op = static_cast<ReduceOp>(h.op);
  t.dtype = static_cast<DType>(h.dtype);
  return t;
}

// Handshake messages (see the header comment for the exchange).
struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint64_t cluster = 0;
  uint64_t layout = 0;
  int32_t world = 0;
  int32_t rank = 0;
  std::array<uint8_t, 32> nonce{};
};
struct HelloAck {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint64_t cluster = 0;
  uint64_t layout = 0;
  int32_t world = 0;
  int32_t rank = 0;
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

std::array<uint8_t, 32> random_nonce() {
  std::random_device rd;
  std::array<uint8_t, 32> n;
  for (auto& b : n) b = static_cast<uint8_t>(rd());
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

uint64_t cluster_hash(const std::string& id) {
  internal::Digest d = internal::sha256(id);
  uint64_t h = 0;
  std::memcpy(&h, d.data(), sizeof h);
  return h;
}

std::string endpoint_text(const tcp::endpoint& e) {
  return e.address().to_string() + ":" + std::to_string(e.port());
}

// Sends run on a writer thread, so that a rank sends and receives at the same time on two cores:
// one thread doing both halves the throughput of a loopback link used both ways. A send to a peer
// with nothing queued is first tried inline (non-blocking), so small messages never wait for the
// thread. Only the writer thread touches a socket while a frame of it is queued; the waiting thread
// reads. Completions go back through a queue, and wake() kicks the waiting thread's io_context.
class Writer {
 public:
  struct Op {
    Request id;
    FrameHeader header;
    const std::byte* data;
    size_t length;
    size_t sent = 0;  // of header + payload
    size_t total() const { return sizeof header + length; }
  };
  struct Done {
    Request id;
    int peer;
    int error;  // errno, 0 = sent
    MessageTag tag;
  };

  Writer(size_t peers, std::function<void()> wake)
      : queues_(peers), busy_(peers, 0), fds_(peers, -1), wake_(std::move(wake)) {
    thread_ = std::jthread([this](std::stop_token st) { loop(st); });
  }
  ~Writer() { stop(); }

  void set_fd(int peer, int fd) { fds_[static_cast<size_t>(peer)] = fd; }

  // Queues `op`, or sends it at once; true when it is already complete.
  bool submit(int peer, Op op) {
    std::lock_guard lock(mu_);
    auto& q = queues_[static_cast<size_t>(peer)];
    if (stopping_) {
      done_.push_back({op.id, peer, ECANCELED, tag_of(op.header)});
      return false;
    }
    if (q.empty()) {
      int err = push(fds_[static_cast<size_t>(peer)], op);
      if (err == 0 && op.sent == op.total()) return true;
      if (err != 0 && err != EAGAIN) {
        done_.push_back({op.id, peer, err, tag_of(op.header)});
        return false;
      }
    }
    q.push_back(op);
    cv_.notify_one();
    return false;
  }

  std::vector<Done> take() {
    std::lock_guard lock(mu_);
    std::vector<Done> out;
    out.swap(done_);
    return out;
  }

  // After a failure: no new frame starts; queued ones that have not started are dropped. Returns
  // whether `peer` is between frames (safe to write an abort frame on, and to close).
  void quiesce() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (size_t p = 0; p < queues_.size(); ++p) {
      auto& q = queues_[p];
      const size_t keep = !q.empty() && (busy_[p] || q.front().sent > 0) ? 1 : 0;
      while (q.size() > keep) {
        done_.push_back({q.back().id, static_cast<int>(p), ECANCELED, tag_of(q.back().header)});
        q.pop_back();
      }
    }
    cv_.notify_one();
  }
  bool between_frames(int peer) {
    std::lock_guard lock(mu_);
    return queues_[static_cast<size_t>(peer)].empty();
  }
  bool idle() {
    std::lock_guard lock(mu_);
    for (auto& q : queues_) {
      if (!q.empty()) return false;
    }
    return true;
  }
  void stop() {
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

 private:
  // One non-blocking sendmsg of what is left of `op`; 0 or an errno.
  static int push(int fd, Op& op) {
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

  void loop(std::stop_token st) {
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
      for (size_t p = 0; p < queues_.size(); ++p) {
        Op* op = nullptr;
        {
          std::lock_guard lock(mu_);
          if (!queues_[p].empty()) {
            op = &queues_[p].front();  // stays put: only this thread pops the front
            busy_[p] = 1;
          }
        }
        if (op == nullptr) continue;
        const size_t before = op->sent;
        const int err = push(fds_[p], *op);
        progress = progress || op->sent != before;
        if (err == EAGAIN) {
          std::lock_guard lock(mu_);
          busy_[p] = 0;
          waiting.push_back({fds_[p], POLLOUT, 0});
          continue;
        }
        {
          std::lock_guard lock(mu_);
          busy_[p] = 0;
          done_.push_back({op->id, static_cast<int>(p), err, tag_of(op->header)});
          queues_[p].pop_front();
          if (err != 0) {  // the socket is dead: so is everything queued behind
            for (Op& rest : queues_[p]) done_.push_back({rest.id, static_cast<int>(p), err, tag_of(rest.header)});
            queues_[p].clear();
          }
        }
        progress = true;
        wake_();
      }
      if (!progress && !waiting.empty()) ::poll(waiting.data(), waiting.size(), 20);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Op>> queues_;
  std::vector<char> busy_;  // the thread is pushing the front op of this peer
  std::vector<int> fds_;
  std::vector<Done> done_;
  bool stopping_ = false;
  std::function<void()> wake_;
  std::jthread thread_;
};

}  // namespace

struct TcpTransport::Impl {
  struct RequestState {
    bool done = false;
    Status status;
    int peer = -1;
    bool is_send = false;
    MessageTag tag;
  };
  struct RecvOp {
    Request id;
    MessageTag tag;
    std::byte* data;
    size_t length;
  };
  struct Peer {
    std::unique_ptr<tcp::socket> socket;
    std::deque<RecvOp> recvs;
    bool reading = false;
    FrameHeader incoming;
  };

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  int rank = 0, size = 1;
  std::vector<Peer> peers;
  std::unordered_map<Request, RequestState> requests;
  Request next_request = 1;
  Status error;
  std::string abort_frame;
  bool settled = false;
  std::unique_ptr<Writer> writer;  // after the sockets are connected

  ~Impl() {
    if (writer) writer->stop();  // before the sockets it writes to close
    for (Peer& p : peers) close(p);
  }

  void start_writer() {
    writer = std::make_unique<Writer>(peers.size(), [this] { asio::post(io, [] {}); });
    for (size_t p = 0; p < peers.size(); ++p) {
      if (peers[p].socket) writer->set_fd(static_cast<int>(p), peers[p].socket->native_handle());
    }
  }

  bool between_frames(int peer) { return !writer || writer->between_frames(peer); }

  // Takes the writer's completions (waiting thread only).
  void absorb() {
    if (!writer) return;
    for (const Writer::Done& d : writer->take()) {
      Status st;
      if (d.error == ECANCELED) {
        st = error.ok() ? aborted("send cancelled") : error;
      } else if (d.error != 0) {
        st = abort_reason_from(d.peer, "sent " + d.tag.describe());
        if (st.ok()) {
          st = unavailable("sending " + d.tag.describe() + " to rank " + std::to_string(d.peer) +
                           " failed: " + std::strerror(d.error) + " (did rank " +
                           std::to_string(d.peer) + " exit or fail? see its log)");
        }
      }
      complete(d.id, st);
      if (!st.ok()) fail(st);
    }
  }

  static void close(Peer& p) {
    if (p.socket && p.socket->is_open()) {
      boost::system::error_code ignored;
      p.socket->shutdown(tcp::socket::shutdown_both, ignored);
      p.socket->close(ignored);
    }
  }

  // Fails the transport and tells every peer why, so that they report the cause ("rank 1 gave up:
  // collective mismatch ...") rather than just a closed connection. A socket between frames gets
  // the reason and is closed at once; one in the middle of a frame is finished first by settle().
  void fail(const Status& s) {
    if (!error.ok()) return;
    error = s;
    std::string reason = s.message().substr(0, kMaxAbortReason);
    FrameHeader h;
    h.magic = kAbortMagic;
    h.length = reason.size();
    abort_frame.assign(reinterpret_cast<const char*>(&h), sizeof h);
    abort_frame += reason;
    if (writer) writer->quiesce();
    for (size_t p = 0; p < peers.size(); ++p) {
      if (between_frames(static_cast<int>(p))) send_abort_and_close(peers[p]);
    }
  }

  void send_abort_and_close(Peer& p) {
    if (p.socket && p.socket->is_open()) {
      (void)::send(p.socket->native_handle(), abort_frame.data(), abort_frame.size(),
                   MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    close(p);
  }

  // After a failure, outside any handler: lets frames in flight finish (briefly), then sends the
  // reason on those sockets too and closes everything.
  void settle() {
    if (settled || error.ok()) return;
    settled = true;
    const Deadline until = Clock::now() + std::chrono::milliseconds(500);
    while (writer && !writer->idle() && Clock::now() < until) {
      if (io.stopped()) io.restart();
      io.poll();
      absorb();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<char> clean(peers.size());
    for (size_t p = 0; p < peers.size(); ++p) clean[p] = between_frames(static_cast<int>(p));
    if (writer) writer->stop();
    absorb();
    for (size_t p = 0; p < peers.size(); ++p) {
      if (clean[p]) send_abort_and_close(peers[p]);
      close(peers[p]);
    }
  }

  void complete(Request id, Status s) {
    auto it = requests.find(id);
    if (it == requests.end()) return;
    it->second.done = true;
    it->second.status = std::move(s);
  }

  // When a peer gave up it sent its reason before closing; a send that fails finds it here if it is
  // the next thing on the socket (non-blocking; OK when there is none).
  Status abort_reason_from(int peer, const std::string& doing) {
    Peer& p = peers[static_cast<size_t>(peer)];
    if (!p.socket || !p.socket->is_open()) return Status();
    const int fd = p.socket->native_handle();
    FrameHeader h;
    if (::recv(fd, &h, sizeof h, MSG_DONTWAIT | MSG_PEEK) != static_cast<ssize_t>(sizeof h) ||
        h.magic != kAbortMagic || h.length > kMaxAbortReason) {
      return Status();
    }
    std::string frame(sizeof h + h.length, '\0');
    const ssize_t got = ::recv(fd, frame.data(), frame.size(), MSG_DONTWAIT);
    if (got != static_cast<ssize_t>(frame.size())) return Status();
    return aborted("rank " + std::to_string(peer) + " gave up while rank " + std::to_string(rank) +
                   " " + doing + ": " + frame.substr(sizeof h));
  }

  // --- receiving ---------------------------------------------------------------------------------
  Status peer_closed(int peer, const RecvOp& op, const boost::system::error_code& ec) {
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      return unavailable("rank " + std::to_string(peer) +
                         " closed the connection while rank " + std::to_string(rank) +
                         " waited for " + op.tag.describe() +
                         "; it may have exited or failed (see its log)");
    }
    return unavailable("receiving " + op.tag.describe() + " from rank " + std::to_string(peer) +
                       " failed: " + ec.message());
  }

  void start_read(int peer) {
    Peer& p = peers[static_cast<size_t>(peer)];
    if (p.reading || p.recvs.empty() || !error.ok()) return;
    p.reading = true;
    asio::async_read(
        *p.socket, asio::buffer(&p.incoming, sizeof p.incoming),
        [this, peer](const boost::system::error_code& ec, size_t) { on_header(peer, ec); });
  }

  void on_header(int peer, const boost::system::error_code& ec) {
    Peer& p = peers[static_cast<size_t>(peer)];
    if (p.recvs.empty()) {
      p.reading = false;
      return;
    }
    RecvOp& op = p.recvs.front();
    if (ec) {
      p.reading = false;
      Status s = error.ok() ? peer_closed(peer, op, ec) : error;
      complete(op.id, s);
      fail(s);
      return;
    }
    const FrameHeader& h = p.incoming;
    Status bad;
    if (h.magic == kAbortMagic && h.length <= kMaxAbortReason) {
      read_abort_reason(peer, op.tag, h.length);
      return;
    }
    if (h.magic != kFrameMagic) {
      bad = aborted("rank " + std::to_string(peer) +
                    " sent bytes that are not a tributary frame while this rank waited for " +
                    op.tag.describe() + "; the stream is corrupt");
    } else {
      MessageTag got = tag_of(h);
      if (!got.same_collective(op.tag) || got.step != op.tag.step || h.length != op.length) {
        bad = aborted("collective mismatch: rank " + std::to_string(peer) + " sent " +
                      got.describe() + " (" + std::to_string(h.length) + " bytes) but rank " +
                      std::to_string(rank) + " expects " + op.tag.describe() + " (" +
                      std::to_string(op.length) +
                      " bytes); every rank must issue the same collectives in the same order, "
                      "with the same backend options");
      }
    }
    if (!bad.ok()) {
      p.reading = false;
      complete(op.id, bad);
      fail(bad);
      return;
    }
    if (op.length == 0) {
      finish_recv(peer);
      return;
    }
    asio::async_read(*p.socket, asio::buffer(op.data, op.length),
                     [this, peer](const boost::system::error_code& ec2, size_t) {
                       Peer& q = peers[static_cast<size_t>(peer)];
                       if (q.recvs.empty()) {
                         q.reading = false;
                         return;
                       }
                       if (ec2) {
                         q.reading = false;
                         Status s = error.ok() ? peer_closed(peer, q.recvs.front(), ec2) : error;
                         complete(q.recvs.front().id, s);
                         fail(s);
                         return;
                       }
                       finish_recv(peer);
                     });
  }

  void read_abort_reason(int peer, const MessageTag& waiting_for, size_t length) {
    auto reason = std::make_shared<std::string>(length, '\0');
    asio::async_read(*peers[static_cast<size_t>(peer)].socket, asio::buffer(*reason),
                     [this, peer, waiting_for, reason](const boost::system::error_code& ec, size_t) {
                       Peer& q = peers[static_cast<size_t>(peer)];
                       q.reading = false;
                       Status s = aborted(
                           "rank " + std::to_string(peer) + " gave up while rank " +
                           std::to_string(rank) + " waited for " + waiting_for.describe() + ": " +
                           (ec ? std::string("(no reason received)") : *reason));
                       if (!error.ok()) s = error;
                       if (!q.recvs.empty()) complete(q.recvs.front().id, s);
                       fail(s);
                     });
  }

  void finish_recv(int peer) {
    Peer& p = peers[static_cast<size_t>(peer)];
    Request id = p.recvs.front().id;
    p.recvs.pop_front();
    p.reading = false;
    complete(id, Status());
    start_read(peer);
  }

  // --- driving -----------------------------------------------------------------------------------
  // Runs handlers until `done()` or the deadline; false on timeout.
  // Polls without sleeping for a short while first: a message is often only microseconds away, and
  // waking from epoll costs more than that. Then blocks until the deadline.
  template <typename Done>
  bool run_until(Deadline deadline, Done&& done) {
    if (done()) return true;
    // Not while the writer thread has work: on a busy link it needs the core more than we do.
    const bool writer_busy = writer && !writer->idle();
    const Deadline spin_until =
        writer_busy ? Clock::now() : std::min(deadline, Clock::now() + spin);
    while (Clock::now() < spin_until) {
      if (io.stopped()) io.restart();
      io.poll();
      if (done()) return true;
    }
    while (!done()) {
      if (io.stopped()) io.restart();
      if (io.run_one_until(deadline) == 0 && Clock::now() >= deadline) return done();
    }
    return true;
  }
  std::chrono::nanoseconds spin{std::chrono::microseconds(50)};
};

// --- setup ---------------------------------------------------------------------------------------
namespace {

// Picks the local address that routes to `coordinator` (no packet is sent).
std::string interface_towards(asio::io_context& io, const std::string& coordinator) {
  if (coordinator.empty() || coordinator == "localhost" || coordinator.rfind("127.", 0) == 0) {
    return "127.0.0.1";
  }
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(coordinator, "1", ec);
  if (ec || results.empty()) return "127.0.0.1";
  asio::ip::udp::socket probe(io);
  asio::ip::udp::endpoint target(results.begin()->endpoint().address(), 1);
  probe.open(target.protocol(), ec);
  if (!ec) probe.connect(target, ec);
  if (ec) return "127.0.0.1";
  asio::ip::address chosen = probe.local_endpoint(ec).address();
  if (ec) return "127.0.0.1";
  if (!chosen.is_loopback()) return chosen.to_string();
  // The coordinator's name resolves to loopback here (Debian maps the host's own name to
  // 127.0.1.1): publishing that would keep other hosts out. Take a real interface instead.
  ifaddrs* list = nullptr;
  std::string found;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      asio::ip::address_v4 a(ntohl(sin->sin_addr.s_addr));
      if (!a.is_loopback()) found = a.to_string();
    }
    freeifaddrs(list);
  }
  return found.empty() ? chosen.to_string() : found;
}

template <typename Impl, typename Buffer>
Status read_exact(Impl& impl, tcp::socket& s, Buffer buf, Deadline deadline, const char* what) {
  bool done = false;
  boost::system::error_code result;
  asio::async_read(s, buf, [&](const boost::system::error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  if (!impl.run_until(deadline, [&] { return done; })) {
    s.cancel();
    impl.run_until(Clock::now() + std::chrono::seconds(1), [&] { return done; });
    return deadline_exceeded(std::string("timed out reading the ") + what);
  }
  if (result) return unavailable(std::string("reading the ") + what + " failed: " + result.message());
  return Status();
}

template <typename Impl, typename Buffer>
Status write_exact(Impl& impl, tcp::socket& s, Buffer buf, Deadline deadline, const char* what) {
  bool done = false;
  boost::system::error_code result;
  asio::async_write(s, buf, [&](const boost::system::error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  if (!impl.run_until(deadline, [&] { return done; })) {
    s.cancel();
    impl.run_until(Clock::now() + std::chrono::seconds(1), [&] { return done; });
    return deadline_exceeded(std::string("timed out writing the ") + what);
  }
  if (result) return unavailable(std::string("writing the ") + what + " failed: " + result.message());
  return Status();
}

void tune(tcp::socket& s) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
}

}  // namespace

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpTransport::~TcpTransport() = default;

StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::create(Store& store, int rank, int size,
                                                             const TcpTransportOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->spin = options.poll_before_sleep;
  impl->peers.resize(static_cast<size_t>(size));
  const Deadline deadline = Clock::now() + options.timeout;
  const uint64_t cluster = cluster_hash(options.cluster_id);
  const uint64_t layout = cluster_hash(options.layout);
  const std::string layout_advice =
      "every process must use the same number of local replicas and the same ring options "
      "(this rank: " + options.layout + ")";
  const std::string who = "ring transport (rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + ")";
  if (size == 1) {
    impl->start_writer();
    return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
  }

  // Listen and publish.
  boost::system::error_code ec;
  std::string host = options.host.empty() ? interface_towards(impl->io, options.coordinator)
                                          : options.host;
  tcp::acceptor acceptor(impl->io);
  tcp::endpoint bind_at(asio::ip::make_address(host, ec), 0);
  if (ec) return invalid_argument(who + ": host '" + host + "' is not an IP address: " + ec.message());
  acceptor.open(bind_at.protocol(), ec);
  if (!ec) acceptor.bind(bind_at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return unavailable(who + ": cannot listen on " + host + ": " + ec.message() +
                       "; set host= in the ring spec to an address of this machine");
  }
  const std::string my_address = endpoint_text(acceptor.local_endpoint());
  TRIBUTARY_RETURN_IF_ERROR(store.set("addr/" + std::to_string(rank), my_address));

  // Connect to every lower rank.
  for (int peer = 0; peer < rank; ++peer) {
    const auto remaining = std::chrono::duration_cast<Store::Duration>(deadline - Clock::now());
    auto address = store.get("addr/" + std::to_string(peer), remaining);
    if (!address.ok()) return address.status().with_context(who + ": waiting for rank " + std::to_string(peer));
    const std::string& text = *address;
    const size_t colon = text.rfind(':');
    unsigned port = 0;
    const char* port_begin = text.data() + (colon == std::string::npos ? text.size() : colon + 1);
    auto [end, perr] = std::from_chars(port_begin, text.data() + text.size(), port);
    tcp::endpoint target;
    if (colon != std::string::npos && perr == std::errc() && end == text.data() + text.size() &&
        port >= 1 && port <= 65535) {
      target = tcp::endpoint(asio::ip::make_address(text.substr(0, colon), ec),
                             static_cast<uint16_t>(port));
    } else {
      ec = asio::error::invalid_argument;
    }
    if (ec) {
      return internal_error(who + ": rank " + std::to_string(peer) + " published a bad address '" +
                            text + "' (a stale store, or another version of tributary?)");
    }
    auto socket = std::make_unique<tcp::socket>(impl->io);
    bool connected = false;
    boost::system::error_code cec;
    socket->async_connect(target, [&](const boost::system::error_code& e) {
      cec = e;
      connected = true;
    });
    if (!impl->run_until(deadline, [&] { return connected; })) {
      return deadline_exceeded(who + ": could not connect to rank " + std::to_string(peer) +
                               " at " + text + " before the timeout");
    }
    if (cec) {
      return unavailable(who + ": connecting to rank " + std::to_string(peer) + " at " + text +
                         " failed: " + cec.message() + "; is it running and reachable?");
    }
    tune(*socket);
    Hello hello;
    hello.cluster = cluster;
    hello.layout = layout;
    hello.world = size;
    hello.rank = rank;
    hello.nonce = random_nonce();
    const std::string ctx = who + ": handshake with rank " + std::to_string(peer) + " at " + text;
    TRIBUTARY_RETURN_IF_ERROR(write_exact(*impl, *socket, asio::buffer(&hello, sizeof hello), deadline, "hello").with_context(ctx));
    HelloAck ack;
    TRIBUTARY_RETURN_IF_ERROR(read_exact(*impl, *socket, asio::buffer(&ack, sizeof ack), deadline, "hello answer").with_context(ctx));
    if (ack.magic != kHelloMagic || ack.version != kProtocolVersion) {
      return unavailable(ctx + ": the peer does not speak tributary's protocol version " +
                         std::to_string(kProtocolVersion));
    }
    if (ack.cluster != cluster || ack.world != size || ack.rank != peer) {
      return unavailable(ctx + ": the process there belongs to another job (cluster, world size "
                         "or rank differ); check the cluster spec");
    }
    if (ack.layout != layout) {
      return invalid_argument(ctx + ": rank " + std::to_string(peer) + " is set up differently; " +
                              layout_advice);
    }
    Auth auth;
    auth.mac = proof(options.secret, 'C', ack.nonce, rank, peer);
    TRIBUTARY_RETURN_IF_ERROR(write_exact(*impl, *socket, asio::buffer(&auth, sizeof auth), deadline, "authentication").with_context(ctx));
    Verdict verdict;
    TRIBUTARY_RETURN_IF_ERROR(read_exact(*impl, *socket, asio::buffer(&verdict, sizeof verdict), deadline, "verdict").with_context(ctx));
    const bool peer_proved = internal::digest_equal(ack.mac, proof(options.secret, 'A', hello.nonce, peer, rank));
    if (!verdict.accepted || !peer_proved) {
      return unavailable(ctx + ": authentication failed; every process must be given the same "
                         "secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE), or none");
    }
    impl->peers[static_cast<size_t>(peer)].socket = std::move(socket);
  }

  // Accept every higher rank; connections that fail the handshake are dropped and we go on.
  int expected = size - 1 - rank;
  std::string rejected;
  while (expected > 0) {
    auto socket = std::make_unique<tcp::socket>(impl->io);
    bool accepted = false;
    boost::system::error_code aec;
    acceptor.async_accept(*socket, [&](const boost::system::error_code& e) {
      aec = e;
      accepted = true;
    });
    if (!impl->run_until(deadline, [&] { return accepted; })) {
      acceptor.cancel();
      impl->run_until(Clock::now() + std::chrono::seconds(1), [&] { return accepted; });
      return deadline_exceeded(who + ": " + std::to_string(expected) +
                               " higher rank(s) did not connect before the timeout" +
                               (rejected.empty() ? "" : "; rejected: " + rejected));
    }
    if (aec) return unavailable(who + ": accept failed: " + aec.message());
    tune(*socket);
    boost::system::error_code pec;
    const std::string from = endpoint_text(socket->remote_endpoint(pec));
    // A short deadline per handshake, so that a silent client cannot hold up the others.
    const Deadline hs_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    Hello hello;
    Status s = read_exact(*impl, *socket, asio::buffer(&hello, sizeof hello), hs_deadline, "hello");
    if (s.ok() && (hello.magic != kHelloMagic || hello.version != kProtocolVersion)) {
      s = unavailable("not a tributary peer (bad magic or version)");
    }
    if (s.ok() && (hello.cluster != cluster || hello.world != size || hello.rank <= rank ||
                   hello.rank >= size || impl->peers[static_cast<size_t>(hello.rank)].socket)) {
      s = unavailable("a peer of another job or a duplicate rank " + std::to_string(hello.rank));
    }
    HelloAck ack;
    if (s.ok()) {
      ack.cluster = cluster;
      ack.layout = layout;
      ack.world = size;
      ack.rank = rank;
      ack.nonce = random_nonce();
      ack.mac = proof(options.secret, 'A', hello.nonce, rank, hello.rank);
      s = write_exact(*impl, *socket, asio::buffer(&ack, sizeof ack), hs_deadline, "hello answer");
    }
    // A different layout: the answer (with ours) lets the other side name it too; then refuse.
    if (s.ok() && hello.layout != layout) {
      // The group cannot form: no point waiting for the others.
      return invalid_argument(who + ": rank " + std::to_string(hello.rank) +
                              " is set up differently; " + layout_advice);
    }
    Auth auth;
    if (s.ok()) s = read_exact(*impl, *socket, asio::buffer(&auth, sizeof auth), hs_deadline, "authentication");
    bool ok = s.ok() && internal::digest_equal(auth.mac, proof(options.secret, 'C', ack.nonce, hello.rank, rank));
    if (s.ok()) {
      Verdict verdict;
      verdict.accepted = ok ? 1 : 0;
      s = write_exact(*impl, *socket, asio::buffer(&verdict, sizeof verdict), hs_deadline, "verdict");
    }
    if (!s.ok() || !ok) {
      rejected += (rejected.empty() ? "" : "; ") + from + " (" +
                  (s.ok() ? std::string("failed authentication") : s.message()) + ")";
      boost::system::error_code ignored;
      socket->close(ignored);
      continue;
    }
    impl->peers[static_cast<size_t>(hello.rank)].socket = std::move(socket);
    --expected;
  }
  impl->start_writer();
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

int TcpTransport::rank() const { return impl_->rank; }
int TcpTransport::size() const { return impl_->size; }

StatusOr<Request> TcpTransport::isend(int peer, const MessageTag& tag,
                                      std::span<const std::byte> data) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (peer < 0 || peer >= m.size || peer == m.rank) {
    return invalid_argument("ring transport: bad peer " + std::to_string(peer));
  }
  Request id = m.next_request++;
  m.requests[id] = Impl::RequestState{false, Status(), peer, true, tag};
  if (m.writer->submit(peer, Writer::Op{id, header_for(tag, data.size()), data.data(), data.size()})) {
    m.complete(id, Status());
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
  m.requests[id] = Impl::RequestState{false, Status(), peer, false, tag};
  m.peers[static_cast<size_t>(peer)].recvs.push_back(
      Impl::RecvOp{id, tag, data.data(), data.size()});
  m.start_read(peer);
  return id;
}

Status TcpTransport::wait(Request request, Deadline deadline) {
  Impl& m = *impl_;
  auto it = m.requests.find(request);
  if (it == m.requests.end()) {
    return m.error.ok() ? invalid_argument("ring transport: unknown request") : m.error;
  }
  const bool finished = m.run_until(deadline, [&] {
    m.absorb();
    return it->second.done || !m.error.ok();
  });
  if (!finished) {
    const Impl::RequestState& r = it->second;
    Status s = deadline_exceeded(
        "rank " + std::to_string(r.peer) + " did not " + (r.is_send ? "take " : "send ") +
        r.tag.describe() + " within the timeout; is it still running? (raise timeout= in the "
        "backend spec to wait longer)");
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

void TcpTransport::abort(const Status& why) {
  impl_->fail(why);
  impl_->settle();
}

Status TcpTransport::error() const { return impl_->error; }

}  // namespace tributary::backends
