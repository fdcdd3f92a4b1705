// Kernels on the emulated CUDA device: Loom's reduction kernels launched with cuLaunchKernel give
// the CPU kernels' bits (src/reduce), the wait kernel holds its stream, launch arguments are
// checked as the driver does, and faults (a bad pointer, memory freed under a queued copy, an
// injected illegal address) are sticky for the context without leaving any stream blocked.
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "src/core/dtype.h"
#include "src/device/kernels/reduce_math.h"
#include "src/reduce/reduce.h"
#include "tests/device/fake_cuda_test_util.h"

namespace loom::testing_fakecuda {
namespace {

using namespace cuda;  // NOLINT(build/namespaces): the driver's constants

constexpr char kImage[] = "LOOM-NO-DEVICE-CODE";  // any image: the emulator does not parse it

class FakeCudaKernels : public FakeCudaTest {
 protected:
  void SetUp() override {
    FakeCudaTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_CU_OK(cu().cuModuleLoadData(&module_, kImage));
  }
  // Found and loaded, as Loom loads its kernels (a first launch would load it lazily: see
  // FirstLaunchLoadsAfterTheContextsWaitingStreams).
  CUfunction function(const char* name) {
    CUfunction f = nullptr;
    EXPECT_CU(kSuccess, cu().cuModuleGetFunction(&f, module_, name));
    if (f) EXPECT_CU(kSuccess, cu().cuFuncLoad(f));
    return f;
  }
  CUresult launch(CUfunction f, CUstream s, void* args, unsigned block = 256) {
    void* params[] = {args};
    return cu().cuLaunchKernel(f, 4, 1, 1, block, 1, 1, 0, s, params, nullptr);
  }
  CUmodule module_ = nullptr;
};

bool isFloat(loomDataType_t dt) {
  return dt == loomFloat16 || dt == loomBfloat16 || dt == loomFloat32 || dt == loomFloat64;
}

// Random inputs; floats small enough that sums and products stay interesting.
std::vector<char> randomData(size_t count, loomDataType_t dt, std::mt19937_64& g) {
  const size_t es = dataTypeSize(dt);
  std::vector<char> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    uint64_t r = g();
    char* p = out.data() + i * es;
    if (!isFloat(dt)) {
      std::memcpy(p, &r, es);
      continue;
    }
    const double v = static_cast<double>(static_cast<int64_t>(r % 2001) - 1000) / 64.0;
    if (dt == loomFloat64) {
      std::memcpy(p, &v, 8);
    } else {
      const float f = static_cast<float>(v);
      uint16_t h = 0;
      if (dt == loomFloat32) {
        std::memcpy(p, &f, 4);
        continue;
      }
      h = dt == loomFloat16 ? devk::floatToHalf(f) : devk::floatToBf16(f);
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}

bool sameBits(const std::vector<char>& a, const std::vector<char>& b, loomDataType_t dt,
              size_t* where) {
  const size_t es = dataTypeSize(dt);
  for (size_t i = 0; i < a.size() / es; ++i) {
    if (std::memcmp(&a[i * es], &b[i * es], es) == 0) continue;
    double x = 0, y = 0;  // both NaN counts as equal (payloads may differ)
    if (dt == loomFloat32) {
      float fx, fy;
      std::memcpy(&fx, &a[i * es], 4);
      std::memcpy(&fy, &b[i * es], 4);
      x = fx, y = fy;
    } else if (dt == loomFloat64) {
      std::memcpy(&x, &a[i * es], 8);
      std::memcpy(&y, &b[i * es], 8);
    }
    if (!(std::isnan(x) && std::isnan(y))) {
      *where = i;
      return false;
    }
  }
  return true;
}

TEST_F(FakeCudaKernels, ReductionGivesTheCpuKernelsBits) {
  const DriverApi& a = cu();
  CUstream s = stream();
  std::mt19937_64 g(1234);
  const size_t count = 1029;  // vectors and a tail
  const loomRedOp_t ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
  int cases = 0;
  for (loomDataType_t dt :
       {loomFloat32, loomBfloat16, loomFloat16, loomFloat64, loomInt32, loomUint8, loomInt64}) {
    const size_t es = dataTypeSize(dt), bytes = count * es;
    for (loomRedOp_t op : ops) {
      for (int nsrc : {2, 3}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << dt << " op " << op << " n " << nsrc);
        std::vector<std::vector<char>> in;
        for (int i = 0; i < nsrc; ++i) in.push_back(randomData(count, dt, g));
        // CPU: two buffers at a time, left to right; avg divides once at the end.
        std::vector<char> want = in[0];
        for (int i = 1; i < nsrc; ++i)
          reduceBuffers(want.data(), want.data(), in[size_t(i)].data(), count, dt, op);
        if (op == loomAvg) finishAverage(want.data(), count, dt, nsrc);
        // Device: src 0 in device memory (at an element offset when n is 3: the element path),
        // src 1 in device memory, src 2 in host-mapped memory; dst is src 0 when n is 2.
        const size_t off = nsrc == 3 ? es : 0;
        const CUdeviceptr d0 = alloc(bytes + off) + off, d1 = alloc(bytes);
        char* h2 = hostAlloc<char>(bytes);
        const CUdeviceptr dst = nsrc == 2 ? d0 : alloc(bytes);
        ASSERT_CU_OK(a.cuMemcpyAsync(d0, dev(in[0].data()), bytes, s));
        ASSERT_CU_OK(a.cuMemcpyAsync(d1, dev(in[1].data()), bytes, s));
        if (nsrc == 3) std::memcpy(h2, in[2].data(), bytes);
        devk::ReduceArgs args{};
        args.dst[0] = reinterpret_cast<void*>(dst);
        args.ndst = 1;
        args.src[0] = reinterpret_cast<const void*>(d0);
        args.src[1] = reinterpret_cast<const void*>(d1);
        args.src[2] = h2;
        args.nsrc = nsrc;
        args.divideBy = op == loomAvg ? nsrc : 0;
        args.count = count;
        ASSERT_CU_OK(launch(function(devk::reduceKernelName(dt, op)), s, &args));
        std::vector<char> got(bytes);
        ASSERT_CU_OK(a.cuMemcpyAsync(dev(got.data()), dst, bytes, s));
        ASSERT_CU_OK(a.cuStreamSynchronize(s));
        size_t at = 0;
        EXPECT_TRUE(sameBits(got, want, dt, &at)) << "element " << at;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 70);
  EXPECT_GE(counter("kernels_run"), 70);
}

TEST_F(FakeCudaKernels, ArgumentsAreCopiedAtLaunch) {
  const DriverApi& a = cu();
  CUstream s = stream();
  uint64_t* gate = hostAlloc(64);
  const size_t n = 4096;
  std::vector<float> x(n, 1.5f), y(n, 2.25f), out(n, 0);
  const CUdeviceptr dx = alloc(n * 4), dy = alloc(n * 4), dz = alloc(n * 4);
  ASSERT_CU_OK(a.cuMemcpyAsync(dx, dev(x.data()), n * 4, s));
  ASSERT_CU_OK(a.cuMemcpyAsync(dy, dev(y.data()), n * 4, s));
  ASSERT_CU_OK(a.cuStreamWaitValue64(s, dev(gate), 1, kStreamWaitValueGeq));
  auto* args = new devk::ReduceArgs{};
  args->dst[0] = reinterpret_cast<void*>(dz);
  args->ndst = 1;
  args->src[0] = reinterpret_cast<const void*>(dx);
  args->src[1] = reinterpret_cast<const void*>(dy);
  args->nsrc = 2;
  args->count = n;
  ASSERT_CU_OK(launch(function("loomReduce_f32_sum"), s, args));
  std::memset(args, 0xff, sizeof(*args));  // the caller reuses its memory at once
  delete args;
  __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(out.data()), dz, n * 4, s));
  EXPECT_EQ(out, std::vector<float>(n, 3.75f));
}

TEST_F(FakeCudaKernels, WaitKernelHoldsItsStream) {
  const DriverApi& a = cu();
  CUstream s = stream();
  uint64_t* w = hostAlloc(64);
  devk::WaitFlagArgs args{&w[0], 3};
  ASSERT_CU_OK(launch(function(devk::kWaitFlagKernel), s, &args, 1));
  ASSERT_CU_OK(a.cuStreamWriteValue64(s, dev(&w[1]), 1, 0));
  __atomic_store_n(&w[0], 2, __ATOMIC_RELEASE);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_CU(kErrorNotReady, a.cuStreamQuery(s));
  __atomic_store_n(&w[0], 3, __ATOMIC_RELEASE);
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_EQ(w[1], 1u);
}

TEST_F(FakeCudaKernels, LaunchesAreCheckedAsTheDriverDoes) {
  const DriverApi& a = cu();
  CUfunction f = nullptr;
  EXPECT_CU(kErrorNotFound, a.cuModuleGetFunction(&f, module_, "someOtherKernel"));
  f = function("loomReduce_i32_max");
  CUfunction again = function("loomReduce_i32_max");
  EXPECT_EQ(f, again);
  devk::ReduceArgs args{};
  void* params[] = {&args};
  void* extra[] = {nullptr};
  EXPECT_CU(kErrorNotSupported, a.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, params, extra));
  EXPECT_CU(kErrorInvalidValue,
            a.cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, nullptr, params, nullptr));
  EXPECT_CU(kErrorInvalidValue,
            a.cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  EXPECT_CU(kErrorInvalidValue,
            a.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 1 << 20, nullptr, params, nullptr));
  EXPECT_CU(kErrorInvalidValue,
            a.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  // A function of another context's module, launched on this context's stream.
  std::thread([&] {
    CUcontext c1 = nullptr;
    CUmodule m1 = nullptr;
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c1, 1));
    ASSERT_CU_OK(a.cuCtxSetCurrent(c1));
    ASSERT_CU_OK(a.cuModuleLoadData(&m1, kImage));
    ASSERT_CU_OK(a.cuModuleGetFunction(&again, m1, "loomReduce_i32_max"));
  }).join();
  EXPECT_CU(kErrorInvalidHandle,
            a.cuLaunchKernel(again, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));  // its module goes with it
  EXPECT_CU(kSuccess, a.cuModuleUnload(module_));
  EXPECT_CU(kErrorInvalidHandle,
            a.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  EXPECT_CU(kErrorInvalidHandle, a.cuModuleUnload(module_));
  module_ = nullptr;
}

// Lazy loading as the driver does it: a function not loaded is loaded by its first launch, which
// waits until no stream is blocked in a device-side wait (as cuMemFreeHost does). The real driver
// hangs when that wait only ends after the launch; the emulator gives up after
// LOOMTEST_FAKECUDA_LOAD_WAIT_MS with CUDA_ERROR_NOT_PERMITTED. A function loaded before
// (cuFuncLoad, or asking an attribute) launches at once.
TEST_F(FakeCudaKernels, FirstLaunchLoadsAfterTheContextsWaitingStreams) {
  const DriverApi& a = cu();
  ASSERT_NE(a.cuFuncLoad, nullptr);
  ASSERT_NE(a.cuFuncGetAttribute, nullptr);
  setenv("LOOMTEST_FAKECUDA_LOAD_WAIT_MS", "100", 1);
  CUstream s = stream(), t = stream();
  uint64_t* w = hostAlloc(64);
  const size_t n = 64;
  std::vector<float> x(n, 2.0f);
  const CUdeviceptr dx = alloc(n * 4), dz = alloc(n * 4);
  ASSERT_CU_OK(a.cuMemcpyAsync(dx, dev(x.data()), n * 4, s));
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(dz);
  args.ndst = 1;
  args.src[0] = reinterpret_cast<const void*>(dx);
  args.nsrc = 1;
  args.count = n;
  CUfunction lazy = nullptr, eager = nullptr;
  ASSERT_CU_OK(a.cuModuleGetFunction(&lazy, module_, "loomReduce_f32_max"));
  ASSERT_CU_OK(a.cuModuleGetFunction(&eager, module_, "loomReduce_f32_min"));
  int threads = 0;
  ASSERT_CU_OK(a.cuFuncGetAttribute(&threads, kFuncAttrMaxThreadsPerBlock, eager));
  EXPECT_EQ(threads, 1024);
  const long long lazy0 = counter("lazy_loads");

  ASSERT_CU_OK(a.cuStreamWaitValue64(t, dev(&w[0]), 1, kStreamWaitValueGeq));  // t blocks
  ASSERT_TRUE(eventually([&] { return a.cuStreamQuery(t) == kErrorNotReady; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // t is in its wait
  EXPECT_CU(CUresult(800), launch(lazy, s, &args));  // NOT_PERMITTED; a real driver hangs here
  EXPECT_CU(kSuccess, launch(eager, s, &args));      // loaded: no wait
  __atomic_store_n(&w[0], 1, __ATOMIC_RELEASE);
  ASSERT_CU_OK(a.cuStreamSynchronize(t));
  EXPECT_CU(kSuccess, launch(lazy, s, &args));  // nothing waits: it loads now
  ASSERT_CU_OK(a.cuStreamSynchronize(s));
  EXPECT_EQ(counter("lazy_loads") - lazy0, 1);

  // cuMemFreeHost waits for the device to be idle too.
  void* pinned = nullptr;
  ASSERT_CU_OK(a.cuMemHostAlloc(&pinned, 4096, 0));
  ASSERT_CU_OK(a.cuStreamWaitValue64(t, dev(&w[1]), 1, kStreamWaitValueGeq));
  ASSERT_TRUE(eventually([&] { return a.cuStreamQuery(t) == kErrorNotReady; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_CU(CUresult(800), a.cuMemFreeHost(pinned));
  __atomic_store_n(&w[1], 1, __ATOMIC_RELEASE);
  ASSERT_CU_OK(a.cuStreamSynchronize(t));
  EXPECT_CU(kSuccess, a.cuMemFreeHost(pinned));
  unsetenv("LOOMTEST_FAKECUDA_LOAD_WAIT_MS");
}

// Every entry point may be called from any thread: threads that allocate, copy, reduce, record
// and wait on each other's events, and free, all at once.
TEST_F(FakeCudaKernels, ManyThreadsAtOnce) {
  const DriverApi& a = cu();
  const long long allocs = counter("allocations");
  CUfunction f = function("loomReduce_i64_sum");
  constexpr int kThreads = 4, kRounds = 40;
  constexpr size_t kCount = 3000;
  std::vector<CUevent> events(kThreads);
  for (auto& e : events) ASSERT_CU_OK(a.cuEventCreate(&e, kEventDisableTiming));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      a.cuCtxSetCurrent(ctx_);
      CUstream s = nullptr;
      if (a.cuStreamCreate(&s, kStreamNonBlocking) != kSuccess) return void(++bad);
      std::vector<int64_t> x(kCount), out(kCount);
      for (int r = 0; r < kRounds; ++r) {
        for (size_t i = 0; i < kCount; ++i) x[i] = int64_t(i) * (t + 1) + r;
        CUdeviceptr d = 0;
        if (a.cuMemAlloc(&d, kCount * 8) != kSuccess) return void(++bad);
        a.cuMemcpyAsync(d, reinterpret_cast<CUdeviceptr>(x.data()), kCount * 8, s);
        devk::ReduceArgs args{};
        args.dst[0] = reinterpret_cast<void*>(d);
        args.ndst = 1;
        args.src[0] = args.src[1] = args.src[2] = reinterpret_cast<const void*>(d);
        args.nsrc = 3;
        args.count = kCount;
        void* params[] = {&args};
        if (a.cuLaunchKernel(f, 2, 1, 1, 64, 1, 1, 0, s, params, nullptr) != kSuccess) ++bad;
        a.cuEventRecord(events[size_t(t)], s);
        a.cuStreamWaitEvent(s, events[size_t((t + 1) % kThreads)], 0);
        a.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(out.data()), d, kCount * 8, s);
        for (size_t i = 0; i < kCount; ++i)
          if (out[i] != 3 * x[i]) ++bad;
        if (a.cuMemFree(d) != kSuccess) ++bad;
      }
      if (a.cuStreamDestroy(s) != kSuccess) ++bad;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(counter("allocations"), allocs);
  for (auto& e : events) EXPECT_CU(kSuccess, a.cuEventDestroy(e));
}

class FakeCudaFaults : public FakeCudaKernels {};

TEST_F(FakeCudaFaults, IllegalAddressInAKernelIsStickyAndReleasesWaits) {
  const DriverApi& a = cu();
  CUstream s = stream(), t = stream();
  uint64_t* w = hostAlloc(64);
  const long long faults = counter("faults");
  std::vector<int> pageable(256, 1);  // memory a kernel cannot reach
  const CUdeviceptr d = alloc(1024);
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(d);
  args.ndst = 1;
  args.src[0] = reinterpret_cast<const void*>(d);
  args.src[1] = pageable.data();
  args.nsrc = 2;
  args.count = 256;
  ASSERT_CU_OK(a.cuStreamWaitValue64(t, dev(&w[0]), 1, kStreamWaitValueGeq));  // never released
  ASSERT_CU_OK(a.cuStreamWaitValue64(s, dev(&w[1]), 1, kStreamWaitValueGeq));
  ASSERT_CU_OK(launch(function("loomReduce_i32_sum"), s, &args));  // the call succeeds
  ASSERT_CU_OK(a.cuStreamWriteValue64(s, dev(&w[2]), 1, 0));
  __atomic_store_n(&w[1], 1, __ATOMIC_RELEASE);
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamSynchronize(s));
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamSynchronize(t));  // released, not hung
  EXPECT_EQ(w[2], 0u) << "work after the fault ran";
  EXPECT_EQ(counter("faults"), faults + 1);
  CUdeviceptr p = 0;
  CUstream u = nullptr;
  EXPECT_CU(kErrorIllegalAddress, a.cuMemAlloc(&p, 64));
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamCreate(&u, 0));
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamQuery(s));
  EXPECT_CU(kErrorIllegalAddress, a.cuMemsetD8Async(d, 0, 8, nullptr));
  // Device 1 is not affected; recreating the context clears the error, as on a GPU.
  std::thread([&] {
    CUcontext c1 = nullptr;
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c1, 1));
    ASSERT_CU_OK(a.cuCtxSetCurrent(c1));
    EXPECT_CU(kSuccess, a.cuMemAlloc(&p, 64));
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
  }).join();
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRelease(0));
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&ctx_, 0));
  EXPECT_CU(kSuccess, a.cuMemAlloc(&p, 64));
}

// Another device's memory, as on a real GPU: a kernel that reads it faults until its context has
// peer access (cuCtxEnablePeerAccess, one direction; enabling twice says so), while copies between
// the devices need none; the devices are found by bus id, and a device is not its own peer.
TEST_F(FakeCudaFaults, AnotherDevicesMemoryNeedsPeerAccessInKernels) {
  const DriverApi& a = cu();
  int can = -1;
  ASSERT_CU_OK(a.cuDeviceCanAccessPeer(&can, 0, 1));
  EXPECT_EQ(can, 1);
  ASSERT_CU_OK(a.cuDeviceCanAccessPeer(&can, 0, 0));
  EXPECT_EQ(can, 0);
  CUdevice found = -1;
  ASSERT_CU_OK(a.cuDeviceGetByPCIBusId(&found, "0000:11:00.0"));
  EXPECT_EQ(found, 1);
  EXPECT_CU(101, a.cuDeviceGetByPCIBusId(&found, "0000:99:00.0"));  // CUDA_ERROR_INVALID_DEVICE
  CUcontext other = nullptr;
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&other, 1));
  EXPECT_CU(kErrorInvalidContext, a.cuCtxEnablePeerAccess(ctx_, 0));  // itself
  EXPECT_CU(kErrorInvalidValue, a.cuCtxEnablePeerAccess(other, 1));
  ASSERT_CU_OK(a.cuCtxSetCurrent(other));
  const CUdeviceptr remote = alloc(1024);
  ASSERT_CU_OK(a.cuCtxSetCurrent(ctx_));
  const CUdeviceptr local = alloc(1024);
  CUstream s = stream();
  std::vector<int32_t> ones(256, 1), got(256, 0);
  ASSERT_CU_OK(a.cuMemcpyAsync(remote, dev(ones.data()), 1024, s));  // copies need no access
  ASSERT_CU_OK(a.cuMemcpyAsync(local, remote, 1024, s));
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(local);
  args.ndst = 1;
  args.src[0] = reinterpret_cast<const void*>(local);
  args.src[1] = reinterpret_cast<const void*>(remote);
  args.nsrc = 2;
  args.count = 256;
  ASSERT_CU_OK(a.cuCtxEnablePeerAccess(other, 0));
  EXPECT_CU(kErrorPeerAccessAlreadyEnabled, a.cuCtxEnablePeerAccess(other, 0));
  ASSERT_CU_OK(launch(function("loomReduce_i32_sum"), s, &args));
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(got.data()), local, 1024, s));
  ASSERT_CU_OK(a.cuStreamSynchronize(s));
  EXPECT_EQ(got, std::vector<int32_t>(256, 2));
  // Device 1's context has no access to device 0's memory: its kernel faults.
  std::thread([&] {
    ASSERT_CU_OK(a.cuCtxSetCurrent(other));
    CUstream t = nullptr;
    ASSERT_CU_OK(a.cuStreamCreate(&t, kStreamNonBlocking));
    CUmodule m = nullptr;
    CUfunction f = nullptr;
    ASSERT_CU_OK(a.cuModuleLoadData(&m, kImage));
    ASSERT_CU_OK(a.cuModuleGetFunction(&f, m, "loomReduce_i32_sum"));
    devk::ReduceArgs back = args;
    back.dst[0] = reinterpret_cast<void*>(remote);
    back.ndst = 1;
    back.src[0] = reinterpret_cast<const void*>(remote);
    back.src[1] = reinterpret_cast<const void*>(local);
    void* params[] = {&back};
    ASSERT_CU_OK(a.cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, t, params, nullptr));
    EXPECT_CU(kErrorIllegalAddress, a.cuStreamSynchronize(t));
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));  // the fault ends with the context
  }).join();
}

TEST_F(FakeCudaFaults, PastTheEndOfAnAllocationFaultsAndFreeWaitsForQueuedWork) {
  const DriverApi& a = cu();
  CUstream s = stream();
  const CUdeviceptr d = alloc(1000);
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(d);
  args.ndst = 1;
  args.src[0] = reinterpret_cast<const void*>(d);
  args.nsrc = 1;
  args.count = 1001;  // one byte past the end
  ASSERT_CU_OK(launch(function("loomReduce_u8_max"), s, &args));
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamSynchronize(s));
  // A fresh context: a copy queued behind a wait. cuMemFree synchronizes the device, as the
  // driver's: it returns once another thread has let the stream go and the copy has read the
  // memory.
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRelease(0));
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&ctx_, 0));
  s = stream();
  uint64_t* w = hostAlloc(64);
  const CUdeviceptr e = alloc(4096), f = alloc(4096);
  ASSERT_CU_OK(a.cuMemsetD8Async(e, 7, 4096, s));
  ASSERT_CU_OK(a.cuStreamWaitValue64(s, dev(&w[0]), 1, kStreamWaitValueGeq));
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(&w[1]), e, 8, s));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    __atomic_store_n(&w[0], 1, __ATOMIC_RELEASE);
  });
  EXPECT_CU(kSuccess, a.cuMemFree(e));
  opener.join();
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_EQ(w[1], 0x0707070707070707ull) << "the copy ran after its source was freed";
  // Nobody to let the stream go: a real driver hangs in cuMemFree; the emulator fails it here
  // (LOOMTEST_FAKECUDA_LOAD_WAIT_MS; without it, it aborts the process saying why).
  ASSERT_CU_OK(a.cuStreamWaitValue64(s, dev(&w[2]), 1, kStreamWaitValueGeq));
  ::setenv("LOOMTEST_FAKECUDA_LOAD_WAIT_MS", "100", 1);
  EXPECT_CU(CUresult(800), a.cuMemFree(f));  // NOT_PERMITTED
  ::unsetenv("LOOMTEST_FAKECUDA_LOAD_WAIT_MS");
  __atomic_store_n(&w[2], 1, __ATOMIC_RELEASE);
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_CU(kSuccess, a.cuMemFree(f));
}

TEST_F(FakeCudaFaults, InjectedIllegalAddress) {
  const DriverApi& a = cu();
  CUstream s = stream();
  const CUdeviceptr d = alloc(4096);
  ASSERT_CU_OK(a.cuMemsetD8Async(d, 1, 4096, s));
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(d);
  args.ndst = 1;
  args.src[0] = reinterpret_cast<const void*>(d);
  args.src[1] = reinterpret_cast<const void*>(d);
  args.nsrc = 2;
  args.count = 4096;
  ASSERT_EQ(controls().inject("illegal_address", 1), 0);  // the second launch from now
  EXPECT_EQ(controls().inject("bogus", 0), -1);
  ASSERT_CU_OK(launch(function("loomReduce_u8_sum"), s, &args));
  unsigned char b = 0;
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(&b), d + 7, 1, s));
  EXPECT_EQ(b, 2);  // the first launch ran: 1 + 1
  ASSERT_CU_OK(launch(function("loomReduce_u8_sum"), s, &args));
  EXPECT_CU(kErrorIllegalAddress, a.cuStreamSynchronize(s));
  CUdeviceptr p = 0;
  CUdevice devno = -1;
  EXPECT_CU(kErrorIllegalAddress, a.cuMemAlloc(&p, 64));
  EXPECT_CU(kErrorIllegalAddress, a.cuCtxGetDevice(&devno));
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRelease(0));
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&ctx_, 0));
  EXPECT_CU(kSuccess, a.cuMemAlloc(&p, 64));
}

}  // namespace
}  // namespace loom::testing_fakecuda
