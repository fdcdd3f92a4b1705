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

// data[i] /= nranks, after a sum, to finish loomAvg. Integers truncate toward zero (as NCCL).
void finishAverage(void* data, size_t count, loomDataType_t dt, int nranks);

}  // namespace loom
