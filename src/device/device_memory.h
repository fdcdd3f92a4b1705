// What a pointer is to CUDA: plain host memory, device memory (of which device), or managed
// memory; asked of the driver (cuPointerGetAttribute) only where a driver is loaded and sees a GPU,
// so a host-only process pays one load of a flag per question.
//
// Threads: any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "src/core/memory_kind.h"
#include "src/core/status.h"
#include "src/device/cuda_driver.h"

namespace loom::device {

// Whether the CUDA driver loaded and sees a GPU (the first call loads it).
bool cudaUsable();

struct PointerInfo {
  MemKind kind = MemKind::kHost;
  int device = -1;        // the device's ordinal, for device and managed memory
  bool managed = false;   // cudaMallocManaged / cuMemAllocManaged memory (kind: kCudaDevice)
  uint64_t bufferId = 0;  // the driver's id of its allocation (bufferId), 0 for plain host memory
};

// p's kind. Host memory the driver does not know, host memory it pinned or mapped (cuMemHostAlloc,
// cuMemHostRegister) are kHost; device memory (cuMemAlloc, VMM mappings, IPC imports) is
// kCudaDevice with its device. One driver call.
PointerInfo classify(const void* p);

// Whether host code may read [p, p + bytes): its first and last bytes are in readable mappings of
// this process (asked of the kernel, process_vm_readv on itself: no fault). What a pointer the
// driver does not know turns out to be when it is not host memory: a freed device buffer (its
// addresses stay reserved, unreadable, in CUDA's unified address range) or garbage. True when the
// kernel cannot answer. About two system calls for a range this thread has not asked about
// lately (the last 8 ranges found readable are remembered: a loop's buffers cost nothing after
// the first call); asked only where CUDA is usable.
bool hostReadable(const void* p, size_t bytes);

// The CUDA allocation holding [p, p + bytes): its base (*base) and size (*length). A range that is
// not inside one allocation is an error naming it.
Status allocationOf(const void* p, size_t bytes, uintptr_t* base, size_t* length);

// The allocation holding p by the id CUDA gives it (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused
// within a process): tells a freed allocation from a new one at the same address. 0 where unknown
// (no driver, not CUDA memory, freed).
uint64_t bufferId(const void* p);

// A dma-buf file descriptor for the whole allocation holding [p, p + bytes), as a NIC registers GPU
// memory: from the allocation's base (*begin, where every export may start) for *length bytes (its
// size rounded up to the host page, as the driver wants); *offset is p's offset in it, so one
// registration serves every buffer of the allocation. The caller closes the descriptor.
Status exportDmabuf(const void* p, size_t bytes, int* fd, uint64_t* offset, uintptr_t* begin,
                    size_t* length);

// The primary context of a device, retained once per process and never released (as the CUDA
// runtime does), made current on the calling thread.
Status useDevice(int device);

}  // namespace loom::device
