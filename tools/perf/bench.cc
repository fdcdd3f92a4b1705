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
#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"
#include "tools/perf/check.h"
#include "tools/perf/collectives.h"
#include "tools/perf/device_buffers.h"
#include "tools/perf/launcher.h"
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

// One rank this thread drives (-g N: N of them, each on its own GPU, their calls issued in one
// group as nccl-tests issues them): its communicator, buffers and device buffers.
struct Local {
  RankContext ctx;
  HostBuffer send, recv, small;
  DeviceBuffers dev;
  Registration sendReg, recvReg;            // -R; declared after the buffers: released before them
  loom::cuda::CUgraphExec graph = nullptr;  // -G: the timed calls captured on dev's stream
};

class Bench {
 public:
  Bench(const Options& opts, const std::vector<RankContext>& ranks) : opts_(opts) {
    for (const RankContext& r : ranks) {
      locals_.push_back(std::make_unique<Local>());
      locals_.back()->ctx = r;
    }
    first_ = locals_[0]->ctx;
  }

  int run() {
    Status st = runAll();
    if (rowOpen_) print("\n");
    if (!st.isOk()) {
      // A usage error is the same on every rank: rank 0 says it once.
      if (!usageError_ || first_.rank == 0)
        std::fprintf(stderr, "loom-perf: rank %d: %s\n", first_.rank, st.message().c_str());
      std::fflush(stderr);
      if (!usageError_) reportFailure(first_.rank, st);
      writeReport(st.message());
      return usageError_ ? kExitUsage : kExitLoomError;
    }
    writeReport("");
    return totalWrong_ > 0 ? kExitWrong : 0;
  }

 private:
  // Runs f(local) for each rank of this thread; with several, inside one group (their calls are
  // issued as one, as nccl-tests' -g issues them), which also holds the calls f queues in groups
  // of its own (-m).
  template <typename F>
  Status eachLocal(F f) {
    if (locals_.size() == 1) return f(*locals_[0]);
    LOOM_TRY(loomCall(loomGroupStart(), "loomGroupStart"));
    Status first;
    for (auto& l : locals_) {
      first = f(*l);
      if (!first.isOk()) break;
    }
    Status end = loomCall(loomGroupEnd(), "loomGroupEnd");
    return first.isOk() ? end : first;
  }

  // Runs f(local) for each rank of this thread, one after the other (no calls between ranks).
  template <typename F>
  Status forLocals(F f) {
    for (auto& l : locals_) LOOM_TRY(f(*l));
    return Status::ok();
  }

  Status runAll() {
    const CollInfo& info = collInfo(opts_.coll);
    const int nranks = first_.nranks;
    std::vector<int> roots;
    if (!info.hasRoot) {
      roots.push_back(-1);
    } else if (opts_.root == -1) {
      for (int r = 0; r < nranks; ++r) roots.push_back(r);
    } else if (opts_.root >= nranks) {
      usageError_ = true;
      return Status(Code::kInvalidArgument,
                    fmt::format("root {} is out of range for {} ranks", opts_.root, nranks));
    } else {
      roots.push_back(opts_.root);
    }
    std::vector<loomRedOp_t> ops = opts_.ops;
    if (!info.hasOp) ops = {loomSum};  // printed as "none"
    if (opts_.plan) return printPlan(roots);

    // Allocated like nccl-tests: maxbytes each; every size fits, with room to rotate offsets.
    bufferBytes_ = opts_.maxBytes;
    const bool shared = opts_.localRegister != 0;
    for (auto& l : locals_) {
      l->send = allocBuffer(bufferBytes_, shared);
      l->recv = allocBuffer(bufferBytes_, shared);
      l->small = allocBuffer(64, false);
      if (!l->send || !l->recv || !l->small)
        return Status(Code::kSystem, fmt::format("cannot allocate 2 x {} bytes of host memory{}",
                                                 bufferBytes_, shared ? " (loomMemAlloc)" : ""));
    }
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
    if (opts_.cudaGraph > 0 && !onDevice_ && first_.rank == 0)
      std::fprintf(stderr, "loom-perf: note: -G %d is ignored (host buffers: no stream)\n",
                   opts_.cudaGraph);
    if (shared) {
      const size_t bytes = std::max<size_t>(bufferBytes_, 1);
      Status done = forLocals([&](Local& l) -> Status {
        LOOM_TRY(l.sendReg.reg(l.ctx.comm, l.send.get(), bytes));
        return l.recvReg.reg(l.ctx.comm, l.recv.get(), bytes);
      });
      if (!done.isOk()) return done;
    }

    LOOM_TRY(gatherRanks());
    if (onDevice_) {
      LOOM_TRY(forLocals([&](Local& l) {
        return l.dev.init(ranks_[static_cast<size_t>(l.ctx.rank)].device, bufferBytes_)
            .withContext("--mem device");
      }));
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
    if (first_.rank != 0) return Status::ok();
    const loomCollective_t* coll = planName() ? &planName()->coll : nullptr;
    if (!coll) {
      usageError_ = true;
      return Status(Code::kInvalidArgument, "--plan: sendrecv is point to point (no algorithm)");
    }
    // On device memory (--mem device, or auto with a usable GPU): the device paths, priced with
    // rank 0's GPU (its host's first) beside the host schedule.
    const bool device =
        opts_.mem == "device" || (opts_.mem == "auto" && deviceUnavailable().empty());
    if (device && !deviceUnavailable().empty()) {
      usageError_ = true;
      return Status(Code::kInvalidArgument, "--mem device: no usable GPU: " + deviceUnavailable());
    }
    if (device) LOOM_TRY(loom::device::useDevice(0).withContext("--plan --mem device"));
    std::string out = fmt::format(
        "# loom-perf --plan: {} on {} ranks{} (nothing is run)\n#\n", collTestName(opts_.coll),
        first_.nranks, device ? " on CUDA device memory (device 0's measured speeds)" : "");
    out += fmt::format("# {:>12} {:>12} {:>8} {:>5} {:>16} {:>9} {:>7} {:>13}  {}\n", "size",
                       "count", "type", "root", "path", "algorithm", "source", "predicted(us)",
                       "candidates: predicted us (x: excluded by LOOM_ALGO)");
    for (loomDataType_t type : opts_.types) {
      size_t el = dataTypeSize(type);
      for (int root : roots) {
        for (size_t bytes : sweepSizes(opts_)) {
          CollCounts c = collCounts(opts_.coll, bytes, el, first_.nranks);
          loomPlanInfo_t pi;
          const int r = root < 0 ? 0 : root;
          LOOM_TRY(
              device ? loomCall(loomCommPlanInfoDevice(first_.comm, *coll, c.paramCount, type, r, 0,
                                                       &pi),
                                "loomCommPlanInfoDevice")
                     : loomCall(loomCommPlanInfo(first_.comm, *coll, c.paramCount, type, r, 0, &pi),
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
    const size_t n = static_cast<size_t>(first_.nranks);
    std::vector<std::vector<Wire>> got(locals_.size(), std::vector<Wire>(n + 1));
    size_t k = 0;
    LOOM_TRY(eachLocal([&](Local& l) {
      std::vector<Wire>& all = got[k++];
      Wire& mine = all[n];
      mine.device = l.dev.device();
      std::snprintf(mine.name, sizeof(mine.name), "%s", l.dev.name().c_str());
      std::snprintf(mine.bus, sizeof(mine.bus), "%s", l.dev.busId().c_str());
      return loomCall(
          loomAllGather(&mine, all.data(), sizeof(Wire), loomUint8, l.ctx.comm, nullptr),
          "loomAllGather (device information)");
    }));
    const std::vector<Wire>& all = got[0];
    for (size_t r = 0; r < n; ++r) {
      ranks_[r].device = all[r].device;
      ranks_[r].gpu = std::string(all[r].name, strnlen(all[r].name, sizeof(all[r].name)));
      ranks_[r].busId = std::string(all[r].bus, strnlen(all[r].bus, sizeof(all[r].bus)));
    }
    return Status::ok();
  }

  Status gatherRanks() {
    const size_t n = static_cast<size_t>(first_.nranks);
    std::vector<WireRankInfo> mine(locals_.size());
    std::vector<std::vector<WireRankInfo>> got(locals_.size(), std::vector<WireRankInfo>(n));
    const std::string host = hostName(), cpu = cpuModel();  // once for this thread's ranks
    size_t k = 0;
    LOOM_TRY(eachLocal([&](Local& l) {
      WireRankInfo& m = mine[k];
      m.rank = l.ctx.rank;
      m.pid = static_cast<int32_t>(getpid());
      std::snprintf(m.host, sizeof(m.host), "%s", host.c_str());
      std::snprintf(m.cpu, sizeof(m.cpu), "%s", cpu.c_str());
      std::vector<WireRankInfo>& all = got[k++];
      return loomCall(loomAllGather(&m, all.data(), sizeof(m), loomUint8, l.ctx.comm, nullptr),
                      "loomAllGather (rank information)");
    }));
    std::map<std::string, int> perHost;
    for (const auto& w : got[0]) {
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

  // The call of iteration iter: the offset rotates through the buffer as in nccl-tests. With
  // --mem device, on the device buffers and the rank's stream, unless mirror asks for the same call
  // on the host mirrors (which fill and check the values). Each pointer is its buffer's base plus
  // an offset: which buffer the send side uses comes from inPlace, never from comparing addresses
  // (the driver may place the two device buffers back to back, and did on an H200: the check then
  // filled past the end of a mirror).
  CollCall makeCall(const Local& l, loomDataType_t type, loomRedOp_t op, int root,
                    const CollCounts& c, bool inPlace, long iter, bool mirror = false) const {
    const size_t el = dataTypeSize(type);
    const size_t total = std::max(c.sendCount, c.recvCount) * el;
    size_t steps = total ? bufferBytes_ / total : 1;
    if (steps == 0) steps = 1;
    const size_t shift = total * (static_cast<size_t>(iter) % steps);
    const size_t rank = static_cast<size_t>(l.ctx.rank);
    size_t sendOff = shift, recvOff = shift;
    if (inPlace) {  // both in the receive buffer
      sendOff = shift + rank * c.sendInplaceOffset * el;
      recvOff = shift + rank * c.recvInplaceOffset * el;
    }
    const bool dev = onDevice_ && !mirror;
    char* recvBase = dev ? static_cast<char*>(l.dev.recv()) : l.recv.get();
    char* sendBase = inPlace ? recvBase : dev ? static_cast<char*>(l.dev.send()) : l.send.get();
    CollCall call{opts_.coll, sendBase + sendOff, recvBase + recvOff, c.paramCount, type, op,
                  root,       l.ctx.rank,         l.ctx.nranks,       l.ctx.comm};
    if (dev) call.stream = l.dev.stream();
    return call;
  }

  Status issue(const CollCall& call) {
    const char* what = "";
    loomResult_t res = runColl(call, &what);
    if (res == loomSuccess) return Status::ok();
    return loomCall(res, what);
  }

  Status barrier() {
    return eachLocal([&](Local& l) {
      int32_t* v = reinterpret_cast<int32_t*>(l.small.get());
      v[0] = 0;
      return loomCall(loomAllReduce(v, v, 1, loomInt32, loomSum, l.ctx.comm, nullptr),
                      "loomAllReduce (barrier)");
    });
  }

  // Combines this thread's seconds per op (the same for each of its ranks) across ranks as -a
  // asks.
  Status combineTime(double* sec) {
    const double mine = *sec;
    LOOM_TRY(eachLocal([&](Local& l) -> Status {
      double* v = reinterpret_cast<double*>(l.small.get());
      *v = mine;
      switch (opts_.average) {
        case 0:
          return loomCall(loomBroadcast(v, v, 1, loomFloat64, 0, l.ctx.comm, nullptr),
                          "loomBroadcast (rank 0 time)");
        case 1:
          return loomCall(loomAllReduce(v, v, 1, loomFloat64, loomSum, l.ctx.comm, nullptr),
                          "loomAllReduce (mean time)");
        case 2:
          return loomCall(loomAllReduce(v, v, 1, loomFloat64, loomMin, l.ctx.comm, nullptr),
                          "loomAllReduce (min time)");
        default:
          return loomCall(loomAllReduce(v, v, 1, loomFloat64, loomMax, l.ctx.comm, nullptr),
                          "loomAllReduce (max time)");
      }
    }));
    *sec = *reinterpret_cast<double*>(locals_[0]->small.get());
    if (opts_.average == 1) *sec /= first_.nranks;
    return Status::ok();
  }

  // The sum over every rank of the thread's *value (counted once, by its first rank).
  Status sumAcrossRanks(int64_t* value) {
    const int64_t mine = *value;
    LOOM_TRY(eachLocal([&](Local& l) {
      int64_t* v = reinterpret_cast<int64_t*>(l.small.get());
      *v = &l == locals_[0].get() ? mine : 0;
      return loomCall(loomAllReduce(v, v, 1, loomInt64, loomSum, l.ctx.comm, nullptr),
                      "loomAllReduce (wrong-value count)");
    }));
    *value = *reinterpret_cast<int64_t*>(locals_[0]->small.get());
    return Status::ok();
  }

  // Issues call(local) for every rank of this thread (in one group when there are several).
  template <typename MakeCall>
  Status issueAll(MakeCall call) {
    return eachLocal([&](Local& l) { return issue(call(l)); });
  }

  // Waits for every device buffer's stream.
  Status syncAll() {
    return forLocals([](Local& l) { return l.dev.sync(); });
  }

  // -G: every local rank's stream captures (in GLOBAL mode, or THREAD_LOCAL where several threads
  // capture, as nccl-tests), then each capture becomes an executable graph (Local::graph).
  Status beginCapture() {
    const cuda::DriverApi& api = cuda::cudaDriver().api;
    if (!api.cuStreamBeginCapture || !api.cuStreamEndCapture || !api.cuGraphInstantiate ||
        !api.cuGraphLaunch || !api.cuGraphExecDestroy || !api.cuGraphDestroy)
      return Status(Code::kInvalidArgument,
                    "-G: the CUDA driver " + cuda::cudaDriver().library + " cannot capture graphs");
    const int mode = opts_.nThreads > 1 ? cuda::kCaptureModeThreadLocal : cuda::kCaptureModeGlobal;
    return forLocals([&](Local& l) -> Status {
      LOOM_TRY(loom::device::useDevice(l.dev.device()));  // the stream's context, current
      LOOM_CU(api.cuStreamBeginCapture(static_cast<cuda::CUstream>(l.dev.stream()), mode));
      return Status::ok();
    });
  }
  Status endCapture() {
    const cuda::DriverApi& api = cuda::cudaDriver().api;
    Status first;
    // Every capture ends, also after a failure (a stream left capturing refuses later work).
    (void)forLocals([&](Local& l) -> Status {
      (void)loom::device::useDevice(l.dev.device());
      cuda::CUgraph graph = nullptr;
      cuda::CUresult rc =
          api.cuStreamEndCapture(static_cast<cuda::CUstream>(l.dev.stream()), &graph);
      if (rc == cuda::kSuccess) rc = api.cuGraphInstantiate(&l.graph, graph, 0);
      if (graph) api.cuGraphDestroy(graph);  // the executable graph keeps what it needs
      if (rc != cuda::kSuccess && first.isOk())
        first = cuda::cudaError(rc, "-G: ending the capture of the timed calls");
      return Status::ok();
    });
    return first;
  }
  Status launchGraphs() {
    return forLocals([](Local& l) -> Status {
      LOOM_TRY(loom::device::useDevice(l.dev.device()));
      LOOM_CU(cuda::cudaDriver().api.cuGraphLaunch(l.graph,
                                                   static_cast<cuda::CUstream>(l.dev.stream())));
      return Status::ok();
    });
  }
  Status destroyGraphs() {
    return forLocals([](Local& l) -> Status {
      if (l.graph) cuda::cudaDriver().api.cuGraphExecDestroy(l.graph);
      l.graph = nullptr;
      return Status::ok();
    });
  }

  // Warm-up at the largest and the smallest size, out of place.
  Status warmUp(loomDataType_t type, loomRedOp_t op, int root) {
    for (size_t bytes : {opts_.maxBytes, opts_.minBytes}) {
      CollCounts c = collCounts(opts_.coll, bytes, dataTypeSize(type), first_.nranks);
      for (int w = 0; w < opts_.warmupIters; ++w)
        LOOM_TRY(issueAll([&](const Local& l) {
                   return makeCall(l, type, op, root, c, false, w);
                 }).withContext("warm-up"));
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
    Pattern pattern(opts_.coll, type, op, first_.nranks);
    const std::vector<size_t> sizes = sweepSizes(opts_);
    long repeat = opts_.runCycles;
    int cycle = 0;
    do {
      for (size_t bytes : sizes) {
        CollCounts c = collCounts(opts_.coll, bytes, el, first_.nranks);
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
      Status st = forLocals([&](Local& l) {
        return loomCall(loomCommSetAlgo(l.ctx.comm, spec.c_str()), "loomCommSetAlgo");
      });
      if (!st.isOk()) usageError_ = true;  // an unknown name: the same on every rank
      return st;
    };
    LOOM_TRY(warmUp(type, op, root));
    Pattern pattern(opts_.coll, type, op, first_.nranks);
    long repeat = opts_.runCycles;
    int cycle = 0;
    do {
      for (size_t bytes : sweepSizes(opts_)) {
        CollCounts c = collCounts(opts_.coll, bytes, el, first_.nranks);
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
        if (first_.rank == 0 && loomCommPlanInfo(first_.comm, planName()->coll, c.paramCount, type,
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
    auto callAt = [&](long iter) {
      return [&, iter](const Local& l) { return makeCall(l, type, op, root, c, inPlace, iter); };
    };
    LOOM_TRY(issueAll(callAt(0)));
    LOOM_TRY(barrier());

    const int agg = opts_.aggIters;
    const bool grouped = agg > 1 || locals_.size() > 1;
    // -G: the timed loop is captured into a graph per stream, then launched; the clock runs over
    // the launches only (as nccl-tests').
    const int launches = onDevice_ ? opts_.cudaGraph : 0;
    if (launches > 0) LOOM_TRY(beginCapture());
    auto start = std::chrono::steady_clock::now();
    for (int iter = 0; iter < opts_.iters; ++iter) {
      // The -m ops of every rank of this thread in one group.
      if (grouped) LOOM_TRY(loomCall(loomGroupStart(), "loomGroupStart"));
      for (int a = 0; a < agg; ++a) {
        Status st = forLocals([&](Local& l) {
          return issue(makeCall(l, type, op, root, c, inPlace, static_cast<long>(iter) * agg + a));
        });
        if (!st.isOk()) {
          if (grouped) (void)loomGroupEnd();
          return st;
        }
      }
      if (grouped) {
        Status ended = loomCall(loomGroupEnd(), "loomGroupEnd");
        if (!ended.isOk()) {
          if (launches > 0) (void)endCapture();
          return ended;
        }
      }
      if (opts_.blocking) {
        if (onDevice_) LOOM_TRY(syncAll());
        LOOM_TRY(barrier());
      }
    }
    if (launches > 0) {
      LOOM_TRY(endCapture());
      // One launch untimed (between processes it opens the peers' buffers), then a barrier.
      LOOM_TRY(launchGraphs());
      LOOM_TRY(syncAll());
      LOOM_TRY(barrier());
      start = std::chrono::steady_clock::now();
      for (int i = 0; i < launches; ++i) LOOM_TRY(launchGraphs());
    }
    // On a stream the calls were enqueued: the clock stops when the streams have run them.
    if (onDevice_) LOOM_TRY(syncAll());
    std::chrono::duration<double> delta = std::chrono::steady_clock::now() - start;
    if (launches > 0) LOOM_TRY(destroyGraphs());
    double sec = delta.count() / (static_cast<double>(opts_.iters) * agg * std::max(launches, 1));
    LOOM_TRY(combineTime(&sec));
    m->timeUs = sec * 1.0e6;
    collBandwidth(opts_.coll, c.paramCount, dataTypeSize(type), sec, first_.nranks, &m->algBw,
                  &m->busBw);

    // In-place sendrecv (one buffer sent and received in one group) is defined in Loom: the
    // receive lands once the send has read the buffer. It is validated like the rest.
    if (opts_.check > 0) {
      int64_t wrong = 0;
      for (int rep = 0; rep < opts_.check; ++rep) {
        auto checked = [&](const Local& l) {
          return CheckCall{makeCall(l, type, op, root, c, inPlace, 0, /*mirror=*/true), c};
        };
        Status done = forLocals([&](Local& l) -> Status {
          fillInputs(checked(l), pattern);
          if (!onDevice_) return Status::ok();
          // The mirrors to the device, then the call, then the output back.
          LOOM_TRY(l.dev.toDevice(l.dev.send(), l.send.get(), bufferBytes_));
          return l.dev.toDevice(l.dev.recv(), l.recv.get(), bufferBytes_);
        });
        if (!done.isOk()) return done;
        if (launches > 0) {  // -G: the checked call is a graph's too
          LOOM_TRY(beginCapture());
          Status issued = issueAll(callAt(0));
          Status ended = endCapture();
          LOOM_TRY(issued);
          LOOM_TRY(ended);
          LOOM_TRY(launchGraphs());
          LOOM_TRY(syncAll());
          LOOM_TRY(destroyGraphs());
        } else {
          LOOM_TRY(issueAll(callAt(0)));
        }
        done = forLocals([&](Local& l) -> Status {
          if (onDevice_) {
            LOOM_TRY(l.dev.sync());
            LOOM_TRY(l.dev.toHost(l.recv.get(), l.dev.recv(), bufferBytes_));
          }
          std::string firstBad;
          int64_t bad = checkOutputs(checked(l), pattern, &firstBad);
          if (bad > 0 && reportedMismatches_ < kMaxMismatchReports) {
            ++reportedMismatches_;
            std::fprintf(stderr,
                         "loom-perf: rank %d: %s %s %s root %d count %zu %s: %lld wrong values; "
                         "first: %s\n",
                         l.ctx.rank, collTestName(opts_.coll), dataTypeName(type),
                         collInfo(opts_.coll).hasOp ? redOpName(op) : "none", root, c.paramCount,
                         inPlace ? "in-place" : "out-of-place", static_cast<long long>(bad),
                         firstBad.c_str());
          }
          wrong += bad;
          return Status::ok();
        });
        if (!done.isOk()) return done;
      }
      LOOM_TRY(sumAcrossRanks(&wrong));
      m->wrong = wrong;
      totalWrong_ += wrong;
    }
    return Status::ok();
  }

  void print(const std::string& text) {
    if (first_.rank != 0) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }

  void writeReport(const std::string& error) {
    if (first_.rank != 0 || opts_.jsonFile.empty()) return;
    JsonReport report;
    report.opts = &opts_;
    report.nranks = first_.nranks;
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
  std::vector<std::unique_ptr<Local>> locals_;  // this thread's ranks (-g), in rank order
  RankContext first_;                           // locals_[0]'s: rank 0 of all prints
  bool onDevice_ = false;
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

int runBenchmarks(const Options& opts, const std::vector<RankContext>& ranks) {
  if (ranks.empty()) return kExitUsage;
  Bench bench(opts, ranks);
  return bench.run();
}

}  // namespace perf
}  // namespace loom
