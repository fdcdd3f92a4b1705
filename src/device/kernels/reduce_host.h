// The host build of Loom's device reduction kernels (reduce_math.h): what the emulated device
// runs when Loom launches a kernel by name, and what the tests compare with the CPU kernels.
#pragma once

#include "src/device/kernels/reduce_math.h"

namespace loom::devk {

// Runs the kernel named `name` (reduceKernelName) on args, all of it on the calling thread;
// false for a name that is not one of Loom's reduction kernels.
bool runReduceKernelOnHost(const char* name, const ReduceArgs& args);

// The same for (datatype, op) directly (op kAvg: a sum, then divideBy must be set).
void runReduceOnHost(int dt, int op, const ReduceArgs& args);

}  // namespace loom::devk
