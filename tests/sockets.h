// Sockets for tests that hand a server its listening socket (TRIBUTARY_STORE_FD), as tributary-run
// does.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace tributary::testing {

// A socket listening on every interface at `*port` (0: a free port, written back), inheritable
// (no close-on-exec), or -1 with errno set.
inline int listening_socket(std::uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(*port);
  socklen_t len = sizeof a;
  const int one = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// A port of 127.0.0.1 that nobody listens on, kept so while this lives: a socket bound to it with
// SO_REUSEADDR but not listening. Connections to it are refused, the kernel gives it to no other
// bind(0) or connect(), and a server that sets SO_REUSEADDR too (TcpStore's does) can still bind
// and listen on it. For tests of a client that tries before its server exists, or of one that never
// does, without a window in which another process (a parallel test) could take the port. port()
// is 0 when no socket could be bound.
class ReservedPort {
 public:
  ReservedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const int one = 1;
    if (fd_ >= 0 && ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~ReservedPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

}  // namespace tributary::testing
