// Test helper: CUDA device memory through the loaded driver (the emulated device in CI), written
// and read with the driver's copies. Used by the device-call tests and the GPUDirect tests.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <vector>

#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"

namespace loomtest {

// Device memory of `device` (its primary context made current), freed on destruction.
struct DevBuf {
  loom::cuda::CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit DevBuf(size_t n, int device = 0) : bytes(n) {
    if (loom::device::useDevice(device).isOk()) api().cuMemAlloc(&p, n);
    (void)loom::device::useDevice(0);
  }
  ~DevBuf() {
    if (p) api().cuMemFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* ptr(size_t offset = 0) const { return reinterpret_cast<void*>(p + offset); }
  bool ok() const { return p != 0; }
  // Copies elements in at a byte offset, or out (on stream s, synchronized); a failed read gives
  // count copies of T(-2).
  template <class T = float>
  bool put(const std::vector<T>& v, size_t offset = 0) {
    return api().cuMemcpyAsync(p + offset, reinterpret_cast<loom::cuda::CUdeviceptr>(v.data()),
                               v.size() * sizeof(T), nullptr) == 0 &&
           api().cuStreamSynchronize(nullptr) == 0;
  }
  template <class T = float>
  std::vector<T> get(size_t count, loom::cuda::CUstream s = nullptr, size_t offset = 0) const {
    std::vector<T> v(count, T(-1));
    if (api().cuMemcpyAsync(reinterpret_cast<loom::cuda::CUdeviceptr>(v.data()), p + offset,
                            count * sizeof(T), s) != 0 ||
        api().cuStreamSynchronize(s) != 0)
      v.assign(count, T(-2));
    return v;
  }

 private:
  static const loom::cuda::DriverApi& api() { return loom::cuda::cudaDriver().api; }
};

// A symbol of the loaded driver library that Loom's table does not hold (cuMemAllocManaged) or
// of the emulated device's controls; null when it has none.
inline void* driverSymbol(const char* name) {
  void* lib = ::dlopen(loom::cuda::cudaDriver().library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  return lib ? ::dlsym(lib, name) : nullptr;
}

// The emulated CUDA device's counter `what` (loomtest_fakecuda_count, fake_cuda.h), read from the
// loaded driver library; -1 where that library has no counters (a real driver).
inline long long fakeCudaCount(const char* what) {
  auto* count =
      reinterpret_cast<long long (*)(const char*)>(driverSymbol("loomtest_fakecuda_count"));
  return count ? count(what) : -1;
}

}  // namespace loomtest
