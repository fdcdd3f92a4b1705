#include "src/runtime/device_one_pass.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "src/core/collective.h"
#include "src/core/dtype.h"
#include "src/core/hash.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "src/device/kernels.h"
#include "src/runtime/comm.h"
#include "src/runtime/device_plan.h"
#include "src/runtime/run.h"
#include "topology/paths.h"
#include "transports/shm/host_group.h"

namespace loom {

namespace {

// Round 1: what each rank publishes (its low-latency buffer holds it).
struct Record {
  uint32_t pid;
  uint32_t flags;  // kCan, kHandles
  uint64_t gpuKey;
  uint64_t inAddr, outAddr;  // device addresses in its own process (0: unused)
  uint64_t inOff, outOff;    // from the base of their allocations
  char bus[16];              // its GPU's PCI bus id (cuDeviceGetPCIBusId), NUL-terminated
};
static_assert(sizeof(Record) <= 64, "fits the smallest low-latency buffer");
constexpr uint32_t kCan = 1;  // every buffer it uses is device memory of gpuKey, reachable

// Round 2, between processes or GPUs that differ: the IPC handles of the two buffers'
// allocations, and whether this rank reaches every other rank's GPU.
struct Handles {
  cuda::CUipcMemHandle in, out;
  uint32_t reach;
  uint32_t pad;
};

constexpr size_t kMaxMappings = 64;

uint64_t roundSignature(const OpArgs& op, uint64_t round) {
  return Fnv64().mix(opSignature(op)).mix(0x4445564f50ull).mix(round).value();
}

// [offset, offset + count) of slice r of count elements split n ways (the first count % n slices
// one longer).
struct Slice {
  size_t off, count;
};
Slice sliceOf(size_t count, int n, int r) {
  const size_t base = count / static_cast<size_t>(n), rem = count % static_cast<size_t>(n);
  const size_t ur = static_cast<size_t>(r);
  return {ur * base + std::min(ur, rem), base + (ur < rem ? 1 : 0)};
}

}  // namespace

DeviceOnePass::DeviceOnePass(Comm* comm, int device, cuda::CUstream stream)
    : comm_(comm), device_(device), stream_(stream) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUdevice dev = 0;
  char bus[64] = {};
  if (api.cuDeviceGet(&dev, device) == cuda::kSuccess &&
      api.cuDeviceGetPCIBusId(bus, sizeof(bus), dev) == cuda::kSuccess &&
      std::strlen(bus) < sizeof(Record::bus)) {
    gpuKey_ = Fnv64().mixBytes(bus).value() | 1;
    bus_ = bus;
  }
  shm::HostGroup* g = comm->shm();
  usable_ = params::kDeviceOnePass.asInt() != 0 && comm->nranks() >= 2 && comm->allLocal() && g &&
            g->area().options().llBytes >= sizeof(Handles) && gpuKey_ != 0;
  if (usable_) {
    // A rank whose kernels cannot load still takes part in the first round, saying it cannot.
    Status k = device::loadKernels();
    kernels_ = k.isOk();
    if (!kernels_) LOOM_WARN("rank {}: device calls are staged: {}", comm->rank(), k.message());
    // Here, on the thread that makes the runner, not on the runner thread during a call: turning
    // peer access on may wait for the device, where a user's stream may be waiting for that call.
    if (params::kDeviceP2p.asBool()) enablePeers();
    // And the device's speeds, which the first call prices with: measuring allocates and frees
    // device memory, which the runner thread must not (prepare() says why).
    if (kernels_) (void)speeds();
  }
}

const device::DeviceSpeeds* DeviceOnePass::speeds() {
  if (!speedsTried_) {
    speedsTried_ = true;
    Result<device::DeviceSpeeds> sp = device::currentDeviceSpeeds();
    speedsOk_ = sp.isOk();
    if (speedsOk_)
      speeds_ = sp.value();
    else
      LOOM_INFO(kSubShm, "device one pass: no measured speeds ({}): not priced, copy engines",
                sp.status().message());
  }
  return speedsOk_ ? &speeds_ : nullptr;
}

OnePassCopies DeviceOnePass::copiesFor(const OpArgs& op, bool sameGpu) {
  const int n = comm_->nranks();
  const CallShape call = shapeOf(op, n, false);
  auto price = sameGpu ? deviceOnePassSeconds : devicePeerOnePassSeconds;
  const device::DeviceSpeeds none;
  const device::DeviceSpeeds& at = speeds() ? *speeds() : none;
  return chooseOnePassCopies(price(call, n, at, 0, OnePassCopies::kKernels),
                             price(call, n, at, 0, OnePassCopies::kEngines));
}

bool DeviceOnePass::plannedHere(const OpArgs& op) {
  if (params::kDeviceOnePass.asInt() == 2) return true;
  CallShape host = shapeOf(op, comm_->nranks(), false);
  host.sendKind = host.recvKind = MemKind::kHost;  // what the staged path's host calls are
  // Nothing to price (the rounds decide whether the ranks reach each other), nor speeds to measure.
  const int gpus = onePassGpus(comm_, host);
  if (gpus == 0) return true;
  const device::DeviceSpeeds* sp = speeds();
  if (!sp) return true;
  Result<DevicePlan> plan = planDeviceCall(comm_, host, *sp, gpus);
  if (!plan.isOk()) {
    LOOM_INFO(kSubShm, "device one pass: not priced ({})", plan.status().message());
    return true;
  }
  // Against staging as the runner stages (GPUDirect, where the plan has it, does not apply to the
  // ranks of one host that the one pass serves).
  const DevicePlan& p = plan.value();
  const double staged = p.pipelinedSec >= 0 ? p.pipelinedSec : p.wholeSec;
  if (p.onePassSec < 0 || staged < 0 || p.onePassSec <= staged) return true;
  LOOM_INFO(kSubShm,
            "{} of {} bytes: staging priced lower than the one pass ({:.1f} us < {:.1f} us)",
            collName(op.coll), op.count * dataTypeSize(op.dtype), staged * 1e6, p.onePassSec * 1e6);
  return false;
}

DeviceOnePass::~DeviceOnePass() {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  for (const Mapping& m : maps_) api.cuIpcCloseMemHandle(m.base);
}

namespace {

bool sameHandle(uint32_t pid, const cuda::CUipcMemHandle& h, uint32_t pid2,
                const cuda::CUipcMemHandle& h2) {
  return pid == pid2 && std::memcmp(&h, &h2, sizeof(h)) == 0;
}

}  // namespace

cuda::CUdeviceptr DeviceOnePass::lookup(uint32_t pid, const cuda::CUipcMemHandle& handle,
                                        std::vector<cuda::CUdeviceptr>* held) {
  std::lock_guard<std::mutex> lk(mapsMu_);
  for (auto it = maps_.begin(); it != maps_.end(); ++it)
    if (sameHandle(it->pid, it->handle, pid, handle)) {
      maps_.splice(maps_.begin(), maps_, it);
      ++maps_.front().busy;
      held->push_back(maps_.front().base);
      return maps_.front().base;
    }
  auto known = [&](const Wanted& w) { return sameHandle(w.pid, w.handle, pid, handle); };
  if (std::none_of(wanted_.begin(), wanted_.end(), known) &&
      std::none_of(opening_.begin(), opening_.end(), known) &&
      std::none_of(unopenable_.begin(), unopenable_.end(), known))
    wanted_.push_back({pid, handle});
  return 0;
}

void DeviceOnePass::release(const std::vector<cuda::CUdeviceptr>& held) {
  std::lock_guard<std::mutex> lk(mapsMu_);
  for (cuda::CUdeviceptr b : held)
    for (Mapping& m : maps_)
      if (m.base == b && m.busy > 0) {
        --m.busy;
        break;
      }
}

void DeviceOnePass::prepare() {
  std::unique_lock<std::mutex> one(prepareMu_, std::try_to_lock);
  if (!one.owns_lock()) return;  // another thread prepares now
  std::vector<Wanted> want;
  std::vector<cuda::CUdeviceptr> close;
  {
    std::lock_guard<std::mutex> lk(mapsMu_);
    want.swap(wanted_);
    opening_ = want;
    // Room for what opens, the least recently used idle mappings going first.
    size_t over =
        maps_.size() + want.size() > kMaxMappings ? maps_.size() + want.size() - kMaxMappings : 0;
    for (auto it = maps_.end(); over > 0 && it != maps_.begin();) {
      --it;
      if (it->busy) continue;
      close.push_back(it->base);
      it = maps_.erase(it);
      --over;
    }
  }
  if (want.empty() && close.empty()) return;
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  for (cuda::CUdeviceptr b : close) api.cuIpcCloseMemHandle(b);
  std::vector<Mapping> opened;
  std::vector<Wanted> failed;
  for (const Wanted& w : want) {
    cuda::CUdeviceptr base = 0;
    const cuda::CUresult rc =
        api.cuIpcOpenMemHandle(&base, w.handle, cuda::kIpcMemLazyEnablePeerAccess);
    if (rc == cuda::kSuccess) {
      opened.push_back({w.pid, w.handle, base, 0});
      continue;
    }
    // The owner freed it, or this GPU cannot map it: its calls stay staged.
    LOOM_INFO(kSubShm,
              "rank {}: process {}'s device buffer is not opened here ({}): its calls are "
              "staged",
              comm_->rank(), w.pid, cuda::cudaError(rc, "cuIpcOpenMemHandle").message());
    failed.push_back(w);
  }
  std::lock_guard<std::mutex> lk(mapsMu_);
  opening_.clear();
  for (const Mapping& m : opened) maps_.push_front(m);
  for (const Wanted& w : failed) {
    unopenable_.push_back(w);
    if (unopenable_.size() > kMaxMappings) unopenable_.pop_front();
  }
}

bool DeviceOnePass::tries(const QueuedOp& call) const {
  const OpArgs& a = call.args;
  // Calls on host memory never try (a rank whose peers have no runner may make them).
  if (!usable_ || a.count == 0 || comm_->nranks() > devk::kMaxReduceInputs ||
      !(call.inDevice || call.outDevice))
    return false;
  switch (a.coll) {
    case CollKind::kAllReduce:
    case CollKind::kReduceScatter:
    case CollKind::kAllGather:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return true;
    case CollKind::kAllToAll:
      return !a.inPlace;  // a block would be overwritten before its owner pushed it
    default:
      return false;
  }
}

bool DeviceOnePass::peerAllowed(cuda::CUdevice peer, const std::string& peerBus) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  int can = 0;
  if (!params::kDeviceP2p.asBool() || !api.cuDeviceCanAccessPeer || !api.cuCtxEnablePeerAccess ||
      api.cuDeviceCanAccessPeer(&can, device_, peer) != cuda::kSuccess || !can)
    return false;
  // The topology's verdict where it knows both GPUs (NCCL's: a path of PXB or better, so not
  // through the CPUs' interconnect).
  const topo::Graph& graph = localTopology();
  if (!paths_) paths_ = std::make_unique<topo::Paths>(topo::Paths::compute(graph));
  const int a = graph.findByBusId(asciiLower(bus_)), b = graph.findByBusId(asciiLower(peerBus));
  return a < 0 || b < 0 || paths_->p2pAllowed(a, b);
}

void DeviceOnePass::enablePeers() {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  int count = 0;
  if (!api.cuDeviceGetCount || api.cuDeviceGetCount(&count) != cuda::kSuccess) return;
  for (int d = 0; d < count; ++d) {
    char bus[64] = {};
    cuda::CUcontext ctx = nullptr;
    if (d == device_ || api.cuDeviceGetPCIBusId(bus, sizeof(bus), d) != cuda::kSuccess ||
        !peerAllowed(d, bus) || api.cuDevicePrimaryCtxRetain(&ctx, d) != cuda::kSuccess)
      continue;
    const cuda::CUresult rc = api.cuCtxEnablePeerAccess(ctx, 0);
    if (rc == cuda::kSuccess || rc == cuda::kErrorPeerAccessAlreadyEnabled)
      peersOn_.insert(d);
    else
      LOOM_INFO(kSubInit, "rank {}: no peer access from CUDA device {} to device {}: {}",
                comm_->rank(), device_, d, cuda::cudaError(rc, "cuCtxEnablePeerAccess").message());
  }
}

bool DeviceOnePass::reachPeers(const void* records, int n, uint32_t myPid) {
  const auto* recs = static_cast<const Record*>(records);
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  if (!api.cuDeviceGetByPCIBusId) return false;
  for (int i = 0; i < n; ++i) {
    const Record& r = recs[i];
    if (r.gpuKey == gpuKey_) continue;
    const std::string bus(r.bus, strnlen(r.bus, sizeof(r.bus)));
    cuda::CUdevice peer = -1;
    if (api.cuDeviceGetByPCIBusId(&peer, bus.c_str()) != cuda::kSuccess)
      return false;  // not visible in this process
    // A thread of this process: reached by address through the peer access turned on when the
    // runner started (enablePeers); another process: by opening its IPC handles with lazy peer
    // access.
    if (r.pid == myPid ? peersOn_.count(peer) == 0 : !peerAllowed(peer, bus)) return false;
  }
  return true;
}

DeviceOnePass::Exported DeviceOnePass::exportBuffers(const QueuedOp& call) const {
  Exported ex;
  if (comm_->oneProcess()) return ex;  // threads reach each other by address
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  auto one = [&](const void* p, bool device, cuda::CUipcMemHandle* h, uint64_t* off) {
    cuda::CUdeviceptr base = 0;
    size_t size = 0;
    if (!device || !p || !api.cuIpcGetMemHandle ||
        api.cuMemGetAddressRange(&base, &size, reinterpret_cast<cuda::CUdeviceptr>(p)) !=
            cuda::kSuccess ||
        api.cuIpcGetMemHandle(h, base) != cuda::kSuccess)
      return false;
    *off = reinterpret_cast<uint64_t>(p) - base;
    return true;
  };
  ex.inOk = one(call.args.sendbuff, call.inDevice, &ex.in, &ex.inOff);
  ex.outOk = one(call.args.recvbuff, call.outDevice, &ex.out, &ex.outOff);
  return ex;
}

Status DeviceOnePass::run(const QueuedOp& call, const Exported& exported, bool* ran) {
  *ran = false;
  const OpArgs& op = call.args;
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  shm::HostGroup* g = comm_->shm();
  shm::LowLatencyExchange& ll = g->exchange();
  shm::OnePassGuard& guard = g->onePass();
  const int n = comm_->nranks(), me = comm_->rank();
  const uint32_t myPid = static_cast<uint32_t>(getpid());
  const size_t es = dataTypeSize(op.dtype);
  const CollCounts counts = collCounts(op.coll, op.count, n);
  auto usesIn = [&](int r) { return collUsesInput(op.coll, r, op.root, op.isSend); };
  auto usesOut = [&](int r) { return collUsesOutput(op.coll, r, op.root, op.isSend); };

  // Round 1: this rank's buffers, and whether it can take the path.
  Record rec{};
  rec.pid = myPid;
  rec.gpuKey = gpuKey_;
  std::snprintf(rec.bus, sizeof(rec.bus), "%s", bus_.c_str());
  bool can = kernels_;
  Handles mine{};
  const bool otherProcesses = !comm_->oneProcess();
  auto describe = [&](const void* p, bool device, uint64_t* addr, uint64_t* off,
                      cuda::CUipcMemHandle* h, bool exOk, const cuda::CUipcMemHandle& exH,
                      uint64_t exOff) {
    if (!device || call.device != device_) return false;  // kinds and device: checkDevice's
    *addr = reinterpret_cast<uint64_t>(p);
    if (!otherProcesses) return true;
    if (!exOk) return false;  // not IPC-capable memory (a VMM mapping, say): staged
    *h = exH;
    *off = exOff;
    return true;
  };
  if (usesIn(me))
    can = can && describe(op.sendbuff, call.inDevice, &rec.inAddr, &rec.inOff, &mine.in,
                          exported.inOk, exported.in, exported.inOff);
  if (usesOut(me))
    can = can && describe(op.recvbuff, call.outDevice, &rec.outAddr, &rec.outOff, &mine.out,
                          exported.outOk, exported.out, exported.outOff);
  // Last: pricing measures the device's speeds the first time.
  can = can && plannedHere(op);
  rec.flags = can ? kCan : 0;
  auto failed = [&](Status st) {
    guard.end();  // first: a peer failing too waits for it (shm::HostGroup::setState)
    st = comm_->explainLocalWait(
        st, std::string(collName(op.coll)) + " (one pass over the peers' device buffers)");
    comm_->fail(st);
    return st;
  };
  uint64_t seq = comm_->nextLlSeq();
  Status st = ll.round(seq, &rec, sizeof(rec), roundSignature(op, 1), callNote(op), comm_->spinNs(),
                       comm_->timeoutMs());
  if (!st.isOk() && st.cause() == Cause::kMismatch)
    st = st.rewritten(st.code(), st.message() +
                                     " (or some ranks passed host memory and others CUDA device "
                                     "memory: every rank of a call passes device memory, or "
                                     "every rank host memory)");
  if (!st.isOk()) return failed(st);
  std::vector<Record> recs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) std::memcpy(&recs[i], ll.buffer(i, seq), sizeof(Record));
  // Every rank decides from the same records: all go on or all stage.
  bool sameGpu = true;
  for (const Record& r : recs) {
    if (!(r.flags & kCan)) return Status();
    sameGpu = sameGpu && r.gpuKey == recs[0].gpuKey;
  }

  // Round 2 (processes, or GPUs that differ): the handles, and whether each rank reaches every
  // other GPU peer to peer: all go on only if every one does. Round 3 (processes): whether each
  // rank has the other processes' buffers open already; all go on only if every one has (the
  // runner opens nothing: prepare()).
  std::vector<char*> ins(static_cast<size_t>(n), nullptr), outs(static_cast<size_t>(n), nullptr);
  for (int i = 0; i < n; ++i) {
    ins[i] = reinterpret_cast<char*>(recs[i].inAddr);
    outs[i] = reinterpret_cast<char*>(recs[i].outAddr);
  }
  // The mappings this call uses stay busy until it returns (prepare closes only idle ones).
  std::vector<cuda::CUdeviceptr> held;
  struct Release {
    DeviceOnePass* self;
    std::vector<cuda::CUdeviceptr>* held;
    ~Release() { self->release(*held); }
  } releaseAtEnd{this, &held};
  std::vector<Handles> handles(static_cast<size_t>(n));
  if (otherProcesses || !sameGpu) {
    mine.reach = sameGpu || reachPeers(recs.data(), n, myPid) ? 1 : 0;
    seq = comm_->nextLlSeq();
    st = ll.round(seq, &mine, sizeof(mine), roundSignature(op, 2), callNote(op), comm_->spinNs(),
                  comm_->timeoutMs());
    if (!st.isOk()) return failed(st);
    for (int i = 0; i < n; ++i) {
      std::memcpy(&handles[i], ll.buffer(i, seq), sizeof(Handles));
      if (!handles[i].reach) return Status();  // nothing touched yet: every rank stages
    }
  }
  if (otherProcesses) {
    uint32_t have = 1;
    for (int i = 0; i < n; ++i) {
      if (recs[i].pid == myPid) continue;
      const Handles& h = handles[static_cast<size_t>(i)];
      auto place = [&](char** p, uint64_t addr, const cuda::CUipcMemHandle& handle, uint64_t off) {
        if (!addr) return;
        const cuda::CUdeviceptr base = lookup(recs[i].pid, handle, &held);
        if (base == 0) have = 0;  // wanted: the next post opens it
        *p = reinterpret_cast<char*>(base + off);
      };
      place(&ins[i], recs[i].inAddr, h.in, recs[i].inOff);
      place(&outs[i], recs[i].outAddr, h.out, recs[i].outOff);
    }
    seq = comm_->nextLlSeq();
    st = ll.round(seq, &have, sizeof(have), roundSignature(op, 4), callNote(op), comm_->spinNs(),
                  comm_->timeoutMs());
    if (!st.isOk()) return failed(st);
    for (int i = 0; i < n; ++i) {
      uint32_t theirs = 0;
      std::memcpy(&theirs, ll.buffer(i, seq), sizeof(theirs));
      if (!theirs) {
        LOOM_INFO(kSubShm,
                  "{}: staged, rank {} has not yet opened its peers' device buffers (the next "
                  "call's post opens them)",
                  collName(op.coll), i);
        return Status();  // nothing touched yet: every rank stages
      }
    }
  }

  // From here this rank touches its peers' buffers.
  st = guard.begin();
  if (!st.isOk()) return failed(st);
  // dst = in_0 op ... op in_{n-1} at byte offset off of every input, count elements, in rank
  // order, in one launch (tries() keeps n within kMaxReduceInputs); dst may be one of them; avg
  // divides the sum by n.
  // Kernels store a result or a block into every output in one launch; the engines copy it
  // into each other output after the reduction into this rank's own (copiesFor).
  const bool byKernels = copiesFor(op, sameGpu) == OnePassCopies::kKernels;
  // dsts = in_0 op ... op in_{n-1} at byte offset off of every input, count elements.
  auto reduceTo = [&](const std::vector<void*>& dsts, size_t off, size_t count) -> Status {
    std::vector<const void*> srcs;
    for (int i = 0; i < n; ++i) srcs.push_back(ins[i] + off);
    return device::launchReduceTo(stream_, dsts.data(), static_cast<int>(dsts.size()), srcs.data(),
                                  n, count, op.dtype, op.op, n);
  };
  auto reduce = [&](char* dst, size_t off, size_t count) { return reduceTo({dst}, off, count); };
  auto copy = [&](char* dst, const char* src, size_t bytes) -> Status {
    if (dst == src || bytes == 0) return Status();
    LOOM_CU(api.cuMemcpyAsync(reinterpret_cast<cuda::CUdeviceptr>(dst),
                              reinterpret_cast<cuda::CUdeviceptr>(src), bytes, stream_));
    return Status();
  };
  // src into every dsts[i] at byte offset off (the one that is src itself skipped).
  auto copyToAll = [&](const std::vector<char*>& dsts, size_t off, const char* src,
                       size_t bytes) -> Status {
    if (bytes == 0) return Status();
    std::vector<void*> to;
    for (char* d : dsts)
      if (d + off != src) to.push_back(d + off);
    if (!byKernels) {
      for (void* d : to) LOOM_TRY(copy(static_cast<char*>(d), src, bytes));
      return Status();
    }
    if (to.empty()) return Status();
    // A one-input "reduction" copies: in the widest unsigned type every address and the length
    // allow (a GPU faults on misaligned loads).
    const void* one[] = {src};
    uintptr_t bits = reinterpret_cast<uintptr_t>(src) | bytes;
    for (void* d : to) bits |= reinterpret_cast<uintptr_t>(d);
    const size_t w = bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 1;
    const loomDataType_t t = w == 8 ? loomUint64 : w == 4 ? loomUint32 : loomUint8;
    return device::launchReduceTo(stream_, to.data(), static_cast<int>(to.size()), one, 1,
                                  bytes / w, t, loomSum, 0);
  };
  auto work = [&]() -> Status {
    const size_t c = op.count;
    switch (op.coll) {
      case CollKind::kAllReduce: {
        const Slice s = sliceOf(c, n, me);
        if (s.count == 0) return Status();
        if (byKernels) {
          std::vector<void*> all;
          for (int i = 0; i < n; ++i) all.push_back(outs[i] + s.off * es);
          return reduceTo(all, s.off * es, s.count);
        }
        LOOM_TRY(reduce(outs[me] + s.off * es, s.off * es, s.count));
        for (int i = 0; i < n; ++i)
          if (i != me) LOOM_TRY(copy(outs[i] + s.off * es, outs[me] + s.off * es, s.count * es));
        return Status();
      }
      case CollKind::kReduceScatter:
        return reduce(outs[me], static_cast<size_t>(me) * c * es, c);
      case CollKind::kReduce: {
        const Slice s = sliceOf(c, n, me);
        if (s.count == 0) return Status();
        return reduce(outs[op.root] + s.off * es, s.off * es, s.count);
      }
      case CollKind::kAllGather:
        return copyToAll(outs, static_cast<size_t>(me) * c * es, ins[me], c * es);
      case CollKind::kAllToAll:
        for (int i = 0; i < n; ++i)
          LOOM_TRY(copy(outs[i] + static_cast<size_t>(me) * c * es,
                        ins[me] + static_cast<size_t>(i) * c * es, c * es));
        return Status();
      case CollKind::kBroadcast:
        return copyToAll({outs[me]}, 0, ins[op.root], c * es);
      default:
        return LOOM_ERROR(kInternal, "{} has no device one pass", collName(op.coll));
    }
  };
  st = work();
  if (st.isOk()) {
    const cuda::CUresult rc = api.cuStreamSynchronize(stream_);
    if (rc != cuda::kSuccess) st = cuda::cudaError(rc, "cuStreamSynchronize of the one pass");
  }
  if (!st.isOk()) return failed(st);
  guard.end();

  // Last round: nobody returns (and lets its stream reuse its buffers) while a peer may still
  // read or write them.
  seq = comm_->nextLlSeq();
  st = ll.round(seq, nullptr, 0, roundSignature(op, 3), callNote(op), comm_->spinNs(),
                comm_->timeoutMs());
  if (!st.isOk()) return failed(st);
  *ran = true;
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LOOM_INFO(kSubShm, "{} of {} bytes ran in one pass over the peers' device buffers ({})",
              collName(op.coll), std::max(counts.input, counts.output) * es,
              otherProcesses ? "CUDA IPC between processes" : "threads of one process");
  });
  return Status();
}

}  // namespace loom
