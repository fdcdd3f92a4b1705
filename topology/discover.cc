#include "topology/discover.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "topology/discover_internal.h"
#include "topology/xml.h"

namespace loom::topo {

namespace {

bool isHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// Strict DDDD:BB:DD.F (the spelling of sysfs directory names).
bool isSysfsBdf(const std::string& s) {
  if (s.size() != 12) return false;
  for (size_t i = 0; i < s.size(); i++) {
    char want = (i == 4 || i == 7) ? ':' : (i == 10 ? '.' : 'x');
    if (want == 'x' ? !isHex(s[i]) : s[i] != want) return false;
  }
  return true;
}

// The environment variable of a parameter, or its NCCL_ name when Loom's is unset.
std::string paramOrNccl(const Param& p, const char* ncclName, std::string* from) {
  if (p.isSet() && !p.str().empty()) {
    *from = p.name();
    return p.str();
  }
  const char* v = std::getenv(ncclName);
  if (v != nullptr && v[0] != '\0') {
    *from = ncclName;
    return v;
  }
  return "";
}

}  // namespace

std::string cpumaskString(const std::vector<int>& cpus, int minCpus) {
  int maxCpu = std::min(minCpus, 1 << 20) - 1;
  for (int c : cpus) maxCpu = std::max(maxCpu, c);
  int words = maxCpu < 0 ? 1 : maxCpu / 32 + 1;
  std::vector<uint32_t> w(words, 0);
  for (int c : cpus) {
    if (c >= 0) w[c / 32] |= 1u << (c % 32);
  }
  std::string s;
  for (int i = words - 1; i >= 0; i--) {
    if (!s.empty()) s += ',';
    s += fmt::format("{:08x}", w[i]);
  }
  return s;
}

Result<std::vector<int>> parseCpumask(const std::string& mask) {
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    size_t comma = mask.find(',', start);
    words.push_back(mask.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (words.size() > 4096) return LOOM_ERROR(kInvalidArgument, "cpumask too long");
  std::vector<int> cpus;
  for (size_t i = 0; i < words.size(); i++) {
    const std::string& w = words[i];
    std::string digits = w.rfind("0x", 0) == 0 ? w.substr(2) : w;
    if (digits.empty() || digits.size() > 8 || !std::all_of(digits.begin(), digits.end(), isHex)) {
      return LOOM_ERROR(kInvalidArgument, "\"{}\" is not a cpumask (32-bit hex words)",
                        mask.size() > 40 ? mask.substr(0, 40) + "..." : mask);
    }
    uint32_t v = static_cast<uint32_t>(std::strtoul(digits.c_str(), nullptr, 16));
    int base = static_cast<int>(words.size() - 1 - i) * 32;
    for (int bit = 0; bit < 32; bit++) {
      if (v & (1u << bit)) cpus.push_back(base + bit);
    }
  }
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

std::string normalizeBusId(const std::string& text) {
  // [domain:]bus:dev.fn with a domain of up to 8 hex digits.
  std::string s = asciiLower(text);
  size_t dot = s.rfind('.');
  size_t c2 = s.rfind(':');
  if (dot == std::string::npos || c2 == std::string::npos || c2 > dot) return "";
  size_t c1 = c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
  std::string dom = c1 == std::string::npos ? "0" : s.substr(0, c1);
  std::string bus =
      s.substr(c1 == std::string::npos ? 0 : c1 + 1, c2 - (c1 == std::string::npos ? 0 : c1 + 1));
  std::string dev = s.substr(c2 + 1, dot - c2 - 1);
  std::string fn = s.substr(dot + 1);
  auto hexOk = [](const std::string& x, size_t maxLen) {
    return !x.empty() && x.size() <= maxLen && std::all_of(x.begin(), x.end(), isHex);
  };
  if (!hexOk(dom, 8) || !hexOk(bus, 2) || !hexOk(dev, 2) || !hexOk(fn, 1)) return "";
  unsigned long d = std::strtoul(dom.c_str(), nullptr, 16);
  return fmt::format("{:04x}:{:02x}:{:02x}.{}", d, std::strtoul(bus.c_str(), nullptr, 16),
                     std::strtoul(dev.c_str(), nullptr, 16), fn);
}

std::string pciBusIdOfSysfsPath(const std::string& path) {
  std::string last;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string comp =
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (isSysfsBdf(comp)) last = asciiLower(comp);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return last;
}

namespace detail {

int Builder::cpuForNuma(int numa) const {
  for (int c : cpus) {
    if (raw.node(c).numaId == numa) return c;
  }
  return cpus.empty() ? -1 : cpus[0];
}

void Builder::source(std::string line) {
  LOOM_INFO(kSubTopo, "discovery: {}", line);
  if (info) info->sources.push_back(std::move(line));
}

void Builder::skipped(std::string line) {
  LOOM_INFO(kSubTopo, "discovery: {}", line);
  if (info) info->skipped.push_back(std::move(line));
}

std::optional<std::string> readLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line) && !in.eof()) return std::nullopt;
  if (line.size() > 4096) line.resize(4096);
  size_t b = line.find_first_not_of(" \t\r\n");
  size_t e = line.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : line.substr(b, e - b + 1);
}

std::optional<long long> readInt(const std::string& path, int base) {
  auto s = readLine(path);
  if (!s || s->empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s->c_str(), &end, base);
  if (end == s->c_str() || errno == ERANGE) return std::nullopt;
  return v;
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> r;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return r;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") r.push_back(n);
  }
  ::closedir(d);
  std::sort(r.begin(), r.end());
  return r;
}

NodeType typeOfClass(uint32_t pciClass) {
  if (pciClass == 0x068000) return NodeType::kNvSwitch;
  if ((pciClass >> 16) == 0x03) return NodeType::kGpu;
  if ((pciClass >> 16) == 0x02) return NodeType::kNic;
  return NodeType::kPciSwitch;
}

namespace {
// "16.0 GT/s PCIe" -> 16; nullopt when empty or not a speed.
std::optional<double> gts(const std::optional<std::string>& s) {
  if (!s || s->empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s->c_str(), &end);
  if (end == s->c_str() || !(v > 0)) return std::nullopt;
  return v;
}
}  // namespace

int addPciNode(Builder& b, const std::string& busId, int parent, const PciIds& ids) {
  if (b.findPci(busId) >= 0) return -1;
  std::string dir = b.sysRoot + "/bus/pci/devices/" + busId;
  uint32_t cls = ids.classId;
  if (auto c = readInt(dir + "/class", 16)) cls = static_cast<uint32_t>(*c) & 0xffffff;
  uint16_t vendor = static_cast<uint16_t>(readInt(dir + "/vendor", 16).value_or(ids.vendor));
  if ((cls >> 16) == 0x03 && vendor != 0x10de && vendor != 0x1002) {
    // A BMC's VGA controller and the like: not a GPU a collective can use. NCCL's own dumps list
    // only CUDA GPUs; keeping it would make it a <pci> of GPU class.
    b.skipped(fmt::format(
        "display device {} (vendor {:#06x}) is not an NVIDIA or AMD GPU: left out", busId, vendor));
    return -1;
  }
  auto hexId = [&](const char* file, uint16_t fallback) {
    auto v = readInt(dir + "/" + file, 16);
    return fmt::format("0x{:04x}", v ? static_cast<uint16_t>(*v) : fallback);
  };
  // NCCL writes the lower of the device's and its upstream port's maximum speed and width: the
  // current values drop while a GPU idles.
  std::string up = realPath(dir);
  up = up.empty() ? "" : up.substr(0, up.rfind('/'));
  auto devSpeed = readLine(dir + "/max_link_speed");
  auto upSpeed = up.empty() ? std::nullopt : readLine(up + "/max_link_speed");
  std::string speed;
  if (gts(devSpeed) && (!gts(upSpeed) || *gts(devSpeed) <= *gts(upSpeed))) {
    speed = *devSpeed;
  } else if (gts(upSpeed)) {
    speed = *upSpeed;
  }
  auto devWidth = readInt(dir + "/max_link_width");
  auto upWidth = up.empty() ? std::nullopt : readInt(up + "/max_link_width");
  long long width = 0;
  if (devWidth && *devWidth > 0) width = *devWidth;
  if (upWidth && *upWidth > 0 && (width == 0 || *upWidth < width)) width = *upWidth;
  if (width > 64) width = 0;

  Node n;
  n.type = typeOfClass(cls);
  n.parent = parent;
  n.hasPci = true;
  n.busId = busId;
  n.pciClass = cls;
  n.pciAttrs = {{"busid", busId},
                {"class", fmt::format("0x{:06x}", cls)},
                {"vendor", hexId("vendor", ids.vendor)},
                {"device", hexId("device", ids.device)},
                {"subsystem_vendor", hexId("subsystem_vendor", ids.subVendor)},
                {"subsystem_device", hexId("subsystem_device", ids.subDevice)},
                {"link_speed", speed},
                {"link_width", std::to_string(width)}};
  return b.raw.addNode(std::move(n));
}

namespace {

std::string hostName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace

}  // namespace detail

Result<Graph> discoverLocal(HostInfo* info) {
  HostInfo localInfo;
  detail::Builder b;
  b.info = info ? info : &localInfo;
  *b.info = HostInfo();
  b.info->hostname = detail::hostName();
  if (!detail::addHwloc(b)) detail::addFallbackCpuAndPci(b);
  if (b.cpus.empty()) {
    return LOOM_ERROR(kInternal, "topology discovery found no CPU at all");
  }
  b.gdrDriver = !detail::listDir(b.sysRoot + "/module/nvidia_peermem").empty() ||
                !detail::listDir(b.sysRoot + "/module/nv_peer_mem").empty() ||
                detail::readLine(b.sysRoot + "/kernel/mm/memory_peers/nv_mem/version").has_value();
  detail::addGpus(b);
  detail::addNetworks(b, detail::listVerbsDevices(b));
  // One interpretation path for files and discovery: see discover_internal.h.
  std::string xml = exportXmlString(b.raw);
  auto g = importXmlString(xml, "discovered topology");
  if (!g.isOk()) return g.status().withContext("discovery built an invalid topology (a bug)");
  LOOM_INFO(kSubTopo, "discovered {} CPU(s), {} GPU(s), {} NIC(s), {} port(s), {} nodes",
            g.value().count(NodeType::kCpu), g.value().count(NodeType::kGpu),
            g.value().count(NodeType::kNic), g.value().count(NodeType::kNet), g.value().size());
  return g;
}

bool topologyFilesNamed() {
  std::string from;
  return !paramOrNccl(params::kTopoFile, "NCCL_TOPO_FILE", &from).empty() ||
         !paramOrNccl(params::kTopoDumpFile, "NCCL_TOPO_DUMP_FILE", &from).empty();
}

Result<Graph> loadLocalTopology(HostInfo* info, std::string* source) {
  std::string from;
  std::string file = paramOrNccl(params::kTopoFile, "NCCL_TOPO_FILE", &from);
  if (!file.empty()) LOOM_INFO(kSubTopo, "topology from {} ({}) instead of discovery", file, from);
  Result<Graph> g = file.empty() ? discoverLocal(info) : importXmlFile(file);
  if (!g.isOk()) {
    return file.empty() ? g.status() : g.status().withContext("topology file named by " + from);
  }
  if (source) *source = file.empty() ? std::string("discovered") : "file " + file;
  std::string dumpFrom;
  std::string dump = paramOrNccl(params::kTopoDumpFile, "NCCL_TOPO_DUMP_FILE", &dumpFrom);
  if (!dump.empty()) {
    LOOM_TRY(exportXmlFile(g.value(), dump).withContext("topology dump file named by " + dumpFrom));
    LOOM_INFO(kSubTopo, "topology written to {} ({})", dump, dumpFrom);
  }
  return g;
}

}  // namespace loom::topo
