#include "algorithms/tuning.h"

#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "src/core/text.h"

namespace loom {

std::string describeLayout(int nranks, const std::vector<int>& ranksPerHost) {
  std::string s;
  for (int r : ranksPerHost) s += (s.empty() ? "" : ",") + std::to_string(r);
  return fmt::format("{} ranks, ranks per host {}", nranks, s.empty() ? "?" : s);
}

namespace {

// A field that is not what it must be (thrown by the readers below, caught with the JSON
// library's own errors).
struct BadField : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer field from lo to hi. Only JSON integers: a number with a fraction or an exponent
// (3e20) is refused rather than converted (out of an int's range that conversion is undefined),
// and so is an integer out of range (rather than wrapped).
int64_t integerField(const nlohmann::json& v, const char* name, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo)
      return static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= lo && x <= hi) return x;
  }
  throw BadField(fmt::format("\"{}\" is {}, not an integer from {} to {}", name, v.dump(), lo, hi));
}

// A byte count: any unsigned 64-bit integer.
size_t sizeField(const nlohmann::json& v, const char* name) {
  if (v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0))
    return static_cast<size_t>(v.get<uint64_t>());
  throw BadField(fmt::format("\"{}\" is {}, not a byte count", name, v.dump()));
}

}  // namespace

Result<TuningFile> parseTuning(const std::string& text, const std::string& source) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    return LOOM_ERROR(kInvalidArgument, "tuning file {}: not valid JSON", source);
  TuningFile f;
  try {
    const auto version = j.is_object() ? j.find("loom_tuning") : j.end();
    if (!j.is_object() || version == j.end() || !version->is_number_integer() ||
        version->get<int64_t>() != 1)
      return LOOM_ERROR(kInvalidArgument, "tuning file {}: \"loom_tuning\": 1 is missing", source);
    const json& layout = j.at("layout");
    const int maxInt = std::numeric_limits<int>::max();
    f.nranks = static_cast<int>(integerField(layout.at("nranks"), "nranks", 1, maxInt));
    const json& hosts = layout.at("ranks_per_host");
    if (!hosts.is_array()) throw BadField("\"ranks_per_host\" is not a list");
    int64_t sum = 0;
    for (const json& h : hosts) {
      const int64_t r = integerField(h, "ranks_per_host", std::numeric_limits<int>::min(), maxInt);
      if (r <= 0)
        return LOOM_ERROR(kInvalidArgument, "tuning file {}: a host with {} ranks", source, r);
      f.ranksPerHost.push_back(static_cast<int>(r));
      sum += r;
    }
    if (f.nranks <= 0 || sum != f.nranks)
      return LOOM_ERROR(kInvalidArgument,
                        "tuning file {}: nranks {} does not match ranks_per_host (sum {})", source,
                        f.nranks, sum);
    size_t i = 0;
    for (const json& e : j.at("entries")) {
      TuningEntry t;
      std::string coll = e.at("collective").get<std::string>();
      if (!collFromSpecName(coll, &t.coll))
        return LOOM_ERROR(kInvalidArgument, "tuning file {}: entry {}: unknown collective '{}'",
                          source, i, coll);
      t.minBytes = sizeField(e.at("min_bytes"), "min_bytes");
      t.maxBytes = sizeField(e.at("max_bytes"), "max_bytes");
      t.algorithm = asciiLower(e.at("algorithm").get<std::string>());
      t.measuredUs = e.value("measured_us", 0.0);
      if (t.minBytes > t.maxBytes)
        return LOOM_ERROR(kInvalidArgument, "tuning file {}: entry {}: min_bytes {} > max_bytes {}",
                          source, i, t.minBytes, t.maxBytes);
      if (!findAlgorithm(t.coll, t.algorithm))
        return LOOM_ERROR(kInvalidArgument, "tuning file {}: entry {}: {} has no algorithm '{}'",
                          source, i, collName(t.coll), t.algorithm);
      f.entries.push_back(std::move(t));
      ++i;
    }
  } catch (const json::exception& e) {
    return LOOM_ERROR(kInvalidArgument, "tuning file {}: {}", source, e.what());
  } catch (const BadField& e) {
    return LOOM_ERROR(kInvalidArgument, "tuning file {}: {}", source, e.what());
  }
  return f;
}

Result<TuningFile> loadTuning(const std::string& path) {
  std::ifstream in(path);
  if (!in) return LOOM_ERROR(kInvalidArgument, "tuning file {} cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parseTuning(ss.str(), path);
}

std::string formatTuning(const TuningFile& file) {
  using nlohmann::json;
  json j;
  j["loom_tuning"] = 1;
  j["layout"] = {{"nranks", file.nranks}, {"ranks_per_host", file.ranksPerHost}};
  j["entries"] = json::array();
  for (const TuningEntry& t : file.entries)
    j["entries"].push_back({{"collective", collSpecName(t.coll)},
                            {"min_bytes", t.minBytes},
                            {"max_bytes", t.maxBytes},
                            {"algorithm", t.algorithm},
                            {"measured_us", t.measuredUs}});
  return j.dump(2) + "\n";
}

}  // namespace loom
