#include "algorithms/cluster.h"

#include <algorithm>
#include <cmath>

#include "src/core/text.h"

namespace loom {

namespace {

// Ports one node puts on each rail: its NICs spread over the rails (one each when there are as
// many rails as NICs, the rail-optimized layout).
int portsPerRail(const ClusterSpec& c) {
  const int rails = c.fabric.rails > 0 ? c.fabric.rails : std::max(1, c.node.nics);
  return std::max(1, (c.node.nics + rails - 1) / rails);
}

// The nodes below one switch of tier t (1: leaf) of a rail: a switch of a tier that has another
// tier above it gives half its ports to the uplinks, and each node takes portsPerRail of them.
double nodesBelow(const ClusterSpec& c, int tier) {
  const FabricSpec& f = c.fabric;
  double half = f.radix / 2.0;
  double ports = f.tiers == 1 ? f.radix : std::pow(half, tier) * (tier == f.tiers ? 2 : 1);
  return std::max(1.0, std::floor(ports / portsPerRail(c)));
}

// The tiers above the leaf a cluster of n nodes uses, and the group (nodes below one switch) of
// each: {L, P} for three tiers, {L} for two, {} within one switch.
std::vector<double> crossedGroups(const ClusterSpec& c) {
  std::vector<double> groups;
  for (int t = 1; t < c.fabric.tiers; ++t) {
    double below = nodesBelow(c, t);
    if (c.nodes > below) groups.push_back(below);
  }
  return groups;
}

// The share of the uplinks of a switch whose group holds g nodes, when `crossing` of every node's
// flows leave the group: uplink capacity g / oversub (in NIC rates) over crossing * g flows.
double uplinkShare(double crossing, double oversub) {
  if (crossing <= 0) return 1.0;
  return std::min(1.0, 1.0 / (crossing * oversub));
}

}  // namespace

double nvlinkRatedGBs(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86) return 12.0;
  if (sm >= 70) return 20.0;
  return 18.0;
}

double NodeSpec::gpuIntraRatedGBs() const {
  return nvlinks > 0 ? nvlinks * nvlinkRatedGBs(sm) : pciGBs * 0.75;
}

int ClusterSpec::nodesPerLeaf() const { return static_cast<int>(nodesBelow(*this, 1)); }

Status ClusterSpec::validate() const {
  const NodeSpec& n = node;
  if (nodes < 1) return LOOM_ERROR(kInvalidArgument, "nodes must be at least 1 (got {})", nodes);
  if (n.gpus < 1)
    return LOOM_ERROR(kInvalidArgument, "{}: gpus per node must be at least 1", n.name);
  if (n.nvlinks < 0 || (n.nvlinks > 0 && n.nvlinkGBs <= 0))
    return LOOM_ERROR(kInvalidArgument, "{}: NVLink links ({}) need a positive rate ({} GB/s)",
                      n.name, n.nvlinks, n.nvlinkGBs);
  if (n.pciGBs <= 0)
    return LOOM_ERROR(kInvalidArgument, "{}: the PCIe rate must be positive ({} GB/s)", n.name,
                      n.pciGBs);
  if (n.hostMemory && (n.memcpyGBs <= 0 || n.reduceGBs <= 0 || n.cores < 0))
    return LOOM_ERROR(kInvalidArgument,
                      "{}: CPU hosts need positive copy and reduction rates ({} and {} GB/s) and "
                      "a core count of 0 or more ({})",
                      n.name, n.memcpyGBs, n.reduceGBs, n.cores);
  if (!n.hostMemory && n.hbmGBs <= 0)
    return LOOM_ERROR(kInvalidArgument, "{}: the GPU memory bandwidth must be positive ({} GB/s)",
                      n.name, n.hbmGBs);
  if (nodes > 1 && (n.nics < 1 || n.nicGBs <= 0))
    return LOOM_ERROR(kInvalidArgument,
                      "{}: {} nodes need a network: NIC count {} and rate {} GB/s must be positive",
                      n.name, nodes, n.nics, n.nicGBs);
  const FabricSpec& f = fabric;
  if (f.tiers < 1 || f.tiers > 3)
    return LOOM_ERROR(kInvalidArgument, "the fabric has 1, 2 or 3 tiers (got {})", f.tiers);
  if (f.radix < 2 || f.radix % 2)
    return LOOM_ERROR(kInvalidArgument, "the switch radix must be even and at least 2 (got {})",
                      f.radix);
  if (!(f.oversub >= 1.0))
    return LOOM_ERROR(kInvalidArgument, "oversubscription must be at least 1 (got {})", f.oversub);
  if (f.hopLatencyUs < 0)
    return LOOM_ERROR(kInvalidArgument, "the hop latency must not be negative (got {} us)",
                      f.hopLatencyUs);
  if (f.rails < 0 || (nodes > 1 && f.rails > std::max(1, n.nics)))
    return LOOM_ERROR(kInvalidArgument, "rails must be between 1 and the {} NICs per node (got {})",
                      n.nics, f.rails);
  double most = nodesBelow(*this, f.tiers);
  if (nodes > most)
    return LOOM_ERROR(kInvalidArgument,
                      "{} nodes do not fit a {}-tier fabric of radix-{} switches (at most {:.0f} "
                      "per rail): add a tier or use larger switches",
                      nodes, f.tiers, f.radix, most);
  return Status::ok();
}

double fabricShare(const ClusterSpec& c, TrafficPattern p) {
  double share = 1.0;
  const double n = c.nodes;
  for (double g : crossedGroups(c)) {
    double crossing = 0;  // the fraction of a group's node flows that leave it
    switch (p) {
      case TrafficPattern::kNeighbor:
        crossing = 1.0 / g;  // one ring edge leaves each group (per direction)
        break;
      case TrafficPattern::kTree:
        crossing = 2.0 / g;  // the group's subtree: its root's parent and one more edge
        break;
      case TrafficPattern::kButterfly: {
        // Steps whose partner distance is at least the group cross it with every flow; the
        // others stay inside. Time-weighted over the steps (equal bytes per step).
        double steps = std::max(1.0, std::log2(n));
        double across = std::max(0.0, std::log2(n / g));
        double slow = std::max(1.0, c.fabric.oversub);
        share *= steps / ((steps - across) + across * slow);
        continue;
      }
      case TrafficPattern::kAllToAll:
        crossing = (n - g) / n;
        break;
      case TrafficPattern::kInNetwork:
        crossing = 0;  // reduced on the way up: the uplinks carry no more than one NIC's flow
        break;
    }
    share *= uplinkShare(crossing, c.fabric.oversub);
  }
  return share;
}

double fabricExtraHops(const ClusterSpec& c, TrafficPattern p) {
  double hops = 0;
  const double n = c.nodes;
  for (double g : crossedGroups(c)) {
    switch (p) {
      case TrafficPattern::kNeighbor:
      case TrafficPattern::kAllToAll:
      case TrafficPattern::kInNetwork:
        hops += 2;  // some message of every step goes up one more tier and down again
        break;
      case TrafficPattern::kTree:
      case TrafficPattern::kButterfly: {
        double levels = std::max(1.0, std::log2(n));
        hops += 2 * std::max(0.0, std::log2(n / g)) / levels;  // only the upper levels cross
        break;
      }
    }
  }
  return hops;
}

TrafficPattern loomPattern(CollKind coll, const std::string& a) {
  if (a == "ring" || a == "chain") return TrafficPattern::kNeighbor;
  if (a == "tree" || a == "binomial") return TrafficPattern::kTree;
  if (a == "rd" || a == "rhd" || a == "bruck") return TrafficPattern::kButterfly;
  if (a == "hier") {
    // AllReduce: rings of each local index; Broadcast and Reduce: a chain of leaders;
    // AllGather and ReduceScatter: every host with every other on each rail.
    if (coll == CollKind::kAllGather || coll == CollKind::kReduceScatter)
      return TrafficPattern::kAllToAll;
    return TrafficPattern::kNeighbor;
  }
  return TrafficPattern::kAllToAll;  // direct, pairwise
}

CostMachine clusterCostMachine(const ClusterSpec& c, TrafficPattern p) {
  const NodeSpec& n = c.node;
  const double hops = c.nodes > 1 ? fabricExtraHops(c, p) * c.fabric.hopLatencyUs : 0;
  if (n.hostMemory) {
    HostCluster hc;
    for (int r = 0; r < c.nranks(); ++r) hc.hostOf.push_back(r / n.gpus);
    hc.coresPerHost.assign(static_cast<size_t>(c.nodes), static_cast<uint32_t>(n.cores));
    hc.memcpyBytesPerSec = n.memcpyGBs * 1e9;
    hc.reduceBytesPerSec = n.reduceGBs * 1e9;
    hc.netBytesPerSec = n.nics * n.nicGBs * 1e9 * (c.nodes > 1 ? fabricShare(c, p) : 1);
    hc.netAlphaSec = (c.loom.interUs + hops) * 1e-6;
    hc.shmAlphaSec = c.loom.intraUs * 1e-6;
    return hostCostMachine(hc);
  }
  CostMachine m = CostMachine::uniform(c.nranks(), n.gpus);
  const double link = n.gpuIntraRatedGBs() * 1e9;
  m.intra = LinkCost{c.loom.intraUs * 1e-6, link};
  // A GPU sends and receives at its links' rate at once: its transfers count on both ends.
  m.memBytesPerSec = std::min(n.hbmGBs * 1e9, 2 * link);
  m.reduceBytesPerSec = n.hbmGBs * 1e9 / 3;
  m.copyBytesPerSec = n.hbmGBs * 1e9 / 2;
  m.fuseIntraRecvReduce = true;
  if (c.nodes > 1) {
    m.inter = LinkCost{(c.loom.interUs + hops) * 1e-6, n.nicGBs * 1e9};
    m.nicBytesPerSec = n.nics * n.nicGBs * 1e9 * fabricShare(c, p);
  }
  return m;
}

namespace {

// One built-in machine's figures, in NodeSpec's order.
struct Builtin {
  const char* name;
  const char* description;
  const char* source;
  int gpus, sm, nvlinks;
  double nvlinkGBs;
  bool nvswitch, nvls;
  double pciGBs;
  int nics;
  double nicGBs;
  NodeSpec::Cpu cpu;
  double hbmGBs;
};

// clang-format off
constexpr Builtin kBuiltins[] = {
    {"dgx-h100",
     "DGX H100 class: 8x H100 SXM (NVLink 4, 18 links) on 4 NVSwitches with NVLink SHARP, 8x 400 "
     "Gb/s ConnectX-7, PCIe Gen5, Intel Xeon",
     "NVIDIA DGX H100 datasheet and DGX H100/H200 user guide (900 GB/s NVLink per GPU, 8 "
     "single-port ConnectX-7 at 400 Gb/s for the compute fabric); H100 SXM datasheet (3.35 TB/s "
     "HBM3)",
     8, 90, 18, 25, true, true, 64, 8, 50, NodeSpec::Cpu::kIntel, 3350},
    {"dgx-h200", "DGX H200 class: the DGX H100 node with H200 GPUs (141 GB HBM3e)",
     "NVIDIA H200 datasheet (4.8 TB/s HBM3e, NVLink 900 GB/s); DGX H100/H200 user guide",
     8, 90, 18, 25, true, true, 64, 8, 50, NodeSpec::Cpu::kIntel, 4800},
    {"dgx-b200",
     "DGX B200 class: 8x B200 (NVLink 5, 18 links) on 2 NVSwitch chips with NVLink SHARP, 8x 400 "
     "Gb/s ConnectX-7, PCIe Gen5, Intel Xeon",
     "NVIDIA DGX B200 datasheet (1.8 TB/s NVLink per GPU, 8 ConnectX-7 at 400 Gb/s, 8 TB/s HBM3e "
     "per GPU)",
     8, 100, 18, 50, true, true, 64, 8, 50, NodeSpec::Cpu::kIntel, 8000},
    {"gb200-nvl72",
     "GB200 NVL72 class: one NVLink domain of 72 Blackwell GPUs (18 trays of 4) on NVLink switch "
     "trays with NVLink SHARP, one 400 Gb/s ConnectX-7 per GPU, Grace CPUs",
     "NVIDIA GB200 NVL72 product page and datasheet (72 GPUs in one NVLink domain, 1.8 TB/s "
     "NVLink per GPU, 8 TB/s HBM3e); one ConnectX-7 per GPU as in the reference compute tray",
     72, 100, 18, 50, true, true, 64, 72, 50, NodeSpec::Cpu::kArm, 8000},
    {"pcie-h100",
     "PCIe server without NVLink: 8x H100 PCIe, two GPUs and one 400 Gb/s NIC under each of 4 "
     "PCIe Gen5 switches, Intel Xeon",
     "NVIDIA H100 PCIe product brief (PCIe Gen5 x16, 2 TB/s HBM2e); the switch layout is the "
     "common 8-GPU PCIe server shape (an assumption, not one product)",
     8, 90, 0, 0, false, false, 64, 4, 50, NodeSpec::Cpu::kIntel, 2000},
};
// clang-format on

}  // namespace

const std::vector<NodeSpec>& builtinNodes() {
  static const std::vector<NodeSpec> kNodes = [] {
    std::vector<NodeSpec> v;
    for (const Builtin& b : kBuiltins) {
      NodeSpec n;
      n.name = b.name;
      n.description = b.description;
      n.source = b.source;
      n.gpus = b.gpus;
      n.sm = b.sm;
      n.nvlinks = b.nvlinks;
      n.nvlinkGBs = b.nvlinkGBs;
      n.nvswitch = b.nvswitch;
      n.nvls = b.nvls;
      n.pciGBs = b.pciGBs;
      n.nics = b.nics;
      n.nicGBs = b.nicGBs;
      n.cpu = b.cpu;
      n.hbmGBs = b.hbmGBs;
      v.push_back(n);
    }
    // CPU hosts: Loom on host memory, the runtime's model; rates given on the command line.
    NodeSpec host;
    host.name = "cpu-host";
    host.description =
        "CPU hosts: Loom on host memory (ranks per host = --gpus), shared memory inside a host, "
        "one network port per host; the runtime's own cost model";
    host.source =
        "the runtime's planner (hostCostMachine); give the rates it measured "
        "(LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=PLAN prints them): --memcpy-gbps, "
        "--reduce-gbps, --cores, --nic-gbps";
    host.hostMemory = true;
    host.gpus = 2;
    host.sm = 0;
    host.pciGBs = 16;
    host.nics = 1;
    host.nicGBs = 10.0 / 8;
    host.memcpyGBs = 5;
    host.reduceGBs = 4;
    host.hbmGBs = 5;
    v.push_back(host);
    return v;
  }();
  return kNodes;
}

Result<NodeSpec> builtinNode(const std::string& name) {
  std::string want = asciiLower(name);
  std::string names;
  for (const NodeSpec& n : builtinNodes()) {
    if (n.name == want) return n;
    names += (names.empty() ? "" : ", ") + n.name;
  }
  return LOOM_ERROR(kInvalidArgument, "no built-in machine named '{}' (known: {})", name, names);
}

}  // namespace loom
