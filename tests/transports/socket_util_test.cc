// Pure helpers of transports/socket/socket_util: interface-name grammar and address parsing.
#include "transports/socket/socket_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

namespace loom {
namespace {

TEST(MatchIfName, PrefixList) {
  EXPECT_TRUE(matchIfName("eth0", "eth"));
  EXPECT_TRUE(matchIfName("eth12", "eth"));
  EXPECT_TRUE(matchIfName("ib0", "eth,ib"));
  EXPECT_TRUE(matchIfName("ib0", "eth,,ib"));  // empty items are ignored
  EXPECT_FALSE(matchIfName("enp1s0", "eth,ib"));
  EXPECT_FALSE(matchIfName("eth0", ""));
  EXPECT_FALSE(matchIfName("et", "eth"));  // a prefix of the item is not a match
}

TEST(MatchIfName, Exclude) {
  EXPECT_FALSE(matchIfName("docker0", "^docker,lo"));
  EXPECT_FALSE(matchIfName("lo", "^docker,lo"));
  EXPECT_TRUE(matchIfName("eth0", "^docker,lo"));
  EXPECT_TRUE(matchIfName("eth0", "^"));  // excluding nothing keeps everything
}

TEST(MatchIfName, Exact) {
  EXPECT_TRUE(matchIfName("eth0", "=eth0"));
  EXPECT_FALSE(matchIfName("eth01", "=eth0"));
  EXPECT_FALSE(matchIfName("eth", "=eth0"));
  EXPECT_TRUE(matchIfName("ib1", "=eth0,ib1"));
  EXPECT_FALSE(matchIfName("ib10", "=eth0,ib1"));
}

TEST(MatchIfName, ExcludeExact) {
  EXPECT_FALSE(matchIfName("eth0", "^=eth0,eth1"));
  EXPECT_FALSE(matchIfName("eth1", "^=eth0,eth1"));
  EXPECT_TRUE(matchIfName("eth01", "^=eth0,eth1"));
  EXPECT_TRUE(matchIfName("eth2", "^=eth0,eth1"));
}

TEST(MatchIfName, PortSuffixIgnored) {
  EXPECT_TRUE(matchIfName("eth0", "eth0:1234"));
  EXPECT_TRUE(matchIfName("eth0", "=eth0:1234"));
}

TEST(ParseSockAddr, Ipv4) {
  auto r = parseSockAddr("127.0.0.1:5000");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().family(), AF_INET);
  EXPECT_EQ(r.value().port(), 5000);
  EXPECT_TRUE(r.value().isLoopback());
  EXPECT_EQ(r.value().toString(), "127.0.0.1:5000");

  auto o = parseSockAddr("192.0.2.7:65535");
  ASSERT_TRUE(o.isOk());
  EXPECT_FALSE(o.value().isLoopback());
  EXPECT_EQ(o.value().port(), 65535);
}

TEST(ParseSockAddr, Ipv6Brackets) {
  auto r = parseSockAddr("[::1]:6000");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().family(), AF_INET6);
  EXPECT_EQ(r.value().port(), 6000);
  EXPECT_TRUE(r.value().isLoopback());
  EXPECT_EQ(r.value().toString(), "[::1]:6000");

  auto g = parseSockAddr("[2001:db8::5]:80");
  ASSERT_TRUE(g.isOk()) << g.status().message();
  EXPECT_EQ(g.value().toString(), "[2001:db8::5]:80");
}

TEST(ParseSockAddr, HostName) {
  auto r = parseSockAddr("localhost:1234");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_TRUE(r.value().isLoopback());
  EXPECT_EQ(r.value().port(), 1234);
}

TEST(ParseSockAddr, BadInputs) {
  for (const char* bad :
       {"", "127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:80x", "[::1]", "[::1]80", "[::1:80", "::1:80", "1.2.3.4:5:6", "[]:80"}) {
    auto r = parseSockAddr(bad);
    EXPECT_FALSE(r.isOk()) << "'" << bad << "' parsed as " << r.value().toString();
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    }
  }
}

TEST(FindInterfaces, LoopbackByName) {
  auto lo = findInterfaces("=lo", AF_INET);
  ASSERT_FALSE(lo.empty()) << "no IPv4 loopback interface";
  EXPECT_EQ(lo[0].name, "lo");
  EXPECT_EQ(lo[0].addr.port(), 0);
  EXPECT_TRUE(lo[0].addr.isLoopback());
}

TEST(FindInterfaces, DefaultIsNeverEmpty) {
  // Everything but lo/docker, or lo as the fallback.
  EXPECT_FALSE(findInterfaces("", AF_UNSPEC).empty());
  EXPECT_TRUE(findInterfaces("=no-such-interface-xyz", AF_UNSPEC).empty());
}

TEST(FindInterfaces, FamilyFilter) {
  for (const auto& i : findInterfaces("", AF_INET)) EXPECT_EQ(i.addr.family(), AF_INET);
  for (const auto& i : findInterfaces("", AF_INET6)) EXPECT_EQ(i.addr.family(), AF_INET6);
}

TEST(SendvSome, GathersBuffers) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Fd a(sv[0]), b(sv[1]);
  char x[] = "hello ", y[] = "world";
  iovec iov[2] = {{x, 6}, {y, 5}};
  auto r = sendvSome(a.get(), iov, 2);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value(), 11u);
  char got[16] = {};
  auto g = recvSome(b.get(), got, sizeof(got));
  ASSERT_TRUE(g.isOk());
  EXPECT_EQ(std::string(got, g.value()), "hello world");
  b.reset();
  // Writing to a closed peer is a kRemote error, never SIGPIPE.
  Status st;
  for (int k = 0; k < 100 && st.isOk(); ++k) {
    auto w = sendvSome(a.get(), iov, 2);
    st = w.status();
  }
  EXPECT_EQ(st.code(), Code::kRemote) << st.message();
}

}  // namespace
}  // namespace loom
