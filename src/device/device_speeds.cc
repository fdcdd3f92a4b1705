#include "src/device/device_speeds.h"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/device/cuda_driver.h"
#include "src/device/kernels.h"

namespace loom::device {

namespace {

constexpr size_t kBytes = 8 << 20;
constexpr int kReps = 5;

// Device memory, pinned memory and a stream for the measurement. The stream goes when done; the
// memory stays for the process (at most 32 MiB a device, measured once): cuMemFree and
// cuMemFreeHost synchronize the device, and a stream of this process may be waiting for a call
// this thread has yet to make (ranks as threads sharing a GPU): freeing here could hang.
struct Scratch {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  cuda::CUdeviceptr a = 0, b = 0, c = 0;
  void* pinned = nullptr;
  cuda::CUstream stream = nullptr;
  ~Scratch() {
    if (stream) {
      api.cuStreamSynchronize(stream);
      api.cuStreamDestroy(stream);
    }
  }
};

// The third quartile of kReps rates of fn (enqueues bytes of work on the stream), each timed
// from enqueue to the stream's completion.
Result<double> rateOf(Scratch& s, size_t bytes, const std::function<Status()>& fn) {
  std::vector<double> rates;
  for (int i = 0; i < kReps; ++i) {
    const int64_t t0 = nowNs();
    LOOM_TRY(fn());
    LOOM_CU(s.api.cuStreamSynchronize(s.stream));
    const int64_t dt = std::max<int64_t>(1, nowNs() - t0);
    rates.push_back(static_cast<double>(bytes) * 1e9 / static_cast<double>(dt));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() * 3 / 4];
}

// Copies from the next device's memory into this one's (0 where there is none, or no peer access,
// or anything fails: the model then does not price peer paths). The current context stays.
double peerRate(int device) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  int count = 0, can = 0;
  if (!api.cuDeviceCanAccessPeer || !api.cuCtxEnablePeerAccess ||
      api.cuDeviceGetCount(&count) != cuda::kSuccess || count < 2)
    return 0;
  const int peer = (device + 1) % count;
  if (api.cuDeviceCanAccessPeer(&can, device, peer) != cuda::kSuccess || !can) return 0;
  cuda::CUcontext mine = nullptr, theirs = nullptr;
  if (api.cuCtxGetCurrent(&mine) != cuda::kSuccess ||
      api.cuDevicePrimaryCtxRetain(&theirs, peer) != cuda::kSuccess)
    return 0;
  cuda::CUdeviceptr remote = 0;
  if (api.cuCtxSetCurrent(theirs) != cuda::kSuccess) return 0;
  const bool allocated = api.cuMemAlloc(&remote, kBytes) == cuda::kSuccess;
  api.cuCtxSetCurrent(mine);
  double rate = 0;
  const cuda::CUresult on = api.cuCtxEnablePeerAccess(theirs, 0);
  if (allocated && (on == cuda::kSuccess || on == cuda::kErrorPeerAccessAlreadyEnabled)) {
    Scratch s;
    if (s.api.cuStreamCreate(&s.stream, cuda::kStreamNonBlocking) == cuda::kSuccess &&
        s.api.cuMemAlloc(&s.a, kBytes) == cuda::kSuccess) {
      Result<double> r = rateOf(s, kBytes, [&]() -> Status {
        LOOM_CU(api.cuMemcpyAsync(s.a, remote, kBytes, s.stream));
        return Status();
      });
      if (r.isOk()) rate = r.value();
    }
  }
  // remote stays allocated, and the peer's context retained, for the reason Scratch gives.
  return rate;
}

Result<DeviceSpeeds> measure(int device) {
  Scratch s;
  const cuda::DriverApi& api = s.api;
  LOOM_CU(api.cuStreamCreate(&s.stream, cuda::kStreamNonBlocking));
  LOOM_CU(api.cuMemAlloc(&s.a, kBytes));
  LOOM_CU(api.cuMemAlloc(&s.b, kBytes));
  LOOM_CU(api.cuMemAlloc(&s.c, kBytes));
  LOOM_CU(api.cuMemHostAlloc(&s.pinned, kBytes, cuda::kMemHostAllocPortable));
  LOOM_CU(api.cuMemsetD8Async(s.a, 0, kBytes, s.stream));
  LOOM_CU(api.cuMemsetD8Async(s.b, 0, kBytes, s.stream));
  const auto host = reinterpret_cast<cuda::CUdeviceptr>(s.pinned);
  DeviceSpeeds d;
  d.device = device;
  auto copy = [&](cuda::CUdeviceptr dst, cuda::CUdeviceptr src, size_t bytes) {
    return [&api, &s, dst, src, bytes]() -> Status {
      LOOM_CU(api.cuMemcpyAsync(dst, src, bytes, s.stream));
      return Status();
    };
  };
  LOOM_ASSIGN(d.toHostBytesPerSec, rateOf(s, kBytes, copy(host, s.a, kBytes)));
  LOOM_ASSIGN(d.toDeviceBytesPerSec, rateOf(s, kBytes, copy(s.a, host, kBytes)));
  LOOM_ASSIGN(d.copyBytesPerSec, rateOf(s, kBytes, copy(s.c, s.a, kBytes)));
  LOOM_ASSIGN(double tiny, rateOf(s, 1, copy(s.c, s.a, 4)));
  d.launchSec = 1.0 / tiny;
  if (loadKernels().isOk()) {
    const void* srcs[] = {reinterpret_cast<const void*>(s.a), reinterpret_cast<const void*>(s.b)};
    void* dst = reinterpret_cast<void*>(s.c);
    Result<double> r = rateOf(s, kBytes, [&]() -> Status {
      return launchReduce(s.stream, dst, srcs, 2, kBytes / sizeof(float), loomFloat32, loomSum, 0);
    });
    if (r.isOk()) d.reduceBytesPerSec = r.value();
  }
  d.peerBytesPerSec = peerRate(device);
  LOOM_INFO(kSubPlan,
            "CUDA device {} speeds: to host {:.1f} GB/s, to device {:.1f} GB/s, device copy "
            "{:.1f} GB/s, float32 sum kernel {:.1f} GB/s, an operation {:.1f} us, from a peer GPU "
            "{:.1f} GB/s (0: none)",
            device, d.toHostBytesPerSec / 1e9, d.toDeviceBytesPerSec / 1e9, d.copyBytesPerSec / 1e9,
            d.reduceBytesPerSec / 1e9, d.launchSec * 1e6, d.peerBytesPerSec / 1e9);
  return d;
}

}  // namespace

Result<DeviceSpeeds> currentDeviceSpeeds() {
  const cuda::Driver& drv = cuda::cudaDriver();
  if (!drv.ok()) return drv.status;
  cuda::CUcontext ctx = nullptr;
  cuda::CUdevice dev = -1;
  if (drv.api.cuCtxGetCurrent(&ctx) != cuda::kSuccess || ctx == nullptr ||
      drv.api.cuCtxGetDevice(&dev) != cuda::kSuccess)
    return LOOM_ERROR(kInvalidUsage, "no CUDA context is current on this thread");
  static std::mutex mu;
  static auto* known = new std::map<int, DeviceSpeeds>();  // never destroyed: used at exit
  std::lock_guard<std::mutex> lk(mu);
  auto it = known->find(dev);
  if (it != known->end()) return it->second;
  LOOM_ASSIGN(DeviceSpeeds d, measure(dev));
  known->emplace(dev, d);
  return d;
}

}  // namespace loom::device
