#include "src/device/device_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <vector>

namespace loom::device {

bool cudaUsable() {
  static const bool usable = cuda::cudaDriver().ok();
  return usable;
}

PointerInfo classify(const void* p) {
  PointerInfo info;
  if (!p || !cudaUsable()) return info;
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(p);
  unsigned type = 0;
  if (api.cuPointerGetAttribute(&type, cuda::kPointerAttrMemoryType, ptr) != cuda::kSuccess)
    return info;  // not known to CUDA: plain host memory
  int managed = 0;
  api.cuPointerGetAttribute(&managed, cuda::kPointerAttrIsManaged, ptr);
  info.managed = managed != 0;
  if (type == cuda::kMemoryTypeDevice || type == cuda::kMemoryTypeUnified || info.managed) {
    info.kind = MemKind::kCudaDevice;
    api.cuPointerGetAttribute(&info.device, cuda::kPointerAttrDeviceOrdinal, ptr);
  }
  return info;
}

bool hostReadable(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  // The ranges this thread found readable lately: a loop's buffers are asked about once.
  struct Range {
    uintptr_t begin = 0, end = 0;
  };
  constexpr int kRanges = 8;
  thread_local Range known[kRanges];
  thread_local int next = 0;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + bytes;
  for (const Range& r : known)
    if (begin >= r.begin && end <= r.end) return true;
  char probe[1];
  iovec local{probe, 1};
  for (uintptr_t at : {begin, end - 1}) {
    iovec remote{reinterpret_cast<void*>(at), 1};
    if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1) continue;
    if (errno == EFAULT) return false;
    return true;  // not permitted or not there: cannot tell
  }
  known[next] = {begin, end};
  next = (next + 1) % kRanges;
  return true;
}

Status useDevice(int device) {
  const cuda::Driver& drv = cuda::cudaDriver();
  LOOM_TRY(drv.status);
  static std::mutex mu;
  static std::vector<cuda::CUcontext>* contexts = new std::vector<cuda::CUcontext>();
  cuda::CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (device < 0 || device >= drv.devices)
      return LOOM_ERROR(kInvalidArgument, "CUDA device {} does not exist ({} device(s))", device,
                        drv.devices);
    if (contexts->size() < static_cast<size_t>(drv.devices))
      contexts->resize(static_cast<size_t>(drv.devices), nullptr);
    ctx = (*contexts)[static_cast<size_t>(device)];
    if (!ctx) {
      cuda::CUdevice dev = 0;
      LOOM_CU(drv.api.cuDeviceGet(&dev, device));
      LOOM_CU(drv.api.cuDevicePrimaryCtxRetain(&ctx, dev));
      (*contexts)[static_cast<size_t>(device)] = ctx;
    }
  }
  LOOM_CU(drv.api.cuCtxSetCurrent(ctx));
  return Status();
}

}  // namespace loom::device
