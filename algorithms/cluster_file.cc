#include "algorithms/cluster_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <vector>

#include "src/core/text.h"
#include "topology/graph.h"
#include "topology/paths.h"
#include "topology/xml.h"

namespace loom {

namespace {

// Physical rates NCCL's files do not carry: one NVLink link per direction (NVLink 2-4: 25 GB/s,
// NVLink 5: 50 GB/s) and a GPU's memory bandwidth by architecture (V100, A100, H100, B200 SXM).
double nvlinkLinkGBs(int sm) { return sm >= 100 ? 50 : sm >= 70 ? 25 : 20; }
double hbmGBs(int sm) { return sm >= 100 ? 8000 : sm >= 90 ? 3350 : sm >= 80 ? 2039 : 900; }

// The GPUs of NCCL's first node: the NVLink domain of the first GPU when it spans hosts, else the
// first GPU's host; and how many such nodes the file holds.
std::vector<int> firstNode(const topo::Graph& g, const topo::Paths& paths,
                           const std::vector<int>& gpus, int* nodesInFile) {
  std::vector<int> domain{gpus[0]};
  std::set<int> hosts{g.node(gpus[0]).host};
  for (size_t i = 1; i < gpus.size(); ++i) {
    topo::PathType t = paths.get(gpus[0], gpus[i]).type;
    if (t == topo::PathType::kNvl || t == topo::PathType::kNvb) {
      domain.push_back(gpus[i]);
      hosts.insert(g.node(gpus[i]).host);
    }
  }
  if (hosts.size() > 1) {
    *nodesInFile = static_cast<int>(gpus.size() / domain.size());
    return domain;
  }
  std::vector<int> mine;
  for (int gpu : gpus)
    if (g.node(gpu).host == g.node(gpus[0]).host) mine.push_back(gpu);
  *nodesInFile = g.hostCount();
  return mine;
}

}  // namespace

Result<Machine> machineFromGraph(const topo::Graph& g, const std::string& path) {
  Machine m;
  NodeSpec& n = m.node;
  n.name = path;
  n.source = "NCCL topology file " + path;
  std::vector<int> all;
  for (int i = 0; i < g.size(); ++i)
    if (g.node(i).type == topo::NodeType::kGpu) all.push_back(i);
  if (all.empty())
    return LOOM_ERROR(kInvalidArgument, "{}: the file describes no GPU to simulate", path);
  topo::Paths paths = topo::Paths::compute(g);
  std::vector<int> gpus = firstNode(g, paths, all, &m.nodesInFile);
  std::set<int> hosts;
  for (int gpu : gpus) hosts.insert(g.node(gpu).host);
  std::vector<int> nets;
  for (int i = 0; i < g.size(); ++i)
    if (g.node(i).type == topo::NodeType::kNet && hosts.count(g.node(i).host)) nets.push_back(i);
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
  for (int gpu : gpus) {
    int net = paths.nearestNet(gpu);
    if (net < 0 || paths.get(gpu, net).type > topo::PathType::kPxb) n.nicNearGpu = false;
  }
  for (int i = 0; i < g.size(); ++i) {
    const topo::Node& c = g.node(i);
    if (c.type != topo::NodeType::kCpu || !hosts.count(c.host)) continue;
    if (asciiLower(c.vendor).find("amd") != std::string::npos) n.cpu = NodeSpec::Cpu::kAmd;
    if (asciiLower(c.arch) == "arm64" || asciiLower(c.arch) == "aarch64")
      n.cpu = NodeSpec::Cpu::kArm;
  }
  n.hbmGBs = hbmGBs(n.sm);
  n.description =
      std::to_string(n.gpus) + " GPUs (sm " + std::to_string(n.sm) + ")" +
      (hosts.size() > 1 ? " of one NVLink domain on " + std::to_string(hosts.size()) + " hosts"
                        : "") +
      ", " +
      (n.nvlinks ? std::to_string(n.nvlinks) + " NVLink links per GPU" +
                       (n.nvswitch ? " to NVSwitches" : "")
                 : std::string("no NVLink")) +
      ", " + std::to_string(n.nics) + " network ports";
  return m;
}

Result<Machine> loadMachine(const std::string& spec) {
  Result<NodeSpec> builtin = builtinNode(spec);
  if (builtin.isOk()) return Machine{builtin.value(), 1};
  struct stat st;
  if (::stat(spec.c_str(), &st) != 0)
    return LOOM_ERROR(kInvalidArgument, "--topo {}: neither a built-in machine nor a file ({})",
                      spec, builtin.status().message());
  LOOM_ASSIGN(topo::Graph g, topo::importXmlFile(spec));
  return machineFromGraph(g, spec);
}

}  // namespace loom
