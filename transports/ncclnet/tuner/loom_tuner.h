// Loom's NCCL tuner: for each call NCCL asks about, the (algorithm, protocol) of least predicted
// time by loom-sim's model of NCCL's algorithms on this communicator's ranks and nodes (the
// fabric's view of NCCL's tuning model, algorithms/nccl_model.h), or a measured table's row where
// one matches (LOOM_TUNER_FILE). Only combinations NCCL offers are chosen; anything it cannot
// judge (no machine, an unknown collective, nothing priced) is left to NCCL, and each decision
// carries its reason for NCCL's log.
//
// The machine: LOOM_TUNER_MACHINE (a loom-sim built-in or an NCCL topology file), else
// NCCL_TOPO_FILE, else the machine Loom discovers where NCCL runs; GPUs per node and nodes are
// NCCL's. Thread-safe after create (decide is const).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/nccl_model.h"
#include "src/core/status.h"
#include "transports/ncclnet/tuner/tuner_table.h"

namespace loom {
namespace tuner {

struct Decision {
  bool decided = false;  // false: leave the call to NCCL
  NcclAlgo algo = NcclAlgo::kRing;
  NcclProto proto = NcclProto::kSimple;
  int channels = -1;  // -1: NCCL's count
  std::string why;    // for the log: the table row, or the model's costs compared
};

class Tuner {
 public:
  // nRanks and nNodes as NCCL gives them. `machine` null: resolved from the parameters above.
  // constants: NCCL's tuning constants (null: NCCL 2.28's). Never fails for want of a machine:
  // the tuner then decides nothing but the table's rows and says why (notes()).
  static std::unique_ptr<Tuner> create(size_t nRanks, size_t nNodes, const NodeSpec* machine,
                                       std::vector<TableRow> table,
                                       const NcclConstants* constants = nullptr);

  // offered(a, p): NCCL would run that combination (its cost entry is not -1).
  Decision decide(CollKind coll, uint64_t bytes, int numPipeOps, int regBuff,
                  const std::function<bool(NcclAlgo, NcclProto)>& offered) const;

  // What create found: the machine and model, or why there is none.
  const std::string& notes() const { return notes_; }
  bool hasModel() const { return model_ != nullptr; }
  const NcclModel* model() const { return model_.get(); }

 private:
  size_t nRanks_ = 0, nNodes_ = 0;
  std::unique_ptr<NcclModel> model_;
  std::vector<TableRow> table_;
  std::string notes_;
};

// The machine the plugin prices on (LOOM_TUNER_MACHINE, NCCL_TOPO_FILE, discovery), with
// `gpusPerNode` GPUs per node.
Result<NodeSpec> resolveMachine(int gpusPerNode);

// NCCL's collective of an ncclFunc_t value (0 broadcast .. 4 allreduce); false for others.
bool collOfNcclFunc(int func, CollKind* out);

}  // namespace tuner
}  // namespace loom
