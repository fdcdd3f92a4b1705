// What loom-topo shows of a topology: a view computed once from the graph and its paths, then
// written as text (summary, per-GPU affinity, path-type matrix), JSON or Graphviz DOT.
#pragma once

#include <string>
#include <vector>

#include "topology/discover.h"
#include "topology/graph.h"
#include "topology/paths.h"

namespace loom::topotool {

struct Input {
  const topo::Graph* graph = nullptr;
  // Discovery's host facts; null when the topology came from a file.
  const topo::HostInfo* host = nullptr;
  std::string source;  // "discovered", "file <path>"
};

std::string textReport(const Input& in, const topo::Paths& paths);
std::string jsonReport(const Input& in, const topo::Paths& paths);
std::string dotGraph(const Input& in);

// "0-3,8,10-11"
std::string cpuRanges(const std::vector<int>& cpus);

}  // namespace loom::topotool
