// Reduction kernels, AVX-512 F/BW/VL/DQ + F16C, 512-bit vectors (flags in CMakeLists.txt); x86-64
// only. Nothing here may run before reduce.cc has checked the CPU (see reduce_kernels_impl.h on
// linkage).
#if defined(LOOM_REDUCE_X86)
#define LOOM_REDUCE_TABLE kAvx512Kernels
#include "src/reduce/reduce_kernels_impl.h"
#endif
