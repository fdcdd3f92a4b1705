// The per-rank topology exchanged at communicator init and the global picture built from it.
#include "topology/system.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "topology/xml.h"

namespace loom::topo {
namespace {

std::string topoPath(const std::string& file) {
  return std::string(LOOM_SHARED_DIR) + "/topologies/" + file;
}

// A host with `ports` ports of `gbs` GB/s and one GPU per port.
RankTopo fakeRank(const std::string& host, int ports, double gbs = 25, int cudaDev = -1) {
  RankTopo t;
  t.hostId = host;
  t.numaNode = 0;
  t.cudaDev = cudaDev;
  for (int i = 0; i < ports; i++) {
    RankTopo::Port p;
    p.name = fmt::format("mlx5_{}", i);
    p.busId = fmt::format("0000:{:02x}:00.0", 0x10 + i);
    p.dev = i;
    p.port = 1;
    p.numa = i / 2;
    p.speedGBs = gbs;
    p.guid = 0x1000 + static_cast<uint64_t>(i);
    p.gdr = true;
    t.ports.push_back(p);
    RankTopo::Gpu g;
    g.busId = fmt::format("0000:{:02x}:00.0", 0x80 + i);
    g.dev = i;
    g.sm = 90;
    g.numa = i / 2;
    g.nearestPort = i;
    t.gpus.push_back(g);
  }
  return t;
}

void expectSame(const RankTopo& a, const RankTopo& b) {
  EXPECT_EQ(a.hostId, b.hostId);
  EXPECT_EQ(a.numaNode, b.numaNode);
  EXPECT_EQ(a.cudaDev, b.cudaDev);
  ASSERT_EQ(a.gpus.size(), b.gpus.size());
  ASSERT_EQ(a.ports.size(), b.ports.size());
  for (size_t i = 0; i < a.gpus.size(); i++) {
    EXPECT_EQ(a.gpus[i].busId, b.gpus[i].busId);
    EXPECT_EQ(a.gpus[i].dev, b.gpus[i].dev);
    EXPECT_EQ(a.gpus[i].sm, b.gpus[i].sm);
    EXPECT_EQ(a.gpus[i].numa, b.gpus[i].numa);
    EXPECT_EQ(a.gpus[i].nearestPort, b.gpus[i].nearestPort);
  }
  for (size_t i = 0; i < a.ports.size(); i++) {
    EXPECT_EQ(a.ports[i].name, b.ports[i].name);
    EXPECT_EQ(a.ports[i].busId, b.ports[i].busId);
    EXPECT_EQ(a.ports[i].dev, b.ports[i].dev);
    EXPECT_EQ(a.ports[i].port, b.ports[i].port);
    EXPECT_EQ(a.ports[i].numa, b.ports[i].numa);
    EXPECT_EQ(a.ports[i].speedGBs, b.ports[i].speedGBs);
    EXPECT_EQ(a.ports[i].guid, b.ports[i].guid);
    EXPECT_EQ(a.ports[i].gdr, b.ports[i].gdr);
  }
}

TEST(TopologySystem, SerializeRoundTrip) {
  for (int ports : {0, 1, 8}) {
    RankTopo t = fakeRank("host-a:boot-id", ports, 22.5, 3);
    auto r = RankTopo::deserialize(t.serialize());
    ASSERT_TRUE(r.isOk()) << r.status().message();
    expectSame(t, r.value());
  }
}

TEST(TopologySystem, LocalRankTopoOfOciH100) {
  if (!std::ifstream(topoPath("oci-hpc_H100-topology.xml")).good()) {
    GTEST_SKIP() << "missing " << topoPath("oci-hpc_H100-topology.xml");
  }
  auto g = importXmlFile(topoPath("oci-hpc_H100-topology.xml"));
  ASSERT_TRUE(g.isOk()) << g.status().message();
  RankTopo t = localRankTopo(g.value(), "oci");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.ports.size(), 16u);
  // GPU 0 (0000:0f:00.0) shares a switch with the ConnectX at 0000:0c:00.0 (mlx5_0, mlx5_1).
  EXPECT_EQ(t.gpus[0].busId, "0000:0f:00.0");
  EXPECT_EQ(t.gpus[0].sm, 90);
  EXPECT_EQ(t.gpus[0].numa, 0);
  ASSERT_GE(t.gpus[0].nearestPort, 0);
  EXPECT_EQ(t.ports[t.gpus[0].nearestPort].name, "mlx5_0");
  EXPECT_EQ(t.ports[t.gpus[0].nearestPort].busId, "0000:0c:00.0");
  EXPECT_EQ(t.gpus[7].numa, 1);
  EXPECT_EQ(t.ports[t.gpus[7].nearestPort].name, "mlx5_16");
  EXPECT_DOUBLE_EQ(t.ports[0].speedGBs, 22.5);
  auto r = RankTopo::deserialize(t.serialize());
  ASSERT_TRUE(r.isOk());
  expectSame(t, r.value());
}

TEST(TopologySystem, RankPathsWithNetBetweenHosts) {
  if (!std::ifstream(topoPath("oci-hpc_H100-topology.xml")).good()) {
    GTEST_SKIP() << "missing " << topoPath("oci-hpc_H100-topology.xml");
  }
  auto g = importXmlFile(topoPath("oci-hpc_H100-topology.xml"));
  ASSERT_TRUE(g.isOk()) << g.status().message();
  // Two OCI H100 hosts, two ranks each on GPUs 0 and 5 (NUMA 0 and 1).
  std::vector<RankTopo> ranks;
  for (const char* host : {"h1", "h2"}) {
    for (int dev : {0, 5}) {
      RankTopo t = localRankTopo(g.value(), host);
      t.cudaDev = dev;
      auto back = RankTopo::deserialize(t.serialize());  // what the exchange carries
      ASSERT_TRUE(back.isOk()) << back.status().message();
      ASSERT_EQ(back.value().gpuPathType.size(), 64u);
      ranks.push_back(std::move(back).value());
    }
  }
  auto sys = SystemTopo::build(ranks);
  ASSERT_TRUE(sys.isOk());
  const SystemTopo& s = sys.value();
  EXPECT_EQ(s.rankPath(0, 0).type, PathType::kLoc);
  // GPU 0 and GPU 5 of one host: NVLink through the NVSwitch, 18 links (370.8 GB/s in the file).
  Path local = s.rankPath(0, 1);
  EXPECT_EQ(local.type, PathType::kNvl);
  EXPECT_NEAR(local.bw, 370.8, 0.1);
  // Across hosts: the network, at the speed of each GPU's nearest port (the file lists every
  // port at speed="180000" Mb/s: 22.5 GB/s).
  Path remote = s.rankPath(0, 3);
  EXPECT_EQ(remote.type, PathType::kNet);
  EXPECT_NEAR(remote.bw, 22.5, 1e-6);
  EXPECT_EQ(remote.hops, 2);
  EXPECT_EQ(s.rankPath(3, 0).type, PathType::kNet);
  // Host-memory ranks: by NUMA node.
  std::vector<RankTopo> cpu = {fakeRank("a", 0), fakeRank("a", 0), fakeRank("b", 0)};
  cpu[1].numaNode = 1;
  auto cs = SystemTopo::build(cpu);
  ASSERT_TRUE(cs.isOk());
  EXPECT_EQ(cs.value().rankPath(0, 1).type, PathType::kSys);
  EXPECT_EQ(cs.value().rankPath(0, 2).type, PathType::kNet);
  EXPECT_EQ(cs.value().rankPath(0, 2).bw, 0.0f);  // no ports: bandwidth unknown
  EXPECT_EQ(cs.value().rankPath(0, 7).type, PathType::kDis);
}

TEST(TopologySystem, BuildsHostsLocalRanksAndRails) {
  // Ranks interleaved over three hosts: a b a c b a.
  std::vector<RankTopo> ranks = {fakeRank("a", 4, 25, 0), fakeRank("b", 4, 25, 0),
                                 fakeRank("a", 4, 25, 1), fakeRank("c", 4, 25, 0),
                                 fakeRank("b", 4, 25, 1), fakeRank("a", 4, 25, 2)};
  std::vector<std::string> blobs;
  for (const auto& r : ranks) blobs.push_back(r.serialize());
  std::vector<RankTopo> received;
  for (const auto& b : blobs) {
    auto r = RankTopo::deserialize(b);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    received.push_back(std::move(r).value());
  }
  auto s = SystemTopo::build(std::move(received));
  ASSERT_TRUE(s.isOk()) << s.status().message();
  const SystemTopo& sys = s.value();
  EXPECT_EQ(sys.nRanks(), 6);
  ASSERT_EQ(sys.hosts.size(), 3u);
  EXPECT_EQ(sys.hosts[0].id, "a");
  EXPECT_EQ(sys.hosts[0].ranks, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(sys.hosts[1].ranks, (std::vector<int>{1, 4}));
  EXPECT_EQ(sys.hosts[2].ranks, (std::vector<int>{3}));
  EXPECT_EQ(sys.hostOf, (std::vector<int>{0, 1, 0, 2, 1, 0}));
  EXPECT_EQ(sys.localRank, (std::vector<int>{0, 0, 1, 0, 1, 2}));
  EXPECT_EQ(sys.localSize(5), 3);
  EXPECT_EQ(sys.localSize(3), 1);
  EXPECT_TRUE(sys.sameHost(0, 5));
  EXPECT_FALSE(sys.sameHost(0, 1));
  EXPECT_EQ(sys.hostView(4).ports.size(), 4u);
  ASSERT_EQ(sys.rails.size(), 4u);
  for (int r = 0; r < 4; r++) EXPECT_EQ(sys.rails[r], (std::vector<int>{r, r, r}));
  EXPECT_TRUE(sys.railsUniform);
  EXPECT_TRUE(sys.warnings.empty());
}

TEST(TopologySystem, UnevenHostsAndInconsistencies) {
  std::vector<RankTopo> ranks = {fakeRank("a", 4, 25, 0), fakeRank("b", 2, 25, 0),
                                 fakeRank("a", 3, 25, 0)};
  auto s = SystemTopo::build(ranks);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  const SystemTopo& sys = s.value();
  ASSERT_EQ(sys.rails.size(), 4u);
  EXPECT_EQ(sys.rails[1], (std::vector<int>{1, 1}));
  EXPECT_EQ(sys.rails[2], (std::vector<int>{2, -1}));  // host b has two ports only
  EXPECT_FALSE(sys.railsUniform);
  // Rank 2 sees 3 ports where rank 0 of its host sees 4; both use CUDA device 0.
  ASSERT_EQ(sys.warnings.size(), 2u);
  EXPECT_NE(sys.warnings[0].find("rank 2 sees"), std::string::npos) << sys.warnings[0];
  EXPECT_NE(sys.warnings[1].find("ranks 0 and 2 both use CUDA device 0"), std::string::npos)
      << sys.warnings[1];
  // Different speeds on one rail: not uniform.
  auto t = SystemTopo::build({fakeRank("a", 2, 25), fakeRank("b", 2, 50)});
  ASSERT_TRUE(t.isOk());
  EXPECT_FALSE(t.value().railsUniform);
  EXPECT_EQ(SystemTopo::build({}).status().code(), Code::kInvalidArgument);
}

TEST(TopologySystem, MalformedBlobsAreErrors) {
  std::string blob = fakeRank("host", 3).serialize();
  // Every truncation and every extension.
  for (size_t n = 0; n < blob.size(); n++) {
    auto r = RankTopo::deserialize(std::string_view(blob).substr(0, n));
    ASSERT_FALSE(r.isOk()) << "truncated at " << n;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  }
  EXPECT_FALSE(RankTopo::deserialize(blob + "x").isOk());
  // Bad magic, a huge string length, a huge device count, a nearest port out of range.
  std::string bad = blob;
  bad[0] ^= 1;
  EXPECT_NE(RankTopo::deserialize(bad).status().message().find("bad magic"), std::string::npos);
  bad = blob;
  bad[4] = bad[5] = bad[6] = bad[7] = '\xff';
  EXPECT_FALSE(RankTopo::deserialize(bad).isOk());
  RankTopo t;
  t.hostId = "h";
  std::string counts = t.serialize();
  counts[counts.size() - 8] = '\xff';  // gpu count
  counts[counts.size() - 7] = '\xff';
  counts[counts.size() - 6] = '\xff';
  EXPECT_FALSE(RankTopo::deserialize(counts).isOk());
  RankTopo wrongPort = fakeRank("h", 1);
  wrongPort.gpus[0].nearestPort = 5;
  EXPECT_NE(RankTopo::deserialize(wrongPort.serialize()).status().message().find("nearest port"),
            std::string::npos);
  // Random bytes and random corruption: errors or values, never a crash.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; i++) {
    std::string s = blob;
    if (i % 2) {
      s.resize(rng() % 200);
      for (char& c : s) c = static_cast<char>(rng());
    } else {
      for (int k = 0; k < 4; k++) s[rng() % s.size()] = static_cast<char>(rng());
    }
    auto r = RankTopo::deserialize(s);
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace loom::topo
