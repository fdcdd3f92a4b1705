#include "topology/system.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "topology/discover.h"
#include "topology/paths.h"

namespace loom::topo {

namespace {

constexpr uint32_t kMagic = 0x4c525431;  // "LRT1"
constexpr uint32_t kMaxString = 4096;
constexpr uint32_t kMaxDevices = 1 << 16;

void putU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putU64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putI32(std::string& s, int v) { putU32(s, static_cast<uint32_t>(v)); }
void putF64(std::string& s, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  putU64(s, bits);
}
void putStr(std::string& s, const std::string& v) {
  putU32(s, static_cast<uint32_t>(v.size()));
  s += v;
}

// Bounds-checked reader: after the first short read every value is zero and ok is false.
struct Reader {
  std::string_view b;
  size_t pos = 0;
  bool ok = true;

  bool need(size_t n) {
    if (!ok || b.size() - pos < n) ok = false;
    return ok;
  }
  uint64_t uint(int bytes) {
    if (!need(static_cast<size_t>(bytes))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b[pos + i])) << (8 * i);
    }
    pos += static_cast<size_t>(bytes);
    return v;
  }
  uint32_t u32() { return static_cast<uint32_t>(uint(4)); }
  int i32() { return static_cast<int>(static_cast<int32_t>(u32())); }
  uint64_t u64() { return uint(8); }
  double f64() {
    uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (n > kMaxString) ok = false;
    if (!need(n)) return "";
    std::string s(b.substr(pos, n));
    pos += n;
    return s;
  }
};

int numaOfNode(const Graph& g, int node) {
  int c = g.cpuOf(node);
  return c >= 0 ? g.node(c).numaId : -1;
}

}  // namespace

std::string RankTopo::serialize() const {
  std::string s;
  putU32(s, kMagic);
  putStr(s, hostId);
  putI32(s, numaNode);
  putI32(s, cudaDev);
  putU32(s, static_cast<uint32_t>(gpus.size()));
  for (const Gpu& g : gpus) {
    putStr(s, g.busId);
    putI32(s, g.dev);
    putI32(s, g.sm);
    putI32(s, g.numa);
    putI32(s, g.nearestPort);
  }
  putU32(s, static_cast<uint32_t>(ports.size()));
  for (const Port& p : ports) {
    putStr(s, p.name);
    putStr(s, p.busId);
    putI32(s, p.dev);
    putI32(s, p.port);
    putI32(s, p.numa);
    putF64(s, p.speedGBs);
    putU64(s, p.guid);
    s.push_back(p.gdr ? 1 : 0);
  }
  // GPU pair paths: present only when complete (gpus^2 entries).
  bool pathsComplete = gpuPathType.size() == gpus.size() * gpus.size() &&
                       gpuPathBw.size() == gpuPathType.size() && !gpus.empty();
  s.push_back(pathsComplete ? 1 : 0);
  if (pathsComplete) {
    for (size_t i = 0; i < gpuPathType.size(); i++) {
      s.push_back(static_cast<char>(gpuPathType[i]));
      putF64(s, gpuPathBw[i]);
    }
  }
  return s;
}

Result<RankTopo> RankTopo::deserialize(std::string_view blob) {
  Reader r{blob};
  RankTopo t;
  if (r.u32() != kMagic) {
    return LOOM_ERROR(kInvalidArgument, "rank topology: bad magic ({} bytes)", blob.size());
  }
  t.hostId = r.str();
  t.numaNode = r.i32();
  t.cudaDev = r.i32();
  uint32_t nGpus = r.u32();
  if (nGpus > kMaxDevices) r.ok = false;
  for (uint32_t i = 0; r.ok && i < nGpus; i++) {
    Gpu g;
    g.busId = r.str();
    g.dev = r.i32();
    g.sm = r.i32();
    g.numa = r.i32();
    g.nearestPort = r.i32();
    t.gpus.push_back(std::move(g));
  }
  uint32_t nPorts = r.u32();
  if (nPorts > kMaxDevices) r.ok = false;
  for (uint32_t i = 0; r.ok && i < nPorts; i++) {
    Port p;
    p.name = r.str();
    p.busId = r.str();
    p.dev = r.i32();
    p.port = r.i32();
    p.numa = r.i32();
    p.speedGBs = r.f64();
    p.guid = r.u64();
    p.gdr = r.uint(1) != 0;
    t.ports.push_back(std::move(p));
  }
  if (r.uint(1) != 0) {
    size_t n = t.gpus.size() * t.gpus.size();
    for (size_t i = 0; r.ok && i < n; i++) {
      uint64_t type = r.uint(1);
      if (type > static_cast<uint64_t>(PathType::kDis)) r.ok = false;
      t.gpuPathType.push_back(static_cast<PathType>(type));
      t.gpuPathBw.push_back(static_cast<float>(r.f64()));
    }
  }
  if (!r.ok || r.pos != blob.size()) {
    return LOOM_ERROR(kInvalidArgument, "rank topology: malformed ({} bytes, stopped at {})",
                      blob.size(), r.pos);
  }
  for (const Gpu& g : t.gpus) {
    if (g.nearestPort < -1 || g.nearestPort >= static_cast<int>(t.ports.size())) {
      return LOOM_ERROR(kInvalidArgument, "rank topology: GPU {} has nearest port {} of {}",
                        g.busId, g.nearestPort, t.ports.size());
    }
  }
  return t;
}

RankTopo localRankTopo(const Graph& graph, const std::string& hostId) {
  RankTopo t;
  t.hostId = hostId;
  int cpu = sched_getcpu();
  for (int c : graph.nodesOfType(NodeType::kCpu)) {
    const std::string* aff = findAttr(graph.node(c).attrs, "affinity");
    if (aff == nullptr || cpu < 0) continue;
    auto cpus = parseCpumask(*aff);
    if (cpus.isOk() && std::binary_search(cpus.value().begin(), cpus.value().end(), cpu)) {
      t.numaNode = graph.node(c).numaId;
      break;
    }
  }
  Paths paths = Paths::compute(graph);
  std::map<int, int> portIndex;  // net node -> index in ports
  for (int n : graph.nodesOfType(NodeType::kNet)) {
    const Node& net = graph.node(n);
    RankTopo::Port p;
    p.name = net.name;
    p.busId = net.parent >= 0 ? graph.node(net.parent).busId : "";
    p.dev = net.dev;
    p.port = net.port;
    p.numa = numaOfNode(graph, n);
    p.speedGBs = net.speedGBs;
    p.guid = net.guid;
    p.gdr = net.gdr;
    portIndex[n] = static_cast<int>(t.ports.size());
    t.ports.push_back(std::move(p));
  }
  for (int gi : graph.nodesOfType(NodeType::kGpu)) {
    const Node& gpu = graph.node(gi);
    RankTopo::Gpu g;
    g.busId = gpu.busId;
    g.dev = gpu.dev;
    g.sm = gpu.sm;
    g.numa = numaOfNode(graph, gi);
    int net = paths.nearestNet(gi);
    g.nearestPort = net >= 0 ? portIndex[net] : -1;
    t.gpus.push_back(std::move(g));
  }
  std::vector<int> gpuNodes = graph.nodesOfType(NodeType::kGpu);
  for (int a : gpuNodes) {
    for (int b : gpuNodes) {
      const Path& p = paths.get(a, b);
      t.gpuPathType.push_back(a == b ? PathType::kLoc : p.type);
      t.gpuPathBw.push_back(p.bw);
    }
  }
  return t;
}

double SystemTopo::netBandwidth(int rank) const {
  const RankTopo& view = hostView(rank);
  for (const auto& g : view.gpus) {
    if (ranks[rank].cudaDev < 0 || g.dev != ranks[rank].cudaDev) continue;
    if (g.nearestPort >= 0) return view.ports[g.nearestPort].speedGBs;
    break;  // the rank's GPU has no nearest port: the host's fastest
  }
  double best = 0;
  for (const auto& port : view.ports) best = std::max(best, port.speedGBs);
  return best;
}

Path SystemTopo::rankPath(int a, int b) const {
  Path p;
  if (a < 0 || b < 0 || a >= nRanks() || b >= nRanks()) return p;  // kDis
  if (a == b) {
    p.type = PathType::kLoc;
    return p;
  }
  const RankTopo& ta = ranks[a];
  const RankTopo& tb = ranks[b];
  // The GPU a rank uses (index into its host view's gpus), or -1.
  auto gpuOf = [&](int r) {
    const RankTopo& view = hostView(r);
    for (size_t i = 0; i < view.gpus.size(); i++)
      if (ranks[r].cudaDev >= 0 && view.gpus[i].dev == ranks[r].cudaDev) return static_cast<int>(i);
    return -1;
  };
  if (!sameHost(a, b)) {
    p.type = PathType::kNet;
    p.bw = static_cast<float>(std::min(netBandwidth(a), netBandwidth(b)));
    p.hops = 2;
    return p;
  }
  const RankTopo& view = hostView(a);
  int ga = gpuOf(a), gb = gpuOf(b);
  size_t n = view.gpus.size();
  if (ga >= 0 && gb >= 0 && view.gpuPathType.size() == n * n) {
    size_t i = static_cast<size_t>(ga) * n + static_cast<size_t>(gb);
    p.type = view.gpuPathType[i];
    p.bw = view.gpuPathBw[i];
    p.hops = 1;
    return p;
  }
  bool sameNuma = ta.numaNode < 0 || tb.numaNode < 0 || ta.numaNode == tb.numaNode;
  p.type = sameNuma ? PathType::kLoc : PathType::kSys;
  p.hops = sameNuma ? 0 : 1;
  return p;
}

Result<SystemTopo> SystemTopo::build(std::vector<RankTopo> ranks) {
  if (ranks.empty()) return LOOM_ERROR(kInvalidArgument, "system topology of zero ranks");
  SystemTopo s;
  s.ranks = std::move(ranks);
  std::map<std::string, int> hostIndex;
  for (int r = 0; r < s.nRanks(); r++) {
    auto [it, inserted] = hostIndex.emplace(s.ranks[r].hostId, static_cast<int>(s.hosts.size()));
    if (inserted) s.hosts.push_back(Host{s.ranks[r].hostId, {}});
    Host& h = s.hosts[it->second];
    s.hostOf.push_back(it->second);
    s.localRank.push_back(static_cast<int>(h.ranks.size()));
    h.ranks.push_back(r);
  }
  auto sameDevices = [](const RankTopo& a, const RankTopo& b) {
    if (a.gpus.size() != b.gpus.size() || a.ports.size() != b.ports.size()) return false;
    for (size_t i = 0; i < a.gpus.size(); i++) {
      if (a.gpus[i].busId != b.gpus[i].busId) return false;
    }
    for (size_t i = 0; i < a.ports.size(); i++) {
      if (a.ports[i].name != b.ports[i].name || a.ports[i].port != b.ports[i].port) return false;
    }
    return true;
  };
  for (const Host& h : s.hosts) {
    const RankTopo& first = s.ranks[h.ranks[0]];
    std::map<int, int> gpuUser;
    for (int r : h.ranks) {
      const RankTopo& t = s.ranks[r];
      if (!sameDevices(first, t)) {
        s.warnings.push_back(
            fmt::format("host {}: rank {} sees {} GPU(s) and {} port(s), rank {} sees {} and {}; "
                        "rank {}'s view "
                        "is used",
                        h.id, r, t.gpus.size(), t.ports.size(), h.ranks[0], first.gpus.size(),
                        first.ports.size(), h.ranks[0]));
      }
      if (t.cudaDev >= 0) {
        auto [it, inserted] = gpuUser.emplace(t.cudaDev, r);
        if (!inserted) {
          s.warnings.push_back(fmt::format("host {}: ranks {} and {} both use CUDA device {}", h.id,
                                           it->second, r, t.cudaDev));
        }
      }
    }
  }
  // Rails: port i of each host.
  size_t maxPorts = 0;
  for (const Host& h : s.hosts) maxPorts = std::max(maxPorts, s.ranks[h.ranks[0]].ports.size());
  s.rails.assign(maxPorts, std::vector<int>(s.hosts.size(), -1));
  const RankTopo& ref = s.ranks[s.hosts[0].ranks[0]];
  for (size_t h = 0; h < s.hosts.size(); h++) {
    const RankTopo& t = s.ranks[s.hosts[h].ranks[0]];
    for (size_t i = 0; i < t.ports.size(); i++) s.rails[i][h] = static_cast<int>(i);
    if (t.ports.size() != ref.ports.size()) {
      s.railsUniform = false;
      continue;
    }
    for (size_t i = 0; i < t.ports.size(); i++) {
      if (t.ports[i].speedGBs != ref.ports[i].speedGBs) s.railsUniform = false;
    }
  }
  return s;
}

}  // namespace loom::topo
