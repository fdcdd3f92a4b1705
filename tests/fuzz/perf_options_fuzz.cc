// Fuzz target for loom-perf's command line (tools/perf/options.cc, parseArgs): the input, split at
// NUL bytes, is argv (its first piece the program's name, whose personality all_reduce_perf, ...
// the parser takes).
//
// Contract checked on every input: the parser returns options or an exit code (0 or 2), never
// throws, exits or aborts; a usage error says what is wrong on stderr; options it accepts are in
// range (sizes ordered, iterations and ranks per process within bounds, known types and ops) and
// their sweep steps up and ends. With clang and -DLOOM_FUZZ_LIBFUZZER=ON this is a libFuzzer
// target, otherwise fuzz_driver.h drives it.
//   perf_options_fuzz [--seconds 20] [--iterations 1000000] [--seed 1] FILE_OR_DIR...
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "tests/fuzz/fuzz_driver.h"
#include "tools/perf/options.h"

namespace {

using loom::perf::Options;

[[noreturn]] void die(const std::string& what, std::string_view input) {
  loomfuzz::fail("perf_options_fuzz", "perf_options_fuzz_crash.bin", what, input);
}

// How many sizes the sweep has, counted as sweepSizes steps them, up to cap + 1.
uint64_t countSweep(const Options& o, uint64_t cap) {
  uint64_t n = 0;
  size_t size = o.minBytes;
  while (size <= o.maxBytes && n <= cap) {
    ++n;
    size_t next;
    if (o.stepFactor > 1) {
      if (size > SIZE_MAX / o.stepFactor) break;
      next = size == 0 ? 1 : size * o.stepFactor;
    } else {
      next = size + o.stepBytes;
    }
    if (next <= size) break;
    size = next;
  }
  return n;
}

void checkOptions(const Options& o, std::string_view input) {
  if (o.minBytes > o.maxBytes) die("minbytes > maxbytes accepted", input);
  if (o.nThreads < 1 || o.nGpus < 1 ||
      static_cast<int64_t>(o.nThreads) * o.nGpus > loom::perf::kMaxRanksPerProcess)
    die("-t x -g out of range accepted", input);
  if (o.iters < 1 || o.aggIters < 1 || o.warmupIters < 0 || o.check < 0 || o.runCycles < 0 ||
      o.average < 0 || o.average > 3 || o.timeoutSec < 0 || o.stepFactor < 1 || o.root < -1 ||
      o.compareRounds < 1 || o.np < 0 || o.localRegister < 0 || o.localRegister > 2)
    die("a count out of range accepted", input);
  if (o.types.empty() || o.ops.empty()) die("no datatype or op accepted", input);
  for (loomDataType_t t : o.types)
    if (!loom::validDataType(t)) die("an unknown datatype accepted", input);
  for (loomRedOp_t op : o.ops)
    if (!loom::validRedOp(op)) die("an unknown op accepted", input);
  if (o.mem != "host" && o.mem != "device" && o.mem != "auto")
    die("an unknown --mem accepted", input);
  if (o.programName != std::string(loom::perf::collTestName(o.coll)) + "_perf")
    die("the program name does not follow the collective", input);
  loom::CollKind k;
  if (!loom::perf::findColl(o.programName, &k) || k != o.coll)
    die("the program name does not name its collective", input);
  // The sweep: no longer than the limit, as long as the parser says, and made (when short enough
  // to make here at every input).
  const uint64_t n = countSweep(o, loom::perf::kMaxSweepSizes);
  if (n > loom::perf::kMaxSweepSizes) die("a sweep longer than the limit accepted", input);
  if (n != loom::perf::sweepLength(o)) die("sweepLength miscounts the sweep", input);
  if (n > 100000) return;
  std::vector<size_t> sizes = loom::perf::sweepSizes(o);
  if (sizes.size() != n || sizes.front() != o.minBytes)
    die("the sweep does not start at -b", input);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > o.maxBytes) die("the sweep passes -e", input);
    if (i && sizes[i] <= sizes[i - 1]) die("the sweep does not step up", input);
  }
}

void runOne(std::string_view input) {
  std::vector<std::string> args;
  size_t start = 0;
  while (start <= input.size()) {
    size_t nul = input.find('\0', start);
    if (nul == std::string_view::npos) nul = input.size();
    args.emplace_back(input.substr(start, nul - start));
    start = nul + 1;
    if (args.size() > 256) break;
  }
  Options opts;
  loom::perf::ParseOutcome o;
  try {
    o = loom::perf::parseArgs(args, &opts);
  } catch (const std::exception& e) {
    die(std::string("parseArgs threw: ") + e.what(), input);
  } catch (...) {
    die("parseArgs threw something", input);
  }
  if (o.exitCode == -1) {
    checkOptions(opts, input);
  } else if (o.exitCode == 2) {
    if (o.err.empty()) die("a usage error without a message", input);
  } else if (o.exitCode == 0) {
    if (o.out.empty()) die("exit 0 (help, version, params) without output", input);
  } else {
    die("exit code " + std::to_string(o.exitCode), input);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    loom::setParamWarnings(false);
    return true;
  }();
  (void)quiet;
  runOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef LOOM_LIBFUZZER

int main(int argc, char** argv) {
  loom::setParamWarnings(false);
  auto line = [](std::vector<std::string> args) {
    std::string out;
    for (size_t i = 0; i < args.size(); ++i) out += (i ? std::string(1, '\0') : "") + args[i];
    return out;
  };
  std::vector<std::string> seeds = {
      line({"loom-perf", "all_reduce", "-b", "8", "-e", "128M", "-f", "2", "-g", "1"}),
      line({"all_gather_perf", "-b", "1K", "-e", "1M", "-i", "64K", "-d", "all", "-o", "sum,max"}),
      line({"loom-perf", "broadcast", "-r", "all", "-np", "3", "-c", "0", "-n", "5", "-w", "0"}),
      line({"/usr/bin/reduce_perf", "-t", "2", "-g", "4", "-a", "2", "-T", "30", "-J", "out.json"}),
      line({"loom-perf", "allreduce", "--compare", "auto,ring,rd", "--compare-rounds", "3", "--mem",
            "host", "-R", "1"}),
      line({"loom-perf", "sendrecv", "--plan", "-p", "1", "-G", "0", "-N", "2", "-z", "1"}),
      line({"loom-perf", "--help"}),
      line({"loom-perf", "alltoall", "--np=4", "-m", "2", "-y", "0", "-C", "0"})};
  const std::vector<std::string> tokens = {std::string(1, '\0'),
                                           "-b",
                                           "-e",
                                           "-i",
                                           "-f",
                                           "-n",
                                           "-w",
                                           "-m",
                                           "-c",
                                           "-o",
                                           "-d",
                                           "-r",
                                           "-z",
                                           "-a",
                                           "-T",
                                           "-J",
                                           "-N",
                                           "-t",
                                           "-g",
                                           "-R",
                                           "-np",
                                           "--np=",
                                           "--params",
                                           "--plan",
                                           "--compare",
                                           "--compare-rounds",
                                           "--mem",
                                           "--version",
                                           "--",
                                           "=",
                                           ",",
                                           "all",
                                           "0",
                                           "-1",
                                           "1",
                                           "2",
                                           "64",
                                           "1K",
                                           "4G",
                                           "16E",
                                           "99999999999999999999",
                                           "0x10",
                                           "1e3",
                                           "float",
                                           "bfloat16",
                                           "avg",
                                           "all_reduce",
                                           "_perf",
                                           "device",
                                           "auto",
                                           "\xff"};
  return loomfuzz::fuzzMain(argc, argv, "perf_options_fuzz", std::move(seeds), tokens, runOne);
}
#endif
