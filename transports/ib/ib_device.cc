#include "transports/ib/ib_device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/device/device_memory.h"
#include "transports/ib/ib_errors.h"

namespace loom {
namespace ib {
namespace {

constexpr size_t kPage = 4096;
// The event thread also wakes through an eventfd when it must stop; the timeout is a backstop.
constexpr int kEventPollMs = 100;
// How often the event thread looks for idle GPU registrations whose allocation was freed.
constexpr auto kIdleGpuSweep = std::chrono::seconds(1);

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

bool gidIsZero(const ibv_gid& g) {
  for (unsigned char b : g.raw)
    if (b != 0) return false;
  return true;
}

bool gidIsIpv4Mapped(const ibv_gid& g) {
  static const unsigned char kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, sizeof(kPrefix)) == 0;
}

std::string gidText(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.raw, buf, sizeof(buf));
  return buf;
}

// RoCE version of a GID: 2, 1, or 0 when unknown.
int gidVersion(const Port& p, int index) {
  const VerbsApi& api = p.dev->api();
  if (api.queryGidEx != nullptr) {
    ibv_gid_entry e{};
    if (api.queryGidEx(p.dev->ctx(), p.port, index, &e, 0) == 0)
      return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
  }
  std::string t = readLine("/sys/class/infiniband/" + p.dev->name() + "/ports/" +
                           std::to_string(p.port) + "/gid_attrs/types/" + std::to_string(index));
  if (t.find("v2") != std::string::npos) return 2;
  if (!t.empty()) return 1;
  return 0;
}

}  // namespace

void Health::fail(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  failed_.store(true, std::memory_order_release);
}

std::string Health::reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}

std::string Port::name() const { return dev->name() + ":" + std::to_string(port); }

void Port::markDown(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  downReason_ = reason;
  downs_.fetch_add(1, std::memory_order_release);
}

std::string Port::downReason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return downReason_;
}

namespace {

// A verbs code (one bit) and what it stands for.
struct CodeValue {
  int code;
  int value;
};
// ibv_port_attr::active_speed -> Mb/s per lane: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR.
constexpr CodeValue kLaneMbps[] = {{1, 2500},   {2, 5000},   {4, 10000},  {8, 10000},
                                   {16, 14000}, {32, 25000}, {64, 50000}, {128, 100000}};
// ibv_port_attr::active_width -> lanes.
constexpr CodeValue kLanes[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};

// The value of `code` in `table`; 0 for a code it does not know.
template <size_t N>
int valueOf(const CodeValue (&table)[N], int code) {
  for (const CodeValue& c : table)
    if (c.code == code) return c.value;
  return 0;
}

}  // namespace

int portSpeedMbps(const ibv_port_attr& attr) {
  return valueOf(kLaneMbps, attr.active_speed) * valueOf(kLanes, attr.active_width);
}

Status chooseGid(Port* p) {
  const VerbsApi& api = p->dev->api();
  const int64_t forced = params::kIbGidIndex.asInt();
  auto query = [&](int index, ibv_gid* gid) -> Status {
    if (api.queryGid(p->dev->ctx(), p->port, index, gid) != 0)
      return LOOM_ERROR(kSystem, "ibv_query_gid({}, index {}) failed: {}", p->name(), index,
                        std::strerror(errno));
    return Status();
  };
  if (forced >= 0 || !p->roce) {
    p->gidIndex = forced >= 0 ? static_cast<int>(forced) : 0;
    LOOM_TRY(query(p->gidIndex, &p->gid));
    p->gidInfo = fmt::format("GID index {} {}{}", p->gidIndex, gidText(p->gid),
                             forced >= 0 ? " (LOOM_IB_GID_INDEX)" : "");
    return Status();
  }
  const int want = params::kIbRoceVersion.asInt() == 1 ? 1 : 2;
  int best = -1, bestScore = -1, bestVersion = 0;
  ibv_gid bestGid{};
  for (int i = 0; i < p->attr.gid_tbl_len; ++i) {
    ibv_gid g{};
    if (api.queryGid(p->dev->ctx(), p->port, i, &g) != 0 || gidIsZero(g)) continue;
    int version = gidVersion(*p, i);
    // Preferred version with an IPv4 address, then the preferred version, then IPv4, then any.
    int score = (version == want ? 2 : 0) + (gidIsIpv4Mapped(g) ? 1 : 0);
    if (score > bestScore) {
      best = i;
      bestScore = score;
      bestGid = g;
      bestVersion = version;
    }
  }
  if (best < 0)
    return LOOM_ERROR(kSystem,
                      "{}: RoCE port without a usable GID (no IP address on its network "
                      "interface?)",
                      p->name());
  p->gidIndex = best;
  p->gid = bestGid;
  p->gidInfo = fmt::format("GID index {} {} (RoCE v{}, chosen automatically)", best,
                           gidText(bestGid), bestVersion);
  return Status();
}

Device::~Device() {
  stop_.store(true, std::memory_order_release);
  if (wake_ >= 0) {
    uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }
  if (events_.joinable()) events_.join();
  if (wake_ >= 0) ::close(wake_);
  for (auto& m : mrs_)
    if (m->mr != nullptr) api_->deregMr(m->mr);
  if (pd_ != nullptr) api_->deallocPd(pd_);
  if (ctx_ != nullptr) api_->closeDevice(ctx_);
}

Result<CachedMr*> Device::regHost(const void* data, size_t size) {
  uintptr_t p = reinterpret_cast<uintptr_t>(data);
  uintptr_t b = p & ~(kPage - 1);
  uintptr_t e = (p + (size ? size : 1) + kPage - 1) & ~(kPage - 1);
  std::lock_guard<std::mutex> lk(mrMu_);
  for (auto& m : mrs_) {
    if (!m->gpu && m->begin <= b && e <= m->end) {
      ++m->refs;
      return m.get();
    }
  }
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = api_->regMr(pd_, reinterpret_cast<void*>(b), e - b, access);
  if (mr == nullptr)
    return LOOM_ERROR(kSystem,
                      "{}: ibv_reg_mr of {} bytes at {:#x} failed: {} (locked-memory limit? see "
                      "ulimit -l)",
                      name_, e - b, b, std::strerror(errno));
  auto m = std::make_unique<CachedMr>();
  m->begin = b;
  m->end = e;
  m->mr = mr;
  m->refs = 1;
  mrs_.push_back(std::move(m));
  return mrs_.back().get();
}

Result<CachedMr*> Device::regGpu(const void* data, size_t size, int dmabufFd,
                                 uint64_t dmabufOffset) {
  if (!gdr_.usable())
    return LOOM_ERROR(kInvalidUsage, "{}: cannot register GPU memory: {}", name_, gdr_.summary);
  uintptr_t p = reinterpret_cast<uintptr_t>(data);
  const uint64_t id = device::bufferId(data);
  const int level = gdrLevelParam();
  // GPUDirect only where the GPU sits close enough to the NIC (LOOM_NET_GDR_LEVEL).
  auto tooFar = [&](const std::string& gpuPath, int dist) {
    return LOOM_ERROR(kInvalidUsage,
                      "{}: GPUDirect RDMA not used for GPU {}: PCI distance {} is beyond "
                      "LOOM_NET_GDR_LEVEL ({}); stage through host memory",
                      name_, gpuPath.empty() ? "(unknown)" : gpuPath, dist, level);
  };
  std::lock_guard<std::mutex> lk(mrMu_);
  for (auto& m : mrs_) {
    // The same allocation only: a range freed and allocated again while in use (the caller's
    // error) is not shared with the new allocation.
    if (m->gpu && m->begin <= p && p + size <= m->end && m->bufferId == id) {
      if (m->pciDistance > level) return tooFar(gpuPciPath(data), m->pciDistance);
      ++m->refs;
      return m.get();
    }
  }
  // A new registration: what follows is for the first use of an allocation only.
  std::string gpuPath = gpuPciPath(data);
  const int dist = pciDistance(gpuPath, pciPath_);
  if (dist > level) return tooFar(gpuPath, dist);
  dropFreedIdleGpu();  // first the idle ones of allocations now gone
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = nullptr;
  uintptr_t begin = p;
  size_t length = size;
  if (gdr_.dmabuf && dmabufFd >= 0) {
    // The caller's dma-buf, as given: the registration takes its own reference to it.
    mr = api_->regDmabufMr(pd_, dmabufOffset, size, p, dmabufFd, access);
    if (mr == nullptr)
      return LOOM_ERROR(kSystem,
                        "{}: ibv_reg_dmabuf_mr of {} GPU bytes at {} (dma-buf fd {}, "
                        "offset {}) failed: {}",
                        name_, size, data, dmabufFd, dmabufOffset, std::strerror(errno));
  } else if (gdr_.dmabuf) {
    int fd = -1;
    uint64_t offset = 0;
    LOOM_TRY(device::exportDmabuf(data, size, &fd, &offset, &begin, &length));
    mr = api_->regDmabufMr(pd_, 0, length, begin, fd, access);
    int err = errno;
    ::close(fd);  // the registration holds its own reference to the dma-buf
    if (mr == nullptr)
      return LOOM_ERROR(kSystem, "{}: ibv_reg_dmabuf_mr of {} GPU bytes failed: {}", name_, length,
                        std::strerror(err));
  } else {
    // The whole allocation too, as with dma-buf: one registration serves every buffer in it.
    LOOM_TRY(device::allocationOf(data, size, &begin, &length));
    mr = api_->regMr(pd_, reinterpret_cast<void*>(begin), length, access);
    if (mr == nullptr)
      return LOOM_ERROR(kSystem, "{}: ibv_reg_mr of {} GPU bytes failed through nvidia-peermem: {}",
                        name_, length, std::strerror(errno));
  }
  auto m = std::make_unique<CachedMr>();
  m->begin = begin;
  m->end = begin + length;
  m->mr = mr;
  m->refs = 1;
  m->gpu = true;
  m->bufferId = id;
  m->pciDistance = dist;
  mrs_.push_back(std::move(m));
  return mrs_.back().get();
}

void Device::dropMr(size_t i) {
  if (api_->deregMr(mrs_[i]->mr) != 0)
    LOOM_WARN("{}: ibv_dereg_mr failed: {}", name_, std::strerror(errno));
  mrs_[i] = std::move(mrs_.back());
  mrs_.pop_back();
}

template <class Gone>
void Device::dropIdleGpuWhere(Gone gone) {
  for (size_t i = 0; i < mrs_.size();) {
    const CachedMr& m = *mrs_[i];
    if (m.gpu && m.refs == 0 && gone(m))
      dropMr(i);  // the last entry takes its place: look at i again
    else
      ++i;
  }
}

void Device::dropFreedIdleGpu() {
  dropIdleGpuWhere([](const CachedMr& m) {
    return device::bufferId(reinterpret_cast<const void*>(m.begin)) != m.bufferId;
  });
}

void Device::capIdleGpu() {
  for (;;) {
    size_t idle = 0, oldest = mrs_.size();
    for (size_t i = 0; i < mrs_.size(); ++i) {
      if (!mrs_[i]->gpu || mrs_[i]->refs != 0) continue;
      ++idle;
      if (oldest == mrs_.size() || mrs_[i]->lastUse < mrs_[oldest]->lastUse) oldest = i;
    }
    if (idle <= kIdleGpuMrs) return;
    dropMr(oldest);
  }
}

void Device::deregister(CachedMr* mr) {
  if (mr == nullptr) return;
  std::lock_guard<std::mutex> lk(mrMu_);
  if (--mr->refs > 0) return;
  if (mr->gpu && mr->bufferId != 0) {  // kept, idle (regGpu)
    mr->lastUse = ++idleClock_;
    capIdleGpu();  // no driver call here: this runs as each request completes
    return;
  }
  for (size_t i = 0; i < mrs_.size(); ++i)
    if (mrs_[i].get() == mr) return dropMr(i);
}

size_t Device::cachedRanges() const {
  std::lock_guard<std::mutex> lk(mrMu_);
  return mrs_.size();
}

void Device::watchQp(uint32_t qpn, std::shared_ptr<Health> health) {
  std::lock_guard<std::mutex> lk(qpMu_);
  qps_[qpn] = std::move(health);
}

void Device::unwatchQp(uint32_t qpn) {
  std::lock_guard<std::mutex> lk(qpMu_);
  qps_.erase(qpn);
}

void Device::startEvents() {
  if (ctx_->async_fd < 0) {
    LOOM_INFO(kSubNet, "{}: no asynchronous event fd; port failures show as completion errors",
              name_);
    return;
  }
  // Non-blocking: an event another reader took must not block this thread in get_async_event.
  int flags = ::fcntl(ctx_->async_fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK);
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  events_ = std::thread([this] { eventLoop(); });
}

void Device::sweepFreedIdleGpu() {
  struct Idle {
    const CachedMr* mr;
    uintptr_t begin;
    uint64_t bufferId;
  };
  std::vector<Idle> idle;
  {
    std::lock_guard<std::mutex> lk(mrMu_);
    for (const auto& m : mrs_)
      if (m->gpu && m->refs == 0 && m->bufferId != 0)
        idle.push_back({m.get(), m->begin, m->bufferId});
  }
  // The driver is asked with mrMu_ released: a driver call can wait for a lock that a thread
  // blocked on a stream holds, and the data path must not wait for this thread then.
  std::vector<Idle> gone;
  for (const Idle& i : idle)
    if (device::bufferId(reinterpret_cast<const void*>(i.begin)) != i.bufferId) gone.push_back(i);
  if (gone.empty()) return;
  std::lock_guard<std::mutex> lk(mrMu_);
  // Still the registration seen then (not one made since at the same place) and still idle.
  dropIdleGpuWhere([&](const CachedMr& m) {
    return std::any_of(gone.begin(), gone.end(), [&](const Idle& i) {
      return i.mr == &m && i.begin == m.begin && i.bufferId == m.bufferId;
    });
  });
}

void Device::eventLoop() {
  auto nextSweep = std::chrono::steady_clock::now() + kIdleGpuSweep;
  while (!stop_.load(std::memory_order_acquire)) {
    pollfd fds[2] = {{ctx_->async_fd, POLLIN, 0}, {wake_, POLLIN, 0}};
    int rc = ::poll(fds, wake_ >= 0 ? 2 : 1, kEventPollMs);
    if (std::chrono::steady_clock::now() >= nextSweep) {
      sweepFreedIdleGpu();
      nextSweep = std::chrono::steady_clock::now() + kIdleGpuSweep;
    }
    const pollfd& pfd = fds[0];
    if (rc < 0 && errno != EINTR) {
      LOOM_WARN("{}: polling asynchronous events failed: {}", name_, std::strerror(errno));
      return;
    }
    if (rc <= 0 || !(pfd.revents & POLLIN)) continue;
    ibv_async_event ev{};
    if (api_->getAsyncEvent(ctx_, &ev) != 0) continue;
    handleEvent(ev);
    api_->ackAsyncEvent(&ev);
  }
}

void Device::handleEvent(const ibv_async_event& ev) {
  const char* hint = asyncEventHint(ev.event_type);
  std::string what =
      fmt::format("{}{}{}", api_->eventTypeStr(ev.event_type), *hint ? ": " : "", hint);
  switch (ev.event_type) {
    case IBV_EVENT_PORT_ERR:
      for (auto& p : ports) {
        if (p->port == ev.element.port_num) {
          std::string r = fmt::format("port {} went down ({})", p->name(), what);
          LOOM_WARN("InfiniBand: {}", r);
          p->markDown(r);
        }
      }
      break;
    case IBV_EVENT_DEVICE_FATAL: {
      std::string r = fmt::format("device {} failed ({})", name_, what);
      LOOM_WARN("InfiniBand: {}", r);
      health_.fail(r);
      break;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      uint32_t qpn = ev.element.qp != nullptr ? ev.element.qp->qp_num : 0;
      std::shared_ptr<Health> h;
      {
        std::lock_guard<std::mutex> lk(qpMu_);
        auto it = qps_.find(qpn);
        if (it != qps_.end()) h = it->second;
      }
      std::string r = fmt::format("queue pair {:#x} on {}: {}", qpn, name_, what);
      LOOM_WARN("InfiniBand: {}", r);
      if (h) h->fail(r);
      break;
    }
    case IBV_EVENT_PORT_ACTIVE:
      LOOM_INFO(kSubNet, "InfiniBand: port {} of {} is active again (new connections may use it)",
                ev.element.port_num, name_);
      break;
    case IBV_EVENT_CQ_ERR:
      LOOM_WARN("InfiniBand: {}: {}", name_, what);
      break;
    default:
      LOOM_INFO(kSubNet, "InfiniBand: {}: event {}", name_, what);
  }
}

Result<std::vector<std::unique_ptr<Device>>> openDevices(const VerbsApi* api, const HcaSpec& spec,
                                                         std::string* whyNot) {
  std::vector<std::unique_ptr<Device>> out;
  int n = 0;
  errno = 0;
  ibv_device** list = api->getDeviceList(&n);
  if (list == nullptr || n == 0) {
    int err = errno;
    if (list != nullptr) api->freeDeviceList(list);
    *whyNot = fmt::format("no RDMA device ({} lists none{}{})", api->path, err != 0 ? ": " : "",
                          err != 0 ? std::strerror(err) : "");
    return out;
  }
  std::vector<std::string> seen, inactive, excluded, failed;
  for (int i = 0; i < n; ++i) {
    const char* name = api->getDeviceName(list[i]);
    std::string devName = name != nullptr ? name : "?";
    seen.push_back(devName);
    ibv_context* ctx = api->openDevice(list[i]);
    if (ctx == nullptr) {
      failed.push_back(fmt::format("{} (cannot open: {})", devName, std::strerror(errno)));
      continue;
    }
    std::unique_ptr<Device> d(new Device());
    d->api_ = api;
    d->name_ = devName;
    d->ctx_ = ctx;
    d->guid_ = be64toh(api->getDeviceGuid(list[i]));
    if (api->queryDevice(ctx, &d->attr_) != 0) {
      failed.push_back(fmt::format("{} (ibv_query_device: {})", devName, std::strerror(errno)));
      continue;
    }
    char real[PATH_MAX];
    std::string sys = "/sys/class/infiniband/" + devName + "/device";
    if (::realpath(sys.c_str(), real) != nullptr) d->pciPath_ = real;
    for (int port = 1; port <= d->attr_.phys_port_cnt; ++port) {
      auto p = std::make_unique<Port>();
      p->dev = d.get();
      p->port = port;
      if (api->queryPort(ctx, port, &p->attr) != 0) {
        failed.push_back(
            fmt::format("{}:{} (ibv_query_port: {})", devName, port, std::strerror(errno)));
        continue;
      }
      if (!spec.matches(devName, port)) {
        excluded.push_back(p->name());
        continue;
      }
      if (p->attr.state != IBV_PORT_ACTIVE) {
        inactive.push_back(p->name());
        continue;
      }
      if (p->attr.link_layer != IBV_LINK_LAYER_INFINIBAND &&
          p->attr.link_layer != IBV_LINK_LAYER_ETHERNET &&
          p->attr.link_layer != IBV_LINK_LAYER_UNSPECIFIED) {
        failed.push_back(fmt::format("{} (link layer {})", p->name(), p->attr.link_layer));
        continue;
      }
      p->roce = p->attr.link_layer == IBV_LINK_LAYER_ETHERNET;
      Status st = chooseGid(p.get());
      if (!st.isOk()) {
        failed.push_back(st.message());
        continue;
      }
      p->speedMbps = portSpeedMbps(p->attr);
      d->ports.push_back(std::move(p));
    }
    if (d->ports.empty()) continue;
    d->pd_ = api->allocPd(ctx);
    if (d->pd_ == nullptr) {
      failed.push_back(fmt::format("{} (ibv_alloc_pd: {})", devName, std::strerror(errno)));
      continue;
    }
    d->gdr_ = detectGdr(*api, d->pd_);
    LOOM_INFO(kSubNet, "InfiniBand: {} guid {:#x} {}: {}", devName, d->guid_,
              d->pciPath_.empty() ? "(no PCI path)" : d->pciPath_, d->gdr_.summary);
    for (auto& p : d->ports)
      LOOM_INFO(kSubNet, "InfiniBand: port {} {} {} Mb/s lid {} {}", p->name(),
                p->roce ? "RoCE" : "IB", p->speedMbps, p->attr.lid, p->gidInfo);
    d->startEvents();
    out.push_back(std::move(d));
  }
  api->freeDeviceList(list);
  if (out.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
      return s;
    };
    std::string why = fmt::format("no usable RDMA port (devices: {}", join(seen));
    if (!inactive.empty()) why += "; not ACTIVE: " + join(inactive);
    if (!excluded.empty())
      why +=
          fmt::format("; excluded by LOOM_IB_HCA='{}': {}", params::kIbHca.str(), join(excluded));
    if (!failed.empty()) why += "; failed: " + join(failed);
    *whyNot = why + ")";
  }
  return out;
}

}  // namespace ib
}  // namespace loom
