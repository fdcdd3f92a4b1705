#include "topology/paths.h"

#include <queue>
#include <tuple>

namespace loom::topo {

const char* pathTypeName(PathType type) {
  static const char* const kNames[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB",
                                       "P2C", "PXN", "PHB", "SYS", "NET", "DIS"};
  return kNames[static_cast<int>(type)];
}

namespace {

bool isDevice(NodeType t) {
  return t == NodeType::kCpu || t == NodeType::kGpu || t == NodeType::kNic || t == NodeType::kNet;
}

// true when a is a better path than b.
bool better(const Path& a, const Path& b) {
  return std::make_tuple(a.type, -a.bw, a.hops) < std::make_tuple(b.type, -b.bw, b.hops);
}

PathType hopType(const Graph& g, int u, int v, const Link& l, bool viaGpu) {
  NodeType tu = g.node(u).type, tv = g.node(v).type;
  switch (l.type) {
    case LinkType::kLoc:
      return PathType::kLoc;
    case LinkType::kNvl:
      return viaGpu ? PathType::kNvb : PathType::kNvl;
    case LinkType::kC2c:
      return PathType::kC2c;
    case LinkType::kSys:
      return PathType::kSys;
    case LinkType::kNet:
      return PathType::kLoc;
    case LinkType::kPci:
      if (tu == NodeType::kCpu || tv == NodeType::kCpu) return PathType::kPhb;
      if (tu == NodeType::kPciSwitch && tv == NodeType::kPciSwitch) return PathType::kPxb;
      return PathType::kPix;
  }
  return PathType::kDis;
}

std::vector<Path> fromSource(const Graph& g, int s) {
  const int n = g.size();
  std::vector<Path> best(n);
  std::vector<bool> done(n, false);
  // Whether the best path to a node arrived over NVLink (a GPU may be crossed only then).
  std::vector<bool> viaNvl(n, false);
  best[s] = Path{PathType::kLoc, 1e12f, 0};
  auto cmp = [](const std::pair<Path, int>& a, const std::pair<Path, int>& b) {
    return better(b.first, a.first);
  };
  std::priority_queue<std::pair<Path, int>, std::vector<std::pair<Path, int>>, decltype(cmp)> q(
      cmp);
  q.push({best[s], s});
  while (!q.empty()) {
    auto [p, u] = q.top();
    q.pop();
    if (done[u]) continue;
    done[u] = true;
    NodeType tu = g.node(u).type;
    if (u != s) {
      if (tu == NodeType::kNet) continue;
      if (tu == NodeType::kGpu && !viaNvl[u]) continue;
    }
    for (int li : g.linksFrom(u)) {
      const Link& l = g.links()[li];
      int v = l.to;
      if (done[v]) continue;
      // Through a NIC only to its own ports; through a GPU only NVLink to NVLink.
      if (u != s && tu == NodeType::kNic && l.type != LinkType::kNet) continue;
      if (u != s && tu == NodeType::kGpu && l.type != LinkType::kNvl) continue;
      bool viaGpu = u != s && tu == NodeType::kGpu;
      Path np;
      np.type = std::max(p.type, hopType(g, u, v, l, viaGpu));
      np.bw = std::min(p.bw, static_cast<float>(l.bw));
      np.hops = p.hops + 1;
      if (best[v].type == PathType::kDis || better(np, best[v])) {
        best[v] = np;
        viaNvl[v] = l.type == LinkType::kNvl;
        q.push({np, v});
      }
    }
  }
  best[s].bw = 0;  // a device to itself: LOC, no link
  return best;
}

}  // namespace

Paths Paths::compute(const Graph& graph) {
  Paths p;
  p.graph_ = &graph;
  p.row_.assign(graph.size(), -1);
  for (int i = 0; i < graph.size(); i++) {
    if (!isDevice(graph.node(i).type)) continue;
    p.row_[i] = static_cast<int>(p.paths_.size());
    p.paths_.push_back(fromSource(graph, i));
  }
  return p;
}

const Path& Paths::get(int from, int to) const {
  static const Path kNone;
  if (from < 0 || from >= static_cast<int>(row_.size()) || row_[from] < 0) return kNone;
  if (to < 0 || to >= static_cast<int>(row_.size())) return kNone;
  return paths_[row_[from]][to];
}

int Paths::nearestOf(int gpu, NodeType type) const {
  int bestNode = -1;
  for (int i = 0; i < graph_->size(); i++) {
    if (graph_->node(i).type != type) continue;
    const Path& p = get(gpu, i);
    if (p.type == PathType::kDis) continue;
    if (bestNode < 0 || std::make_pair(p.type, -p.bw) <
                            std::make_pair(get(gpu, bestNode).type, -get(gpu, bestNode).bw)) {
      bestNode = i;
    }
  }
  return bestNode;
}

int Paths::nearestNic(int gpu) const { return nearestOf(gpu, NodeType::kNic); }
int Paths::nearestNet(int gpu) const { return nearestOf(gpu, NodeType::kNet); }

bool Paths::gdrAllowed(int gpu, int net) const {
  const Node& g = graph_->node(gpu);
  const Node& n = graph_->node(net);
  if (g.type != NodeType::kGpu || n.type != NodeType::kNet || !g.gdr || !n.gdr) return false;
  return get(gpu, net).type <= PathType::kPxb;
}

bool Paths::p2pAllowed(int a, int b) const {
  PathType t = get(a, b).type;
  if (t <= PathType::kPxb) return true;
  if (t > PathType::kSys) return false;
  bool amd = false;
  for (int c : graph_->nodesOfType(NodeType::kCpu)) amd |= graph_->node(c).vendor == "AuthenticAMD";
  return amd && graph_->count(NodeType::kGpu) <= 2;
}

}  // namespace loom::topo
