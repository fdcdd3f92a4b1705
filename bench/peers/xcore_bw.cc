// xcore_bw: how fast two cores hand data to each other through their caches, the quantity that
// decides whether Loom's one pass passes results through the shared tiles (src/runtime/
// tile_choice.h). Two threads pinned to two CPUs of this process's affinity (the first two, or
// the two given):
//   roundtrip: one cache line passed back and forth (ns per round trip, the median of rounds);
//   handoff:   one thread fills 256 KiB tiles of a 4-tile ring, the other copies each out as it
//              is filled (GB/s of tiles moved, the best of rounds), as the result tiles are.
// On a VM whose host moves its vCPUs between cache domains, both change from run to run (the
// 2-vCPU EPYC VM: 65-130 ns or 365-490 ns).
//
//   xcore_bw [rounds] [cpuA cpuB]
//     ->  XCORE cpus=0,1 roundtrip_ns=104 handoff_gbs=24.51 rounds=5
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDeadlineSec = 30;  // every wait gives up after this

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Spins until done() or the deadline; false at the deadline (the other thread is stuck).
template <typename Done>
bool spinUntil(Done done, Clock::time_point deadline) {
  for (uint64_t i = 0; !done(); ++i)
    if ((i & 0xffff) == 0 && Clock::now() > deadline) return false;
  return true;
}

std::atomic<bool> failed{false};

// ns per round trip of one cache line between cpu a (this thread) and cpu b.
double roundTrip(int a, int b, int trips) {
  alignas(64) static std::atomic<long> flag;
  flag.store(0);
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSec);
  std::thread other([&] {
    pin(b);
    for (long i = 0; i < trips && !failed; ++i) {
      if (!spinUntil([&] { return flag.load(std::memory_order_acquire) == 2 * i + 1; }, deadline))
        failed = true;
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  pin(a);
  const auto t0 = Clock::now();
  for (long i = 0; i < trips && !failed; ++i) {
    flag.store(2 * i + 1, std::memory_order_release);
    if (!spinUntil([&] { return flag.load(std::memory_order_acquire) == 2 * i + 2; }, deadline))
      failed = true;
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / trips;
  other.join();
  return ns;
}

// GB/s of tiles filled on cpu a and copied out on cpu b.
double handoff(int a, int b, size_t total) {
  constexpr size_t kTile = 256 << 10, kTiles = 4;
  static std::vector<char> ring(kTile * kTiles), src(kTile, 1), dst(kTile);
  alignas(64) static std::atomic<long> filled, taken;
  filled.store(0);
  taken.store(0);
  const long tiles = static_cast<long>(total / kTile);
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSec);
  std::thread other([&] {
    pin(b);
    for (long j = 0; j < tiles && !failed; ++j) {
      if (!spinUntil([&] { return filled.load(std::memory_order_acquire) > j; }, deadline))
        failed = true;
      std::memcpy(dst.data(), &ring[(j % kTiles) * kTile], kTile);
      taken.store(j + 1, std::memory_order_release);
    }
  });
  pin(a);
  const auto t0 = Clock::now();
  for (long j = 0; j < tiles && !failed; ++j) {
    if (!spinUntil(
            [&] { return j - taken.load(std::memory_order_acquire) < static_cast<long>(kTiles); },
            deadline))
      failed = true;
    std::memcpy(&ring[(j % kTiles) * kTile], src.data(), kTile);
    filled.store(j + 1, std::memory_order_release);
  }
  other.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(tiles * kTile) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  int a = -1, b = -1;
  if (argc > 3) {
    a = std::atoi(argv[2]);
    b = std::atoi(argv[3]);
  } else {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
      for (int c = 0; c < CPU_SETSIZE && b < 0; ++c)
        if (CPU_ISSET(c, &set)) (a < 0 ? a : b) = c;
  }
  if (rounds < 1 || a < 0 || b < 0 || a == b) {
    if (rounds < 1)
      std::fprintf(stderr, "xcore_bw: rounds must be at least 1 (got %s)\n", argv[1]);
    else
      std::fprintf(
          stderr, "xcore_bw: needs two different CPUs (%s)\n",
          a == b && a >= 0 ? "the same one given twice" : "this process may use fewer than two");
    std::fprintf(stderr, "usage: xcore_bw [rounds] [cpuA cpuB]\n");
    return 2;
  }
  std::vector<double> trips;
  double best = 0;
  for (int r = 0; r < rounds && !failed; ++r) {
    trips.push_back(roundTrip(a, b, 100000));
    best = std::max(best, handoff(a, b, size_t(256) << 20));
  }
  if (failed) {
    std::fprintf(stderr, "xcore_bw: a thread did not answer in %d s (is cpu %d or %d usable?)\n",
                 kDeadlineSec, a, b);
    return 1;
  }
  std::sort(trips.begin(), trips.end());
  std::printf("XCORE cpus=%d,%d roundtrip_ns=%.0f handoff_gbs=%.2f rounds=%d\n", a, b,
              trips[trips.size() / 2], best, rounds);
  return 0;
}
