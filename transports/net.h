// The internal network-transport interface. Shaped like the NCCL net-plugin ABI
// (listen / connect / accept / regMr / isend / irecv / test / close) so that a Loom transport can
// be exported to NCCL as a plugin and an external NCCL plugin can be imported as a Loom transport.
//
// Contracts (the same as NCCL's):
// - listen, connect and accept never block. connect returns OK with *sendConn == nullptr until the
//   connection is established, accept likewise with *recvConn == nullptr; callers call again.
// - isend/irecv return OK with *request == nullptr when the request cannot be posted now (too many
//   outstanding); that is not an error: post again later.
// - Sends and receives on one send/receive connection pair match in posting order. A frame
//   carries its tag: a grouped receive (n > 1) places it in the buffer with the same tag; a frame
//   whose tag matches no posted buffer is an error, and so is a frame larger than the buffer it
//   lands in ("message truncated"), never an overflow. A frame smaller than the posted buffer is
//   fine: test reports the size received.
// - test never blocks; once it reports done (or an error) the request is freed.
// - Close functions accept connections with requests in flight (they are dropped).
// Names: a "connection" (sendConn, recvConn, listener) is what NCCL's ABI calls a comm; in Loom a
// "communicator" is only ever loomComm_t (src/runtime/comm.h).
//
// Threads (stated once, for every implementation): a transport instance may be called from several
// threads at once provided that each connection (listener, send or receive connection) and each
// request is used by one thread at a time; name, devices and getProperties may be called from any
// thread. The network transports are one instance per process, shared by every communicator, and
// communicators may be driven from different threads (include/loom/loom.h). The shared-memory
// transport is the exception: an instance belongs to one rank of one communicator and all its
// connections share state, so the instance as a whole is driven by one thread at a time (the
// communicator's rule).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/loom.h"
#include "src/core/status.h"

namespace loom {
namespace net {

constexpr size_t kHandleSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
struct Handle {
  unsigned char bytes[kHandleSize];
};

enum PtrType : int { kPtrHost = 1, kPtrCuda = 2, kPtrDmabuf = 4 };

// What a transport says about reaching one rank of a communicator (NCCL's canConnect): whether it
// can carry that rank's traffic on a channel, and at what price. The runtime builds its table of
// transports per (rank, channel) from these once, at init, and takes the cheapest.
struct Reach {
  bool reachable = false;
  double latencyUs = 0;
};

struct Properties {
  std::string name;     // device name, e.g. "eth0" or "mlx5_0"
  std::string pciPath;  // sysfs path of the PCI device, empty when virtual
  uint64_t guid = 0;
  int ptrSupport = kPtrHost;
  int speedMbps = 0;
  int port = 0;
  float latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = 1;
  size_t maxP2pBytes = size_t(1) << 31;
};

// How long a wait naps where nothing can wake it when its requests may progress: an eighth of the
// time its caller has already waited without progress (idleNs), at least 10 us, at most limitNs.
// Such a wait adds at most an eighth to the latency it would have had polling, and a rank waiting
// long for a slow peer wakes a few thousand times a second instead of keeping its core busy.
inline int64_t idleNapNs(int64_t idleNs, int64_t limitNs) {
  constexpr int64_t kMinNs = 10000;
  return std::max<int64_t>(1, std::min(limitNs, std::max(kMinNs, idleNs / 8)));
}

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Number of devices (network interfaces); at least 1 once init succeeded.
  virtual int devices() const = 0;
  virtual Status getProperties(int dev, Properties* props) const = 0;

  virtual Status listen(int dev, Handle* handle, void** listener) = 0;
  virtual Status connect(int dev, const Handle& handle, void** sendConn) = 0;
  virtual Status accept(void* listener, void** recvConn) = 0;

  virtual Status regMr(void* conn, void* data, size_t size, int type, void** mhandle) = 0;
  // GPU memory [data, data + size) that the caller exported as the dma-buf `fd`, data lying at
  // `offset` in it (NCCL's regMrDmaBuf). The fd stays the caller's: a transport that needs it past
  // the call takes its own reference. The default ignores the fd (regMr).
  virtual Status regMrDmaBuf(void* conn, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mhandle) {
    return regMr(conn, data, size, type, mhandle);
  }
  virtual Status deregMr(void* conn, void* mhandle) = 0;

  virtual Status isend(void* sendConn, const void* data, size_t size, int tag, void* mhandle,
                       void** request) = 0;
  virtual Status irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
                       void** mhandles, void** request) = 0;
  // Makes received data visible to a GPU; *request == nullptr when there is nothing to wait for.
  virtual Status iflush(void* recvConn, int n, void** data, const size_t* sizes, void** mhandles,
                        void** request) {
    *request = nullptr;
    return Status();
  }
  // Loom extension, not in NCCL's ABI: a receive that combines instead of storing. When the
  // message has arrived, dst[i] = src[i] (op) received[i] for every element (dst may equal src;
  // loomAvg combines as a sum). A transport that can read the incoming bytes where they lie (shared
  // memory) saves the copy into a staging buffer. Only when supportsRecvReduce().
  virtual bool supportsRecvReduce() const { return false; }
  virtual Status irecvReduce(void* recvConn, void* dst, const void* src, size_t size, int tag,
                             loomDataType_t dt, loomRedOp_t op, void** request) {
    return Status(Code::kInternal, std::string(name()) + " has no fused receive-reduce");
  }
  // Loom extension: receives posted on recvConn after this call write their destination with
  // non-temporal stores (on) or ordinary ones (off): the runtime's hint for calls whose buffers
  // exceed the caches (streamingStoresFor). Transports whose CPU does not store the bytes ignore
  // it.
  virtual void setStreamingStores(void* recvConn, bool on) {}
  // sizes (may be null): for a receive, one entry per buffer: the bytes received.
  virtual Status test(void* request, int* done, size_t* sizes) = 0;

  virtual Status closeSend(void* sendConn) = 0;
  virtual Status closeRecv(void* recvConn) = 0;
  virtual Status closeListen(void* listener) = 0;

  // Loom extension, not in NCCL's ABI: sleeps up to timeoutMs or until one of the given requests
  // (and, if listener is not null, that listener) may be able to progress. Lets oversubscribed
  // ranks give their core away instead of spinning. The default just yields.
  virtual void waitActivity(void* const* requests, int n, void* listener, int timeoutMs);
  // Loom extension: waitActivity for a caller that has waited idleNs without progress so far. A
  // transport that cannot sleep until some of its requests may progress (nothing wakes it: an
  // InfiniBand send waiting for its clear-to-send, an imported NCCL plugin) naps idleNapNs instead
  // of yielding. The default is waitActivity.
  virtual void waitActivityIdle(void* const* requests, int n, void* listener, int timeoutMs,
                                int64_t idleNs) {
    waitActivity(requests, n, listener, timeoutMs);
  }
  // Loom extension: for a caller that also waits on another transport (so it must look at that
  // one again soon): sleeps up to timeoutUs until this transport may progress, and returns true,
  // where it can be woken that fast (a doorbell); false at once where it cannot (then poll it).
  virtual bool napUs(int64_t timeoutUs) { return false; }

  // Loom extension: the connections of transports that make them when the ranks attach (shared
  // memory: one per pair of ranks of the host, from the segment), by communicator rank; nullptr
  // where connections are made with listen / connect / accept.
  virtual void* presetSendConn(int rank) { return nullptr; }
  virtual void* presetRecvConn(int rank) { return nullptr; }
  // Loom extension: whether this transport reaches `rank` of the communicator on `channel`. A
  // network transport reaches every rank on every channel at its device's latency.
  virtual Reach reach(int rank, int channel) const;
  // Whether this transport wants memory registered (regMr) before it moves it: the runtime then
  // passes registered buffers' handles (loomCommRegister) instead of nullptr.
  virtual bool wantsRegistration() const { return true; }
  // Loom extension: registers [data, data + size) (memory of `type`, NCCL_PTR_*) now, on the
  // calling thread, for the connections of device `dev`, and keeps that registration until
  // releaseMemory(*hold), so that requests on the range meanwhile, with or without a memory
  // handle, find it made and call no driver. For the device runner (src/runtime/device_runner.h):
  // registering GPU memory calls the CUDA driver (a dma-buf export), which must not happen on the
  // thread a user's stream waits for. *hold is nullptr where the transport registers nothing.
  virtual Status holdMemory(int dev, const void* data, size_t size, int type, void** hold) {
    *hold = nullptr;
    return Status();
  }
  virtual void releaseMemory(void* hold) {}
};

}  // namespace net
}  // namespace loom
