// Store: the key-value store through which the processes of a job meet at rendezvous. Ranks publish
// their addresses, NCCL unique ids and UCX worker addresses under agreed keys and read each
// other's. Modelled on Gloo's rendezvous::Store and PyTorch c10d's Store / TCPStore.
//
// Contract:
// - Keys are non-empty byte strings of at most kMaxStoreKeyBytes; values are byte strings (NUL
// bytes
//   allowed) of at most kMaxStoreValueBytes. Larger ones are rejected with kInvalidArgument.
// - Every method is thread-safe, and every store may be shared by many threads and processes.
// - get() and wait() block until the key(s) exist or the timeout passes; on timeout they return
//   kDeadlineExceeded naming the keys still missing and the timeout. The overloads without a
//   timeout use StoreOptions::timeout. A timeout <= 0 checks once and does not wait.
// - add() treats the value as a decimal int64 (an absent key counts as 0), updates it atomically
// for
//   every client of the store and returns the new value; get() of a counter returns its decimal
//   text.
// - No exception crosses this API; destructors neither throw nor hang.
//
// Implementations: MemoryStore (one process; ranks as threads), FileStore (a directory on a
// filesystem that all processes share), TcpStore (a client of a TcpStoreServer run by the chief).
// PrefixStore scopes the keys of one group inside a store that several groups share.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

inline constexpr std::size_t kMaxStoreKeyBytes = 64 * 1024;
inline constexpr std::size_t kMaxStoreValueBytes = 64 * 1024 * 1024;

struct StoreOptions {
  // How long get() and wait() block when called without a timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // TcpStore: how long connect() (and any later reconnection) keeps retrying an unreachable server.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
  // TcpStore: the job's shared secret ("" = none). With one, client and server prove it to each
  // other when connecting and every frame after that carries a MAC (tcp_store_protocol.h), so a
  // process without it can neither read nor change keys; the server must have the same secret.
  // make_backend_context sets it from TRIBUTARY_SECRET or TRIBUTARY_SECRET_FILE.
  std::string secret;
  // TcpStore: what the server is, for error messages ("" = "the store server (rank 0)", the
  // rendezvous store). Users of the store as an RPC channel name the task they talk to, e.g.
  // "worker:1" or "parameter server ps:0", so a failure points at the right process.
  std::string server_role;
};

class PrefixStore;

class Store {
 public:
  using Duration = std::chrono::milliseconds;

  explicit Store(StoreOptions options = {}) : options_(options) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets `key` to `value`, replacing any previous value, and wakes the readers waiting for it.
  Status set(std::string_view key, std::string_view value);
  // The same, giving up after `timeout` when the store does not answer (a TcpStore whose server
  // process is stopped): for reports made while something is already failing.
  Status set(std::string_view key, std::string_view value, Duration timeout);
  // The value of `key`, waiting up to `timeout` for some client to set it.
  StatusOr<std::string> get(std::string_view key) { return get(key, options_.timeout); }
  StatusOr<std::string> get(std::string_view key, Duration timeout);
  // Atomically adds `delta` to the counter `key` (absent = 0) and returns the new value.
  StatusOr<std::int64_t> add(std::string_view key, std::int64_t delta);
  // Waits up to `timeout` until every key in `keys` exists.
  Status wait(const std::vector<std::string>& keys) { return wait(keys, options_.timeout); }
  Status wait(const std::vector<std::string>& keys, Duration timeout);
  // Whether every key in `keys` exists now; does not wait for them.
  StatusOr<bool> check(const std::vector<std::string>& keys);
  // Removes `key`; true when it existed.
  StatusOr<bool> delete_key(std::string_view key);
  // A last will, as in MQTT: if this process dies, or its connection to the store is lost, before
  // this store object is destroyed, the store appends `value` and a newline to `key` (waking the
  // readers of `key`), so that the job's other processes learn who was lost rather than only that a
  // connection broke. One will per store object: a later call replaces it, and an empty `key`
  // withdraws it; destroying the store object withdraws it too. Only a store that sees its clients'
  // connections can honour this: TcpStore does; MemoryStore and FileStore answer kUnimplemented.
  Status set_last_will(std::string_view key, std::string_view value);

  const StoreOptions& options() const { return options_; }
  // For messages: "memory store", "file store at /shared/job42", "TCP store at 10.0.0.1:29500".
  virtual std::string describe() const = 0;

 protected:
  // The front door above validates keys, values and timeouts, then calls these. A blocking call
  // that times out is not an error here: get_impl returns nullopt and wait_impl fills `missing`;
  // the front door turns that into one kDeadlineExceeded message for every store.
  virtual Status set_impl(std::string_view key, std::string_view value) = 0;
  // set() within `timeout`; stores that always answer at once keep the default (set_impl).
  virtual Status set_within_impl(std::string_view key, std::string_view value, Duration timeout);
  virtual StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) = 0;
  virtual StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) = 0;
  virtual Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                           std::vector<std::string>* missing) = 0;
  virtual StatusOr<bool> check_impl(const std::vector<std::string>& keys) = 0;
  virtual StatusOr<bool> delete_key_impl(std::string_view key) = 0;
  virtual Status set_last_will_impl(std::string_view key, std::string_view value);

 private:
  friend class PrefixStore;  // forwards to the *_impl of the store it wraps
  StoreOptions options_;
};

// In-process store: a map under a mutex. For tests and single-process jobs with ranks as threads.
class MemoryStore final : public Store {
 public:
  explicit MemoryStore(StoreOptions options = {});
  ~MemoryStore() override;
  std::string describe() const override { return "memory store"; }

 protected:
  Status set_impl(std::string_view key, std::string_view value) override;
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override;
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override;
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override;
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key_impl(std::string_view key) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A directory on a filesystem that every process can reach (local, or NFS/Lustre for many hosts).
// Each key is one file, written to a temporary file and renamed into place, so a reader sees a
// whole old value or a whole new one; set/add/delete_key serialise on an flock()ed lock file, so
// counters are exact across processes. get() and wait() poll with backoff (1 ms growing to 50 ms).
// The directory is created when missing and is never removed by the store: use a fresh one per job.
class FileStore final : public Store {
 public:
  static StatusOr<std::unique_ptr<FileStore>> open(const std::string& path,
                                                   StoreOptions options = {});
  ~FileStore() override;
  std::string describe() const override;
  const std::string& path() const { return path_; }

 protected:
  Status set_impl(std::string_view key, std::string_view value) override;
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override;
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override;
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override;
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key_impl(std::string_view key) override;

 private:
  FileStore(std::string path, StoreOptions options);
  std::string path_;
};

// A procedure served by a TcpStoreServer beside its keys (TcpStore::call): what the parameter-server
// tasks of strategy/parameter_server.h answer, on the store's connections, authentication and
// frame limits. The handler runs on the server's I/O thread and must not block: it answers at once
// or hands the work to another thread. `reply` must be called exactly once, from any thread, at any
// time (after the server stopped or the client left, the answer is dropped); an answer longer than
// kMaxStoreValueBytes becomes a kResourceExhausted error.
using StoreCallReply = std::function<void(StatusOr<std::string> answer)>;
using StoreCallHandler =
    std::function<void(std::string_view method, std::string_view payload, StoreCallReply reply)>;

struct TcpStoreServerOptions {
  // Pending connections the kernel queues; raise it when thousands of ranks connect at once.
  int listen_backlog = 4096;
  // The shared secret clients must prove ("" = none: anyone who reaches the port is served).
  std::string secret;
  // Limits, so that whoever can reach the port cannot exhaust the server's memory or descriptors:
  // connections open at once (more are closed on accept; make_backend_context allows 16 per rank,
  // at least 1024);
  std::size_t max_connections = 1024;
  // bytes of requests received but not yet handled, over all connections (a connection that would
  // pass it is closed with an error);
  std::size_t max_buffered_bytes = std::size_t{256} << 20;
  // bytes of keys and values held (a set or add that would pass it fails with kResourceExhausted);
  std::size_t max_stored_bytes = std::size_t{1} << 30;
  // how long a new connection has to say hello (and, with a secret, to authenticate) before it is
  // closed.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  // Once a client's last will has been executed (a process of the job was lost), destroying the
  // server waits up to this long for the clients that still hold a will to close, so that the
  // survivors can still read who was lost when the chief (rank 0) ends first. 0 = do not wait.
  std::chrono::milliseconds linger_after_loss = std::chrono::seconds(5);
  // The job's processes, each of which leaves a last will (make_backend_context sets the world
  // size; 0 = unknown). Destroying the server before every one of them has connected waits up to
  // linger_for_absent for those still to come to connect and close again, so that a chief that
  // fails at once (a backend option only the world size refuses) does not take the store from the
  // ranks still starting, which would otherwise wait their whole timeout to reach it, and then
  // blame the network, instead of meeting the same error themselves. Once all have connected,
  // destroying the server does not wait.
  std::size_t expected_clients = 0;
  std::chrono::milliseconds linger_for_absent = std::chrono::seconds(5);
  // Serves TcpStore::call (null: calls are answered kUnimplemented).
  StoreCallHandler call_handler;
  // A TCP socket already bound and listening, which the server serves on instead of binding one
  // (systemd's socket activation; and how tributary-run hands rank 0 a port it never released:
  // TRIBUTARY_STORE_FD, read by make_backend_context and by parameter-server tasks). It must
  // listen on create_server's `port` (or any, with port 0); create_server owns it from the call on
  // (it closes it on failure too, and sets close-on-exec on it), so options that name one serve
  // one create_server call only. -1 = bind `host`:`port`.
  int listen_fd = -1;
};

class TcpStoreServer;

// A client of a TcpStoreServer. Each process of the job (the server's own included) connects one.
// Concurrent calls from several threads use separate connections from a small pool, so a thread
// blocked in get() never delays another thread's set(). A call whose server stops answering returns
// within its timeout plus a short grace (at most 5 s); a connection that failed is dropped and the
// next call reconnects (retrying for StoreOptions::connect_timeout).
class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying with backoff while the server is not (yet) reachable, for up to
  // options.connect_timeout; then kUnavailable naming the address, the time spent and what to
  // check.
  static StatusOr<std::unique_ptr<TcpStore>> connect(const std::string& host, std::uint16_t port,
                                                     StoreOptions options = {});
  // Starts a server listening on host:port ("0.0.0.0" or "" for every IPv4 interface, "::" for
  // every interface); port 0 picks a free port, which TcpStoreServer::port() reports.
  static StatusOr<std::unique_ptr<TcpStoreServer>> create_server(
      const std::string& host, std::uint16_t port, TcpStoreServerOptions options = {});

  ~TcpStore() override;
  std::string describe() const override;

  // Calls `method` of the server's call handler with `payload` and returns its answer, or its
  // error, or kDeadlineExceeded when no answer came within `timeout` (the connection is then
  // dropped), or kUnavailable when the server cannot be reached (retrying the connection for at most
  // StoreOptions::connect_timeout). `method` follows the rules of keys and `payload` those of
  // values. Concurrent calls from several threads run on separate connections.
  StatusOr<std::string> call(std::string_view method, std::string_view payload,
                             std::chrono::milliseconds timeout);

 protected:
  Status set_impl(std::string_view key, std::string_view value) override;
  Status set_within_impl(std::string_view key, std::string_view value,
                         Duration timeout) override;
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override;
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override;
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override;
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key_impl(std::string_view key) override;
  Status set_last_will_impl(std::string_view key, std::string_view value) override;

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl, StoreOptions options);
  std::unique_ptr<Impl> impl_;
};

// The server side of TcpStore: holds the keys in memory and serves clients on its own I/O thread.
// Blocked get()/wait() requests are parked and answered when their keys arrive or their timeout
// passes. A client that sends a malformed, oversized or truncated frame is disconnected; the others
// are unaffected. The destructor stops the thread and closes every connection.
class TcpStoreServer {
 public:
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const;
  std::uint16_t port() const;  // the bound port (the chosen one when created with port 0)
  // Connections served since start (for tests and diagnostics).
  std::size_t num_connections_accepted() const;

 private:
  friend class TcpStore;
  struct Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Scopes keys: key "k" becomes "<prefix>/k" in the wrapped store, so groups sharing one store do
// not collide. Messages name the keys as the caller wrote them and the prefix in describe().
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  std::string describe() const override;
  const std::string& prefix() const { return prefix_; }

 protected:
  Status set_impl(std::string_view key, std::string_view value) override;
  Status set_within_impl(std::string_view key, std::string_view value,
                         Duration timeout) override;
  StatusOr<std::optional<std::string>> get_impl(std::string_view key, Duration timeout) override;
  StatusOr<std::int64_t> add_impl(std::string_view key, std::int64_t delta) override;
  Status wait_impl(const std::vector<std::string>& keys, Duration timeout,
                   std::vector<std::string>* missing) override;
  StatusOr<bool> check_impl(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key_impl(std::string_view key) override;
  Status set_last_will_impl(std::string_view key, std::string_view value) override;

 private:
  std::string full_key(std::string_view key) const;
  std::vector<std::string> full_keys(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
