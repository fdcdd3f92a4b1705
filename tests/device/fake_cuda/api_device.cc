// Entry points: initialization, versions, error strings, devices and their attributes, primary
// contexts and the current context.
#include <cstdio>
#include <cstring>

#include "tests/device/fake_cuda/state.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants

namespace {

constexpr char kDeviceName[] = "Loom emulated GPU";
constexpr int kDriverVersion = 12080;

// An sm_90 GPU of the H100/H200 class: the attributes that read a fixed value other than 0.
struct FixedAttribute {
  int attr;
  int value;
};
constexpr FixedAttribute kFixedAttributes[] = {
    {1, 1024},         // MAX_THREADS_PER_BLOCK
    {2, 1024},         // MAX_BLOCK_DIM_X
    {3, 1024},         // MAX_BLOCK_DIM_Y
    {4, 64},           // MAX_BLOCK_DIM_Z
    {5, 2147483647},   // MAX_GRID_DIM_X
    {6, 65535},        // MAX_GRID_DIM_Y
    {7, 65535},        // MAX_GRID_DIM_Z
    {8, 49152},        // MAX_SHARED_MEMORY_PER_BLOCK
    {9, 65536},        // TOTAL_CONSTANT_MEMORY
    {10, 32},          // WARP_SIZE
    {11, 2147483647},  // MAX_PITCH
    {12, 65536},       // MAX_REGISTERS_PER_BLOCK
    {13, 1980000},     // CLOCK_RATE (kHz)
    {14, 512},         // TEXTURE_ALIGNMENT
    {15, 1},           // GPU_OVERLAP
    {kAttrMultiprocessorCount, 132},
    {19, 1},         // CAN_MAP_HOST_MEMORY
    {31, 1},         // CONCURRENT_KERNELS
    {32, 1},         // ECC_ENABLED
    {36, 2619000},   // MEMORY_CLOCK_RATE (kHz)
    {37, 6144},      // GLOBAL_MEMORY_BUS_WIDTH
    {38, 50 << 20},  // L2_CACHE_SIZE
    {39, 2048},      // MAX_THREADS_PER_MULTIPROCESSOR
    {40, 3},         // ASYNC_ENGINE_COUNT
    {kAttrUnifiedAddressing, 1},
    {kAttrComputeCapabilityMajor, 9},  // and minor 0 (not listed)
    {78, 1},                           // STREAM_PRIORITIES_SUPPORTED
    {79, 1},                           // GLOBAL_L1_CACHE_SUPPORTED
    {80, 1},                           // LOCAL_L1_CACHE_SUPPORTED
    {81, 233472},                      // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    {82, 65536},                       // MAX_REGISTERS_PER_MULTIPROCESSOR
    {83, 1},                           // MANAGED_MEMORY
    {87, 2},                           // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
    {89, 1},                           // CONCURRENT_MANAGED_ACCESS
    {90, 1},                           // COMPUTE_PREEMPTION_SUPPORTED
    {91, 1},                           // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    {95, 1},                           // COOPERATIVE_LAUNCH
    {96, 1},                           // COOPERATIVE_MULTI_DEVICE_LAUNCH
    {97, 232448},                      // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    {99, 1},                           // HOST_REGISTER_SUPPORTED
    {106, 32},                         // MAX_BLOCKS_PER_MULTIPROCESSOR
    {108, 31457280},                   // MAX_PERSISTING_L2_CACHE_SIZE
    {109, 134213632},                  // MAX_ACCESS_POLICY_WINDOW_SIZE
    {111, 1024},                       // RESERVED_SHARED_MEMORY_PER_BLOCK
    {113, 1},                          // READ_ONLY_HOST_REGISTER_SUPPORTED
    {115, 1},                          // MEMORY_POOLS_SUPPORTED
    {116, 1},                          // GPU_DIRECT_RDMA_SUPPORTED
    {117, 1},                          // GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
    {119, 1},                          // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
    {120, 1},                          // CLUSTER_LAUNCH
    {125, 1},                          // IPC_EVENT_SUPPORTED
    {126, 4},                          // MEM_SYNC_DOMAIN_COUNT
    {127, 1},                          // TENSOR_MAP_ACCESS_SUPPORTED
    {129, 1},                          // UNIFIED_FUNCTION_POINTERS
    {131, -1},                         // NUMA_ID
    {134, -1},                         // HOST_NUMA_ID
};

// The device's attribute `attr`: those that follow the configuration (fake_cuda.h's environment)
// or the device, then the fixed ones; unknown attributes below kNumAttributes read 0.
bool deviceAttribute(int attr, const Device& d, int* out) {
  const Config& c = state().cfg;
  if (attr < 1 || attr >= kNumAttributes) return false;
  switch (attr) {
    case 92:  // stream memory operations, v1 (92 to 94) and current
    case 93:
    case 94:
    case kAttrStreamMemOps64:
    case 123:
      *out = c.memops ? 1 : 0;
      return true;
    case kAttrVmmSupported:
    case kAttrPosixFdHandleSupported:
    case 110:  // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
      *out = c.vmm ? 1 : 0;
      return true;
    case kAttrDmaBufSupported:
      *out = c.dmabuf ? 1 : 0;
      return true;
    case kAttrPciBusId:
      *out = 0x10 + d.ordinal;
      return true;
    default:
      break;
  }
  *out = 0;
  for (const FixedAttribute& a : kFixedAttributes)
    if (a.attr == attr) *out = a.value;
  return true;
}

// Copies s into out[0, len) as the driver does: truncated, always terminated.
CUresult copyName(char* out, int len, const char* s) {
  if (out == nullptr || len <= 0) return kErrorInvalidValue;
  std::snprintf(out, size_t(len), "%s", s);
  return kSuccess;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
  if (flags != 0) return kErrorInvalidValue;
  return guarded([] { return initialize(); });
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return kErrorInvalidValue;
  *version = kDriverVersion;
  return kSuccess;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return kErrorInvalidValue;
  *name = errorName(error);
  return *name ? kSuccess : kErrorInvalidValue;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return kErrorInvalidValue;
  *str = errorText(error);
  return *str ? kSuccess : kErrorInvalidValue;
}

CUresult cuDeviceGetCount(int* count) {
  FAKECUDA_ENTRY();
  if (count == nullptr) return kErrorInvalidValue;
  *count = int(state().devices.size());
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKECUDA_ENTRY();
  if (device == nullptr) return kErrorInvalidValue;
  if (deviceOf(ordinal) == nullptr) return kErrorInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute_, CUdevice device) {
  FAKECUDA_ENTRY();
  if (value == nullptr) return kErrorInvalidValue;
  Device* d = deviceOf(device);
  if (d == nullptr) return kErrorInvalidDevice;
  return deviceAttribute(attribute_, *d, value) ? kSuccess : kErrorInvalidValue;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  FAKECUDA_ENTRY();
  if (deviceOf(device) == nullptr) return kErrorInvalidDevice;
  return copyName(name, len, kDeviceName);
}

CUresult cuDeviceGetPCIBusId(char* busId, int len, CUdevice device) {
  FAKECUDA_ENTRY();
  Device* d = deviceOf(device);
  if (d == nullptr) return kErrorInvalidDevice;
  char id[16];
  std::snprintf(id, sizeof(id), "0000:%02X:00.0", 0x10 + d->ordinal);
  return copyName(busId, len, id);
}

// Distinct devices reach each other unless LOOMTEST_FAKECUDA_P2P=0 (devices under different
// root ports without peer-to-peer support); a device does not count as its own peer.
CUresult cuDeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  FAKECUDA_ENTRY();
  if (can == nullptr) return kErrorInvalidValue;
  if (deviceOf(device) == nullptr || deviceOf(peer) == nullptr) return kErrorInvalidDevice;
  *can = device != peer && state().cfg.p2p ? 1 : 0;
  return kSuccess;
}

CUresult cuDeviceGetByPCIBusId(CUdevice* device, const char* busId) {
  FAKECUDA_ENTRY();
  if (device == nullptr || busId == nullptr) return kErrorInvalidValue;
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(busId, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4 || domain != 0 || dev != 0 ||
      fn != 0 || bus < 0x10 || deviceOf(int(bus - 0x10)) == nullptr)
    return kErrorInvalidDevice;
  *device = int(bus - 0x10);
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  FAKECUDA_ENTRY();
  if (ctx == nullptr) return kErrorInvalidValue;
  Device* d = deviceOf(device);
  if (d == nullptr) return kErrorInvalidDevice;
  return guarded([&] {
    Context* c = nullptr;
    FAKECUDA_TRY(retainPrimary(d, &c));
    *ctx = c->handle();
    return kSuccess;
  });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  FAKECUDA_ENTRY();
  Device* d = deviceOf(device);
  if (d == nullptr) return kErrorInvalidDevice;
  return guarded([&] { return releasePrimary(d); });
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  FAKECUDA_ENTRY();
  if (ctx == nullptr) return kErrorInvalidValue;
  Context* c = currentContext();
  *ctx = c ? c->handle() : nullptr;
  return kSuccess;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKECUDA_ENTRY();
  if (ctx == nullptr) {
    setCurrentContext(nullptr);
    return kSuccess;
  }
  Context* c = contextOf(ctx);
  if (c == nullptr) return kErrorInvalidContext;
  setCurrentContext(c);
  return kSuccess;
}

// Lets the current context's kernels reach peer's memory (one direction, as the driver's).
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  FAKECUDA_ENTRY();
  if (flags != 0) return kErrorInvalidValue;
  Context* c = nullptr;
  FAKECUDA_TRY(requireContext(&c));
  Context* p = nullptr;
  for (int d = 0; deviceOf(d) != nullptr; ++d)
    if (deviceOf(d)->primary->handle() == peer) p = deviceOf(d)->primary;
  if (p == nullptr || p == c || !p->active.load()) return kErrorInvalidContext;
  if (!state().cfg.p2p) return kErrorPeerAccessUnsupported;
  const uint32_t bit = 1u << p->dev->ordinal;
  if (c->peers.fetch_or(bit) & bit) return kErrorPeerAccessAlreadyEnabled;
  return kSuccess;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKECUDA_ENTRY();
  if (device == nullptr) return kErrorInvalidValue;
  Context* c = nullptr;
  FAKECUDA_TRY(requireContext(&c));
  *device = c->dev->ordinal;
  return kSuccess;
}

}  // extern "C"
