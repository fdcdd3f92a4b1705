// Helpers of the emulated CUDA device's tests: the driver loaded through Loom's own loader with
// LOOM_CUDA_LIB naming the built library (LOOMTEST_FAKECUDA_LIB, from CMake), the library's test
// controls, a fixture with device 0's primary context current, VMM properties, and child processes
// that are this test binary started afresh (tests/child_process.h).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "src/core/params.h"
#include "src/device/cuda_driver.h"
#include "tests/child_process.h"
#include "tests/device/fake_cuda/fake_cuda.h"

namespace loom::testing_fakecuda {

using cuda::CUcontext;
using cuda::CUdeviceptr;
using cuda::CUresult;
using cuda::CUstream;

// The driver as Loom loads it, on the emulated device (two devices unless the environment says).
inline const cuda::Driver& fakeDriver() {
  static const bool set = [] {
    ::setenv("LOOM_CUDA_LIB", LOOMTEST_FAKECUDA_LIB, 1);
    ::setenv("LOOMTEST_FAKECUDA_DEVICES", "2", 0);
    reloadParams();
    return true;
  }();
  (void)set;
  return cuda::cudaDriver();
}

inline const cuda::DriverApi& cu() { return fakeDriver().api; }

inline std::string cuName(CUresult rc) {
  const char* n = nullptr;
  cu().cuGetErrorName(rc, &n);
  return (n ? n : "?") + std::string(" (") + std::to_string(rc) + ")";
}

// The library's test controls (fake_cuda.h), from the handle the loader holds.
struct Controls {
  loomtest_fakecuda_inject_fn inject = nullptr;
  loomtest_fakecuda_count_fn count = nullptr;
  loomtest_fakecuda_set_capturing_fn setCapturing = nullptr;
};
inline const Controls& controls() {
  static const Controls c = [] {
    fakeDriver();
    Controls r;
    void* h = ::dlopen(LOOMTEST_FAKECUDA_LIB, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) return r;
    r.inject =
        reinterpret_cast<loomtest_fakecuda_inject_fn>(::dlsym(h, "loomtest_fakecuda_inject"));
    r.count = reinterpret_cast<loomtest_fakecuda_count_fn>(::dlsym(h, "loomtest_fakecuda_count"));
    r.setCapturing = reinterpret_cast<loomtest_fakecuda_set_capturing_fn>(
        ::dlsym(h, "loomtest_fakecuda_set_capturing"));
    return r;
  }();
  return c;
}
inline long long counter(const char* what) { return controls().count(what); }

// Waits (at most 10 s) until pred() holds.
template <class Pred>
bool eventually(Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace loom::testing_fakecuda

// Expects a driver call to give `code` (a CUresult), naming both on failure.
#define EXPECT_CU(code, call)                                                         \
  do {                                                                                \
    const ::loom::cuda::CUresult rc_ = (call);                                        \
    EXPECT_EQ(rc_, (code)) << #call << ": " << ::loom::testing_fakecuda::cuName(rc_); \
  } while (0)
#define ASSERT_CU(code, call)                                                         \
  do {                                                                                \
    const ::loom::cuda::CUresult rc_ = (call);                                        \
    ASSERT_EQ(rc_, (code)) << #call << ": " << ::loom::testing_fakecuda::cuName(rc_); \
  } while (0)
#define ASSERT_CU_OK(call) ASSERT_CU(::loom::cuda::kSuccess, call)

namespace loom::testing_fakecuda {

// Device 0's primary context retained and current for each test, released after it: the last
// release destroys the context, so every test starts with a fresh one (and no sticky error).
class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::Driver& d = fakeDriver();
    ASSERT_TRUE(d.ok()) << d.status.message();
    ASSERT_NE(controls().count, nullptr) << "no loomtest_fakecuda_count in " << d.library;
    ASSERT_CU_OK(cu().cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU_OK(cu().cuCtxSetCurrent(ctx_));
  }
  void TearDown() override {
    if (ctx_ == nullptr) return;
    cu().cuCtxSetCurrent(ctx_);
    EXPECT_CU(cuda::kSuccess, cu().cuDevicePrimaryCtxRelease(0));
    cu().cuCtxSetCurrent(nullptr);
    // Every context is gone: so are its streams' workers (none waits forever).
    EXPECT_TRUE(eventually([] { return counter("workers") == 0; }))
        << counter("workers") << " stream workers still run";
    EXPECT_EQ(counter("allocations"), 0);
    EXPECT_EQ(counter("context_refs"), 0);
  }

  // Device memory with `bytes` bytes, freed with the context.
  CUdeviceptr alloc(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(cuda::kSuccess, cu().cuMemAlloc(&p, bytes));
    return p;
  }
  // Host memory the device can use (DEVICEMAP | PORTABLE), zeroed.
  template <class T = uint64_t>
  T* hostAlloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_CU(
        cuda::kSuccess,
        cu().cuMemHostAlloc(&p, bytes, cuda::kMemHostAllocDeviceMap | cuda::kMemHostAllocPortable));
    if (p) std::memset(p, 0, bytes);
    return static_cast<T*>(p);
  }
  CUstream stream() {
    CUstream s = nullptr;
    EXPECT_CU(cuda::kSuccess, cu().cuStreamCreate(&s, cuda::kStreamNonBlocking));
    return s;
  }
  static CUdeviceptr dev(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

  CUcontext ctx_ = nullptr;
};

// VMM memory on `device` that can be exported as a POSIX fd (cuMemCreate's properties).
inline cuda::CUmemAllocationProp posixFdProp(int device = 0) {
  cuda::CUmemAllocationProp prop{};
  prop.type = cuda::kMemAllocationTypePinned;
  prop.requestedHandleTypes = cuda::kMemHandleTypePosixFd;
  prop.location.type = cuda::kMemLocationTypeDevice;
  prop.location.id = device;
  return prop;
}

// Read and write access for `device` (cuMemSetAccess).
inline cuda::CUmemAccessDesc readWriteAccess(int device = 0) {
  cuda::CUmemAccessDesc acc{};
  acc.location.type = cuda::kMemLocationTypeDevice;
  acc.location.id = device;
  acc.flags = cuda::kMemAccessReadWrite;
  return acc;
}

// Children (tests/child_process.h) wait at most this long.
constexpr int64_t kChildTimeoutMs = 60000;
using testing_util::ChildProcess;
using testing_util::spawnSelf;

}  // namespace loom::testing_fakecuda
