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

#include "topology/paths.h"
#include "topology/system.h"
#include "topology/xml.h"

namespace {

[[noreturn]] void die(const std::string& what, std::string_view input) {
  // The whole input, for reproduction: topo_xml_fuzz --seconds 0 topo_xml_fuzz_crash.xml
  if (FILE* f = std::fopen("topo_xml_fuzz_crash.xml", "wb")) {
    std::fwrite(input.data(), 1, input.size(), f);
    std::fclose(f);
  }
  std::fprintf(stderr, "topo_xml_fuzz: %s\ninput (%zu bytes): %.*s\n", what.c_str(), input.size(),
               static_cast<int>(std::min<size_t>(input.size(), 400)), input.data());
  std::abort();
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
#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <random>
#include <vector>

namespace {

void addInputs(const std::string& path, std::vector<std::string>* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "topo_xml_fuzz: cannot read %s\n", path.c_str());
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = opendir(path.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) addInputs(path + "/" + n, out);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  out->emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  static const char* const kTokens[] = {"<",
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
  const size_t kTokenCount = sizeof(kTokens) / sizeof(kTokens[0]);
  std::string s = corpus[rng() % corpus.size()];
  int edits = 1 + static_cast<int>(rng() % 6);
  for (int e = 0; e < edits; e++) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:  // flip a byte
        if (!s.empty()) s[pos % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // insert a token
        s.insert(pos, kTokens[rng() % kTokenCount]);
        break;
      case 2:  // erase a range
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 64);
        break;
      case 3:  // truncate
        s.resize(pos);
        break;
      case 4: {  // duplicate a range (deepens nesting)
        if (s.empty()) break;
        size_t a = rng() % s.size();
        size_t n = std::min<size_t>(1 + rng() % 512, s.size() - a);
        s.insert(pos, s.substr(a, n));
        break;
      }
      case 5: {  // splice with another input
        const std::string& o = corpus[rng() % corpus.size()];
        if (o.empty()) break;
        s = s.substr(0, pos) + o.substr(rng() % o.size());
        break;
      }
      default:  // random byte
        s.insert(pos, 1, static_cast<char>(rng()));
        break;
    }
    if (s.size() > (1u << 20)) s.resize(1u << 20);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 20;
  long long iterations = 1000000;
  unsigned long long seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if ((a == "--seconds" || a == "--iterations" || a == "--seed") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--seconds") seconds = std::atof(v);
      if (a == "--iterations") iterations = std::atoll(v);
      if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "usage: %s [--seconds S] [--iterations N] [--seed K] FILE_OR_DIR...\n",
                   argv[0]);
      return 2;
    } else {
      addInputs(a, &corpus);
    }
  }
  // Small hand-made seeds so that the driver is useful without files.
  corpus.push_back("<system version=\"1\"><cpu numaid=\"0\"/></system>");
  corpus.push_back(
      "<system version=\"1\"><cpu numaid=\"0\" vendor=\"GenuineIntel\"><pci busid=\"0000:01:00.0\" "
      "class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"0\" sm=\"80\" "
      "rank=\"0\" gdr=\"1\"/></pci><nic><net name=\"eth0\" dev=\"0\" speed=\"100000\"/></nic>"
      "</cpu></system>");
  for (const auto& c : corpus) runOne(c);
  std::mt19937_64 rng(seed);
  auto start = std::chrono::steady_clock::now();
  long long n = 0;
  for (; n < iterations; n++) {
    if ((n & 63) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      break;
    }
    runOne(mutate(corpus, rng));
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "topo_xml_fuzz: %zu seed input(s), %lld mutation(s) in %.1f s (seed %llu): no failure\n",
      corpus.size(), n, took, seed);
  return 0;
}
#endif
