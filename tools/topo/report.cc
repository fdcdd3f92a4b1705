#include "tools/topo/report.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "src/core/text.h"

namespace loom::topotool {

using topo::Graph;
using topo::Node;
using topo::NodeType;
using topo::Path;
using topo::Paths;
using topo::PathType;

namespace {

std::string gbs(double v) { return fmt::format("{:.1f} GB/s", v); }

std::string attrOr(const topo::Attrs& a, const char* name, const std::string& def = "") {
  const std::string* v = topo::findAttr(a, name);
  return v ? *v : def;
}

const char* vendorName(const std::string& id) {
  static const std::map<std::string, const char*> kNames = {
      {"0x10de", "NVIDIA"},   {"0x15b3", "Mellanox"}, {"0x1d0f", "Amazon"},
      {"0x8086", "Intel"},    {"0x1af4", "virtio"},   {"0x1000", "Broadcom/LSI"},
      {"0x14e4", "Broadcom"}, {"0x1002", "AMD"},      {"0x1022", "AMD"},
      {"0x1077", "QLogic"},   {"0x19e5", "Huawei"},   {"0x1924", "Solarflare"}};
  auto it = kNames.find(id);
  return it == kNames.end() ? nullptr : it->second;
}

std::string sizeText(uint64_t bytes) {
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// Everything the outputs share, computed once.
struct View {
  const Graph& g;
  const Paths& p;
  std::vector<int> gpus, nics, cpus;
  std::map<int, std::string> label;

  View(const Graph& graph, const Paths& paths) : g(graph), p(paths) {
    gpus = g.nodesOfType(NodeType::kGpu);
    std::stable_sort(gpus.begin(), gpus.end(), [&](int a, int b) {
      const Node &x = g.node(a), &y = g.node(b);
      return std::make_tuple(x.host, x.dev < 0, x.dev) < std::make_tuple(y.host, y.dev < 0, y.dev);
    });
    nics = g.nodesOfType(NodeType::kNic);
    cpus = g.nodesOfType(NodeType::kCpu);
    for (size_t i = 0; i < gpus.size(); i++) label[gpus[i]] = fmt::format("GPU{}", i);
    for (size_t i = 0; i < nics.size(); i++) label[nics[i]] = fmt::format("NIC{}", i);
    for (size_t i = 0; i < cpus.size(); i++) label[cpus[i]] = fmt::format("CPU{}", i);
  }

  int numaOf(int node) const {
    int c = g.cpuOf(node);
    return c >= 0 ? g.node(c).numaId : -1;
  }
  std::vector<int> ports(int nic) const {
    std::vector<int> r;
    for (int c : g.node(nic).children) {
      if (g.node(c).type == NodeType::kNet) r.push_back(c);
    }
    return r;
  }
  std::string portNames(int nic) const {
    std::string s;
    for (int c : ports(nic)) s += (s.empty() ? "" : ", ") + g.node(c).name;
    return s;
  }
  // The NICs tied for nearest to a GPU (best type, then bandwidth).
  std::vector<int> nearestNics(int gpu) const {
    std::vector<int> r;
    int best = p.nearestNic(gpu);
    if (best < 0) return r;
    const Path& bp = p.get(gpu, best);
    for (int n : nics) {
      const Path& q = p.get(gpu, n);
      if (q.type == bp.type && q.bw == bp.bw) r.push_back(n);
    }
    return r;
  }
  std::vector<int> gdrPorts(int gpu) const {
    std::vector<int> r;
    for (int net : g.nodesOfType(NodeType::kNet)) {
      if (p.gdrAllowed(gpu, net)) r.push_back(net);
    }
    return r;
  }
  // NVLinks of a GPU: links listed in its <nvlink> elements (self-targets excluded) and their
  // total bandwidth.
  std::pair<int, double> nvlinks(int gpu) const {
    int count = 0;
    const Node& n = g.node(gpu);
    for (const auto& e : n.linkElements) {
      if (e.tag != "nvlink") continue;
      if (asciiLower(attrOr(e.attrs, "target")) == n.busId) continue;
      count += std::max(0, std::atoi(attrOr(e.attrs, "count", "1").c_str()));
    }
    double bw = 0;
    for (int li : g.linksFrom(gpu)) {
      if (g.links()[li].type == topo::LinkType::kNvl) bw += g.links()[li].bw;
    }
    return {count, bw};
  }
  std::string affinity(int cpu) const {
    auto cpusOf = topo::parseCpumask(attrOr(g.node(cpu).attrs, "affinity"));
    return cpusOf.isOk() && !cpusOf.value().empty() ? cpuRanges(cpusOf.value()) : "?";
  }
  std::string pciIds(int node) const {
    const Node& n = g.node(node);
    std::string v = attrOr(n.pciAttrs, "vendor"), d = attrOr(n.pciAttrs, "device");
    if (v.empty()) return "";
    const char* name = vendorName(v);
    return fmt::format("{}{}:{}", name ? std::string(name) + " " : "", v.substr(2),
                       d.size() > 2 ? d.substr(2) : d);
  }
};

std::string cpuLine(const Graph& g, int c) {
  const Node& n = g.node(c);
  std::string s = n.vendor.empty() ? "unknown vendor" : n.vendor;
  if (n.familyId >= 0) s += fmt::format(" family {} model {}", n.familyId, n.modelId);
  if (!n.arch.empty()) s += " (" + n.arch + ")";
  return s;
}

}  // namespace

std::string cpuRanges(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) j++;
    if (!s.empty()) s += ',';
    s += j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return s;
}

// A file of several hosts: each host's hash, GPUs and ports, and the NVLink domains (GPUs that
// reach each other over NVLink, across hosts through a shared NVSwitch fabric).
struct HostSummary {
  std::string hash;
  int gpus = 0, ports = 0;
};

std::vector<HostSummary> hostSummaries(const Graph& g) {
  std::vector<HostSummary> hosts(static_cast<size_t>(g.hostCount()));
  for (size_t h = 0; h < g.hosts().size(); ++h) hosts[h].hash = g.hosts()[h];
  for (const Node& n : g.nodes()) {
    if (n.host < 0 || n.host >= g.hostCount()) continue;
    hosts[static_cast<size_t>(n.host)].gpus += n.type == NodeType::kGpu;
    hosts[static_cast<size_t>(n.host)].ports += n.type == NodeType::kNet;
  }
  return hosts;
}

// NVLink domains as lists of GPU labels, largest first; GPUs without NVLink are left out.
std::vector<std::vector<int>> nvlinkDomains(const Graph& g, const Paths& p,
                                            const std::vector<int>& gpus) {
  std::vector<std::vector<int>> domains;
  std::set<int> seen;
  for (int a : gpus) {
    if (seen.count(a)) continue;
    std::vector<int> d{a};
    seen.insert(a);
    for (int b : gpus) {
      if (b == a || seen.count(b)) continue;
      PathType t = p.get(a, b).type;
      if (t == PathType::kNvl || t == PathType::kNvb) {
        d.push_back(b);
        seen.insert(b);
      }
    }
    if (d.size() > 1) domains.push_back(d);
  }
  return domains;
}

std::string textReport(const Input& in, const Paths& paths) {
  const Graph& g = *in.graph;
  View v(g, paths);
  std::string o;
  auto line = [&](const std::string& key, const std::string& val) {
    o += fmt::format("{:<12}{}\n", key, val);
  };
  o += fmt::format("loom-topo: topology {}\n\n", in.source);

  // ---- summary ----
  std::string host = in.host ? in.host->hostname : "";
  for (int c : v.cpus) {
    if (host.empty()) host = attrOr(g.node(c).attrs, "host_hash");
  }
  if (g.hostCount() > 1) {
    std::vector<HostSummary> hosts = hostSummaries(g);
    line("Hosts", fmt::format("{} in this file (one per host_hash)", hosts.size()));
    for (size_t h = 0; h < hosts.size(); ++h)
      line("", fmt::format("host {}  {}  {} GPU(s), {} port(s)", h,
                           hosts[h].hash.empty() ? "(no host_hash)" : hosts[h].hash, hosts[h].gpus,
                           hosts[h].ports));
  } else {
    line("Host", host.empty() ? "(not in the file)" : host);
  }
  if (v.cpus.empty()) {
    line("CPU", "none in this topology");
  } else if (in.host) {
    const topo::HostInfo& h = *in.host;
    std::string cpu0 = cpuLine(g, v.cpus[0]);
    line("CPU", h.cpuModel.empty() ? cpu0 : h.cpuModel + ", " + cpu0);
    line("", fmt::format("{} package(s), {} NUMA node(s), {} core(s), {} hardware thread(s)",
                         h.packages, h.numaNodes, h.cores, h.pus));
    std::string caches;
    for (const auto& c : h.caches) {
      caches += fmt::format("{}{} {} x{}", caches.empty() ? "" : ", ", c.name,
                            sizeText(c.sizeBytes), c.count);
    }
    line("Caches", caches.empty() ? "(unknown)" : caches);
  } else {
    std::set<std::string> kinds;
    for (int c : v.cpus) kinds.insert(cpuLine(g, c));
    std::string k;
    for (const auto& s : kinds) k += (k.empty() ? "" : "; ") + s;
    line("CPU", fmt::format("{} NUMA domain(s): {}", v.cpus.size(), k));
  }
  for (int c : v.cpus) {
    line(c == v.cpus[0] ? "NUMA" : "",
         fmt::format("{}: NUMA {}, CPUs {}", v.label[c], g.node(c).numaId, v.affinity(c)));
  }
  int pci = 0, bridges = 0;
  for (const Node& n : g.nodes()) {
    pci += n.hasPci;
    bridges += n.hasPci && n.type == NodeType::kPciSwitch && (n.pciClass >> 8) == 0x0604;
  }
  int nvs = g.count(NodeType::kNvSwitch);
  line("PCI", fmt::format("{} device(s) in the tree, {} of them PCIe switches", pci, bridges));
  line("Devices",
       fmt::format("{} GPU(s), {} NIC(s) with {} port(s){}", v.gpus.size(), v.nics.size(),
                   g.count(NodeType::kNet), nvs ? fmt::format(", {} NVSwitch node(s)", nvs) : ""));
  for (int nic : v.nics) {
    const Node& n = g.node(nic);
    std::string where = n.hasPci ? n.busId : "no PCI device (under the CPU)";
    std::string ids = v.pciIds(nic);
    line(nic == v.nics[0] ? "NICs" : "",
         fmt::format("{}  {}{}  NUMA {}  PCIe {}", v.label[nic], where,
                     ids.empty() ? "" : " [" + ids + "]", v.numaOf(nic),
                     !n.hasPci ? std::string("-")
                     : attrOr(n.pciAttrs, "link_speed").empty()
                         ? gbs(n.pciBw) + " (link speed not reported)"
                         : gbs(n.pciBw)));
    for (int port : v.ports(nic)) {
      const Node& p = g.node(port);
      std::string layer = attrOr(p.attrs, "link_layer");
      line("", fmt::format("  {:<12} dev {:<3} port {:<2} {:>8.1f} Gb/s  guid {}  GDR {}{}", p.name,
                           p.dev, p.port, p.speedGBs * 8, fmt::format("{:#x}", p.guid),
                           p.gdr ? "yes" : "no", layer.empty() ? "" : "  " + layer));
    }
  }
  if (v.nics.empty()) line("NICs", "none");
  if (v.gpus.empty()) line("GPUs", "none");
  if (g.hostCount() > 1) {
    std::vector<std::vector<int>> domains = nvlinkDomains(g, paths, v.gpus);
    for (size_t d = 0; d < domains.size(); ++d) {
      std::set<int> hosts;
      for (int gpu : domains[d]) hosts.insert(g.node(gpu).host);
      line(d == 0 ? "NVLink" : "",
           fmt::format("domain {}: {} GPU(s) on {} host(s), {} to {}", d, domains[d].size(),
                       hosts.size(), v.label[domains[d].front()], v.label[domains[d].back()]));
    }
    if (domains.empty()) line("NVLink", "no GPUs reach each other over NVLink");
  }
  if (in.host) {
    for (size_t i = 0; i < in.host->sources.size(); i++) {
      line(i == 0 ? "Sources" : "", in.host->sources[i]);
    }
    for (size_t i = 0; i < in.host->skipped.size(); i++) {
      line(i == 0 ? "Notes" : "", in.host->skipped[i]);
    }
  }

  // ---- per GPU ----
  for (int gpu : v.gpus) {
    const Node& n = g.node(gpu);
    o += fmt::format("\n{}  {}{}  dev {}  sm {}  NUMA {}  GDR {}{}\n", v.label[gpu],
                     g.hostCount() > 1 ? fmt::format("host {}  ", n.host) : "", n.busId, n.dev,
                     n.sm, v.numaOf(gpu), n.gdr ? "yes" : "no",
                     n.elemTag.empty() ? "  (no <gpu> element: PCI only)" : "");
    std::vector<int> near = v.nearestNics(gpu);
    if (near.empty()) {
      o += "  nearest NIC   none\n";
    } else {
      const Path& np = paths.get(gpu, near[0]);
      for (int nic : near) {
        std::string names = v.portNames(nic);
        o += fmt::format("  {:<13} {} {}{}  {}  {}\n", nic == near[0] ? "nearest NIC" : "",
                         v.label[nic], g.node(nic).hasPci ? g.node(nic).busId : "(under CPU)",
                         names.empty() ? "" : " (" + names + ")", topo::pathTypeName(np.type),
                         gbs(np.bw));
      }
    }
    std::string gdr;
    for (int net : v.gdrPorts(gpu)) gdr += (gdr.empty() ? "" : ", ") + g.node(net).name;
    o += fmt::format("  {:<13} {}\n", "GPUDirect", gdr.empty() ? "no port" : gdr);
    auto [count, nvbw] = v.nvlinks(gpu);
    if (count > 0 || nvbw > 0) {
      o += fmt::format("  {:<13} {} link(s), {}\n", "NVLink", count, gbs(nvbw));
    }
    // Peers over NVLink, grouped by (type, bandwidth); P2P decision over all peers.
    std::map<std::pair<PathType, double>, std::string> groups;
    std::string p2p, noP2p;
    for (int other : v.gpus) {
      if (other == gpu) continue;
      const Path& q = paths.get(gpu, other);
      if (q.type == PathType::kNvl || q.type == PathType::kNvb) {
        std::string& s = groups[{q.type, q.bw}];
        s += (s.empty() ? "" : ",") + v.label[other];
      }
      std::string& to = paths.p2pAllowed(gpu, other) ? p2p : noP2p;
      to += (to.empty() ? "" : ",") + v.label[other];
    }
    bool first = true;
    for (const auto& [k, labels] : groups) {
      o += fmt::format("  {:<13} {} {} {}\n", first ? "NVLink peers" : "", labels,
                       topo::pathTypeName(k.first), gbs(k.second));
      first = false;
    }
    if (v.gpus.size() > 1) {
      o += fmt::format("  {:<13} {}{}\n", "P2P", p2p.empty() ? "no peer" : p2p,
                       noP2p.empty() ? "" : "  (through the CPU: " + noP2p + ")");
    }
  }

  // ---- matrix ----
  std::vector<int> devs = v.gpus;
  devs.insert(devs.end(), v.nics.begin(), v.nics.end());
  devs.insert(devs.end(), v.cpus.begin(), v.cpus.end());
  if (!devs.empty()) {
    size_t w = 4;
    for (int d : devs) w = std::max(w, v.label[d].size());
    w += 1;
    o += "\nPath types (best path between devices, like nvidia-smi topo -m)\n";
    o += fmt::format("{:<{}}", "", w + 1);
    for (int d : devs) o += fmt::format("{:<{}}", v.label[d], w);
    o += "NUMA  CPU affinity\n";
    for (int r : devs) {
      o += fmt::format("{:<{}}", v.label[r], w + 1);
      for (int c : devs) {
        o += fmt::format("{:<{}}", r == c ? "X" : topo::pathTypeName(paths.get(r, c).type), w);
      }
      int cpu = g.cpuOf(r);
      o += fmt::format("{:<6}{}\n", v.numaOf(r), cpu >= 0 ? v.affinity(cpu) : "?");
    }
    o += "\nLegend:\n";
    o += "  X   = self\n";
    o += "  NVL = NVLink, direct or through NVSwitches\n";
    o += "  NVB = NVLink through another GPU\n";
    o += "  C2C = chip-to-chip link to the CPU\n";
    o += "  PIX = through at most one PCIe switch\n";
    o += "  PXB = through several PCIe switches, without the CPU's host bridge\n";
    o += "  PHB = through the PCIe host bridge of a CPU (one NUMA node)\n";
    o += "  SYS = across the CPU-to-CPU interconnect (another NUMA node)\n";
    o += "  DIS = not connected\n";
    for (int nic : v.nics) {
      std::string names = v.portNames(nic);
      o += fmt::format("  {} = {}{}\n", v.label[nic], names.empty() ? "(no port)" : names,
                       g.node(nic).hasPci ? " (" + g.node(nic).busId + ")" : "");
    }
  }
  return o;
}

std::string jsonReport(const Input& in, const Paths& paths) {
  using nlohmann::json;
  const Graph& g = *in.graph;
  View v(g, paths);
  json j;
  j["source"] = in.source;
  if (in.host) {
    const topo::HostInfo& h = *in.host;
    json caches = json::array();
    for (const auto& c : h.caches) {
      caches.push_back({{"name", c.name}, {"sizeBytes", c.sizeBytes}, {"count", c.count}});
    }
    j["host"] = {{"hostname", h.hostname},   {"cpuModel", h.cpuModel}, {"packages", h.packages},
                 {"numaNodes", h.numaNodes}, {"cores", h.cores},       {"pus", h.pus},
                 {"caches", caches},         {"sources", h.sources},   {"notes", h.skipped}};
  }
  json cpus = json::array();
  for (int c : v.cpus) {
    const Node& n = g.node(c);
    cpus.push_back({{"label", v.label[c]},
                    {"numa", n.numaId},
                    {"cpus", v.affinity(c)},
                    {"affinity", attrOr(n.attrs, "affinity")},
                    {"arch", n.arch},
                    {"vendor", n.vendor},
                    {"familyId", n.familyId},
                    {"modelId", n.modelId}});
  }
  j["cpus"] = cpus;
  int pci = 0, bridges = 0;
  for (const Node& n : g.nodes()) {
    pci += n.hasPci;
    bridges += n.hasPci && n.type == NodeType::kPciSwitch && (n.pciClass >> 8) == 0x0604;
  }
  j["pci"] = {{"devices", pci}, {"switches", bridges}};
  j["nvswitches"] = g.count(NodeType::kNvSwitch);
  json hosts = json::array();
  for (const HostSummary& h : hostSummaries(g))
    hosts.push_back({{"hostHash", h.hash}, {"gpus", h.gpus}, {"ports", h.ports}});
  j["hosts"] = hosts;
  json domains = json::array();
  for (const std::vector<int>& d : nvlinkDomains(g, paths, v.gpus)) {
    json labels = json::array();
    for (int gpu : d) labels.push_back(v.label[gpu]);
    domains.push_back(labels);
  }
  j["nvlinkDomains"] = domains;
  json nics = json::array();
  for (int nic : v.nics) {
    const Node& n = g.node(nic);
    json ports = json::array();
    for (int port : v.ports(nic)) {
      const Node& p = g.node(port);
      ports.push_back({{"name", p.name},
                       {"dev", p.dev},
                       {"port", p.port},
                       {"speedGbps", p.speedGBs * 8},
                       {"guid", fmt::format("{:#x}", p.guid)},
                       {"gdr", p.gdr}});
    }
    nics.push_back({{"label", v.label[nic]},
                    {"busId", n.busId},
                    {"numa", v.numaOf(nic)},
                    {"pciBwGBs", n.pciBw},
                    {"ports", ports}});
  }
  j["nics"] = nics;
  json gpus = json::array();
  for (int gpu : v.gpus) {
    const Node& n = g.node(gpu);
    json near = json::array();
    for (int nic : v.nearestNics(gpu)) {
      const Path& q = paths.get(gpu, nic);
      near.push_back(
          {{"nic", v.label[nic]}, {"path", topo::pathTypeName(q.type)}, {"bwGBs", q.bw}});
    }
    json gdr = json::array();
    for (int net : v.gdrPorts(gpu)) gdr.push_back(g.node(net).name);
    json peers = json::array();
    json p2p = json::array();
    for (int other : v.gpus) {
      if (other == gpu) continue;
      const Path& q = paths.get(gpu, other);
      peers.push_back(
          {{"gpu", v.label[other]}, {"path", topo::pathTypeName(q.type)}, {"bwGBs", q.bw}});
      if (paths.p2pAllowed(gpu, other)) p2p.push_back(v.label[other]);
    }
    auto [count, nvbw] = v.nvlinks(gpu);
    gpus.push_back({{"label", v.label[gpu]},
                    {"host", n.host},
                    {"dev", n.dev},
                    {"busId", n.busId},
                    {"sm", n.sm},
                    {"numa", v.numaOf(gpu)},
                    {"gdr", n.gdr},
                    {"nearestNics", near},
                    {"gdrPorts", gdr},
                    {"nvlinkCount", count},
                    {"nvlinkBwGBs", nvbw},
                    {"peers", peers},
                    {"p2p", p2p}});
  }
  j["gpus"] = gpus;
  std::vector<int> devs = v.gpus;
  devs.insert(devs.end(), v.nics.begin(), v.nics.end());
  devs.insert(devs.end(), v.cpus.begin(), v.cpus.end());
  json labels = json::array(), types = json::array(), bws = json::array();
  for (int r : devs) {
    labels.push_back(v.label[r]);
    json tr = json::array(), br = json::array();
    for (int c : devs) {
      tr.push_back(topo::pathTypeName(paths.get(r, c).type));
      br.push_back(paths.get(r, c).bw);
    }
    types.push_back(tr);
    bws.push_back(br);
  }
  j["matrix"] = {{"labels", labels}, {"paths", types}, {"bwGBs", bws}};
  // Names come from files: replace invalid UTF-8 instead of failing.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string dotGraph(const Input& in) {
  const Graph& g = *in.graph;
  auto esc = [](const std::string& s) {
    std::string r;
    for (char c : s) {
      if (c == '"' || c == '\\') r += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) r += c;
    }
    return r;
  };
  std::string o = "graph loom_topology {\n  node [fontname=\"Helvetica\", fontsize=10];\n";
  o += "  edge [fontname=\"Helvetica\", fontsize=8];\n";
  for (int i = 0; i < g.size(); i++) {
    const Node& n = g.node(i);
    std::string label, shape = "box", color = "black";
    switch (n.type) {
      case NodeType::kCpu:
        label = fmt::format("CPU NUMA {}\\n{}", n.numaId, esc(n.vendor));
        shape = "box3d";
        color = "firebrick";
        break;
      case NodeType::kGpu:
        label = fmt::format("GPU {}\\n{}\\nsm {}", n.dev, n.busId, n.sm);
        color = "forestgreen";
        break;
      case NodeType::kNic:
        label = fmt::format("NIC\\n{}", n.hasPci ? n.busId : "(no PCI)");
        color = "royalblue";
        break;
      case NodeType::kNet:
        label = fmt::format("{}\\n{:.0f} Gb/s", esc(n.name), n.speedGBs * 8);
        shape = "ellipse";
        color = "royalblue";
        break;
      case NodeType::kNvSwitch:
        label = n.synthetic ? "NVSwitch fabric" : fmt::format("NVSwitch\\n{}", n.busId);
        shape = "hexagon";
        color = "forestgreen";
        break;
      case NodeType::kPciSwitch:
        label = fmt::format("PCI {}\\nclass {:#08x}", n.busId, n.pciClass);
        shape = (n.pciClass >> 8) == 0x0604 ? "trapezium" : "box";
        color = "gray40";
        break;
    }
    o += fmt::format("  n{} [label=\"{}\", shape={}, color={}];\n", i, label, shape, color);
  }
  std::set<std::tuple<int, int, int>> seen;
  for (const topo::Link& l : g.links()) {
    int a = std::min(l.from, l.to), b = std::max(l.from, l.to);
    if (!seen.insert({a, b, static_cast<int>(l.type)}).second) continue;
    const char* color = "black";
    switch (l.type) {
      case topo::LinkType::kNvl:
        color = "forestgreen";
        break;
      case topo::LinkType::kSys:
        color = "firebrick";
        break;
      case topo::LinkType::kNet:
        color = "royalblue";
        break;
      case topo::LinkType::kC2c:
        color = "purple";
        break;
      default:
        break;
    }
    o += fmt::format("  n{} -- n{} [label=\"{} {:.1f}\", color={}];\n", a, b,
                     topo::linkTypeName(l.type), l.bw, color);
  }
  o += "}\n";
  return o;
}

}  // namespace loom::topotool
