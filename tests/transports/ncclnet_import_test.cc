// An external NCCL net plugin used as a Loom transport (transports/ncclnet/ncclnet_transport.h),
// tested with Loom's own libnccl-net-loom.so (over its socket transport on loopback) loaded
// through each ABI version it exports, and the selection of that plugin (LOOM_NET_PLUGIN,
// LOOM_NET). LOOM_TEST_NCCL_PLUGIN_PATH is the built library (CMake).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "tests/transports/socket_test_util.h"
#include "transports/ncclnet/ncclnet_transport.h"
#include "transports/select/select.h"

namespace loom {
namespace {

using net::Transport;
using testing_util::checkPattern;
using testing_util::closePair;
using testing_util::connectPair;
using testing_util::drive;
using testing_util::fillPattern;
using testing_util::Pair;
using testing_util::Req;
using testing_util::ScopedEnv;

const char* const kPlugin = LOOM_TEST_NCCL_PLUGIN_PATH;
constexpr unsigned char kGuard = 0xab;
constexpr size_t kGuardBytes = 4096;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The environment the plugin's own Loom reads when it first initialises (it keeps its choice for
// the life of the process): sockets on loopback.
void pluginEnv(ScopedEnv* env) {
  env->set("LOOM_SOCKET_IFNAME", "=lo");
  env->set("LOOM_NET", "");
  ::unsetenv("LOOM_NET");
  reloadParams();
}

class NcclNetImportTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    pluginEnv(&env_);
    auto t = loadNcclNetPlugin(kPlugin, GetParam());
    ASSERT_TRUE(t.isOk()) << t.status().message();
    t_ = std::move(t).value();
    Status st = connectPair(t_.get(), 0, &p_);
    ASSERT_TRUE(st.isOk()) << st.message();
  }
  void TearDown() override {
    if (t_) closePair(t_.get(), &p_);
  }

  Status isend(const void* data, size_t size, int tag, Req* r, void* mh = nullptr) {
    return t_->isend(p_.send, data, size, tag, mh, &r->handle);
  }
  Status irecv(void* data, size_t size, int tag, Req* r, void* mh = nullptr) {
    return t_->irecv(p_.recv, 1, &data, &size, &tag, mh ? &mh : nullptr, &r->handle);
  }

  // One message of `size` bytes into a buffer of `capacity`; content, sizes and guard checked.
  // registered: the buffers are registered by the test (else the adaptor registers them).
  void roundTrip(size_t size, size_t capacity, int tag, bool registered) {
    std::vector<unsigned char> src(size), dst(capacity + kGuardBytes, kGuard);
    fillPattern(src.data(), size, size + 7);
    void* smh = nullptr;
    void* rmh = nullptr;
    if (registered) {
      ASSERT_TRUE(t_->regMr(p_.send, src.data(), size, net::kPtrHost, &smh).isOk());
      ASSERT_TRUE(t_->regMr(p_.recv, dst.data(), capacity, net::kPtrHost, &rmh).isOk());
    }
    Req s, r;
    ASSERT_TRUE(irecv(dst.data(), capacity, tag, &r, rmh).isOk());
    ASSERT_TRUE(isend(src.data(), size, tag, &s, smh).isOk());
    ASSERT_NE(r.handle, nullptr);
    ASSERT_NE(s.handle, nullptr);
    ASSERT_TRUE(drive(t_.get(), {&s, &r})) << "size " << size << " did not complete";
    ASSERT_TRUE(s.status.isOk()) << s.status.message();
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    EXPECT_EQ(s.sizes[0], size);
    EXPECT_EQ(r.sizes[0], size);
    EXPECT_EQ(checkPattern(dst.data(), size, size + 7), -1) << "size " << size;
    for (size_t k = capacity; k < dst.size(); ++k)
      ASSERT_EQ(dst[k], kGuard) << "write past the buffer at " << k;
    if (registered) {
      // A flush of host memory: nothing to wait for, or a request that completes.
      Req f;
      void* data = dst.data();
      size_t got = size;
      Status st = t_->iflush(p_.recv, 1, &data, &got, &rmh, &f.handle);
      ASSERT_TRUE(st.isOk()) << st.message();
      if (f.handle != nullptr) {
        ASSERT_TRUE(drive(t_.get(), {&f}));
        ASSERT_TRUE(f.status.isOk()) << f.status.message();
      }
      EXPECT_TRUE(t_->deregMr(p_.send, smh).isOk());
      EXPECT_TRUE(t_->deregMr(p_.recv, rmh).isOk());
    }
  }

  ScopedEnv env_;
  std::unique_ptr<Transport> t_;
  Pair p_;
};

std::string versionName(const ::testing::TestParamInfo<int>& info) {
  return "v" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Abi, NcclNetImportTest, ::testing::Values(8, 9, 10, 11, 12), versionName);

TEST_P(NcclNetImportTest, NameAndProperties) {
  EXPECT_STREQ(t_->name(), "Loom");
  ASSERT_GE(t_->devices(), 1);
  net::Properties p;
  ASSERT_TRUE(t_->getProperties(0, &p).isOk());
  EXPECT_FALSE(p.name.empty());
  EXPECT_NE(p.ptrSupport & net::kPtrHost, 0);
  EXPECT_GE(p.maxRecvs, 8);  // Loom's socket transport groups 8
  EXPECT_GT(p.maxP2pBytes, size_t(16) << 20);
  EXPECT_LE(p.maxP2pBytes, size_t(INT_MAX));  // test() reports sizes as int
  EXPECT_FALSE(t_->getProperties(t_->devices(), &p).isOk());
}

TEST_P(NcclNetImportTest, Sizes) {
  for (size_t size :
       {size_t(0), size_t(1), size_t(4095), size_t(65536), size_t(1 << 20) + 3, size_t(16) << 20}) {
    SCOPED_TRACE(size);
    roundTrip(size, size, 3, /*registered=*/false);
    roundTrip(size, size, 4, /*registered=*/true);
  }
}

TEST_P(NcclNetImportTest, SmallerSendReportsActualSize) {
  roundTrip(1000, 1 << 20, 1, false);
  roundTrip(0, 100, 2, false);
  roundTrip(100000, 300000, 3, true);
}

TEST_P(NcclNetImportTest, ThirtyTwoInFlightBothWays) {
  constexpr int kMax = 32;
  constexpr size_t kSize = 10000;
  std::vector<std::vector<unsigned char>> src(kMax), dst(kMax);
  std::vector<Req> sends(kMax), recvs(kMax);
  for (int k = 0; k < kMax; ++k) {
    src[k].resize(kSize);
    dst[k].resize(kSize);
    fillPattern(src[k].data(), kSize, k);
    ASSERT_TRUE(isend(src[k].data(), kSize, k, &sends[k]).isOk());
    ASSERT_NE(sends[k].handle, nullptr) << "send " << k;
  }
  for (int k = 0; k < kMax; ++k) {
    ASSERT_TRUE(irecv(dst[k].data(), kSize, k, &recvs[k]).isOk());
    ASSERT_NE(recvs[k].handle, nullptr) << "recv " << k;
  }
  Req extraSend, extraRecv;
  std::vector<unsigned char> extra(kSize);
  ASSERT_TRUE(isend(extra.data(), kSize, 99, &extraSend).isOk());
  EXPECT_EQ(extraSend.handle, nullptr) << "33rd send was accepted";
  ASSERT_TRUE(irecv(extra.data(), kSize, 99, &extraRecv).isOk());
  EXPECT_EQ(extraRecv.handle, nullptr) << "33rd receive was accepted";
  std::vector<Req*> all;
  for (int k = 0; k < kMax; ++k) all.push_back(&sends[k]), all.push_back(&recvs[k]);
  ASSERT_TRUE(drive(t_.get(), all));
  for (int k = 0; k < kMax; ++k) {
    ASSERT_TRUE(sends[k].status.isOk()) << sends[k].status.message();
    ASSERT_TRUE(recvs[k].status.isOk()) << recvs[k].status.message();
    EXPECT_EQ(recvs[k].sizes[0], kSize);
    EXPECT_EQ(checkPattern(dst[k].data(), kSize, k), -1) << "message " << k;
  }
  roundTrip(10, 10, 5, false);  // the slots are free again
}

TEST_P(NcclNetImportTest, GroupedReceiveOfEight) {
  constexpr int kN = 8;
  const size_t caps[kN] = {0, 1, 4095, 65536 + 5, 200000, 17, size_t(1) << 20, 3};
  int tags[kN];
  size_t sent[kN];
  std::vector<std::vector<unsigned char>> src(kN), dst(kN);
  void* bufs[kN];
  for (int j = 0; j < kN; ++j) {
    tags[j] = 100 + j * 7;
    sent[j] = caps[j] - ((j % 2 && caps[j] > 0) ? 1 : 0);  // some shorter than their buffer
    src[j].resize(sent[j]);
    fillPattern(src[j].data(), sent[j], tags[j]);
    dst[j].assign(caps[j] + kGuardBytes, kGuard);
    bufs[j] = dst[j].data();
  }
  Req r;
  ASSERT_TRUE(t_->irecv(p_.recv, kN, bufs, caps, tags, nullptr, &r.handle).isOk());
  ASSERT_NE(r.handle, nullptr);
  const int order[kN] = {5, 2, 7, 0, 3, 6, 1, 4};
  std::vector<Req> s(kN);
  std::vector<Req*> all{&r};
  for (int k = 0; k < kN; ++k) {
    int j = order[k];
    ASSERT_TRUE(isend(src[j].data(), sent[j], tags[j], &s[k]).isOk());
    ASSERT_NE(s[k].handle, nullptr);
    all.push_back(&s[k]);
  }
  ASSERT_TRUE(drive(t_.get(), all));
  for (Req* q : all) ASSERT_TRUE(q->status.isOk()) << q->status.message();
  for (int j = 0; j < kN; ++j) {
    EXPECT_EQ(r.sizes[j], sent[j]) << "buffer " << j;
    EXPECT_EQ(checkPattern(dst[j].data(), sent[j], tags[j]), -1) << "buffer " << j;
    for (size_t k = caps[j]; k < dst[j].size(); ++k) ASSERT_EQ(dst[j][k], kGuard);
  }
  // More buffers than a grouped receive takes: refused, nothing posted.
  std::vector<void*> many(kN + 1, dst[0].data());
  std::vector<size_t> manyCaps(kN + 1, 0);
  std::vector<int> manyTags(kN + 1, 1);
  Req big;
  Status st = t_->irecv(p_.recv, kN + 1, many.data(), manyCaps.data(), manyTags.data(), nullptr,
                        &big.handle);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(big.handle, nullptr);
  EXPECT_TRUE(contains(st.message(), "9 buffers")) << st.message();
}

TEST_P(NcclNetImportTest, TruncatedReceiveFailsWithoutOverflow) {
  const size_t sent = 300000, cap = 100000;
  std::vector<unsigned char> src(sent, 0x11), dst(cap + kGuardBytes, kGuard);
  Req s, r;
  ASSERT_TRUE(irecv(dst.data(), cap, 4, &r).isOk());
  ASSERT_TRUE(isend(src.data(), sent, 4, &s).isOk());
  ASSERT_TRUE(drive(t_.get(), {&r}, testing_util::kTestDeadlineMs, {&s}));
  ASSERT_FALSE(r.status.isOk()) << "truncation not reported";
  const std::string& m = r.status.message();
  EXPECT_TRUE(contains(m, "message truncated")) << m;
  EXPECT_TRUE(contains(m, std::string("NCCL net plugin ") + kPlugin)) << m;
  EXPECT_TRUE(contains(m, "test failed")) << m;
  EXPECT_TRUE(contains(m, "ABI v" + std::to_string(GetParam()))) << m;
  for (size_t k = cap; k < dst.size(); ++k) ASSERT_EQ(dst[k], kGuard) << "overflow at " << k;
  closePair(t_.get(), &p_);  // before src goes: the send may still be in flight
}

TEST_P(NcclNetImportTest, CloseWithRequestsInFlight) {
  std::vector<unsigned char> src(4 << 20), dst(4 << 20);
  std::vector<Req> s(4), r(4);
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(irecv(dst.data(), dst.size(), k, &r[k]).isOk());
    ASSERT_TRUE(isend(src.data(), src.size(), k, &s[k]).isOk());
  }
  int done = 0;
  EXPECT_TRUE(t_->test(s[0].handle, &done, nullptr).isOk());
  EXPECT_TRUE(t_->test(r[0].handle, &done, nullptr).isOk());
  closePair(t_.get(), &p_);
  // The other order, with nothing tested at all.
  ASSERT_TRUE(connectPair(t_.get(), 0, &p_).isOk());
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(isend(src.data(), src.size(), k, &s[k]).isOk());
    ASSERT_TRUE(irecv(dst.data(), dst.size(), k, &r[k]).isOk());
  }
  EXPECT_TRUE(t_->closeRecv(p_.recv).isOk());
  p_.recv = nullptr;
  EXPECT_TRUE(t_->closeSend(p_.send).isOk());
  p_.send = nullptr;
  // A new pair on the same transport still works.
  ASSERT_TRUE(connectPair(t_.get(), 0, &p_).isOk());
  roundTrip(1000, 1000, 1, false);
}

// Loom's runtime accepts every peer on one listen comm (NCCL accepts once per listener).
TEST_P(NcclNetImportTest, SeveralAcceptsOnOneListener) {
  net::Handle h;
  void* lc = nullptr;
  ASSERT_TRUE(t_->listen(0, &h, &lc).isOk());
  void* sends[2] = {};
  void* recvs[2] = {};
  int accepted = 0;
  Deadline deadline(testing_util::kTestDeadlineMs);
  while ((sends[1] == nullptr || accepted < 2) && !deadline.expired()) {
    void** next = sends[0] == nullptr ? &sends[0] : &sends[1];
    if (*next == nullptr) {
      ASSERT_TRUE(t_->connect(0, h, next).isOk());
    }
    if (accepted < 2) {
      void* rc = nullptr;
      ASSERT_TRUE(t_->accept(lc, &rc).isOk());
      if (rc != nullptr) recvs[accepted++] = rc;
    }
  }
  ASSERT_FALSE(deadline.expired());
  EXPECT_TRUE(t_->closeListen(lc).isOk());
  // Which recv comm belongs to which send is the order of accept: check the set of payloads.
  int payload[2] = {1001, 2002}, got[2] = {0, 0};
  std::vector<Req> s(2), r(2);
  for (int k = 0; k < 2; ++k) {
    void* data = &got[k];
    size_t size = sizeof(int);
    int tag = 0;
    ASSERT_TRUE(t_->irecv(recvs[k], 1, &data, &size, &tag, nullptr, &r[k].handle).isOk());
    ASSERT_TRUE(t_->isend(sends[k], &payload[k], sizeof(int), 0, nullptr, &s[k].handle).isOk());
  }
  ASSERT_TRUE(drive(t_.get(), {&s[0], &s[1], &r[0], &r[1]}));
  for (Req& q : r) ASSERT_TRUE(q.status.isOk()) << q.status.message();
  EXPECT_EQ(got[0] + got[1], 3003);
  EXPECT_TRUE(got[0] == 1001 || got[0] == 2002) << got[0];
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(t_->closeSend(sends[k]).isOk());
    EXPECT_TRUE(t_->closeRecv(recvs[k]).isOk());
  }
}

TEST_P(NcclNetImportTest, SizesTheAbiCannotCarryAreRefused) {
  net::Properties p;
  ASSERT_TRUE(t_->getProperties(0, &p).isOk());
  const size_t tooBig = p.maxP2pBytes + 1;  // never touched: refused before any access
  char byte = 0;
  Req s, r;
  Status st = isend(&byte, tooBig, 1, &s);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), std::to_string(tooBig))) << st.message();
  EXPECT_EQ(s.handle, nullptr);
  st = irecv(&byte, tooBig, 1, &r);
  EXPECT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), std::to_string(tooBig))) << st.message();
  if (GetParam() == 8) {
    EXPECT_LE(p.maxP2pBytes, size_t(1) << 30) << "v8 carries at most 1 GiB (int sizes)";
  }
  roundTrip(100, 100, 1, false);  // the comm is still usable
}

// --- Loading errors and selection ------------------------------------------------------------

TEST(NcclNetImport, MissingLibraryIsNamed) {
  auto t = loadNcclNetPlugin("/nonexistent/dir/libnccl-net-nope.so");
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "/nonexistent/dir/libnccl-net-nope.so"))
      << t.status().message();
  // A bare name is also tried as libnccl-net-<name>.so, and both are named.
  t = loadNcclNetPlugin("loomtest-absent");
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "'loomtest-absent'")) << t.status().message();
  EXPECT_TRUE(contains(t.status().message(), "libnccl-net-loomtest-absent.so"))
      << t.status().message();
}

TEST(NcclNetImport, LibraryWithoutPluginSymbols) {
  auto t = loadNcclNetPlugin("libc.so.6");
  ASSERT_FALSE(t.isOk());
  const std::string m = t.status().message();
  EXPECT_TRUE(contains(m, "libc.so.6")) << m;
  EXPECT_TRUE(contains(m, "ncclNetPlugin_v12")) << m;
  EXPECT_TRUE(contains(m, "ncclNetPlugin_v8")) << m;
}

TEST(NcclNetImport, VersionsOutsideTheAbiAreRefused) {
  auto t = loadNcclNetPlugin(kPlugin, 7);
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "v7")) << t.status().message();
}

TEST(NcclNetImport, NewestVersionIsChosen) {
  ScopedEnv env;
  pluginEnv(&env);
  auto t = loadNcclNetPlugin(kPlugin);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  // The error text names the version in use: provoke one (a comm of the wrong kind).
  void* req = nullptr;
  Status st = t.value()->irecv(nullptr, 1, nullptr, nullptr, nullptr, nullptr, &req);
  EXPECT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), "ABI v12")) << st.message();
}

TEST(NcclNetImport, SelectedByLoomNetPlugin) {
  ScopedEnv env;
  pluginEnv(&env);
  env.set("LOOM_NET_PLUGIN", kPlugin);
  auto t = makeNetworkTransport(/*allowPlugin=*/true);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_STREQ(t.value()->name(), "Loom");
  // LOOM_NET naming the plugin's network, in any case.
  env.set("LOOM_NET", "LOOM");
  t = makeNetworkTransport(true);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_STREQ(t.value()->name(), "Loom");
  // A built-in network wins over the plugin.
  env.set("LOOM_NET", "socket");
  t = makeNetworkTransport(true);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_STRNE(t.value()->name(), "Loom");
  // Without allowPlugin (Loom's exported plugin choosing its own transport) the plugin is ignored
  // and LOOM_NET=loom means "automatic".
  env.set("LOOM_NET", "loom");
  t = makeNetworkTransport(false);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_STRNE(t.value()->name(), "Loom");
}

TEST(NcclNetImport, LoomNetNamingAnotherNetworkFails) {
  ScopedEnv env;
  pluginEnv(&env);
  {
    // The plugin's own Loom makes its choice once per process, with a sane environment.
    auto first = loadNcclNetPlugin(kPlugin);
    ASSERT_TRUE(first.isOk()) << first.status().message();
  }
  env.set("LOOM_NET_PLUGIN", kPlugin);
  env.set("LOOM_NET", "AWS Libfabric");
  auto t = makeNetworkTransport(true);
  ASSERT_FALSE(t.isOk());
  const std::string m = t.status().message();
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(m, "LOOM_NET=AWS Libfabric")) << m;
  EXPECT_TRUE(contains(m, "'Loom'")) << m;
  EXPECT_TRUE(contains(m, kPlugin)) << m;
  // Without a plugin, a name that is not a built-in network is an error too.
  ::unsetenv("LOOM_NET_PLUGIN");
  reloadParams();
  t = makeNetworkTransport(true);
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "LOOM_NET_PLUGIN")) << t.status().message();
}

TEST(NcclNetImport, BadPluginPathFailsSelection) {
  ScopedEnv env;
  pluginEnv(&env);
  env.set("LOOM_NET_PLUGIN", "/nonexistent/libnccl-net-x.so");
  auto t = makeNetworkTransport(true);
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "/nonexistent/libnccl-net-x.so"))
      << t.status().message();
}

// --- A broken plugin (fake_nccl_net_plugin.c, network "Fake") ---------------------------------

const char* const kFake = LOOM_TEST_FAKE_NCCL_PLUGIN_PATH;

TEST(NcclNetImport, FailingInitIsNamedWithWhatThePluginSaid) {
  ScopedEnv env;
  env.set("LOOMTEST_FAKE_NET_MODE", "init-fails");
  auto t = loadNcclNetPlugin(kFake);
  ASSERT_FALSE(t.isOk());
  const std::string m = t.status().message();
  EXPECT_EQ(t.status().code(), Code::kSystem);
  EXPECT_TRUE(contains(m, kFake)) << m;
  EXPECT_TRUE(contains(m, "'Fake'")) << m;
  EXPECT_TRUE(contains(m, "init failed: ncclSystemError (2)")) << m;
  EXPECT_TRUE(contains(m, "it said: fake: no provider found (42)")) << m;
}

TEST(NcclNetImport, PluginWithoutDevicesIsRefused) {
  ScopedEnv env;
  env.set("LOOMTEST_FAKE_NET_MODE", "no-devices");
  auto t = loadNcclNetPlugin(kFake);
  ASSERT_FALSE(t.isOk());
  const std::string m = t.status().message();
  EXPECT_TRUE(contains(m, "network 'Fake'")) << m;
  EXPECT_TRUE(contains(m, "0 devices")) << m;
}

TEST(NcclNetImport, NullRequiredMembersAreNamed) {
  auto t = loadNcclNetPlugin(kFake, 9);
  ASSERT_FALSE(t.isOk());
  const std::string m = t.status().message();
  EXPECT_TRUE(contains(m, "ncclNetPlugin_v9")) << m;
  EXPECT_TRUE(contains(m, "isend, test")) << m;
  // v10 is not exported at all.
  t = loadNcclNetPlugin(kFake, 10);
  ASSERT_FALSE(t.isOk());
  EXPECT_TRUE(contains(t.status().message(), "ncclNetPlugin_v10")) << t.status().message();
}

TEST(NcclNetImport, FailingCallNamesPluginCallAndResult) {
  ScopedEnv env;
  env.set("LOOMTEST_FAKE_NET_MODE", "");
  auto t = loadNcclNetPlugin(kFake);
  ASSERT_TRUE(t.isOk()) << t.status().message();  // v11 is complete
  EXPECT_STREQ(t.value()->name(), "Fake");
  net::Properties p;
  ASSERT_TRUE(t.value()->getProperties(0, &p).isOk());
  EXPECT_EQ(p.name, "fake0");
  EXPECT_EQ(p.maxP2pBytes, size_t(1) << 20);
  EXPECT_EQ(p.speedMbps, 1000);
  net::Handle h;
  void* lc = nullptr;
  Status st = t.value()->listen(0, &h, &lc);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_EQ(lc, nullptr);
  EXPECT_TRUE(contains(st.message(), "ABI v11): listen failed: ncclInternalError (3)"))
      << st.message();
  EXPECT_TRUE(contains(st.message(), "it said: fake: listen refused on device 0")) << st.message();
  // LOOM_NET selects a plugin by its own network name only.
  env.set("LOOM_NET_PLUGIN", kFake);
  env.set("LOOM_NET", "fake");
  auto chosen = makeNetworkTransport(true);
  ASSERT_TRUE(chosen.isOk()) << chosen.status().message();
  EXPECT_STREQ(chosen.value()->name(), "Fake");
}

TEST(NcclNetImport, PluginLogLinesReachLoomsLogAtTheirLevel) {
  ScopedEnv env;
  env.set("LOOMTEST_FAKE_NET_MODE", "");
  env.set("LOOM_DEBUG", "INFO");
  env.set("LOOM_DEBUG_SUBSYS", "NET");
  for (bool info : {true, false}) {
    SCOPED_TRACE(info ? "LOOM_DEBUG=INFO" : "LOOM_DEBUG=WARN");
    if (!info) env.set("LOOM_DEBUG", "WARN");
    ::testing::internal::CaptureStderr();
    auto t = loadNcclNetPlugin(kFake);
    net::Handle h;
    void* lc = nullptr;
    Status st = t.isOk() ? t.value()->listen(0, &h, &lc) : t.status();
    const std::string out = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(t.isOk()) << t.status().message();
    EXPECT_FALSE(st.isOk());
    EXPECT_EQ(contains(out, "INFO NET net plugin: fake: init, mode 'default'"), info) << out;
    EXPECT_TRUE(contains(out, "WARN  net plugin: fake: listen refused on device 0")) << out;
  }
}

}  // namespace
}  // namespace loom
