// The TCP congestion-control rule of the TCP transport (transports/tcp/congestion.h), on real
// loopback connections, and ring's tcp_congestion option.
#include "transports/tcp/congestion.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include "tributary/registry.h"

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
