#include "transports/shm/shared_alloc.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include "src/core/log.h"

namespace loom::shm {

namespace {

constexpr size_t kMaxPeerMappings = 64;
constexpr size_t kPopulateChunk = size_t(2) << 20;

struct Allocation {
  size_t size = 0;
  int fd = -1;
  uint64_t serial = 0;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Allocation> byBase;
  uint64_t nextSerial = 1;
  ProbeInfo probe;
  Status probeStatus = LOOM_ERROR(kInternal, "no probe yet");
  bool probeMade = false;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: allocations may outlive statics
  return *r;
}

std::string memfdName(pid_t pid, uint64_t serial) {
  return fmt::format("loom-{}-{}", static_cast<long>(pid), serial);
}

size_t pageRound(size_t v) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (v + page - 1) / page * page;
}

// Creates, sizes and maps a memfd for serial. Caller holds the registry lock.
Result<std::pair<char*, Allocation>> makeAllocation(Registry& reg, size_t size) {
  // Rounding a size near SIZE_MAX up to a page would wrap to a tiny allocation.
  if (size > static_cast<size_t>(std::numeric_limits<off_t>::max()) / 2)
    return LOOM_ERROR(kInvalidArgument, "cannot allocate {} bytes of shared memory: too large",
                      size);
  Allocation a;
  a.serial = reg.nextSerial++;
  a.size = pageRound(size ? size : 1);
  std::string name = memfdName(getpid(), a.serial);
  a.fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (a.fd < 0)
    return LOOM_ERROR(kSystem, "memfd_create for {} bytes of shared memory: {}", a.size,
                      std::strerror(errno));
  if (ftruncate(a.fd, static_cast<off_t>(a.size)) != 0) {
    int e = errno;
    close(a.fd);
    return LOOM_ERROR(kSystem, "sizing shared memory of {} bytes: {}", a.size, std::strerror(e));
  }
  // Reserve the pages now, so that running out of memory is an error here and not a SIGBUS later.
  int rc = posix_fallocate(a.fd, 0, static_cast<off_t>(a.size));
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    close(a.fd);
    return LOOM_ERROR(kSystem, "cannot reserve {} bytes of shared memory: {}", a.size,
                      std::strerror(rc));
  }
  void* p = mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(a.fd);
    return LOOM_ERROR(kSystem, "mapping {} bytes of shared memory: {}", a.size, std::strerror(e));
  }
  return std::make_pair(static_cast<char*>(p), a);
}

}  // namespace

Result<void*> sharedAlloc(size_t size) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  LOOM_ASSIGN(auto made, makeAllocation(reg, size));
  reg.byBase[reinterpret_cast<uintptr_t>(made.first)] = made.second;
  gLiveSharedAllocations.store(reg.byBase.size(), std::memory_order_release);
  return static_cast<void*>(made.first);
}

Status sharedFree(void* ptr) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.byBase.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == reg.byBase.end())
    return LOOM_ERROR(kInvalidArgument, "{} was not returned by loomMemAlloc (or is freed)", ptr);
  munmap(ptr, it->second.size);
  close(it->second.fd);
  reg.byBase.erase(it);
  gLiveSharedAllocations.store(reg.byBase.size(), std::memory_order_release);
  return Status();
}

std::atomic<size_t> gLiveSharedAllocations{0};

bool findShared(const void* p, size_t bytes, SharedRef* ref) {
  Registry& reg = registry();
  if (liveSharedAllocations() == 0) return false;
  auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.byBase.upper_bound(addr);
  if (it == reg.byBase.begin()) return false;
  --it;
  const Allocation& a = it->second;
  uintptr_t off = addr - it->first;
  if (off >= a.size || bytes > a.size - off) return false;
  ref->serial = a.serial;
  ref->fd = a.fd;
  ref->offset = off;
  return true;
}

Result<ProbeInfo> probeAllocation() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  if (!reg.probeMade) {
    reg.probeMade = true;
    Result<std::pair<char*, Allocation>> made = makeAllocation(reg, 1);
    if (!made.isOk()) {
      reg.probeStatus = made.status();
    } else {
      std::random_device rd;
      reg.probe.value = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0xa5a5a5a5a5a5a5a5ull;
      std::memcpy(made.value().first, &reg.probe.value, sizeof(uint64_t));
      reg.probe.fd = made.value().second.fd;
      reg.probe.serial = made.value().second.serial;
      reg.probeStatus = Status();
      // Not registered in byBase: the probe page is never a message buffer.
    }
  }
  if (!reg.probeStatus.isOk()) return reg.probeStatus;
  return reg.probe;
}

PeerMappings::~PeerMappings() {
  for (auto& kv : maps_) munmap(kv.second.base, kv.second.size);
}

void PeerMappings::evictOne() {
  auto victim = maps_.begin();
  for (auto it = maps_.begin(); it != maps_.end(); ++it)
    if (it->second.lastUse < victim->second.lastUse) victim = it;
  munmap(victim->second.base, victim->second.size);
  maps_.erase(victim);
}

Result<const char*> PeerMappings::map(pid_t pid, int fd, uint64_t serial, uint64_t offset,
                                      size_t bytes) {
  auto key = std::make_pair(pid, serial);
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    std::string path = fmt::format("/proc/{}/fd/{}", static_cast<long>(pid), fd);
    // The fd must still name allocation `serial` of that process (memfd links read
    // "/memfd:loom-<pid>-<serial> (deleted)").
    char link[256];
    ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n < 0)
      return LOOM_ERROR(kSystem, "cannot read {} (the peer's shared buffer): {}", path,
                        std::strerror(errno));
    link[n] = '\0';
    std::string want = "/memfd:" + memfdName(pid, serial) + " ";
    if (std::strncmp(link, want.c_str(), want.size()) != 0)
      return LOOM_ERROR(kRemote, "{} is '{}', not the peer's shared buffer {}", path, link,
                        memfdName(pid, serial));
    int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (f < 0)
      return LOOM_ERROR(kSystem, "cannot open {} (the peer's shared buffer): {}", path,
                        std::strerror(errno));
    struct stat st {};
    if (fstat(f, &st) != 0 || st.st_size <= 0) {
      close(f);
      return LOOM_ERROR(kSystem, "cannot size {}", path);
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    int e = errno;
    close(f);
    if (p == MAP_FAILED)
      return LOOM_ERROR(kSystem, "cannot map {} ({} bytes): {}", path, size, std::strerror(e));
    if (maps_.size() >= kMaxPeerMappings) evictOne();
    Mapping m;
    m.base = static_cast<char*>(p);
    m.size = size;
    m.populated.assign((size + kPopulateChunk - 1) / kPopulateChunk, false);
    it = maps_.emplace(key, std::move(m)).first;
    LOOM_TRACE(kSubShm, "mapped shared buffer {} of pid {} ({} bytes)", serial,
               static_cast<long>(pid), size);
  }
  Mapping& m = it->second;
  m.lastUse = ++clock_;
  if (offset > m.size || bytes > m.size - offset)
    return LOOM_ERROR(kRemote, "peer's shared buffer {} has {} bytes; asked for {} at offset {}",
                      serial, m.size, bytes, offset);
  populate(m, offset, bytes);
  return static_cast<const char*>(m.base + offset);
}

// A call's first touch of each page of a peer's buffer would fault, one page at a time, inside the
// call (a 1 MiB AllReduce at a new offset of a nccl-tests sweep took 300 us instead of 30): the
// range a call asks for is populated first, in 2 MiB chunks, each once per mapping. Only what calls
// use: a peer's allocation may be far larger than what it ever touches. Where the kernel has no
// MADV_POPULATE_WRITE (before 5.14) the pages fault as before.
void PeerMappings::populate(Mapping& m, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  for (size_t c = offset / kPopulateChunk; c <= (offset + bytes - 1) / kPopulateChunk; ++c) {
    if (m.populated[c]) continue;
    m.populated[c] = true;
    const size_t start = c * kPopulateChunk;
#ifdef MADV_POPULATE_WRITE
    madvise(m.base + start, std::min(kPopulateChunk, m.size - start), MADV_POPULATE_WRITE);
#endif
  }
}

}  // namespace loom::shm
