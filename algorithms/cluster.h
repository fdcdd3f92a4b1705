// A modelled GPU cluster, for what-if questions at sizes nobody can book (loom-sim) and for the
// planner's view of NCCL's algorithms: one kind of node (its GPUs, NVLink, PCIe, NICs) repeated
// `nodes` times on a fabric (rails, a one- to three-tier fat tree with its oversubscription, a
// per-hop latency, in-network reduction).
//
// A node is what NCCL calls a node: the GPUs that reach each other without the network. On
// multi-node NVLink systems (GB200 NVL72) that is the whole NVLink domain, not one tray.
//
// Rates are GB/s (1e9 bytes per second) in one direction; latencies microseconds.
// Pure values; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "algorithms/cost_model.h"
#include "src/core/collective.h"
#include "src/core/status.h"

namespace loom {

struct NodeSpec {
  std::string name;         // the built-in's name, or the file it was read from
  std::string description;  // one line: what it is
  std::string source;       // where its figures come from (built-ins)
  int gpus = 8;
  int sm = 90;             // compute capability x 10 (90 Hopper, 100 Blackwell)
  int nvlinks = 0;         // NVLink links per GPU (0: none; GPUs talk over PCIe)
  double nvlinkGBs = 0;    // one link's rate, physical
  bool nvswitch = false;   // GPUs reach every other GPU through NVSwitches at all links' rate
  bool nvls = false;       // the NVSwitches reduce and multicast (NVLink SHARP)
  double pciGBs = 0;       // a GPU's (and a NIC's) PCIe link
  int nics = 0;            // network ports per node
  double nicGBs = 0;       // one port's rate
  bool nicNearGpu = true;  // every GPU has a NIC under its PCIe switch (NCCL's PXB or closer)
  enum class Cpu { kIntel, kAmd, kArm };
  Cpu cpu = Cpu::kIntel;  // NCCL's latency and LL tables depend on the CPU
  double hbmGBs = 0;      // a GPU's memory bandwidth (reductions and copies)
  // CPU hosts (Loom on host memory, no GPUs: "gpus" counts ranks): the runtime's own machine
  // (hostCostMachine) with these measured rates; NCCL does not run there.
  bool hostMemory = false;
  int cores = 0;         // CPUs a host's ranks share (0: as many as ranks)
  double memcpyGBs = 0;  // one core's copy rate
  double reduceGBs = 0;  // one core's reduction rate

  // What data moves at between a node's GPUs once protocols take their share: NCCL's rating of
  // the links (NVLink per link by architecture, 20.6 GB/s of NVLink 4's 25; PCIe at 3/4 of its
  // signalling rate), which its search plans with and which NCCL's busbw reaches (370 GB/s on
  // DGX H100). Loom's device copies are priced at the same rate until measured on a GPU.
  double gpuIntraRatedGBs() const;
};

struct FabricSpec {
  // Independent networks (0: one per NIC, rail-optimized). Fewer rails than NICs put several of a
  // node's ports on one rail's switches: fewer nodes per leaf, more traffic over the uplinks.
  int rails = 0;
  int tiers = 2;              // 1: one switch per rail; 2: leaf and spine; 3: leaf, spine, core
  double oversub = 1.0;       // downlinks / uplinks at each tier above the leaf (>= 1)
  int radix = 64;             // switch ports
  double hopLatencyUs = 0.5;  // one switch hop (and its cable), beyond the first switch
  bool sharp = false;         // the switches reduce (IB SHARP): NCCL's CollNet
};

// What one of Loom's messages costs beyond its bytes. Loom's device path has not been timed on a
// GPU yet: the defaults are NCCL's Simple-protocol step latencies (NVLink ring, network ring),
// which Loom's executor, posting whole pieces, resembles. On CPU hosts they are the runtime's
// LOOM_MODEL_SHM_LAT_US and LOOM_MODEL_NET_LAT_US defaults (hostMessageCosts).
struct LoomMessageCosts {
  double intraUs = 3.4;
  double interUs = 14.0;
};
inline LoomMessageCosts hostMessageCosts() { return LoomMessageCosts{2, 30}; }

struct ClusterSpec {
  NodeSpec node;
  FabricSpec fabric;
  LoomMessageCosts loom;
  int nodes = 1;

  int nranks() const { return node.gpus * nodes; }
  // Nodes one leaf switch of a rail connects (radix / 2 below it, half its ports going up).
  int nodesPerLeaf() const;
  // Checks the figures (positive counts, rates, a fabric that holds `nodes`): kInvalidArgument
  // naming the field otherwise.
  Status validate() const;
};

// How a collective's node-to-node traffic is spread over the fabric, for its bandwidth share and
// its hop count.
enum class TrafficPattern {
  kNeighbor,   // node i with i +- 1 (rings, chains)
  kTree,       // a binary tree over the nodes (each node with its parent and children)
  kButterfly,  // partners at distance 2^k (recursive doubling, halving, Bruck, PAT)
  kAllToAll,   // every node with every other
  kInNetwork,  // reduced in the switches (SHARP): one round trip up the tree and back
};

// The fraction of a NIC's rate a node's flows of that pattern get once the fabric's uplinks are
// shared (1 on a non-blocking fabric or inside one leaf), and the switch hops of a typical path
// beyond the first switch (the latency the NCCL tables do not hold).
double fabricShare(const ClusterSpec& c, TrafficPattern p);
double fabricExtraHops(const ClusterSpec& c, TrafficPattern p);

// NCCL's rate of one NVLink link of a GPU of this architecture (src/graph/topo.h), GB/s.
double nvlinkRatedGBs(int sm);

// The traffic pattern of one of Loom's algorithms between hosts.
TrafficPattern loomPattern(CollKind coll, const std::string& algorithm);

// The machine Loom's cost model prices an algorithm of that pattern on: one rank per GPU, nodes as
// hosts; NVLink (or PCIe) between GPUs of a node, a GPU's memory for its copies and reductions
// (kernels: reductions read two operands and write one), the node's NICs shared by its GPUs'
// flows as the fabric shares them, the hops beyond the first switch added to each message.
CostMachine clusterCostMachine(const ClusterSpec& c, TrafficPattern p);

// The built-in machines (DGX H100 and H200 class, DGX B200 class, GB200 NVL72 class, a PCIe server
// without NVLink), each with its source.
const std::vector<NodeSpec>& builtinNodes();
// kInvalidArgument naming the built-ins when name is not one of them (case-insensitive).
Result<NodeSpec> builtinNode(const std::string& name);

}  // namespace loom
