// The emulated CUDA device across processes and at start-up: legacy IPC handles and VMM handles
// (an fd passed over a Unix socket) opened by another process, faults injected through the
// environment (a lost device), calls before cuInit, and no device at all. Each child is this
// binary started afresh (spawnSelf) with LOOMTEST_FAKECUDA_CHILD="<role> <args>": it runs its part
// in a static initializer, before main, and exits with 0 or the line of the check that failed.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <sstream>

#include "src/device/kernels/reduce_math.h"
#include "tests/device/fake_cuda_test_util.h"

namespace loom::testing_fakecuda {
namespace {

using namespace cuda;  // NOLINT(build/namespaces): the driver's constants

constexpr size_t kGranule = size_t(2) << 20;

std::string toHex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<const unsigned char*>(p)[i];
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}
void fromHex(const std::string& s, void* p, size_t n) {
  for (size_t i = 0; i < n && 2 * i + 1 < s.size(); ++i)
    static_cast<unsigned char*>(p)[i] =
        static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
}

unsigned char pattern(size_t i) { return static_cast<unsigned char>(i * 13 + 5); }

// ---- the children ----

#define CHILD_CHECK(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "fake_cuda child: %s failed (line %d)\n", #cond, __LINE__); \
      return __LINE__ % 250 + 1;                                                       \
    }                                                                                  \
  } while (0)

int retainAndSetCurrent(int device) {
  CUcontext c = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&c, device) == kSuccess);
  CHILD_CHECK(cu().cuCtxSetCurrent(c) == kSuccess);
  return 0;
}

// Opens the parent's allocation (handle of an interior pointer: the importer gets the base),
// checks it, writes 0xab over its first 4 KiB; a handle of freed memory must not open.
int childIpc(const std::string& handleHex, const std::string& freedHex) {
  const DriverApi& a = cu();
  CHILD_CHECK(fakeDriver().ok());
  if (int rc = retainAndSetCurrent(0)) return rc;
  CUipcMemHandle h, freed;
  fromHex(handleHex, &h, sizeof(h));
  fromHex(freedHex, &freed, sizeof(freed));
  CUdeviceptr p = 0, again = 0;
  CHILD_CHECK(a.cuIpcOpenMemHandle(&p, h, kIpcMemLazyEnablePeerAccess) == kSuccess);
  CHILD_CHECK(a.cuIpcOpenMemHandle(&again, h, kIpcMemLazyEnablePeerAccess) == kSuccess);
  CHILD_CHECK(again == p);
  unsigned type = 0;
  size_t size = 0;
  CHILD_CHECK(a.cuPointerGetAttribute(&type, kPointerAttrMemoryType, p + 10) == kSuccess);
  CHILD_CHECK(type == kMemoryTypeDevice);
  CHILD_CHECK(a.cuPointerGetAttribute(&size, kPointerAttrRangeSize, p) == kSuccess);
  CHILD_CHECK(size == 3 * (size_t(1) << 20));
  std::vector<unsigned char> buf(8192);
  CHILD_CHECK(a.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(buf.data()), p, buf.size(), nullptr) ==
              kSuccess);
  for (size_t i = 0; i < buf.size(); ++i) CHILD_CHECK(buf[i] == pattern(i));
  CHILD_CHECK(a.cuMemsetD8Async(p, 0xab, 4096, nullptr) == kSuccess);
  CHILD_CHECK(a.cuStreamSynchronize(nullptr) == kSuccess);
  CHILD_CHECK(a.cuIpcCloseMemHandle(p) == kSuccess);
  CHILD_CHECK(a.cuIpcCloseMemHandle(p) == kSuccess);
  CHILD_CHECK(a.cuIpcCloseMemHandle(p) == kErrorInvalidValue);
  CHILD_CHECK(a.cuIpcOpenMemHandle(&p, freed, kIpcMemLazyEnablePeerAccess) == kErrorInvalidHandle);
  CHILD_CHECK(counter("ipc_mappings") == 0);
  return 0;
}

// Receives a VMM fd over the socket, imports and maps it, checks the parent's 0x5c and writes 0x3d
// over the first 4 KiB of the second granule.
int childVmm(int sock) {
  const DriverApi& a = cu();
  CHILD_CHECK(fakeDriver().ok());
  if (int rc = retainAndSetCurrent(0)) return rc;
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  CHILD_CHECK(::recvmsg(sock, &msg, 0) == 1);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  CHILD_CHECK(cm != nullptr && cm->cmsg_type == SCM_RIGHTS);
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
  CUmemGenericAllocationHandle h = 0;
  CHILD_CHECK(a.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fd)),
                                               kMemHandleTypePosixFd) == kSuccess);
  ::close(fd);
  CUdeviceptr va = 0;
  CHILD_CHECK(a.cuMemAddressReserve(&va, 2 * kGranule, 0, 0, 0) == kSuccess);
  CHILD_CHECK(a.cuMemMap(va, 2 * kGranule, 0, h, 0) == kSuccess);
  const CUmemAccessDesc acc = readWriteAccess();
  CHILD_CHECK(a.cuMemSetAccess(va, 2 * kGranule, &acc, 1) == kSuccess);
  std::vector<unsigned char> buf(4096);
  CHILD_CHECK(a.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(buf.data()), va + kGranule - 4096,
                              buf.size(), nullptr) == kSuccess);
  for (unsigned char c : buf) CHILD_CHECK(c == 0x5c);
  CHILD_CHECK(a.cuMemsetD8Async(va + kGranule, 0x3d, 4096, nullptr) == kSuccess);
  CHILD_CHECK(a.cuStreamSynchronize(nullptr) == kSuccess);
  CHILD_CHECK(a.cuMemUnmap(va, 2 * kGranule) == kSuccess);
  CHILD_CHECK(a.cuMemRelease(h) == kSuccess);
  CHILD_CHECK(a.cuMemAddressFree(va, 2 * kGranule) == kSuccess);
  return 0;
}

// LOOMTEST_FAKECUDA_FAULT=lost_device:2 or illegal_address:1, read by cuInit.
int childFault(const std::string& spec) {
  ::setenv("LOOMTEST_FAKECUDA_FAULT", spec.c_str(), 1);
  const DriverApi& a = cu();
  CHILD_CHECK(fakeDriver().ok());
  if (int rc = retainAndSetCurrent(0)) return rc;
  CUmodule m = nullptr;
  CUfunction f = nullptr;
  CUstream s = nullptr;
  CUdeviceptr d = 0;
  CHILD_CHECK(a.cuModuleLoadData(&m, "image") == kSuccess);
  CHILD_CHECK(a.cuModuleGetFunction(&f, m, "loomReduce_f32_sum") == kSuccess);
  CHILD_CHECK(a.cuStreamCreate(&s, kStreamNonBlocking) == kSuccess);
  CHILD_CHECK(a.cuMemAlloc(&d, 4096) == kSuccess);
  devk::ReduceArgs args{};
  args.dst[0] = reinterpret_cast<void*>(d);
  args.ndst = 1;
  args.src[0] = args.src[1] = reinterpret_cast<const void*>(d);
  args.nsrc = 2;
  args.count = 1024;
  void* params[] = {&args};
  auto launch = [&] { return a.cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, s, params, nullptr); };
  CHILD_CHECK(launch() == kSuccess);
  CUdeviceptr p = 0;
  if (spec == "illegal_address:1") {
    CHILD_CHECK(a.cuStreamSynchronize(s) == kErrorIllegalAddress);
    CHILD_CHECK(a.cuMemAlloc(&p, 64) == kErrorIllegalAddress);
    return 0;
  }
  CHILD_CHECK(a.cuStreamSynchronize(s) == kSuccess);
  CHILD_CHECK(launch() == kSuccess);
  CHILD_CHECK(a.cuStreamSynchronize(s) == kErrorDeviceUnavailable);
  CHILD_CHECK(a.cuMemAlloc(&p, 64) == kErrorDeviceUnavailable);
  CUcontext c = nullptr;
  CHILD_CHECK(a.cuDevicePrimaryCtxRetain(&c, 0) == kErrorDeviceUnavailable);
  CHILD_CHECK(launch() == kErrorDeviceUnavailable);
  // The other device still works.
  if (int rc = retainAndSetCurrent(1)) return rc;
  CHILD_CHECK(a.cuMemAlloc(&p, 64) == kSuccess);
  return 0;
}

// The library itself, before cuInit.
int childNoInit() {
  void* h = ::dlopen(LOOMTEST_FAKECUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  CHILD_CHECK(h != nullptr);
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(::dlsym(h, "cuInit"));
  auto alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(::dlsym(h, "cuMemAlloc_v2"));
  auto count = reinterpret_cast<CUresult (*)(int*)>(::dlsym(h, "cuDeviceGetCount"));
  CHILD_CHECK(init && alloc && count);
  CUdeviceptr p = 0;
  int n = -1;
  CHILD_CHECK(alloc(&p, 64) == kErrorNotInitialized);
  CHILD_CHECK(count(&n) == kErrorNotInitialized);
  CHILD_CHECK(init(1) == kErrorInvalidValue);
  CHILD_CHECK(init(0) == kSuccess);
  CHILD_CHECK(count(&n) == kSuccess && n == 2);
  return 0;
}

int childNoDevice() {
  ::setenv("LOOMTEST_FAKECUDA_DEVICES", "0", 1);
  const Driver& d = fakeDriver();
  CHILD_CHECK(!d.ok());
  CHILD_CHECK(d.status.message().find("CUDA_ERROR_NO_DEVICE") != std::string::npos);
  return 0;
}

int childMain(const std::string& what) {
  std::istringstream in(what);
  std::string role, x, y;
  in >> role >> x >> y;
  ::setenv("LOOMTEST_FAKECUDA_DEVICES", "2", 0);
  if (role == "ipc") return childIpc(x, y);
  if (role == "vmm") return childVmm(std::stoi(x));
  if (role == "fault") return childFault(x);
  if (role == "noinit") return childNoInit();
  if (role == "nodevice") return childNoDevice();
  return 250;
}

const int kChildRan = [] {
  const char* v = std::getenv("LOOMTEST_FAKECUDA_CHILD");
  if (v != nullptr && *v != '\0') ::_exit(childMain(v));
  return 0;
}();

// ---- the parents ----

class FakeCudaProcess : public FakeCudaTest {};

TEST_F(FakeCudaProcess, LegacyIpcHandleOpensInAnotherProcess) {
  const DriverApi& a = cu();
  const size_t bytes = size_t(3) << 20;
  std::vector<unsigned char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern(i);
  const CUdeviceptr p = alloc(bytes);
  ASSERT_CU_OK(a.cuMemcpyAsync(p, dev(data.data()), bytes, nullptr));
  ASSERT_CU_OK(a.cuStreamSynchronize(nullptr));
  CUipcMemHandle h, freed;
  ASSERT_CU_OK(a.cuIpcGetMemHandle(&h, p + 4096));  // names the whole allocation
  const CUdeviceptr q = alloc(1 << 20);
  ASSERT_CU_OK(a.cuIpcGetMemHandle(&freed, q));
  ASSERT_CU_OK(a.cuMemFree(q));
  ChildProcess child(spawnSelf("LOOMTEST_FAKECUDA_CHILD",
                               "ipc " + toHex(&h, sizeof(h)) + " " + toHex(&freed, sizeof(freed))));
  ASSERT_GT(child.pid, 0);
  EXPECT_EQ(child.exitCode(kChildTimeoutMs), 0)
      << "the child's checks failed (its stderr says which)";
  std::vector<unsigned char> got(8192);
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(got.data()), p, got.size(), nullptr));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], i < 4096 ? 0xab : pattern(i)) << "byte " << i;
}

TEST_F(FakeCudaProcess, VmmHandleTravelsOverAUnixSocket) {
  const DriverApi& a = cu();
  const CUmemAllocationProp prop = posixFdProp();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_CU_OK(a.cuMemCreate(&h, 2 * kGranule, &prop, 0));
  ASSERT_CU_OK(a.cuMemAddressReserve(&va, 2 * kGranule, 0, 0, 0));
  ASSERT_CU_OK(a.cuMemMap(va, 2 * kGranule, 0, h, 0));
  const CUmemAccessDesc acc = readWriteAccess();
  ASSERT_CU_OK(a.cuMemSetAccess(va, 2 * kGranule, &acc, 1));
  ASSERT_CU_OK(a.cuMemsetD8Async(va, 0x5c, 2 * kGranule, nullptr));
  ASSERT_CU_OK(a.cuStreamSynchronize(nullptr));
  int fd = -1;
  ASSERT_CU_OK(a.cuMemExportToShareableHandle(&fd, h, kMemHandleTypePosixFd, 0));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);  // sv[1] goes to the child
  ::fcntl(sv[0], F_SETFD, FD_CLOEXEC);
  ChildProcess child(spawnSelf("LOOMTEST_FAKECUDA_CHILD", "vmm " + std::to_string(sv[1]), sv[0]));
  ::close(sv[1]);
  ASSERT_GT(child.pid, 0);
  char byte = 1;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(fd));
  EXPECT_EQ(::sendmsg(sv[0], &msg, 0), 1);
  ::close(fd);
  EXPECT_EQ(child.exitCode(kChildTimeoutMs), 0)
      << "the child's checks failed (its stderr says which)";
  ::close(sv[0]);
  std::vector<unsigned char> got(8192);
  ASSERT_CU_OK(a.cuMemcpyAsync(dev(got.data()), va + kGranule - 4096, got.size(), nullptr));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i < 4096 ? 0x5c : 0x3d) << i;
  EXPECT_CU(kSuccess, a.cuMemUnmap(va, 2 * kGranule));
  EXPECT_CU(kSuccess, a.cuMemRelease(h));
  EXPECT_CU(kSuccess, a.cuMemAddressFree(va, 2 * kGranule));
}

TEST(FakeCudaStartup, FaultsFromTheEnvironment) {
  for (const char* spec : {"lost_device:2", "illegal_address:1"}) {
    ChildProcess child(spawnSelf("LOOMTEST_FAKECUDA_CHILD", std::string("fault ") + spec));
    ASSERT_GT(child.pid, 0);
    EXPECT_EQ(child.exitCode(kChildTimeoutMs), 0) << spec << ": the child's checks failed";
  }
}

TEST(FakeCudaStartup, CallsBeforeCuInitAndNoDevice) {
  for (const char* role : {"noinit", "nodevice"}) {
    ChildProcess child(spawnSelf("LOOMTEST_FAKECUDA_CHILD", role));
    ASSERT_GT(child.pid, 0);
    EXPECT_EQ(child.exitCode(kChildTimeoutMs), 0) << role << ": the child's checks failed";
  }
}

}  // namespace
}  // namespace loom::testing_fakecuda
