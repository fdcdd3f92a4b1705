// Bruck's allgather: ceil(log2 n) rounds for any n (not only powers of two). Rank r keeps the
// blocks it has, rotated so that its own comes first, in scratch; in the round of distance d it
// sends its first min(d, n - d) blocks to rank r - d and appends as many from rank r + d. After the
// last round scratch holds the blocks of ranks r, r+1, ..., r+n-1, which two copies rotate into
// place. Fewest rounds of any allgather; each byte is copied into scratch and out again.
#include <algorithm>

#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

RankSchedule bruckAllGather(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const size_t own = static_cast<size_t>(rank) * c;
  if (n == 1) {
    if (!args.inPlace) b.copy(inputAt(0), outputAt(own), c);
    return b.finish();
  }
  b.needScratch(static_cast<size_t>(n) * c);
  b.copy(args.inPlace ? outputAt(own) : inputAt(0), scratchAt(0), c);
  for (int d = 1; d < n; d <<= 1) {
    const size_t blocks = static_cast<size_t>(std::min(d, n - d));
    b.send(modRank(rank - d, n), scratchAt(0), blocks * c);
    b.recv(modRank(rank + d, n), scratchAt(static_cast<size_t>(d) * c), blocks * c);
  }
  // Scratch block i belongs to rank (r + i) mod n: blocks 0 .. n-r-1 go to the output from the
  // rank's own position on, the rest to its beginning.
  const size_t head = static_cast<size_t>(n - rank) * c;
  b.copy(scratchAt(0), outputAt(own), head);
  if (rank > 0) b.copy(scratchAt(head), outputAt(0), own);
  return b.finish();
}

}  // namespace loom
