// The recursive doubling AllReduce ("rd"): registration, step counts, and the order in which every
// rank combines its operands. (generators_test verifies it with every registered generator.)
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"

namespace loom {
namespace {

TEST(RecursiveDoublingAllReduce, RegisteredAfterRing) {
  const AlgorithmInfo* rd = findAlgorithm(CollKind::kAllReduce, "rd");
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->coll, CollKind::kAllReduce);
  EXPECT_STREQ(defaultAlgorithm(CollKind::kAllReduce)->name, "ring");
  EXPECT_LT(findAlgorithm(CollKind::kAllReduce, "ring"), rd);
}

struct Counts {
  int sends = 0;
  int recvs = 0;  // Recv and RecvReduce
};
Counts countComm(const RankSchedule& rs, size_t count) {
  Counts c;
  for (const Step& st : rs.steps) {
    EXPECT_EQ(st.count, count);  // every step moves or combines the whole vector
    c.sends += st.kind == StepKind::kSend;
    c.recvs += st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce;
  }
  return c;
}

// Power of two: exactly log2(n) sends and receives per rank, each of the whole vector.
TEST(RecursiveDoublingAllReduce, StepCountsPowerOfTwo) {
  const AlgorithmInfo* rd = findAlgorithm(CollKind::kAllReduce, "rd");
  ASSERT_NE(rd, nullptr);
  for (int n = 2; n <= 128; n *= 2) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.nranks = n;
      a.count = 37;
      a.inPlace = inPlace;
      const Schedule s = buildSchedule(*rd, a);
      for (const RankSchedule& rs : s.ranks) {
        const Counts c = countComm(rs, a.count);
        EXPECT_EQ(c.sends, log2Floor(n));
        EXPECT_EQ(c.recvs, log2Floor(n));
        // Scratch: none for one step out of place, else one vector, in place with an odd
        // number (>= 3) of steps two.
        const int steps = log2Floor(n);
        const size_t scratch = steps == 1 && !inPlace                    ? 0
                               : inPlace && steps % 2 == 1 && steps >= 3 ? 2
                                                                         : 1;
        EXPECT_EQ(rs.scratchCount, scratch * a.count);
      }
    }
  }
}

// Otherwise, with p = 2^floor(log2 n) and e = n - p: the e odd ranks 1, 3, .., 2e-1 send once and
// receive once, the ranks 0, 2, .., 2e-2 they fold into do one exchange more than the others.
TEST(RecursiveDoublingAllReduce, StepCountsWithFold) {
  const AlgorithmInfo* rd = findAlgorithm(CollKind::kAllReduce, "rd");
  ASSERT_NE(rd, nullptr);
  for (int n : {3, 5, 6, 7, 12, 33, 63, 100}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int steps = log2Floor(n);
    const int extras = n - (1 << steps);
    CollArgs a;
    a.nranks = n;
    a.count = 5;
    const Schedule s = buildSchedule(*rd, a);
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      const Counts c = countComm(s.ranks[static_cast<size_t>(r)], a.count);
      const int expected = r >= 2 * extras ? steps : r % 2 == 1 ? 1 : steps + 1;
      EXPECT_EQ(c.sends, expected);
      EXPECT_EQ(c.recvs, expected);
    }
  }
}

TEST(RecursiveDoublingAllReduce, SingleRank) {
  const AlgorithmInfo* rd = findAlgorithm(CollKind::kAllReduce, "rd");
  ASSERT_NE(rd, nullptr);
  CollArgs a;
  a.nranks = 1;
  a.count = 9;
  Schedule s = buildSchedule(*rd, a);
  ASSERT_EQ(s.ranks[0].steps.size(), 1u);
  EXPECT_EQ(s.ranks[0].steps[0].kind, StepKind::kCopy);
  a.inPlace = true;
  s = buildSchedule(*rd, a);
  EXPECT_TRUE(s.ranks[0].steps.empty());
}

// Runs an AllReduce schedule on expression strings: rank r's input element is "r", a reduction
// writes "(a+b)" in the operand order the executor uses (RecvReduce: src op received; Reduce:
// dst op src). Steps run in order, sends are buffered: the data each step sees is the data it sees
// under the executor's rules, which only reorder steps that do not conflict. Returns, per rank, the
// output expressions, or an empty vector if the ranks cannot all finish.
std::vector<std::vector<std::string>> runSymbolic(const Schedule& s) {
  const int n = s.args.nranks;
  const size_t c = s.args.count;
  struct RankBufs {
    std::vector<std::string> input, output, scratch;
    size_t pc = 0;
  };
  std::vector<RankBufs> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    RankBufs& rb = ranks[static_cast<size_t>(r)];
    rb.input.assign(c, std::to_string(r));
    rb.output.assign(c, s.args.inPlace ? std::to_string(r) : "?");
    rb.scratch.assign(s.ranks[static_cast<size_t>(r)].scratchCount, "?");
  }
  auto at = [&](RankBufs& rb, BufRef ref, size_t i) -> std::string& {
    switch (ref.buf) {
      case BufKind::kInput:
        return (s.args.inPlace ? rb.output : rb.input).at(ref.offset + i);
      case BufKind::kOutput:
        return rb.output.at(ref.offset + i);
      case BufKind::kScratch:
        break;
    }
    return rb.scratch.at(ref.offset + i);
  };
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::string>>> inFlight;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      RankBufs& rb = ranks[static_cast<size_t>(r)];
      const std::vector<Step>& steps = s.ranks[static_cast<size_t>(r)].steps;
      while (rb.pc < steps.size()) {
        const Step& st = steps[rb.pc];
        std::vector<std::string> msg;
        if (st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce) {
          auto& q = inFlight[{st.peer, r, st.channel}];
          if (q.empty()) break;
          msg = std::move(q.front());
          q.pop_front();
          EXPECT_EQ(msg.size(), st.count);
          if (msg.size() != st.count) return {};
        }
        std::vector<std::string> out(st.count);
        for (size_t i = 0; i < st.count; ++i) {
          switch (st.kind) {
            case StepKind::kSend:
              out[i] = at(rb, st.src, i);
              break;
            case StepKind::kRecv:
              out[i] = msg[i];
              break;
            case StepKind::kRecvReduce:
              out[i] = "(" + at(rb, st.src, i) + "+" + msg[i] + ")";
              break;
            case StepKind::kCopy:
              out[i] = at(rb, st.src, i);
              break;
            case StepKind::kReduce:
              out[i] = "(" + at(rb, st.dst, i) + "+" + at(rb, st.src, i) + ")";
              break;
          }
        }
        if (st.kind == StepKind::kSend) {
          inFlight[{r, st.peer, st.channel}].push_back(std::move(out));
        } else {
          for (size_t i = 0; i < st.count; ++i) at(rb, st.dst, i) = std::move(out[i]);
        }
        ++rb.pc;
        progress = true;
      }
    }
  }
  std::vector<std::vector<std::string>> outputs;
  for (int r = 0; r < n; ++r) {
    RankBufs& rb = ranks[static_cast<size_t>(r)];
    if (rb.pc != s.ranks[static_cast<size_t>(r)].steps.size()) return {};
    outputs.push_back(rb.output);
  }
  return outputs;
}

// Every rank ends with the same expression, operand order included, so floats come out
// bit-identical on every rank even where the op is commutative only up to NaN payloads or the
// sign of zero. Checked for every registered AllReduce generator.
TEST(AllReduceCombinationOrder, SameOnEveryRank) {
  for (const AlgorithmInfo& algo : algorithms()) {
    if (algo.coll != CollKind::kAllReduce) continue;
    for (int n = 1; n <= 70; ++n) {
      for (size_t count : {size_t{1}, size_t{3}, static_cast<size_t>(n + 1)}) {
        for (bool inPlace : {false, true}) {
          SCOPED_TRACE(::testing::Message() << algo.name << " n=" << n << " count=" << count
                                            << (inPlace ? " in place" : ""));
          CollArgs a;
          a.nranks = n;
          a.count = count;
          a.inPlace = inPlace;
          const auto outputs = runSymbolic(buildSchedule(algo, a));
          ASSERT_EQ(outputs.size(), static_cast<size_t>(n));
          for (int r = 1; r < n; ++r) {
            ASSERT_EQ(outputs[static_cast<size_t>(r)], outputs[0]) << "rank " << r;
          }
          if (n > 1) {
            EXPECT_EQ(outputs[0][0].front(), '(') << outputs[0][0];
          }
        }
      }
    }
  }
}

// The recursive doubling expression is the balanced tree over ranks in rank order: for n = 4,
// ((0+1)+(2+3)); with the fold (n = 3), ((0+1)+2).
TEST(RecursiveDoublingAllReduce, CombinationTree) {
  const AlgorithmInfo* rd = findAlgorithm(CollKind::kAllReduce, "rd");
  ASSERT_NE(rd, nullptr);
  CollArgs a;
  a.count = 2;
  a.nranks = 4;
  auto outputs = runSymbolic(buildSchedule(*rd, a));
  ASSERT_EQ(outputs.size(), 4u);
  EXPECT_EQ(outputs[3][1], "((0+1)+(2+3))");
  a.nranks = 3;
  outputs = runSymbolic(buildSchedule(*rd, a));
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[1][0], "((0+1)+2)");
  a.nranks = 6;
  outputs = runSymbolic(buildSchedule(*rd, a));
  ASSERT_EQ(outputs.size(), 6u);
  EXPECT_EQ(outputs[5][0], "(((0+1)+(2+3))+(4+5))");
}

}  // namespace
}  // namespace loom
