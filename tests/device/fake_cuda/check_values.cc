// The values state.h adds to cuda_driver.h's, against the driver's own header where it is
// installed (in a file of its own: cuda.h's types and entry points must not meet the emulator's).
#include "tests/device/fake_cuda/memory.h"

#if __has_include(<cuda.h>)
#include <cuda.h>

namespace fakecuda {
static_assert(kErrorInvalidDevice == CUDA_ERROR_INVALID_DEVICE, "cuda.h");
static_assert(kErrorMapFailed == CUDA_ERROR_MAP_FAILED, "cuda.h");
static_assert(kErrorHostMemoryAlreadyRegistered == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
              "cuda.h");
static_assert(kErrorHostMemoryNotRegistered == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "cuda.h");
static_assert(kErrorNotPermitted == CUDA_ERROR_NOT_PERMITTED, "cuda.h");
static_assert(kErrorCaptureInvalidated == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuda.h");
static_assert(kErrorIllegalState == CUDA_ERROR_ILLEGAL_STATE, "cuda.h");
static_assert(kErrorCaptureWrongThread == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "cuda.h");
static_assert(kErrorCaptureUnmatched == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "cuda.h");
static_assert(kErrorCaptureMerge == CUDA_ERROR_STREAM_CAPTURE_MERGE, "cuda.h");
static_assert(kErrorCaptureUnjoined == CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "cuda.h");

static_assert(kErrorUnknown == CUDA_ERROR_UNKNOWN, "cuda.h");
static_assert(kCaptureStatusInvalidated == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "cuda.h");
static_assert(kPointerAttrHostPointer == CU_POINTER_ATTRIBUTE_HOST_POINTER, "cuda.h");
static_assert(kPointerAttrIsLegacyIpcCapable == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
              "cuda.h");
static_assert(kPointerAttrMapped == CU_POINTER_ATTRIBUTE_MAPPED, "cuda.h");
static_assert(kMemAttachGlobal == CU_MEM_ATTACH_GLOBAL && kMemAttachHost == CU_MEM_ATTACH_HOST,
              "cuda.h");
static_assert(kPointerAttrMappingSize == CU_POINTER_ATTRIBUTE_MAPPING_SIZE, "cuda.h");
static_assert(kPointerAttrMappingBase == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, "cuda.h");
static_assert(kHostAllocFlags == (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                  CU_MEMHOSTALLOC_WRITECOMBINED),
              "cuda.h");
static_assert(kHostRegisterFlags == (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                     CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY),
              "cuda.h");
static_assert(kEventFlags ==
                  (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS),
              "cuda.h");
static_assert(kEventInterprocess == CU_EVENT_INTERPROCESS, "cuda.h");
static_assert(kWaitValueFlush == CU_STREAM_WAIT_VALUE_FLUSH, "cuda.h");
static_assert(kWriteValueNoMemoryBarrier == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, "cuda.h");
static_assert(kMemHandleTypeFabric == CU_MEM_HANDLE_TYPE_FABRIC, "cuda.h");
static_assert(kNumAttributes == CU_DEVICE_ATTRIBUTE_MAX, "cuda.h");
static_assert(int(loom::cuda::kMemAccessReadWrite) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "cuda.h");
static_assert(int(kAccessRead) == int(CU_MEM_ACCESS_FLAGS_PROT_READ), "cuda.h");
}  // namespace fakecuda
#endif
