#include "tools/perf/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/dtype.h"
#include "src/core/params.h"
#include "tools/cli.h"

namespace loom {
namespace perf {
namespace {

struct CollName {
  CollKind kind;
  const char* name;
};
constexpr CollName kCollNames[] = {
    {CollKind::kAllReduce, "all_reduce"},
    {CollKind::kAllGather, "all_gather"},
    {CollKind::kReduceScatter, "reduce_scatter"},
    {CollKind::kBroadcast, "broadcast"},
    {CollKind::kReduce, "reduce"},
    {CollKind::kAllToAll, "alltoall"},
    {CollKind::kSendRecv, "sendrecv"},
};

std::string stripped(std::string s) {
  std::string out;
  for (char c : s)
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool findColl(const std::string& text, CollKind* kind) {
  std::string want = stripped(text);
  if (want.size() > 4 && want.compare(want.size() - 4, 4, "perf") == 0)
    want.resize(want.size() - 4);
  for (const auto& c : kCollNames) {
    if (stripped(c.name) == want) {
      *kind = c.kind;
      return true;
    }
  }
  return false;
}

namespace {

// Acting as all_reduce_perf, ... when started under that name (a symlink to loom-perf).
bool personality(const char* argv0, CollKind* kind) {
  std::string base(argv0 ? argv0 : "");
  size_t slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  for (const auto& c : kCollNames) {
    if (base == std::string(c.name) + "_perf") {
      *kind = c.kind;
      return true;
    }
  }
  return false;
}

bool parseBytes(const std::string& text, const char* what, size_t* out, std::string* error) {
  int64_t v = 0;
  if (!parseSize(text, &v)) {
    *error = std::string("invalid ") + what + " '" + text + "' (bytes, with optional K/M/G suffix)";
    return false;
  }
  *out = static_cast<size_t>(v);
  return true;
}

// "all", a name, or a comma list of names.
template <typename T>
bool parseList(const std::string& text, int count, int (*parseOne)(const char*), const char* what,
               std::vector<T>* out, std::string* error) {
  out->clear();
  if (text == "all") {
    for (int i = 0; i < count; ++i) out->push_back(static_cast<T>(i));
    return true;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int v = parseOne(item.c_str());
    if (v < 0) {
      *error = std::string("unknown ") + what + " '" + item + "'";
      return false;
    }
    out->push_back(static_cast<T>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

int parseDataTypeName(const char* name) { return parseDataType(name); }
int parseRedOpName(const char* name) { return parseRedOp(name); }

void noteIgnored(const char* what, int value, std::string* err) {
  if (value != 0)
    *err += fmt::format("loom-perf: note: {} {} is ignored (host buffers, no CUDA)\n", what, value);
}

}  // namespace

const char* collTestName(CollKind kind) {
  for (const auto& c : kCollNames)
    if (c.kind == kind) return c.name;
  return "unknown";
}

int parseOptions(int argc, char** argv, Options* opts) {
  ParseOutcome o = parseArgs(std::vector<std::string>(argv, argv + argc), opts);
  std::fputs(o.out.c_str(), stdout);
  std::fputs(o.err.c_str(), stderr);
  return o.exitCode;
}

ParseOutcome parseArgs(const std::vector<std::string>& argsIn, Options* opts) {
  ParseOutcome outcome;
  auto usageError = [&](const std::string& message) {
    outcome.err += tools::usageErrorText("loom-perf", message);
    outcome.exitCode = tools::kExitUsage;
    return outcome;
  };
  CollKind fixed = CollKind::kAllReduce;
  bool hasPersonality = personality(argsIn.empty() ? nullptr : argsIn[0].c_str(), &fixed);

  // CLI11 would read "-np" as "-n p"; nccl-tests users and mpirun users type "-np".
  std::vector<std::string> args = argsIn;
  if (args.empty()) args.push_back("loom-perf");
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "-np")
      args[i] = "--np";
    else if (args[i].rfind("-np=", 0) == 0)
      args[i] = "--np=" + args[i].substr(4);
  }
  std::vector<const char*> cargv;
  for (const auto& a : args) cargv.push_back(a.c_str());

  CLI::App app{"loom-perf: collective performance tests with nccl-tests' options and output",
               hasPersonality ? std::string(collTestName(fixed)) + "_perf" : "loom-perf"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.set_version_flag(
      "--version", fmt::format("{} {}.{}.{}", app.get_name(), LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH));
  // A repeated option takes its last value, as nccl-tests' getopt does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string collText, minText = "32M", maxText = "32M", stepText = "1M";
  std::string opText = "sum", typeText = "float", rootText = "0";
  int stepFactor = 1, parallelInit = 0, cpuTime = 0;
  int streamNull = 0;
  if (!hasPersonality) {
    app.add_option("collective", collText,
                   "all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall or "
                   "sendrecv (or start the program as all_reduce_perf, ...)");
  }
  app.add_option("-t,--nthreads", opts->nThreads,
                 "Threads per process, each driving -g ranks (default 1)");
  app.add_option("-g,--ngpus", opts->nGpus,
                 "Ranks (GPUs with --mem device) per thread, their calls issued in one group "
                 "(default 1)");
  app.add_option("-b,--minbytes", minText, "Minimum size in bytes, K/M/G suffixes (default 32M)");
  app.add_option("-e,--maxbytes", maxText, "Maximum size in bytes, K/M/G suffixes (default 32M)");
  app.add_option("-i,--stepbytes", stepText, "Increment between sizes (default 1M)");
  app.add_option("-f,--stepfactor", stepFactor,
                 "Multiplication factor between sizes (default: off)");
  app.add_option("-n,--iters", opts->iters, "Timed iterations (default 20)");
  app.add_option("-w,--warmup_iters", opts->warmupIters, "Untimed warm-up iterations (default 1)");
  app.add_option("-m,--agg_iters", opts->aggIters,
                 "Operations aggregated in a group per iteration");
  app.add_option("-c,--check", opts->check, "Validate results this many times (default 1; 0 off)");
  app.add_option("-o,--op", opText, "sum, prod, max, min, avg or all (default sum)");
  app.add_option("-d,--datatype", typeText,
                 "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 or all "
                 "(default float)");
  app.add_option("-r,--root", rootText, "Root of broadcast and reduce, or all (default 0)");
  app.add_option("-z,--blocking", opts->blocking, "1: barrier after each collective");
  app.add_option("-a,--average", opts->average,
                 "How per-rank times combine: 0 rank 0, 1 mean, 2 min, 3 max (default 1)");
  app.add_option("-T,--timeout", opts->timeoutSec,
                 "Deadline in seconds of every wait (default LOOM_TIMEOUT)");
  app.add_option("-J,--output_file", opts->jsonFile,
                 "Write every measurement as JSON to this file");
  app.add_option("-N,--run_cycles", opts->runCycles,
                 "Repeat each sweep this many times (0 forever)");
  app.add_option("-p,--parallel_init", parallelInit, "Accepted for compatibility; ignored");
  app.add_option("-G,--cudagraph", opts->cudaGraph,
                 "Capture each size's timed iterations into a CUDA graph and launch it this many "
                 "times (device memory; ignored on host buffers)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-C,--report_cputime", cpuTime, "Accepted for compatibility; ignored");
  app.add_option("-R,--local_register", opts->localRegister,
                 "1 or 2: buffers from loomMemAlloc (mapped by peers on the host) and registered "
                 "with loomCommRegister (network transports skip per-message registration), as "
                 "nccl-tests uses ncclMemAlloc and ncclCommRegister")
      ->check(CLI::Range(0, 2));
  app.add_option("-y,--stream_null", streamNull, "Accepted for compatibility; ignored");
  CLI::Option* npOpt =
      app.add_option("--np", opts->np, "Spawn this many local ranks (also written -np N)");
  app.add_flag("--params", opts->printParams, "Print every LOOM_* parameter and exit");
  app.add_flag("--plan", opts->plan,
               "Print, for each size of the sweep, the path, algorithm and predicted time the "
               "planner chooses (and every candidate's), without running anything");
  std::string compareText;
  app.add_option("--compare", compareText,
                 "Comma list of algorithms (LOOM_ALGO names, and 'auto' for the planner's choice) "
                 "to time interleaved at each size, out of place: every round runs each once "
                 "(-n iterations, timed as -a says), and each keeps its best round");
  app.add_option("--mem", opts->mem,
                 "Buffers: host, device, or auto (device where a GPU is usable; default)");
  app.add_option("--compare-rounds", opts->compareRounds, "Rounds of --compare (default 5)");
  app.footer(
      "Without -np, ranks come from mpirun (OMPI_COMM_WORLD_*), torchrun (WORLD_SIZE), or srun "
      "with LOOM_COMM_ID; otherwise one rank runs.");

  // Every usage error exits 2, its message named.
  {
    std::ostringstream out, err;
    int rc = tools::parseCommandLine(app, static_cast<int>(cargv.size()), cargv.data(), "loom-perf",
                                     out, err);
    outcome.out += out.str();
    outcome.err += err.str();
    if (rc >= 0) {
      outcome.exitCode = rc;
      return outcome;
    }
  }
  if (opts->printParams) {
    outcome.out += formatParams();
    outcome.exitCode = 0;
    return outcome;
  }

  if (hasPersonality) {
    opts->coll = fixed;
  } else if (collText.empty()) {
    return usageError(
        "name the collective: loom-perf all_reduce|all_gather|reduce_scatter|"
        "broadcast|reduce|alltoall|sendrecv [options]");
  } else if (!findColl(collText, &opts->coll)) {
    return usageError("unknown collective '" + collText +
                      "' (all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, "
                      "sendrecv)");
  }
  opts->programName = std::string(collTestName(opts->coll)) + "_perf";

  std::string error;
  if (!parseBytes(minText, "-b/--minbytes", &opts->minBytes, &error) ||
      !parseBytes(maxText, "-e/--maxbytes", &opts->maxBytes, &error) ||
      !parseBytes(stepText, "-i/--stepbytes", &opts->stepBytes, &error) ||
      !parseList(typeText, loomNumTypes, parseDataTypeName, "datatype (-d)", &opts->types,
                 &error) ||
      !parseList(opText, loomNumOps, parseRedOpName, "reduction op (-o)", &opts->ops, &error)) {
    return usageError(error);
  }
  if (rootText == "all") {
    opts->root = -1;
  } else {
    char* end = nullptr;
    long v = std::strtol(rootText.c_str(), &end, 0);
    if (rootText.empty() || *end != '\0' || v < -1 || v > INT_MAX)
      return usageError("invalid root (-r) '" + rootText + "': a rank, or -1/all for every rank");
    opts->root = static_cast<int>(v);
  }
  if (opts->nThreads < 1 || opts->nGpus < 1 ||
      static_cast<long long>(opts->nThreads) * opts->nGpus > kMaxRanksPerProcess)
    return usageError("-t " + std::to_string(opts->nThreads) + " -g " +
                      std::to_string(opts->nGpus) +
                      ": each must be at least 1, and -t x -g at most " +
                      std::to_string(kMaxRanksPerProcess) + " ranks per process");
  if (opts->mem != "host" && opts->mem != "device" && opts->mem != "auto")
    return usageError("--mem " + opts->mem + ": host, device or auto");
  if (opts->mem == "device" && opts->localRegister)
    return usageError(
        "-R registers host memory from loomMemAlloc; it does not go with --mem device");
  if (opts->minBytes > opts->maxBytes)
    return usageError("invalid sizes for 'minbytes' and 'maxbytes': " +
                      std::to_string(opts->minBytes) + " > " + std::to_string(opts->maxBytes));
  if (stepFactor < 1) return usageError("-f/--stepfactor must be at least 1");
  opts->stepFactor = static_cast<size_t>(stepFactor);
  if (uint64_t n = sweepLength(*opts); n > kMaxSweepSizes)
    return usageError(fmt::format(
        "-b {} -e {} -i {} make a sweep of {} sizes, more than {}: use a larger -i, or -f",
        opts->minBytes, opts->maxBytes, opts->stepBytes, n, kMaxSweepSizes));
  if (opts->iters < 1) return usageError("-n/--iters must be at least 1");
  if (opts->aggIters < 1) return usageError("-m/--agg_iters must be at least 1");
  if (opts->warmupIters < 0) return usageError("-w/--warmup_iters must not be negative");
  if (opts->check < 0) return usageError("-c/--check must not be negative");
  if (opts->runCycles < 0) return usageError("-N/--run_cycles must not be negative");
  if (opts->average < 0 || opts->average > 3)
    return usageError("-a/--average must be 0 (rank 0), 1 (mean), 2 (min) or 3 (max)");
  if (opts->timeoutSec < 0 || opts->timeoutSec > 2000000)
    return usageError("-T/--timeout must be between 0 and 2000000 seconds");
  if (npOpt->count() > 0 && opts->np < 1) return usageError("-np must be at least 1");
  if (!compareText.empty()) {
    size_t start = 0;
    while (start <= compareText.size()) {
      size_t comma = compareText.find(',', start);
      if (comma == std::string::npos) comma = compareText.size();
      std::string name = compareText.substr(start, comma - start);
      if (name.empty()) return usageError("--compare '" + compareText + "': an empty name");
      for (const std::string& seen : opts->compare)
        if (seen == name) return usageError("--compare '" + compareText + "': " + name + " twice");
      opts->compare.push_back(name);
      start = comma + 1;
    }
    if (opts->coll == CollKind::kSendRecv)
      return usageError("--compare: sendrecv is point to point (no algorithm)");
    if (opts->plan) return usageError("--compare and --plan: choose one");
  }
  if (opts->compareRounds < 1) return usageError("--compare-rounds must be at least 1");
  noteIgnored("-p/--parallel_init", parallelInit, &outcome.err);
  if (opts->cudaGraph > 0 && opts->blocking)
    return usageError("-G and -z: choose one (no barrier runs between a captured graph's calls)");
  noteIgnored("-C/--report_cputime", cpuTime, &outcome.err);
  noteIgnored("-y/--stream_null", streamNull, &outcome.err);
  return outcome;
}

std::vector<size_t> sweepSizes(const Options& opts) {
  std::vector<size_t> sizes;
  size_t size = opts.minBytes;
  while (size <= opts.maxBytes) {
    sizes.push_back(size);
    size_t next;
    if (opts.stepFactor > 1) {
      if (size > SIZE_MAX / opts.stepFactor) break;
      next = size == 0 ? 1 : size * opts.stepFactor;
    } else {
      next = size + opts.stepBytes;
    }
    if (next <= size) break;  // step 0, or overflow
    size = next;
  }
  return sizes;
}

uint64_t sweepLength(const Options& opts) {
  if (opts.minBytes > opts.maxBytes) return 0;
  // At most 65 sizes: each step at least doubles the size.
  if (opts.stepFactor > 1) return sweepSizes(opts).size();
  if (opts.stepBytes == 0) return 1;
  return (opts.maxBytes - opts.minBytes) / opts.stepBytes + 1;
}

}  // namespace perf
}  // namespace loom
