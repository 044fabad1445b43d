// A client that writes arbitrary bytes to a server on 127.0.0.1 and reads what comes back for a
// moment (shared by the fuzz targets that reach a server through a real socket).
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tributary::fuzz {

// Sends `data` to 127.0.0.1:port, half-closes, and reads the answer until the server closes or
// `linger` passes. The server must survive anything; what it answers is not checked here.
inline void send_raw(uint16_t port, const uint8_t* data, size_t size,
                     std::chrono::milliseconds linger = std::chrono::milliseconds(50)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    const auto deadline = std::chrono::steady_clock::now() + linger;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (::poll(&p, 1, static_cast<int>(left.count()) + 1) <= 0) break;
      if (::recv(fd, buf, sizeof buf, 0) <= 0) break;
    }
  }
  ::close(fd);
}

}  // namespace tributary::fuzz
