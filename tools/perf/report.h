// loom-perf output: nccl-tests' text table (same format strings, column widths included, so that
// scripts written for nccl-tests parse it) and a JSON record of every measurement (-J).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/perf/options.h"

namespace loom {
namespace perf {

struct RankInfo {
  int rank = 0;
  int pid = 0;
  int device = 0;  // index of this rank among the ranks of its host
  std::string host;
  std::string cpu;
  std::string gpu;    // --mem device: the GPU's name ("" on host memory)
  std::string busId;  // and its PCI bus id
};

struct Measurement {
  double timeUs = 0;
  double algBw = 0;
  double busBw = 0;
  int64_t wrong = -1;  // -1: not validated
};

struct Row {
  int cycle = 0;
  size_t bytes = 0;
  size_t count = 0;
  std::string type;
  std::string redop;
  int root = -1;
  Measurement outOfPlace;
  Measurement inPlace;
  // --compare: each algorithm's best round (out of place), in --compare's order, and what "auto"
  // ran (the planner's choice, as loomCommPlanInfo names it).
  std::vector<std::pair<std::string, Measurement>> compare;
  std::string planned;
};

// "# nThread 1 nGpus 1 minBytes ..." through the two-line column header.
std::string formatHeader(const Options& opts, const std::vector<RankInfo>& ranks);
// The first five columns of a row (size count type redop root).
std::string formatRowPrefix(const Row& row);
// One "  time  algbw  busbw  #wrong" block; #wrong is N/A when the measurement was not validated.
std::string formatMeasurement(const Measurement& m);
// --compare's two header lines, and one row (prefix, each algorithm's time, the fastest).
std::string formatCompareHeader(const Options& opts);
std::string formatCompareRow(const Row& row);
// "# Out of bounds values : N OK" and "# Avg bus bandwidth    : X" and "#".
std::string formatFooter(int64_t wrongValues, double avgBusBw);

struct JsonReport {
  const Options* opts = nullptr;
  int nranks = 0;
  std::vector<RankInfo> ranks;
  std::vector<Row> rows;
  int64_t wrongValues = 0;
  double avgBusBw = 0;
  std::string error;  // empty when the run succeeded
};

// Writes the report; false (with *error) when the file cannot be written.
bool writeJson(const std::string& path, const JsonReport& report, std::string* error);

}  // namespace perf
}  // namespace loom
