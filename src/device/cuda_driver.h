// The CUDA driver API, loaded at run time: every entry point Loom uses, in one function table
// filled by dlopen of libcuda.so.1 (LOOM_CUDA_LIB names another library: the emulated device of the
// tests, tests/device/fake_cuda). libloom.so links no CUDA library, so one binary runs on a laptop,
// a CPU cluster and a GPU host; where no driver loads, cudaDriver() says why and every device path
// is refused with that reason.
//
// The types and constants are declared here with the driver's C ABI (no cuda.h is needed to build
// Loom); where cuda.h is present the build checks every value against it (cuda_driver.cc).
//
// Threads: cudaDriver() may be called from any thread; it loads and initialises the driver once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/core/status.h"

namespace loom::cuda {

// ---- the driver's types (opaque handles are pointers to incomplete types, as in cuda.h) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmod_st;
struct CUfunc_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUuserObject_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
using CUuserObject = CUuserObject_st*;
using CUmemGenericAllocationHandle = unsigned long long;  // NOLINT(runtime/int)
using CUhostFn = void (*)(void* userData);

constexpr size_t kIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
struct CUipcMemHandle {
  char reserved[kIpcHandleBytes];
};

// CUmemAllocationProp and friends, for the virtual memory management calls (cuMemCreate).
struct CUmemLocation {
  int type;  // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int id;
};
struct CUmemAllocationProp {
  int type;                  // CU_MEM_ALLOCATION_TYPE_PINNED = 1
  int requestedHandleTypes;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;  // NOLINT(runtime/int)
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
};

// ---- constants (values of cuda.h) ----
constexpr CUresult kSuccess = 0;                          // CUDA_SUCCESS
constexpr CUresult kErrorInvalidValue = 1;                // CUDA_ERROR_INVALID_VALUE
constexpr CUresult kErrorOutOfMemory = 2;                 // CUDA_ERROR_OUT_OF_MEMORY
constexpr CUresult kErrorNotInitialized = 3;              // CUDA_ERROR_NOT_INITIALIZED
constexpr CUresult kErrorDeinitialized = 4;               // CUDA_ERROR_DEINITIALIZED
constexpr CUresult kErrorNoDevice = 100;                  // CUDA_ERROR_NO_DEVICE
constexpr CUresult kErrorInvalidContext = 201;            // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kErrorInvalidHandle = 400;             // CUDA_ERROR_INVALID_HANDLE
constexpr CUresult kErrorNotFound = 500;                  // CUDA_ERROR_NOT_FOUND
constexpr CUresult kErrorNotReady = 600;                  // CUDA_ERROR_NOT_READY
constexpr CUresult kErrorIllegalAddress = 700;            // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr CUresult kErrorLaunchFailed = 719;              // CUDA_ERROR_LAUNCH_FAILED
constexpr CUresult kErrorNotSupported = 801;              // CUDA_ERROR_NOT_SUPPORTED
constexpr CUresult kErrorStreamCaptureUnsupported = 900;  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
constexpr CUresult kErrorDeviceUnavailable = 46;          // CUDA_ERROR_DEVICE_UNAVAILABLE
constexpr CUresult kErrorPeerAccessUnsupported = 217;     // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
constexpr CUresult kErrorPeerAccessAlreadyEnabled = 704;  // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED

constexpr int kFuncAttrMaxThreadsPerBlock = 0;   // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr int kAttrMultiprocessorCount = 16;     // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrPciBusId = 33;                // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
constexpr int kAttrUnifiedAddressing = 41;       // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrVmmSupported = 102;  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
constexpr int kAttrPosixFdHandleSupported = 103;  // ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
constexpr int kAttrStreamMemOps64 = 122;   // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
constexpr int kAttrDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED

constexpr int kPointerAttrContext = 1;        // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kPointerAttrMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttrDevicePointer = 3;  // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
constexpr int kPointerAttrBufferId = 7;       // CU_POINTER_ATTRIBUTE_BUFFER_ID
constexpr int kPointerAttrIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kPointerAttrDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kPointerAttrRangeStart = 11;    // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kPointerAttrRangeSize = 12;     // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemoryTypeHost = 1;       // CU_MEMORYTYPE_HOST
constexpr unsigned kMemoryTypeDevice = 2;     // CU_MEMORYTYPE_DEVICE
constexpr unsigned kMemoryTypeUnified = 4;    // CU_MEMORYTYPE_UNIFIED

constexpr unsigned kStreamNonBlocking = 1;           // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 2;          // CU_EVENT_DISABLE_TIMING
constexpr unsigned kStreamWaitValueGeq = 0;          // CU_STREAM_WAIT_VALUE_GEQ
constexpr unsigned kStreamWriteValueDefault = 0;     // CU_STREAM_WRITE_VALUE_DEFAULT
constexpr unsigned kMemHostAllocPortable = 1;        // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kMemHostAllocDeviceMap = 2;       // CU_MEMHOSTALLOC_DEVICEMAP
constexpr unsigned kIpcMemLazyEnablePeerAccess = 1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr int kCaptureStatusNone = 0;                // CU_STREAM_CAPTURE_STATUS_NONE
constexpr int kCaptureStatusActive = 1;              // CU_STREAM_CAPTURE_STATUS_ACTIVE
constexpr int kCaptureModeGlobal = 0;                // CU_STREAM_CAPTURE_MODE_GLOBAL
constexpr int kCaptureModeThreadLocal = 1;           // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr int kCaptureModeRelaxed = 2;               // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr unsigned kUserObjectNoDestructorSync = 1;  // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
constexpr unsigned kGraphUserObjectMove = 1;         // CU_GRAPH_USER_OBJECT_MOVE
constexpr int kMemHandleTypePosixFd = 1;             // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kMemAllocationTypePinned = 1;          // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kMemLocationTypeDevice = 1;            // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kMemAccessReadWrite = 3;               // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kMemAllocGranularityMinimum = 0;       // CU_MEM_ALLOC_GRANULARITY_MINIMUM
constexpr int kMemRangeHandleTypeDmaBufFd = 1;       // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

// ---- the table ----
// Each member is the driver's function of that name (the versioned symbol where the driver has
// several: cuMemAlloc_v2, cuStreamWaitValue64_v2, ...). Required ones are non-null once the table
// loaded; optional ones (later drivers, or not needed by every path) may be null.
struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);
  CUresult (*cuGetErrorName)(CUresult error, const char** name);
  CUresult (*cuGetErrorString)(CUresult error, const char** str);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice device);
  CUresult (*cuDeviceGetPCIBusId)(char* busId, int len, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);  // _v2
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxGetDevice)(CUdevice* device);
  CUresult (*cuPointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr);
  // Several attributes in one call; a pointer the driver does not know is no error: every value
  // is zero (memory type 0).
  CUresult (*cuPointerGetAttributes)(unsigned count, int* attributes, void** data, CUdeviceptr ptr);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);  // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes);                              // _v2
  CUresult (*cuMemFree)(CUdeviceptr ptr);                                              // _v2
  CUresult (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned flags);
  CUresult (*cuMemFreeHost)(void* ptr);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr* dptr, void* ptr, unsigned flags);  // _v2
  CUresult (*cuMemHostRegister)(void* ptr, size_t bytes, unsigned flags);               // _v2
  CUresult (*cuMemHostUnregister)(void* ptr);
  CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream);
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream stream);  // _v2
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuStreamQuery)(CUstream stream);
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned flags);
  CUresult (*cuStreamGetCtx)(CUstream stream, CUcontext* ctx);
  CUresult (*cuStreamIsCapturing)(CUstream stream, int* status);
  CUresult (*cuEventCreate)(CUevent* event, unsigned flags);
  CUresult (*cuEventDestroy)(CUevent event);  // _v2
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventQuery)(CUevent event);
  CUresult (*cuEventSynchronize)(CUevent event);
  CUresult (*cuLaunchHostFunc)(CUstream stream, CUhostFn fn, void* userData);
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction* fn, CUmodule module, const char* name);
  CUresult (*cuLaunchKernel)(CUfunction fn, unsigned gridX, unsigned gridY, unsigned gridZ,
                             unsigned blockX, unsigned blockY, unsigned blockZ,
                             unsigned sharedBytes, CUstream stream, void** params, void** extra);
  // Optional from here on.
  CUresult (*cuStreamWaitValue64)(CUstream stream, CUdeviceptr addr, uint64_t value,
                                  unsigned flags);  // _v2
  CUresult (*cuStreamWriteValue64)(CUstream stream, CUdeviceptr addr, uint64_t value,
                                   unsigned flags);  // _v2
  CUresult (*cuDeviceCanAccessPeer)(int* can, CUdevice device, CUdevice peer);
  CUresult (*cuDeviceGetByPCIBusId)(CUdevice* device, const char* busId);
  CUresult (*cuCtxEnablePeerAccess)(CUcontext peer, unsigned flags);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle* handle, CUdeviceptr ptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr* ptr, CUipcMemHandle handle, unsigned flags);  // _v2
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr ptr);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle* handle, size_t bytes,
                          const CUmemAllocationProp* prop, unsigned long long flags);  // NOLINT
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle);
  CUresult (*cuMemExportToShareableHandle)(void* shareable, CUmemGenericAllocationHandle handle,
                                           int handleType, unsigned long long flags);  // NOLINT
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle* handle, void* shareable,
                                             int handleType);
  CUresult (*cuMemAddressReserve)(CUdeviceptr* ptr, size_t bytes, size_t alignment,
                                  CUdeviceptr addr, unsigned long long flags);  // NOLINT
  CUresult (*cuMemAddressFree)(CUdeviceptr ptr, size_t bytes);
  CUresult (*cuMemMap)(CUdeviceptr ptr, size_t bytes, size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags);  // NOLINT
  CUresult (*cuMemUnmap)(CUdeviceptr ptr, size_t bytes);
  CUresult (*cuMemSetAccess)(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc,
                             size_t count);
  CUresult (*cuMemGetAllocationGranularity)(size_t* granularity, const CUmemAllocationProp* prop,
                                            int option);
  CUresult (*cuMemGetHandleForAddressRange)(void* handle, CUdeviceptr ptr, size_t bytes,
                                            int handleType,
                                            unsigned long long flags);  // NOLINT
  // Loading a function now (CUDA 12.4+), else asking an attribute of it, which also loads it.
  CUresult (*cuFuncLoad)(CUfunction fn);
  CUresult (*cuFuncGetAttribute)(int* value, int attrib, CUfunction fn);
  // Stream capture into CUDA graphs (11.3+): a captured call's state lives in a user object that
  // the graph owns.
  CUresult (*cuStreamGetCaptureInfo)(CUstream stream, int* status, uint64_t* id, CUgraph* graph,
                                     const void** deps, size_t* numDeps);  // _v2
  // _v3 (12.3+), with the edges' data: the driver of a later CUDA may have this one only.
  CUresult (*cuStreamGetCaptureInfo3)(CUstream stream, int* status, uint64_t* id, CUgraph* graph,
                                      const void** deps, const void** edges, size_t* numDeps);
  CUresult (*cuThreadExchangeStreamCaptureMode)(int* mode);
  CUresult (*cuUserObjectCreate)(CUuserObject* obj, void* ptr, CUhostFn destroy,
                                 unsigned initialRefcount, unsigned flags);
  CUresult (*cuUserObjectRelease)(CUuserObject obj, unsigned count);
  CUresult (*cuGraphRetainUserObject)(CUgraph graph, CUuserObject obj, unsigned count,
                                      unsigned flags);
  // Capturing, instantiating and launching graphs: the application's calls (loom-perf -G).
  CUresult (*cuStreamBeginCapture)(CUstream stream, int mode);  // _v2
  CUresult (*cuStreamEndCapture)(CUstream stream, CUgraph* graph);
  CUresult (*cuGraphInstantiate)(CUgraphExec* exec, CUgraph graph,
                                 unsigned long long flags);  // NOLINT: WithFlags
  CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream stream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec exec);
  CUresult (*cuGraphDestroy)(CUgraph graph);
};

// The loaded driver.
struct Driver {
  DriverApi api{};
  Status status;        // why the driver is unusable (not loaded, an entry point missing,
                        // cuInit failed, no device); OK when usable
  std::string library;  // the library loaded (LOOM_CUDA_LIB or libcuda.so.1)
  int version = 0;      // cuDriverGetVersion (12080 for 12.8)
  int devices = 0;
  bool ok() const { return status.isOk(); }
};

// The driver, loaded and initialised on first use (never unloaded: unloading the CUDA driver after
// cuInit is not supported). LOOM_CUDA_LIB chooses the library.
const Driver& cudaDriver();

// While alive, the calling thread may make the driver calls that a stream capture under way (in
// another thread's GLOBAL mode, or its own) forbids: allocations, frees, synchronization
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED otherwise). Its capture mode is RELAXED meanwhile
// (cuThreadExchangeStreamCaptureMode), as NCCL's allocations do; nothing where the driver lacks it.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int old_ = 0;
  bool set_ = false;
};

// The message for a CUresult from a call named what: "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2):
// out of memory", code Code::kCuda.
Status cudaError(CUresult rc, const char* what);

}  // namespace loom::cuda

// Checks a driver call: returns the Status of a failed CUresult from the enclosing function.
#define LOOM_CU(call)                                                                              \
  do {                                                                                             \
    ::loom::cuda::CUresult loom_cu_rc_ = (call);                                                   \
    if (loom_cu_rc_ != ::loom::cuda::kSuccess) return ::loom::cuda::cudaError(loom_cu_rc_, #call); \
  } while (0)
