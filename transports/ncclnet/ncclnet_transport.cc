#include "transports/ncclnet/ncclnet_transport.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/device/device_memory.h"
#include "transports/ncclnet/nccl_result.h"
#include "transports/ncclnet/plugin_abi.h"

namespace loom {
namespace {

using ncclabi::ncclResult_t;
using ncclabi::ncclSuccess;
using ncclnet::kMaxGroupedRecvs;
using ncclnet::PluginAbi;
using ncclnet::PluginProps;

// NCCL's own per-comm limit (NCCL_NET_MAX_REQUESTS): plugins are written for callers that never
// exceed it, so the adaptor answers "not now" itself rather than asking the plugin.
constexpr size_t kMaxRequests = ncclabi::NCCL_NET_MAX_REQUESTS;

// The last warning a plugin logged on this thread: added to the Status of the call that failed
// (plugins report the cause in the log and only a code in the result).
thread_local std::string tLastWarn;

void pluginLogger(ncclabi::ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                  const char* fmt, ...) {
  LogLevel lv;
  switch (level) {
    case ncclabi::NCCL_LOG_WARN:
    case ncclabi::NCCL_LOG_ABORT:
      lv = LogLevel::kWarn;
      break;
    case ncclabi::NCCL_LOG_VERSION:
    case ncclabi::NCCL_LOG_INFO:
      lv = LogLevel::kInfo;
      break;
    case ncclabi::NCCL_LOG_TRACE:
      lv = LogLevel::kTrace;
      break;
    default:
      return;
  }
  uint32_t subsys = kSubNet;
  if (flags & ncclabi::NCCL_INIT) subsys |= kSubInit;
  if (flags & ncclabi::NCCL_ENV) subsys |= kSubEnv;
  const bool enabled = logEnabled(lv, subsys);
  if (!enabled && lv != LogLevel::kWarn) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int len = fmt ? std::vsnprintf(buf, sizeof(buf), fmt, ap) : 0;
  va_end(ap);
  if (len < 0) len = 0;
  size_t n = std::min(static_cast<size_t>(len), sizeof(buf) - 1);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) --n;
  std::string msg(buf, n);
  if (lv == LogLevel::kWarn) tLastWarn = msg;
  if (enabled) logWrite(lv, subsys, file ? file : "plugin", line, "net plugin: " + msg);
}

struct Request;

// A CUDA allocation registered with the plugin on one comm, whole (as NCCL registers its buffers):
// kept after the requests that used it end, so that the next ones on any part of it register
// nothing (a registration of GPU memory costs the NIC's driver a pinning of the pages, far more
// than a message). It goes when the comm closes, when a later registration finds the allocation
// freed (CUDA's buffer id tells a new allocation at the same address from the old one), or as the
// least recently used beyond kPluginIdleGpuRegistrations idle ones (ncclnet_transport.h).
struct GpuReg {
  uintptr_t begin = 0, end = 0;
  uint64_t bufferId = 0;
  void* mh = nullptr;
  int users = 0;         // requests in flight on it
  uint64_t lastUse = 0;  // the comm's use count when its last request ended
};

// A dma-buf of a CUDA allocation, exported on the thread that posts a call (holdMemory) for the
// registrations the comms make later (GpuReg), so that those, on the device runner's thread, call
// no CUDA driver function that takes its mapping lock (a user's stream may be waiting for that
// thread while another thread holds the lock: src/runtime/device_runner.h). Kept while the
// allocation lives (a training loop posts on the same allocations every step; an export per call
// would cost a driver call each time), at most kPluginIdleGpuRegistrations idle.
struct GpuExport {
  uintptr_t begin = 0;
  size_t length = 0;  // the allocation's size rounded up to the host page
  uint64_t bufferId = 0;
  int fd = -1;
  int users = 0;  // holds, and registrations being made with it
  uint64_t lastUse = 0;
};

// Of a cache of kept registrations or exports (GpuReg, GpuExport): removes the entries no one uses
// that drop picks, release(entry) first.
template <class T, class Drop, class Release>
void dropIdle(std::vector<std::unique_ptr<T>>& kept, Drop drop, Release release) {
  for (size_t i = 0; i < kept.size();) {
    if (kept[i]->users != 0 || !drop(*kept[i])) {
      ++i;
      continue;
    }
    release(*kept[i]);
    kept[i] = std::move(kept.back());
    kept.pop_back();
  }
}

// Room for one more idle entry in kept: the least recently used idle ones beyond
// kPluginIdleGpuRegistrations go.
template <class T, class Release>
void makeIdleRoom(std::vector<std::unique_ptr<T>>& kept, Release release) {
  for (;;) {
    size_t idle = 0;
    const T* oldest = nullptr;
    for (auto& e : kept) {
      if (e->users != 0) continue;
      ++idle;
      if (oldest == nullptr || e->lastUse < oldest->lastUse) oldest = e.get();
    }
    if (idle < kPluginIdleGpuRegistrations) return;
    dropIdle(
        kept, [oldest](const T& e) { return &e == oldest; }, release);
  }
}

// A listen, send or recv comm: the plugin's comm plus what the adaptor needs to check and clean
// up (the device's limits, the requests in flight, their automatic registrations and the GPU
// allocations kept registered).
struct Comm {
  enum class Kind { kListen, kSend, kRecv };
  Kind kind;
  void* plugin = nullptr;
  int dev = 0;
  size_t maxBytes = 0;  // largest message
  int maxRecvs = 1;
  std::vector<Request*> inflight;
  std::vector<Request*> spare;  // finished requests kept for reuse
  std::vector<std::unique_ptr<GpuReg>> gpuRegs;
  uint64_t uses = 0;
  ~Comm();
};

struct Request {
  enum class Kind { kSend, kRecv, kFlush };
  Kind kind;
  Comm* comm = nullptr;
  void* plugin = nullptr;
  int n = 1;
  size_t posted = 0;  // bytes of a send (its size when the plugin leaves test's sizes unset)
  size_t index = 0;   // position in comm->inflight
  int nAuto = 0;
  void* autoMh[kMaxGroupedRecvs] = {};  // host memory registered for this request only
  int nGpu = 0;
  GpuReg* gpu[kMaxGroupedRecvs] = {};  // the kept GPU registrations it uses
};

Comm::~Comm() {
  for (Request* r : inflight) delete r;
  for (Request* r : spare) delete r;
}

// A zero-byte message still needs a registered buffer for most plugins; this byte is it (never
// written: its capacity is 0).
char gZeroByte = 0;

class PluginTransport final : public net::Transport {
 public:
  PluginTransport(std::string path, std::unique_ptr<PluginAbi> abi)
      : path_(std::move(path)), abi_(std::move(abi)), name_(abi_->name()) {}
  ~PluginTransport() override {
    for (auto& e : exports_) ::close(e->fd);
    if (initialised_) abi_->finalize();
  }

  Status start() {
    static std::atomic<uint64_t> instances{0};
    const uint64_t commId = (static_cast<uint64_t>(getpid()) << 24) + instances++;
    LOOM_TRY(call("init", abi_->init(commId, pluginLogger)));
    initialised_ = true;
    int ndev = 0;
    LOOM_TRY(call("devices", abi_->devices(&ndev)));
    if (ndev < 1)
      return LOOM_ERROR(kSystem, "NCCL net plugin {} (network '{}', ABI v{}) reports {} devices",
                        path_, name_, abi_->version(), ndev);
    props_.resize(ndev);
    for (int d = 0; d < ndev; ++d) {
      LOOM_TRY(call("getProperties", abi_->getProperties(d, &props_[d])));
      PluginProps& p = props_[d];
      if (p.maxRecvs < 1) p.maxRecvs = 1;
      LOOM_INFO(kSubNet | kSubInit,
                "NCCL net plugin {} device {}: {} ({}), {} Mb/s, port {}, guid {:#x}, "
                "ptrSupport {:#x}, maxRecvs {}, maxP2pBytes {}",
                name_, d, p.name, p.pciPath.empty() ? "no PCI path" : p.pciPath, p.speed, p.port,
                p.guid, p.ptrSupport, p.maxRecvs, p.maxP2pBytes);
    }
    return Status();
  }

  const char* name() const override { return name_.c_str(); }
  int devices() const override { return static_cast<int>(props_.size()); }

  Status getProperties(int dev, net::Properties* props) const override {
    LOOM_TRY(checkDev(dev));
    const PluginProps& p = props_[dev];
    props->name = p.name;
    props->pciPath = p.pciPath;
    props->guid = p.guid;
    props->ptrSupport = p.ptrSupport;
    props->speedMbps = p.speed;
    props->port = p.port;
    props->latencyUs = p.latency;
    props->maxComms = p.maxComms;
    props->maxRecvs = std::min(p.maxRecvs, kMaxGroupedRecvs);
    props->maxP2pBytes = maxBytes(dev);
    return Status();
  }

  Status listen(int dev, net::Handle* handle, void** listener) override {
    *listener = nullptr;
    LOOM_TRY(checkDev(dev));
    auto c = std::make_unique<Comm>();
    c->kind = Comm::Kind::kListen;
    c->dev = dev;
    std::memset(handle->bytes, 0, sizeof(handle->bytes));
    LOOM_TRY(call("listen", abi_->listen(dev, handle->bytes, &c->plugin)));
    if (c->plugin == nullptr) return LOOM_ERROR(kInternal, "{}: listen gave no comm", describe());
    *listener = c.release();
    return Status();
  }

  Status connect(int dev, const net::Handle& handle, void** sendConn) override {
    *sendConn = nullptr;
    LOOM_TRY(checkDev(dev));
    // Plugins keep the state of a connection in progress in the handle between calls (NCCL's own
    // transports do), while Loom's caller passes the same const handle for every connection to a
    // peer: each (thread, handle) attempt gets its own copy until it yields a comm or fails.
    const auto key = std::make_pair(
        std::this_thread::get_id(),
        std::string(reinterpret_cast<const char*>(handle.bytes), sizeof(handle.bytes)));
    net::Handle* copy;
    {
      std::lock_guard<std::mutex> lk(connectMu_);
      auto& slot = connecting_[key];
      if (!slot) slot = std::make_unique<net::Handle>(handle);
      copy = slot.get();
    }
    void* pc = nullptr;
    Status st = call("connect", abi_->connect(dev, copy->bytes, &pc));
    if (!st.isOk() || pc != nullptr) {
      std::lock_guard<std::mutex> lk(connectMu_);
      connecting_.erase(key);
    }
    LOOM_TRY(st);
    if (pc != nullptr) *sendConn = newComm(Comm::Kind::kSend, pc, dev);
    return Status();
  }

  Status accept(void* listener, void** recvConn) override {
    *recvConn = nullptr;
    LOOM_ASSIGN(Comm * l, commOf(listener, Comm::Kind::kListen, "accept"));
    void* pc = nullptr;
    LOOM_TRY(call("accept", abi_->accept(l->plugin, &pc)));
    if (pc == nullptr) return Status();
    *recvConn = newComm(Comm::Kind::kRecv, pc, l->dev);
    return Status();
  }

  Status regMr(void* comm, void* data, size_t size, int type, void** mhandle) override {
    *mhandle = nullptr;
    LOOM_ASSIGN(Comm * c, dataComm(comm, "regMr"));
    return call("regMr", abi_->regMr(c->plugin, data, size, type, mhandle));
  }

  Status deregMr(void* comm, void* mhandle) override {
    LOOM_ASSIGN(Comm * c, dataComm(comm, "deregMr"));
    return call("deregMr", abi_->deregMr(c->plugin, mhandle));
  }

  Status isend(void* sendConn, const void* data, size_t size, int tag, void* mhandle,
               void** request) override {
    *request = nullptr;
    LOOM_ASSIGN(Comm * c, commOf(sendConn, Comm::Kind::kSend, "isend"));
    if (size > c->maxBytes)
      return LOOM_ERROR(kInvalidArgument,
                        "{}: isend of {} bytes: more than the {} bytes one message may carry "
                        "(device {} maxP2pBytes, and the int sizes of the ABI)",
                        describe(), size, c->maxBytes, c->dev);
    if (c->inflight.size() >= kMaxRequests) return Status();
    Request* r = newRequest(c, Request::Kind::kSend, 1);
    r->posted = size;
    void* buf = const_cast<void*>(data);
    void* mh = mhandle;
    Status st = autoRegister(r, &buf, size, &mh);
    if (st.isOk()) st = call("isend", abi_->isend(c->plugin, buf, size, tag, mh, &r->plugin));
    if (!st.isOk() || r->plugin == nullptr) {
      finish(r);
      return st;
    }
    *request = r;
    return Status();
  }

  Status irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, void** request) override {
    *request = nullptr;
    LOOM_ASSIGN(Comm * c, commOf(recvConn, Comm::Kind::kRecv, "irecv"));
    if (n < 1 || n > c->maxRecvs)
      return LOOM_ERROR(kInvalidArgument,
                        "{}: irecv of {} buffers: device {} takes 1 to {} per grouped receive",
                        describe(), n, c->dev, c->maxRecvs);
    for (int i = 0; i < n; ++i) {
      if (sizes[i] > c->maxBytes)
        return LOOM_ERROR(kInvalidArgument,
                          "{}: irecv into a buffer of {} bytes: more than the {} bytes one "
                          "message may carry (device {} maxP2pBytes, and the int sizes of the ABI)",
                          describe(), sizes[i], c->maxBytes, c->dev);
    }
    if (c->inflight.size() >= kMaxRequests) return Status();
    Request* r = newRequest(c, Request::Kind::kRecv, n);
    void* bufs[kMaxGroupedRecvs];
    void* mhs[kMaxGroupedRecvs];
    int tagCopy[kMaxGroupedRecvs];
    size_t sizeCopy[kMaxGroupedRecvs];
    Status st;
    for (int i = 0; i < n && st.isOk(); ++i) {
      bufs[i] = data[i];
      mhs[i] = mhandles ? mhandles[i] : nullptr;
      tagCopy[i] = tags[i];
      sizeCopy[i] = sizes[i];
      st = autoRegister(r, &bufs[i], sizes[i], &mhs[i]);
    }
    if (st.isOk())
      st = call("irecv", abi_->irecv(c->plugin, n, bufs, sizeCopy, tagCopy, mhs, &r->plugin));
    if (!st.isOk() || r->plugin == nullptr) {
      finish(r);
      return st;
    }
    *request = r;
    return Status();
  }

  // GPU memory that received bytes needs a flush (the plugin decides whether its NIC does). A
  // buffer the caller passes without a handle (Loom's runtime, for memory registered per message)
  // is registered for the flush as for the receive; host memory never needs one.
  Status iflush(void* recvConn, int n, void** data, const size_t* sizes, void** mhandles,
                void** request) override {
    *request = nullptr;
    LOOM_ASSIGN(Comm * c, commOf(recvConn, Comm::Kind::kRecv, "iflush"));
    if (!abi_->hasIflush()) return Status();
    if (n < 1 || n > c->maxRecvs)
      return LOOM_ERROR(kInvalidArgument, "{}: iflush of {} buffers (1 to {})", describe(), n,
                        c->maxRecvs);
    int isizes[kMaxGroupedRecvs];
    bool any = false;
    for (int i = 0; i < n; ++i) {
      if (sizes[i] > INT_MAX)
        return LOOM_ERROR(kInvalidArgument, "{}: iflush of {} bytes: the ABI's sizes are int",
                          describe(), sizes[i]);
      isizes[i] = static_cast<int>(sizes[i]);
      any = any || (mhandles != nullptr && mhandles[i] != nullptr) ||
            (sizes[i] > 0 && device::cudaUsable() &&
             device::classify(data[i]).kind == MemKind::kCudaDevice);
    }
    if (!any) return Status();
    Request* r = newRequest(c, Request::Kind::kFlush, n);
    void* bufs[kMaxGroupedRecvs];
    void* mhs[kMaxGroupedRecvs];
    Status st;
    for (int i = 0; i < n && st.isOk(); ++i) {
      bufs[i] = data[i];
      mhs[i] = mhandles ? mhandles[i] : nullptr;
      st = autoRegister(r, &bufs[i], sizes[i], &mhs[i]);
    }
    if (st.isOk()) st = call("iflush", abi_->iflush(c->plugin, n, bufs, isizes, mhs, &r->plugin));
    if (!st.isOk() || r->plugin == nullptr) {
      finish(r);
      return st;
    }
    *request = r;
    return Status();
  }

  Status test(void* request, int* done, size_t* sizes) override {
    *done = 0;
    auto* r = static_cast<Request*>(request);
    if (r == nullptr) return LOOM_ERROR(kInvalidArgument, "{}: test of a null request", describe());
    int got[kMaxGroupedRecvs];
    std::fill(got, got + kMaxGroupedRecvs, -1);
    Status st = call("test", abi_->test(r->plugin, done, got));
    if (!st.isOk()) {
      *done = 0;
      finish(r);
      return st;
    }
    if (!*done) return Status();
    if (sizes != nullptr && r->kind != Request::Kind::kFlush) {
      for (int i = 0; i < r->n; ++i)
        sizes[i] = got[i] >= 0                       ? static_cast<size_t>(got[i])
                   : r->kind == Request::Kind::kSend ? r->posted
                                                     : 0;
    }
    finish(r);
    return Status();
  }

  Status closeSend(void* sendConn) override {
    if (sendConn == nullptr) return Status();
    LOOM_ASSIGN(Comm * c, commOf(sendConn, Comm::Kind::kSend, "closeSend"));
    return closeData(c, "closeSend");
  }

  Status closeRecv(void* recvConn) override {
    if (recvConn == nullptr) return Status();
    LOOM_ASSIGN(Comm * c, commOf(recvConn, Comm::Kind::kRecv, "closeRecv"));
    return closeData(c, "closeRecv");
  }

  Status closeListen(void* listener) override {
    if (listener == nullptr) return Status();
    LOOM_ASSIGN(Comm * c, commOf(listener, Comm::Kind::kListen, "closeListen"));
    std::unique_ptr<Comm> owned(c);
    return call("closeListen", abi_->closeListen(c->plugin));
  }

  // NCCL plugins have no way to wait for activity: nap in proportion to the caller's idle time
  // (net::idleNapNs), so that a rank waiting long for a slow peer does not keep its core busy.
  void waitActivity(void* const* requests, int n, void* listener, int timeoutMs) override {
    waitActivityIdle(requests, n, listener, timeoutMs, 0);
  }
  void waitActivityIdle(void* const*, int, void*, int timeoutMs, int64_t idleNs) override {
    sleepNs(net::idleNapNs(idleNs, std::max(1, timeoutMs) * int64_t{1000000}));
  }

  // The device runner's call on the posting thread: GPU memory that the comms will register
  // through a dma-buf is exported now (GpuExport). Nothing else needs the calling thread: host
  // memory and regMr of GPU memory call no CUDA driver function that takes its mapping lock.
  Status holdMemory(int dev, const void* data, size_t size, int type, void** hold) override {
    *hold = nullptr;
    LOOM_TRY(checkDev(dev));
    if (type != net::kPtrCuda || size == 0 || !dmabufPath(dev)) return Status();
    LOOM_ASSIGN(GpuExport * e, exportOf(data, size));
    *hold = e;
    return Status();
  }

  void releaseMemory(void* hold) override {
    if (hold == nullptr) return;
    std::lock_guard<std::mutex> lk(exportMu_);
    auto* e = static_cast<GpuExport*>(hold);
    --e->users;
    e->lastUse = ++exportUses_;
  }

 private:
  std::string describe() const {
    return "NCCL net plugin " + path_ + " (network '" + name_ + "', ABI v" +
           std::to_string(abi_->version()) + ")";
  }

  Status call(const char* what, ncclResult_t rc) const {
    if (rc == ncclSuccess) {
      if (!tLastWarn.empty()) tLastWarn.clear();
      return Status();
    }
    std::string said;
    if (!tLastWarn.empty()) {
      said = "; it said: " + tLastWarn;
      tLastWarn.clear();
    }
    // NCCL defines ncclRemoteError as a network error or a remote process that exited early:
    // the peer went away, as far as the caller can tell. ncclInvalidUsage from a call that moves
    // data is the two sides' calls not matching (Loom's own plugin says so for a message that
    // does not fit its receive: nccl_result.h).
    Status st(ncclnet::codeOfNcclResult(rc),
              fmt::format("{}: {} failed: {} ({}){}", describe(), what, ncclnet::ncclResultName(rc),
                          static_cast<int>(rc), said));
    if (rc == ncclabi::ncclRemoteError) return st.withCause(Cause::kPeerGone);
    if (rc == ncclabi::ncclInvalidUsage) return st.withCause(Cause::kMismatch);
    return st;
  }

  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices())
      return LOOM_ERROR(kInvalidArgument, "{}: no device {} (it has {})", describe(), dev,
                        devices());
    return Status();
  }

  // The largest message on dev: maxP2pBytes, the version's isend size, and test's int sizes.
  size_t maxBytes(int dev) const {
    size_t m = std::min<size_t>(props_[dev].maxP2pBytes, abi_->maxMessageBytes());
    return std::min<size_t>(m, INT_MAX);
  }

  Comm* newComm(Comm::Kind kind, void* plugin, int dev) {
    auto* c = new Comm();
    c->kind = kind;
    c->plugin = plugin;
    c->dev = dev;
    c->maxBytes = maxBytes(dev);
    c->maxRecvs = std::min(props_[dev].maxRecvs, kMaxGroupedRecvs);
    return c;
  }

  Result<Comm*> commOf(void* comm, Comm::Kind kind, const char* what) const {
    auto* c = static_cast<Comm*>(comm);
    if (c == nullptr || c->kind != kind)
      return LOOM_ERROR(kInvalidArgument, "{}: {} on a null comm or a comm of the wrong kind",
                        describe(), what);
    return c;
  }

  Result<Comm*> dataComm(void* comm, const char* what) const {
    auto* c = static_cast<Comm*>(comm);
    if (c == nullptr || c->kind == Comm::Kind::kListen)
      return LOOM_ERROR(kInvalidArgument, "{}: {} needs a send or recv comm", describe(), what);
    return c;
  }

  Request* newRequest(Comm* c, Request::Kind kind, int n) {
    Request* r;
    if (!c->spare.empty()) {
      r = c->spare.back();
      c->spare.pop_back();
    } else {
      r = new Request();
    }
    r->kind = kind;
    r->comm = c;
    r->plugin = nullptr;
    r->n = n;
    r->nAuto = 0;
    r->nGpu = 0;
    r->index = c->inflight.size();
    c->inflight.push_back(r);
    return r;
  }

  // Registers *data for r when the caller gave no mhandle (*mh null): CUDA device memory through
  // the comm's kept registration of its allocation (gpuRegistration: the plugin's GPUDirect RDMA;
  // a plugin without it refuses), anything else as host memory for the life of r.
  Status autoRegister(Request* r, void** data, size_t size, void** mh) {
    if (*mh != nullptr) return Status();
    if (size == 0) *data = &gZeroByte;
    const device::PointerInfo info =
        size && device::cudaUsable() ? device::classify(*data) : device::PointerInfo{};
    if (info.kind == MemKind::kCudaDevice) {
      LOOM_ASSIGN(GpuReg * g, gpuRegistration(r->comm, *data, size, info.bufferId));
      ++g->users;
      r->gpu[r->nGpu++] = g;
      *mh = g->mh;
      return Status();
    }
    void* h = nullptr;
    LOOM_TRY(call("regMr", abi_->regMr(r->comm->plugin, *data, std::max<size_t>(size, 1),
                                       ncclabi::NCCL_PTR_HOST, &h)));
    r->autoMh[r->nAuto++] = h;
    *mh = h;
    return Status();
  }

  // Whether GPU memory on dev is registered through a dma-buf: the plugin takes one
  // (NCCL_PTR_DMABUF and regMrDmaBuf), which NCCL prefers.
  bool dmabufPath(int dev) const {
    return (props_[dev].ptrSupport & ncclabi::NCCL_PTR_DMABUF) != 0 && abi_->hasRegMrDmaBuf();
  }

  // The export of the CUDA allocation holding [data, data + size), with one more user: the one
  // kept, or a new one (made on the calling thread). The export itself is made
  // without exportMu_ held: a registration on the runner's thread waits for that lock, and the
  // export may wait for the driver's mapping lock, held by a thread waiting for the runner.
  Result<GpuExport*> exportOf(const void* data, size_t size) {
    const auto p = reinterpret_cast<uintptr_t>(data);
    const uint64_t id = device::bufferId(data);
    auto freed = [](const GpuExport& e) {  // its allocation is gone (or another is there now)
      return device::bufferId(reinterpret_cast<const void*>(e.begin)) != e.bufferId;
    };
    auto find = [&]() -> GpuExport* {
      for (auto& e : exports_)
        if (e->begin <= p && p + size <= e->begin + e->length && e->bufferId == id && id != 0) {
          ++e->users;
          return e.get();
        }
      return nullptr;
    };
    {
      std::lock_guard<std::mutex> lk(exportMu_);
      const auto now = std::chrono::steady_clock::now();
      if (now - lastSweep_ >= std::chrono::seconds(1)) {  // freed allocations' exports go
        lastSweep_ = now;
        dropIdle(exports_, freed, closeExport);
      }
      if (GpuExport* e = find()) return e;
    }
    auto made = std::make_unique<GpuExport>();
    uint64_t offset = 0;
    LOOM_TRY(device::exportDmabuf(data, size, &made->fd, &offset, &made->begin, &made->length));
    made->bufferId = id;
    made->users = 1;
    std::lock_guard<std::mutex> lk(exportMu_);
    if (GpuExport* e = find()) {  // another thread exported it meanwhile
      ::close(made->fd);
      return e;
    }
    dropIdle(exports_, freed, closeExport);
    makeIdleRoom(exports_, closeExport);
    exports_.push_back(std::move(made));
    return exports_.back().get();
  }

  static void closeExport(const GpuExport& e) { ::close(e.fd); }

  // Deregisters a GpuReg of c.
  auto deregisterer(Comm* c) {
    return [this, c](const GpuReg& g) {
      Status st = call("deregMr", abi_->deregMr(c->plugin, g.mh));
      if (!st.isOk()) LOOM_WARN("{}", st.message());
    };
  }

  // c's registration of the CUDA allocation holding [data, data + size), made on its first use:
  // the whole allocation, through a dma-buf where the plugin takes one (dmabufPath: the export
  // holdMemory made, else one made here), else with regMr as NCCL_PTR_CUDA. id: the allocation's
  // buffer id (classify).
  Result<GpuReg*> gpuRegistration(Comm* c, void* data, size_t size, uint64_t id) {
    const auto p = reinterpret_cast<uintptr_t>(data);
    for (auto& g : c->gpuRegs)
      if (g->begin <= p && p + size <= g->end && g->bufferId == id && id != 0) return g.get();
    auto dereg = deregisterer(c);
    dropIdle(
        c->gpuRegs,
        [](const GpuReg& g) {
          return device::bufferId(reinterpret_cast<const void*>(g.begin)) != g.bufferId;
        },
        dereg);
    makeIdleRoom(c->gpuRegs, dereg);
    auto g = std::make_unique<GpuReg>();
    g->bufferId = id;
    const bool dmabuf = dmabufPath(c->dev);
    size_t length = 0;
    Status st;
    if (dmabuf) {
      LOOM_ASSIGN(GpuExport * e, exportOf(data, size));
      g->begin = e->begin;
      length = e->length;
      // As NCCL: the fd stays the caller's; the plugin takes its own reference if it needs one.
      st = call("regMrDmaBuf", abi_->regMrDmaBuf(c->plugin, reinterpret_cast<void*>(g->begin),
                                                 length, ncclabi::NCCL_PTR_CUDA, 0, e->fd, &g->mh));
      releaseMemory(e);
    } else {
      LOOM_TRY(device::allocationOf(data, size, &g->begin, &length));
      st = call("regMr", abi_->regMr(c->plugin, reinterpret_cast<void*>(g->begin), length,
                                     ncclabi::NCCL_PTR_CUDA, &g->mh));
    }
    if (!st.isOk())
      return Status(st.code(), fmt::format("registering the GPU allocation at {:#x} ({} bytes, "
                                           "holding buffer {} of {} bytes) with {}: {}",
                                           g->begin, length, data, size,
                                           dmabuf ? "a dma-buf" : "regMr", st.message()))
          .withCause(st.cause());
    g->end = g->begin + length;
    LOOM_INFO(kSubNet, "{}: GPU allocation at {:#x} ({} bytes) registered on device {} ({})",
              describe(), g->begin, length, c->dev, dmabuf ? "dma-buf" : "regMr");
    c->gpuRegs.push_back(std::move(g));
    return c->gpuRegs.back().get();
  }

  void releaseRegistrations(Request* r) {
    for (int i = 0; i < r->nAuto; ++i) {
      Status st = call("deregMr", abi_->deregMr(r->comm->plugin, r->autoMh[i]));
      if (!st.isOk()) LOOM_WARN("{}", st.message());
    }
    r->nAuto = 0;
    for (int i = 0; i < r->nGpu; ++i) {
      --r->gpu[i]->users;
      r->gpu[i]->lastUse = ++r->comm->uses;
    }
    r->nGpu = 0;
  }

  // Ends r (completed, failed, or never posted): its registrations go, the slot is reused.
  void finish(Request* r) {
    releaseRegistrations(r);
    Comm* c = r->comm;
    Request* last = c->inflight.back();
    c->inflight[r->index] = last;
    last->index = r->index;
    c->inflight.pop_back();
    r->plugin = nullptr;
    c->spare.push_back(r);
  }

  // NCCL's order: registrations go while the comm still exists, then the comm.
  Status closeData(Comm* c, const char* what) {
    std::unique_ptr<Comm> owned(c);
    for (Request* r : c->inflight) releaseRegistrations(r);
    dropIdle(
        c->gpuRegs, [](const GpuReg&) { return true; }, deregisterer(c));
    return call(what, c->kind == Comm::Kind::kSend ? abi_->closeSend(c->plugin)
                                                   : abi_->closeRecv(c->plugin));
  }

  std::string path_;
  std::unique_ptr<PluginAbi> abi_;
  std::string name_;
  bool initialised_ = false;
  std::vector<PluginProps> props_;
  std::mutex connectMu_;
  std::map<std::pair<std::thread::id, std::string>, std::unique_ptr<net::Handle>> connecting_;
  std::mutex exportMu_;  // exports_, exportUses_, lastSweep_
  std::vector<std::unique_ptr<GpuExport>> exports_;
  uint64_t exportUses_ = 0;
  std::chrono::steady_clock::time_point lastSweep_{};
};

// dlopen as NCCL does: the name as given, then libnccl-net-<name>.so. Never closed.
Result<std::pair<void*, std::string>> openLibrary(const std::string& nameOrPath) {
  std::vector<std::string> tries{nameOrPath};
  if (nameOrPath.find('/') == std::string::npos)
    tries.push_back("libnccl-net-" + nameOrPath + ".so");
  std::string errors;
  for (const std::string& t : tries) {
    void* h = dlopen(t.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return std::make_pair(h, t);
    const char* e = dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", e ? e : t + ": not loadable");
  }
  return LOOM_ERROR(kSystem, "cannot load the NCCL net plugin '{}' (tried {}): {}", nameOrPath,
                    tries.size() == 1 ? tries[0] : tries[0] + " and " + tries[1], errors);
}

}  // namespace

Result<std::unique_ptr<net::Transport>> loadNcclNetPlugin(const std::string& nameOrPath,
                                                          int onlyVersion) {
  if (nameOrPath.empty())
    return LOOM_ERROR(kInvalidArgument, "no NCCL net plugin named (LOOM_NET_PLUGIN is empty)");
  if (onlyVersion != 0 &&
      (onlyVersion < ncclnet::kOldestVersion || onlyVersion > ncclnet::kNewestVersion))
    return LOOM_ERROR(kInvalidArgument, "NCCL net plugin ABI v{} is not spoken here (v{} to v{})",
                      onlyVersion, ncclnet::kOldestVersion, ncclnet::kNewestVersion);
  LOOM_ASSIGN(auto lib, openLibrary(nameOrPath));
  const std::string& path = lib.second;
  std::string looked;
  for (int v = ncclnet::kNewestVersion; v >= ncclnet::kOldestVersion; --v) {
    if (onlyVersion != 0 && v != onlyVersion) continue;
    const std::string sym = "ncclNetPlugin_v" + std::to_string(v);
    looked += (looked.empty() ? "" : ", ") + sym;
    void* table = dlsym(lib.first, sym.c_str());
    if (table == nullptr) continue;
    auto abi = ncclnet::makePluginAbi(v, table);
    std::string missing = abi->missingMembers();
    if (!missing.empty())
      return LOOM_ERROR(kInvalidUsage, "NCCL net plugin {}: {} leaves required members NULL: {}",
                        path, sym, missing);
    LOOM_INFO(kSubNet | kSubInit, "NCCL net plugin {}: network '{}', using {}", path, abi->name(),
              sym);
    auto t = std::make_unique<PluginTransport>(path, std::move(abi));
    LOOM_TRY(t->start());
    return std::unique_ptr<net::Transport>(std::move(t));
  }
  return LOOM_ERROR(kInvalidUsage,
                    "{} is not an NCCL net plugin Loom can use: it exports none of {} (NCCL 2.20 "
                    "and later plugins export at least ncclNetPlugin_v8)",
                    path, looked);
}

}  // namespace loom
