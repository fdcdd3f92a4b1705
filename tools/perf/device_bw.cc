// loom-device-bw: Loom's reduction kernel against the device's own copy, in one process on one
// GPU. For float32 and bfloat16 sum, two inputs to one output: the kernel's bandwidth (bytes read
// plus written: 3x the buffer) and the device-to-device copy's (cuMemcpyAsync, 2x the buffer),
// each the best of --iters timed runs after a warm-up, and their ratio; the kernel's output is
// checked element by element. The target: ratio >= 0.90 at 256 MiB on an H200.
//
//   loom-device-bw [--bytes 256M] [--iters 20] [--device 0]
//
// Over the emulated device (LOOM_CUDA_LIB) it runs too, on the host build of the kernels: its
// figures then say nothing about a GPU, only that the tool works (tests/tools).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"
#include "src/device/kernels.h"

namespace {

namespace cuda = loom::cuda;

int usage(const char* why) {
  std::fprintf(stderr,
               "loom-device-bw: %s\nusage: loom-device-bw [--bytes N[K|M|G]] [--iters N] "
               "[--device N]\n",
               why);
  return 2;
}

bool parseBytes(const char* s, size_t* out) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || v <= 0) return false;
  double mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1024.0, ++end;
  if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, ++end;
  if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

// The best time (seconds) of iters runs of fn on stream, after one warm-up.
template <class Fn>
double bestOf(int iters, cuda::CUstream stream, Fn fn, bool* ok) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  double best = 1e30;
  for (int i = 0; i <= iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!fn() || api.cuStreamSynchronize(stream) != cuda::kSuccess) {
      *ok = false;
      return 0;
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, t);
  }
  return best;
}

// Element values of a datatype as bits: 1.0, 2.0 and 3.0.
uint32_t f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t(256) << 20;
  int iters = 20, device = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing the value of " + a).c_str());
    if (a == "--bytes") {
      if (!parseBytes(argv[++i], &bytes)) return usage("--bytes: a size such as 256M");
    } else if (a == "--iters") {
      iters = std::atoi(argv[++i]);
      if (iters < 1) return usage("--iters: at least 1");
    } else if (a == "--device") {
      device = std::atoi(argv[++i]);
    } else {
      return usage(("unknown argument " + a).c_str());
    }
  }
  const cuda::Driver& drv = cuda::cudaDriver();
  if (!drv.ok()) {
    std::fprintf(stderr, "loom-device-bw: no usable CUDA driver: %s\n",
                 drv.status.message().c_str());
    return 77;
  }
  loom::Status st = loom::device::useDevice(device);
  if (!st.isOk()) {
    std::fprintf(stderr, "loom-device-bw: %s\n", st.message().c_str());
    return 1;
  }
  const cuda::DriverApi& api = drv.api;
  char name[256] = {};
  cuda::CUdevice dev = 0;
  api.cuDeviceGet(&dev, device);
  api.cuDeviceGetName(name, sizeof(name), dev);
  bytes = bytes / 16 * 16;
  cuda::CUdeviceptr a = 0, b = 0, dst = 0;
  cuda::CUstream stream = nullptr;
  if (api.cuMemAlloc(&a, bytes) != 0 || api.cuMemAlloc(&b, bytes) != 0 ||
      api.cuMemAlloc(&dst, bytes) != 0 || api.cuStreamCreate(&stream, cuda::kStreamNonBlocking)) {
    std::fprintf(stderr, "loom-device-bw: cannot allocate 3 x %zu bytes on device %d\n", bytes,
                 device);
    return 1;
  }
  std::printf("# loom-device-bw: device %d (%s), %zu bytes per buffer, best of %d\n", device, name,
              bytes, iters);
  std::printf("# %-9s %14s %14s %8s\n", "type", "reduce GB/s", "copy GB/s", "ratio");
  int rc = 0;
  for (loomDataType_t dt : {loomFloat32, loomBfloat16}) {
    const size_t es = loom::dataTypeSize(dt), count = bytes / es;
    // Inputs 1 and 2 (exact in both types); the sum is 3.
    auto fill = [&](cuda::CUdeviceptr p, float v) {
      std::vector<uint8_t> host(bytes);
      const uint32_t bits = f32(v);
      for (size_t i = 0; i < count; ++i) {
        if (es == 4)
          std::memcpy(&host[i * 4], &bits, 4);
        else {
          const uint16_t hi = static_cast<uint16_t>(bits >> 16);
          std::memcpy(&host[i * 2], &hi, 2);
        }
      }
      return api.cuMemcpyAsync(p, reinterpret_cast<cuda::CUdeviceptr>(host.data()), bytes,
                               stream) == 0 &&
             api.cuStreamSynchronize(stream) == 0;
    };
    if (!fill(a, 1.0f) || !fill(b, 2.0f)) {
      std::fprintf(stderr, "loom-device-bw: filling the inputs failed\n");
      return 1;
    }
    bool ok = true;
    const void* srcs[] = {reinterpret_cast<void*>(a), reinterpret_cast<void*>(b)};
    const double tReduce = bestOf(
        iters, stream,
        [&] {
          return loom::device::launchReduce(stream, reinterpret_cast<void*>(dst), srcs, 2, count,
                                            dt, loomSum, 0)
              .isOk();
        },
        &ok);
    // Check the output of the last run.
    std::vector<uint8_t> out(bytes);
    size_t wrong = 0;
    if (ok &&
        api.cuMemcpyAsync(reinterpret_cast<cuda::CUdeviceptr>(out.data()), dst, bytes, stream) ==
            0 &&
        api.cuStreamSynchronize(stream) == 0) {
      const uint32_t three = f32(3.0f);
      for (size_t i = 0; i < count; ++i) {
        const bool good = es == 4 ? std::memcmp(&out[i * 4], &three, 4) == 0
                                  : uint32_t(out[i * 2] | out[i * 2 + 1] << 8) == (three >> 16);
        wrong += good ? 0 : 1;
      }
    } else {
      ok = false;
    }
    const double tCopy = bestOf(
        iters, stream, [&] { return api.cuMemcpyAsync(dst, a, bytes, stream) == 0; }, &ok);
    if (!ok) {
      std::fprintf(stderr, "loom-device-bw: %s: a launch or copy failed\n", loom::dataTypeName(dt));
      return 1;
    }
    const double reduceGBs = 3.0 * bytes / tReduce / 1e9, copyGBs = 2.0 * bytes / tCopy / 1e9;
    std::printf("  %-9s %14.1f %14.1f %8.3f   #wrong %zu\n", loom::dataTypeName(dt), reduceGBs,
                copyGBs, reduceGBs / copyGBs, wrong);
    if (wrong) rc = 1;
  }
  api.cuStreamDestroy(stream);
  api.cuMemFree(a);
  api.cuMemFree(b);
  api.cuMemFree(dst);
  return rc;
}
