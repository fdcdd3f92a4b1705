// loom-perf: measures Loom's collectives with nccl-tests' options and output format.
//   loom-perf all_reduce -np 4 -b 8 -e 128M -f 2        (or all_reduce_perf -np 4 ...)
//   mpirun -np 16 loom-perf all_gather -b 1M -e 1G -f 2 -J out.json
//   loom-perf all_reduce -g 2 -t 2 --mem device  (4 ranks: 2 threads of 2 GPUs each)
//   loom-perf --params
#include <sys/prctl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "src/core/params.h"
#include "tools/perf/bench.h"
#include "tools/perf/launcher.h"
#include "tools/perf/options.h"

int main(int argc, char** argv) {
  using namespace loom::perf;
  Options opts;
  // libloom.so has its own copy of the parameters and warns about a rejected value it reads; the
  // copy linked here (for --params and the launcher) stays quiet, so each warning is said once.
  loom::setParamWarnings(false);
  // A rank spawned by -np runs /proc/self/exe, which the kernel names "exe": give it the
  // program's name back for ps, top and pgrep.
  if (isSpawnedRank()) {
    const char* slash = std::strrchr(argv[0], '/');
    prctl(PR_SET_NAME, slash ? slash + 1 : argv[0]);
  }
  int rc = parseOptions(argc, argv, &opts);
  if (rc >= 0) return rc;
  // -J: a file rank 0 cannot write fails now, not after the whole sweep.
  if (!opts.jsonFile.empty() && mayHoldRankZero()) {
    struct stat st;
    const bool existed = ::stat(opts.jsonFile.c_str(), &st) == 0;
    std::FILE* f = std::fopen(opts.jsonFile.c_str(), "a");
    if (!f) {
      std::fprintf(stderr, "loom-perf: -J %s: cannot write it: %s\n", opts.jsonFile.c_str(),
                   std::strerror(errno));
      return kExitUsage;
    }
    std::fclose(f);
    if (!existed) std::remove(opts.jsonFile.c_str());
  }

  if (opts.np > 0 && !isSpawnedRank()) return spawnRanks(opts, argc, argv);

  // The ranks of this process: -t threads, each driving -g of them.
  std::vector<RankContext> ranks;
  loom::Status st = initComms(opts, &ranks);
  if (!st.isOk()) {
    std::fprintf(stderr, "loom-perf: %s\n", st.message().c_str());
    reportFailure(ranks.empty() ? spawnedFirstRank(opts) : ranks.front().rank, st);
    for (const RankContext& r : ranks) loomCommAbort(r.comm);
    return kExitLoomError;
  }
  const size_t perThread = static_cast<size_t>(opts.nGpus);
  std::vector<int> codes(static_cast<size_t>(opts.nThreads), 0);
  auto runThread = [&](size_t t) {
    std::vector<RankContext> mine(ranks.begin() + t * perThread,
                                  ranks.begin() + (t + 1) * perThread);
    codes[t] = runBenchmarks(opts, mine);
    if (codes[t] == kExitLoomError) {
      // Wakes peers blocked on these ranks instead of leaving them to their deadlines.
      for (const RankContext& r : mine) loomCommAbort(r.comm);
    }
  };
  if (opts.nThreads == 1) {
    runThread(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < codes.size(); ++t) threads.emplace_back(runThread, t);
    for (auto& th : threads) th.join();
  }
  rc = *std::max_element(codes.begin(), codes.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (codes[i / perThread] == kExitLoomError) continue;  // aborted above
    loomResult_t res = loomCommFinalize(ranks[i].comm);
    if (res == loomSuccess)
      res = loomCommDestroy(ranks[i].comm);
    else
      loomCommAbort(ranks[i].comm);
    if (res != loomSuccess) {
      std::fprintf(stderr, "loom-perf: rank %d: closing the communicator failed: %s: %s\n",
                   ranks[i].rank, loomGetErrorString(res), loomGetLastError());
      if (!rc) rc = kExitLoomError;
    }
  }
  return rc;
}
