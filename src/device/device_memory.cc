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
  unsigned type = 0, managed = 0;
  int device = -1;
  unsigned long long id = 0;  // NOLINT: the driver's type
  int attrs[] = {cuda::kPointerAttrMemoryType, cuda::kPointerAttrIsManaged,
                 cuda::kPointerAttrDeviceOrdinal, cuda::kPointerAttrBufferId};
  void* data[] = {&type, &managed, &device, &id};
  if (cuda::cudaDriver().api.cuPointerGetAttributes(
          4, attrs, data, reinterpret_cast<cuda::CUdeviceptr>(p)) != cuda::kSuccess ||
      type == 0)
    return info;  // not known to CUDA: plain host memory
  info.managed = managed != 0;
  info.bufferId = static_cast<uint64_t>(id);
  if (type == cuda::kMemoryTypeDevice || type == cuda::kMemoryTypeUnified || info.managed) {
    info.kind = MemKind::kCudaDevice;
    info.device = device;
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

Status allocationOf(const void* p, size_t bytes, uintptr_t* base, size_t* length) {
  const cuda::Driver& d = cuda::cudaDriver();
  LOOM_TRY(d.status);
  const auto at = reinterpret_cast<uintptr_t>(p);
  cuda::CUdeviceptr b = 0;
  size_t n = 0;
  cuda::CUresult rc = d.api.cuMemGetAddressRange(&b, &n, static_cast<cuda::CUdeviceptr>(at));
  if (rc != cuda::kSuccess)
    return cuda::cudaError(
        rc, fmt::format("cuMemGetAddressRange of GPU buffer {} ({} bytes)", p, bytes).c_str());
  if (at + bytes > b + n)
    return LOOM_ERROR(kInvalidArgument,
                      "GPU buffer {} ({} bytes) runs past the end of its allocation ({:#x}, {} "
                      "bytes)",
                      p, bytes, b, n);
  *base = b;
  *length = n;
  return Status();
}

uint64_t bufferId(const void* p) {
  if (!cudaUsable()) return 0;
  unsigned long long id = 0;  // NOLINT: the driver's type
  if (cuda::cudaDriver().api.cuPointerGetAttribute(&id, cuda::kPointerAttrBufferId,
                                                   reinterpret_cast<cuda::CUdeviceptr>(p)) !=
      cuda::kSuccess)
    return 0;
  return static_cast<uint64_t>(id);
}

Status exportDmabuf(const void* p, size_t bytes, int* fd, uint64_t* offset, uintptr_t* begin,
                    size_t* length) {
  const cuda::Driver& d = cuda::cudaDriver();
  LOOM_TRY(d.status);
  if (d.api.cuMemGetHandleForAddressRange == nullptr)
    return LOOM_ERROR(kCuda, "the CUDA driver has no cuMemGetHandleForAddressRange (dma-buf)");
  uintptr_t base = 0;
  size_t n = 0;
  LOOM_TRY(allocationOf(p, bytes, &base, &n));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t exported = (n + page - 1) / page * page;
  int out = -1;
  cuda::CUresult rc = d.api.cuMemGetHandleForAddressRange(&out, base, exported,
                                                          cuda::kMemRangeHandleTypeDmaBufFd, 0);
  if (rc != cuda::kSuccess)
    return cuda::cudaError(rc, fmt::format("cuMemGetHandleForAddressRange (dma-buf) of the "
                                           "allocation at {:#x} ({} bytes)",
                                           base, exported)
                                   .c_str());
  *fd = out;
  *offset = reinterpret_cast<uintptr_t>(p) - base;
  *begin = base;
  *length = exported;
  return Status();
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
