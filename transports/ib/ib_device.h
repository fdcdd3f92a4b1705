// The InfiniBand transport's view of the machine: open devices (one context and one protection
// domain each), their selected ACTIVE ports (each a net device of the transport), the RoCE GID of
// each port, the registration cache, GPUDirect support and the asynchronous-event thread that
// turns port and device failures into errors.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "src/core/status.h"
#include "transports/ib/gdr.h"
#include "transports/ib/ib_hca.h"
#include "transports/ib/verbs_api.h"

namespace loom {
namespace ib {

// A failure that several parties observe (a port, a device, one connection's queue pairs): the
// first reason wins. Thread-safe; failed() is one atomic load, for data paths.
class Health {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void fail(const std::string& reason);
  std::string reason() const;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// A registered range, shared by every registration that falls inside it.
struct CachedMr {
  uintptr_t begin = 0, end = 0;  // page-aligned (host) or exact (GPU)
  ibv_mr* mr = nullptr;
  int refs = 0;
  bool gpu = false;
  uint64_t bufferId = 0;  // GPU: the allocation's (device::bufferId); 0: unknown
  int pciDistance = 0;    // GPU: from its GPU to the NIC (pciDistance)
  uint64_t lastUse = 0;   // when it last became idle (GPU, kept registered)
};

class Device;

struct Port {
  Device* dev = nullptr;
  int port = 0;
  ibv_port_attr attr{};
  bool roce = false;
  int gidIndex = 0;
  ibv_gid gid{};
  std::string gidInfo;  // how the GID was chosen, for logs
  int speedMbps = 0;
  std::string name() const;  // "mlx5_0:1"

  // Port failures (IBV_EVENT_PORT_ERR) so far: a comm fails when the count changed since it was
  // created, so comms made after the port came back are not failed by an old event.
  uint32_t downs() const { return downs_.load(std::memory_order_acquire); }
  void markDown(const std::string& reason);
  std::string downReason() const;

 private:
  std::atomic<uint32_t> downs_{0};
  mutable std::mutex mu_;
  std::string downReason_;
};

class Device {
 public:
  ~Device();
  const VerbsApi& api() const { return *api_; }
  const std::string& name() const { return name_; }
  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const ibv_device_attr& attr() const { return attr_; }
  uint64_t guid() const { return guid_; }
  const std::string& pciPath() const { return pciPath_; }
  const Health& health() const { return health_; }
  const GdrSupport& gdr() const { return gdr_; }

  // Registration cache (thread-safe): a host range is registered page-aligned once and shared by
  // reference count; deregistered when the count drops to zero. A freed buffer must not stay
  // registered: the pages of a later allocation at the same address would not be the ones the
  // registration pinned.
  Result<CachedMr*> regHost(const void* data, size_t size);
  // GPU memory through dma-buf or nvidia-peermem (whichever gdr() found); an error says why
  // neither works. Either registers the whole allocation holding the range, so that any part of it
  // finds the registration later (only that first registration calls the driver beyond two
  // pointer queries). A GPU allocation's registration outlives its last user (a training loop sends
  // from the same allocations every step; registering one costs far more than a message): kept
  // idle, keyed by the allocation's buffer id, until that allocation is gone (checked before each
  // new registration, and every second by the event thread: its range now holds another id, or
  // none) or kIdleGpuMrs newer idle ones push it out. An allocation whose id is unknown is
  // deregistered with its last user, as host memory is.
  // With dmabufFd >= 0 (the caller exported the memory: NCCL's regMrDmaBuf), a new registration
  // is of [data, data + size) through that dma-buf at dmabufOffset, and calls no CUDA driver
  // function that takes its mapping lock (the export is the caller's); on a device without
  // dma-buf registration (nvidia-peermem only) the fd is not needed and not used.
  Result<CachedMr*> regGpu(const void* data, size_t size, int dmabufFd = -1,
                           uint64_t dmabufOffset = 0);
  void deregister(CachedMr* mr);
  size_t cachedRanges() const;
  static constexpr size_t kIdleGpuMrs = 16;

  // Connections register their queue pairs so that a queue-pair event fails the right one.
  void watchQp(uint32_t qpn, std::shared_ptr<Health> health);
  void unwatchQp(uint32_t qpn);

 private:
  friend Result<std::vector<std::unique_ptr<Device>>> openDevices(const VerbsApi* api,
                                                                  const HcaSpec& spec,
                                                                  std::string* whyNot);
  Device() = default;
  void startEvents();
  void eventLoop();
  void handleEvent(const ibv_async_event& ev);

  const VerbsApi* api_ = nullptr;
  std::string name_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_device_attr attr_{};
  uint64_t guid_ = 0;
  std::string pciPath_;
  GdrSupport gdr_;
  Health health_;

  // Under mrMu_: deregisters mrs_[i] and removes it (the last entry takes its place).
  void dropMr(size_t i);
  // Under mrMu_: drops the idle GPU registrations whose allocation is gone (one driver query
  // each: only before a new registration, not on every message).
  void dropFreedIdleGpu();
  // Under mrMu_: drops the idle GPU registrations for which gone(const CachedMr&) is true.
  template <class Gone>
  void dropIdleGpuWhere(Gone gone);
  // Under mrMu_: drops the oldest idle GPU registrations beyond kIdleGpuMrs.
  void capIdleGpu();
  // The event thread's sweep, every second: dropFreedIdleGpu's work, with the driver asked
  // outside mrMu_, so that memory a user freed is not held for long when no new registration
  // comes (a dma-buf registration keeps the GPU pages it pinned).
  void sweepFreedIdleGpu();

  mutable std::mutex mrMu_;
  std::vector<std::unique_ptr<CachedMr>> mrs_;
  uint64_t idleClock_ = 0;

  std::mutex qpMu_;
  std::unordered_map<uint32_t, std::shared_ptr<Health>> qps_;

  std::thread events_;
  std::atomic<bool> stop_{false};
  int wake_ = -1;  // eventfd that wakes the event thread to stop

 public:
  std::vector<std::unique_ptr<Port>> ports;  // selected ACTIVE ports
};

// Opens every device with at least one ACTIVE port that spec selects. Empty (with *whyNot saying
// why: no device, no active port, everything excluded) when none.
Result<std::vector<std::unique_ptr<Device>>> openDevices(const VerbsApi* api, const HcaSpec& spec,
                                                         std::string* whyNot);

// Link speed of a port in Mb/s from its active_speed and active_width codes (0 when unknown).
int portSpeedMbps(const ibv_port_attr& attr);

// Chooses the RoCE GID of a port: LOOM_IB_GID_INDEX when set, else a RoCE v2 (or
// LOOM_IB_ROCE_VERSION_NUM) GID holding an IPv4-mapped address, else one of that version, else any
// non-zero GID. IB ports use index 0 unless LOOM_IB_GID_INDEX says otherwise.
Status chooseGid(Port* port);

}  // namespace ib
}  // namespace loom
