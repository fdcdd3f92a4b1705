#include "src/device/cuda_driver.h"

#include <dlfcn.h>

#include <type_traits>

#include "src/core/log.h"
#include "src/core/params.h"

namespace loom::cuda {

namespace {

Status errorFrom(const DriverApi& a, CUresult rc, const char* what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (a.cuGetErrorName) a.cuGetErrorName(rc, &name);
  if (a.cuGetErrorString) a.cuGetErrorString(rc, &text);
  return LOOM_ERROR(kCuda, "{}: {} ({}){}{}", what, name ? name : "CUDA error", rc,
                    text ? ": " : "", text ? text : "");
}

Driver* load() {
  auto* d = new Driver();
  const std::string lib = params::kCudaLib.str().empty() ? "libcuda.so.1" : params::kCudaLib.str();
  d->library = lib;
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    d->status = LOOM_ERROR(kCuda, "no CUDA driver: {} ({})", lib, e ? e : "dlopen failed");
    return d;
  }
  std::string missing;
  auto need = [&](const char* name, auto* out) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(dlsym(h, name));
    if (!*out) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  auto may = [&](const char* name, auto* out) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(dlsym(h, name));
  };
  DriverApi& a = d->api;
  need("cuInit", &a.cuInit);
  need("cuDriverGetVersion", &a.cuDriverGetVersion);
  need("cuGetErrorName", &a.cuGetErrorName);
  need("cuGetErrorString", &a.cuGetErrorString);
  need("cuDeviceGetCount", &a.cuDeviceGetCount);
  need("cuDeviceGet", &a.cuDeviceGet);
  need("cuDeviceGetAttribute", &a.cuDeviceGetAttribute);
  need("cuDeviceGetName", &a.cuDeviceGetName);
  need("cuDeviceGetPCIBusId", &a.cuDeviceGetPCIBusId);
  need("cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain);
  need("cuDevicePrimaryCtxRelease_v2", &a.cuDevicePrimaryCtxRelease);
  need("cuCtxGetCurrent", &a.cuCtxGetCurrent);
  need("cuCtxSetCurrent", &a.cuCtxSetCurrent);
  need("cuCtxGetDevice", &a.cuCtxGetDevice);
  need("cuPointerGetAttribute", &a.cuPointerGetAttribute);
  need("cuPointerGetAttributes", &a.cuPointerGetAttributes);
  need("cuMemGetAddressRange_v2", &a.cuMemGetAddressRange);
  need("cuMemAlloc_v2", &a.cuMemAlloc);
  need("cuMemFree_v2", &a.cuMemFree);
  need("cuMemHostAlloc", &a.cuMemHostAlloc);
  need("cuMemFreeHost", &a.cuMemFreeHost);
  need("cuMemHostGetDevicePointer_v2", &a.cuMemHostGetDevicePointer);
  need("cuMemHostRegister_v2", &a.cuMemHostRegister);
  need("cuMemHostUnregister", &a.cuMemHostUnregister);
  need("cuMemcpyAsync", &a.cuMemcpyAsync);
  need("cuMemsetD8Async", &a.cuMemsetD8Async);
  need("cuStreamCreate", &a.cuStreamCreate);
  need("cuStreamDestroy_v2", &a.cuStreamDestroy);
  need("cuStreamSynchronize", &a.cuStreamSynchronize);
  need("cuStreamQuery", &a.cuStreamQuery);
  need("cuStreamWaitEvent", &a.cuStreamWaitEvent);
  need("cuStreamGetCtx", &a.cuStreamGetCtx);
  need("cuStreamIsCapturing", &a.cuStreamIsCapturing);
  need("cuEventCreate", &a.cuEventCreate);
  need("cuEventDestroy_v2", &a.cuEventDestroy);
  need("cuEventRecord", &a.cuEventRecord);
  need("cuEventQuery", &a.cuEventQuery);
  need("cuEventSynchronize", &a.cuEventSynchronize);
  need("cuLaunchHostFunc", &a.cuLaunchHostFunc);
  need("cuModuleLoadData", &a.cuModuleLoadData);
  need("cuModuleUnload", &a.cuModuleUnload);
  need("cuModuleGetFunction", &a.cuModuleGetFunction);
  need("cuLaunchKernel", &a.cuLaunchKernel);
  may("cuStreamWaitValue64_v2", &a.cuStreamWaitValue64);
  may("cuStreamWriteValue64_v2", &a.cuStreamWriteValue64);
  may("cuDeviceCanAccessPeer", &a.cuDeviceCanAccessPeer);
  may("cuDeviceGetByPCIBusId", &a.cuDeviceGetByPCIBusId);
  may("cuCtxEnablePeerAccess", &a.cuCtxEnablePeerAccess);
  may("cuIpcGetMemHandle", &a.cuIpcGetMemHandle);
  may("cuIpcOpenMemHandle_v2", &a.cuIpcOpenMemHandle);
  may("cuIpcCloseMemHandle", &a.cuIpcCloseMemHandle);
  may("cuMemCreate", &a.cuMemCreate);
  may("cuMemRelease", &a.cuMemRelease);
  may("cuMemExportToShareableHandle", &a.cuMemExportToShareableHandle);
  may("cuMemImportFromShareableHandle", &a.cuMemImportFromShareableHandle);
  may("cuMemAddressReserve", &a.cuMemAddressReserve);
  may("cuMemAddressFree", &a.cuMemAddressFree);
  may("cuMemMap", &a.cuMemMap);
  may("cuMemUnmap", &a.cuMemUnmap);
  may("cuMemSetAccess", &a.cuMemSetAccess);
  may("cuMemGetAllocationGranularity", &a.cuMemGetAllocationGranularity);
  may("cuMemGetHandleForAddressRange", &a.cuMemGetHandleForAddressRange);
  may("cuFuncLoad", &a.cuFuncLoad);
  may("cuFuncGetAttribute", &a.cuFuncGetAttribute);
  may("cuStreamGetCaptureInfo_v2", &a.cuStreamGetCaptureInfo);
  may("cuStreamGetCaptureInfo_v3", &a.cuStreamGetCaptureInfo3);
  may("cuThreadExchangeStreamCaptureMode", &a.cuThreadExchangeStreamCaptureMode);
  may("cuUserObjectCreate", &a.cuUserObjectCreate);
  may("cuUserObjectRelease", &a.cuUserObjectRelease);
  may("cuGraphRetainUserObject", &a.cuGraphRetainUserObject);
  may("cuStreamBeginCapture_v2", &a.cuStreamBeginCapture);
  may("cuStreamEndCapture", &a.cuStreamEndCapture);
  may("cuGraphInstantiateWithFlags", &a.cuGraphInstantiate);
  may("cuGraphLaunch", &a.cuGraphLaunch);
  may("cuGraphExecDestroy", &a.cuGraphExecDestroy);
  may("cuGraphDestroy", &a.cuGraphDestroy);
  if (!missing.empty()) {
    d->status =
        LOOM_ERROR(kCuda, "the CUDA driver {} lacks entry points Loom needs: {}", lib, missing);
    return d;
  }
  CUresult rc = a.cuInit(0);
  if (rc != kSuccess) {
    d->status = errorFrom(a, rc, "cuInit").withContext("the CUDA driver " + lib);
    return d;
  }
  a.cuDriverGetVersion(&d->version);
  if (a.cuDeviceGetCount(&d->devices) != kSuccess || d->devices == 0) {
    d->status = LOOM_ERROR(kCuda, "the CUDA driver {} sees no GPU", lib);
    return d;
  }
  LOOM_INFO(kSubInit, "CUDA driver {} version {}.{}, {} device(s)", lib, d->version / 1000,
            d->version % 1000 / 10, d->devices);
  return d;
}

}  // namespace

const Driver& cudaDriver() {
  // Never destroyed: streams and memory may outlive static teardown.
  static const Driver* d = load();
  return *d;
}

Status cudaError(CUresult rc, const char* what) { return errorFrom(cudaDriver().api, rc, what); }

RelaxedCapture::RelaxedCapture() {
  const Driver& d = cudaDriver();
  if (!d.ok() || d.api.cuThreadExchangeStreamCaptureMode == nullptr) return;
  old_ = kCaptureModeRelaxed;
  set_ = d.api.cuThreadExchangeStreamCaptureMode(&old_) == kSuccess;
}

RelaxedCapture::~RelaxedCapture() {
  if (set_) cudaDriver().api.cuThreadExchangeStreamCaptureMode(&old_);
}

}  // namespace loom::cuda

// The values declared in cuda_driver.h against the driver's own header, where it is installed. At
// the end of the file: cuda.h defines macros of the entry points' names (cuMemAlloc ->
// cuMemAlloc_v2) that would rename the table's members above.
#if __has_include(<cuda.h>)
#include <cuda.h>
namespace {
using namespace loom::cuda;  // NOLINT
static_assert(kErrorIllegalAddress == CUDA_ERROR_ILLEGAL_ADDRESS, "cuda.h");
static_assert(kErrorNotReady == CUDA_ERROR_NOT_READY, "cuda.h");
static_assert(kErrorNotFound == CUDA_ERROR_NOT_FOUND, "cuda.h");
static_assert(kErrorNotSupported == CUDA_ERROR_NOT_SUPPORTED, "cuda.h");
static_assert(kErrorDeviceUnavailable == CUDA_ERROR_DEVICE_UNAVAILABLE, "cuda.h");
static_assert(kErrorPeerAccessUnsupported == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "cuda.h");
static_assert(kErrorPeerAccessAlreadyEnabled == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "cuda.h");
static_assert(kErrorStreamCaptureUnsupported == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuda.h");
static_assert(kAttrPciBusId == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "cuda.h");
static_assert(kFuncAttrMaxThreadsPerBlock == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "cuda.h");
static_assert(kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
              "cuda.h");
static_assert(kAttrVmmSupported == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
              "cuda.h");
static_assert(kAttrStreamMemOps64 == CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, "cuda.h");
static_assert(kAttrDmaBufSupported == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "cuda.h");
static_assert(kPointerAttrMemoryType == CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "cuda.h");
static_assert(kPointerAttrDeviceOrdinal == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "cuda.h");
static_assert(kPointerAttrBufferId == CU_POINTER_ATTRIBUTE_BUFFER_ID, "cuda.h");
static_assert(kPointerAttrIsManaged == CU_POINTER_ATTRIBUTE_IS_MANAGED, "cuda.h");
static_assert(kPointerAttrRangeStart == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "cuda.h");
static_assert(kMemoryTypeDevice == CU_MEMORYTYPE_DEVICE, "cuda.h");
static_assert(sizeof(int) == sizeof(CUpointer_attribute), "cuda.h");
static_assert(kStreamWaitValueGeq == CU_STREAM_WAIT_VALUE_GEQ, "cuda.h");
static_assert(kCaptureStatusActive == CU_STREAM_CAPTURE_STATUS_ACTIVE, "cuda.h");
static_assert(kCaptureModeRelaxed == CU_STREAM_CAPTURE_MODE_RELAXED, "cuda.h");
static_assert(kCaptureModeGlobal == CU_STREAM_CAPTURE_MODE_GLOBAL, "cuda.h");
static_assert(kCaptureModeThreadLocal == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, "cuda.h");
static_assert(sizeof(int) == sizeof(CUstreamCaptureMode), "cuda.h");
static_assert(sizeof(int) == sizeof(CUstreamCaptureStatus), "cuda.h");
static_assert(kUserObjectNoDestructorSync == CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, "cuda.h");
static_assert(kGraphUserObjectMove == CU_GRAPH_USER_OBJECT_MOVE, "cuda.h");
static_assert(kMemHostAllocDeviceMap == CU_MEMHOSTALLOC_DEVICEMAP, "cuda.h");
static_assert(kMemHandleTypePosixFd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "cuda.h");
static_assert(kMemRangeHandleTypeDmaBufFd == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, "cuda.h");
static_assert(kIpcHandleBytes == CU_IPC_HANDLE_SIZE, "cuda.h");
static_assert(sizeof(loom::cuda::CUmemAllocationProp) == sizeof(::CUmemAllocationProp), "cuda.h");
static_assert(sizeof(loom::cuda::CUmemAccessDesc) == sizeof(::CUmemAccessDesc), "cuda.h");
}  // namespace
#endif
