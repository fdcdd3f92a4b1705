// memcpy_bw: single-core memcpy bandwidth, the ceiling for any one-copy host transport.
// Copies a 64 MiB buffer (default) several times and prints the best, in decimal GB/s counted as
// bytes copied per second (read + write traffic is twice that).
//
//   memcpy_bw [MiB] [repetitions]      ->  MEMCPY bytes=67108864 reps=10 best_gbs=9.87 ...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (mib == 0 || reps < 1) {
    std::fprintf(stderr, "usage: memcpy_bw [MiB>0] [repetitions>0]\n");
    return 2;
  }
  const size_t bytes = mib << 20;
  char* src = static_cast<char*>(std::aligned_alloc(4096, bytes));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, bytes));
  if (!src || !dst) {
    std::fprintf(stderr, "memcpy_bw: cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  // Touch both so that page faults are not timed.
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 131u);
  std::memset(dst, 0, bytes);

  double best = 0, sum = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    // Keep the copy observable so it is not optimised away.
    volatile char sink = dst[(r * 4099u) % bytes];
    (void)sink;
    double gbs = static_cast<double>(bytes) / 1e9 / dt.count();
    sum += gbs;
    if (gbs > best) best = gbs;
  }
  std::printf("MEMCPY bytes=%zu reps=%d best_gbs=%.3f mean_gbs=%.3f\n", bytes, reps, best,
              sum / reps);
  std::free(src);
  std::free(dst);
  return 0;
}
