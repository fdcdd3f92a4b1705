// An external NCCL net plugin used as a Loom transport (transports/ncclnet/ncclnet_transport.h),
// tested with Loom's own libnccl-net-loom.so (over its socket transport on loopback): what is the
// importer's own (the plugin's properties at each ABI version, sizes an ABI cannot carry, loading
// errors, the selection of a plugin by LOOM_NET_PLUGIN and LOOM_NET). The transport contract at
// each ABI version is in net_conformance_test.cc. LOOM_TEST_NCCL_PLUGIN_PATH is the built library
// (CMake).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "tests/transports/net_backends.h"
#include "transports/ncclnet/ncclnet_transport.h"
#include "transports/select/select.h"

namespace loom {
namespace {

using namespace testing_util;  // NOLINT(build/namespaces): the transport tests' helpers

const char* const kPlugin = LOOM_TEST_NCCL_PLUGIN_PATH;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

void pluginEnv(ScopedEnv* env) { NcclPluginBackend::pluginEnv(env); }

class NcclNetImportTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string skip;
    Status st = b_.setUp(&skip);
    ASSERT_TRUE(st.isOk()) << st.message();
    t_ = b_.transport();
  }

  NcclPluginBackend b_{kPlugin, GetParam()};
  net::Transport* t_ = nullptr;
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

TEST_P(NcclNetImportTest, SizesTheAbiCannotCarryAreRefused) {
  Link l;
  ASSERT_TRUE(b_.open(&l).isOk());
  net::Properties p;
  ASSERT_TRUE(t_->getProperties(0, &p).isOk());
  const size_t tooBig = p.maxP2pBytes + 1;  // never touched: refused before any access
  char byte = 0;
  void* s = nullptr;
  Status st = t_->isend(l.send, &byte, tooBig, 1, nullptr, &s);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), std::to_string(tooBig))) << st.message();
  EXPECT_EQ(s, nullptr);
  void* data = &byte;
  int tag = 1;
  void* r = nullptr;
  st = t_->irecv(l.recv, 1, &data, &tooBig, &tag, nullptr, &r);
  EXPECT_FALSE(st.isOk());
  EXPECT_TRUE(contains(st.message(), std::to_string(tooBig))) << st.message();
  if (GetParam() == 8) {
    EXPECT_LE(p.maxP2pBytes, size_t(1) << 30) << "v8 carries at most 1 GiB (int sizes)";
  }
  roundTrip(l, 100, 100, 1, 1);  // the comm is still usable
  b_.close(&l);
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
