// Facts a reader checks by hand in each shared file, counted over all device pairs: how many
// (GPU, port) pairs may use GPUDirect RDMA, how many GPU pairs may use peer-to-peer, and the
// NVLink bandwidth of every GPU pair. (paths_test.cc checks each GPU's nearest NIC.)
//
// Read from the files:
//  oci-hpc_H100: 8 GPUs, each behind a two-level Broadcom switch holding one dual-port ConnectX-7
//    (gdr="1" on GPUs and nets) -> 8 x 2 GDR pairs; 18 NVLinks per GPU to the NVSwitches
//    (5+5+4+4, sm 90: 20.6 GB/s each) -> every ordered GPU pair NVL at 370.8 GB/s, all P2P.
//  aws p5.48xl: 8 GPUs, each on a switch with four EFA nets, all gdr="1" -> 8 x 4 GDR pairs; no
//    NVLink elements, one AMD NUMA node -> GPUs meet at the CPU (PHB): no P2P.
//  aws p4d-24xl: PCI tree only (no <gpu>, no <net>) -> no GDR pair; two GPUs per virtual switch ->
//    4 x 2 ordered P2P pairs (PIX), the rest PHB/SYS.
//  azhpc ncv4: eth0 has gdr="0" -> no GDR pair; NVLinks point at the GPU's own bus id -> none;
//    4 GPUs on 4 AMD NUMA nodes -> no P2P.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "topology/paths.h"
#include "topology/xml.h"

namespace loom::topo {
namespace {

struct Facts {
  const char* file;
  int gpus, nics, ports;
  int gdrPairs;     // (GPU, port) pairs
  int p2pPairs;     // ordered GPU pairs
  int nvlPairs;     // ordered GPU pairs with an NVL path
  double nvlBwGBs;  // bandwidth of each of those paths
};

const Facts kFacts[] = {
    {"oci-hpc_H100-topology.xml", 8, 8, 16, 16, 56, 56, 18 * 20.6},
    {"aws-ofi-nccl_p5.48xl-topo.xml", 8, 32, 32, 32, 0, 0, 0},
    {"aws-ofi-nccl_p4d-24xl-topo.xml", 8, 4, 0, 0, 8, 0, 0},
    {"azhpc-images_ncv4-topo.xml", 4, 1, 1, 0, 0, 0, 0},
};

TEST(TopologyFacts, PairCountsOfEachSharedFile) {
  for (const Facts& f : kFacts) {
    std::string path = std::string(LOOM_SHARED_DIR) + "/topologies/" + f.file;
    if (!std::ifstream(path).good()) {
      GTEST_SKIP() << "missing " << path << " (the shared topology fixtures)";
    }
    SCOPED_TRACE(f.file);
    auto r = importXmlFile(path);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    const Graph& g = r.value();
    Paths p = Paths::compute(g);
    EXPECT_EQ(g.count(NodeType::kGpu), f.gpus);
    EXPECT_EQ(g.count(NodeType::kNic), f.nics);
    EXPECT_EQ(g.count(NodeType::kNet), f.ports);
    int gdr = 0, p2p = 0, nvl = 0;
    for (int a : g.nodesOfType(NodeType::kGpu)) {
      for (int net : g.nodesOfType(NodeType::kNet)) gdr += p.gdrAllowed(a, net);
      for (int b : g.nodesOfType(NodeType::kGpu)) {
        if (a == b) continue;
        p2p += p.p2pAllowed(a, b);
        if (p.get(a, b).type == PathType::kNvl) {
          nvl++;
          EXPECT_NEAR(p.get(a, b).bw, f.nvlBwGBs, 1e-3) << g.describe(a) << " " << g.describe(b);
        }
      }
    }
    EXPECT_EQ(gdr, f.gdrPairs);
    EXPECT_EQ(p2p, f.p2pPairs);
    EXPECT_EQ(nvl, f.nvlPairs);
  }
}

}  // namespace
}  // namespace loom::topo
