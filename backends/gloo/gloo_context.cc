#include "backends/gloo/gloo_context.h"

#include <arpa/inet.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backends/gloo/gloo_store.h"
#include "core/crypto/crypto.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "tributary/options.h"
#include "tributary/store.h"

namespace tributary::backends {
namespace {

// The local address whose route reaches `coordinator` (a UDP connect sends no packet); loopback
// when there is no coordinator or it is local.
// An address as text, "[10.0.0.2]:41234". Gloo's tcp::Address::str() prints the port as stored,
// in network byte order; `as_gloo` prints it that way, to compare with Gloo's texts.
std::string address_text(const sockaddr_storage& a, bool as_gloo) {
  char text[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = in->sin_port;
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    port = in6->sin6_port;
  } else {
    return "";
  }
  return "[" + std::string(text) + "]:" + std::to_string(as_gloo ? port : ntohs(port));
}

struct OpenSocket {
  int fd = -1;
  std::string local, remote;            // as the OS has them
  std::string gloo_local, gloo_remote;  // as Gloo's str() prints them
  bool healthy = true;                  // established (no FIN or reset seen)
};

// Every connected TCP socket of this process.
std::vector<OpenSocket> open_tcp_sockets() {
  std::vector<OpenSocket> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
    sockaddr_storage local{}, remote{};
    socklen_t llen = sizeof(local), rlen = sizeof(remote);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0) continue;
    OpenSocket s{fd, address_text(local, false), address_text(remote, false),
                 address_text(local, true), address_text(remote, true)};
    // Not SO_ERROR: reading it would clear an error that Gloo has yet to see.
    tcp_info info{};
    socklen_t ilen = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &ilen) == 0) {
      s.healthy = info.tcpi_state == TCP_ESTABLISHED;
    }
    if (!s.local.empty() && !s.remote.empty()) out.push_back(std::move(s));
  }
  return out;
}

// A connection as "local->remote" (address_text of each end): how PeerDirectory names and finds it.
std::string socket_key(const std::string& local, const std::string& remote) {
  return local + "->" + remote;
}
std::string socket_key(const OpenSocket& s) { return socket_key(s.local, s.remote); }

// Bcube needs a base that divides the number of processes.
int smallest_divisor(int n) {
  for (int d = 2; d * d <= n; ++d) {
    if (n % d == 0) return d;
  }
  return n < 2 ? 2 : n;
}

}  // namespace

SigpipeGuard::SigpipeGuard() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  already_blocked_ = sigismember(&old_, SIGPIPE) == 1;
}

SigpipeGuard::~SigpipeGuard() {
  if (already_blocked_) return;
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    timespec zero{};
    while (sigtimedwait(&pipe, nullptr, &zero) == -1 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

PeerDirectory PeerDirectory::learn(gloo::Context& context, GlooStore& store) {
  PeerDirectory made;
  const int rank = context.rank, size = context.size;
  const auto n = static_cast<size_t>(size);
  made.addresses_.assign(n, {});
  made.sockets_.assign(n, "");
  made.fds_.assign(n, -1);
  std::vector<std::string> mine(n);
  std::string list;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    mine[static_cast<size_t>(p)] = context.getPair(p)->address().str();
    list += std::to_string(p) + "=" + mine[static_cast<size_t>(p)] + "\n";
  }
  store.set("addresses/" + std::to_string(rank), std::vector<char>(list.begin(), list.end()));
  const std::string key = std::to_string(rank) + "=";
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::vector<char> theirs = store.get("addresses/" + std::to_string(p));
    std::string_view rest(theirs.data(), theirs.size());
    while (!rest.empty()) {
      const size_t end = std::min(rest.find('\n'), rest.size());
      if (rest.substr(0, end).starts_with(key)) {
        made.addresses_[static_cast<size_t>(p)].emplace_back(
            rest.substr(key.size(), end - key.size()));
      }
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
  }
  // Gloo's I/O thread may still be accepting when connectFullMesh returns: look again, briefly.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (;;) {
    bool all = true;
    const std::vector<OpenSocket> sockets = open_tcp_sockets();
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const auto& theirs = made.addresses_[static_cast<size_t>(p)];
      int matches = 0;
      for (const OpenSocket& s : sockets) {
        const bool far = std::find(theirs.begin(), theirs.end(), s.gloo_remote) != theirs.end();
        if (far || s.gloo_local == mine[static_cast<size_t>(p)]) {
          made.sockets_[static_cast<size_t>(p)] = socket_key(s);
          made.fds_[static_cast<size_t>(p)] = s.fd;
          ++matches;
        }
      }
      // Only where exactly one socket is that connection.
      if (matches != 1) {
        made.sockets_[static_cast<size_t>(p)].clear();
        made.fds_[static_cast<size_t>(p)] = -1;
      }
      all = all && !made.sockets_[static_cast<size_t>(p)].empty();
    }
    if (all || std::chrono::steady_clock::now() > give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return made;
}

std::string PeerDirectory::socket_of(int peer) const {
  return peer >= 0 && static_cast<size_t>(peer) < sockets_.size()
             ? sockets_[static_cast<size_t>(peer)]
             : std::string();
}

int PeerDirectory::fd_of(int peer) const {
  return peer >= 0 && static_cast<size_t>(peer) < fds_.size() ? fds_[static_cast<size_t>(peer)]
                                                              : -1;
}

bool PeerDirectory::same_socket(int peer, int fd) const {
  if (fd < 0 || fd_of(peer) != fd) return false;
  sockaddr_storage local{}, remote{};
  socklen_t llen = sizeof(local), rlen = sizeof(remote);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0) {
    return false;
  }
  return socket_key(address_text(local, false), address_text(remote, false)) == socket_of(peer);
}

size_t gloo_priming_bytes(bool sync) {
  if (!sync) return kGlooPrimingAsyncBytes;
  constexpr size_t kLeast = kGlooPrimingAsyncBytes, kMost = kGlooPrimingMostBytes;
  size_t bytes = kMost;
  if (FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) == 1) bytes = static_cast<size_t>(v);
    std::fclose(f);
  }
  return std::clamp(bytes, kLeast, kMost);
}

namespace {
// One message of gloo_priming_bytes(sync) to and from every peer (see there), in Gloo's async mode:
// its I/O thread takes them in while this thread sends. Every rank takes the same slot. Each
// receive is posted at the largest size any rank may send, since hosts may set wmem_max apart.
// Throws what Gloo throws, after closing every pair: Gloo's I/O thread may otherwise still write
// into `in` for a healthy peer once it is freed.
void prime_send_buffers(gloo::Context& context, bool sync) {
  const size_t bytes = gloo_priming_bytes(sync);
  std::vector<char> out(bytes);
  std::unique_ptr<char[]> in(new char[kGlooPrimingMostBytes]);  // every message lands here, unread
  const int slot = context.nextSlot();
  std::vector<std::unique_ptr<gloo::transport::Buffer>> recvs, sends;
  try {
    for (int p = 0; p < context.size; ++p) {
      if (p == context.rank) continue;
      recvs.push_back(context.getPair(p)->createRecvBuffer(slot, in.get(), kGlooPrimingMostBytes));
    }
    for (int p = 0; p < context.size; ++p) {
      if (p == context.rank) continue;
      sends.push_back(context.getPair(p)->createSendBuffer(slot, out.data(), bytes));
      sends.back()->send();
    }
    for (auto& s : sends) s->waitSend();
    for (auto& r : recvs) r->waitRecv();
  } catch (...) {
    for (int p = 0; p < context.size; ++p) {
      if (p != context.rank) context.getPair(p)->close();
    }
    throw;
  }
}
}  // namespace

int PeerDirectory::peer_in(const std::string& gloo_message) const {
  for (size_t r = 0; r < addresses_.size(); ++r) {
    for (const std::string& a : addresses_[r]) {
      // "[127.0.0.1]:4000" must not match "[127.0.0.1]:40001".
      const size_t at = gloo_message.find(a);
      if (at == std::string::npos) continue;
      const size_t after = at + a.size();
      if (after < gloo_message.size() &&
          std::isdigit(static_cast<unsigned char>(gloo_message[after]))) {
        continue;
      }
      return static_cast<int>(r);
    }
  }
  // Else the one peer whose connection is closed, closing (it sent FIN) or in error.
  const std::vector<OpenSocket> sockets = open_tcp_sockets();
  int gone = -1;
  for (size_t r = 0; r < sockets_.size(); ++r) {
    if (sockets_[r].empty()) continue;
    const bool open = std::any_of(sockets.begin(), sockets.end(), [&](const OpenSocket& s) {
      return s.healthy && socket_key(s) == sockets_[r];
    });
    if (open) continue;
    if (gone >= 0) return -1;
    gone = static_cast<int>(r);
  }
  return gone;
}

namespace {

using internal::hex;

// Every rank shows, through the store, that it holds the same secret as the others (an HMAC over
// every rank's fresh nonce, so a proof cannot be replayed from another job or instance), or that
// no rank has one. Runs on every rank, secret or not, so that a difference fails everywhere.
Status check_same_secret(int rank, int world_size, Store& store, const GlooConnectOptions& o,
                         const std::string& who) {
  uint8_t nonce[16];
  if (getrandom(nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) {
    return internal_error(who + ": getrandom failed");
  }
  const auto wait = o.timeout;
  TRIBUTARY_RETURN_IF_ERROR(
      store.set("secret/nonce/" + std::to_string(rank), hex(nonce, sizeof nonce)));
  std::string transcript = "tributary gloo secret|" + o.cluster_id;
  for (int r = 0; r < world_size; ++r) {
    auto n = store.get("secret/nonce/" + std::to_string(r), wait);
    if (!n.ok()) return n.status().with_context(who + ": comparing secrets");
    transcript += "|" + *n;
  }
  const auto proof_of = [&](int r) {
    if (o.secret.empty()) return std::string("none");
    const internal::Digest d = internal::hmac_sha256(o.secret, transcript + "|" + std::to_string(r));
    return hex(d.data(), d.size());
  };
  TRIBUTARY_RETURN_IF_ERROR(store.set("secret/proof/" + std::to_string(rank), proof_of(rank)));
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    auto theirs = store.get("secret/proof/" + std::to_string(r), wait);
    if (!theirs.ok()) return theirs.status().with_context(who + ": comparing secrets");
    const std::string want = proof_of(r);
    if (*theirs == want) continue;
    std::string what;
    if (o.secret.empty()) {
      what = "rank " + std::to_string(r) + " has a secret (TRIBUTARY_SECRET) and this rank has none";
    } else if (*theirs == "none") {
      what = "this rank has a secret (TRIBUTARY_SECRET) and rank " + std::to_string(r) +
             " has none";
    } else {
      what = "rank " + std::to_string(r) + " holds a different secret";
    }
    return unavailable(who + ": " + what +
                       "; authentication failed: give every process the same secret "
                       "(TRIBUTARY_SECRET, TRIBUTARY_SECRET_FILE or secret_file=), or none");
  }
  return Status();
}

}  // namespace

namespace {

// Where Gloo's TCP device listens: an interface, or an address (by default the one that reaches
// the coordinator). `where` names it for messages.
gloo::transport::tcp::attr device_attr(const GlooConnectOptions& options, std::string* where) {
  gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
    *where = "interface " + options.iface;
  } else {
    attr.hostname =
        options.host.empty() ? internal::interface_towards(options.coordinator) : options.host;
    *where = "address " + attr.hostname;
  }
  return attr;
}

}  // namespace

bool gloo_timed_out(std::string_view what) {
  return what.find("imeout") != std::string_view::npos ||
         what.find("imed out") != std::string_view::npos;
}

namespace {

// Gloo's I/O thread (the loop that CreateDevice starts) runs as SCHED_BATCH, so that its wake-ups
// do not preempt the thread issuing the collective. In async mode that thread writes its messages
// itself, holding the pair's lock; the I/O thread, woken by the peer's data meanwhile, cannot take
// the lock (Pair::handleEvents tries, and returns) and finds the data again at once: where both
// share a core (ranks bound to cores), it spun until its time slice ran out, 3-4 ms, about once a
// collective. Measured, 2 processes bound to a core each (tributary-bench --bind-to core, gloo,
// 256 KiB, in place): 1.8-2.5 ms per all-reduce before, 0.28 ms after. A tick can still hand the
// core to the I/O thread while the lock is held; it then waits for what runs there, as any
// SCHED_BATCH thread does (its share of the CPU is unchanged). The guard sets the calling thread
// to SCHED_BATCH while CreateDevice starts the loop thread, which inherits the policy (no other
// thread is touched), and restores it after. Only from SCHED_OTHER, and a refusal (a container's
// policy) leaves everything as it was: slower where a core is shared, not wrong.
class BatchThreadsStartedHere {
 public:
  BatchThreadsStartedHere() {
    if (sched_getscheduler(0) != SCHED_OTHER) return;
    sched_param param{};
    active_ = sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  }
  ~BatchThreadsStartedHere() {
    if (!active_) return;
    sched_param param{};
    (void)sched_setscheduler(0, SCHED_OTHER, &param);
  }
  BatchThreadsStartedHere(const BatchThreadsStartedHere&) = delete;
  BatchThreadsStartedHere& operator=(const BatchThreadsStartedHere&) = delete;

 private:
  bool active_ = false;
};

// gloo::rendezvous::Context with the full mesh connected our way. Gloo's connectFullMesh connects
// the pairs one after another, so a rank whose connection to one peer failed at once (a stranger
// took that peer's port) never connects its later pairs, and the peers listening on them wait out
// the whole timeout before anyone can retry. Here every pair connects on its own thread: a pair
// waits only for its own peer, and a refused connection fails its rank at once while its other
// pairs still complete, so that every rank reports within moments and all retry together.
class MeshContext final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  // Publishes this rank's pair addresses under "pairs/<rank>" and connects every pair; throws as
  // Gloo does (the first connection failure that is not a timeout, else the first failure).
  void connect_mesh(gloo::rendezvous::Store& store,
                    const std::shared_ptr<gloo::transport::Device>& device) {
    std::shared_ptr<gloo::transport::Context> pairs = device->createContext(rank, size);
    pairs->setTimeout(getTimeout());
    // Per rank, in rank order: a 4-byte length, then that pair's address (empty for this rank).
    std::vector<char> mine;
    for (int i = 0; i < size; ++i) {
      std::vector<char> bytes;
      if (i != rank) bytes = pairs->createPair(i)->address().bytes();
      const auto n = static_cast<uint32_t>(bytes.size());
      const auto* p = reinterpret_cast<const char*>(&n);
      mine.insert(mine.end(), p, p + sizeof n);
      mine.insert(mine.end(), bytes.begin(), bytes.end());
    }
    store.set("pairs/" + std::to_string(rank), mine);
    // Gloo waits up to five times its timeout for a pair's first connection (tcp::Pair::waitUntil),
    // so a peer that published its addresses and then died or stopped would hold this rank's
    // listening pair that long. This thread waits for the pairs until the timeout instead, and
    // closes those still connecting then, which ends their waits.
    const auto deadline = std::chrono::steady_clock::now() + getTimeout();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> finished(static_cast<size_t>(size), 0);
    int pending = size - 1;
    std::vector<int> late;
    {
      std::vector<std::jthread> threads;
      for (int i = 0; i < size; ++i) {
        if (i == rank) continue;
        threads.emplace_back([&, i] {
          try {
            const std::vector<char> theirs = store.get("pairs/" + std::to_string(i));
            pairs->getPair(i)->connect(address_for(theirs, rank, i));
          } catch (...) {
            errors[static_cast<size_t>(i)] = std::current_exception();
          }
          {
            std::lock_guard lock(mu);
            finished[static_cast<size_t>(i)] = 1;
            --pending;
          }
          cv.notify_all();
        });
      }
      std::unique_lock lock(mu);
      if (!cv.wait_until(lock, deadline, [&] { return pending == 0; })) {
        for (int i = 0; i < size; ++i) {
          if (i != rank && finished[static_cast<size_t>(i)] == 0) late.push_back(i);
        }
      }
      lock.unlock();
      for (int i : late) pairs->getPair(i)->close();
    }
    if (!late.empty()) {
      std::string ranks;
      for (int i : late) ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
      throw gloo::IoException("Connect timeout: no connection from or to rank(s) " + ranks +
                              " within the timeout; they may have exited or stopped after "
                              "publishing their addresses");
    }
    std::exception_ptr first, refused;
    for (const std::exception_ptr& e : errors) {
      if (!e) continue;
      if (!first) first = e;
      try {
        std::rethrow_exception(e);
      } catch (const gloo::IoException& io) {
        if (!refused && !gloo_timed_out(io.what())) refused = e;
      } catch (...) {
      }
    }
    if (refused) std::rethrow_exception(refused);
    if (first) std::rethrow_exception(first);
    device_ = device;
    transportContext_ = std::move(pairs);
  }

 private:
  // The address that rank `from` published for its pair with rank `to`.
  static std::vector<char> address_for(const std::vector<char>& published, int to, int from) {
    size_t at = 0;
    for (int i = 0;; ++i) {
      uint32_t n = 0;
      if (published.size() - at < sizeof n) break;
      std::memcpy(&n, published.data() + at, sizeof n);
      at += sizeof n;
      if (published.size() - at < n) break;
      if (i == to) return std::vector<char>(published.begin() + static_cast<ptrdiff_t>(at),
                                            published.begin() + static_cast<ptrdiff_t>(at + n));
      at += n;
    }
    throw gloo::EnforceNotMet(__FILE__, __LINE__, "published pair addresses",
                              "rank " + std::to_string(from) +
                                  " published a malformed list of pair addresses");
  }
};

// Runs `body`, a step of setting up Gloo, and turns what Gloo and the store throw into a Status.
// `transient` (when given) says whether a failure was a connection's (refused, reset: worth a
// fresh attempt) rather than the setup's.
template <typename Body>
Status gloo_step(const std::string& who, const std::string& where, const std::string& store_name,
                 std::chrono::milliseconds timeout, bool* transient, Body body) {
  if (transient) *transient = false;
  try {
    // Gloo's I/O thread, started by CreateDevice, inherits the blocked SIGPIPE.
    SigpipeGuard guard;
    body();
    return Status();
  } catch (const StoreError& e) {
    Status s = e.status();
    std::string hint = s.code() == StatusCode::kDeadlineExceeded
                           ? "; did every rank create its 'gloo' backend, in the same order as its "
                             "other multi-process backends?"
                           : "";
    return Status(s.code(), who + ": rendezvous failed: " + s.message() + hint);
  } catch (const gloo::IoException& e) {
    std::string what = e.what();
    const bool timed_out = gloo_timed_out(what);
    if (transient) *transient = !timed_out;
    std::string m = who + ": connecting Gloo's TCP mesh (listening on " + where +
                    ") failed: " + what +
                    "; check that every rank can reach every other at the address it " +
                    "published, or set host= or iface= in the gloo spec";
    return timed_out ? deadline_exceeded(m + " (timeout " + format_duration(timeout) + ")")
                     : unavailable(m);
  } catch (const gloo::EnforceNotMet& e) {
    return unavailable(who + ": Gloo could not set up its TCP device on " + where + ": " +
                       e.what() +
                       "; set host= to an address of this machine or iface= to one of "
                       "its interfaces");
  } catch (const std::bad_alloc&) {
    return resource_exhausted(who + ": out of memory while connecting Gloo's TCP mesh");
  } catch (const std::exception& e) {
    return internal_error(who + ": connecting Gloo's TCP mesh through " + store_name +
                          " failed: " + e.what());
  } catch (...) {
    return internal_error(who + ": connecting Gloo's TCP mesh failed with an unknown exception");
  }
}

// prime_send_buffers() with Gloo's exceptions as a Status naming the peer where Gloo's message
// says which.
// Its waits have the pairs' timeout, set when the mesh was made.
Status prime(gloo::Context& context, bool sync, const PeerDirectory& peers,
             const std::string& who) {
  const std::string what = who + ": priming the send buffers of Gloo's connections";
  try {
    SigpipeGuard guard;
    prime_send_buffers(context, sync);
    if (!sync) {
      // Gloo now reads 2 x (kGlooPrimingAsyncBytes + its 48-byte header) back and raises the
      // buffer only for larger pinned-buffer messages; the kernel's goes to about twice that
      // (gloo_context.h). Where the descriptor was not found, or no longer is that connection,
      // the buffer stays as primed: slower, not wrong. (Gloo's I/O thread could still close it
      // between the check and the call, on a peer's failure that setup reports anyway; the call
      // would then set another file's buffer, or fail.)
      const int half = static_cast<int>(kGlooAsyncSendBufferBytes / 2);  // the kernel doubles it
      for (int p = 0; p < context.size; ++p) {
        const int fd = p == context.rank ? -1 : peers.fd_of(p);
        if (fd >= 0 && peers.same_socket(p, fd)) {
          (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &half, sizeof(half));
        }
      }
    }
    return Status();
  } catch (const std::bad_alloc&) {
    return resource_exhausted(what + ": out of memory");
  } catch (const std::exception& e) {
    const std::string message = e.what();
    const int peer = peers.peer_in(message);
    const std::string with = peer >= 0 ? " (with rank " + std::to_string(peer) + ")" : "";
    return gloo_timed_out(message)
               ? deadline_exceeded(what + with + " timed out: " + message +
                                   "; is every rank still running?")
               : unavailable(what + with + " failed: " + message +
                             "; a rank may have exited or failed (see its log)");
  }
}

constexpr int kMeshAttempts = 3;

}  // namespace

// Gloo's TCP pairs accept the first connection that reaches their listening port as the peer:
// anything else that connects first (a port scanner, a stray client) takes the peer's place, and
// the real peer's connection is refused. So the mesh is attempted up to kMeshAttempts times, each
// under its own store prefix with fresh ports: after each attempt every rank posts how it went and
// reads every other's, and all retry together when a connection failed anywhere (a setup error,
// such as an unknown interface or a timeout, is not retried). What is left over of a failed
// attempt (a pair connected to a stranger) is torn down with it.
StatusOr<GlooConnection> connect_gloo(int rank, int world_size, std::shared_ptr<Store> store,
                                      const GlooConnectOptions& options) {
  const std::string who =
      "backend 'gloo' on rank " + std::to_string(rank) + " of " + std::to_string(world_size);
  TRIBUTARY_RETURN_IF_ERROR(check_same_secret(rank, world_size, *store, options, who));
  if (!options.secret.empty() && !options.allow_unauthenticated) {
    return failed_precondition(
        who + ": a shared secret is set (TRIBUTARY_SECRET), but Gloo's TCP transport cannot "
              "authenticate its connections or its data, so the secret would not protect this "
              "job; use backend 'ring' or 'ucx' (they authenticate every connection and message), "
              "or accept Gloo's unauthenticated transport with gloo:allow_unauthenticated=true");
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options.timeout;
  const auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  std::string where;
  const gloo::transport::tcp::attr attr = device_attr(options, &where);
  const std::string store_name = store->describe();
  const int base = options.bcube_base > 0 ? options.bcube_base : smallest_divisor(world_size);
  std::string failures;  // what went wrong in the attempts so far
  for (int attempt = 0; attempt < kMeshAttempts; ++attempt) {
    auto scoped = std::make_shared<PrefixStore>("mesh" + std::to_string(attempt) + "/", store);
    // The mesh alone: nothing here waits for a peer once its own pairs are connected, so that
    // every rank reports how its part went, whatever happened to the others'.
    auto rendezvous = std::make_unique<GlooStore>(scoped, remaining());
    std::shared_ptr<gloo::rendezvous::Context> context;
    bool transient = false;
    Status mesh = gloo_step(who, where, store_name, remaining(), &transient, [&] {
      std::shared_ptr<gloo::transport::Device> device;
      {
        BatchThreadsStartedHere batch;
        device = gloo::transport::tcp::CreateDevice(attr);
      }
      auto mesh_context = std::make_shared<MeshContext>(rank, world_size, base);
      mesh_context->setTimeout(remaining());
      mesh_context->connect_mesh(*rendezvous, device);
      context = std::move(mesh_context);
    });
    // How it went, for every rank: "ok", "retry <why>" or "fatal <why>".
    const std::string mine =
        mesh.ok() ? "ok" : (transient ? "retry " : "fatal ") + mesh.message().substr(0, 4096);
    TRIBUTARY_RETURN_IF_ERROR(scoped->set("result/" + std::to_string(rank), mine));
    bool all_ok = true;
    std::string fatal;
    for (int r = 0; r < world_size; ++r) {
      auto theirs = r == rank ? StatusOr<std::string>(mine)
                              : scoped->get("result/" + std::to_string(r), remaining());
      if (!theirs.ok()) {
        // Name every rank that has not reported, not only the first awaited: the one that hung
        // may come later in rank order than one that reported a moment too late.
        std::string silent;
        for (int q = r; q < world_size; ++q) {
          if (q == rank) continue;
          auto there = scoped->check({"result/" + std::to_string(q)});
          if (there.ok() && !*there) silent += (silent.empty() ? "" : ", ") + std::to_string(q);
        }
        if (silent.empty()) silent = std::to_string(r);
        return theirs.status().with_context(
            who + ": waiting for rank(s) " + silent + " to report their part of Gloo's TCP mesh" +
            (mesh.ok() ? std::string() : " (this rank's part failed: " + mesh.message() + ")"));
      }
      if (*theirs == "ok") continue;
      all_ok = false;
      if (theirs->rfind("fatal ", 0) == 0) {
        if (r != rank && fatal.empty()) fatal = "rank " + std::to_string(r) + ": " + theirs->substr(6);
      } else if (theirs->rfind("retry ", 0) == 0 && r != rank) {
        failures += "; attempt " + std::to_string(attempt + 1) + ", rank " + std::to_string(r) +
                    ": " + theirs->substr(6);
      }
    }
    if (all_ok) {
      GlooConnection made;
      TRIBUTARY_RETURN_IF_ERROR(gloo_step(who, where, store_name, remaining(), nullptr, [&] {
        made.peers = PeerDirectory::learn(*context, *rendezvous);
      }));
      // Before sync mode, which reads in the calling thread.
      TRIBUTARY_RETURN_IF_ERROR(prime(*context, options.sync, made.peers, who));
      TRIBUTARY_RETURN_IF_ERROR(gloo_step(who, where, store_name, remaining(), nullptr, [&] {
        if (options.sync) {
          for (int p = 0; p < world_size; ++p) {
            if (p != rank) context->getPair(p)->setSync(true, options.busy_poll);
          }
        }
      }));
      made.context = std::move(context);
      return made;
    }
    if (!mesh.ok() && !transient) return mesh;
    if (!fatal.empty()) {
      return unavailable(who + ": Gloo's TCP mesh could not be set up on " + fatal);
    }
    if (!mesh.ok()) {
      failures += "; attempt " + std::to_string(attempt + 1) + ", rank " + std::to_string(rank) +
                  ": " + mesh.message();
    }
  }
  return unavailable(
      who + ": Gloo's TCP mesh failed " + std::to_string(kMeshAttempts) +
      " times, with fresh ports each time: a connection was refused or reset (" +
      failures.substr(2) +
      "). A process that is not part of this job may be connecting to Gloo's ports (Gloo takes "
      "the first connection to reach a pair's port as the peer; see SECURITY.md), or the ranks "
      "cannot reach each other");
}

}  // namespace tributary::backends
