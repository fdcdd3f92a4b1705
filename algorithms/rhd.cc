// Recursive halving and doubling (Rabenseifner; MPICH's algorithms for medium messages on
// full-bisection fabrics). Over the group of p = 2^L ranks of RecursiveDoublingPattern:
// - reduce-scatter by recursive halving: at step s (distance p / 2^(s+1)) a rank keeps the half of
//   its current window of blocks that holds its own block, sends the other half to its partner and
//   reduces the partner's copy of the kept half into it; after L steps it holds its block reduced;
// - allgather by recursive doubling: at step s (distance 2^s) a rank sends its window of 2^s blocks
//   and receives its partner's, doubling the window.
// The n - p extra ranks of a non-power-of-two n fold into their even neighbour first and get their
// result from it last. Blocks are contiguous element ranges, so each exchange is one message each
// way; their sizes may differ by one element (evenBlock) or be zero (dropped on both sides).
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

namespace {

// The aligned window of `size` virtual ranks that contains v.
int windowStart(int v, int size) { return v & ~(size - 1); }

}  // namespace

// The vector is split into p near-equal blocks, block v for virtual rank v. Partial sums go to the
// output (every rank's to write; in place the input is the output, and a kept range is only read
// by the step that overwrites it with the same range), so no scratch is needed. The allgather
// receive of a range waits, through the conflict, for the reduce-scatter send that read it: by then
// the partner has posted its receive. A fold rank sends the whole result to its extra rank.
RankSchedule rhdAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const size_t c = args.count;
  const RecursiveDoublingPattern rd{args.nranks, rank};
  const int fold = rd.foldPeer();
  if (rd.isExtra()) {
    b.send(fold, inputAt(0), c);
    b.recv(fold, outputAt(0), c);
    return b.finish();
  }
  const int p = rd.pow2();
  const int steps = rd.steps();
  const int v = rd.virtualRank();
  // Elements of the virtual blocks [first, first + size).
  auto range = [&](int first, int size) {
    const size_t lo = evenBlock(c, p, first).offset;
    const size_t hi = first + size < p ? evenBlock(c, p, first + size).offset : c;
    return Block{lo, hi - lo};
  };
  bool inOutput = false;  // where the current partial sums are: the input, then the output
  if (fold >= 0) {
    b.recvReduce(fold, inputAt(0), outputAt(0), c);
    inOutput = true;
  }
  auto current = [&](size_t offset) { return inOutput ? outputAt(offset) : inputAt(offset); };
  for (int s = 0; s < steps; ++s) {
    const int dist = p >> (s + 1);
    const int partner = v ^ dist;
    const int peer = rd.realRank(partner);
    const Block give = range(windowStart(partner, dist), dist);
    const Block keep = range(windowStart(v, dist), dist);
    b.send(peer, current(give.offset), give.count);
    b.recvReduce(peer, current(keep.offset), outputAt(keep.offset), keep.count);
    inOutput = true;
  }
  for (int s = 0; s < steps; ++s) {
    const int dist = 1 << s;
    const int partner = v ^ dist;
    const int peer = rd.realRank(partner);
    const Block mine = range(windowStart(v, dist), dist);
    const Block theirs = range(windowStart(partner, dist), dist);
    b.send(peer, outputAt(mine.offset), mine.count);
    b.recv(peer, outputAt(theirs.offset), theirs.count);
  }
  if (fold >= 0) b.send(fold, outputAt(0), c);
  return b.finish();
}

// Blocks of the collective are per real rank (count elements each); virtual rank v owns the real
// blocks [realRank(v), realRank(v + 1)), so a window of virtual ranks is one contiguous range.
// Partial sums live in scratch, since the input is read-only outside the rank's own output block:
// a fold rank first reduces its extra rank's whole input with its own into scratch (n * count),
// other ranks need only their first kept half, mirrored at scratch offset 0. The last step reduces
// straight into the output, except on a fold rank, whose kept window holds its block and its extra
// rank's: one goes to the output by a copy, the other to the extra rank.
RankSchedule rhdReduceScatter(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const RecursiveDoublingPattern rd{n, rank};
  const int fold = rd.foldPeer();
  if (rd.isExtra()) {
    b.send(fold, inputAt(0), static_cast<size_t>(n) * c);
    b.recv(fold, outputAt(0), c);
    return b.finish();
  }
  const int p = rd.pow2();
  const int steps = rd.steps();
  const int v = rd.virtualRank();
  auto range = [&](int first, int size) {
    const size_t lo = static_cast<size_t>(rd.realRank(first)) * c;
    const size_t hi = static_cast<size_t>(rd.realRank(first + size)) * c;
    return Block{lo, hi - lo};
  };
  // Scratch holds input offsets [base, base + scratch count).
  size_t base = 0;
  bool inScratch = false;
  if (fold >= 0) {
    b.needScratch(static_cast<size_t>(n) * c);
    b.recvReduce(fold, inputAt(0), scratchAt(0), static_cast<size_t>(n) * c);
    inScratch = true;
  } else if (steps > 1) {
    const Block keep0 = range(windowStart(v, p / 2), p / 2);
    base = keep0.offset;
    b.needScratch(keep0.count);
  }
  auto current = [&](size_t offset) {
    return inScratch ? scratchAt(offset - base) : inputAt(offset);
  };
  for (int s = 0; s < steps; ++s) {
    const int dist = p >> (s + 1);
    const int partner = v ^ dist;
    const int peer = rd.realRank(partner);
    const Block give = range(windowStart(partner, dist), dist);
    const Block keep = range(windowStart(v, dist), dist);
    b.send(peer, current(give.offset), give.count);
    const BufRef dst = s == steps - 1 && fold < 0 ? outputAt(0) : scratchAt(keep.offset - base);
    b.recvReduce(peer, current(keep.offset), dst, keep.count);
    inScratch = true;
  }
  if (fold >= 0) {
    const size_t own = static_cast<size_t>(rank) * c;
    b.send(fold, scratchAt(own + c), c);
    b.copy(scratchAt(own), outputAt(0), c);
  }
  return b.finish();
}

// Rank r's block is output block r. A fold rank first receives its extra rank's block next to its
// own; each exchange then sends the window the rank holds (its own input directly at the first
// step, so that it need not wait for the local copy) and receives the partner's. A fold rank
// finally sends its extra rank every block but the extra rank's own, in two messages.
RankSchedule rhdAllGather(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const size_t own = static_cast<size_t>(rank) * c;
  const size_t total = static_cast<size_t>(n) * c;
  if (!args.inPlace) b.copy(inputAt(0), outputAt(own), c);
  if (n == 1) return b.finish();
  const RecursiveDoublingPattern rd{n, rank};
  const int fold = rd.foldPeer();
  if (rd.isExtra()) {
    b.send(fold, inputAt(0), c);
    b.recv(fold, outputAt(0), own);
    b.recv(fold, outputAt(own + c), total - own - c);
    return b.finish();
  }
  if (fold >= 0) b.recv(fold, outputAt(own + c), c);
  const int steps = rd.steps();
  const int v = rd.virtualRank();
  auto range = [&](int first, int size) {
    const size_t lo = static_cast<size_t>(rd.realRank(first)) * c;
    const size_t hi = static_cast<size_t>(rd.realRank(first + size)) * c;
    return Block{lo, hi - lo};
  };
  for (int s = 0; s < steps; ++s) {
    const int dist = 1 << s;
    const int partner = v ^ dist;
    const int peer = rd.realRank(partner);
    const Block mine = range(windowStart(v, dist), dist);
    const Block theirs = range(windowStart(partner, dist), dist);
    b.send(peer, s == 0 && fold < 0 ? inputAt(0) : outputAt(mine.offset), mine.count);
    b.recv(peer, outputAt(theirs.offset), theirs.count);
  }
  if (fold >= 0) {
    const size_t extra = own + c;
    b.send(fold, outputAt(0), extra);
    b.send(fold, outputAt(extra + c), total - extra - c);
  }
  return b.finish();
}

}  // namespace loom
