// Entry points: device memory (cuMemAlloc/Free), host memory known to the device (cuMemHostAlloc,
// cuMemHostRegister), and what a pointer is (cuPointerGetAttribute, cuMemGetAddressRange).
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "tests/device/fake_cuda/memory.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants

namespace {

size_t pageSize() { return size_t(::getpagesize()); }

template <class T>
void put(void* data, T v) {
  std::memcpy(data, &v, sizeof(T));
}

// Makes [base, base + bytes) host memory the device knows, of context c: allocated (owned) or
// registered, or managed (owned). False when it meets host memory the device knows already.
bool addHost(uintptr_t base, size_t bytes, unsigned flags, bool owned, Context* c,
             bool managed = false) {
  auto h = std::make_shared<HostRegion>(base, bytes, flags, owned, c);
  h->managed = managed;
  if (!space().insertHost(std::move(h))) return false;
  count(owned ? kHostAllocations : kHostRegistrations);
  return true;
}

// Forgets the host memory that starts at p, allocated (owned) or registered; false when there is
// none of that kind.
bool removeHost(void* p, bool owned) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::shared_ptr<HostRegion> h = space().findHost(a);
  if (h == nullptr || h->base != a || h->owned != owned) return false;
  if (space().removeHost(a) == nullptr) return false;
  count(owned ? kHostAllocations : kHostRegistrations, -1);
  return true;
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  FAKECUDA_ENTRY();
  if (dptr == nullptr || bytes == 0) return kErrorInvalidValue;
  FAKECUDA_TRY(captureForbids());
  FAKECUDA_TRY(waitForMappingLock("cuMemAlloc"));
  return inContext([&](Context* c) {
    const size_t span = roundUp(bytes, kGranularity);
    std::shared_ptr<Backing> b;
    FAKECUDA_TRY(makeBacking(c->dev, span, roundUp(bytes, pageSize()), &b));
    const uintptr_t base = space().reserve(span, kGranularity);
    if (base == 0) return kErrorOutOfMemory;
    if (!mapRegion(RegionKind::kAlloc, base, span, bytes, std::move(b), 0, c))
      return kErrorOutOfMemory;
    *dptr = base;
    return kSuccess;
  });
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(captureForbids());
  return inContext([&](Context* c) {
    if (dptr == 0) return kSuccess;
    if (!space().inArena(dptr)) {  // managed memory, else not the driver's
      std::shared_ptr<HostRegion> h = space().findHost(dptr);
      if (h == nullptr || !h->managed) return kErrorInvalidValue;
      void* p = reinterpret_cast<void*>(dptr);
      return removeHost(p, true) ? kSuccess : kErrorInvalidValue;
    }
    std::shared_ptr<Region> r = space().find(dptr);
    if (r == nullptr || r->base != dptr || r->kind != RegionKind::kAlloc) return kErrorInvalidValue;
    // As the driver's, it synchronizes the device first: work queued on it finishes with the
    // memory still there.
    FAKECUDA_TRY(waitForIdleContext(c, "cuMemFree"));
    if (space().remove(dptr) == nullptr) return kErrorInvalidValue;  // freed meanwhile
    count(kAllocations, -1);
    return kSuccess;  // the bytes stay mapped until work that uses them ends
  });
}

CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned flags) {
  FAKECUDA_ENTRY();
  if (pp == nullptr || bytes == 0 || (flags & ~kHostAllocFlags) != 0) return kErrorInvalidValue;
  FAKECUDA_TRY(captureForbids());
  FAKECUDA_TRY(waitForMappingLock("cuMemHostAlloc"));
  return inContext([&](Context* c) {
    void* p = ::mmap(nullptr, roundUp(bytes, pageSize()), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return kErrorOutOfMemory;
    // Fresh memory cannot meet known memory (a failure unmaps it).
    if (!addHost(reinterpret_cast<uintptr_t>(p), bytes, flags, true, c)) return kErrorUnknown;
    *pp = p;
    return kSuccess;
  });
}

// Managed memory is host memory here (the host may read it, as on a real system), that the
// driver reports as managed device memory of the current context's device; cuMemFree frees it.
CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned flags) {
  FAKECUDA_ENTRY();
  if (dptr == nullptr || bytes == 0 || (flags != kMemAttachGlobal && flags != kMemAttachHost))
    return kErrorInvalidValue;
  return inContext([&](Context* c) {
    void* p = ::mmap(nullptr, roundUp(bytes, pageSize()), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return kErrorOutOfMemory;
    if (!addHost(reinterpret_cast<uintptr_t>(p), bytes, 0, true, c, true)) return kErrorUnknown;
    *dptr = reinterpret_cast<CUdeviceptr>(p);
    return kSuccess;
  });
}

CUresult cuMemFreeHost(void* p) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(captureForbids());
  return guarded([&] {
    std::shared_ptr<HostRegion> h = space().findHost(reinterpret_cast<uintptr_t>(p));
    if (h != nullptr && h->managed) return kErrorInvalidValue;  // cuMemFree's
    // As the driver's, it waits for the device to be idle.
    FAKECUDA_TRY(waitForDeviceWaits("cuMemFreeHost", "free pinned memory where no stream waits"));
    return removeHost(p, true) ? kSuccess : kErrorInvalidValue;
  });
}

CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned flags) {
  FAKECUDA_ENTRY();
  if (p == nullptr || bytes == 0 || (flags & ~kHostRegisterFlags) != 0) return kErrorInvalidValue;
  return inContext([&](Context* c) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (space().inArena(a)) return kErrorInvalidValue;  // device memory
    // The driver pins the pages, which fails for addresses that are not mapped.
    const uintptr_t first = a & ~(uintptr_t(pageSize()) - 1);
    if (::msync(reinterpret_cast<void*>(first), roundUp(a + bytes - first, pageSize()), MS_ASYNC) !=
        0)
      return kErrorInvalidValue;
    if (!addHost(a, bytes, flags, false, c)) return kErrorHostMemoryAlreadyRegistered;
    return kSuccess;
  });
}

CUresult cuMemHostUnregister(void* p) {
  FAKECUDA_ENTRY();
  return guarded([&] { return removeHost(p, false) ? kSuccess : kErrorHostMemoryNotRegistered; });
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned flags) {
  FAKECUDA_ENTRY();
  if (dptr == nullptr || flags != 0) return kErrorInvalidValue;
  return inContext([&](Context* c) {
    if (space().findHost(reinterpret_cast<uintptr_t>(p)) == nullptr) return kErrorInvalidValue;
    *dptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
    return kSuccess;
  });
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::shared_ptr<Region> r = space().inArena(dptr) ? space().find(dptr) : nullptr;
    if (r == nullptr) return kErrorNotFound;
    if (base) *base = r->base;
    if (size) *size = r->size;
    return kSuccess;
  });
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  FAKECUDA_ENTRY();
  if (data == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Region> r = space().inArena(ptr) ? space().find(ptr) : nullptr;
    std::shared_ptr<HostRegion> h = r ? nullptr : space().findHost(ptr);
    if (r == nullptr && h == nullptr) return kErrorInvalidValue;  // not memory the driver knows
    Context* ctx = r ? (r->ctx ? r->ctx : state().contexts[size_t(r->device)].get()) : h->ctx;
    const uintptr_t base = r ? r->base : h->base;
    const size_t size = r ? r->size : h->size;
    switch (attribute) {
      case kPointerAttrContext:
        put(data, ctx->handle());
        return kSuccess;
      case kPointerAttrMemoryType:
        put(data, r || h->managed ? kMemoryTypeDevice : kMemoryTypeHost);
        return kSuccess;
      case kPointerAttrDevicePointer:
        put(data, CUdeviceptr(ptr));
        return kSuccess;
      case kPointerAttrHostPointer:
        if (r) return kErrorInvalidValue;
        put(data, reinterpret_cast<void*>(ptr));
        return kSuccess;
      case kPointerAttrBufferId:
        put(data, static_cast<unsigned long long>(r ? r->bufferId : h->bufferId));  // NOLINT
        return kSuccess;
      case kPointerAttrIsManaged:
        put(data, h && h->managed ? 1u : 0u);
        return kSuccess;
      case kPointerAttrDeviceOrdinal:
        put(data, r ? r->device : ctx->dev->ordinal);
        return kSuccess;
      case kPointerAttrIsLegacyIpcCapable:
        put(data, r && r->kind == RegionKind::kAlloc ? 1u : 0u);
        return kSuccess;
      case kPointerAttrRangeStart:
      case kPointerAttrMappingBase:
        put(data, CUdeviceptr(base));
        return kSuccess;
      case kPointerAttrRangeSize:
      case kPointerAttrMappingSize:
        put(data, size);
        return kSuccess;
      case kPointerAttrMapped:
        put(data, 1u);
        return kSuccess;
      default:
        return kErrorInvalidValue;
    }
  });
}

// As the driver: each attribute as cuPointerGetAttribute answers it, and zero (of the attribute's
// size) where that has no answer, a pointer the driver does not know included.
CUresult cuPointerGetAttributes(unsigned count, int* attributes, void** data, CUdeviceptr ptr) {
  FAKECUDA_ENTRY();
  if (count == 0 || attributes == nullptr || data == nullptr) return kErrorInvalidValue;
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] == nullptr) return kErrorInvalidValue;
    const int a = attributes[i];
    const bool narrow = a == kPointerAttrMemoryType || a == kPointerAttrIsManaged ||
                        a == kPointerAttrDeviceOrdinal || a == kPointerAttrIsLegacyIpcCapable ||
                        a == kPointerAttrMapped;
    if (cuPointerGetAttribute(data[i], a, ptr) != kSuccess)
      std::memset(data[i], 0, narrow ? sizeof(unsigned) : sizeof(unsigned long long));  // NOLINT
  }
  return kSuccess;
}

}  // extern "C"
