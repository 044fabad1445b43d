// The TCP congestion-control rule of the TCP transport (transports/tcp/congestion.h), on real
// loopback connections and on a TcpTransport's own connections, and ring's tcp_congestion option.
#include "transports/tcp/congestion.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/tcp/tcp_transport.h"
#include "tributary/registry.h"
#include "tributary/store.h"

namespace tributary::transports {
namespace {

// A connected pair of TCP sockets on 127.0.0.1.
class LoopbackPair {
 public:
  LoopbackPair() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      if (listener >= 0) ::close(listener);
      return;
    }
    a_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(a_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      b_ = ::accept(listener, nullptr, nullptr);
    }
    ::close(listener);
  }
  ~LoopbackPair() {
    if (a_ >= 0) ::close(a_);
    if (b_ >= 0) ::close(b_);
  }
  bool ok() const { return a_ >= 0 && b_ >= 0; }
  int a() const { return a_; }
  int b() const { return b_; }

 private:
  int a_ = -1, b_ = -1;
};

TEST(TcpCongestion, LoopbackConnectionIsSameHost) {
  LoopbackPair p;
  ASSERT_TRUE(p.ok()) << "no loopback TCP connection";
  EXPECT_TRUE(same_host_connection(p.a()));
  EXPECT_TRUE(same_host_connection(p.b()));
  const int unconnected = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_FALSE(same_host_connection(unconnected));
  ::close(unconnected);
}

TEST(TcpCongestion, AutoTurnsBbrIntoRenoBetweenRanksOfOneHost) {
  LoopbackPair p;
  ASSERT_TRUE(p.ok()) << "no loopback TCP connection";
  if (const int err = set_congestion_control(p.a(), "bbr"); err != 0) {
    GTEST_SKIP() << "this kernel does not offer bbr to this process ("
                 << check_congestion_control("bbr") << ")";
  }
  ASSERT_EQ(congestion_control(p.a()), "bbr");
  EXPECT_EQ(apply_congestion_control(p.a(), "auto"), 0);
  EXPECT_EQ(congestion_control(p.a()), "reno");
  ASSERT_EQ(set_congestion_control(p.b(), "bbr"), 0);
  EXPECT_EQ(apply_congestion_control(p.b(), ""), 0);  // "" is auto too
  EXPECT_EQ(congestion_control(p.b()), "reno");
}

// The first IPv4 address of this machine that is not a loopback one ("" when there is none).
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto& a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &a, text, sizeof text) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// A peer on this kernel (the same boot id, as a rank in another network namespace of this machine
// publishes) gets reno under auto even where the addresses do not show it. Such an address pair is
// made here by a client bound to 127.0.0.1 that connects to this machine's own non-loopback
// address: its local and peer addresses differ and neither end it sees is loopback.
TEST(TcpCongestion, AutoTurnsBbrIntoRenoForAPeerOnThisKernelWhateverItsAddresses) {
  const std::string address = non_loopback_ipv4();
  if (address.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{}, from{};
  at.sin_family = from.sin_family = AF_INET;
  ASSERT_EQ(::inet_pton(AF_INET, address.c_str(), &at.sin_addr), 1);
  from.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof at;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at), 0) << address;
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len), 0);
  ASSERT_EQ(::bind(client, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&at), sizeof at), 0)
      << "127.0.0.1 -> " << address;
  const int server = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  ASSERT_GE(server, 0);
  if (set_congestion_control(client, "bbr") != 0) {
    ::close(client);
    ::close(server);
    GTEST_SKIP() << "this kernel does not offer bbr to this process ("
                 << check_congestion_control("bbr") << ")";
  }
  EXPECT_FALSE(same_host_connection(client)) << "127.0.0.1 -> " << address;
  EXPECT_EQ(apply_congestion_control(client, "auto"), 0);
  EXPECT_EQ(congestion_control(client), "bbr");  // nothing says the peer is on this kernel
  EXPECT_EQ(apply_congestion_control(client, "auto", /*same_machine=*/true), 0);
  EXPECT_EQ(congestion_control(client), "reno");
  ::close(client);
  ::close(server);
}

// The names auto replaces: the BBR family only (bbr2 and bbr3 cannot be set on this kernel, so
// the rule itself is checked).
TEST(TcpCongestion, AutoReplacesTheBbrFamilyOnly) {
  for (const char* name : {"bbr", "bbr2", "bbr3"}) EXPECT_TRUE(paces(name)) << name;
  for (const char* name : {"reno", "cubic", "dctcp", "vegas", "htcp", "", "xbbr"}) {
    EXPECT_FALSE(paces(name)) << name;
  }
}

TEST(TcpCongestion, AutoLeavesAlgorithmsThatDoNotPace) {
  LoopbackPair p;
  ASSERT_TRUE(p.ok()) << "no loopback TCP connection";
  // cubic where this process may choose it, else reno (always allowed).
  const std::string keep = set_congestion_control(p.a(), "cubic") == 0 ? "cubic" : "reno";
  ASSERT_EQ(set_congestion_control(p.a(), keep), 0);
  EXPECT_EQ(apply_congestion_control(p.a(), "auto"), 0);
  EXPECT_EQ(congestion_control(p.a()), keep);
}

TEST(TcpCongestion, AnExplicitChoiceIsSetOrRefused) {
  LoopbackPair p;
  ASSERT_TRUE(p.ok()) << "no loopback TCP connection";
  EXPECT_EQ(apply_congestion_control(p.a(), "reno"), 0);
  EXPECT_EQ(congestion_control(p.a()), "reno");
  EXPECT_NE(apply_congestion_control(p.a(), "no_such_algorithm"), 0);
  EXPECT_EQ(congestion_control(p.a()), "reno");

  EXPECT_EQ(check_congestion_control("auto"), "");
  EXPECT_EQ(check_congestion_control(""), "");
  EXPECT_EQ(check_congestion_control("reno"), "");
  const std::string why = check_congestion_control("no_such_algorithm");
  EXPECT_NE(why.find("'no_such_algorithm'"), std::string::npos) << why;
  EXPECT_NE(why.find("available: "), std::string::npos) << why;
  EXPECT_NE(why.find("reno"), std::string::npos) << why;  // the lists name what there is
}

// The algorithm of every connected TCP socket of this process (the store below is in memory, so
// they are the transports' connections).
std::vector<std::string> algorithms_of_connections() {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(dir)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (const std::string cc = congestion_control(fd); !cc.empty()) out.push_back(cc);
  }
  ::closedir(dir);
  return out;
}

// Two TcpTransports (ranks as threads) over 127.0.0.1 with `congestion`; returns the algorithms
// their connections run while both are alive.
std::vector<std::string> connect_two(const std::string& congestion) {
  MemoryStore store;
  TcpTransportOptions o;
  o.host = "127.0.0.1";
  o.timeout = std::chrono::seconds(20);
  o.congestion = congestion;
  std::unique_ptr<TcpTransport> t[2];
  std::thread other([&] {
    auto made = TcpTransport::create(store, 1, 2, o);
    if (made.ok()) t[1] = std::move(*made);
  });
  auto made = TcpTransport::create(store, 0, 2, o);
  other.join();
  EXPECT_TRUE(made.ok()) << made.status().message();
  EXPECT_TRUE(t[1] != nullptr);
  if (!made.ok() || t[1] == nullptr) return {};
  t[0] = std::move(*made);
  return algorithms_of_connections();
}

std::string system_default() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(TcpCongestion, TransportConnectionsBetweenRanksOfOneHostLeaveBbrByDefault) {
  if (system_default() != "bbr") {
    GTEST_SKIP() << "the system's TCP congestion control is '" << system_default()
                 << "', not bbr: auto changes nothing here";
  }
  const std::vector<std::string> seen = connect_two("auto");
  ASSERT_FALSE(seen.empty()) << "no connected TCP socket found";
  for (const std::string& cc : seen) EXPECT_EQ(cc, "reno");
}

TEST(TcpCongestion, TransportConnectionsTakeANamedAlgorithm) {
  // An algorithm other than the system's, so that only the option can have set it.
  std::string want;
  for (const char* c : {"reno", "cubic", "bbr"}) {
    if (c != system_default() && check_congestion_control(c).empty()) {
      want = c;
      break;
    }
  }
  if (want.empty()) {
    GTEST_SKIP() << "no algorithm other than the system's '" << system_default()
                 << "' may be chosen here";
  }
  const std::vector<std::string> seen = connect_two(want);
  ASSERT_FALSE(seen.empty()) << "no connected TCP socket found";
  for (const std::string& cc : seen) EXPECT_EQ(cc, want);
}

TEST(TcpCongestion, RingRefusesAnAlgorithmTheKernelRefuses) {
  BackendRegistry r = builtin_backends();
  BackendContext cpu;  // one process
  cpu.devices = {Device::cpu(0)};
  auto bad = r.create("ring:tcp_congestion=no_such_algorithm", cpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tcp_congestion=no_such_algorithm"), std::string::npos)
      << bad.status().message();
  auto good = r.create("ring:tcp_congestion=reno", cpu);
  EXPECT_TRUE(good.ok()) << good.status().message();
}

}  // namespace
}  // namespace tributary::transports
