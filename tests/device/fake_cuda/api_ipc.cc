// Entry points: memory across processes. Legacy IPC handles (cuIpc*), virtual memory management
// with POSIX fd handles (cuMemCreate, export/import, reserve/map/access), and dma-buf export
// (cuMemGetHandleForAddressRange) for the emulated verbs device.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "tests/device/fake_cuda/memory.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants

namespace {

// ---- legacy IPC ----

constexpr uint32_t kIpcMagic = 0x4c464349;  // "LFCI"

// What another process needs to map an allocation, in the 64-byte CUipcMemHandle.
struct IpcHandle {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  int32_t fd;     // the allocation's memfd in the owner
  uint64_t ino;   // its inode: a reused fd number is told apart
  uint64_t size;  // bytes allocated
  uint64_t span;  // the memfd's size
  int32_t device;
  uint32_t reserved;
};
static_assert(sizeof(IpcHandle) <= kIpcHandleBytes, "fits CUipcMemHandle");

struct IpcKey {
  int pid;
  uint64_t ino;
  Context* ctx;
  bool operator<(const IpcKey& o) const {
    return std::tie(pid, ino, ctx) < std::tie(o.pid, o.ino, o.ctx);
  }
};
struct IpcOpen {
  uintptr_t base = 0;
  int refs = 0;
};

std::mutex gIpcMu;
std::map<IpcKey, IpcOpen>& ipcOpen() {
  static auto* m = new std::map<IpcKey, IpcOpen>();  // never destroyed
  return *m;
}

// ---- VMM ----

struct Physical {
  std::shared_ptr<Backing> backing;
  int handleTypes = 0;
};

std::mutex gVmmMu;  // the two tables below, and mapping decisions
std::map<CUmemGenericAllocationHandle, std::shared_ptr<Physical>>& physicals() {
  static auto* m = new std::map<CUmemGenericAllocationHandle, std::shared_ptr<Physical>>();
  return *m;
}
std::map<uintptr_t, size_t>& reservations() {
  static auto* m = new std::map<uintptr_t, size_t>();  // base -> bytes
  return *m;
}
CUmemGenericAllocationHandle gNextHandle = 0x10001;

CUresult vmmEnabled() { return state().cfg.vmm ? kSuccess : kErrorNotSupported; }

CUresult checkLocation(const CUmemLocation& l) {
  if (l.type != kMemLocationTypeDevice) return kErrorNotSupported;  // host NUMA: not emulated
  return deviceOf(l.id) ? kSuccess : kErrorInvalidDevice;
}

CUresult checkProp(const CUmemAllocationProp* p) {
  if (p == nullptr || p->type != kMemAllocationTypePinned) return kErrorInvalidValue;
  if (p->requestedHandleTypes == kMemHandleTypeFabric) return kErrorNotSupported;
  if ((p->requestedHandleTypes & ~kMemHandleTypePosixFd) != 0) return kErrorInvalidValue;
  return checkLocation(p->location);
}

bool aligned(uint64_t v) { return v % kGranularity == 0; }

// The VMM mappings that exactly cover [ptr, ptr + bytes), in order; empty when there are gaps or
// other kinds of memory.
std::vector<std::shared_ptr<Region>> vmmCover(uintptr_t ptr, size_t bytes) {
  std::vector<std::shared_ptr<Region>> rs = space().overlapping(ptr, bytes);
  uintptr_t at = ptr;
  for (auto& r : rs) {
    if (r->kind != RegionKind::kVmm || r->base != at || r->base + r->size > ptr + bytes) return {};
    at += r->size;
  }
  if (at != ptr + bytes) return {};
  return rs;
}

}  // namespace

namespace fakecuda {

void dropContextIpc(Context* c, uint64_t /*gen*/) {
  long long n = 0;
  std::lock_guard<std::mutex> lk(gIpcMu);
  for (auto it = ipcOpen().begin(); it != ipcOpen().end();) {
    if (it->first.ctx == c) {
      it = ipcOpen().erase(it);  // the regions go with the context's memory (memory.cc)
      ++n;
    } else {
      ++it;
    }
  }
  count(kIpcMappings, -n);
}

}  // namespace fakecuda

extern "C" {

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKECUDA_ENTRY();
  if (handle == nullptr) return kErrorInvalidValue;
  FAKECUDA_TRY(waitForMappingLock("cuIpcGetMemHandle"));
  return inContext([&](Context* c) {
    std::shared_ptr<Region> r = space().inArena(dptr) ? space().find(dptr) : nullptr;
    if (r == nullptr || r->kind != RegionKind::kAlloc) return kErrorInvalidValue;
    // An interior pointer names the whole allocation; the importer gets its base.
    IpcHandle h{};
    h.magic = kIpcMagic;
    h.version = 1;
    h.pid = ::getpid();
    h.fd = r->backing->fd;
    h.ino = r->backing->ino;
    h.size = r->size;
    h.span = r->span;
    h.device = r->device;
    std::memset(handle->reserved, 0, sizeof(handle->reserved));
    std::memcpy(handle->reserved, &h, sizeof(h));
    return kSuccess;
  });
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned flags) {
  FAKECUDA_ENTRY();
  if (dptr == nullptr || (flags & ~kIpcMemLazyEnablePeerAccess) != 0) return kErrorInvalidValue;
  FAKECUDA_TRY(waitForMappingLock("cuIpcOpenMemHandle"));
  return inContext([&](Context* c) {
    IpcHandle h;
    std::memcpy(&h, handle.reserved, sizeof(h));
    if (h.magic != kIpcMagic || h.version != 1 || h.size == 0 || h.span < h.size)
      return kErrorInvalidValue;
    if (h.pid == ::getpid()) return kErrorInvalidContext;  // as the driver: not in the owner
    std::lock_guard<std::mutex> lk(gIpcMu);
    const IpcKey key{h.pid, h.ino, c};
    auto it = ipcOpen().find(key);
    if (it != ipcOpen().end()) {  // opened already in this context: counted
      ++it->second.refs;
      *dptr = it->second.base;
      return kSuccess;
    }
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return kErrorInvalidHandle;  // the owner is gone, or freed the memory
    auto b = std::make_shared<Backing>();
    b->fd = fd;
    struct stat st;
    if (::fstat(fd, &st) != 0 || uint64_t(st.st_ino) != h.ino || uint64_t(st.st_size) < h.span)
      return kErrorInvalidHandle;  // the fd number now names something else
    b->size = h.span;
    b->ino = h.ino;
    b->device = deviceOf(h.device) ? h.device : c->dev->ordinal;
    if (b->device != c->dev->ordinal) {  // another device's memory: mapped over peer access
      if (!state().cfg.p2p) return kErrorPeerAccessUnsupported;
      if (flags & kIpcMemLazyEnablePeerAccess) c->peers.fetch_or(1u << b->device);
    }
    const uintptr_t base = space().reserve(h.span, kGranularity);
    if (base == 0) return kErrorOutOfMemory;
    if (!mapRegion(RegionKind::kIpc, base, h.span, h.size, std::move(b), 0, c))
      return kErrorMapFailed;
    ipcOpen()[key] = IpcOpen{base, 1};
    *dptr = base;
    return kSuccess;
  });
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(waitForMappingLock("cuIpcCloseMemHandle"));
  return inContext([&](Context* c) {
    std::shared_ptr<Region> gone;
    {
      std::lock_guard<std::mutex> lk(gIpcMu);
      auto it = ipcOpen().begin();
      while (it != ipcOpen().end() && !(it->second.base == dptr && it->first.ctx == c)) ++it;
      if (it == ipcOpen().end()) return kErrorInvalidValue;
      if (--it->second.refs > 0) return kSuccess;
      ipcOpen().erase(it);
      gone = space().remove(dptr);
    }
    count(kIpcMappings, -1);
    return kSuccess;  // `gone` unmaps here, or when work in flight on it ends
  });
}

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       int option) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (granularity == nullptr || (option != 0 && option != 1)) return kErrorInvalidValue;
  FAKECUDA_TRY(checkProp(prop));
  *granularity = kGranularity;  // minimum and recommended alike, as on current GPUs
  return kSuccess;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                     const CUmemAllocationProp* prop, unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (handle == nullptr || flags != 0 || bytes == 0 || !aligned(bytes)) return kErrorInvalidValue;
  FAKECUDA_TRY(checkProp(prop));
  return guarded([&] {
    Device* d = deviceOf(prop->location.id);
    if (d->lost.load()) return kErrorDeviceUnavailable;
    auto p = std::make_shared<Physical>();
    FAKECUDA_TRY(makeBacking(d, bytes, bytes, &p->backing));
    p->handleTypes = prop->requestedHandleTypes;
    std::lock_guard<std::mutex> lk(gVmmMu);
    *handle = gNextHandle++;
    physicals()[*handle] = std::move(p);
    count(kVmmHandles);
    return kSuccess;
  });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  return guarded([&] {
    std::shared_ptr<Physical> p;  // the memory lives on while it is mapped
    std::lock_guard<std::mutex> lk(gVmmMu);
    auto it = physicals().find(handle);
    if (it == physicals().end()) return kErrorInvalidValue;
    p = std::move(it->second);
    physicals().erase(it);
    count(kVmmHandles, -1);
    return kSuccess;
  });
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      int handleType, unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (shareable == nullptr || flags != 0) return kErrorInvalidValue;
  if (handleType != kMemHandleTypePosixFd) return kErrorNotSupported;
  return guarded([&] {
    std::lock_guard<std::mutex> lk(gVmmMu);
    auto it = physicals().find(handle);
    if (it == physicals().end() || (it->second->handleTypes & kMemHandleTypePosixFd) == 0)
      return kErrorInvalidValue;  // unknown, or not created exportable as an fd
    const int fd = ::fcntl(it->second->backing->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return kErrorOutOfMemory;
    *static_cast<int*>(shareable) = fd;  // the caller owns it
    return kSuccess;
  });
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* shareable,
                                        int handleType) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (handle == nullptr) return kErrorInvalidValue;
  if (handleType != kMemHandleTypePosixFd) return kErrorNotSupported;
  return guarded([&] {
    const int given = static_cast<int>(reinterpret_cast<intptr_t>(shareable));
    const int fd = ::fcntl(given, F_DUPFD_CLOEXEC, 0);  // the caller keeps (and closes) its own
    if (fd < 0) return kErrorInvalidValue;
    auto p = std::make_shared<Physical>();
    const CUresult rc = adoptBacking(fd, &p->backing);
    if (rc != kSuccess) {
      ::close(fd);
      return rc;
    }
    p->handleTypes = kMemHandleTypePosixFd;
    std::lock_guard<std::mutex> lk(gVmmMu);
    *handle = gNextHandle++;
    physicals()[*handle] = std::move(p);
    count(kVmmHandles);
    return kSuccess;
  });
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t bytes, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (ptr == nullptr || flags != 0 || bytes == 0 || !aligned(bytes) ||
      (alignment & (alignment - 1)) != 0)
    return kErrorInvalidValue;
  return guarded([&] {
    const uintptr_t va = space().reserve(bytes, alignment, addr);  // addr: a hint
    if (va == 0) return kErrorOutOfMemory;
    std::lock_guard<std::mutex> lk(gVmmMu);
    reservations()[va] = bytes;
    count(kVmmReservations);
    *ptr = va;
    return kSuccess;
  });
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t bytes) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  return guarded([&] {
    std::lock_guard<std::mutex> lk(gVmmMu);
    auto it = reservations().find(ptr);
    if (it == reservations().end() || it->second != bytes) return kErrorInvalidValue;
    if (!space().overlapping(ptr, bytes).empty()) return kErrorInvalidValue;  // still mapped
    reservations().erase(it);
    space().unreserve(ptr, bytes);
    count(kVmmReservations, -1);
    return kSuccess;
  });
}

CUresult cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (flags != 0 || bytes == 0 || !aligned(ptr) || !aligned(bytes) || !aligned(offset))
    return kErrorInvalidValue;
  return guarded([&] {
    std::lock_guard<std::mutex> lk(gVmmMu);
    auto p = physicals().find(handle);
    if (p == physicals().end()) return kErrorInvalidValue;
    const std::shared_ptr<Backing>& b = p->second->backing;
    if (offset > b->size || bytes > b->size - offset) return kErrorInvalidValue;
    auto res = reservations().upper_bound(ptr);
    if (res == reservations().begin()) return kErrorInvalidValue;
    --res;
    if (ptr + bytes > res->first + res->second) return kErrorInvalidValue;    // not reserved
    if (!space().overlapping(ptr, bytes).empty()) return kErrorInvalidValue;  // mapped already
    return mapRegion(RegionKind::kVmm, ptr, bytes, bytes, b, offset, nullptr) ? kSuccess
                                                                              : kErrorOutOfMemory;
  });
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t bytes) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  return guarded([&] {
    std::vector<std::shared_ptr<Region>> gone;
    std::lock_guard<std::mutex> lk(gVmmMu);
    std::vector<std::shared_ptr<Region>> rs = vmmCover(ptr, bytes);
    if (rs.empty()) return kErrorInvalidValue;
    for (auto& r : rs) gone.push_back(space().remove(r->base));
    count(kVmmMappings, -static_cast<long long>(rs.size()));
    return kSuccess;
  });
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc, size_t count_) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(vmmEnabled());
  if (desc == nullptr || count_ == 0) return kErrorInvalidValue;
  int access = kAccessNone;
  for (size_t i = 0; i < count_; ++i) {
    FAKECUDA_TRY(checkLocation(desc[i].location));
    const int f = desc[i].flags;
    if (f != kAccessNone && f != kAccessRead && f != kAccessReadWrite) return kErrorInvalidValue;
    if (f > access) access = f;  // one device runs everything here: the widest access wins
  }
  return guarded([&] {
    std::lock_guard<std::mutex> lk(gVmmMu);
    std::vector<std::shared_ptr<Region>> rs = vmmCover(ptr, bytes);
    if (rs.empty()) return kErrorInvalidValue;
    for (auto& r : rs) r->access.store(access, std::memory_order_release);
    return kSuccess;
  });
}

CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t bytes, int handleType,
                                       unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  if (handle == nullptr || handleType != kMemRangeHandleTypeDmaBufFd || (flags & ~1ull) != 0)
    return kErrorInvalidValue;
  if (!state().cfg.dmabuf) return kErrorNotSupported;
  const size_t page = size_t(::getpagesize());
  if (bytes == 0 || dptr % page != 0 || bytes % page != 0) return kErrorInvalidValue;
  FAKECUDA_TRY(waitForMappingLock("cuMemGetHandleForAddressRange"));
  return guarded([&] {
    std::shared_ptr<Region> r = space().inArena(dptr) ? space().find(dptr) : nullptr;
    if (r == nullptr || bytes > r->span - (dptr - r->base)) return kErrorInvalidValue;
    // Offset 0 of a dma-buf is the range's start; a dup of the memfd can only give that when the
    // range starts where the backing does.
    if (r->backingOffset + (dptr - r->base) != 0) return kErrorNotSupported;
    const int fd = ::fcntl(r->backing->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return kErrorOutOfMemory;
    *static_cast<int*>(handle) = fd;
    count(kDmabufExports);
    return kSuccess;
  });
}

}  // extern "C"
