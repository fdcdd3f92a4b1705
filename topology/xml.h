// NCCL topology XML (version 1: NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE) import and export.
// Import accepts every quirk of real dumps (see ../shared/reference/topology-xml.md) and rejects
// other dialects (RCCL's version 2, <xgmi>) and malformed files with kInvalidArgument and the line.
// There is no limit on the number of nodes. Export writes XML that NCCL reads; importing what
// export wrote gives the same graph (diffGraphs() is empty).
#pragma once

#include <string>
#include <string_view>

#include "src/core/status.h"
#include "topology/graph.h"

namespace loom::topo {

// `source` names the input in error messages ("p5.xml line 12: ...").
Result<Graph> importXmlString(std::string_view text, const std::string& source = "<string>");
Result<Graph> importXmlFile(const std::string& path);

std::string exportXmlString(const Graph& graph);
Status exportXmlFile(const Graph& graph, const std::string& path);

// Limits that keep hostile input from exhausting the stack or memory.
constexpr int kMaxXmlDepth = 64;
constexpr size_t kMaxXmlBytes = 64u << 20;

}  // namespace loom::topo
