// The ring transport's data path after the handshake (transports/tcp/tcp_transport.cc, tcp_wire.h):
// arbitrary bytes in place of a peer's frames. Each input gets a fresh two-rank group on loopback
// without a secret (so no MAC stands in front of the frame parser): rank 1 connects through a relay
// that passes the handshake through untouched, then sends the input to rank 0 instead of anything
// rank 1 says, and hangs up. Rank 0 has posted a 4 KiB receive from rank 1; it must end with the
// data (the input was a well-formed frame for it) or with an error, within 5 s: a crash, a hang, a
// write past the posted buffer (AddressSanitizer) or a success with bytes that were not sent is a
// finding. The corpus holds a well-formed frame, a striped one, an abort and truncated variants.
// FUZZ_RING_FRAMES_VERBOSE=1 prints what each input ended in.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/tcp/tcp_transport.h"
#include "transports/tcp/tcp_wire.h"
#include "tributary/store.h"

namespace {

using tributary::transports::TcpTransport;
using tributary::transports::TcpTransportOptions;
namespace wire = tributary::transports::wire;
using Clock = std::chrono::steady_clock;

constexpr size_t kReceiveBytes = 4096;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "ring frames: %s\n", what.c_str());
  std::abort();
}

// A listening socket on 127.0.0.1 with an ephemeral port.
int listen_here(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof at;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 ||
      ::listen(fd, 4) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    finding("cannot listen on 127.0.0.1");
  }
  *port = ntohs(at.sin_port);
  return fd;
}

// Retries briefly when the kernel is out of local ports or interrupted (thousands of connections a
// run leave many in TIME_WAIT: one CI run of 10 s failed here once, with no errno to tell why).
int connect_to(uint16_t port) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) finding(std::string("cannot make a socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0) return fd;
    err = errno;
    ::close(fd);
    if (err != EADDRNOTAVAIL && err != EAGAIN && err != EINTR) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  finding(std::string("cannot connect to rank 0: ") + std::strerror(err));
}

// Moves exactly n bytes from one socket to the other (a handshake message), within 5 s.
bool pass(int from, int to, size_t n) {
  std::vector<char> buf(n);
  size_t got = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (got < n && Clock::now() < deadline) {
    pollfd p{from, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t r = ::recv(from, buf.data() + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  if (got < n) return false;
  size_t sent = 0;
  while (sent < n) {
    const ssize_t w = ::send(to, buf.data() + sent, n - sent, MSG_NOSIGNAL);
    if (w <= 0) return false;
    sent += static_cast<size_t>(w);
  }
  return true;
}

TcpTransportOptions options() {
  TcpTransportOptions o;
  o.host = "127.0.0.1";
  o.cluster_id = "fuzz-frames";
  o.timeout = std::chrono::seconds(10);
  o.poll_before_sleep = std::chrono::nanoseconds(0);
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tributary::MemoryStore store;
  const TcpTransportOptions o = options();
  std::unique_ptr<TcpTransport> rank0, rank1;
  std::string setup0, setup1;
  std::thread first([&] {
    auto t = TcpTransport::create(store, 0, 2, o);
    if (t.ok()) rank0 = std::move(t).value();
    else setup0 = t.status().to_string();
  });
  // Rank 1 is sent to the relay: rank 0's address is replaced before rank 1 reads it.
  auto real = store.get("addr/0", std::chrono::seconds(10));
  if (!real.ok()) finding("rank 0 published no address: " + real.status().to_string());
  const uint16_t rank0_port =
      static_cast<uint16_t>(std::stoi(real->substr(real->rfind(':') + 1)));
  uint16_t relay_port = 0;
  const int relay = listen_here(&relay_port);
  if (!store.set("addr/0", "127.0.0.1:" + std::to_string(relay_port)).ok()) finding("store set");
  std::thread second([&] {
    auto t = TcpTransport::create(store, 1, 2, o);
    if (t.ok()) rank1 = std::move(t).value();
    else setup1 = t.status().to_string();
  });
  // libFuzzer's own timers can interrupt the accept (EINTR): that is not rank 1 failing to come.
  int from1 = -1;
  do {
    from1 = ::accept4(relay, nullptr, nullptr, SOCK_CLOEXEC);
  } while (from1 < 0 && errno == EINTR);
  const int accept_errno = errno;
  ::close(relay);
  if (from1 < 0) {
    finding(std::string("rank 1 did not connect to the relay: ") + std::strerror(accept_errno));
  }
  const int to0 = connect_to(rank0_port);
  const bool handshake = pass(from1, to0, sizeof(wire::Hello)) &&
                         pass(to0, from1, sizeof(wire::HelloAck)) &&
                         pass(from1, to0, sizeof(wire::Auth)) &&
                         pass(to0, from1, sizeof(wire::Verdict));
  first.join();
  second.join();
  if (!handshake || !rank0 || !rank1) {
    finding("the untouched handshake did not set the pair up: " + setup0 + " / " + setup1);
  }

  // Rank 0 waits for 4 KiB of all_reduce #1 from rank 1; the input arrives instead.
  tributary::algorithms::MessageTag tag;
  tag.sequence = 1;
  tag.count = kReceiveBytes / 4;
  std::vector<std::byte> buffer(kReceiveBytes, std::byte{0x5a});
  auto request = rank0->irecv(1, tag, buffer);
  size_t sent = 0;
  while (sent < size) {
    const ssize_t w = ::send(to0, data + sent, size - sent, MSG_NOSIGNAL);
    if (w <= 0) break;
    sent += static_cast<size_t>(w);
  }
  ::shutdown(to0, SHUT_WR);
  const auto start = Clock::now();
  tributary::Status s =
      request.ok() ? rank0->wait(*request, start + std::chrono::seconds(5)) : request.status();
  if (Clock::now() - start > std::chrono::seconds(6)) finding("the receive overran its deadline");
  static const bool verbose = std::getenv("FUZZ_RING_FRAMES_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "ring frames: %zu bytes: %s\n", size, s.to_string().c_str());
  if (s.ok()) {
    // Only bytes of the input can have landed: a frame header, then the payload.
    if (size < sizeof(wire::FrameHeader) + kReceiveBytes ||
        std::memcmp(buffer.data(), data + sizeof(wire::FrameHeader), kReceiveBytes) != 0) {
      finding("a receive completed with bytes that were not sent as its payload");
    }
  } else if (s.code() == tributary::StatusCode::kDeadlineExceeded) {
    finding("the peer hung up, yet the receive waited out its deadline: " + s.to_string());
  }
  ::close(to0);
  ::close(from1);
  rank1.reset();
  rank0.reset();
  return 0;
}
