// The emulated CUDA device (tests/device/fake_cuda), loaded through Loom's own loader: devices and
// contexts, device memory the host cannot read, host-mapped memory, streams as asynchronous
// ordered queues, events, stream memory operations, capture, and VMM and dma-buf within one
// process. Kernels and faults: fake_cuda_kernel_test.cc; across processes:
// fake_cuda_process_test.cc.
#include <sys/mman.h>

#include <atomic>
#include <thread>

#include "tests/device/fake_cuda_test_util.h"

namespace loom::testing_fakecuda {
namespace {

using namespace cuda;  // NOLINT(build/namespaces): the driver's constants

TEST(FakeCudaLoader, LoadsThroughLoomsLoader) {
  const Driver& d = fakeDriver();
  ASSERT_TRUE(d.ok()) << d.status.message();
  EXPECT_EQ(d.library, LOOMTEST_FAKECUDA_LIB);
  EXPECT_EQ(d.version, 12080);
  EXPECT_EQ(d.devices, 2);
  // The optional entry points are all there.
  EXPECT_NE(d.api.cuStreamWaitValue64, nullptr);
  EXPECT_NE(d.api.cuIpcOpenMemHandle, nullptr);
  EXPECT_NE(d.api.cuMemCreate, nullptr);
  EXPECT_NE(d.api.cuMemGetHandleForAddressRange, nullptr);
  EXPECT_NE(d.api.cuStreamGetCaptureInfo, nullptr);
  EXPECT_NE(d.api.cuStreamGetCaptureInfo3, nullptr);
  EXPECT_NE(d.api.cuThreadExchangeStreamCaptureMode, nullptr);
  EXPECT_NE(d.api.cuUserObjectCreate, nullptr);
  EXPECT_NE(d.api.cuGraphRetainUserObject, nullptr);
}

TEST(FakeCudaLoader, DevicesAreSm90) {
  const DriverApi& a = cu();
  ASSERT_TRUE(fakeDriver().ok());
  struct Want {
    int attr;
    int value;
  };
  for (Want w : {Want{kAttrComputeCapabilityMajor, 9},
                 {kAttrComputeCapabilityMinor, 0},
                 {kAttrMultiprocessorCount, 132},
                 {kAttrUnifiedAddressing, 1},
                 {kAttrVmmSupported, 1},
                 {kAttrPosixFdHandleSupported, 1},
                 {kAttrStreamMemOps64, 1},
                 {kAttrDmaBufSupported, 1},
                 {kAttrPciBusId, 0x11}}) {
    int v = -1;
    EXPECT_CU(kSuccess, a.cuDeviceGetAttribute(&v, w.attr, 1));
    EXPECT_EQ(v, w.value) << "attribute " << w.attr;
  }
  int v = 0;
  EXPECT_CU(kErrorInvalidValue, a.cuDeviceGetAttribute(&v, 100000, 0));
  EXPECT_CU(101, a.cuDeviceGetAttribute(&v, kAttrPciBusId, 2));  // CUDA_ERROR_INVALID_DEVICE
  char name[64], bus[64], small[6];
  EXPECT_CU(kSuccess, a.cuDeviceGetName(name, sizeof(name), 0));
  EXPECT_STREQ(name, "Loom emulated GPU");
  EXPECT_CU(kSuccess, a.cuDeviceGetName(small, sizeof(small), 0));
  EXPECT_STREQ(small, "Loom ");  // truncated, as the driver does
  EXPECT_CU(kSuccess, a.cuDeviceGetPCIBusId(bus, sizeof(bus), 0));
  EXPECT_STREQ(bus, "0000:10:00.0");
  EXPECT_CU(kSuccess, a.cuDeviceGetPCIBusId(bus, sizeof(bus), 1));
  EXPECT_STREQ(bus, "0000:11:00.0");
  CUdevice dev = -1;
  EXPECT_CU(101, a.cuDeviceGet(&dev, 2));
}

TEST(FakeCudaLoader, EveryCodeHasANameAndText) {
  ASSERT_TRUE(fakeDriver().ok());
  for (CUresult rc : {0,   1,   2,   3,   4,   46,  100, 101, 200, 201, 205, 400,
                      500, 600, 700, 712, 713, 719, 800, 801, 900, 901, 999}) {
    const char* name = nullptr;
    const char* text = nullptr;
    EXPECT_CU(kSuccess, cu().cuGetErrorName(rc, &name));
    EXPECT_CU(kSuccess, cu().cuGetErrorString(rc, &text));
    ASSERT_NE(name, nullptr);
    ASSERT_NE(text, nullptr);
    EXPECT_EQ(std::string(name).rfind("CUDA_", 0), 0u) << name;
  }
  const char* name = "x";
  EXPECT_CU(kErrorInvalidValue, cu().cuGetErrorName(12345, &name));
  EXPECT_EQ(name, nullptr);
  // Loom's message for a code names it, with the driver's text.
  const std::string msg = cudaError(kErrorIllegalAddress, "cuTest").message();
  EXPECT_NE(msg.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("illegal memory access"), std::string::npos) << msg;
}

TEST(FakeCudaContext, CallsNeedACurrentContext) {
  const DriverApi& a = cu();
  ASSERT_TRUE(fakeDriver().ok());
  std::thread([&] {
    CUcontext cur = reinterpret_cast<CUcontext>(1);
    EXPECT_CU(kSuccess, a.cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, nullptr);
    CUdeviceptr p = 0;
    CUstream s = nullptr;
    CUdevice d = 0;
    EXPECT_CU(kErrorInvalidContext, a.cuMemAlloc(&p, 64));
    EXPECT_CU(kErrorInvalidContext, a.cuStreamCreate(&s, 0));
    EXPECT_CU(kErrorInvalidContext, a.cuCtxGetDevice(&d));
    EXPECT_CU(kErrorInvalidContext, a.cuStreamSynchronize(nullptr));
    EXPECT_CU(kErrorInvalidContext, a.cuCtxSetCurrent(reinterpret_cast<CUcontext>(&d)));
  }).join();
}

TEST(FakeCudaContext, PrimaryContextIsCountedAndDestroyedByTheLastRelease) {
  const DriverApi& a = cu();
  ASSERT_TRUE(fakeDriver().ok());
  std::thread([&] {
    const long long allocs = counter("allocations");
    CUcontext c1 = nullptr, c2 = nullptr;
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c1, 1));
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c2, 1));
    EXPECT_EQ(c1, c2);
    ASSERT_CU_OK(a.cuCtxSetCurrent(c1));
    CUdevice d = -1;
    EXPECT_CU(kSuccess, a.cuCtxGetDevice(&d));
    EXPECT_EQ(d, 1);
    CUdeviceptr p = 0;
    ASSERT_CU_OK(a.cuMemAlloc(&p, 1000));
    int ordinal = -1;
    EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&ordinal, kPointerAttrDeviceOrdinal, p));
    EXPECT_EQ(ordinal, 1);
    EXPECT_EQ(counter("allocations"), allocs + 1);
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
    EXPECT_EQ(counter("allocations"), allocs + 1);  // still retained once
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
    EXPECT_EQ(counter("allocations"), allocs);  // the context and its memory are gone
    EXPECT_CU(kErrorInvalidContext, a.cuDevicePrimaryCtxRelease(1));
    EXPECT_CU(kErrorInvalidContext, a.cuMemAlloc(&p, 64));  // current, but destroyed
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c2, 1));
    EXPECT_EQ(c2, c1);  // the same handle, a fresh context
    EXPECT_CU(kSuccess, a.cuMemAlloc(&p, 64));
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
    a.cuCtxSetCurrent(nullptr);
  }).join();
}

class FakeCudaMemory : public FakeCudaTest {};

TEST_F(FakeCudaMemory, DeviceMemoryAttributesAndCopies) {
  const DriverApi& a = cu();
  const long long allocs = counter("allocations");
  const CUdeviceptr p = alloc(3 << 20);
  ASSERT_NE(p, 0u);
  EXPECT_EQ(p % (2 << 20), 0u);
  EXPECT_EQ(counter("allocations"), allocs + 1);
  const CUdeviceptr mid = p + 4096 + 3;
  unsigned type = 0;
  CUcontext c = nullptr;
  CUdeviceptr start = 0, same = 0;
  size_t size = 0;
  int ordinal = -1;
  unsigned managed = 7;
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, mid));
  EXPECT_EQ(type, kMemoryTypeDevice);
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&c, kPointerAttrContext, mid));
  EXPECT_EQ(c, ctx_);
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&ordinal, kPointerAttrDeviceOrdinal, mid));
  EXPECT_EQ(ordinal, 0);
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&start, kPointerAttrRangeStart, mid));
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&size, kPointerAttrRangeSize, mid));
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, size_t(3 << 20));
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&managed, kPointerAttrIsManaged, mid));
  EXPECT_EQ(managed, 0u);
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&same, kPointerAttrDevicePointer, mid));
  EXPECT_EQ(same, mid);
  EXPECT_CU(kSuccess, a.cuMemGetAddressRange(&start, &size, mid));
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, size_t(3 << 20));
  // Several at once; a pointer the driver does not know gives zeros, not an error.
  unsigned long long id = 0, id2 = 0;  // NOLINT: the driver's type
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&id, kPointerAttrBufferId, p));
  EXPECT_NE(id, 0u);
  constexpr int kHostPointer = 4;  // CU_POINTER_ATTRIBUTE_HOST_POINTER
  int attrs[] = {kPointerAttrMemoryType, kPointerAttrDeviceOrdinal, kPointerAttrBufferId,
                 kHostPointer};
  void* host = &type;
  type = 0;
  ordinal = -1;
  void* data[] = {&type, &ordinal, &id2, &host};
  EXPECT_CU(kSuccess, a.cuPointerGetAttributes(4, attrs, data, mid));
  EXPECT_EQ(type, kMemoryTypeDevice);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(id2, id);
  EXPECT_EQ(host, nullptr);  // device memory has no host pointer: zero
  std::vector<char> unknown(64);
  type = 7;
  EXPECT_CU(kSuccess, a.cuPointerGetAttributes(4, attrs, data, dev(unknown.data())));
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(id2, 0u);
  EXPECT_CU(kErrorInvalidValue, a.cuPointerGetAttributes(0, attrs, data, mid));

  // Host -> device -> device -> host, at offsets, on the NULL stream.
  std::vector<unsigned char> in(100000), out(100000, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  const CUdeviceptr q = alloc(in.size() + 17);
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(mid, dev(in.data()), in.size(), nullptr));
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(q + 17, mid, in.size(), nullptr));
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(dev(out.data()), q + 17, in.size(), nullptr));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(nullptr));
  EXPECT_EQ(in, out);
  EXPECT_CU(kSuccess, a.cuMemsetD8Async(q, 0x5a, 17, nullptr));
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(dev(out.data()), q, 18, nullptr));
  EXPECT_EQ(out[16], 0x5a);  // copies into pageable memory are done on return
  EXPECT_EQ(out[17], in[0]);

  // Ranges past an allocation's end, unknown and freed pointers.
  EXPECT_CU(kErrorInvalidValue, a.cuMemcpyAsync(dev(out.data()), q + 17, in.size() + 1, nullptr));
  EXPECT_CU(kErrorInvalidValue, a.cuMemsetD8Async(p + (3 << 20), 0, 1, nullptr));
  EXPECT_CU(kErrorInvalidValue, a.cuMemFree(mid));
  EXPECT_CU(kSuccess, a.cuMemFree(p));
  EXPECT_CU(kErrorInvalidValue, a.cuMemFree(p));
  EXPECT_CU(kErrorInvalidValue, a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, p));
  EXPECT_CU(kErrorNotFound, a.cuMemGetAddressRange(&start, &size, p));
  std::vector<char> plain(64);
  EXPECT_CU(kErrorInvalidValue,
            a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, dev(plain.data())));
  EXPECT_CU(kErrorInvalidValue, a.cuMemsetD8Async(dev(plain.data()), 0, 1, nullptr));
  CUdeviceptr big = 0;
  EXPECT_CU(kErrorOutOfMemory, a.cuMemAlloc(&big, size_t(17) << 30));
  EXPECT_CU(kErrorInvalidValue, a.cuMemAlloc(&big, 0));
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

// Reads (or writes) the bytes at a device address from host code.
void touch(CUdeviceptr p, bool write) {
  volatile char* q = reinterpret_cast<volatile char*>(p);
  if (write) *q = 1;
  std::fprintf(stderr, "read %d\n", *q);
}

TEST_F(FakeCudaMemory, HostDereferenceOfDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUdeviceptr p = alloc(4096);
  ASSERT_NE(p, 0u);
  // Under ASan its SEGV handler reports the access and exits with an error (unless
  // ASAN_OPTIONS has handle_segv=0); otherwise the signal kills the process.
  const char* asanOptions = std::getenv("ASAN_OPTIONS");
  if (kAsan && !(asanOptions && std::strstr(asanOptions, "handle_segv=0"))) {
    EXPECT_DEATH(touch(p + 100, false), "SEGV");
    EXPECT_DEATH(touch(p, true), "SEGV");
  } else {
    EXPECT_EXIT(touch(p + 100, false), ::testing::KilledBySignal(SIGSEGV), "");
    EXPECT_EXIT(touch(p, true), ::testing::KilledBySignal(SIGSEGV), "");
  }
}

TEST_F(FakeCudaMemory, HostAllocatedAndRegisteredMemory) {
  const DriverApi& a = cu();
  auto* h = hostAlloc<char>(10000);
  ASSERT_NE(h, nullptr);
  h[9999] = 3;  // ordinary host memory
  CUdeviceptr d = 0;
  unsigned type = 0;
  CUcontext c = nullptr;
  EXPECT_CU(kSuccess, a.cuMemHostGetDevicePointer(&d, h + 10, 0));
  EXPECT_EQ(d, dev(h + 10));  // unified addressing
  EXPECT_CU(kErrorInvalidValue, a.cuMemHostGetDevicePointer(&d, h, 1));
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, dev(h + 5)));
  EXPECT_EQ(type, kMemoryTypeHost);
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&c, kPointerAttrContext, dev(h)));
  EXPECT_EQ(c, ctx_);

  std::vector<uint64_t> plain(512, 0);
  EXPECT_CU(kErrorInvalidValue, a.cuMemHostGetDevicePointer(&d, plain.data(), 0));
  EXPECT_CU(kSuccess, a.cuMemHostRegister(plain.data(), 4096, kMemHostAllocDeviceMap));
  EXPECT_CU(712, a.cuMemHostRegister(plain.data() + 8, 64, 0));  // ALREADY_REGISTERED
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, dev(&plain[3])));
  EXPECT_EQ(type, kMemoryTypeHost);
  EXPECT_CU(kSuccess, a.cuMemHostGetDevicePointer(&d, &plain[3], 0));
  EXPECT_EQ(d, dev(&plain[3]));
  // Registered memory takes stream memory operations.
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(nullptr, dev(&plain[7]), 42, 0));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(nullptr));
  EXPECT_EQ(plain[7], 42u);
  EXPECT_CU(kSuccess, a.cuMemHostUnregister(plain.data()));
  EXPECT_CU(713, a.cuMemHostUnregister(plain.data()));  // NOT_REGISTERED
  EXPECT_CU(kErrorInvalidValue, a.cuStreamWriteValue64(nullptr, dev(&plain[7]), 1, 0));

  void* gone = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ::munmap(gone, 8192);
  EXPECT_CU(kErrorInvalidValue, a.cuMemHostRegister(gone, 8192, 0));  // nothing mapped there
  EXPECT_CU(kSuccess, a.cuMemFreeHost(h));
  EXPECT_CU(kErrorInvalidValue, a.cuMemFreeHost(h));
}

class FakeCudaStreams : public FakeCudaTest {};

TEST_F(FakeCudaStreams, WorkRunsInOrderAfterTheCallReturns) {
  const DriverApi& a = cu();
  CUstream s = stream();
  uint64_t* w = hostAlloc(4096);  // w[0]: the gate; w[1], w[2]: written behind it
  const CUdeviceptr d = alloc(64);
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[0]), 1, kStreamWaitValueGeq));
  EXPECT_CU(kSuccess, a.cuMemsetD8Async(d, 0x11, 64, s));
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(dev(&w[2]), d, 8, s));
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(s, dev(&w[1]), 7, 0));
  std::vector<int> order;
  struct Note {
    std::vector<int>* order;
    int i;
  };
  std::vector<Note> notes;
  notes.reserve(20);
  for (int i = 0; i < 20; ++i) {
    notes.push_back({&order, i});
    EXPECT_CU(kSuccess, a.cuLaunchHostFunc(
                            s,
                            [](void* p) {
                              auto* n = static_cast<Note*>(p);
                              n->order->push_back(n->i);
                            },
                            &notes.back()));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_CU(kErrorNotReady, a.cuStreamQuery(s));
  EXPECT_EQ(__atomic_load_n(&w[1], __ATOMIC_ACQUIRE), 0u) << "work ran before the wait";
  EXPECT_GE(counter("pending_ops"), 24);
  __atomic_store_n(&w[0], 1, __ATOMIC_RELEASE);  // the host releases the stream
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_CU(kSuccess, a.cuStreamQuery(s));
  EXPECT_EQ(w[1], 7u);
  EXPECT_EQ(w[2], 0x1111111111111111ull);
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_CU(kSuccess, a.cuStreamDestroy(s));
  EXPECT_CU(kErrorInvalidHandle, a.cuStreamDestroy(s));
  EXPECT_CU(kErrorInvalidHandle, a.cuStreamDestroy(nullptr));
}

TEST_F(FakeCudaStreams, WaitValueKindsOnHostAndDeviceMemory) {
  const DriverApi& a = cu();
  CUstream s = stream(), t = stream();
  uint64_t* w = hostAlloc(64);
  const CUdeviceptr word = alloc(8);
  EXPECT_CU(kSuccess, a.cuMemsetD8Async(word, 0, 8, t));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(t));
  // s waits on a device word that stream t writes; then EQ, AND and NOR on host memory.
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, word, 5, kStreamWaitValueGeq));
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[0]), 3, 1));        // EQ
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[1]), 0x10, 2));     // AND
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[2]), ~0x8ull, 3));  // NOR
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(s, dev(&w[3]), 1, 0));
  auto passed = [&] { return __atomic_load_n(&w[3], __ATOMIC_ACQUIRE) == 1; };
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(t, word, 4, 0));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(t));
  __atomic_store_n(&w[0], 3, __ATOMIC_RELEASE);
  __atomic_store_n(&w[1], 0x10, __ATOMIC_RELEASE);
  w[2] = ~0ull;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(passed()) << "4 >= 5";
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(t, word, 1ull << 40, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(passed()) << "NOR of all ones";
  __atomic_store_n(&w[2], 0ull, __ATOMIC_RELEASE);  // ~(0 | ~8) = 8: passes
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_TRUE(passed());
  EXPECT_GE(counter("memop_waits"), 4);
  EXPECT_CU(kErrorInvalidValue, a.cuStreamWaitValue64(s, dev(&w[0]) + 4, 1, 0));  // unaligned
  std::vector<uint64_t> plain(4);
  EXPECT_CU(kErrorInvalidValue, a.cuStreamWaitValue64(s, dev(plain.data()), 1, 0));  // pageable
  EXPECT_CU(kErrorInvalidValue, a.cuStreamWaitValue64(s, dev(&w[0]), 1, 7));         // kind
}

TEST_F(FakeCudaStreams, EventsOrderStreams) {
  const DriverApi& a = cu();
  CUstream s = stream(), t = stream();
  CUevent e = nullptr, never = nullptr;
  ASSERT_CU_OK(a.cuEventCreate(&e, kEventDisableTiming));
  ASSERT_CU_OK(a.cuEventCreate(&never, 0));
  EXPECT_CU(kSuccess, a.cuEventQuery(never));  // never recorded: complete
  EXPECT_CU(kSuccess, a.cuEventSynchronize(never));
  uint64_t* w = hostAlloc(64);
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[0]), 1, kStreamWaitValueGeq));
  EXPECT_CU(kSuccess, a.cuEventRecord(e, s));
  EXPECT_CU(kSuccess, a.cuStreamWaitEvent(t, e, 0));
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(t, dev(&w[1]), 9, 0));
  EXPECT_CU(kSuccess, a.cuStreamWaitEvent(t, never, 0));  // no record before it: no wait
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_CU(kErrorNotReady, a.cuEventQuery(e));
  EXPECT_CU(kErrorNotReady, a.cuStreamQuery(t));
  EXPECT_EQ(__atomic_load_n(&w[1], __ATOMIC_ACQUIRE), 0u);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    __atomic_store_n(&w[0], 1, __ATOMIC_RELEASE);
  });
  EXPECT_CU(kSuccess, a.cuEventSynchronize(e));  // blocks until the host releases s
  release.join();
  EXPECT_CU(kSuccess, a.cuEventQuery(e));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(t));
  EXPECT_EQ(w[1], 9u);
  // Stream and event of two different contexts: the driver refuses the record.
  std::thread([&] {
    CUcontext c1 = nullptr;
    CUstream other = nullptr;
    ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c1, 1));
    ASSERT_CU_OK(a.cuCtxSetCurrent(c1));
    ASSERT_CU_OK(a.cuStreamCreate(&other, 0));
    EXPECT_CU(kErrorInvalidHandle, a.cuEventRecord(e, other));
    EXPECT_CU(kSuccess, a.cuStreamWaitEvent(other, e, 0));  // waits across contexts are fine
    EXPECT_CU(kSuccess, a.cuStreamSynchronize(other));
    EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
    a.cuCtxSetCurrent(nullptr);
  }).join();
  EXPECT_CU(kSuccess, a.cuEventDestroy(e));
  EXPECT_CU(kErrorInvalidHandle, a.cuEventQuery(e));
}

TEST_F(FakeCudaStreams, StreamOfAnotherContextAndHostFunctions) {
  const DriverApi& a = cu();
  CUcontext c1 = nullptr;
  CUstream other = nullptr;
  ASSERT_CU_OK(a.cuDevicePrimaryCtxRetain(&c1, 1));
  ASSERT_CU_OK(a.cuCtxSetCurrent(c1));
  ASSERT_CU_OK(a.cuStreamCreate(&other, 0));
  ASSERT_CU_OK(a.cuCtxSetCurrent(ctx_));
  CUcontext got = nullptr;
  EXPECT_CU(kSuccess, a.cuStreamGetCtx(other, &got));
  EXPECT_EQ(got, c1);
  const CUdeviceptr d = alloc(64);
  EXPECT_CU(kErrorInvalidHandle, a.cuMemsetD8Async(d, 0, 64, other));
  EXPECT_CU(kSuccess, a.cuStreamGetCtx(nullptr, &got));
  EXPECT_EQ(got, ctx_);
  // A host function may not call the driver.
  static std::atomic<int> inside{-1};
  EXPECT_CU(kSuccess, a.cuLaunchHostFunc(
                          nullptr,
                          [](void*) {
                            CUdeviceptr p = 0;
                            inside = cu().cuMemAlloc(&p, 8);
                          },
                          nullptr));
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(nullptr));
  EXPECT_EQ(inside.load(), 800);  // CUDA_ERROR_NOT_PERMITTED
  EXPECT_CU(kSuccess, a.cuDevicePrimaryCtxRelease(1));
}

TEST_F(FakeCudaStreams, DestroyingAStreamBlockedInAWaitReturns) {
  const DriverApi& a = cu();
  const long long workers = counter("workers"), abandoned = counter("abandoned_ops");
  CUstream s = stream();
  uint64_t* w = hostAlloc(64);
  EXPECT_CU(kSuccess, a.cuStreamWaitValue64(s, dev(&w[0]), 1, kStreamWaitValueGeq));
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(s, dev(&w[1]), 1, 0));
  EXPECT_EQ(counter("workers"), workers + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_CU(kSuccess, a.cuStreamDestroy(s));
  EXPECT_TRUE(eventually([&] { return counter("workers") == workers; }))
      << "the worker of a destroyed stream still waits";
  EXPECT_EQ(counter("abandoned_ops"), abandoned + 2);
  EXPECT_EQ(w[1], 0u);
}

TEST_F(FakeCudaStreams, CaptureIsReportedAndNeverSilent) {
  const DriverApi& a = cu();
  CUstream s = stream();
  uint64_t* w = hostAlloc(64);
  int status = -1;
  EXPECT_CU(kSuccess, a.cuStreamIsCapturing(s, &status));
  EXPECT_EQ(status, kCaptureStatusNone);
  ASSERT_EQ(controls().setCapturing(s, 1), 0);
  EXPECT_CU(kSuccess, a.cuStreamIsCapturing(s, &status));
  EXPECT_EQ(status, kCaptureStatusActive);
  EXPECT_CU(kSuccess, a.cuStreamWriteValue64(s, dev(&w[0]), 5, 0));  // captured, not run
  EXPECT_CU(kErrorStreamCaptureUnsupported, a.cuStreamSynchronize(s));
  EXPECT_CU(kSuccess, a.cuStreamIsCapturing(s, &status));
  EXPECT_EQ(status, 2);  // invalidated
  EXPECT_CU(901, a.cuStreamWriteValue64(s, dev(&w[0]), 5, 0));
  ASSERT_EQ(controls().setCapturing(s, 0), 0);
  EXPECT_CU(kSuccess, a.cuStreamSynchronize(s));
  EXPECT_EQ(w[0], 0u);
  EXPECT_GE(counter("captured_ops"), 1);
}

// The capture and graph entry points (the application's, in Loom's table for loom-perf -G).
struct Graphs {
  decltype(DriverApi::cuStreamBeginCapture) begin = cu().cuStreamBeginCapture;
  decltype(DriverApi::cuStreamEndCapture) end = cu().cuStreamEndCapture;
  decltype(DriverApi::cuGraphInstantiate) instantiate = cu().cuGraphInstantiate;
  decltype(DriverApi::cuGraphLaunch) launch = cu().cuGraphLaunch;
  decltype(DriverApi::cuGraphExecDestroy) execDestroy = cu().cuGraphExecDestroy;
  decltype(DriverApi::cuGraphDestroy) graphDestroy = cu().cuGraphDestroy;
};

struct Counted {
  static void bump(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }
};

// A capture records the stream's work without running it; each launch of the executable graph
// runs it again, in order, on the launch stream; a user object the graph owns is destroyed once
// the graph and its executable graph are gone and the launches have run (its destructor may not
// call the driver).
TEST_F(FakeCudaStreams, CapturedWorkRunsAtEachLaunchAndUserObjectsGoWithTheGraph) {
  const DriverApi& a = cu();
  Graphs g;
  ASSERT_TRUE(g.begin && g.end && g.instantiate && g.launch && g.execDestroy && g.graphDestroy);
  CUstream s = stream(), other = stream();
  uint64_t* w = hostAlloc(64);
  std::atomic<int> ran{0}, destroyed{0};
  EXPECT_CU(kErrorStreamCaptureUnsupported, g.begin(nullptr, 0));  // the NULL stream
  ASSERT_CU_OK(g.begin(s, 1));
  EXPECT_CU(401, g.begin(s, 1));  // CUDA_ERROR_ILLEGAL_STATE: already capturing
  ASSERT_CU_OK(a.cuLaunchHostFunc(s, &Counted::bump, &ran));
  ASSERT_CU_OK(a.cuStreamWriteValue64(s, dev(&w[0]), 7, 0));
  int status = -1;
  uint64_t id = 0;
  cuda::CUgraph graph = nullptr;
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo(s, &status, &id, &graph, nullptr, nullptr));
  EXPECT_EQ(status, kCaptureStatusActive);
  EXPECT_NE(id, 0u);
  ASSERT_NE(graph, nullptr);
  cuda::CUgraph again = nullptr;
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo3(s, &status, nullptr, &again, nullptr, nullptr, nullptr));
  EXPECT_EQ(again, graph);
  cuda::CUuserObject obj = nullptr;
  EXPECT_CU(kErrorInvalidValue, a.cuUserObjectCreate(&obj, &destroyed, &Counted::bump, 1, 0));
  ASSERT_CU_OK(
      a.cuUserObjectCreate(&obj, &destroyed, &Counted::bump, 1, kUserObjectNoDestructorSync));
  ASSERT_CU_OK(a.cuGraphRetainUserObject(graph, obj, 1, kGraphUserObjectMove));
  cuda::CUgraph ended = nullptr;
  ASSERT_CU_OK(g.end(s, &ended));
  EXPECT_EQ(ended, graph);
  EXPECT_EQ(ran.load(), 0) << "captured work ran";
  EXPECT_EQ(w[0], 0u);
  cuda::CUgraphExec exec = nullptr;
  ASSERT_CU_OK(g.instantiate(&exec, ended, 0));
  ASSERT_CU_OK(g.graphDestroy(ended));
  EXPECT_EQ(destroyed.load(), 0) << "the executable graph holds the user object";
  for (int i = 1; i <= 3; ++i) {
    w[0] = 0;
    ASSERT_CU_OK(g.launch(exec, i % 2 ? s : other));
    ASSERT_CU_OK(a.cuStreamSynchronize(i % 2 ? s : other));
    EXPECT_EQ(ran.load(), i);
    EXPECT_EQ(w[0], 7u);
  }
  EXPECT_EQ(counter("graph_launches") >= 3, true);
  ASSERT_CU_OK(g.execDestroy(exec));
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_CU(kErrorInvalidValue, a.cuUserObjectRelease(obj, 1));  // gone with its last reference
  EXPECT_CU(kErrorInvalidValue, g.launch(exec, s));
}

// Forks and joins through events, as PyTorch's process groups use them: a stream that waits on an
// event recorded in a capture joins it (its work goes to the graph, after what the event
// follows), and the origin waits for it again through an event of the fork before the capture
// ends; a fork left unjoined fails the capture (CUDA_ERROR_STREAM_CAPTURE_UNJOINED), only the
// origin ends it (UNMATCHED), and a stream of another capture cannot wait on it (MERGE).
TEST_F(FakeCudaStreams, StreamsJoinACaptureThroughEvents) {
  const DriverApi& a = cu();
  Graphs g;
  CUstream s = stream(), side = stream(), other = stream();
  CUevent forked = nullptr, joined = nullptr;
  ASSERT_CU_OK(a.cuEventCreate(&forked, kEventDisableTiming));
  ASSERT_CU_OK(a.cuEventCreate(&joined, kEventDisableTiming));
  uint64_t* w = hostAlloc(64);
  ASSERT_CU_OK(g.begin(s, 0));
  ASSERT_CU_OK(a.cuStreamWriteValue64(s, dev(&w[0]), 1, 0));
  ASSERT_CU_OK(a.cuEventRecord(forked, s));
  ASSERT_CU_OK(a.cuStreamWaitEvent(side, forked, 0));         // side joins the capture
  ASSERT_CU_OK(a.cuStreamWriteValue64(s, dev(&w[2]), 5, 0));  // the side does not wait for it
  int status = -1;
  cuda::CUgraph graph = nullptr, sideGraph = nullptr;
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo(s, &status, nullptr, &graph, nullptr, nullptr));
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo(side, &status, nullptr, &sideGraph, nullptr, nullptr));
  EXPECT_EQ(status, kCaptureStatusActive);
  EXPECT_EQ(sideGraph, graph);
  // The side's work: w[1] = w[0] + 1 as the graph runs (a host function reads what came first),
  // and w[3] = w[2], which the origin writes with nothing making the side wait for it: a launch
  // runs the fork as early as its dependencies allow, so it reads 0.
  struct Step {
    static void run(void* p) {
      auto* v = static_cast<uint64_t*>(p);
      v[1] = v[0] + 1;
      v[3] = v[2];
    }
  };
  ASSERT_CU_OK(a.cuLaunchHostFunc(side, &Step::run, w));
  cuda::CUgraph ended = nullptr;
  EXPECT_CU(903, g.end(side, &ended));  // CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: a fork
  ASSERT_CU_OK(a.cuEventRecord(joined, side));
  ASSERT_CU_OK(a.cuStreamWaitEvent(s, joined, 0));  // the origin joins it back
  ASSERT_CU_OK(g.end(s, &ended));
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo(side, &status, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(status, kCaptureStatusNone) << "a fork leaves the capture with it";
  EXPECT_EQ(w[0] + w[1], 0u) << "captured work ran";
  cuda::CUgraphExec exec = nullptr;
  ASSERT_CU_OK(g.instantiate(&exec, ended, 0));
  for (int i = 0; i < 2; ++i) {
    w[0] = w[1] = w[2] = w[3] = 0;
    ASSERT_CU_OK(g.launch(exec, other));
    ASSERT_CU_OK(a.cuStreamSynchronize(other));
    EXPECT_EQ(w[0], 1u);
    EXPECT_EQ(w[1], 2u) << "the fork's work ran after what its event followed";
    EXPECT_EQ(w[2], 5u);
    EXPECT_EQ(w[3], 0u) << "the fork waited for work it has no dependency on";
  }
  ASSERT_CU_OK(g.execDestroy(exec));
  ASSERT_CU_OK(g.graphDestroy(ended));

  // A fork not joined back fails the capture, and leaves it.
  ASSERT_CU_OK(g.begin(s, 0));
  ASSERT_CU_OK(a.cuEventRecord(forked, s));
  ASSERT_CU_OK(a.cuStreamWaitEvent(side, forked, 0));
  ASSERT_CU_OK(a.cuLaunchHostFunc(side, &Step::run, w));
  EXPECT_CU(904, g.end(s, &ended));  // CUDA_ERROR_STREAM_CAPTURE_UNJOINED
  EXPECT_EQ(ended, nullptr);
  ASSERT_CU_OK(a.cuStreamGetCaptureInfo(side, &status, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(status, kCaptureStatusNone);

  // Two captures do not merge.
  ASSERT_CU_OK(g.begin(s, 2));
  ASSERT_CU_OK(a.cuEventRecord(forked, s));
  ASSERT_CU_OK(g.begin(other, 2));
  EXPECT_CU(902, a.cuStreamWaitEvent(other, forked, 0));  // CUDA_ERROR_STREAM_CAPTURE_MERGE
  ASSERT_CU_OK(g.end(other, &ended));
  ASSERT_CU_OK(g.graphDestroy(ended));
  ASSERT_CU_OK(g.end(s, &ended));
  ASSERT_CU_OK(g.graphDestroy(ended));
  // After the capture an event recorded in it is waited on as any other (nothing to wait for).
  ASSERT_CU_OK(a.cuStreamWaitEvent(side, forked, 0));
  ASSERT_CU_OK(a.cuStreamSynchronize(side));
  ASSERT_CU_OK(a.cuEventDestroy(forked));
  ASSERT_CU_OK(a.cuEventDestroy(joined));
}

// A fork joined into another fork is joined when the origin waits for that one afterwards: the
// driver follows the graph's dependencies, not the streams. The second fork's work follows the
// first's at each launch, since the event it waited on stood for everything the first depended on.
TEST_F(FakeCudaStreams, AForkJoinsThroughAnotherFork) {
  const DriverApi& a = cu();
  Graphs g;
  CUstream s = stream(), b = stream(), c = stream(), other = stream();
  CUevent ev[4] = {};
  for (CUevent& e : ev) ASSERT_CU_OK(a.cuEventCreate(&e, kEventDisableTiming));
  uint64_t* w = hostAlloc(64);
  struct Step {
    static void run(void* p) {
      auto* v = static_cast<uint64_t*>(p);
      v[1] = v[0] + 1;
    }
  };
  // b forks from s, c from b; c's work; b waits for c (no work of its own after); s waits for b.
  auto capture = [&](bool joinB, bool recordBAfterWait, cuda::CUgraph* ended) {
    EXPECT_CU(kSuccess, g.begin(s, 0));
    EXPECT_CU(kSuccess, a.cuEventRecord(ev[0], s));
    EXPECT_CU(kSuccess, a.cuStreamWaitEvent(b, ev[0], 0));
    EXPECT_CU(kSuccess, a.cuEventRecord(ev[1], b));
    EXPECT_CU(kSuccess, a.cuStreamWaitEvent(c, ev[1], 0));
    EXPECT_CU(kSuccess, a.cuStreamWriteValue64(c, dev(&w[0]), 7, 0));
    EXPECT_CU(kSuccess, a.cuEventRecord(ev[2], c));
    if (!recordBAfterWait) EXPECT_CU(kSuccess, a.cuEventRecord(ev[3], b));
    EXPECT_CU(kSuccess, a.cuStreamWaitEvent(b, ev[2], 0));
    if (recordBAfterWait) EXPECT_CU(kSuccess, a.cuEventRecord(ev[3], b));
    if (joinB) EXPECT_CU(kSuccess, a.cuStreamWaitEvent(s, ev[3], 0));
    EXPECT_CU(kSuccess, a.cuLaunchHostFunc(s, &Step::run, w));
    return g.end(s, ended);
  };
  cuda::CUgraph ended = nullptr;
  ASSERT_CU_OK(capture(true, true, &ended));
  cuda::CUgraphExec exec = nullptr;
  ASSERT_CU_OK(g.instantiate(&exec, ended, 0));
  for (int i = 0; i < 2; ++i) {
    w[0] = w[1] = 0;
    ASSERT_CU_OK(g.launch(exec, other));
    ASSERT_CU_OK(a.cuStreamSynchronize(other));
    EXPECT_EQ(w[1], 8u) << "the origin's work ran after the second fork's";
  }
  ASSERT_CU_OK(g.execDestroy(exec));
  ASSERT_CU_OK(g.graphDestroy(ended));
  // b's event recorded before b waited for c stands for nothing of c's: c is not joined.
  EXPECT_CU(904, capture(true, false, &ended));  // CUDA_ERROR_STREAM_CAPTURE_UNJOINED
  EXPECT_EQ(ended, nullptr);
  // Nor is it when the origin never waits for b.
  EXPECT_CU(904, capture(false, true, &ended));
  EXPECT_EQ(ended, nullptr);
  int status = -1;
  for (CUstream f : {b, c}) {
    ASSERT_CU_OK(a.cuStreamGetCaptureInfo(f, &status, nullptr, nullptr, nullptr, nullptr));
    EXPECT_EQ(status, kCaptureStatusNone) << "the forks leave the failed capture";
  }
  for (CUevent e : ev) ASSERT_CU_OK(a.cuEventDestroy(e));
}

// Capture modes as the driver has them: while a thread captures in GLOBAL mode, every thread in
// GLOBAL mode is refused allocations and synchronization; RELAXED (cuThreadExchangeStreamCapture
// Mode) may; a THREAD_LOCAL capture binds only its own thread; a capture in another mode than
// RELAXED ends on the thread that began it; a synchronized capturing stream invalidates it.
TEST_F(FakeCudaStreams, CaptureModesForbidUnsafeCallsAsTheDriverDoes) {
  const DriverApi& a = cu();
  Graphs g;
  CUstream s = stream(), other = stream();
  auto fromAnotherThread = [&](int mode) {
    CUresult rc = -1;
    std::thread t([&] {
      a.cuCtxSetCurrent(ctx_);
      int m = mode;
      a.cuThreadExchangeStreamCaptureMode(&m);
      CUdeviceptr p = 0;
      rc = a.cuMemAlloc(&p, 4096);
      if (rc == kSuccess) rc = a.cuMemFree(p);
      if (rc == kSuccess) rc = a.cuStreamSynchronize(other);
    });
    t.join();
    return rc;
  };
  ASSERT_CU_OK(g.begin(s, 0));  // GLOBAL
  EXPECT_CU(kErrorStreamCaptureUnsupported, fromAnotherThread(0));
  EXPECT_CU(kSuccess, fromAnotherThread(1));  // THREAD_LOCAL: another thread's capture is no bar
  EXPECT_CU(kSuccess, fromAnotherThread(2));  // RELAXED
  cuda::CUgraph ended = nullptr;
  CUresult wrong = -1;
  std::thread([&] { wrong = g.end(s, &ended); }).join();
  EXPECT_CU(908, wrong);  // CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
  EXPECT_CU(kErrorStreamCaptureUnsupported, a.cuStreamSynchronize(s));  // invalidates it
  EXPECT_CU(901, g.end(s, &ended));
  EXPECT_EQ(ended, nullptr);
  EXPECT_CU(kSuccess, fromAnotherThread(0));  // no capture any more
  ASSERT_CU_OK(g.begin(s, 1));                // THREAD_LOCAL: its own thread only
  CUdeviceptr p = 0;
  EXPECT_CU(kErrorStreamCaptureUnsupported, a.cuMemAlloc(&p, 4096));
  EXPECT_CU(kSuccess, fromAnotherThread(0));
  int m = 2;
  ASSERT_CU_OK(a.cuThreadExchangeStreamCaptureMode(&m));
  EXPECT_EQ(m, 0);
  ASSERT_CU_OK(a.cuMemAlloc(&p, 4096));
  ASSERT_CU_OK(a.cuMemFree(p));
  ASSERT_CU_OK(a.cuThreadExchangeStreamCaptureMode(&m));
  EXPECT_EQ(m, 2);
  ASSERT_CU_OK(g.end(s, &ended));
  ASSERT_NE(ended, nullptr);
  ASSERT_CU_OK(g.graphDestroy(ended));
}

class FakeCudaVmm : public FakeCudaTest {};

TEST_F(FakeCudaVmm, CreateMapAccessExportImportInOneProcess) {
  const DriverApi& a = cu();
  const CUmemAllocationProp prop = posixFdProp();
  size_t g = 0;
  ASSERT_CU_OK(a.cuMemGetAllocationGranularity(&g, &prop, kMemAllocGranularityMinimum));
  EXPECT_EQ(g, size_t(2) << 20);
  CUmemGenericAllocationHandle h = 0, imported = 0;
  EXPECT_CU(kErrorInvalidValue, a.cuMemCreate(&h, g + 4096, &prop, 0));
  ASSERT_CU_OK(a.cuMemCreate(&h, 2 * g, &prop, 0));
  CUdeviceptr va = 0, vb = 0;
  ASSERT_CU_OK(a.cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  ASSERT_CU_OK(a.cuMemMap(va, 2 * g, 0, h, 0));
  EXPECT_CU(kErrorInvalidValue, a.cuMemMap(va, g, 0, h, 0));            // mapped already
  EXPECT_CU(kErrorInvalidValue, a.cuMemsetD8Async(va, 1, 8, nullptr));  // no access yet
  const CUmemAccessDesc acc = readWriteAccess();
  ASSERT_CU_OK(a.cuMemSetAccess(va, 2 * g, &acc, 1));
  EXPECT_CU(kSuccess, a.cuMemsetD8Async(va + g, 0x77, 4096, nullptr));
  unsigned type = 0;
  EXPECT_CU(kSuccess, a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, va + 5));
  EXPECT_EQ(type, kMemoryTypeDevice);
  // Exported as an fd and imported again: the same memory at another address.
  int fd = -1;
  ASSERT_CU_OK(a.cuMemExportToShareableHandle(&fd, h, kMemHandleTypePosixFd, 0));
  ASSERT_GE(fd, 0);
  ASSERT_CU_OK(a.cuMemImportFromShareableHandle(
      &imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), kMemHandleTypePosixFd));
  ::close(fd);
  ASSERT_CU_OK(a.cuMemAddressReserve(&vb, g, 0, 0, 0));
  ASSERT_CU_OK(a.cuMemMap(vb, g, g, imported, 0));  // the second granule
  ASSERT_CU_OK(a.cuMemSetAccess(vb, g, &acc, 1));
  std::vector<unsigned char> out(4096);
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(dev(out.data()), vb, out.size(), nullptr));
  EXPECT_EQ(out, std::vector<unsigned char>(4096, 0x77));
  // Only this emulator's fds can be imported; teardown in the driver's order.
  EXPECT_CU(kErrorInvalidValue,
            a.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(intptr_t(0)),
                                             kMemHandleTypePosixFd));
  EXPECT_CU(kErrorInvalidValue, a.cuMemAddressFree(va, 2 * g));  // still mapped
  EXPECT_CU(kSuccess, a.cuMemUnmap(vb, g));
  EXPECT_CU(kSuccess, a.cuMemUnmap(va, 2 * g));
  EXPECT_CU(kSuccess, a.cuMemRelease(h));
  EXPECT_CU(kSuccess, a.cuMemRelease(imported));
  EXPECT_CU(kSuccess, a.cuMemAddressFree(va, 2 * g));
  EXPECT_CU(kSuccess, a.cuMemAddressFree(vb, g));
  EXPECT_EQ(counter("vmm_handles"), 0);
  EXPECT_EQ(counter("vmm_mappings"), 0);
  EXPECT_EQ(counter("vmm_reservations"), 0);
}

TEST_F(FakeCudaVmm, DmaBufOfAnAllocationFromItsBase) {
  const DriverApi& a = cu();
  const size_t bytes = size_t(4) << 20;
  const long long exports = counter("dmabuf_exports");
  const CUdeviceptr p = alloc(bytes);
  int fd = -1;
  ASSERT_CU_OK(a.cuMemGetHandleForAddressRange(&fd, p, bytes, kMemRangeHandleTypeDmaBufFd, 0));
  ASSERT_GE(fd, 0);
  // Offset 0 of the fd is the range's start: what the emulated verbs device maps.
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  ::close(fd);
  static_cast<char*>(m)[4096 + 1] = 0x42;
  char out = 0;
  EXPECT_CU(kSuccess, a.cuMemcpyAsync(dev(&out), p + 4096 + 1, 1, nullptr));
  EXPECT_EQ(out, 0x42);
  ::munmap(m, bytes);
  EXPECT_CU(kErrorNotSupported,
            a.cuMemGetHandleForAddressRange(&fd, p + 65536, 65536, kMemRangeHandleTypeDmaBufFd, 0));
  EXPECT_CU(kErrorInvalidValue,
            a.cuMemGetHandleForAddressRange(&fd, p + 1, 4096, kMemRangeHandleTypeDmaBufFd, 0));
  std::vector<char> plain(8192);
  EXPECT_CU(kErrorInvalidValue, a.cuMemGetHandleForAddressRange(&fd, dev(plain.data()), 4096,
                                                                kMemRangeHandleTypeDmaBufFd, 0));
  EXPECT_EQ(counter("dmabuf_exports"), exports + 1);
}

TEST_F(FakeCudaVmm, IpcHandleCannotBeOpenedByItsOwner) {
  const DriverApi& a = cu();
  const CUdeviceptr p = alloc(1 << 20);
  CUipcMemHandle h;
  ASSERT_CU_OK(a.cuIpcGetMemHandle(&h, p + 64));
  CUdeviceptr q = 0;
  EXPECT_CU(kErrorInvalidContext, a.cuIpcOpenMemHandle(&q, h, kIpcMemLazyEnablePeerAccess));
  uint64_t* host = hostAlloc(64);
  EXPECT_CU(kErrorInvalidValue, a.cuIpcGetMemHandle(&h, dev(host)));
}

}  // namespace
}  // namespace loom::testing_fakecuda
