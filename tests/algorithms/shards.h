// Sharding of the per-algorithm proofs: one gtest per (registered algorithm, range of 16 rank
// counts from 1 to 64), so that ctest runs them in parallel and names each.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>

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

}  // namespace loom
