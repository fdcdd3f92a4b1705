// The double binary tree AllReduce ("tree"): the shape of the two trees, the chunking, and how many
// messages each rank exchanges. (generators_test verifies it with every registered generator.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "algorithms/generators.h"
#include "algorithms/patterns.h"
#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"

namespace loom {
namespace {

// Each tree spans all ranks: one root, child links mirror parent links, at most two children,
// every rank reaches the root, and the depth (edges on the longest root path) is at most
// floor(log2 n) + 1.
TEST(DoubleBinaryTree, EachTreeIsASpanningBinaryTreeOfLogDepth) {
  for (int n = 1; n <= 300; ++n) {
    for (int t = 0; t < 2; ++t) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " tree " << t);
      std::vector<TreeLinks> links;
      for (int r = 0; r < n; ++r) links.push_back(DoubleBinaryTreePattern{n, r}.links(t));
      int roots = 0;
      std::vector<int> parentOf(static_cast<size_t>(n), -1);
      for (int r = 0; r < n; ++r) {
        const TreeLinks& l = links[static_cast<size_t>(r)];
        roots += l.parent < 0;
        for (int c : l.child) {
          if (c < 0) continue;
          ASSERT_LT(c, n);
          ASSERT_NE(c, r);
          ASSERT_EQ(parentOf[static_cast<size_t>(c)], -1) << "rank " << c << " has two parents";
          parentOf[static_cast<size_t>(c)] = r;
        }
        if (l.child[0] >= 0 && l.child[1] >= 0) {
          EXPECT_NE(l.child[0], l.child[1]);
        }
      }
      EXPECT_EQ(roots, 1);
      int maxDepth = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(parentOf[static_cast<size_t>(r)], links[static_cast<size_t>(r)].parent)
            << "rank " << r;
        int depth = 0;
        for (int x = r; links[static_cast<size_t>(x)].parent >= 0 && depth <= n;
             x = links[static_cast<size_t>(x)].parent)
          ++depth;
        ASSERT_LE(depth, n - 1) << "rank " << r << " does not reach the root";
        maxDepth = std::max(maxDepth, depth);
      }
      EXPECT_LE(maxDepth, log2Floor(n) + 1);
    }
  }
}

// Complementary: a rank has children in at most one tree, so it is a leaf in at least one; both
// roots differ for n >= 2.
TEST(DoubleBinaryTree, TreesAreComplementary) {
  for (int n = 2; n <= 300; ++n) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    int roots[2] = {-1, -1};
    for (int r = 0; r < n; ++r) {
      const DoubleBinaryTreePattern p{n, r};
      const TreeLinks l0 = p.links(0), l1 = p.links(1);
      EXPECT_TRUE(l0.isLeaf() || l1.isLeaf()) << "rank " << r << " is interior in both trees";
      if (l0.parent < 0) roots[0] = r;
      if (l1.parent < 0) roots[1] = r;
    }
    EXPECT_NE(roots[0], roots[1]);
  }
}

TEST(TreeAllReduce, ChunkCount) {
  EXPECT_EQ(treeAllReduceChunks(0), 1u);
  EXPECT_EQ(treeAllReduceChunks(1), 1u);
  EXPECT_EQ(treeAllReduceChunks(64), 1u);   // halves of 32
  EXPECT_EQ(treeAllReduceChunks(65), 2u);   // a half of 33
  EXPECT_EQ(treeAllReduceChunks(200), 4u);  // halves of 100
  EXPECT_EQ(treeAllReduceChunks(1000), 8u);
  EXPECT_EQ(treeAllReduceChunks(size_t{1} << 40), 8u);
}

// Per chunk and tree, a rank receives from each child and sends to its parent once (up), then
// receives from its parent and sends to each child once (down), on channel 0 and only to
// its neighbours in that tree. Every step stays within one chunk, so chunks only wait for
// themselves (the pipelining).
TEST(TreeAllReduce, MessagesPerChunkFollowTheTrees) {
  const AlgorithmInfo* tree = findAlgorithm(CollKind::kAllReduce, "tree");
  ASSERT_NE(tree, nullptr);
  for (int n : {2, 3, 4, 7, 8, 12, 31, 64}) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.nranks = n;
      a.count = 1001;  // halves of 501 and 500: 8 chunks each
      a.inPlace = inPlace;
      const size_t k = treeAllReduceChunks(a.count);
      ASSERT_EQ(k, 8u);
      const Schedule s = buildSchedule(*tree, a);
      for (int r = 0; r < n; ++r) {
        const RankSchedule& rs = s.ranks[static_cast<size_t>(r)];
        EXPECT_EQ(rs.scratchCount, 0u);
        const DoubleBinaryTreePattern p{n, r};
        size_t sends[2] = {0, 0}, recvs[2] = {0, 0};
        for (const Step& st : rs.steps) {
          ASSERT_NE(st.kind, StepKind::kCopy);
          ASSERT_NE(st.kind, StepKind::kReduce);
          // Both trees travel on channel 0; the half of the data says which tree a step is in.
          ASSERT_EQ(st.channel, 0);
          const size_t off = st.kind == StepKind::kSend ? st.src.offset : st.dst.offset;
          const int t = off >= evenBlock(a.count, 2, 1).offset ? 1 : 0;
          const TreeLinks l = p.links(t);
          EXPECT_TRUE(st.peer == l.parent || st.peer == l.child[0] || st.peer == l.child[1])
              << "rank " << r << " talks to " << st.peer << " in tree " << t;
          (st.kind == StepKind::kSend ? sends : recvs)[t]++;
          // The step lies within one chunk of its tree's half.
          const Block half = evenBlock(a.count, 2, t);
          bool inOneChunk = false;
          for (size_t j = 0; j < k; ++j) {
            const Block blk = evenBlock(half.count, static_cast<int>(k), static_cast<int>(j));
            inOneChunk |= off == half.offset + blk.offset && st.count == blk.count;
          }
          EXPECT_TRUE(inOneChunk) << "offset " << off << " count " << st.count;
        }
        for (int t = 0; t < 2; ++t) {
          const TreeLinks l = p.links(t);
          const size_t children = (l.child[0] >= 0) + (l.child[1] >= 0);
          const size_t parent = l.parent >= 0;
          EXPECT_EQ(sends[t], k * (parent + children)) << "rank " << r << " tree " << t;
          EXPECT_EQ(recvs[t], k * (children + parent)) << "rank " << r << " tree " << t;
          EXPECT_LE(parent + children, 3u);
        }
        // Leaf in one tree: at most 1 + 3 messages each way per chunk index.
        EXPECT_LE(sends[0] + sends[1], 4 * k);
      }
    }
  }
}

// The verifier accepts every chunk count, including more chunks than elements (empty chunks are
// dropped on both sides).
TEST(TreeAllReduce, VerifiesForForcedChunkCounts) {
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, 32, 33}) {
    for (size_t k : {1, 2, 3, 8, 13}) {
      for (size_t count :
           {size_t{1}, static_cast<size_t>(n), static_cast<size_t>(5 * n + 3), size_t{100}}) {
        for (bool inPlace : {false, true}) {
          CollArgs a;
          a.nranks = n;
          a.count = count;
          a.inPlace = inPlace;
          Schedule s;
          s.args = a;
          s.algorithm = "tree";
          for (int r = 0; r < n; ++r) s.ranks.push_back(treeAllReduceChunked(a, r, k));
          const Status st = verifySchedule(s);
          ASSERT_TRUE(st.isOk()) << "chunks " << k << ": " << st.message();
        }
      }
    }
  }
}

TEST(TreeAllReduce, LargeRankCounts) {
  const AlgorithmInfo* tree = findAlgorithm(CollKind::kAllReduce, "tree");
  ASSERT_NE(tree, nullptr);
  for (int n : {65, 100, 127, 128, 255}) {
    for (size_t count : {size_t{1}, static_cast<size_t>(n + 1), size_t{1000}}) {
      CollArgs a;
      a.nranks = n;
      a.count = count;
      const Status st = verifySchedule(buildSchedule(*tree, a));
      ASSERT_TRUE(st.isOk()) << st.message();
    }
  }
}

}  // namespace
}  // namespace loom
