// Binomial trees (MPICH's shape): ranks are numbered relative to the root (v = rank - root mod
// n); v receives from v minus its lowest set bit and sends to v + 2^k for every 2^k below that
// bit. log2(n) rounds instead of the chain's n-1 hops: fewer steps for small messages, while the
// chain pipelines better for large ones.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

namespace {

// The lowest set bit of v (v > 0), or the first power of two >= n for the root.
int lowBit(int v, int n) {
  int mask = 1;
  while (mask < n) {
    if (v & mask) return mask;
    mask <<= 1;
  }
  return mask;
}

}  // namespace

// Each rank receives once (from its parent) and forwards to its children, largest subtree first.
RankSchedule binomialBroadcast(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const int v = modRank(rank - args.root, n);
  const int low = lowBit(v, n);
  BufRef from = inputAt(0);
  if (v == 0) {
    if (!args.inPlace) b.copy(inputAt(0), outputAt(0), c);
  } else {
    b.recv(modRank(v - low + args.root, n), outputAt(0), c);
    from = outputAt(0);
  }
  for (int mask = low >> 1; mask > 0; mask >>= 1)
    if (v + mask < n) b.send(modRank(v + mask + args.root, n), from, c);
  return b.finish();
}

// The mirror image: each rank combines its children's partial results (smallest subtree first)
// with its input, then sends the sum to its parent. Partial sums of non-root ranks live in scratch:
// a non-root rank's output is never written.
RankSchedule binomialReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const int v = modRank(rank - args.root, n);
  const int low = lowBit(v, n);
  const BufRef acc = v == 0 ? outputAt(0) : scratchAt(0);
  bool combined = false;
  for (int mask = 1; mask < low; mask <<= 1) {
    if (v + mask >= n) continue;
    if (v != 0 && !combined) b.needScratch(c);
    b.recvReduce(modRank(v + mask + args.root, n), combined ? acc : inputAt(0), acc, c);
    combined = true;
  }
  if (v == 0) {
    if (!combined && !args.inPlace) b.copy(inputAt(0), outputAt(0), c);
  } else {
    b.send(modRank(v - low + args.root, n), combined ? acc : inputAt(0), c);
  }
  return b.finish();
}

}  // namespace loom
