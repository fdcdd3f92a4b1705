// loom-perf command line: nccl-tests' options (-b -e -f -i -n -w -m -c -o -d -r -z -a -t -g -T -J
// -N ...) plus Loom's (-np N, --params). The collective comes from argv[0] (all_reduce_perf, ...)
// or from the first positional argument (loom-perf all_reduce ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/collective.h"

namespace loom {
namespace perf {

// -t x -g: the ranks one process may drive.
constexpr int kMaxRanksPerProcess = 64;

struct Options {
  CollKind coll = CollKind::kAllReduce;
  std::string programName;  // as nccl-tests names it: all_reduce_perf, ...

  // nccl-tests' defaults.
  int nThreads = 1;
  int nGpus = 1;
  size_t minBytes = 32u << 20;
  size_t maxBytes = 32u << 20;
  size_t stepBytes = 1u << 20;
  size_t stepFactor = 1;  // > 1: multiply sizes by it instead of adding stepBytes
  int iters = 20;
  int warmupIters = 1;
  int aggIters = 1;
  int check = 1;  // check repetitions per measurement; 0: no validation
  std::vector<loomRedOp_t> ops{loomSum};
  std::vector<loomDataType_t> types{loomFloat32};
  int root = 0;  // -1: every rank in turn
  int blocking = 0;
  // -G: each size's timed iterations captured into a CUDA graph, launched this many times (device
  // memory; nccl-tests' cudaGraphLaunches). 0: enqueued one by one.
  int cudaGraph = 0;
  int average = 1;     // 0 rank 0, 1 mean, 2 min, 3 max
  int timeoutSec = 0;  // 0: LOOM_TIMEOUT
  std::string jsonFile;
  int runCycles = 1;      // 0: forever
  int localRegister = 0;  // -R: 1 or 2: buffers from loomMemAlloc, registered with loomCommRegister

  // Loom additions.
  int np = 0;  // > 0: spawn that many local ranks
  bool printParams = false;
  bool plan = false;  // --plan: print the planner's choices for the sweep instead of running it
  // --compare: these algorithms ("auto": the planner's choice), timed interleaved at each size
  // (out of place), each the best of compareRounds rounds of -n iterations.
  std::vector<std::string> compare;
  int compareRounds = 5;
  // --mem: where the buffers live: "host", "device" (a GPU of the rank's, through the CUDA driver),
  // or "auto" (device where a GPU is usable, else host).
  std::string mem = "auto";
};

// What parsing a command line decided: run with the options (exitCode -1), or exit with exitCode
// (0 after --help, --version or --params; 2 after a usage error). Either way `out` is for stdout
// and `err` for stderr (a running program may have notes there).
struct ParseOutcome {
  int exitCode = -1;
  std::string out;
  std::string err;
};

// Parses args (args[0]: the program's name, whose personality it takes) into *opts. Prints
// nothing, never exits, throws nothing but std::bad_alloc: the command line is input like any
// other (tests/fuzz/perf_options_fuzz.cc feeds it garbage).
ParseOutcome parseArgs(const std::vector<std::string>& args, Options* opts);

// parseArgs on argv, printing its text. Returns -1 when the program should run, otherwise the
// exit code (0 after --help or --params; non-zero after printing what is wrong).
int parseOptions(int argc, char** argv, Options* opts);

// The sizes of one sweep, as nccl-tests steps them.
std::vector<size_t> sweepSizes(const Options& opts);
// How many sizes sweepSizes gives (0 when minBytes > maxBytes), without making them.
uint64_t sweepLength(const Options& opts);
// The most sizes a sweep may have: the sweep is listed before it runs, and no one measures more.
constexpr uint64_t kMaxSweepSizes = 1000000;

// "all_reduce" for CollKind::kAllReduce, ...: the collective as nccl-tests names its test.
const char* collTestName(CollKind kind);
// "all_reduce", "all_reduce_perf", "allreduce" and "AllReduce" all name kAllReduce.
bool findColl(const std::string& text, CollKind* kind);

}  // namespace perf
}  // namespace loom
