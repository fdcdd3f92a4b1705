// Sharding of the per-algorithm proofs: one gtest per (registered algorithm, range of 16 rank
// counts from 1 to 64), so that ctest runs them in parallel and names each.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"

namespace loom {

constexpr int kShardRanks = 16;
using ShardParam = std::tuple<size_t, int>;  // (index into algorithms(), shard)

inline auto allShards() {
  return ::testing::Combine(::testing::Range(size_t{0}, algorithms().size()),
                            ::testing::Range(0, 4));
}

// "AllReduce_ring_n17to32".
inline std::string shardName(const ::testing::TestParamInfo<ShardParam>& p) {
  const AlgorithmInfo& a = algorithms()[std::get<0>(p.param)];
  const int first = std::get<1>(p.param) * kShardRanks + 1;
  return std::string(collName(a.coll)) + "_" + a.name + "_n" + std::to_string(first) + "to" +
         std::to_string(first + kShardRanks - 1);
}

// LOOMTEST_QUICK=1: tools/test.sh's sanitizer stage, after the full proofs of the first stage.
inline bool quickProofs() {
  const char* q = std::getenv("LOOMTEST_QUICK");
  return q && std::string(q) == "1";
}

// The rank counts a shard proves: all 16. With quickProofs(), the first shard (1-16, where the
// small special cases are) stays whole; the others keep their first two, middle and last two
// counts (odd and even, the power of two that ends each shard and its neighbours).
inline std::vector<int> shardRankCounts(const ShardParam& p) {
  const int first = std::get<1>(p) * kShardRanks + 1, last = first + kShardRanks - 1;
  std::vector<int> out;
  for (int n = first; n <= last; ++n) {
    const bool keep = !quickProofs() || first == 1 || n <= first + 1 || n >= last - 1 ||
                      n == first + kShardRanks / 2;
    if (keep) out.push_back(n);
  }
  return out;
}

}  // namespace loom
