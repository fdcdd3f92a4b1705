// A machine for the model (loom-sim, the NCCL tuner plugin): a built-in name, or an NCCL topology
// file (or a discovered topology graph) read into the node it describes.
#pragma once

#include <string>

#include "algorithms/cluster.h"
#include "src/core/status.h"

namespace loom {
namespace topo {
class Graph;
}

struct Machine {
  NodeSpec node;
  int nodesInFile = 1;  // NCCL nodes a file of several hosts describes (1 for a built-in)
};

// `spec` is a built-in's name (builtinNodes) or the path of an NCCL topology XML file. From a
// file: the GPUs (count, architecture), each GPU's NVLink links and whether they reach NVSwitches,
// the GPUs' PCIe links, the network ports (count, speed) and whether every GPU has one within its
// PCIe switches, the CPU vendor; the GPUs' memory bandwidth from their architecture (a file does
// not hold it). A file of several hosts (host_hash): the node is NCCL's, its first NVLink domain
// when that spans hosts (GB200 NVL72: the trays of one rack), else its first host; nodesInFile
// counts them. Errors: an unknown name that is not a readable file, a file without GPUs.
Result<Machine> loadMachine(const std::string& spec);
// The same from a topology graph already in hand (a file's, or this machine's discovered one);
// `name` names it in messages.
Result<Machine> machineFromGraph(const topo::Graph& g, const std::string& name);

}  // namespace loom
