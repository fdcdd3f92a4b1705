// memcpy_bw: copy bandwidth of one core, or of several cores copying at once (the machine's
// streaming bandwidth, which bounds any collective between processes of one host). Each thread
// copies its own buffer (64 MiB by default) several times, with memcpy and (x86) with a loop of
// non-temporal stores, which skip the read of each destination line that an ordinary store costs
// (glibc's memcpy does not use them at every size on every CPU). Prints the best of each, in
// decimal GB/s counted as bytes copied per second over all threads; best_gbs is the better of the
// two and traffic_gbs twice that (reads plus writes): the machine's limit.
//
//   memcpy_bw [MiB] [repetitions] [threads]
//     ->  MEMCPY bytes=67108864 reps=10 threads=1 best_gbs=13.1 mean_gbs=12.8 traffic_gbs=26.2
//         memcpy_gbs=9.87 stream_gbs=13.1
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_util.h"

namespace {

struct Buffers {
  char* src = nullptr;
  char* dst = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  if (mib == 0 || reps < 1 || threads < 1 || threads > 1024) {
    std::fprintf(stderr, "usage: memcpy_bw [MiB>0] [repetitions>0] [threads 1..1024]\n");
    return 2;
  }
  const size_t bytes = mib << 20;
  std::vector<Buffers> bufs(threads);
  for (auto& b : bufs) {
    b.src = static_cast<char*>(std::aligned_alloc(4096, bytes));
    b.dst = static_cast<char*>(std::aligned_alloc(4096, bytes));
    if (!b.src || !b.dst) {
      std::fprintf(stderr, "memcpy_bw: cannot allocate %d x 2 x %zu bytes\n", threads, bytes);
      return 1;
    }
    // Touch both so that page faults are not timed.
    for (size_t i = 0; i < bytes; ++i) b.src[i] = static_cast<char>(i * 131u);
    std::memset(b.dst, 0, bytes);
  }

  // kind 0: memcpy; 1: non-temporal stores.
  double best[2] = {0, 0}, sum[2] = {0, 0};
  for (int r = 0; r < reps; ++r) {
    for (int kind = 0; kind < 2; ++kind) {
      auto copy = [kind, bytes](const Buffers& b) {
        if (kind == 0)
          std::memcpy(b.dst, b.src, bytes);
        else
          stream_copy(b.dst, b.src, bytes);
      };
      auto t0 = std::chrono::steady_clock::now();
      if (threads == 1) {
        copy(bufs[0]);
      } else {
        std::vector<std::thread> ts;
        for (auto& b : bufs) ts.emplace_back([&copy, &b] { copy(b); });
        for (auto& t : ts) t.join();
      }
      std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      // Keep the copies observable so they are not optimised away.
      for (auto& b : bufs) {
        volatile char sink = b.dst[(r * 4099u) % bytes];
        (void)sink;
      }
      double gbs = static_cast<double>(bytes) * threads / 1e9 / dt.count();
      sum[kind] += gbs;
      if (gbs > best[kind]) best[kind] = gbs;
    }
  }
  const int k = best[1] > best[0] ? 1 : 0;
  std::printf(
      "MEMCPY bytes=%zu reps=%d threads=%d best_gbs=%.3f mean_gbs=%.3f traffic_gbs=%.3f "
      "memcpy_gbs=%.3f stream_gbs=%.3f\n",
      bytes, reps, threads, best[k], sum[k] / reps, 2 * best[k], best[0], best[1]);
  for (auto& b : bufs) {
    std::free(b.src);
    std::free(b.dst);
  }
  return 0;
}
