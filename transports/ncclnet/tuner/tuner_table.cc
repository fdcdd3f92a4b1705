#include "transports/ncclnet/tuner/tuner_table.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "src/core/text.h"

namespace loom {
namespace tuner {

namespace {

bool parseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseColl(const std::string& s, CollKind* out) {
  static const std::pair<const char*, CollKind> kNames[] = {
      {"broadcast", CollKind::kBroadcast},
      {"reduce", CollKind::kReduce},
      {"allgather", CollKind::kAllGather},
      {"reducescatter", CollKind::kReduceScatter},
      {"allreduce", CollKind::kAllReduce}};
  for (const auto& [name, kind] : kNames) {
    if (s == name) {
      *out = kind;
      return true;
    }
  }
  return false;
}

std::string trimmed(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

bool TableRow::matches(CollKind c, uint64_t bytes, int nodes, int ranks, int pipeOps,
                       int reg) const {
  return c == coll && bytes >= minBytes && bytes <= maxBytes && (nNodes < 0 || nNodes == nodes) &&
         (nRanks < 0 || nRanks == ranks) && (numPipeOps < 0 || numPipeOps == pipeOps) &&
         (regBuff < 0 || regBuff == reg);
}

Result<std::vector<TableRow>> parseTable(const std::string& text, const std::string& source) {
  std::vector<TableRow> rows;
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  while (std::getline(in, raw)) {
    ++lineNo;
    std::string line = trimmed(raw);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string item;
    while (std::getline(ss, item, ',')) f.push_back(asciiLower(trimmed(item)));
    if (line.back() == ',') f.push_back("");
    auto bad = [&](const std::string& why) {
      return LOOM_ERROR(kInvalidArgument,
                        "{} line {}: {} (expected collective,min_bytes,max_bytes,"
                        "algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff])",
                        source, lineNo, why);
    };
    if (f.size() != 8 && f.size() != 9 && f.size() != 10)
      return bad(fmt::format("{} fields", f.size()));
    TableRow r;
    r.line = lineNo;
    if (!parseColl(f[0], &r.coll)) return bad("unknown collective '" + f[0] + "'");
    long long v = 0;
    if (!parseInt(f[1], 0, INT64_MAX, &v)) return bad("min_bytes '" + f[1] + "' is not a size");
    r.minBytes = static_cast<uint64_t>(v);
    if (!parseInt(f[2], 0, INT64_MAX, &v)) return bad("max_bytes '" + f[2] + "' is not a size");
    r.maxBytes = static_cast<uint64_t>(v);
    if (r.minBytes > r.maxBytes) return bad("min_bytes is larger than max_bytes");
    if (!parseNcclAlgo(f[3], &r.algo)) return bad("unknown algorithm '" + f[3] + "'");
    bool proto = false;
    for (int p = 0; p < kNcclProtos; ++p) {
      if (asciiLower(ncclProtoName(static_cast<NcclProto>(p))) == f[4]) {
        r.proto = static_cast<NcclProto>(p);
        proto = true;
      }
    }
    if (!proto) return bad("unknown protocol '" + f[4] + "' (ll, ll128, simple)");
    int* ints[] = {&r.channels, &r.nNodes, &r.nRanks, &r.numPipeOps, &r.regBuff};
    const char* names[] = {"channels", "nNodes", "nRanks", "numPipeOps", "regBuff"};
    for (size_t i = 5; i < f.size(); ++i) {
      if (!parseInt(f[i], -1, 1 << 24, &v) || (v == 0 && i != 9))
        return bad(fmt::format("{} '{}' is not -1 or a positive count", names[i - 5], f[i]));
      *ints[i - 5] = static_cast<int>(v);
    }
    if (r.regBuff > 1) return bad("regBuff must be -1, 0 or 1");
    rows.push_back(r);
  }
  return rows;
}

Result<std::vector<TableRow>> loadTable(const std::string& path) {
  std::ifstream in(path);
  if (!in) return systemError("cannot read tuner table " + path, errno);
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > (16u << 20))
    return LOOM_ERROR(kInvalidArgument, "{}: larger than 16 MiB", path);
  return parseTable(ss.str(), path);
}

}  // namespace tuner
}  // namespace loom
