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

// The primary context of a device, retained once per process and never released (as the CUDA
// runtime does), made current on the calling thread.
Status useDevice(int device);

}  // namespace loom::device
