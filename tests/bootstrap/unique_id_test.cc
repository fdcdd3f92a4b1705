#include <cstring>
#include <random>

#include "tests/bootstrap/test_util.h"

namespace loom {
namespace {

using testing::loopback;

TEST(UniqueId, RoundTripIpv4) {
  UniqueIdInfo in;
  in.root = loopback(4567);
  in.secret = 0x0123456789abcdefull;
  loomUniqueId id;
  packUniqueId(in, &id);
  auto out = unpackUniqueId(id);
  ASSERT_TRUE(out.isOk()) << out.status().message();
  EXPECT_EQ(out.value().root.toString(), "127.0.0.1:4567");
  EXPECT_EQ(out.value().root.family(), AF_INET);
  EXPECT_EQ(out.value().secret, in.secret);
}

TEST(UniqueId, RoundTripIpv6) {
  UniqueIdInfo in;
  auto a = parseSockAddr("[::1]:65535");
  ASSERT_TRUE(a.isOk()) << a.status().message();
  in.root = a.value();
  in.secret = ~0ull;
  loomUniqueId id;
  packUniqueId(in, &id);
  auto out = unpackUniqueId(id);
  ASSERT_TRUE(out.isOk()) << out.status().message();
  EXPECT_EQ(out.value().root.toString(), "[::1]:65535");
  EXPECT_EQ(out.value().secret, in.secret);
}

TEST(UniqueId, FromCreateRoot) {
  loomUniqueId id;
  SockAddr at = loopback();
  ASSERT_TRUE(createRootAndId(&id, &at).isOk());
  auto info = unpackUniqueId(id);
  ASSERT_TRUE(info.isOk()) << info.status().message();
  EXPECT_TRUE(info.value().root.isLoopback());
  EXPECT_NE(info.value().root.port(), 0);
  EXPECT_NE(info.value().secret, 0u);
  // Two roots get different secrets.
  loomUniqueId id2;
  ASSERT_TRUE(createRootAndId(&id2, &at).isOk());
  EXPECT_NE(unpackUniqueId(id2).value().secret, info.value().secret);
  // A given secret is used as is.
  loomUniqueId id3;
  ASSERT_TRUE(createRootAndId(&id3, &at, 42).isOk());
  EXPECT_EQ(unpackUniqueId(id3).value().secret, 42u);
}

void expectRejected(const loomUniqueId& id, const std::string& what) {
  auto r = unpackUniqueId(id);
  ASSERT_FALSE(r.isOk()) << "accepted " << what;
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << what;
  EXPECT_NE(r.status().message().find("unique id"), std::string::npos) << r.status().message();
}

TEST(UniqueId, RejectsGarbage) {
  loomUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  expectRejected(zero, "zeros");
  auto r = unpackUniqueId(zero);
  EXPECT_NE(r.status().message().find("magic"), std::string::npos) << r.status().message();

  std::mt19937 rng(7);
  for (int i = 0; i < 100; ++i) {
    loomUniqueId junk;
    for (auto& c : junk.internal) c = static_cast<char>(rng());
    expectRejected(junk, "random bytes");
  }

  UniqueIdInfo in;
  in.root = loopback(1234);
  in.secret = 99;
  loomUniqueId good;
  packUniqueId(in, &good);
  ASSERT_TRUE(unpackUniqueId(good).isOk());
  // Any single flipped bit in the used part, or any byte set in the unused part, is caught.
  for (size_t byte = 0; byte < sizeof(good.internal); ++byte) {
    loomUniqueId bad = good;
    bad.internal[byte] ^= 0x10;
    expectRejected(bad, "flipped byte " + std::to_string(byte));
  }
  loomUniqueId badVersion = good;
  badVersion.internal[4] = 9;
  auto v = unpackUniqueId(badVersion);
  ASSERT_FALSE(v.isOk());
  EXPECT_NE(v.status().message().find("version"), std::string::npos) << v.status().message();
  loomUniqueId badSum = good;
  badSum.internal[8] ^= 1;  // the secret
  auto s = unpackUniqueId(badSum);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.status().message().find("checksum"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace loom
