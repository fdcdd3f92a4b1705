// Hierarchical (two-level) generators: collectives split into phases inside each host (fast links,
// shared memory) and across hosts (the network), so that the network carries as little as the
// collective allows. The hosts and ranks come from the args' RankLayout; without one every rank is
// on one host and only the intra-host phases run. Hosts may hold different numbers of ranks.
//
// All transfers use channel 0 (the shared-memory transport serves local peers on channel 0 only):
// intra-host and inter-host phases never pair the same two ranks, and where one pair exchanges
// several messages in a phase both sides list them in the same order (ascending slice or rank).
#include <algorithm>
#include <memory>
#include <vector>

#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {
namespace {

// hierAllReduce's pipelining: at most this many parts, each of at least this many elements.
constexpr size_t kHierParts = 16;
constexpr size_t kHierMinPartElems = 32 << 10;

// One rank's view of the layout.
struct HostView {
  std::shared_ptr<const RankLayout> layout;
  int rank;
  int host;
  int nhosts;
  int localIndex;
  int localSize;
  const std::vector<int>* local;  // the ranks of this host, ascending

  HostView(const CollArgs& args, int r) : layout(effectiveLayout(args)), rank(r) {
    host = layout->hostOf(r);
    nhosts = layout->nhosts();
    localIndex = layout->localIndex(r);
    local = &layout->ranksOf(host);
    localSize = static_cast<int>(local->size());
  }
  // The rank at local index x (mod the host's size) of this host / of host g.
  int localRank(long long x) const { return (*local)[static_cast<size_t>(modRank(x, localSize))]; }
  int rankOn(int g, long long x) const {
    const std::vector<int>& rs = layout->ranksOf(modRank(g, nhosts));
    return rs[static_cast<size_t>(modRank(x, static_cast<int>(rs.size())))];
  }
  // The ranks whose blocks local index x of this host is responsible for in the inter-host
  // exchanges of AllGather and ReduceScatter, ascending: the rank itself (local index x of this
  // host), and every rank q of another host with localIndex(q) % localSize == x.
  std::vector<int> blockSet(int x) const {
    std::vector<int> set;
    for (int q = 0; q < layout->nranks(); ++q) {
      if (layout->hostOf(q) == host ? layout->localIndex(q) == x
                                    : layout->localIndex(q) % localSize == x) {
        set.push_back(q);
      }
    }
    return set;
  }
  // The leader of host g for the rooted collectives: the root on its host, elsewhere the rank at
  // the root's local index (mod the host's size), so that equal hosts use one rail.
  int leader(int g, int root) const {
    if (modRank(g, nhosts) == layout->hostOf(root)) return root;
    return rankOn(g, layout->localIndex(root));
  }
};

}  // namespace

// Slices: the buffer split into S near-equal slices, S the most ranks on one host. In a host of l
// ranks, local index j owns the slices s with s % l == j (block j). Three phases:
// 1. Inside each host, a ring reduce-scatter over the l blocks: local index j ends with the host's
//    sum of block j in its output. Step t sends block j-t-1 (from the input at t = 0, the partial
//    sums in the output after) and reduces block j-t-2 received from j-1 with the input block.
// 2. Across hosts, for each slice s in ascending order, a ring allreduce of the slice among its
//    owners (one per host, in host order): one flow per rail. Its operand is the host's sum in the
//    output, or the input on a host with one rank (phase 1 moved nothing there).
// 3. Inside each host, a ring allgather of the l blocks.
// Every element is summed over the ranks of each host once (phase 1) and over the hosts once (phase
// 2). A rank on a host of l ranks sends about 2 (H-1)/H count/S elements to other hosts.
// Large buffers are cut into up to kHierParts parts, each run through the three phases; all parts'
// phase 1 steps come first, then all phase 2, then all phase 3, so that (as every queue of one
// peer is in order) part p's network phase overlaps part p+1's reduce-scatter and part p-1's
// allgather instead of waiting behind them.
RankSchedule hierAllReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const HostView v(args, rank);
  const int S = v.layout->maxLocal();
  const int l = v.localSize;
  const int j = v.localIndex;
  const int H = v.nhosts;
  const int parts = static_cast<int>(
      std::min<size_t>(kHierParts, std::max<size_t>(1, args.count / kHierMinPartElems)));
  // Slice s of part p, and f(slice) for every slice of block blk of this host (s = blk mod l).
  auto slice = [&](int p, int s) {
    const Block part = evenBlock(args.count, parts, p);
    Block sl = evenBlock(part.count, S, s);
    sl.offset += part.offset;
    return sl;
  };
  auto forBlock = [&](int p, long long blk, auto&& f) {
    for (int s = modRank(blk, l); s < S; s += l) f(slice(p, s));
  };
  const int next = v.localRank(j + 1), prev = v.localRank(j - 1);
  // Phase 1, every part: reduce-scatter inside the host.
  for (int p = 0; p < parts && l > 1; ++p) {
    for (int t = 0; t < l - 1; ++t) {
      forBlock(p, j - t - 1, [&](Block sl) {
        b.send(next, t == 0 ? inputAt(sl.offset) : outputAt(sl.offset), sl.count);
      });
      forBlock(p, j - t - 2, [&](Block sl) {
        b.recvReduce(prev, inputAt(sl.offset), outputAt(sl.offset), sl.count);
      });
    }
  }
  // Phase 2, every part: a ring allreduce of each of this rank's slices among its owners. Each
  // slice is a unit of two halves, its reduce-scatter and its allgather. A unit's allgather is
  // listed after the reduce-scatter of the next unit with the same owners, so the link carries
  // that unit's data while this unit's received half is being reduced (else every unit would leave
  // the link idle for a round trip and a reduction). Every owner lists the same units in the same
  // (part, slice) order and delays alike, so each pair's queue holds the same sequence on both
  // sides.
  auto src = [&](size_t off) { return l > 1 ? outputAt(off) : inputAt(off); };
  struct Unit {
    Block sl;
    std::vector<int> owners;  // the slice's owners on every host, in host order
  };
  // The owners on the next and on the previous host.
  auto up = [&](const Unit& un) { return un.owners[static_cast<size_t>(modRank(v.host + 1, H))]; };
  auto down = [&](const Unit& un) {
    return un.owners[static_cast<size_t>(modRank(v.host - 1, H))];
  };
  std::vector<Unit> units;
  for (int p = 0; p < parts && H > 1; ++p) {
    for (int s = j; s < S; s += l) {
      Unit un{slice(p, s), {}};
      for (int g = 0; g < H; ++g) un.owners.push_back(v.rankOn(g, s));
      units.push_back(std::move(un));
    }
  }
  auto sub = [&](const Block& sl, long long k) {
    Block blk = evenBlock(sl.count, H, modRank(v.host + k, H));
    blk.offset += sl.offset;
    return blk;
  };
  auto reduceScatterHalf = [&](const Unit& un) {
    for (int t = 0; t < H - 1; ++t) {
      const Block sb = sub(un.sl, -t);
      b.send(up(un), t == 0 ? src(sb.offset) : outputAt(sb.offset), sb.count);
      const Block rb = sub(un.sl, -t - 1);
      b.recvReduce(down(un), src(rb.offset), outputAt(rb.offset), rb.count);
    }
  };
  auto allGatherHalf = [&](const Unit& un) {
    for (int t = 0; t < H - 1; ++t) {
      const Block sb = sub(un.sl, 1 - t);
      b.send(up(un), outputAt(sb.offset), sb.count);
      const Block rb = sub(un.sl, -t);
      b.recv(down(un), outputAt(rb.offset), rb.count);
    }
  };
  std::vector<size_t> pending;  // units whose allgather is not listed yet, in order
  for (size_t u = 0; u < units.size(); ++u) {
    reduceScatterHalf(units[u]);
    for (size_t k = 0; k < pending.size(); ++k) {
      if (units[pending[k]].owners == units[u].owners) {
        allGatherHalf(units[pending[k]]);
        pending.erase(pending.begin() + static_cast<long>(k));
        break;
      }
    }
    pending.push_back(u);
  }
  for (size_t u : pending) allGatherHalf(units[u]);
  // Phase 3, every part: allgather inside the host.
  for (int p = 0; p < parts && l > 1; ++p) {
    for (int t = 0; t < l - 1; ++t) {
      forBlock(p, j - t, [&](Block sl) { b.send(next, outputAt(sl.offset), sl.count); });
      forBlock(p, j - t - 1, [&](Block sl) { b.recv(prev, outputAt(sl.offset), sl.count); });
    }
  }
  return b.finish();
}

// A pipelined chain across hosts among the leaders (from the root's host in host order), then a
// pipelined chain inside each host starting at its leader. Non-root ranks receive into their
// output and forward from it.
RankSchedule hierBroadcast(const CollArgs& args, int rank) {
  StepList b;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const HostView v(args, rank);
  const int H = v.nhosts;
  const int root = args.root;
  const int lead = v.leader(v.host, root);
  const BufRef src = rank == root ? inputAt(0) : outputAt(0);
  if (rank == lead) {
    const int q = modRank(v.host - v.layout->hostOf(root), H);  // position in the leaders' chain
    if (q > 0) b.recv(v.leader(v.host - 1, root), outputAt(0), c);
    if (q < H - 1) b.send(v.leader(v.host + 1, root), src, c);
  }
  const int l = v.localSize;
  const int pos = modRank(v.localIndex - v.layout->localIndex(lead), l);
  if (pos > 0) b.recv(v.localRank(v.localIndex - 1), outputAt(0), c);
  if (pos < l - 1) b.send(v.localRank(v.localIndex + 1), src, c);
  if (rank == root && !args.inPlace) b.copy(inputAt(0), outputAt(0), c);
  return b.finish();
}

// The mirror of hierBroadcast: a chain inside each host ending at its leader, then a chain across
// hosts among the leaders ending at the root. Partial sums of non-root ranks live in scratch (a
// non-root rank's output is never written); the root reduces into its output.
RankSchedule hierReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const size_t c = args.count;
  const HostView v(args, rank);
  const int H = v.nhosts;
  const int root = args.root;
  const int lead = v.leader(v.host, root);
  const BufRef acc = rank == root ? outputAt(0) : scratchAt(0);
  bool reduced = false;  // acc holds a partial sum (else the operand is the input)
  auto accumulate = [&](int peer) {
    if (acc.buf == BufKind::kScratch) b.needScratch(c);
    b.recvReduce(peer, reduced ? acc : inputAt(0), acc, c);
    reduced = true;
  };
  const int l = v.localSize;
  const int pos = modRank(v.localIndex - v.layout->localIndex(lead) - 1, l);
  if (pos > 0) accumulate(v.localRank(v.localIndex - 1));
  if (rank != lead) {
    b.send(v.localRank(v.localIndex + 1), reduced ? acc : inputAt(0), c);
    return b.finish();
  }
  const int q = modRank(v.host - v.layout->hostOf(root) - 1, H);
  if (q > 0) accumulate(v.leader(v.host - 1, root));
  if (rank != root) b.send(v.leader(v.host + 1, root), reduced ? acc : inputAt(0), c);
  return b.finish();
}

// Across hosts first: every rank sends its input to one rank of every other host (the one at its
// local index mod that host's size: its rail), then inside each host every rank sends the blocks
// it holds (its own and those it received, blockSet) to every other rank of its host. Each block
// crosses the network once per other host.
RankSchedule hierAllGather(const CollArgs& args, int rank) {
  StepList b;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const HostView v(args, rank);
  const int H = v.nhosts;
  const int l = v.localSize;
  const int j = v.localIndex;
  auto block = [&](int q) { return outputAt(static_cast<size_t>(q) * c); };
  if (!args.inPlace) b.copy(inputAt(0), block(rank), c);
  for (int d = 1; d < H; ++d) b.send(v.rankOn(v.host + d, j), inputAt(0), c);
  for (int d = 1; d < H; ++d) {
    const std::vector<int>& from = v.layout->ranksOf(modRank(v.host - d, H));
    for (int q : from) {
      if (v.layout->localIndex(q) % l == j) b.recv(q, block(q), c);
    }
  }
  const std::vector<int> mine = v.blockSet(j);
  for (int d = 1; d < l; ++d) {
    const int to = v.localRank(j + d);
    for (int q : mine) b.send(to, q == rank ? inputAt(0) : block(q), c);
  }
  for (int d = 1; d < l; ++d) {
    for (int q : v.blockSet(modRank(j - d, l))) b.recv(v.localRank(j - d), block(q), c);
  }
  return b.finish();
}

// The mirror of hierAllGather: inside each host every rank sends each input block to the rank of
// its host responsible for it (blockSet), which reduces the host's contributions (its own block in
// its output, the others in scratch); then across hosts each responsible rank sends its host's
// partial sum of block q to rank q, which reduces them into its output.
RankSchedule hierReduceScatter(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const size_t c = args.count;
  const HostView v(args, rank);
  const int H = v.nhosts;
  const int l = v.localSize;
  const int j = v.localIndex;
  auto in = [&](int q) { return inputAt(static_cast<size_t>(q) * c); };
  for (int d = 1; d < l; ++d) {
    const int to = v.localRank(j + d);
    for (int q : v.blockSet(modRank(j + d, l))) b.send(to, in(q), c);
  }
  const std::vector<int> mine = v.blockSet(j);
  // Where the host's partial sum of each block of mine is.
  std::vector<BufRef> partial(mine.size());
  size_t slots = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    if (l == 1) {
      partial[k] = in(mine[k]);
    } else if (mine[k] == rank) {
      partial[k] = outputAt(0);
    } else {
      partial[k] = scratchAt(slots++ * c);
    }
  }
  if (l > 1) {
    b.needScratch(slots * c);
    for (int d = 1; d < l; ++d) {
      for (size_t k = 0; k < mine.size(); ++k) {
        b.recvReduce(v.localRank(j - d), d == 1 ? in(mine[k]) : partial[k], partial[k], c);
      }
    }
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    if (mine[k] != rank) b.send(mine[k], partial[k], c);
  }
  BufRef acc = l > 1 ? outputAt(0) : in(rank);
  for (int d = 1; d < H; ++d) {
    b.recvReduce(v.rankOn(v.host - d, j), acc, outputAt(0), c);
    acc = outputAt(0);
  }
  return b.finish();
}

}  // namespace loom
