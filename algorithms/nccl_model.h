// NVIDIA NCCL's algorithms and protocols on a modelled cluster: what NCCL would choose for a call
// and how long that takes, beside Loom's own algorithms (loom-sim, the tuner plugin).
//
// Two views of one model:
// - NCCL's view: NCCL's tuning model (src/graph/tuning.cc of NCCL 2.28) fed with the channels and
//   per-channel rates NCCL's topology search would find on the node (an emulation of
//   src/graph/search.cc: its speed arrays, its channel count bounded by the GPUs' NVLink or PCIe
//   and the NICs, its channel duplication and its second pass). Its published constants (base and
//   hardware latencies per algorithm and protocol, the LL / LL128 / tree bandwidth caps, the NVLS
//   efficiency, the tree correction factors, the ring plateau) are used as published. NCCL's
//   default choice is the (algorithm, protocol) of least time in this view.
// - The fabric's view: the same formulas with what NCCL does not know: each algorithm's share of a
//   NIC once the fabric's uplinks are shared by its traffic pattern (rings: neighbours, trees,
//   butterflies, all-to-all, in-network reduction) and the latency of the switch hops beyond the
//   first one. This is the predicted time of the call.
//
// What the emulation of the search leaves out: rings over GPUs that are not fully connected
// (NVLink meshes without NVSwitch are priced as if switched), NCCL's crossNic and PXN choices,
// the tree pattern fallback, NCCL's per-size channel and thread reduction for small calls (its
// time estimate does not use them either), and user overrides (NCCL_ALGO, NCCL_PROTO).
// Thread-safe once built.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>

#include "algorithms/cluster.h"
#include "src/core/collective.h"
#include "src/core/status.h"

namespace loom {

// In NCCL's order (NCCL_ALGO_*, NCCL_PROTO_*).
enum class NcclAlgo : int { kTree, kRing, kCollNetDirect, kCollNetChain, kNvls, kNvlsTree, kPat };
enum class NcclProto : int { kLL, kLL128, kSimple };
inline constexpr int kNcclAlgos = 7;
inline constexpr int kNcclProtos = 3;
const char* ncclAlgoName(NcclAlgo a);    // NCCL's spelling, lower case: "ring", "nvls_tree", ...
const char* ncclProtoName(NcclProto p);  // "LL", "LL128", "Simple"
// Parses ncclAlgoName's spellings (and "collnet" for CollNet direct), case-insensitive.
bool parseNcclAlgo(const std::string& name, NcclAlgo* out);

// What NCCL's search would find for one algorithm's graph: channels and per-channel rates.
struct NcclGraph {
  int channels = 0;     // 0: no graph (the algorithm cannot run here)
  double bwIntra = 0;   // GB/s per channel inside a node
  double bwInter = 0;   // GB/s per channel between nodes
  bool nvlink = false;  // the graph's intra-node links are NVLink (else PCIe)
};

// NCCL's tuning constants (what NCCL 2.28 hands a v5 tuner plugin at init, in its layout): the
// model starts from NCCL 2.28's published values (defaults()) and takes the ones NCCL reports.
struct NcclConstants {
  double baseLat[kNcclAlgos][kNcclProtos];
  double hwLat[3][kNcclAlgos][kNcclProtos];  // NVLink, PCIe, network
  double llMaxBws[4][3];                     // Volta, Ampere, Hopper, Blackwell x 1, 2, more nodes
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNvlsTreeBws[4][3];
  static const NcclConstants& defaults();
};

struct NcclTime {
  double ncclUs = -1;       // NCCL's own estimate; < 0: NCCL would not use this combination
  double predictedUs = -1;  // on the modelled fabric; < 0 with ncclUs
};

struct NcclChoice {
  NcclAlgo algo = NcclAlgo::kRing;
  NcclProto proto = NcclProto::kSimple;
  NcclTime time;
};

class NcclModel {
 public:
  // Errors: an invalid cluster (ClusterSpec::validate). constants: NCCL's (null: the defaults).
  static Result<NcclModel> build(const ClusterSpec& cluster,
                                 const NcclConstants* constants = nullptr);

  // One (algorithm, protocol) for a call of `bytes` (nccl-tests' size: the whole buffer for
  // AllGather and ReduceScatter). SendRecv and AllToAll have no NCCL algorithm: always < 0.
  NcclTime time(CollKind coll, NcclAlgo a, NcclProto p, size_t bytes) const;
  // NCCL's default choice: least NCCL-estimated time; false when nothing runs (one rank, or a
  // collective NCCL does not tune).
  bool choose(CollKind coll, size_t bytes, NcclChoice* out) const;
  // The (algorithm, protocol) of least predicted time among those `allowed` accepts (all when
  // null): what Loom's tuner plugin makes NCCL run. False when none runs.
  bool choosePredicted(CollKind coll, size_t bytes,
                       const std::function<bool(NcclAlgo, NcclProto)>& allowed,
                       NcclChoice* out) const;
  // The best protocol of one algorithm by predicted time; false when the algorithm cannot run.
  bool bestProtocol(CollKind coll, NcclAlgo a, size_t bytes, NcclChoice* out) const;

  const NcclGraph& graph(NcclAlgo a) const { return graphs_[static_cast<int>(a)]; }
  const ClusterSpec& cluster() const { return cluster_; }

 private:
  struct Table {
    // [coll][algo][proto]: NCCL's latency (us) and bus bandwidth converted to algorithm
    // bandwidth (GB/s); bw 0 = disabled.
    double lat[6][kNcclAlgos][kNcclProtos] = {};
    double bw[6][kNcclAlgos][kNcclProtos] = {};
  };
  void fillTable(bool fabric, Table* t) const;
  double tableTime(const Table& t, CollKind coll, NcclAlgo a, NcclProto p, size_t bytes) const;

  ClusterSpec cluster_;
  NcclConstants k_{};
  std::array<NcclGraph, kNcclAlgos> graphs_{};
  Table nccl_, fabric_;
};

}  // namespace loom
