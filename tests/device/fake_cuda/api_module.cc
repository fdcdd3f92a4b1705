// Entry points: modules and kernel launches. The kernels are Loom's own (src/device/kernels), run
// as their host build on the stream's worker, with the device pointers of their arguments
// translated to the memory's shadows.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "src/device/kernels/reduce_host.h"
#include "tests/device/fake_cuda/memory.h"
#include "tests/device/fake_cuda/streams.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants
namespace devk = loom::devk;

namespace {

constexpr int kWaitFlagOp = -1;  // Function::op of the wait kernel
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxSharedPerBlock = 49152;  // without the opt-in attribute

size_t elementSize(int dt) {
  switch (dt) {
    case devk::kInt8:
    case devk::kUint8:
      return 1;
    case devk::kFloat16:
    case devk::kBfloat16:
      return 2;
    case devk::kInt32:
    case devk::kUint32:
    case devk::kFloat32:
      return 4;
    default:
      return 8;
  }
}

// What a kernel of context c may touch: host memory known to the device, device memory of c's
// device, and another device's memory where c has peer access to it (VMM mappings: their access
// flags, checked by resolve).
bool reachable(const Resolved& r, const Context* c) {
  if (r.target == Target::kHost) return true;
  if (r.target != Target::kDevice) return false;
  const int d = r.region->device;
  return r.region->kind == RegionKind::kVmm || d == c->dev->ordinal ||
         (c->peers.load(std::memory_order_acquire) & (1u << d)) != 0;
}

// Which of Loom's kernels `name` is: fills dtype/op; false when none.
bool knownKernel(const char* name, Function* f) {
  if (std::strcmp(name, devk::kWaitFlagKernel) == 0) {
    f->op = kWaitFlagOp;
    return true;
  }
  for (int dt = 0; dt < devk::kNumDTypes; ++dt) {
    for (int op = 0; op < 4; ++op) {
      const char* n = devk::reduceKernelName(dt, op);
      if (n != nullptr && std::strcmp(n, name) == 0) {
        f->dtype = dt;
        f->op = op;
        return true;
      }
    }
  }
  return false;
}

// A reduction kernel as the device runs it: every pointer must be device or host-mapped memory
// of this process, for all count elements.
CUresult runReduce(const Function& f, const devk::ReduceArgs& a, const Context* c) {
  if (a.nsrc < 1 || a.nsrc > devk::kMaxReduceInputs) return kErrorIllegalAddress;
  if (a.ndst < 1 || a.ndst > devk::kMaxReduceOutputs) return kErrorIllegalAddress;
  if (a.count == 0) return kSuccess;
  const size_t es = elementSize(f.dtype);
  if (a.count > std::numeric_limits<size_t>::max() / es) return kErrorIllegalAddress;
  const size_t bytes = size_t(a.count) * es;
  // Keeps the memory mapped while the kernel runs.
  Resolved held[devk::kMaxReduceOutputs + devk::kMaxReduceInputs];
  devk::ReduceArgs t = a;
  for (int d = 0; d < a.ndst; ++d) {
    held[d] = resolve(reinterpret_cast<uintptr_t>(a.dst[d]), bytes, true);
    if (!reachable(held[d], c)) return kErrorIllegalAddress;
    t.dst[d] = held[d].p;
  }
  for (int s = 0; s < a.nsrc; ++s) {
    Resolved& h = held[devk::kMaxReduceOutputs + s];
    h = resolve(reinterpret_cast<uintptr_t>(a.src[s]), bytes, false);
    if (!reachable(h, c)) return kErrorIllegalAddress;
    t.src[s] = h.p;
  }
  if (!devk::runReduceKernelOnHost(f.name.c_str(), t)) return kErrorLaunchFailed;
  count(kKernelsRun);
  return kSuccess;
}

// The wait kernel: spins (interruptibly) until *flag >= value.
CUresult runWaitFlag(Stream& st, const devk::WaitFlagArgs& a) {
  const Resolved w = resolve(reinterpret_cast<uintptr_t>(a.flag), 8, false);
  if (!reachable(w, st.ctx()) || reinterpret_cast<uintptr_t>(a.flag) % 8 != 0)
    return kErrorIllegalAddress;
  const auto* word = reinterpret_cast<const uint64_t*>(w.p);
  const uint64_t value = a.value;
  if (!deviceWait(st, [&] { return __atomic_load_n(word, __ATOMIC_ACQUIRE) >= value; }))
    return waitGivenUp(st);
  count(kKernelsRun);
  return kSuccess;
}

}  // namespace

extern "C" {

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAKECUDA_ENTRY();
  if (module == nullptr || image == nullptr) return kErrorInvalidValue;
  return inContext([&](Context* c) {
    auto m = std::make_unique<Module>();
    m->ctx = c;
    m->gen = c->gen.load();
    *module = reinterpret_cast<CUmodule>(m.get());
    handles().add(&Handles::modules, std::move(m));
    count(kModules);
    return kSuccess;
  });
}

CUresult cuModuleUnload(CUmodule module) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::unique_ptr<Module> m;
    {
      Handles& t = handles();
      std::lock_guard<std::mutex> lk(t.mu);  // the module and its functions go together
      m = takeEntry(t.modules, reinterpret_cast<Module*>(module));
      if (m == nullptr) return kErrorInvalidHandle;
      for (auto& f : m->functions) t.functions.erase(f.second.get());
    }
    count(kModules, -1);
    return kSuccess;  // launches already enqueued hold their function
  });
}

CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  FAKECUDA_ENTRY();
  if (fn == nullptr || name == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    Handles& t = handles();
    std::lock_guard<std::mutex> lk(t.mu);
    auto it = t.modules.find(reinterpret_cast<Module*>(module));
    if (it == t.modules.end()) return kErrorInvalidHandle;
    Module& m = *it->second;
    auto f = m.functions.find(name);
    if (f == m.functions.end()) {
      auto nf = std::make_shared<Function>();
      if (!knownKernel(name, nf.get())) return kErrorNotFound;
      nf->module = &m;
      nf->name = name;
      t.functions[nf.get()] = nf;
      f = m.functions.emplace(name, std::move(nf)).first;
    }
    *fn = reinterpret_cast<CUfunction>(f->second.get());
    return kSuccess;
  });
}

namespace {

// Lazy loading (CUDA_MODULE_LOADING=LAZY, the driver's default since CUDA 12.2): a function not
// loaded yet is loaded by its first launch, which waits until the device is idle
// (waitForDeviceWaits).
// Marks fn loaded, counting the first time (and, for a first launch, a lazy load).
void markLoaded(Function& fn, bool lazy) {
  if (fn.loaded.exchange(true)) return;
  count(kFunctionLoads);
  if (lazy) count(kLazyLoads);
}

CUresult loadOnFirstLaunch(Function& fn) {
  if (fn.loaded.load(std::memory_order_acquire)) return kSuccess;
  FAKECUDA_TRY(waitForDeviceWaits(("the first launch of " + fn.name + ", which loads it").c_str(),
                                  "load functions before work waits: cuFuncLoad"));
  markLoaded(fn, true);
  return kSuccess;
}

}  // namespace

CUresult cuFuncLoad(CUfunction f) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::shared_ptr<Function> fn = handles().find(&Handles::functions, f);
    if (fn == nullptr) return kErrorInvalidHandle;
    markLoaded(*fn, false);
    return kSuccess;
  });
}

CUresult cuFuncGetAttribute(int* value, int attrib, CUfunction f) {
  FAKECUDA_ENTRY();
  if (value == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Function> fn = handles().find(&Handles::functions, f);
    if (fn == nullptr) return kErrorInvalidHandle;
    // Values of Loom's kernels built for sm_90: max threads per block, shared, const and local
    // bytes, registers, PTX and binary versions; others are 0.
    static const int kValues[] = {1024, 0, 0, 0, 32, 90, 90};
    if (attrib < 0 || attrib > 16) return kErrorInvalidValue;
    *value = attrib < 7 ? kValues[attrib] : 0;
    markLoaded(*fn, false);  // asking loads it, as the driver does
    return kSuccess;
  });
}

CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                        unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedBytes,
                        CUstream stream, void** params, void** extra) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::shared_ptr<Function> fn;
    Context* fnCtx = nullptr;
    uint64_t fnGen = 0;
    {
      Handles& t = handles();
      std::lock_guard<std::mutex> lk(t.mu);
      auto it = t.functions.find(reinterpret_cast<Function*>(f));
      if (it == t.functions.end()) return kErrorInvalidHandle;
      fn = it->second;
      fnCtx = fn->module->ctx;
      fnGen = fn->module->gen;
    }
    if (extra != nullptr) return kErrorNotSupported;  // parameters as one buffer: not emulated
    if (params == nullptr || params[0] == nullptr) return kErrorInvalidValue;
    if (gridX == 0 || gridY == 0 || gridZ == 0 || blockX == 0 || blockY == 0 || blockZ == 0 ||
        gridY > 65535 || gridZ > 65535 || blockX > 1024 || blockY > 1024 || blockZ > 64 ||
        uint64_t(blockX) * blockY * blockZ > kMaxThreadsPerBlock ||
        sharedBytes > kMaxSharedPerBlock)
      return kErrorInvalidValue;
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(streamOf(stream, true, &s));
    if (fnCtx != s->ctx() || fnGen != s->gen()) return kErrorInvalidHandle;
    FAKECUDA_TRY(loadOnFirstLaunch(*fn));
    const FaultKind fault = nextLaunchFault();
    count(kKernelLaunches);
    // The parameter is copied now: the caller may reuse its memory once the call returns.
    OpFn run;
    if (fn->op == kWaitFlagOp) {
      devk::WaitFlagArgs a;
      std::memcpy(&a, params[0], sizeof(a));
      run = [a](Stream& st) { return runWaitFlag(st, a); };
    } else {
      devk::ReduceArgs a;
      std::memcpy(&a, params[0], sizeof(a));
      run = [fn, a](Stream& st) { return runReduce(*fn, a, st.ctx()); };
    }
    return s->enqueue([run = std::move(run), fault](Stream& st) -> CUresult {
      if (fault == FaultKind::kIllegalAddress) return kErrorIllegalAddress;
      if (fault == FaultKind::kLostDevice) {
        st.ctx()->dev->lost.store(true, std::memory_order_release);
        return kErrorDeviceUnavailable;
      }
      return run(st);
    });
  });
}

}  // extern "C"
