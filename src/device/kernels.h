// Loom's device kernels as the driver runs them: the module image nvcc built at build time
// (kernels/reduce_kernels.cu; where nvcc was absent, a placeholder that only the emulated device
// accepts), loaded once per CUDA context with the driver's module API, and launches of the
// reduction kernels on a stream.
//
// Threads: any thread, with the context to use current (cuCtxSetCurrent) on it.
#pragma once

#include <cstddef>

#include "loom/loom.h"
#include "src/core/status.h"
#include "src/device/cuda_driver.h"
#include "src/device/kernels/reduce_math.h"

namespace loom::device {

// True when the image holds real device code (nvcc was found at build time); false for the
// placeholder, which a real driver rejects (the error says Loom was built without nvcc).
bool imageHasDeviceCode();

// Loads Loom's module into the context current on this thread (once per context): an error says
// why the kernels cannot run there (built without nvcc on a real GPU, or the driver refused it).
Status loadKernels();

// dst[i] = src[0][i] op ... op src[n-1][i] (pairwise, left to right: reduce_math.h), then / n for
// loomAvg when divideBy > 0, on stream, asynchronously. Pointers are device (or host-mapped)
// addresses; dst may equal a src exactly. At most devk::kMaxReduceInputs inputs.
Status launchReduce(cuda::CUstream stream, void* dst, const void* const* srcs, int nsrc,
                    size_t count, loomDataType_t dt, loomRedOp_t op, int divideBy);
// The same result stored into each of dsts[0..ndst-1] in the one pass (at most
// devk::kMaxReduceOutputs): a one pass's result into every rank's output, or, with one source,
// a copy to them all (op loomSum, any datatype of the bytes' size).
Status launchReduceTo(cuda::CUstream stream, void* const* dsts, int ndst, const void* const* srcs,
                      int nsrc, size_t count, loomDataType_t dt, loomRedOp_t op, int divideBy);

// On stream, a one-thread kernel that waits until the 64-bit word at flag (host-mapped memory) is
// >= value: the stream's wait where stream memory operations are not supported.
Status launchWaitFlag(cuda::CUstream stream, const uint64_t* flag, uint64_t value);

}  // namespace loom::device
