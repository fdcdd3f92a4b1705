// Discovery of CPUs, NUMA nodes, caches and the PCI tree, from hwloc (with a sysconf() + sysfs
// fallback when hwloc cannot load a topology).
#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>

#include "src/core/log.h"
#include "topology/discover_internal.h"

namespace loom::topo::detail {

namespace {

const char* archName() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "arm64";
#elif defined(__powerpc64__)
  return "ppc64";
#else
  return "";
#endif
}

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string infoOf(hwloc_obj_t obj, const char* name) {
  const char* v = obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
  return v ? v : "";
}

std::string busIdOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", static_cast<unsigned>(p.domain), p.bus, p.dev,
                     p.func);
}

PciIds idsOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p) {
  PciIds ids;
  ids.classId = static_cast<uint32_t>(p.class_id) << 8;
  ids.vendor = p.vendor_id;
  ids.device = p.device_id;
  ids.subVendor = p.subvendor_id;
  ids.subDevice = p.subdevice_id;
  return ids;
}

bool hasPciDeviceBelow(hwloc_obj_t obj) {
  for (hwloc_obj_t c = obj->io_first_child; c; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_PCI_DEVICE) return true;
    if (c->type == HWLOC_OBJ_BRIDGE && hasPciDeviceBelow(c)) return true;
  }
  return false;
}

hwloc_obj_t firstPciDeviceBelow(hwloc_obj_t obj) {
  for (hwloc_obj_t c = obj->io_first_child; c; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_PCI_DEVICE) return c;
    if (c->type == HWLOC_OBJ_BRIDGE) {
      if (hwloc_obj_t d = firstPciDeviceBelow(c)) return d;
    }
  }
  return nullptr;
}

// NCCL's shape: a PCIe switch is one node, its upstream port. Bridges at odd depth below the host
// bridge (root ports, a switch's downstream ports) are folded into their parent.
void walk(Builder& b, hwloc_obj_t obj, int parent, int depth) {
  for (hwloc_obj_t c = obj->io_first_child; c; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_PCI_DEVICE) {
      addPciNode(b, busIdOf(c->attr->pcidev), parent, idsOf(c->attr->pcidev));
    } else if (c->type == HWLOC_OBJ_BRIDGE &&
               c->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
      if (!hasPciDeviceBelow(c)) continue;
      int d = depth + 1;
      int self = parent;
      if (d % 2 == 0) {
        const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p = c->attr->bridge.upstream.pci;
        int id = addPciNode(b, busIdOf(p), parent, idsOf(p));
        if (id >= 0) self = id;
      }
      walk(b, c, self, d);
    }
  }
}

void addCaches(hwloc_topology_t t, HostInfo& info) {
  struct Kind {
    hwloc_obj_type_t type;
    const char* name;
  };
  const Kind kinds[] = {{HWLOC_OBJ_L1CACHE, "L1d"}, {HWLOC_OBJ_L1ICACHE, "L1i"},
                        {HWLOC_OBJ_L2CACHE, "L2"},  {HWLOC_OBJ_L3CACHE, "L3"},
                        {HWLOC_OBJ_L4CACHE, "L4"},  {HWLOC_OBJ_L5CACHE, "L5"}};
  for (const Kind& k : kinds) {
    int n = hwloc_get_nbobjs_by_type(t, k.type);
    if (n <= 0) continue;
    hwloc_obj_t first = hwloc_get_obj_by_type(t, k.type, 0);
    CacheLevel c;
    c.name = k.name;
    if (k.type == HWLOC_OBJ_L1CACHE && first->attr->cache.type == HWLOC_OBJ_CACHE_UNIFIED) {
      c.name = "L1";
    }
    c.sizeBytes = first->attr->cache.size;
    c.count = n;
    info.caches.push_back(c);
  }
}

}  // namespace

bool addHwloc(Builder& b) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    b.source("hwloc: hwloc_topology_init failed; CPUs from sysconf(), PCI from sysfs");
    return false;
  }
  TopologyPtr t(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_icache_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
#if HWLOC_API_VERSION >= 0x00020100
  // PCI from hwloc's Linux sysfs backend rather than its libpciaccess plugin: the same devices,
  // without reading config space, and without the plugin's allocations that outlive its dlclose.
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  // hwloc's GPU and display plugins: Loom finds GPUs itself (the CUDA driver, NVML). Loading them
  // would start the GPU runtimes in every rank's process, and they unload them again: OpenCL's ICD
  // loader has thread-local storage, whose dlclose made LeakSanitizer's scan of the main thread's
  // TLS crash at exit ("Tracer caught signal 11") in the tests.
  for (const char* gpu : {"opencl", "cuda", "nvml", "rsmi", "levelzero", "gl"})
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, gpu);
#endif
  if (hwloc_topology_load(raw) != 0) {
    b.source("hwloc: hwloc_topology_load failed; CPUs from sysconf(), PCI from sysfs");
    return false;
  }
  HostInfo& info = *b.info;
  info.packages = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PACKAGE);
  info.numaNodes = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
  info.cores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
  info.pus = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU);
  addCaches(raw, info);
  hwloc_obj_t pkg0 = hwloc_get_obj_by_type(raw, HWLOC_OBJ_PACKAGE, 0);
  info.cpuModel = infoOf(pkg0, "CPUModel");

  // One <cpu> per NUMA node, with the vendor and CPUID of its package (NCCL's cpu attributes).
  for (int i = 0; i < info.numaNodes; i++) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, i);
    hwloc_obj_t pkg = numa->parent
                          ? hwloc_get_ancestor_obj_by_type(raw, HWLOC_OBJ_PACKAGE, numa->parent)
                          : nullptr;
    if (pkg == nullptr) pkg = pkg0;
    std::vector<int> cpus;
    if (numa->cpuset) {
      for (int c = hwloc_bitmap_first(numa->cpuset); c >= 0;
           c = hwloc_bitmap_next(numa->cpuset, c)) {
        cpus.push_back(c);
      }
    }
    Node n;
    n.type = NodeType::kCpu;
    n.elemTag = "cpu";
    n.numaId = static_cast<int>(numa->os_index);
    n.attrs = {{"numaid", std::to_string(numa->os_index)},
               {"affinity", readLine(fmt::format("{}/devices/system/node/node{}/cpumap", b.sysRoot,
                                                 numa->os_index))
                                .value_or(cpumaskString(cpus, info.pus))},
               {"arch", archName()},
               {"vendor", infoOf(pkg, "CPUVendor")},
               {"familyid", infoOf(pkg, "CPUFamilyNumber")},
               {"modelid", infoOf(pkg, "CPUModelNumber")}};
    b.cpus.push_back(b.raw.addNode(std::move(n)));
  }
  if (b.cpus.empty()) {
    b.source("hwloc: no NUMA node; CPUs from sysconf(), PCI from sysfs");
    return false;
  }

  int pciBefore = b.raw.size();
  for (hwloc_obj_t hb = hwloc_get_next_bridge(raw, nullptr); hb;
       hb = hwloc_get_next_bridge(raw, hb)) {
    if (hb->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_HOST) continue;
    int numa = -1;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(raw, hb);
    if (anc && anc->nodeset && hwloc_bitmap_weight(anc->nodeset) == 1) {
      numa = hwloc_bitmap_first(anc->nodeset);
    } else {
      // Locality wider than one NUMA node (sub-NUMA clustering, AMD NPS2/4): the kernel's
      // numa_node of a device below, else the first NUMA node of that locality.
      hwloc_obj_t dev = firstPciDeviceBelow(hb);
      if (dev) {
        numa = static_cast<int>(
            readInt(b.sysRoot + "/bus/pci/devices/" + busIdOf(dev->attr->pcidev) + "/numa_node")
                .value_or(-1));
      }
      if (numa < 0 && anc && anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset)) {
        numa = hwloc_bitmap_first(anc->nodeset);
      }
    }
    walk(b, hb, b.cpuForNuma(numa), 0);
  }
  b.source(fmt::format("hwloc {}: {} package(s), {} NUMA node(s), {} core(s), {} PCI node(s)",
                       HWLOC_VERSION, info.packages, info.numaNodes, info.cores,
                       b.raw.size() - pciBefore));
  return true;
}

void addFallbackCpuAndPci(Builder& b) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  std::vector<int> cpus;
  for (long i = 0; i < n && i < 65536; i++) cpus.push_back(static_cast<int>(i));
  b.info->pus = static_cast<int>(cpus.size());
  Node cpu;
  cpu.type = NodeType::kCpu;
  cpu.elemTag = "cpu";
  cpu.numaId = -1;
  cpu.attrs = {{"numaid", "-1"}, {"affinity", cpumaskString(cpus)}, {"arch", archName()}};
  b.cpus.push_back(b.raw.addNode(std::move(cpu)));
  b.info->numaNodes = 1;

  // The PCI tree from sysfs paths (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...), folded
  // the way walk() folds hwloc's: components at even positions (root ports, downstream ports) go.
  std::string dir = b.sysRoot + "/bus/pci/devices";
  std::vector<std::pair<std::vector<std::string>, std::string>> devs;  // ancestors, self
  for (const std::string& e : listDir(dir)) {
    std::string path = realPath(dir + "/" + e);
    std::vector<std::string> chain;
    size_t start = 0;
    while (start < path.size()) {
      size_t slash = path.find('/', start);
      std::string comp = path.substr(start, slash == std::string::npos ? slash : slash - start);
      if (!pciBusIdOfSysfsPath(comp).empty()) chain.push_back(pciBusIdOfSysfsPath(comp));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (chain.empty()) continue;
    std::string self = chain.back();
    chain.pop_back();
    devs.push_back({chain, self});
  }
  std::sort(devs.begin(), devs.end(),
            [](const auto& x, const auto& y) { return x.first.size() < y.first.size(); });
  int added = 0;
  for (const auto& [chain, self] : devs) {
    bool bridge = (readInt(dir + "/" + self + "/class", 16).value_or(0) >> 8) == 0x0604;
    if (bridge && chain.size() % 2 == 0) continue;  // folded
    int parent = b.cpus[0];
    for (size_t i = chain.size(); i-- > 0;) {
      if (i % 2 == 1 && b.findPci(chain[i]) >= 0) {
        parent = b.findPci(chain[i]);
        break;
      }
    }
    added += addPciNode(b, self, parent, PciIds()) >= 0;
  }
  b.source(fmt::format("sysfs fallback: {} CPU(s), {} PCI node(s)", cpus.size(), added));
}

}  // namespace loom::topo::detail
