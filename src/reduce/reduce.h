// CPU reduction kernels for every datatype and op. float16 and bfloat16 are converted to float32,
// combined, and rounded once per element (they accumulate in float32 inside a step).
#pragma once

#include <cstddef>

#include "loom/loom.h"

namespace loom {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b exactly (not partially).
// loomAvg combines as loomSum: the executor divides once at the end (finishAverage).
void reduceBuffers(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                   loomRedOp_t op);

// The same results written around the caches (non-temporal stores): for destinations that will
// not be read again soon, such as a large call's output on a host whose buffers exceed its caches,
// where an ordinary store first reads each destination line from memory. Each returns after a
// store fence, so a release that follows publishes what it wrote. Small sizes, and CPUs without
// such stores, take the ordinary form, and so does a reduction whose destination is one of its
// operands (read first, it is cached anyway). copyStreaming's ranges may overlap (then it is
// memmove).
void reduceBuffersStreaming(void* dst, const void* a, const void* b, size_t count,
                            loomDataType_t dt, loomRedOp_t op);
void copyStreaming(void* dst, const void* src, size_t bytes);
// Whether a call whose buffers on this host total hostBytes (every local rank's input and output)
// writes its results with the streaming forms: above LOOM_NT_MIN, or above the last-level cache
// when that is 0 (nothing it writes would stay cached until it is read).
bool streamingStoresFor(size_t hostBytes);

// data[i] /= nranks, after a sum, to finish loomAvg. Integers truncate toward zero (as NCCL).
void finishAverage(void* data, size_t count, loomDataType_t dt, int nranks);

}  // namespace loom
