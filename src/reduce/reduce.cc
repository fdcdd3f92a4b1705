// Public entry points: validate nothing (the caller does), ignore what is unknown, and forward to
// the kernel table of the best instruction set this CPU supports, chosen once at first use.
#include "src/reduce/reduce.h"

#include <atomic>
#include <initializer_list>

#include "src/core/dtype.h"
#include "src/reduce/reduce_isa.h"

namespace loom {
namespace {

using reduce_internal::KernelTable;

const KernelTable* tableFor(ReduceIsa isa) {
  switch (isa) {
#if defined(LOOM_REDUCE_X86)
    case ReduceIsa::kAvx512:
      return &reduce_internal::kAvx512Kernels;
    case ReduceIsa::kAvx2:
      return &reduce_internal::kAvx2Kernels;
#endif
    default:
      return &reduce_internal::kGenericKernels;
  }
}

// The table in force; null until first use. Tables are immutable constants, so relaxed loads and
// stores suffice.
std::atomic<const KernelTable*> activeTable{nullptr};

const KernelTable* table() {
  const KernelTable* t = activeTable.load(std::memory_order_relaxed);
  if (t == nullptr) {
    t = tableFor(bestReduceIsa());
    activeTable.store(t, std::memory_order_relaxed);
  }
  return t;
}

}  // namespace

const char* reduceIsaName(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kGeneric:
      return "generic";
    case ReduceIsa::kAvx2:
      return "avx2";
    case ReduceIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool reduceIsaSupported(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kGeneric:
      return true;
#if defined(LOOM_REDUCE_X86)
    // __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state (XCR0).
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    default:
      return false;
  }
}

ReduceIsa bestReduceIsa() {
  static const ReduceIsa best = [] {
    for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2}) {
      if (reduceIsaSupported(isa)) return isa;
    }
    return ReduceIsa::kGeneric;
  }();
  return best;
}

ReduceIsa activeReduceIsa() {
  const KernelTable* t = table();
  for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2}) {
    if (reduceIsaSupported(isa) && t == tableFor(isa)) return isa;
  }
  return ReduceIsa::kGeneric;
}

bool setReduceIsa(ReduceIsa isa) {
  if (!reduceIsaSupported(isa)) return false;
  activeTable.store(tableFor(isa), std::memory_order_relaxed);
  return true;
}

void reduceBuffers(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                   loomRedOp_t op) {
  if (count == 0 || !validDataType(dt) || !validRedOp(op)) return;
  table()->reduce(dst, a, b, count, dt, op);
}

void finishAverage(void* data, size_t count, loomDataType_t dt, int nranks) {
  if (count == 0 || nranks <= 1 || !validDataType(dt)) return;
  table()->finishAverage(data, count, dt, nranks);
}

}  // namespace loom
