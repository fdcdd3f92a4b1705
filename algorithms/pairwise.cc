// Pairwise exchange AllToAll.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// Round k (1 <= k < n): send block r+k of the input to rank r+k, receive block r-k of the output
// from rank r-k. Out of place the own block is copied first. In place the own block is already in
// its place; every other block is first copied to scratch and sent from there, since the receives
// overwrite the input.
RankSchedule pairwiseAllToAll(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const PairwisePattern pw{n, rank};
  const size_t own = static_cast<size_t>(rank) * c;
  const size_t total = static_cast<size_t>(n) * c;
  BufKind from = BufKind::kInput;
  if (args.inPlace) {
    if (n == 1) return b.finish();
    b.needScratch(total);
    b.copy(inputAt(0), scratchAt(0), own);
    b.copy(inputAt(own + c), scratchAt(own + c), total - own - c);
    from = BufKind::kScratch;
  } else {
    b.copy(inputAt(own), outputAt(own), c);
  }
  for (int k = 1; k < n; ++k) {
    const int to = pw.sendPeer(k);
    b.send(to, BufRef{from, static_cast<size_t>(to) * c}, c);
    const int src = pw.recvPeer(k);
    b.recv(src, outputAt(static_cast<size_t>(src) * c), c);
  }
  return b.finish();
}

}  // namespace loom
