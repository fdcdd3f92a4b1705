// loom-sim's machines: a built-in name, or an NCCL topology file read into the node it describes.
#pragma once

#include <string>

#include "algorithms/cluster.h"
#include "src/core/status.h"

namespace loom {
namespace sim {

// `spec` is a built-in's name (builtinNodes) or the path of an NCCL topology XML file. From a
// file: the GPUs (count, architecture), each GPU's NVLink links and whether they reach NVSwitches,
// the GPUs' PCIe links, the network ports (count, speed) and whether every GPU has one within its
// PCIe switches, the CPU vendor; the GPUs' memory bandwidth from their architecture (a file does
// not hold it). Errors: an unknown name that is not a readable file, a file without GPUs.
Result<NodeSpec> loadNode(const std::string& spec);

}  // namespace sim
}  // namespace loom
