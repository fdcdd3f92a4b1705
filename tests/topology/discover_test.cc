// Discovery on this machine, discovery from a fake sysfs tree (IB ports, RoCE, virtio, virtual
// interfaces, PCIe link speed), IB ports from verbs over sysfs, LOOM_TOPO_FILE / NCCL_TOPO_FILE /
// LOOM_TOPO_DUMP_FILE, and the helpers discovery shares.
#include "topology/discover.h"

#include <ftw.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>  // enum values only; libibverbs is never linked
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "src/core/params.h"
#include "topology/discover_internal.h"
#include "topology/xml.h"

namespace loom::topo {
namespace {

std::string topoPath(const std::string& file) {
  return std::string(LOOM_SHARED_DIR) + "/topologies/" + file;
}

int netNamed(const Graph& g, const std::string& name) {
  for (int i : g.nodesOfType(NodeType::kNet)) {
    if (g.node(i).name == name) return i;
  }
  return -1;
}

// ---- this machine ----

TEST(TopologyDiscover, FindsThisMachine) {
  if (access("/sys/bus/pci/devices", R_OK) != 0 || access("/sys/class/net", R_OK) != 0) {
    GTEST_SKIP() << "/sys/bus/pci/devices or /sys/class/net is not readable here";
  }
  HostInfo info;
  auto r = discoverLocal(&info);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  EXPECT_GE(g.count(NodeType::kCpu), 1);
  EXPECT_GE(info.numaNodes, 1);
  EXPECT_GE(info.cores, 1);
  EXPECT_GE(info.pus, info.cores);
  EXPECT_FALSE(info.sources.empty());
  // Every CPU has an affinity mask naming at least one CPU, and arch/vendor as NCCL writes them.
  for (int c : g.nodesOfType(NodeType::kCpu)) {
    const std::string* aff = findAttr(g.node(c).attrs, "affinity");
    ASSERT_NE(aff, nullptr);
    auto cpus = parseCpumask(*aff);
    ASSERT_TRUE(cpus.isOk()) << cpus.status().message();
    EXPECT_FALSE(cpus.value().empty());
  }
  // The PCI devices sysfs lists are in the graph, except bridges (folded as NCCL does) and
  // non-NVIDIA/AMD display devices (left out, with a note).
  int pciDevs = 0, pciNodes = 0;
  for (const std::string& d : detail::listDir("/sys/bus/pci/devices")) {
    auto cls = detail::readInt("/sys/bus/pci/devices/" + d + "/class", 16);
    if (cls && (*cls >> 8) == 0x0604) continue;
    pciDevs++;
    if (g.findByBusId(d) >= 0) pciNodes++;
  }
  EXPECT_EQ(pciNodes + static_cast<int>(std::count_if(
                           info.skipped.begin(), info.skipped.end(),
                           [](const std::string& s) { return s.rfind("display device", 0) == 0; })),
            pciDevs);
  // Every interface with a device (eth0 on this VM) is a port of a NIC.
  int physical = 0;
  for (const std::string& ifname : detail::listDir("/sys/class/net")) {
    if (ifname == "lo" || detail::realPath("/sys/class/net/" + ifname + "/device").empty()) {
      continue;
    }
    physical++;
    int net = netNamed(g, ifname);
    if (net < 0) {
      // Only a RoCE interface may be missing: its IB device carries it.
      bool carried = false;
      for (const auto& s : info.skipped) carried |= s.rfind(ifname + ": carried by", 0) == 0;
      EXPECT_TRUE(carried) << ifname;
      continue;
    }
    EXPECT_EQ(g.node(g.node(net).parent).type, NodeType::kNic) << ifname;
    EXPECT_GT(g.node(net).speedGBs, 0) << ifname;
    std::string bus = pciBusIdOfSysfsPath(detail::realPath("/sys/class/net/" + ifname + "/device"));
    if (!bus.empty()) {
      EXPECT_EQ(g.node(g.node(net).parent).busId, bus) << ifname;
    }
  }
  if (physical == 0) {
    std::cout << "note: no network interface with a device here; only CPUs and PCI checked\n";
  }
}

TEST(TopologyDiscover, DumpOfThisMachineRoundTrips) {
  auto r = discoverLocal();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string xml = exportXmlString(r.value());
  EXPECT_EQ(xml.rfind("<system version=\"1\">\n  <cpu numaid=", 0), 0u) << xml.substr(0, 100);
  auto b = importXmlString(xml, "dump");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(diffGraphs(r.value(), b.value()), "");
  EXPECT_EQ(exportXmlString(b.value()), xml);
}

// ---- a fake sysfs ----

void removeTree(const std::string& path) {
  nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        (void)std::remove(p);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

class FakeSys {
 public:
  FakeSys() {
    root_ = ::testing::TempDir() + "/loom_fake_sys_" + std::to_string(getpid());
    removeTree(root_);
  }
  ~FakeSys() { removeTree(root_); }
  const std::string& root() const { return root_; }
  void file(const std::string& rel, const std::string& text) {
    mkdirs(rel.substr(0, rel.rfind('/')));
    std::ofstream(root_ + "/" + rel) << text << "\n";
  }
  void dir(const std::string& rel) { mkdirs(rel); }
  // A symlink at rel pointing at root/target.
  void link(const std::string& rel, const std::string& target) {
    mkdirs(rel.substr(0, rel.rfind('/')));
    mkdirs(target);
    ASSERT_EQ(symlink((root_ + "/" + target).c_str(), (root_ + "/" + rel).c_str()), 0) << rel;
  }

 private:
  void mkdirs(const std::string& rel) {
    std::string p = root_;
    mkdir(p.c_str(), 0755);
    size_t start = 0;
    while (start < rel.size()) {
      size_t slash = rel.find('/', start);
      p += "/" + rel.substr(start, slash == std::string::npos ? slash : slash - start);
      mkdir(p.c_str(), 0755);
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
  }
  std::string root_;
};

TEST(TopologyDiscover, NetworksFromFakeSysfs) {
  FakeSys s;
  const std::string hca = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  const std::string virtio = "devices/pci0000:00/0000:00:03.0";
  // A ConnectX behind a Gen3 x8 root port: NCCL writes the lower of device and port maxima.
  s.file("devices/pci0000:00/0000:00:01.0/max_link_speed", "8.0 GT/s PCIe");
  s.file("devices/pci0000:00/0000:00:01.0/max_link_width", "8");
  s.file(hca + "/class", "0x020000");
  s.file(hca + "/vendor", "0x15b3");
  s.file(hca + "/device", "0x101b");
  s.file(hca + "/max_link_speed", "16.0 GT/s PCIe");
  s.file(hca + "/max_link_width", "16");
  s.link("bus/pci/devices/0000:01:00.0", hca);
  // mlx5_0: port 1 active (RoCE, its netdev ens1f0), port 2 down.
  s.link("class/infiniband/mlx5_0/device", hca);
  s.file("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
  s.file("class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet");
  s.file("class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)");
  s.file("class/infiniband/mlx5_0/ports/2/state", "1: DOWN");
  s.dir(hca + "/net/ens1f0");
  s.link("class/net/ens1f0/device", hca);
  // A virtio NIC: no link speed, interface speed -1, the device link points below the PCI device.
  s.file(virtio + "/class", "0x020000");
  s.file(virtio + "/vendor", "0x1af4");
  s.link("bus/pci/devices/0000:00:03.0", virtio);
  s.link("class/net/eth0/device", virtio + "/virtio2");
  s.file("class/net/eth0/speed", "-1");
  // A 25 Gb/s interface on a device that is not a PCI function (like Azure's hv_netvsc).
  s.link("class/net/eth1/device", "devices/vmbus/abcd");
  s.file("class/net/eth1/speed", "25000");
  // Virtual interfaces.
  s.dir("class/net/veth0");
  s.dir("class/net/lo");

  detail::Builder b;
  HostInfo info;
  b.info = &info;
  b.sysRoot = s.root();
  Node cpu;
  cpu.type = NodeType::kCpu;
  cpu.elemTag = "cpu";
  cpu.numaId = 0;
  cpu.attrs = {{"numaid", "0"}, {"affinity", "00000003"}};
  b.cpus.push_back(b.raw.addNode(std::move(cpu)));
  ASSERT_GE(detail::addPciNode(b, "0000:01:00.0", b.cpus[0], {}), 0);
  ASSERT_GE(detail::addPciNode(b, "0000:00:03.0", b.cpus[0], {}), 0);
  detail::addNetworks(
      b, std::vector<detail::IbDevice>{{"mlx5_0", 0x9a70500003ae6d94ull, std::nullopt}});
  auto r = importXmlString(exportXmlString(b.raw), "fake");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();

  int hcaNode = g.findByBusId("0000:01:00.0");
  ASSERT_GE(hcaNode, 0);
  EXPECT_EQ(*findAttr(g.node(hcaNode).pciAttrs, "link_speed"), "8.0 GT/s PCIe");
  EXPECT_EQ(*findAttr(g.node(hcaNode).pciAttrs, "link_width"), "8");
  EXPECT_EQ(*findAttr(g.node(hcaNode).pciAttrs, "vendor"), "0x15b3");
  EXPECT_DOUBLE_EQ(g.node(hcaNode).pciBw, 6);

  ASSERT_EQ(g.count(NodeType::kNet), 3);  // mlx5_0 port 1, eth0, eth1
  int mlx = netNamed(g, "mlx5_0");
  ASSERT_GE(mlx, 0);
  EXPECT_EQ(g.node(mlx).parent, hcaNode);
  EXPECT_EQ(g.node(mlx).dev, 0);  // IB first
  EXPECT_EQ(g.node(mlx).port, 1);
  EXPECT_DOUBLE_EQ(g.node(mlx).speedGBs, 25);  // 200 Gb/s
  EXPECT_EQ(g.node(mlx).guid, 0x9a70500003ae6d94ull);
  EXPECT_EQ(*findAttr(g.node(mlx).attrs, "link_layer"), "Ethernet");
  EXPECT_EQ(netNamed(g, "ens1f0"), -1);  // carried by mlx5_0

  int eth0 = netNamed(g, "eth0");
  ASSERT_GE(eth0, 0);
  EXPECT_EQ(g.node(g.node(eth0).parent).busId, "0000:00:03.0");
  EXPECT_DOUBLE_EQ(g.node(eth0).speedGBs, 1.25);  // NCCL's 10 Gb/s default
  EXPECT_EQ(*findAttr(g.node(g.node(eth0).parent).pciAttrs, "link_speed"), "");
  EXPECT_EQ(*findAttr(g.node(g.node(eth0).parent).pciAttrs, "link_width"), "0");

  int eth1 = netNamed(g, "eth1");
  ASSERT_GE(eth1, 0);
  EXPECT_TRUE(g.node(g.node(eth1).parent).isCpuNic());
  EXPECT_DOUBLE_EQ(g.node(eth1).speedGBs, 25000 / 8000.0);
  EXPECT_NE(g.node(eth0).guid, g.node(eth1).guid);  // distinct adapters

  auto noted = [&](const std::string& prefix) {
    for (const auto& n : info.skipped) {
      if (n.rfind(prefix, 0) == 0) return true;
    }
    return false;
  };
  EXPECT_TRUE(noted("mlx5_0 port 2: state \"1: DOWN\""));
  EXPECT_TRUE(noted("ens1f0: carried by mlx5_0"));
  EXPECT_TRUE(noted("eth0: speed not reported"));
  EXPECT_TRUE(noted("veth0: virtual interface"));
  EXPECT_FALSE(noted("lo"));
}

TEST(TopologyDiscover, IbPortsFromVerbsWinOverSysfs) {
  FakeSys s;
  const std::string hca = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  s.file(hca + "/class", "0x020700");  // InfiniBand controller
  s.file(hca + "/vendor", "0x15b3");
  s.link("bus/pci/devices/0000:01:00.0", hca);
  // mlx5_0: sysfs says otherwise than verbs, which wins; port 3's rate comes from sysfs (XDR is
  // only in active_speed_ex, newer than the verbs headers).
  s.link("class/infiniband/mlx5_0/device", hca);
  s.file("class/infiniband/mlx5_0/ports/1/state", "1: DOWN");
  s.file("class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet");
  s.file("class/infiniband/mlx5_0/ports/1/rate", "10 Gb/sec (4X SDR)");
  s.file("class/infiniband/mlx5_0/ports/3/rate", "800 Gb/sec (4X XDR)");
  // mlx5_1: verbs failed for it: sysfs, where ACTIVE_DEFER is not active (as in verbs).
  s.link("class/infiniband/mlx5_1/device", hca);
  s.file("class/infiniband/mlx5_1/ports/1/state", "5: ACTIVE_DEFER");
  s.file("class/infiniband/mlx5_1/ports/1/link_layer", "InfiniBand");
  s.file("class/infiniband/mlx5_1/ports/1/rate", "400 Gb/sec (4X NDR)");
  s.dir("class/net");

  detail::Builder b;
  HostInfo info;
  b.info = &info;
  b.sysRoot = s.root();
  Node cpu;
  cpu.type = NodeType::kCpu;
  cpu.elemTag = "cpu";
  cpu.numaId = 0;
  cpu.attrs = {{"numaid", "0"}, {"affinity", "00000003"}};
  b.cpus.push_back(b.raw.addNode(std::move(cpu)));
  ASSERT_GE(detail::addPciNode(b, "0000:01:00.0", b.cpus[0], {}), 0);
  detail::IbDevice verbs{"mlx5_0", 0x1122334455667788ull, std::vector<detail::IbPort>{}};
  verbs.ports->push_back({1, detail::ibPortStateString(IBV_PORT_ACTIVE), true,
                          detail::ibLinkLayerString(IBV_LINK_LAYER_INFINIBAND),
                          detail::ibRateMbps(128, 2)});  // 4X NDR
  verbs.ports->push_back({2, detail::ibPortStateString(IBV_PORT_DOWN), false, "InfiniBand", 0});
  verbs.ports->push_back({3, detail::ibPortStateString(IBV_PORT_ACTIVE), true, "InfiniBand", 0});
  detail::addNetworks(b, std::vector<detail::IbDevice>{verbs, {"mlx5_1", 0x99ull, std::nullopt}});
  auto r = importXmlString(exportXmlString(b.raw), "fake");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();

  ASSERT_EQ(g.count(NodeType::kNet), 2);  // mlx5_0 ports 1 and 3
  std::vector<int> nets = g.nodesOfType(NodeType::kNet);
  const Node& p1 = g.node(nets[0]);
  const Node& p3 = g.node(nets[1]);
  EXPECT_EQ(p1.name, "mlx5_0");
  EXPECT_EQ(p1.port, 1);
  EXPECT_DOUBLE_EQ(p1.speedGBs, 50);  // 400 Gb/s
  EXPECT_EQ(*findAttr(p1.attrs, "link_layer"), "InfiniBand");
  EXPECT_EQ(p1.guid, 0x1122334455667788ull);
  EXPECT_EQ(p1.parent, g.findByBusId("0000:01:00.0"));
  EXPECT_EQ(p3.port, 3);
  EXPECT_DOUBLE_EQ(p3.speedGBs, 100);  // 800 Gb/s, sysfs
  EXPECT_EQ(p3.parent, p1.parent);

  auto noted = [&](const std::vector<std::string>& lines, const std::string& prefix) {
    for (const auto& n : lines) {
      if (n.rfind(prefix, 0) == 0) return true;
    }
    return false;
  };
  EXPECT_TRUE(noted(info.skipped, "mlx5_0 port 2: state \"1: DOWN\", not active"));
  EXPECT_TRUE(noted(info.skipped, "mlx5_0 port 3: rate unknown to verbs: 800000 Mb/s from sysfs"));
  EXPECT_TRUE(noted(info.skipped, "mlx5_1 port 1: state \"5: ACTIVE_DEFER\", not active"));
  EXPECT_TRUE(noted(info.sources,
                    "network: 2 port(s): 2 InfiniBand/RoCE (attributes of 1 "
                    "device(s) from verbs, 1 from sysfs), 0 interface(s)"));
}

TEST(TopologyDiscover, VerbsOnThisMachine) {
  // Without IB hardware (or without libibverbs) this only checks that the verbs path reports
  // itself; with devices, every device's ports come from verbs or name why not.
  detail::Builder b;
  HostInfo info;
  b.info = &info;
  auto devs = detail::listVerbsDevices(b);
  ASSERT_FALSE(info.sources.empty());
  EXPECT_EQ(info.sources.back().rfind("verbs: ", 0), 0u) << info.sources.back();
  if (!devs) return;
  for (const detail::IbDevice& d : *devs) {
    if (!d.ports) continue;
    for (const detail::IbPort& p : *d.ports) {
      EXPECT_GE(p.port, 1) << d.name;
      EXPECT_FALSE(p.state.empty()) << d.name;
      EXPECT_GE(p.mbps, 0) << d.name;
    }
  }
}

TEST(TopologyDiscover, FallbackPciTreeFromFakeSysfs) {
  // root port 00:01.0 > switch upstream 01:00.0 > downstream 02:00.0 > GPU 03:00.0; a BMC VGA.
  FakeSys s;
  std::string rp = "devices/pci0000:00/0000:00:01.0";
  std::string up = rp + "/0000:01:00.0";
  std::string down = up + "/0000:02:00.0";
  std::string gpu = down + "/0000:03:00.0";
  std::string vga = "devices/pci0000:00/0000:00:1f.0";
  for (const auto& [path, cls] : {std::pair<std::string, std::string>{rp, "0x060400"},
                                  {up, "0x060400"},
                                  {down, "0x060400"},
                                  {gpu, "0x030200"},
                                  {vga, "0x030000"}}) {
    s.file(path + "/class", cls);
    s.link("bus/pci/devices/" + path.substr(path.rfind('/') + 1), path);
  }
  s.file(gpu + "/vendor", "0x10de");
  s.file(vga + "/vendor", "0x1a03");
  detail::Builder b;
  HostInfo info;
  b.info = &info;
  b.sysRoot = s.root();
  detail::addFallbackCpuAndPci(b);
  auto r = importXmlString(exportXmlString(b.raw), "fake");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  ASSERT_EQ(g.count(NodeType::kCpu), 1);
  EXPECT_EQ(g.findByBusId("0000:00:01.0"), -1);  // root port folded
  EXPECT_EQ(g.findByBusId("0000:02:00.0"), -1);  // downstream port folded
  int sw = g.findByBusId("0000:01:00.0");
  int gp = g.findByBusId("0000:03:00.0");
  ASSERT_GE(sw, 0);
  ASSERT_GE(gp, 0);
  EXPECT_EQ(g.node(sw).parent, 0);
  EXPECT_EQ(g.node(gp).parent, sw);
  EXPECT_EQ(g.node(gp).type, NodeType::kGpu);
  EXPECT_EQ(g.findByBusId("0000:00:1f.0"), -1);  // ASPEED-like VGA: not a GPU
}

// ---- LOOM_TOPO_FILE, NCCL_TOPO_FILE, LOOM_TOPO_DUMP_FILE ----

class TopoEnv : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v :
         {"LOOM_TOPO_FILE", "NCCL_TOPO_FILE", "LOOM_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE"}) {
      unsetenv(v);
    }
    reloadParams();
  }
  static void set(const char* name, const std::string& value) {
    setenv(name, value.c_str(), 1);
    reloadParams();
  }
};

#define REQUIRE_FILE(f)                                                             \
  if (!std::ifstream(topoPath(f)).good()) {                                         \
    GTEST_SKIP() << "missing " << topoPath(f) << " (the shared topology fixtures)"; \
  }

TEST_F(TopoEnv, LoomTopoFileReplacesDiscovery) {
  REQUIRE_FILE("oci-hpc_H100-topology.xml");
  set("LOOM_TOPO_FILE", topoPath("oci-hpc_H100-topology.xml"));
  std::string source;
  auto r = loadLocalTopology(nullptr, &source);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(source, "file " + topoPath("oci-hpc_H100-topology.xml"));
  auto f = importXmlFile(topoPath("oci-hpc_H100-topology.xml"));
  ASSERT_TRUE(f.isOk());
  EXPECT_EQ(diffGraphs(r.value(), f.value()), "");
}

TEST_F(TopoEnv, NcclTopoFileWhenLoomUnsetAndLoomWins) {
  REQUIRE_FILE("azhpc-images_ncv4-topo.xml");
  REQUIRE_FILE("aws-ofi-nccl_p5.48xl-topo.xml");
  set("NCCL_TOPO_FILE", topoPath("azhpc-images_ncv4-topo.xml"));
  auto r = loadLocalTopology();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().count(NodeType::kGpu), 4);
  set("LOOM_TOPO_FILE", topoPath("aws-ofi-nccl_p5.48xl-topo.xml"));
  auto l = loadLocalTopology();
  ASSERT_TRUE(l.isOk()) << l.status().message();
  EXPECT_EQ(l.value().count(NodeType::kNic), 32);  // LOOM_TOPO_FILE wins
}

TEST_F(TopoEnv, BadTopoFileNamesTheVariableAndLine) {
  std::string bad = ::testing::TempDir() + "/loom_bad_topo.xml";
  std::ofstream(bad) << "<system version=\"1\">\n<cpu>\n</system>\n";
  set("LOOM_TOPO_FILE", bad);
  auto r = loadLocalTopology();
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("LOOM_TOPO_FILE"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().message();
  set("LOOM_TOPO_FILE", "/nonexistent/loom.xml");
  EXPECT_EQ(loadLocalTopology().status().code(), Code::kSystem);
  std::remove(bad.c_str());
}

TEST_F(TopoEnv, DumpFileOfDiscoveryReimportsToTheSameGraph) {
  std::string dump = ::testing::TempDir() + "/loom_dump_" + std::to_string(getpid()) + ".xml";
  set("LOOM_TOPO_DUMP_FILE", dump);
  auto r = loadLocalTopology();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto b = importXmlFile(dump);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(diffGraphs(r.value(), b.value()), "");
  std::remove(dump.c_str());
}

TEST_F(TopoEnv, NcclDumpFileAndFileThroughDump) {
  REQUIRE_FILE("aws-ofi-nccl_p4d-24xl-topo.xml");
  std::string dump = ::testing::TempDir() + "/loom_ndump_" + std::to_string(getpid()) + ".xml";
  set("LOOM_TOPO_FILE", topoPath("aws-ofi-nccl_p4d-24xl-topo.xml"));
  set("NCCL_TOPO_DUMP_FILE", dump);
  auto r = loadLocalTopology();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto b = importXmlFile(dump);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(diffGraphs(r.value(), b.value()), "");
  std::remove(dump.c_str());
  set("LOOM_TOPO_DUMP_FILE", "/nonexistent/dir/dump.xml");
  auto bad = loadLocalTopology();
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("LOOM_TOPO_DUMP_FILE"), std::string::npos)
      << bad.status().message();
}

// ---- helpers ----

TEST(TopologyDiscover, Cpumasks) {
  EXPECT_EQ(cpumaskString({0, 1}), "00000003");
  EXPECT_EQ(cpumaskString({}), "00000000");
  EXPECT_EQ(cpumaskString({0}, 96), "00000000,00000000,00000001");
  EXPECT_EQ(cpumaskString({32, 63, 64}), "00000001,80000001,00000000");
  const std::string oci = "00000000,000000ff,ffffffff,ffff0000,00000000,00ffffff,ffffffff";
  auto cpus = parseCpumask(oci);
  ASSERT_TRUE(cpus.isOk());
  EXPECT_EQ(cpus.value().size(), 112u);  // 0-55 and 112-167
  EXPECT_EQ(cpus.value().front(), 0);
  EXPECT_EQ(cpus.value().back(), 167);
  EXPECT_EQ(cpumaskString(cpus.value(), 224), oci);
  EXPECT_TRUE(parseCpumask("0x3").isOk());
  EXPECT_FALSE(parseCpumask("").isOk());
  EXPECT_FALSE(parseCpumask("xyz").isOk());
  EXPECT_FALSE(parseCpumask("123456789").isOk());
  EXPECT_FALSE(parseCpumask("ff,,ff").isOk());
}

TEST(TopologyDiscover, IbRatesAsNccl) {
  EXPECT_EQ(detail::ibRateMbps(64, 2), 200000);          // 4X HDR
  EXPECT_EQ(detail::ibRateMbps(128, 2), 400000);         // 4X NDR
  EXPECT_EQ(detail::ibRateMbps(32, 2), 100000);          // 4X EDR
  EXPECT_EQ(detail::ibRateMbps(16, 8), 168000);          // 12X FDR
  EXPECT_EQ(detail::ibRateMbps(8, 2), 40000);            // 4X FDR10, NCCL's 10000 per lane
  EXPECT_EQ(detail::ibRateMbps(4, 4), 80000);            // 8X QDR
  EXPECT_EQ(detail::ibRateMbps(2, 16), 10000);           // 2X DDR
  EXPECT_EQ(detail::ibRateMbps(1, 1), 2500);             // 1X SDR
  EXPECT_EQ(detail::ibRateMbps(256, 2), 800000);         // 4X XDR
  EXPECT_EQ(detail::ibRateMbps(64 | 32, 2 | 1), 25000);  // lowest bits, as NCCL
  EXPECT_EQ(detail::ibLanes(16), 2);
  EXPECT_EQ(detail::ibLaneMbps(256), 200000);
  // Unknown codes: 0, not NCCL's last entry (the caller then reads the sysfs rate).
  EXPECT_EQ(detail::ibRateMbps(0, 2), 0);
  EXPECT_EQ(detail::ibRateMbps(512, 2), 0);
  EXPECT_EQ(detail::ibRateMbps(64, 0), 0);
  EXPECT_EQ(detail::ibRateMbps(64, 32), 0);
}

TEST(TopologyDiscover, IbPortStringsAsSysfs) {
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_ACTIVE), "4: ACTIVE");
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_DOWN), "1: DOWN");
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_NOP), "0: NOP");
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_INIT), "2: INIT");
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_ARMED), "3: ARMED");
  EXPECT_EQ(detail::ibPortStateString(IBV_PORT_ACTIVE_DEFER), "5: ACTIVE_DEFER");
  EXPECT_EQ(detail::ibPortStateString(9), "9: UNKNOWN");
  EXPECT_EQ(detail::ibPortStateString(-1), "-1: UNKNOWN");
  EXPECT_EQ(detail::ibLinkLayerString(IBV_LINK_LAYER_UNSPECIFIED), "InfiniBand");
  EXPECT_EQ(detail::ibLinkLayerString(IBV_LINK_LAYER_INFINIBAND), "InfiniBand");
  EXPECT_EQ(detail::ibLinkLayerString(IBV_LINK_LAYER_ETHERNET), "Ethernet");
  EXPECT_EQ(detail::ibLinkLayerString(7), "Unknown");
}

TEST(TopologyDiscover, BusIds) {
  EXPECT_EQ(normalizeBusId("00000000:1C:00.0"), "0000:1c:00.0");
  EXPECT_EQ(normalizeBusId("0001:00:00.0"), "0001:00:00.0");
  EXPECT_EQ(normalizeBusId("3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(normalizeBusId("fffffff:ff:ff.0"), "fffffff:ff:ff.0");
  EXPECT_EQ(normalizeBusId(""), "");
  EXPECT_EQ(normalizeBusId("garbage"), "");
  EXPECT_EQ(normalizeBusId("0000:1c:00"), "");
  EXPECT_EQ(normalizeBusId("0000:123:00.0"), "");
  EXPECT_EQ(pciBusIdOfSysfsPath("/sys/devices/pci0000:00/0000:00:03.0/virtio2"), "0000:00:03.0");
  EXPECT_EQ(pciBusIdOfSysfsPath("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
            "0000:01:00.0");
  EXPECT_EQ(pciBusIdOfSysfsPath("/sys/devices/virtual/net/lo"), "");
  EXPECT_EQ(pciBusIdOfSysfsPath(""), "");
}

}  // namespace
}  // namespace loom::topo
