// Bruck's AllToAll: ceil(log2 n) rounds for any n instead of pairwise's n-1, at the price of
// forwarding: a block travels once per set bit of its distance, so about half the data moves in
// each round. Small blocks at large n, where the per-message latency dominates.
//
// Rank r names its outgoing blocks by distance: block i (1 <= i < n) is the one for rank r+i. In
// the round of d = 2^k it sends to rank r+d, packed into one message, every block whose distance
// has bit k set, and receives from rank r-d the blocks of the same distances (which now have d less
// to go). A block of distance i thus reaches rank r+i after the rounds of i's set bits, and is
// final after the round of its highest bit. What rank r holds at distance i after that round came
// from rank r-i.
#include <algorithm>
#include <vector>

#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// Where the blocks are: a block is first sent (in the round of its distance's lowest bit) straight
// from the input (out of place) or from a scratch copy of the input (in place, where the output
// receives would overwrite blocks not yet sent); a received block that still has rounds to go waits
// in scratch slot i (its distance); a final one is unpacked straight into the output. Each round
// packs its blocks with copies into a send area and unpacks a receive area; the areas alternate
// between two pairs so that a round's packing need not wait for the previous round's message.
RankSchedule bruckAllToAll(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const size_t own = static_cast<size_t>(rank) * c;
  const size_t total = static_cast<size_t>(n) * c;
  if (!args.inPlace) b.copy(inputAt(own), outputAt(own), c);
  if (n == 1) return b.finish();
  // The most blocks any round moves.
  size_t maxBlocks = 0;
  for (int d = 1; d < n; d <<= 1) {
    size_t m = 0;
    for (int i = 1; i < n; ++i) m += (i & d) != 0;
    maxBlocks = std::max(maxBlocks, m);
  }
  // Scratch: [input copy (in place only)] [held blocks by distance] [send 0, send 1] [recv 0, 1].
  const size_t copyBase = 0;
  const size_t heldBase = args.inPlace ? total : 0;
  const size_t sendBase = heldBase + total;
  const size_t recvBase = sendBase + 2 * maxBlocks * c;
  b.needScratch(recvBase + 2 * maxBlocks * c);
  auto original = [&](int i) {  // the input block for rank r+i
    const size_t off = static_cast<size_t>(modRank(rank + i, n)) * c;
    return args.inPlace ? scratchAt(copyBase + off) : inputAt(off);
  };
  if (args.inPlace) {
    b.copy(inputAt(0), scratchAt(copyBase), own);
    b.copy(inputAt(own + c), scratchAt(copyBase + own + c), total - own - c);
  }
  std::vector<int> moved;
  for (int d = 1, k = 0; d < n; d <<= 1, ++k) {
    moved.clear();
    for (int i = 1; i < n; ++i)
      if (i & d) moved.push_back(i);
    const size_t area = static_cast<size_t>(k % 2) * maxBlocks * c;
    for (size_t x = 0; x < moved.size(); ++x) {
      const int i = moved[x];
      const BufRef src =
          i % d == 0 ? original(i) : scratchAt(heldBase + static_cast<size_t>(i) * c);
      b.copy(src, scratchAt(sendBase + area + x * c), c);
    }
    const size_t elems = moved.size() * c;
    b.send(modRank(rank + d, n), scratchAt(sendBase + area), elems);
    b.recv(modRank(rank - d, n), scratchAt(recvBase + area), elems);
    for (size_t x = 0; x < moved.size(); ++x) {
      const int i = moved[x];
      const bool arrived = i < 2 * d;  // d is the highest bit of i
      const BufRef dst = arrived ? outputAt(static_cast<size_t>(modRank(rank - i, n)) * c)
                                 : scratchAt(heldBase + static_cast<size_t>(i) * c);
      b.copy(scratchAt(recvBase + area + x * c), dst, c);
    }
  }
  return b.finish();
}

}  // namespace loom
