// loom-sim: what a cluster nobody can book would do. It predicts nccl-tests' table (loom-perf's
// columns, "predicted" in the header) for a collective on N nodes of a built-in machine or of an
// NCCL topology file, over a fabric given by options: NCCL's algorithms and protocols with NCCL's
// own choice, Loom's algorithms with its planner's choice, one block per algorithm asked for, and
// a summary of who wins at each size.
//   loom-sim all_reduce --topo dgx-h100 --nodes 64 -b 8 -e 8G -f 2 --algo auto,nccl,nccl:ring
//   loom-sim all_gather --topo p5.xml --nodes 16 --oversub 2 -J out.json --svg out.svg
//   loom-sim --list-machines
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/cluster.h"
#include "algorithms/cluster_file.h"
#include "algorithms/nccl_model.h"
#include "algorithms/planner.h"
#include "loom/loom.h"
#include "nlohmann/json.hpp"
#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "tools/cli.h"
#include "tools/perf/collectives.h"
#include "tools/perf/options.h"
#include "tools/perf/report.h"
#include "tools/sim/plot.h"

namespace loom {
namespace sim {
namespace {

constexpr int kExitError = 1;
using tools::kExitUsage;

int usageError(const std::string& message) { return tools::usageError("loom-sim", message); }

// One block of the output: what is predicted for every size.
struct Block {
  enum class Kind { kLoom, kLoomAuto, kNccl, kNcclChoice, kNcclWithTuner };
  Kind kind = Kind::kLoom;
  std::string name;  // as asked ("hier", "auto", "nccl", "nccl:ring")
  const AlgorithmInfo* loom = nullptr;
  NcclAlgo ncclAlgo = NcclAlgo::kRing;
  int ncclProto = -1;  // -1: the best protocol
};

struct Prediction {
  double us = -1;       // < 0: the algorithm does not run this call
  std::string ran;      // what ran: "nvls/Simple", "hier", ...
  perf::Measurement m;  // us as nccl-tests reports it (time, algbw, busbw)
};

struct BlockResult {
  Block block;
  std::vector<Prediction> rows;  // per size
};

std::string describeFabric(const ClusterSpec& c) {
  if (c.nodes == 1) return "one node (no network)";
  const FabricSpec& f = c.fabric;
  std::string tiers = f.tiers == 1 ? "one switch per rail"
                                   : fmt::format(
                                         "{}-tier fat tree of radix-{} switches ({} nodes "
                                         "per leaf)",
                                         f.tiers, f.radix, c.nodesPerLeaf());
  return fmt::format(
      "{} x {:g} Gb/s NICs per node on {} rails, {}, oversubscription {:g}:1, "
      "{:g} us per hop beyond the first switch, SHARP {}",
      c.node.nics, c.node.nicGBs * 8, f.rails > 0 ? f.rails : c.node.nics, tiers, f.oversub,
      f.hopLatencyUs, f.sharp ? "on" : "off");
}

// Parses --algo: Loom's algorithms of the collective, "auto", "nccl", "nccl:ALGO[/PROTO]", "all".
bool parseBlocks(const std::string& spec, CollKind coll, const NcclModel& nccl,
                 std::vector<Block>* out, std::string* error) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    names.push_back(spec.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::string loomNames;
  for (const AlgorithmInfo& a : algorithms())
    if (a.coll == coll) loomNames += (loomNames.empty() ? "" : ", ") + std::string(a.name);
  for (const std::string& raw : names) {
    std::string n = asciiLower(raw);
    if (n == "all") {
      out->push_back({Block::Kind::kLoomAuto, "auto"});
      for (const AlgorithmInfo& a : algorithms())
        if (a.coll == coll) out->push_back({Block::Kind::kLoom, a.name, &a});
      out->push_back({Block::Kind::kNcclChoice, "nccl"});
      for (int a = 0; a < kNcclAlgos; ++a) {
        NcclChoice c;
        auto algo = static_cast<NcclAlgo>(a);
        bool runs = false;
        for (size_t b = 1; b <= (size_t{1} << 34) && !runs; b *= 4)
          runs = nccl.bestProtocol(coll, algo, b, &c);
        if (runs)
          out->push_back(
              {Block::Kind::kNccl, std::string("nccl:") + ncclAlgoName(algo), nullptr, algo});
      }
      continue;
    }
    if (n == "auto") {
      out->push_back({Block::Kind::kLoomAuto, "auto"});
      continue;
    }
    if (n == "nccl") {
      out->push_back({Block::Kind::kNcclChoice, "nccl"});
      continue;
    }
    if (n == "loom-tuner") {
      out->push_back({Block::Kind::kNcclWithTuner, "loom-tuner"});
      continue;
    }
    if (n.rfind("nccl:", 0) == 0) {
      Block b{Block::Kind::kNccl, n};
      std::string algo = n.substr(5), proto;
      size_t slash = algo.find('/');
      if (slash != std::string::npos) {
        proto = algo.substr(slash + 1);
        algo = algo.substr(0, slash);
      }
      if (!parseNcclAlgo(algo, &b.ncclAlgo)) {
        *error = "--algo " + raw +
                 ": NCCL has no such algorithm (tree, ring, collnet_direct, collnet_chain, nvls, "
                 "nvls_tree, pat)";
        return false;
      }
      if (!proto.empty()) {
        for (int p = 0; p < kNcclProtos; ++p)
          if (asciiLower(ncclProtoName(static_cast<NcclProto>(p))) == proto) b.ncclProto = p;
        if (b.ncclProto < 0) {
          *error = "--algo " + raw + ": NCCL has no protocol '" + proto + "' (LL, LL128, Simple)";
          return false;
        }
      }
      out->push_back(b);
      continue;
    }
    const AlgorithmInfo* a = findAlgorithm(coll, n);
    if (!a) {
      *error = fmt::format(
          "--algo {}: {} has no Loom algorithm of that name (Loom: {}; also auto, nccl, "
          "nccl:ALGO[/PROTO], loom-tuner, all)",
          raw, collName(coll), loomNames);
      return false;
    }
    out->push_back({Block::Kind::kLoom, a->name, a});
  }
  return true;
}

struct Options {
  std::string coll;
  std::string topo;
  int nodes = -1;  // -1: the nodes of the file (1 for a built-in)
  std::string minBytes = "8", maxBytes = "8G", stepBytes = "", stepFactor = "2";
  std::string datatype = "float", op = "sum";
  int root = 0;
  std::string algo = "auto,nccl";
  std::string json, svg, published;
  bool listMachines = false;
  // Fabric and node overrides (negative: from the machine).
  int nics = -1;
  double nicGbps = -1;
  int gpus = -1;
  int cores = -1;
  double memcpyGbps = -1, reduceGbps = -1;
  bool loomCostsGiven = false;
  ClusterSpec cluster;
  std::string sharp = "off";
};

class Simulator {
 public:
  Simulator(const ClusterSpec& c, NcclModel nccl, CollKind coll, loomDataType_t type,
            std::shared_ptr<const RankLayout> layout)
      : c_(c), nccl_(std::move(nccl)), coll_(coll), type_(type), layout_(std::move(layout)) {
    // The runtime knows nothing of the fabric: its planner prices a non-blocking one.
    ClusterSpec blind = c_;
    blind.fabric.oversub = 1;
    blind.fabric.hopLatencyUs = 0;
    planner_ = std::make_unique<Planner>(clusterCostMachine(blind, TrafficPattern::kNeighbor),
                                         layout_, kPieceBytes);
  }

  Prediction predict(const Block& b, size_t paramCount) const {
    Prediction p;
    const size_t el = dataTypeSize(type_);
    CollArgs args;
    args.coll = coll_;
    args.nranks = c_.nranks();
    args.count = paramCount;
    args.layout = layout_;
    const size_t ncclBytes = collCallCount(coll_, paramCount, args.nranks) * el;
    switch (b.kind) {
      case Block::Kind::kLoom:
        return loomTime(*b.loom, args);
      case Block::Kind::kLoomAuto: {
        Result<Plan> plan = planner_->choose(args, el, AlgoFilter());
        if (!plan.isOk()) return p;
        const AlgorithmInfo* a = findAlgorithm(coll_, plan.value().algorithm);
        if (!a) return p;
        return loomTime(*a, args);
      }
      case Block::Kind::kNcclChoice:
      case Block::Kind::kNcclWithTuner: {
        // NCCL alone takes its own model's least time; with Loom's tuner plugin, the least
        // predicted time (libnccl-tuner-loom.so decides with this model).
        NcclChoice ch;
        if (b.kind == Block::Kind::kNcclChoice
                ? !nccl_.choose(coll_, ncclBytes, &ch)
                : !nccl_.choosePredicted(coll_, ncclBytes, nullptr, &ch))
          return p;
        p.us = ch.time.predictedUs;
        p.ran = fmt::format("{}/{}", ncclAlgoName(ch.algo), ncclProtoName(ch.proto));
        return p;
      }
      case Block::Kind::kNccl: {
        NcclChoice ch;
        if (b.ncclProto >= 0) {
          NcclTime t =
              nccl_.time(coll_, b.ncclAlgo, static_cast<NcclProto>(b.ncclProto), ncclBytes);
          if (t.predictedUs < 0) return p;
          ch.algo = b.ncclAlgo;
          ch.proto = static_cast<NcclProto>(b.ncclProto);
          ch.time = t;
        } else if (!nccl_.bestProtocol(coll_, b.ncclAlgo, ncclBytes, &ch)) {
          return p;
        }
        p.us = ch.time.predictedUs;
        p.ran = fmt::format("{}/{}", ncclAlgoName(ch.algo), ncclProtoName(ch.proto));
        return p;
      }
    }
    return p;
  }

 private:
  // LOOM_CHUNK_SIZE's default: the executor's pieces.
  static constexpr size_t kPieceBytes = 512 << 10;

  Prediction loomTime(const AlgorithmInfo& a, const CollArgs& args) const {
    Prediction p;
    CostMachine m = clusterCostMachine(c_, loomPattern(coll_, a.name));
    Result<double> s = priceAlgorithm(a, args, m, dataTypeSize(type_), kPieceBytes);
    if (!s.isOk()) return p;
    p.us = s.value() * 1e6;
    p.ran = a.name;
    return p;
  }

  ClusterSpec c_;
  NcclModel nccl_;
  CollKind coll_;
  loomDataType_t type_;
  std::shared_ptr<const RankLayout> layout_;
  std::unique_ptr<Planner> planner_;
};

int run(Options& o) {
  CollKind coll;
  if (!perf::findColl(o.coll, &coll) || coll == CollKind::kSendRecv)
    return usageError("unknown collective '" + o.coll +
                      "' (all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall)");
  int dt = parseDataType(o.datatype.c_str());
  if (dt < 0) return usageError("unknown datatype '" + o.datatype + "'");
  int op = parseRedOp(o.op.c_str());
  if (op < 0) return usageError("unknown reduction '" + o.op + "'");
  const auto type = static_cast<loomDataType_t>(dt);

  perf::Options sweep;
  int64_t v = 0;
  if (!parseSize(o.minBytes, &v)) return usageError("invalid -b '" + o.minBytes + "'");
  sweep.minBytes = static_cast<size_t>(v);
  if (!parseSize(o.maxBytes, &v)) return usageError("invalid -e '" + o.maxBytes + "'");
  sweep.maxBytes = static_cast<size_t>(v);
  if (!o.stepBytes.empty()) {
    if (!parseSize(o.stepBytes, &v) || v <= 0)
      return usageError("invalid -i '" + o.stepBytes + "'");
    sweep.stepBytes = static_cast<size_t>(v);
    sweep.stepFactor = 1;
  } else {
    if (!parseSize(o.stepFactor, &v) || v < 2)
      return usageError("invalid -f '" + o.stepFactor + "' (at least 2)");
    sweep.stepFactor = static_cast<size_t>(v);
  }
  if (sweep.minBytes > sweep.maxBytes) return usageError("-b is larger than -e");

  Result<Machine> machine = loadMachine(o.topo);
  if (!machine.isOk()) {
    std::fprintf(stderr, "loom-sim: %s\n", machine.status().message().c_str());
    return kExitUsage;
  }
  ClusterSpec& c = o.cluster;
  c.node = machine.value().node;
  c.nodes = o.nodes >= 0 ? o.nodes : machine.value().nodesInFile;
  if (o.nics >= 0) c.node.nics = o.nics;
  if (o.nicGbps >= 0) c.node.nicGBs = o.nicGbps / 8;
  if (o.gpus >= 0) c.node.gpus = o.gpus;
  if (o.cores >= 0 || o.memcpyGbps >= 0 || o.reduceGbps >= 0) {
    if (!c.node.hostMemory)
      return usageError(
          "--cores, --memcpy-gbps and --reduce-gbps describe CPU hosts (--topo "
          "cpu-host)");
    if (o.cores >= 0) c.node.cores = o.cores;
    if (o.memcpyGbps >= 0) c.node.memcpyGBs = o.memcpyGbps;
    if (o.reduceGbps >= 0) c.node.reduceGBs = o.reduceGbps;
  }
  if (c.node.hostMemory && !o.loomCostsGiven) c.loom = hostMessageCosts();
  if (o.sharp != "on" && o.sharp != "off") return usageError("--sharp takes on or off");
  c.fabric.sharp = o.sharp == "on";
  Status valid = c.validate();
  if (!valid.isOk()) return usageError(valid.message());
  if (c.nranks() > (1 << 20)) return usageError("more than 1,048,576 GPUs");

  Result<NcclModel> nccl = NcclModel::build(c);
  if (!nccl.isOk()) return usageError(nccl.status().message());
  std::vector<Block> blocks;
  std::string error;
  if (!parseBlocks(o.algo, coll, nccl.value(), &blocks, &error)) return usageError(error);

  std::vector<int> hostOf(static_cast<size_t>(c.nranks()));
  for (int r = 0; r < c.nranks(); ++r) hostOf[static_cast<size_t>(r)] = r / c.node.gpus;
  Result<std::shared_ptr<const RankLayout>> layout = RankLayout::create(hostOf);
  if (!layout.isOk()) return usageError(layout.status().message());
  Simulator sim(c, nccl.value(), coll, type, layout.value());

  const perf::CollInfo& info = perf::collInfo(coll);
  const std::vector<size_t> sizes = perf::sweepSizes(sweep);
  // Each size's counts and the first columns of its row, as loom-perf prints them.
  std::vector<perf::CollCounts> counts;
  std::vector<perf::Row> sizeRows;
  for (size_t bytes : sizes) {
    perf::CollCounts cc = perf::collCounts(coll, bytes, dataTypeSize(type), c.nranks());
    perf::Row row;
    row.bytes = std::max(cc.sendCount, cc.recvCount) * dataTypeSize(type);
    row.count = cc.paramCount;
    row.type = dataTypeName(type);
    row.redop = info.hasOp ? redOpName(static_cast<loomRedOp_t>(op)) : "none";
    row.root = info.hasRoot ? o.root : -1;
    counts.push_back(cc);
    sizeRows.push_back(row);
  }
  std::vector<BlockResult> results;
  for (const Block& b : blocks) {
    BlockResult r{b, {}};
    for (const perf::CollCounts& cc : counts) {
      Prediction p = sim.predict(b, cc.paramCount);
      if (p.us >= 0) {
        p.m.timeUs = p.us;
        perf::collBandwidth(coll, cc.paramCount, dataTypeSize(type), p.us * 1e-6, c.nranks(),
                            &p.m.algBw, &p.m.busBw);
      }
      r.rows.push_back(std::move(p));
    }
    results.push_back(std::move(r));
  }

  // The text report.
  std::string out;
  out +=
      fmt::format("# loom-sim {}.{}.{}: predicted {}_perf on {} node{} x {} = {} {}\n", LOOM_MAJOR,
                  LOOM_MINOR, LOOM_PATCH, perf::collTestName(coll), c.nodes, c.nodes > 1 ? "s" : "",
                  c.node.name, c.nranks(), c.node.hostMemory ? "ranks" : "GPUs");
  out += "#  node: " + c.node.description + "\n";
  out += "#  fabric: " + describeFabric(c) + "\n";
  if (c.node.hostMemory)
    out += fmt::format(
        "#  CPU hosts: {} rank(s) per host on {} core(s), copies {:g} GB/s, reductions {:g} GB/s; "
        "Loom's messages: {:g} us inside a host, {:g} us between hosts\n",
        c.node.gpus, c.node.cores > 0 ? std::to_string(c.node.cores) : std::string("as many"),
        c.node.memcpyGBs, c.node.reduceGBs, c.loom.intraUs, c.loom.interUs);
  else
    out += fmt::format(
        "#  Loom's messages: {:g} us inside a node, {:g} us between nodes (assumed: Loom's device "
        "path is not yet timed on a GPU)\n",
        c.loom.intraUs, c.loom.interUs);
  std::string graphs;
  for (int a = 0; a < kNcclAlgos; ++a) {
    const NcclGraph& g = nccl.value().graph(static_cast<NcclAlgo>(a));
    if (g.channels == 0) continue;
    graphs += fmt::format("{}{} {}x{:g}/{:g}", graphs.empty() ? "" : ", ",
                          ncclAlgoName(static_cast<NcclAlgo>(a)), g.channels, g.bwIntra, g.bwInter);
  }
  out += "#  NCCL's graphs (channels x GB/s inside/between nodes): " +
         (graphs.empty() ? "none" : graphs) + "\n#\n";
  std::vector<double> avgBus(results.size(), 0);
  for (size_t bi = 0; bi < results.size(); ++bi) {
    const BlockResult& r = results[bi];
    const char* what = r.block.kind == Block::Kind::kLoomAuto     ? "Loom's planner's choice"
                       : r.block.kind == Block::Kind::kNcclChoice ? "NCCL 2.28's default choice"
                       : r.block.kind == Block::Kind::kNccl ? "NCCL's algorithm, best protocol"
                                                            : "Loom's algorithm";
    out += fmt::format("# Algorithm: {} ({})\n", r.block.name, what);
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:^23}\n", "", "", "", "", "",
                       "predicted");
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {}\n", "size",
                       "count", "type", "redop", "root", "time", "algbw", "busbw", "algorithm");
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}\n", "(B)",
                       "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)");
    int counted = 0;
    for (size_t si = 0; si < sizes.size(); ++si) {
      const perf::Row& row = sizeRows[si];
      const Prediction& p = r.rows[si];
      if (p.us < 0) {
        out += perf::formatRowPrefix(row) +
               fmt::format("  {:>7}  {:>6}  {:>6}  {}\n", "-", "-", "-", "(does not run here)");
        continue;
      }
      std::string cols = perf::formatMeasurement(p.m);
      cols.resize(cols.size() - 7);  // no "#wrong" column ("  %5s"): nothing ran
      out += perf::formatRowPrefix(row) + cols + "  " + p.ran + "\n";
      avgBus[bi] += p.m.busBw;
      ++counted;
    }
    if (counted) avgBus[bi] /= counted;
    out += fmt::format("# Avg bus bandwidth    : {:g} (predicted)\n#\n", avgBus[bi]);
  }
  // Who wins at each size.
  if (results.size() > 1) {
    out += "# Summary (predicted): the fastest block at each size, and each block's time over it\n";
    std::string head = fmt::format("# {:>10}  {:>10}", "size", "fastest");
    for (const BlockResult& r : results)
      head += fmt::format("  {:>10}", r.block.name.substr(0, 10));
    out += head + "\n";
    for (size_t si = 0; si < sizes.size(); ++si) {
      size_t best = results.size();
      for (size_t bi = 0; bi < results.size(); ++bi) {
        const Prediction& p = results[bi].rows[si];
        if (p.us >= 0 && (best == results.size() || p.us < results[best].rows[si].us)) best = bi;
      }
      std::string line =
          fmt::format("  {:>10}  {:>10}", sizes[si],
                      best < results.size() ? results[best].block.name.substr(0, 10) : "-");
      for (const BlockResult& r : results) {
        const Prediction& p = r.rows[si];
        if (p.us < 0 || best == results.size())
          line += fmt::format("  {:>10}", "-");
        else
          line += fmt::format("  {:>10.2f}", p.us / results[best].rows[si].us);
      }
      out += line + "\n";
    }
    out += "#\n";
  }
  std::fputs(out.c_str(), stdout);

  bool ok = true;
  if (!o.json.empty()) {
    nlohmann::json j;
    j["tool"] = "loom-sim";
    j["version"] = fmt::format("{}.{}.{}", LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH);
    j["test"] = std::string(perf::collTestName(coll)) + "_perf";
    j["collective"] = perf::collTestName(coll);
    j["predicted"] = true;
    j["nranks"] = c.nranks();
    j["machine"] = {{"name", c.node.name},          {"description", c.node.description},
                    {"source", c.node.source},      {"nodes", c.nodes},
                    {"gpus_per_node", c.node.gpus}, {"sm", c.node.sm},
                    {"nvlinks", c.node.nvlinks},    {"nvlink_gbs", c.node.nvlinkGBs},
                    {"nvswitch", c.node.nvswitch},  {"nics", c.node.nics},
                    {"nic_gbs", c.node.nicGBs}};
    j["fabric"] = {{"rails", c.fabric.rails > 0 ? c.fabric.rails : c.node.nics},
                   {"tiers", c.fabric.tiers},
                   {"radix", c.fabric.radix},
                   {"oversubscription", c.fabric.oversub},
                   {"hop_latency_us", c.fabric.hopLatencyUs},
                   {"sharp", c.fabric.sharp}};
    nlohmann::json rows = nlohmann::json::array();
    for (const BlockResult& r : results) {
      for (size_t si = 0; si < sizes.size(); ++si) {
        const perf::Row& sr = sizeRows[si];
        const Prediction& p = r.rows[si];
        nlohmann::json row = {
            {"block", r.block.name},
            {"size", sr.bytes},
            {"count", sr.count},
            {"type", sr.type},
            {"redop", sr.redop},
            {"root", sr.root},
            {"algorithm", p.us < 0 ? nlohmann::json(nullptr) : nlohmann::json(p.ran)}};
        if (p.us >= 0) {
          row["out_of_place"] = {{"time_us", p.m.timeUs},
                                 {"algbw_gbps", p.m.algBw},
                                 {"busbw_gbps", p.m.busBw},
                                 {"wrong", nullptr}};
        } else {
          row["out_of_place"] = nullptr;
        }
        rows.push_back(row);
      }
    }
    j["results"] = rows;
    std::ofstream f(o.json);
    f << j.dump(2) << "\n";
    f.close();
    if (!f) {
      std::fprintf(stderr, "loom-sim: cannot write %s\n", o.json.c_str());
      ok = false;
    }
  }
  if (!o.svg.empty()) {
    std::vector<Series> series;
    for (const BlockResult& r : results) {
      Series s;
      s.name = r.block.name;
      for (size_t si = 0; si < sizes.size(); ++si) {
        const Prediction& p = r.rows[si];
        if (p.us >= 0) s.points.emplace_back(static_cast<double>(sizes[si]), p.m.busBw);
      }
      series.push_back(std::move(s));
    }
    if (!o.published.empty()) {
      Result<std::vector<Series>> pub = readPublished(o.published);
      if (!pub.isOk()) {
        std::fprintf(stderr, "loom-sim: %s\n", pub.status().message().c_str());
        return kExitUsage;
      }
      for (Series& s : pub.value()) series.push_back(std::move(s));
    }
    std::string title = fmt::format("{} on {} x {} ({} GPUs), predicted busbw",
                                    perf::collTestName(coll), c.nodes, c.node.name, c.nranks());
    std::ofstream f(o.svg);
    f << plotSvg(title, series);
    f.close();
    if (!f) {
      std::fprintf(stderr, "loom-sim: cannot write %s\n", o.svg.c_str());
      ok = false;
    }
  }
  return ok ? 0 : kExitError;
}

}  // namespace
}  // namespace sim
}  // namespace loom

int main(int argc, char** argv) {
  using loom::sim::Options;
  CLI::App app{
      "loom-sim: predicted nccl-tests results for a collective on a cluster of N nodes of a "
      "built-in machine or an NCCL topology file: NCCL's algorithms and its choice, Loom's "
      "algorithms and its planner's choice"};
  app.set_version_flag("--version",
                       fmt::format("loom-sim {}.{}.{}", LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Options o;
  loom::FabricSpec& f = o.cluster.fabric;
  loom::LoomMessageCosts& lc = o.cluster.loom;
  app.add_option("collective", o.coll,
                 "all_reduce, all_gather, reduce_scatter, broadcast, reduce or alltoall");
  app.add_option("--topo", o.topo,
                 "A built-in machine (see --list-machines) or an NCCL topology XML file");
  app.add_option("--nodes", o.nodes,
                 "Nodes (hosts, or NVLink domains) in the cluster (default: the file's, or 1)")
      ->capture_default_str();
  app.add_option("-b,--minbytes", o.minBytes, "Smallest size (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.maxBytes, "Largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.stepFactor, "Multiply the size by this")
      ->capture_default_str();
  app.add_option("-i,--stepbytes", o.stepBytes, "Add this to the size instead of -f");
  app.add_option("-d,--datatype", o.datatype, "Datatype")->capture_default_str();
  app.add_option("-o,--op", o.op, "Reduction")->capture_default_str();
  app.add_option("-r,--root", o.root, "Root of broadcast and reduce")->capture_default_str();
  app.add_option("--algo", o.algo,
                 "Blocks to predict, comma separated: Loom's algorithms (ring, tree, hier, ...), "
                 "auto (Loom's planner), nccl (NCCL's choice), loom-tuner (NCCL with Loom's tuner "
                 "plugin), nccl:ALGO[/PROTO] (ring, tree, nvls, nvls_tree, collnet_direct, "
                 "collnet_chain, pat), all")
      ->capture_default_str();
  app.add_option("-J,--json", o.json, "Write the predictions as JSON (loom-perf's rows)");
  app.add_option("--svg", o.svg, "Plot busbw against size for every block to this SVG file");
  app.add_option("--published", o.published,
                 "With --svg: CSV of published points (size_bytes,busbw_gbps[,label])");
  app.add_flag("--list-machines", o.listMachines, "List the built-in machines and exit");
  app.add_option("--gpus", o.gpus, "GPUs per node (default: the machine's)");
  app.add_option("--nics", o.nics, "Network ports per node (default: the machine's)");
  app.add_option("--nic-gbps", o.nicGbps, "Speed of one port in Gb/s (default: the machine's)");
  app.add_option("--rails", f.rails, "Rails (default: one per NIC)");
  app.add_option("--tiers", f.tiers, "Fat-tree tiers: 1, 2 or 3")->capture_default_str();
  app.add_option("--radix", f.radix, "Switch ports")->capture_default_str();
  app.add_option("--oversub", f.oversub, "Oversubscription above the leaf (2 = 2:1)")
      ->capture_default_str();
  app.add_option("--hop-latency", f.hopLatencyUs, "Microseconds per switch hop beyond the first")
      ->capture_default_str();
  app.add_option("--sharp", o.sharp, "In-network reduction (IB SHARP, NCCL's CollNet): on or off")
      ->capture_default_str();
  CLI::Option* intraUs =
      app.add_option("--loom-intra-us", lc.intraUs, "Loom's cost of one message inside a node")
          ->capture_default_str();
  CLI::Option* interUs =
      app.add_option("--loom-inter-us", lc.interUs, "Loom's cost of one message between nodes")
          ->capture_default_str();
  app.add_option("--cores", o.cores, "CPU hosts: cores a host's ranks share");
  app.add_option("--memcpy-gbps", o.memcpyGbps, "CPU hosts: one core's copy rate, GB/s");
  app.add_option("--reduce-gbps", o.reduceGbps, "CPU hosts: one core's reduction rate, GB/s");
  if (int rc = loom::tools::parseCommandLine(app, argc, argv, "loom-sim"); rc >= 0) return rc;
  o.loomCostsGiven = intraUs->count() > 0 || interUs->count() > 0;
  if (o.listMachines) {
    for (const loom::NodeSpec& n : loom::builtinNodes())
      std::printf("%-12s %s\n             source: %s\n", n.name.c_str(), n.description.c_str(),
                  n.source.c_str());
    return 0;
  }
  if (o.coll.empty()) return loom::sim::usageError("name a collective (all_reduce, ...)");
  if (o.topo.empty())
    return loom::sim::usageError("--topo is required (a built-in machine or a file)");
  return loom::sim::run(o);
}
