// Direct generators: every rank exchanges with every other rank in one step, with no forwarding.
// They suit transports where any pair of ranks is as close as any other and a message can be
// read straight from the sender's buffer (shared memory with single copy): each byte then crosses
// memory once per hop, and there is one hop. Peers are visited starting at rank+1 (sends) and
// rank-1 (receives) so that ranks do not all start with the same peer.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// Reduce-scatter then allgather over n near-equal blocks. Rank r sends input block j to rank j and
// reduces block r of every peer's input into its output block r; then sends its reduced block to
// every peer and receives theirs.
RankSchedule directAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const Block mine = evenBlock(args.count, n, rank);
  for (int d = 1; d < n; ++d) {
    const Block blk = evenBlock(args.count, n, modRank(rank + d, n));
    b.send(modRank(rank + d, n), inputAt(blk.offset), blk.count);
  }
  for (int d = 1; d < n; ++d)
    b.recvReduce(modRank(rank - d, n), d == 1 ? inputAt(mine.offset) : outputAt(mine.offset),
                 outputAt(mine.offset), mine.count);
  for (int d = 1; d < n; ++d) b.send(modRank(rank + d, n), outputAt(mine.offset), mine.count);
  for (int d = 1; d < n; ++d) {
    const int from = modRank(rank - d, n);
    const Block blk = evenBlock(args.count, n, from);
    b.recv(from, outputAt(blk.offset), blk.count);
  }
  return b.finish();
}

// Rank r sends input block j to rank j and reduces block r of every peer's input into its output.
RankSchedule directReduceScatter(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  for (int d = 1; d < n; ++d) {
    const int to = modRank(rank + d, n);
    b.send(to, inputAt(static_cast<size_t>(to) * c), c);
  }
  for (int d = 1; d < n; ++d)
    b.recvReduce(modRank(rank - d, n),
                 d == 1 ? inputAt(static_cast<size_t>(rank) * c) : outputAt(0), outputAt(0), c);
  return b.finish();
}

// Rank r sends its input to every peer and receives each peer's block into place.
RankSchedule directAllGather(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const size_t own = static_cast<size_t>(rank) * c;
  if (!args.inPlace) b.copy(inputAt(0), outputAt(own), c);
  for (int d = 1; d < n; ++d) b.send(modRank(rank + d, n), inputAt(0), c);
  for (int d = 1; d < n; ++d) {
    const int from = modRank(rank - d, n);
    b.recv(from, outputAt(static_cast<size_t>(from) * c), c);
  }
  return b.finish();
}

// The root sends to every rank; with single copy the receivers all read the root's buffer at once.
RankSchedule directBroadcast(const CollArgs& args, int rank) {
  StepList b;
  const int n = args.nranks;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  if (rank == args.root) {
    for (int d = 1; d < n; ++d) b.send(modRank(rank + d, n), inputAt(0), c);
    if (!args.inPlace) b.copy(inputAt(0), outputAt(0), c);
  } else {
    b.recv(args.root, outputAt(0), c);
  }
  return b.finish();
}

// Every rank sends its input to the root, which reduces them into its output in a fixed order.
RankSchedule directReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  if (rank != args.root) {
    b.send(args.root, inputAt(0), c);
    return b.finish();
  }
  for (int d = 1; d < n; ++d)
    b.recvReduce(modRank(rank - d, n), d == 1 ? inputAt(0) : outputAt(0), outputAt(0), c);
  return b.finish();
}

}  // namespace loom
