#include "src/device/kernels/reduce_host.h"

#include <cstring>

namespace loom::devk {

namespace {

using HostFn = void (*)(const ReduceArgs&);

template <int DT, int Op>
void runOne(const ReduceArgs& a) {
  reduceAll<DT, Op>(a, 0, 1);
}

struct Entry {
  int dt;
  int op;
  HostFn fn;
};

#define LOOM_DEVK_HOST_ENTRY(DT, DN, OP, ON) {DT, OP, &runOne<DT, OP>},
#define LOOM_DEVK_HOST_OF(DT, DN) LOOM_DEVK_FOR_EACH_OP(LOOM_DEVK_HOST_ENTRY, DT, DN)
const Entry kEntries[] = {LOOM_DEVK_FOR_EACH_REDUCE(LOOM_DEVK_HOST_OF)};
#undef LOOM_DEVK_HOST_OF
#undef LOOM_DEVK_HOST_ENTRY

}  // namespace

void runReduceOnHost(int dt, int op, const ReduceArgs& args) {
  const int kernelOp = op == kAvg ? kSum : op;
  for (const Entry& e : kEntries)
    if (e.dt == dt && e.op == kernelOp) return e.fn(args);
}

bool runReduceKernelOnHost(const char* name, const ReduceArgs& args) {
  for (const Entry& e : kEntries) {
    const char* n = reduceKernelName(e.dt, e.op);
    if (n && std::strcmp(n, name) == 0) {
      e.fn(args);
      return true;
    }
  }
  return false;
}

}  // namespace loom::devk
