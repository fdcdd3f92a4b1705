// The verifier accepts hand-written correct schedules and rejects broken ones with a message that
// names the rank, the step and the element.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"

namespace loom {
namespace {

const BufRef kIn0{BufKind::kInput, 0};
const BufRef kOut0{BufKind::kOutput, 0};
const BufRef kNone{};

Step send(int peer, BufRef src, size_t count, int ch = 0) {
  return mk(StepKind::kSend, peer, src, kNone, count, ch);
}
Step recv(int peer, BufRef dst, size_t count, int ch = 0) {
  return mk(StepKind::kRecv, peer, kNone, dst, count, ch);
}
Step recvReduce(int peer, BufRef src, BufRef dst, size_t count) {
  return mk(StepKind::kRecvReduce, peer, src, dst, count);
}
Step copy(BufRef src, BufRef dst, size_t count) { return mk(StepKind::kCopy, -1, src, dst, count); }
Step reduce(BufRef src, BufRef dst, size_t count) {
  return mk(StepKind::kReduce, -1, src, dst, count);
}

Schedule twoRankAllReduce(size_t count) {
  Schedule s;
  s.args.coll = CollKind::kAllReduce;
  s.args.nranks = 2;
  s.args.count = count;
  s.algorithm = "hand";
  s.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    s.ranks[r].steps = {send(1 - r, kIn0, count), recvReduce(1 - r, kIn0, kOut0, count)};
  }
  return s;
}

Schedule ring(CollKind coll, int n, size_t count, bool inPlace = false) {
  CollArgs a;
  a.coll = coll;
  a.nranks = n;
  a.count = count;
  a.inPlace = inPlace;
  return buildSchedule(*defaultAlgorithm(coll), a);
}

void expectError(const Schedule& s, const std::vector<std::string>& parts) {
  const Status st = verifySchedule(s);
  ASSERT_FALSE(st.isOk()) << "verifier accepted a broken schedule";
  for (const std::string& p : parts) {
    EXPECT_NE(st.message().find(p), std::string::npos)
        << "message lacks '" << p << "': " << st.message();
  }
}

TEST(Verifier, AcceptsHandWrittenAllReduce) {
  const Status st = verifySchedule(twoRankAllReduce(5));
  EXPECT_TRUE(st.isOk()) << st.message();
}

TEST(Verifier, DroppedStep) {
  Schedule s = ring(CollKind::kAllReduce, 4, 9);
  s.ranks[1].steps.pop_back();  // the last allgather receive
  expectError(s, {"never matched", "rank 0", "Send to 1"});
  s = ring(CollKind::kAllReduce, 4, 9);
  // Without rank 2's first send, rank 3's first receive matches the next one: the wrong block.
  s.ranks[2].steps.erase(s.ranks[2].steps.begin());
  expectError(s, {"rank 3 step 1", "element 0", "reduces input[5] with input[3]"});
}

TEST(Verifier, DroppedLocalCopy) {
  Schedule s = ring(CollKind::kAllGather, 3, 4);
  ASSERT_EQ(s.ranks[1].steps[0].kind, StepKind::kCopy);
  s.ranks[1].steps.erase(s.ranks[1].steps.begin());
  expectError(s, {"rank 1 output[4]", "undefined", "never written"});
}

TEST(Verifier, WrongPeer) {
  Schedule s = ring(CollKind::kAllReduce, 4, 8);
  for (Step& st : s.ranks[0].steps) {
    if (st.kind == StepKind::kSend) {
      st.peer = 2;
      break;
    }
  }
  ASSERT_FALSE(verifySchedule(s).isOk());
  s.ranks[0].steps[0].peer = 4;
  expectError(s, {"rank 0 step 0", "peer 4 out of range"});
  s.ranks[0].steps[0].peer = 0;
  expectError(s, {"rank 0 step 0", "itself"});
}

TEST(Verifier, WrongCount) {
  Schedule s = twoRankAllReduce(5);
  s.ranks[0].steps[0].count = 4;
  expectError(s, {"rank 1 step 1", "count 5 differs", "count 4", "rank 0 step 0"});
}

TEST(Verifier, DoubleReduction) {
  Schedule s = twoRankAllReduce(3);
  s.ranks[0].steps.push_back(reduce(kIn0, kOut0, 3));
  expectError(s, {"rank 0 step 2", "element 0", "counts a rank twice", "{0}", "{0-1}"});
}

TEST(Verifier, ReducesDifferentElements) {
  Schedule s = twoRankAllReduce(3);
  s.ranks[1].steps[1].src.offset = 1;
  s.ranks[1].steps[1].count = 2;
  s.ranks[0].steps[0].count = 2;
  expectError(s, {"rank 1 step 1", "reduces input[1] with input[0]"});
}

TEST(Verifier, RecvBeforeSendCycleDeadlocks) {
  Schedule s;
  s.args.coll = CollKind::kAllReduce;
  s.args.nranks = 2;
  s.args.count = 2;
  s.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    // The send reads what the receive writes, so it waits for a receive that waits for it.
    s.ranks[r].steps = {copy(kIn0, kOut0, 2), recvReduce(1 - r, kOut0, kOut0, 2),
                        send(1 - r, kOut0, 2)};
  }
  expectError(s, {"deadlock", "2 rank(s) blocked", "rank 0 step 2", "rank 1 step 2",
                  "never posts the matching send"});
}

TEST(Verifier, IndependentRecvBeforeSendIsFine) {
  // A receive does not block later steps that do not conflict with it.
  Schedule s;
  s.args.coll = CollKind::kAllReduce;
  s.args.nranks = 2;
  s.args.count = 2;
  s.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    s.ranks[r].steps = {recvReduce(1 - r, kIn0, kOut0, 2), send(1 - r, kIn0, 2)};
  }
  const Status st = verifySchedule(s);
  EXPECT_TRUE(st.isOk()) << st.message();
}

TEST(Verifier, OutOfBounds) {
  Schedule s = twoRankAllReduce(4);
  s.ranks[1].steps[1].dst.offset = 1;
  expectError(s, {"rank 1 step 1", "dst range output[1, 5) is out of bounds", "4 elements"});
  s = twoRankAllReduce(4);
  s.ranks[0].steps[0].src = BufRef{BufKind::kScratch, 0};
  expectError(s, {"rank 0 step 0", "scratch has 0 elements"});
}

TEST(Verifier, WritesUserInput) {
  Schedule s = twoRankAllReduce(4);
  s.ranks[0].steps[1].dst = kIn0;
  expectError(s, {"rank 0 step 1", "must not write"});
  // In place ReduceScatter: only the rank's own block of the input is writable.
  s = ring(CollKind::kReduceScatter, 3, 2, /*inPlace=*/true);
  ASSERT_TRUE(verifySchedule(s).isOk());
  s.ranks[0].steps.push_back(copy(BufRef{BufKind::kScratch, 0}, BufRef{BufKind::kInput, 2}, 2));
  expectError(s, {"rank 0 step", "must not write"});
}

TEST(Verifier, NonRootReduceOutputUntouched) {
  const CollArgs a = callArgs(CollKind::kReduce, /*n=*/3, /*count=*/4);
  Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kReduce), a);
  ASSERT_TRUE(verifySchedule(s).isOk());
  s.ranks[1].steps.push_back(copy(kIn0, kOut0, 4));
  expectError(s, {"rank 1 step", "must not write"});
}

TEST(Verifier, PartialOverlap) {
  Schedule s = twoRankAllReduce(4);
  s.ranks[0].scratchCount = 8;
  s.ranks[0].steps.insert(s.ranks[0].steps.begin(),
                          copy(BufRef{BufKind::kScratch, 0}, BufRef{BufKind::kScratch, 2}, 4));
  expectError(s, {"rank 0 step 0", "overlap partially"});
}

// The hazard rule: a step that writes the source of a pending send waits for the send to complete.
// Here that wait closes a cycle: rank 0's Copy waits for its first send to complete, which needs
// rank 1's step 1, which waits (same range) for rank 1's step 0, which needs rank 0's step 2, which
// reads what the Copy writes.
TEST(Verifier, WriteOverPendingSendSourceWaits) {
  Schedule s;
  s.args.coll = CollKind::kBroadcast;
  s.args.nranks = 2;
  s.args.count = 1;
  s.args.root = 0;
  s.ranks.resize(2);
  s.ranks[0].steps = {copy(kIn0, kOut0, 1), send(1, kOut0, 1, 0), copy(kIn0, kOut0, 1),
                      send(1, kOut0, 1, 1)};
  s.ranks[1].steps = {recv(0, kOut0, 1, 1), recv(0, kOut0, 1, 0)};
  expectError(s, {"deadlock", "rank 0 step 2", "waits for step 1"});
}

// Whether a send carries the value before or after a later overwrite: the verifier must deliver the
// value the source held when the send was posted (the overwrite waits for the send).
TEST(Verifier, OverwriteAfterSendDoesNotLeak) {
  Schedule s;
  s.args.coll = CollKind::kBroadcast;
  s.args.nranks = 2;
  s.args.count = 1;
  s.args.root = 0;
  s.ranks.resize(2);
  s.ranks[0].scratchCount = 1;
  // Rank 0 sends garbage from scratch, then fills the scratch with its input: rank 1 gets garbage.
  s.ranks[0].steps = {send(1, BufRef{BufKind::kScratch, 0}, 1), copy(kIn0, kOut0, 1),
                      copy(kIn0, BufRef{BufKind::kScratch, 0}, 1)};
  s.ranks[1].steps = {recv(0, kOut0, 1)};
  expectError(s, {"rank 1 output[0] is undefined", "last written by step 0"});
}

TEST(Verifier, WrongChannelNeverMatches) {
  Schedule s = twoRankAllReduce(2);
  s.ranks[0].steps[0].channel = 1;
  expectError(s, {"never matched"});
}

TEST(Verifier, BroadcastNonRootInputIsNotData) {
  // A non-root rank "sending" its input contributes garbage.
  Schedule s;
  s.args.coll = CollKind::kBroadcast;
  s.args.nranks = 2;
  s.args.count = 1;
  s.args.root = 0;
  s.ranks.resize(2);
  s.ranks[0].steps = {copy(kIn0, kOut0, 1), send(1, kIn0, 1)};
  s.ranks[1].steps = {recv(0, kOut0, 1)};
  ASSERT_TRUE(verifySchedule(s).isOk());
  s.ranks[0].steps = {recv(1, kOut0, 1)};
  s.ranks[1].steps = {send(0, kIn0, 1), copy(kIn0, kOut0, 1)};
  expectError(s, {"output[0] is undefined"});
}

TEST(Verifier, BadArgs) {
  Schedule s = twoRankAllReduce(2);
  s.ranks.pop_back();
  expectError(s, {"1 rank schedules for 2 ranks"});
  s = twoRankAllReduce(2);
  s.args.coll = CollKind::kReduce;
  s.args.root = 2;
  expectError(s, {"root 2 out of range"});
}

TEST(Verifier, MessagesNameTheCollective) {
  Schedule s = ring(CollKind::kAllReduce, 3, 5, true);
  s.ranks[2].steps.pop_back();
  const Status st = verifySchedule(s);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("ring AllReduce (n=3, count=5, in place)"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace loom
