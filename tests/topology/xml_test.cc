#include "topology/xml.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "topology/graph.h"

namespace loom::topo {
namespace {

std::string topoDir() { return std::string(LOOM_SHARED_DIR) + "/topologies"; }

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

#define SKIP_WITHOUT(file)                                                          \
  do {                                                                              \
    if (!std::ifstream(topoDir() + "/" + (file)).good()) {                          \
      GTEST_SKIP() << "missing " << topoDir() << "/" << (file)                      \
                   << " (the shared topology fixtures, see ../shared/topologies/)"; \
    }                                                                               \
  } while (0)

Graph load(const std::string& file) {
  auto r = importXmlFile(topoDir() + "/" + file);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? std::move(r).value() : Graph();
}

// Error of importing text; the test fails if the import succeeds.
Status importError(const std::string& text) {
  auto r = importXmlString(text, "t.xml");
  EXPECT_FALSE(r.isOk()) << "imported without error:\n" << text.substr(0, 200);
  return r.status();
}

const char* const kFiles[] = {"oci-hpc_H100-topology.xml", "aws-ofi-nccl_p5.48xl-topo.xml",
                              "aws-ofi-nccl_p4d-24xl-topo.xml", "azhpc-images_ncv4-topo.xml"};

TEST(TopologyXml, EveryFileRoundTrips) {
  for (const char* f : kFiles) {
    SKIP_WITHOUT(f);
    Graph a = load(f);
    ASSERT_GT(a.size(), 0) << f;
    std::string xml = exportXmlString(a);
    auto b = importXmlString(xml, std::string("export of ") + f);
    ASSERT_TRUE(b.isOk()) << b.status().message();
    EXPECT_EQ(diffGraphs(a, b.value()), "") << f;
    EXPECT_EQ(exportXmlString(b.value()), xml) << f;
  }
}

TEST(TopologyXml, ExportLooksLikeNccl) {
  SKIP_WITHOUT(kFiles[0]);
  std::string xml = exportXmlString(load(kFiles[0]));
  EXPECT_EQ(xml.rfind("<system version=\"1\">\n  <cpu numaid=\"0\"", 0), 0u) << xml.substr(0, 200);
  EXPECT_NE(xml.find("<nvlink target=\"0000:1c:00.0\" count=\"5\" tclass=\"0x068000\" />"),
            std::string::npos);
  EXPECT_EQ(xml.find("<?xml"), std::string::npos);
}

TEST(TopologyXml, ExportFileRoundTrips) {
  SKIP_WITHOUT(kFiles[3]);
  Graph a = load(kFiles[3]);
  std::string path = ::testing::TempDir() + "/loom_topo_export.xml";
  ASSERT_TRUE(exportXmlFile(a, path).isOk());
  auto b = importXmlFile(path);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(diffGraphs(a, b.value()), "");
  std::remove(path.c_str());
}

TEST(TopologyXml, OciH100Facts) {
  SKIP_WITHOUT(kFiles[0]);
  Graph g = load(kFiles[0]);
  EXPECT_EQ(g.count(NodeType::kCpu), 2);
  EXPECT_EQ(g.count(NodeType::kGpu), 8);
  EXPECT_EQ(g.count(NodeType::kNic), 8);
  EXPECT_EQ(g.count(NodeType::kNet), 16);
  // The four NVSwitches are not in the file: one shared NVSwitch stands for them.
  ASSERT_EQ(g.count(NodeType::kNvSwitch), 1);
  int nvs = g.nodesOfType(NodeType::kNvSwitch)[0];
  EXPECT_TRUE(g.node(nvs).synthetic);
  for (int gpu : g.nodesOfType(NodeType::kGpu)) {
    EXPECT_EQ(g.node(gpu).sm, 90);
    const Link* l = g.findLink(gpu, nvs, LinkType::kNvl);
    ASSERT_NE(l, nullptr) << g.describe(gpu);
    EXPECT_NEAR(l->bw, 18 * 20.6, 1e-9);  // 5+5+4+4 links of 20.6 GB/s
  }
  // Two ports of each ConnectX-7 share one guid.
  for (int nic : g.nodesOfType(NodeType::kNic)) {
    ASSERT_EQ(g.node(nic).children.size(), 2u);
    const Node& p0 = g.node(g.node(nic).children[0]);
    const Node& p1 = g.node(g.node(nic).children[1]);
    EXPECT_EQ(p0.guid, p1.guid);
    EXPECT_EQ(p0.port, 1);
    EXPECT_EQ(p1.port, 2);
    EXPECT_DOUBLE_EQ(p0.speedGBs, 22.5);
  }
  EXPECT_EQ(g.node(g.findByBusId("0000:0c:00.0")).children.size(), 2u);
  EXPECT_EQ(g.node(g.node(g.findByBusId("0000:0c:00.0")).children[0]).guid, 0x9a70500003ae6d94u);
  // Gen5 x16 = 48 GB/s, the upper switch's Gen2 x16 uplink = 6 GB/s (NCCL's rounding).
  EXPECT_DOUBLE_EQ(g.node(g.findByBusId("0000:0f:00.0")).pciBw, 48);
  EXPECT_DOUBLE_EQ(g.node(g.findByBusId("0000:08:00.0")).pciBw, 6);
  // Sapphire Rapids (model 143) sockets: 22 GB/s.
  auto cpus = g.nodesOfType(NodeType::kCpu);
  EXPECT_DOUBLE_EQ(g.findLink(cpus[0], cpus[1], LinkType::kSys)->bw, 22);
}

TEST(TopologyXml, AwsP5Facts) {
  SKIP_WITHOUT(kFiles[1]);
  Graph g = load(kFiles[1]);
  EXPECT_EQ(g.count(NodeType::kCpu), 1);
  EXPECT_EQ(g.count(NodeType::kGpu), 8);
  EXPECT_EQ(g.count(NodeType::kNic), 32);
  EXPECT_EQ(g.count(NodeType::kNet), 32);
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 0);
  EXPECT_EQ(g.count(NodeType::kPciSwitch), 8);
  for (int gpu : g.nodesOfType(NodeType::kGpu)) EXPECT_TRUE(g.node(gpu).gdr);
  EXPECT_DOUBLE_EQ(g.node(g.findByBusId("0000:50:00.0")).pciBw, 12);  // Gen4 x8
}

TEST(TopologyXml, AwsP4dFacts) {
  SKIP_WITHOUT(kFiles[2]);
  Graph g = load(kFiles[2]);
  // A PCI-tree-only file: GPUs and NICs are <pci> elements of their class, no <gpu>/<nic>.
  EXPECT_EQ(g.count(NodeType::kCpu), 2);
  EXPECT_EQ(g.count(NodeType::kGpu), 8);
  EXPECT_EQ(g.count(NodeType::kNic), 4);
  EXPECT_EQ(g.count(NodeType::kNet), 0);
  EXPECT_EQ(g.count(NodeType::kPciSwitch), 4);
  int sw = g.findByBusId("ffff:ff:01.0");  // a virtual switch
  ASSERT_GE(sw, 0);
  EXPECT_EQ(g.node(sw).type, NodeType::kPciSwitch);
  EXPECT_EQ(g.node(sw).children.size(), 3u);
  int gpu = g.findByBusId("0000:10:1c.0");
  EXPECT_EQ(g.node(gpu).type, NodeType::kGpu);
  EXPECT_EQ(g.node(gpu).dev, -1);
  EXPECT_EQ(g.node(gpu).elemTag, "");
  EXPECT_DOUBLE_EQ(g.node(gpu).pciBw, 12);  // "8 GT/s" x16, the pre-5.6 kernel spelling
  auto cpus = g.nodesOfType(NodeType::kCpu);
  EXPECT_DOUBLE_EQ(g.findLink(cpus[0], cpus[1], LinkType::kSys)->bw, 10);  // Skylake
}

TEST(TopologyXml, AzureNcv4Facts) {
  SKIP_WITHOUT(kFiles[3]);
  Graph g = load(kFiles[3]);
  EXPECT_EQ(g.count(NodeType::kCpu), 4);
  EXPECT_EQ(g.count(NodeType::kGpu), 4);
  EXPECT_EQ(g.count(NodeType::kNic), 1);
  EXPECT_EQ(g.count(NodeType::kNet), 1);
  EXPECT_EQ(g.count(NodeType::kNvSwitch), 0);
  // NIC directly under cpu 0, without a <pci>.
  int nic = g.nodesOfType(NodeType::kNic)[0];
  EXPECT_TRUE(g.node(nic).isCpuNic());
  EXPECT_EQ(g.node(g.node(nic).parent).numaId, 0);
  const Node& eth0 = g.node(g.node(nic).children[0]);
  EXPECT_EQ(eth0.name, "eth0");
  EXPECT_DOUBLE_EQ(eth0.speedGBs, 12.5);
  EXPECT_FALSE(eth0.gdr);
  // Empty link_speed and link_width="0": Gen3 x16 as NCCL assumes.
  for (int gpu : g.nodesOfType(NodeType::kGpu)) {
    EXPECT_DOUBLE_EQ(g.node(gpu).pciBw, 12);
    // NVLinks to the GPU's own bus id connect nothing.
    for (int li : g.linksFrom(gpu)) EXPECT_NE(g.links()[li].type, LinkType::kNvl);
    EXPECT_EQ(g.node(gpu).linkElements.size(), 1u);  // but are kept for export
  }
  auto cpus = g.nodesOfType(NodeType::kCpu);
  EXPECT_DOUBLE_EQ(g.findLink(cpus[0], cpus[3], LinkType::kSys)->bw, 16);  // AMD
}

// ---- quirks in small files ----

TEST(TopologyXml, QuirksInline) {
  const char* xml = R"(<!-- a comment first -->
<system version="1">
  <cpu numaid="-1" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="207" host_hash="0xabc" extra="kept">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="64.0 GT/s PCIe">
      <pci busid="0000:02:00.0" class="0x030200" link_speed="" link_width="0">
        <gpu dev="0" sm="100" rank="0" gdr="1">
          <nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>
          <c2c bw="40000" count="10"/>
          <future_element x="1"/>
        </gpu>
      </pci>
      <pcilink target="0000:11:00.0"/>
    </pci>
    <pci busid="0000:11:00.0" class="0x060400"/>
    <nic><net name="a" dev="0" speed="400000" guid="0x1" gdr="1"/><net name="nodev"/></nic>
  </cpu>
</system>)";
  auto r = importXmlString(xml);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  const Node& cpu = g.node(0);
  EXPECT_EQ(cpu.numaId, -1);
  EXPECT_EQ(*findAttr(cpu.attrs, "extra"), "kept");
  EXPECT_EQ(g.count(NodeType::kNet), 1);  // a net without dev is ignored
  int gpu = g.findByBusId("0000:02:00.0");
  ASSERT_EQ(g.count(NodeType::kNvSwitch), 1);
  int nvs = g.nodesOfType(NodeType::kNvSwitch)[0];
  EXPECT_NEAR(g.findLink(gpu, nvs, LinkType::kNvl)->bw, 18 * 40.1, 1e-9);
  EXPECT_DOUBLE_EQ(g.findLink(gpu, 0, LinkType::kC2c)->bw, 400);
  EXPECT_NE(
      g.findLink(g.findByBusId("0000:01:00.0"), g.findByBusId("0000:11:00.0"), LinkType::kPci),
      nullptr);
  EXPECT_DOUBLE_EQ(g.node(g.findByBusId("0000:01:00.0")).pciBw, 96);  // Gen6 x16
  auto b = importXmlString(exportXmlString(g));
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(diffGraphs(g, b.value()), "");
}

TEST(TopologyXml, UpperCaseBusIdsMatch) {
  auto r = importXmlString(
      "<system version=\"1\"><cpu><pci busid=\"0000:0A:00.0\" class=\"0x030200\"><gpu dev=\"0\" "
      "sm=\"80\" rank=\"0\"><nvlink target=\"0000:0B:00.0\" count=\"2\" tclass=\"0x030200\"/></gpu>"
      "</pci><pci busid=\"0000:0b:00.0\" class=\"0x030200\"><gpu dev=\"1\" sm=\"80\" rank=\"1\">"
      "<nvlink target=\"0000:0a:00.0\" count=\"2\" "
      "tclass=\"0x030200\"/></gpu></pci></cpu></system>");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Graph& g = r.value();
  int a = g.findByBusId("0000:0a:00.0"), b = g.findByBusId("0000:0B:00.0");
  ASSERT_NE(g.findLink(a, b, LinkType::kNvl), nullptr);
  EXPECT_DOUBLE_EQ(g.findLink(a, b, LinkType::kNvl)->bw, 40);
  EXPECT_DOUBLE_EQ(g.findLink(b, a, LinkType::kNvl)->bw, 40);
}

// ---- malformed and other dialects ----

void expectInvalid(const Status& st, const std::string& line, const std::string& words) {
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("line " + line), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
}

TEST(TopologyXml, MalformedGivesLine) {
  expectInvalid(importError("<system version=\"1\">\n<cpu>\n<pci busid=\"0000:01:00.0\" "
                            "class=\"0x0604\">\n</cpu>\n</system>\n"),
                "4", "malformed XML");
  expectInvalid(importError("<topology version=\"1\"/>"), "1", "root element is <topology>");
  expectInvalid(importError("<?xml version=\"1.0\"?>\n\n<foo/>"), "3", "root element is <foo>");
  expectInvalid(importError(""), "1", "No document element");
  expectInvalid(importError("just text"), "1", "");
  expectInvalid(importError("<system/>"), "1", "no version");
  expectInvalid(importError("<system version=\"3\"/>"), "1", "unsupported");
  expectInvalid(importError("<system version=\"1\"/>\n<system version=\"1\"/>"), "2",
                "second root");
  expectInvalid(
      importError("<system version=\"1\">\n<cpu>\n<pci class=\"0x0604\"/></cpu></system>"), "3",
      "without busid");
  expectInvalid(
      importError("<system version=\"1\"><cpu>\n<pci busid=\"0000:01:00.0\"/></cpu></system>"), "2",
      "without class");
  expectInvalid(
      importError("<system version=\"1\"><cpu>\n<pci busid=\"0000:01:00.0\" class=\"0x06\"/>"
                  "\n<pci busid=\"0000:01:00.0\" class=\"0x06\"/></cpu></system>"),
      "3", "duplicate busid 0000:01:00.0 (first at line 2)");
  expectInvalid(importError("<system version=\"1\"><cpu>\n<pci busid=\"<x>\" class=\"0x06\"/></cpu>"
                            "</system>"),
                "", "");
  expectInvalid(importError("<system version=\"1\">\n\n<cpu numaid=\"zero\"/></system>"), "3",
                "numaid=\"zero\"");
  expectInvalid(
      importError("<system version=\"1\"><cpu>\n<pci busid=\"0000:01:00.0\" class=\"0x030200\">"
                  "<gpu dev=\"0\" sm=\"80\">\n<nvlink target=\"x\" count=\"99999999999\"/>"
                  "</gpu></pci></cpu></system>"),
      "3", "count=\"99999999999\"");
  expectInvalid(importError("<system version=\"1\"><cpu><nic>\n<net name=\"a\" dev=\"0\" "
                            "speed=\"inf\"/></nic></cpu></system>"),
                "2", "speed");
}

TEST(TopologyXml, TruncatedFilesGiveLine) {
  SKIP_WITHOUT(kFiles[0]);
  std::string text = readFile(topoDir() + "/" + kFiles[0]);
  for (size_t cut = 0; cut < text.size(); cut += 97) {
    auto r = importXmlString(text.substr(0, cut), "cut.xml");
    ASSERT_FALSE(r.isOk()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("cut.xml line "), std::string::npos)
        << r.status().message();
  }
}

TEST(TopologyXml, RcclDialectRejected) {
  const char* v2 = R"(<system version="2">
  <cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
    <pci busid="0000:c1:00.0" class="0x038000">
      <gpu dev="0" sm="90" gcn="gfx942" arch="0" rank="0" gdr="1">
        <xgmi target="0000:d1:00.0" count="1" tclass="0x038000"/>
      </gpu>
    </pci>
  </cpu>
</system>)";
  expectInvalid(importError(v2), "1", "RCCL");
  std::string v1xgmi = v2;
  v1xgmi.replace(v1xgmi.find("version=\"2\""), 11, "version=\"1\"");
  expectInvalid(importError(v1xgmi), "5", "<xgmi>");
}

// ---- hostile input ----

TEST(TopologyXml, DeepNestingIsRejectedNotACrash) {
  std::string xml = "<system version=\"1\"><cpu>";
  const int depth = 100000;
  for (int i = 0; i < depth; i++) {
    xml += fmt::format("<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x060400\">", i >> 8, i & 255);
  }
  for (int i = 0; i < depth; i++) xml += "</pci>";
  xml += "</cpu></system>";
  expectInvalid(importError(xml), "1", "nested deeper");
  // Deep unknown elements are skipped without recursion.
  std::string unk = "<system version=\"1\">";
  for (int i = 0; i < depth; i++) unk += "<a>";
  for (int i = 0; i < depth; i++) unk += "</a>";
  unk += "</system>";
  EXPECT_TRUE(importXmlString(unk).isOk());
}

TEST(TopologyXml, HugeAttributes) {
  std::string big(8 << 20, 'x');
  auto r = importXmlString("<system version=\"1\"><cpu vendor=\"" + big + "\"/></system>");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().node(0).vendor.size(), big.size());
  Status st = importError("<system version=\"1\"><cpu><pci busid=\"" + big +
                          "\" class=\"0x06\"/></cpu></system>");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_LT(st.message().size(), 200u);  // the value is not copied into the message
  std::string huge(kMaxXmlBytes + 1, ' ');
  EXPECT_EQ(importError(huge).code(), Code::kInvalidArgument);
}

TEST(TopologyXml, ThousandsOfNodesBeyondNcclLimit) {
  std::string xml = "<system version=\"1\">";
  const int kCpus = 4, kSwitches = 64, kPerSwitch = 20;  // 2560 GPUs, 2560 NICs
  int bus = 0;
  for (int c = 0; c < kCpus; c++) {
    xml += fmt::format("<cpu numaid=\"{}\">", c);
    for (int s = 0; s < kSwitches; s++) {
      xml += fmt::format("<pci busid=\"{:04x}:00:00.0\" class=\"0x060400\">", bus++);
      for (int k = 0; k < kPerSwitch; k++) {
        xml += fmt::format(
            "<pci busid=\"{:04x}:00:00.0\" class=\"0x030200\"><gpu dev=\"{}\" "
            "sm=\"90\" rank=\"0\" gdr=\"1\"><nvlink target=\"fffffff:ff:ff.0\" "
            "count=\"18\" tclass=\"0x068000\"/></gpu></pci>",
            bus++, k);
        xml += fmt::format(
            "<pci busid=\"{:04x}:00:00.0\" class=\"0x020000\"><nic><net name=\"n\" "
            "dev=\"{}\" speed=\"400000\"/></nic></pci>",
            bus++, k);
      }
      xml += "</pci>";
    }
    xml += "</cpu>";
  }
  xml += "</system>";
  auto r = importXmlString(xml);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().count(NodeType::kGpu), kCpus * kSwitches * kPerSwitch);
  EXPECT_EQ(r.value().count(NodeType::kNet), kCpus * kSwitches * kPerSwitch);
  auto b = importXmlString(exportXmlString(r.value()));
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(diffGraphs(r.value(), b.value()), "");
}

TEST(TopologyXml, RandomCorruptionNeverCrashes) {
  std::string text;
  for (const char* f : kFiles) {
    std::string t = readFile(topoDir() + "/" + f);
    if (!t.empty()) {
      text = t;
      break;
    }
  }
  if (text.empty()) GTEST_SKIP() << "missing " << topoDir() << " (shared topology fixtures)";
  std::mt19937 rng(12345);
  const char kBytes[] = "<>/\"=x0 \n\xff&;!-?";
  int ok = 0;
  for (int iter = 0; iter < 2000; iter++) {
    std::string t = text;
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; e++) {
      size_t pos = rng() % t.size();
      switch (rng() % 3) {
        case 0:
          t[pos] = kBytes[rng() % (sizeof(kBytes) - 1)];
          break;
        case 1:
          t.erase(pos, 1 + rng() % 20);
          break;
        default:
          t.insert(pos, 1, kBytes[rng() % (sizeof(kBytes) - 1)]);
          break;
      }
      if (t.empty()) t = "<";
    }
    auto r = importXmlString(t, "fuzz");
    if (r.isOk()) {
      ok++;
      // Whatever was accepted must export and reimport to the same graph.
      auto b = importXmlString(exportXmlString(r.value()));
      ASSERT_TRUE(b.isOk()) << b.status().message();
      EXPECT_EQ(diffGraphs(r.value(), b.value()), "");
    } else {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().message();
    }
  }
  EXPECT_GT(ok, 0);
}

TEST(TopologyXml, MissingFileIsSystemError) {
  auto r = importXmlFile("/nonexistent/loom/topo.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kSystem);
}

}  // namespace
}  // namespace loom::topo
