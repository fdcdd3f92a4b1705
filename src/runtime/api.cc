// The C entry points: argument validation, error codes and messages, group calls. Every entry
// point catches everything (allocation failure included) and turns it into a result code; the
// message of the last failure on this thread is kept for loomGetLastError().
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algo_filter.h"
#include "loom/loom.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/dtype.h"
#include "src/core/hash.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/device/device_memory.h"
#include "src/runtime/comm.h"
#include "src/runtime/device_plan.h"
#include "src/runtime/device_runner.h"
#include "src/runtime/executor.h"
#include "src/runtime/run.h"
#include "transports/shm/shared_alloc.h"

struct loomComm {
  std::unique_ptr<loom::Comm> impl;
  // The calls running on this handle, and whether loomCommAbort has begun. They live here, in the
  // handle, which an abort never frees (loomCommAbort frees impl and keeps the handle): a call
  // that starts while or after another thread aborts reads them safely and returns loomAborted.
  std::atomic<int> calls{0};
  std::atomic<bool> aborting{false};
};

namespace loom {
namespace {

thread_local std::string tLastError;

struct GroupState {
  int depth = 0;
  std::vector<QueuedOp> ops;
};
thread_local GroupState tGroup;

loomResult_t setError(const Status& st, const char* call) {
  if (st.isOk()) return loomSuccess;
  tLastError = fmt::format("{}: {}", call, st.message());
  if (st.code() == Code::kInvalidArgument || st.code() == Code::kInvalidUsage)
    LOOM_INFO(kSubColl, "{}", tLastError);
  else
    LOOM_WARN("{}", tLastError);
  return st.result();
}

template <typename Fn>
loomResult_t guarded(const char* call, Fn&& fn) {
  try {
    return setError(fn(), call);
  } catch (const std::bad_alloc&) {
    return setError(LOOM_ERROR(kSystem, "out of memory"), call);
  } catch (const std::exception& e) {
    return setError(LOOM_ERROR(kInternal, "unexpected exception: {}", e.what()), call);
  } catch (...) {
    return setError(LOOM_ERROR(kInternal, "unexpected exception"), call);
  }
}

// Marks a handle busy for the duration of a call, so that loomCommAbort from another thread waits
// for the call to leave before freeing the communicator. The call counts itself first, then looks
// at the abort flag (both sequentially consistent, as loomCommAbort raises the flag, then reads
// the count): either the abort waits for the call, or the call sees the abort and touches
// nothing (check()).
class CallScope {
 public:
  explicit CallScope(loomComm_t h) : h_(h) {
    if (h_ != nullptr) h_->calls.fetch_add(1);
  }
  ~CallScope() {
    if (h_ != nullptr) h_->calls.fetch_sub(1);
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  // NULL, or aborted (from any thread, before or during this call), or else the communicator.
  Result<Comm*> check() const {
    if (h_ == nullptr) return LOOM_ERROR(kInvalidArgument, "comm is NULL");
    if (h_->aborting.load()) return LOOM_ERROR(kAborted, "the communicator was aborted");
    if (!h_->impl) return LOOM_ERROR(kInvalidArgument, "comm is NULL");
    logSetThreadRank(h_->impl->rank());
    return h_->impl.get();
  }

 private:
  loomComm_t h_;
};

// A communicator that is usable: not NULL, not aborted (the handle's flag, raised before the
// communicator's own), not failed.
Status checkComm(const CallScope& scope) {
  LOOM_ASSIGN(Comm * c, scope.check());
  Status async = c->asyncError();
  if (!async.isOk())
    return Status(async.code(),
                  "the communicator failed earlier and cannot be used: " + async.message());
  return Status();
}

// A call that failed while loomCommAbort ran on its communicator (from another thread) reports
// the abort: what it saw fail (a connection the abort closed, which may read as a peer's) came
// from it.
Status abortedDuring(loomComm_t h, Status st) {
  if (st.isOk() || st.code() == Code::kAborted || h == nullptr || !h->aborting.load()) return st;
  return Status(Code::kAborted,
                "the communicator was aborted (loomCommAbort) during the call: " + st.message());
}

uint64_t deriveSecret(const std::string& text) { return Fnv64().mixBytes(text).value(); }

// The id for LOOM_COMM_ID: the address from the environment and a secret every process derives
// the same way.
Result<UniqueIdInfo> commIdFromEnv() {
  UniqueIdInfo info;
  LOOM_ASSIGN(info.root, parseSockAddr(params::kCommId.str()));
  info.secret =
      deriveSecret("LOOM_COMM_ID=" + info.root.toString() + ";" + params::kCommSecret.str());
  return info;
}

bool sameAddr(const SockAddr& a, const SockAddr& b) {
  return a.len == b.len && std::memcmp(&a.ss, &b.ss, a.len) == 0;
}

// loomConfig_t.cudaDev, -1 where the caller's loomConfig_t predates the field.
int configDevice(const loomConfig_t* config) {
  if (config && config->size >= offsetof(loomConfig_t, cudaDev) + sizeof(int))
    return config->cudaDev;
  return -1;
}

// dev (-1: none) as `what` names it: a CUDA device of this process.
Status checkDeviceIndex(int dev, const std::string& what) {
  if (dev == -1) return Status();
  if (dev < -1)
    return LOOM_ERROR(kInvalidArgument, "{} is {}: -1 (the first device call's) or a CUDA device",
                      what, dev);
  const cuda::Driver& drv = cuda::cudaDriver();
  if (!drv.ok())
    return LOOM_ERROR(kInvalidArgument, "{} names CUDA device {}, but {}", what, dev,
                      drv.status.message());
  if (dev >= drv.devices)
    return LOOM_ERROR(kInvalidArgument, "{} names CUDA device {}; this process sees {}", what, dev,
                      drv.devices);
  return Status();
}

Status checkConfig(const loomConfig_t* config) {
  if (!config) return Status();
  if (config->size < offsetof(loomConfig_t, version) + sizeof(unsigned int) ||
      config->magic != LOOM_CONFIG_MAGIC)
    return LOOM_ERROR(
        kInvalidArgument,
        "config was not initialised with LOOM_CONFIG_INITIALIZER (size {}, magic {:#x})",
        config->size, config->magic);
  return checkDeviceIndex(configDevice(config), "config.cudaDev");
}

// Binds c to CUDA device dev (-1: nothing to do): its runner, streams and pinned staging are set
// up now, during init, when no stream can wait for one of its calls yet (DeviceRunner::
// reserveAhead). The calling thread's current context is left as it was.
Status bindDevice(Comm* c, int dev) {
  if (dev < 0) return Status();
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUcontext old = nullptr;
  api.cuCtxGetCurrent(&old);
  Status st = device::useDevice(dev);
  if (st.isOk()) {
    Result<DeviceRunner*> r = c->deviceRunner(dev);
    st = r.isOk() ? r.value()->reserveAhead() : r.status();
  }
  api.cuCtxSetCurrent(old);
  return st.withContext(fmt::format("binding the communicator to CUDA device {}", dev));
}

Status initRank(loomComm_t* out, int nranks, const loomUniqueId& id, int rank,
                const loomConfig_t* config, int dev) {
  if (!out) return LOOM_ERROR(kInvalidArgument, "comm pointer is NULL");
  *out = nullptr;
  if (nranks < 1) return LOOM_ERROR(kInvalidArgument, "nranks {} must be at least 1", nranks);
  if (rank < 0 || rank >= nranks)
    return LOOM_ERROR(kInvalidArgument, "rank {} is out of range for {} ranks", rank, nranks);
  LOOM_TRY(checkConfig(config));
  LOOM_ASSIGN(UniqueIdInfo info, unpackUniqueId(id));
  if (rank == 0 && params::kCommId.isSet() && !params::kCommId.str().empty()) {
    auto env = commIdFromEnv();
    if (env.isOk() && sameAddr(env.value().root, info.root)) LOOM_TRY(startRootAt(info));
  }
  logSetThreadRank(rank);
  LOOM_ASSIGN(std::unique_ptr<Comm> c, Comm::create(info, nranks, rank, config));
  LOOM_TRY(bindDevice(c.get(), dev));
  auto* h = new loomComm();
  h->impl = std::move(c);
  *out = h;
  return Status();
}

Status checkPtr(const void* p, const char* name, size_t count, loomDataType_t dt) {
  if (count == 0) return Status();
  if (!p) return LOOM_ERROR(kInvalidArgument, "{} is NULL with count {}", name, count);
  size_t es = dataTypeSize(dt);
  if (reinterpret_cast<uintptr_t>(p) % es != 0)
    return LOOM_ERROR(kInvalidArgument, "{} {} is not aligned to the {}-byte size of {}", name, p,
                      es, dataTypeName(dt));
  return Status();
}

// The checks of a collective's shape, shared by the calls and loomCommPlanInfo: the root of a
// rooted collective is a rank, and the buffers' byte sizes fit in half the address space.
Status checkShape(CollKind coll, size_t count, size_t es, int root, int n) {
  if (collRooted(coll) && (root < 0 || root >= n))
    return LOOM_ERROR(kInvalidArgument, "root {} is out of range for {} ranks", root, n);
  if (count > (SIZE_MAX / 2) / es / static_cast<size_t>(n))
    return LOOM_ERROR(kInvalidArgument, "count {} is too large", count);
  return Status();
}

// Device memory and CUDA streams (src/runtime/device_runner.h): the CUDA device the call runs on
// (*device = -1: host memory and no stream, the host path). Every question to the driver is asked
// only where a driver is loaded and sees a GPU.
Status checkDevice(Comm* c, const OpArgs& a, loomStream_t stream, QueuedOp* q) {
  int* device = &q->device;
  *device = -1;
  const bool cuda = device::cudaUsable();
  if (!cuda) {
    if (stream != nullptr)
      return LOOM_ERROR(kInvalidArgument,
                        "a non-NULL stream needs the CUDA driver, which is not usable here ({}); "
                        "host calls take a NULL stream",
                        cuda::cudaDriver().status.message());
    return Status();
  }
  const int me = c->rank();
  const bool usesIn = a.sendbuff && collUsesInput(a.coll, me, a.root, a.isSend);
  const bool usesOut = a.recvbuff && collUsesOutput(a.coll, me, a.root, a.isSend);
  device::PointerInfo in, out;
  if (usesIn) in = device::classify(a.sendbuff);
  if (usesOut) out = device::classify(a.recvbuff);
  // A pointer the driver does not know is host memory, unless the host cannot read it: a freed
  // device buffer, whose addresses CUDA keeps reserved, would fault on the host path.
  const CollCounts counts = collCounts(a.coll, a.count, c->nranks());
  const size_t es = dataTypeSize(a.dtype);
  for (const auto* p : {&in, &out}) {
    const bool isIn = p == &in;
    if (!(isIn ? usesIn : usesOut) || p->kind != MemKind::kHost) continue;
    const void* ptr = isIn ? a.sendbuff : a.recvbuff;
    if (!device::hostReadable(ptr, (isIn ? counts.input : counts.output) * es))
      return LOOM_ERROR(kInvalidArgument,
                        "{} {} is neither CUDA memory the driver knows nor host memory this "
                        "process can read: a freed device buffer?",
                        isIn ? "sendbuff" : "recvbuff", ptr);
  }
  for (const auto* p : {&in, &out})
    if (p->managed)
      return LOOM_ERROR(kInvalidArgument,
                        "{} is CUDA managed memory (cudaMallocManaged), which Loom does not take: "
                        "allocate device buffers with cudaMalloc",
                        p == &in ? "sendbuff" : "recvbuff");
  if (usesIn && usesOut && in.kind != out.kind)
    return LOOM_ERROR(kInvalidArgument,
                      "sendbuff is {} and recvbuff {}: both must be CUDA device memory or both "
                      "host memory",
                      in.kind == MemKind::kCudaDevice ? "CUDA device memory" : "host memory",
                      out.kind == MemKind::kCudaDevice ? "CUDA device memory" : "host memory");
  int dev = in.kind == MemKind::kCudaDevice ? in.device : out.device;
  if (in.kind == MemKind::kCudaDevice && out.kind == MemKind::kCudaDevice &&
      in.device != out.device)
    return LOOM_ERROR(kInvalidArgument,
                      "sendbuff is on CUDA device {} and recvbuff on device {}: one device per "
                      "call",
                      in.device, out.device);
  if (stream != nullptr) {
    const cuda::DriverApi& api = cuda::cudaDriver().api;
    auto s = static_cast<cuda::CUstream>(stream);
    cuda::CUcontext ctx = nullptr, old = nullptr;
    cuda::CUresult rc = api.cuStreamGetCtx(s, &ctx);
    if (rc != cuda::kSuccess)
      return cuda::cudaError(rc, "cuStreamGetCtx")
          .rewritten(Code::kInvalidArgument,
                     fmt::format("stream {} is not a CUDA stream of a live context ({})", stream,
                                 cuda::cudaError(rc, "cuStreamGetCtx").message()));
    cuda::CUdevice sdev = -1;
    api.cuCtxGetCurrent(&old);
    api.cuCtxSetCurrent(ctx);
    rc = api.cuCtxGetDevice(&sdev);
    api.cuCtxSetCurrent(old);
    if (rc != cuda::kSuccess) return cuda::cudaError(rc, "cuCtxGetDevice of the stream's context");
    if (dev >= 0 && sdev != dev)
      return LOOM_ERROR(kInvalidArgument,
                        "the stream belongs to CUDA device {} and the buffers to device {}", sdev,
                        dev);
    if (dev < 0) dev = sdev;
  }
  if (dev >= 0 && c->runner() && c->runner()->device() != dev)
    return LOOM_ERROR(kInvalidArgument,
                      "the communicator runs its device calls on CUDA device {}; this call's "
                      "buffers or stream are on device {} (one device per communicator, as NCCL)",
                      c->runner()->device(), dev);
  *device = dev;
  q->inDevice = usesIn && in.kind == MemKind::kCudaDevice;
  q->outDevice = usesOut && out.kind == MemKind::kCudaDevice;
  return Status();
}

// Runs the calls of one communicator that go through its device runner: calls on device memory
// or a stream, and every call once the communicator has a runner (one thread drives it).
Status runOnDevice(Comm* c, std::vector<QueuedOp> ops) {
  int device = c->runner() ? c->runner()->device() : -1;
  for (const QueuedOp& q : ops)
    if (device < 0) device = q.device;
  LOOM_ASSIGN(DeviceRunner * runner, c->deviceRunner(device));
  std::vector<cuda::CUstream> streams;
  bool unstreamed = false;
  for (const QueuedOp& q : ops) {
    if (!q.stream) {
      unstreamed = true;
      continue;
    }
    auto s = static_cast<cuda::CUstream>(q.stream);
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  }
  if (unstreamed && !streams.empty())
    return LOOM_ERROR(kInvalidUsage,
                      "a group mixes calls with and without a stream on one communicator");
  return runner->submit(std::move(ops), std::move(streams));
}

// Validates a call and queues it (in a group) or runs it.
Status enqueue(loomComm_t comm, OpArgs a, loomStream_t stream) {
  // Counted as running before anything else is read: loomCommAbort from another thread waits for
  // it instead of freeing the communicator under it.
  CallScope scope(comm);
  LOOM_TRY(checkComm(scope));
  Comm* c = comm->impl.get();
  if (!validDataType(a.rawDtype))
    return LOOM_ERROR(kInvalidArgument, "unknown datatype {} (valid: 0..{})", a.rawDtype,
                      loomNumTypes - 1);
  if (!validRedOp(a.rawOp))
    return LOOM_ERROR(kInvalidArgument, "unknown reduction op {} (valid: 0..{})", a.rawOp,
                      loomNumOps - 1);
  a.dtype = static_cast<loomDataType_t>(a.rawDtype);
  a.op = static_cast<loomRedOp_t>(a.rawOp);
  int n = c->nranks(), me = c->rank();
  size_t es = dataTypeSize(a.dtype);
  LOOM_TRY(checkShape(a.coll, a.count, es, a.root, n));
  if (a.coll == CollKind::kSendRecv && (a.peer < 0 || a.peer >= n))
    return LOOM_ERROR(kInvalidArgument, "peer {} is out of range for {} ranks", a.peer, n);
  const CollCounts counts = collCounts(a.coll, a.count, n);
  const size_t inCount = counts.input, outCount = counts.output;
  bool needIn = collUsesInput(a.coll, me, a.root, a.isSend);
  bool needOut = collUsesOutput(a.coll, me, a.root, a.isSend);
  if (needIn) LOOM_TRY(checkPtr(a.sendbuff, "sendbuff", inCount, a.dtype));
  if (needOut) LOOM_TRY(checkPtr(a.recvbuff, "recvbuff", outCount, a.dtype));
  if (!needIn) a.sendbuff = nullptr;
  // A non-root Reduce may pass a recvbuff: it is not written.
  if (!needOut && a.coll == CollKind::kReduce) a.recvbuff = nullptr;
  const char* s = static_cast<const char*>(a.sendbuff);
  char* r = static_cast<char*>(a.recvbuff);
  if (a.coll != CollKind::kSendRecv && s && r) {
    const size_t block = collInPlaceOffset(a.coll, a.count, me) * es;
    a.inPlace = a.coll == CollKind::kReduceScatter ? r == s + block : s == r + block;
    if (!a.inPlace && rangesOverlap(s, inCount * es, r, outCount * es))
      return LOOM_ERROR(kInvalidArgument,
                        "sendbuff and recvbuff overlap without being in place as {} defines it",
                        collName(a.coll));
  }
  QueuedOp q;
  LOOM_TRY(checkDevice(c, a, stream, &q));
  q.comm = c;
  q.handle = comm;
  q.args = a;
  q.stream = stream;
  if (tGroup.depth > 0) {
    tGroup.ops.push_back(std::move(q));
    return Status();
  }
  Status st = q.device < 0 && !c->runner() ? runCall(c, a) : runOnDevice(c, {std::move(q)});
  return abortedDuring(comm, std::move(st));
}

Status runGroup(std::vector<QueuedOp> ops) {
  std::vector<std::unique_ptr<CallScope>> scopes;
  std::vector<Comm*> seen;
  for (const auto& q : ops) {
    if (std::find(seen.begin(), seen.end(), q.comm) != seen.end()) continue;
    seen.push_back(q.comm);
    scopes.push_back(std::make_unique<CallScope>(q.handle));
    // A communicator aborted (by another thread) since its calls were queued fails the group
    // before anything runs; an aborted handle's communicator is not touched.
    if (!scopes.back()->check().isOk())
      return LOOM_ERROR(kAborted, "a communicator in the group was aborted");
  }
  // The communicators with device calls (or a runner) run theirs on their runner threads, posted
  // first so that they progress together with the host calls this thread runs.
  std::vector<QueuedOp> hostOps;
  std::vector<std::pair<DeviceRunner*, std::shared_ptr<DeviceRunner::Job>>> posted;
  Status first;
  for (Comm* c : seen) {
    std::vector<QueuedOp> mine;
    bool device = c->runner() != nullptr;
    for (const QueuedOp& q : ops)
      if (q.comm == c) {
        mine.push_back(q);
        device |= q.device >= 0;
      }
    if (!device) {
      hostOps.insert(hostOps.end(), mine.begin(), mine.end());
      continue;
    }
    int dev = c->runner() ? c->runner()->device() : -1;
    std::vector<cuda::CUstream> streams;
    bool unstreamed = false;
    for (const QueuedOp& q : mine) {
      if (dev < 0) dev = q.device;
      if (!q.stream) {
        unstreamed = true;
      } else if (std::find(streams.begin(), streams.end(), static_cast<cuda::CUstream>(q.stream)) ==
                 streams.end()) {
        streams.push_back(static_cast<cuda::CUstream>(q.stream));
      }
    }
    Status st;
    if (unstreamed && !streams.empty()) {
      st = LOOM_ERROR(kInvalidUsage,
                      "a group mixes calls with and without a stream on one communicator");
    } else {
      Result<DeviceRunner*> r = c->deviceRunner(dev);
      if (!r.isOk()) {
        st = r.status();
      } else {
        Result<std::shared_ptr<DeviceRunner::Job>> job =
            r.value()->post(std::move(mine), std::move(streams));
        if (job.isOk())
          posted.emplace_back(r.value(), job.value());
        else
          st = job.status();
      }
    }
    if (!st.isOk() && first.isOk()) first = st;
  }
  Status host = runCalls(hostOps);
  if (first.isOk()) first = host;
  for (auto& [runner, job] : posted) {
    Status st = runner->wait(job);
    if (first.isOk()) first = st;
  }
  // As for a call alone (enqueue): a failure while one of the group's communicators was being
  // aborted is the abort's.
  for (const QueuedOp& q : ops) first = abortedDuring(q.handle, std::move(first));
  return first;
}

// Reads an enum argument's bits without loading it as the enum type (see OpArgs::rawDtype).
template <typename E>
int enumBits(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

OpArgs collArgs(CollKind coll, const void* sendbuff, void* recvbuff, size_t count,
                const loomDataType_t& dt, const loomRedOp_t& op, int root) {
  OpArgs a;
  a.coll = coll;
  a.sendbuff = sendbuff;
  a.recvbuff = recvbuff;
  a.count = count;
  a.rawDtype = enumBits(dt);
  a.rawOp = enumBits(op);
  a.root = root;
  return a;
}

// Drops this thread's queued (not yet run) group operations on a communicator being freed.
void forgetQueued(loomComm_t comm) {
  if (!comm) return;
  auto& ops = tGroup.ops;
  ops.erase(std::remove_if(ops.begin(), ops.end(),
                           [comm](const QueuedOp& q) { return q.handle == comm; }),
            ops.end());
}

}  // namespace
}  // namespace loom

using namespace loom;  // NOLINT: this file is the C boundary

extern "C" {

loomResult_t loomGetVersion(int* version) {
  return guarded("loomGetVersion", [&] {
    if (!version) return LOOM_ERROR(kInvalidArgument, "version is NULL");
    *version = LOOM_VERSION_CODE;
    return Status();
  });
}

namespace {

void copyName(char* dst, size_t n, const std::string& s) { std::snprintf(dst, n, "%s", s.c_str()); }

// The checks and the shape loomCommPlanInfo and loomCommPlanInfoDevice share.
Status planShape(loomComm_t comm, const loomCollective_t& coll, size_t count,
                 const loomDataType_t& datatype, int root, int inPlace, loomPlanInfo_t* info,
                 CallShape* call) {
  if (!info) return LOOM_ERROR(kInvalidArgument, "info is NULL");
  std::memset(info, 0, sizeof(*info));
  // loomCollective_t numbers the collectives in kCollectives' order.
  const CollKind* kinds = kCollectives;
  int c = enumBits(coll), dt = enumBits(datatype);
  if (c < 0 || c > 5) return LOOM_ERROR(kInvalidArgument, "unknown collective {} (valid: 0..5)", c);
  if (!validDataType(dt))
    return LOOM_ERROR(kInvalidArgument, "unknown datatype {} (valid: 0..{})", dt,
                      static_cast<int>(loomNumTypes) - 1);
  Comm* cm = comm->impl.get();
  LOOM_TRY(cm->quiesce());
  // Every collective's root is checked here (the calls ignore it where it means nothing).
  if (root < 0 || root >= cm->nranks())
    return LOOM_ERROR(kInvalidArgument, "root {} is out of range for {} ranks", root, cm->nranks());
  LOOM_TRY(checkShape(kinds[c], count, dataTypeSize(static_cast<loomDataType_t>(dt)), root,
                      cm->nranks()));
  call->coll = kinds[c];
  call->count = count;
  call->dtype = static_cast<loomDataType_t>(dt);
  call->root = root;
  call->inPlace = inPlace != 0;
  return Status();
}

// Appends the host plan's candidates to info.
void addCandidates(const Decision& d, loomPlanInfo_t* info) {
  if (!d.plan) return;
  for (const PlanCandidate& pc : d.plan->candidates) {
    if (info->nCandidates >= LOOM_PLAN_MAX_CANDIDATES) break;
    loomPlanCandidate_t& out = info->candidates[info->nCandidates++];
    copyName(out.name, sizeof(out.name), pc.algorithm);
    out.predictedUs = pc.seconds < 0 ? -1 : pc.seconds * 1e6;
    out.allowed = pc.allowed ? 1 : 0;
  }
}

}  // namespace

loomResult_t loomCommPlanInfoDevice(loomComm_t comm, loomCollective_t coll, size_t count,
                                    loomDataType_t datatype, int root, int inPlace,
                                    loomPlanInfo_t* info) {
  return guarded("loomCommPlanInfoDevice", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(checkComm(scope));
    CallShape call;
    LOOM_TRY(planShape(comm, coll, count, datatype, root, inPlace, info, &call));
    call.sendKind = call.recvKind = MemKind::kCudaDevice;
    if (!device::cudaUsable())
      return LOOM_ERROR(kInvalidUsage, "no CUDA device to plan for: {}",
                        cuda::cudaDriver().status.message());
    Comm* cm = comm->impl.get();
    if (cm->runner()) LOOM_TRY(device::useDevice(cm->runner()->device()));
    Result<device::DeviceSpeeds> speeds = device::currentDeviceSpeeds();
    if (!speeds.isOk())
      return speeds.status().rewritten(
          Code::kInvalidUsage,
          fmt::format("the device to plan for: {} (make one current, cudaSetDevice, or make a "
                      "call on device memory first)",
                      speeds.status().message()));
    CallShape host = call;
    host.sendKind = host.recvKind = MemKind::kHost;  // what the staged path's host calls are
    LOOM_ASSIGN(DevicePlan p, planDeviceCall(cm, host, speeds.value()));
    copyName(info->path, sizeof(info->path), p.path);
    copyName(info->algorithm, sizeof(info->algorithm), p.algorithm);
    copyName(info->source, sizeof(info->source), "model");
    info->predictedUs = p.seconds < 0 ? -1 : p.seconds * 1e6;
    const struct {
      const char* name;
      double sec;
    } paths[] = {{"gdr-schedule", p.gdrSec},
                 {"one-pass", p.onePassSec},
                 {"one-pass-kernels", p.onePassKernelsSec},
                 {"one-pass-engines", p.onePassEnginesSec},
                 {"staged-whole", p.wholeSec},
                 {"staged-pipelined", p.pipelinedSec}};
    for (const auto& e : paths) {
      loomPlanCandidate_t& out = info->candidates[info->nCandidates++];
      copyName(out.name, sizeof(out.name), e.name);
      out.predictedUs = e.sec < 0 ? -1 : e.sec * 1e6;
      out.allowed = e.sec >= 0 ? 1 : 0;
    }
    addCandidates(p.host, info);
    return Status();
  });
}

loomResult_t loomCommPlanInfo(loomComm_t comm, loomCollective_t coll, size_t count,
                              loomDataType_t datatype, int root, int inPlace,
                              loomPlanInfo_t* info) {
  return guarded("loomCommPlanInfo", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(checkComm(scope));
    CallShape call;
    LOOM_TRY(planShape(comm, coll, count, datatype, root, inPlace, info, &call));
    Comm* cm = comm->impl.get();
    LOOM_ASSIGN(Decision d, cm->decide(call, /*explain=*/true));
    // The one pass is reported where it runs on plain buffers (loomMemAlloc buffers are reached
    // at a lower price, so it runs on those too).
    const bool onePass = d.path == Path::kOnePass && d.onePassPlain;
    const Path path = d.path == Path::kOnePass && !onePass ? Path::kSchedule : d.path;
    copyName(info->path, sizeof(info->path), pathName(path));
    copyName(info->algorithm, sizeof(info->algorithm), onePass ? "direct" : d.algorithm);
    copyName(info->source, sizeof(info->source), d.source);
    double predicted = onePass ? d.onePassPlainSec : d.scheduleSec;
    if (onePass && d.onePassPlainSec < 0) predicted = d.predictedSec;
    info->predictedUs = predicted < 0 ? -1 : predicted * 1e6;
    addCandidates(d, info);
    return Status();
  });
}

loomResult_t loomCommSetAlgo(loomComm_t comm, const char* spec) {
  return guarded("loomCommSetAlgo", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(checkComm(scope));
    // The calls of an open group choose their algorithms at loomGroupEnd: which setting would
    // apply to which would depend on that.
    if (tGroup.depth > 0)
      return LOOM_ERROR(kInvalidUsage, "loomCommSetAlgo inside loomGroupStart/loomGroupEnd");
    LOOM_TRY(comm->impl->quiesce());
    if (!spec || !*spec) {
      comm->impl->setAlgoOverride(nullptr);
      return Status();
    }
    LOOM_ASSIGN(AlgoFilter f, AlgoFilter::parse(spec, "loomCommSetAlgo"));
    f.warnOnce();
    comm->impl->setAlgoOverride(std::make_shared<const AlgoFilter>(std::move(f)));
    return Status();
  });
}

loomResult_t loomMemAlloc(void** ptr, size_t size) {
  return guarded("loomMemAlloc", [&]() -> Status {
    if (!ptr) return LOOM_ERROR(kInvalidArgument, "ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return LOOM_ERROR(kInvalidArgument, "size is 0");
    LOOM_ASSIGN(*ptr, shm::sharedAlloc(size));
    return Status();
  });
}

loomResult_t loomMemFree(void* ptr) {
  return guarded("loomMemFree", [&]() -> Status {
    if (!ptr) return Status();  // like free(NULL)
    return shm::sharedFree(ptr);
  });
}

loomResult_t loomCommRegister(loomComm_t comm, void* buff, size_t size, void** handle) {
  return guarded("loomCommRegister", [&]() -> Status {
    if (!handle) return LOOM_ERROR(kInvalidArgument, "handle is NULL");
    *handle = nullptr;
    CallScope scope(comm);
    LOOM_TRY(checkComm(scope));
    if (!buff) return LOOM_ERROR(kInvalidArgument, "buff is NULL");
    if (size == 0) return LOOM_ERROR(kInvalidArgument, "size is 0");
    LOOM_ASSIGN(*handle, comm->impl->registrations().add(buff, size));
    return Status();
  });
}

loomResult_t loomCommDeregister(loomComm_t comm, void* handle) {
  return guarded("loomCommDeregister", [&]() -> Status {
    // A communicator that failed still releases its registrations (its connections are closed:
    // only the record goes).
    CallScope scope(comm);
    LOOM_TRY(scope.check().status());
    if (!handle) return LOOM_ERROR(kInvalidArgument, "handle is NULL");
    return comm->impl->registrations().remove(handle);
  });
}

loomResult_t loomGetUniqueId(loomUniqueId* uniqueId) {
  return guarded("loomGetUniqueId", [&]() -> Status {
    if (!uniqueId) return LOOM_ERROR(kInvalidArgument, "uniqueId is NULL");
    std::memset(uniqueId, 0, sizeof(*uniqueId));
    if (params::kCommId.isSet() && !params::kCommId.str().empty()) {
      LOOM_ASSIGN(UniqueIdInfo info, commIdFromEnv());
      packUniqueId(info, uniqueId);
      return Status();
    }
    return createRootAndId(uniqueId);
  });
}

loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank) {
  return guarded("loomCommInitRank",
                 [&] { return initRank(comm, nranks, commId, rank, nullptr, -1); });
}

loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank,
                                    loomConfig_t* config) {
  return guarded("loomCommInitRankConfig", [&] {
    return initRank(comm, nranks, commId, rank, config, configDevice(config));
  });
}

loomResult_t loomCommInitFromEnv(loomComm_t* comm, loomConfig_t* config) {
  return guarded("loomCommInitFromEnv", [&]() -> Status {
    if (!comm) return LOOM_ERROR(kInvalidArgument, "comm pointer is NULL");
    *comm = nullptr;
    LOOM_TRY(checkConfig(config));
    LOOM_ASSIGN(EnvLaunch env, launchFromEnv());
    LOOM_INFO(kSubInit, "rank {} of {} from {}", env.rank, env.nranks, env.source);
    if (env.rank == 0) LOOM_TRY(startRootAt(env.id));
    logSetThreadRank(env.rank);
    LOOM_ASSIGN(std::unique_ptr<Comm> c, Comm::create(env.id, env.nranks, env.rank, config));
    LOOM_TRY(bindDevice(c.get(), configDevice(config)));
    auto* h = new loomComm();
    h->impl = std::move(c);
    *comm = h;
    return Status();
  });
}

loomResult_t loomCommInitAll(loomComm_t* comms, int ndev, const int* devlist) {
  return guarded("loomCommInitAll", [&]() -> Status {
    if (!comms) return LOOM_ERROR(kInvalidArgument, "comms is NULL");
    if (ndev < 1) return LOOM_ERROR(kInvalidArgument, "ndev {} must be at least 1", ndev);
    for (int r = 0; devlist && r < ndev; ++r)
      LOOM_TRY(checkDeviceIndex(devlist[r], fmt::format("devlist[{}]", r)));
    loomUniqueId id;
    LOOM_TRY(createRootAndId(&id));
    std::vector<Status> results(ndev);
    std::vector<std::thread> threads;
    for (int r = 0; r < ndev; ++r)
      threads.emplace_back([&, r] {
        try {
          results[r] = initRank(&comms[r], ndev, id, r, nullptr, devlist ? devlist[r] : -1);
        } catch (const std::bad_alloc&) {
          results[r] = LOOM_ERROR(kSystem, "out of memory");
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ndev; ++r) {
      if (results[r].isOk()) continue;
      for (int k = 0; k < ndev; ++k) {
        delete comms[k];
        comms[k] = nullptr;
      }
      return results[r].withContext(fmt::format("rank {}", r));
    }
    return Status();
  });
}

loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm,
                           loomConfig_t* config) {
  return guarded("loomCommSplit", [&]() -> Status {
    if (!newcomm) return LOOM_ERROR(kInvalidArgument, "newcomm is NULL");
    *newcomm = nullptr;
    CallScope scope(comm);
    LOOM_TRY(checkComm(scope));
    LOOM_TRY(checkConfig(config));
    if (color < LOOM_SPLIT_NOCOLOR)
      return LOOM_ERROR(kInvalidArgument, "color {} must be >= 0 or LOOM_SPLIT_NOCOLOR", color);
    if (tGroup.depth > 0) return LOOM_ERROR(kInvalidUsage, "loomCommSplit inside a group");
    LOOM_TRY(comm->impl->quiesce());
    LOOM_ASSIGN(std::unique_ptr<Comm> c, comm->impl->split(color, key, config));
    if (c) {
      // Its own device where the config names one, else its parent's where that has one (as
      // NCCL's split keeps the parent's device).
      int dev = configDevice(config);
      if (dev < 0 && comm->impl->runner()) dev = comm->impl->runner()->device();
      LOOM_TRY(bindDevice(c.get(), dev));
      auto* h = new loomComm();
      h->impl = std::move(c);
      *newcomm = h;
    }
    return Status();
  });
}

loomResult_t loomCommFinalize(loomComm_t comm) {
  return guarded("loomCommFinalize", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(scope.check().status());
    // Host calls complete before they return: nothing is outstanding.
    return Status();
  });
}

loomResult_t loomCommDestroy(loomComm_t comm) {
  return guarded("loomCommDestroy", [&]() -> Status {
    // An aborted handle stays allocated (see loomCommAbort): nothing is left to free.
    if (comm != nullptr && comm->aborting.load()) return Status();
    forgetQueued(comm);
    delete comm;
    return Status();
  });
}

loomResult_t loomCommAbort(loomComm_t comm) {
  return guarded("loomCommAbort", [&]() -> Status {
    if (!comm) return Status();
    // The flag first: a call that starts from now on sees it and returns loomAborted without
    // touching the communicator (CallScope); then the calls already running are woken.
    if (comm->aborting.exchange(true)) return Status();  // another thread is aborting it
    Comm* c = comm->impl.get();
    forgetQueued(comm);
    c->requestAbort();
    // Blocked calls see the flag within milliseconds; wait for them to leave before freeing. One
    // look that finds none is enough: a call counted after it (CallScope counts itself, then
    // looks at the flag; both sequentially consistent) sees the flag and leaves without touching
    // the communicator. Looking again after that first zero could catch such a passing call
    // and take it for one still running.
    bool idle = false;
    for (int i = 0; i < 10000 && !(idle = comm->calls.load() == 0); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!idle) {
      LOOM_WARN(
          "loomCommAbort: a call is still running on the communicator after 10 s; leaking it");
      return Status();
    }
    // The communicator goes; the handle (a few bytes) stays, reachable here, so that a call made
    // on it by a thread that has not heard of the abort fails cleanly instead of reading freed
    // memory.
    comm->impl.reset();
    static std::mutex mu;
    static auto* kept = new std::vector<loomComm_t>();
    std::lock_guard<std::mutex> lk(mu);
    kept->push_back(comm);
    return Status();
  });
}

loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError) {
  return guarded("loomCommGetAsyncError", [&]() -> Status {
    if (!asyncError) return LOOM_ERROR(kInvalidArgument, "asyncError is NULL");
    CallScope scope(comm);
    if (comm != nullptr && comm->aborting.load()) {
      *asyncError = loomAborted;
      return Status();
    }
    LOOM_TRY(scope.check().status());
    Status st = comm->impl->asyncError();  // aborted: answered above, from the handle
    *asyncError = st.result();
    // What broke it, for loomGetLastError (the call itself succeeded).
    if (!st.isOk()) tLastError = fmt::format("loomCommGetAsyncError: {}", st.message());
    return Status();
  });
}

loomResult_t loomCommCount(const loomComm_t comm, int* count) {
  return guarded("loomCommCount", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(scope.check().status());
    if (!count) return LOOM_ERROR(kInvalidArgument, "count is NULL");
    *count = comm->impl->nranks();
    return Status();
  });
}

loomResult_t loomCommUserRank(const loomComm_t comm, int* rank) {
  return guarded("loomCommUserRank", [&]() -> Status {
    CallScope scope(comm);
    LOOM_TRY(scope.check().status());
    if (!rank) return LOOM_ERROR(kInvalidArgument, "rank is NULL");
    *rank = comm->impl->rank();
    return Status();
  });
}

loomResult_t loomGroupStart(void) {
  return guarded("loomGroupStart", [&] {
    ++tGroup.depth;
    return Status();
  });
}

loomResult_t loomGroupEnd(void) {
  return guarded("loomGroupEnd", [&]() -> Status {
    if (tGroup.depth == 0) return LOOM_ERROR(kInvalidUsage, "loomGroupEnd without loomGroupStart");
    if (--tGroup.depth > 0) return Status();
    std::vector<QueuedOp> ops;
    ops.swap(tGroup.ops);
    return runGroup(std::move(ops));
  });
}

loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                           loomStream_t stream) {
  return guarded("loomAllReduce", [&] {
    return enqueue(comm, collArgs(CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0),
                   stream);
  });
}

loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, int root, loomComm_t comm,
                           loomStream_t stream) {
  return guarded("loomBroadcast", [&] {
    return enqueue(
        comm, collArgs(CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, loomSum, root),
        stream);
  });
}

loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream) {
  return guarded("loomReduce", [&] {
    return enqueue(comm, collArgs(CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root),
                   stream);
  });
}

loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           loomDataType_t datatype, loomComm_t comm, loomStream_t stream) {
  return guarded("loomAllGather", [&] {
    return enqueue(
        comm, collArgs(CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, loomSum, 0),
        stream);
  });
}

loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                               loomStream_t stream) {
  return guarded("loomReduceScatter", [&] {
    return enqueue(
        comm, collArgs(CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0),
        stream);
  });
}

loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          loomDataType_t datatype, loomComm_t comm, loomStream_t stream) {
  return guarded("loomAllToAll", [&] {
    return enqueue(comm,
                   collArgs(CollKind::kAllToAll, sendbuff, recvbuff, count, datatype, loomSum, 0),
                   stream);
  });
}

loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream) {
  return guarded("loomSend", [&] {
    OpArgs a = collArgs(CollKind::kSendRecv, sendbuff, nullptr, count, datatype, loomSum, 0);
    a.peer = peer;
    a.isSend = true;
    return enqueue(comm, a, stream);
  });
}

loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream) {
  return guarded("loomRecv", [&] {
    OpArgs a = collArgs(CollKind::kSendRecv, nullptr, recvbuff, count, datatype, loomSum, 0);
    a.peer = peer;
    a.isSend = false;
    return enqueue(comm, a, stream);
  });
}

const char* loomGetErrorString(loomResult_t result) {
  switch (result) {
    case loomSuccess:
      return "no error";
    case loomUnhandledCudaError:
      return "unhandled CUDA error";
    case loomSystemError:
      return "system error (a system call failed or a connection was lost)";
    case loomInternalError:
      return "internal error (a bug in Loom)";
    case loomInvalidArgument:
      return "invalid argument";
    case loomInvalidUsage:
      return "invalid usage";
    case loomRemoteError:
      return "remote error (a peer failed or does not match this call)";
    case loomInProgress:
      return "operation in progress";
    case loomTimeout:
      return "timeout (LOOM_TIMEOUT passed)";
    case loomAborted:
      return "communicator aborted";
    default:
      return "unknown result code";
  }
}

const char* loomGetLastError(void) { return tLastError.c_str(); }

}  // extern "C"
