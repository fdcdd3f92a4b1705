// Ring generators (NCCL style): each rank sends to the next rank of the ring and receives from the
// previous one. The ring visits the ranks in the layout's ring order (index order without a
// layout). With several channels the data is split into that many contiguous parts, each moved by
// an independent ring on its own channel id; odd channels run the ring backwards, so that both
// directions of every link carry data. One channel and no layout: the ring 0 -> 1 -> ... -> n-1.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {
namespace {

// The ring of one channel, by position: position p sends to position p+1. Position p holds
// ringOrder[p], or ringOrder[n-1-p] on a reversed channel.
struct OrderedRing {
  const RankLayout* layout;  // null: index order
  bool reversed;
  int n;
  int pos;
  OrderedRing(const RankLayout* l, bool rev, int nranks, int rank)
      : layout(l), reversed(rev), n(nranks), pos(0) {
    const int p = l ? l->ringPosition(rank) : rank;
    pos = rev ? n - 1 - p : p;
  }
  // The rank at position pos + k.
  int rankAt(long long k) const {
    int q = modRank(pos + k, n);
    if (reversed) q = n - 1 - q;
    return layout ? layout->ringOrder()[static_cast<size_t>(q)] : q;
  }
  int next() const { return rankAt(1); }
  int prev() const { return rankAt(-1); }
  // Block index pos + k (mod n): for blocks that belong to positions, not to ranks.
  int block(long long k) const { return modRank(pos + k, n); }
};

int channelsOf(const CollArgs& args) { return args.layout ? args.layout->channels() : 1; }

OrderedRing ringOf(const CollArgs& args, int channel, int rank) {
  return OrderedRing(args.layout.get(), channel % 2 == 1, args.nranks, rank);
}

}  // namespace

// Per channel, over its part of the buffer: reduce-scatter then allgather over n near-equal
// blocks. Reduce-scatter step s: send block p-s (the input block at s = 0, the partial sum in the
// output after), receive block p-s-1 and reduce it with the input block into the output. After n-1
// steps position p holds the complete block p+1; allgather step s sends block p+1-s and receives
// block p-s.
RankSchedule ringAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const int channels = channelsOf(args);
  for (int ch = 0; ch < channels; ++ch) {
    const Block part = evenBlock(args.count, channels, ch);
    const OrderedRing ring = ringOf(args, ch, rank);
    auto block = [&](long long k) {
      Block blk = evenBlock(part.count, n, ring.block(k));
      blk.offset += part.offset;
      return blk;
    };
    for (int s = 0; s < n - 1; ++s) {
      const Block sb = block(-s);
      b.send(ring.next(), s == 0 ? inputAt(sb.offset) : outputAt(sb.offset), sb.count, ch);
      const Block rb = block(-s - 1);
      b.recvReduce(ring.prev(), inputAt(rb.offset), outputAt(rb.offset), rb.count, ch);
    }
    for (int s = 0; s < n - 1; ++s) {
      const Block sb = block(1 - s);
      b.send(ring.next(), outputAt(sb.offset), sb.count, ch);
      const Block rb = block(-s);
      b.recv(ring.prev(), outputAt(rb.offset), rb.count, ch);
    }
  }
  return b.finish();
}

// Rank r places its input at block r of the output, then, per channel over its part of every
// block, at step s forwards the block of the rank s positions back and receives the one s+1
// positions back. The first send reads the input directly so it need not wait for the local copy.
RankSchedule ringAllGather(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const int channels = channelsOf(args);
  if (!args.inPlace) b.copy(inputAt(0), outputAt(static_cast<size_t>(rank) * c), c);
  for (int ch = 0; ch < channels; ++ch) {
    const Block part = evenBlock(c, channels, ch);
    const OrderedRing ring = ringOf(args, ch, rank);
    auto at = [&](long long k) { return static_cast<size_t>(ring.rankAt(k)) * c + part.offset; };
    for (int s = 0; s < n - 1; ++s) {
      b.send(ring.next(), s == 0 && !args.inPlace ? inputAt(part.offset) : outputAt(at(-s)),
             part.count, ch);
      b.recv(ring.prev(), outputAt(at(-s - 1)), part.count, ch);
    }
  }
  return b.finish();
}

// Per channel, over its part of every block: step s sends the partial sum of the block of the rank
// s+1 positions back and receives the one s+2 positions back, reducing it with the input block;
// the last step (s = n-2) receives the rank's own block and reduces straight into the output.
// Partial sums live in two scratch slots per channel used alternately (never in the user's input,
// which is read-only outside the output even in place); a slot is rewritten only after the send
// reading it completed.
RankSchedule ringReduceScatter(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const int channels = channelsOf(args);
  if (n > 2) b.needScratch(2 * c);
  for (int ch = 0; ch < channels; ++ch) {
    const Block part = evenBlock(c, channels, ch);
    const OrderedRing ring = ringOf(args, ch, rank);
    auto slot = [&](int s) {
      return scratchAt(2 * part.offset + static_cast<size_t>(s % 2) * part.count);
    };
    auto at = [&](long long k) { return static_cast<size_t>(ring.rankAt(k)) * c + part.offset; };
    for (int s = 0; s < n - 1; ++s) {
      b.send(ring.next(), s == 0 ? inputAt(at(-s - 1)) : slot(s - 1), part.count, ch);
      b.recvReduce(ring.prev(), inputAt(at(-s - 2)), s == n - 2 ? outputAt(part.offset) : slot(s),
                   part.count, ch);
    }
  }
  return b.finish();
}

}  // namespace loom
