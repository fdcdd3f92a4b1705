// Lowering: piece splits, staging, and dependencies proven by executing the pieces of every rank
// numerically in many random orders that respect the dependencies and the posting order.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"
#include "tests/algorithms/shards.h"

namespace loom {
namespace {

TEST(Lower, SplitsStepsIntoPieces) {
  RankSchedule rs;
  rs.scratchCount = 12;
  rs.steps = {
      mk(StepKind::kCopy, -1, BufRef{BufKind::kInput, 2}, BufRef{BufKind::kScratch, 1}, 10),
      mk(StepKind::kSend, 1, BufRef{BufKind::kInput, 0}, BufRef{}, 0),
      mk(StepKind::kRecvReduce, 1, BufRef{BufKind::kInput, 0}, BufRef{BufKind::kOutput, 0}, 4)};
  LoweredSchedule l = lowerSchedule(rs, 3);
  EXPECT_EQ(l.scratchCount, 12u);
  ASSERT_EQ(l.pieces.size(), 6u);  // 3+3+3+1, nothing for the empty send, 3+1
  const size_t counts[] = {3, 3, 3, 1, 3, 1};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(l.pieces[i].step.count, counts[i]) << i;
  EXPECT_EQ(l.pieces[3].step.src.offset, 11u);
  EXPECT_EQ(l.pieces[3].step.dst.offset, 10u);
  EXPECT_EQ(l.pieces[5].step.src.offset, 3u);
  EXPECT_EQ(l.pieces[5].step.dst.offset, 3u);
  EXPECT_EQ(l.pieces[4].stagingOffset, 0u);
  EXPECT_EQ(l.pieces[5].stagingOffset, 3u);
  EXPECT_EQ(l.stagingCount, 4u);
  // Reading the input the copy also reads is no conflict; the pieces are independent.
  for (const Piece& p : l.pieces) EXPECT_TRUE(p.deps.empty());

  l = lowerSchedule(rs, 0);  // no split
  ASSERT_EQ(l.pieces.size(), 2u);
  EXPECT_EQ(l.pieces[0].step.count, 10u);
  l = lowerSchedule(rs, 1000);
  ASSERT_EQ(l.pieces.size(), 2u);
  l = lowerSchedule(rs, 1);
  EXPECT_EQ(l.pieces.size(), 14u);
}

// A forwarded piece depends on exactly the same piece's receive: what pipelines a chain.
TEST(Lower, ChainForwardDependsOnSamePiece) {
  const CollArgs a = callArgs(CollKind::kBroadcast, /*n=*/4, /*count=*/10);
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kBroadcast), a);
  const LoweredSchedule l = lowerSchedule(s.ranks[1], bufferLayout(a, 1), 4);
  ASSERT_EQ(l.pieces.size(), 6u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(l.pieces[k].step.kind, StepKind::kRecv);
    EXPECT_TRUE(l.pieces[k].deps.empty());
    EXPECT_EQ(l.pieces[3 + k].step.kind, StepKind::kSend);
    EXPECT_EQ(l.pieces[3 + k].deps, std::vector<uint32_t>{static_cast<uint32_t>(k)});
  }
}

TEST(Lower, DepsCoverWarRawWaw) {
  const BufRef s0{BufKind::kScratch, 0};
  RankSchedule rs;
  rs.scratchCount = 8;
  rs.steps = {mk(StepKind::kRecv, 1, BufRef{}, s0, 4),                            // 0 writes s[0,4)
              mk(StepKind::kSend, 1, s0, BufRef{}, 4),                            // 1 reads s[0,4)
              mk(StepKind::kSend, 2, BufRef{BufKind::kScratch, 2}, BufRef{}, 4),  // 2 reads s[2,6)
              mk(StepKind::kRecv, 1, BufRef{}, BufRef{BufKind::kScratch, 3}, 2),  // 3 writes s[3,5)
              mk(StepKind::kReduce, -1, BufRef{BufKind::kInput, 0}, s0, 8),       // 4 rw s[0,8)
              mk(StepKind::kSend, 1, BufRef{BufKind::kScratch, 7}, BufRef{}, 1)};  // 5 reads s[7]
  rs.scratchCount = 8;
  const LoweredSchedule l = lowerSchedule(rs, 0);
  ASSERT_EQ(l.pieces.size(), 6u);
  EXPECT_EQ(l.pieces[1].deps, (std::vector<uint32_t>{0}));
  EXPECT_EQ(l.pieces[2].deps, (std::vector<uint32_t>{0}));
  EXPECT_EQ(l.pieces[3].deps, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(l.pieces[4].deps, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(l.pieces[5].deps, (std::vector<uint32_t>{4}));
}

// In place, the input and output alias: only the layout-aware lowering sees the conflict.
TEST(Lower, InPlaceAliasingNeedsTheLayout) {
  CollArgs a;
  a.coll = CollKind::kAllToAll;
  a.nranks = 3;
  a.count = 2;
  a.inPlace = true;
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllToAll), a);
  const RankSchedule& rs = s.ranks[0];
  // Steps: copy input[2,6) to scratch, then send/recv pairs; recvs write output blocks 2 and 1.
  const LoweredSchedule aliased = lowerSchedule(rs, bufferLayout(a, 0), 0);
  const LoweredSchedule plain = lowerSchedule(rs, 0);
  ASSERT_EQ(aliased.pieces.size(), plain.pieces.size());
  bool sawAliasDep = false;
  for (size_t i = 0; i < plain.pieces.size(); ++i) {
    if (plain.pieces[i].step.kind != StepKind::kRecv) continue;
    EXPECT_TRUE(plain.pieces[i].deps.empty());
    EXPECT_EQ(aliased.pieces[i].deps, std::vector<uint32_t>{0});  // waits for the copy
    sawAliasDep = true;
  }
  EXPECT_TRUE(sawAliasDep);
}

TEST(Lower, IsFast) {
  CollArgs a;
  a.nranks = 64;
  a.count = 64 * 40;
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllReduce), a);
  const auto t0 = std::chrono::steady_clock::now();
  const LoweredSchedule l = lowerSchedule(s.ranks[5], bufferLayout(a, 5), 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(l.pieces.size(), 4u * 63 * 40);
  EXPECT_LT(secs, 0.1) << l.pieces.size() << " pieces";
  for (const Piece& p : l.pieces) EXPECT_LE(p.deps.size(), 2u);
}

// ---- Numeric execution of lowered schedules ---------------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t inputValue(int r, size_t i) { return mix((static_cast<uint64_t>(r) << 32) ^ i); }

struct RankMem {
  std::vector<uint64_t> in, out, scratch, staging;
  uint64_t* inBase = nullptr;
  uint64_t* outBase = nullptr;
  uint64_t* at(BufRef ref) {
    switch (ref.buf) {
      case BufKind::kInput:
        return inBase + ref.offset;
      case BufKind::kOutput:
        return outBase + ref.offset;
      case BufKind::kScratch:
        return scratch.data() + ref.offset;
    }
    return nullptr;
  }
};

// Runs every rank's lowered pieces with random interleaving. In order (the model of schedule.h), a
// rank starts its next piece once all its deps are done; otherwise (dataflow, what an executor with
// per-peer queues may do) any piece whose deps are done may start, provided the earlier pieces of
// the same (peer, channel, direction) have started. transfers happen at a random time after both
// sides are posted (the sender's source is read then); local operations and the reduction of a
// received piece happen at a random time after they start. Returns an empty string, or what went
// wrong.
std::string runRandom(const CollArgs& a, const std::vector<LoweredSchedule>& low, bool inOrder,
                      std::mt19937_64& rng) {
  const int n = a.nranks;
  const size_t c = a.count;
  std::vector<RankMem> mem(n);
  for (int r = 0; r < n; ++r) {
    const BufferLayout l = bufferLayout(a, r);
    RankMem& m = mem[r];
    m.in.resize(l.inputCount);
    m.out.resize(l.outputCount);
    for (auto& v : m.out) v = rng();
    m.scratch.resize(low[r].scratchCount);
    for (auto& v : m.scratch) v = rng();
    m.staging.resize(low[r].stagingCount);
    for (auto& v : m.staging) v = rng();
    m.inBase = m.in.data();
    m.outBase = m.out.data();
    if (l.inputInOutput) m.inBase = m.out.data() + l.inputOffsetInOutput;
    if (l.outputInInput) m.outBase = m.in.data() + l.outputOffsetInInput;
    for (size_t i = 0; i < l.inputCount; ++i) m.inBase[i] = inputValue(r, i);
  }
  // Expected outputs (sum, wrapping).
  std::vector<std::vector<uint64_t>> want(n);
  for (int r = 0; r < n; ++r) {
    const BufferLayout l = bufferLayout(a, r);
    want[r].resize(l.outputCount);
    for (size_t j = 0; j < l.outputCount; ++j) {
      uint64_t sum = 0;
      switch (a.coll) {
        case CollKind::kAllReduce:
        case CollKind::kReduce:
          for (int p = 0; p < n; ++p) sum += inputValue(p, j);
          break;
        case CollKind::kBroadcast:
          sum = inputValue(a.root, j);
          break;
        case CollKind::kAllGather:
          sum = inputValue(static_cast<int>(j / c), j % c);
          break;
        case CollKind::kReduceScatter:
          for (int p = 0; p < n; ++p) sum += inputValue(p, r * c + j);
          break;
        case CollKind::kAllToAll:
          sum = inputValue(static_cast<int>(j / c), r * c + j % c);
          break;
        case CollKind::kSendRecv:
          break;
      }
      want[r][j] = sum;
    }
  }

  enum State : uint8_t { kIdle, kPosted, kArrived, kDone };
  auto isComm = [](StepKind k) {
    return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
  };
  std::vector<std::vector<uint8_t>> state(n);
  std::vector<std::vector<uint32_t>> remaining(n);  // unmet deps per piece
  std::vector<std::vector<std::vector<uint32_t>>> dependents(n);
  std::vector<size_t> next(n, 0);  // in order: the next piece to start
  // Dataflow: per (peer, channel, isSend) the pieces in order and the next one to start, and the
  // local pieces whose deps are met.
  using QKey = std::tuple<int, int, bool>;
  std::vector<std::map<QKey, std::pair<std::vector<uint32_t>, size_t>>> queues(n);
  std::vector<std::vector<uint32_t>> readyLocal(n);
  for (int r = 0; r < n; ++r) {
    const size_t np = low[r].pieces.size();
    state[r].assign(np, kIdle);
    remaining[r].resize(np);
    dependents[r].resize(np);
    for (uint32_t i = 0; i < np; ++i) {
      const Piece& p = low[r].pieces[i];
      remaining[r][i] = static_cast<uint32_t>(p.deps.size());
      for (uint32_t d : p.deps) dependents[r][d].push_back(i);
      if (isComm(p.step.kind)) {
        queues[r][QKey{p.step.peer, p.step.channel, p.step.kind == StepKind::kSend}]
            .first.push_back(i);
      } else if (p.deps.empty()) {
        readyLocal[r].push_back(i);
      }
    }
  }
  auto complete = [&](int r, uint32_t i) {
    state[r][i] = kDone;
    for (uint32_t d : dependents[r][i]) {
      if (--remaining[r][d] == 0 && !isComm(low[r].pieces[d].step.kind)) {
        readyLocal[r].push_back(d);
      }
    }
  };
  std::map<std::tuple<int, int, int>, std::pair<std::deque<uint32_t>, std::deque<uint32_t>>> chans;
  std::vector<std::pair<int, uint32_t>> local;  // started local ops / arrived RecvReduce pieces

  std::vector<std::pair<int, uint32_t>> evRanks;  // pieces that may start
  std::vector<decltype(chans)::iterator> evChans;
  for (;;) {
    evRanks.clear();
    evChans.clear();
    for (int r = 0; r < n; ++r) {
      if (inOrder) {
        if (next[r] < low[r].pieces.size() && remaining[r][next[r]] == 0) {
          evRanks.emplace_back(r, static_cast<uint32_t>(next[r]));
        }
        continue;
      }
      for (uint32_t i : readyLocal[r]) evRanks.emplace_back(r, i);
      for (auto& [key, q] : queues[r]) {
        if (q.second < q.first.size() && remaining[r][q.first[q.second]] == 0) {
          evRanks.emplace_back(r, q.first[q.second]);
        }
      }
    }
    for (auto it = chans.begin(); it != chans.end(); ++it) {
      if (!it->second.first.empty() && !it->second.second.empty()) evChans.push_back(it);
    }
    const size_t total = evRanks.size() + evChans.size() + local.size();
    if (total == 0) break;
    size_t e = std::uniform_int_distribution<size_t>(0, total - 1)(rng);
    if (e < evRanks.size()) {
      const auto [r, i] = evRanks[e];
      const Step& st = low[r].pieces[i].step;
      if (inOrder) {
        ++next[r];
      } else if (isComm(st.kind)) {
        ++queues[r][QKey{st.peer, st.channel, st.kind == StepKind::kSend}].second;
      } else {
        auto& rl = readyLocal[r];
        rl.erase(std::find(rl.begin(), rl.end(), i));
      }
      state[r][i] = kPosted;
      if (st.kind == StepKind::kSend) {
        chans[{r, st.peer, st.channel}].first.push_back(i);
      } else if (st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce) {
        chans[{st.peer, r, st.channel}].second.push_back(i);
      } else {
        local.emplace_back(r, i);
      }
      continue;
    }
    e -= evRanks.size();
    if (e < evChans.size()) {
      auto it = evChans[e];
      const int from = std::get<0>(it->first), to = std::get<1>(it->first);
      const uint32_t si = it->second.first.front(), ri = it->second.second.front();
      it->second.first.pop_front();
      it->second.second.pop_front();
      const Step& ss = low[from].pieces[si].step;
      const Piece& rp = low[to].pieces[ri];
      if (ss.count != rp.step.count) return "count mismatch at rank " + std::to_string(from);
      const uint64_t* src = mem[from].at(ss.src);
      uint64_t* dst = rp.step.kind == StepKind::kRecv ? mem[to].at(rp.step.dst)
                                                      : mem[to].staging.data() + rp.stagingOffset;
      std::copy(src, src + ss.count, dst);
      complete(from, si);
      if (rp.step.kind == StepKind::kRecv) {
        complete(to, ri);
      } else {
        state[to][ri] = kArrived;
        local.emplace_back(to, ri);
      }
      continue;
    }
    e -= evChans.size();
    const auto [r, i] = local[e];
    local.erase(local.begin() + static_cast<ptrdiff_t>(e));
    const Piece& p = low[r].pieces[i];
    const size_t k = p.step.count;
    const uint64_t* src = mem[r].at(p.step.src);
    uint64_t* dst = mem[r].at(p.step.dst);
    std::vector<uint64_t> tmp(src, src + k);
    switch (p.step.kind) {
      case StepKind::kCopy:
        std::copy(tmp.begin(), tmp.end(), dst);
        break;
      case StepKind::kReduce:
        for (size_t j = 0; j < k; ++j) dst[j] += tmp[j];
        break;
      case StepKind::kRecvReduce:
        for (size_t j = 0; j < k; ++j) dst[j] = tmp[j] + mem[r].staging[p.stagingOffset + j];
        break;
      default:
        return "unexpected local piece";
    }
    complete(r, i);
  }
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < state[r].size(); ++i) {
      if (state[r][i] != kDone) {
        return "rank " + std::to_string(r) + " piece " + std::to_string(i) + " never completed";
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (a.coll == CollKind::kReduce && r != a.root) continue;
    for (size_t j = 0; j < want[r].size(); ++j) {
      if (mem[r].outBase[j] != want[r][j]) {
        return "rank " + std::to_string(r) + " output[" + std::to_string(j) + "] is wrong";
      }
    }
  }
  return std::string();
}

TEST(Lower, RandomOrderExecutionComputesTheCollective) {
  std::mt19937_64 rng(12345);
  for (const AlgorithmInfo& algo : algorithms()) {
    for (int n : {1, 2, 3, 4, 5, 7, 8}) {
      const std::set<size_t> counts = {0,
                                       1,
                                       static_cast<size_t>(n - 1),
                                       static_cast<size_t>(n + 1),
                                       static_cast<size_t>(3 * n + 1),
                                       50};
      forEachCall(algo, n, {counts.begin(), counts.end()}, nullptr, [&](const CollArgs& a) {
        const Schedule s = buildSchedule(algo, a);
        for (size_t pe : {size_t{1}, size_t{3}, size_t{16}, size_t{0}}) {
          std::vector<LoweredSchedule> low;
          for (int r = 0; r < n; ++r)
            low.push_back(lowerSchedule(s.ranks[r], bufferLayout(a, r), pe));
          for (int rep = 0; rep < 3; ++rep) {
            SCOPED_TRACE(::testing::Message()
                         << algo.name << " " << collName(algo.coll) << " n=" << n
                         << " count=" << a.count << " inPlace=" << a.inPlace << " root=" << a.root
                         << " piece=" << pe << " rep=" << rep);
            const std::string err = runRandom(a, low, rep % 2 == 0, rng);
            ASSERT_EQ(err, "");
          }
        }
      });
      if (HasFatalFailure()) return;
    }
  }
}

// The random executor is sensitive enough to catch a missing dependency: drop the deps of every
// piece and some order produces a wrong result.
TEST(Lower, RandomExecutionCatchesMissingDeps) {
  CollArgs a;
  a.coll = CollKind::kAllReduce;
  a.nranks = 4;
  a.count = 8;
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllReduce), a);
  std::vector<LoweredSchedule> low;
  for (int r = 0; r < a.nranks; ++r) {
    low.push_back(lowerSchedule(s.ranks[r], bufferLayout(a, r), 1));
    for (Piece& p : low.back().pieces) p.deps.clear();
  }
  std::mt19937_64 rng(7);
  bool caught = false;
  for (int rep = 0; rep < 20 && !caught; ++rep) caught = !runRandom(a, low, true, rng).empty();
  EXPECT_TRUE(caught);
}

// Lowered without the layout, an in-place schedule misses the input/output aliasing and some
// order goes wrong: the random executor notices.
TEST(Lower, RandomExecutionCatchesMissingAliasing) {
  CollArgs a;
  a.coll = CollKind::kAllToAll;
  a.nranks = 4;
  a.count = 3;
  a.inPlace = true;
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllToAll), a);
  std::vector<LoweredSchedule> low;
  for (int r = 0; r < a.nranks; ++r) low.push_back(lowerSchedule(s.ranks[r], 1));
  std::mt19937_64 rng(11);
  bool caught = false;
  for (int rep = 0; rep < 50 && !caught; ++rep) caught = !runRandom(a, low, rep % 2, rng).empty();
  EXPECT_TRUE(caught);
}

}  // namespace
}  // namespace loom
