#include "tools/perf/report.h"

#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/loom.h"

namespace loom {
namespace perf {
namespace {

// printf formatting, so that the format strings are nccl-tests' own.
__attribute__((format(printf, 1, 2))) std::string cformat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&out[0], out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

nlohmann::json measurementJson(const Measurement& m) {
  nlohmann::json j;
  j["time_us"] = m.timeUs;
  j["algbw_gbps"] = m.algBw;
  j["busbw_gbps"] = m.busBw;
  j["wrong"] = m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong);
  return j;
}

}  // namespace

std::string formatHeader(const Options& opts, const std::vector<RankInfo>& ranks) {
  std::string out;
  out += cformat("# Collective test starting: %s\n", opts.programName.c_str());
  out += cformat("# loom-perf version %d.%d.%d loom-headers=%d\n", LOOM_MAJOR, LOOM_MINOR,
                 LOOM_PATCH, LOOM_VERSION_CODE);
  const bool factor = opts.stepFactor > 1;
  out += cformat(
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n",
      opts.nThreads, opts.nGpus, opts.minBytes, opts.maxBytes,
      factor ? opts.stepFactor : opts.stepBytes, factor ? "factor" : "bytes", opts.warmupIters,
      opts.iters, opts.aggIters, opts.check, opts.cudaGraph);
  if (opts.localRegister)
    out +=
        "# Buffers from loomMemAlloc and registered with loomCommRegister (-R): peers on this "
        "host map them\n";
  if (opts.blocking)
    out += "# Blocking Enabled: wait for completion and barrier after each collective \n";
  out += "#\n";
  if (!ranks.empty() && !ranks[0].gpu.empty())
    out +=
        "# Buffers on CUDA devices (--mem device); calls enqueued on each rank's stream, timed "
        "to its synchronization\n";
  out += "# Using devices\n";
  for (const auto& r : ranks) {
    if (!r.gpu.empty())
      out += cformat("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", r.rank, 0, r.pid,
                     r.host.c_str(), r.device, r.busId.c_str(), r.gpu.c_str());
    else
      out += cformat("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] %s\n", r.rank, 0,
                     r.pid, r.host.c_str(), r.device, r.cpu.c_str());
  }
  out += "#\n";
  if (!opts.compare.empty()) {
    out += cformat(
        "# Compared interleaved, out of place: each time (us) is the algorithm's best of %d "
        "rounds of %d iterations; #wrong sums every round's\n",
        opts.compareRounds, opts.iters);
    std::string names, units;
    for (const std::string& a : opts.compare) {
      names += cformat("  %10s  %6s", a.c_str(), "#wrong");
      units += cformat("  %10s  %6s", "(us)", "");
    }
    out += cformat("# %10s  %12s  %8s  %6s  %6s%s  %10s  %6s  %s\n", "size", "count", "type",
                   "redop", "root", names.c_str(), "fastest", "auto/f", "auto ran");
    out +=
        cformat("# %10s  %12s  %8s  %6s  %6s%s\n", "(B)", "(elements)", "", "", "", units.c_str());
    return out;
  }
  out += cformat(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
      "          \n",
      "", "", "", "", "");
  out += cformat("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
                 "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                 "algbw", "busbw", "#wrong");
  out += cformat("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
                 "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                 "(GB/s)", "");
  return out;
}

std::string formatRowPrefix(const Row& row) {
  std::string root = cformat("%6i", row.root);
  return cformat("%12zu  %12zu  %8s  %6s  %6s", row.bytes, row.count, row.type.c_str(),
                 row.redop.c_str(), root.c_str());
}

std::string formatMeasurement(const Measurement& m) {
  std::string time;
  if (m.timeUs >= 10000.0) {
    time = cformat("%7.0f", m.timeUs);
  } else if (m.timeUs >= 100.0) {
    time = cformat("%7.1f", m.timeUs);
  } else {
    time = cformat("%7.2f", m.timeUs);
  }
  if (m.wrong >= 0)
    return cformat("  %7s  %6.2f  %6.2f  %5g", time.c_str(), m.algBw, m.busBw,
                   static_cast<double>(m.wrong));
  return cformat("  %7s  %6.2f  %6.2f  %5s", time.c_str(), m.algBw, m.busBw, "N/A");
}

std::string formatCompareRow(const Row& row) {
  std::string out = formatRowPrefix(row);
  const std::pair<std::string, Measurement>* fastest = nullptr;
  const Measurement* automatic = nullptr;
  for (const auto& c : row.compare) {
    out += cformat("  %10.1f  %6s", c.second.timeUs,
                   c.second.wrong < 0 ? "N/A" : std::to_string(c.second.wrong).c_str());
    if (!fastest || c.second.timeUs < fastest->second.timeUs) fastest = &c;
    if (c.first == "auto") automatic = &c.second;
  }
  out += cformat("  %10s", fastest ? fastest->first.c_str() : "-");
  if (automatic && fastest && fastest->second.timeUs > 0)
    out += cformat("  %6.2f", automatic->timeUs / fastest->second.timeUs);
  else
    out += cformat("  %6s", "-");
  if (!row.planned.empty()) out += "  " + row.planned;
  return out + "\n";
}

std::string formatFooter(int64_t wrongValues, double avgBusBw) {
  std::string out;
  out += cformat("# Out of bounds values : %lld %s\n", static_cast<long long>(wrongValues),
                 wrongValues ? "FAILED" : "OK");
  out += cformat("# Avg bus bandwidth    : %g \n", avgBusBw);
  out += "#\n";
  return out;
}

bool writeJson(const std::string& path, const JsonReport& report, std::string* error) {
  const Options& o = *report.opts;
  nlohmann::json j;
  j["tool"] = "loom-perf";
  j["version"] = cformat("%d.%d.%d", LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH);
  j["test"] = o.programName;
  j["collective"] = collTestName(o.coll);
  j["nranks"] = report.nranks;
  j["options"] = {{"minbytes", o.minBytes},
                  {"maxbytes", o.maxBytes},
                  {"stepbytes", o.stepBytes},
                  {"stepfactor", o.stepFactor},
                  {"iters", o.iters},
                  {"warmup_iters", o.warmupIters},
                  {"agg_iters", o.aggIters},
                  {"check", o.check},
                  {"average", o.average},
                  {"blocking", o.blocking},
                  {"run_cycles", o.runCycles},
                  {"timeout_s", o.timeoutSec},
                  {"root", o.root}};
  if (!o.compare.empty()) {
    j["options"]["compare"] = o.compare;
    j["options"]["compare_rounds"] = o.compareRounds;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : report.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"pid", r.pid},
                     {"host", r.host},
                     {"device", r.device},
                     {"cpu", r.cpu},
                     {"gpu", r.gpu},
                     {"bus_id", r.busId}});
  }
  j["ranks"] = ranks;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.rows) {
    nlohmann::json row = {{"cycle", r.cycle}, {"size", r.bytes},  {"count", r.count},
                          {"type", r.type},   {"redop", r.redop}, {"root", r.root}};
    if (r.compare.empty()) {
      row["out_of_place"] = measurementJson(r.outOfPlace);
      row["in_place"] = measurementJson(r.inPlace);
    } else {
      nlohmann::json cmp = nlohmann::json::object();
      for (const auto& c : r.compare) cmp[c.first] = measurementJson(c.second);
      row["compare"] = cmp;  // out of place, each algorithm's best round
      row["planned"] = r.planned;
    }
    rows.push_back(row);
  }
  j["results"] = rows;
  j["out_of_bounds_values"] = report.wrongValues;
  j["avg_busbw_gbps"] = report.avgBusBw;
  j["status"] = report.error.empty() ? "ok" : "error";
  if (!report.error.empty()) j["error"] = report.error;

  std::ofstream f(path);
  if (!f) {
    *error = "cannot open " + path + " for writing";
    return false;
  }
  f << j.dump(2) << "\n";
  f.close();
  if (!f) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace perf
}  // namespace loom
