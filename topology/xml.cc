#include "topology/xml.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <pugixml.hpp>
#include <sstream>
#include <vector>

#include "src/core/log.h"
#include "src/core/text.h"

namespace loom::topo {

namespace {

class Importer {
 public:
  Importer(std::string_view text, std::string source) : text_(text), source_(std::move(source)) {}

  Result<Graph> run() {
    pugi::xml_document doc;
    pugi::xml_parse_result res =
        doc.load_buffer(text_.data(), text_.size(), pugi::parse_default, pugi::encoding_utf8);
    if (!res) return fail(lineAt(res.offset), "malformed XML: {}", res.description());
    pugi::xml_node root;
    for (pugi::xml_node n : doc.children()) {
      if (n.type() != pugi::node_element) continue;
      if (root) return fail(line(n), "second root element <{}>", n.name());
      root = n;
    }
    if (!root) return fail(1, "no root element (expected <system version=\"1\">)");
    if (std::string(root.name()) != "system") {
      return fail(line(root), "root element is <{}>, expected <system> (NCCL topology XML)",
                  root.name());
    }
    pugi::xml_attribute version = root.attribute("version");
    if (!version) return fail(line(root), "<system> has no version (NCCL's format is version 1)");
    std::string v = version.value();
    if (v == "2") {
      return fail(line(root),
                  "<system version=\"2\"> is RCCL's dialect (xgmi links), not NCCL's version 1");
    }
    if (v != "1") return fail(line(root), "unsupported <system> version \"{}\" (expected 1)", v);
    for (pugi::xml_node c : root.children()) {
      if (c.type() != pugi::node_element) continue;
      std::string name = c.name();
      if (name == "cpu") {
        LOOM_TRY(addCpu(c));
      } else {
        LOOM_TRY(unknown(c));
      }
    }
    LOOM_TRY(graph_.buildLinks().withContext(source_));
    return std::move(graph_);
  }

 private:
  // pugixml reports byte offsets; lines are counted once, then found by binary search.
  int lineAt(ptrdiff_t offset) {
    if (offset < 0) return 0;
    if (newlines_.empty()) {
      for (size_t i = 0; i < text_.size(); i++) {
        if (text_[i] == '\n') newlines_.push_back(i);
      }
      newlines_.push_back(std::string_view::npos);
    }
    auto it = std::lower_bound(newlines_.begin(), newlines_.end(), static_cast<size_t>(offset));
    return static_cast<int>(it - newlines_.begin()) + 1;
  }
  int line(pugi::xml_node n) { return lineAt(n.offset_debug()); }

  template <typename... Args>
  Status fail(int l, fmt::format_string<Args...> f, Args&&... args) const {
    return Status(Code::kInvalidArgument, fmt::format("{} line {}: ", source_, l) +
                                              fmt::format(f, std::forward<Args>(args)...));
  }

  static Attrs attrsOf(pugi::xml_node n) {
    Attrs a;
    for (pugi::xml_attribute at : n.attributes()) a.emplace_back(at.name(), at.value());
    return a;
  }

  Status unknown(pugi::xml_node n) {
    if (std::string(n.name()) == "xgmi") {
      return fail(line(n), "<xgmi> is RCCL's dialect (AMD Infinity Fabric), not NCCL's format");
    }
    LOOM_INFO(kSubTopo, "{} line {}: unknown element <{}> ignored", source_, line(n), n.name());
    return Status::ok();
  }

  // Strict integer attribute: absent or empty -> def; garbage -> error.
  Result<long long> intAttr(pugi::xml_node n, const char* name, long long def, int base = 10) {
    pugi::xml_attribute a = n.attribute(name);
    if (!a || a.value()[0] == '\0') return def;
    const char* s = a.value();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, base);
    if (end == s || *end != '\0' || errno == ERANGE || v < -(1LL << 31) || v > (1LL << 31)) {
      return fail(line(n), "<{}> attribute {}=\"{}\" is not a valid number", n.name(), name,
                  truncated(s));
    }
    return v;
  }
  Result<double> doubleAttr(pugi::xml_node n, const char* name, double def) {
    pugi::xml_attribute a = n.attribute(name);
    if (!a || a.value()[0] == '\0') return def;
    const char* s = a.value();
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !std::isfinite(v) || v < 0) {
      return fail(line(n), "<{}> attribute {}=\"{}\" is not a valid number", n.name(), name,
                  truncated(s));
    }
    return v;
  }
  static std::string truncated(const char* s) {
    std::string r(s);
    if (r.size() > 40) r = r.substr(0, 40) + "...";
    return r;
  }

  Status checkDepth(pugi::xml_node n, int depth) {
    if (depth > kMaxXmlDepth) {
      return fail(line(n), "elements nested deeper than {} levels", kMaxXmlDepth);
    }
    return Status::ok();
  }

  Status addCpu(pugi::xml_node c) {
    Node n;
    n.type = NodeType::kCpu;
    n.line = line(c);
    n.elemTag = "cpu";
    n.attrs = attrsOf(c);
    LOOM_ASSIGN(long long numa, intAttr(c, "numaid", -1));
    LOOM_ASSIGN(long long family, intAttr(c, "familyid", -1));
    LOOM_ASSIGN(long long model, intAttr(c, "modelid", -1));
    n.numaId = static_cast<int>(numa);
    n.familyId = static_cast<int>(family);
    n.modelId = static_cast<int>(model);
    n.arch = c.attribute("arch").value();
    n.vendor = c.attribute("vendor").value();
    // NCCL's dumps of several hosts give each cpu its host's hash; the devices below it belong to
    // that host (their bus ids are unique only within it).
    n.host = graph_.addHost(c.attribute("host_hash").value());
    int id = graph_.addNode(std::move(n));
    for (pugi::xml_node ch : c.children()) {
      if (ch.type() != pugi::node_element) continue;
      std::string name = ch.name();
      if (name == "pci") {
        LOOM_TRY(addPci(ch, id, 2));
      } else if (name == "nic") {
        Node nic;
        nic.type = NodeType::kNic;
        nic.parent = id;
        nic.line = line(ch);
        LOOM_TRY(fillNic(ch, graph_.addNode(std::move(nic))));
      } else {
        LOOM_TRY(unknown(ch));
      }
    }
    return Status::ok();
  }

  Status addPci(pugi::xml_node p, int parent, int depth) {
    LOOM_TRY(checkDepth(p, depth));
    Node n;
    n.line = line(p);
    n.parent = parent;
    n.hasPci = true;
    n.pciAttrs = attrsOf(p);
    std::string busId = asciiLower(p.attribute("busid").value());
    if (busId.empty()) return fail(n.line, "<pci> without busid");
    if (busId.find_first_not_of("0123456789abcdef:.") != std::string::npos || busId.size() > 16) {
      return fail(n.line, "<pci> busid \"{}\" is not a PCI bus id", truncated(busId.c_str()));
    }
    const int host = graph_.node(parent).host;
    int dup = graph_.findByBusId(busId, host);
    if (dup >= 0) {
      return fail(n.line, "duplicate busid {} (first at line {}){}", busId, graph_.node(dup).line,
                  graph_.hostCount() > 1 ? " on one host" : "");
    }
    n.busId = busId;
    if (!p.attribute("class")) return fail(n.line, "<pci busid=\"{}\"> without class", busId);
    LOOM_ASSIGN(long long cls, intAttr(p, "class", 0, 16));
    n.pciClass = static_cast<uint32_t>(cls);
    if (n.pciClass == 0x068000) {
      n.type = NodeType::kNvSwitch;
    } else if ((n.pciClass >> 16) == 0x03) {
      n.type = NodeType::kGpu;
    } else if ((n.pciClass >> 16) == 0x02) {
      n.type = NodeType::kNic;
    } else {
      n.type = NodeType::kPciSwitch;
    }
    LOOM_ASSIGN(long long width, intAttr(p, "link_width", 0));
    if (width < 0 || width > 64) return fail(n.line, "link_width=\"{}\" out of range", width);
    n.pciBw = pciBandwidth(p.attribute("link_speed").value(), static_cast<int>(width));
    int id = graph_.addNode(std::move(n));
    for (pugi::xml_node ch : p.children()) {
      if (ch.type() != pugi::node_element) continue;
      std::string name = ch.name();
      NodeType type = graph_.node(id).type;
      if (name == "pci") {
        LOOM_TRY(addPci(ch, id, depth + 1));
      } else if (name == "gpu" && type == NodeType::kGpu) {
        LOOM_TRY(fillGpu(ch, id));
      } else if (name == "nic" && type == NodeType::kNic) {
        LOOM_TRY(fillNic(ch, id));
      } else if (name == "pcilink") {
        graph_.mutableNode(id).linkElements.push_back({name, attrsOf(ch), line(ch)});
      } else if (name == "gpu" || name == "nic") {
        LOOM_INFO(kSubTopo, "{} line {}: <{}> under a <pci> of class {:#x} ignored", source_,
                  line(ch), name, graph_.node(id).pciClass);
      } else {
        LOOM_TRY(unknown(ch));
      }
    }
    return Status::ok();
  }

  Status fillGpu(pugi::xml_node g, int id) {
    if (!graph_.node(id).elemTag.empty()) return fail(line(g), "second <gpu> in one <pci>");
    LOOM_ASSIGN(long long dev, intAttr(g, "dev", -1));
    LOOM_ASSIGN(long long sm, intAttr(g, "sm", 0));
    LOOM_ASSIGN(long long rank, intAttr(g, "rank", -1));
    LOOM_ASSIGN(long long gdr, intAttr(g, "gdr", 0));
    Node& n = graph_.mutableNode(id);
    n.elemTag = "gpu";
    n.attrs = attrsOf(g);
    n.dev = static_cast<int>(dev);
    n.sm = static_cast<int>(sm);
    n.rank = static_cast<int>(rank);
    n.gdr = gdr != 0;
    for (pugi::xml_node ch : g.children()) {
      if (ch.type() != pugi::node_element) continue;
      std::string name = ch.name();
      if (name == "nvlink" || name == "c2c") {
        if (name == "nvlink") {
          LOOM_ASSIGN(long long count, intAttr(ch, "count", 1));
          if (count < 0) return fail(line(ch), "<nvlink> count {} is negative", count);
        } else {
          LOOM_TRY(doubleAttr(ch, "bw", 0).status());
          LOOM_TRY(intAttr(ch, "count", 1).status());
        }
        graph_.mutableNode(id).linkElements.push_back({name, attrsOf(ch), line(ch)});
      } else {
        LOOM_TRY(unknown(ch));
      }
    }
    return Status::ok();
  }

  Status fillNic(pugi::xml_node x, int id) {
    if (!graph_.node(id).elemTag.empty()) return fail(line(x), "second <nic> in one <pci>");
    graph_.mutableNode(id).elemTag = "nic";
    graph_.mutableNode(id).attrs = attrsOf(x);
    for (pugi::xml_node ch : x.children()) {
      if (ch.type() != pugi::node_element) continue;
      if (std::string(ch.name()) != "net") {
        LOOM_TRY(unknown(ch));
        continue;
      }
      if (!ch.attribute("dev")) {
        LOOM_INFO(kSubTopo, "{} line {}: <net> without dev ignored (as NCCL does)", source_,
                  line(ch));
        continue;
      }
      Node n;
      n.type = NodeType::kNet;
      n.parent = id;
      n.line = line(ch);
      n.elemTag = "net";
      n.attrs = attrsOf(ch);
      n.name = ch.attribute("name").value();
      LOOM_ASSIGN(long long dev, intAttr(ch, "dev", -1));
      LOOM_ASSIGN(long long port, intAttr(ch, "port", -1));
      LOOM_ASSIGN(long long gdr, intAttr(ch, "gdr", 0));
      LOOM_ASSIGN(double speed, doubleAttr(ch, "speed", 0));
      LOOM_ASSIGN(double latency, doubleAttr(ch, "latency", 0));
      std::string guid = ch.attribute("guid").value();
      if (!guid.empty()) {
        char* end = nullptr;
        errno = 0;
        unsigned long long g = std::strtoull(guid.c_str(), &end, 16);
        if (end == guid.c_str() || *end != '\0' || errno == ERANGE) {
          return fail(n.line, "<net> guid=\"{}\" is not a hex number", truncated(guid.c_str()));
        }
        n.guid = g;
      }
      n.dev = static_cast<int>(dev);
      n.port = static_cast<int>(port);
      n.gdr = gdr != 0;
      n.speedGBs = speed / 8000.0;
      n.latencyUs = latency;
      graph_.addNode(std::move(n));
    }
    return Status::ok();
  }

  std::string_view text_;
  std::vector<size_t> newlines_;  // offsets of '\n', then npos
  std::string source_;
  Graph graph_;
};

void setAttrs(pugi::xml_node x, const Attrs& attrs) {
  for (const auto& [k, v] : attrs) x.append_attribute(k.c_str()).set_value(v.c_str());
}

void exportNode(const Graph& g, int i, pugi::xml_node parent) {
  const Node& n = g.node(i);
  if (n.synthetic) return;
  pugi::xml_node self = parent;
  if (n.hasPci) {
    self = parent.append_child("pci");
    setAttrs(self, n.pciAttrs);
  }
  // The node's own element (<gpu>, <nic>) is written where the first thing it holds was read, so
  // that link elements and ports keep their order through a round trip even when a <pci> mixes
  // <pcilink> or <pci> children with them (seen in fuzzed files).
  const bool lazy = n.hasPci && !n.elemTag.empty();
  pugi::xml_node elem = self;
  bool made = false;
  auto makeElem = [&]() {
    if (made) return;
    elem = self.append_child(n.elemTag.c_str());
    setAttrs(elem, n.attrs);
    made = true;
  };
  if (!n.elemTag.empty() && !lazy) makeElem();
  for (const LinkElement& e : n.linkElements) {
    // <pcilink> belongs to the <pci>; <nvlink> and <c2c> to the <gpu>.
    if (e.tag == "pcilink") {
      setAttrs(self.append_child(e.tag.c_str()), e.attrs);
      continue;
    }
    if (lazy) makeElem();
    setAttrs(elem.append_child(e.tag.c_str()), e.attrs);
  }
  // Ports go in the <nic>; devices under a <pci> in the <pci>; under a cpu in the <cpu>.
  for (int c : n.children) {
    bool port = n.type == NodeType::kNic && g.node(c).type == NodeType::kNet;
    if (port && lazy) makeElem();
    exportNode(g, c, (!n.hasPci || port) ? elem : self);
  }
  if (lazy) makeElem();
}

}  // namespace

Result<Graph> importXmlString(std::string_view text, const std::string& source) {
  if (text.size() > kMaxXmlBytes) {
    return LOOM_ERROR(kInvalidArgument, "{}: {} bytes is larger than the {} bytes allowed", source,
                      text.size(), kMaxXmlBytes);
  }
  return Importer(text, source).run();
}

Result<Graph> importXmlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return systemError("cannot open topology file " + path, errno);
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxXmlBytes) {
      return LOOM_ERROR(kInvalidArgument, "{}: larger than the {} bytes allowed", path,
                        kMaxXmlBytes);
    }
  }
  return importXmlString(text, path);
}

std::string exportXmlString(const Graph& graph) {
  pugi::xml_document doc;
  pugi::xml_node sys = doc.append_child("system");
  sys.append_attribute("version").set_value("1");
  for (int i = 0; i < graph.size(); i++) {
    if (graph.node(i).parent < 0) exportNode(graph, i, sys);
  }
  std::ostringstream os;
  doc.save(os, "  ", pugi::format_indent | pugi::format_no_declaration, pugi::encoding_utf8);
  return os.str();
}

Status exportXmlFile(const Graph& graph, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return systemError("cannot write topology file " + path, errno);
  out << exportXmlString(graph);
  out.close();
  if (!out) return systemError("cannot write topology file " + path, errno);
  return Status::ok();
}

}  // namespace loom::topo
