// Measured choices for the NCCL tuner plugin: NCCL's example tuner's CSV format (so that existing
// nccl_tuner.conf files work), one row per line,
//   collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff]
// collective: broadcast, reduce, allgather, reducescatter, allreduce; algorithm: tree, ring,
// collnet_direct, collnet_chain, nvls, nvls_tree, pat; protocol: ll, ll128, simple; -1 in
// channels keeps NCCL's channel count, in nNodes, nRanks, numPipeOps and regBuff matches any.
// '#' comments and empty lines are skipped. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/nccl_model.h"
#include "src/core/collective.h"
#include "src/core/status.h"

namespace loom {
namespace tuner {

struct TableRow {
  CollKind coll = CollKind::kAllReduce;
  uint64_t minBytes = 0, maxBytes = 0;
  NcclAlgo algo = NcclAlgo::kRing;
  NcclProto proto = NcclProto::kSimple;
  int channels = -1;
  int nNodes = -1, nRanks = -1, numPipeOps = -1, regBuff = -1;
  int line = 0;  // in the file, for the log

  bool matches(CollKind c, uint64_t bytes, int nodes, int ranks, int pipeOps, int reg) const;
};

// The rows of a table. Errors (kInvalidArgument, naming `source` and the line): a wrong field
// count, an unknown collective, algorithm or protocol, a number that is not one, min > max.
Result<std::vector<TableRow>> parseTable(const std::string& text, const std::string& source);
Result<std::vector<TableRow>> loadTable(const std::string& path);

}  // namespace tuner
}  // namespace loom
