// The emulated device's memory: the PROT_NONE arena its addresses come from, the memfd behind each
// allocation and the read-write mapping (shadow) through which the device reaches it, the map from
// device ranges to those shadows, and host memory known to the device (cuMemHostAlloc,
// cuMemHostRegister). Internal to libloom-fakecuda.so.
//
// Lifetimes: a Region or HostRegion is held by shared_ptr; the tables hold one reference and every
// operation that touches the memory holds another while it runs, so freeing memory that a stream
// still uses leaves the bytes mapped until that operation ends (later ones fault).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "tests/device/fake_cuda/state.h"

namespace fakecuda {

// A memfd holding device memory. Closing it (the last reference) uncharges its device.
struct Backing {
  ~Backing();
  int fd = -1;
  size_t size = 0;            // the file's size
  uint64_t ino = 0;           // its inode, which names it across processes
  int device = 0;             // the device whose memory it is
  Device* charged = nullptr;  // the device charged for it in this process (null: imported)
  size_t chargedBytes = 0;
};

// A new memfd of `size` bytes (sparse) of device `d`, `charge` bytes of it charged to the device
// and reserved (running out of memory is an error now, not a SIGBUS later).
CUresult makeBacking(Device* d, size_t size, size_t charge, std::shared_ptr<Backing>* out);
// Adopts an fd of another process's (or this one's) device memory: checks that it is a memfd of
// this emulator and reads its size and device from it. Takes ownership of fd on success.
CUresult adoptBacking(int fd, std::shared_ptr<Backing>* out);

enum class RegionKind { kAlloc, kVmm, kIpc };
enum Access : int { kAccessNone = 0, kAccessRead = 1, kAccessReadWrite = 3 };

// A mapped device range: [base, base + size) reaches shadow[0, size).
struct Region {
  ~Region();
  uintptr_t base = 0;
  size_t size = 0;  // bytes addressable (an allocation's exact size)
  size_t span = 0;  // address space it holds (size rounded up to the granularity)
  RegionKind kind = RegionKind::kAlloc;
  char* shadow = nullptr;
  size_t shadowLen = 0;
  std::shared_ptr<Backing> backing;
  size_t backingOffset = 0;  // where base is in the backing
  Context* ctx = nullptr;    // owning context (kAlloc, kIpc); null for VMM mappings
  uint64_t gen = 0;
  int device = 0;
  uint64_t bufferId = 0;
  bool ownsAddresses = true;  // returns [base, base + span) to the arena when destroyed
  std::atomic<int> access{kAccessReadWrite};
};

// Maps [base, base + size), holding [base, base + span), to backing b from `offset` through a new
// shadow and adds it to space(), counted: an allocation (kAlloc) or IPC mapping (kIpc) of context
// owner, whose addresses go back to the arena with it; or a VMM mapping (kVmm, owner null) on
// addresses of its reservation, without access until cuMemSetAccess. False when the shadow cannot
// be mapped (then the addresses of an allocation or IPC mapping go back to the arena).
bool mapRegion(RegionKind kind, uintptr_t base, size_t span, size_t size,
               std::shared_ptr<Backing> b, size_t offset, Context* owner);

// Host memory the device may use at the same address.
struct HostRegion {
  // Host memory [at, at + bytes) of context c, allocated (cuMemHostAlloc) or registered; a new
  // buffer id.
  HostRegion(uintptr_t at, size_t bytes, unsigned hostFlags, bool allocated, Context* c);
  ~HostRegion();
  uintptr_t base = 0;
  size_t size = 0;
  unsigned flags = 0;
  bool owned = false;    // cuMemHostAlloc (unmapped when destroyed) or registered
  bool managed = false;  // cuMemAllocManaged (owned): CUDA calls it device memory
  Context* ctx = nullptr;
  uint64_t gen = 0;
  uint64_t bufferId = 0;
};

class AddressSpace {
 public:
  // Reserves the arena; false when the address space cannot be had.
  bool init();
  bool inArena(uintptr_t addr) const { return addr >= arena_ && addr - arena_ < arenaSize_; }

  // Address ranges of the arena (granularity multiples, aligned to `align`), reused as late as
  // possible; 0 when none is free. `hint`, when free, is taken.
  uintptr_t reserve(size_t bytes, size_t align, uintptr_t hint = 0);
  void unreserve(uintptr_t base, size_t bytes);

  void insert(std::shared_ptr<Region> r);
  std::shared_ptr<Region> find(uintptr_t addr);  // the region holding addr
  std::shared_ptr<Region> remove(uintptr_t base);
  // Regions whose [base, base + size) meets [addr, addr + bytes).
  std::vector<std::shared_ptr<Region>> overlapping(uintptr_t addr, size_t bytes);

  // Host memory; insertHost fails (false) when the range meets a known one.
  bool insertHost(std::shared_ptr<HostRegion> r);
  std::shared_ptr<HostRegion> findHost(uintptr_t addr);
  std::shared_ptr<HostRegion> removeHost(uintptr_t base);

  // Removes what generation gen of c owns (its context was destroyed), returning it so that the
  // caller drops the last references outside the lock.
  void takeContext(Context* c, uint64_t gen, std::vector<std::shared_ptr<Region>>* regions,
                   std::vector<std::shared_ptr<HostRegion>>* hosts);

 private:
  std::shared_mutex mu_;
  uintptr_t arena_ = 0;
  size_t arenaSize_ = 0;
  std::map<uintptr_t, size_t> free_;  // free arena ranges: base -> bytes
  uintptr_t cursor_ = 0;              // next-fit start
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;
  std::map<uintptr_t, std::shared_ptr<HostRegion>> hosts_;
};

AddressSpace& space();

uint64_t nextBufferId();

// What an access of [addr, addr + bytes) by the device reaches.
enum class Target {
  kDevice,    // device memory: p is its shadow
  kHost,      // host memory known to the device: p is addr
  kPageable,  // other host memory (copies only): p is addr
  kIllegal,   // in the arena but not mapped, past a region's end, or without access
};
struct Resolved {
  Target target = Target::kIllegal;
  char* p = nullptr;
  std::shared_ptr<Region> region;  // keeps device memory mapped while it is used
  std::shared_ptr<HostRegion> host;
};
Resolved resolve(uintptr_t addr, size_t bytes, bool write);

// Maps `len` bytes of fd at offset read-write; null on failure.
char* mapShadow(int fd, size_t len, size_t offset);

}  // namespace fakecuda
