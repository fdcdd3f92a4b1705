#include "transports/ncclnet/tuner/loom_tuner.h"

#include <fmt/format.h>

#include "algorithms/cluster_file.h"
#include "src/core/params.h"
#include "topology/discover.h"

namespace loom {
namespace tuner {

bool collOfNcclFunc(int func, CollKind* out) {
  switch (func) {
    case 0:
      *out = CollKind::kBroadcast;
      return true;
    case 1:
      *out = CollKind::kReduce;
      return true;
    case 2:
      *out = CollKind::kAllGather;
      return true;
    case 3:
      *out = CollKind::kReduceScatter;
      return true;
    case 4:
      *out = CollKind::kAllReduce;
      return true;
    default:
      return false;
  }
}

Result<NodeSpec> resolveMachine(int gpusPerNode) {
  Machine m;
  if (params::kTunerMachine.isSet() && !params::kTunerMachine.str().empty()) {
    LOOM_ASSIGN(m, loadMachine(params::kTunerMachine.str()));
  } else if (const char* f = std::getenv("NCCL_TOPO_FILE"); f != nullptr && *f != '\0') {
    LOOM_ASSIGN(m, loadMachine(f));
  } else {
    std::string source;
    LOOM_ASSIGN(topo::Graph g, topo::loadLocalTopology(nullptr, &source));
    LOOM_ASSIGN(m, machineFromGraph(g, source == "discovered" ? "this machine" : source));
  }
  if (gpusPerNode > 0) m.node.gpus = gpusPerNode;
  return m.node;
}

std::unique_ptr<Tuner> Tuner::create(size_t nRanks, size_t nNodes, const NodeSpec* machine,
                                     std::vector<TableRow> table, const NcclConstants* constants) {
  auto t = std::unique_ptr<Tuner>(new Tuner());
  t->nRanks_ = nRanks;
  t->nNodes_ = nNodes;
  t->table_ = std::move(table);
  if (nRanks < 2 || nNodes < 1 || nNodes > nRanks) {
    t->notes_ = fmt::format("{} ranks on {} nodes: nothing to tune", nRanks, nNodes);
    return t;
  }
  const int perNode = static_cast<int>((nRanks + nNodes - 1) / nNodes);
  Result<NodeSpec> node = machine ? Result<NodeSpec>(*machine) : resolveMachine(perNode);
  if (!node.isOk()) {
    t->notes_ = "no machine to model (" + node.status().message() + "): NCCL's own choices stand" +
                (t->table_.empty() ? "" : ", except where LOOM_TUNER_FILE has a row");
    return t;
  }
  ClusterSpec c;
  c.node = node.value();
  c.node.gpus = perNode;
  c.nodes = static_cast<int>(nNodes);
  if (c.nodes > 2048) c.fabric.tiers = 3;
  Result<NcclModel> m = NcclModel::build(c, constants);
  if (!m.isOk()) {
    t->notes_ = "cannot model " + c.node.name + ": " + m.status().message();
    return t;
  }
  t->model_ = std::make_unique<NcclModel>(std::move(m).value());
  t->notes_ = fmt::format("{} ranks on {} node(s) of {} ({}), {} table row(s)", nRanks, nNodes,
                          c.node.name, c.node.description, t->table_.size());
  return t;
}

Decision Tuner::decide(CollKind coll, uint64_t bytes, int numPipeOps, int regBuff,
                       const std::function<bool(NcclAlgo, NcclProto)>& offered) const {
  Decision d;
  for (const TableRow& r : table_) {
    if (!r.matches(coll, bytes, static_cast<int>(nNodes_), static_cast<int>(nRanks_), numPipeOps,
                   regBuff))
      continue;
    if (!offered(r.algo, r.proto)) {
      d.why = fmt::format("table line {} asks for {}/{}, which NCCL does not offer here", r.line,
                          ncclAlgoName(r.algo), ncclProtoName(r.proto));
      continue;
    }
    d.decided = true;
    d.algo = r.algo;
    d.proto = r.proto;
    d.channels = r.channels;
    d.why = fmt::format("table line {}", r.line);
    return d;
  }
  if (!model_) {
    if (d.why.empty()) d.why = notes_;
    return d;
  }
  NcclChoice best;
  if (!model_->choosePredicted(coll, bytes, offered, &best)) {
    d.why = "the model prices none of the combinations NCCL offers";
    return d;
  }
  NcclChoice nccl;
  std::string against;
  if (model_->choose(coll, bytes, &nccl) && (nccl.algo != best.algo || nccl.proto != best.proto))
    against =
        fmt::format("; NCCL's model would take {}/{} (predicted {:.1f} us)",
                    ncclAlgoName(nccl.algo), ncclProtoName(nccl.proto), nccl.time.predictedUs);
  d.decided = true;
  d.algo = best.algo;
  d.proto = best.proto;
  d.why = fmt::format("model: {}/{} predicted {:.1f} us{}", ncclAlgoName(best.algo),
                      ncclProtoName(best.proto), best.time.predictedUs, against);
  return d;
}

}  // namespace tuner
}  // namespace loom
