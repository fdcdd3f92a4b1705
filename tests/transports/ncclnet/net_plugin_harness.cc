// loom-net-plugin-harness: drives an NCCL net plugin the way NCCL does, without NCCL.
//
//   loom-net-plugin-harness [--plugin PATH] [--version 8..12] [--big] [--gpu] [--verbose]
//
// It dlopens the plugin (default: the libnccl-net-loom.so of this build), checks that every
// ncclNetPlugin_v8 .. ncclNetPlugin_v12 symbol is exported, takes the table of --version and runs
// two ranks as processes (fork; the out-of-band channel is a socketpair, as NCCL's bootstrap would
// be): init (twice: one context per communicator), devices, getProperties; a loopback pair whose
// listen, connect and accept run alternated in one thread (NCCL's GPU-direct probe); a connection
// each way between the ranks, connect and accept again alternated in one thread; regMr of every
// buffer; sizes 0 B up to 16 MiB (with --big: 1 GiB, or 1 GiB - 1 for v8 whose sizes are int);
// 32 requests in flight and the 33rd refused; grouped receives of 8 with tags; iflush; a truncated
// receive (error, no hang, no corruption); closing with requests in flight; deregMr, closes,
// finalize. One line per check; exit status 0 only when every check passed.
//
// With --gpu, rank 0 also does what NCCL does with GPUDirect RDMA: device buffers of the CUDA
// driver (LOOM_CUDA_LIB, else libcuda.so.1) registered as NCCL_PTR_CUDA, the send buffer through
// regMrDmaBuf with the allocation's dma-buf (as NCCL exports it) where ptrSupport has
// NCCL_PTR_DMABUF, a device-to-device message over the loopback pair, the flush of the receive,
// and every byte read back. --gpu fails where the plugin offers no NCCL_PTR_CUDA.
//
// The network comes from the environment (LOOM_NET, LOOM_IBVERBS_LIB, LOOM_SOCKET_IFNAME, ...),
// so the same binary runs over sockets, the emulated IB device and real hardware.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "src/device/cuda_driver.h"
#include "transports/ncclnet/nccl_net_abi.h"

#ifndef LOOM_NET_PLUGIN_PATH
#define LOOM_NET_PLUGIN_PATH "libnccl-net-loom.so"
#endif

namespace {

namespace abi = ::loom::ncclabi;
using abi::ncclResult_t;

constexpr int kMaxRequests = abi::NCCL_NET_MAX_REQUESTS;
constexpr size_t kOneGiB = size_t(1) << 30;
constexpr int64_t kDeadlineMs = 60000;  // a request that takes longer is a hang
constexpr unsigned kWatchdogSeconds = 280;

int gRank = -1;
int gFailures = 0;
int gChecks = 0;
bool gVerbose = false;

void check(bool ok, const std::string& name, const std::string& detail = std::string()) {
  ++gChecks;
  if (!ok) ++gFailures;
  std::printf("[rank %d] %s %s%s%s\n", gRank, ok ? "PASS" : "FAIL", name.c_str(),
              detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stdout);
}

std::string str(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string str(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

int64_t nowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

// ---- the logger handed to the plugin (NCCL's ncclDebugLogger_t) -------------------------------

std::mutex gLogMu;
std::vector<std::string> gLogInfo;
int gLogWarns = 0;

void logger(abi::ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
            const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(gLogMu);
  if (level == abi::NCCL_LOG_WARN) {
    ++gLogWarns;
    // Some checks provoke errors on purpose (a truncated receive, refused arguments): their
    // WARN lines show the message a user would get.
    std::printf("[rank %d]   plugin WARN: %s\n", gRank, buf);
  } else {
    if (level == abi::NCCL_LOG_INFO) gLogInfo.push_back(buf);
    if (gVerbose) std::printf("[rank %d]   plugin log %d/%#lx: %s\n", gRank, level, flags, buf);
  }
  std::fflush(stdout);
}

bool logHas(const char* needle) {
  std::lock_guard<std::mutex> lk(gLogMu);
  for (const auto& l : gLogInfo)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

// ---- one view of every ABI version ----------------------------------------------------------

struct Props {
  std::string name;
  const char* pciPath = nullptr;
  uint64_t guid = 0;
  int ptrSupport = 0, regIsGlobal = 0, forceFlush = 0, speed = 0, port = 0;
  float latency = 0;
  int maxComms = 0, maxRecvs = 0, netDeviceType = -1, netDeviceVersion = 0;
  int vNdevs = -1, vDev0 = -1;               // v9+
  size_t maxP2pBytes = 0, maxCollBytes = 0;  // v9+
  int maxMultiRequestSize = -1;              // v11+
};

class Net {
 public:
  virtual ~Net() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  virtual ncclResult_t init(void** ctx, uint64_t commId) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;
  virtual ncclResult_t devices(int* n) = 0;
  virtual ncclResult_t getProperties(int dev, Props* p) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** sc) = 0;
  virtual ncclResult_t accept(void* lc, void** rc) = 0;
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) = 0;
  virtual ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t off,
                                   int fd, void** mh) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mh) = 0;
  // size is passed as the version's type (int for v8: the caller keeps it in range).
  virtual ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) = 0;
  virtual ncclResult_t isendInt(void* sc, void* data, int size, int tag, void* mh,
                                void** req) = 0;  // v8 only
  virtual ncclResult_t irecv(void* rc, int n, void** data, const size_t* sizes, int* tags,
                             void** mhs, void** req) = 0;
  virtual ncclResult_t iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) = 0;
  virtual ncclResult_t test(void* req, int* done, int* sizes) = 0;
  virtual ncclResult_t closeSend(void* c) = 0;
  virtual ncclResult_t closeRecv(void* c) = 0;
  virtual ncclResult_t closeListen(void* c) = 0;
  virtual bool hasVersionEntries(std::string* why) const = 0;
};

template <int V, typename T>
class NetV final : public Net {
 public:
  explicit NetV(const T* t) : t_(t) {}
  int version() const override { return V; }
  const char* name() const override { return t_->name; }

  ncclResult_t init(void** ctx, uint64_t commId) override {
    *ctx = nullptr;
    if constexpr (V >= 11) {
      abi::ncclNetCommConfig_v11_t config{abi::NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return t_->init(ctx, commId, &config, &logger, nullptr);
    } else if constexpr (V == 10) {
      return t_->init(&logger, nullptr);
    } else {
      return t_->init(&logger);
    }
  }
  ncclResult_t finalize(void* ctx) override {
    if constexpr (V >= 11) return t_->finalize(ctx);
    return abi::ncclSuccess;
  }
  ncclResult_t devices(int* n) override { return t_->devices(n); }
  ncclResult_t getProperties(int dev, Props* p) override {
    if constexpr (V == 8) {
      abi::ncclNetProperties_v8_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      if (r == abi::ncclSuccess) common(q, p);
      return r;
    } else if constexpr (V == 9 || V == 10) {
      abi::ncclNetProperties_v9_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      if (r == abi::ncclSuccess) common(q, p), v9(q, p);
      return r;
    } else if constexpr (V == 11) {
      abi::ncclNetProperties_v11_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      if (r == abi::ncclSuccess)
        common(q, p), v9(q, p), p->maxMultiRequestSize = q.maxMultiRequestSize;
      return r;
    } else {
      abi::ncclNetProperties_v12_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      if (r == abi::ncclSuccess)
        common(q, p), v9(q, p), p->maxMultiRequestSize = q.maxMultiRequestSize;
      return r;
    }
  }
  ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) override {
    if constexpr (V >= 11) {
      return t_->listen(ctx, dev, handle, lc);
    } else {
      return t_->listen(dev, handle, lc);
    }
  }
  ncclResult_t connect(void* ctx, int dev, void* handle, void** sc) override {
    abi::ncclNetDeviceHandle_t* devComm = nullptr;
    if constexpr (V >= 11) {
      return t_->connect(ctx, dev, handle, sc, &devComm);
    } else if constexpr (V == 10) {
      abi::ncclNetCommConfig_v10_t config{abi::NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return t_->connect(dev, &config, handle, sc, &devComm);
    } else {
      return t_->connect(dev, handle, sc, &devComm);
    }
  }
  ncclResult_t accept(void* lc, void** rc) override {
    abi::ncclNetDeviceHandle_t* devComm = nullptr;
    return t_->accept(lc, rc, &devComm);
  }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) override {
    return t_->regMr(comm, data, size, type, mh);
  }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t off, int fd,
                           void** mh) override {
    return t_->regMrDmaBuf(comm, data, size, type, off, fd, mh);
  }
  ncclResult_t deregMr(void* comm, void* mh) override { return t_->deregMr(comm, mh); }
  ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) override {
    if constexpr (V == 8) {
      return t_->isend(sc, data, static_cast<int>(size), tag, mh, req);
    } else if constexpr (V == 9) {
      return t_->isend(sc, data, size, tag, mh, req);
    } else {
      return t_->isend(sc, data, size, tag, mh, nullptr, req);
    }
  }
  ncclResult_t isendInt(void* sc, void* data, int size, int tag, void* mh, void** req) override {
    if constexpr (V == 8) return t_->isend(sc, data, size, tag, mh, req);
    return abi::ncclInvalidUsage;
  }
  ncclResult_t irecv(void* rc, int n, void** data, const size_t* sizes, int* tags, void** mhs,
                     void** req) override {
    if constexpr (V == 8) {
      int s[64];
      for (int i = 0; i < n && i < 64; ++i) s[i] = static_cast<int>(sizes[i]);
      return t_->irecv(rc, n, data, s, tags, mhs, req);
    } else {
      size_t s[64];
      for (int i = 0; i < n && i < 64; ++i) s[i] = sizes[i];
      if constexpr (V == 9) {
        return t_->irecv(rc, n, data, s, tags, mhs, req);
      } else {
        void* ph[64] = {};
        return t_->irecv(rc, n, data, s, tags, mhs, ph, req);
      }
    }
  }
  ncclResult_t iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) override {
    return t_->iflush(rc, n, data, sizes, mhs, req);
  }
  ncclResult_t test(void* req, int* done, int* sizes) override {
    return t_->test(req, done, sizes);
  }
  ncclResult_t closeSend(void* c) override { return t_->closeSend(c); }
  ncclResult_t closeRecv(void* c) override { return t_->closeRecv(c); }
  ncclResult_t closeListen(void* c) override { return t_->closeListen(c); }
  bool hasVersionEntries(std::string* why) const override {
    const bool core = t_->init && t_->devices && t_->getProperties && t_->listen && t_->connect &&
                      t_->accept && t_->regMr && t_->regMrDmaBuf && t_->deregMr && t_->isend &&
                      t_->irecv && t_->iflush && t_->test && t_->closeSend && t_->closeRecv &&
                      t_->closeListen;
    if (!core) *why = "a mandatory function pointer is NULL";
    if constexpr (V >= 11) {
      if (!t_->finalize || !t_->setNetAttr) {
        *why = "finalize or setNetAttr is NULL";
        return false;
      }
    }
    return core;
  }

 private:
  template <typename Q>
  static void common(const Q& q, Props* p) {
    p->name = q.name ? q.name : "";
    p->pciPath = q.pciPath;
    p->guid = q.guid;
    p->ptrSupport = q.ptrSupport;
    p->regIsGlobal = q.regIsGlobal;
    p->speed = q.speed;
    p->port = q.port;
    p->latency = q.latency;
    p->maxComms = q.maxComms;
    p->maxRecvs = q.maxRecvs;
    p->netDeviceType = q.netDeviceType;
    p->netDeviceVersion = q.netDeviceVersion;
  }
  template <typename Q>
  static void v9(const Q& q, Props* p) {
    p->forceFlush = q.forceFlush;
    p->vNdevs = q.vProps.ndevs;
    p->vDev0 = q.vProps.devs[0];
    p->maxP2pBytes = q.maxP2pBytes;
    p->maxCollBytes = q.maxCollBytes;
  }

  const T* t_;
};

std::unique_ptr<Net> makeNet(void* lib, int version) {
  void* sym = dlsym(lib, str("ncclNetPlugin_v%d", version).c_str());
  if (sym == nullptr) return nullptr;
  switch (version) {
    case 8:
      return std::make_unique<NetV<8, abi::ncclNet_v8_t>>(static_cast<abi::ncclNet_v8_t*>(sym));
    case 9:
      return std::make_unique<NetV<9, abi::ncclNet_v9_t>>(static_cast<abi::ncclNet_v9_t*>(sym));
    case 10:
      return std::make_unique<NetV<10, abi::ncclNet_v10_t>>(static_cast<abi::ncclNet_v10_t*>(sym));
    case 11:
      return std::make_unique<NetV<11, abi::ncclNet_v11_t>>(static_cast<abi::ncclNet_v11_t*>(sym));
    case 12:
      return std::make_unique<NetV<12, abi::ncclNet_v12_t>>(static_cast<abi::ncclNet_v12_t*>(sym));
    default:
      return nullptr;
  }
}

// ---- out-of-band channel between the two ranks ------------------------------------------------

int gOob = -1;

bool oobSend(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(gOob, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool oobRecv(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(gOob, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Both ranks reach the same point; a dead peer ends this rank (it would wait forever).
void barrier(const char* where) {
  char b = 'b';
  if (!oobSend(&b, 1) || !oobRecv(&b, 1)) {
    check(false, str("barrier %s", where), "the other rank is gone");
    std::exit(1);
  }
}

// ---- data patterns ---------------------------------------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = mix(seed * 0x100000001b3ull + i);
    std::memcpy(b + i, &w, 8);
  }
  if (i < n) {
    uint64_t w = mix(seed * 0x100000001b3ull + i);
    std::memcpy(b + i, &w, n - i);
  }
}

// Index of the first byte that differs from fill(seed), or n.
size_t verify(const void* p, size_t n, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = mix(seed * 0x100000001b3ull + i);
    if (std::memcmp(b + i, &w, 8) != 0) break;
  }
  for (; i < n; ++i) {
    uint64_t w = mix(seed * 0x100000001b3ull + (i & ~size_t(7)));
    if (b[i] != reinterpret_cast<const uint8_t*>(&w)[i & 7]) return i;
  }
  return n;
}

constexpr uint8_t kCanary = 0xa5;

bool canaryIntact(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != kCanary) return false;
  return true;
}

// Page-aligned, zero-initialised host memory (NICs register pages).
struct Buffer {
  void* p = nullptr;
  size_t n = 0;
  explicit Buffer(size_t bytes) : n(bytes) {
    p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
  }
  ~Buffer() { ::munmap(p, std::max<size_t>(n, 1)); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(p); }
};

// ---- driving requests ------------------------------------------------------------------------

Net* gNet = nullptr;

// Tests req until it completes, fails or the deadline passes. Returns the test result, or
// ncclNumResults for a hang.
ncclResult_t waitRequest(void* req, int* sizes, int64_t deadlineMs = kDeadlineMs) {
  const int64_t end = nowMs() + deadlineMs;
  for (;;) {
    int done = 0;
    ncclResult_t r = gNet->test(req, &done, sizes);
    if (r != abi::ncclSuccess) return r;
    if (done) return abi::ncclSuccess;
    if (nowMs() > end) return abi::ncclNumResults;
  }
}

// Tests every request of reqs round-robin until all completed. False (with a message) on an
// error or a hang.
bool waitAll(std::vector<void*>& reqs, std::vector<std::vector<int>>* sizes, std::string* why) {
  const int64_t end = nowMs() + kDeadlineMs;
  size_t left = reqs.size();
  while (left > 0) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      int* s = sizes ? (*sizes)[i].data() : nullptr;
      ncclResult_t r = gNet->test(reqs[i], &done, s);
      if (r != abi::ncclSuccess) {
        *why = str("request %zu: test returned %d", i, r);
        return false;
      }
      if (done) {
        reqs[i] = nullptr;
        --left;
      }
    }
    if (nowMs() > end) {
      *why = str("%zu request(s) still pending after %lld ms", left, (long long)kDeadlineMs);
      return false;
    }
  }
  return true;
}

// Posts with NCCL's retry rule: a NULL request means "again later".
ncclResult_t postSend(void* sc, void* data, size_t size, int tag, void* mh, void** req) {
  const int64_t end = nowMs() + kDeadlineMs;
  for (;;) {
    ncclResult_t r = gNet->isend(sc, data, size, tag, mh, req);
    if (r != abi::ncclSuccess || *req != nullptr) return r;
    if (nowMs() > end) return abi::ncclNumResults;
  }
}

ncclResult_t postRecv(void* rc, int n, void** data, const size_t* sizes, int* tags, void** mhs,
                      void** req) {
  const int64_t end = nowMs() + kDeadlineMs;
  for (;;) {
    ncclResult_t r = gNet->irecv(rc, n, data, sizes, tags, mhs, req);
    if (r != abi::ncclSuccess || *req != nullptr) return r;
    if (nowMs() > end) return abi::ncclNumResults;
  }
}

struct Conn {
  void* send = nullptr;  // to the other rank (or to self, for the loopback pair)
  void* recv = nullptr;
};

// listen on dev; the handle goes to the peer (or stays here for loopback); connect and accept
// alternate in this one thread until both are established, as NCCL does. A blocking connect or
// accept deadlocks here, which is the point.
bool establish(void* ctx, int dev, bool loopback, Conn* c, std::string* why) {
  unsigned char mine[abi::NCCL_NET_HANDLE_MAXSIZE] = {};
  unsigned char theirs[abi::NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ncclResult_t r = gNet->listen(ctx, dev, mine, &lc);
  if (r != abi::ncclSuccess || lc == nullptr) {
    *why = str("listen returned %d", r);
    return false;
  }
  if (loopback) {
    std::memcpy(theirs, mine, sizeof(mine));
  } else if (!oobSend(mine, sizeof(mine)) || !oobRecv(theirs, sizeof(theirs))) {
    *why = "handle exchange failed: the other rank is gone";
    return false;
  }
  const int64_t end = nowMs() + kDeadlineMs;
  while (c->send == nullptr || c->recv == nullptr) {
    if (c->send == nullptr) {
      r = gNet->connect(ctx, dev, theirs, &c->send);
      if (r != abi::ncclSuccess) {
        *why = str("connect returned %d", r);
        return false;
      }
    }
    if (c->recv == nullptr) {
      r = gNet->accept(lc, &c->recv);
      if (r != abi::ncclSuccess) {
        *why = str("accept returned %d", r);
        return false;
      }
    }
    if (nowMs() > end) {
      *why = str("not connected after %lld ms (send %s, recv %s)", (long long)kDeadlineMs,
                 c->send ? "up" : "pending", c->recv ? "up" : "pending");
      return false;
    }
  }
  // NCCL closes the listen comm as soon as accept succeeded.
  r = gNet->closeListen(lc);
  if (r != abi::ncclSuccess) {
    *why = str("closeListen returned %d", r);
    return false;
  }
  return true;
}

bool closeConn(Conn* c) {
  ncclResult_t a = c->send ? gNet->closeSend(c->send) : abi::ncclSuccess;
  ncclResult_t b = c->recv ? gNet->closeRecv(c->recv) : abi::ncclSuccess;
  c->send = c->recv = nullptr;
  return a == abi::ncclSuccess && b == abi::ncclSuccess;
}

// How many of this process's descriptors refer to the file `fd` refers to (itself included).
// Other threads (the emulated device's, the plugin's) open and close descriptors of their own
// at any time, so counting every descriptor would race with them; this counts only one file's.
int fdsOnFileOf(int fd) {
  struct stat want {};
  if (::fstat(fd, &want) != 0) return -1;
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      struct stat st {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      if (e->d_name[0] != '.' && ::stat(path.c_str(), &st) == 0 && st.st_dev == want.st_dev &&
          st.st_ino == want.st_ino)
        ++n;
    }
    ::closedir(d);
  }
  return n;
}

// ---- the checks ------------------------------------------------------------------------------

struct Run {
  bool big = false;
  bool ours = false;  // the plugin is Loom's: its own contracts are checked too
  void* ctx = nullptr;
  int dev = 0;
  Props props;
};

// One message of each size from rank 1 to rank 0 over c (rank 0 receives).
void sizesCheck(Run& run, Conn& c) {
  std::vector<size_t> sizes = {0, 1, 3, 4096, 65535, (size_t(1) << 20) + 7, size_t(16) << 20};
  if (run.big) sizes.push_back(gNet->version() == 8 ? kOneGiB - 1 : kOneGiB);
  const size_t slack = 64;
  const size_t cap = sizes.back() + slack;
  Buffer buf(cap);
  void* mh = nullptr;
  void* comm = gRank == 0 ? c.recv : c.send;
  ncclResult_t r = gNet->regMr(comm, buf.p, cap, abi::NCCL_PTR_HOST, &mh);
  check(r == abi::ncclSuccess, str("regMr of a %zu-byte host buffer", cap), str("returned %d", r));
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    const uint64_t seed = 1000 + k;
    void* req = nullptr;
    int got = -1;
    if (gRank == 1) {
      fill(buf.p, n, seed);
      r = postSend(c.send, buf.p, n, 7, mh, &req);
      if (r == abi::ncclSuccess) r = waitRequest(req, nullptr);
      check(r == abi::ncclSuccess, str("send of %zu bytes", n), str("result %d", r));
    } else {
      // The posted receive is larger than the message: test reports the size received.
      std::memset(buf.bytes() + n, kCanary, slack);
      size_t post = n + slack;
      int tag = 7;
      void* data = buf.p;
      r = postRecv(c.recv, 1, &data, &post, &tag, &mh, &req);
      if (r == abi::ncclSuccess) r = waitRequest(req, &got);
      const size_t bad = r == abi::ncclSuccess ? verify(buf.p, n, seed) : 0;
      check(r == abi::ncclSuccess && got == static_cast<int>(n) && bad == n &&
                canaryIntact(buf.bytes() + n, slack),
            str("receive of %zu bytes into a %zu-byte buffer", n, post),
            str("result %d, size %d, first bad byte %zu, canary %s", r, got, bad,
                canaryIntact(buf.bytes() + n, slack) ? "intact" : "overwritten"));
    }
  }
  r = gNet->deregMr(comm, mh);
  check(r == abi::ncclSuccess, "deregMr", str("returned %d", r));
}

// 32 requests in flight each way; the 33rd must wait (NULL request).
void inflightCheck(Run& run, Conn& c) {
  const size_t each = 64 << 10;
  Buffer buf(each * kMaxRequests);
  void* comm = gRank == 0 ? c.recv : c.send;
  void* mh = nullptr;
  ncclResult_t r = gNet->regMr(comm, buf.p, buf.n, abi::NCCL_PTR_HOST, &mh);
  check(r == abi::ncclSuccess, "regMr of the in-flight buffers", str("returned %d", r));
  std::vector<void*> reqs(kMaxRequests, nullptr);
  int posted = 0;
  if (gRank == 1) {
    for (int i = 0; i < kMaxRequests; ++i) {
      fill(buf.bytes() + i * each, each, 5000 + i);
      r = gNet->isend(c.send, buf.bytes() + i * each, each, 100 + i, mh, &reqs[i]);
      if (r == abi::ncclSuccess && reqs[i] != nullptr) ++posted;
    }
    check(posted == kMaxRequests, "32 sends posted without waiting",
          str("%d of 32 got a request", posted));
    if (run.ours) {
      void* extra = nullptr;
      r = gNet->isend(c.send, buf.p, 1, 999, mh, &extra);
      check(r == abi::ncclSuccess && extra == nullptr, "33rd send: NULL request (retry later)",
            str("result %d, request %p", r, extra));
    }
    barrier("in-flight sends posted");
  } else {
    barrier("in-flight sends posted");
    for (int i = 0; i < kMaxRequests; ++i) {
      void* data = buf.bytes() + i * each;
      size_t size = each;
      int tag = 100 + i;
      r = gNet->irecv(c.recv, 1, &data, &size, &tag, &mh, &reqs[i]);
      if (r == abi::ncclSuccess && reqs[i] != nullptr) ++posted;
    }
    check(posted == kMaxRequests, "32 receives posted without waiting",
          str("%d of 32 got a request", posted));
    if (run.ours) {
      void* extra = nullptr;
      void* data = buf.p;
      size_t size = 1;
      int tag = 999;
      r = gNet->irecv(c.recv, 1, &data, &size, &tag, &mh, &extra);
      check(r == abi::ncclSuccess && extra == nullptr, "33rd receive: NULL request (retry later)",
            str("result %d, request %p", r, extra));
    }
  }
  std::string why;
  std::vector<std::vector<int>> sizes(kMaxRequests, std::vector<int>(1, -1));
  bool ok = posted == kMaxRequests && waitAll(reqs, &sizes, &why);
  if (gRank == 0 && ok) {
    for (int i = 0; i < kMaxRequests && ok; ++i) {
      size_t bad = verify(buf.bytes() + i * each, each, 5000 + i);
      if (bad != each || sizes[i][0] != static_cast<int>(each)) {
        ok = false;
        why = str("message %d: size %d, first bad byte %zu", i, sizes[i][0], bad);
      }
    }
  }
  check(ok,
        gRank == 0 ? "32 in-flight receives completed in order with their data"
                   : "32 in-flight sends completed",
        why);
  r = gNet->deregMr(comm, mh);
  check(r == abi::ncclSuccess, "deregMr of the in-flight buffers", str("returned %d", r));
}

// Grouped receives: n buffers (8 where maxRecvs allows) per request, matched by tag; several
// groups in flight.
void groupedCheck(Run& run, Conn& c) {
  const int n = std::min(8, run.props.maxRecvs);
  if (n < 8)
    std::printf("[rank %d] note: maxRecvs is %d: grouped receives of %d\n", gRank,
                run.props.maxRecvs, n);
  const int groups = 4;
  const size_t slot = 16 << 10;
  Buffer buf(slot * n * groups);
  void* comm = gRank == 0 ? c.recv : c.send;
  void* mh = nullptr;
  ncclResult_t r = gNet->regMr(comm, buf.p, buf.n, abi::NCCL_PTR_HOST, &mh);
  check(r == abi::ncclSuccess, "regMr of the grouped-receive buffers", str("returned %d", r));
  auto msgSize = [](int g, int j) { return size_t(1000) * (j + 1) + 17 * g; };
  auto seedOf = [](int g, int j) { return uint64_t(7000 + 100 * g + j); };
  std::vector<void*> reqs;
  if (gRank == 1) {
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < n; ++j) {
        uint8_t* p = buf.bytes() + (g * n + j) * slot;
        fill(p, msgSize(g, j), seedOf(g, j));
        void* req = nullptr;
        r = postSend(c.send, p, msgSize(g, j), 10 * g + j, mh, &req);
        if (r != abi::ncclSuccess) break;
        reqs.push_back(req);
      }
    }
    std::string why;
    bool ok = r == abi::ncclSuccess && waitAll(reqs, nullptr, &why);
    check(ok, str("%d groups of %d tagged sends", groups, n), r ? str("result %d", r) : why);
    r = gNet->deregMr(comm, mh);
    check(r == abi::ncclSuccess, "deregMr of the grouped-send buffers", str("returned %d", r));
    return;
  }
  // Buffer j of group g waits for tag 10*g + (n-1-j): the reverse of the send order.
  std::vector<std::vector<int>> tags(groups, std::vector<int>(n));
  for (int g = 0; g < groups; ++g) {
    std::vector<void*> data(n), mhs(n, mh);
    std::vector<size_t> sizes(n, slot);
    for (int j = 0; j < n; ++j) {
      tags[g][j] = 10 * g + (n - 1 - j);
      data[j] = buf.bytes() + (g * n + j) * slot;
    }
    void* req = nullptr;
    r = postRecv(c.recv, n, data.data(), sizes.data(), tags[g].data(), mhs.data(), &req);
    check(r == abi::ncclSuccess, str("grouped receive %d of %d buffers posted", g, n),
          str("result %d", r));
    if (r != abi::ncclSuccess) return;
    reqs.push_back(req);
  }
  std::vector<std::vector<int>> got(groups, std::vector<int>(n, -1));
  std::string why;
  bool ok = waitAll(reqs, &got, &why);
  for (int g = 0; g < groups && ok; ++g) {
    for (int j = 0; j < n && ok; ++j) {
      const int sent = tags[g][j] - 10 * g;  // index j' of the matching send
      const size_t want = msgSize(g, sent);
      size_t bad = verify(buf.bytes() + (g * n + j) * slot, want, seedOf(g, sent));
      if (got[g][j] != static_cast<int>(want) || bad != want) {
        ok = false;
        why = str("group %d buffer %d (tag %d): size %d (want %zu), first bad byte %zu", g, j,
                  tags[g][j], got[g][j], want, bad);
      }
    }
  }
  check(ok, str("grouped receives: each message in the buffer with its tag, sizes per buffer"),
        why);
  if (run.ours) {
    void* data[64];
    size_t sizes[64];
    int tg[64];
    void* mhs[64];
    const int tooMany = std::min(run.props.maxRecvs + 1, 64);
    for (int j = 0; j < tooMany; ++j) data[j] = buf.p, sizes[j] = 1, tg[j] = j, mhs[j] = mh;
    void* req = nullptr;
    r = gNet->irecv(c.recv, tooMany, data, sizes, tg, mhs, &req);
    check(r != abi::ncclSuccess && req == nullptr,
          str("grouped receive of maxRecvs+1 = %d buffers refused", tooMany), str("result %d", r));
  }
  // A flush of host memory: success, and a request (if any) that completes.
  int fsize = 4096;
  void* fdata = buf.p;
  void* freq = nullptr;
  r = gNet->iflush(c.recv, 1, &fdata, &fsize, &mh, &freq);
  if (r == abi::ncclSuccess && freq != nullptr) r = waitRequest(freq, nullptr);
  check(r == abi::ncclSuccess, "iflush of a received host buffer", str("result %d", r));
  r = gNet->deregMr(comm, mh);
  check(r == abi::ncclSuccess, "deregMr of the grouped-receive buffers", str("returned %d", r));
}

// A send larger than the posted receive: an error on some side, no hang, nothing written past the
// posted size. On its own connection (the error may end the connection).
void truncationCheck(Run& run) {
  Conn c;
  std::string why;
  bool ok = establish(run.ctx, run.dev, false, &c, &why);
  check(ok, "connection for the truncation check", why);
  if (!ok) return;
  const size_t sent = 64 << 10, posted = 4 << 10, slack = 4 << 10;
  Buffer buf(sent + slack);
  void* comm = gRank == 0 ? c.recv : c.send;
  void* mh = nullptr;
  ncclResult_t r = gNet->regMr(comm, buf.p, buf.n, abi::NCCL_PTR_HOST, &mh);
  void* req = nullptr;
  if (gRank == 1) {
    fill(buf.p, sent, 42);
    r = postSend(c.send, buf.p, sent, 3, mh, &req);
  } else {
    std::memset(buf.p, kCanary, buf.n);
    size_t size = posted;
    int tag = 3;
    void* data = buf.p;
    r = postRecv(c.recv, 1, &data, &size, &tag, &mh, &req);
  }
  // Each rank tests until its request ends or the peer reports that its own ended; then tells the
  // peer. A side whose request never ends (the peer failed first) closes with it in flight.
  ncclResult_t mine = abi::ncclNumResults;  // still pending
  bool peerEnded = false;
  char peerOutcome = 0;
  const int64_t end = nowMs() + kDeadlineMs;
  if (r != abi::ncclSuccess) mine = r;
  // A peer that completed ('D') says nothing about this side: keep testing until this request
  // ends; a peer that failed ('E') may leave this side's request pending forever.
  while (mine == abi::ncclNumResults && !(peerEnded && peerOutcome == 'E') && nowMs() < end) {
    int done = 0;
    int size = -1;
    ncclResult_t t = gNet->test(req, &done, &size);
    if (t != abi::ncclSuccess)
      mine = t;
    else if (done)
      mine = abi::ncclSuccess;
    pollfd p{gOob, POLLIN, 0};
    if (!peerEnded && ::poll(&p, 1, 0) > 0) peerEnded = oobRecv(&peerOutcome, 1);
  }
  const bool ended = mine != abi::ncclNumResults;
  char outcome = !ended ? 'P' : mine == abi::ncclSuccess ? 'D' : 'E';
  oobSend(&outcome, 1);
  if (!peerEnded) peerEnded = oobRecv(&peerOutcome, 1);  // the peer always reports once
  const bool someError = outcome == 'E' || peerOutcome == 'E';
  if (gRank == 0) {
    check(outcome != 'D', "truncated receive does not complete as a success",
          str("receive outcome %c, sender outcome %c", outcome, peerOutcome));
    check(canaryIntact(buf.bytes() + posted, buf.n - posted),
          "truncated receive wrote nothing past the posted size");
  }
  check(someError, "a send larger than the posted receive is reported as an error",
        str("this rank %c, peer %c (D done, E error, P pending)", outcome, peerOutcome));
  check(ended || peerOutcome == 'E', "no hang on the truncated transfer",
        str("this rank %c, peer %c", outcome, peerOutcome));
  barrier("truncation outcome");
  // Close with the request possibly still in flight (allowed), then deregister.
  r = gNet->deregMr(comm, mh);
  ok = closeConn(&c);
  check(ok, "close after the truncation error");
}

// Requests in flight when the comms close: close must return, without a crash or a hang.
void closeInFlightCheck(Run& run) {
  Conn c;
  std::string why;
  bool ok = establish(run.ctx, run.dev, false, &c, &why);
  check(ok, "connection for the close-in-flight check", why);
  if (!ok) return;
  const int count = 8;
  const size_t each = 4 << 20;
  Buffer buf(each * count);
  void* comm = gRank == 0 ? c.recv : c.send;
  void* mh = nullptr;
  ncclResult_t r = gNet->regMr(comm, buf.p, buf.n, abi::NCCL_PTR_HOST, &mh);
  // Rank 1 posts 8 sends of 4 MiB, rank 0 only 2 receives: most sends cannot complete.
  int posted = 0;
  for (int i = 0; i < (gRank == 1 ? count : count / 4) && r == abi::ncclSuccess; ++i) {
    void* req = nullptr;
    uint8_t* p = buf.bytes() + i * each;
    if (gRank == 1) {
      r = gNet->isend(c.send, p, each, 1, mh, &req);
    } else {
      size_t size = each;
      int tag = 1;
      void* data = p;
      r = gNet->irecv(c.recv, 1, &data, &size, &tag, &mh, &req);
    }
    if (req != nullptr) ++posted;
  }
  check(r == abi::ncclSuccess && posted > 0, "requests posted before closing",
        str("%d posted, result %d", posted, r));
  barrier("in-flight before close");
  r = gNet->deregMr(comm, mh);
  ok = closeConn(&c);
  check(ok, "close with requests in flight returns success");
  barrier("closed in flight");
}

void propertiesCheck(Run& run, int ndev) {
  for (int d = 0; d < ndev; ++d) {
    Props p;
    ncclResult_t r = gNet->getProperties(d, &p);
    check(r == abi::ncclSuccess, str("getProperties(%d)", d), str("returned %d", r));
    if (r != abi::ncclSuccess) continue;
    if (d == run.dev) run.props = p;
    std::printf(
        "[rank %d] dev %d: name %s pciPath %s guid %#llx ptrSupport %#x speed %d port %d "
        "latency %.1f maxComms %d maxRecvs %d maxP2pBytes %zu\n",
        gRank, d, p.name.c_str(), p.pciPath ? p.pciPath : "(null)", (unsigned long long)p.guid,
        p.ptrSupport, p.speed, p.port, p.latency, p.maxComms, p.maxRecvs, p.maxP2pBytes);
    check(!p.name.empty(), str("dev %d has a name", d));
    check(p.pciPath == nullptr || p.pciPath[0] == '/', str("dev %d pciPath NULL or a path", d));
    check(
        (p.ptrSupport & abi::NCCL_PTR_HOST) != 0 &&
            (p.ptrSupport & ~(abi::NCCL_PTR_HOST | abi::NCCL_PTR_CUDA | abi::NCCL_PTR_DMABUF)) == 0,
        str("dev %d ptrSupport has HOST and only known bits", d), str("%#x", p.ptrSupport));
    check(!(p.ptrSupport & abi::NCCL_PTR_DMABUF) || (p.ptrSupport & abi::NCCL_PTR_CUDA),
          str("dev %d DMABUF only with CUDA", d));
    check(p.speed > 0 && p.latency >= 0 && p.maxComms > 0 && p.maxRecvs >= 1,
          str("dev %d speed, latency, maxComms, maxRecvs sane", d));
    check(p.netDeviceType == abi::NCCL_NET_DEVICE_HOST, str("dev %d netDeviceType host", d));
    if (gNet->version() >= 9) {
      check(p.maxP2pBytes > 0 && p.maxP2pBytes <= NCCL_ABI_MAX_NET_SIZE_BYTES &&
                p.maxCollBytes > 0 && p.maxCollBytes <= NCCL_ABI_MAX_NET_SIZE_BYTES,
            str("dev %d maxP2pBytes and maxCollBytes in (0, 1 TiB]", d),
            str("%zu, %zu", p.maxP2pBytes, p.maxCollBytes));
      check(p.vNdevs == 1 && p.vDev0 == d, str("dev %d vProps = {1, {%d}}", d, d),
            str("{%d, {%d}}", p.vNdevs, p.vDev0));
    }
    if (run.ours) {
      check(p.regIsGlobal == 0 && p.forceFlush == 0, str("dev %d regIsGlobal 0, forceFlush 0", d));
      if (gNet->version() >= 11)
        check(p.maxMultiRequestSize == 1, str("dev %d maxMultiRequestSize 1", d));
    }
  }
  Props none;
  ncclResult_t r = gNet->getProperties(ndev, &none);
  check(r != abi::ncclSuccess, str("getProperties(%d) (out of range) is an error", ndev),
        str("returned %d", r));
}

// The pair NCCL's GPU-direct probe builds: one process, one thread, connect and accept alternated.
void loopbackCheck(Run& run) {
  Conn c;
  std::string why;
  bool ok = establish(run.ctx, run.dev, true, &c, &why);
  check(ok, "loopback pair: listen + connect/accept alternated in one thread", why);
  if (!ok) return;
  if (run.ours)
    check(logHas("staged through host memory") || logHas("GPUDirect RDMA"),
          "the plugin logged the data path of the connection");
  Buffer sbuf(256 << 10), rbuf(256 << 10);
  void *smh = nullptr, *rmh = nullptr;
  ncclResult_t r1 = gNet->regMr(c.send, sbuf.p, sbuf.n, abi::NCCL_PTR_HOST, &smh);
  ncclResult_t r2 = gNet->regMr(c.recv, rbuf.p, rbuf.n, abi::NCCL_PTR_HOST, &rmh);
  check(r1 == abi::ncclSuccess && r2 == abi::ncclSuccess, "loopback regMr on send and recv comms");
  if (!(run.props.ptrSupport & abi::NCCL_PTR_CUDA)) {
    void* bad = nullptr;
    ncclResult_t r = gNet->regMr(c.send, sbuf.p, sbuf.n, abi::NCCL_PTR_CUDA, &bad);
    check(r != abi::ncclSuccess, "regMr of type CUDA refused when ptrSupport lacks CUDA",
          str("returned %d", r));
  }
  if (run.ours) {
    // regMrDmaBuf must not keep NCCL's fd (NCCL closes it right after the call).
    int fd = ::memfd_create("loom-harness", 0);
    if (fd >= 0) {
      const int before = fdsOnFileOf(fd);
      void* dm = nullptr;
      ncclResult_t r = gNet->regMrDmaBuf(c.send, sbuf.p, sbuf.n, abi::NCCL_PTR_HOST, 0, fd, &dm);
      const int after = fdsOnFileOf(fd);
      check(r == abi::ncclSuccess && before >= 1 && after == before,
            "regMrDmaBuf of host memory keeps no file descriptor",
            str("result %d, descriptors on the memfd %d -> %d", r, before, after));
      if (r == abi::ncclSuccess) gNet->deregMr(c.send, dm);
      ::close(fd);
    }
  }
  const size_t n = 200 << 10;
  fill(sbuf.p, n, 77);
  void *sreq = nullptr, *rreq = nullptr;
  void* data = rbuf.p;
  size_t size = rbuf.n;
  int tag = 0;
  ncclResult_t r = postRecv(c.recv, 1, &data, &size, &tag, &rmh, &rreq);
  if (r == abi::ncclSuccess) r = postSend(c.send, sbuf.p, n, 0, smh, &sreq);
  std::vector<void*> reqs = {sreq, rreq};
  std::vector<std::vector<int>> sizes = {{-1}, {-1}};
  ok = r == abi::ncclSuccess && waitAll(reqs, &sizes, &why);
  check(ok && sizes[1][0] == static_cast<int>(n) && verify(rbuf.p, n, 77) == n,
        "loopback message arrives intact", ok ? str("size %d", sizes[1][0]) : why);
  gNet->deregMr(c.send, smh);
  gNet->deregMr(c.recv, rmh);
  check(closeConn(&c), "loopback closeSend/closeRecv");
}

// ---- GPU buffers (--gpu) --------------------------------------------------------------------

bool gGpu = false;

// The CUDA driver entry points NCCL's GPUDirect path uses, from LOOM_CUDA_LIB (the emulated
// device in CI) or libcuda.so.1, with the driver's types (src/device/cuda_driver.h): called
// through a pointer of another type, the emulated device's functions would be undefined behaviour
// (clang's UBSan checks it).
struct Cuda {
  using Ptr = loom::cuda::CUdeviceptr;
  using Context = loom::cuda::CUcontext;
  using Stream = loom::cuda::CUstream;
  int (*cuInit)(unsigned) = nullptr;
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDevicePrimaryCtxRetain)(Context*, int) = nullptr;
  int (*cuCtxSetCurrent)(Context) = nullptr;
  int (*cuMemAlloc)(Ptr*, size_t) = nullptr;
  int (*cuMemFree)(Ptr) = nullptr;
  int (*cuMemcpyAsync)(Ptr, Ptr, size_t, Stream) = nullptr;
  int (*cuStreamSynchronize)(Stream) = nullptr;
  int (*cuMemGetAddressRange)(Ptr*, size_t*, Ptr) = nullptr;
  int (*cuMemGetHandleForAddressRange)(void*, Ptr, size_t, int, unsigned long long) = nullptr;

  // "" once loaded with device 0's primary context current, else why not.
  std::string load() {
    const char* lib = std::getenv("LOOM_CUDA_LIB");
    if (lib == nullptr || *lib == '\0') lib = "libcuda.so.1";
    void* h = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return str("cannot load %s: %s", lib, ::dlerror());
    std::string missing;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(h, name));
      if (*fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    sym(&cuInit, "cuInit");
    sym(&cuDeviceGet, "cuDeviceGet");
    sym(&cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(&cuCtxSetCurrent, "cuCtxSetCurrent");
    sym(&cuMemAlloc, "cuMemAlloc_v2");
    sym(&cuMemFree, "cuMemFree_v2");
    sym(&cuMemcpyAsync, "cuMemcpyAsync");
    sym(&cuStreamSynchronize, "cuStreamSynchronize");
    sym(&cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    sym(&cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
    if (!missing.empty()) return str("%s lacks %s", lib, missing.c_str());
    int dev = 0;
    Context ctx = nullptr;
    int rc = cuInit(0);
    if (rc == 0) rc = cuDeviceGet(&dev, 0);
    if (rc == 0) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == 0) rc = cuCtxSetCurrent(ctx);
    return rc == 0 ? std::string() : str("%s: no usable device 0 (CUresult %d)", lib, rc);
  }
  bool copy(Ptr dst, Ptr src, size_t n) const {
    return cuMemcpyAsync(dst, src, n, nullptr) == 0 && cuStreamSynchronize(nullptr) == 0;
  }
};

void gpuDirectCheck(Run& run) {
  Cuda cu;
  std::string why = cu.load();
  check(why.empty(), "--gpu: the CUDA driver loads, device 0's context current", why);
  if (!why.empty()) return;
  const int ptr = run.props.ptrSupport;
  check(ptr & abi::NCCL_PTR_CUDA, "--gpu: ptrSupport offers NCCL_PTR_CUDA (GPUDirect RDMA)",
        str("ptrSupport %d", ptr));
  if (!(ptr & abi::NCCL_PTR_CUDA)) return;
  Conn c;
  bool ok = establish(run.ctx, run.dev, true, &c, &why);
  check(ok, "--gpu: loopback pair", why);
  if (!ok) return;
  const size_t bytes = 2 << 20, n = (1 << 20) + 3;
  Cuda::Ptr src = 0, dst = 0;
  if (cu.cuMemAlloc(&src, bytes) != 0 || cu.cuMemAlloc(&dst, bytes) != 0) {
    check(false, "--gpu: cuMemAlloc of two 2 MiB device buffers");
    return;
  }
  std::vector<uint8_t> pattern(n), back(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<uint8_t>(i * 13 + 5);
  ok = cu.copy(src + 64, reinterpret_cast<Cuda::Ptr>(pattern.data()), n);
  check(ok, "--gpu: the pattern copied to the device");
  void *smh = nullptr, *rmh = nullptr;
  ncclResult_t r = abi::ncclSuccess;
  if (ptr & abi::NCCL_PTR_DMABUF) {
    // As NCCL registers with dma-buf: the allocation exported from its base, offset 0.
    Cuda::Ptr base = 0;
    size_t size = 0;
    int fd = -1;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    int rc = cu.cuMemGetAddressRange(&base, &size, src);
    const size_t exported = (size + page - 1) / page * page;
    if (rc == 0) rc = cu.cuMemGetHandleForAddressRange(&fd, base, exported, 1, 0);
    check(rc == 0 && fd >= 0, "--gpu: the send buffer's allocation exported as a dma-buf",
          str("CUresult %d", rc));
    const int before = fd >= 0 ? fdsOnFileOf(fd) : -1;
    r = gNet->regMrDmaBuf(c.send, reinterpret_cast<void*>(base), exported, abi::NCCL_PTR_CUDA, 0,
                          fd, &smh);
    const int after = fd >= 0 ? fdsOnFileOf(fd) : -1;
    check(r == abi::ncclSuccess && before >= 1 && after == before,
          "--gpu: regMrDmaBuf of GPU memory (NCCL_PTR_CUDA), keeping no file descriptor",
          str("result %d, descriptors on the dma-buf %d -> %d", r, before, after));
    if (fd >= 0) ::close(fd);
  } else {
    r = gNet->regMr(c.send, reinterpret_cast<void*>(src), bytes, abi::NCCL_PTR_CUDA, &smh);
    check(r == abi::ncclSuccess, "--gpu: regMr of the GPU send buffer (NCCL_PTR_CUDA)",
          str("result %d", r));
  }
  ncclResult_t r2 =
      gNet->regMr(c.recv, reinterpret_cast<void*>(dst), bytes, abi::NCCL_PTR_CUDA, &rmh);
  check(r2 == abi::ncclSuccess, "--gpu: regMr of the GPU receive buffer (NCCL_PTR_CUDA)",
        str("result %d", r2));
  check(logHas("GPUDirect RDMA in use"), "--gpu: the plugin logged GPUDirect RDMA in use");
  if (r == abi::ncclSuccess && r2 == abi::ncclSuccess) {
    void* data = reinterpret_cast<void*>(dst + 128);
    size_t size = n;
    int tag = 7;
    void *sreq = nullptr, *rreq = nullptr;
    r = postRecv(c.recv, 1, &data, &size, &tag, &rmh, &rreq);
    if (r == abi::ncclSuccess)
      r = postSend(c.send, reinterpret_cast<void*>(src + 64), n, tag, smh, &sreq);
    std::vector<void*> reqs = {sreq, rreq};
    std::vector<std::vector<int>> sizes = {{-1}, {-1}};
    ok = r == abi::ncclSuccess && waitAll(reqs, &sizes, &why);
    check(ok && sizes[1][0] == static_cast<int>(n), "--gpu: a device-to-device message",
          ok ? str("size %d", sizes[1][0]) : why);
    // NCCL flushes a GPU receive before its kernels read it: a request that completes.
    int fsize = static_cast<int>(n);
    void* freq = nullptr;
    r = gNet->iflush(c.recv, 1, &data, &fsize, &rmh, &freq);
    check(r == abi::ncclSuccess && freq != nullptr, "--gpu: iflush of the GPU receive is a request",
          str("result %d", r));
    if (r == abi::ncclSuccess && freq != nullptr)
      check(waitRequest(freq, nullptr) == abi::ncclSuccess, "--gpu: the flush completes");
    ok = cu.copy(reinterpret_cast<Cuda::Ptr>(back.data()), dst + 128, n);
    check(ok && back == pattern, "--gpu: every byte arrived in device memory");
  }
  if (smh != nullptr) gNet->deregMr(c.send, smh);
  if (rmh != nullptr) gNet->deregMr(c.recv, rmh);
  check(closeConn(&c), "--gpu: closeSend/closeRecv");
  cu.cuMemFree(src);
  cu.cuMemFree(dst);
}

// v8 sizes are int: negative and > 1 GiB transfers are refused before anything is sent.
void v8LimitsCheck(Conn& c) {
  Buffer buf(4096);
  void* req = nullptr;
  ncclResult_t r = gNet->isendInt(c.send, buf.p, -1, 0, nullptr, &req);
  check(r != abi::ncclSuccess && req == nullptr, "v8 isend of a negative size refused",
        str("result %d", r));
  r = gNet->isendInt(c.send, buf.p, static_cast<int>(kOneGiB) + 1, 0, nullptr, &req);
  check(r != abi::ncclSuccess && req == nullptr, "v8 isend of 1 GiB + 1 refused",
        str("result %d", r));
}

void reverseCheck(Conn& c) {
  // Rank 0 sends to rank 1 over the second connection of the pair.
  const size_t n = (1 << 20) + 5;
  Buffer buf(n);
  void* comm = gRank == 0 ? c.send : c.recv;
  void* mh = nullptr;
  ncclResult_t r = gNet->regMr(comm, buf.p, n, abi::NCCL_PTR_HOST, &mh);
  void* req = nullptr;
  int got = -1;
  if (gRank == 0) {
    fill(buf.p, n, 99);
    if (r == abi::ncclSuccess) r = postSend(c.send, buf.p, n, 11, mh, &req);
    if (r == abi::ncclSuccess) r = waitRequest(req, nullptr);
    check(r == abi::ncclSuccess, "reverse direction: send", str("result %d", r));
  } else {
    void* data = buf.p;
    size_t size = n;
    int tag = 11;
    if (r == abi::ncclSuccess) r = postRecv(c.recv, 1, &data, &size, &tag, &mh, &req);
    if (r == abi::ncclSuccess) r = waitRequest(req, &got);
    check(r == abi::ncclSuccess && got == static_cast<int>(n) && verify(buf.p, n, 99) == n,
          "reverse direction: receive intact", str("result %d, size %d", r, got));
  }
  gNet->deregMr(comm, mh);
}

int runRank(const std::string& path, int version, bool big) {
  alarm(kWatchdogSeconds);
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  check(lib != nullptr, str("dlopen %s", path.c_str()), lib ? "" : dlerror());
  if (lib == nullptr) return 1;
  for (int v = 8; v <= 12; ++v)
    check(dlsym(lib, str("ncclNetPlugin_v%d", v).c_str()) != nullptr,
          str("exports ncclNetPlugin_v%d", v));
  std::unique_ptr<Net> net = makeNet(lib, version);
  check(net != nullptr, str("ncclNetPlugin_v%d resolved", version));
  if (!net) return 1;
  gNet = net.get();
  std::string why;
  check(net->hasVersionEntries(&why), str("v%d table has every mandatory entry", version), why);
  Run run;
  run.big = big;
  run.ours = net->name() != nullptr && std::strcmp(net->name(), "Loom") == 0;
  check(net->name() != nullptr && net->name()[0] != '\0', "plugin has a name",
        net->name() ? net->name() : "(null)");

  // One context per communicator: NCCL calls init for each.
  void* ctx2 = nullptr;
  ncclResult_t r = net->init(&run.ctx, 0x1000 + gRank);
  check(r == abi::ncclSuccess, "init", str("returned %d", r));
  if (r != abi::ncclSuccess) return 1;
  r = net->init(&ctx2, 0x2000 + gRank);
  check(r == abi::ncclSuccess, "init again (a second communicator)", str("returned %d", r));
  if (version >= 11)
    check(run.ctx != nullptr && ctx2 != nullptr && run.ctx != ctx2, "a context per communicator");
  check(logHas(""), "the plugin logs through the logger given to init (INFO lines received)");
  int ndev = 0;
  r = net->devices(&ndev);
  check(r == abi::ncclSuccess && ndev >= 1, "devices >= 1", str("result %d, %d devices", r, ndev));
  if (ndev < 1) return 1;
  propertiesCheck(run, ndev);

  loopbackCheck(run);
  if (gGpu && gRank == 0) gpuDirectCheck(run);
  barrier("after loopback");

  Conn c;
  bool ok = establish(run.ctx, run.dev, false, &c, &why);
  check(ok, "connection each way: connect/accept alternated in one thread", why);
  if (!ok) return 1;
  barrier("connected");
  sizesCheck(run, c);
  barrier("sizes");
  inflightCheck(run, c);
  barrier("in flight");
  groupedCheck(run, c);
  barrier("grouped");
  if (version == 8 && gRank == 1 && run.ours) v8LimitsCheck(c);
  if (run.ours && gRank == 1 && version >= 9 && run.props.maxP2pBytes < SIZE_MAX) {
    Buffer small(4096);
    void* req = nullptr;
    r = net->isend(c.send, small.p, run.props.maxP2pBytes + 1, 0, nullptr, &req);
    check(r != abi::ncclSuccess && req == nullptr, "isend above maxP2pBytes refused",
          str("result %d", r));
  }
  reverseCheck(c);
  barrier("reverse");
  check(closeConn(&c), "closeSend and closeRecv");
  barrier("closed");

  truncationCheck(run);
  barrier("truncation");
  closeInFlightCheck(run);

  r = net->finalize(ctx2);
  ncclResult_t r2 = net->finalize(run.ctx);
  check(r == abi::ncclSuccess && r2 == abi::ncclSuccess, "finalize of each context");
  {
    std::lock_guard<std::mutex> lk(gLogMu);
    std::printf("[rank %d] %d checks, %d failed; plugin logged %zu INFO and %d WARN lines\n", gRank,
                gChecks, gFailures, gLogInfo.size(), gLogWarns);
  }
  std::fflush(stdout);
  return gFailures == 0 ? 0 : 1;
}

void onAlarm(int) {
  const char msg[] = "FAIL watchdog: the harness did not finish in time (a hang)\n";
  ssize_t w = ::write(STDOUT_FILENO, msg, sizeof(msg) - 1);
  (void)w;
  _exit(3);
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--plugin PATH] [--version 8..12] [--big] [--gpu] [--verbose]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = LOOM_NET_PLUGIN_PATH;
  int version = 12;
  bool big = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--plugin" && i + 1 < argc) {
      path = argv[++i];
    } else if (a == "--version" && i + 1 < argc) {
      version = std::atoi(argv[++i]);
    } else if (a == "--big") {
      big = true;
    } else if (a == "--gpu") {
      gGpu = true;
    } else if (a == "--verbose") {
      gVerbose = true;
    } else {
      return usage(argv[0]);
    }
  }
  if (version < 8 || version > 12) return usage(argv[0]);
  // The plugin formats INFO lines (which transport, which path) only when NCCL would print them,
  // and the checks look for them.
  const char* level = std::getenv("NCCL_DEBUG");
  if (level == nullptr || (strcasecmp(level, "INFO") != 0 && strcasecmp(level, "TRACE") != 0))
    ::setenv("NCCL_DEBUG", "INFO", 1);
  std::printf("harness: plugin %s, ABI v%d%s, LOOM_NET=%s\n", path.c_str(), version,
              big ? ", with the 1 GiB transfer" : "",
              std::getenv("LOOM_NET") ? std::getenv("LOOM_NET") : "(auto)");
  std::fflush(stdout);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    std::perror("socketpair");
    return 1;
  }
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = ::fork();
    if (pids[rank] < 0) {
      std::perror("fork");
      return 1;
    }
    if (pids[rank] == 0) {
      gRank = rank;
      gOob = sv[rank];
      ::close(sv[1 - rank]);
      ::signal(SIGALRM, onAlarm);
      int rc = runRank(path, version, big);
      std::fflush(stdout);
      _exit(rc);
    }
  }
  ::close(sv[0]);
  ::close(sv[1]);
  int failed = 0;
  for (int rank = 0; rank < 2; ++rank) {
    int st = 0;
    ::waitpid(pids[rank], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ++failed;
      if (WIFSIGNALED(st))
        std::printf("FAIL rank %d killed by signal %d\n", rank, WTERMSIG(st));
      else
        std::printf("FAIL rank %d exited with %d\n", rank, WEXITSTATUS(st));
    }
  }
  std::printf("%s: plugin ABI v%d over %s\n", failed ? "FAILED" : "PASSED", version,
              std::getenv("LOOM_NET") ? std::getenv("LOOM_NET") : "(auto)");
  return failed ? 1 : 0;
}
