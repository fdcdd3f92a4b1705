#include "src/device/device_memory.h"

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
