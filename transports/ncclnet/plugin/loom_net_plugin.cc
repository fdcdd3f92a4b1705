#include "transports/ncclnet/plugin/loom_net_plugin.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "src/core/log.h"
#include "src/core/params.h"
#include "transports/ncclnet/nccl_result.h"
#include "transports/net.h"
#include "transports/select/select.h"

namespace loom {
namespace ncclplugin {
namespace {

using abi::ncclResult_t;

constexpr uint32_t kListenMagic = 0x4c4e4c53;   // "LNLS"
constexpr uint32_t kSendMagic = 0x4c4e5344;     // "LNSD"
constexpr uint32_t kRecvMagic = 0x4c4e5243;     // "LNRC"
constexpr uint32_t kRequestMagic = 0x4c4e5251;  // "LNRQ"
constexpr uint32_t kContextMagic = 0x4c4e4358;  // "LNCX"
constexpr uint32_t kDeadMagic = 0xdeadbeef;
constexpr int kMaxRequests = abi::NCCL_NET_MAX_REQUESTS;
// Request slots per comm: the 32 isend/irecv NCCL may have outstanding, plus as many flushes.
constexpr int kSlots = 2 * kMaxRequests;

// ---- logging ----------------------------------------------------------------------------------

std::atomic<abi::ncclDebugLogger_t> gLogger{nullptr};

// The level NCCL's logger will print (NCCL_DEBUG; it filters again itself): Loom formats nothing
// that would be dropped.
LogLevel ncclDebugLevel() {
  const char* v = std::getenv("NCCL_DEBUG");
  if (v == nullptr) return LogLevel::kWarn;
  if (strcasecmp(v, "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(v, "TRACE") == 0) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

void toNcclLogger(LogLevel level, uint32_t subsys, const char* file, int line, const char* msg) {
  abi::ncclDebugLogger_t log = gLogger.load(std::memory_order_acquire);
  if (log == nullptr) return;
  abi::ncclDebugLogLevel l = level == LogLevel::kWarn   ? abi::NCCL_LOG_WARN
                             : level == LogLevel::kInfo ? abi::NCCL_LOG_INFO
                                                        : abi::NCCL_LOG_TRACE;
  unsigned long flags = abi::NCCL_NET;
  if (subsys & kSubInit) flags |= abi::NCCL_INIT;
  log(l, flags, file, line, "NET/Loom : %s", msg);
}

// Logs the failure of `what` with its cause and converts it.
ncclResult_t fail(const char* what, const Status& st) {
  LOOM_WARN("{} failed: {}", what, st.message());
  return ncclnet::ncclResultOf(st);
}

// Runs f, turning any exception into an error code: nothing may unwind into NCCL.
template <typename F>
ncclResult_t guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(what, LOOM_ERROR(kSystem, "out of memory"));
  } catch (const std::exception& e) {
    return fail(what, LOOM_ERROR(kInternal, "unexpected exception: {}", e.what()));
  } catch (...) {
    return fail(what, LOOM_ERROR(kInternal, "unexpected exception"));
  }
}

// ---- process state -----------------------------------------------------------------------------

struct Device {
  std::string name;
  std::string pciPath;
  DeviceProps props;
};

struct State {
  std::mutex mu;  // serialises loadTransport
  // Process-wide, never freed (see select.h). Published last (release): devs is complete and
  // immutable once transport is non-null, so the data path reads both without the lock.
  std::atomic<net::Transport*> transport{nullptr};
  std::vector<std::unique_ptr<Device>> devs;
};

State& state() {
  static State* s = new State();  // leaked: NCCL may call in during static teardown
  return *s;
}

const char* ptrSupportText(int p) {
  if ((p & abi::NCCL_PTR_CUDA) && (p & abi::NCCL_PTR_DMABUF)) return "HOST|CUDA|DMABUF";
  if (p & abi::NCCL_PTR_CUDA) return "HOST|CUDA";
  return "HOST";
}

// Chooses the transport and reads the device properties once. Caller holds state().mu.
Status loadTransport(State& s) {
  if (s.transport.load(std::memory_order_acquire) != nullptr) return Status();
  auto chosen = networkTransport(/*allowPlugin=*/false);
  if (!chosen.isOk()) return chosen.status();
  net::Transport* t = chosen.value();
  const int n = t->devices();
  if (n < 1) return LOOM_ERROR(kSystem, "Loom's {} transport found no network device", t->name());
  std::vector<std::unique_ptr<Device>> devs;
  std::string list;
  for (int d = 0; d < n; ++d) {
    net::Properties p;
    LOOM_TRY(t->getProperties(d, &p).withContext(fmt::format("properties of device {}", d)));
    auto dev = std::make_unique<Device>();
    dev->name = p.name.empty() ? fmt::format("{}{}", t->name(), d) : p.name;
    dev->pciPath = p.pciPath;
    DeviceProps& o = dev->props;
    o.name = dev->name.c_str();
    o.pciPath = dev->pciPath.empty() ? nullptr : dev->pciPath.c_str();
    // Equal GUIDs tell NCCL "ports of one NIC": a transport that knows none gets one per device.
    o.guid = p.guid != 0 ? p.guid : static_cast<uint64_t>(d);
    o.ptrSupport = abi::NCCL_PTR_HOST;
    if (p.ptrSupport & net::kPtrCuda) o.ptrSupport |= abi::NCCL_PTR_CUDA;
    if ((p.ptrSupport & net::kPtrCuda) && (p.ptrSupport & net::kPtrDmabuf))
      o.ptrSupport |= abi::NCCL_PTR_DMABUF;
    o.speedMbps = p.speedMbps > 0 ? p.speedMbps : 1;
    o.port = p.port;
    o.latencyUs = p.latencyUs >= 0 ? p.latencyUs : 0;
    o.maxComms = p.maxComms > 0 ? p.maxComms : 1;
    o.maxRecvs = std::max(1, std::min(p.maxRecvs, kMaxGroup));
    o.maxTransferBytes =
        std::min(p.maxP2pBytes > 0 ? p.maxP2pBytes : kMaxTransferBytes, kMaxTransferBytes);
    list += fmt::format("{}[{}] {} ({} Mb/s, ptrSupport {}, GPUDirect RDMA {})", d == 0 ? "" : "; ",
                        d, dev->name, o.speedMbps, ptrSupportText(o.ptrSupport),
                        (o.ptrSupport & abi::NCCL_PTR_CUDA) ? "supported" : "not available");
    devs.push_back(std::move(dev));
  }
  s.devs = std::move(devs);
  s.transport.store(t, std::memory_order_release);
  LOOM_LOG_AT(LogLevel::kInfo, kSubInit | kSubNet,
              "plugin {} over Loom's {} transport (LOOM_NET={}), {} device(s): {}", kPluginName,
              t->name(), params::kNet.str().empty() ? "auto" : params::kNet.str(), n, list);
  return Status();
}

// The state once init succeeded.
struct Ready {
  net::Transport* transport;
  const std::vector<std::unique_ptr<Device>>* devs;
};
Result<Ready> ready(const char* what) {
  State& s = state();
  net::Transport* t = s.transport.load(std::memory_order_acquire);
  if (t == nullptr) return LOOM_ERROR(kInvalidUsage, "{} before a successful init", what);
  return Ready{t, &s.devs};
}

Result<const Device*> deviceOf(const Ready& s, int dev, const char* what) {
  const int n = static_cast<int>(s.devs->size());
  if (dev < 0 || dev >= n)
    return LOOM_ERROR(kInvalidArgument, "{}: device {} out of range (0..{})", what, dev, n - 1);
  return (*s.devs)[dev].get();
}

// ---- comms and requests ------------------------------------------------------------------------

struct Comm;

struct Request {
  uint32_t magic = 0;
  Comm* comm = nullptr;
  void* inner = nullptr;
  int n = 0;
  bool counted = false;  // an isend/irecv (counts toward the 32); false: a flush
  bool inUse = false;
  size_t sendSize = 0;
};

struct Listen {
  uint32_t magic = kListenMagic;
  int dev = 0;
  void* inner = nullptr;
};

struct Comm {
  uint32_t magic = 0;
  int dev = 0;
  const Device* device = nullptr;
  void* inner = nullptr;
  int outstanding = 0;
  bool gdrLogged = false;
  Request slots[kSlots];
  std::vector<Request*> freeSlots;

  Comm(uint32_t m, int d, const Device* devp, void* in)
      : magic(m), dev(d), device(devp), inner(in) {
    freeSlots.reserve(kSlots);
    for (int i = kSlots - 1; i >= 0; --i) freeSlots.push_back(&slots[i]);
  }
  bool isSend() const { return magic == kSendMagic; }
  const char* direction() const { return isSend() ? "send" : "receive"; }
  Request* take(bool counted) {
    if (freeSlots.empty() || (counted && outstanding >= kMaxRequests)) return nullptr;
    Request* r = freeSlots.back();
    freeSlots.pop_back();
    r->magic = kRequestMagic;
    r->comm = this;
    r->inner = nullptr;
    r->n = 1;
    r->counted = counted;
    r->inUse = true;
    r->sendSize = 0;
    if (counted) ++outstanding;
    return r;
  }
  void release(Request* r) {
    if (r->counted) --outstanding;
    r->inUse = false;
    r->magic = 0;
    freeSlots.push_back(r);
  }
};

Result<Comm*> commOf(void* p, const char* what) {
  auto* c = static_cast<Comm*>(p);
  if (c == nullptr) return LOOM_ERROR(kInvalidArgument, "{} on a null comm", what);
  if (c->magic != kSendMagic && c->magic != kRecvMagic)
    return LOOM_ERROR(kInvalidArgument, "{} on {} which is not a Loom send or receive comm", what,
                      p);
  return c;
}

Result<Comm*> commOf(void* p, uint32_t magic, const char* what) {
  LOOM_ASSIGN(Comm * c, commOf(p, what));
  if (c->magic != magic) return LOOM_ERROR(kInvalidUsage, "{} on a {} comm", what, c->direction());
  return c;
}

// Says once per connection which path its data takes.
void logPath(const Comm& c, const char* peerWhat) {
  const bool gdr = (c.device->props.ptrSupport & abi::NCCL_PTR_CUDA) != 0;
  LOOM_LOG_AT(LogLevel::kInfo, kSubInit | kSubNet, "{} connection on dev {} ({}) {}: {}",
              c.direction(), c.dev, c.device->name, peerWhat,
              gdr ? "GPUDirect RDMA capable (NCCL may register GPU buffers with the NIC)"
                  : "staged through host memory (no GPUDirect RDMA on this transport/device)");
}

struct Context {
  uint32_t magic = kContextMagic;
  uint64_t commId = 0;
  int trafficClass = abi::NCCL_NET_TRAFFIC_CLASS_UNDEF;
};

}  // namespace

// ---- entry points ------------------------------------------------------------------------------

ncclResult_t invalidArgument(const char* what, const char* why) {
  return fail(what, LOOM_ERROR(kInvalidArgument, "{}", why));
}

ncclResult_t initProcess(abi::ncclDebugLogger_t logger) {
  return guarded("init", [&] {
    if (logger != nullptr) {
      gLogger.store(logger, std::memory_order_release);
      setLogSink(&toNcclLogger, ncclDebugLevel());
    }
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    Status st = loadTransport(s);
    if (!st.isOk()) return fail("init", st);
    return abi::ncclSuccess;
  });
}

ncclResult_t initContext(void** ctx, uint64_t commId, int trafficClass,
                         abi::ncclDebugLogger_t logger) {
  if (ctx == nullptr) return invalidArgument("init", "null context pointer");
  *ctx = nullptr;
  ncclResult_t r = initProcess(logger);
  if (r != abi::ncclSuccess) return r;
  return guarded("init", [&] {
    auto* c = new Context();
    c->commId = commId;
    c->trafficClass = trafficClass;
    if (trafficClass != abi::NCCL_NET_TRAFFIC_CLASS_UNDEF)
      LOOM_INFO(kSubNet,
                "communicator {:#x} asks for traffic class {}: Loom's transports take theirs from "
                "LOOM_IB_TC",
                commId, trafficClass);
    *ctx = c;
    return abi::ncclSuccess;
  });
}

ncclResult_t checkContext(void* ctx, const char* what) {
  if (ctx == nullptr) return abi::ncclSuccess;
  if (static_cast<Context*>(ctx)->magic != kContextMagic)
    return invalidArgument(what, "context was not returned by this plugin's init");
  return abi::ncclSuccess;
}

ncclResult_t finalizeContext(void* ctx) {
  if (ctx == nullptr) return abi::ncclSuccess;
  auto* c = static_cast<Context*>(ctx);
  if (c->magic != kContextMagic)
    return invalidArgument("finalize", "context was not returned by this plugin's init");
  c->magic = kDeadMagic;
  delete c;
  return abi::ncclSuccess;
}

ncclResult_t devices(int* ndev) {
  return guarded("devices", [&] {
    if (ndev == nullptr) return invalidArgument("devices", "null pointer");
    auto s = ready("devices");
    if (!s.isOk()) return fail("devices", s.status());
    *ndev = static_cast<int>(s.value().devs->size());
    return abi::ncclSuccess;
  });
}

ncclResult_t deviceProps(int dev, DeviceProps* props) {
  return guarded("getProperties", [&] {
    auto s = ready("getProperties");
    if (!s.isOk()) return fail("getProperties", s.status());
    auto d = deviceOf(s.value(), dev, "getProperties");
    if (!d.isOk()) return fail("getProperties", d.status());
    *props = d.value()->props;
    return abi::ncclSuccess;
  });
}

ncclResult_t listen(int dev, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    if (listenComm == nullptr || handle == nullptr)
      return invalidArgument("listen", "null handle or comm pointer");
    *listenComm = nullptr;
    auto s = ready("listen");
    if (!s.isOk()) return fail("listen", s.status());
    auto d = deviceOf(s.value(), dev, "listen");
    if (!d.isOk()) return fail("listen", d.status());
    net::Handle h{};
    void* inner = nullptr;
    Status st = s.value().transport->listen(dev, &h, &inner);
    if (!st.isOk()) return fail("listen", st);
    std::memcpy(handle, h.bytes, net::kHandleSize);
    auto* l = new Listen();
    l->dev = dev;
    l->inner = inner;
    *listenComm = l;
    return abi::ncclSuccess;
  });
}

ncclResult_t connect(int dev, void* handle, void** sendComm) {
  return guarded("connect", [&] {
    if (sendComm == nullptr || handle == nullptr)
      return invalidArgument("connect", "null handle or comm pointer");
    *sendComm = nullptr;
    auto s = ready("connect");
    if (!s.isOk()) return fail("connect", s.status());
    auto d = deviceOf(s.value(), dev, "connect");
    if (!d.isOk()) return fail("connect", d.status());
    net::Handle h;
    std::memcpy(h.bytes, handle, net::kHandleSize);
    void* inner = nullptr;
    Status st = s.value().transport->connect(dev, h, &inner);
    if (!st.isOk()) return fail("connect", st);
    if (inner == nullptr) return abi::ncclSuccess;  // not yet: NCCL calls again
    auto c = std::make_unique<Comm>(kSendMagic, dev, d.value(), inner);
    logPath(*c, "connected");
    *sendComm = c.release();
    return abi::ncclSuccess;
  });
}

ncclResult_t accept(void* listenComm, void** recvComm) {
  return guarded("accept", [&] {
    if (recvComm == nullptr) return invalidArgument("accept", "null comm pointer");
    *recvComm = nullptr;
    auto* l = static_cast<Listen*>(listenComm);
    if (l == nullptr || l->magic != kListenMagic)
      return invalidArgument("accept", "not a listen comm of this plugin");
    auto s = ready("accept");
    if (!s.isOk()) return fail("accept", s.status());
    auto d = deviceOf(s.value(), l->dev, "accept");
    if (!d.isOk()) return fail("accept", d.status());
    void* inner = nullptr;
    Status st = s.value().transport->accept(l->inner, &inner);
    if (!st.isOk()) return fail("accept", st);
    if (inner == nullptr) return abi::ncclSuccess;
    auto c = std::make_unique<Comm>(kRecvMagic, l->dev, d.value(), inner);
    logPath(*c, "accepted");
    *recvComm = c.release();
    return abi::ncclSuccess;
  });
}

// regMr, and regMrDmaBuf with the caller's dma-buf of GPU memory (dmabufFd >= 0), as `what`.
ncclResult_t registerMemory(const char* what, void* comm, void* data, size_t size, int type,
                            int dmabufFd, uint64_t dmabufOffset, void** mhandle) {
  return guarded(what, [&] {
    if (mhandle == nullptr) return invalidArgument(what, "null mhandle pointer");
    *mhandle = nullptr;
    auto s = ready(what);
    if (!s.isOk()) return fail(what, s.status());
    auto c = commOf(comm, what);
    if (!c.isOk()) return fail(what, c.status());
    Comm* cm = c.value();
    if (type != abi::NCCL_PTR_HOST && type != abi::NCCL_PTR_CUDA)
      return fail(what,
                  LOOM_ERROR(kInvalidArgument,
                             "memory type {} (valid: NCCL_PTR_HOST 1, NCCL_PTR_CUDA 2)", type));
    if (type == abi::NCCL_PTR_CUDA && !(cm->device->props.ptrSupport & abi::NCCL_PTR_CUDA))
      return fail(
          what, LOOM_ERROR(kInvalidArgument,
                           "cannot register GPU memory (type = 2, {} bytes at {}) on dev {} ({}): "
                           "this transport/device has no GPUDirect RDMA (ptrSupport {}); NCCL "
                           "stages GPU data through host memory when ptrSupport lacks CUDA",
                           size, data, cm->dev, cm->device->name,
                           ptrSupportText(cm->device->props.ptrSupport)));
    const int loomType = type == abi::NCCL_PTR_CUDA ? net::kPtrCuda : net::kPtrHost;
    Status st = dmabufFd >= 0 && type == abi::NCCL_PTR_CUDA
                    ? s.value().transport->regMrDmaBuf(cm->inner, data, size, loomType,
                                                       dmabufOffset, dmabufFd, mhandle)
                    : s.value().transport->regMr(cm->inner, data, size, loomType, mhandle);
    if (!st.isOk()) return fail(what, st);
    if (type == abi::NCCL_PTR_CUDA && !cm->gdrLogged) {
      cm->gdrLogged = true;
      LOOM_LOG_AT(LogLevel::kInfo, kSubInit | kSubNet,
                  "{} connection on dev {} ({}): GPUDirect RDMA in use (GPU buffer registered)",
                  cm->direction(), cm->dev, cm->device->name);
    }
    return abi::ncclSuccess;
  });
}

ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return registerMemory("regMr", comm, data, size, type, -1, 0, mhandle);
}

ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                         void** mhandle) {
  // The fd is NCCL's: it closes it right after this call, so nothing here keeps it (the NIC's
  // registration takes its own reference). Host memory needs no dma-buf; GPU memory is registered
  // through it, so that this call makes no export of its own (which takes the CUDA driver's
  // mapping lock); only offered when the device supports it.
  if (type == abi::NCCL_PTR_CUDA) {
    auto s = ready("regMrDmaBuf");
    if (!s.isOk()) return fail("regMrDmaBuf", s.status());
    auto c = commOf(comm, "regMrDmaBuf");
    if (!c.isOk()) return fail("regMrDmaBuf", c.status());
    if (!(c.value()->device->props.ptrSupport & abi::NCCL_PTR_DMABUF))
      return fail("regMrDmaBuf",
                  LOOM_ERROR(kInvalidArgument,
                             "dma-buf registration of GPU memory on dev {} ({}): not supported "
                             "(ptrSupport {})",
                             c.value()->dev, c.value()->device->name,
                             ptrSupportText(c.value()->device->props.ptrSupport)));
  }
  return registerMemory("regMrDmaBuf", comm, data, size, type, fd, offset, mhandle);
}

ncclResult_t deregMr(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    auto s = ready("deregMr");
    if (!s.isOk()) return fail("deregMr", s.status());
    auto c = commOf(comm, "deregMr");
    if (!c.isOk()) return fail("deregMr", c.status());
    Status st = s.value().transport->deregMr(c.value()->inner, mhandle);
    if (!st.isOk()) return fail("deregMr", st);
    return abi::ncclSuccess;
  });
}

ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                   void** request) {
  return guarded("isend", [&] {
    if (request == nullptr) return invalidArgument("isend", "null request pointer");
    *request = nullptr;
    auto s = ready("isend");
    if (!s.isOk()) return fail("isend", s.status());
    auto c = commOf(sendComm, kSendMagic, "isend");
    if (!c.isOk()) return fail("isend", c.status());
    Comm* cm = c.value();
    if (size > cm->device->props.maxTransferBytes)
      return fail(
          "isend",
          LOOM_ERROR(kInvalidArgument, "{} bytes on dev {} ({}): more than maxP2pBytes ({})", size,
                     cm->dev, cm->device->name, cm->device->props.maxTransferBytes));
    Request* r = cm->take(/*counted=*/true);
    if (r == nullptr) return abi::ncclSuccess;  // 32 outstanding: NCCL retries
    void* inner = nullptr;
    Status st = s.value().transport->isend(cm->inner, data, size, tag, mhandle, &inner);
    if (!st.isOk() || inner == nullptr) {
      cm->release(r);
      return st.isOk() ? abi::ncclSuccess : fail("isend", st);
    }
    r->inner = inner;
    r->sendSize = size;
    *request = r;
    return abi::ncclSuccess;
  });
}

ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                   void** mhandles, void** request) {
  return guarded("irecv", [&] {
    // NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION; every receive here completes
    // through test, so the hint is overwritten.
    if (request == nullptr) return invalidArgument("irecv", "null request pointer");
    *request = nullptr;
    auto s = ready("irecv");
    if (!s.isOk()) return fail("irecv", s.status());
    auto c = commOf(recvComm, kRecvMagic, "irecv");
    if (!c.isOk()) return fail("irecv", c.status());
    Comm* cm = c.value();
    if (n < 1 || n > cm->device->props.maxRecvs)
      return fail("irecv", LOOM_ERROR(kInvalidArgument,
                                      "grouped receive of {} buffers on dev {} ({}): 1 to maxRecvs "
                                      "({})",
                                      n, cm->dev, cm->device->name, cm->device->props.maxRecvs));
    if (data == nullptr || sizes == nullptr || tags == nullptr)
      return invalidArgument("irecv", "null data, sizes or tags array");
    Request* r = cm->take(/*counted=*/true);
    if (r == nullptr) return abi::ncclSuccess;
    void* inner = nullptr;
    Status st = s.value().transport->irecv(cm->inner, n, data, sizes, tags, mhandles, &inner);
    if (!st.isOk() || inner == nullptr) {
      cm->release(r);
      return st.isOk() ? abi::ncclSuccess : fail("irecv", st);
    }
    r->inner = inner;
    r->n = n;
    *request = r;
    return abi::ncclSuccess;
  });
}

ncclResult_t iflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles,
                    void** request) {
  return guarded("iflush", [&] {
    if (request == nullptr) return invalidArgument("iflush", "null request pointer");
    *request = nullptr;
    auto s = ready("iflush");
    if (!s.isOk()) return fail("iflush", s.status());
    auto c = commOf(recvComm, kRecvMagic, "iflush");
    if (!c.isOk()) return fail("iflush", c.status());
    Comm* cm = c.value();
    if (n < 1 || n > kMaxGroup || sizes == nullptr || data == nullptr)
      return fail("iflush",
                  LOOM_ERROR(kInvalidArgument, "flush of {} buffers (1 to {})", n, kMaxGroup));
    size_t sz[kMaxGroup];
    for (int i = 0; i < n; ++i) {
      if (sizes[i] < 0)
        return fail("iflush", LOOM_ERROR(kInvalidArgument, "negative size {}", sizes[i]));
      sz[i] = static_cast<size_t>(sizes[i]);
    }
    void* inner = nullptr;
    Status st = s.value().transport->iflush(cm->inner, n, data, sz, mhandles, &inner);
    if (!st.isOk()) return fail("iflush", st);
    if (inner == nullptr) return abi::ncclSuccess;  // nothing to wait for
    Request* r = cm->take(/*counted=*/false);
    if (r == nullptr)
      return fail("iflush", LOOM_ERROR(kInternal, "more than {} flushes outstanding", kSlots));
    r->inner = inner;
    r->n = 1;
    *request = r;
    return abi::ncclSuccess;
  });
}

ncclResult_t test(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    if (done == nullptr) return invalidArgument("test", "null done pointer");
    *done = 0;
    auto* r = static_cast<Request*>(request);
    if (r == nullptr || r->magic != kRequestMagic || !r->inUse)
      return invalidArgument("test", "not an outstanding request of this plugin");
    auto s = ready("test");
    if (!s.isOk()) return fail("test", s.status());
    Comm* cm = r->comm;
    size_t got[kMaxGroup] = {};
    Status st = s.value().transport->test(r->inner, done, got);
    if (!st.isOk()) {
      *done = 0;
      const bool send = cm->isSend();
      const int dev = cm->dev;
      const std::string name = cm->device->name;
      cm->release(r);
      return fail(send ? "test of a send" : "test of a receive",
                  st.withContext(fmt::format("dev {} ({})", dev, name)));
    }
    if (!*done) return abi::ncclSuccess;
    if (cm->isSend() && r->counted) got[0] = r->sendSize;
    const int n = r->n;
    cm->release(r);
    if (sizes != nullptr) {
      for (int i = 0; i < n; ++i) {
        if (got[i] > static_cast<size_t>(INT_MAX))
          return fail("test",
                      LOOM_ERROR(kInternal, "{} bytes received: more than test() can report (int)",
                                 got[i]));
        sizes[i] = static_cast<int>(got[i]);
      }
    }
    return abi::ncclSuccess;
  });
}

namespace {
ncclResult_t closeComm(void* p, uint32_t magic, const char* what) {
  return guarded(what, [&] {
    if (p == nullptr) return abi::ncclSuccess;
    auto c = commOf(p, magic, what);
    if (!c.isOk()) return fail(what, c.status());
    auto s = ready(what);
    if (!s.isOk()) return fail(what, s.status());
    std::unique_ptr<Comm> cm(c.value());
    Status st = magic == kSendMagic ? s.value().transport->closeSend(cm->inner)
                                    : s.value().transport->closeRecv(cm->inner);
    cm->magic = kDeadMagic;
    for (Request& r : cm->slots) r.magic = 0;  // requests still in flight die with the comm
    if (!st.isOk()) return fail(what, st);
    return abi::ncclSuccess;
  });
}
}  // namespace

ncclResult_t closeSend(void* sendComm) { return closeComm(sendComm, kSendMagic, "closeSend"); }
ncclResult_t closeRecv(void* recvComm) { return closeComm(recvComm, kRecvMagic, "closeRecv"); }

ncclResult_t closeListen(void* listenComm) {
  return guarded("closeListen", [&] {
    if (listenComm == nullptr) return abi::ncclSuccess;
    auto* l = static_cast<Listen*>(listenComm);
    if (l->magic != kListenMagic)
      return invalidArgument("closeListen", "not a listen comm of this plugin");
    auto s = ready("closeListen");
    if (!s.isOk()) return fail("closeListen", s.status());
    Status st = s.value().transport->closeListen(l->inner);
    l->magic = kDeadMagic;
    delete l;
    if (!st.isOk()) return fail("closeListen", st);
    return abi::ncclSuccess;
  });
}

}  // namespace ncclplugin
}  // namespace loom
