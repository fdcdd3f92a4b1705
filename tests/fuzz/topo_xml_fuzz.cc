// Fuzz target for the NCCL topology XML importer (and the rank topology blob parser).
//
// Contract checked on every input: import either fails with kInvalidArgument, or succeeds and then
// export + import gives the same graph, paths can be computed, and the rank topology of the graph
// survives serialization. Anything else (a crash, a sanitizer report, another error) aborts.
//
// With clang and -DLOOM_FUZZ_LIBFUZZER=ON this is a libFuzzer target. Otherwise (gcc) main() below
// drives it: each file or directory given is run as-is, then mutations of those inputs (byte flips,
// XML tokens inserted, ranges erased or duplicated, truncations, splices of two inputs) from a
// fixed seed, until --iterations or --seconds is reached, whichever comes first.
//   topo_xml_fuzz [--seconds 20] [--iterations 1000000] [--seed 1] FILE_OR_DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_driver.h"
#include "topology/paths.h"
#include "topology/system.h"
#include "topology/xml.h"

namespace {

[[noreturn]] void die(const std::string& what, std::string_view input) {
  loomfuzz::fail("topo_xml_fuzz", "topo_xml_fuzz_crash.xml", what, input);
}

void runOne(std::string_view input) {
  using namespace loom::topo;
  auto r = importXmlString(input, "fuzz");
  if (!r.isOk()) {
    if (r.status().code() != loom::Code::kInvalidArgument) die(r.status().message(), input);
    if (r.status().message().find(" line ") == std::string::npos) {
      die("error without a line: " + r.status().message(), input);
    }
  } else {
    const Graph& g = r.value();
    std::string xml = exportXmlString(g);
    auto b = importXmlString(xml, "fuzz export");
    if (!b.isOk()) die("export does not import: " + b.status().message(), xml);
    std::string diff = diffGraphs(g, b.value());
    if (!diff.empty()) die("round trip differs: " + diff, input);
    if (g.size() < 4096) {
      Paths p = Paths::compute(g);
      for (int gpu : g.nodesOfType(NodeType::kGpu)) {
        int net = p.nearestNet(gpu);
        if (net >= 0) (void)p.gdrAllowed(gpu, net);
      }
      RankTopo t = localRankTopo(g, "fuzz");
      auto back = RankTopo::deserialize(t.serialize());
      if (!back.isOk()) die("rank topology does not round-trip: " + back.status().message(), input);
    }
  }
  // The same bytes as a rank topology blob: an error or a value, never a crash.
  auto blob = RankTopo::deserialize(input);
  if (!blob.isOk() && blob.status().code() != loom::Code::kInvalidArgument) {
    die(blob.status().message(), input);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  runOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef LOOM_LIBFUZZER

int main(int argc, char** argv) {
  const std::vector<std::string> tokens = {"<",
                                           ">",
                                           "/>",
                                           "</pci>",
                                           "<pci busid=\"0000:01:00.0\" class=\"0x060400\">",
                                           "\"",
                                           "=",
                                           "<!--",
                                           "-->",
                                           "<nvlink target=\"fffffff:ff:ff.0\" count=\"18\"/>",
                                           "&amp;",
                                           "&#0;",
                                           "\xff\xfe",
                                           "<![CDATA[x]]>",
                                           "<gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\">",
                                           "</gpu>",
                                           "<nic>",
                                           "</nic>",
                                           "<net name=\"n\" dev=\"0\" speed=\"400000\" gdr=\"1\"/>",
                                           "version=\"2\"",
                                           "<xgmi/>",
                                           "-1",
                                           "99999999999",
                                           "0x",
                                           "link_width=\"64\"",
                                           "<cpu numaid=\"1\">",
                                           "</cpu>",
                                           "\n",
                                           "<c2c bw=\"1e308\" count=\"2\"/>",
                                           "<pcilink target=\"0000:01:00.0\"/>"};
  // Small hand-made seeds so that the driver is useful without files.
  std::vector<std::string> seeds = {
      "<system version=\"1\"><cpu numaid=\"0\"/></system>",
      "<system version=\"1\"><cpu numaid=\"0\" vendor=\"GenuineIntel\"><pci busid=\"0000:01:00.0\" "
      "class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"0\" sm=\"80\" "
      "rank=\"0\" gdr=\"1\"/></pci><nic><net name=\"eth0\" dev=\"0\" speed=\"100000\"/></nic>"
      "</cpu></system>"};
  return loomfuzz::fuzzMain(argc, argv, "topo_xml_fuzz", std::move(seeds), tokens, runOne);
}
#endif
