#include "src/runtime/device_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "src/core/collective.h"
#include "src/core/dtype.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/device/device_memory.h"
#include "src/device/kernels.h"
#include "src/runtime/comm.h"
#include "src/runtime/executor.h"
#include "src/runtime/run.h"

namespace loom {

namespace {

// One device range of a call copied to the host before it runs (in) or back after it (out).
struct Copy {
  cuda::CUdeviceptr device;
  char* host;
  size_t bytes;
};

constexpr size_t kAlign = 256;
size_t alignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Signals of destroyed runners whose streams had not passed their last call when the runner went:
// each freed once the event recorded after its last handoff has completed (or can no longer: a
// faulted context drops its streams' work).
struct Retired {
  std::unique_ptr<device::StreamSignal> signal;
  cuda::CUevent passed;
};
std::mutex gRetiredMu;
std::vector<Retired>& retired() {
  static auto* r = new std::vector<Retired>();  // never destroyed: streams may outlive main
  return *r;
}

// Frees the retired signals no stream reads any more.
void reapRetired() {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  std::lock_guard<std::mutex> lk(gRetiredMu);
  auto& r = retired();
  r.erase(std::remove_if(r.begin(), r.end(),
                         [&](Retired& x) {
                           if (api.cuEventQuery(x.passed) == cuda::kErrorNotReady) return false;
                           api.cuEventDestroy(x.passed);
                           return true;
                         }),
          r.end());
}

using StagePlan = DeviceRunner::StagePlan;

// Host-mapped words for kept calls (one each: the graph's wait reads it, the runner writes it).
// Never freed: a graph may be replayed after its communicator and runner are gone, and its wait
// still reads the word. A word is reused once its kept call's graph is gone.
class KeptWords {
 public:
  Result<std::atomic<uint64_t>*> take() {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.empty()) {
      void* page = nullptr;
      LOOM_CU(cuda::cudaDriver().api.cuMemHostAlloc(
          &page, kPage, cuda::kMemHostAllocDeviceMap | cuda::kMemHostAllocPortable));
      auto* words = new (page) std::atomic<uint64_t>[kPage / sizeof(uint64_t)];
      for (size_t i = 0; i < kPage / sizeof(uint64_t); ++i) free_.push_back(&words[i]);
    }
    std::atomic<uint64_t>* w = free_.back();
    free_.pop_back();
    w->store(0, std::memory_order_relaxed);
    return w;
  }
  void give(std::atomic<uint64_t>* w) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(w);
  }

 private:
  static constexpr size_t kPage = 4096;
  std::mutex mu_;
  std::vector<std::atomic<uint64_t>*> free_;
};
KeptWords& keptWords() {
  static auto* w = new KeptWords();  // never destroyed: graphs may outlive main
  return *w;
}

// The capture of stream s (cuStreamGetCaptureInfo, _v3 where the driver has it): its status, id
// and graph (each may be null).
cuda::CUresult captureInfo(cuda::CUstream s, int* status, uint64_t* id, cuda::CUgraph* graph) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  return api.cuStreamGetCaptureInfo3
             ? api.cuStreamGetCaptureInfo3(s, status, id, graph, nullptr, nullptr, nullptr)
             : api.cuStreamGetCaptureInfo(s, status, id, graph, nullptr, nullptr);
}

// Makes stream to wait for what stream from holds now: an event recorded on from and waited on by
// to, then destroyed (the driver keeps it until the wait is over). Under capture it makes no node,
// only the dependency. A group's streams join its first one this way before and after its calls.
Status joinStream(cuda::CUstream from, cuda::CUstream to) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUevent ev = nullptr;
  LOOM_CU(api.cuEventCreate(&ev, cuda::kEventDisableTiming));
  cuda::CUresult rc = api.cuEventRecord(ev, from);
  if (rc == cuda::kSuccess) rc = api.cuStreamWaitEvent(to, ev, 0);
  api.cuEventDestroy(ev);
  return rc == cuda::kSuccess ? Status() : cuda::cudaError(rc, "joining a group's streams");
}

// Whether a job's streams are being captured into a CUDA graph (*captured), refusing what Loom
// cannot keep for a graph.
Status capturedStreams(const std::vector<cuda::CUstream>& streams, bool* captured) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  *captured = false;
  size_t active = 0;
  for (cuda::CUstream s : streams) {
    int c = cuda::kCaptureStatusNone;
    if (api.cuStreamIsCapturing(s, &c) != cuda::kSuccess || c == cuda::kCaptureStatusNone) continue;
    if (c != cuda::kCaptureStatusActive)
      return LOOM_ERROR(kInvalidUsage,
                        "stream {} is in a capture that was invalidated "
                        "(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED): end it and capture again",
                        static_cast<void*>(s));
    ++active;
  }
  if (active == 0) return Status();
  if ((!api.cuStreamGetCaptureInfo && !api.cuStreamGetCaptureInfo3) || !api.cuUserObjectCreate ||
      !api.cuUserObjectRelease || !api.cuGraphRetainUserObject)
    return LOOM_ERROR(kInvalidUsage,
                      "the stream is being captured into a CUDA graph, and this CUDA driver ({}) "
                      "lacks graph user objects (CUDA 11.3 and later have them): make the call "
                      "outside the capture",
                      cuda::cudaDriver().version);
  // A group on several streams: every one of them in the same capture (the graph then joins them
  // at the group, as handOff's events do for eager calls). One stream needs no capture id.
  std::set<uint64_t> ids;
  if (streams.size() > 1 && active == streams.size()) {
    for (cuda::CUstream s : streams) {
      uint64_t id = 0;
      int status = cuda::kCaptureStatusNone;
      cuda::CUresult rc = captureInfo(s, &status, &id, nullptr);
      if (rc != cuda::kSuccess) return cuda::cudaError(rc, "cuStreamGetCaptureInfo");
      if (status == cuda::kCaptureStatusActive) ids.insert(id);
    }
  }
  if (active < streams.size() || ids.size() > 1)
    return LOOM_ERROR(kInvalidUsage,
                      "a group's calls are on {} streams, {} of them being captured into a CUDA "
                      "graph{}: a group's streams must all be in one capture (fork the others "
                      "into it: an event recorded on the capturing stream, waited on by them)",
                      streams.size(), active,
                      ids.size() > 1 ? fmt::format(" ({} different captures)", ids.size()) : "");
  *captured = true;
  return Status();
}

// A staging copy the driver refused, naming the buffer: a device buffer freed after an enqueued
// call was made and before the stream reached it is the usual cause.
Status copyFailed(cuda::CUresult rc, int rank, cuda::CUdeviceptr device, size_t bytes,
                  bool toHost) {
  return cuda::cudaError(rc, "cuMemcpyAsync")
      .withContext(fmt::format(
          "rank {}: staging device buffer {:#x} ({} bytes) {} the host{}", rank, device, bytes,
          toHost ? "to" : "from",
          rc == cuda::kErrorInvalidValue ? " (was it freed before the call ran?)" : ""));
}

constexpr size_t kMinRowChunk = 64 << 10;  // a pipelined chunk's least bytes per row

}  // namespace

bool DeviceRunner::pipelineOf(const QueuedOp& call, int n, size_t chunkBytes, StagePlan* p) {
  const OpArgs& a = call.args;
  if (!chunkBytes || !(call.inDevice || call.outDevice) || a.count == 0) return false;
  switch (a.coll) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      break;
    case CollKind::kAllGather:
      p->outRows = n;
      break;
    case CollKind::kReduceScatter:
      p->inRows = n;
      break;
    case CollKind::kAllToAll:
      p->inRows = p->outRows = n;
      break;
    default:
      return false;
  }
  const size_t es = dataTypeSize(a.dtype);
  const size_t rows = static_cast<size_t>(std::max(p->inRows, p->outRows));
  // Chunks of a whole number of kAlign-byte units per row, kMinRowChunk at least.
  const size_t rowBytes = std::max(kMinRowChunk, chunkBytes / rows) / kAlign * kAlign;
  p->chunkElems = std::max<size_t>(1, rowBytes / es);
  p->chunks = (a.count + p->chunkElems - 1) / p->chunkElems;
  if (p->chunks < 2) {
    *p = StagePlan{};
    return false;
  }
  p->inSlot = alignUp(static_cast<size_t>(p->inRows) * p->chunkElems * es);
  p->outSlot = alignUp(static_cast<size_t>(p->outRows) * p->chunkElems * es);
  return true;
}

namespace {

// The plans of a job's calls, packed one after the other; returns the pinned bytes they need.
size_t planStaging(const std::vector<QueuedOp>& calls, int n, size_t chunkBytes,
                   std::vector<StagePlan>* plans) {
  plans->assign(calls.size(), StagePlan{});
  if (calls.size() == 1 && DeviceRunner::pipelineOf(calls[0], n, chunkBytes, &(*plans)[0]))
    return DeviceRunner::kSlots * ((*plans)[0].inSlot + (*plans)[0].outSlot);
  size_t total = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const OpArgs& a = calls[i].args;
    StagePlan& p = (*plans)[i];
    const size_t es = dataTypeSize(a.dtype);
    const CollCounts c = collCounts(a.coll, a.count, n);
    const bool inDev = calls[i].inDevice, outDev = calls[i].outDevice;
    if (a.inPlace && (inDev || outDev)) {
      // The larger buffer holds the other (ReduceScatter: the input; else the output).
      p.whole = true;
      p.stageIn = p.stageOut = true;
      p.inBytes = (a.coll == CollKind::kReduceScatter ? c.input : c.output) * es;
      p.inOff = total;
      total += alignUp(p.inBytes);
      continue;
    }
    if (inDev) {
      p.stageIn = true;
      p.inBytes = c.input * es;
      p.inOff = total;
      total += alignUp(p.inBytes);
    }
    if (outDev) {
      p.stageOut = true;
      p.outBytes = c.output * es;
      p.outOff = total;
      total += alignUp(p.outBytes);
    }
  }
  return total;
}

}  // namespace

struct DeviceRunner::Port {
  std::mutex mu;
  DeviceRunner* runner = nullptr;  // null once the runner is going
  std::vector<Kept*> live;         // kept calls whose graphs are alive
  std::vector<Kept*> dead;         // gone while the runner lived: holds to release (reapKept)
};

struct DeviceRunner::Kept {
  std::shared_ptr<Port> port;
  int rank = 0;
  std::vector<QueuedOp> calls;
  std::vector<StagePlan> plans;
  DeviceOnePass::Exported exported;
  std::vector<void*> holds;  // the buffers' registrations (GPUDirect RDMA), released at reapKept
  char* staging = nullptr;
  size_t stagingBytes = 0;
  std::atomic<uint64_t>* done = nullptr;  // 0 while a replay runs, 1 when it is done
  std::atomic<bool> inFlight{false};
};

Result<std::unique_ptr<DeviceRunner>> DeviceRunner::create(Comm* comm, int device) {
  cuda::RelaxedCapture relaxed;  // the first call may be made on a stream being captured
  std::unique_ptr<DeviceRunner> r(new DeviceRunner(comm, device));
  r->port_ = std::make_shared<Port>();
  r->port_->runner = r.get();
  LOOM_TRY(device::useDevice(device));
  reapRetired();
  // Loom's kernels are loaded here, before any call: loading waits for the device's other work,
  // which may be a stream waiting for a call of this runner (the one pass's kernels run on the
  // runner thread, the wait kernel's launch on the calling thread). Without them calls are staged
  // (DeviceOnePass says why).
  if (device::imageHasDeviceCode()) (void)device::loadKernels();
  LOOM_ASSIGN(device::StreamSignal * s, device::StreamSignal::create());
  r->signal_.reset(s);
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  LOOM_CU(api.cuStreamCreate(&r->stream_, cuda::kStreamNonBlocking));
  LOOM_CU(api.cuStreamCreate(&r->backStream_, cuda::kStreamNonBlocking));
  LOOM_CU(api.cuEventCreate(&r->passed_, cuda::kEventDisableTiming));
  for (size_t i = 0; i < kSlots; ++i) {
    LOOM_CU(api.cuEventCreate(&r->inDone_[i], cuda::kEventDisableTiming));
    LOOM_CU(api.cuEventCreate(&r->outDone_[i], cuda::kEventDisableTiming));
  }
  r->stageChunk_ = static_cast<size_t>(std::max<int64_t>(0, params::kDeviceStageChunk.asInt()));
  r->onePass_ = std::make_unique<DeviceOnePass>(comm, device, r->stream_);
  r->thread_ = std::thread([p = r.get()] { p->loop(); });
  // Which path, and why not GPUDirect RDMA where it is not (no silent fallback to staging).
  std::string path =
      comm->deviceSchedule()
          ? "on the schedule, the network reading and writing the device buffers (GPUDirect RDMA)"
      : r->onePass_->usable() ? "in one pass over the peers' device buffers where they apply, "
                                "else staged through pinned host memory"
                              : "staged through pinned host memory";
  if (!comm->deviceSchedule()) path += "; not GPUDirect RDMA: " + comm->deviceScheduleWhyNot();
  LOOM_INFO(kSubInit, "rank {}: device calls on CUDA device {}, {}; streams signalled by {}",
            comm->rank(), device, path,
            s->memOps() ? "stream memory operations" : "a host function and a wait kernel");
  return r;
}

DeviceRunner::~DeviceRunner() {
  cuda::RelaxedCapture relaxed;
  // Graphs reaching a kept call from now on find no runner (onReplay); the registrations of the
  // kept calls go with the transport, here.
  std::vector<void*> keptHolds;
  std::vector<Kept*> gone;
  if (port_) {
    std::lock_guard<std::mutex> lk(port_->mu);
    port_->runner = nullptr;
    for (Kept* k : port_->live) {
      keptHolds.insert(keptHolds.end(), k->holds.begin(), k->holds.end());
      k->holds.clear();
    }
    gone.swap(port_->dead);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lk(openMu_);
    openStop_ = true;
  }
  openCv_.notify_all();
  if (opener_.joinable()) opener_.join();
  for (Kept* k : gone) {
    keptHolds.insert(keptHolds.end(), k->holds.begin(), k->holds.end());
    keptWords().give(k->done);
    delete k;
  }
  for (void* h : keptHolds) comm_->transport()->releaseMemory(h);
  // Every job is finished now: their registrations go before the memory does.
  for (auto& job : holding_) releaseHolds(job.get());
  if (scratchHold_) comm_->transport()->releaseMemory(scratchHold_);
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  for (cuda::CUstream s : {stream_, backStream_}) {
    if (!s) continue;
    api.cuStreamSynchronize(s);
    api.cuStreamDestroy(s);
  }
  for (size_t i = 0; i < kSlots; ++i)
    for (cuda::CUevent ev : {inDone_[i], outDone_[i]})
      if (ev) api.cuEventDestroy(ev);
  if (pinned_) api.cuMemFreeHost(pinned_);
  for (char* p : outgrown_) api.cuMemFreeHost(p);
  if (scratch_) api.cuMemFree(scratch_);
  for (cuda::CUdeviceptr p : outgrownScratch_) api.cuMemFree(p);
  onePass_.reset();  // closes its IPC mappings
  if (passed_) {
    if (signal_ && api.cuEventQuery(passed_) == cuda::kErrorNotReady) {
      LOOM_INFO(kSubInit,
                "rank {}: a stream has not yet reached its last call; its signal is freed when "
                "it has",
                comm_->rank());
      std::lock_guard<std::mutex> lk(gRetiredMu);
      retired().push_back({std::move(signal_), passed_});
    } else {
      api.cuEventDestroy(passed_);
    }
  }
  signal_.reset();
  reapRetired();
}

Result<std::shared_ptr<DeviceRunner::Job>> DeviceRunner::post(std::vector<QueuedOp> calls,
                                                              std::vector<cuda::CUstream> streams) {
  // The allocations and synchronization below are forbidden while a stream capture is under way
  // (this call's own, or another thread's in GLOBAL mode) unless this thread is RELAXED.
  cuda::RelaxedCapture relaxed;
  auto job = std::make_shared<Job>();
  job->calls = std::move(calls);
  job->streams = std::move(streams);
  LOOM_TRY(device::useDevice(device_));
  bool captured = false;
  LOOM_TRY(capturedStreams(job->streams, &captured));
  reapKept();
  // The driver's IPC calls here, not on the runner: the peers' handles a call found unopened,
  // and this call's own.
  onePass_->prepare();
  if (job->calls.size() == 1 && onePass_->tries(job->calls[0]))
    job->exported = onePass_->exportBuffers(job->calls[0]);
  LOOM_TRY(reserveStaging(job.get()));
  releaseFinishedHolds();
  LOOM_TRY(holdRegistrations(job.get()));
  if (captured) {
    Status kept = capture(job.get());
    if (!kept.isOk()) {
      releaseHolds(job.get());
      return kept;
    }
    job->finished = true;  // nothing to wait for: the graph's replays run it
    return job;
  }
  Status queued = job->streams.empty() ? Status() : handOff(job.get());
  if (queued.isOk()) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) {
      queued = LOOM_ERROR(kInvalidUsage, "the communicator is being destroyed");
    } else {
      jobs_.push_back(job);
      cv_.notify_all();
    }
  }
  if (!queued.isOk()) {
    releaseHolds(job.get());
    return queued;
  }
  if (!job->holds.empty()) holding_.push_back(job);
  return job;
}

Status DeviceRunner::handOff(Job* job) {
  // The first stream carries the handoff; the others join it before and after, as a group's
  // streams must all reach the calls and all wait for them.
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUstream lead = job->streams[0];
  for (size_t i = 1; i < job->streams.size(); ++i) LOOM_TRY(joinStream(job->streams[i], lead));
  job->seq = ++nextSeq_;
  LOOM_TRY(signal_->enqueue(lead, job->seq));
  LOOM_CU(api.cuEventRecord(passed_, lead));
  for (size_t i = 1; i < job->streams.size(); ++i) LOOM_TRY(joinStream(lead, job->streams[i]));
  return Status();
}

Status DeviceRunner::capture(Job* job) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUstream s = job->streams[0];
  auto k = std::make_unique<Kept>();
  k->port = port_;
  k->rank = comm_->rank();
  k->calls = job->calls;
  k->plans = job->plans;
  k->exported = job->exported;
  k->staging = job->staging;
  k->stagingBytes = job->stagingBytes;
  LOOM_ASSIGN(k->done, keptWords().take());
  cuda::CUdeviceptr done = 0;
  int status = cuda::kCaptureStatusNone;
  cuda::CUgraph graph = nullptr;
  cuda::CUuserObject obj = nullptr;
  cuda::CUresult rc = api.cuMemHostGetDevicePointer(&done, k->done, 0);
  if (rc == cuda::kSuccess) rc = captureInfo(s, &status, nullptr, &graph);
  if (rc == cuda::kSuccess && (status != cuda::kCaptureStatusActive || graph == nullptr))
    rc = cuda::kErrorStreamCaptureUnsupported;
  if (rc == cuda::kSuccess)
    rc = api.cuUserObjectCreate(&obj, k.get(), &onGraphGone, 1, cuda::kUserObjectNoDestructorSync);
  if (rc != cuda::kSuccess) {
    keptWords().give(k->done);
    return cuda::cudaError(rc, "keeping a call for a CUDA graph")
        .withContext(fmt::format("rank {}: the stream's capture", comm_->rank()));
  }
  Kept* kept = k.release();  // the user object's now: onGraphGone frees it
  rc = api.cuGraphRetainUserObject(graph, obj, 1, cuda::kGraphUserObjectMove);
  if (rc != cuda::kSuccess) {
    api.cuUserObjectRelease(obj, 1);  // frees it (it holds no registrations yet)
    return cuda::cudaError(rc, "cuGraphRetainUserObject");
  }
  {
    std::lock_guard<std::mutex> lk(port_->mu);
    kept->holds = std::move(job->holds);
    job->holds.clear();
    port_->live.push_back(kept);
  }
  // What the graph does where the call is: admit it, then wait until it is done; a group's other
  // streams join the first before and wait for it after. From here a failure leaves the kept call
  // with the graph (freed with it), which the capture's error has made unusable.
  for (size_t i = 1; i < job->streams.size(); ++i) LOOM_TRY(joinStream(job->streams[i], s));
  LOOM_CU(api.cuLaunchHostFunc(s, &onReplay, kept));
  if (signal_->memOps()) {
    LOOM_CU(api.cuStreamWaitValue64(s, done, 1, cuda::kStreamWaitValueGeq));
  } else {
    LOOM_TRY(device::launchWaitFlag(s, reinterpret_cast<const uint64_t*>(done), 1));
  }
  for (size_t i = 1; i < job->streams.size(); ++i) LOOM_TRY(joinStream(s, job->streams[i]));
  if (onePass_->usable() && !openerStarted_.exchange(true))
    opener_ = std::thread([this] { openerLoop(); });
  LOOM_INFO(kSubColl, "rank {}: {} call(s) kept for the CUDA graph being captured on stream {}",
            comm_->rank(), job->calls.size(), static_cast<void*>(s));
  return Status();
}

void DeviceRunner::openerLoop() {
  cuda::RelaxedCapture relaxed;
  if (!device::useDevice(device_).isOk()) return;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(openMu_);
      openCv_.wait(lk, [&] { return openWanted_ || openStop_; });
      if (openStop_) return;
      openWanted_ = false;
    }
    onePass_->prepare();
  }
}

void DeviceRunner::onReplay(void* p) {
  auto* k = static_cast<Kept*>(p);
  std::lock_guard<std::mutex> lk(k->port->mu);
  DeviceRunner* r = k->port->runner;
  if (r == nullptr) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      LOOM_WARN(
          "rank {}: a CUDA graph reached a Loom call of a communicator that was destroyed: the "
          "call does nothing, and the graph goes on",
          k->rank);
    k->done->store(1, std::memory_order_release);
    return;
  }
  if (k->inFlight.exchange(true, std::memory_order_acq_rel)) {
    // The replay still running releases this launch's wait too (one word); the communicator
    // fails after it.
    Status st = LOOM_ERROR(kInvalidUsage,
                           "rank {}: a CUDA graph reached a Loom call that a launch of the same "
                           "graph was still running (two executable graphs of it launched at "
                           "once?): their calls have no order between ranks, and this launch's "
                           "call did not run",
                           k->rank);
    LOOM_WARN("{}", st.message());
    r->admitFailure(std::move(st));
    return;
  }
  k->done->store(0, std::memory_order_release);
  r->admit(k);
}

void DeviceRunner::onGraphGone(void* p) {
  auto* k = static_cast<Kept*>(p);
  std::shared_ptr<Port> port = k->port;
  {
    std::lock_guard<std::mutex> lk(port->mu);
    auto& live = port->live;
    live.erase(std::remove(live.begin(), live.end(), k), live.end());
    if (port->runner != nullptr && !k->holds.empty()) {
      port->dead.push_back(k);  // the registrations go on the posting thread (reapKept)
      return;
    }
  }
  keptWords().give(k->done);
  delete k;
}

void DeviceRunner::admit(Kept* k) {
  auto job = std::make_shared<Job>();
  job->calls = k->calls;
  job->plans = k->plans;
  job->exported = k->exported;
  job->staging = k->staging;
  job->stagingBytes = k->stagingBytes;
  job->kept = k;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stop_) {
      replays_.push_back(std::move(job));
      cv_.notify_all();
      return;
    }
  }
  finish(job.get(), LOOM_ERROR(kInvalidUsage, "the communicator is being destroyed"));
}

void DeviceRunner::admitFailure(Status why) {
  auto job = std::make_shared<Job>();
  job->refused = std::move(why);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stop_) {
      replays_.push_back(std::move(job));
      cv_.notify_all();
    }
  }
}

void DeviceRunner::reapKept() {
  std::vector<Kept*> dead;
  {
    std::lock_guard<std::mutex> lk(port_->mu);
    dead.swap(port_->dead);
  }
  for (Kept* k : dead) {
    for (void* h : k->holds) comm_->transport()->releaseMemory(h);
    keptWords().give(k->done);
    delete k;
  }
}

Status DeviceRunner::holdRegistrations(Job* job) {
  net::Transport* t = comm_->transport();
  if (!comm_->deviceSchedule() || t == nullptr) return Status();
  // Device 0: the one Connections listens and connects on.
  auto hold = [&](const void* p, size_t bytes, void** out) -> Status {
    return t->holdMemory(0, p, bytes, net::kPtrCuda, out)
        .withContext(fmt::format("rank {}: registering device buffer {} ({} bytes) for GPUDirect "
                                 "RDMA",
                                 comm_->rank(), p, bytes));
  };
  cuda::CUdeviceptr scratch = 0;
  size_t scratchBytes = 0;
  {
    std::lock_guard<std::mutex> lk(scratchMu_);
    scratch = scratch_;
    scratchBytes = scratchBytes_;
  }
  if (scratch != scratchHeldAt_) {  // reserveStaging grew it (or the runner did, and registered it)
    if (scratchHold_) t->releaseMemory(scratchHold_);
    scratchHold_ = nullptr;
    scratchHeldAt_ = 0;
    if (scratch) LOOM_TRY(hold(reinterpret_cast<void*>(scratch), scratchBytes, &scratchHold_));
    scratchHeldAt_ = scratch;
  }
  const int me = comm_->rank();
  for (const QueuedOp& q : job->calls) {
    const OpArgs& a = q.args;
    const CollCounts c = collCounts(a.coll, a.count, comm_->nranks());
    const size_t es = dataTypeSize(a.dtype);
    const void* bufs[] = {
        q.inDevice && collUsesInput(a.coll, me, a.root, a.isSend) ? a.sendbuff : nullptr,
        q.outDevice && collUsesOutput(a.coll, me, a.root, a.isSend) ? a.recvbuff : nullptr};
    const size_t bytes[] = {c.input * es, c.output * es};
    for (int i = 0; i < 2; ++i) {
      if (bufs[i] == nullptr || bytes[i] == 0) continue;  // nothing moves
      void* h = nullptr;
      Status st = hold(bufs[i], bytes[i], &h);
      if (!st.isOk()) {
        releaseHolds(job);
        return st;
      }
      if (h) job->holds.push_back(h);
    }
  }
  return Status();
}

void DeviceRunner::releaseHolds(Job* job) {
  for (void* h : job->holds) comm_->transport()->releaseMemory(h);
  job->holds.clear();
}

void DeviceRunner::releaseFinishedHolds() {
  while (!holding_.empty()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!holding_.front()->finished) return;  // jobs finish in order
    }
    releaseHolds(holding_.front().get());
    holding_.pop_front();
  }
}

Status DeviceRunner::wait(const std::shared_ptr<Job>& job) {
  if (job->seq) return Status();  // on streams: enqueued
  Status st;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return job->finished; });
    st = job->status;
  }
  releaseFinishedHolds();
  return st;
}

void DeviceRunner::finish(Job* job, Status st) {
  if (job->seq) signal_->release(job->seq);
  if (job->kept) {  // the graph goes on (and may free the kept call) once the word is written
    job->kept->inFlight.store(false, std::memory_order_release);
    job->kept->done->store(1, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lk(mu_);
  job->status = std::move(st);
  job->finished = true;
  cv_.notify_all();
}

void DeviceRunner::loop() {
  // This thread synchronizes and queries while users' streams may be being captured.
  cuda::RelaxedCapture relaxed;
  Status ctx = device::useDevice(device_);
  // After a replay: the opener opens what it found unopened, for the next replay.
  auto wakeOpener = [&] {
    if (!openerStarted_.load() || !onePass_->wanting()) return;
    {
      std::lock_guard<std::mutex> lk(openMu_);
      openWanted_ = true;
    }
    openCv_.notify_all();
  };
  // A replay a graph admitted (or null), taken under mu_.
  auto takeReplay = [&]() -> std::shared_ptr<Job> {
    if (replays_.empty()) return nullptr;
    std::shared_ptr<Job> r = std::move(replays_.front());
    replays_.pop_front();
    return r;
  };
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty() || !replays_.empty(); });
      // A graph's replay first: it was admitted when its stream reached it, so every call still
      // queued on that stream is behind it.
      job = takeReplay();
      if (!job) {
        if (jobs_.empty()) return;  // stopping, nothing left
        job = jobs_.front();
        jobs_.pop_front();
      }
      if (stop_) {
        lk.unlock();
        Status why = comm_->asyncError();
        finish(job.get(), why.isOk() ? LOOM_ERROR(kInvalidUsage,
                                                  "the communicator was destroyed with this call "
                                                  "pending on a stream")
                                     : why);
        continue;
      }
    }
    // The stream's own work before the call: no deadline (it may be long), but an abort, a
    // failure or destruction ends the wait, and so does a stream that can no longer get here (its
    // context faulted: the driver dropped its work). Graphs' replays admitted meanwhile run
    // meanwhile (they may be what the stream waits for).
    Status st = ctx;
    if (st.isOk() && job->seq) {
      int64_t napUs = 1;
      const cuda::DriverApi& api = cuda::cudaDriver().api;
      while (!signal_->isReady(job->seq)) {
        if (comm_->aborted()) {
          st = LOOM_ERROR(kAborted, "communicator aborted (loomCommAbort)");
          break;
        }
        if (napUs >= 1000) {
          const cuda::CUresult q = api.cuStreamQuery(job->streams[0]);
          if (q != cuda::kErrorNotReady && !signal_->isReady(job->seq)) {
            st = q != cuda::kSuccess
                     ? cuda::cudaError(q, "cuStreamQuery")
                           .withContext("the stream failed before it reached the call")
                     : LOOM_ERROR(kInternal, "the stream completed without reaching the call");
            break;
          }
        }
        std::shared_ptr<Job> replay;
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (stop_) {
            st = LOOM_ERROR(kInvalidUsage,
                            "the communicator was destroyed before its stream reached this call");
            break;
          }
          replay = takeReplay();
        }
        if (replay) {
          execute(replay.get(), ctx);
          wakeOpener();
          napUs = 1;
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(napUs));
        napUs = std::min<int64_t>(napUs * 2, 1000);
      }
    }
    execute(job.get(), st);
    if (job->kept) wakeOpener();
  }
}

void DeviceRunner::execute(Job* job, Status st) {
  if (st.isOk() && !job->refused.isOk()) st = job->refused;
  if (st.isOk()) {
    Status failed = comm_->asyncError();
    st = failed.isOk() ? run(*job) : failed;
  }
  if (!st.isOk() && st.code() != Code::kAborted && comm_->asyncError().isOk()) comm_->fail(st);
  if (!st.isOk() && (job->seq || job->kept))
    LOOM_WARN(
        "rank {}: a call on a CUDA stream{} failed (the stream is released; "
        "loomCommGetAsyncError reports it): {}",
        comm_->rank(), job->kept ? " (a CUDA graph's)" : "", st.message());
  finish(job, st);
}

Status DeviceRunner::reserveStaging(Job* job) {
  if (comm_->deviceSchedule()) {  // GPUDirect RDMA: nothing is staged (runOnSchedule)
    job->plans.assign(job->calls.size(), StagePlan{});
    // A job without device memory runs as host calls (run), decided there.
    if (std::none_of(job->calls.begin(), job->calls.end(),
                     [](const QueuedOp& q) { return q.inDevice || q.outDevice; }))
      return Status();
    // The schedule's device scratch instead, here rather than on the runner: each call decided
    // and its schedule built here (the runner then finds both made), and what the schedules take
    // reserved as the executor will lay it out (scheduleScratchBytes), so that the runner
    // allocates nothing. (If it ever must, deviceScratch grows it there, and says so.)
    const bool grouped = job->calls.size() > 1;
    const size_t pieceBytes = static_cast<size_t>(std::max<int64_t>(params::kChunkSize.asInt(), 1));
    size_t need = 0;
    for (size_t i = 0; i < job->calls.size(); ++i) {
      QueuedOp& q = job->calls[i];
      LOOM_TRY(decideOnSchedule(&q, grouped));
      if (!(q.inDevice || q.outDevice)) continue;  // host calls take the host scratch
      LOOM_ASSIGN(auto sched, comm_->schedules().get(q.args, comm_->rank(), comm_->nranks(),
                                                     comm_->rankLayout(), q.algorithm, pieceBytes));
      // A receive that overlaps a send of its group is received into a copy (executeOps).
      bool blocked = false;
      for (size_t k = 0; k < job->calls.size() && !blocked; ++k)
        blocked = k != i && receiveOverlapsSend(q.args, job->calls[k].args);
      need += scheduleScratchBytes(*sched, q.args, blocked);
    }
    return growScratch(need);
  }
  const size_t need = planStaging(job->calls, comm_->nranks(), stageChunk_, &job->plans);
  LOOM_TRY(growStaging(need));
  job->staging = pinned_;
  job->stagingBytes = pinnedBytes_;
  return Status();
}

Status DeviceRunner::reserveAhead() {
  // Only ranks as threads need it: a rank alone in its process allocates on the thread that posts
  // its own calls, which no other rank's thread holds up.
  if (comm_->deviceSchedule() || stageChunk_ == 0 || !comm_->sharesProcess()) return Status();
  // A pipelined call takes kSlots slots of its rows' chunks in and out, each row's chunk at most
  // max(kMinRowChunk, chunk / rows) (pipelineOf); a call staged whole is under two chunks per row
  // each way. Rows: nranks at most.
  const size_t rows = static_cast<size_t>(comm_->nranks());
  const size_t slot = alignUp(std::max(rows * kMinRowChunk, stageChunk_) + kAlign);
  return growStaging(kSlots * 2 * slot);
}

Status DeviceRunner::growStaging(size_t need) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  if (need > pinnedBytes_) {
    const size_t want = std::max(need, pinnedBytes_ * 2);
    void* p = nullptr;
    const cuda::CUresult rc = api.cuMemHostAlloc(&p, want, cuda::kMemHostAllocPortable);
    if (rc != cuda::kSuccess)
      return cuda::cudaError(rc, "cuMemHostAlloc")
          .withContext(fmt::format("rank {}: {} bytes of pinned host memory to stage device "
                                   "buffers through",
                                   comm_->rank(), want));
    // The outgrown buffer stays until the runner goes (at most as much again, the growth being
    // geometric): a job in flight may use it, and cuMemFreeHost waits until the whole device is
    // idle, which a stream of another communicator of this process may only get to once this
    // thread's call runs (the emulated device aborts there, as a real one hangs).
    if (pinned_) outgrown_.push_back(pinned_);
    pinned_ = static_cast<char*>(p);
    pinnedBytes_ = want;
  }
  return Status();
}

Status DeviceRunner::run(Job& job) {
  // A call without a stream on device memory comes after the work already on the context's
  // default (legacy) stream, as NCCL's calls on stream 0 do: the caller may have just filled its
  // buffers there.
  if (!job.seq && !job.kept &&
      std::any_of(job.calls.begin(), job.calls.end(),
                  [](const QueuedOp& q) { return q.inDevice || q.outDevice; })) {
    const cuda::CUresult rc = cuda::cudaDriver().api.cuStreamSynchronize(nullptr);
    if (rc != cuda::kSuccess)
      return cuda::cudaError(rc, "cuStreamSynchronize")
          .withContext("the default stream's work before the call failed");
  }
  if (job.calls.size() == 1 && onePass_->tries(job.calls[0])) {
    bool ran = false;
    LOOM_TRY(onePass_->run(job.calls[0], job.exported, &ran));
    if (ran) return Status();
  }
  if (comm_->deviceSchedule() &&
      std::any_of(job.calls.begin(), job.calls.end(),
                  [](const QueuedOp& q) { return q.inDevice || q.outDevice; }))
    return runOnSchedule(job);
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  const int me = comm_->rank();
  // Planned, and its pinned memory reserved, by post() on the calling thread: never allocated here
  // (see reserveStaging).
  const std::vector<StagePlan>& plans = job.plans;
  char* host = job.staging;
  if (job.calls.size() == 1 && plans[0].chunks >= 2)
    return runPipelined(job.calls[0], plans[0], host);
  std::vector<QueuedOp> hostCalls = job.calls;
  std::vector<Copy> ins, outs;
  for (size_t i = 0; i < job.calls.size(); ++i) {
    const OpArgs& a = job.calls[i].args;
    OpArgs& h = hostCalls[i].args;
    const StagePlan& p = plans[i];
    const size_t es = dataTypeSize(a.dtype);
    if (p.whole) {
      const bool rs = a.coll == CollKind::kReduceScatter;
      const char* base = static_cast<const char*>(rs ? a.sendbuff : a.recvbuff);
      char* hb = host + p.inOff;
      const size_t block = collInPlaceOffset(a.coll, a.count, me) * es;
      ins.push_back({reinterpret_cast<cuda::CUdeviceptr>(base), hb, p.inBytes});
      outs.push_back({reinterpret_cast<cuda::CUdeviceptr>(base), hb, p.inBytes});
      if (rs) {
        h.sendbuff = hb;
        h.recvbuff = hb + block;
      } else {
        h.recvbuff = hb;
        h.sendbuff = hb + block;
      }
      continue;
    }
    if (p.stageIn) {
      ins.push_back({reinterpret_cast<cuda::CUdeviceptr>(a.sendbuff), host + p.inOff, p.inBytes});
      h.sendbuff = host + p.inOff;
    }
    if (p.stageOut) {
      outs.push_back(
          {reinterpret_cast<cuda::CUdeviceptr>(a.recvbuff), host + p.outOff, p.outBytes});
      h.recvbuff = host + p.outOff;
    }
  }
  auto copies = [&](const std::vector<Copy>& list, bool toHost) -> Status {
    for (const Copy& c : list) {
      if (!c.bytes) continue;
      const auto pinned = reinterpret_cast<cuda::CUdeviceptr>(c.host);
      const cuda::CUresult rc = toHost ? api.cuMemcpyAsync(pinned, c.device, c.bytes, stream_)
                                       : api.cuMemcpyAsync(c.device, pinned, c.bytes, stream_);
      if (rc != cuda::kSuccess) return copyFailed(rc, me, c.device, c.bytes, toHost);
    }
    if (!list.empty()) LOOM_CU(api.cuStreamSynchronize(stream_));
    return Status();
  };
  LOOM_TRY(copies(ins, true));
  LOOM_TRY(runCalls(hostCalls));
  LOOM_TRY(copies(outs, false));
  return Status();
}

Status DeviceRunner::runPipelined(const QueuedOp& call, const StagePlan& p, char* host) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  const OpArgs& a = call.args;
  const int me = comm_->rank();
  const size_t es = dataTypeSize(a.dtype);
  const bool usesIn = collUsesInput(a.coll, me, a.root, a.isSend) && a.sendbuff;
  const bool usesOut = collUsesOutput(a.coll, me, a.root, a.isSend) && a.recvbuff;
  auto slotIn = [&](size_t j) { return host + (j % kSlots) * (p.inSlot + p.outSlot); };
  auto slotOut = [&](size_t j) { return slotIn(j) + p.inSlot; };
  auto elems = [&](size_t j) { return std::min(p.chunkElems, a.count - j * p.chunkElems); };
  // Chunk j of every row of the input to its slot (toHost), or from its slot to the output: by
  // the copy engines for device memory (Loom's stream in, backStream_ out, then the slot's
  // event), by the CPU for host memory.
  auto move = [&](size_t j, bool toHost) -> Status {
    const bool device = toHost ? call.inDevice : call.outDevice;
    char* user = toHost ? const_cast<char*>(static_cast<const char*>(a.sendbuff))
                        : static_cast<char*>(a.recvbuff);
    char* slot = toHost ? slotIn(j) : slotOut(j);
    const size_t bytes = elems(j) * es, off = j * p.chunkElems * es;
    cuda::CUstream s = toHost ? stream_ : backStream_;
    for (int r = 0; r < (toHost ? p.inRows : p.outRows); ++r) {
      char* u = user + static_cast<size_t>(r) * a.count * es + off;
      char* h = slot + static_cast<size_t>(r) * bytes;
      if (!device) {
        std::memcpy(toHost ? h : u, toHost ? u : h, bytes);
        continue;
      }
      const auto du = reinterpret_cast<cuda::CUdeviceptr>(u);
      const auto dh = reinterpret_cast<cuda::CUdeviceptr>(h);
      const cuda::CUresult rc =
          toHost ? api.cuMemcpyAsync(dh, du, bytes, s) : api.cuMemcpyAsync(du, dh, bytes, s);
      if (rc != cuda::kSuccess) return copyFailed(rc, me, du, bytes, toHost);
    }
    LOOM_CU(api.cuEventRecord(toHost ? inDone_[j % kSlots] : outDone_[j % kSlots], s));
    return Status();
  };
  auto waitFor = [&](cuda::CUevent ev, const char* what) -> Status {
    const cuda::CUresult rc = api.cuEventSynchronize(ev);
    if (rc != cuda::kSuccess)
      return cuda::cudaError(rc, "cuEventSynchronize")
          .withContext(fmt::format("rank {}: a pipelined staging copy {} the host", me, what));
    return Status();
  };
  auto pipeline = [&]() -> Status {
    for (size_t j = 0; j < std::min(kSlots, p.chunks); ++j)
      if (usesIn) LOOM_TRY(move(j, true));
    for (size_t j = 0; j < p.chunks; ++j) {
      if (usesIn) LOOM_TRY(waitFor(inDone_[j % kSlots], "to"));
      // The slot's output part is free once the copy back of chunk j - kSlots is done.
      if (j >= kSlots && usesOut) LOOM_TRY(waitFor(outDone_[j % kSlots], "from"));
      QueuedOp chunk = call;
      OpArgs& h = chunk.args;
      h.count = elems(j);
      h.sendbuff = slotIn(j);
      h.recvbuff = slotOut(j);
      h.inPlace = false;  // the rows of a chunk are apart in the user's buffers
      LOOM_TRY(runCalls({chunk}));
      if (usesOut) LOOM_TRY(move(j, false));
      // The slot's input part is free now that chunk j's host call is done.
      if (usesIn && j + kSlots < p.chunks) LOOM_TRY(move(j + kSlots, true));
    }
    return Status();
  };
  Status st = pipeline();
  // Nothing may still write into the slots when the next job takes them, even after a failure.
  for (cuda::CUstream s : {stream_, backStream_}) {
    const cuda::CUresult rc = api.cuStreamSynchronize(s);
    if (st.isOk() && rc != cuda::kSuccess)
      st = cuda::cudaError(rc, "cuStreamSynchronize").withContext("a pipelined staging copy");
  }
  return st;
}

Status DeviceRunner::growScratch(size_t bytes) {
  size_t want = 0;
  {
    std::lock_guard<std::mutex> lk(scratchMu_);
    if (bytes <= scratchBytes_) return Status();
    want = std::max(bytes, scratchBytes_ * 2);
  }
  cuda::CUdeviceptr p = 0;
  const cuda::CUresult rc = cuda::cudaDriver().api.cuMemAlloc(&p, want);
  if (rc != cuda::kSuccess)
    return cuda::cudaError(rc, "cuMemAlloc")
        .withContext(fmt::format("rank {}: {} bytes of device scratch for a schedule on device "
                                 "memory",
                                 comm_->rank(), want));
  std::lock_guard<std::mutex> lk(scratchMu_);
  if (want <= scratchBytes_) {  // the other thread grew it meanwhile
    outgrownScratch_.push_back(p);
    return Status();
  }
  if (scratch_) outgrownScratch_.push_back(scratch_);
  scratch_ = p;
  scratchBytes_ = want;
  return Status();
}

Result<char*> DeviceRunner::deviceScratch(size_t bytes) {
  bool grown = false;
  {
    std::lock_guard<std::mutex> lk(scratchMu_);
    grown = bytes > scratchBytes_;
  }
  if (grown) {
    LOOM_INFO(kSubInit,
              "rank {}: a schedule on device memory needs {} bytes of device scratch, more than "
              "its post reserved: allocated on the runner thread",
              comm_->rank(), bytes);
    LOOM_TRY(growScratch(bytes));
  }
  std::lock_guard<std::mutex> lk(scratchMu_);
  return reinterpret_cast<char*>(scratch_);
}

Status DeviceRunner::decideOnSchedule(QueuedOp* q, bool grouped) {
  CallShape shape = shapeOf(q->args, comm_->nranks(), grouped);
  if (q->inDevice) shape.sendKind = MemKind::kCudaDevice;
  if (q->outDevice) shape.recvKind = MemKind::kCudaDevice;
  LOOM_ASSIGN(Decision d, comm_->decide(shape));
  q->algorithm = std::move(d.algorithm);
  return Status();
}

Status DeviceRunner::runOnSchedule(const Job& job) {
  // Each call as dispatch decides it with its buffers' kinds: device memory takes the schedule
  // path only (the exchange and the one pass read host memory); host calls go as ever.
  // Decided when posted (reserveStaging); a call that was not is decided here.
  std::vector<QueuedOp> calls = job.calls;
  const bool grouped = calls.size() > 1;
  for (QueuedOp& q : calls)
    if (q.algorithm.empty()) LOOM_TRY(decideOnSchedule(&q, grouped));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LOOM_INFO(kSubNet,
              "rank {}: calls on device memory run on the schedule, the network reading and "
              "writing the device buffers (GPUDirect RDMA)",
              comm_->rank());
  });
  return executeOps(calls);
}

}  // namespace loom
