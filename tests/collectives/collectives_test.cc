// Every collective x datatype x op x rank count x in/out of place x count, with ranks as threads
// and as processes, over shared memory (and, through the ctest variants in CMakeLists.txt, over
// each other intra-host path and over sockets); plus bad input, rank failure, abort, split, groups.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "algorithms/schedule.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/log.h"
#include "src/core/process.h"
#include "tests/collectives/harness.h"
#include "tests/collectives/workers.h"
#include "tests/quick.h"
#include "transports/socket/socket_util.h"

namespace loomtest {
namespace {

const std::vector<loomRedOp_t> kAllOps = {loomSum, loomProd, loomMax, loomMin, loomAvg};

class Env : public ::testing::Environment {
 public:
  void SetUp() override {
    // Small pieces so that modest counts are several pieces long; bounded waits everywhere.
    setParam("LOOM_CHUNK_SIZE", "4K");
    setParam("LOOM_TIMEOUT", "60");
  }
};
const auto* kEnv = ::testing::AddGlobalTestEnvironment(new Env);

// Thread-rank communicators, created once per size and shared by the matrix tests.
ThreadRanks& ranksOf(int n) {
  static std::map<int, std::unique_ptr<ThreadRanks>> cache;
  auto& p = cache[n];
  if (!p) p = std::make_unique<ThreadRanks>(n);
  return *p;
}

std::string runMatrix(ThreadRanks& tr, const std::vector<Case>& cases) {
  return tr.run([&](int rank, loomComm_t comm) {
    std::string first;
    for (const auto& c : cases) {
      std::string e = runCase(comm, rank, tr.size(), c);
      if (!e.empty() && first.empty()) first = e;
      // A Loom error leaves the communicator unusable: stop; a wrong value does not.
      if (!e.empty() && e.find("expected") == std::string::npos) break;
    }
    return first;
  });
}

class ThreadMatrix : public ::testing::TestWithParam<std::tuple<int, Coll>> {};

TEST_P(ThreadMatrix, EveryDatatypeOpCountAndPlacement) {
  auto [n, coll] = GetParam();
  ThreadRanks& tr = ranksOf(n);
  ASSERT_TRUE(tr.ok()) << tr.error();
  auto cases = matrix(coll, n, standardCounts(n), kAllOps);
  ASSERT_FALSE(cases.empty());
  EXPECT_EQ(runMatrix(tr, cases), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::ValuesIn(allColls())),
                         [](const auto& p) {
                           return std::string(collName(std::get<1>(p.param))) + "_" +
                                  std::to_string(std::get<0>(p.param)) + "ranks";
                         });

// AllReduce has two algorithms chosen by size (recursive doubling up to LOOM_ALLREDUCE_RD_MAX, the
// ring above): the matrix above runs mostly the first; these force each one for every case.
class AllReduceAlgorithms : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(AllReduceAlgorithms, EveryDatatypeOpCountAndPlacement) {
  auto [n, rdMax] = GetParam();
  ThreadRanks& tr = ranksOf(n);
  ASSERT_TRUE(tr.ok()) << tr.error();
  setParam("LOOM_ALLREDUCE_RD_MAX", rdMax);
  std::string result = runMatrix(tr, matrix(Coll::kAllReduce, n, standardCounts(n), kAllOps));
  setParam("LOOM_ALLREDUCE_RD_MAX", nullptr);
  EXPECT_EQ(result, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceAlgorithms,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::Values("0", "1G")),
                         [](const auto& p) {
                           return std::string(std::get<1>(p.param)[0] == '0' ? "Ring" : "Rd") +
                                  "_" + std::to_string(std::get<0>(p.param)) + "ranks";
                         });

// Every algorithm of every collective, forced with LOOM_ALGO, on a one-host communicator (whose
// default is the direct family) with the low-latency exchange off so that schedules run.
TEST(ForcedAlgorithms, EveryRegisteredAlgorithmIsCorrect) {
  setParam("LOOM_SHM_LL_MAX", "0");  // read at init: a fresh communicator below
  ThreadRanks tr(3);
  setParam("LOOM_SHM_LL_MAX", nullptr);
  ASSERT_TRUE(tr.ok()) << tr.error();
  for (const loom::AlgorithmInfo& a : loom::algorithms()) {
    Coll coll = Coll::kAllReduce;
    bool found = false;
    for (Coll c : allColls())
      if (std::string(collName(c)) == collName(a.coll)) coll = c, found = true;
    ASSERT_TRUE(found) << collName(a.coll);
    std::string spec = std::string(collName(a.coll)) + ":" + a.name;
    setParam("LOOM_ALGO", spec.c_str());
    std::string result = runMatrix(tr, matrix(coll, 3, standardCounts(3), {loomSum, loomMax}));
    setParam("LOOM_ALGO", nullptr);
    EXPECT_EQ(result, "") << spec;
  }
}

// The same on one host with several ring channels (channels other than 0 use the sockets).
TEST(ForcedAlgorithms, EveryRegisteredAlgorithmWithRingChannels) {
  setParam("LOOM_SHM_LL_MAX", "0");  // read at init
  setParam("LOOM_RING_CHANNELS", "3");
  ThreadRanks tr(4);
  setParam("LOOM_SHM_LL_MAX", nullptr);
  setParam("LOOM_RING_CHANNELS", nullptr);
  ASSERT_TRUE(tr.ok()) << tr.error();
  for (const loom::AlgorithmInfo& a : loom::algorithms()) {
    Coll coll = Coll::kAllReduce;
    for (Coll c : allColls())
      if (std::string(collName(c)) == collName(a.coll)) coll = c;
    std::string spec = std::string(collName(a.coll)) + ":" + a.name;
    setParam("LOOM_ALGO", spec.c_str());
    std::string result = runMatrix(tr, matrix(coll, 4, standardCounts(4), {loomSum}));
    setParam("LOOM_ALGO", nullptr);
    EXPECT_EQ(result, "") << spec;
  }
}

// Ranks as processes on simulated hosts of 3, 2 and 1 ranks, interleaved (LOOM_HOSTID per rank):
// the hierarchical algorithms and the rings (ordered by host, two channels) across them.
TEST(ForcedAlgorithms, HierarchicalAndRingsAcrossSimulatedHosts) {
  for (const char* algo : {"hier", "ring"}) {
    for (Coll coll : allColls()) {
      bool registered = false;
      for (const loom::AlgorithmInfo& a : loom::algorithms())
        registered |=
            std::string(a.name) == algo && std::string(collName(a.coll)) == collName(coll);
      if (!registered) continue;
      std::string spec = std::string(collName(coll)) + ":" + algo;
      WorkerResult res = runWorkers(6, std::string("matrix:") + collName(coll),
                                    {{"LOOM_TEST_HOSTS", "a,b,a,c,b,a"},
                                     {"LOOM_ALGO", spec},
                                     {"LOOM_RING_CHANNELS", "2"},
                                     {"LOOM_SHM_LL_MAX", "0"}});
      size_t want = matrix(coll, 6, standardCounts(6), kAllOps).size();
      for (int r = 0; r < 6; ++r) {
        EXPECT_TRUE(res.exitedWith(r, 0)) << spec << " rank " << r << ": " << res.describe(r);
        EXPECT_NE(res.output[r].find("ran " + std::to_string(want) + " cases"), std::string::npos)
            << spec << ": " << res.output[r];
      }
    }
  }
}

TEST(ForcedAlgorithms, UnknownNameFailsInitWithTheValidNames) {
  setParam("LOOM_ALGO", "allreduce:treee");
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomComm_t comm = nullptr;
  loomResult_t r = loomCommInitRank(&comm, 1, id, 0);
  std::string msg = loomGetLastError();
  setParam("LOOM_ALGO", nullptr);
  EXPECT_EQ(r, loomInvalidArgument) << msg;
  EXPECT_NE(msg.find("unknown algorithm 'treee'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("direct"), std::string::npos) << msg;
  if (comm) loomCommDestroy(comm);
}

// Warnings logged while a test runs (a log sink).
std::mutex gWarnMu;
std::vector<std::string> gWarnings;
void collectWarnings(loom::LogLevel level, uint32_t, const char*, int, const char* msg) {
  if (level != loom::LogLevel::kWarn) return;
  std::lock_guard<std::mutex> lk(gWarnMu);
  gWarnings.push_back(msg);
}

// A bare algorithm name restricts the collectives that have that algorithm; the others keep the
// automatic choice, with one warning naming them (issue 21: LOOM_ALGO=ring failed every Reduce and
// hier every AllToAll inside a group, while small calls passed on the low-latency exchange).
TEST(ForcedAlgorithms, BareNameAppliesWhereTheCollectiveHasIt) {
  for (const char* spec : {"ring", "hier", "bruck"}) {
    {
      std::lock_guard<std::mutex> lk(gWarnMu);
      gWarnings.clear();
    }
    loom::setLogSink(&collectWarnings, loom::LogLevel::kWarn);
    setParam("LOOM_ALGO", spec);
    setParam("LOOM_SHM_LL_MAX", "0");  // read at init: schedules run
    ThreadRanks tr(3);
    setParam("LOOM_SHM_LL_MAX", nullptr);
    ASSERT_TRUE(tr.ok()) << spec << ": " << tr.error();
    for (Coll c : allColls())
      EXPECT_EQ(runMatrix(tr, matrix(c, 3, standardCounts(3), {loomSum, loomMax})), "")
          << spec << " " << collName(c);
    // Collectives with and without the algorithm in one group.
    std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
      const size_t count = 4099;
      // Calls of one group run together: no buffer one writes may be one another reads.
      std::vector<int32_t> in(3 * count), out(3 * count, -1), red(count, -1), max(count, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>(rank * 100000 + i);
      loomGroupStart();
      loomAllToAll(in.data(), out.data(), count, loomInt32, comm, nullptr);
      loomReduce(in.data(), red.data(), count, loomInt32, loomSum, 2, comm, nullptr);
      loomAllReduce(in.data(), max.data(), count, loomInt32, loomMax, comm, nullptr);
      if (loomGroupEnd() != loomSuccess) return std::string(spec) + ": " + loomGetLastError();
      for (int p = 0; p < 3; ++p)
        for (size_t i = 0; i < count; ++i)
          if (out[p * count + i] != static_cast<int32_t>(p * 100000 + rank * count + i))
            return std::string(spec) + ": wrong AllToAll element";
      if (rank == 2)
        for (size_t i = 0; i < count; ++i)
          if (red[i] != static_cast<int32_t>(300000 + 3 * i)) return "wrong Reduce element";
      for (size_t i = 0; i < count; ++i)
        if (max[i] != static_cast<int32_t>(200000 + i)) return "wrong AllReduce element";
      return "";
    });
    EXPECT_EQ(all, "");
    // What the planner names: the bare algorithm where the collective has it.
    struct Want {
      loomCollective_t coll;
      loom::CollKind kind;
    };
    for (Want w : {Want{loomCollAllReduce, loom::CollKind::kAllReduce},
                   Want{loomCollReduce, loom::CollKind::kReduce},
                   Want{loomCollAllGather, loom::CollKind::kAllGather},
                   Want{loomCollAllToAll, loom::CollKind::kAllToAll}}) {
      loomPlanInfo_t info;
      ASSERT_EQ(loomCommPlanInfo(tr.comm(0), w.coll, 1 << 16, loomFloat32, 0, 0, &info),
                loomSuccess)
          << loomGetLastError();
      if (loom::findAlgorithm(w.kind, spec))
        EXPECT_STREQ(info.algorithm, spec) << loom::collName(w.kind);
      else
        EXPECT_STRNE(info.algorithm, spec) << loom::collName(w.kind);
    }
    setParam("LOOM_ALGO", nullptr);
    loom::setLogSink(nullptr, loom::LogLevel::kWarn);
    std::lock_guard<std::mutex> lk(gWarnMu);
    int notes = 0;
    for (const std::string& m : gWarnings)
      if (m.find(std::string("LOOM_ALGO=") + spec + ":") != std::string::npos &&
          m.find("keep") != std::string::npos)
        ++notes;
    EXPECT_EQ(notes, 1) << spec << ": one warning naming the unrestricted collectives";
  }
}

// loomCommSetAlgo replaces LOOM_ALGO for one communicator; NULL goes back to LOOM_ALGO; a bad spec
// or a call inside a group is refused and leaves the setting as it was.
TEST(ForcedAlgorithms, SetAlgoOverridesLoomAlgoForOneCommunicator) {
  setParam("LOOM_SHM_LL_MAX", "0");  // read at init: schedules run
  ThreadRanks tr(3);
  setParam("LOOM_SHM_LL_MAX", nullptr);
  ASSERT_TRUE(tr.ok()) << tr.error();
  const size_t count = 1 << 16;
  auto planned = [&](loomComm_t comm) {
    loomPlanInfo_t info;
    if (loomCommPlanInfo(comm, loomCollAllReduce, count, loomFloat32, 0, 0, &info) != loomSuccess)
      return std::string("error: ") + loomGetLastError();
    return std::string(info.algorithm);
  };
  // Every rank sets it, then runs an allreduce that must be correct under it.
  auto setAndRun = [&](const char* spec) {
    return tr.run([&](int rank, loomComm_t comm) -> std::string {
      if (loomCommSetAlgo(comm, spec) != loomSuccess) return loomGetLastError();
      std::vector<float> a(count, static_cast<float>(rank + 1)), b(count, -1.0f);
      if (loomAllReduce(a.data(), b.data(), count, loomFloat32, loomSum, comm, nullptr) !=
          loomSuccess)
        return loomGetLastError();
      for (float v : b)
        if (v != 6.0f) return "wrong sum " + std::to_string(v) + " under " + (spec ? spec : "NULL");
      return "";
    });
  };
  setParam("LOOM_ALGO", "allreduce:rd");
  EXPECT_EQ(planned(tr.comm(0)), "rd");
  EXPECT_EQ(setAndRun("allreduce:ring"), "");
  EXPECT_EQ(planned(tr.comm(0)), "ring");
  EXPECT_EQ(planned(tr.comm(1)), "ring");

  EXPECT_EQ(loomCommSetAlgo(tr.comm(0), "allreduce:nope"), loomInvalidArgument);
  std::string msg = loomGetLastError();
  EXPECT_NE(msg.find("loomCommSetAlgo=allreduce:nope: unknown algorithm 'nope'"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rhd"), std::string::npos) << msg;
  EXPECT_EQ(planned(tr.comm(0)), "ring");  // unchanged
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  EXPECT_EQ(loomCommSetAlgo(tr.comm(0), "allreduce:tree"), loomInvalidUsage);
  ASSERT_EQ(loomGroupEnd(), loomSuccess);
  EXPECT_EQ(planned(tr.comm(0)), "ring");

  EXPECT_EQ(setAndRun(nullptr), "");  // back to LOOM_ALGO
  EXPECT_EQ(planned(tr.comm(2)), "rd");
  setParam("LOOM_ALGO", nullptr);
  EXPECT_EQ(loomCommSetAlgo(nullptr, "ring"), loomInvalidArgument);
}

TEST(AllReduceAlgorithms, RanksThatDisagreeOnTheAlgorithmFailInsteadOfHanging) {
  ThreadRanks tr(3);
  ASSERT_TRUE(tr.ok()) << tr.error();
  // Rank 1 passes a different op. Every message's tag covers (collective, count, datatype, op,
  // root, algorithm), so the mismatch fails every rank instead of mixing data or hanging.
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    std::vector<float> a(64, 1.0f), b(64);
    loomResult_t r = loomAllReduce(a.data(), b.data(), 64, loomFloat32,
                                   rank == 1 ? loomMax : loomSum, comm, nullptr);
    if (r == loomSuccess)
      r = loomAllReduce(a.data(), b.data(), 8, loomFloat32, loomSum, comm, nullptr);
    return r == loomSuccess ? "rank " + std::to_string(rank) + " did not fail" : "";
  });
  EXPECT_EQ(all, "");
}

class ProcessMatrix : public ::testing::TestWithParam<std::tuple<int, Coll>> {};

TEST_P(ProcessMatrix, EveryDatatypeOpCountAndPlacement) {
  auto [n, coll] = GetParam();
  WorkerResult res = runWorkers(n, std::string("matrix:") + collName(coll), {});
  size_t want = matrix(coll, n, standardCounts(n), kAllOps).size();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("ran " + std::to_string(want) + " cases"), std::string::npos)
        << res.output[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ProcessMatrix,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8),
                                            ::testing::ValuesIn(allColls())),
                         [](const auto& p) {
                           return std::string(collName(std::get<1>(p.param))) + "_" +
                                  std::to_string(std::get<0>(p.param)) + "ranks";
                         });

// Two hosts of two processes each (a host id per pair): one communicator whose ranks reach some
// peers through shared memory and others through sockets, so the progress loop waits on both
// transports at once.
class MixedTransports : public ::testing::TestWithParam<Coll> {};

TEST_P(MixedTransports, TwoHostsOfTwoProcesses) {
  WorkerResult res = runWorkers(4, std::string("matrix:") + collName(GetParam()),
                                {{"LOOM_TEST_RANKS_PER_HOST", "2"},
                                 {"LOOM_DEBUG", "INFO"},
                                 {"LOOM_DEBUG_SUBSYS", "SHM,NET"}});
  size_t want = matrix(GetParam(), 4, standardCounts(4), kAllOps).size();
  bool network = false;
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("ran " + std::to_string(want) + " cases"), std::string::npos)
        << res.output[r];
    EXPECT_NE(res.output[r].find("shared memory with 2 local ranks"), std::string::npos)
        << res.output[r];
    network |= res.output[r].find("socket transport: connected to") != std::string::npos;
  }
  EXPECT_TRUE(network) << "no rank connected a socket to the other host";
}

INSTANTIATE_TEST_SUITE_P(Colls, MixedTransports, ::testing::ValuesIn(allColls()),
                         [](const auto& p) { return std::string(collName(p.param)); });

// Large messages: many pieces (f32Count float32 sums, bf16Count bfloat16 maxima), every
// collective, over a few rank counts.
void runLargeMessages(size_t f32Count, size_t bf16Count) {
  for (int n : {2, 3}) {
    ThreadRanks& tr = ranksOf(n);
    ASSERT_TRUE(tr.ok()) << tr.error();
    std::vector<Case> cases;
    for (Coll c : allColls())
      for (bool inPlace : {false, true}) {
        cases.push_back({c, loomFloat32, loomSum, f32Count, inPlace, n - 1});
        cases.push_back({c, loomBfloat16, loomMax, bf16Count, inPlace, 0});
      }
    EXPECT_EQ(runMatrix(tr, cases), "") << n << " ranks";
  }
}

TEST(Collectives, LargeMessages) { runLargeMessages((size_t(1) << 20) + 3, (size_t(1) << 19) + 1); }

// The same with every result stored around the caches (LOOM_NT_MIN=1: as calls larger than the
// last-level cache are): the receives, local copies and reductions and the one pass take their
// streaming forms, whose stores need a fence before a peer may read them.
TEST(Collectives, LargeMessagesStoredAroundTheCaches) {
  struct Restore {
    ~Restore() { setParam("LOOM_NT_MIN", nullptr); }
  } restore;
  setParam("LOOM_NT_MIN", "1");
  runLargeMessages((size_t(1) << 18) + 3, (size_t(1) << 17) + 1);  // 2 pieces of 512K and more
}

// ---- Bad input ---------------------------------------------------------------------------------

// loomCommPlanInfo prices nothing it is not given a valid shape for: a count whose bytes would
// overflow used to reach the planner (and its schedule lowering) unchecked.
TEST(BadInput, PlanInfoRejectsBadShapes) {
  ThreadRanks& tr = ranksOf(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  loomComm_t comm = tr.comm(0);
  loomPlanInfo_t info;
  auto expectError = [&](loomResult_t got, const char* text) {
    EXPECT_EQ(got, loomInvalidArgument) << text;
    EXPECT_NE(std::string(loomGetLastError()).find(text), std::string::npos)
        << "message '" << loomGetLastError() << "' should mention '" << text << "'";
  };
  expectError(loomCommPlanInfo(comm, loomCollAllReduce, 16, loomFloat32, 0, 0, nullptr),
              "info is NULL");
  expectError(
      loomCommPlanInfo(comm, static_cast<loomCollective_t>(9), 16, loomFloat32, 0, 0, &info),
      "unknown collective 9");
  expectError(
      loomCommPlanInfo(comm, loomCollAllReduce, 16, static_cast<loomDataType_t>(42), 0, 0, &info),
      "unknown datatype 42");
  expectError(loomCommPlanInfo(comm, loomCollBroadcast, 16, loomFloat32, 2, 0, &info),
              "root 2 is out of range");
  expectError(loomCommPlanInfo(comm, loomCollAllGather, SIZE_MAX / 4, loomFloat32, 0, 0, &info),
              "is too large");
  ASSERT_EQ(loomCommPlanInfo(comm, loomCollAllReduce, 1 << 20, loomFloat32, 0, 0, &info),
            loomSuccess)
      << loomGetLastError();
  EXPECT_GT(info.nCandidates, 1);
  EXPECT_GT(std::strlen(info.algorithm), 0u);
}

TEST(BadInput, RejectedWithClearErrors) {
  ThreadRanks& tr = ranksOf(1);
  ASSERT_TRUE(tr.ok()) << tr.error();
  loomComm_t comm = tr.comm(0);
  std::vector<float> a(64), b(64);
  auto expectError = [&](loomResult_t got, loomResult_t want, const char* text) {
    EXPECT_EQ(got, want) << text;
    EXPECT_NE(std::string(loomGetLastError()).find(text), std::string::npos)
        << "message '" << loomGetLastError() << "' should mention '" << text << "'";
  };
  expectError(loomAllReduce(nullptr, b.data(), 4, loomFloat32, loomSum, comm, nullptr),
              loomInvalidArgument, "sendbuff is NULL");
  expectError(loomAllReduce(a.data(), nullptr, 4, loomFloat32, loomSum, comm, nullptr),
              loomInvalidArgument, "recvbuff is NULL");
  expectError(
      loomAllReduce(a.data(), b.data(), 4, static_cast<loomDataType_t>(42), loomSum, comm, nullptr),
      loomInvalidArgument, "unknown datatype 42");
  expectError(loomAllReduce(a.data(), b.data(), 4, loomFloat32, static_cast<loomRedOp_t>(-3), comm,
                            nullptr),
              loomInvalidArgument, "unknown reduction op -3");
  expectError(loomBroadcast(a.data(), b.data(), 4, loomFloat32, 1, comm, nullptr),
              loomInvalidArgument, "root 1 is out of range");
  expectError(loomReduce(a.data(), b.data(), 4, loomFloat32, loomSum, -1, comm, nullptr),
              loomInvalidArgument, "root -1 is out of range");
  expectError(loomSend(a.data(), 4, loomFloat32, 5, comm, nullptr), loomInvalidArgument,
              "peer 5 is out of range");
  expectError(loomAllReduce(reinterpret_cast<char*>(a.data()) + 1, b.data(), 4, loomFloat32,
                            loomSum, comm, nullptr),
              loomInvalidArgument, "not aligned");
  expectError(loomAllReduce(a.data(), a.data() + 2, 8, loomFloat32, loomSum, comm, nullptr),
              loomInvalidArgument, "overlap");
  int fakeStream = 0;
  expectError(loomAllReduce(a.data(), b.data(), 4, loomFloat32, loomSum, comm, &fakeStream),
              loomInvalidArgument, "stream");
  expectError(loomAllReduce(a.data(), b.data(), 4, loomFloat32, loomSum, nullptr, nullptr),
              loomInvalidArgument, "comm is NULL");
  expectError(loomGroupEnd(), loomInvalidUsage, "without loomGroupStart");
  int count = 0;
  expectError(loomCommCount(comm, nullptr), loomInvalidArgument, "count is NULL");
  EXPECT_EQ(loomCommCount(comm, &count), loomSuccess);
  EXPECT_EQ(count, 1);
  loomComm_t bad = nullptr;
  loomUniqueId id{};
  expectError(loomCommInitRank(&bad, 0, id, 0), loomInvalidArgument, "nranks 0");
  expectError(loomCommInitRank(&bad, 2, id, 2), loomInvalidArgument, "rank 2 is out of range");
  expectError(loomCommInitRank(&bad, 1, id, 0), loomInvalidArgument, "id");
  loomConfig_t cfg{};
  expectError(loomCommInitRankConfig(&bad, 1, id, 0, &cfg), loomInvalidArgument,
              "LOOM_CONFIG_INITIALIZER");
  // Zero counts with NULL buffers are fine, as in NCCL.
  EXPECT_EQ(loomAllReduce(nullptr, nullptr, 0, loomFloat32, loomSum, comm, nullptr), loomSuccess);
  // The communicator still works after rejected calls.
  EXPECT_EQ(runCase(comm, 0, 1, {Coll::kAllReduce, loomInt32, loomSum, 17, false, 0}), "");
}

TEST(BadInput, CountsThatDifferFailOnEveryRank) {
  for (Coll coll : {Coll::kAllReduce, Coll::kAllGather, Coll::kBroadcast}) {
    ThreadRanks tr(3);
    ASSERT_TRUE(tr.ok()) << tr.error();
    std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
      size_t count = rank == 1 ? 1005 : 1000;
      std::vector<float> a(3 * 1010, 1.0f), b(3 * 1010);
      loomResult_t r = loomSuccess;
      if (coll == Coll::kAllReduce)
        r = loomAllReduce(a.data(), b.data(), count, loomFloat32, loomSum, comm, nullptr);
      if (coll == Coll::kAllGather)
        r = loomAllGather(a.data(), b.data(), count, loomFloat32, comm, nullptr);
      if (coll == Coll::kBroadcast)
        r = loomBroadcast(a.data(), b.data(), count, loomFloat32, 0, comm, nullptr);
      // A rank whose own part of the exchange matched may finish; its next call must then fail.
      if (r == loomSuccess)
        r = loomAllReduce(a.data(), b.data(), 10, loomFloat32, loomSum, comm, nullptr);
      if (r == loomSuccess) return "rank " + std::to_string(rank) + " did not fail";
      loomResult_t async = loomSuccess;
      loomCommGetAsyncError(comm, &async);
      if (async == loomSuccess) return "rank " + std::to_string(rank) + ": async error not set";
      return "";
    });
    EXPECT_EQ(all, "") << collName(coll);
  }
}

// Calls that differ, on whatever path the environment gives (the ctest variants run it over
// sockets, the NCCL plugin and the emulated IB device too): every rank fails with
// loomInvalidUsage, and ranks 0 and 2, which called the same, never blame each other. (The
// executor once blamed the peer of the next request in flight, not of the one that failed.)
TEST(BadInput, CountsThatDifferBlameTheRankThatDiffers) {
  for (size_t count : {size_t{100}, size_t{30000}}) {
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(fmt::format("count {}, round {}", count, round));
      ThreadRanks tr(3);
      ASSERT_TRUE(tr.ok()) << tr.error();
      std::vector<std::string> messages(3);
      std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
        std::vector<float> a(count + 16, 1.0f), b(count + 16);
        loomResult_t r = loomAllReduce(a.data(), b.data(), rank == 1 ? count + 5 : count,
                                       loomFloat32, rank == 1 ? loomMax : loomSum, comm, nullptr);
        messages[rank] = loomGetLastError();
        if (r != loomInvalidUsage)
          return fmt::format("rank {}: {} instead of loomInvalidUsage: {}\n", rank,
                             loomGetErrorString(r), messages[rank]);
        return "";
      });
      EXPECT_EQ(all, "");
      for (int me : {0, 2}) {
        const std::string wrong = fmt::format(
            "rank {} called AllReduce of {} float (sum); what rank {} sent", me, count, 2 - me);
        EXPECT_EQ(messages[me].find(wrong), std::string::npos) << messages[me];
      }
    }
  }
}

// On a schedule, the rank whose transport sees a message that does not fit (Cause::kMismatch)
// says what the ranks probably did.
// Also through an imported NCCL net plugin (Loom's own, in the ctest variants): it says
// ncclInvalidUsage for a message that does not fit, which the importer reads as a mismatch.
TEST(BadInput, CountsThatDifferOnAScheduleNameTheLikelyCause) {
  setParam("LOOM_SHM_LL_MAX", "0");  // read at init: the ring runs, not the low-latency exchange
  ThreadRanks tr(3);
  setParam("LOOM_SHM_LL_MAX", nullptr);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::mutex mu;
  std::string messages;
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    if (loomCommSetAlgo(comm, "allreduce:ring") != loomSuccess) return loomGetLastError();
    size_t count = rank == 1 ? 3005 : 3000;
    std::vector<float> a(3010, 1.0f), b(3010);
    if (loomAllReduce(a.data(), b.data(), count, loomFloat32, loomSum, comm, nullptr) ==
        loomSuccess)
      return "";  // its part matched; another rank reports
    std::lock_guard<std::mutex> lk(mu);
    messages += std::string(loomGetLastError()) + "\n";
    return "";
  });
  EXPECT_EQ(all, "");
  // Which rank sees the other call first depends on timing; some rank says what rank 1 called.
  EXPECT_NE(messages.find("calls differ between ranks"), std::string::npos) << messages;
  EXPECT_NE(messages.find("called AllReduce of 3005 float (sum)"), std::string::npos) << messages;
}

// Calls that differ between ranks fail every rank with loomInvalidUsage, whichever path runs
// them, and the message says what each rank called: on one host both calls (the peer's is read
// from shared memory), between hosts this rank's and that the peer's message is of another call.
struct DifferingCase {
  const char* name;
  std::vector<std::pair<const char*, const char*>> params;  // read at init
  size_t count;
  std::vector<const char*> expected;  // in some rank's message
};

void expectCallsDiffer(const DifferingCase& c) {
  SCOPED_TRACE(c.name);
  for (const auto& [k, v] : c.params) setParam(k, v);
  ThreadRanks tr(3);
  for (const auto& [k, v] : c.params) setParam(k, nullptr);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::mutex mu;
  std::string messages;
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    std::vector<float> a(2 * c.count + 8, 1.0f), b(2 * c.count + 8);
    // Rank 1 reduces a different count with another op.
    loomResult_t r = loomAllReduce(a.data(), b.data(), rank == 1 ? c.count + 5 : c.count,
                                   loomFloat32, rank == 1 ? loomMax : loomSum, comm, nullptr);
    std::lock_guard<std::mutex> lk(mu);
    messages += std::string(loomGetLastError()) + "\n";
    if (r != loomInvalidUsage)
      return fmt::format("rank {}: {} instead of loomInvalidUsage: {}", rank, loomGetErrorString(r),
                         loomGetLastError());
    return "";
  });
  EXPECT_EQ(all, "");
  for (const char* e : c.expected) EXPECT_NE(messages.find(e), std::string::npos) << messages;
}

TEST(BadInput, CallsThatDifferSayHowOnEveryPath) {
  expectCallsDiffer({"low-latency exchange",
                     {},
                     100,
                     {"calls differ between ranks: rank 1 called AllReduce of 105 float (max)",
                      "called AllReduce of 100 float (sum)"}});
  expectCallsDiffer({"schedule over shared memory",
                     {{"LOOM_SHM_LL_MAX", "0"}, {"LOOM_SHM_MAPPED", "0"}, {"LOOM_ALGO", "ring"}},
                     100000,
                     {"calls differ between ranks: rank 1 called AllReduce of 100005 float (max)",
                      "called AllReduce of 100000 float (sum)"}});
  expectCallsDiffer(
      {"schedule over sockets",
       {{"LOOM_SHM_DISABLE", "1"}, {"LOOM_ALGO", "ring"}},
       100000,
       // Which ranks see a message of another call depends on the rings' timing (any that does
       // not learns it from the report of one that did, and adds its own call).
       {"calls differ between ranks", "called AllReduce of 100005 float (max)",
        "called AllReduce of 100000 float (sum)", "sent or published belongs to another call"}});
}

TEST(BadInput, StrangersOnTheBootstrapPortAreDropped) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError();
  auto info = loom::unpackUniqueId(id);
  ASSERT_TRUE(info.isOk()) << info.status().message();
  loom::Deadline dl(5000);
  // One sends garbage, one connects and says nothing, one sends a partial header and closes.
  auto garbage = loom::connectWithRetry(info.value().root, dl);
  ASSERT_TRUE(garbage.isOk());
  const char junk[] = "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
  ASSERT_TRUE(loom::sendAll(garbage.value().get(), junk, sizeof(junk), dl).isOk());
  auto silent = loom::connectWithRetry(info.value().root, dl);
  ASSERT_TRUE(silent.isOk());
  {
    auto partial = loom::connectWithRetry(info.value().root, dl);
    ASSERT_TRUE(partial.isOk());
    ASSERT_TRUE(loom::sendAll(partial.value().get(), junk, 3, dl).isOk());
  }
  const int n = 3;
  std::vector<loomComm_t> comms(n, nullptr);
  std::vector<loomResult_t> res(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] { res[r] = loomCommInitRank(&comms[r], n, id, r); });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(res[r], loomSuccess) << "rank " << r;
  ts.clear();
  std::vector<std::string> errs(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      errs[r] = runCase(comms[r], r, n, {Coll::kAllReduce, loomInt64, loomSum, 100, false, 0});
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errs[r], "");
  for (auto c : comms) loomCommDestroy(c);
}

// ---- Failures, abort, timeouts -----------------------------------------------------------------

// Shared-memory segments are named /loom-<pid of the host's first rank>-<nonce>.
std::vector<std::string> segmentsOf(const WorkerResult& res) {
  std::vector<std::string> left;
  size_t at = res.output[0].find("worker pid ");
  if (at == std::string::npos) return {"(rank 0 printed no pid)"};
  std::string prefix = "loom-" + std::to_string(atoi(res.output[0].c_str() + at + 11)) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) left.push_back(e->d_name);
    closedir(d);
  }
  return left;
}

TEST(Failure, KilledRankIsNamedBySurvivors) {
  WorkerResult res = runWorkers(3, "kill:2", {{"LOOM_TIMEOUT", "30"}});
  EXPECT_TRUE(res.killedBySignal(2)) << res.describe(2);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Failure, KilledRankOnTheLowLatencyPathIsNamed) {
  WorkerResult res = runWorkers(3, "killsmall:1", {{"LOOM_TIMEOUT", "30"}});
  EXPECT_TRUE(res.killedBySignal(1)) << res.describe(1);
  for (int r : {0, 2}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Shm, ProcessesUseSharedMemorySayItAndLeaveNothingInDevShm) {
  WorkerResult res =
      runWorkers(3, "matrix:AllReduce", {{"LOOM_DEBUG", "INFO"}, {"LOOM_DEBUG_SUBSYS", "SHM"}});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("shared memory with 3 local ranks"), std::string::npos)
        << res.output[r];
  }
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Shm, LoomMemAllocBuffersRunInOnePassAndSayIt) {
  WorkerResult res = runWorkers(3, "matrix:AllReduce",
                                {{"LOOM_DEBUG", "INFO"},
                                 {"LOOM_DEBUG_SUBSYS", "SHM"},
                                 {"LOOMTEST_MEM_ALLOC", "1"},
                                 {"LOOM_SHM_LL_MAX", "0"}});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("2 by mapping loomMemAlloc buffers"), std::string::npos)
        << res.output[r];
    EXPECT_NE(res.output[r].find("one pass over the peers' buffers (mapped loomMemAlloc"),
              std::string::npos)
        << res.output[r];
  }
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Shm, MixedAllocationsFallBackTogether) {
  WorkerResult res =
      runWorkers(3, "mixedalloc", {{"LOOM_SHM_LL_MAX", "0"}, {"LOOM_SHM_MAPPED_CMA", "0"}});
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
}

// Plain malloc buffers of processes: the one pass reaches them with process_vm_readv/writev (the
// fixed rule takes it whatever rank 0 measured those calls at; runTileWorkers says why).
TEST(Shm, PlainBuffersOfProcessesRunInOnePassAndSayIt) {
  WorkerResult res = runWorkers(3, "matrix:AllReduce",
                                {{"LOOM_PLANNER", "0"},
                                 {"LOOM_DEBUG", "INFO"},
                                 {"LOOM_DEBUG_SUBSYS", "SHM"},
                                 {"LOOM_SHM_LL_MAX", "0"},
                                 {"LOOM_SHM_RESULT_TILES", "0"}});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("one pass over the peers' buffers (process_vm_readv/writev)"),
              std::string::npos)
        << res.output[r];
  }
}

// Workers of the tiles modes (workers.cc) with the tiles on even where the ranks outnumber the
// cores (tiles "2"; "1": the default, chosen by measurement), every call counted as cold, and the
// one pass saying how it ran. The fixed rule (LOOM_PLANNER=0) takes the one pass for every
// size here: the cost model prices the one pass through process_vm_readv/writev with the speed
// rank 0 measured at init, and a 4-rank AllReduce of 4.8 MB flips to the schedule once those
// calls measure 1.37x memcpy's time (1.1-1.2 idle here, more on a loaded host).
WorkerResult runTileWorkers(int n, const char* mode, const char* tiles = "2") {
  return runWorkers(n, mode,
                    {{"LOOM_SHM_RESULT_TILES", tiles},
                     {"LOOM_PLANNER", "0"},
                     {"LOOM_NT_MIN", "1"},
                     {"LOOM_DEBUG", "INFO"},
                     {"LOOM_DEBUG_SUBSYS", "SHM"}});
}

// Out of place, the one pass passes the results through the shared segment's tiles
// (LOOM_SHM_RESULT_TILES; 2 also where the ranks outnumber the cores, as they may here) where the
// outputs are cold (LOOM_NT_MIN=1: every call counts as such): AllReduce (sum, max, avg) and
// Broadcast from either end, every datatype, several tiles per rank, a partial last one, uneven
// slices, each element checked (and AllGather, which does not take the tiles, beside them).
TEST(Shm, ResultTilesCarryEveryRanksResults) {
  // LOOMTEST_QUICK=1 (tools/test.sh's sanitizer stage, after the first stage ran all three): 2 and
  // 3 ranks, where a rank has one peer and several.
  const bool all = !loomtest::quick();
  for (int n : {2, 3, 4}) {
    if (n == 4 && !all) continue;
    WorkerResult res = runTileWorkers(n, "tiles");
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(res.exitedWith(r, 0)) << n << " ranks, rank " << r << ": " << res.describe(r);
      EXPECT_NE(res.output[r].find("ran 120 cases"), std::string::npos) << res.output[r];
      for (const char* coll : {"AllReduce", "Broadcast"}) {
        // The line that says how this collective ran through the tiles.
        bool tiled = false;
        std::istringstream lines(res.output[r]);
        for (std::string line; std::getline(lines, line);)
          tiled = tiled || (line.find(std::string(coll) + " of ") != std::string::npos &&
                            line.find("results through shared tiles") != std::string::npos);
        EXPECT_TRUE(tiled) << coll << " never ran through the tiles: " << res.output[r];
      }
    }
  }
}

// One rank with the tiles off: every rank writes the results with process_vm_writev instead.
TEST(Shm, ResultTilesOnlyWhereEveryRankAgrees) {
  WorkerResult res = runTileWorkers(2, "tiles:mixed");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    const std::string& said = res.output[r];
    EXPECT_EQ(said.find("results through shared tiles"), std::string::npos) << said;
    EXPECT_NE(said.find("(process_vm_readv/writev)"), std::string::npos) << said;
  }
}

// By default (LOOM_SHM_RESULT_TILES=1) each rank measures both ways of passing cold results, the
// tiles first, then process_vm_writev (src/runtime/tile_choice.h), and every case still checks out
// whichever way each call took. Needs a core per rank: where the ranks outnumber the cores the
// default takes no tiles at all.
TEST(Shm, MeasuredChoiceTakesBothWaysOfPassingResults) {
  // The rule the communicator applies (Comm::computeLocality: ranks outnumbering usableCpus()).
  if (loom::usableCpus() < 2)
    GTEST_SKIP() << "needs 2 usable cores for 2 ranks (this process may use " << loom::usableCpus()
                 << "): with fewer the default passes no result tiles";
  WorkerResult res = runTileWorkers(2, "tiles", "1");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    const std::string& said = res.output[r];
    EXPECT_NE(said.find("ran 120 cases"), std::string::npos) << said;
    for (const char* coll : {"AllReduce", "Broadcast"}) {
      const std::string measured = std::string(coll) + " results passed to the peers measured at ";
      EXPECT_NE(said.find(measured), std::string::npos)
          << "rank " << r << " never measured both ways for " << coll << ": " << said;
    }
  }
}

// A rank killed while its peers wait for its result tiles (or it for theirs).
TEST(Failure, KilledRankOnTheResultTilesIsNamed) {
  WorkerResult res = runWorkers(
      3, "kill:1", {{"LOOM_TIMEOUT", "30"}, {"LOOM_SHM_RESULT_TILES", "2"}, {"LOOM_NT_MIN", "1"}});
  EXPECT_TRUE(res.killedBySignal(1)) << res.describe(1);
  for (int r : {0, 2}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

// The same killed rank on the shared-memory transport's own path (no one pass).
TEST(Failure, KilledRankOnTheShmTransportIsNamed) {
  WorkerResult res =
      runWorkers(3, "kill:1", {{"LOOM_TIMEOUT", "30"}, {"LOOM_SHM_MAPPED_CMA", "0"}});
  EXPECT_TRUE(res.killedBySignal(1)) << res.describe(1);
  for (int r : {0, 2}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Failure, KilledRankOnTheMappedPathIsNamed) {
  WorkerResult res = runWorkers(3, "killmapped:2", {{"LOOM_TIMEOUT", "30"}});
  EXPECT_TRUE(res.killedBySignal(2)) << res.describe(2);
  for (int r : {0, 1}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
  EXPECT_EQ(segmentsOf(res), std::vector<std::string>());
}

TEST(Shm, RanksOnDifferentPathsFailInsteadOfHanging) {
  // Rank 0's count is small enough for the low-latency exchange, rank 1's goes through the
  // direct schedule: each must notice the other is elsewhere and fail, well before LOOM_TIMEOUT.
  ThreadRanks tr(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  auto t0 = std::chrono::steady_clock::now();
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    size_t count = rank == 0 ? 16 : size_t(1) << 20;
    std::vector<float> a(count, 1.0f), b(count);
    loomResult_t r = loomAllReduce(a.data(), b.data(), count, loomFloat32, loomSum, comm, nullptr);
    if (r == loomSuccess) return "rank " + std::to_string(rank) + " did not fail";
    std::string msg = loomGetLastError();
    if (r != loomInvalidUsage || msg.find("calls differ between ranks") == std::string::npos)
      return "rank " + std::to_string(rank) + ": unclear error: " + msg;
    return "";
  });
  EXPECT_EQ(all, "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(Failure, AbortWakesABlockedCall) {
  ThreadRanks tr(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::atomic<bool> started{false};
  loomResult_t got = loomSuccess;
  std::string msg;
  auto t0 = std::chrono::steady_clock::now();
  std::thread blocked([&] {
    std::vector<float> buf(16);
    started = true;
    got = loomRecv(buf.data(), 16, loomFloat32, 1, tr.comm(0), nullptr);  // rank 1 never sends
    msg = loomGetLastError();
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(loomCommAbort(tr.comm(0)), loomSuccess);
  tr.release(0);
  blocked.join();
  EXPECT_EQ(got, loomAborted) << msg;
  // Well under LOOM_TIMEOUT (60 s): the abort, not the deadline, ended the call.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

// loomCommAbort from another thread at any moment: a thread that keeps calling (or that queued
// calls in a group before the abort and ends the group after it) gets loomAborted and never
// touches the freed communicator (the handle stays valid: ASan would see a use after free); a
// later loomCommDestroy of the aborted handle is harmless.
TEST(Failure, CallsRacingAnAbortFailCleanly) {
  for (int round = 0; round < 40; ++round) {
    ThreadRanks tr(1);  // one rank: every call returns at once, so the caller keeps entering
    ASSERT_TRUE(tr.ok()) << tr.error();
    std::atomic<bool> go{false};
    std::vector<loomResult_t> seen;
    std::thread caller([&] {
      std::vector<float> buf(16);
      while (!go) std::this_thread::yield();
      for (int i = 0; i < 100000; ++i) {
        loomResult_t r;
        if (round % 2 == 0) {
          r = loomAllReduce(buf.data(), buf.data(), 16, loomFloat32, loomSum, tr.comm(0), nullptr);
        } else {  // queued in a group before the abort, run after it
          loomGroupStart();
          loomResult_t q =
              loomAllReduce(buf.data(), buf.data(), 16, loomFloat32, loomSum, tr.comm(0), nullptr);
          r = loomGroupEnd();
          if (q != loomSuccess) r = q;
        }
        seen.push_back(r);
        if (r != loomSuccess) break;
      }
    });
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (round % 7)));
    EXPECT_EQ(loomCommAbort(tr.comm(0)), loomSuccess) << loomGetLastError();
    caller.join();
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), loomAborted) << "round " << round << ": " << seen.size() << " calls";
    // After the abort: every call on the handle says so.
    std::vector<float> buf(16);
    EXPECT_EQ(loomAllReduce(buf.data(), buf.data(), 16, loomFloat32, loomSum, tr.comm(0), nullptr),
              loomAborted);
    loomResult_t async = loomSuccess;
    EXPECT_EQ(loomCommGetAsyncError(tr.comm(0), &async), loomSuccess);
    EXPECT_EQ(async, loomAborted);
    EXPECT_EQ(loomCommAbort(tr.comm(0)), loomSuccess);
    EXPECT_EQ(loomCommDestroy(tr.comm(0)), loomSuccess);
    tr.release(0);
  }
}

TEST(Failure, DeadlinePassesWithATimeoutError) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<loomComm_t> comms(2, nullptr);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
      cfg.timeoutMs = 1500;
      EXPECT_EQ(loomCommInitRankConfig(&comms[r], 2, id, r, &cfg), loomSuccess)
          << loomGetLastError();
    });
  for (auto& t : ts) t.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> buf(16);
  EXPECT_EQ(loomRecv(buf.data(), 16, loomFloat32, 1, comms[0], nullptr), loomTimeout);
  EXPECT_NE(std::string(loomGetLastError()).find("rank 1"), std::string::npos)
      << loomGetLastError();
  for (auto c : comms) loomCommDestroy(c);
}

// ---- Communicator management and groups
// ----------------------------------------------------------

TEST(Comm, SplitByParity) {
  ThreadRanks tr(5);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    loomComm_t sub = nullptr;
    int color = rank == 4 ? LOOM_SPLIT_NOCOLOR : rank % 2;
    if (loomCommSplit(comm, color, -rank, &sub, nullptr) != loomSuccess) return loomGetLastError();
    if (color == LOOM_SPLIT_NOCOLOR) return sub == nullptr ? "" : "NOCOLOR gave a communicator";
    int n = 0, me = -1;
    loomCommCount(sub, &n);
    loomCommUserRank(sub, &me);
    int wantN = 2;                                  // {0, 2} and {1, 3}
    int wantMe = (rank == 0 || rank == 1) ? 1 : 0;  // key = -rank: higher old rank first
    std::string err;
    if (n != wantN || me != wantMe)
      err = "rank " + std::to_string(rank) + " got " + std::to_string(me) + "/" + std::to_string(n);
    if (err.empty())
      err = runCase(sub, me, n, {Coll::kAllReduce, loomInt32, loomSum, 1001, false, 0});
    loomCommDestroy(sub);
    return err;
  });
  EXPECT_EQ(all, "");
}

TEST(Group, OneThreadDrivesEveryRank) {
  const int n = 4;
  std::vector<loomComm_t> comms(n);
  ASSERT_EQ(loomCommInitAll(comms.data(), n, nullptr), loomSuccess) << loomGetLastError();
  const size_t count = 10007;
  std::vector<std::vector<int64_t>> in(n, std::vector<int64_t>(count)),
      out(n, std::vector<int64_t>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<int64_t>(i) * (r + 1);
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(
        loomAllReduce(in[r].data(), out[r].data(), count, loomInt64, loomSum, comms[r], nullptr),
        loomSuccess);
  ASSERT_EQ(loomGroupEnd(), loomSuccess) << loomGetLastError();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[r][i], static_cast<int64_t>(i) * 10) << r << " " << i;
  for (auto c : comms) loomCommDestroy(c);
}

TEST(Group, SendRecvToEveryPeerAtOnce) {
  ThreadRanks& tr = ranksOf(5);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    const int n = tr.size();
    const size_t count = 5000;
    std::vector<std::vector<int32_t>> send(n, std::vector<int32_t>(count)),
        recv(n, std::vector<int32_t>(count, -1));
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i)
        send[p][i] = rank * 100000 + p * 1000 + static_cast<int32_t>(i % 1000);
    loomGroupStart();
    for (int p = 0; p < n; ++p) {
      loomSend(send[p].data(), count, loomInt32, p, comm, nullptr);
      loomRecv(recv[p].data(), count, loomInt32, p, comm, nullptr);
    }
    if (loomGroupEnd() != loomSuccess) return loomGetLastError();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i)
        if (recv[p][i] != p * 100000 + rank * 1000 + static_cast<int32_t>(i % 1000))
          return "rank " + std::to_string(rank) + " wrong data from " + std::to_string(p);
    return "";
  });
  EXPECT_EQ(all, "");
}

// ---- Registration (loomCommRegister) -----------------------------------------------------------

// Over the emulated InfiniBand device: allreduces on registered buffers make no ibv_reg_mr call
// once the connections exist, allreduces on unregistered ones do (per message), and deregistering
// releases the NIC registrations (workers.cc, regCountMode).
TEST(Registration, RegisteredBuffersAreNotRegisteredPerMessage) {
#ifndef LOOMTEST_FAKEVERBS_LIB
  GTEST_SKIP() << "needs the emulated verbs device (libloom-fakeverbs.so), which is not built";
#else
  for (int n : {2, 3}) {
    WorkerResult res = runWorkers(n, "regcount",
                                  {{"LOOM_NET", "ib"},
                                   {"LOOM_IBVERBS_LIB", LOOMTEST_FAKEVERBS_LIB},
                                   {"LOOM_SHM_DISABLE", "1"}});
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(res.exitedWith(r, 0)) << n << " ranks, rank " << r << ": " << res.describe(r);
      EXPECT_NE(res.output[r].find("reg_mr_calls registered +0 unregistered +"), std::string::npos)
          << res.output[r];
    }
  }
#endif
}

// Registered buffers give the same results over every path of the thread ranks (shared memory
// here; sockets, the emulated IB device and the plugin in the ctest variants), with registrations
// that overlap and are released in another order than they were made.
TEST(Registration, OverlappingRegistrationsOnEveryCollective) {
  ThreadRanks& tr = ranksOf(3);
  ASSERT_TRUE(tr.ok()) << tr.error();
  std::string all = tr.run([&](int rank, loomComm_t comm) -> std::string {
    const size_t kCount = 5000;
    std::vector<float> in(kCount * 3), out(kCount * 3);
    void *whole = nullptr, *half = nullptr, *outH = nullptr;
    if (loomCommRegister(comm, in.data(), in.size() * sizeof(float), &whole) != loomSuccess ||
        loomCommRegister(comm, in.data() + 7, in.size() / 2 * sizeof(float), &half) !=
            loomSuccess ||
        loomCommRegister(comm, out.data(), out.size() * sizeof(float), &outH) != loomSuccess)
      return std::string("loomCommRegister: ") + loomGetLastError();
    if (whole == half || whole == outH || half == outH) return "two registrations, one handle";
    for (int it = 0; it < 3; ++it) {
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((rank + 1) * (i % 13 + it));
      // At an offset inside the registrations.
      if (loomAllReduce(in.data() + 9, out.data() + 3, kCount, loomFloat32, loomSum, comm,
                        nullptr) != loomSuccess)
        return std::string("allreduce: ") + loomGetLastError();
      for (size_t i = 0; i < kCount; ++i)
        if (out[3 + i] != static_cast<float>(6 * ((i + 9) % 13 + it)))
          return "rank " + std::to_string(rank) + " element " + std::to_string(i) + " is " +
                 std::to_string(out[3 + i]);
    }
    if (loomCommDeregister(comm, whole) != loomSuccess ||
        loomCommDeregister(comm, outH) != loomSuccess ||
        loomCommDeregister(comm, half) != loomSuccess)
      return std::string("loomCommDeregister: ") + loomGetLastError();
    return "";
  });
  EXPECT_EQ(all, "");
}

TEST(Group, ErrorsNameTheCall) {
  ThreadRanks& tr = ranksOf(1);
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(loomGetErrorString(loomSuccess), std::string("no error"));
  EXPECT_STRNE(loomGetErrorString(loomRemoteError), loomGetErrorString(loomSystemError));
  EXPECT_EQ(loomAllGather(nullptr, nullptr, 3, loomInt8, tr.comm(0), nullptr), loomInvalidArgument);
  EXPECT_EQ(std::string(loomGetLastError()).rfind("loomAllGather", 0), 0u) << loomGetLastError();
  int v = 0;
  EXPECT_EQ(loomGetVersion(&v), loomSuccess);
  EXPECT_EQ(v, LOOM_VERSION_CODE);
}

}  // namespace
}  // namespace loomtest

int main(int argc, char** argv) {
  if (getenv("LOOM_TEST_WORKER")) return loomtest::workerMain();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
