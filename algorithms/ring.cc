// Ring generators (NCCL style): rank r sends to r+1 and receives from r-1.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// Reduce-scatter then allgather over n near-equal blocks of the buffer. Reduce-scatter step s:
// send block r-s (the input block at s = 0, the partial sum in the output after), receive block
// r-s-1 and reduce it with the input block into the output. After n-1 steps rank r holds the
// complete block r+1; allgather step s sends block r+1-s and receives block r-s.
RankSchedule ringAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const RingPattern ring{n, rank};
  auto block = [&](long long k) { return evenBlock(c, n, ring.block(k)); };
  for (int s = 0; s < n - 1; ++s) {
    const Block sb = block(-s);
    b.send(ring.next(), s == 0 ? inputAt(sb.offset) : outputAt(sb.offset), sb.count);
    const Block rb = block(-s - 1);
    b.recvReduce(ring.prev(), inputAt(rb.offset), outputAt(rb.offset), rb.count);
  }
  for (int s = 0; s < n - 1; ++s) {
    const Block sb = block(1 - s);
    b.send(ring.next(), outputAt(sb.offset), sb.count);
    const Block rb = block(-s);
    b.recv(ring.prev(), outputAt(rb.offset), rb.count);
  }
  return b.finish();
}

// Rank r places its input at block r of the output, then at step s forwards block r-s and receives
// block r-s-1. The first send reads the input directly so it need not wait for the local copy.
RankSchedule ringAllGather(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const RingPattern ring{n, rank};
  const size_t own = static_cast<size_t>(rank) * c;
  if (!args.inPlace) b.copy(inputAt(0), outputAt(own), c);
  for (int s = 0; s < n - 1; ++s) {
    const size_t sb = static_cast<size_t>(ring.block(-s)) * c;
    b.send(ring.next(), s == 0 && !args.inPlace ? inputAt(0) : outputAt(sb), c);
    const size_t rb = static_cast<size_t>(ring.block(-s - 1)) * c;
    b.recv(ring.prev(), outputAt(rb), c);
  }
  return b.finish();
}

// Step s sends the partial sum of block r-s-1 and receives block r-s-2, reducing it with the input
// block; the last step (s = n-2) receives block r and reduces straight into the output. Partial
// sums live in two scratch slots used alternately (never in the user's input, which is read-only
// outside the output even in place); a slot is rewritten only after the send reading it completed.
RankSchedule ringReduceScatter(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const RingPattern ring{n, rank};
  auto slot = [&](int s) { return scratchAt(static_cast<size_t>(s % 2) * c); };
  if (n > 2) b.needScratch(2 * c);
  for (int s = 0; s < n - 1; ++s) {
    const size_t sb = static_cast<size_t>(ring.block(-s - 1)) * c;
    b.send(ring.next(), s == 0 ? inputAt(sb) : slot(s - 1), c);
    const size_t rb = static_cast<size_t>(ring.block(-s - 2)) * c;
    b.recvReduce(ring.prev(), inputAt(rb), s == n - 2 ? outputAt(0) : slot(s), c);
  }
  return b.finish();
}

}  // namespace loom
