// The executor: runs lowered schedules (pieces with dependencies) over the network transport. It
// knows no algorithm by name. Several operations, on one or several communicators, run together
// in one progress loop (a group); on each communicator they are posted in issue order, so sends
// and receives between two ranks match in the order the user issued them.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/algo_filter.h"
#include "algorithms/schedule.h"
#include "loom/loom.h"
#include "src/core/status.h"

namespace loom {

class Comm;

// One operation as the user issued it (already validated).
struct OpArgs {
  CollKind coll = CollKind::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  loomDataType_t dtype = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = 0;
  int peer = -1;        // kSendRecv: the peer
  bool isSend = false;  // kSendRecv: send (true) or receive
  bool inPlace = false;
  // The datatype and op exactly as the C caller passed them, before validation: a C caller may pass
  // any int, which C++ must not load as the enum type (it would be undefined behaviour).
  int rawDtype = 0;
  int rawOp = 0;
};

// A hash of what every rank must agree on for a collective: kind, count, datatype, and the op and
// root where they matter. Ranks compare it to detect mismatched calls.
uint64_t opSignature(const OpArgs& op);

// A lowered schedule with its dependency graph in CSR form, shared by every call with the same
// shape. Immutable once built.
struct LoweredPlan {
  CollArgs args;
  std::string algorithm;
  BufferLayout layout;
  LoweredSchedule lowered;
  std::vector<uint32_t> depCount;         // per piece: number of deps
  std::vector<uint32_t> dependentsStart;  // CSR: dependents of piece i are
  std::vector<uint32_t> dependents;       //   dependents[dependentsStart[i] .. [i+1])
  bool touchesOutput = false;
  bool touchesInput = false;
};

// Per-communicator cache of lowered plans (LRU).
class PlanCache {
 public:
  // layout: where the ranks live (Comm::rankLayout; null: one host), part of the cache key.
  // allLocal: every rank shares this host's shared memory (Comm::allLocal).
  Result<std::shared_ptr<const LoweredPlan>> get(const OpArgs& op, int rank, int nranks,
                                                 const std::shared_ptr<const RankLayout>& layout,
                                                 const std::string& algorithm, size_t pieceBytes);

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const LoweredPlan>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

// The algorithm for op on comm: the planner's choice among what LOOM_ALGO allows (with
// LOOM_PLANNER=0, a fixed size rule). Every rank derives the same from the same arguments, the
// exchanged topology and parameters.
Result<std::string> chooseAlgorithm(Comm& comm, const OpArgs& op);
// What the planner prices for op: the same on every rank (see the Broadcast/Reduce note).
CollArgs planArgsOf(const Comm& comm, const OpArgs& op);
// The algorithm filter in force on comm: loomCommSetAlgo's, else LOOM_ALGO's (parsed once per
// distinct value; an error names a bad spec).
Result<std::shared_ptr<const AlgoFilter>> currentAlgoFilter(const Comm& comm);

// True when the byte ranges [a, a+na) and [b, b+nb) share a byte (null or empty ranges never do).
bool rangesOverlap(const void* a, size_t na, const void* b, size_t nb);

struct QueuedOp {
  Comm* comm = nullptr;
  OpArgs args;
};

// Runs the ops to completion (or failure, abort, or LOOM_TIMEOUT without progress). On failure the
// communicator involved is marked failed (Comm::fail) and the first error is returned.
Status executeOps(const std::vector<QueuedOp>& ops);

}  // namespace loom
