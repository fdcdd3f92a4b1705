// Double binary tree AllReduce (NCCL's "tree"): each of the two complementary trees of
// DoubleBinaryTreePattern carries half of the vector, reduced up to its root and broadcast back
// down, in chunks so that a rank forwards chunk j while its children already send chunk j+1.
// Latency grows with the depth (log2 n) instead of n as in the ring; each rank sends about the
// whole vector once up and once down, half of it per tree.
#include <algorithm>

#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

namespace {

// Chunks per half: up to kTreeMaxChunks (the pipeline depth NCCL's tree reaches with its default
// chunk sizes), none below kTreeMinChunkElems elements, at least one. Small halves travel whole:
// more chunks would only add per-message latency. The executor also splits every step into pieces
// of its own size, which pipelines large chunks further.
constexpr size_t kTreeMaxChunks = 8;
constexpr size_t kTreeMinChunkElems = 32;

}  // namespace

size_t treeAllReduceChunks(size_t count) {
  const size_t half = evenBlock(count, 2, 0).count;  // the larger half
  const size_t k = (half + kTreeMinChunkElems - 1) / kTreeMinChunkElems;
  return std::max<size_t>(1, std::min(k, kTreeMaxChunks));
}

// Chunk j of tree t covers the elements evenBlock(half t, chunks, j). Both trees use channel 0
// (the shared-memory transport carries channel 0 only): where they link the same pair of ranks,
// both sides list the pair's messages in the same (chunk, tree) order, which the verifier checks.
// Up phase, per chunk and tree: an interior rank reduces its children's partial sums with its input
// into its output (the output is every rank's to write, so no scratch is needed, in place or not)
// and sends the sum to its parent; a leaf sends its input. Down phase: the root's output holds the
// result; every other rank receives the chunk into its output and forwards it to its children.
// Every rank thus ends with the root's bits. Steps are ordered as NCCL's tree kernel runs them:
// every chunk up, then every chunk down. The chunks of one phase pipeline: a rank's send of chunk j
// waits only for its children's chunk j.
RankSchedule treeAllReduceChunked(const CollArgs& args, int rank, size_t chunks) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const size_t c = args.count;
  const size_t k = std::max<size_t>(1, chunks);
  const DoubleBinaryTreePattern dbt{args.nranks, rank};
  const TreeLinks links[2] = {dbt.links(0), dbt.links(1)};
  auto chunk = [&](int t, size_t j) {
    const Block half = evenBlock(c, 2, t);
    Block blk = evenBlock(half.count, static_cast<int>(k), static_cast<int>(j));
    blk.offset += half.offset;
    return blk;
  };
  for (size_t j = 0; j < k; ++j) {
    for (int t = 0; t < 2; ++t) {
      const TreeLinks& l = links[t];
      const Block blk = chunk(t, j);
      bool reduced = false;
      for (int child : l.child) {
        if (child < 0) continue;
        b.recvReduce(child, reduced ? outputAt(blk.offset) : inputAt(blk.offset),
                     outputAt(blk.offset), blk.count);
        reduced = true;
      }
      if (l.parent >= 0) {
        b.send(l.parent, reduced ? outputAt(blk.offset) : inputAt(blk.offset), blk.count);
      }
    }
  }
  for (size_t j = 0; j < k; ++j) {
    for (int t = 0; t < 2; ++t) {
      const TreeLinks& l = links[t];
      const Block blk = chunk(t, j);
      if (l.parent >= 0) b.recv(l.parent, outputAt(blk.offset), blk.count);
      for (int child : l.child) {
        if (child >= 0) b.send(child, outputAt(blk.offset), blk.count);
      }
    }
  }
  return b.finish();
}

RankSchedule treeAllReduce(const CollArgs& args, int rank) {
  return treeAllReduceChunked(args, rank, treeAllReduceChunks(args.count));
}

}  // namespace loom
