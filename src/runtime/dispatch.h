// Dispatch: the one place that decides what runs for a call. A pure function from the call's shape
// (collective, count, datatype, op, root, placement, whether it is one of several in a group, the
// memory kind of each buffer) and the communicator's facts (how its ranks are laid out, which
// intra-host paths its transports offer, its cost model, its tuning table and algorithm filter) to
// one Decision: the path, the algorithm, the predicted time, and where the choice came from.
//
// Each path makes an offer, as UCC's score table does: whether it can take the call (and why not),
// and at what price.
//   - low-latency: the shared-memory flag exchange for small calls of a one-host communicator
//     (src/runtime/low_latency.h). A protocol, as NCCL's LL is: where it is eligible it runs
//     (LOOM_SHM_LL_MAX bounds it); its price is shown for comparison.
//   - one-pass: every rank reduces or copies its slice straight from and into its peers' buffers
//     (src/runtime/one_pass.h), where the planner chose "direct" or the model prices it below the
//     planner's choice. The buffers' reach is known only once the ranks have exchanged them, so
//     the decision is "try the one pass, else run `algorithm`"; the fallback is taken together by
//     every rank.
//   - schedule: the planner's algorithm (model, tuning file, filter, or the fixed rule with
//     LOOM_PLANNER=0), lowered and run by the executor over the communicator's transport table.
// Every rank must reach the same decision: the inputs are the same on every rank (the call's
// shape, the exchanged topology, parameters set alike). The memory kinds only exclude paths that
// cannot take a kind; host memory and loomMemAlloc memory are taken by every path alike, so ranks
// whose buffers differ in that way still decide the same.
//
// loomCommPlanInfo, loom-perf --plan, the PLAN log line and the runtime all read this Decision.
// Pure: no state is read or changed; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algo_filter.h"
#include "algorithms/cost_model.h"
#include "algorithms/planner.h"
#include "loom/loom.h"
#include "src/core/collective.h"
#include "src/core/dtype.h"
#include "src/core/memory_kind.h"
#include "src/core/status.h"

namespace loom {

enum class Path : uint8_t { kLowLatency, kOnePass, kSchedule };
// "low-latency", "one-pass", "schedule": the names loomPlanInfo_t.path, logs and docs use.
const char* pathName(Path p);

// The memory kinds the low-latency exchange and the one pass take: host memory (the CPU copies and
// reduces it). The schedule path takes what the communicator's transports and its executor take
// (DispatchFacts::scheduleKinds).
inline MemKindSet pathAccepts(Path) { return kHostKinds; }  // the CPU copies and reduces it

// The call, as every rank sees it.
struct CallShape {
  CollKind coll = CollKind::kAllReduce;
  size_t count = 0;  // as the C call takes it (collective.h)
  loomDataType_t dtype = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = 0;
  bool inPlace = false;
  bool grouped = false;  // one of several calls of a group: they run together on schedules
  MemKind sendKind = MemKind::kHost;
  MemKind recvKind = MemKind::kHost;
};

// The communicator's facts dispatch reads (Comm::dispatchFacts builds them per call: parameters
// may be reloaded between calls).
struct DispatchFacts {
  int nranks = 1;
  bool allLocal = false;      // every rank shares this host and its shared memory
  size_t llMaxBytes = 0;      // the low-latency exchange's largest contribution (0: none)
  bool onePassOn = false;     // LOOM_SHM_MAPPED, and the exchange's buffers hold its record
  bool onePassReach = false;  // every pair of processes reaches the other's buffers
  bool oneProcess = false;    // every rank is a thread of one process
  bool singleCopy = false;    // LOOM_SHM_SINGLE_COPY >= 1
  size_t directMaxBytes = 0;  // LOOM_SHM_DIRECT_MAX
  size_t rdMaxBytes = 0;      // LOOM_ALLREDUCE_RD_MAX (the fixed rule)
  // What the schedule path takes: the kinds every transport of the communicator's table accepts
  // (net::Properties::ptrSupport), within what its executor's copies and reductions take.
  MemKindSet scheduleKinds = kHostKinds;
  const AlgoFilter* filter = nullptr;    // LOOM_ALGO or loomCommSetAlgo (never null)
  const CostMachine* machine = nullptr;  // the cost model's machine (null: no model)
  // The planner's choice for a call under a filter (Comm::planFor caches Planner::choose); empty:
  // the fixed rule (LOOM_PLANNER=0, or no model could be built).
  std::function<Result<std::shared_ptr<const Plan>>(const CollArgs& args, size_t elemSize,
                                                    const AlgoFilter& filter)>
      plan;
  // Compute the schedule's plan even when the low-latency exchange wins (loomCommPlanInfo); the
  // calls themselves skip that work.
  bool explain = false;
  // Fill Decision::offers (with explain, or for the PLAN log); the calls skip that work.
  bool detail = false;
};

struct PathOffer {
  Path path = Path::kSchedule;
  bool eligible = false;
  double seconds = -1;  // the model's price (< 0: not priced)
  std::string why;      // why not eligible, or what decided
};

struct Decision {
  Path path = Path::kSchedule;
  // The schedule: what kSchedule runs and what kOnePass falls back to ("p2p" for Send/Recv).
  // Empty on the low-latency path unless facts.explain.
  std::string algorithm;
  double predictedSec = -1;  // the chosen path's price (< 0: not priced)
  double scheduleSec = -1;   // the schedule's price
  // Where the algorithm came from: "model", "tuning" (a LOOM_TUNING_FILE entry), "filter" (the
  // filter left only it), "rule" (LOOM_PLANNER=0, Send/Recv).
  const char* source = "";
  // The planner's plan (every registered algorithm, priced where allowed); null with the rule.
  std::shared_ptr<const Plan> plan;
  std::vector<PathOffer> offers;  // one per path, in Path order (with facts.explain or .detail)
  // The one pass: tried only while cheaper than onePassLimitSec (< 0: no limit) at the price of
  // the buffers it finds; onePassPlainSec is that price for plain buffers of other processes
  // (process_vm_readv/writev), onePassPlain whether it runs on those.
  double onePassLimitSec = -1;
  double onePassPlainSec = -1;
  bool onePassPlain = false;
};

// The decision for one call. Errors: a buffer kind no path accepts, a filter that leaves the
// collective no algorithm, an algorithm that cannot be priced or built.
Result<Decision> dispatch(const CallShape& call, const DispatchFacts& facts);

// What the planner prices for a call: the same on every rank. A Broadcast or Reduce is in place
// or not on its root only (the other ranks pass no buffer to compare), so it is priced out of
// place everywhere.
CollArgs planArgsOf(const CallShape& call, int nranks);

// The model's time for the one pass of call on machine: each rank's reads and writes of its
// peers' buffers at the copy speed (shared by an oversubscribed host's ranks), plus two flag
// rounds; cma: some buffers are reached through process_vm_readv/writev. < 0 without a model.
double onePassSeconds(const CostMachine& machine, const CallShape& call, int nranks, bool cma);

// The low-latency exchange's offer, the first dispatch() asks: true when it takes call (then
// dispatch() decides Path::kLowLatency). The runtime asks it first for a call outside a group, so
// that the small calls the exchange takes pay nothing else (no Decision is built).
// (Inline, with lowLatencyBytes: every small call asks it.)
inline bool lowLatencyTakes(const CallShape& call, const DispatchFacts& facts);

// The bytes each rank contributes to the low-latency exchange for call (the root's for a
// Broadcast, whose size decides for every rank).
inline size_t lowLatencyBytes(const CallShape& call, int rank, int nranks) {
  if (!collUsesInput(call.coll, rank, call.root, false)) return 0;
  return collCounts(call.coll, call.count, nranks).input * dataTypeSize(call.dtype);
}

inline bool lowLatencyTakes(const CallShape& call, const DispatchFacts& f) {
  const MemKindSet ok = pathAccepts(Path::kLowLatency);
  return f.allLocal && f.nranks >= 2 && !call.grouped && call.count > 0 &&
         call.coll != CollKind::kSendRecv && accepts(ok, call.sendKind) &&
         accepts(ok, call.recvKind) && lowLatencyBytes(call, call.root, f.nranks) <= f.llMaxBytes;
}

// One line for the PLAN log: path, algorithm, source, price and every offer.
std::string describeDecision(const Decision& d);

}  // namespace loom
