// loom-perf: measures Loom's collectives with nccl-tests' options and output format.
//   loom-perf all_reduce -np 4 -b 8 -e 128M -f 2        (or all_reduce_perf -np 4 ...)
//   mpirun -np 16 loom-perf all_gather -b 1M -e 1G -f 2 -J out.json
//   loom-perf --params
#include <cstdio>

#include "loom/loom.h"
#include "tools/perf/bench.h"
#include "tools/perf/launcher.h"
#include "tools/perf/options.h"

int main(int argc, char** argv) {
  using namespace loom::perf;
  Options opts;
  int rc = parseOptions(argc, argv, &opts);
  if (rc >= 0) return rc;

  if (opts.np > 0 && !isSpawnedRank()) return spawnRanks(opts, argc, argv);

  RankContext ctx;
  loom::Status st = initComm(opts, &ctx);
  if (!st.isOk()) {
    std::fprintf(stderr, "loom-perf: %s\n", st.message().c_str());
    if (ctx.comm) loomCommAbort(ctx.comm);
    return kExitLoomError;
  }
  rc = runBenchmarks(opts, ctx);
  if (rc == kExitLoomError) {
    // Wakes peers blocked on this rank instead of leaving them to their deadlines.
    loomCommAbort(ctx.comm);
    return rc;
  }
  loomResult_t res = loomCommFinalize(ctx.comm);
  if (res == loomSuccess)
    res = loomCommDestroy(ctx.comm);
  else
    loomCommAbort(ctx.comm);
  if (res != loomSuccess) {
    std::fprintf(stderr, "loom-perf: rank %d: closing the communicator failed: %s: %s\n", ctx.rank,
                 loomGetErrorString(res), loomGetLastError());
    return rc ? rc : kExitLoomError;
  }
  return rc;
}
