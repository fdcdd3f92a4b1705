// Topology files of several hosts: NCCL writes one file for the hosts of a multi-node NVLink
// system (each <cpu> with its host's host_hash, PCI bus ids repeating from host to host, GPUs
// reaching the domain's NVSwitches through fffffff:ff:ff.0). They load as one graph of several
// hosts: paths inside each host as before, NVLink across hosts through the shared switch fabric,
// nothing else between hosts; export writes them back, unknown attributes included.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "topology/graph.h"
#include "topology/paths.h"
#include "topology/xml.h"

namespace loom::topo {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const std::string kNvlFile = std::string(LOOM_TESTS_DIR) + "/topology/multi_host_nvl.xml";

std::vector<int> gpusOf(const Graph& g) { return g.nodesOfType(NodeType::kGpu); }

TEST(MultiHostTopology, OneNvlinkDomainAcrossTwoTrays) {
  Result<Graph> r = importXmlFile(kNvlFile);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  ASSERT_EQ(g.hostCount(), 2);
  EXPECT_EQ(g.hosts()[0], "0x5f3a1c2b9e8d7f60");
  std::vector<int> gpus = gpusOf(g);
  ASSERT_EQ(gpus.size(), 8u);
  // The same bus id on both hosts, each found on its own host.
  int a = g.findByBusId("0008:01:00.0", 0), b = g.findByBusId("0008:01:00.0", 1);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(g.node(a).host, 0);
  EXPECT_EQ(g.node(b).host, 1);
  // One NVSwitch fabric shared by the trays: GPUs of different hosts are NVLink peers.
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 1);
  Paths p = Paths::compute(g);
  EXPECT_EQ(p.get(a, b).type, PathType::kNvl);
  EXPECT_NEAR(p.get(a, b).bw, 18 * 40.1, 1e-3);  // a float
  // Nothing else connects the hosts: a GPU reaches the other host's NIC only through the other
  // GPU (PXN-like paths are not modelled), and the CPUs of different hosts are not linked.
  int nicOther = g.findByBusId("0008:03:00.0", 1);
  ASSERT_GE(nicOther, 0);
  EXPECT_EQ(p.get(a, nicOther).type, PathType::kDis);
  std::vector<int> cpus = g.nodesOfType(NodeType::kCpu);
  ASSERT_EQ(cpus.size(), 4u);
  EXPECT_NE(g.findLink(cpus[0], cpus[1], LinkType::kSys), nullptr);  // one host's two sockets
  EXPECT_EQ(g.findLink(cpus[0], cpus[2], LinkType::kSys), nullptr);  // two hosts
  // The GPU's own NIC and its Grace CPU.
  EXPECT_EQ(p.get(a, g.findByBusId("0008:03:00.0", 0)).type, PathType::kPix);
  EXPECT_EQ(p.get(b, g.cpuOf(b)).type, PathType::kC2c);
}

TEST(MultiHostTopology, ExportKeepsHostsAndUnknownAttributes) {
  Result<Graph> r = importXmlFile(kNvlFile);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string xml = exportXmlString(r.value());
  EXPECT_NE(xml.find("host_hash=\"0x1b2c3d4e5f607182\""), std::string::npos);
  EXPECT_NE(xml.find("gin=\"1\""), std::string::npos);
  EXPECT_NE(xml.find("target=\"fffffff:ff:ff.0\""), std::string::npos);
  Result<Graph> back = importXmlString(xml, "exported.xml");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(diffGraphs(r.value(), back.value()), "");
}

// Two DGX-style hosts in one file, each with its own NVSwitches (real bus ids in the targets):
// no NVLink between them.
TEST(MultiHostTopology, SeparateHostsKeepTheirOwnSwitches) {
  const std::string oci = std::string(LOOM_SHARED_DIR) + "/topologies/oci-hpc_H100-topology.xml";
  std::string text = readFile(oci);
  if (text.empty()) GTEST_SKIP() << "missing " << oci << " (the shared topology fixtures)";
  size_t open = text.find("<cpu "), close = text.rfind("</system>");
  ASSERT_NE(open, std::string::npos);
  ASSERT_NE(close, std::string::npos);
  std::string cpus = text.substr(open, close - open);
  auto withHash = [&](const std::string& hash) {
    std::string s = cpus;
    for (size_t at = s.find("<cpu "); at != std::string::npos; at = s.find("<cpu ", at + 1))
      s.insert(at + 5, "host_hash=\"" + hash + "\" ");
    return s;
  };
  std::string two = text.substr(0, open) + withHash("0xaaa") + withHash("0xbbb") + "</system>\n";
  Result<Graph> r = importXmlString(two, "two_h100.xml");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  EXPECT_EQ(g.hostCount(), 2);
  std::vector<int> gpus = gpusOf(g);
  ASSERT_EQ(gpus.size(), 16u);
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 2);  // one per host
  Paths p = Paths::compute(g);
  int a = g.findByBusId("0000:0f:00.0", 0), b = g.findByBusId("0000:0f:00.0", 1);
  int a2 = g.findByBusId("0000:2d:00.0", 0);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(a2, 0);
  EXPECT_EQ(p.get(a, a2).type, PathType::kNvl);  // inside host 0
  EXPECT_EQ(p.get(a, b).type, PathType::kDis);   // between the hosts
  // Without host hashes the same text is a file of one host with every bus id twice.
  std::string dup = text.substr(0, open) + cpus + cpus + "</system>\n";
  Result<Graph> d = importXmlString(dup, "dup.xml");
  ASSERT_FALSE(d.isOk());
  EXPECT_NE(d.status().message().find("duplicate busid"), std::string::npos);
  // A bus id twice on one host of a multi-host file is still an error, and says so.
  std::string twice = text.substr(0, open) + withHash("0xaaa") + withHash("0xaaa") + "</system>\n";
  Result<Graph> t = importXmlString(twice, "twice.xml");
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("duplicate busid"), std::string::npos);
}

}  // namespace
}  // namespace loom::topo
