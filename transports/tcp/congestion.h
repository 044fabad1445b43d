// TCP congestion control of tributary's TCP data connections (TcpTransport), header-only so that
// tributary-bench's loopback ceiling sets up its sockets by the same rule and measures what the
// transport gets.
//
// "auto" (the default): a connection that never leaves this machine's kernel and whose algorithm
// paces its sending (bbr, and its successors bbr2 and bbr3 where a kernel has them) switches to
// reno; every other connection keeps the system's choice (net.ipv4.tcp_congestion_control), which
// is the administrator's for the real network. A connection stays in the kernel when its two ends
// are addresses of this host (loopback, or a rank of this host reached at its own address, as with
// ring:intra_host=net), or when the caller knows that the peer runs on the same kernel (the same
// boot id: containers or network namespaces of one machine, joined by veths and a bridge). BBR
// paces each connection to its estimate of the path's bandwidth, and between two ranks of one host,
// whose traffic comes in bursts with idle gaps, that estimate held them to about the loopback
// "ceiling" the bench printed: tributary-bench --np 2 --backend ring:intra_host=net on a 2-vCPU
// VM whose default is bbr, float32 sum in place, interleaved: 1 MiB (the first size after
// connecting) 1.8-2.4 GB/s under bbr against 3.6-3.9 under reno (cubic 3.3-3.7); a sweep from
// 4 KiB to 64 MiB, 4 MiB 1.5-2.1 against 2.4-3.7. On a lossless same-host path reno and cubic
// behave alike; reno is the one every process may choose without CAP_NET_ADMIN.
//
// Between two network namespaces of one machine (bench/multihost.sh's "hosts": veths into a
// bridge, as between containers or pods of one node), bbr held the ring, 2 "hosts" x 1 process,
// float32 sum in place, to 1.3-1.4 GB/s at 1 MiB and 0.5 at 4 MiB, against 4.1-4.3 and 3.8-3.9
// under reno (cubic: 2.1-2.4 and 1.0-1.6).
//
// Any other value names the algorithm for every connection (checked when the backend is made).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "core/kernel_id.h"

namespace tributary::transports {

// The congestion control algorithm of socket `fd` ("" when it cannot be read).
inline std::string congestion_control(int fd) {
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

// Sets `algorithm` on socket `fd`: 0, or the errno.
inline int set_congestion_control(int fd, const std::string& algorithm) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(),
                   static_cast<socklen_t>(algorithm.size())) != 0) {
    return errno;
  }
  return 0;
}

// Whether connected socket `fd` joins two addresses of this host: its peer is a loopback address or
// its own local address (the kernel answers a connection to one of its addresses from that same
// address).
inline bool same_host_connection(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof local, plen = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
      local.ss_family != peer.ss_family) {
    return false;
  }
  if (peer.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local).sin_addr;
    const auto& p = reinterpret_cast<const sockaddr_in&>(peer).sin_addr;
    return (ntohl(p.s_addr) >> 24) == 127 || l.s_addr == p.s_addr;
  }
  if (peer.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local).sin6_addr;
    const auto& p = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&p) || std::memcmp(&l, &p, sizeof p) == 0;
  }
  return false;
}

// Whether `algorithm` is one that auto replaces between ranks of one host: the BBR family, which
// paces (bbr; bbr2 and bbr3 in kernels that carry them, e.g. Google's and some distributions').
inline bool paces(const std::string& algorithm) { return algorithm.rfind("bbr", 0) == 0; }

// Applies `choice` ("auto", "" = auto, or an algorithm) to connected socket `fd`: 0, or the errno
// of an explicit choice the kernel refused (auto never fails: a refused switch keeps the
// algorithm). `same_machine`: the peer is known to run on this kernel (internal::kernel_id(),
// core/kernel_id.h).
inline int apply_congestion_control(int fd, const std::string& choice, bool same_machine = false) {
  if (!choice.empty() && choice != "auto") return set_congestion_control(fd, choice);
  if ((same_machine || same_host_connection(fd)) && paces(congestion_control(fd))) {
    (void)set_congestion_control(fd, "reno");
  }
  return 0;
}

// An error message when `choice` cannot be set on a TCP socket of this process, else "".
inline std::string check_congestion_control(const std::string& choice) {
  if (choice.empty() || choice == "auto") return "";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";  // nothing to check against; connections will tell
  const int err = set_congestion_control(fd, choice);
  ::close(fd);
  if (err == 0) return "";
  auto read_line = [](const char* path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line.empty() ? std::string("?") : line;
  };
  return "the kernel refused TCP congestion control '" + choice + "' (" + std::strerror(err) +
         "); available: " + read_line("/proc/sys/net/ipv4/tcp_available_congestion_control") +
         "; allowed without CAP_NET_ADMIN: " +
         read_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control") +
         " (a module such as tcp_bbr may need loading), or use auto";
}

}  // namespace tributary::transports
