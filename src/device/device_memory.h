// What a pointer is to CUDA: plain host memory, device memory (of which device), or managed
// memory; asked of the driver (cuPointerGetAttribute) only where a driver is loaded and sees a GPU,
// so a host-only process pays one load of a flag per question.
//
// Threads: any.
#pragma once

#include <atomic>

#include "src/core/memory_kind.h"
#include "src/core/status.h"
#include "src/device/cuda_driver.h"

namespace loom::device {

// Whether the CUDA driver loaded and sees a GPU (the first call loads it).
bool cudaUsable();

struct PointerInfo {
  MemKind kind = MemKind::kHost;
  int device = -1;       // the device's ordinal, for device and managed memory
  bool managed = false;  // cudaMallocManaged / cuMemAllocManaged memory (kind: kCudaDevice)
};

// p's kind. Host memory the driver does not know, host memory it pinned or mapped (cuMemHostAlloc,
// cuMemHostRegister) are kHost; device memory (cuMemAlloc, VMM mappings, IPC imports) is
// kCudaDevice with its device.
PointerInfo classify(const void* p);

// Whether host code may read [p, p + bytes): its first and last bytes are in readable mappings of
// this process (asked of the kernel, process_vm_readv on itself: no fault). What a pointer the
// driver does not know turns out to be when it is not host memory: a freed device buffer (its
// addresses stay reserved, unreadable, in CUDA's unified address range) or garbage. True when the
// kernel cannot answer. About two system calls for a range this thread has not asked about
// lately (the last 8 ranges found readable are remembered: a loop's buffers cost nothing after
// the first call); asked only where CUDA is usable.
bool hostReadable(const void* p, size_t bytes);

// The primary context of a device, retained once per process and never released (as the CUDA
// runtime does), made current on the calling thread.
Status useDevice(int device);

}  // namespace loom::device
