// push_bw: two ways for a rank of a 2-rank AllReduce to get the half of its peer's input it
// reduces, on plain (private) buffers of two processes, measured in the same run:
//   cma:  it reads the peer's half itself, with process_vm_readv in 256 KiB pieces into a stage
//         (what Loom's one pass does: the kernel pins the peer's pages one by one);
//   push: the peer copies that half into a ring of 4 x 256 KiB in shared memory, and the rank
//         reduces from the ring (no page pinned; one more copy, through the caches).
// Each call reduces the rank's half (float32 sum) into its output; the buffers are 64 MiB pools
// on 4 KiB pages, then on transparent huge pages (madvise), each call at the next offset (cold, as
// nccl-tests' sweep). The two ways take turns in rounds; each keeps its best round.
//
//   push_bw [MiB sizes, comma-separated] [rounds] [calls per round]
//     ->  PUSH size=1M pages=4k cma_ms=0.177 push_ms=0.115 push_over_cma=0.65
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

constexpr size_t kPool = 64 << 20, kPiece = 256 << 10;
constexpr uint64_t kRing = 4;
constexpr double kDeadlineSec = 30;

struct Shared {
  std::atomic<uint64_t> arrived[2];
  std::atomic<uint64_t> pushed[2];  // pieces a rank has put in its ring
  std::atomic<uint64_t> taken[2];   // pieces a rank has reduced from its peer's ring
  std::atomic<int> failed;
  uint64_t input[2];  // each rank's input pool, for process_vm_readv
  int pid[2];
  alignas(64) char ring[2][kRing][kPiece];
};

// Spins until done(); exits the process when the peer failed or after the deadline.
template <class Done>
void waitFor(Shared* sh, Done done, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t spins = 0; !done(); ++spins) {
    if ((spins & 0xffff) != 0) continue;
    if (sh->failed.load() ||
        std::chrono::steady_clock::now() - start > std::chrono::duration<double>(kDeadlineSec)) {
      std::fprintf(stderr, "push_bw: gave up waiting for %s\n", what);
      sh->failed.store(1);
      std::exit(1);
    }
  }
}

void barrier(Shared* sh, int me, uint64_t* gen) {
  sh->arrived[me].store(++*gen, std::memory_order_release);
  waitFor(
      sh, [&] { return sh->arrived[1 - me].load(std::memory_order_acquire) >= *gen; },
      "the peer at a barrier");
}

void reduce(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

struct Rank {
  Shared* sh;
  int me;
  char* in;
  char* out;
  char* stage;
  uint64_t gen = 0, pushed = 0, taken = 0;
  size_t call = 0;

  // One call of `bytes` (this rank reduces its half), the peer's half by cma or push.
  void run(size_t bytes, bool push) {
    const int peer = 1 - me;
    const size_t half = bytes / 2, base = (call++ % (kPool / bytes)) * bytes;
    const size_t mine = base + static_cast<size_t>(me) * half;
    const size_t theirs = base + static_cast<size_t>(peer) * half;
    for (size_t o = 0; o < half; o += kPiece) {
      const size_t len = std::min(kPiece, half - o);
      const float* b;
      if (!push) {
        iovec l{stage, len}, r{reinterpret_cast<void*>(sh->input[peer] + mine + o), len};
        if (process_vm_readv(sh->pid[peer], &l, 1, &r, 1, 0) != static_cast<ssize_t>(len)) {
          std::fprintf(stderr, "push_bw: process_vm_readv: %s\n", std::strerror(errno));
          sh->failed.store(1);
          std::exit(1);
        }
        b = reinterpret_cast<const float*>(stage);
      } else {
        waitFor(
            sh, [&] { return pushed - sh->taken[peer].load(std::memory_order_acquire) < kRing; },
            "a free slot of the ring");
        std::memcpy(sh->ring[me][pushed % kRing], in + theirs + o, len);
        sh->pushed[me].store(++pushed, std::memory_order_release);
        waitFor(
            sh, [&] { return sh->pushed[peer].load(std::memory_order_acquire) > taken; },
            "the peer's piece");
        b = reinterpret_cast<const float*>(sh->ring[peer][taken % kRing]);
      }
      reduce(reinterpret_cast<float*>(out + mine + o),
             reinterpret_cast<const float*>(in + mine + o), b, len / sizeof(float));
      if (push) sh->taken[me].store(++taken, std::memory_order_release);
    }
    barrier(sh, me, &gen);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (const char* p = argc > 1 ? argv[1] : "1,4,16"; *p;) {
    char* end = nullptr;
    const unsigned long long mib = std::strtoull(p, &end, 10);
    if (end == p || mib == 0 || (mib << 20) > kPool / 2) {
      std::fprintf(stderr, "push_bw: bad size list '%s' (MiB, 1 to %zu)\n", argv[1], kPool >> 21);
      return 2;
    }
    sizes.push_back(static_cast<size_t>(mib) << 20);
    p = *end == ',' ? end + 1 : end;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 6, calls = argc > 3 ? std::atoi(argv[3]) : 20;
  if (rounds <= 0 || calls <= 0) {
    std::fprintf(stderr, "push_bw: rounds and calls must be positive\n");
    return 2;
  }
  void* m =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("push_bw: mmap");
    return 1;
  }
  auto* sh = new (m) Shared();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("push_bw: fork");
    return 1;
  }
  Rank rank{sh, child == 0 ? 1 : 0, nullptr, nullptr, nullptr};
  sh->pid[rank.me] = getpid();
  int rc = 0;
  for (int huge = 0; huge < 2 && rc == 0; ++huge) {
    // Private pools, touched after the fork (no page shared copy-on-write).
    rank.in = static_cast<char*>(std::aligned_alloc(1 << 21, kPool));
    rank.out = static_cast<char*>(std::aligned_alloc(1 << 21, kPool));
    rank.stage = static_cast<char*>(std::aligned_alloc(4096, kPiece));
    if (!rank.in || !rank.out || !rank.stage) {
      std::fprintf(stderr, "push_bw: out of memory\n");
      sh->failed.store(1);
      return 1;
    }
    const int advice = huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE;
    madvise(rank.in, kPool, advice);
    madvise(rank.out, kPool, advice);
    for (size_t i = 0; i < kPool / sizeof(float); ++i)
      reinterpret_cast<float*>(rank.in)[i] = static_cast<float>(i % 1000);
    std::memset(rank.out, 0, kPool);
    sh->input[rank.me] = reinterpret_cast<uint64_t>(rank.in);
    barrier(sh, rank.me, &rank.gen);
    for (size_t bytes : sizes) {
      double best[2] = {1e30, 1e30};
      for (int r = 0; r < rounds; ++r)
        for (int push = 0; push < 2; ++push) {
          rank.run(bytes, push);  // one untimed call: the way's first piece in flight
          const auto t0 = std::chrono::steady_clock::now();
          for (int c = 0; c < calls; ++c) rank.run(bytes, push);
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count() /
              calls;
          best[push] = std::min(best[push], ms);
        }
      if (rank.me == 0)
        std::printf("PUSH size=%zuM pages=%s cma_ms=%.3f push_ms=%.3f push_over_cma=%.2f\n",
                    bytes >> 20, huge ? "thp" : "4k", best[0], best[1], best[1] / best[0]);
    }
    barrier(sh, rank.me, &rank.gen);  // the peer is done reading this pool
    std::free(rank.in);
    std::free(rank.out);
    std::free(rank.stage);
  }
  if (child > 0) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
