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

// An sm_90 GPU of the H100/H200 class; attributes not listed read 0.
bool deviceAttribute(int attr, const Device& d, int* out) {
  const Config& c = state().cfg;
  if (attr < 1 || attr >= kNumAttributes) return false;
  int v = 0;
  switch (attr) {
    case 1:
    case 2:
    case 3:
      v = 1024;
      break;  // MAX_THREADS_PER_BLOCK, MAX_BLOCK_DIM_X/Y
    case 4:
      v = 64;
      break;  // MAX_BLOCK_DIM_Z
    case 5:
      v = 2147483647;
      break;  // MAX_GRID_DIM_X
    case 6:
    case 7:
      v = 65535;
      break;  // MAX_GRID_DIM_Y/Z
    case 8:
      v = 49152;
      break;  // MAX_SHARED_MEMORY_PER_BLOCK
    case 9:
      v = 65536;
      break;  // TOTAL_CONSTANT_MEMORY
    case 10:
      v = 32;
      break;  // WARP_SIZE
    case 11:
      v = 2147483647;
      break;  // MAX_PITCH
    case 12:
      v = 65536;
      break;  // MAX_REGISTERS_PER_BLOCK
    case 13:
      v = 1980000;
      break;  // CLOCK_RATE (kHz)
    case 14:
      v = 512;
      break;  // TEXTURE_ALIGNMENT
    case 15:
      v = 1;
      break;  // GPU_OVERLAP
    case kAttrMultiprocessorCount:
      v = 132;
      break;
    case 19:
      v = 1;
      break;  // CAN_MAP_HOST_MEMORY
    case 31:
      v = 1;
      break;  // CONCURRENT_KERNELS
    case 32:
      v = 1;
      break;  // ECC_ENABLED
    case kAttrPciBusId:
      v = 0x10 + d.ordinal;
      break;
    case 36:
      v = 2619000;
      break;  // MEMORY_CLOCK_RATE (kHz)
    case 37:
      v = 6144;
      break;  // GLOBAL_MEMORY_BUS_WIDTH
    case 38:
      v = 50 << 20;
      break;  // L2_CACHE_SIZE
    case 39:
      v = 2048;
      break;  // MAX_THREADS_PER_MULTIPROCESSOR
    case 40:
      v = 3;
      break;  // ASYNC_ENGINE_COUNT
    case kAttrUnifiedAddressing:
      v = 1;
      break;
    case kAttrComputeCapabilityMajor:
      v = 9;
      break;
    case kAttrComputeCapabilityMinor:
      v = 0;
      break;
    case 78:
      v = 1;
      break;  // STREAM_PRIORITIES_SUPPORTED
    case 79:
    case 80:
      v = 1;
      break;  // GLOBAL/LOCAL_L1_CACHE_SUPPORTED
    case 81:
      v = 233472;
      break;  // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82:
      v = 65536;
      break;  // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 83:
      v = 1;
      break;  // MANAGED_MEMORY
    case 86:
      v = 0;
      break;  // HOST_NATIVE_ATOMIC_SUPPORTED
    case 87:
      v = 2;
      break;  // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
    case 89:
      v = 1;
      break;  // CONCURRENT_MANAGED_ACCESS
    case 90:
      v = 1;
      break;  // COMPUTE_PREEMPTION_SUPPORTED
    case 91:
      v = 1;
      break;  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    case 92:
    case 93:
    case 94:
      v = c.memops ? 1 : 0;
      break;  // stream memops (v1)
    case 95:
    case 96:
      v = 1;
      break;  // COOPERATIVE_(MULTI_DEVICE_)LAUNCH
    case 97:
      v = 232448;
      break;  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 99:
      v = 1;
      break;  // HOST_REGISTER_SUPPORTED
    case kAttrVmmSupported:
    case kAttrPosixFdHandleSupported:
      v = c.vmm ? 1 : 0;
      break;
    case 106:
      v = 32;
      break;  // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 108:
      v = 31457280;
      break;  // MAX_PERSISTING_L2_CACHE_SIZE
    case 109:
      v = 134213632;
      break;  // MAX_ACCESS_POLICY_WINDOW_SIZE
    case 110:
      v = c.vmm ? 1 : 0;
      break;  // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    case 111:
      v = 1024;
      break;  // RESERVED_SHARED_MEMORY_PER_BLOCK
    case 113:
      v = 1;
      break;  // READ_ONLY_HOST_REGISTER_SUPPORTED
    case 115:
      v = 1;
      break;  // MEMORY_POOLS_SUPPORTED
    case 116:
      v = 1;
      break;  // GPU_DIRECT_RDMA_SUPPORTED
    case 117:
      v = 1;
      break;  // GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
    case 119:
      v = 1;
      break;  // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
    case 120:
      v = 1;
      break;  // CLUSTER_LAUNCH
    case kAttrStreamMemOps64:
    case 123:
      v = c.memops ? 1 : 0;
      break;
    case kAttrDmaBufSupported:
      v = c.dmabuf ? 1 : 0;
      break;
    case 125:
      v = 1;
      break;  // IPC_EVENT_SUPPORTED
    case 126:
      v = 4;
      break;  // MEM_SYNC_DOMAIN_COUNT
    case 127:
      v = 1;
      break;  // TENSOR_MAP_ACCESS_SUPPORTED
    case 129:
      v = 1;
      break;  // UNIFIED_FUNCTION_POINTERS
    case 131:
      v = -1;
      break;  // NUMA_ID
    case 134:
      v = -1;
      break;  // HOST_NUMA_ID
    default:
      break;
  }
  *out = v;
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

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKECUDA_ENTRY();
  if (device == nullptr) return kErrorInvalidValue;
  Context* c = nullptr;
  FAKECUDA_TRY(requireContext(&c));
  *device = c->dev->ordinal;
  return kSuccess;
}

}  // extern "C"
