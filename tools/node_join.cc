// The launchers' join (see node_join.h). One thread, poll() with deadlines everywhere.
#include "tools/node_join.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "tools/fd.h"

namespace tributary::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr std::string_view kHello = "tributary-run/1";
constexpr size_t kMaxLine = 256;
// How long node 0 waits for a node to hang up after "ok" (so the TIME_WAIT lands on that side and
// the master port is free for the chief's store at once).
constexpr Millis kHangUpWait{1000};

using Socket = Fd;

int millis_until(Clock::time_point t) {
  auto ms = std::chrono::duration_cast<Millis>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms + 1, 0, 1000));
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void send_line(const Socket& s, const std::string& line) {
  std::string text = line + "\n";  // a few bytes into an empty socket buffer: never blocks
  [[maybe_unused]] ssize_t n = ::send(s.get(), text.data(), text.size(), MSG_NOSIGNAL);
}

std::string where(const JoinOptions& o) {
  const bool v6 = o.master_addr.find(':') != std::string::npos;
  return (v6 ? "[" + o.master_addr + "]" : o.master_addr) + ":" + std::to_string(o.master_port);
}

std::string command_hint(const JoinOptions& o) {
  return "tributary-run --nnodes " + std::to_string(o.nnodes) + " --node-rank K --nproc-per-node " +
         std::to_string(o.nproc_per_node) + " --master-addr " + o.master_addr +
         " --master-port " + std::to_string(o.master_port);
}

// Reads what is available into `line` (up to '\n'); nullopt while incomplete, "" on EOF/error.
std::optional<std::string> read_line(const Socket& s, std::string& line, bool& closed) {
  char buf[kMaxLine];
  for (;;) {
    ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
    if (n <= 0) {
      closed = true;
      return std::nullopt;
    }
    line.append(buf, static_cast<size_t>(n));
    if (size_t nl = line.find('\n'); nl != std::string::npos) return line.substr(0, nl);
    if (line.size() > kMaxLine) {
      closed = true;
      return std::nullopt;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Node 0

Socket listen_on(int port, std::string& error) {
  // Dual-stack where IPv6 exists, else IPv4: the other nodes may name us either way.
  for (int family : {AF_INET6, AF_INET}) {
    Socket s(::socket(family, SOCK_STREAM, 0));
    if (!s.open()) continue;
    int one = 1, zero = 0;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t len;
    if (family == AF_INET6) {
      ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in);
    }
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(s.get(), 128) != 0) {
      error = "cannot listen on port " + std::to_string(port) + " for the other nodes: " +
              std::strerror(errno) + " (is another job using it? choose another --master-port)";
      if (errno == EADDRINUSE) return Socket();
      continue;
    }
    set_nonblocking(s.get());
    return s;
  }
  return Socket();
}

struct Peer {
  Socket socket;
  std::string line;
  int node_rank = -1;  // once its hello is read and valid
};

// Checks one hello line; returns the node rank, or sets `why`.
int check_hello(const JoinOptions& o, const std::string& line, std::string& why) {
  int node = -1, nnodes = -1, nproc = -1;
  char magic[32] = "";
  if (std::sscanf(line.c_str(), "%31s node_rank=%d nnodes=%d nproc_per_node=%d", magic, &node,
                  &nnodes, &nproc) != 4 ||
      kHello != magic) {
    why = "a connection to the master port that is not a tributary-run node said '" +
          line.substr(0, 80) + "'";
    return -1;
  }
  const std::string who = "node " + std::to_string(node);
  if (nnodes != o.nnodes) {
    why = who + " was started with --nnodes " + std::to_string(nnodes) + ", node 0 with " +
          std::to_string(o.nnodes) + "; give every node the same --nnodes";
  } else if (nproc != o.nproc_per_node) {
    why = who + " was started with --nproc-per-node " + std::to_string(nproc) + ", node 0 with " +
          std::to_string(o.nproc_per_node) + "; give every node the same --nproc-per-node";
  } else if (node < 1 || node >= o.nnodes) {
    why = "a node joined with --node-rank " + std::to_string(node) + "; the others need 1 to " +
          std::to_string(o.nnodes - 1) + " (node 0 is the one at --master-addr)";
  }
  return why.empty() ? node : -1;
}

bool host_join(const JoinOptions& o, std::string& error) {
  const auto deadline = Clock::now() + o.timeout;
  Socket listener = listen_on(o.master_port, error);
  if (!listener.open()) return false;
  std::vector<Peer> peers;
  auto fail_all = [&](const std::string& why) {
    for (const Peer& p : peers) {
      if (p.socket.open()) send_line(p.socket, "error " + why);
    }
    error = why;
    return false;
  };
  auto joined = [&] {
    return static_cast<int>(std::count_if(peers.begin(), peers.end(), [](const Peer& p) {
      return p.socket.open() && p.node_rank > 0;
    }));
  };
  while (joined() < o.nnodes - 1) {
    if (Clock::now() >= deadline) {
      std::string missing;
      int count = 0;
      for (int k = 1; k < o.nnodes; ++k) {
        if (std::none_of(peers.begin(), peers.end(),
                         [&](const Peer& p) { return p.socket.open() && p.node_rank == k; })) {
          missing += (count++ ? ", " : "") + std::to_string(k);
        }
      }
      return fail_all((count == 1 ? "node " : "nodes ") + missing + " of " +
                      std::to_string(o.nnodes) + " did not join within --join-timeout " +
                      o.timeout_text + "; start `" + command_hint(o) +
                      " ...` on each host (K = its node rank), or raise --join-timeout");
    }
    std::vector<pollfd> fds = {{listener.get(), POLLIN, 0}};
    for (const Peer& p : peers) fds.push_back({p.socket.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), millis_until(deadline)) <= 0) continue;
    for (size_t i = 0; i < peers.size(); ++i) {
      Peer& p = peers[i];
      if (fds[i + 1].revents == 0 || !p.socket.open()) continue;
      bool closed = false;
      std::optional<std::string> line = read_line(p.socket, p.line, closed);
      if (closed) {
        p.socket.reset();  // gone before or after its hello; a node that comes back may retry
        continue;
      }
      if (!line || p.node_rank > 0) continue;
      std::string why;
      const int node = check_hello(o, *line, why);
      if (node < 0) {
        send_line(p.socket, "error " + why);
        p.socket.reset();
        if (line->starts_with(kHello)) return fail_all(why);  // a real node, misconfigured
        continue;  // a stranger: ignore it
      }
      for (const Peer& q : peers) {
        if (&q != &p && q.socket.open() && q.node_rank == node) {
          return fail_all("two nodes joined with --node-rank " + std::to_string(node) +
                          "; give each host its own node rank");
        }
      }
      p.node_rank = node;
    }
    if (fds[0].revents != 0) {
      while (peers.size() < 4096) {
        Socket s(::accept(listener.get(), nullptr, nullptr));
        if (!s.open()) break;
        set_nonblocking(s.get());
        peers.push_back(Peer{std::move(s), "", -1});
      }
    }
    std::erase_if(peers, [](const Peer& p) { return !p.socket.open(); });
  }
  listener.reset();  // the chief's store takes the port over
  for (const Peer& p : peers) {
    if (p.socket.open()) send_line(p.socket, "ok");
  }
  const auto hang_up = Clock::now() + kHangUpWait;
  for (Peer& p : peers) {
    if (!p.socket.open()) continue;
    pollfd fd{p.socket.get(), POLLIN, 0};
    while (Clock::now() < hang_up && ::poll(&fd, 1, millis_until(hang_up)) >= 0) {
      bool closed = false;
      std::string ignored;
      read_line(p.socket, ignored, closed);
      if (closed) break;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Nodes 1..N-1

// One non-blocking connection attempt to every address of the master, bounded by `until`.
Socket try_connect(const JoinOptions& o, Clock::time_point until, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(o.master_port);
  if (int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
    why = std::string("cannot resolve --master-addr ") + o.master_addr + ": " + gai_strerror(rc);
    return Socket();
  }
  Socket result;
  for (addrinfo* a = found; a != nullptr && !result.open(); a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (!s.open()) continue;
    set_nonblocking(s.get());
    int rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd fd{s.get(), POLLOUT, 0};
      while (Clock::now() < until && (rc = ::poll(&fd, 1, millis_until(until))) == 0) {
      }
      int err = rc > 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof err;
      if (rc > 0) ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      rc = err == 0 ? 0 : -1;
    }
    if (rc == 0) {
      result = std::move(s);
    } else {
      why = std::strerror(errno);
    }
  }
  ::freeaddrinfo(found);
  return result;
}

bool join_as_node(const JoinOptions& o, std::string& error) {
  const auto deadline = Clock::now() + o.timeout;
  std::string why = "not tried";
  for (;;) {
    Socket s = try_connect(o, std::min(deadline, Clock::now() + Millis(2000)), why);
    if (s.open()) {
      send_line(s, std::string(kHello) + " node_rank=" + std::to_string(o.node_rank) +
                       " nnodes=" + std::to_string(o.nnodes) +
                       " nproc_per_node=" + std::to_string(o.nproc_per_node));
      // Node 0 answers by its own deadline, which ends before ours counted from now.
      const auto answer_by = Clock::now() + o.timeout + Millis(5000);
      std::string line;
      bool closed = false;
      while (Clock::now() < answer_by) {
        pollfd fd{s.get(), POLLIN, 0};
        if (::poll(&fd, 1, millis_until(answer_by)) <= 0) continue;
        std::optional<std::string> got = read_line(s, line, closed);
        if (got == "ok") return true;
        if (got && got->starts_with("error ")) {
          error = "node 0 (" + where(o) + "): " + got->substr(6);
          return false;
        }
        if (got || closed) break;
      }
      error = "node 0 at " + where(o) +
              (closed ? " hung up without an answer" : " did not answer within the join timeout") +
              "; is tributary-run --node-rank 0 listening there, and not another program?";
      return false;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(Millis(250), deadline - Clock::now()));
  }
  error = "could not reach node 0 (tributary-run --node-rank 0) at " + where(o) +
          " within --join-timeout " + o.timeout_text + " (" + why +
          "); is it running there with the same --master-addr and --master-port, and is the port "
          "open? raise --join-timeout to wait longer";
  return false;
}

}  // namespace

bool join_nodes(const JoinOptions& options, std::string& error) {
  if (options.nnodes <= 1) return true;
  return options.node_rank == 0 ? host_join(options, error) : join_as_node(options, error);
}

}  // namespace tributary::tools
