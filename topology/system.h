// The global picture every rank holds after communicator init: which ranks share a host, each
// rank's local index, the devices each rank sees, and the network rails.
//
// Use (at communicator init, on every rank):
//   RankTopo me = localRankTopo(graph, hostId);   // graph: loadLocalTopology()
//   me.cudaDev = <the rank's CUDA device, or -1>;
//   std::string blob = me.serialize();            // exchange with an all-gather of blobs
//   std::vector<RankTopo> all;  for each blob: LOOM_ASSIGN(RankTopo r, RankTopo::deserialize(blob))
//   LOOM_ASSIGN(SystemTopo sys, SystemTopo::build(std::move(all)));
// Every rank then holds the same SystemTopo (build is deterministic in the order of `all`).
//
// Rails: port i of every host (ports in the order of the host's topology graph, which is PCI
// order for a discovered machine) forms rail i. On machines built alike this pairs the NICs that
// sit at the same place in each host, which is what rail-optimised fabrics wire together.
// SystemTopo::railsUniform says whether every host has the same number of ports at the same
// speeds; when false, rails are still defined (hosts with fewer ports are absent from the higher
// rails) but should not be relied on for rail-aligned algorithms.
//
// Thread safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/status.h"
#include "topology/graph.h"
#include "topology/paths.h"

namespace loom::topo {

struct RankTopo {
  struct Gpu {
    std::string busId;
    int dev = -1;  // NVML index
    int sm = 0;
    int numa = -1;
    int nearestPort = -1;  // index into ports, or -1
  };
  struct Port {  // one network port (<net>)
    std::string name;
    std::string busId;  // of the NIC; empty for a NIC without a PCI device
    int dev = -1;
    int port = -1;
    int numa = -1;
    double speedGBs = 0;
    uint64_t guid = 0;
    bool gdr = false;
  };

  std::string hostId;
  int numaNode = -1;  // NUMA node the process ran on when localRankTopo() was called; -1 unknown
  int cudaDev = -1;   // the GPU this rank uses (set by the caller); -1: none
  std::vector<Gpu> gpus;
  std::vector<Port> ports;
  // Best path between every ordered pair of the host's GPUs (row-major, gpus.size()^2 entries):
  // type and bottleneck bandwidth (GB/s), as Paths computes them on the host's graph.
  std::vector<PathType> gpuPathType;
  std::vector<float> gpuPathBw;

  // Compact binary form for the init exchange. deserialize() never trusts its input: any
  // truncated, oversized or otherwise malformed blob gives kInvalidArgument.
  std::string serialize() const;
  static Result<RankTopo> deserialize(std::string_view blob);
};

// This rank's view of its host, from the host's topology graph.
RankTopo localRankTopo(const Graph& graph, const std::string& hostId);

struct SystemTopo {
  struct Host {
    std::string id;
    std::vector<int> ranks;  // global ranks on this host, ascending
  };

  std::vector<RankTopo> ranks;  // as given to build(), index = global rank
  std::vector<Host> hosts;      // in order of each host's first rank
  std::vector<int> hostOf;      // rank -> index into hosts
  std::vector<int> localRank;   // rank -> index among its host's ranks
  // rails[r][h]: index (into ranks[hosts[h].ranks[0]].ports) of rail r's port on host h, or -1.
  std::vector<std::vector<int>> rails;
  bool railsUniform = true;
  // Inconsistencies that do not stop init (ranks of one host seeing different devices, two ranks
  // of one host using one GPU); the caller logs them.
  std::vector<std::string> warnings;

  int nRanks() const { return static_cast<int>(ranks.size()); }
  int localSize(int rank) const { return static_cast<int>(hosts[hostOf[rank]].ranks.size()); }
  bool sameHost(int a, int b) const { return hostOf[a] == hostOf[b]; }
  // The devices of a rank's host as seen by the host's first rank (the host's agreed view).
  const RankTopo& hostView(int rank) const { return ranks[hosts[hostOf[rank]].ranks[0]]; }

  // The path between the devices two ranks use, with NCCL's path types:
  //  - the same rank: LOC;
  //  - ranks on different hosts: NET, with the bandwidth of the narrower of the two ranks'
  //    network ports (a rank using a GPU: that GPU's nearest port; otherwise its host's fastest
  //    port; 0 when a host has no port) and 2 hops (rank to network, network to rank);
  //  - two ranks of one host using GPUs: the host's GPU-to-GPU path (NVL, PIX, ..., SYS);
  //  - other ranks of one host (host memory): LOC on the same NUMA node (or when either node is
  //    unknown), SYS across NUMA nodes; bandwidth 0 (not modelled: the planner measures it).
  Path rankPath(int a, int b) const;
  // GB/s of the network port a rank uses (its GPU's nearest port, else its host's fastest; 0
  // when its host has none): what a NET rankPath takes the narrower of.
  double netBandwidth(int rank) const;

  // Fails (kInvalidArgument) on an empty list only.
  static Result<SystemTopo> build(std::vector<RankTopo> ranks);
};

}  // namespace loom::topo
