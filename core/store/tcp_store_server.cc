// TcpStoreServer on Boost.Asio (the client, TcpStore, is in tcp_store.cc; the wire format in
// tcp_store_protocol.h).
//
// One io_context on its own thread owns every connection and the key-value map, so the map needs no
// lock. A blocked get/wait is parked as a Waiter registered under one of its missing keys and
// answered by the set/add that completes it or by its own timer: no polling. Each connection reads
// only what has arrived (it waits for readability, then reads what is there), so a length field can
// never make the server allocate memory the peer has not actually sent.
//
// Limits (TcpStoreServerOptions): connections open at once, bytes received and not yet handled
// over all connections, bytes stored, and the time a new connection has to say hello (and, with a
// secret, to authenticate); before that, frames are at most kMaxUnauthenticatedFrameBytes. With a
// secret, nothing is served before the client proved it, and every later frame is sealed.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>  // before Asio: Boost 1.74's headers use std::exchange without including it

#include "core/store/store_common.h"
#include "core/store/tcp_store_protocol.h"
#include "tributary/options.h"
#include "tributary/store.h"

namespace tributary {
namespace {

namespace asio = boost::asio;
namespace wire = internal::wire;
using asio::ip::tcp;
using Clock = internal::StoreClock;
using error_code = boost::system::error_code;
using std::chrono::milliseconds;

std::string error_frame(const Status& s) {
  return wire::Writer().u8(static_cast<std::uint8_t>(s.code())).str(s.message()).finish();
}

// =================================================================================================
// Server
// =================================================================================================

class ServerCore;
class Session;

// A parked get or wait. Registered under exactly one missing key at a time (`registered_key`): when
// that key arrives the waiter either completes or moves on to its next missing key.
struct Waiter {
  explicit Waiter(asio::io_context& ioc) : timer(ioc) {}
  std::weak_ptr<Session> session;
  wire::Op op = wire::Op::kGet;
  std::vector<std::string> keys;
  std::string registered_key;
  asio::steady_timer timer;
  bool done = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerCore& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), handshake_timer_(socket_.get_executor()) {}

  void start(milliseconds handshake_timeout) {
    error_code ec;
    socket_.non_blocking(true, ec);
    if (ec) return close();
    handshake_timer_.expires_after(handshake_timeout);
    handshake_timer_.async_wait([self = shared_from_this()](const error_code& e) {
      if (!e && !self->ready()) self->close();  // silent, or never authenticated
    });
    wait_readable();
  }
  void close();
  void send(std::string frame);
  // Answers with an error and drops the connection once the answer is written.
  void reject(const Status& status) {
    send(error_frame(status));
    close_after_write_ = true;
  }
  // "address:port" of the client, for the record of refused clients.
  std::string peer() const {
    error_code ec;
    const auto at = socket_.remote_endpoint(ec);
    return ec ? std::string("an unknown address")
              : at.address().to_string() + ":" + std::to_string(at.port());
  }
  // Handles the complete frames buffered so far (stops while a request is parked).
  void process_input();

  bool hello_done = false;
  bool refused_noted = false;  // noted under wire::kRefusedClientsKey already
  // With a secret: the nonces of the hello, and once kAuth succeeded, the frame MACs.
  bool authenticated = false;
  wire::Nonce client_nonce{}, server_nonce{};
  internal::FrameMac in_mac, out_mac;
  // Served: said hello and, when the server has a secret, authenticated.
  bool ready() const;
  std::shared_ptr<Waiter> waiter;  // the parked request, if any
  bool call_pending = false;       // a kCall waits for its handler's reply
  // The last will (kWill): appended to will_key when the connection ends, unless the server stops.
  std::string will_key, will_value;

 private:
  void wait_readable();
  void on_readable(const error_code& ec);
  void write_next();
  // After a rejection's answer is written: stops sending and reads (and drops) what the client is
  // still sending for a moment before closing, so that the close does not reset the connection
  // and destroy the answer before the client reads it.
  void linger_then_close();
  // Keeps the server's count of bytes received and not handled in step with in_.
  void account();

  ServerCore& server_;
  tcp::socket socket_;
  asio::steady_timer handshake_timer_;
  std::size_t counted_ = 0;
  std::string in_;  // received bytes; in_[consumed_..] not handled yet
  std::size_t consumed_ = 0;
  std::deque<std::string> out_;
  bool writing_ = false;
  bool close_after_write_ = false;
  bool draining_ = false;
  bool closed_ = false;
};

// What a call handler's reply needs to reach the server: cleared when the server stops, so that a
// reply arriving later (from another thread) is dropped instead of posted to a dead io_context.
struct ReplyRoute {
  std::mutex mu;
  asio::io_context* ioc = nullptr;
};

class ServerCore {
 public:
  ServerCore() = default;
  ~ServerCore() { stop(); }

  Status start(const std::string& host, std::uint16_t port, const TcpStoreServerOptions& options);
  void stop();
  // Serves on `fd` (TcpStoreServerOptions::listen_fd), which it owns from here on.
  Status adopt(int fd, std::uint16_t port);
  // The accept loop and the I/O thread, once the acceptor listens.
  Status run();

  void handle(const std::shared_ptr<Session>& session, std::string_view body);
  void handshake(const std::shared_ptr<Session>& session, wire::Op op, wire::Reader& r);
  void cancel_waiter(const std::shared_ptr<Waiter>& w);
  void forget(const std::shared_ptr<Session>& s) { sessions_.erase(s); }
  // A connection with a will ended: appends the value and a newline to the key (nothing when the
  // server is stopping, or when the store is full: the will is then lost, as the client is).
  void execute_will(const std::string& key, const std::string& value);
  // A client was refused for the secret: noted under wire::kRefusedClientsKey (the last few).
  void note_refused(Session& s, std::string_view why);
  // A session took (+1) or dropped (-1) its will.
  void count_will(int delta) { wills_held_ += delta; }
  // A session set its will to `value`: a process of the job (its will names it) has connected.
  void saw_will(const std::string& value) {
    if (wills_seen_.insert(value).second) clients_seen_ = wills_seen_.size();
  }

  const TcpStoreServerOptions& options() const { return options_; }
  bool has_secret() const { return !options_.secret.empty(); }
  // Bytes received and not yet handled, over all sessions.
  std::size_t& buffered() { return buffered_; }

  asio::io_context& ioc() { return ioc_; }
  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  std::size_t accepted() const { return accepted_.load(); }

 private:
  void do_accept();
  bool has(const std::string& key) const { return data_.find(key) != data_.end(); }
  const std::string* first_missing(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys) {
      if (!has(k)) return &k;
    }
    return nullptr;
  }
  void park(const std::shared_ptr<Session>& s, wire::Op op, std::vector<std::string> keys,
            std::uint64_t timeout_ms);
  void call(const std::shared_ptr<Session>& s, std::string_view method, std::string_view payload);
  void register_waiter(const std::shared_ptr<Waiter>& w, const std::string& key);
  void unregister_waiter(const std::shared_ptr<Waiter>& w);
  void finish_waiter(const std::shared_ptr<Waiter>& w);
  void key_changed(const std::string& key);
  // Counts `key` with a value of `value_bytes` in stored_ in place of its old value, or says why it
  // would pass max_stored_bytes (nothing counted then).
  Status make_room(std::string_view key, std::size_t value_bytes) {
    auto it = data_.find(key);
    const std::size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    const std::size_t after = stored_ - old + key.size() + value_bytes;
    if (after > options_.max_stored_bytes) {
      return resource_exhausted(
          "the store holds " + std::to_string(stored_) + " bytes and storing " +
          std::to_string(value_bytes) + " more under '" + std::string(key.substr(0, 100)) +
          "' would pass its limit of " + std::to_string(options_.max_stored_bytes) +
          " (TcpStoreServerOptions::max_stored_bytes)");
    }
    stored_ = after;
    return Status();
  }
  std::string answer_for(wire::Op op, const std::vector<std::string>& keys) const;

  asio::io_context ioc_{1};  // first member: destroyed last, after everything that refers to it
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer accept_retry_{ioc_};
  std::string host_;
  std::uint16_t port_ = 0;
  TcpStoreServerOptions options_;
  std::size_t buffered_ = 0;
  std::size_t stored_ = 0;  // bytes of keys and values in data_
  std::atomic<std::size_t> accepted_{0};
  // Sessions holding a will, and whether one was executed (read by stop() on another thread).
  std::atomic<int> wills_held_{0};
  std::atomic<bool> will_executed_{false};
  // The distinct wills set so far (one per process of the job), and their number for stop().
  std::unordered_set<std::string> wills_seen_;
  std::atomic<std::size_t> clients_seen_{0};
  bool stopping_ = false;
  std::unordered_set<std::shared_ptr<Session>> sessions_;
  std::shared_ptr<ReplyRoute> route_ = std::make_shared<ReplyRoute>();
  std::map<std::string, std::string, std::less<>> data_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiting_;
  std::jthread thread_;
};

// --- Session -------------------------------------------------------------------------------------

bool Session::ready() const { return hello_done && (authenticated || !server_.has_secret()); }

void Session::account() {
  const std::size_t now = closed_ ? 0 : in_.size() - consumed_;
  server_.buffered() = server_.buffered() - counted_ + now;
  counted_ = now;
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  // A client that said hello but never proved the secret (it found ours wrong, or it is not a
  // rank of this job) is noted like one refused outright.
  if (hello_done && !authenticated && server_.has_secret()) {
    server_.note_refused(*this, "said hello, never proved the secret (a wrong secret?)");
  }
  account();
  handshake_timer_.cancel();
  if (waiter) server_.cancel_waiter(waiter);
  waiter.reset();
  if (!will_key.empty()) {
    server_.count_will(-1);
    server_.execute_will(std::exchange(will_key, {}), will_value);
  }
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  server_.forget(shared_from_this());
}

void Session::wait_readable() {
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) { self->on_readable(ec); });
}

void Session::linger_then_close() {
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  draining_ = true;
  in_.clear();
  consumed_ = 0;
  account();
  handshake_timer_.expires_after(std::chrono::seconds(1));
  handshake_timer_.async_wait([self = shared_from_this()](const error_code& e) {
    if (!e) self->close();
  });
  wait_readable();
}

void Session::on_readable(const error_code& ec) {
  if (closed_) return;
  if (ec) return close();
  if (draining_) {
    char sink[65536];
    error_code rec;
    for (;;) {
      socket_.read_some(asio::buffer(sink), rec);
      if (rec == asio::error::would_block || rec == asio::error::try_again) return wait_readable();
      if (rec) return close();
    }
  }
  error_code rec;
  std::size_t available = socket_.available(rec);
  // Before the handshake a client has no business sending more than a small frame.
  const std::size_t cap = ready() ? std::size_t{1} << 20 : wire::kMaxUnauthenticatedFrameBytes;
  std::size_t want = std::clamp<std::size_t>(available, std::min<std::size_t>(4096, cap), cap);
  if (server_.buffered() + want > server_.options().max_buffered_bytes) {
    return reject(resource_exhausted(
        "the store has " + std::to_string(server_.buffered()) +
        " bytes of requests in hand, its limit (TcpStoreServerOptions::max_buffered_bytes); "
        "this connection is closed"));
  }
  std::size_t old = in_.size();
  in_.resize(old + want);
  std::size_t n = socket_.read_some(asio::buffer(in_.data() + old, want), rec);
  in_.resize(old + n);
  account();
  if (rec == asio::error::would_block || rec == asio::error::try_again) return wait_readable();
  if (rec) return close();  // end of file, reset: the client went away
  // A client may send one request ahead while another is parked, but never more than one frame's
  // worth of bytes; anything beyond that is not our protocol.
  const std::size_t max_pending =
      ready() ? wire::kFrameHeaderBytes + wire::kMaxFrameBytes + internal::FrameMac::kTagBytes +
                    (1 << 20)
              : 2 * wire::kMaxUnauthenticatedFrameBytes;
  if (in_.size() - consumed_ > max_pending) return close();
  process_input();
  if (!closed_ && !close_after_write_) wait_readable();
}

void Session::process_input() {
  auto self = shared_from_this();  // handle() may close this session
  while (!closed_ && !close_after_write_ && !waiter && !call_pending) {
    std::size_t available = in_.size() - consumed_;
    if (available < wire::kFrameHeaderBytes) break;
    const char* header = in_.data() + consumed_;
    std::uint32_t length = wire::read_frame_length(header);
    const std::size_t limit =
        !ready() ? wire::kMaxUnauthenticatedFrameBytes
                 : wire::kMaxFrameBytes + (authenticated ? internal::FrameMac::kTagBytes : 0);
    if (length == 0 || length > limit) {
      reject(invalid_argument("request frame of " + std::to_string(length) +
                              " bytes is outside 1.." + std::to_string(limit) +
                              (ready() ? "" : " before the handshake") +
                              "; is this client a tributary TcpStore of the same version?"));
      break;
    }
    if (available < wire::kFrameHeaderBytes + length) break;
    std::string_view body(header + wire::kFrameHeaderBytes, length);
    consumed_ += wire::kFrameHeaderBytes + length;
    if (authenticated && !wire::unseal(in_mac, header, body)) {
      close();  // changed on the way, or not from the client that authenticated: say nothing
      break;
    }
    server_.handle(self, body);
  }
  if (consumed_ == in_.size()) {
    in_.clear();
    consumed_ = 0;
    if (in_.capacity() > (1 << 20)) in_.shrink_to_fit();  // do not keep a 64 MiB value's buffer
  } else if (consumed_ > (1 << 20)) {
    in_.erase(0, consumed_);
    consumed_ = 0;
  }
  account();
}

void Session::send(std::string frame) {
  if (closed_) return;
  if (authenticated) wire::seal(out_mac, frame);
  out_.push_back(std::move(frame));
  if (!writing_) write_next();
}

void Session::write_next() {
  if (closed_) return;
  if (out_.empty()) {
    writing_ = false;
    if (close_after_write_ && !draining_) linger_then_close();
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(out_.front()),
                    [self = shared_from_this()](const error_code& ec, std::size_t) {
                      if (self->closed_) return;
                      if (ec) return self->close();
                      self->out_.pop_front();
                      self->write_next();
                    });
}

// --- ServerCore ----------------------------------------------------------------------------------

}  // namespace

int internal::listening_tcp_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int listening = 0, type = 0;
  socklen_t size = sizeof(listening), type_size = sizeof(type);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) ||
      ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_size) != 0 || type != SOCK_STREAM ||
      ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || listening == 0) {
    return -1;
  }
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
}

namespace {

Status ServerCore::start(const std::string& host, std::uint16_t port,
                         const TcpStoreServerOptions& options) {
  host_ = host;
  options_ = options;
  std::string where = (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(port);
  if (options.listen_fd >= 0) return adopt(options.listen_fd, port);
  try {
    std::vector<tcp::endpoint> endpoints;
    if (host.empty() || host == "0.0.0.0") {
      endpoints.emplace_back(tcp::v4(), port);
    } else if (host == "::") {
      endpoints.emplace_back(tcp::v6(), port);
    } else {
      error_code ec;
      tcp::resolver resolver(ioc_);
      auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
      if (ec) {
        return unavailable("TcpStore server: cannot resolve '" + host + "' to listen on: " +
                           ec.message() + "; give an address of this host, or 0.0.0.0 for all");
      }
      for (const auto& r : results) endpoints.push_back(r.endpoint());
    }
    error_code ec;
    for (const tcp::endpoint& ep : endpoints) {
      error_code ignored;
      acceptor_.close(ignored);
      acceptor_.open(ep.protocol(), ec);
      if (ec) continue;
      // The processes this one starts must not hold the port (a trainer's data-loader workers).
      ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
      acceptor_.set_option(tcp::acceptor::reuse_address(true), ignored);
      acceptor_.bind(ep, ec);
      if (ec) continue;
      acceptor_.listen(options.listen_backlog, ec);
      if (!ec) break;
    }
    if (ec || !acceptor_.is_open()) {
      return unavailable("TcpStore server: cannot listen on " + where + ": " +
                         (ec ? ec.message() : std::string("no address to bind")) +
                         "; is another job's store using this port? choose another port, or 0 for "
                         "any free one");
    }
  } catch (const std::exception& e) {
    return unavailable("TcpStore server on " + where + ": " + e.what());
  }
  return run();
}

Status ServerCore::adopt(int fd, std::uint16_t port) {
  const int bound = internal::listening_tcp_port(fd);
  if (bound < 0 || (port != 0 && bound != port)) {
    ::close(fd);
    return invalid_argument("TcpStore server: descriptor " + std::to_string(fd) +
                            " is not a TCP socket listening on port " + std::to_string(port));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  error_code ec;
  acceptor_.assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    return unavailable("TcpStore server: cannot serve on descriptor " + std::to_string(fd) + ": " +
                       ec.message());
  }
  // The descriptor was inherited across exec (tributary-run clears the flag for the child that
  // serves): the processes this one starts must not hold the port.
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return run();
}

Status ServerCore::run() {
  try {
    error_code ec;
    port_ = acceptor_.local_endpoint(ec).port();
    if (ec) return unavailable("TcpStore server: cannot read the bound port: " + ec.message());
    route_->ioc = &ioc_;
    do_accept();
    thread_ = std::jthread([this] {
      for (;;) {
        try {
          ioc_.run();
          return;
        } catch (const std::exception&) {
          // A handler ran out of memory; the failing connection is lost, the server keeps going.
        }
      }
    });
  } catch (const std::exception& e) {
    return unavailable(std::string("TcpStore server: ") + e.what());
  }
  return Status();
}

void ServerCore::stop() {
  // Keeps serving for up to `most` while `pending()` holds.
  const auto linger = [](milliseconds most, const auto& pending) {
    const auto until = Clock::now() + most;
    while (pending() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
  };
  if (thread_.joinable() && options_.expected_clients > 0 &&
      clients_seen_ < options_.expected_clients) {
    // Some process of the job has not connected yet (options_.expected_clients): the store keeps
    // serving while the ones still starting connect, and until they close again.
    linger(options_.linger_for_absent,
           [&] { return clients_seen_ < options_.expected_clients || wills_held_ > 0; });
  }
  {
    std::lock_guard lock(route_->mu);
    route_->ioc = nullptr;  // replies still to come are dropped
  }
  if (!thread_.joinable()) return;
  if (will_executed_) {
    // A process of the job was lost: let the survivors read who before the store goes.
    linger(options_.linger_after_loss, [&] { return wills_held_ > 0; });
  }
  asio::post(ioc_, [this] {
    stopping_ = true;
    error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    auto sessions = std::move(sessions_);
    sessions_.clear();
    for (const auto& s : sessions) s->close();
    waiting_.clear();
    // Handlers still queued are destroyed, not run, when the io_context goes; they only hold
    // shared_ptrs to closed sessions and waiters.
    ioc_.stop();
  });
  thread_.join();
}

void ServerCore::do_accept() {
  acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (stopping_) return;
    if (ec) {
      // Out of descriptors and the like: pause instead of spinning, then accept again.
      accept_retry_.expires_after(milliseconds(50));
      accept_retry_.async_wait([this](const error_code& e) {
        if (!e && !stopping_) do_accept();
      });
      return;
    }
    accepted_++;
    error_code ignored;
    if (sessions_.size() >= options_.max_connections) {
      socket.close(ignored);  // full: the client retries or reports the store unreachable
    } else {
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(*this, std::move(socket));
      sessions_.insert(session);
      session->start(options_.handshake_timeout);
    }
    do_accept();
  });
}

void ServerCore::handle(const std::shared_ptr<Session>& s, std::string_view body) {
  wire::Reader r(body);
  auto op = static_cast<wire::Op>(r.u8());
  auto malformed = [&] {
    s->reject(invalid_argument("malformed request (type " + std::to_string(int(op)) + ", " +
                               std::to_string(body.size()) + " bytes)"));
  };
  if (!s->ready()) return handshake(s, op, r);

  auto key_error = [](std::string_view key) { return internal::validate_store_key(key); };
  switch (op) {
    case wire::Op::kSet: {
      std::string_view key = r.str();
      std::string_view value = r.str();
      if (!r.done()) return malformed();
      Status st = key_error(key);
      if (st.ok()) st = internal::validate_store_value(key, value.size());
      if (st.ok()) st = make_room(key, value.size());
      if (!st.ok()) return s->send(error_frame(st));
      data_.insert_or_assign(std::string(key), std::string(value));
      s->send(wire::Writer().u8(0).finish());
      return key_changed(std::string(key));
    }
    case wire::Op::kGet: {
      std::uint64_t timeout_ms = r.u64();
      std::string_view key = r.str();
      if (!r.done()) return malformed();
      if (Status st = key_error(key); !st.ok()) return s->send(error_frame(st));
      std::vector<std::string> keys{std::string(key)};
      if (has(keys[0]) || timeout_ms == 0) return s->send(answer_for(op, keys));
      return park(s, op, std::move(keys), timeout_ms);
    }
    case wire::Op::kAdd: {
      std::string_view key = r.str();
      std::int64_t delta = r.i64();
      if (!r.done()) return malformed();
      if (Status st = key_error(key); !st.ok()) return s->send(error_frame(st));
      auto it = data_.find(key);
      auto result = internal::add_to_counter(key, it == data_.end() ? nullptr : &it->second, delta);
      if (!result.ok()) return s->send(error_frame(result.status()));
      const std::string text = std::to_string(*result);
      if (Status st = make_room(key, text.size()); !st.ok()) return s->send(error_frame(st));
      data_.insert_or_assign(std::string(key), text);
      s->send(wire::Writer().u8(0).i64(*result).finish());
      return key_changed(std::string(key));
    }
    case wire::Op::kWait:
    case wire::Op::kCheck: {
      std::uint64_t timeout_ms = op == wire::Op::kWait ? r.u64() : 0;
      std::uint32_t n = r.count(4);
      std::vector<std::string> keys;
      keys.reserve(n);
      for (std::uint32_t i = 0; i < n && !r.failed(); ++i) keys.emplace_back(r.str());
      if (!r.done()) return malformed();
      for (const std::string& k : keys) {
        if (Status st = key_error(k); !st.ok()) return s->send(error_frame(st));
      }
      if (op == wire::Op::kCheck || first_missing(keys) == nullptr || timeout_ms == 0) {
        return s->send(answer_for(op, keys));
      }
      return park(s, op, std::move(keys), timeout_ms);
    }
    case wire::Op::kDelete: {
      std::string_view key = r.str();
      if (!r.done()) return malformed();
      if (Status st = key_error(key); !st.ok()) return s->send(error_frame(st));
      auto it = data_.find(key);
      bool existed = it != data_.end();
      if (existed) {
        stored_ -= it->first.size() + it->second.size();
        data_.erase(it);
      }
      return s->send(wire::Writer().u8(0).u8(existed ? 1 : 0).finish());
    }
    case wire::Op::kWill: {
      std::string_view key = r.str();
      std::string_view value = r.str();
      if (!r.done()) return malformed();
      Status st = key.empty() ? Status() : key_error(key);
      if (st.ok()) st = internal::validate_store_value(key, value.size());
      if (!st.ok()) return s->send(error_frame(st));
      count_will((key.empty() ? 0 : 1) - (s->will_key.empty() ? 0 : 1));
      if (!key.empty()) saw_will(std::string(value));
      s->will_key = std::string(key);
      s->will_value = std::string(value);
      return s->send(wire::Writer().u8(0).finish());
    }
    case wire::Op::kCall: {
      std::string_view method = r.str();
      std::string_view payload = r.str();
      if (!r.done()) return malformed();
      if (Status st = key_error(method); !st.ok()) return s->send(error_frame(st));
      return call(s, method, payload);
    }
    case wire::Op::kHello:
    case wire::Op::kAuth:
      break;
  }
  s->reject(invalid_argument("unknown request type " + std::to_string(int(op))));
}

void ServerCore::execute_will(const std::string& key, const std::string& value) {
  if (stopping_) return;
  auto it = data_.find(key);
  std::string next = it == data_.end() ? std::string() : it->second;
  next += value;
  next += '\n';
  if (!internal::validate_store_value(key, next.size()).ok()) return;
  if (!make_room(key, next.size()).ok()) return;
  data_.insert_or_assign(key, std::move(next));
  will_executed_ = true;
  key_changed(key);
}

void ServerCore::note_refused(Session& s, std::string_view why) {
  if (std::exchange(s.refused_noted, true)) return;
  const std::string key = wire::kRefusedClientsKey;
  auto it = data_.find(key);
  std::string lines = it == data_.end() ? std::string() : it->second;
  lines += s.peer() + ": " + std::string(why) + "\n";
  while (std::count(lines.begin(), lines.end(), '\n') > wire::kRefusedClientsKept) {
    lines.erase(0, lines.find('\n') + 1);
  }
  if (!make_room(key, lines.size()).ok()) return;
  data_.insert_or_assign(key, std::move(lines));
  key_changed(key);
}

// The hello, then (with a secret) kAuth; see tcp_store_protocol.h.
void ServerCore::handshake(const std::shared_ptr<Session>& s, wire::Op op, wire::Reader& r) {
  const std::string& secret = options_.secret;
  if (s->hello_done) {  // the server has a secret and waits for the client's proof
    std::string_view proof = r.raw(sizeof(internal::Digest));
    if (op != wire::Op::kAuth || !r.done()) {
      return s->reject(unavailable(
          "this store requires the job's shared secret and the client did not authenticate"));
    }
    const internal::Digest want = wire::session_digest(secret, "C", s->client_nonce,
                                                       s->server_nonce);
    if (!internal::bytes_equal(proof.data(), want.data(), want.size())) {
      note_refused(*s, "wrong secret");
      return s->reject(unavailable(
          "authentication failed: the client does not hold this store's shared secret; give "
          "every process the same secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE)"));
    }
    s->send(wire::Writer().u8(0).finish());
    s->authenticated = true;
    s->in_mac = internal::FrameMac(wire::session_digest(secret, "c", s->client_nonce,
                                                        s->server_nonce));
    s->out_mac = internal::FrameMac(wire::session_digest(secret, "s", s->client_nonce,
                                                         s->server_nonce));
    return;
  }
  std::string_view magic = r.raw(sizeof(wire::kMagic));
  std::uint32_t version = r.u32();
  if (op != wire::Op::kHello || magic != std::string_view(wire::kMagic, sizeof(wire::kMagic))) {
    return s->reject(
        invalid_argument("expected a tributary store hello; is this client a "
                         "tributary TcpStore?"));
  }
  if (version != wire::kVersion) {
    return s->reject(failed_precondition("protocol version mismatch: the client speaks version " +
                                         std::to_string(version) + ", this server version " +
                                         std::to_string(wire::kVersion) +
                                         "; run the same tributary build on every rank"));
  }
  std::string_view nonce = r.raw(wire::kNonceBytes);
  const bool client_has_secret = r.u8() != 0;
  if (!r.done()) return s->reject(invalid_argument("malformed store hello"));
  if (!secret.empty() && !client_has_secret) {
    note_refused(*s, "no secret");
    return s->reject(unavailable(
        "this store requires the job's shared secret and this process has none; give every "
        "process the same secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE)"));
  }
  std::copy(nonce.begin(), nonce.end(), reinterpret_cast<char*>(s->client_nonce.data()));
  internal::random_bytes(s->server_nonce.data(), s->server_nonce.size());
  internal::Digest proof{};
  if (!secret.empty()) {
    proof = wire::session_digest(secret, "S", s->client_nonce, s->server_nonce);
  }
  s->hello_done = true;
  s->send(wire::Writer()
              .u8(0)
              .raw(magic)
              .u32(wire::kVersion)
              .raw(wire::bytes_of(s->server_nonce))
              .u8(secret.empty() ? 0 : 1)
              .raw(std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()))
              .finish());
}

// The OK answer to a get/wait/check, given what the map holds now.
std::string ServerCore::answer_for(wire::Op op, const std::vector<std::string>& keys) const {
  wire::Writer w;
  w.u8(0);
  if (op == wire::Op::kGet) {
    auto it = data_.find(keys[0]);
    if (it == data_.end()) return w.u8(0).finish();
    return w.u8(1).str(it->second).finish();
  }
  std::vector<const std::string*> missing;
  for (const std::string& k : keys) {
    if (!has(k)) missing.push_back(&k);
  }
  if (op == wire::Op::kCheck) return w.u8(missing.empty() ? 1 : 0).finish();
  w.u32(static_cast<std::uint32_t>(missing.size()));
  for (const std::string* k : missing) w.str(*k);
  return w.finish();
}

void ServerCore::park(const std::shared_ptr<Session>& s, wire::Op op, std::vector<std::string> keys,
                      std::uint64_t timeout_ms) {
  auto w = std::make_shared<Waiter>(ioc_);
  w->session = s;
  w->op = op;
  w->keys = std::move(keys);
  s->waiter = w;
  register_waiter(w, *first_missing(w->keys));
  auto timeout = std::min<std::uint64_t>(timeout_ms, wire::kMaxServerWait.count());
  w->timer.expires_after(milliseconds(timeout));
  w->timer.async_wait([this, w](const error_code& ec) {
    if (ec || w->done) return;
    finish_waiter(w);  // timed out: answers with whatever is still missing
  });
}

void ServerCore::call(const std::shared_ptr<Session>& s, std::string_view method,
                      std::string_view payload) {
  if (!options_.call_handler) {
    return s->send(error_frame(
        unimplemented("this server has no procedure '" + std::string(method.substr(0, 100)) +
                      "' (it serves keys only; is the address that of the right task?)")));
  }
  s->call_pending = true;
  std::weak_ptr<Session> weak = s;
  auto once = std::make_shared<std::atomic<bool>>(false);
  StoreCallReply reply = [route = route_, weak, once](StatusOr<std::string> answer) {
    if (once->exchange(true)) return;
    std::string frame;
    if (!answer.ok()) {
      frame = error_frame(answer.status());
    } else if (answer->size() > kMaxStoreValueBytes) {
      frame = error_frame(resource_exhausted(
          "the answer of " + std::to_string(answer->size()) + " bytes is above the limit of " +
          std::to_string(kMaxStoreValueBytes) + " bytes for one answer"));
    } else {
      frame = wire::Writer().u8(0).str(*answer).finish();
    }
    std::lock_guard lock(route->mu);
    if (route->ioc == nullptr) return;
    asio::post(*route->ioc, [weak, frame = std::move(frame)]() mutable {
      auto session = weak.lock();
      if (!session) return;
      session->call_pending = false;
      session->send(std::move(frame));
      session->process_input();
    });
  };
  try {
    options_.call_handler(method, payload, reply);
  } catch (const std::exception& e) {
    // The handler threw (it must not): answer for it, unless it replied already.
    reply(internal_error(std::string("the call handler failed: ") + e.what()));
  }
}

void ServerCore::register_waiter(const std::shared_ptr<Waiter>& w, const std::string& key) {
  w->registered_key = key;
  waiting_[key].push_back(w);
}

void ServerCore::unregister_waiter(const std::shared_ptr<Waiter>& w) {
  auto it = waiting_.find(w->registered_key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  list.erase(std::remove(list.begin(), list.end(), w), list.end());
  if (list.empty()) waiting_.erase(it);
}

void ServerCore::cancel_waiter(const std::shared_ptr<Waiter>& w) {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  unregister_waiter(w);
}

void ServerCore::finish_waiter(const std::shared_ptr<Waiter>& w) {
  cancel_waiter(w);
  auto s = w->session.lock();
  if (!s) return;
  s->waiter.reset();
  s->send(answer_for(w->op, w->keys));
  // Requests the client sent meanwhile are handled from the event loop, not from inside set().
  asio::post(ioc_, [s] { s->process_input(); });
}

void ServerCore::key_changed(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<std::shared_ptr<Waiter>> list = std::move(it->second);
  waiting_.erase(it);
  for (const auto& w : list) {
    if (w->done) continue;
    w->registered_key.clear();
    if (const std::string* next = first_missing(w->keys)) {
      register_waiter(w, *next);
    } else {
      finish_waiter(w);
    }
  }
}

}  // namespace

struct TcpStoreServer::Impl {
  ServerCore core;
};

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() = default;
const std::string& TcpStoreServer::host() const { return impl_->core.host(); }
std::uint16_t TcpStoreServer::port() const { return impl_->core.port(); }
std::size_t TcpStoreServer::num_connections_accepted() const { return impl_->core.accepted(); }

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStore::create_server(const std::string& host,
                                                                  std::uint16_t port,
                                                                  TcpStoreServerOptions options) {
  auto impl = std::make_unique<TcpStoreServer::Impl>();
  TRIBUTARY_RETURN_IF_ERROR(impl->core.start(host, port, options));
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

}  // namespace tributary
