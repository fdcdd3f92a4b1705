// loom-sim --svg: bus bandwidth against size, one line per algorithm, published points as marks.
// A plain SVG writer (no plotting library): log2 sizes on x, GB/s on y.
#pragma once

#include <string>
#include <vector>

#include "src/core/status.h"

namespace loom {
namespace sim {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (bytes, busbw GB/s); busbw < 0 skipped
  bool marks = false;                             // published points: marks, no line
};

std::string plotSvg(const std::string& title, const std::vector<Series>& series);

// Published results, one point per line: "size_bytes,busbw_gbps[,label]" ('#' comments and a
// header line before the points allowed; the label names the series, default "published").
// kInvalidArgument with the line on anything else.
Result<std::vector<Series>> readPublished(const std::string& path);

}  // namespace sim
}  // namespace loom
