// Helpers of the schedule generators' tests: a step and a call's arguments in one expression, and
// log2.
#pragma once

#include <cstddef>

#include "algorithms/schedule.h"

namespace loom {

// A step (channel last: most tests use channel 0).
inline Step mk(StepKind kind, int peer, BufRef src, BufRef dst, size_t count, int channel = 0) {
  return Step{kind, peer, channel, src, dst, count};
}

// The arguments of a call of collective coll on n ranks with count elements (one host).
inline CollArgs callArgs(CollKind coll, int n, size_t count, int root = 0, bool inPlace = false) {
  return CollArgs{coll, n, count, root, inPlace, nullptr};
}

// floor(log2 n), for n >= 1: the exchanges of recursive doubling on a power of two.
inline int log2Floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

}  // namespace loom
