// The measurement loop of loom-perf, as nccl-tests runs it: per datatype/op/root, warm-up ops at
// the largest and smallest size; per size and per placement (out-of-place, then in-place) one
// untimed op, a barrier, the timed loop (-n iterations of -m ops each, buffer offset rotated every
// op), per-rank times combined across ranks (-a), then validation (-c) with crafted inputs.
#pragma once

#include <vector>

#include "loom/loom.h"
#include "tools/perf/options.h"

namespace loom {
namespace perf {

struct RankContext {
  loomComm_t comm = nullptr;
  int rank = 0;
  int nranks = 1;
};

// Runs every sweep on the ranks one thread drives (one, or -g N of them, whose calls it issues in
// one group, as nccl-tests does); rank 0 prints the table. Returns the exit code: 0 when every
// value was right, 1 on wrong values, 2 on usage errors, 3 when a Loom call failed (the
// communicators should then be aborted, not destroyed).
int runBenchmarks(const Options& opts, const std::vector<RankContext>& ranks);

constexpr int kExitWrong = 1;
constexpr int kExitUsage = 2;
constexpr int kExitLoomError = 3;

}  // namespace perf
}  // namespace loom
