#include "src/runtime/calibrate.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/reduce/reduce.h"
#include "src/runtime/one_pass.h"

namespace loom {

namespace {

// Larger than the caches of most cores (so that the speed is memory's), small enough to measure
// in a few milliseconds.
constexpr size_t kBytes = 8 << 20;
constexpr int kReps = 12;
// The one pass's staging tile for peers reached through process_vm_readv/writev (one_pass.cc).
constexpr size_t kCmaTile = 256 << 10;

// The third quartile of kReps runs. Contention (another process on the core, a page of the buffer
// not yet in the TLB) only ever slows a run, so the low runs measure the machine's noise and a
// median of 5 moved 10.5-14 GB/s between starts on a 2-core VM; the best run overstates what a
// collective sustains (the cost model's predictions were about 25% optimistic with it).
template <typename Fn>
double typicalRate(Fn fn) {
  std::vector<double> rates;
  for (int i = 0; i < kReps; ++i) {
    int64_t t0 = nowNs();
    fn();
    int64_t dt = std::max<int64_t>(1, nowNs() - t0);
    rates.push_back(static_cast<double>(kBytes) * 1e9 / static_cast<double>(dt));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() * 3 / 4];
}

KernelSpeeds measure() {
  KernelSpeeds s;
  std::unique_ptr<float[]> a(new float[kBytes / sizeof(float)]);
  std::unique_ptr<float[]> b(new float[kBytes / sizeof(float)]);
  std::unique_ptr<float[]> c(new float[kBytes / sizeof(float)]);
  for (size_t i = 0; i < kBytes / sizeof(float); ++i) a[i] = b[i] = c[i] = 1.0f;
  s.memcpyBytesPerSec = typicalRate([&] { std::memcpy(c.get(), a.get(), kBytes); });
  s.reduceBytesPerSec = typicalRate([&] {
    reduceBuffers(c.get(), a.get(), b.get(), kBytes / sizeof(float), loomFloat32, loomSum);
  });
  // The one pass's tiles (kCmaTile) between the large buffer and a cache-sized one, each way, by
  // memcpy and by process_vm_readv/writev on this process (its own pid: the same pinning and
  // copying as a peer's memory, allowed whatever ptrace's rules). On huge pages where the one
  // pass puts the buffers it reaches so (LOOM_SHM_THP, one_pass.h): the pages decide how fast
  // these calls are (1.2-1.6x on huge pages).
  std::unique_ptr<char, decltype(&std::free)> hugeBuf(
      static_cast<char*>(std::aligned_alloc(kHugePageBytes, kBytes)), &std::free);
  char* big = hugeBuf ? hugeBuf.get() : reinterpret_cast<char*>(a.get());
  if (hugeBuf) {
    std::memset(big, 1, kBytes);
    if (params::kShmThp.asBool()) collapseHugePages(big, kBytes);  // best effort
  }
  const pid_t self = getpid();
  char* tile = reinterpret_cast<char*>(c.get());
  bool refused = false;
  auto tiles = [&](bool cma) {
    for (size_t off = 0; off < kBytes; off += kCmaTile) {
      if (!cma) {
        std::memcpy(tile, big + off, kCmaTile);
        std::memcpy(big + off, tile, kCmaTile);
        continue;
      }
      iovec local{tile, kCmaTile}, remote{big + off, kCmaTile};
      refused |= process_vm_readv(self, &local, 1, &remote, 1, 0) != ssize_t(kCmaTile);
      refused |= process_vm_writev(self, &local, 1, &remote, 1, 0) != ssize_t(kCmaTile);
    }
  };
  const double copied = typicalRate([&] { tiles(false); });
  const double cma = typicalRate([&] { tiles(true); });
  if (!refused && cma > 0) s.cmaSlowdown = copied / cma;
  LOOM_INFO(kSubPlan,
            "kernel speeds on this core: memcpy {:.2f} GB/s, float32 sum {:.2f} GB/s, "
            "process_vm_readv/writev {:.1f}x memcpy's time{}",
            s.memcpyBytesPerSec / 1e9, s.reduceBytesPerSec / 1e9, s.cmaSlowdown,
            refused ? " (refused here)" : "");
  return s;
}

}  // namespace

const KernelSpeeds& localKernelSpeeds() {
  static const KernelSpeeds speeds = measure();
  return speeds;
}

}  // namespace loom
