#include "src/device/kernels.h"

#include <cstring>
#include <map>
#include <mutex>

#include "src/core/dtype.h"

// The module image, embedded by src/device/CMakeLists.txt (kernels_image.cc).
extern "C" const unsigned char loom_device_image[];
extern "C" const unsigned char loom_device_image_end[];

namespace loom::device {

namespace {

constexpr char kPlaceholder[] = "LOOM-NO-DEVICE-CODE";
constexpr int kThreads = 256;

struct ContextKernels {
  cuda::CUmodule module = nullptr;
  int sms = 1;
  cuda::CUfunction reduce[devk::kNumDTypes][4] = {};
  cuda::CUfunction waitFlag = nullptr;
};

std::mutex gMu;
std::map<cuda::CUcontext, ContextKernels>& contexts() {
  static auto* m = new std::map<cuda::CUcontext, ContextKernels>();  // never destroyed
  return *m;
}

Result<ContextKernels*> kernelsOfCurrent() {
  const cuda::Driver& drv = cuda::cudaDriver();
  if (!drv.ok()) return drv.status;
  cuda::CUcontext ctx = nullptr;
  LOOM_CU(drv.api.cuCtxGetCurrent(&ctx));
  if (!ctx) return LOOM_ERROR(kCuda, "no CUDA context is current on this thread");
  std::lock_guard<std::mutex> lk(gMu);
  ContextKernels& k = contexts()[ctx];
  if (k.module) return &k;
  cuda::CUresult rc = drv.api.cuModuleLoadData(&k.module, loom_device_image);
  if (rc != cuda::kSuccess) {
    k.module = nullptr;
    if (!imageHasDeviceCode())
      return LOOM_ERROR(kCuda,
                        "Loom was built without device kernels (nvcc was not found at build "
                        "time), so device reductions cannot run on this GPU");
    return cuda::cudaError(rc, "cuModuleLoadData of Loom's kernels");
  }
  cuda::CUdevice dev = 0;
  if (drv.api.cuCtxGetDevice(&dev) == cuda::kSuccess)
    drv.api.cuDeviceGetAttribute(&k.sms, cuda::kAttrMultiprocessorCount, dev);
  if (k.sms < 1) k.sms = 1;
  // Every function now, and loaded now: with lazy loading (CUDA_MODULE_LOADING=LAZY, the default
  // since CUDA 12.2) a kernel's first launch loads its code into the context, which waits for the
  // device's other work, and that may be a user's stream waiting for the very call the kernel
  // serves (NCCL loads its kernels at init for the same reason).
  auto load = [&](cuda::CUfunction* fn, const char* name) -> Status {
    LOOM_CU(drv.api.cuModuleGetFunction(fn, k.module, name));
    int ignored = 0;
    if (drv.api.cuFuncLoad) {
      LOOM_CU(drv.api.cuFuncLoad(*fn));
    } else if (drv.api.cuFuncGetAttribute) {
      LOOM_CU(drv.api.cuFuncGetAttribute(&ignored, cuda::kFuncAttrMaxThreadsPerBlock, *fn));
    }
    return Status();
  };
  Status st;
  for (int d = 0; d < devk::kNumDTypes && st.isOk(); ++d)
    for (int o = 0; o < 4 && st.isOk(); ++o)
      st = load(&k.reduce[d][o], devk::reduceKernelName(d, o));
  if (st.isOk()) st = load(&k.waitFlag, devk::kWaitFlagKernel);
  if (!st.isOk()) {
    drv.api.cuModuleUnload(k.module);
    k = ContextKernels{};
    return st.withContext("loading Loom's kernels");
  }
  return &k;
}

}  // namespace

bool imageHasDeviceCode() {
  const size_t bytes = static_cast<size_t>(loom_device_image_end - loom_device_image);
  return !(bytes >= sizeof(kPlaceholder) - 1 &&
           std::memcmp(loom_device_image, kPlaceholder, sizeof(kPlaceholder) - 1) == 0);
}

Status loadKernels() { return kernelsOfCurrent().status(); }

Status launchReduce(cuda::CUstream stream, void* dst, const void* const* srcs, int nsrc,
                    size_t count, loomDataType_t dt, loomRedOp_t op, int divideBy) {
  return launchReduceTo(stream, &dst, 1, srcs, nsrc, count, dt, op, divideBy);
}

Status launchReduceTo(cuda::CUstream stream, void* const* dsts, int ndst, const void* const* srcs,
                      int nsrc, size_t count, loomDataType_t dt, loomRedOp_t op, int divideBy) {
  if (nsrc < 1 || nsrc > devk::kMaxReduceInputs || ndst < 1 || ndst > devk::kMaxReduceOutputs)
    return LOOM_ERROR(kInternal, "device reduction of {} inputs (1..{}) to {} outputs (1..{})",
                      nsrc, devk::kMaxReduceInputs, ndst, devk::kMaxReduceOutputs);
  if (count == 0) return Status();
  LOOM_ASSIGN(ContextKernels * k, kernelsOfCurrent());
  const int dti = static_cast<int>(dt), opi = op == loomAvg ? static_cast<int>(loomSum) : op;
  if (dti < 0 || dti >= devk::kNumDTypes || opi < 0 || opi > 3)
    return LOOM_ERROR(kInternal, "no device reduction for datatype {} op {}", dti, opi);
  const cuda::CUfunction fn = k->reduce[dti][opi];  // resolved and loaded with the module
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  devk::ReduceArgs args{};
  for (int d = 0; d < ndst; ++d) args.dst[d] = dsts[d];
  args.ndst = ndst;
  for (int s = 0; s < nsrc; ++s) args.src[s] = srcs[s];
  args.nsrc = nsrc;
  args.divideBy = op == loomAvg ? divideBy : 0;
  args.count = count;
  // One thread per 16-byte vector, in blocks of kThreads, at most 8 blocks per SM (the loop is
  // grid-stride).
  const size_t vecs = (count * dataTypeSize(dt) + 15) / 16;
  size_t blocks = (vecs + kThreads - 1) / kThreads;
  blocks = std::max<size_t>(1, std::min<size_t>(blocks, static_cast<size_t>(k->sms) * 8));
  void* params[] = {&args};
  LOOM_CU(api.cuLaunchKernel(fn, static_cast<unsigned>(blocks), 1, 1, kThreads, 1, 1, 0, stream,
                             params, nullptr));
  return Status();
}

Status launchWaitFlag(cuda::CUstream stream, const uint64_t* flag, uint64_t value) {
  LOOM_ASSIGN(ContextKernels * k, kernelsOfCurrent());
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  devk::WaitFlagArgs args{flag, value};
  void* params[] = {&args};
  LOOM_CU(api.cuLaunchKernel(k->waitFlag, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
  return Status();
}

}  // namespace loom::device
