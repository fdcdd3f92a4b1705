#include "algorithms/cost_formulas.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
double rate(double r) { return r > 0 ? r : kInf; }

// hierAllReduce's parts and treeAllReduce's chunks (hier.cc, tree.cc).
constexpr size_t kHierParts = 16;
constexpr size_t kHierMinPartElems = 32 << 10;
size_t hierParts(size_t count) {
  return std::max<size_t>(1, std::min(kHierParts, count / kHierMinPartElems));
}

// The machine's links and ports (what the formulas read of a CostMachine beside the rates Ctx
// derives), copied: a phase may price a host's ranks on a share of its NIC.
struct Links {
  LinkCost intra, inter;
  double nicBytesPerSec = 0;
  bool serialInterAlphaPerRank = false;
};

// The machine as the formulas see it, for one call.
struct Ctx {
  Links m;
  int n = 1, H = 1, P = 1;
  size_t piece = 0;      // bytes; 0: whole steps
  double mem = kInf;     // one rank's memory, all ranks of its host busy
  double reduce = kInf;  // one rank's reduction rate
  double copy = kInf;
  bool fuse = false;
  double memRate = kInf, hostMem = kInf, hostRankMem = kInf;  // what mem derives from

  Ctx(const CostMachine& machine, int nranks, int hosts, size_t pieceBytes)
      : n(nranks), H(hosts), P(nranks / hosts), piece(pieceBytes) {
    m = Links{machine.intra, machine.inter, machine.nicBytesPerSec,
              machine.serialInterAlphaPerRank};
    memRate = rate(machine.memBytesPerSec);
    if (!machine.hostRankMemBytesPerSec.empty())
      hostRankMem = rate(machine.hostRankMemBytesPerSec[0]);
    if (!machine.hostMemBytesPerSec.empty()) hostMem = rate(machine.hostMemBytesPerSec[0]);
    setMem();
    reduce = rate(machine.reduceBytesPerSec);
    copy = rate(machine.copyBytesPerSec);
    fuse = machine.fuseIntraRecvReduce;
  }
  // A rank's memory: its own rate, its share of its host's when the host has more ranks than
  // cores.
  void setMem() { mem = std::min({memRate, hostRankMem, hostMem / P}); }
  double pieces(double bytes) const {
    if (piece == 0 || bytes <= 0) return 1;
    return std::max(1.0, std::ceil(bytes / static_cast<double>(piece)));
  }
  double pieceBytes(double bytes) const { return bytes / pieces(bytes); }
  // One intra-host flow when `users` flows share each rank's memory.
  double intraRate(double users) const {
    return std::min(rate(m.intra.bytesPerSec), mem / std::max(1.0, users));
  }
  // One inter-host flow when `flows` leave (or enter) each host at once.
  double interRate(double flows) const {
    return std::min(rate(m.inter.bytesPerSec), rate(m.nicBytesPerSec) / std::max(1.0, flows));
  }
  double reduceRate(double users) const { return std::min(reduce, mem / std::max(1.0, users)); }
  // A message of `bytes` over a link of alpha at rate r, split into the executor's pieces.
  double msg(double bytes, double alpha, double r) const {
    if (bytes <= 0) return 0;
    return pieces(bytes) * alpha + bytes / r;
  }
  bool sameHost(int a, int b) const { return a / P == b / P; }
};

// One exchange step of every rank at once (recursive doubling and halving, Bruck, binomial
// rounds): `bytes` sent and received by each rank with partner(r), reduced on arrival when
// `reduces`, in the executor's pieces. The step runs at its slowest rank.
struct StepCost {
  double first = 0;   // one piece through: sent, received, reduced
  double each = 0;    // every further piece (the busiest resource's time per piece)
  double pieces = 0;  // 0: an empty step
  // Per piece, what the step takes of resources that pipelined steps share: the busiest host's
  // NIC, a rank's memory, a rank's reductions.
  double nicSec = 0, memSec = 0, reduceSec = 0;
  double total() const { return pieces > 0 ? first + (pieces - 1) * each : 0; }
};

template <typename Partner>
StepCost exchangeStep(const Ctx& c, double bytes, bool reduces, Partner partner) {
  StepCost s;
  if (bytes <= 0) return s;
  std::vector<int> interFlows(static_cast<size_t>(c.H), 0);
  bool intra = false, inter = false;
  for (int r = 0; r < c.n; ++r) {
    int q = partner(r);
    if (q < 0 || q == r) continue;
    if (c.sameHost(r, q)) {
      intra = true;
    } else {
      inter = true;
      ++interFlows[static_cast<size_t>(r / c.P)];
    }
  }
  if (!intra && !inter) return s;
  const int flows = *std::max_element(interFlows.begin(), interFlows.end());
  s.pieces = c.pieces(bytes);
  const double piece = bytes / s.pieces;
  if (intra) {
    // A send and a receive on each rank's memory (the reduction fused into the receive, or a
    // third user).
    double r = c.intraRate(reduces && !c.fuse ? 3 : 2);
    if (reduces && c.fuse) r = std::min(r, c.reduceRate(2));
    double move = c.m.intra.alphaSec + piece / r;
    double red = reduces && !c.fuse ? piece / c.reduceRate(3) : 0;
    s.first = std::max(s.first, move + red);
    s.each = std::max({s.each, move, red});
    s.memSec = 2 * piece / c.mem;
  }
  if (inter) {
    double move = c.m.inter.alphaSec + piece / c.interRate(flows);
    double red = reduces ? piece / c.reduceRate(1) : 0;
    s.first = std::max(s.first, move + red);
    s.each = std::max({s.each, move, red});
    s.nicSec = piece * flows / rate(c.m.nicBytesPerSec);
  }
  if (reduces) s.reduceSec = piece / c.reduce;
  return s;
}

// Steps whose pieces pipeline from one step to the next (each step moves the same vector: a
// piece goes on as soon as its previous step is done with it).
double pipelinedSteps(const std::vector<StepCost>& steps) {
  double fill = 0, each = 0, pieces = 0, nic = 0, mem = 0, red = 0;
  for (const StepCost& s : steps) {
    if (s.pieces == 0) continue;
    fill += s.first;
    each = std::max(each, s.each);
    pieces = std::max(pieces, s.pieces);
    nic += s.nicSec;  // every step's pieces cross the same NIC, memory and reduction units
    mem += s.memSec;
    red += s.reduceSec;
  }
  return pieces > 0 ? fill + (pieces - 1) * std::max({each, nic, mem, red}) : 0;
}

// A ring of n ranks (the layout's default order: hosts entered and left once) moving `steps`
// steps of `bytes` per channel over `channels` channels, reducing on arrival when `reduces`: it
// runs at its slowest link, piece by piece.
double ringSteps(const Ctx& c, int steps, double bytes, int channels, bool reduces) {
  if (steps <= 0 || bytes <= 0) return 0;
  const double k = c.pieces(bytes);
  const double piece = bytes / k;
  double t = 0;
  if (c.P > 1) {
    // Each rank's memory: a send and a receive per channel (and the reduction when not fused).
    double users = 2.0 * channels + (reduces && !c.fuse ? channels : 0);
    double r = c.intraRate(users);
    if (reduces && c.fuse) r = std::min(r, c.reduceRate(users));
    t = std::max(t, c.m.intra.alphaSec + piece / r);
    if (reduces && !c.fuse) t = std::max(t, piece / c.reduceRate(users));
  }
  if (c.H > 1) {
    t = std::max(t, c.m.inter.alphaSec + piece / c.interRate(channels));
    if (reduces) t = std::max(t, piece / c.reduceRate(2.0 * channels));
  }
  return steps * k * t;
}

// A pipelined chain (broadcast or reduce) of interHops hops between hosts and intraHops inside
// hosts, each piece forwarded as soon as it arrives: the pipeline fills along the hops, then runs
// at its slowest hop.
double chainCost(const Ctx& c, double bytes, bool reduces, int interHops, int intraHops) {
  if (interHops + intraHops <= 0 || bytes <= 0) return 0;
  const double k = c.pieces(bytes);
  const double piece = bytes / k;
  double tIntra = 0, tInter = 0;
  if (intraHops > 0) {
    double r = c.intraRate(reduces && !c.fuse ? 3 : 2);
    if (reduces && c.fuse) r = std::min(r, c.reduceRate(2));
    tIntra = c.m.intra.alphaSec + piece / r;
    if (reduces && !c.fuse) tIntra += piece / c.reduceRate(3);
  }
  if (interHops > 0) {
    tInter = c.m.inter.alphaSec + piece / c.interRate(1);
    if (reduces) tInter += piece / c.reduceRate(1);
  }
  return interHops * tInter + intraHops * tIntra + (k - 1) * std::max(tIntra, tInter);
}

// Direct exchanges: a rank sends `block` bytes to each other rank at once, or receives one from
// each and reduces them into its own block. allSend: every rank does so (the exchanges of
// AllReduce, ReduceScatter, AllGather, AllToAll: a host's NIC carries P x (n - P) blocks and each
// rank's memory 2 (P - 1)); otherwise one root does (Broadcast, Reduce). The senders post their
// inter-host messages one after the other when the machine says so. Reduced receives run in
// turn, piece by piece (a piece of one peer's block waits for the same piece of the previous
// peer's), so they pipeline over the pieces.
double directFan(const Ctx& c, double block, bool reduces, bool allSend) {
  if (c.n <= 1 || block <= 0) return 0;
  const int local = c.P - 1, remote = c.n - c.P;
  const double k = c.pieces(block);
  const bool serial = c.m.serialInterAlphaPerRank;
  const double senders = allSend ? c.P : 1, memBlocks = allSend ? 2 : 1;
  const double nic = senders * remote * block / rate(c.m.nicBytesPerSec);
  if (reduces) {
    const double piece = block / k;
    double rIntra = std::min(c.intraRate(2), c.fuse ? c.reduceRate(2) : kInf);
    double tIntra = c.m.intra.alphaSec + piece / rIntra + (c.fuse ? 0 : piece / c.reduceRate(3));
    double tInter = c.m.inter.alphaSec + piece / c.interRate(senders) + piece / c.reduceRate(1);
    double chain = local * tIntra + remote * tInter +
                   (k - 1) * std::max(local ? tIntra : 0.0, remote ? tInter : 0.0);
    // Each sender's own messages to its host's ranks come first in its serial order.
    if (allSend && remote > 0 && serial) chain += k * c.m.inter.alphaSec * local;
    double volume =
        std::max({memBlocks * local * block / c.mem, (c.n - 1) * block / c.reduce, nic});
    return std::max(chain, volume);
  }
  double t = 0;
  if (local > 0)
    t = std::max(t, k * c.m.intra.alphaSec + std::max(block / rate(c.m.intra.bytesPerSec),
                                                      memBlocks * local * block / c.mem));
  if (remote > 0)
    t = std::max(t, c.m.inter.alphaSec * k * (serial ? remote : 1) +
                        std::max(block / rate(c.m.inter.bytesPerSec), nic));
  return t;
}

// Recursive doubling / halving: log2(p) steps over p = 2^L ranks, plus the fold of the n - p
// extra ranks (whole vector to the neighbour before, back after) when n is not a power of two.
double foldCost(const Ctx& c, double bytes, bool reduces) {
  RecursiveDoublingPattern pat{c.n, 0};
  if (pat.extras() == 0) return 0;
  auto fold = [&](int r) {
    RecursiveDoublingPattern p{c.n, r};
    return p.foldPeer();
  };
  return exchangeStep(c, bytes, reduces, fold).total() +
         exchangeStep(c, bytes, false, fold).total();
}

double rdAllReduce(const Ctx& fused, double bytes) {
  // Half the ranks of every exchange receive and then reduce (lower op higher): not fused. Every
  // step moves the whole vector, so its pieces pipeline through the steps (and the fold).
  Ctx c = fused;
  c.fuse = false;
  RecursiveDoublingPattern base{c.n, 0};
  auto fold = [&](int r) { return RecursiveDoublingPattern{c.n, r}.foldPeer(); };
  std::vector<StepCost> steps;
  if (base.extras() > 0) steps.push_back(exchangeStep(c, bytes, true, fold));
  for (int k = 0; k < base.steps(); ++k) {
    steps.push_back(exchangeStep(c, bytes, true, [&](int r) {
      RecursiveDoublingPattern p{c.n, r};
      return p.isExtra() ? -1 : p.partner(k);
    }));
  }
  if (base.extras() > 0) steps.push_back(exchangeStep(c, bytes, false, fold));
  return pipelinedSteps(steps);
}

// Recursive halving (reduce-scatter, distances p/2, p/4, ...) and doubling (allgather, distances
// 1, 2, ...) over `bytes` (the whole vector).
double rhdPhase(const Ctx& c, double bytes, bool halving) {
  RecursiveDoublingPattern base{c.n, 0};
  const int L = base.steps();
  const double p2 = base.pow2();
  double t = 0;
  for (int s = 0; s < L; ++s) {
    int k = halving ? L - 1 - s : s;
    double stepBytes = halving ? bytes / std::pow(2.0, s + 1) : bytes * std::pow(2.0, s) / p2;
    t += exchangeStep(c, stepBytes, halving, [&](int r) {
           RecursiveDoublingPattern p{c.n, r};
           return p.isExtra() ? -1 : p.partner(k);
         }).total();
  }
  return t;
}

// The double binary tree: each tree carries half the vector up (reducing) and down, in chunks
// that pipeline along its depth. Edges between hosts share their hosts' NICs.
double treeAllReduce(const Ctx& c, const CollArgs& args, size_t elemSize) {
  if (c.n <= 1) return 0;
  const double half = static_cast<double>((args.count + 1) / 2) * elemSize;
  const double chunks = static_cast<double>(treeAllReduceChunks(args.count));
  const double chunk = half / chunks;
  // Depth in hops, and the busiest host's inter-host edges (both trees, one direction).
  std::vector<int> interEdges(static_cast<size_t>(c.H), 0);
  int depth = 0, interDepth = 0;
  for (int tree = 0; tree < 2; ++tree) {
    for (int r = 0; r < c.n; ++r) {
      TreeLinks l = DoubleBinaryTreePattern{c.n, r}.links(tree);
      if (l.parent >= 0 && !c.sameHost(r, l.parent)) ++interEdges[static_cast<size_t>(r / c.P)];
      if (!l.isLeaf()) continue;
      int d = 0, di = 0;
      for (int v = r; v >= 0;) {
        int par = DoubleBinaryTreePattern{c.n, v}.links(tree).parent;
        if (par < 0) break;
        ++d;
        di += c.sameHost(v, par) ? 0 : 1;
        v = par;
      }
      if (d > depth || (d == depth && di > interDepth)) {
        depth = d;
        interDepth = di;
      }
    }
  }
  const int flows = *std::max_element(interEdges.begin(), interEdges.end());
  const double k = c.pieces(chunk);
  const double piece = chunk / k;
  // An interior rank receives from two children and sends to its parent (up) or the reverse
  // (down), for two trees: about four flows on its memory.
  double tIntra = c.P > 1 ? c.m.intra.alphaSec + piece / c.intraRate(4) : 0;
  double tInter = c.H > 1 ? c.m.inter.alphaSec + piece / c.interRate(std::max(1, flows)) : 0;
  double tRed = piece / c.reduceRate(4);
  double hop = std::max(tIntra, tInter);
  double pipelineFill = interDepth * tInter + (depth - interDepth) * tIntra;
  // Up: the pieces of every chunk through the depth, each reduced at every level; down: the same
  // without reductions. Every rank sends its chunks twice (two trees share its links).
  double total = chunks * k;  // per edge; the two trees run on other edges at once
  double up = pipelineFill + depth * tRed + (total - 1) * std::max(hop, 2 * tRed);
  double down = pipelineFill + (total - 1) * hop;
  return up + down;
}

// The ranks of one host alone (the intra-host phases of the hierarchical algorithms).
Ctx oneHost(const Ctx& c) {
  Ctx intra = c;
  intra.H = 1;
  intra.n = c.P;
  return intra;
}

// One rank per host, its NIC shared with its host's other ranks doing the same at once (the
// inter-host phases of the hierarchical algorithms: every local index has its own).
Ctx oneRankPerHost(const Ctx& c) {
  Ctx inter = c;
  if (inter.m.nicBytesPerSec > 0) inter.m.nicBytesPerSec /= c.P;
  inter.n = c.H;
  inter.P = 1;
  inter.setMem();
  return inter;
}

// Two-level: reduce-scatter inside each host (a ring of P), an allreduce (ring over H) of each
// rank's slice with the ranks of the same local index, an allgather inside the host; pipelined
// over parts.
double hierAllReduce(const Ctx& c, const CollArgs& args, size_t elemSize) {
  const double bytes = static_cast<double>(args.count) * elemSize;
  const double parts = static_cast<double>(hierParts(args.count));
  const Ctx intra = oneHost(c), interShared = oneRankPerHost(c);
  double part = bytes / parts;
  double rs = ringSteps(intra, c.P - 1, part / c.P, 1, true);
  double ar = 2 * ringSteps(interShared, c.H - 1, part / (c.P * static_cast<double>(c.H)), 1, true);
  double ag = ringSteps(intra, c.P - 1, part / c.P, 1, false);
  double slowest = std::max({rs, ar, ag});
  return rs + ar + ag + (parts - 1) * slowest;
}

// Hierarchical AllGather / ReduceScatter: a direct exchange among the ranks of each local index
// across hosts (every rank's rail at once) and a direct exchange of H blocks inside each host.
double hierGather(const Ctx& c, double block, bool reduces) {
  const Ctx intra = oneHost(c), inter = oneRankPerHost(c);
  return directFan(intra, block * c.H, reduces, true) + directFan(inter, block, reduces, true);
}

// binomial.cc's lowest set bit of v (v > 0), or the first power of two >= n for the root.
int binomialBit(int v, int n) {
  int low = 1;
  if (v == 0) {
    while (low < n) low <<= 1;
  } else {
    while (!(v & low)) low <<= 1;
  }
  return low;
}

// Binomial broadcast or reduce (binomial.cc): v = rank - root receives from v minus its lowest
// set bit and sends to v + 2^k for every 2^k below it, largest subtree first, all at once. The
// first piece's arrival is followed down the tree (a rank's sends share its NIC and memory, and
// post their inter-host alphas one after the other when the machine says so); further pieces
// follow at the pace of the busiest rank.
double binomialBroadcast(const Ctx& c, double bytes, int root) {
  const double k = c.pieces(bytes);
  const double piece = bytes / k;
  const bool serial = c.m.serialInterAlphaPerRank;
  std::vector<double> arrival(static_cast<size_t>(c.n), 0);
  double last = 0, slowest = 0;
  auto real = [&](int v) { return (v + root) % c.n; };
  for (int v = 0; v < c.n; ++v) {
    const int low = binomialBit(v, c.n);
    int inter = 0, intra = 0;
    for (int d = low >> 1; d >= 1; d >>= 1)
      if (v + d < c.n) (c.sameHost(real(v), real(v + d)) ? intra : inter)++;
    if (inter + intra == 0) continue;
    const double interRate =
        std::min(rate(c.m.inter.bytesPerSec), rate(c.m.nicBytesPerSec) / std::max(1, inter));
    const double intraRate = std::min(rate(c.m.intra.bytesPerSec), c.mem / (intra + 1));
    int nthInter = 0;
    for (int d = low >> 1; d >= 1; d >>= 1) {
      if (v + d >= c.n) continue;
      double hop;
      if (c.sameHost(real(v), real(v + d))) {
        hop = c.m.intra.alphaSec + piece / intraRate;
      } else {
        ++nthInter;
        hop = c.m.inter.alphaSec * (serial ? nthInter : 1) + piece / interRate;
      }
      double t = arrival[static_cast<size_t>(v)] + hop;
      arrival[static_cast<size_t>(v + d)] = t;
      last = std::max(last, t);
    }
    if (inter > 0)
      slowest = std::max(slowest, c.m.inter.alphaSec * (serial ? inter : 1) + piece / interRate);
    if (intra > 0) slowest = std::max(slowest, c.m.intra.alphaSec + piece / intraRate);
  }
  return last + (k - 1) * slowest;
}

// Binomial reduce: the tree backwards. A rank reduces its children's sums into one partial sum,
// one child after the other (smallest subtree first), then sends it to its parent; the first
// piece's readiness is followed up the tree, further pieces at the pace of the busiest rank.
double binomialReduce(const Ctx& c, double bytes, int root) {
  const double k = c.pieces(bytes);
  const double piece = bytes / k;
  auto real = [&](int v) { return (v + root) % c.n; };
  double intraRate = std::min(rate(c.m.intra.bytesPerSec), c.mem / 2);
  const double red = piece / c.reduceRate(2);
  if (c.fuse) intraRate = std::min(intraRate, c.reduceRate(2));
  const double intraHop = c.m.intra.alphaSec + piece / intraRate + (c.fuse ? 0 : red);
  const double interHop = c.m.inter.alphaSec +
                          piece / std::min(rate(c.m.inter.bytesPerSec), rate(c.m.nicBytesPerSec)) +
                          red;
  std::vector<double> ready(static_cast<size_t>(c.n), 0);
  double slowest = 0;
  for (int v = c.n - 1; v >= 0; --v) {
    const int low = binomialBit(v, c.n);
    // Per further piece: the reductions into the partial sum take turns (an intra-host receive
    // that reduces as it arrives holds the sum for all of it); inter-host pieces arrive in
    // staging at once, sharing the NIC.
    double t = 0, serialized = 0, inter = 0;
    for (int mask = 1; mask < low; mask <<= 1) {
      if (v + mask >= c.n) continue;
      const bool local = c.sameHost(real(v), real(v + mask));
      double hop = local ? intraHop : interHop;
      t = std::max(t, ready[static_cast<size_t>(v + mask)]) + hop;
      serialized += local ? intraHop : red;
      inter += local ? 0 : 1;
    }
    ready[static_cast<size_t>(v)] = t;
    slowest = std::max({slowest, serialized, inter > 0 ? interHop : 0.0,
                        inter * piece / rate(c.m.nicBytesPerSec)});
  }
  return ready[0] + (k - 1) * slowest;
}

double bruckAllGather(const Ctx& c, double block) {
  double t = 0;
  for (int d = 1; d < c.n; d *= 2) {
    double bytes = block * std::min(d, c.n - d);
    t += exchangeStep(c, bytes, false, [&](int r) { return (r + d) % c.n; }).total();
  }
  // The blocks are copied into scratch and rotated out again.
  return t + 2.0 * block * c.n / std::min(c.copy, c.mem);
}

double bruckAllToAll(const Ctx& c, double block) {
  double t = 0;
  for (int d = 1; d < c.n; d *= 2) {
    int blocks = 0;
    for (int i = 1; i < c.n; ++i) blocks += (i & d) ? 1 : 0;
    double bytes = block * blocks;
    t += exchangeStep(c, bytes, false, [&](int r) { return (r + d) % c.n; }).total();
    t += 2.0 * bytes / std::min(c.copy, c.mem);  // packed and unpacked
  }
  return t;
}

}  // namespace

bool costFormulasApply(const CollArgs& args, const CostMachine& machine) {
  std::shared_ptr<const RankLayout> layout = effectiveLayout(args);
  if (layout->nranks() != args.nranks || args.nranks < 1) return false;
  const int H = layout->nhosts();
  if (args.nranks % H != 0) return false;
  const int P = args.nranks / H;
  if (machine.hostOf.size() != static_cast<size_t>(args.nranks)) return false;
  for (int r = 0; r < args.nranks; ++r) {
    if (layout->hostOf(r) != r / P) return false;
    if (machine.hostOf[static_cast<size_t>(r)] != machine.hostOf[static_cast<size_t>(r / P * P)])
      return false;
    if (!layout->ringOrder().empty() && layout->ringOrder()[static_cast<size_t>(r)] != r)
      return false;
  }
  return true;
}

Result<double> formulaCost(const std::string& algorithm, const CollArgs& args,
                           const CostMachine& machine, size_t elemSize, size_t pieceBytes) {
  if (!costFormulasApply(args, machine))
    return LOOM_ERROR(kInvalidArgument,
                      "the closed-form costs need hosts of equal size with consecutive ranks");
  if (elemSize == 0) return LOOM_ERROR(kInvalidArgument, "element size 0");
  std::shared_ptr<const RankLayout> layout = effectiveLayout(args);
  const int n = args.nranks;
  Ctx c(machine, n, layout->nhosts(), pieceBytes);
  if (n == 1) return 0.0;
  const int ch = layout->channels();
  const double elem = static_cast<double>(elemSize);
  // Bytes of the whole buffer (AllReduce, Broadcast, Reduce: one rank's vector; AllGather,
  // ReduceScatter: the gathered buffer; AllToAll: one rank's n blocks) and of one block.
  const double whole = static_cast<double>(collCallCount(args.coll, args.count, n)) * elem;
  const double block = args.coll == CollKind::kAllReduce || args.coll == CollKind::kBroadcast ||
                               args.coll == CollKind::kReduce
                           ? whole / n
                           : static_cast<double>(args.count) * elem;
  const std::string& a = algorithm;
  switch (args.coll) {
    case CollKind::kAllReduce:
      if (a == "ring")
        return ringSteps(c, n - 1, block / ch, ch, true) +
               ringSteps(c, n - 1, block / ch, ch, false);
      if (a == "rd") return rdAllReduce(c, whole);
      if (a == "direct") return directFan(c, block, true, true) + directFan(c, block, false, true);
      if (a == "tree") return treeAllReduce(c, args, elemSize);
      if (a == "rhd")
        return foldCost(c, whole, true) + rhdPhase(c, whole, true) + rhdPhase(c, whole, false);
      if (a == "hier") return hierAllReduce(c, args, elemSize);
      break;
    case CollKind::kAllGather:
      if (a == "ring") return ringSteps(c, n - 1, block / ch, ch, false);
      if (a == "direct") return directFan(c, block, false, true);
      if (a == "bruck") return bruckAllGather(c, block);
      if (a == "rhd") return foldCost(c, whole, false) + rhdPhase(c, whole, false);
      if (a == "hier") return hierGather(c, block, false);
      break;
    case CollKind::kReduceScatter:
      if (a == "ring") return ringSteps(c, n - 1, block / ch, ch, true);
      if (a == "direct") return directFan(c, block, true, true);
      if (a == "rhd") return foldCost(c, whole, true) + rhdPhase(c, whole, true);
      if (a == "hier") return hierGather(c, block, true);
      break;
    case CollKind::kBroadcast:
    case CollKind::kReduce: {
      const bool red = args.coll == CollKind::kReduce;
      if (a == "chain") return chainCost(c, whole, red, c.H - 1, n - c.H);
      if (a == "direct") return directFan(c, whole, red, false);
      if (a == "binomial")
        return red ? binomialReduce(c, whole, args.root) : binomialBroadcast(c, whole, args.root);
      if (a == "hier") return chainCost(c, whole, red, c.H - 1, c.P - 1);
      break;
    }
    case CollKind::kAllToAll:
      if (a == "pairwise")
        return directFan(c, block, false, true) + block / std::min(c.copy, c.mem);
      if (a == "bruck") return bruckAllToAll(c, block);
      break;
    case CollKind::kSendRecv:
      break;
  }
  return LOOM_ERROR(kInvalidArgument, "no closed-form cost for {} {}", collName(args.coll), a);
}

}  // namespace loom
