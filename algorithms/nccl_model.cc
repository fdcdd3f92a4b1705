#include "algorithms/nccl_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/core/text.h"

namespace loom {

namespace {

constexpr int kTree = 0, kRing = 1, kCollNetDirect = 2, kCollNetChain = 3, kNvls = 4, kNvlsTree = 5,
              kPat = 6;
constexpr int kLL = 0, kLL128 = 1, kSimple = 2;
constexpr int kHwNvlink = 0, kHwPci = 1, kHwNet = 2;

// NCCL 2.28's published tuning constants (src/graph/tuning.cc), microseconds and GB/s.
constexpr NcclConstants kDefaults = {
    // base latencies: tree, ring, collnet direct, collnet chain, NVLS, NVLS-tree, PAT x LL, LL128,
    // Simple
    {{6.8, 14.0, 8.4},
     {6.6, 14.0, 8.4},
     {0, 0, 0},
     {0, 0, 0},
     {0, 0, 0},
     {0, 0, 0},
     {8.0, 8.0, 8.0}},
    // hardware latencies: NVLink, PCIe, network
    {{{0.6, 1.25, 4.0},
      {0.6, 1.9, 3.4},
      {0, 0, 3.7},
      {0, 0, 2.8},
      {0, 0, 25},
      {0, 0, 25},
      {0, 0, 4.0}},
     {{1.0, 1.9, 4.0},
      {1.0, 2.5, 5.7},
      {0, 0, 3.7},
      {0, 0, 2.8},
      {0, 0, 0},
      {0, 0, 0},
      {0, 0, 4.0}},
     {{5.0, 8.5, 14},
      {2.7, 4.0, 14.0},
      {0, 0, 31},
      {0, 0, 30},
      {0, 0, 18},
      {0, 0, 20.9},
      {0, 0, 14}}},
    // LL caps; rows Volta, Ampere, Hopper, Blackwell; columns 1 node, 2 nodes, more
    {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}},
    {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}},
    {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}},
    {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}},
    {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 80.0}},
};
constexpr double kNvlsEfficiency[4] = {0.0, 0.0, 0.85, 0.74};
// Trees stray from the model at medium sizes: NCCL's correction per protocol, by
// log2(bytes / 64) from 0 to 23.
constexpr double kTreeCorrection[kNcclProtos][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6,  .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6,  .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
     .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

// NCCL's search: per-channel speeds it tries (src/graph/search.cc), by architecture, inside one
// node and across nodes.
const std::vector<double>& speedArray(int sm, bool inter) {
  static const std::vector<double> kIntra = {40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3};
  static const std::vector<double> kInter = {48, 30, 28, 24, 20, 18,  15,  12,   10,  9,
                                             7,  6,  5,  4,  3,  2.4, 1.2, 0.24, 0.12};
  static const std::vector<double> kSm90Intra = {60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3};
  static const std::vector<double> kSm90Inter = {48, 45, 42, 40, 30,  24,  22,   20,  17.5,
                                                 15, 12, 6,  3,  2.4, 1.2, 0.24, 0.12};
  static const std::vector<double> kSm100Intra = {90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18};
  static const std::vector<double> kSm100Inter = {96, 86,   80, 48, 45.1, 42, 40,  30,  24,   22,
                                                  20, 17.5, 15, 12, 6,    3,  2.4, 1.2, 0.24, 0.12};
  if (sm >= 100) return inter ? kSm100Inter : kSm100Intra;
  if (sm >= 90) return inter ? kSm90Inter : kSm90Intra;
  return inter ? kInter : kIntra;
}

int compCapIndex(int sm) { return sm >= 100 ? 3 : sm >= 90 ? 2 : sm >= 80 ? 1 : 0; }

int log2i(double v) { return v < 1 ? 0 : static_cast<int>(std::floor(std::log2(v))); }

// What NCCL sees of a node: the rates its search works with.
struct SearchView {
  int gpus = 1, nodes = 1, sm = 90, nics = 0;
  double gpuTotal = 0;  // one GPU's links to the other GPUs
  double pairBw = 0;    // the best path between two GPUs
  double netPath = 0;   // a GPU's path to its NIC (the narrower of the NIC and PCIe)
  bool nvlink = false;
};

SearchView searchView(const ClusterSpec& c) {
  const NodeSpec& n = c.node;
  SearchView v;
  v.gpus = n.gpus;
  v.nodes = c.nodes;
  v.sm = n.sm;
  v.nics = n.nics;
  v.nvlink = n.nvlinks > 0;
  double pci = n.pciGBs * 0.75;  // NCCL counts a PCIe link at 3/4 of its signalling rate
  if (v.nvlink) {
    v.gpuTotal = n.gpuIntraRatedGBs();
    // Without NVSwitches the links are spread over the peers (a full mesh).
    v.pairBw = n.nvswitch || n.gpus <= 2 ? v.gpuTotal : v.gpuTotal / (n.gpus - 1);
  } else {
    v.gpuTotal = v.pairBw = pci;
  }
  // More ports than GPUs, in whole multiples (dual-port NICs, AWS p5's 4 EFA ports per GPU): NCCL
  // (2.21 on, NCCL_NET_MERGE_LEVEL) and its plugins merge the ports of one GPU into a virtual NIC.
  int merged = 1;
  if (n.nics > n.gpus && n.gpus > 0 && n.nics % n.gpus == 0) merged = n.nics / n.gpus;
  v.nics = n.nics / merged;
  v.netPath = std::min(n.nicGBs * merged, pci * merged);
  return v;
}

// The channels a ring or tree graph fits at per-channel speed s: each channel passes every GPU
// of the node once (in and out on its links) and, across nodes, enters and leaves through one NIC.
int channelsAt(const SearchView& v, double s, bool tree) {
  constexpr int kMaxChannels = 16;  // NCCL: MAXCHANNELS / 2 for ring and tree graphs
  int c = kMaxChannels;
  if (v.gpus > 1) {
    double total = v.gpuTotal * (tree ? v.gpus / (v.gpus - 1.0) : 1.0);
    if (s > v.pairBw) return 0;
    c = std::min(c, static_cast<int>(std::floor(total / s + 1e-9)));
  }
  if (v.nodes > 1) {
    if (s > v.netPath || v.nics < 1) return 0;
    c = std::min(c, v.nics * static_cast<int>(std::floor(v.netPath / s + 1e-9)));
  }
  return c;
}

// NCCL's ring or tree search: pass 1 lowers the speed (keeping the best channels x speed while the
// next speed is above half the best), channels are duplicated when fast, pass 2 raises the speed
// of the channels found.
NcclGraph searchRingTree(const SearchView& v, bool tree) {
  NcclGraph g;
  g.nvlink = v.nvlink;
  const std::vector<double>& speeds = speedArray(v.sm, v.nodes > 1);
  size_t i = 0;
  while (i + 1 < speeds.size() && speeds[i] > std::max(v.pairBw, v.nodes > 1 ? v.netPath : 0.0))
    ++i;
  double bestBw = 0;
  int bestC = 0;
  size_t bestI = 0;
  for (; i < speeds.size(); ++i) {
    int c = channelsAt(v, speeds[i], tree);
    if (c > 0 && c * speeds[i] > bestC * bestBw) {
      bestC = c;
      bestBw = speeds[i];
      bestI = i;
      if (c * speeds[i] >= v.gpuTotal) break;  // optimal: the GPUs' links are full
    }
    if (bestC > 0 && !(i + 1 < speeds.size() && speeds[i + 1] / bestBw > .49)) break;
  }
  if (bestC == 0) return g;  // NCCL then falls back to one slow channel; not modelled
  g.channels = bestC;
  g.bwIntra = g.bwInter = bestBw;
  // Duplication (ncclTopoDupChannels).
  if (g.bwIntra >= 25.0 && !(v.sm > 80 && g.bwIntra < 50.0 && g.channels > 4)) {
    g.channels = std::min(2 * g.channels, 16);
    g.bwIntra /= 2;
    g.bwInter /= 2;
  }
  // Pass 2: a higher speed for the same channels.
  size_t j = bestI;
  while (j < speeds.size() && speeds[j] > g.bwInter) ++j;
  while (j > 0) {
    double up = speeds[j - 1];
    if (!tree) {
      if (channelsAt(v, up, false) < g.channels) break;
      g.bwIntra = g.bwInter = up;
    } else {
      // Trees raise only their intra-node rate, up to twice the inter-node one.
      if (v.nodes <= 1 || g.bwIntra >= 2 * g.bwInter) break;
      SearchView intraOnly = v;
      intraOnly.nodes = 1;
      if (channelsAt(intraOnly, up, true) < g.channels) break;
      g.bwIntra = up;
    }
    --j;
  }
  return g;
}

// NVLS (NVLink SHARP) and CollNet graphs: one channel per head (a GPU that reads the switch's
// result; across nodes each head needs a NIC). For NVLS every GPU's switch link carries every
// channel once each way and its own heads' twice: the intra-node speed is the highest that fits;
// the search's second pass then raises the inter-node speed (which the switch links do not carry)
// while it is below twice the intra-node one.
NcclGraph searchHeads(const SearchView& v, int heads, bool nvls) {
  NcclGraph g;
  g.nvlink = v.nvlink;
  const std::vector<double>& speeds = speedArray(v.sm, v.nodes > 1);
  const double net = v.nodes > 1 ? v.netPath : std::numeric_limits<double>::max();
  const int headsPerGpu = (heads + v.gpus - 1) / v.gpus;
  size_t i = 0;
  for (; i < speeds.size(); ++i) {
    double s = speeds[i];
    bool fits = s <= net && (nvls ? (heads + headsPerGpu) * s <= v.gpuTotal + 1e-9 : s <= v.pairBw);
    if (fits) break;
  }
  if (i == speeds.size()) return g;
  g.channels = heads;
  g.bwIntra = g.bwInter = speeds[i];
  if (nvls) {
    size_t j = i;
    while (j > 0 && g.bwInter < 2 * g.bwIntra && speeds[j - 1] <= net) g.bwInter = speeds[--j];
    // Across nodes, once the NICs stop the inter-node speed, the same pass raises the intra-node
    // one (its generic branch) while the switch links carry it and it stays below twice the
    // inter-node speed: Blackwell's NVLink takes 80 GB/s per head over 48 GB/s NICs.
    if (v.nodes > 1) {
      size_t k = i;
      while (k > 0 && g.bwIntra < 2 * g.bwInter &&
             (heads + headsPerGpu) * speeds[k - 1] <= v.gpuTotal + 1e-9)
        g.bwIntra = speeds[--k];
    }
  }
  return g;
}

TrafficPattern patternOf(int a) {
  switch (a) {
    case kRing:
      return TrafficPattern::kNeighbor;
    case kTree:
    case kNvlsTree:
      return TrafficPattern::kTree;
    case kPat:
      return TrafficPattern::kButterfly;
    default:
      return TrafficPattern::kInNetwork;
  }
}

int collIndex(CollKind c) { return static_cast<int>(c); }

}  // namespace

const char* ncclAlgoName(NcclAlgo a) {
  static const char* kNames[kNcclAlgos] = {
      "tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
  return kNames[static_cast<int>(a)];
}

const char* ncclProtoName(NcclProto p) {
  static const char* kNames[kNcclProtos] = {"LL", "LL128", "Simple"};
  return kNames[static_cast<int>(p)];
}

bool parseNcclAlgo(const std::string& name, NcclAlgo* out) {
  std::string n = asciiLower(name);
  if (n == "collnet" || n == "collnetdirect") n = "collnet_direct";
  if (n == "collnetchain") n = "collnet_chain";
  if (n == "nvlstree") n = "nvls_tree";
  for (int a = 0; a < kNcclAlgos; ++a) {
    if (n == ncclAlgoName(static_cast<NcclAlgo>(a))) {
      *out = static_cast<NcclAlgo>(a);
      return true;
    }
  }
  return false;
}

const NcclConstants& NcclConstants::defaults() { return kDefaults; }

Result<NcclModel> NcclModel::build(const ClusterSpec& cluster, const NcclConstants* constants) {
  LOOM_TRY(cluster.validate());
  NcclModel m;
  m.cluster_ = cluster;
  m.k_ = constants ? *constants : kDefaults;
  if (cluster.node.hostMemory) return m;  // NCCL runs on GPUs only: every time is < 0
  SearchView v = searchView(cluster);
  m.graphs_[kRing] = searchRingTree(v, false);
  m.graphs_[kTree] = searchRingTree(v, true);
  m.graphs_[kPat] = m.graphs_[kTree];
  const NodeSpec& n = cluster.node;
  if (n.nvswitch && n.nvls && n.sm >= 90) {
    constexpr int kMaxNvlsArity = 32;  // NCCL_MAX_NVLS_ARITY
    int heads = std::min(kMaxNvlsArity, cluster.nodes > 1 ? std::min(n.gpus, n.nics) : n.gpus);
    m.graphs_[kNvls] = m.graphs_[kNvlsTree] = searchHeads(v, heads, true);
  }
  if (cluster.fabric.sharp && cluster.nodes > 1)
    m.graphs_[kCollNetDirect] = m.graphs_[kCollNetChain] =
        searchHeads(v, std::min(n.gpus, n.nics), false);
  m.fillTable(false, &m.nccl_);
  m.fillTable(true, &m.fabric_);
  return m;
}

// NCCL's ncclTopoTuneModel, with the fabric's share and hops when `fabric`.
void NcclModel::fillTable(bool fabric, Table* t) const {
  const ClusterSpec& c = cluster_;
  const NodeSpec& node = c.node;
  const int nNodes = c.nodes;
  const int nRanks = c.nranks();
  if (nRanks <= 1) return;
  const int cc = compCapIndex(node.sm);
  const int index2 = nNodes <= 2 ? nNodes - 1 : 2;
  const bool amd = node.cpu == NodeSpec::Cpu::kAmd;
  const int index1 = nNodes == 1 ? cc : (amd ? 1 : 0);
  const double llMaxBw = k_.llMaxBws[index1][index2];
  const double perChMaxTreeBw = k_.perChMaxTreeBws[cc][index2];
  const double perChMaxRingLL128Bw = k_.perChMaxRingLL128Bws[cc][index2];
  const double perChMaxTreeLL128Bw = k_.perChMaxTreeLL128Bws[cc][index2];
  const double perChMaxNvlsTreeBw = k_.perChMaxNvlsTreeBws[cc][index2];
  const double ppn = static_cast<double>(nRanks) / nNodes;
  const double netOverhead = amd ? 2.0 : 1.0;
  // LL128 (on by default from Hopper on): NVLink inside the node (or one GPU), and across nodes a
  // NIC within a PCIe switch of each GPU or reached through another GPU over NVLink (PXN).
  const bool ll128 = node.sm >= 70 && (node.gpus == 1 || node.nvlinks > 0) &&
                     (nNodes == 1 || node.nicNearGpu || node.nvlinks > 0);
  const bool patOk = node.sm >= 60 && nNodes == nRanks;

  for (CollKind coll : kCollectives) {
    if (coll == CollKind::kAllToAll) continue;
    const int ci = collIndex(coll);
    const bool ar = coll == CollKind::kAllReduce;
    const bool agrs = coll == CollKind::kAllGather || coll == CollKind::kReduceScatter;
    const int nsteps = ar ? 2 * (nRanks - 1) : agrs ? nRanks - 1 : nRanks;
    for (int a = 0; a < kNcclAlgos; ++a) {
      const NcclGraph& g = graphs_[a];
      if (g.channels == 0) continue;
      if ((coll == CollKind::kBroadcast || coll == CollKind::kReduce) && a != kRing) continue;
      if (agrs && a != kPat && a != kRing && a != kNvls && a != kCollNetDirect) continue;
      if (ar && a == kPat) continue;
      if (nNodes == 1 && a == kNvlsTree) continue;
      if (a == kNvls && nNodes > 1 && !c.fabric.sharp) continue;  // multi-node NVLS is CollNet
      if (a == kCollNetDirect && !node.nvswitch) continue;
      // What the fabric leaves of the graph's inter-node rate.
      double bwInter = g.bwInter;
      double latInter = 0;
      if (fabric && nNodes > 1) {
        TrafficPattern pat = patternOf(a);
        double nicShare = node.nicGBs * node.nics * fabricShare(c, pat) / g.channels;
        bwInter = std::min(bwInter, nicShare);
        latInter = fabricExtraHops(c, pat) * c.fabric.hopLatencyUs;
      }
      const bool collnet = a == kCollNetDirect || a == kCollNetChain;
      for (int p = 0; p < kNcclProtos; ++p) {
        if ((a == kNvls || a == kNvlsTree) && p != kSimple) continue;
        if (a == kPat && (p != kSimple || !patOk)) continue;
        if (collnet && p != kSimple) continue;
        if (p == kLL128 && !ll128) continue;
        double bw = nNodes <= 2 || collnet ? g.bwIntra : g.bwInter;
        // Two nodes: a tree sends half of what crosses a node's links over the network (NCCL
        // prices it with the intra-node rate, up to twice the inter-node one).
        if (fabric && nNodes > 1)
          bw = std::min(bw, bwInter * (nNodes <= 2 && (a == kTree || collnet) ? 2 : 1));
        if (a == kNvls || a == kNvlsTree) {
          if (g.channels < 2) continue;
          double intraBw =
              g.bwIntra * kNvlsEfficiency[cc] * (g.channels - 1) / static_cast<double>(g.channels);
          intraBw *= ar ? 2.0 : (ppn - 1) / ppn;
          double interBw = bwInter * ((nNodes <= 2 && a == kNvlsTree) ? 2 : 1);
          bw = std::min({intraBw, interBw,
                         a == kNvlsTree ? perChMaxNvlsTreeBw : std::numeric_limits<double>::max()});
        }
        double busBw = g.channels * bw;
        if (a == kRing && p == kLL) busBw = std::min(llMaxBw, busBw * .5);
        if (a == kRing && p == kLL128)
          busBw = std::min(busBw * 0.92, g.channels * perChMaxRingLL128Bw);
        if (a == kTree && ar) busBw = std::min(busBw * .92, g.channels * perChMaxTreeBw);
        if (a == kTree && p == kLL) busBw = std::min(busBw * 1.0 / 3.8, llMaxBw);
        if (a == kTree && p == kLL128)
          busBw = std::min(busBw * (nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0),
                           g.channels * perChMaxTreeLL128Bw);
        if (a == kPat) busBw *= .75;
        if (a == kCollNetDirect) {
          if (agrs) {
            busBw = ppn * std::min(g.bwIntra, bwInter * 0.9);
          } else {
            double factor = ppn / g.channels;  // GPUs per NIC
            factor -= (factor - 1) / 2;
            busBw /= factor;
            if (node.sm >= 90) busBw *= .85;
          }
        }
        // CollNet and NVLS gather and scatter across nodes only with one GPU per head.
        if ((a == kNvls || a == kCollNetDirect) && agrs && nNodes > 1 && ppn > g.channels) continue;
        if (!(a != kRing && agrs)) {
          double ratio = (a == kRing || a == kNvls || a == kNvlsTree)
                             ? static_cast<double>(nRanks) / nsteps
                             : .5;
          busBw *= ratio;
        }
        if (busBw <= 0) continue;
        t->bw[ci][a][p] = busBw;
        double lat = k_.baseLat[a][p];
        const int intraHw = g.nvlink ? kHwNvlink : kHwPci;
        const int hw = nNodes == 1 ? intraHw : kHwNet;
        double intraLat = k_.hwLat[intraHw][a][p];
        double interLat =
            (ppn == 1 ? k_.hwLat[kHwNet][kTree][p] : k_.hwLat[kHwNet][a][p]) + latInter;
        if (p == kSimple) interLat += latInter;  // the flush's round trip
        const int localRanks = nRanks / nNodes;
        if (a == kRing) {
          double hwLat = k_.hwLat[hw][a][p];
          if (coll == CollKind::kReduce || coll == CollKind::kBroadcast) {
            // Rings of different channels (NCCL's sameChannels 0 on NVSwitch systems).
            if (p == kSimple) hwLat = k_.hwLat[hw][kTree][p];
            lat += nsteps * (hwLat + (nNodes > 1 ? latInter : 0));
          } else {
            double overhead = nNodes > 1 ? netOverhead * (p == kSimple ? 3 : 1) : 0;
            double il = std::max(intraLat, overhead);
            int nInterSteps = nNodes == 1 ? 0 : ar ? 2 * (nNodes - 1) : nNodes - 1;
            lat += (nsteps - nInterSteps) * il + nInterSteps * interLat;
          }
        } else if (a == kTree) {
          if (ar) lat += 2 * ((localRanks - 1) * intraLat + log2i(nNodes) * interLat);
        } else if (a == kCollNetDirect) {
          lat += 2 * (std::min(1, localRanks - 1) * intraLat + (localRanks - 1) * 0.4) + interLat;
        } else if (a == kCollNetChain) {
          lat += 2 * (localRanks - 1) * intraLat + interLat;
        } else if (a == kNvls) {
          lat = intraLat + (nNodes > 1 ? interLat : 0);
        } else if (a == kNvlsTree) {
          lat += intraLat + 2 * log2i(nNodes) * interLat;
        } else if (a == kPat) {
          if (agrs) lat += log2i(nNodes) * (interLat / 3.5) + nRanks * 2.8;
        }
        t->lat[ci][a][p] = lat;
      }
    }
  }
}

// NCCL's ncclTopoGetAlgoTime for one operation.
double NcclModel::tableTime(const Table& t, CollKind coll, NcclAlgo algo, NcclProto proto,
                            size_t bytes) const {
  if (coll == CollKind::kAllToAll || coll == CollKind::kSendRecv) return -1;
  const int ci = collIndex(coll), a = static_cast<int>(algo), p = static_cast<int>(proto);
  double bw = t.bw[ci][a][p];
  double lat = t.lat[ci][a][p];
  if (bw <= 0) return -1;
  const bool ar = coll == CollKind::kAllReduce;
  int logSize = log2i(static_cast<double>(bytes >> 6));
  if ((bytes >> 6) == 0) logSize = -1;
  if (a == kTree && ar && logSize >= 0 && logSize < 23) bw *= kTreeCorrection[p][logSize];
  if (a == kNvlsTree && ar && logSize >= 0 && logSize < 24 && cluster_.node.sm >= 100 &&
      cluster_.node.cpu != NodeSpec::Cpu::kArm)
    bw *= kTreeCorrection[p][logSize];  // x86 Blackwell only
  const int commChannels = std::min(32, 2 * std::max(1, graphs_[kRing].channels));
  if (a == kRing && p == kSimple && cluster_.nodes > 1 && ar &&
      bytes / (static_cast<size_t>(commChannels) * cluster_.nranks()) >= 64)
    lat *= cluster_.node.sm < 80 ? 1.9 : 1.4;  // the ring's plateau
  return lat + static_cast<double>(bytes) / (1000.0 * bw);
}

NcclTime NcclModel::time(CollKind coll, NcclAlgo a, NcclProto p, size_t bytes) const {
  NcclTime t;
  t.ncclUs = tableTime(nccl_, coll, a, p, bytes);
  if (t.ncclUs >= 0) t.predictedUs = tableTime(fabric_, coll, a, p, bytes);
  return t;
}

bool NcclModel::choose(CollKind coll, size_t bytes, NcclChoice* out) const {
  bool found = false;
  for (int a = 0; a < kNcclAlgos; ++a) {
    for (int p = 0; p < kNcclProtos; ++p) {
      NcclTime t = time(coll, static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), bytes);
      if (t.ncclUs < 0) continue;
      if (!found || t.ncclUs < out->time.ncclUs) {
        out->algo = static_cast<NcclAlgo>(a);
        out->proto = static_cast<NcclProto>(p);
        out->time = t;
        found = true;
      }
    }
  }
  return found;
}

bool NcclModel::choosePredicted(CollKind coll, size_t bytes,
                                const std::function<bool(NcclAlgo, NcclProto)>& allowed,
                                NcclChoice* out) const {
  bool found = false;
  for (int a = 0; a < kNcclAlgos; ++a) {
    for (int p = 0; p < kNcclProtos; ++p) {
      const auto algo = static_cast<NcclAlgo>(a);
      const auto proto = static_cast<NcclProto>(p);
      if (allowed && !allowed(algo, proto)) continue;
      NcclTime t = time(coll, algo, proto, bytes);
      if (t.predictedUs < 0) continue;
      if (!found || t.predictedUs < out->time.predictedUs) {
        *out = NcclChoice{algo, proto, t};
        found = true;
      }
    }
  }
  return found;
}

bool NcclModel::bestProtocol(CollKind coll, NcclAlgo a, size_t bytes, NcclChoice* out) const {
  bool found = false;
  for (int p = 0; p < kNcclProtos; ++p) {
    NcclTime t = time(coll, a, static_cast<NcclProto>(p), bytes);
    if (t.predictedUs < 0) continue;
    if (!found || t.predictedUs < out->time.predictedUs) {
      out->algo = a;
      out->proto = static_cast<NcclProto>(p);
      out->time = t;
      found = true;
    }
  }
  return found;
}

}  // namespace loom
