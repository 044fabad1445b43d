// TcpStore, the client of TcpStoreServer (tcp_store_server.cc), on Boost.Asio. The wire format is
// in tcp_store_protocol.h.
//
// Blocking calls with deadlines. Each connection has a private io_context; an operation is started
// asynchronously and the io_context run until the deadline, after which the socket is closed (the
// pattern of Asio's blocking_tcp_client example). Connections live in a small pool so that threads
// never queue behind another thread's blocked get().
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

// =================================================================================================
// Client
// =================================================================================================

// One connection to the server with its own io_context, used by one thread at a time.
class Connection {
 public:
  Connection() = default;

  // Starts `start(handler)` and runs until the handler ran or `deadline` passed; on the deadline
  // the socket is closed (the connection is then unusable) and the result is timed_out.
  template <typename Start>
  error_code run(Clock::time_point deadline, Start&& start) {
    error_code result = asio::error::would_block;
    start([&result](const error_code& ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run_until(deadline);
    if (!ioc_.stopped()) {
      error_code ignored;
      socket_.close(ignored);
      ioc_.restart();
      ioc_.run();  // the aborted operation's handler must run before `result` goes out of scope
      return asio::error::timed_out;
    }
    return result;
  }

  error_code write(std::string_view data, Clock::time_point deadline) {
    return run(deadline, [&](auto handler) {
      asio::async_write(socket_, asio::buffer(data.data(), data.size()), std::move(handler));
    });
  }
  error_code read(char* data, std::size_t n, Clock::time_point deadline) {
    return run(deadline, [&](auto handler) {
      asio::async_read(socket_, asio::buffer(data, n), std::move(handler));
    });
  }

  tcp::socket& socket() { return socket_; }

  // With a secret, after the handshake: the MACs of the frames sent and received.
  bool sealed = false;
  internal::FrameMac send_mac, recv_mac;

 private:
  asio::io_context ioc_{1};
  tcp::socket socket_{ioc_};
};

class ClientCore {
 public:
  ClientCore(std::string host, std::uint16_t port, StoreOptions options)
      : host_(std::move(host)), port_(port), options_(options) {}

  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Connects and says hello, retrying with backoff for up to `budget`.
  StatusOr<std::unique_ptr<Connection>> connect(milliseconds budget);
  // Sends one request frame and returns the OK response body after its status byte, or the error
  // the server answered, or a transport error. `budget` bounds the wait for the answer.
  StatusOr<std::string> call(const std::string& frame, milliseconds budget);
  // The same on a connection the caller holds (kept out of the pool).
  StatusOr<std::string> call_on(Connection& conn, const std::string& frame,
                                Clock::time_point deadline, milliseconds budget);
  void give_back(std::unique_ptr<Connection> conn);

 private:
  // kSilent: transient, and the server accepted the connection but did not answer in time.
  enum class Failure { kNone, kTransient, kSilent, kFatal };
  StatusOr<std::unique_ptr<Connection>> connect_once(Clock::time_point deadline, Failure* failure,
                                                     std::string* last_error);
  Status transport_error(const error_code& ec, milliseconds budget) const;

  std::string host_;
  std::uint16_t port_;
  StoreOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

constexpr std::size_t kMaxIdleConnections = 8;

Status ClientCore::transport_error(const error_code& ec, milliseconds budget) const {
  const std::string role =
      options_.server_role.empty() ? "the store server (rank 0)" : options_.server_role;
  if (ec == asio::error::timed_out) {
    return deadline_exceeded("the server did not answer within " + format_duration(budget) +
                             "; is " + role + " alive and reachable?");
  }
  if (ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe) {
    return unavailable("the server closed the connection (" + ec.message() + "); has " + role +
                       " exited?");
  }
  return unavailable("talking to the server: " + ec.message() + "; is " + role +
                     " still running?");
}

StatusOr<std::unique_ptr<Connection>> ClientCore::connect_once(Clock::time_point deadline,
                                                               Failure* failure,
                                                               std::string* last_error) {
  *failure = Failure::kTransient;
  try {
    auto conn = std::make_unique<Connection>();
    error_code ec;
    // Resolved on every attempt: a launcher may publish the chief's name only once it runs.
    tcp::resolver resolver(conn->socket().get_executor());
    auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
    if (ec) {
      *last_error = "cannot resolve '" + host_ + "': " + ec.message();
      return unavailable(*last_error);
    }
    ec = conn->run(deadline, [&](auto handler) {
      asio::async_connect(conn->socket(), endpoints, std::move(handler));
    });
    if (ec) {
      *last_error = ec.message();
      return unavailable(*last_error);
    }
    conn->socket().set_option(tcp::no_delay(true), ec);
    const std::string& secret = options_.secret;
    wire::Nonce client_nonce{};
    internal::random_bytes(client_nonce.data(), client_nonce.size());
    std::string hello = wire::Writer()
                            .u8(static_cast<std::uint8_t>(wire::Op::kHello))
                            .raw(std::string_view(wire::kMagic, sizeof(wire::kMagic)))
                            .u32(wire::kVersion)
                            .raw(wire::bytes_of(client_nonce))
                            .u8(secret.empty() ? 0 : 1)
                            .finish();
    if ((ec = conn->write(hello, deadline))) {
      *last_error = "sending the hello: " + ec.message();
      return unavailable(*last_error);
    }
    std::string body;
    char header[wire::kFrameHeaderBytes];
    if ((ec = conn->read(header, sizeof(header), deadline))) {
      *last_error = "waiting for the hello answer: " + ec.message();
      // Connected, then nothing: the server's process holds its port but does not answer.
      if (ec == asio::error::timed_out) *failure = Failure::kSilent;
      return unavailable(*last_error);
    }
    // From here on the peer answered: anything unexpected is not a transient condition.
    *failure = Failure::kFatal;
    std::uint32_t length = wire::read_frame_length(header);
    if (length == 0 || length > 64 * 1024) {
      return unavailable("the service at " + address() +
                         " is not a tributary store (it answered the hello with a frame of " +
                         std::to_string(length) + " bytes); check the port");
    }
    body.resize(length);
    if ((ec = conn->read(body.data(), length, deadline))) {
      *failure = Failure::kTransient;
      *last_error = "reading the hello answer: " + ec.message();
      return unavailable(*last_error);
    }
    wire::Reader r(body);
    std::uint8_t code = r.u8();
    if (code != 0) {
      std::string message(r.str());
      return unavailable("the TCP store at " + address() + " refused the connection: " + message);
    }
    std::string_view magic = r.raw(sizeof(wire::kMagic));
    std::uint32_t version = r.u32();
    std::string_view nonce = r.raw(wire::kNonceBytes);
    const bool server_has_secret = r.u8() != 0;
    std::string_view proof = r.raw(sizeof(internal::Digest));
    if (!r.done() || magic != std::string_view(wire::kMagic, sizeof(wire::kMagic)) ||
        version != wire::kVersion) {
      return unavailable("the service at " + address() +
                         " is not a tributary store of this version (bad hello answer); check the "
                         "port and that every rank runs the same tributary build");
    }
    if (secret.empty()) {
      *failure = Failure::kNone;
      return conn;
    }
    if (!server_has_secret) {
      return unavailable("the TCP store at " + address() +
                         " does not use a shared secret but this process has one; give every "
                         "process the same secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE)");
    }
    wire::Nonce server_nonce{};
    std::copy(nonce.begin(), nonce.end(), reinterpret_cast<char*>(server_nonce.data()));
    const internal::Digest want = wire::session_digest(secret, "S", client_nonce, server_nonce);
    if (!internal::bytes_equal(proof.data(), want.data(), want.size())) {
      return unavailable("authentication failed: the TCP store at " + address() +
                         " does not hold this process's shared secret; give every process the "
                         "same secret (TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE)");
    }
    const internal::Digest mine = wire::session_digest(secret, "C", client_nonce, server_nonce);
    std::string auth =
        wire::Writer()
            .u8(static_cast<std::uint8_t>(wire::Op::kAuth))
            .raw(std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size()))
            .finish();
    *failure = Failure::kTransient;
    if ((ec = conn->write(auth, deadline))) {
      *last_error = "sending the proof of the secret: " + ec.message();
      return unavailable(*last_error);
    }
    if ((ec = conn->read(header, sizeof(header), deadline))) {
      *last_error = "waiting for the store to accept the proof: " + ec.message();
      return unavailable(*last_error);
    }
    *failure = Failure::kFatal;
    length = wire::read_frame_length(header);
    if (length == 0 || length > wire::kMaxUnauthenticatedFrameBytes) {
      return unavailable("the TCP store at " + address() + " answered the proof with a frame of " +
                         std::to_string(length) + " bytes");
    }
    body.assign(length, '\0');
    if ((ec = conn->read(body.data(), length, deadline))) {
      *failure = Failure::kTransient;
      *last_error = "reading the answer to the proof: " + ec.message();
      return unavailable(*last_error);
    }
    wire::Reader a(body);
    if (std::uint8_t c = a.u8(); c != 0) {
      return unavailable("the TCP store at " + address() + " refused the connection: " +
                         std::string(a.str()));
    }
    conn->sealed = true;
    conn->send_mac =
        internal::FrameMac(wire::session_digest(secret, "c", client_nonce, server_nonce));
    conn->recv_mac =
        internal::FrameMac(wire::session_digest(secret, "s", client_nonce, server_nonce));
    *failure = Failure::kNone;
    return conn;
  } catch (const std::exception& e) {  // io_context creation can fail when out of descriptors
    *last_error = e.what();
    return unavailable(*last_error);
  }
}

StatusOr<std::unique_ptr<Connection>> ClientCore::connect(milliseconds budget) {
  auto start = Clock::now();
  auto deadline = internal::store_deadline(budget);
  auto backoff = std::chrono::microseconds(10'000);
  int attempts = 0;
  std::string last_error;
  Failure failure = Failure::kNone;
  for (;;) {
    ++attempts;
    auto conn = connect_once(deadline, &failure, &last_error);
    if (conn.ok() || failure == Failure::kFatal) return conn;
    if (Clock::now() >= deadline) break;
    internal::sleep_with_backoff(&backoff, std::chrono::seconds(1), deadline);
    if (Clock::now() >= deadline) break;
  }
  auto spent = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  // A server that accepts but does not answer is alive and silent (stopped, hung): a deadline, not
  // an unreachable store.
  return Status(
      failure == Failure::kSilent ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable,
      "could not reach the TCP store at " + address() + " within " + format_duration(budget) +
      " (" + std::to_string(attempts) + " attempts over " + format_duration(spent) +
      "; last error: " + last_error +
      "); " +
      (options_.server_role.empty()
           ? std::string("check that the chief (rank 0) has started the store server, that the "
                         "host and port are right (MASTER_ADDR/MASTER_PORT or the cluster spec) "
                         "and that no firewall blocks the port; raise connect_timeout "
                         "(StoreOptions) to wait longer")
           : "check that " + options_.server_role +
                 " is running and serving this address (TF_CONFIG) and that no firewall "
                 "blocks the port"));
}

void ClientCore::give_back(std::unique_ptr<Connection> conn) {
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(conn));
}

StatusOr<std::string> ClientCore::call(const std::string& frame, milliseconds budget) {
  std::unique_ptr<Connection> conn;
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      conn = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  // One deadline for the whole call, a reconnection included, so that a get(key, 100ms) against a
  // vanished server fails in about that time rather than after the whole connect timeout.
  auto deadline = internal::store_deadline(budget);
  if (!conn) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    TRIBUTARY_ASSIGN_OR_RETURN(conn, connect(std::min(left, options_.connect_timeout)));
  }
  // A connection that fails or times out is dropped here (its answer might still be in flight).
  auto body = call_on(*conn, frame, deadline, budget);
  if (body.ok()) give_back(std::move(conn));
  return body;
}

StatusOr<std::string> ClientCore::call_on(Connection& conn, const std::string& frame,
                                          Clock::time_point deadline, milliseconds budget) {
  std::string sealed;
  if (conn.sealed) {
    sealed = frame;
    wire::seal(conn.send_mac, sealed);
  }
  if (error_code ec = conn.write(conn.sealed ? sealed : frame, deadline)) {
    return transport_error(ec, budget);
  }
  char header[wire::kFrameHeaderBytes];
  if (error_code ec = conn.read(header, sizeof(header), deadline)) {
    return transport_error(ec, budget);
  }
  std::uint32_t length = wire::read_frame_length(header);
  const std::size_t limit =
      wire::kMaxFrameBytes + (conn.sealed ? internal::FrameMac::kTagBytes : 0);
  if (length == 0 || length > limit) {
    return internal_error("the server at " + address() + " sent a frame of " +
                          std::to_string(length) + " bytes, outside the protocol's limits");
  }
  std::string body(length, '\0');
  if (error_code ec = conn.read(body.data(), length, deadline)) return transport_error(ec, budget);
  if (conn.sealed) {
    std::string_view view(body);
    if (!wire::unseal(conn.recv_mac, header, view)) {
      return unavailable("an answer from the TCP store at " + address() +
                         " failed authentication: it was changed on the way or did not come from "
                         "the store (is something on the network between them?)");
    }
    body.resize(view.size());
  }
  if (body.empty()) return internal_error("the server at " + address() + " sent an empty answer");
  auto code = static_cast<std::uint8_t>(body[0]);
  if (code != 0) {
    wire::Reader r(std::string_view(body).substr(1));
    std::string message(r.str());
    if (code > static_cast<std::uint8_t>(StatusCode::kInternal) || r.failed()) {
      return internal_error("the server sent a malformed error answer");
    }
    return Status(static_cast<StatusCode>(code), "the server answered: " + message);
  }
  body.erase(0, 1);
  return body;
}

// A get/wait is timed by the server, which answers with what is still missing; the client waits a
// little longer for that answer before it gives up on a server that stopped answering.
milliseconds client_budget(milliseconds timeout) {
  timeout = std::min(timeout, wire::kMaxServerWait);
  return timeout + std::clamp<milliseconds>(timeout / 2, milliseconds(250), milliseconds(5000));
}

// The keys of a wait/check request, after checking that they fit one frame.
Status write_keys(wire::Writer& w, const std::vector<std::string>& keys) {
  std::size_t bytes = 0;
  for (const std::string& k : keys) bytes += k.size() + 4;
  if (bytes > wire::kMaxFrameBytes - 64) {
    return invalid_argument(std::to_string(keys.size()) + " keys total " + std::to_string(bytes) +
                            " bytes, above the limit of " +
                            std::to_string(wire::kMaxFrameBytes - 64) + " for one request");
  }
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const std::string& k : keys) w.str(k);
  return Status();
}

Status malformed_answer() {
  return internal_error(
      "malformed answer from the server; is every rank running the same "
      "tributary build?");
}

}  // namespace

// =================================================================================================
// Public classes
// =================================================================================================

struct TcpStore::Impl {
  Impl(std::string host, std::uint16_t port, StoreOptions options)
      : core(std::move(host), port, options) {}
  ClientCore core;
  // The connection that carries the last will: never pooled, never used for anything else, so
  // that it stays open exactly as long as this process holds the store.
  std::mutex will_mu;
  std::unique_ptr<Connection> will_conn;
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl, StoreOptions options)
    : Store(options), impl_(std::move(impl)) {}

TcpStore::~TcpStore() {
  // A store closed on purpose is not a lost client: withdraw the will before the connection closes.
  std::lock_guard lock(impl_->will_mu);
  if (!impl_->will_conn) return;
  const auto frame = wire::Writer().u8(std::uint8_t(wire::Op::kWill)).str("").str("").finish();
  const milliseconds budget(1000);
  (void)impl_->core.call_on(*impl_->will_conn, frame, internal::store_deadline(budget), budget);
}

Status TcpStore::set_last_will_impl(std::string_view key, std::string_view value) {
  std::lock_guard lock(impl_->will_mu);
  const milliseconds budget = options().timeout;
  const auto deadline = internal::store_deadline(budget);
  if (!impl_->will_conn) {
    TRIBUTARY_ASSIGN_OR_RETURN(impl_->will_conn,
                               impl_->core.connect(std::min(budget, options().connect_timeout)));
  }
  const auto frame = wire::Writer().u8(std::uint8_t(wire::Op::kWill)).str(key).str(value).finish();
  auto body = impl_->core.call_on(*impl_->will_conn, frame, deadline, budget);
  if (!body.ok()) {
    impl_->will_conn.reset();  // its state is unknown; the next call starts afresh
    return body.status();
  }
  if (!body->empty()) return malformed_answer();
  return Status();
}

StatusOr<std::string> TcpStore::call(std::string_view method, std::string_view payload,
                                     std::chrono::milliseconds timeout) {
  TRIBUTARY_RETURN_IF_ERROR(internal::validate_store_key(method));
  TRIBUTARY_RETURN_IF_ERROR(internal::validate_store_value(method, payload.size()));
  auto frame =
      wire::Writer().u8(std::uint8_t(wire::Op::kCall)).str(method).str(payload).finish();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(frame, timeout));
  wire::Reader r(body);
  std::string_view answer = r.str();
  if (!r.done()) return malformed_answer();
  return std::string(answer);
}

std::string TcpStore::describe() const { return "TCP store at " + impl_->core.address(); }

StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, std::uint16_t port,
                                                      StoreOptions options) {
  if (host.empty() || port == 0) {
    return invalid_argument("TcpStore::connect: needs a host and a non-zero port, got '" + host +
                            ":" + std::to_string(port) + "'");
  }
  auto impl = std::make_unique<Impl>(host, port, options);
  TRIBUTARY_ASSIGN_OR_RETURN(auto conn, impl->core.connect(options.connect_timeout));
  impl->core.give_back(std::move(conn));
  return std::unique_ptr<TcpStore>(new TcpStore(std::move(impl), options));
}

Status TcpStore::set_impl(std::string_view key, std::string_view value) {
  return set_within_impl(key, value, options().timeout);
}

Status TcpStore::set_within_impl(std::string_view key, std::string_view value, Duration timeout) {
  auto frame = wire::Writer().u8(std::uint8_t(wire::Op::kSet)).str(key).str(value).finish();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(frame, timeout));
  if (!body.empty()) return malformed_answer();
  return Status();
}

StatusOr<std::optional<std::string>> TcpStore::get_impl(std::string_view key, Duration timeout) {
  auto frame = wire::Writer()
                   .u8(std::uint8_t(wire::Op::kGet))
                   .u64(static_cast<std::uint64_t>(timeout.count()))
                   .str(key)
                   .finish();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(frame, client_budget(timeout)));
  wire::Reader r(body);
  std::uint8_t found = r.u8();
  if (found == 0) {
    if (!r.done()) return malformed_answer();
    return std::optional<std::string>();
  }
  std::string_view value = r.str();
  if (!r.done()) return malformed_answer();
  return std::optional<std::string>(std::string(value));
}

StatusOr<std::int64_t> TcpStore::add_impl(std::string_view key, std::int64_t delta) {
  auto frame = wire::Writer().u8(std::uint8_t(wire::Op::kAdd)).str(key).i64(delta).finish();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(frame, options().timeout));
  wire::Reader r(body);
  std::int64_t value = r.i64();
  if (!r.done()) return malformed_answer();
  return value;
}

Status TcpStore::wait_impl(const std::vector<std::string>& keys, Duration timeout,
                           std::vector<std::string>* missing) {
  wire::Writer w;
  w.u8(std::uint8_t(wire::Op::kWait)).u64(static_cast<std::uint64_t>(timeout.count()));
  TRIBUTARY_RETURN_IF_ERROR(write_keys(w, keys));
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body,
                             impl_->core.call(w.finish(), client_budget(timeout)));
  wire::Reader r(body);
  std::uint32_t n = r.count(4);
  for (std::uint32_t i = 0; i < n && !r.failed(); ++i) missing->emplace_back(r.str());
  if (!r.done()) return malformed_answer();
  return Status();
}

StatusOr<bool> TcpStore::check_impl(const std::vector<std::string>& keys) {
  wire::Writer w;
  w.u8(std::uint8_t(wire::Op::kCheck));
  TRIBUTARY_RETURN_IF_ERROR(write_keys(w, keys));
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(w.finish(), options().timeout));
  wire::Reader r(body);
  std::uint8_t all = r.u8();
  if (!r.done()) return malformed_answer();
  return all != 0;
}

StatusOr<bool> TcpStore::delete_key_impl(std::string_view key) {
  auto frame = wire::Writer().u8(std::uint8_t(wire::Op::kDelete)).str(key).finish();
  TRIBUTARY_ASSIGN_OR_RETURN(std::string body, impl_->core.call(frame, options().timeout));
  wire::Reader r(body);
  std::uint8_t existed = r.u8();
  if (!r.done()) return malformed_answer();
  return existed != 0;
}

}  // namespace tributary
