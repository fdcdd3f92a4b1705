// Best paths between devices of a topology graph, with NCCL's path types, and the decisions NCCL
// makes from them: each GPU's nearest NIC, GPUDirect RDMA, GPU peer-to-peer.
//
// A path's type is its worst hop and its bandwidth its narrowest link. Hops: NVLink -> NVL (NVB
// when it passes through another GPU), C2C -> C2C, PCIe between a device and a switch -> PIX,
// between two switches -> PXB, touching a CPU -> PHB, CPU to CPU -> SYS, NIC to its port -> LOC
// (as in NCCL, the path to a port has the type of the path to its NIC). Paths never pass through
// a NIC, a port, or (except NVLink to NVLink) a GPU. Among paths, the best has the lowest type,
// then the highest bandwidth, then the fewest hops. Not yet modelled: PXN, P2C, NET (two hosts).
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/status.h"
#include "topology/graph.h"

namespace loom::topo {

enum class PathType : uint8_t {
  kLoc,
  kNvl,
  kNvb,
  kC2c,
  kPix,
  kPxb,
  kP2c,
  kPxn,
  kPhb,
  kSys,
  kNet,
  kDis
};
const char* pathTypeName(PathType type);

struct Path {
  PathType type = PathType::kDis;
  float bw = 0;  // GB/s
  int32_t hops = 0;
};

class Paths {
 public:
  // Paths from every device (CPU, GPU, NIC, port) to every node. Memory: devices x nodes.
  static Paths compute(const Graph& graph);

  // Path from `from` (a device) to any node; kDis when from is not a device.
  const Path& get(int from, int to) const;

  // The NIC (adapter node) closest to a GPU: best type, then bandwidth, then lowest index; -1
  // when the graph has no NIC. nearestNet does the same over ports.
  int nearestNic(int gpu) const;
  int nearestNet(int gpu) const;
  // GPUDirect RDMA between a GPU and a NIC port: both say gdr="1" and the path is PXB or better.
  bool gdrAllowed(int gpu, int net) const;
  // Peer-to-peer between two GPUs: path PXB or better (up to SYS on AMD CPUs with <= 2 GPUs).
  bool p2pAllowed(int gpuA, int gpuB) const;

 private:
  const Graph* graph_ = nullptr;
  std::vector<int> row_;  // node -> row in paths_, or -1
  std::vector<std::vector<Path>> paths_;
  int nearestOf(int gpu, NodeType type) const;
};

}  // namespace loom::topo
