// cma_bw: what one core moves through process_vm_readv/writev (cross-memory attach, the system
// calls that reach another process's plain memory, as Loom's one pass and Open MPI's CMA use
// them), against what the same core moves with its own loads and stores, on buffers that are not
// in the caches (each measurement at the next offset of a pool larger than the last-level cache,
// as nccl-tests' sweep rotates). Each row: bytes moved per second, in decimal GB/s, the best of the
// repetitions; tiles of --tile bytes (Loom's one pass uses 256 KiB), the local side one tile that
// stays in the cache ("hot") or the cold pool. With 4 KiB pages, then with transparent huge pages
// (madvise) where the kernel offers them. The calls target this process's own pid: the same page
// pinning and copy as to another process's memory. Last, both sides one cached tile read again and
// again: what the kernel's walk costs without memory traffic, against memcpy of the same bytes,
// and the difference per 4 KiB page (the pinning, mapping and unpinning of each page, which huge
// pages do not remove: the kernel copies page by page).
//
//   cma_bw [MiB per measurement] [repetitions] [tile KiB]
//     ->  CMA pages=4k readv_cold_to_hot=6.9 writev_hot_to_cold=6.5 readv_cold_to_cold=4.8
//             load_cold_to_hot=10.3 store_hot_to_cold=8.7 stream_hot_to_cold=16.0
//             readv_hot_to_hot=10.4 load_hot_to_hot=43.5 kernel_ns_per_page=300
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "bench_util.h"

namespace {

// Moves bytes between local and remote (this process's own memory, through the kernel), whole.
bool cma(bool write, char* local, char* remote, size_t bytes) {
  const pid_t self = getpid();
  for (size_t done = 0; done < bytes;) {
    iovec l{local + done, bytes - done}, r{remote + done, bytes - done};
    ssize_t n =
        write ? process_vm_writev(self, &l, 1, &r, 1, 0) : process_vm_readv(self, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      std::fprintf(stderr, "cma_bw: process_vm_%s: %s\n", write ? "writev" : "readv",
                   n < 0 ? std::strerror(errno) : "no progress");
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const size_t tileKib = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 256;
  if (mib == 0 || mib > (1 << 16) || reps < 1 || tileKib == 0 || tileKib * 1024 > (mib << 20)) {
    std::fprintf(stderr, "usage: cma_bw [MiB>0] [repetitions>0] [tile KiB, at most the MiB]\n");
    return 2;
  }
  const size_t call = mib << 20, tile = tileKib << 10;
  const size_t slots = 8;  // the pool: 8 measurements apart before a buffer comes back
  const size_t pool = call * slots;
  for (bool huge : {false, true}) {
    void* a = mmap(nullptr, pool, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* b = mmap(nullptr, pool, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* t = std::aligned_alloc(4096, tile);
    if (a == MAP_FAILED || b == MAP_FAILED || !t) {
      std::fprintf(stderr, "cma_bw: cannot allocate 2 x %zu bytes\n", pool);
      return 1;
    }
    if (huge && (madvise(a, pool, MADV_HUGEPAGE) != 0 || madvise(b, pool, MADV_HUGEPAGE) != 0)) {
      std::printf("CMA pages=thp unavailable (madvise: %s)\n", std::strerror(errno));
      munmap(a, pool);
      munmap(b, pool);
      std::free(t);
      break;
    }
    char* src = static_cast<char*>(a);
    char* dst = static_cast<char*>(b);
    char* hot = static_cast<char*>(t);
    std::memset(src, 1, pool);  // touched: every page is there before the first measurement
    std::memset(dst, 2, pool);
    std::memset(hot, 3, tile);
    size_t slot = 0;
    bool ok = true;
    // One measurement: fn(offset into the pool's next call-sized slot, tile-sized piece).
    auto best = [&](const std::function<bool(size_t)>& fn) {
      double sec = 1e30;
      for (int r = 0; r < reps && ok; ++r) {
        const size_t base = (slot++ % slots) * call;
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t o = 0; o < call && ok; o += tile) ok = fn(base + o);
        sec = std::min(
            sec, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return call / sec / 1e9;
    };
    const double readHot = best([&](size_t o) { return cma(false, hot, src + o, tile); });
    const double writeCold = best([&](size_t o) { return cma(true, hot, dst + o, tile); });
    const double readCold = best([&](size_t o) { return cma(false, dst + o, src + o, tile); });
    const double loadHot = best([&](size_t o) {
      std::memcpy(hot, src + o, tile);
      return true;
    });
    const double storeCold = best([&](size_t o) {
      std::memcpy(dst + o, hot, tile);
      return true;
    });
    const double streamCold = best([&](size_t o) {
      stream_copy(dst + o, hot, tile);
      return true;
    });
    // The pool's first tile, on the pool's pages, read again and again: in the cache after the
    // first time.
    const double readHotHot = best([&](size_t) { return cma(false, hot, src, tile); });
    const double loadHotHot = best([&](size_t) {
      std::memcpy(hot, src, tile);
      asm volatile("" : : "r"(hot) : "memory");  // each copy happens
      return true;
    });
    if (!ok) return 1;
    const double nsPerPage = (1 / readHotHot - 1 / loadHotHot) * 4096;  // GB/s: bytes per ns
    std::printf(
        "CMA pages=%s tile=%zu readv_cold_to_hot=%.2f writev_hot_to_cold=%.2f "
        "readv_cold_to_cold=%.2f load_cold_to_hot=%.2f store_hot_to_cold=%.2f "
        "stream_hot_to_cold=%.2f readv_hot_to_hot=%.2f load_hot_to_hot=%.2f "
        "kernel_ns_per_page=%.0f\n",
        huge ? "thp" : "4k", tile, readHot, writeCold, readCold, loadHot, storeCold, streamCold,
        readHotHot, loadHotHot, nsPerPage);
    munmap(a, pool);
    munmap(b, pool);
    std::free(t);
  }
  return 0;
}
