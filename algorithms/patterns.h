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

}  // namespace loom
