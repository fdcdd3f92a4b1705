#include "topology/graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "src/core/log.h"
#include "src/core/text.h"

namespace loom::topo {

namespace {
// NCCL's bandwidth of a link inside a device (a NIC under a cpu, a pcilink): effectively unlimited.
constexpr double kLocBw = 5000.0;
constexpr uint32_t kClassNvSwitch = 0x068000;
constexpr uint32_t kClassCpu = 0x068001;

bool parseHexClass(const std::string* s, uint32_t* out) {
  if (s == nullptr || s->empty()) return false;
  char* end = nullptr;
  unsigned long v = std::strtoul(s->c_str(), &end, 16);
  if (end == s->c_str() || *end != '\0') return false;
  *out = static_cast<uint32_t>(v);
  return true;
}
}  // namespace

const char* nodeTypeName(NodeType type) {
  switch (type) {
    case NodeType::kCpu:
      return "CPU";
    case NodeType::kPciSwitch:
      return "PCI";
    case NodeType::kGpu:
      return "GPU";
    case NodeType::kNic:
      return "NIC";
    case NodeType::kNet:
      return "NET";
    case NodeType::kNvSwitch:
      return "NVS";
  }
  return "?";
}

const char* linkTypeName(LinkType type) {
  switch (type) {
    case LinkType::kLoc:
      return "LOC";
    case LinkType::kNvl:
      return "NVL";
    case LinkType::kC2c:
      return "C2C";
    case LinkType::kPci:
      return "PCI";
    case LinkType::kSys:
      return "SYS";
    case LinkType::kNet:
      return "NET";
  }
  return "?";
}

const std::string* findAttr(const Attrs& attrs, const std::string& name) {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

double pciBandwidth(const std::string& linkSpeed, int width) {
  // NCCL's kvDictPciGen: per-lane rate in units of 100 Mb/s; GB/s = width * rate / 80.
  double rate = 60;  // NCCL's fallback (Gen3) for an empty or unknown speed
  char* end = nullptr;
  double gts = std::strtod(linkSpeed.c_str(), &end);
  if (end != linkSpeed.c_str() && std::isfinite(gts)) {
    if (gts == 2.5) rate = 15;
    if (gts == 5) rate = 30;
    if (gts == 8) rate = 60;
    if (gts == 16) rate = 120;
    if (gts == 32) rate = 240;
    if (gts == 64) rate = 480;
  }
  if (width <= 0) width = 16;
  return width * rate / 80.0;
}

double nvlinkBandwidth(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86 || sm == 87 || sm == 89) return 12.0;
  if (sm >= 70) return 20.0;
  if (sm >= 60) return 18.0;
  return 20.0;
}

double interCpuBandwidth(const std::string& arch, const std::string& vendor, int familyId,
                         int modelId) {
  if (arch == "ppc64") return 32;
  if (arch == "arm64") return 6;
  if (vendor == "AuthenticAMD") return 16;
  if (vendor == "GenuineIntel" && familyId == 6) {
    if (modelId >= 0xCF) return 40;  // Emerald Rapids
    if (modelId >= 0x8F) return 22;  // Sapphire Rapids
    if (modelId >= 0x55) return 10;  // Skylake
  }
  return 6;  // Broadwell and anything unknown
}

namespace {
std::string busKey(int host, const std::string& busId) {
  return std::to_string(host) + "/" + busId;
}
}  // namespace

int Graph::addHost(const std::string& hostHash) {
  for (size_t h = 0; h < hosts_.size(); ++h)
    if (hosts_[h] == hostHash) return static_cast<int>(h);
  hosts_.push_back(hostHash);
  return static_cast<int>(hosts_.size()) - 1;
}

int Graph::addNode(Node node) {
  int id = size();
  int parent = node.parent;
  if (parent >= 0 && parent < id) node.host = nodes_[parent].host;
  if (!node.busId.empty()) byBusId_.emplace(busKey(node.host, node.busId), id);
  nodes_.push_back(std::move(node));
  out_.emplace_back();
  if (parent >= 0 && parent < id) nodes_[parent].children.push_back(id);
  return id;
}

void Graph::addLink(int from, int to, LinkType type, double bw, double latencyUs) {
  for (int li : out_[from]) {
    Link& l = links_[li];
    if (l.to == to && l.type == type) {
      l.bw += bw;
      return;
    }
  }
  out_[from].push_back(static_cast<int>(links_.size()));
  links_.push_back(Link{from, to, type, bw, latencyUs});
}

const Link* Graph::findLink(int a, int b, LinkType type) const {
  for (int li : out_[a]) {
    if (links_[li].to == b && links_[li].type == type) return &links_[li];
  }
  return nullptr;
}

std::vector<int> Graph::nodesOfType(NodeType type) const {
  std::vector<int> r;
  for (int i = 0; i < size(); i++) {
    if (nodes_[i].type == type) r.push_back(i);
  }
  return r;
}

int Graph::count(NodeType type) const {
  return static_cast<int>(
      std::count_if(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.type == type; }));
}

int Graph::findByBusId(const std::string& busId, int host) const {
  auto it = byBusId_.find(busKey(host, asciiLower(busId)));
  return it == byBusId_.end() ? -1 : it->second;
}

int Graph::cpuOf(int i) const {
  // Parents always precede children, so this walk ends.
  while (i >= 0 && nodes_[i].type != NodeType::kCpu) i = nodes_[i].parent;
  return i;
}

std::string Graph::describe(int i) const {
  if (i < 0 || i >= size()) return fmt::format("node {} (none)", i);
  const Node& n = nodes_[i];
  std::string s = nodeTypeName(n.type);
  switch (n.type) {
    case NodeType::kCpu:
      s += fmt::format(" numa {}", n.numaId);
      break;
    case NodeType::kGpu:
      s += fmt::format(" dev {}", n.dev);
      break;
    case NodeType::kNet:
      s += fmt::format(" {} (dev {})", n.name, n.dev);
      break;
    default:
      break;
  }
  if (!n.busId.empty()) s += fmt::format(" ({})", n.busId);
  return s;
}

Status Graph::buildLinks() {
  links_.clear();
  for (auto& o : out_) o.clear();
  // Invisible NVLink far ends are NVSwitches NCCL adds: one per host, or, for the target
  // fffffff:ff:ff.0 of a file of several hosts (a multi-node NVLink domain), one the hosts share.
  // A file of one host has one such switch, whatever the targets say.
  std::unordered_map<int, int> synthSwitch;  // host (-1: shared) -> node
  for (int i = 0; i < size(); i++) {
    if (nodes_[i].synthetic && nodes_[i].type == NodeType::kNvSwitch)
      synthSwitch[nodes_[i].host] = i;
  }
  const bool manyHosts = hostCount() > 1;
  auto nvSwitch = [&](int host, const std::string& target) {
    const int key = manyHosts && target != "fffffff:ff:ff.0" ? host : -1;
    auto it = synthSwitch.find(key);
    if (it != synthSwitch.end()) return it->second;
    Node nvs;
    nvs.type = NodeType::kNvSwitch;
    nvs.synthetic = true;
    nvs.host = key;
    int id = addNode(std::move(nvs));
    synthSwitch[key] = id;
    return id;
  };

  const int n0 = size();
  for (int i = 0; i < n0; i++) {
    const Node& n = nodes_[i];
    if (n.synthetic) continue;
    if (n.hasPci && n.parent >= 0) addBiLink(i, n.parent, LinkType::kPci, n.pciBw);
    if (n.isCpuNic() && n.parent >= 0) addBiLink(i, n.parent, LinkType::kPci, kLocBw);
    if (n.type == NodeType::kNet && n.parent >= 0) {
      addBiLink(n.parent, i, LinkType::kNet, n.speedGBs, n.latencyUs);
    }
  }
  for (int i = 0; i < n0; i++) {
    // Copy: nvSwitch() may append to nodes_.
    const std::vector<LinkElement> elems = nodes_[i].linkElements;
    for (const LinkElement& e : elems) {
      const Node& n = nodes_[i];
      if (e.tag == "nvlink") {
        const std::string* target = findAttr(e.attrs, "target");
        if (target == nullptr || target->empty()) {
          return LOOM_ERROR(kInvalidArgument, "line {}: <nvlink> of {} has no target", e.line,
                            describe(i));
        }
        int count = 1;
        if (const std::string* c = findAttr(e.attrs, "count")) count = std::atoi(c->c_str());
        if (count <= 0) continue;
        uint32_t tclass = 0;
        bool hasClass = parseHexClass(findAttr(e.attrs, "tclass"), &tclass);
        std::string tgt = asciiLower(*target);
        if (tgt == n.busId) {
          // Seen in Azure VM dumps: a GPU's NVLinks "to itself". Nothing to connect.
          LOOM_INFO(kSubTopo, "line {}: NVLink of {} targets itself, ignored", e.line, describe(i));
          continue;
        }
        int t = findByBusId(tgt, n.host);
        double bw = count * nvlinkBandwidth(n.sm);
        int remote = -1;
        if (hasClass && tclass == kClassCpu) {
          remote = cpuOf(i);
        } else if ((hasClass && (tclass >> 16) == 0x03) ||
                   (t >= 0 && nodes_[t].type == NodeType::kGpu)) {
          if (t >= 0 && nodes_[t].type == NodeType::kGpu) remote = t;
        } else if (t >= 0 && nodes_[t].type == NodeType::kNvSwitch) {
          remote = t;
        } else if ((hasClass && tclass == kClassNvSwitch) || t < 0) {
          // Invisible far end (not in the file, or fffffff:ff:ff.0): NCCL treats it as the one
          // NVSwitch fabric all GPUs share.
          remote = nvSwitch(n.host, tgt);
        }
        if (remote < 0) {
          LOOM_INFO(kSubTopo, "line {}: NVLink target {} of {} not found, ignored", e.line, tgt,
                    describe(i));
          continue;
        }
        addLink(i, remote, LinkType::kNvl, bw);
        if (nodes_[remote].type != NodeType::kGpu) addLink(remote, i, LinkType::kNvl, bw);
      } else if (e.tag == "c2c") {
        const std::string* bwStr = findAttr(e.attrs, "bw");
        const std::string* cntStr = findAttr(e.attrs, "count");
        double bw = bwStr ? std::atof(bwStr->c_str()) : 0;
        int count = cntStr ? std::atoi(cntStr->c_str()) : 1;
        int cpu = cpuOf(i);
        if (cpu >= 0 && bw > 0 && count > 0) addBiLink(i, cpu, LinkType::kC2c, bw * count / 1000.0);
      } else if (e.tag == "pcilink") {
        const std::string* target = findAttr(e.attrs, "target");
        int t = target ? findByBusId(*target, nodes_[i].host) : -1;
        if (t < 0 || t == i) continue;
        if (findLink(i, t, LinkType::kPci) == nullptr) addBiLink(i, t, LinkType::kPci, kLocBw);
      }
    }
  }
  std::vector<int> cpus = nodesOfType(NodeType::kCpu);
  for (int a : cpus) {
    for (int b : cpus) {
      if (a == b || nodes_[a].host != nodes_[b].host) continue;  // hosts meet only over NVLink
      const Node& c = nodes_[a];
      addLink(a, b, LinkType::kSys, interCpuBandwidth(c.arch, c.vendor, c.familyId, c.modelId));
    }
  }
  return Status::ok();
}

namespace {
std::string attrsText(const Attrs& attrs) {
  std::string s;
  for (const auto& [k, v] : attrs) s += fmt::format(" {}=\"{}\"", k, v);
  return s;
}
}  // namespace

std::string diffGraphs(const Graph& a, const Graph& b) {
  if (a.size() != b.size()) return fmt::format("{} nodes vs {}", a.size(), b.size());
  if (a.hosts() != b.hosts()) return fmt::format("{} hosts vs {}", a.hostCount(), b.hostCount());
  for (int i = 0; i < a.size(); i++) {
    const Node& x = a.node(i);
    const Node& y = b.node(i);
    std::string where = fmt::format("node {} ({} vs {})", i, a.describe(i), b.describe(i));
    if (x.type != y.type || x.parent != y.parent || x.synthetic != y.synthetic ||
        x.busId != y.busId || x.children != y.children || x.host != y.host) {
      return where + ": type, parent, bus id, host or children differ";
    }
    if (x.hasPci != y.hasPci || x.pciAttrs != y.pciAttrs) {
      return where + ": <pci>" + attrsText(x.pciAttrs) + " vs" + attrsText(y.pciAttrs);
    }
    if (x.elemTag != y.elemTag || x.attrs != y.attrs) {
      return where + ": <" + x.elemTag + attrsText(x.attrs) + "> vs <" + y.elemTag +
             attrsText(y.attrs) + ">";
    }
    if (x.linkElements.size() != y.linkElements.size()) return where + ": link elements differ";
    for (size_t k = 0; k < x.linkElements.size(); k++) {
      if (x.linkElements[k].tag != y.linkElements[k].tag ||
          x.linkElements[k].attrs != y.linkElements[k].attrs) {
        return where + fmt::format(": link element {} differs", k);
      }
    }
  }
  if (a.links().size() != b.links().size()) {
    return fmt::format("{} links vs {}", a.links().size(), b.links().size());
  }
  for (size_t k = 0; k < a.links().size(); k++) {
    const Link& x = a.links()[k];
    const Link& y = b.links()[k];
    if (x.from != y.from || x.to != y.to || x.type != y.type || x.bw != y.bw ||
        x.latencyUs != y.latencyUs) {
      return fmt::format("link {}: {}->{} {} {} GB/s vs {}->{} {} {} GB/s", k, x.from, x.to,
                         linkTypeName(x.type), x.bw, y.from, y.to, linkTypeName(y.type), y.bw);
    }
  }
  return "";
}

}  // namespace loom::topo
