// NCCL's algorithms on modelled clusters: the graphs its search would find, the choices its tuning
// model makes (what NCCL users see in NCCL_DEBUG=INFO's tuning tables and nccl-tests sweeps), what
// it refuses to run, and what the fabric does to the predictions. The cluster description itself:
// validation, built-in machines and the fabric's shares.
#include "algorithms/nccl_model.h"

#include <gtest/gtest.h>

#include "algorithms/cluster.h"

namespace loom {
namespace {

ClusterSpec cluster(const std::string& machine, int nodes) {
  ClusterSpec c;
  c.node = builtinNode(machine).value();
  c.nodes = nodes;
  return c;
}

NcclModel model(const ClusterSpec& c) {
  Result<NcclModel> m = NcclModel::build(c);
  EXPECT_TRUE(m.isOk()) << m.status().message();
  return m.value();
}

NcclChoice choice(const NcclModel& m, CollKind coll, size_t bytes) {
  NcclChoice c;
  EXPECT_TRUE(m.choose(coll, bytes, &c));
  return c;
}

double busBw(const ClusterSpec& c, CollKind coll, size_t bytes, double us) {
  const double n = c.nranks();
  const double factor = coll == CollKind::kAllReduce ? 2 * (n - 1) / n
                        : coll == CollKind::kAllGather || coll == CollKind::kReduceScatter
                            ? (n - 1) / n
                            : 1;
  return bytes / (us * 1e3) * factor;
}

TEST(NcclModel, GraphsFitTheLinks) {
  for (const NodeSpec& n : builtinNodes()) {
    for (int nodes : {1, 2, 16}) {
      ClusterSpec c = cluster(n.name, nodes);
      NcclModel m = model(c);
      const NcclGraph& ring = m.graph(NcclAlgo::kRing);
      if (n.hostMemory) {  // NCCL does not run on CPU hosts
        for (int a = 0; a < kNcclAlgos; ++a)
          EXPECT_EQ(m.graph(static_cast<NcclAlgo>(a)).channels, 0) << n.name;
        NcclChoice none;
        EXPECT_FALSE(m.choose(CollKind::kAllReduce, 1 << 20, &none));
        continue;
      }
      ASSERT_GT(ring.channels, 0) << n.name;
      // NCCL's search never plans more than a GPU's links (in NCCL's per-link rates) carry.
      double links = n.nvlinks > 0 ? n.nvlinks * (n.sm >= 100 ? 40.1 : 20.6) : n.pciGBs * 0.75;
      EXPECT_LE(ring.channels * ring.bwIntra, links + 1e-6) << n.name;
      if (nodes > 1) {
        EXPECT_LE(ring.channels * ring.bwInter, n.nics * n.nicGBs + 1e-6) << n.name;
      }
      // NVLS only on NVSwitch systems that reduce, from Hopper on.
      EXPECT_EQ(m.graph(NcclAlgo::kNvls).channels > 0, n.nvls) << n.name;
      // CollNet only with in-network reduction.
      EXPECT_EQ(m.graph(NcclAlgo::kCollNetDirect).channels, 0) << n.name;
    }
  }
}

// The choices NCCL is known for on a DGX H100: LL for small messages, NVLS for large ones in one
// node, the tree with LL / LL128 at medium sizes across nodes and NVLS-tree for large ones.
TEST(NcclModel, ChoicesOnDgxH100) {
  ClusterSpec one = cluster("dgx-h100", 1);
  NcclModel m1 = model(one);
  EXPECT_EQ(choice(m1, CollKind::kAllReduce, 8).proto, NcclProto::kLL);
  EXPECT_EQ(choice(m1, CollKind::kAllReduce, 8).algo, NcclAlgo::kRing);
  NcclChoice big = choice(m1, CollKind::kAllReduce, size_t{1} << 30);
  EXPECT_EQ(big.algo, NcclAlgo::kNvls);
  EXPECT_EQ(big.proto, NcclProto::kSimple);
  // NVLS reaches about 480 GB/s of busbw on 8 H100s (NVIDIA's published figure for DGX H100);
  // the model's own limit is 8 channels x min(NVLS rate, 60 GB/s).
  double bw = busBw(one, CollKind::kAllReduce, size_t{1} << 33,
                    choice(m1, CollKind::kAllReduce, size_t{1} << 33).time.ncclUs);
  EXPECT_GT(bw, 430);
  EXPECT_LT(bw, 500);
  EXPECT_EQ(choice(m1, CollKind::kAllGather, size_t{1} << 30).algo, NcclAlgo::kRing);

  ClusterSpec many = cluster("dgx-h100", 16);
  NcclModel m16 = model(many);
  NcclChoice small = choice(m16, CollKind::kAllReduce, 8);
  EXPECT_EQ(small.algo, NcclAlgo::kTree);
  EXPECT_EQ(small.proto, NcclProto::kLL);
  EXPECT_EQ(choice(m16, CollKind::kAllReduce, size_t{1} << 30).algo, NcclAlgo::kNvlsTree);
  // Broadcast and Reduce have only the ring; AllToAll and SendRecv no NCCL algorithm at all.
  EXPECT_EQ(choice(m16, CollKind::kBroadcast, 1 << 20).algo, NcclAlgo::kRing);
  NcclChoice none;
  EXPECT_FALSE(m16.choose(CollKind::kAllToAll, 1 << 20, &none));
  EXPECT_FALSE(m16.choose(CollKind::kSendRecv, 1 << 20, &none));
}

TEST(NcclModel, WhatEachMachineRefuses) {
  // A PCIe server: no NVLS, and no LL128 (NCCL enables it over NVLink only).
  NcclModel pcie = model(cluster("pcie-h100", 2));
  for (size_t b = 8; b <= (size_t{1} << 32); b *= 8) {
    NcclChoice c = choice(pcie, CollKind::kAllReduce, b);
    EXPECT_NE(c.algo, NcclAlgo::kNvls);
    EXPECT_NE(c.algo, NcclAlgo::kNvlsTree);
    EXPECT_NE(c.proto, NcclProto::kLL128);
  }
  EXPECT_LT(pcie.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kLL128, 1 << 20).ncclUs, 0);
  // PAT: AllGather and ReduceScatter with one GPU per node only.
  ClusterSpec single = cluster("dgx-h100", 8);
  single.node.gpus = 1;
  NcclModel one = model(single);
  EXPECT_GT(one.time(CollKind::kAllGather, NcclAlgo::kPat, NcclProto::kSimple, 1 << 20).ncclUs, 0);
  NcclModel eight = model(cluster("dgx-h100", 8));
  EXPECT_LT(eight.time(CollKind::kAllGather, NcclAlgo::kPat, NcclProto::kSimple, 1 << 20).ncclUs,
            0);
  EXPECT_LT(one.time(CollKind::kAllReduce, NcclAlgo::kPat, NcclProto::kSimple, 1 << 20).ncclUs, 0);
  // NVLS-tree needs two nodes; CollNet needs SHARP.
  NcclModel dgx1 = model(cluster("dgx-h100", 1));
  EXPECT_LT(
      dgx1.time(CollKind::kAllReduce, NcclAlgo::kNvlsTree, NcclProto::kSimple, 1 << 20).ncclUs, 0);
  ClusterSpec sharp = cluster("dgx-h100", 8);
  sharp.fabric.sharp = true;
  NcclModel withSharp = model(sharp);
  EXPECT_GT(
      withSharp.time(CollKind::kAllReduce, NcclAlgo::kCollNetDirect, NcclProto::kSimple, 1 << 20)
          .ncclUs,
      0);
  EXPECT_LT(eight.time(CollKind::kAllReduce, NcclAlgo::kCollNetDirect, NcclProto::kSimple, 1 << 20)
                .ncclUs,
            0);
}

TEST(NcclModel, TimesGrowWithSizeAndRanks) {
  for (const NodeSpec& n : builtinNodes()) {
    if (n.hostMemory) continue;
    NcclModel m = model(cluster(n.name, 4));
    for (int a = 0; a < kNcclAlgos; ++a) {
      for (int p = 0; p < kNcclProtos; ++p) {
        double prev = 0;
        for (size_t b = 64; b <= (size_t{1} << 32); b *= 4) {
          NcclTime t =
              m.time(CollKind::kAllReduce, static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), b);
          if (t.ncclUs < 0) break;
          EXPECT_GT(t.ncclUs, prev) << n.name << " " << ncclAlgoName(static_cast<NcclAlgo>(a));
          prev = t.ncclUs;
        }
      }
    }
  }
  // More nodes: the ring's latency grows with them.
  NcclModel m2 = model(cluster("dgx-h100", 2)), m64 = model(cluster("dgx-h100", 64));
  EXPECT_LT(m2.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kLL, 8).ncclUs,
            m64.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kLL, 8).ncclUs);
}

// NCCL does not know the fabric; the prediction does. On a non-blocking fabric within one leaf the
// two agree; oversubscription slows what crosses the spine: all-to-all patterns first, trees (a
// few edges leave each leaf) only when it is steep, rings (one edge per leaf) hardly ever.
TEST(NcclModel, TheFabricChangesPredictionsNotChoices) {
  ClusterSpec leaf = cluster("dgx-h100", 16);
  leaf.fabric.hopLatencyUs = 0.5;
  NcclModel m = model(leaf);
  for (size_t b = 8; b <= (size_t{1} << 30); b *= 32) {
    NcclChoice c = choice(m, CollKind::kAllReduce, b);
    EXPECT_DOUBLE_EQ(c.time.ncclUs, c.time.predictedUs) << b;
  }
  ClusterSpec big = cluster("dgx-h100", 512);
  ClusterSpec over = big;
  over.fabric.oversub = 32;
  NcclModel flat = model(big), tight = model(over);
  const size_t b = size_t{1} << 30;
  NcclChoice cf = choice(flat, CollKind::kAllReduce, b),
             ct = choice(tight, CollKind::kAllReduce, b);
  EXPECT_EQ(cf.algo, NcclAlgo::kNvlsTree);
  EXPECT_EQ(cf.algo, ct.algo);  // NCCL chooses alike
  EXPECT_DOUBLE_EQ(cf.time.ncclUs, ct.time.ncclUs);
  EXPECT_GT(ct.time.predictedUs, cf.time.predictedUs);  // but its tree takes longer
  EXPECT_DOUBLE_EQ(
      flat.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kSimple, b).predictedUs,
      tight.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kSimple, b).predictedUs);
  // Extra hops: 512 nodes cross the spine, a predicted ring pays them at every step.
  EXPECT_GT(flat.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kLL, 8).predictedUs,
            flat.time(CollKind::kAllReduce, NcclAlgo::kRing, NcclProto::kLL, 8).ncclUs);
  EXPECT_LT(fabricShare(over, TrafficPattern::kAllToAll), fabricShare(over, TrafficPattern::kTree));
  EXPECT_LT(fabricShare(over, TrafficPattern::kTree), 1.0);
  EXPECT_DOUBLE_EQ(fabricShare(over, TrafficPattern::kNeighbor), 1.0);
  ClusterSpec mild = big;
  mild.fabric.oversub = 2;
  EXPECT_NEAR(fabricShare(mild, TrafficPattern::kAllToAll), 0.5 * 512 / (512 - 32), 1e-9);
  EXPECT_DOUBLE_EQ(fabricShare(leaf, TrafficPattern::kAllToAll), 1.0);
}

TEST(NcclModel, AlgorithmNames) {
  NcclAlgo a;
  EXPECT_TRUE(parseNcclAlgo("NVLS_Tree", &a));
  EXPECT_EQ(a, NcclAlgo::kNvlsTree);
  EXPECT_TRUE(parseNcclAlgo("collnet", &a));
  EXPECT_EQ(a, NcclAlgo::kCollNetDirect);
  EXPECT_FALSE(parseNcclAlgo("swing", &a));
  EXPECT_STREQ(ncclProtoName(NcclProto::kLL128), "LL128");
}

TEST(Cluster, ValidationNamesTheField) {
  ClusterSpec c = cluster("dgx-h100", 4);
  EXPECT_TRUE(c.validate().isOk());
  auto message = [](ClusterSpec bad) { return bad.validate().message(); };
  ClusterSpec bad = c;
  bad.nodes = 0;
  EXPECT_NE(message(bad).find("nodes must be at least 1"), std::string::npos);
  bad = c;
  bad.fabric.tiers = 4;
  EXPECT_NE(message(bad).find("1, 2 or 3 tiers"), std::string::npos);
  bad = c;
  bad.fabric.radix = 33;
  EXPECT_NE(message(bad).find("radix"), std::string::npos);
  bad = c;
  bad.fabric.oversub = 0.5;
  EXPECT_NE(message(bad).find("oversubscription"), std::string::npos);
  bad = c;
  bad.node.nics = 0;
  EXPECT_NE(message(bad).find("need a network"), std::string::npos);
  bad = c;
  bad.nodes = 5000;  // a 2-tier radix-64 fabric holds 2,048 nodes per rail
  EXPECT_NE(message(bad).find("do not fit a 2-tier fabric"), std::string::npos) << message(bad);
  bad.fabric.tiers = 3;
  EXPECT_TRUE(bad.validate().isOk());
  // One node needs no network.
  ClusterSpec alone = cluster("dgx-h100", 1);
  alone.node.nics = 0;
  EXPECT_TRUE(alone.validate().isOk());
  bad.fabric.tiers = 4;
  EXPECT_FALSE(NcclModel::build(bad).isOk());
}

TEST(Cluster, BuiltinsAreDocumented) {
  ASSERT_GE(builtinNodes().size(), 5u);
  for (const NodeSpec& n : builtinNodes()) {
    EXPECT_FALSE(n.description.empty()) << n.name;
    EXPECT_FALSE(n.source.empty()) << n.name;
    ClusterSpec c;
    c.node = n;
    c.nodes = 2;
    EXPECT_TRUE(c.validate().isOk()) << n.name << ": " << c.validate().message();
  }
  EXPECT_TRUE(builtinNode("DGX-H100").isOk());
  Result<NodeSpec> none = builtinNode("dgx-a100");
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("known: dgx-h100"), std::string::npos);
}

}  // namespace
}  // namespace loom
