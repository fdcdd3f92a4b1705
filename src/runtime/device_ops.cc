#include "src/runtime/device_ops.h"

#include "src/device/kernels.h"

namespace loom {

namespace {

cuda::CUdeviceptr dptr(const void* p) { return reinterpret_cast<cuda::CUdeviceptr>(p); }

}  // namespace

DeviceOps::~DeviceOps() {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  if (!pending_.empty()) api.cuStreamSynchronize(stream_);
  for (const Pending& p : pending_) api.cuEventDestroy(p.event);
  for (cuda::CUevent e : spare_) api.cuEventDestroy(e);
}

Status DeviceOps::track(uint64_t token) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUevent ev = nullptr;
  if (!spare_.empty()) {
    ev = spare_.back();
    spare_.pop_back();
  } else {
    LOOM_CU(api.cuEventCreate(&ev, cuda::kEventDisableTiming));
  }
  const cuda::CUresult rc = api.cuEventRecord(ev, stream_);
  if (rc != cuda::kSuccess) {
    spare_.push_back(ev);
    return cuda::cudaError(rc, "cuEventRecord");
  }
  pending_.push_back({ev, token});
  return Status();
}

Status DeviceOps::copy(void* dst, const void* src, size_t bytes, uint64_t token) {
  if (bytes && dst != src)
    LOOM_CU(cuda::cudaDriver().api.cuMemcpyAsync(dptr(dst), dptr(src), bytes, stream_));
  return track(token);
}

Status DeviceOps::reduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                         loomRedOp_t op, uint64_t token) {
  const void* srcs[] = {a, b};
  if (count) LOOM_TRY(device::launchReduce(stream_, dst, srcs, 2, count, dt, op, 0));
  return track(token);
}

Status DeviceOps::sync(const char* what) {
  const cuda::CUresult rc = cuda::cudaDriver().api.cuStreamSynchronize(stream_);
  if (rc != cuda::kSuccess) return cuda::cudaError(rc, "cuStreamSynchronize").withContext(what);
  return Status();
}

Status DeviceOps::copyNow(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src)
    LOOM_CU(cuda::cudaDriver().api.cuMemcpyAsync(dptr(dst), dptr(src), bytes, stream_));
  return sync("a device copy of the executor");
}

Status DeviceOps::divideNow(void* buf, size_t count, loomDataType_t dt, int n) {
  const void* srcs[] = {buf};
  if (count) LOOM_TRY(device::launchReduce(stream_, buf, srcs, 1, count, dt, loomAvg, n));
  return sync("the division of an average on the device");
}

Status DeviceOps::zeroNow(void* p, size_t bytes) {
  if (bytes) LOOM_CU(cuda::cudaDriver().api.cuMemsetD8Async(dptr(p), 0, bytes, stream_));
  return sync("zeroing device scratch");
}

Status DeviceOps::poll(std::vector<uint64_t>* done) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  while (!pending_.empty()) {
    const cuda::CUresult rc = api.cuEventQuery(pending_.front().event);
    if (rc == cuda::kErrorNotReady) break;
    if (rc != cuda::kSuccess)
      return cuda::cudaError(rc, "cuEventQuery").withContext("a copy or reduction on the device");
    done->push_back(pending_.front().token);
    spare_.push_back(pending_.front().event);
    pending_.pop_front();
  }
  return Status();
}

}  // namespace loom
