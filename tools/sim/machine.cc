#include "tools/sim/machine.h"

#include <sys/stat.h>

#include <algorithm>

#include "src/core/text.h"
#include "topology/graph.h"
#include "topology/paths.h"
#include "topology/xml.h"

namespace loom {
namespace sim {

namespace {

// Physical rates NCCL's files do not carry: one NVLink link per direction (NVLink 2-4: 25 GB/s,
// NVLink 5: 50 GB/s) and a GPU's memory bandwidth by architecture (V100, A100, H100, B200 SXM).
double nvlinkLinkGBs(int sm) { return sm >= 100 ? 50 : sm >= 70 ? 25 : 20; }
double hbmGBs(int sm) { return sm >= 100 ? 8000 : sm >= 90 ? 3350 : sm >= 80 ? 2039 : 900; }

Result<NodeSpec> nodeFromGraph(const topo::Graph& g, const std::string& path) {
  NodeSpec n;
  n.name = path;
  n.source = "NCCL topology file " + path;
  std::vector<int> gpus, nets;
  for (int i = 0; i < g.size(); ++i) {
    if (g.node(i).type == topo::NodeType::kGpu) gpus.push_back(i);
    if (g.node(i).type == topo::NodeType::kNet) nets.push_back(i);
  }
  if (gpus.empty())
    return LOOM_ERROR(kInvalidArgument, "{}: the file describes no GPU to simulate", path);
  n.gpus = static_cast<int>(gpus.size());
  n.sm = g.node(gpus[0]).sm > 0 ? g.node(gpus[0]).sm : 90;
  // NVLink: the links of the first GPU (its bandwidth in NCCL's per-link units) and whether any
  // reaches an NVSwitch.
  double nvlBw = 0;
  for (int li : g.linksFrom(gpus[0])) {
    const topo::Link& l = g.links()[static_cast<size_t>(li)];
    if (l.type != topo::LinkType::kNvl) continue;
    nvlBw += l.bw;
    if (g.node(l.to).type == topo::NodeType::kNvSwitch) n.nvswitch = true;
  }
  n.nvlinks = static_cast<int>(nvlBw / topo::nvlinkBandwidth(n.sm) + 0.5);
  n.nvlinkGBs = n.nvlinks > 0 ? nvlinkLinkGBs(n.sm) : 0;
  n.nvls = n.nvswitch && n.sm >= 90;
  // NCCL rates PCIe at 3/4 of its signalling rate (Gen5 x16: 48 GB/s of 64).
  double pci = g.node(gpus[0]).pciBw;
  n.pciGBs = (pci > 0 ? pci : 24) / 0.75;
  n.nics = static_cast<int>(nets.size());
  for (int i : nets) n.nicGBs = std::max(n.nicGBs, g.node(i).speedGBs);
  if (!nets.empty()) {
    topo::Paths paths = topo::Paths::compute(g);
    for (int gpu : gpus) {
      int net = paths.nearestNet(gpu);
      if (net < 0 || paths.get(gpu, net).type > topo::PathType::kPxb) n.nicNearGpu = false;
    }
  }
  for (int i = 0; i < g.size(); ++i) {
    const topo::Node& c = g.node(i);
    if (c.type != topo::NodeType::kCpu) continue;
    if (asciiLower(c.vendor).find("amd") != std::string::npos) n.cpu = NodeSpec::Cpu::kAmd;
    if (asciiLower(c.arch) == "arm64" || asciiLower(c.arch) == "aarch64")
      n.cpu = NodeSpec::Cpu::kArm;
  }
  n.hbmGBs = hbmGBs(n.sm);
  n.description = std::to_string(n.gpus) + " GPUs (sm " + std::to_string(n.sm) + "), " +
                  (n.nvlinks ? std::to_string(n.nvlinks) + " NVLink links per GPU" +
                                   (n.nvswitch ? " to NVSwitches" : "")
                             : std::string("no NVLink")) +
                  ", " + std::to_string(n.nics) + " network ports";
  return n;
}

}  // namespace

Result<NodeSpec> loadNode(const std::string& spec) {
  Result<NodeSpec> builtin = builtinNode(spec);
  if (builtin.isOk()) return builtin;
  struct stat st;
  if (::stat(spec.c_str(), &st) != 0)
    return LOOM_ERROR(kInvalidArgument, "--topo {}: neither a built-in machine nor a file ({})",
                      spec, builtin.status().message());
  LOOM_ASSIGN(topo::Graph g, topo::importXmlFile(spec));
  return nodeFromGraph(g, spec);
}

}  // namespace sim
}  // namespace loom
