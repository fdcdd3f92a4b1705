// Discovery of network devices: InfiniBand / RoCE devices (libibverbs, loaded at run time, lists
// them and gives their GUID; the kernel's sysfs gives each port's state, link layer and rate, the
// same values ibv_query_port returns) and network interfaces (sysfs).
#include <dlfcn.h>

#include <cstdlib>
#include <memory>

#include "src/core/log.h"
#include "topology/discover_internal.h"

namespace loom::topo::detail {

namespace {

struct DlCloser {
  void operator()(void* h) const {
    if (h) dlclose(h);
  }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

// NCCL's socket default when an interface does not report its speed (virtio, link down).
constexpr long long kDefaultSpeedMbps = 10000;

struct NetEntry {
  int nic = -1;                      // raw node of the adapter
  Attrs attrs;                       // without dev (numbered at the end)
  std::vector<std::string> netdevs;  // interfaces of the same function (RoCE)
};

// The adapter node for a device whose sysfs "device" link resolves to devPath: its PCI node when
// that is a NIC, else a <nic> directly under the CPU (as NCCL does for a NIC it cannot place).
int nicNodeFor(Builder& b, const std::string& devPath, const std::string& what) {
  std::string busId = pciBusIdOfSysfsPath(devPath);
  int pci = busId.empty() ? -1 : b.findPci(busId);
  if (pci >= 0 && b.raw.node(pci).type == NodeType::kNic) {
    Node& n = b.raw.mutableNode(pci);
    if (n.elemTag.empty()) n.elemTag = "nic";
    return pci;
  }
  int cpu = -1;
  if (pci >= 0) {
    cpu = b.raw.cpuOf(pci);
    b.skipped(fmt::format("{}: PCI device {} is not of a network class: placed under its CPU", what,
                          busId));
  } else {
    auto numa = devPath.empty() ? std::nullopt : readInt(devPath + "/numa_node");
    cpu = b.cpuForNuma(numa ? static_cast<int>(*numa) : -1);
  }
  Node n;
  n.type = NodeType::kNic;
  n.parent = cpu;
  n.elemTag = "nic";
  return b.raw.addNode(std::move(n));
}

// "100 Gb/sec (4X EDR)" -> 100000 Mb/s.
long long rateMbps(const std::string& rate) {
  char* end = nullptr;
  double gbps = std::strtod(rate.c_str(), &end);
  if (end == rate.c_str() || !(gbps > 0) || gbps > 1e6) return 0;
  return static_cast<long long>(gbps * 1000 + 0.5);
}

}  // namespace

std::optional<std::vector<IbDevice>> listVerbsDevices(Builder& b) {
  DlHandle lib(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL));
  if (!lib) {
    const char* err = dlerror();
    b.source(fmt::format("verbs: libibverbs.so.1 not loaded ({}): no InfiniBand/RoCE devices",
                         err ? err : "not found"));
    return std::nullopt;
  }
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  using GetName = const char* (*)(void*);
  using GetGuid = uint64_t (*)(void*);
  auto getList = reinterpret_cast<GetList>(dlsym(lib.get(), "ibv_get_device_list"));
  auto freeList = reinterpret_cast<FreeList>(dlsym(lib.get(), "ibv_free_device_list"));
  auto getName = reinterpret_cast<GetName>(dlsym(lib.get(), "ibv_get_device_name"));
  auto getGuid = reinterpret_cast<GetGuid>(dlsym(lib.get(), "ibv_get_device_guid"));
  if (!getList || !freeList || !getName || !getGuid) {
    b.source("verbs: libibverbs.so.1 lacks ibv_get_device_list/name/guid: skipped");
    return std::nullopt;
  }
  int n = 0;
  void** list = getList(&n);
  std::vector<IbDevice> devs;
  for (int i = 0; list && i < n; i++) {
    const char* name = getName(list[i]);
    // The GUID as NCCL writes it: the big-endian value read as a host integer.
    if (name) devs.push_back({name, getGuid(list[i])});
  }
  if (list) freeList(list);
  // Stays loaded, as NCCL leaves it: libibverbs caches its devices and providers in globals that
  // unloading would leak (and the IB transport loads it again anyway).
  (void)lib.release();
  b.source(fmt::format("verbs: {} InfiniBand/RoCE device(s)", devs.size()));
  return devs;
}

void addNetworks(Builder& b, const std::optional<std::vector<IbDevice>>& ib) {
  std::vector<NetEntry> nets;
  std::string maxconn = "131072";  // NCCL's IB plugin
  for (const IbDevice& d : ib.value_or(std::vector<IbDevice>())) {
    std::string dir = b.sysRoot + "/class/infiniband/" + d.name;
    std::string devPath = realPath(dir + "/device");
    std::vector<std::string> netdevs =
        devPath.empty() ? std::vector<std::string>() : listDir(devPath + "/net");
    int nic = -1;
    for (const std::string& p : listDir(dir + "/ports")) {
      std::string pdir = dir + "/ports/" + p;
      std::string state = readLine(pdir + "/state").value_or("");
      std::string layer = readLine(pdir + "/link_layer").value_or("");
      long long mbps = rateMbps(readLine(pdir + "/rate").value_or(""));
      if (state.find("ACTIVE") == std::string::npos) {
        b.skipped(fmt::format("{} port {}: state \"{}\", not active", d.name, p, state));
        continue;
      }
      if (nic < 0) nic = nicNodeFor(b, devPath, d.name);
      NetEntry e;
      e.nic = nic;
      e.netdevs = netdevs;
      e.attrs = {{"name", d.name},
                 {"speed", std::to_string(mbps)},
                 {"port", p},
                 {"latency", "0.000000"},
                 {"guid", fmt::format("{:#x}", d.guid)},
                 {"maxconn", maxconn},
                 {"gdr", b.gdrDriver ? "1" : "0"},
                 {"link_layer", layer}};
      nets.push_back(std::move(e));
    }
  }
  const size_t ibNets = nets.size();

  for (const std::string& ifname : listDir(b.sysRoot + "/class/net")) {
    if (ifname == "lo") continue;
    std::string devPath = realPath(b.sysRoot + "/class/net/" + ifname + "/device");
    if (devPath.empty()) {
      b.skipped(fmt::format("{}: virtual interface (no device)", ifname));
      continue;
    }
    bool carried = false;
    for (size_t i = 0; i < ibNets && !carried; i++) {
      for (const std::string& nd : nets[i].netdevs) carried |= nd == ifname;
      if (carried) {
        b.skipped(
            fmt::format("{}: carried by {} (RoCE)", ifname, *findAttr(nets[i].attrs, "name")));
      }
    }
    if (carried) continue;
    auto speed = readInt(b.sysRoot + "/class/net/" + ifname + "/speed");
    long long mbps = speed.value_or(0);
    if (mbps <= 0) {
      mbps = kDefaultSpeedMbps;
      b.skipped(fmt::format("{}: speed not reported (virtual NIC or link down): {} Mb/s assumed",
                            ifname, mbps));
    }
    NetEntry e;
    e.nic = nicNodeFor(b, devPath, ifname);
    e.attrs = {{"name", ifname}, {"speed", std::to_string(mbps)},
               {"port", "0"},    {"latency", "0.000000"},
               {"guid", ""},     {"maxconn", "65536"},
               {"gdr", "0"}};
    nets.push_back(std::move(e));
  }

  // dev: IB ports first (NCCL prefers its IB plugin), then sockets.
  for (size_t i = 0; i < nets.size(); i++) {
    Node n;
    n.type = NodeType::kNet;
    n.parent = nets[i].nic;
    n.elemTag = "net";
    n.attrs = nets[i].attrs;
    n.attrs.insert(n.attrs.begin() + 1, {"dev", std::to_string(i)});
    // NCCL's socket plugin uses the device index as the GUID (distinct adapters).
    for (auto& [k, v] : n.attrs) {
      if (k == "guid" && v.empty()) v = fmt::format("{:#x}", i);
    }
    b.raw.addNode(std::move(n));
  }
  b.source(fmt::format("sysfs: {} network port(s) ({} InfiniBand/RoCE, {} interface(s))",
                       nets.size(), ibNets, nets.size() - ibNets));
}

}  // namespace loom::topo::detail
