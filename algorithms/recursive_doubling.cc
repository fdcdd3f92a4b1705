// Recursive doubling AllReduce (latency optimal for small messages): log2(p) exchanges of the whole
// vector, p the largest power of two <= n, plus a fold for the n - p extra ranks.
#include <vector>

#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// Group rank, step k: send the current vector to the partner, receive the partner's and combine
// them into another buffer (writing into the buffer a pending send reads would wait for that send,
// which waits for the partner's receive: a deadlock), so the vector alternates between the output
// and scratch, the last step landing in the output. Every combination is (lower rank's operand)
// op (higher rank's operand): the lower rank uses RecvReduce (dst = local op received), the higher
// one Recv then Reduce (dst = received op local). By induction over the steps every rank of an
// aligned block of 2^k virtual ranks holds the same bits, so all ranks end bit-identical even for
// ops that are commutative only up to NaN payloads or the sign of zero (float sum, fmax).
// Fold: rank 2i combines its input with extra rank 2i+1's (lower op higher again) before the
// exchanges and sends it the result after them.
RankSchedule recursiveDoublingAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const RecursiveDoublingPattern rd{n, rank};
  const int fold = rd.foldPeer();
  if (rd.isExtra()) {
    b.send(fold, inputAt(0), c);
    b.recv(fold, outputAt(0), c);
    return b.finish();
  }
  const int steps = rd.steps();  // >= 1 since n >= 2
  // dst[k]: where step k leaves the vector. Backwards from the output, alternating with scratch.
  std::vector<BufRef> dst(static_cast<size_t>(steps));
  for (int k = steps - 1; k >= 0; --k)
    dst[k] = (steps - 1 - k) % 2 == 0 ? outputAt(0) : scratchAt(0);
  BufRef cur = inputAt(0);
  bool copyOut = false;
  if (fold >= 0) {
    // The folded vector goes to whichever of output / scratch step 0 does not write.
    cur = dst[0].buf == BufKind::kOutput ? scratchAt(0) : outputAt(0);
    if (cur.buf == BufKind::kScratch) b.needScratch(c);
    b.recvReduce(fold, inputAt(0), cur, c);
  } else if (args.inPlace && dst[0].buf == BufKind::kOutput) {
    // The input is the output and step 0 would write it: an odd number of steps. Use a second
    // scratch slot for step 0, or with a single step, finish with a copy.
    if (steps >= 3) {
      dst[0] = scratchAt(c);
    } else {
      dst[0] = scratchAt(0);
      copyOut = true;
    }
  }
  for (int k = 0; k < steps; ++k) {
    const int peer = rd.partner(k);
    b.send(peer, cur, c);
    if (rank < peer) {
      b.recvReduce(peer, cur, dst[k], c);
    } else {
      b.recv(peer, dst[k], c);
      b.reduce(cur, dst[k], c);
    }
    if (dst[k].buf == BufKind::kScratch) b.needScratch(dst[k].offset + c);
    cur = dst[k];
  }
  if (copyOut) b.copy(cur, outputAt(0), c);
  if (fold >= 0) b.send(fold, outputAt(0), c);
  return b.finish();
}

}  // namespace loom
