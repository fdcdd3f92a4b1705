#include "src/runtime/dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/core/dtype.h"

namespace loom {

namespace {

// Peers reached through process_vm_readv/writev: time over the mapped one pass, per rank count.
// The (n-1)/n of a rank's traffic that is its peers' moves `slowdown` times slower than memcpy
// (page pinning and the kernel's copy: measured at init, KernelSpeeds::cmaSlowdown; 2.2 where
// unknown, which gave the 1.6 measured end to end at 2 ranks on a 2-core Xeon VM), and the pinned
// pages' reference counts shared by n-1 readers slow it further as ranks grow (that VM: 2.7-4.9,
// median 3.6, at 4 ranks). On a 2-core EPYC VM the calls took 5.5x memcpy's time, and the one
// pass through them lost to two copies through shared memory (5.2 GB/s against 8.6 at 64 MiB).
double cmaFactor(int n, double slowdown) {
  const double s = slowdown > 0 ? slowdown : 2.2;
  const double dn = static_cast<double>(n);
  return (1 + (dn - 1) / dn * (s - 1)) * (1 + 0.69 * (dn - 2));
}

// The fixed rule (LOOM_PLANNER=0): communicators whose ranks all share a host use the direct
// algorithms up to LOOM_SHM_DIRECT_MAX; otherwise small AllReduces use recursive doubling and the
// rest the generator registered first for the collective.
std::string ruleChoice(const CallShape& call, const DispatchFacts& f) {
  size_t bytes = call.count * dataTypeSize(call.dtype);
  if (f.allLocal && f.nranks > 1 && bytes <= f.directMaxBytes && findAlgorithm(call.coll, "direct"))
    return "direct";
  if (call.coll == CollKind::kAllReduce && f.nranks > 1 && bytes <= f.rdMaxBytes) return "rd";
  const AlgorithmInfo* a = defaultAlgorithm(call.coll);
  return a ? a->name : "";
}

// The low-latency exchange's price: each rank copies its contribution in, then reads what its
// output needs from every rank's buffer (one flag round).
double lowLatencySeconds(const CostMachine& m, const CallShape& call, int n) {
  if (m.memBytesPerSec <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const CollCounts c = collCounts(call.coll, call.count, n);
  double reads = static_cast<double>(c.output) * es;
  if (collReduces(call.coll)) reads *= n;
  return m.intra.alphaSec + (static_cast<double>(c.input) * es + reads) / m.memBytesPerSec;
}

}  // namespace

const char* pathName(Path p) {
  switch (p) {
    case Path::kLowLatency:
      return "low-latency";
    case Path::kOnePass:
      return "one-pass";
    case Path::kSchedule:
      return "schedule";
  }
  return "unknown";
}

CollArgs planArgsOf(const CallShape& call, int nranks) {
  CollArgs a;
  a.coll = call.coll;
  a.nranks = nranks;
  a.count = call.count;
  a.root = call.root;
  a.inPlace = call.inPlace && !collRooted(call.coll);
  return a;
}

double onePassSeconds(const CostMachine& m, const CallShape& call, int n, bool cma) {
  if (m.memBytesPerSec <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const double c = static_cast<double>(call.count), dn = static_cast<double>(n);
  const double slice = std::ceil(c / dn) * es;  // one rank's share of a count-element buffer
  double reads = 0, writes = 0;                 // by the busiest rank
  switch (call.coll) {
    case CollKind::kAllReduce:
      reads = writes = dn * slice;
      break;
    case CollKind::kReduce:
      reads = dn * slice;
      writes = slice;
      break;
    case CollKind::kReduceScatter:
      reads = dn * c * es;
      writes = c * es;
      break;
    case CollKind::kAllGather:
      reads = c * es;
      writes = dn * c * es;
      break;
    case CollKind::kBroadcast:
      reads = slice;
      writes = dn * slice;
      break;
    case CollKind::kAllToAll:
      reads = writes = dn * c * es;
      break;
    default:
      return -1;
  }
  // A copy of b bytes (b read, b written) takes b / memBytesPerSec: traffic moves at twice that.
  // Every rank works at once, so ranks of an oversubscribed host split its cores. Peers reached
  // through process_vm_readv/writev cost more (cmaFactor).
  double perRank = m.memBytesPerSec;
  if (!m.hostMemBytesPerSec.empty() && m.hostMemBytesPerSec[0] > 0)
    perRank = std::min(perRank, m.hostMemBytesPerSec[0] / dn);
  double seconds = (reads + writes) / (2 * perRank);
  if (cma) seconds *= cmaFactor(n, m.cmaSlowdown);
  return seconds + 2 * m.intra.alphaSec;
}

Result<Decision> dispatch(const CallShape& call, const DispatchFacts& f) {
  Decision d;
  if (!f.filter) return LOOM_ERROR(kInternal, "dispatch without an algorithm filter");
  const int n = f.nranks;
  const size_t es = dataTypeSize(call.dtype);
  const bool p2p = call.coll == CollKind::kSendRecv;
  const bool detail = f.explain || f.detail;
  auto takes = [&](Path p) {
    MemKindSet ok = p == Path::kSchedule ? f.scheduleKinds : pathAccepts(p);
    return accepts(ok, call.sendKind) && accepts(ok, call.recvKind);
  };
  auto kinds = [&] {
    return fmt::format("{} and {} buffers", memKindName(call.sendKind), memKindName(call.recvKind));
  };
  // Why a path shared by the low-latency exchange and the one pass cannot take the call ("" if
  // it can, as far as these common conditions go).
  auto localWhy = [&]() -> const char* {
    if (p2p) return "point-to-point";
    if (!f.allLocal || n < 2) return "the ranks do not all share this host's memory";
    if (call.grouped) return "one of several calls of a group";
    if (call.count == 0) return "empty";
    return "";
  };
  // why is evaluated only with detail: the calls themselves build no strings.
  auto add = [&](Path p, bool eligible, double seconds, auto&& why) {
    if (!detail) return;
    PathOffer o;
    o.path = p;
    o.eligible = eligible;
    o.seconds = seconds;
    o.why = why();
    d.offers.push_back(std::move(o));
  };

  // 1. The low-latency exchange.
  const char* common = localWhy();
  const size_t llBytes = *common ? 0 : lowLatencyBytes(call, call.root, n);
  const bool llKinds = takes(Path::kLowLatency);
  const bool ll = lowLatencyTakes(call, f);
  const double llSec = detail && f.machine && !p2p ? lowLatencySeconds(*f.machine, call, n) : -1;
  add(Path::kLowLatency, ll, llSec, [&]() -> std::string {
    if (ll) return "a protocol: runs where eligible";
    if (*common) return common;
    if (!llKinds) return kinds();
    return fmt::format("{} bytes per rank > LOOM_SHM_LL_MAX {}", llBytes, f.llMaxBytes);
  });
  if (ll && !f.explain) {
    d.path = Path::kLowLatency;
    d.predictedSec = llSec;
    return d;
  }

  // 2. The schedule: the planner's algorithm (or the fixed rule).
  if (!takes(Path::kSchedule))
    return LOOM_ERROR(kInvalidArgument,
                      "{} on {}: no path takes them (the communicator's transports and executor "
                      "move host memory only; device memory needs a CUDA build of Loom)",
                      collName(call.coll), kinds());
  if (p2p) {
    d.algorithm = "p2p";
    d.source = "rule";
  } else if (!f.plan || n < 2) {
    LOOM_ASSIGN(d.algorithm, f.filter->choose(call.coll, ruleChoice(call, f)));
    d.source = "rule";
  } else {
    LOOM_ASSIGN(d.plan, f.plan(planArgsOf(call, n), es, *f.filter));
    d.algorithm = d.plan->algorithm;
    d.scheduleSec = d.plan->predictedSec;
    d.source = d.plan->source;
  }
  const bool priced = !std::strcmp(d.source, "model") || !std::strcmp(d.source, "filter");

  // 3. The one pass over the peers' buffers: where the schedule is "direct" (the one pass is its
  // messageless form), or where the model prefers it, the filter allows "direct", the size is
  // within LOOM_SHM_DIRECT_MAX, single copy is on and every pair of processes can reach each
  // other's buffers.
  const size_t bytes = call.count * es;
  const bool plannedDirect = d.algorithm == "direct";
  const bool opKinds = takes(Path::kOnePass);
  const bool inPlaceA2a = call.coll == CollKind::kAllToAll && call.inPlace;
  const bool opBase = !*common && f.onePassOn && !inPlaceA2a && opKinds;
  const double opSec = opBase && f.machine ? onePassSeconds(*f.machine, call, n, false) : -1;
  const bool opCheaper =
      priced && d.scheduleSec >= 0 && f.singleCopy && bytes <= f.directMaxBytes && f.onePassReach &&
      f.filter->allows(call.coll, "direct") && opSec >= 0 && opSec < d.scheduleSec;
  const bool onePass = opBase && (plannedDirect || opCheaper);
  add(Path::kOnePass, onePass, opSec, [&]() -> std::string {
    if (onePass)
      return plannedDirect ? "the messageless form of direct" : "cheaper than the schedule";
    if (*common) return common;
    if (!f.onePassOn) return "off (LOOM_SHM_MAPPED=0)";
    // In place, an AllToAll's blocks would be overwritten before their owner sent them.
    if (inPlaceA2a) return "an AllToAll in place";
    if (!opKinds) return kinds();
    if (!priced || d.scheduleSec < 0) return "the schedule was not priced by the model";
    if (!f.singleCopy) return "single copy is off (LOOM_SHM_SINGLE_COPY=0)";
    if (bytes > f.directMaxBytes)
      return fmt::format("{} bytes > LOOM_SHM_DIRECT_MAX {}", bytes, f.directMaxBytes);
    if (!f.onePassReach) return "some process cannot reach another's buffers";
    if (!f.filter->allows(call.coll, "direct")) return "the filter excludes direct";
    return "dearer than the schedule";
  });
  add(Path::kSchedule, true, d.scheduleSec,
      [&] { return d.algorithm + " by " + std::string(d.source); });
  if (onePass) {
    // The schedule's price bounds the one pass where it must reach buffers through
    // process_vm_readv/writev, as when loom-tune measured "direct" forced.
    d.onePassLimitSec = d.scheduleSec;
    d.onePassPlainSec = f.machine ? onePassSeconds(*f.machine, call, n, !f.oneProcess) : -1;
    d.onePassPlain =
        d.onePassLimitSec < 0 || (d.onePassPlainSec >= 0 && d.onePassPlainSec < d.onePassLimitSec);
  }
  if (ll) {
    d.path = Path::kLowLatency;
    d.predictedSec = llSec;
  } else if (onePass) {
    d.path = Path::kOnePass;
    d.predictedSec = opSec;
  } else {
    d.path = Path::kSchedule;
    d.predictedSec = d.scheduleSec;
  }
  return d;
}

std::string describeDecision(const Decision& d) {
  std::string s = fmt::format("{}", pathName(d.path));
  if (!d.algorithm.empty()) s += fmt::format(" {} by {}", d.algorithm, d.source);
  if (d.plan && std::strcmp(d.plan->pricing, "simulation") != 0)
    s += fmt::format(" (priced by {})", d.plan->pricing);
  if (d.predictedSec >= 0) s += fmt::format(", predicted {:.1f} us", d.predictedSec * 1e6);
  std::string offers;
  for (const PathOffer& o : d.offers) {
    offers += fmt::format("; {} {}", pathName(o.path), o.eligible ? "eligible" : "no");
    if (o.seconds >= 0) offers += fmt::format(" {:.1f} us", o.seconds * 1e6);
    if (!o.why.empty()) offers += " (" + o.why + ")";
  }
  std::string cands;
  for (const PlanCandidate& c : d.plan ? d.plan->candidates : std::vector<PlanCandidate>()) {
    if (!c.allowed)
      cands += fmt::format(" {} (excluded)", c.algorithm);
    else if (c.seconds >= 0)
      cands += fmt::format(" {} {:.1f}", c.algorithm, c.seconds * 1e6);
  }
  if (!cands.empty()) s += "; candidates (us):" + cands;
  return s + offers;
}

}  // namespace loom
