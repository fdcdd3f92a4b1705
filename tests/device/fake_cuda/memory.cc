// The arena of device addresses, memfd backings and their shadows, the range maps, and address
// resolution for the device's accesses.
#include "tests/device/fake_cuda/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

namespace fakecuda {

using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's constants

namespace {

constexpr char kMemfdPrefix[] = "loom-fakecuda-d";

// The device ordinal in the name of one of this emulator's memfds, or -1.
int memfdDevice(int fd) {
  char path[64];
  char link[256];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  if (n <= 0) return -1;
  link[n] = '\0';
  const char* p = std::strstr(link, kMemfdPrefix);
  if (std::strncmp(link, "/memfd:", 7) != 0 || p == nullptr) return -1;
  return std::atoi(p + sizeof(kMemfdPrefix) - 1);
}

std::atomic<uint64_t> gBufferIds{1};

// The range of `ranges` (by base) whose [base, base + size) holds addr; null when none does. Takes
// mu shared.
template <class T>
std::shared_ptr<T> holding(std::shared_mutex& mu,
                           const std::map<uintptr_t, std::shared_ptr<T>>& ranges, uintptr_t addr) {
  std::shared_lock<std::shared_mutex> lk(mu);
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return nullptr;
  --it;
  if (addr - it->first >= it->second->size) return nullptr;
  return it->second;
}

// Removes the range of `ranges` that starts at base and returns it (null when none does). Takes
// mu.
template <class T>
std::shared_ptr<T> removeRange(std::shared_mutex& mu,
                               std::map<uintptr_t, std::shared_ptr<T>>& ranges, uintptr_t base) {
  std::unique_lock<std::shared_mutex> lk(mu);
  return takeEntry(ranges, base);
}

}  // namespace

uint64_t nextBufferId() { return gBufferIds.fetch_add(1); }

Backing::~Backing() {
  if (fd >= 0) ::close(fd);
  if (charged != nullptr) {
    charged->uncharge(chargedBytes);
    count(kDeviceBytes, -static_cast<long long>(chargedBytes));
  }
}

CUresult makeBacking(Device* d, size_t size, size_t charge, std::shared_ptr<Backing>* out) {
  if (!d->charge(charge)) return kErrorOutOfMemory;
  auto b = std::make_shared<Backing>();
  b->charged = d;
  b->chargedBytes = charge;
  b->device = d->ordinal;
  b->size = size;
  count(kDeviceBytes, static_cast<long long>(charge));
  std::string name = kMemfdPrefix + std::to_string(d->ordinal);
  b->fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (b->fd < 0) return errno == EMFILE || errno == ENFILE ? kErrorOutOfMemory : kErrorUnknown;
  if (::ftruncate(b->fd, off_t(size)) != 0) return kErrorOutOfMemory;
  if (charge > 0) {
    int rc = ::posix_fallocate(b->fd, 0, off_t(charge));
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) return kErrorOutOfMemory;
  }
  struct stat st;
  if (::fstat(b->fd, &st) != 0) return kErrorUnknown;
  b->ino = uint64_t(st.st_ino);
  *out = std::move(b);
  return kSuccess;
}

CUresult adoptBacking(int fd, std::shared_ptr<Backing>* out) {
  int dev = memfdDevice(fd);
  struct stat st;
  if (dev < 0 || ::fstat(fd, &st) != 0 || st.st_size <= 0) return kErrorInvalidValue;
  auto b = std::make_shared<Backing>();
  b->fd = fd;
  b->size = size_t(st.st_size);
  b->ino = uint64_t(st.st_ino);
  b->device = dev < int(state().devices.size()) ? dev : 0;
  *out = std::move(b);
  return kSuccess;
}

char* mapShadow(int fd, size_t len, size_t offset) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

Region::~Region() {
  if (shadow != nullptr) ::munmap(shadow, shadowLen);
  if (ownsAddresses && span > 0) space().unreserve(base, span);
}

bool mapRegion(RegionKind kind, uintptr_t base, size_t span, size_t size,
               std::shared_ptr<Backing> b, size_t offset, Context* owner) {
  auto r = std::make_shared<Region>();
  r->base = base;
  r->span = span;
  r->size = size;
  r->kind = kind;
  r->ownsAddresses = kind != RegionKind::kVmm;
  r->shadow = mapShadow(b->fd, span, offset);
  if (r->shadow == nullptr) return false;
  r->shadowLen = span;
  r->device = b->device;
  r->backing = std::move(b);
  r->backingOffset = offset;
  if (owner != nullptr) {
    r->ctx = owner;
    r->gen = owner->gen.load();
  }
  r->bufferId = nextBufferId();
  if (kind == RegionKind::kVmm) r->access.store(kAccessNone);
  space().insert(std::move(r));
  count(kind == RegionKind::kAlloc ? kAllocations
        : kind == RegionKind::kIpc ? kIpcMappings
                                   : kVmmMappings);
  return true;
}

HostRegion::HostRegion(uintptr_t at, size_t bytes, unsigned hostFlags, bool allocated, Context* c)
    : base(at),
      size(bytes),
      flags(hostFlags),
      owned(allocated),
      ctx(c),
      gen(c->gen.load()),
      bufferId(nextBufferId()) {}

HostRegion::~HostRegion() {
  if (owned) ::munmap(reinterpret_cast<void*>(base), roundUp(size, size_t(::getpagesize())));
}

bool AddressSpace::init() {
  // 1 TiB of addresses that are never readable by the host (less where that much is refused).
  for (size_t bytes : {size_t(1) << 40, size_t(1) << 38, size_t(1) << 36}) {
    void* p = ::mmap(nullptr, bytes + kGranularity, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    arena_ = roundUp(reinterpret_cast<uintptr_t>(p), kGranularity);
    arenaSize_ = bytes;
    free_[arena_] = arenaSize_;
    cursor_ = arena_;
    return true;
  }
  return false;
}

uintptr_t AddressSpace::reserve(size_t bytes, size_t align, uintptr_t hint) {
  bytes = roundUp(bytes == 0 ? 1 : bytes, kGranularity);
  if (align < kGranularity) align = kGranularity;
  std::unique_lock<std::shared_mutex> lk(mu_);
  auto carve = [&](std::map<uintptr_t, size_t>::iterator it, uintptr_t lo) {
    const uintptr_t b = it->first;
    const size_t len = it->second;
    free_.erase(it);
    if (lo > b) free_[b] = lo - b;
    if (lo + bytes < b + len) free_[lo + bytes] = b + len - (lo + bytes);
    cursor_ = lo + bytes;
    return lo;
  };
  if (hint != 0 && hint % align == 0) {
    auto it = free_.upper_bound(hint);
    if (it != free_.begin()) {
      --it;
      if (hint >= it->first && hint + bytes <= it->first + it->second) return carve(it, hint);
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    const uintptr_t from = pass == 0 ? cursor_ : arena_;
    auto it = free_.upper_bound(from);
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second > from) it = prev;
    }
    for (; it != free_.end(); ++it) {
      uintptr_t lo = roundUp(std::max(it->first, from), align);
      if (lo + bytes <= it->first + it->second) return carve(it, lo);
    }
  }
  return 0;
}

void AddressSpace::unreserve(uintptr_t base, size_t bytes) {
  bytes = roundUp(bytes, kGranularity);
  std::unique_lock<std::shared_mutex> lk(mu_);
  auto next = free_.lower_bound(base);
  if (next != free_.end() && next->first == base + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == base) {
      prev->second += bytes;
      return;
    }
  }
  free_[base] = bytes;
}

void AddressSpace::insert(std::shared_ptr<Region> r) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  const uintptr_t base = r->base;
  regions_[base] = std::move(r);
}

std::shared_ptr<Region> AddressSpace::find(uintptr_t addr) { return holding(mu_, regions_, addr); }

std::shared_ptr<Region> AddressSpace::remove(uintptr_t base) {
  return removeRange(mu_, regions_, base);
}

std::vector<std::shared_ptr<Region>> AddressSpace::overlapping(uintptr_t addr, size_t bytes) {
  std::vector<std::shared_ptr<Region>> out;
  std::shared_lock<std::shared_mutex> lk(mu_);
  auto it = regions_.upper_bound(addr);
  if (it != regions_.begin()) --it;
  for (; it != regions_.end() && it->first < addr + bytes; ++it)
    if (it->first + it->second->size > addr) out.push_back(it->second);
  return out;
}

bool AddressSpace::insertHost(std::shared_ptr<HostRegion> r) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  auto next = hosts_.lower_bound(r->base);
  if (next != hosts_.end() && next->first < r->base + r->size) return false;
  if (next != hosts_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second->size > r->base) return false;
  }
  const uintptr_t base = r->base;
  hosts_[base] = std::move(r);
  return true;
}

std::shared_ptr<HostRegion> AddressSpace::findHost(uintptr_t addr) {
  return holding(mu_, hosts_, addr);
}

std::shared_ptr<HostRegion> AddressSpace::removeHost(uintptr_t base) {
  return removeRange(mu_, hosts_, base);
}

void AddressSpace::takeContext(Context* c, uint64_t gen,
                               std::vector<std::shared_ptr<Region>>* regions,
                               std::vector<std::shared_ptr<HostRegion>>* hosts) {
  auto owned = [&](const auto& r) { return r->ctx == c && r->gen == gen; };
  std::unique_lock<std::shared_mutex> lk(mu_);
  takeIf(regions_, owned, regions);
  takeIf(hosts_, owned, hosts);
}

AddressSpace& space() {
  static AddressSpace* s = new AddressSpace();  // never destroyed
  return *s;
}

Resolved resolve(uintptr_t addr, size_t bytes, bool write) {
  Resolved out;
  if (bytes == 0) bytes = 1;
  AddressSpace& sp = space();
  if (sp.inArena(addr)) {
    std::shared_ptr<Region> r = sp.find(addr);
    if (r == nullptr || bytes > r->size - (addr - r->base)) return out;
    const int access = r->access.load(std::memory_order_acquire);
    if (access == kAccessNone || (write && access != kAccessReadWrite)) return out;
    out.target = Target::kDevice;
    out.p = r->shadow + (addr - r->base);
    out.region = std::move(r);
    return out;
  }
  if (addr < uintptr_t(::getpagesize())) return out;  // NULL and its page: never memory
  out.p = reinterpret_cast<char*>(addr);
  std::shared_ptr<HostRegion> h = sp.findHost(addr);
  if (h == nullptr) {
    out.target = Target::kPageable;
    return out;
  }
  if (bytes > h->size - (addr - h->base)) return out;  // past the end of pinned memory
  out.target = Target::kHost;
  out.host = std::move(h);
  return out;
}

void dropContextMemory(Context* c, uint64_t gen) {
  std::vector<std::shared_ptr<Region>> regions;
  std::vector<std::shared_ptr<HostRegion>> hosts;
  space().takeContext(c, gen, &regions, &hosts);
  for (auto& r : regions)
    if (r->kind == RegionKind::kAlloc) count(kAllocations, -1);
  for (auto& h : hosts) count(h->owned ? kHostAllocations : kHostRegistrations, -1);
}

}  // namespace fakecuda
