// Reduction kernels, portable: the compiler's baseline flags (SSE2 on x86-64); always compiled.
#define LOOM_REDUCE_TABLE kGenericKernels
#include "src/reduce/reduce_kernels_impl.h"
