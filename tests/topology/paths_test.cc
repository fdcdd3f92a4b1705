#include "topology/paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "topology/xml.h"

namespace loom::topo {
namespace {

std::string topoPath(const std::string& file) {
  return std::string(LOOM_SHARED_DIR) + "/topologies/" + file;
}

#define LOAD_OR_SKIP(graph, file)                                                      \
  if (!std::ifstream(topoPath(file)).good()) {                                         \
    GTEST_SKIP() << "missing " << topoPath(file) << " (the shared topology fixtures)"; \
  }                                                                                    \
  auto graph##Result = importXmlFile(topoPath(file));                                  \
  ASSERT_TRUE(graph##Result.isOk()) << graph##Result.status().message();               \
  const Graph& graph = graph##Result.value()

// GPU node with this NVML index.
int gpuDev(const Graph& g, int dev) {
  for (int i : g.nodesOfType(NodeType::kGpu)) {
    if (g.node(i).dev == dev) return i;
  }
  return -1;
}

int netNamed(const Graph& g, const std::string& name) {
  for (int i : g.nodesOfType(NodeType::kNet)) {
    if (g.node(i).name == name) return i;
  }
  return -1;
}

TEST(TopologyPaths, OciH100) {
  LOAD_OR_SKIP(g, "oci-hpc_H100-topology.xml");
  Paths p = Paths::compute(g);
  // Each GPU and its NIC share a two-level Broadcom switch: GPU - sw - top sw - sw - NIC = PXB.
  const std::map<int, std::string> nic = {
      {0, "0000:0c:00.0"}, {1, "0000:2a:00.0"}, {2, "0000:41:00.0"}, {3, "0000:58:00.0"},
      {4, "0000:86:00.0"}, {5, "0000:a5:00.0"}, {6, "0000:bd:00.0"}, {7, "0000:d5:00.0"}};
  for (const auto& [dev, bus] : nic) {
    int gpu = gpuDev(g, dev);
    ASSERT_GE(gpu, 0);
    int n = p.nearestNic(gpu);
    ASSERT_GE(n, 0);
    EXPECT_EQ(g.node(n).busId, bus) << "GPU " << dev;
    EXPECT_EQ(p.get(gpu, n).type, PathType::kPxb) << "GPU " << dev;
    EXPECT_FLOAT_EQ(p.get(gpu, n).bw, 48);  // Gen5 x16 all the way (not the Gen2 uplink)
    int net = p.nearestNet(gpu);
    EXPECT_EQ(g.node(net).parent, n);
    EXPECT_EQ(g.node(net).port, 1);             // the first of two equal ports
    EXPECT_FLOAT_EQ(p.get(gpu, net).bw, 22.5);  // 180 Gb/s port
    for (int other : g.node(n).children) EXPECT_TRUE(p.gdrAllowed(gpu, other));
  }
  int gpu0 = gpuDev(g, 0);
  EXPECT_EQ(p.get(gpu0, netNamed(g, "mlx5_3")).type, PathType::kPhb);  // same socket
  EXPECT_FALSE(p.gdrAllowed(gpu0, netNamed(g, "mlx5_3")));
  EXPECT_EQ(p.get(gpu0, netNamed(g, "mlx5_9")).type, PathType::kSys);  // other socket
  EXPECT_FALSE(p.gdrAllowed(gpu0, netNamed(g, "mlx5_9")));
  // All GPU pairs: NVLink through the NVSwitches, 18 links x 20.6 GB/s.
  for (int a : g.nodesOfType(NodeType::kGpu)) {
    for (int b : g.nodesOfType(NodeType::kGpu)) {
      if (a == b) {
        EXPECT_EQ(p.get(a, b).type, PathType::kLoc);
        continue;
      }
      EXPECT_EQ(p.get(a, b).type, PathType::kNvl) << g.describe(a) << " " << g.describe(b);
      EXPECT_NEAR(p.get(a, b).bw, 18 * 20.6, 1e-3);
      EXPECT_EQ(p.get(a, b).hops, 2);
      EXPECT_TRUE(p.p2pAllowed(a, b));
    }
  }
}

TEST(TopologyPaths, AwsP5) {
  LOAD_OR_SKIP(g, "aws-ofi-nccl_p5.48xl-topo.xml");
  Paths p = Paths::compute(g);
  // GPU k sits on a switch with four EFA NICs; the first of them is nearest (ties: file order).
  const std::map<int, std::string> nic = {
      {0, "0000:50:00.0"}, {1, "0000:61:00.0"}, {2, "0000:71:00.0"}, {3, "0000:81:00.0"},
      {4, "0000:91:00.0"}, {5, "0000:a1:00.0"}, {6, "0000:b1:00.0"}, {7, "0000:c1:00.0"}};
  for (const auto& [dev, bus] : nic) {
    int gpu = gpuDev(g, dev);
    int n = p.nearestNic(gpu);
    ASSERT_GE(n, 0);
    EXPECT_EQ(g.node(n).busId, bus) << "GPU " << dev;
    EXPECT_EQ(p.get(gpu, n).type, PathType::kPix);
    EXPECT_FLOAT_EQ(p.get(gpu, n).bw, 12);  // the NIC's Gen4 x8 link
    // GPUDirect RDMA with the four NICs of its switch only.
    int gdr = 0;
    for (int net : g.nodesOfType(NodeType::kNet)) gdr += p.gdrAllowed(gpu, net);
    EXPECT_EQ(gdr, 4) << "GPU " << dev;
  }
  // No NVLink in this file: GPUs meet at the CPU (PHB), so no peer-to-peer (8 GPUs on AMD).
  int a = gpuDev(g, 0), b = gpuDev(g, 1);
  EXPECT_EQ(p.get(a, b).type, PathType::kPhb);
  EXPECT_FALSE(p.p2pAllowed(a, b));
}

TEST(TopologyPaths, AwsP4d) {
  LOAD_OR_SKIP(g, "aws-ofi-nccl_p4d-24xl-topo.xml");
  Paths p = Paths::compute(g);
  // Two GPUs and one NIC per virtual switch.
  const std::map<std::string, std::string> nic = {
      {"0000:10:1c.0", "0000:10:1b.0"}, {"0000:10:1d.0", "0000:10:1b.0"},
      {"0000:20:1c.0", "0000:20:1b.0"}, {"0000:20:1d.0", "0000:20:1b.0"},
      {"0000:90:1c.0", "0000:90:1b.0"}, {"0000:90:1d.0", "0000:90:1b.0"},
      {"0000:a0:1c.0", "0000:a0:1b.0"}, {"0000:a0:1d.0", "0000:a0:1b.0"}};
  for (const auto& [gbus, nbus] : nic) {
    int gpu = g.findByBusId(gbus);
    int n = p.nearestNic(gpu);
    ASSERT_GE(n, 0);
    EXPECT_EQ(g.node(n).busId, nbus);
    EXPECT_EQ(p.get(gpu, n).type, PathType::kPix);
    EXPECT_FLOAT_EQ(p.get(gpu, n).bw, 12);
    EXPECT_EQ(p.nearestNet(gpu), -1);  // no <net> in this file
  }
  int a = g.findByBusId("0000:10:1c.0");
  EXPECT_EQ(p.get(a, g.findByBusId("0000:10:1d.0")).type, PathType::kPix);
  EXPECT_TRUE(p.p2pAllowed(a, g.findByBusId("0000:10:1d.0")));
  EXPECT_EQ(p.get(a, g.findByBusId("0000:20:1c.0")).type, PathType::kPhb);
  EXPECT_FALSE(p.p2pAllowed(a, g.findByBusId("0000:20:1c.0")));
  EXPECT_EQ(p.get(a, g.findByBusId("0000:90:1c.0")).type, PathType::kSys);
  EXPECT_FLOAT_EQ(p.get(a, g.findByBusId("0000:90:1c.0")).bw, 10);  // Skylake UPI
}

TEST(TopologyPaths, AzureNcv4) {
  LOAD_OR_SKIP(g, "azhpc-images_ncv4-topo.xml");
  Paths p = Paths::compute(g);
  int eth0 = netNamed(g, "eth0");
  int nic = g.node(eth0).parent;
  for (int dev = 0; dev < 4; dev++) {
    int gpu = gpuDev(g, dev);
    EXPECT_EQ(p.nearestNic(gpu), nic);
    EXPECT_EQ(p.nearestNet(gpu), eth0);
    // eth0 hangs off NUMA 0's CPU: PHB from GPU 0, across sockets from the others.
    EXPECT_EQ(p.get(gpu, nic).type, dev == 0 ? PathType::kPhb : PathType::kSys) << dev;
    EXPECT_FLOAT_EQ(p.get(gpu, eth0).bw, 12);
    EXPECT_FALSE(p.gdrAllowed(gpu, eth0));  // gdr="0" on the port
  }
  // The self-targeted NVLinks give no NVLink path; 4 GPUs on AMD: no P2P across sockets.
  EXPECT_EQ(p.get(gpuDev(g, 0), gpuDev(g, 1)).type, PathType::kSys);
  EXPECT_FALSE(p.p2pAllowed(gpuDev(g, 0), gpuDev(g, 1)));
}

Graph fromXml(const std::string& xml) {
  auto r = importXmlString(xml);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? std::move(r).value() : Graph();
}

TEST(TopologyPaths, NvlinkThroughGpuIsNvb) {
  // Three GPUs in a chain over direct NVLink: 0-1, 1-2.
  std::string xml = "<system version=\"1\"><cpu numaid=\"0\" vendor=\"GenuineIntel\">";
  const char* bus[] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0"};
  for (int i = 0; i < 3; i++) {
    xml += fmt::format(
        "<pci busid=\"{}\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
        "link_width=\"16\"><gpu dev=\"{}\" sm=\"80\" rank=\"{}\" gdr=\"1\">",
        bus[i], i, i);
    if (i > 0)
      xml += fmt::format("<nvlink target=\"{}\" count=\"4\" tclass=\"0x030200\"/>", bus[i - 1]);
    if (i < 2)
      xml += fmt::format("<nvlink target=\"{}\" count=\"2\" tclass=\"0x030200\"/>", bus[i + 1]);
    xml += "</gpu></pci>";
  }
  xml += "</cpu></system>";
  Graph g = fromXml(xml);
  Paths p = Paths::compute(g);
  int g0 = g.findByBusId(bus[0]), g1 = g.findByBusId(bus[1]), g2 = g.findByBusId(bus[2]);
  EXPECT_EQ(p.get(g0, g1).type, PathType::kNvl);
  EXPECT_FLOAT_EQ(p.get(g0, g1).bw, 40);  // GPU 0 lists 2 links to GPU 1
  EXPECT_EQ(p.get(g0, g2).type, PathType::kNvb);
  EXPECT_FLOAT_EQ(p.get(g0, g2).bw, 40);
  EXPECT_EQ(p.get(g0, g2).hops, 2);
  EXPECT_TRUE(p.p2pAllowed(g0, g2));
}

TEST(TopologyPaths, ManyDevicesBeyondNcclLimit) {
  std::string xml = "<system version=\"1\"><cpu numaid=\"0\">";
  int bus = 0;
  const int kSwitches = 40, kPer = 8;  // 320 GPUs, 320 NICs: beyond NCCL's 256 nodes of a kind
  for (int s = 0; s < kSwitches; s++) {
    xml += fmt::format("<pci busid=\"{:04x}:00:00.0\" class=\"0x060400\">", bus++);
    for (int k = 0; k < kPer; k++) {
      xml += fmt::format(
          "<pci busid=\"{:04x}:00:00.0\" class=\"0x030200\"><gpu dev=\"{}\" "
          "sm=\"90\" rank=\"0\" gdr=\"1\"/></pci>",
          bus++, s * kPer + k);
      xml += fmt::format(
          "<pci busid=\"{:04x}:00:00.0\" class=\"0x020000\"><nic><net name=\"n{}\" "
          "dev=\"{}\" speed=\"400000\" gdr=\"1\"/></nic></pci>",
          bus++, s * kPer + k, s * kPer + k);
    }
    xml += "</pci>";
  }
  xml += "</cpu></system>";
  Graph g = fromXml(xml);
  ASSERT_EQ(g.count(NodeType::kGpu), kSwitches * kPer);
  Paths p = Paths::compute(g);
  for (int gpu : g.nodesOfType(NodeType::kGpu)) {
    int n = p.nearestNic(gpu);
    ASSERT_GE(n, 0);
    EXPECT_EQ(g.node(n).parent, g.node(gpu).parent);  // same switch
    EXPECT_EQ(p.get(gpu, n).type, PathType::kPix);
  }
  int last = g.nodesOfType(NodeType::kGpu).back();
  EXPECT_EQ(p.get(gpuDev(g, 0), last).type, PathType::kPhb);
}

TEST(TopologyPaths, Names) {
  EXPECT_STREQ(pathTypeName(PathType::kLoc), "LOC");
  EXPECT_STREQ(pathTypeName(PathType::kPxb), "PXB");
  EXPECT_STREQ(pathTypeName(PathType::kDis), "DIS");
}

}  // namespace
}  // namespace loom::topo
