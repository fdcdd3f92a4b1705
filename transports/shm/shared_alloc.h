// Memory that other processes of the host can map: what loomMemAlloc returns. A buffer in it can
// be read by a peer rank on the same host straight from the peer's own mapping, so a shared-memory
// message from it costs one copy (the receiver's) without process_vm_readv's page pinning, as
// between threads of one process. This is Loom's counterpart of ncclMemAlloc and of XPMEM-style
// buffers mapped by both sides.
//
// Each allocation is a memfd of its own, mapped MAP_SHARED in this process. A peer process maps it
// by opening /proc/<pid>/fd/<fd> (allowed where ptrace's read check passes, as for cross-memory
// attach; probed at communicator init). Nothing is ever named in /dev/shm: a crash leaves nothing.
// Thread safety: every function may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/core/status.h"

namespace loom::shm {

// Allocates size bytes (rounded up to pages) of mappable memory, zero-filled and page aligned.
Result<void*> sharedAlloc(size_t size);
// Frees an allocation made by sharedAlloc. Peers that mapped it keep their mapping (the memory
// lives until they unmap it) but never reuse it for another allocation (serials are unique).
Status sharedFree(void* ptr);

// Where [p, p + bytes) lies in this process's shared allocations.
struct SharedRef {
  uint64_t serial = 0;  // unique per allocation in this process; 0 = not shared
  int fd = -1;          // the memfd, in this process's fd table
  uint64_t offset = 0;  // of p in the allocation
};
// True when the whole range lies in one live allocation.
bool findShared(const void* p, size_t bytes, SharedRef* ref);
// Allocations live now, read without the registry's lock (a buffer from loomMemAlloc is live
// while its caller uses it, so none live means no buffer is one): the calls' fast path.
extern std::atomic<size_t> gLiveSharedAllocations;
inline size_t liveSharedAllocations() {
  return gLiveSharedAllocations.load(std::memory_order_acquire);
}

// A small allocation of this process that peers map at init to learn whether they can map this
// process's memory at all (its first 8 bytes hold value).
struct ProbeInfo {
  int fd = -1;
  uint64_t serial = 0;
  uint64_t value = 0;
};
Result<ProbeInfo> probeAllocation();

// Mappings of one peer process's shared allocations, made on first use and kept (up to a bound,
// least recently used first out) until destruction. Not thread safe: one per transport instance.
class PeerMappings {
 public:
  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  ~PeerMappings();

  // The address, in this process, of bytes at offset of the peer's allocation (serial, fd),
  // mapped read-write (collectives write their results straight into peers' buffers).
  // Checks that the fd still names that allocation (its memfd name carries pid and serial).
  Result<const char*> map(pid_t pid, int fd, uint64_t serial, uint64_t offset, size_t bytes);

 private:
  struct Mapping {
    char* base = nullptr;
    size_t size = 0;
    uint64_t lastUse = 0;
    std::vector<bool> populated;  // per kPopulateChunk of the mapping: page tables filled
  };
  // Fills the page tables of [offset, offset + bytes) of m, a chunk at a time, each once.
  static void populate(Mapping& m, size_t offset, size_t bytes);
  void evictOne();
  std::map<std::pair<pid_t, uint64_t>, Mapping> maps_;
  uint64_t clock_ = 0;
};

}  // namespace loom::shm
