#include "tools/sim/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

namespace loom {
namespace sim {

namespace {

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string sizeLabel(double bytes) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:g}{}", bytes, units[u]);
}

}  // namespace

std::string plotSvg(const std::string& title, const std::vector<Series>& series) {
  constexpr double kW = 900, kH = 520, kLeft = 70, kRight = 200, kTop = 40, kBottom = 50;
  double xmin = 1e300, xmax = 0, ymax = 0;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      if (x <= 0 || y < 0) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
    }
  if (xmax <= 0) xmin = 1, xmax = 2;
  if (xmax <= xmin) xmax = xmin * 2;
  if (ymax <= 0) ymax = 1;
  // A round top for the y axis.
  double step = std::pow(10.0, std::floor(std::log10(ymax)));
  double top = std::ceil(ymax / step) * step;
  const double lx0 = std::log2(xmin), lx1 = std::log2(xmax);
  auto px = [&](double x) {
    return kLeft + (std::log2(x) - lx0) / (lx1 - lx0) * (kW - kLeft - kRight);
  };
  auto py = [&](double y) { return kTop + (1 - y / top) * (kH - kTop - kBottom); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kW, kH);
  out += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"15\">{}</text>\n", kLeft, escaped(title));
  // Axes, grid and labels.
  for (int i = 0; i <= 5; ++i) {
    double y = top * i / 5;
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n",
        kLeft, py(y), kW - kRight, py(y), kLeft - 6, py(y) + 4, y);
  }
  int every = std::max(1, static_cast<int>((lx1 - lx0) / 12) + 1);
  for (int e = static_cast<int>(std::ceil(lx0)); e <= static_cast<int>(lx1); e += every) {
    double x = std::ldexp(1.0, e);
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        px(x), kTop, kH - kBottom, kH - kBottom + 16, sizeLabel(x));
  }
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">size (bytes)</text>\n"
      "<text transform=\"translate(18,{:.1f}) rotate(-90)\" text-anchor=\"middle\">bus bandwidth "
      "(GB/s)</text>\n",
      (kLeft + kW - kRight) / 2, kH - 12, (kTop + kH - kBottom) / 2);
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  int i = 0;
  for (const Series& s : series) {
    const char* color = kColors[i % 10];
    std::string pts;
    for (const auto& [x, y] : s.points) {
      if (x <= 0 || y < 0) continue;
      if (s.marks)
        out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"/>\n", px(x),
                           py(y), color);
      else
        pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    if (!pts.empty())
      out += fmt::format(
          "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", color, pts);
    double ly = kTop + 10 + 18 * i;
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        kW - kRight + 12, ly - 10, color, kW - kRight + 30, ly, escaped(s.name));
    ++i;
  }
  return out + "</svg>\n";
}

Result<std::vector<Series>> readPublished(const std::string& path) {
  std::ifstream in(path);
  if (!in) return LOOM_ERROR(kInvalidArgument, "--published {}: cannot read it", path);
  std::map<std::string, Series> byName;
  std::vector<std::string> order;
  std::string line;
  int lineNo = 0;
  bool sawHeader = false;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.empty() || line[0] == '#') continue;
    const char* p = line.c_str();
    char* end = nullptr;
    double size = std::strtod(p, &end);
    if (end == p) {
      if (!sawHeader && order.empty()) {  // a header, before any point
        sawHeader = true;
        continue;
      }
      return LOOM_ERROR(kInvalidArgument, "{} line {}: expected size_bytes,busbw_gbps[,label]",
                        path, lineNo);
    }
    if (*end != ',')
      return LOOM_ERROR(kInvalidArgument, "{} line {}: expected a comma after the size", path,
                        lineNo);
    p = end + 1;
    double busbw = std::strtod(p, &end);
    if (end == p || !(size > 0) || !(busbw >= 0) || !std::isfinite(size) || !std::isfinite(busbw))
      return LOOM_ERROR(kInvalidArgument, "{} line {}: size and busbw must be positive numbers",
                        path, lineNo);
    std::string label = "published";
    if (*end == ',') {
      label = std::string(end + 1);
      while (!label.empty() && (label.back() == '\r' || label.back() == ' ')) label.pop_back();
      if (label.empty()) label = "published";
    } else if (*end != '\0' && *end != '\r') {
      return LOOM_ERROR(kInvalidArgument, "{} line {}: unexpected text after the bandwidth", path,
                        lineNo);
    }
    if (!byName.count(label)) order.push_back(label);
    Series& s = byName[label];
    s.name = label;
    s.marks = true;
    s.points.emplace_back(size, busbw);
  }
  std::vector<Series> out;
  for (const std::string& n : order) out.push_back(byName[n]);
  return out;
}

}  // namespace sim
}  // namespace loom
