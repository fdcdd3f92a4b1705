#include "tools/perf/device_buffers.h"

#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"

namespace loom {
namespace perf {

namespace {
const cuda::DriverApi& api() { return cuda::cudaDriver().api; }
}  // namespace

std::string deviceUnavailable() {
  const cuda::Driver& d = cuda::cudaDriver();
  return d.ok() ? std::string() : d.status.message();
}

DeviceBuffers::~DeviceBuffers() {
  if (!cuda::cudaDriver().ok()) return;
  if (device_ >= 0) (void)device::useDevice(device_);
  if (stream_) {
    api().cuStreamSynchronize(static_cast<cuda::CUstream>(stream_));
    api().cuStreamDestroy(static_cast<cuda::CUstream>(stream_));
  }
  if (send_) api().cuMemFree(send_);
  if (recv_) api().cuMemFree(recv_);
}

Status DeviceBuffers::init(int localIndex, size_t bytes) {
  const cuda::Driver& d = cuda::cudaDriver();
  LOOM_TRY(d.status);
  device_ = localIndex % d.devices;
  LOOM_TRY(device::useDevice(device_));
  cuda::CUdevice dev = 0;
  LOOM_CU(api().cuDeviceGet(&dev, device_));
  char text[128] = {};
  if (api().cuDeviceGetName(text, sizeof(text) - 1, dev) == cuda::kSuccess) name_ = text;
  char bus[64] = {};
  if (api().cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev) == cuda::kSuccess) busId_ = bus;
  LOOM_CU(api().cuMemAlloc(&send_, std::max<size_t>(bytes, 1)));
  LOOM_CU(api().cuMemAlloc(&recv_, std::max<size_t>(bytes, 1)));
  cuda::CUstream s = nullptr;
  LOOM_CU(api().cuStreamCreate(&s, cuda::kStreamNonBlocking));
  stream_ = s;
  return Status::ok();
}

Status DeviceBuffers::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return Status::ok();
  LOOM_TRY(device::useDevice(device_));  // -g: one thread's ranks are on several devices
  auto s = static_cast<cuda::CUstream>(stream_);
  LOOM_CU(api().cuMemcpyAsync(reinterpret_cast<cuda::CUdeviceptr>(dst),
                              reinterpret_cast<cuda::CUdeviceptr>(src), bytes, s));
  LOOM_CU(api().cuStreamSynchronize(s));
  return Status::ok();
}

Status DeviceBuffers::sync() {
  LOOM_TRY(device::useDevice(device_));
  LOOM_CU(api().cuStreamSynchronize(static_cast<cuda::CUstream>(stream_)));
  return Status::ok();
}

}  // namespace perf
}  // namespace loom
