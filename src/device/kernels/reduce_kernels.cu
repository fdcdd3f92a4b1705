// Loom's device reduction kernels: one per (datatype, op), named as reduceKernelName says, each a
// grid-stride loop over reduce_math.h's arithmetic (16-byte vectors where every pointer is
// aligned). nvcc builds them into a fatbin (sm_80, sm_90, sm_100 and PTX) that libloom.so embeds
// and loads with the driver's module API (src/device/kernels.h).
#include "src/device/kernels/reduce_math.h"

#define LOOM_DEVK_KERNEL(DT, DN, OP, ON)                                                    \
  extern "C" __global__ void loomReduce_##DN##_##ON(loom::devk::ReduceArgs a) {             \
    const unsigned long long tid =                                                          \
        static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;             \
    const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * blockDim.x; \
    loom::devk::reduceAll<loom::devk::DT, loom::devk::OP>(a, tid, threads);                 \
  }
#define LOOM_DEVK_KERNELS_OF(DT, DN) LOOM_DEVK_FOR_EACH_OP(LOOM_DEVK_KERNEL, DT, DN)
LOOM_DEVK_FOR_EACH_REDUCE(LOOM_DEVK_KERNELS_OF)

extern "C" __global__ void loomWaitFlag(loom::devk::WaitFlagArgs a) {
  const volatile uint64_t* flag = a.flag;
  while (*flag < a.value) __nanosleep(1000);
}
