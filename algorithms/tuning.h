// Tuning files: measured algorithm choices that override the cost model (LOOM_TUNING_FILE), as
// written by `loom-perf --tune`. JSON:
//   { "loom_tuning": 1,
//     "layout": { "nranks": 4, "ranks_per_host": [2, 2] },
//     "entries": [ { "collective": "allreduce", "min_bytes": 0, "max_bytes": 65536,
//                    "algorithm": "rd", "measured_us": 12.5 }, ... ] }
// A file measured on another layout (rank count or ranks per host) does not apply: the caller
// ignores it with a warning. Collective names as LOOM_ALGO spells them (allreduce, allgather, ...).
#pragma once

#include <string>
#include <vector>

#include "algorithms/planner.h"
#include "src/core/status.h"

namespace loom {

struct TuningFile {
  int nranks = 0;
  std::vector<int> ranksPerHost;
  std::vector<TuningEntry> entries;
};

// Parses text (the file's contents; `source` names it in errors). Errors name the problem: bad
// JSON, a missing field, an unknown collective or algorithm, min_bytes > max_bytes.
Result<TuningFile> parseTuning(const std::string& text, const std::string& source);
Result<TuningFile> loadTuning(const std::string& path);
std::string formatTuning(const TuningFile& file);

// "4 ranks, ranks per host 2,2": for messages.
std::string describeLayout(int nranks, const std::vector<int>& ranksPerHost);

}  // namespace loom
