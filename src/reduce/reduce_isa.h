// Run-time choice of the instruction set used by reduceBuffers/finishAverage, and the kernel tables
// each per-ISA translation unit exports. reduceBuffers picks the best supported ISA on first use;
// tests and benchmarks may force another one to compare or to cover every variant.
#pragma once

#include <cstddef>

#include "loom/loom.h"

namespace loom {

enum class ReduceIsa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumReduceIsas = 3;

const char* reduceIsaName(ReduceIsa isa);
// True when this build contains the variant and the CPU and OS support it (kGeneric: always).
bool reduceIsaSupported(ReduceIsa isa);
// The variant reduceBuffers uses unless setReduceIsa overrides it.
ReduceIsa bestReduceIsa();
// The variant in use now.
ReduceIsa activeReduceIsa();
// Tests and benchmarks: route later calls to isa. Returns false and changes nothing when isa is not
// supported. Thread safe, but a call already running keeps the variant it started with.
bool setReduceIsa(ReduceIsa isa);

namespace reduce_internal {

// One per ISA translation unit; each entry has the contract of the public function it serves, with
// dt and op already known to be valid (and nranks > 1 for finishAverage).
struct KernelTable {
  void (*reduce)(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                 loomRedOp_t op);
  void (*finishAverage)(void* data, size_t count, loomDataType_t dt, int nranks);
  // nt[i] = copy[i] = a[i] (op) b[i]: nt (64-byte aligned) by non-temporal stores, copy by ordinary
  // ones; copy may alias a or b exactly; es is dt's size (dtype.h's helpers are not for these
  // translation units). No fence: the caller fences.
  void (*reduceTwice)(void* nt, void* copy, const void* a, const void* b, size_t count,
                      loomDataType_t dt, size_t es, loomRedOp_t op);
};

extern const KernelTable kGenericKernels;
extern const KernelTable kAvx2Kernels;    // defined only when LOOM_REDUCE_X86
extern const KernelTable kAvx512Kernels;  // defined only when LOOM_REDUCE_X86

}  // namespace reduce_internal
}  // namespace loom
