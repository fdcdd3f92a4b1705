#include "algorithms/algo_filter.h"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>

#include "src/core/log.h"
#include "src/core/text.h"

namespace loom {

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    out.push_back(trim(s.substr(start, at == std::string::npos ? std::string::npos : at - start)));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return out;
}

std::string validCollNames() {
  std::string s;
  for (CollKind c : kCollectives) s += (s.empty() ? "" : ", ") + collSpecName(c);
  return s;
}

std::string validAlgoNames() {
  std::set<std::string> names;
  for (const AlgorithmInfo& a : algorithms()) names.insert(a.name);
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

Result<AlgoFilter> AlgoFilter::parse(const std::string& spec, const char* source) {
  AlgoFilter f;
  f.spec_ = spec;
  f.source_ = source;
  if (trim(spec).empty()) return f;
  std::set<std::string> known;
  for (const AlgorithmInfo& a : algorithms()) known.insert(a.name);
  for (const std::string& part : split(spec, ';')) {
    if (part.empty()) continue;
    Rule r;
    std::string list = part;
    size_t colon = part.find(':');
    if (colon != std::string::npos) {
      std::string cname = asciiLower(trim(part.substr(0, colon)));
      if (!collFromSpecName(cname, &r.coll))
        return LOOM_ERROR(kInvalidArgument, "{}={}: unknown collective '{}' (valid: {})", source,
                          spec, cname, validCollNames());
      r.any = false;
      list = trim(part.substr(colon + 1));
    }
    if (!list.empty() && list[0] == '^') {
      r.exclude = true;
      list = trim(list.substr(1));
    }
    for (const std::string& name : split(list, ',')) {
      std::string n = asciiLower(name);
      if (n.empty())
        return LOOM_ERROR(kInvalidArgument, "{}={}: empty algorithm name", source, spec);
      if (!known.count(n))
        return LOOM_ERROR(kInvalidArgument, "{}={}: unknown algorithm '{}' (valid: {})", source,
                          spec, n, validAlgoNames());
      r.names.push_back(n);
    }
    f.rules_.push_back(std::move(r));
  }
  // Which registered algorithms of coll a rule lets through.
  auto leavesSome = [](const Rule& r, CollKind coll) {
    for (const AlgorithmInfo& a : algorithms()) {
      if (a.coll != coll) continue;
      bool listed = std::find(r.names.begin(), r.names.end(), a.name) != r.names.end();
      if (listed != r.exclude) return true;
    }
    return false;
  };
  auto registeredFor = [](CollKind coll) {
    std::string s;
    for (const AlgorithmInfo& a : algorithms())
      if (a.coll == coll) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
  };
  std::string skipped;
  for (Rule& r : f.rules_) {
    for (CollKind coll : kCollectives) {
      if (r.any) {
        if (leavesSome(r, coll)) continue;
        if (std::find(r.skipped.begin(), r.skipped.end(), coll) != r.skipped.end()) continue;
        r.skipped.push_back(coll);
        if (skipped.find(collSpecName(coll)) == std::string::npos)
          skipped += (skipped.empty() ? "" : ", ") + collSpecName(coll);
      } else if (r.coll == coll && !leavesSome(r, coll)) {
        return LOOM_ERROR(kInvalidArgument, "{}={} leaves no algorithm for {} (it has: {})", source,
                          spec, collSpecName(coll), registeredFor(coll));
      }
    }
  }
  if (!skipped.empty())
    f.note_ = fmt::format(
        "{}={}: {} {} no such algorithm and keep{} the automatic choice (name a collective, as "
        "in 'allreduce:ring', to restrict only it)",
        source, spec, skipped, skipped.find(',') == std::string::npos ? "has" : "have",
        skipped.find(',') == std::string::npos ? "s" : "");
  return f;
}

void AlgoFilter::warnOnce() const {
  if (note_.empty()) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!warned.insert(source_ + "=" + spec_).second) return;
  }
  LOOM_WARN("{}", note_);
}

bool AlgoFilter::allows(CollKind coll, const std::string& algorithm) const {
  // The most specific rule decides: a rule for this collective, else a rule for every collective.
  // A rule for every collective that leaves this one nothing does not apply to it.
  const Rule* rule = nullptr;
  for (const Rule& r : rules_)
    if (!r.any && r.coll == coll) rule = &r;
  if (!rule)
    for (const Rule& r : rules_)
      if (r.any && std::find(r.skipped.begin(), r.skipped.end(), coll) == r.skipped.end())
        rule = &r;
  if (!rule) return true;
  bool listed = std::find(rule->names.begin(), rule->names.end(), algorithm) != rule->names.end();
  return rule->exclude ? !listed : listed;
}

Result<std::string> AlgoFilter::choose(CollKind coll, const std::string& preferred) const {
  if (allows(coll, preferred)) return preferred;
  std::string registered;
  for (const AlgorithmInfo& a : algorithms()) {
    if (a.coll != coll) continue;
    if (allows(coll, a.name)) return std::string(a.name);
    registered += (registered.empty() ? "" : ", ") + std::string(a.name);
  }
  return LOOM_ERROR(kInvalidArgument, "{}={} leaves no algorithm for {} (it has: {})", source_,
                    spec_, collName(coll), registered);
}

}  // namespace loom
