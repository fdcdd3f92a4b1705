// Rank arithmetic of the communication patterns (which peer, which block), kept apart from the
// schedule builders so that every generator states its pattern in one place (UCC style).
// Pure functions; no allocation.
#pragma once

#include <algorithm>
#include <cstddef>

namespace loom {

// x mod n in [0, n) for any sign of x; n >= 1.
inline int modRank(long long x, int n) {
  long long m = x % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

// count elements split into n near-equal blocks: the first count % n blocks hold one element more
// (so some blocks are empty when count < n). Every rank computes the same split.
struct Block {
  size_t offset = 0;
  size_t count = 0;
};
inline Block evenBlock(size_t count, int n, int b) {
  const size_t base = count / static_cast<size_t>(n);
  const size_t rem = count % static_cast<size_t>(n);
  const size_t ub = static_cast<size_t>(b);
  return Block{ub * base + std::min(ub, rem), base + (ub < rem ? 1 : 0)};
}

// The ring 0 -> 1 -> ... -> n-1 -> 0: a rank sends to next() and receives from prev().
struct RingPattern {
  int n;
  int rank;
  int next() const { return modRank(rank + 1, n); }
  int prev() const { return modRank(rank - 1, n); }
  // Block index rank + k (mod n).
  int block(long long k) const { return modRank(rank + k, n); }
};

// The chain first -> first+1 -> ... -> first+n-1 (mod n). prev()/next() are -1 at the ends.
struct ChainPattern {
  int n;
  int first;
  int rank;
  int position() const { return modRank(rank - first, n); }
  int prev() const { return position() == 0 ? -1 : modRank(rank - 1, n); }
  int next() const { return position() == n - 1 ? -1 : modRank(rank + 1, n); }
};

// Pairwise exchange: at round k (1 <= k < n) a rank sends to rank + k and receives from rank - k.
struct PairwisePattern {
  int n;
  int rank;
  int sendPeer(int k) const { return modRank(rank + k, n); }
  int recvPeer(int k) const { return modRank(rank - k, n); }
};

// Recursive doubling and halving with the standard fold for non-powers of two. With p the largest
// power of two <= n and e = n - p, the odd ranks 2i+1 (i < e) are "extra": they hand their data to
// rank 2i and get the result back from it. The p remaining ranks (the group) take consecutive
// virtual ranks in rank order (2i -> i for i < e, r -> r - e for r >= 2e), and at step k a group
// rank exchanges with the virtual rank v ^ (1 << k). Virtual and real ranks have the same order, so
// "lower virtual rank" is "lower rank", and the real ranks a run of virtual ranks stands for (a
// group rank and its extra) are contiguous: virtual v stands for real ranks
// [realRank(v), realRank(v + 1)), and realRank(p) = n.
struct RecursiveDoublingPattern {
  int n;
  int rank;
  int pow2() const {
    int p = 1;
    while (p <= n / 2) p *= 2;
    return p;
  }
  int extras() const { return n - pow2(); }
  bool isExtra() const { return rank < 2 * extras() && rank % 2 == 1; }
  // The rank an extra rank folds into (rank - 1), or the extra rank a group rank serves
  // (rank + 1), or -1.
  int foldPeer() const {
    if (rank >= 2 * extras()) return -1;
    return rank % 2 == 1 ? rank - 1 : rank + 1;
  }
  int virtualRank() const { return rank < 2 * extras() ? rank / 2 : rank - extras(); }
  int realRank(int v) const { return v < extras() ? 2 * v : v + extras(); }
  // log2(pow2()): the number of exchanges.
  int steps() const {
    int k = 0;
    while ((1 << (k + 1)) <= n) ++k;
    return k;
  }
  int partner(int k) const { return realRank(virtualRank() ^ (1 << k)); }
};

// One rank's links in a binary tree: parent -1 at the root, children -1 where absent.
struct TreeLinks {
  int parent = -1;
  int child[2] = {-1, -1};
  bool isLeaf() const { return child[0] < 0 && child[1] < 0; }
};

// NCCL's in-order binary tree over m ranks: rank v's parent and children follow from its lowest
// set bit (the odd ranks are the leaves); rank 0 is the root and has one child, the largest power
// of two below m. Depth floor(log2 m) + 1 at most.
inline TreeLinks inOrderBinaryTree(int m, int v) {
  TreeLinks t;
  if (m <= 1) return t;
  int bit = 1;
  while (bit < m && !(v & bit)) bit <<= 1;
  if (v == 0) {
    t.child[1] = bit >> 1;
    return t;
  }
  t.parent = (v ^ bit) | (bit << 1);
  if (t.parent >= m) t.parent = v ^ bit;
  int low = bit >> 1;
  if (low == 0) return t;
  t.child[0] = v - low;
  while (low > 0 && v + low >= m) low >>= 1;
  t.child[1] = low > 0 ? v + low : -1;
  return t;
}

// Two complementary binary trees over n ranks (the double binary tree of NCCL's tree
// algorithms): every rank has children in at most one of them, so a rank forwards the data of one
// tree only and the two trees together use each rank's links about equally. n even: tree 0 is the
// in-order tree over the ranks, tree 1 its mirror (rank r plays n-1-r), which turns the odd
// leaves into even ones. n odd: the same pair over ranks 1..n-1, and rank 0, a leaf in both,
// becomes the second child of each root (NCCL shifts instead, which leaves rank 0 with children in
// both trees). Depth floor(log2 n) + 1 at most.
struct DoubleBinaryTreePattern {
  int n;
  int rank;
  TreeLinks links(int tree) const {
    TreeLinks t;
    if (n <= 1) return t;
    const int first = n % 2;  // rank 0 stands apart when n is odd
    const int m = n - first;
    // Real rank <-> virtual rank of the in-order tree: identity or mirror over [first, n).
    auto toVirtual = [&](int r) { return tree == 0 ? r - first : n - 1 - r; };
    auto toReal = [&](int v) { return v < 0 ? -1 : (tree == 0 ? v + first : n - 1 - v); };
    const int root = toReal(0);
    if (first == 1 && rank == 0) {
      t.parent = root;
      return t;
    }
    const TreeLinks v = inOrderBinaryTree(m, toVirtual(rank));
    t.parent = toReal(v.parent);
    t.child[0] = toReal(v.child[0]);
    t.child[1] = toReal(v.child[1]);
    if (first == 1 && rank == root) t.child[0] = 0;
    return t;
  }
};

}  // namespace loom
