#include "tools/perf/bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/status.h"
#include "tools/perf/check.h"
#include "tools/perf/collectives.h"
#include "tools/perf/device_buffers.h"
#include "tools/perf/report.h"

namespace loom {
namespace perf {
namespace {

Status loomCall(loomResult_t res, const char* what) {
  if (res == loomSuccess) return Status::ok();
  return Status(static_cast<Code>(res), fmt::format("{} failed: {}: {}", what,
                                                    loomGetErrorString(res), loomGetLastError()));
}

struct BufferDeleter {
  bool shared = false;
  void operator()(char* p) const {
    if (shared)
      loomMemFree(p);
    else
      std::free(p);
  }
};
using HostBuffer = std::unique_ptr<char, BufferDeleter>;

// Page-aligned and touched, so that the timed loop does not measure page faults. shared: from
// loomMemAlloc (-R), which peers on the host read by mapping it.
HostBuffer allocBuffer(size_t bytes, bool shared) {
  const size_t kPage = 4096;
  size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  char* p = nullptr;
  if (shared) {
    void* v = nullptr;
    if (loomMemAlloc(&v, rounded) != loomSuccess) return HostBuffer(nullptr, BufferDeleter{true});
    p = static_cast<char*>(v);
  } else {
    p = static_cast<char*>(std::aligned_alloc(kPage, rounded));
  }
  if (p) std::memset(p, 0, rounded);
  return HostBuffer(p, BufferDeleter{shared});
}

// A buffer registered with loomCommRegister (-R, as nccl-tests' -R calls ncclCommRegister),
// deregistered when this goes, which must be before the buffer is freed and before the
// communicator is destroyed.
class Registration {
 public:
  Registration() = default;
  ~Registration() { release(); }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  Status reg(loomComm_t comm, void* p, size_t bytes) {
    release();
    comm_ = comm;
    return loomCall(loomCommRegister(comm, p, bytes, &handle_), "loomCommRegister");
  }
  void release() {
    if (handle_ && loomCommDeregister(comm_, handle_) != loomSuccess)
      std::fprintf(stderr, "loom-perf: loomCommDeregister: %s\n", loomGetLastError());
    handle_ = nullptr;
  }

 private:
  loomComm_t comm_ = nullptr;
  void* handle_ = nullptr;
};

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  char* dot = std::strchr(buf, '.');  // nccl-tests prints the short name
  if (dot) *dot = '\0';
  return buf;
}

std::string cpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t start = line.find_first_not_of(" \t", colon + 1);
        if (start != std::string::npos) return line.substr(start) + ", host memory";
      }
    }
  }
  return "host memory";
}

// Exchanged with loomAllGather to print one line per rank, as nccl-tests gathers them over MPI.
struct WireRankInfo {
  int32_t rank;
  int32_t pid;
  char host[64];
  char cpu[120];
};

class Bench {
 public:
  Bench(const Options& opts, const RankContext& ctx) : opts_(opts), ctx_(ctx) {}

  int run() {
    Status st = runAll();
    if (rowOpen_) print("\n");
    if (!st.isOk()) {
      // A usage error is the same on every rank: rank 0 says it once.
      if (!usageError_ || ctx_.rank == 0)
        std::fprintf(stderr, "loom-perf: rank %d: %s\n", ctx_.rank, st.message().c_str());
      std::fflush(stderr);
      writeReport(st.message());
      return usageError_ ? kExitUsage : kExitLoomError;
    }
    writeReport("");
    return totalWrong_ > 0 ? kExitWrong : 0;
  }

 private:
  Status runAll() {
    const CollInfo& info = collInfo(opts_.coll);
    std::vector<int> roots;
    if (!info.hasRoot) {
      roots.push_back(-1);
    } else if (opts_.root == -1) {
      for (int r = 0; r < ctx_.nranks; ++r) roots.push_back(r);
    } else if (opts_.root >= ctx_.nranks) {
      usageError_ = true;
      return Status(Code::kInvalidArgument,
                    fmt::format("root {} is out of range for {} ranks", opts_.root, ctx_.nranks));
    } else {
      roots.push_back(opts_.root);
    }
    std::vector<loomRedOp_t> ops = opts_.ops;
    if (!info.hasOp) ops = {loomSum};  // printed as "none"
    if (opts_.plan) return printPlan(roots);

    // Allocated like nccl-tests: maxbytes each; every size fits, with room to rotate offsets.
    bufferBytes_ = opts_.maxBytes;
    const bool shared = opts_.localRegister != 0;
    send_ = allocBuffer(bufferBytes_, shared);
    recv_ = allocBuffer(bufferBytes_, shared);
    small_ = allocBuffer(64, false);
    // --mem device (or auto where a GPU is usable): the calls take device buffers of the same
    // size and a stream; the host buffers above are the mirrors that fill and check them.
    if (opts_.mem == "device" || (opts_.mem == "auto" && deviceUnavailable().empty())) {
      if (opts_.mem == "device" && !deviceUnavailable().empty()) {
        usageError_ = true;
        return Status(Code::kInvalidArgument,
                      "--mem device: no usable GPU: " + deviceUnavailable());
      }
      onDevice_ = true;
    }
    if (!send_ || !recv_ || !small_)
      return Status(Code::kSystem, fmt::format("cannot allocate 2 x {} bytes of host memory{}",
                                               bufferBytes_, shared ? " (loomMemAlloc)" : ""));
    if (shared) {
      const size_t bytes = std::max<size_t>(bufferBytes_, 1);
      LOOM_TRY(sendReg_.reg(ctx_.comm, send_.get(), bytes));
      LOOM_TRY(recvReg_.reg(ctx_.comm, recv_.get(), bytes));
    }

    LOOM_TRY(gatherRanks());
    if (onDevice_) {
      LOOM_TRY(dev_.init(ranks_[static_cast<size_t>(ctx_.rank)].device, bufferBytes_)
                   .withContext("--mem device"));
      LOOM_TRY(gatherDevices());
    }
    print(formatHeader(opts_, ranks_));
    for (loomDataType_t type : opts_.types)
      for (loomRedOp_t op : ops)
        for (int root : roots)
          LOOM_TRY(opts_.compare.empty() ? timeTest(type, op, root, info.hasOp)
                                         : compareTest(type, op, root, info.hasOp));

    double avg = busBwCount_ ? busBwSum_ / busBwCount_ : 0;
    print(formatFooter(totalWrong_, avg));
    avgBusBw_ = avg;
    return Status::ok();
  }

  // The collective as loomCommPlanInfo and LOOM_ALGO name it; null for sendrecv.
  struct PlanName {
    CollKind kind;
    loomCollective_t coll;
    const char* spec;
  };
  const PlanName* planName() const {
    static const PlanName kMap[] = {
        {CollKind::kAllReduce, loomCollAllReduce, "allreduce"},
        {CollKind::kAllGather, loomCollAllGather, "allgather"},
        {CollKind::kReduceScatter, loomCollReduceScatter, "reducescatter"},
        {CollKind::kBroadcast, loomCollBroadcast, "broadcast"},
        {CollKind::kReduce, loomCollReduce, "reduce"},
        {CollKind::kAllToAll, loomCollAllToAll, "alltoall"}};
    for (const auto& m : kMap)
      if (m.kind == opts_.coll) return &m;
    return nullptr;
  }

  // --plan: what the planner chooses for each size of the sweep, from rank 0; nothing runs.
  Status printPlan(const std::vector<int>& roots) {
    if (ctx_.rank != 0) return Status::ok();
    const loomCollective_t* coll = planName() ? &planName()->coll : nullptr;
    if (!coll) {
      usageError_ = true;
      return Status(Code::kInvalidArgument, "--plan: sendrecv is point to point (no algorithm)");
    }
    std::string out = fmt::format("# loom-perf --plan: {} on {} ranks (nothing is run)\n#\n",
                                  collTestName(opts_.coll), ctx_.nranks);
    out += fmt::format("# {:>12} {:>12} {:>8} {:>5} {:>16} {:>9} {:>7} {:>13}  {}\n", "size",
                       "count", "type", "root", "path", "algorithm", "source", "predicted(us)",
                       "candidates: predicted us (x: excluded by LOOM_ALGO)");
    for (loomDataType_t type : opts_.types) {
      size_t el = dataTypeSize(type);
      for (int root : roots) {
        for (size_t bytes : sweepSizes(opts_)) {
          CollCounts c = collCounts(opts_.coll, bytes, el, ctx_.nranks);
          loomPlanInfo_t pi;
          LOOM_TRY(loomCall(
              loomCommPlanInfo(ctx_.comm, *coll, c.paramCount, type, root < 0 ? 0 : root, 0, &pi),
              "loomCommPlanInfo"));
          std::string cands;
          for (int i = 0; i < pi.nCandidates; ++i) {
            const loomPlanCandidate_t& k = pi.candidates[i];
            cands += k.allowed ? fmt::format(" {} {:.1f}", k.name, k.predictedUs)
                               : fmt::format(" {} x", k.name);
          }
          out +=
              fmt::format("  {:>12} {:>12} {:>8} {:>5} {:>16} {:>9} {:>7} {:>13.1f} {}\n",
                          std::max(c.sendCount, c.recvCount) * el, c.paramCount, dataTypeName(type),
                          root, pi.path, pi.algorithm, pi.source, pi.predictedUs, cands);
        }
      }
    }
    print(out);
    return Status::ok();
  }

  // Each rank's GPU, for the header (nccl-tests names each rank's device and bus id).
  Status gatherDevices() {
    struct Wire {
      int32_t device;
      char name[92];
      char bus[32];
    };
    const size_t n = static_cast<size_t>(ctx_.nranks);
    HostBuffer mem = allocBuffer(sizeof(Wire) * (n + 1), false);
    Wire* all = reinterpret_cast<Wire*>(mem.get());
    Wire& mine = all[n];
    mine.device = dev_.device();
    std::snprintf(mine.name, sizeof(mine.name), "%s", dev_.name().c_str());
    std::snprintf(mine.bus, sizeof(mine.bus), "%s", dev_.busId().c_str());
    LOOM_TRY(loomCall(loomAllGather(&mine, all, sizeof(Wire), loomUint8, ctx_.comm, nullptr),
                      "loomAllGather (device information)"));
    for (size_t r = 0; r < n; ++r) {
      ranks_[r].device = all[r].device;
      ranks_[r].gpu = std::string(all[r].name, strnlen(all[r].name, sizeof(all[r].name)));
      ranks_[r].busId = std::string(all[r].bus, strnlen(all[r].bus, sizeof(all[r].bus)));
    }
    return Status::ok();
  }

  Status gatherRanks() {
    WireRankInfo mine{};
    mine.rank = ctx_.rank;
    mine.pid = static_cast<int32_t>(getpid());
    std::snprintf(mine.host, sizeof(mine.host), "%s", hostName().c_str());
    std::snprintf(mine.cpu, sizeof(mine.cpu), "%s", cpuModel().c_str());
    std::vector<WireRankInfo> all(static_cast<size_t>(ctx_.nranks));
    LOOM_TRY(loomCall(loomAllGather(&mine, all.data(), sizeof(mine), loomUint8, ctx_.comm, nullptr),
                      "loomAllGather (rank information)"));
    std::map<std::string, int> perHost;
    for (const auto& w : all) {
      RankInfo r;
      r.rank = w.rank;
      r.pid = w.pid;
      r.host = std::string(w.host, strnlen(w.host, sizeof(w.host)));
      r.cpu = std::string(w.cpu, strnlen(w.cpu, sizeof(w.cpu)));
      r.device = perHost[r.host]++;
      ranks_.push_back(r);
    }
    return Status::ok();
  }

  // The call of iteration iter: the offset rotates through the buffer as in nccl-tests.
  CollCall makeCall(loomDataType_t type, loomRedOp_t op, int root, const CollCounts& c,
                    bool inPlace, long iter) const {
    const size_t el = dataTypeSize(type);
    const size_t total = std::max(c.sendCount, c.recvCount) * el;
    size_t steps = total ? bufferBytes_ / total : 1;
    if (steps == 0) steps = 1;
    const size_t shift = total * (static_cast<size_t>(iter) % steps);
    char* send = send_.get() + shift;
    char* recv = recv_.get() + shift;
    const size_t rank = static_cast<size_t>(ctx_.rank);
    if (inPlace) {
      send = recv + rank * c.sendInplaceOffset * el;
      recv = recv + rank * c.recvInplaceOffset * el;
    }
    CollCall call{opts_.coll, send, recv,      c.paramCount, type,
                  op,         root, ctx_.rank, ctx_.nranks,  ctx_.comm};
    return onDevice_ ? onDeviceCall(call) : call;
  }

  // The same call on the device buffers (at the same offsets) and the rank's stream.
  CollCall onDeviceCall(CollCall host) const {
    auto move = [&](const void* p, const char* hostBase, void* devBase) -> void* {
      return static_cast<char*>(devBase) + (static_cast<const char*>(p) - hostBase);
    };
    const bool inRecv =
        host.sendbuff >= recv_.get() && host.sendbuff < recv_.get() + bufferBytes_ + 1;
    host.sendbuff = inRecv ? move(host.sendbuff, recv_.get(), dev_.recv())
                           : move(host.sendbuff, send_.get(), dev_.send());
    host.recvbuff = move(host.recvbuff, recv_.get(), dev_.recv());
    host.stream = dev_.stream();
    return host;
  }

  // The host mirror of a device call (fill and check work on it).
  CollCall onHostCall(CollCall dev) const {
    auto move = [&](const void* p, void* devBase, const char* hostBase) -> char* {
      return const_cast<char*>(hostBase) +
             (static_cast<const char*>(p) - static_cast<char*>(devBase));
    };
    const bool inRecv = dev.sendbuff >= dev_.recv() &&
                        dev.sendbuff < static_cast<char*>(dev_.recv()) + bufferBytes_ + 1;
    dev.sendbuff = inRecv ? move(dev.sendbuff, dev_.recv(), recv_.get())
                          : move(dev.sendbuff, dev_.send(), send_.get());
    dev.recvbuff = move(dev.recvbuff, dev_.recv(), recv_.get());
    dev.stream = nullptr;
    return dev;
  }

  Status issue(const CollCall& call) {
    const char* what = "";
    loomResult_t res = runColl(call, &what);
    if (res == loomSuccess) return Status::ok();
    return loomCall(res, what);
  }

  Status barrier() {
    int32_t* v = reinterpret_cast<int32_t*>(small_.get());
    v[0] = 0;
    return loomCall(loomAllReduce(v, v, 1, loomInt32, loomSum, ctx_.comm, nullptr),
                    "loomAllReduce (barrier)");
  }

  // Combines this rank's seconds per op across ranks as -a asks.
  Status combineTime(double* sec) {
    double* v = reinterpret_cast<double*>(small_.get());
    *v = *sec;
    switch (opts_.average) {
      case 0:
        LOOM_TRY(loomCall(loomBroadcast(v, v, 1, loomFloat64, 0, ctx_.comm, nullptr),
                          "loomBroadcast (rank 0 time)"));
        break;
      case 1:
        LOOM_TRY(loomCall(loomAllReduce(v, v, 1, loomFloat64, loomSum, ctx_.comm, nullptr),
                          "loomAllReduce (mean time)"));
        *v /= ctx_.nranks;
        break;
      case 2:
        LOOM_TRY(loomCall(loomAllReduce(v, v, 1, loomFloat64, loomMin, ctx_.comm, nullptr),
                          "loomAllReduce (min time)"));
        break;
      default:
        LOOM_TRY(loomCall(loomAllReduce(v, v, 1, loomFloat64, loomMax, ctx_.comm, nullptr),
                          "loomAllReduce (max time)"));
        break;
    }
    *sec = *v;
    return Status::ok();
  }

  Status sumAcrossRanks(int64_t* value) {
    int64_t* v = reinterpret_cast<int64_t*>(small_.get());
    *v = *value;
    LOOM_TRY(loomCall(loomAllReduce(v, v, 1, loomInt64, loomSum, ctx_.comm, nullptr),
                      "loomAllReduce (wrong-value count)"));
    *value = *v;
    return Status::ok();
  }

  // Warm-up at the largest and the smallest size, out of place.
  Status warmUp(loomDataType_t type, loomRedOp_t op, int root) {
    for (size_t bytes : {opts_.maxBytes, opts_.minBytes}) {
      CollCounts c = collCounts(opts_.coll, bytes, dataTypeSize(type), ctx_.nranks);
      for (int w = 0; w < opts_.warmupIters; ++w)
        LOOM_TRY(issue(makeCall(type, op, root, c, false, w)).withContext("warm-up"));
    }
    return Status::ok();
  }

  // A row's first columns (size count type redop root).
  Row newRow(loomDataType_t type, loomRedOp_t op, int root, bool hasOp, const CollCounts& c,
             int cycle) const {
    Row row;
    row.cycle = cycle;
    row.bytes = std::max(c.sendCount, c.recvCount) * dataTypeSize(type);
    row.count = c.paramCount;
    row.type = dataTypeName(type);
    row.redop = hasOp ? redOpName(op) : "none";
    row.root = root;
    return row;
  }

  Status timeTest(loomDataType_t type, loomRedOp_t op, int root, bool hasOp) {
    const size_t el = dataTypeSize(type);
    LOOM_TRY(warmUp(type, op, root));
    Pattern pattern(opts_.coll, type, op, ctx_.nranks);
    const std::vector<size_t> sizes = sweepSizes(opts_);
    long repeat = opts_.runCycles;
    int cycle = 0;
    do {
      for (size_t bytes : sizes) {
        CollCounts c = collCounts(opts_.coll, bytes, el, ctx_.nranks);
        Row row = newRow(type, op, root, hasOp, c, cycle);
        print(formatRowPrefix(row));
        rowOpen_ = true;
        for (bool inPlace : {false, true}) {
          Measurement& m = inPlace ? row.inPlace : row.outOfPlace;
          LOOM_TRY(benchTime(type, op, root, c, inPlace, pattern, &m)
                       .withContext(fmt::format("{} {} {} root {} size {} {}",
                                                collTestName(opts_.coll), row.type, row.redop, root,
                                                row.bytes, inPlace ? "in-place" : "out-of-place")));
          print(formatMeasurement(m));
          busBwSum_ += m.busBw;
          ++busBwCount_;
        }
        print("\n");
        rowOpen_ = false;
        rows_.push_back(row);
      }
      ++cycle;
    } while (--repeat);
    return Status::ok();
  }

  // --compare: every listed algorithm at each size, interleaved (round r starts with algorithm
  // r mod A, so that none always follows the same one), each keeping its fastest round. A burst of
  // noise, or a slow phase of a shared machine, then hits every algorithm alike.
  Status compareTest(loomDataType_t type, loomRedOp_t op, int root, bool hasOp) {
    const size_t el = dataTypeSize(type);
    const size_t nAlgos = opts_.compare.size();
    auto use = [&](const std::string& algo) -> Status {
      std::string spec = algo == "auto" ? "" : std::string(planName()->spec) + ":" + algo;
      Status st = loomCall(loomCommSetAlgo(ctx_.comm, spec.c_str()), "loomCommSetAlgo");
      if (!st.isOk()) usageError_ = true;  // an unknown name: the same on every rank
      return st;
    };
    LOOM_TRY(warmUp(type, op, root));
    Pattern pattern(opts_.coll, type, op, ctx_.nranks);
    long repeat = opts_.runCycles;
    int cycle = 0;
    do {
      for (size_t bytes : sweepSizes(opts_)) {
        CollCounts c = collCounts(opts_.coll, bytes, el, ctx_.nranks);
        Row row = newRow(type, op, root, hasOp, c, cycle);
        for (const std::string& a : opts_.compare) row.compare.push_back({a, Measurement{}});
        for (int round = 0; round < opts_.compareRounds; ++round) {
          for (size_t k = 0; k < nAlgos; ++k) {
            auto& entry = row.compare[(k + static_cast<size_t>(round)) % nAlgos];
            LOOM_TRY(use(entry.first));
            Measurement m;
            LOOM_TRY(
                benchTime(type, op, root, c, false, pattern, &m)
                    .withContext(fmt::format("{} size {} --compare {}", collTestName(opts_.coll),
                                             row.bytes, entry.first)));
            Measurement& best = entry.second;
            int64_t wrong = best.wrong < 0 ? m.wrong : best.wrong + std::max<int64_t>(m.wrong, 0);
            if (round == 0 || m.timeUs < best.timeUs) best = m;
            best.wrong = wrong;
          }
        }
        LOOM_TRY(use("auto"));
        loomPlanInfo_t pi;
        if (ctx_.rank == 0 && loomCommPlanInfo(ctx_.comm, planName()->coll, c.paramCount, type,
                                               root < 0 ? 0 : root, 0, &pi) == loomSuccess)
          row.planned =
              std::string(pi.algorithm) +
              (std::string(pi.path) == "schedule" ? "" : " (" + std::string(pi.path) + ")");
        for (const auto& e : row.compare) {
          busBwSum_ += e.second.busBw;
          ++busBwCount_;
        }
        print(formatCompareRow(row));
        rows_.push_back(row);
      }
      ++cycle;
    } while (--repeat);
    return Status::ok();
  }

  Status benchTime(loomDataType_t type, loomRedOp_t op, int root, const CollCounts& c, bool inPlace,
                   const Pattern& pattern, Measurement* m) {
    // One untimed op, then a barrier so that every rank starts the clock together.
    LOOM_TRY(issue(makeCall(type, op, root, c, inPlace, 0)));
    LOOM_TRY(barrier());

    const int agg = opts_.aggIters;
    auto start = std::chrono::steady_clock::now();
    for (int iter = 0; iter < opts_.iters; ++iter) {
      if (agg > 1) LOOM_TRY(loomCall(loomGroupStart(), "loomGroupStart"));
      for (int a = 0; a < agg; ++a) {
        Status st = issue(makeCall(type, op, root, c, inPlace, static_cast<long>(iter) * agg + a));
        if (!st.isOk()) {
          if (agg > 1) (void)loomGroupEnd();
          return st;
        }
      }
      if (agg > 1) LOOM_TRY(loomCall(loomGroupEnd(), "loomGroupEnd"));
      if (opts_.blocking) {
        if (onDevice_) LOOM_TRY(dev_.sync());
        LOOM_TRY(barrier());
      }
    }
    // On a stream the calls were enqueued: the clock stops when the stream has run them.
    if (onDevice_) LOOM_TRY(dev_.sync());
    std::chrono::duration<double> delta = std::chrono::steady_clock::now() - start;
    double sec = delta.count() / (static_cast<double>(opts_.iters) * agg);
    LOOM_TRY(combineTime(&sec));
    m->timeUs = sec * 1.0e6;
    collBandwidth(opts_.coll, c.paramCount, dataTypeSize(type), sec, ctx_.nranks, &m->algBw,
                  &m->busBw);

    // In-place sendrecv (one buffer sent and received in one group) is defined in Loom: the
    // receive lands once the send has read the buffer. It is validated like the rest.
    if (opts_.check > 0) {
      int64_t wrong = 0;
      for (int rep = 0; rep < opts_.check; ++rep) {
        const CollCall call = makeCall(type, op, root, c, inPlace, 0);
        CheckCall cc{onDevice_ ? onHostCall(call) : call, c};
        fillInputs(cc, pattern);
        if (onDevice_) {  // the mirrors to the device, the call, the output back
          LOOM_TRY(dev_.toDevice(dev_.send(), send_.get(), bufferBytes_));
          LOOM_TRY(dev_.toDevice(dev_.recv(), recv_.get(), bufferBytes_));
        }
        LOOM_TRY(issue(call));
        if (onDevice_) {
          LOOM_TRY(dev_.sync());
          LOOM_TRY(dev_.toHost(recv_.get(), dev_.recv(), bufferBytes_));
        }
        std::string firstBad;
        int64_t bad = checkOutputs(cc, pattern, &firstBad);
        if (bad > 0 && reportedMismatches_ < kMaxMismatchReports) {
          ++reportedMismatches_;
          std::fprintf(stderr,
                       "loom-perf: rank %d: %s %s %s root %d count %zu %s: %lld wrong values; "
                       "first: %s\n",
                       ctx_.rank, collTestName(opts_.coll), dataTypeName(type),
                       collInfo(opts_.coll).hasOp ? redOpName(op) : "none", root, c.paramCount,
                       inPlace ? "in-place" : "out-of-place", static_cast<long long>(bad),
                       firstBad.c_str());
        }
        wrong += bad;
      }
      LOOM_TRY(sumAcrossRanks(&wrong));
      m->wrong = wrong;
      totalWrong_ += wrong;
    }
    return Status::ok();
  }

  void print(const std::string& text) {
    if (ctx_.rank != 0) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }

  void writeReport(const std::string& error) {
    if (ctx_.rank != 0 || opts_.jsonFile.empty()) return;
    JsonReport report;
    report.opts = &opts_;
    report.nranks = ctx_.nranks;
    report.ranks = ranks_;
    report.rows = rows_;
    report.wrongValues = totalWrong_;
    report.avgBusBw = avgBusBw_;
    report.error = error;
    std::string why;
    if (!writeJson(opts_.jsonFile, report, &why))
      std::fprintf(stderr, "loom-perf: -J: %s\n", why.c_str());
  }

  static constexpr int kMaxMismatchReports = 20;

  const Options& opts_;
  const RankContext ctx_;
  HostBuffer send_, recv_, small_;
  bool onDevice_ = false;
  DeviceBuffers dev_;
  Registration sendReg_, recvReg_;  // -R; declared after the buffers: released before them
  size_t bufferBytes_ = 0;
  std::vector<RankInfo> ranks_;
  std::vector<Row> rows_;
  double busBwSum_ = 0;
  long busBwCount_ = 0;
  double avgBusBw_ = 0;
  int64_t totalWrong_ = 0;
  int reportedMismatches_ = 0;
  bool rowOpen_ = false;
  bool usageError_ = false;
};

}  // namespace

int runBenchmarks(const Options& opts, const RankContext& ctx) {
  Bench bench(opts, ctx);
  return bench.run();
}

}  // namespace perf
}  // namespace loom
