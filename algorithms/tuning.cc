#include "algorithms/tuning.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/core/text.h"

namespace loom {

std::string describeLayout(int nranks, const std::vector<int>& ranksPerHost) {
  std::string s;
  for (int r : ranksPerHost) s += (s.empty() ? "" : ",") + std::to_string(r);
  return fmt::format("{} ranks, ranks per host {}", nranks, s.empty() ? "?" : s);
}

Result<TuningFile> parseTuning(const std::string& text, const std::string& source) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    return LOOM_ERROR(kInvalidArgument, "tuning file {}: not valid JSON", source);
  TuningFile f;
  try {
    if (!j.is_object() || j.value("loom_tuning", 0) != 1)
      return LOOM_ERROR(kInvalidArgument, "tuning file {}: \"loom_tuning\": 1 is missing", source);
    const json& layout = j.at("layout");
    f.nranks = layout.at("nranks").get<int>();
    f.ranksPerHost = layout.at("ranks_per_host").get<std::vector<int>>();
    int sum = 0;
    for (int r : f.ranksPerHost) {
      if (r <= 0)
        return LOOM_ERROR(kInvalidArgument, "tuning file {}: a host with {} ranks", source, r);
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
      t.minBytes = e.at("min_bytes").get<size_t>();
      t.maxBytes = e.at("max_bytes").get<size_t>();
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
