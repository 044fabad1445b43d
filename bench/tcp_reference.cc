// The direct TCP line of tributary-bench (see lines.h): plain sockets between the same ranks,
// moving what a ring all-reduce moves through each rank's link, and nothing else.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/lines.h"
#include "tools/fd.h"
#include "transports/tcp/congestion.h"
#include "tributary/store.h"

namespace tributary::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

using tools::Fd;

// What ring's connections get: TCP_NODELAY and congestion.h's choice, `same_kernel` when the peer
// published this kernel's id.
void tune(int fd, bool same_kernel) {
  const int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)transports::apply_congestion_control(fd, "auto", same_kernel);
}

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Each call moves 2(n-1)/n of the message each way (a ring all-reduce's reduce-scatter and
// all-gather through one rank's link), in calls of at most 1 MiB, by one thread with non-blocking
// calls and poll() (ring's transport sends from a thread of its own instead: tcp_writer.h).
class TcpReference final : public Line {
 public:
  TcpReference(int world_size, bool message_buffers, Fd next, Fd prev, Fd pipe_read, Fd pipe_write,
               size_t pipe_capacity)
      : world_size_(world_size),
        message_buffers_(message_buffers),
        next_(std::move(next)),
        prev_(std::move(prev)),
        pipe_read_(std::move(pipe_read)),
        pipe_write_(std::move(pipe_write)),
        pipe_capacity_(pipe_capacity),
        send_buf_(kBuffer, std::byte{1}),
        recv_buf_(kBuffer) {}

  std::string spec() const override {
    return std::string("tcp-direct:buffers=") + (message_buffers_ ? "message" : "cache") +
           (pipe_write_.get() >= 0 ? ",send=splice" : "");
  }
  bool reference() const override { return true; }
  bool all_reduces() const override { return false; }
  int num_replicas_in_sync() const override { return world_size_; }

  Status all_reduce(ReduceOp, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs,
                    std::chrono::milliseconds timeout) override {
    const size_t bytes = inputs[0].nbytes();
    const size_t total = internal::ring_link_bytes(bytes, world_size_);
    // Where the bytes come from and go to: the 1 MiB buffers, or the message's own (a ring reads
    // its input and writes its output through memory).
    const std::byte* from = send_buf_.data();
    std::byte* into = recv_buf_.data();
    size_t span = kBuffer;
    if (message_buffers_ && bytes > 0) {
      from = static_cast<const std::byte*>(inputs[0].data());
      into = static_cast<std::byte*>(outputs[0].data());
      span = bytes;
    }
    const int in = prev_.get() >= 0 ? prev_.get() : next_.get();  // two ranks: one connection
    return internal::tcp_exchange({.out = next_.get(),
                                   .in = in,
                                   .from = from,
                                   .into = into,
                                   .span = span,
                                   .total = total,
                                   .pipe_read = pipe_read_.get(),
                                   .pipe_write = pipe_write_.get(),
                                   .pipe_capacity = pipe_capacity_},
                                  timeout);
  }

 private:
  static constexpr size_t kBuffer = size_t{1} << 20;
  int world_size_;
  bool message_buffers_;
  Fd next_, prev_;  // prev_ is empty with two ranks (next_ carries both ways)
  Fd pipe_read_, pipe_write_;  // send=splice; empty for send=copy
  size_t pipe_capacity_;
  std::vector<std::byte> send_buf_, recv_buf_;
};

}  // namespace

namespace internal {

Status tcp_exchange(const TcpExchange& x, std::chrono::milliseconds timeout) {
  // Calls of at most 1 MiB: calls of up to the whole message (buffers=message) moved 0.7-1.7 GB/s
  // at 256 MiB on this project's 2-vCPU VM where 1 MiB calls moved 3.8-4.3 (2026-11-29).
  constexpr size_t kCall = size_t{1} << 20;
  const auto deadline = Clock::now() + timeout;
  // splice()'s SPLICE_F_NONBLOCK covers the pipe only: a blocking socket would block it.
  if (x.pipe_write >= 0) {
    const int flags = ::fcntl(x.out, F_GETFL);
    if (flags < 0 || ::fcntl(x.out, F_SETFL, flags | O_NONBLOCK) != 0) {
      return unavailable(errno_text("tcp-direct: making the socket non-blocking"));
    }
  }
  size_t sent = 0, got = 0;
  size_t in_pipe = 0;  // send=splice: bytes in the pipe, not yet in the socket
  while (sent < x.total || got < x.total) {
    bool moved = false;
    if (sent < x.total && x.pipe_write >= 0) {
      const size_t queued = sent + in_pipe;
      if (queued < x.total && in_pipe < x.pipe_capacity) {
        const size_t at = queued % x.span;
        iovec iov{const_cast<std::byte*>(x.from) + at,
                  std::min({x.pipe_capacity - in_pipe, x.span - at, x.total - queued})};
        const ssize_t v = ::vmsplice(x.pipe_write, &iov, 1, SPLICE_F_NONBLOCK);
        if (v > 0) {
          in_pipe += static_cast<size_t>(v);
        } else if (errno != EAGAIN && errno != EINTR) {
          return unavailable(errno_text("tcp-direct: vmsplice"));
        }
      }
      if (in_pipe > 0) {
        const bool more = sent + in_pipe < x.total;
        const ssize_t k = ::splice(x.pipe_read, nullptr, x.out, nullptr, in_pipe,
                                   SPLICE_F_NONBLOCK | (more ? SPLICE_F_MORE : 0u));
        if (k > 0) {
          sent += static_cast<size_t>(k);
          in_pipe -= static_cast<size_t>(k);
          moved = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return unavailable(errno_text("tcp-direct: splice"));
        }
      }
    } else if (sent < x.total) {
      const size_t at = sent % x.span;
      const ssize_t k = ::send(x.out, x.from + at, std::min({kCall, x.span - at, x.total - sent}),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<size_t>(k);
        moved = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return unavailable(errno_text("tcp-direct: sending"));
      }
    }
    if (got < x.total) {
      const size_t at = got % x.span;
      const ssize_t k =
          ::recv(x.in, x.into + at, std::min({kCall, x.span - at, x.total - got}), MSG_DONTWAIT);
      if (k > 0) {
        got += static_cast<size_t>(k);
        moved = true;
      } else if (k == 0) {
        return unavailable("tcp-direct: the peer closed its connection");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return unavailable(errno_text("tcp-direct: receiving"));
      }
    }
    if (moved) continue;
    pollfd p[2];
    nfds_t np = 0;
    const short out_events = sent < x.total ? POLLOUT : 0;
    const short in_events = got < x.total ? POLLIN : 0;
    if (x.out == x.in) {
      p[np++] = {x.out, static_cast<short>(out_events | in_events), 0};
    } else {
      if (out_events) p[np++] = {x.out, out_events, 0};
      if (in_events) p[np++] = {x.in, in_events, 0};
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return deadline_exceeded("tcp-direct: " + std::to_string(sent) + " of " +
                               std::to_string(x.total) + " bytes sent and " + std::to_string(got) +
                               " received within " + std::to_string(timeout.count()) +
                               " ms; a peer is stuck or gone");
    }
    if (::poll(p, np, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 &&
        errno != EINTR) {
      return unavailable(errno_text("tcp-direct: poll"));
    }
  }
  return Status();
}

std::string local_address_towards(const std::string& coordinator) {
  if (coordinator.empty() || coordinator == "localhost") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(coordinator.c_str(), "9", &hints, &found) != 0 || !found) return "127.0.0.1";
  std::string result = "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &local.sin_addr, text, sizeof text)) result = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return result;
}

size_t ring_link_bytes(size_t bytes, int n) {
  if (n < 2) return 0;
  const size_t ranks = static_cast<size_t>(n);
  return 2 * (ranks - 1) * (bytes / ranks);
}

namespace {

struct Links {
  Fd to_next, from_prev;  // from_prev is empty with two ranks (to_next carries both ways)
};

// This rank's connections to its ring neighbours, within `deadline`: every rank listens and
// publishes its kernel id (core/kernel_id.h) and "host:port" under `prefix`; of each pair, the
// higher rank connects and sends its rank (4 bytes), the lower accepts. A connect never waits for
// the accepting side (the listen backlog takes it), so the order of the two links does not matter.
StatusOr<Links> connect_ring(const BackendContext& context, const std::string& prefix,
                             Clock::time_point deadline) {
  const int rank = context.rank, n = context.world_size;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const std::string host = local_address_towards(context.coordinator_host);
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (listener.get() < 0 || inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1 ||
      ::bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(listener.get(), 4) != 0) {
    return unavailable(errno_text(("tcp-direct: listening on " + host).c_str()));
  }
  socklen_t len = sizeof sa;
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return unavailable(errno_text("tcp-direct: getsockname"));
  }
  const std::string kernel = tributary::internal::kernel_id();
  TRIBUTARY_RETURN_IF_ERROR(context.store->set(prefix + "kernel/" + std::to_string(rank), kernel));
  TRIBUTARY_RETURN_IF_ERROR(context.store->set(prefix + std::to_string(rank),
                                               host + ":" + std::to_string(ntohs(sa.sin_port))));
  auto left = [&] {
    return std::chrono::duration_cast<Store::Duration>(
        std::max(Clock::duration::zero(), deadline - Clock::now()));
  };
  // Published before the peer's address: there by the time its connection is (as for ring's).
  auto same_kernel = [&](int peer) {
    auto theirs = context.store->get(prefix + "kernel/" + std::to_string(peer),
                                     std::min<Store::Duration>(left(), std::chrono::seconds(1)));
    return theirs.ok() && !kernel.empty() && *theirs == kernel;
  };

  auto connect_to = [&](int peer) -> StatusOr<Fd> {
    TRIBUTARY_ASSIGN_OR_RETURN(std::string where,
                               context.store->get(prefix + std::to_string(peer), left()));
    const size_t colon = where.rfind(':');
    sockaddr_in to{};
    to.sin_family = AF_INET;
    if (colon == std::string::npos ||
        inet_pton(AF_INET, where.substr(0, colon).c_str(), &to.sin_addr) != 1) {
      return invalid_argument("tcp-direct: rank " + std::to_string(peer) + " published '" + where +
                              "', not host:port");
    }
    to.sin_port =
        htons(static_cast<uint16_t>(std::strtoul(where.c_str() + colon + 1, nullptr, 10)));
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    // Linux bounds connect() by the send timeout too: within the deadline.
    const auto ms = std::max<int64_t>(1, left().count());
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    if (fd.get() >= 0) (void)setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (fd.get() < 0 || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      return unavailable(errno_text(
          ("tcp-direct: connecting to rank " + std::to_string(peer) + " at " + where).c_str()));
    }
    const int32_t me = rank;
    if (::send(fd.get(), &me, sizeof me, MSG_NOSIGNAL) != sizeof me) {
      return unavailable(errno_text("tcp-direct: greeting"));
    }
    tune(fd.get(), same_kernel(peer));
    return fd;
  };
  std::vector<Fd> accepted(static_cast<size_t>(n));
  auto accept_from = [&](int peer) -> Status {
    while (accepted[static_cast<size_t>(peer)].get() < 0) {
      if (!wait_fd(listener.get(), POLLIN, deadline)) {
        return deadline_exceeded("tcp-direct: rank " + std::to_string(peer) +
                                 " did not connect within 60 s");
      }
      Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return unavailable(errno_text("tcp-direct: accept"));
      }
      int32_t who = -1;
      if (!wait_fd(fd.get(), POLLIN, deadline) ||
          ::recv(fd.get(), &who, sizeof who, MSG_WAITALL) != sizeof who || who < 0 || who >= n) {
        continue;  // not one of ours
      }
      tune(fd.get(), same_kernel(who));
      accepted[static_cast<size_t>(who)] = std::move(fd);
    }
    return Status();
  };
  auto link = [&](int peer) -> StatusOr<Fd> {
    if (rank > peer) return connect_to(peer);
    TRIBUTARY_RETURN_IF_ERROR(accept_from(peer));
    return std::move(accepted[static_cast<size_t>(peer)]);
  };
  Links links;
  TRIBUTARY_ASSIGN_OR_RETURN(links.to_next, link(next));
  if (n > 2) {
    TRIBUTARY_ASSIGN_OR_RETURN(links.from_prev, link(prev));
  }
  return links;
}

}  // namespace

StatusOr<std::unique_ptr<Line>> tcp_reference(const BackendSpec& spec,
                                              const BackendContext& context) {
  bool message_buffers = false, splice = false;
  for (const auto& [key, value] : spec.options) {
    if (key == "buffers") {
      if (value != "cache" && value != "message") {
        return invalid_argument("buffers is cache or message, not '" + value + "'");
      }
      message_buffers = value == "message";
    } else if (key == "send") {
      if (value != "copy" && value != "splice") {
        return invalid_argument("send is copy or splice, not '" + value + "'");
      }
      splice = value == "splice";
    } else {
      return invalid_argument("unknown option '" + key + "' (buffers, send)");
    }
  }
  // send=splice: a 1 MiB pipe where the system allows it, as ring's zero-copy sends use.
  Fd pipe_read, pipe_write;
  size_t pipe_capacity = 0;
  if (splice) {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      return unavailable(errno_text("tcp-direct: pipe2 for send=splice"));
    }
    pipe_read = Fd(fds[0]);
    pipe_write = Fd(fds[1]);
    (void)::fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    const int capacity = ::fcntl(fds[1], F_GETPIPE_SZ);
    if (capacity <= 0) return unavailable(errno_text("tcp-direct: F_GETPIPE_SZ"));
    pipe_capacity = static_cast<size_t>(capacity);
  }
  if (context.world_size < 2 || !context.store) {
    return invalid_argument("it is for several processes (--np N, N >= 2)");
  }
  if (context.devices.size() != 1) {
    return invalid_argument(
        "it is for one replica per process (--replicas 1): it moves what "
        "the processes' ring moves, and local replicas are reduced before it");
  }
  if (!context.devices[0].is_cpu()) {
    return invalid_argument("it moves host memory, not " + context.devices[0].to_string());
  }
  // Every rank creates its references in the same order, so the n-th one meets under the same
  // keys everywhere.
  static int instance = 0;
  const std::string prefix = "bench/tcp-direct/" + std::to_string(instance++) + "/";
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  TRIBUTARY_ASSIGN_OR_RETURN(Links links, connect_ring(context, prefix, deadline));
  // (The runner checks that every rank made the line: Runner's made_everywhere.)
  return std::unique_ptr<Line>(new TcpReference(
      context.world_size, message_buffers, std::move(links.to_next), std::move(links.from_prev),
      std::move(pipe_read), std::move(pipe_write), pipe_capacity));
}

}  // namespace internal
}  // namespace tributary::bench
