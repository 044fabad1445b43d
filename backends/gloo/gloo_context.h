// Setting up the gloo backend's connections: Gloo's TCP device and full mesh, with rendezvous
// through a tributary Store; a directory of which connection is which peer's, so that Gloo's I/O
// errors can name the peer's rank; and the SIGPIPE guard every call into Gloo's transport runs
// under.
//
// connect_gloo() never throws: Gloo's exceptions and the store's errors come back as a Status
// naming this rank, the address it listens on and the store. The other functions are called inside
// the backend's exception boundary.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/status.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace tributary {
class Store;
}  // namespace tributary

namespace tributary::backends {

class GlooStore;

// Holds SIGPIPE back in this thread while alive. A write to a peer that has died raises SIGPIPE,
// whose default action kills the process; blocked, the write fails with EPIPE instead and Gloo
// reports an I/O error. A SIGPIPE raised meanwhile is discarded before the mask is restored.
// Threads started meanwhile (Gloo's I/O loop, by CreateDevice) inherit the blocked mask for good.
class SigpipeGuard {
 public:
  SigpipeGuard();
  ~SigpipeGuard();
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_;
  bool already_blocked_ = false;
};

// Which connection is which peer's. Each rank publishes (through the store) the address of its end
// of each pair as Gloo prints it; this rank's connection with peer p is the socket whose far end is
// p's published address, or whose near end is this rank's. Best effort: where nothing matches,
// errors say "a peer". Linux: the sockets are found under /proc/self/fd.
class PeerDirectory {
 public:
  // After connectFullMesh. Throws what the store throws (StoreError).
  static PeerDirectory learn(gloo::Context& context, GlooStore& store);
  // The rank whose connection failed: the one whose published address Gloo's message names, else
  // the one peer whose connection is closed, closing or in error; -1 when that is not clear.
  int peer_in(const std::string& gloo_message) const;
  // This rank's connection with `peer` as "local->remote" ("[127.0.0.1]:40000->[...]:41000"), or
  // "" where it was not found.
  std::string socket_of(int peer) const;
  // That connection's descriptor (Gloo's) when learn() found exactly one, or -1. Gloo closes it
  // on an error, after which the number may name another file: check it (same_socket) first.
  int fd_of(int peer) const;
  // Whether `fd` is still this rank's connection with `peer` (both addresses unchanged).
  bool same_socket(int peer, int fd) const;

 private:
  std::vector<std::vector<std::string>> addresses_;  // by rank, as Gloo prints them
  std::vector<std::string> sockets_;                 // by rank: "local->remote", or ""
  std::vector<int> fds_;                             // by rank, or -1
};

struct GlooConnectOptions {
  std::string host;         // address/hostname to listen on; "" = the one that reaches coordinator
  std::string iface;        // network interface to listen on (overrides host), e.g. "eth0"
  std::string coordinator;  // the store's host
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  int bcube_base = 0;  // 0: the smallest divisor >= 2 of the world size
  // Gloo's sync mode: the calling thread reads its own sockets (no hand-off through Gloo's I/O
  // thread), spinning on them with busy_poll. Only classic algorithms work then.
  bool sync = false;
  bool busy_poll = false;
  // TRIBUTARY_SECRET (or the secret_file option); "" for none. Gloo's TCP transport cannot
  // authenticate its connections or data, so connect_gloo first makes every rank prove through the
  // store that it holds the same secret as every other (or that none has one), failing on every
  // rank when they differ; then, with a secret, it refuses unless allow_unauthenticated says the
  // user accepts Gloo's unauthenticated transport.
  std::string secret;
  bool allow_unauthenticated = false;
  std::string cluster_id;
};

// A connected full mesh (null context for one process) and its peers.
struct GlooConnection {
  std::shared_ptr<gloo::Context> context;
  PeerDirectory peers;
};

// Gloo sizes a pair's socket send buffer (SO_SNDBUF) for its pinned-buffer sends (classic
// algorithms), so that a message's write completes at once: when a message is larger than the
// buffer Gloo last read back, it asks for the message's size (the kernel doubles it, up to twice
// net.core.wmem_max). Its unbound-buffer sends (gloo::allreduce, broadcast, all_gather) never
// change it. Setting SO_SNDBUF also turns off the kernel's tuning of it, so a message up to twice
// the last one that raised it gets a buffer of 1-2x its size, and larger messages after small
// first ones then waited on the peer's delayed acknowledgements (40 ms each): 2 processes, 64 KiB
// all-reduce 4-20 ms, 128 KiB 50-80 ms in some runs, in the direct Gloo line alike. connect_gloo
// therefore sends every peer one message of gloo_priming_bytes(sync) first:
// - async mode (Gloo's I/O thread reads; the default): kGlooPrimingAsyncBytes, 64 KiB, after which
//   Gloo reads back 2 x (64 KiB + 48); the kernel's buffer is then raised to
//   kGlooAsyncSendBufferBytes (256 KiB; twice wmem_max where that is less) behind Gloo's back, so
//   that a pinned-buffer message Gloo does not raise it for has about twice its size, larger ones
//   get twice theirs from Gloo, and unbound sends keep 256 KiB at every size. Priming as large as
//   wmem_max (4 MiB here) fixed the stalls too but made 1-4 MiB all-reduces 20-60% slower than
//   the direct Gloo line (2 processes, in place: 4 MiB 5.2-5.6 ms against 2.8-3.5), and unbound
//   ones slower than with 256 KiB (unbound_ring, 16 MiB in place, one run each: 14.9 ms against
//   8.8, the direct line 15.6-16.4). Priming with
//   64 KiB alone left 128 KiB messages a buffer of their own size, which a write fills before it
//   is done: 256 KiB all-reduces 440-520 us against the direct line's 310-380. A fixed 1 MiB
//   buffer (Gloo never raising it) ran 4-16 MiB faster still but stalled some rounds of 256 KiB
//   all-reduces (0.4-2 ms).
// - sync modes (the calling thread reads its own sockets): net.core.wmem_max, the most
//   SO_SNDBUF may ask for (208 KiB on a stock kernel), at most kGlooPrimingMostBytes, at least
//   64 KiB. There both ranks of a pair write before either reads, so a message larger than the
//   buffers deadlocks: two ranks deadlocked from 4 MiB before, and ran up to 32 MiB with this.
// Each rank sends world size - 1 such messages at setup. Receives are posted at
// kGlooPrimingMostBytes, since hosts may set wmem_max apart.
inline constexpr size_t kGlooPrimingAsyncBytes = size_t{64} << 10;
inline constexpr size_t kGlooAsyncSendBufferBytes = size_t{256} << 10;
inline constexpr size_t kGlooPrimingMostBytes = size_t{4} << 20;
size_t gloo_priming_bytes(bool sync);

// Whether a Gloo exception's message says it timed out ("Timed out ...", "... timeout ..."): Gloo
// has no distinct exception type for it.
bool gloo_timed_out(std::string_view what);

// Creates Gloo's TCP device and connects the full mesh through `store` (already scoped to this
// instance), then sends every peer one message of gloo_priming_bytes(options.sync) (see there).
// Never throws.
StatusOr<GlooConnection> connect_gloo(int rank, int world_size, std::shared_ptr<Store> store,
                                      const GlooConnectOptions& options);

}  // namespace tributary::backends
