// The NCCL tuner plugin driven as NCCL 2.28 drives it: dlopen the library (libnccl-tuner-loom.so,
// NCCL_TUNER_PLUGIN=loom, or libnccl-net-loom.so, where NCCL looks when no tuner is named), dlsym
// ncclTunerPlugin_v5 .. v2, init with NCCL's constants and NVLink domains, getCollInfo with cost
// tables holding entries NCCL will not run (-1), finalize; several communicators at once; bad
// tables and bad calls. Only the C ABI is used, as NCCL would. Each scenario runs in its own
// process (ctest sets LOOM_TUNER_MACHINE / LOOM_TUNER_FILE; the plugin reads them once).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nccl_model.h"
#include "transports/ncclnet/nccl_tuner_abi.h"

namespace nabi = ::loom::ncclabi;

namespace {

constexpr int kAlgos = nabi::NCCL_TUNER_NUM_ALGORITHMS, kProtos = nabi::NCCL_TUNER_NUM_PROTOCOLS;
constexpr int kTree = 0, kRing = 1, kNvls = 4, kNvlsTree = 5;
constexpr int kLL = 0, kSimple = 2;

std::mutex gLogMu;
std::vector<std::pair<int, std::string>> gLog;

void logger(nabi::ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(gLogMu);
  gLog.emplace_back(static_cast<int>(level), buf);
}

bool logged(int level, const std::string& what) {
  std::lock_guard<std::mutex> lk(gLogMu);
  for (const auto& [l, m] : gLog)
    if (l == level && m.find(what) != std::string::npos) return true;
  return false;
}

template <typename T>
const T* symbol(const char* lib, const char* name) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(h, nullptr) << dlerror();
  if (h == nullptr) return nullptr;
  return static_cast<const T*>(dlsym(h, name));
}

const nabi::ncclTuner_v5_t* v5(const char* lib = LOOM_TUNER_PLUGIN_PATH) {
  return symbol<nabi::ncclTuner_v5_t>(lib, "ncclTunerPlugin_v5");
}

// NCCL 2.28's default constants, as it hands them to init (the model's copy of NCCL's published
// values: the layout is the same, which the plugin checks statically).
nabi::ncclTunerConstants_v5_t ncclConstants() {
  nabi::ncclTunerConstants_v5_t k{};
  static_assert(sizeof(k) == sizeof(loom::NcclConstants), "v5 constants layout");
  std::memcpy(&k, &loom::NcclConstants::defaults(), sizeof(k));
  return k;
}

// A cost table as NCCL fills it: every entry NCCL offers positive, the others -1.
struct Table {
  float cost[kAlgos][kProtos];
  explicit Table(bool all = true) {
    for (auto& row : cost)
      for (float& c : row) c = all ? 100.0f : -1.0f;
  }
  float** ptr() { return reinterpret_cast<float**>(cost); }
  // The entry NCCL would take: the lowest non-negative.
  std::pair<int, int> chosen() const {
    std::pair<int, int> best{-1, -1};
    float low = 1e30f;
    for (int a = 0; a < kAlgos; ++a)
      for (int p = 0; p < kProtos; ++p)
        if (cost[a][p] >= 0 && cost[a][p] < low) {
          low = cost[a][p];
          best = {a, p};
        }
    return best;
  }
};

// A 1 GiB AllReduce on a full table leaves every entry as NCCL set it (the call is left to NCCL).
void expectLeftToNccl(const nabi::ncclTuner_v5_t* t, void* ctx) {
  Table table;
  int channels = 0;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, table.ptr(), kAlgos,
                           kProtos, 0, &channels),
            nabi::ncclSuccess);
  for (auto& row : table.cost)
    for (float c : row) EXPECT_EQ(c, 100.0f);
}

void* initV5(const nabi::ncclTuner_v5_t* t, size_t nRanks, size_t nNodes,
             nabi::ncclTunerConstants_v5_t* k = nullptr) {
  nabi::ncclNvlDomainInfo_v5_t nvl{static_cast<int>(nNodes), static_cast<int>(nRanks / nNodes),
                                   static_cast<int>(nRanks / nNodes)};
  nabi::ncclTunerConstants_v5_t own = ncclConstants();
  void* ctx = nullptr;
  EXPECT_EQ(t->init(&ctx, 1, nRanks, nNodes, logger, &nvl, k ? k : &own), nabi::ncclSuccess);
  EXPECT_NE(ctx, nullptr);
  return ctx;
}

// LOOM_TUNER_MACHINE=dgx-h100.
TEST(TunerModel, ChoosesByTheModelAmongWhatNcclOffers) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name, "Loom");
  void* ctx = initV5(t, 16, 2);
  EXPECT_TRUE(logged(nabi::NCCL_LOG_INFO, "16 ranks on 2 node(s) of dgx-h100"));
  int channels = -7;
  // 1 GiB AllReduce on 2 DGX H100 nodes: NVLS-tree, the protocol Simple.
  Table all;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, all.ptr(), kAlgos,
                           kProtos, 0, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(all.chosen(), std::make_pair(kNvlsTree, kSimple));
  EXPECT_EQ(all.cost[kNvlsTree][kSimple], 0.0f);
  EXPECT_EQ(all.cost[kRing][kSimple], 100.0f);  // the others untouched
  EXPECT_EQ(channels, -7);                      // NCCL's channel count kept
  // NCCL offers only ring and tree (no NVLS): the choice stays among them, -1 entries untouched.
  Table some(false);
  for (int p = 0; p < kProtos; ++p) some.cost[kRing][p] = some.cost[kTree][p] = 50.0f;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, some.ptr(), kAlgos,
                           kProtos, 0, &channels),
            nabi::ncclSuccess);
  std::pair<int, int> c = some.chosen();
  EXPECT_TRUE(c.first == kRing || c.first == kTree);
  EXPECT_EQ(some.cost[kNvlsTree][kSimple], -1.0f);
  EXPECT_EQ(some.cost[kNvls][kSimple], -1.0f);
  // Small: a low-latency protocol.
  Table small;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, 8, 1, small.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(small.chosen().second, kLL);
  // SendRecv is not a collective it judges: untouched.
  Table p2p;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncSendRecv, 1 << 20, 1, p2p.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(p2p.cost[0][0], 100.0f);
  EXPECT_EQ(p2p.chosen(), std::make_pair(0, 0));
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
}

// The constants NCCL hands at init are the model's: a ring whose LL latency NCCL says is huge
// is not chosen for small calls.
TEST(TunerModel, ReadsNcclsConstants) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  nabi::ncclTunerConstants_v5_t k = ncclConstants();
  k.baseLatencies[kRing][kLL] = 1000;
  void* ctx = initV5(t, 8, 1, &k);
  Table small;
  int channels = 0;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllGather, 64, 1, small.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclSuccess);
  EXPECT_NE(small.chosen(), std::make_pair(kRing, kLL));
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
  // With NCCL's own constants, one node's small AllGather is ring/LL.
  void* plain = initV5(t, 8, 1);
  Table again;
  ASSERT_EQ(t->getCollInfo(plain, nabi::ncclFuncAllGather, 64, 1, again.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(again.chosen(), std::make_pair(kRing, kLL));
  EXPECT_EQ(t->finalize(plain), nabi::ncclSuccess);
}

TEST(TunerModel, OlderVersions) {
  using V4 = nabi::ncclTuner_v4_t;
  using V3 = nabi::ncclTuner_v3_t;
  using V2 = nabi::ncclTuner_v2_t;
  const V4* t4 = symbol<V4>(LOOM_TUNER_PLUGIN_PATH, "ncclTunerPlugin_v4");
  const V3* t3 = symbol<V3>(LOOM_TUNER_PLUGIN_PATH, "ncclTunerPlugin_v3");
  const V2* t2 = symbol<V2>(LOOM_TUNER_PLUGIN_PATH, "ncclTunerPlugin_v2");
  ASSERT_TRUE(t4 && t3 && t2);
  int channels = 0;
  void* c4 = nullptr;
  ASSERT_EQ(t4->init(16, 2, logger, &c4), nabi::ncclSuccess);
  Table a;
  ASSERT_EQ(t4->getCollInfo(c4, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, a.ptr(), kAlgos,
                            kProtos, 1, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(a.chosen(), std::make_pair(kNvlsTree, kSimple));
  EXPECT_EQ(t4->destroy(c4), nabi::ncclSuccess);
  void* c3 = nullptr;
  ASSERT_EQ(t3->init(16, 2, logger, &c3), nabi::ncclSuccess);
  Table b;
  ASSERT_EQ(t3->getCollInfo(c3, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, b.ptr(), kAlgos,
                            kProtos, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(b.chosen(), std::make_pair(kNvlsTree, kSimple));
  EXPECT_EQ(t3->destroy(c3), nabi::ncclSuccess);
  void* c2 = nullptr;
  ASSERT_EQ(t2->init(16, 2, logger, &c2), nabi::ncclSuccess);
  int algo = -1, proto = -1;
  ASSERT_EQ(t2->getCollInfo(c2, nabi::ncclFuncAllReduce, size_t{1} << 30, 0, 1, 1, &algo, &proto,
                            &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(algo, kNvlsTree);
  EXPECT_EQ(proto, kSimple);
  algo = proto = -1;  // without NVLS support: not an NVLS algorithm
  ASSERT_EQ(t2->getCollInfo(c2, nabi::ncclFuncAllReduce, size_t{1} << 30, 0, 0, 1, &algo, &proto,
                            &channels),
            nabi::ncclSuccess);
  EXPECT_TRUE(algo == kRing || algo == kTree) << algo;
  EXPECT_EQ(t2->destroy(c2), nabi::ncclSuccess);
}

// NCCL finds the tuner in the net plugin it loaded when no tuner library is named.
TEST(TunerModel, BothRoutes) {
  const nabi::ncclTuner_v5_t* viaNet = v5(LOOM_NET_PLUGIN_PATH);
  ASSERT_NE(viaNet, nullptr);
  void* ctx = initV5(viaNet, 16, 2);
  Table all;
  int channels = 0;
  ASSERT_EQ(viaNet->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, all.ptr(), kAlgos,
                                kProtos, 0, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(all.chosen(), std::make_pair(kNvlsTree, kSimple));
  EXPECT_EQ(viaNet->finalize(ctx), nabi::ncclSuccess);
}

// Several communicators at once (NCCL inits one context per communicator), from several threads.
TEST(TunerModel, ManyCommunicatorsAtOnce) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      size_t nodes = 1 + i % 4, ranks = 8 * nodes;
      void* ctx = initV5(t, ranks, nodes);
      for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 16) {
        Table table;
        int channels = 0;
        if (t->getCollInfo(ctx, nabi::ncclFuncAllReduce, bytes, 1, table.ptr(), kAlgos, kProtos, 0,
                           &channels) != nabi::ncclSuccess ||
            table.chosen().first < 0)
          ++failures[i];
      }
      if (t->finalize(ctx) != nabi::ncclSuccess) ++failures[i];
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(TunerModel, BadCalls) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  nabi::ncclTunerConstants_v5_t k = ncclConstants();
  EXPECT_EQ(t->init(nullptr, 1, 8, 1, logger, nullptr, &k), nabi::ncclInvalidArgument);
  void* ctx = initV5(t, 8, 1);
  int channels = 0;
  EXPECT_EQ(
      t->getCollInfo(ctx, nabi::ncclFuncAllReduce, 8, 1, nullptr, kAlgos, kProtos, 0, &channels),
      nabi::ncclInvalidArgument);
  Table table;
  EXPECT_EQ(t->getCollInfo(nullptr, nabi::ncclFuncAllReduce, 8, 1, table.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclInvalidArgument);
  // A smaller table than NCCL 2.28's (an older NCCL): only its entries are considered.
  float narrow[2][kProtos] = {{100, 100, 100}, {100, 100, 100}};
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1,
                           reinterpret_cast<float**>(narrow), 2, kProtos, 0, &channels),
            nabi::ncclSuccess);
  int zeros = 0;
  for (auto& row : narrow)
    for (float c : row) zeros += c == 0.0f;
  EXPECT_EQ(zeros, 1);
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
  EXPECT_EQ(t->finalize(nullptr), nabi::ncclInvalidArgument);
}

// LOOM_TUNER_FILE with rows in NCCL's example tuner format (and LOOM_TUNER_MACHINE=dgx-h100).
TEST(TunerTable, RowsWinWhereTheyMatch) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  void* ctx = initV5(t, 16, 2);
  int channels = -1;
  Table small;  // row 1: allreduce up to 64 KiB on any layout: ring/simple on 4 channels
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, 4096, 1, small.ptr(), kAlgos, kProtos, 0,
                           &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(small.chosen(), std::make_pair(kRing, kSimple));
  EXPECT_EQ(channels, 4);
  Table big;  // row 2 is for 4 nodes only: the model decides
  channels = -1;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllReduce, size_t{1} << 30, 1, big.ptr(), kAlgos,
                           kProtos, 0, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(big.chosen(), std::make_pair(kNvlsTree, kSimple));
  EXPECT_EQ(channels, -1);
  // Row 3 asks AllGather for tree/LL, which NCCL does not offer (only the ring here): the model
  // decides among what is offered.
  Table gather(false);
  for (int p = 0; p < kProtos; ++p) gather.cost[kRing][p] = 10.0f;
  ASSERT_EQ(t->getCollInfo(ctx, nabi::ncclFuncAllGather, 1 << 20, 1, gather.ptr(), kAlgos, kProtos,
                           0, &channels),
            nabi::ncclSuccess);
  EXPECT_EQ(gather.chosen().first, kRing);
  EXPECT_EQ(gather.cost[kTree][kLL], -1.0f);
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
}

// LOOM_TUNER_FILE is malformed: one warning naming it, and every choice left to NCCL.
TEST(TunerTable, BadTableIsOneWarningAndNcclsChoices) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  void* ctx = initV5(t, 16, 2);
  EXPECT_TRUE(logged(nabi::NCCL_LOG_WARN, "line 2: unknown algorithm 'swing'"));
  EXPECT_TRUE(logged(nabi::NCCL_LOG_WARN, "the tuner leaves every choice to NCCL"));
  expectLeftToNccl(t, ctx);
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
}

// No machine to model (this machine has no GPU, no file named): NCCL's choices stand.
TEST(TunerNoMachine, LeavesEverythingToNccl) {
  const nabi::ncclTuner_v5_t* t = v5();
  ASSERT_NE(t, nullptr);
  void* ctx = initV5(t, 16, 2);
  EXPECT_TRUE(logged(nabi::NCCL_LOG_INFO, "no machine to model"));
  expectLeftToNccl(t, ctx);
  EXPECT_EQ(t->finalize(ctx), nabi::ncclSuccess);
}

}  // namespace
