// Sharding of the per-algorithm proofs: one gtest per (registered algorithm, range of 16 rank
// counts from 1 to 64), so that ctest runs them in parallel and names each; and the proof each
// shard runs (verifyCalls).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/quick.h"

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

// The rank counts a shard proves: all 16. In the quick mode of the sanitizer stages
// (loomtest::quick(), after the full proofs of the first stage), the first shard (1-16, where the
// small special cases are) stays whole; the others keep their first two, middle and last two
// counts (odd and even, the power of two that ends each shard and its neighbours).
inline std::vector<int> shardRankCounts(const ShardParam& p) {
  const int first = std::get<1>(p) * kShardRanks + 1, last = first + kShardRanks - 1;
  std::vector<int> out;
  for (int n = first; n <= last; ++n) {
    const bool keep = !loomtest::quick() || first == 1 || n <= first + 1 || n >= last - 1 ||
                      n == first + kShardRanks / 2;
    if (keep) out.push_back(n);
  }
  return out;
}

// Runs check(algo, n) for the shard's algorithm and each of its rank counts, naming both in failure
// messages; stops at the first fatal failure.
template <class Check>
void forEachShardRankCount(const ShardParam& p, Check check) {
  const AlgorithmInfo& algo = algorithms()[std::get<0>(p)];
  for (int n : shardRankCounts(p)) {
    SCOPED_TRACE(::testing::Message() << algo.name << " " << collName(algo.coll) << " n=" << n);
    check(algo, n);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Roots worth trying for collective c on n ranks: the first, middle and last (0 alone without a
// root).
inline std::vector<int> rootsFor(CollKind c, int n) {
  if (!collRooted(c)) return {0};
  std::set<int> s = {0, n - 1, n / 2};
  return std::vector<int>(s.begin(), s.end());
}

// Calls fn(args) for each call of algo's collective on n ranks: each count, in place and not,
// each root of rootsFor, with `layout` (null: one host). Stops at the first fatal failure.
template <class Fn>
void forEachCall(const AlgorithmInfo& algo, int n, const std::vector<size_t>& counts,
                 const std::shared_ptr<const RankLayout>& layout, Fn fn) {
  for (size_t count : counts) {
    for (bool inPlace : {false, true}) {
      for (int root : rootsFor(algo.coll, n)) {
        fn(CollArgs{algo.coll, n, count, root, inPlace, layout});
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Checks that verifySchedule accepts algo's schedule for each call of forEachCall; then calls
// more(args, schedule) when given.
inline void verifyCalls(const AlgorithmInfo& algo, int n, const std::vector<size_t>& counts,
                        const std::shared_ptr<const RankLayout>& layout = nullptr,
                        const std::function<void(const CollArgs&, const Schedule&)>& more = {}) {
  forEachCall(algo, n, counts, layout, [&](const CollArgs& a) {
    const Schedule s = buildSchedule(algo, a);
    const Status st = verifySchedule(s);
    ASSERT_TRUE(st.isOk()) << st.message();
    if (more) more(a, s);
  });
}

}  // namespace loom
