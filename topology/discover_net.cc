// Discovery of network devices: InfiniBand / RoCE devices and their ports (libibverbs, loaded at
// run time and never linked, lists the devices with their GUID and queries each port's state, link
// layer and rate; the kernel's sysfs gives the same port values when a verbs call is missing or
// fails) and network interfaces (sysfs).
#include <dlfcn.h>
// Only the struct and enum definitions are used: functions are resolved with dlvsym.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "src/core/dl.h"
#include "src/core/log.h"
#include "topology/discover_internal.h"

namespace loom::topo::detail {

namespace {

using loom::DlHandle;

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

// The symbol version these struct layouts belong to (libibverbs also exports IBVERBS_1.0 compat
// functions taking older structs); plain dlsym (the default version) for a library without it.
void* verbsSym(void* lib, const char* name) {
  void* f = dlvsym(lib, name, "IBVERBS_1.1");
  return f ? f : dlsym(lib, name);
}

// A verbs result struct with room after it: a library newer than these headers may fill a longer
// one (rdma-core grows ibv_port_attr).
template <typename T>
struct Padded {
  T v;
  unsigned char slack[256];
};

struct VerbsPortFns {
  ibv_context* (*open)(ibv_device*) = nullptr;
  int (*close)(ibv_context*) = nullptr;
  int (*queryDevice)(ibv_context*, ibv_device_attr*) = nullptr;
  // The exported IBVERBS_1.1 function (verbs.h's ibv_query_port is an inline wrapper around it).
  int (*queryPort)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
};

// Every port of a device, or nullopt with *why set.
std::optional<std::vector<IbPort>> queryPorts(const VerbsPortFns& fn, ibv_device* dev,
                                              std::string* why) {
  errno = 0;
  ibv_context* ctx = fn.open(dev);
  if (!ctx) {
    *why = fmt::format("ibv_open_device failed ({})", errno ? std::strerror(errno) : "no error");
    return std::nullopt;
  }
  std::optional<std::vector<IbPort>> ports;
  Padded<ibv_device_attr> da{};
  int rc = fn.queryDevice(ctx, &da.v);
  if (rc != 0) {
    *why = fmt::format("ibv_query_device failed ({})", std::strerror(rc));
  } else {
    ports.emplace();
    for (int p = 1; p <= da.v.phys_port_cnt; p++) {
      Padded<ibv_port_attr> pa{};
      rc = fn.queryPort(ctx, static_cast<uint8_t>(p), &pa.v);
      if (rc != 0) {
        *why = fmt::format("ibv_query_port({}) failed ({})", p, std::strerror(rc));
        ports.reset();
        break;
      }
      IbPort port;
      port.port = p;
      port.state = ibPortStateString(pa.v.state);
      port.active = pa.v.state == IBV_PORT_ACTIVE;
      port.linkLayer = ibLinkLayerString(pa.v.link_layer);
      port.mbps = ibRateMbps(pa.v.active_speed, pa.v.active_width);
      ports->push_back(std::move(port));
    }
  }
  fn.close(ctx);
  return ports;
}

}  // namespace

int ibLanes(int activeWidth) {
  static constexpr int kLanes[] = {1, 4, 8, 12, 2};  // bits 0..4: 1x, 4x, 8x, 12x, 2x
  for (int i = 0; i < 5; i++) {
    if (activeWidth & (1 << i)) return kLanes[i];
  }
  return 0;
}

long long ibLaneMbps(int activeSpeed) {
  // bits 0..8: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR (NCCL rounds FDR10 to QDR's 10000).
  static constexpr long long kMbps[] = {2500,  5000,  10000,  10000, 14000,
                                        25000, 50000, 100000, 200000};
  for (int i = 0; i < 9; i++) {
    if (activeSpeed & (1 << i)) return kMbps[i];
  }
  return 0;
}

long long ibRateMbps(int activeSpeed, int activeWidth) {
  return ibLaneMbps(activeSpeed) * ibLanes(activeWidth);
}

std::string ibPortStateString(int state) {
  static constexpr const char* kNames[] = {"NOP",   "DOWN",   "INIT",
                                           "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  const char* name = state >= 0 && state < 6 ? kNames[state] : "UNKNOWN";
  return fmt::format("{}: {}", state, name);
}

std::string ibLinkLayerString(int linkLayer) {
  switch (linkLayer) {
    case IBV_LINK_LAYER_UNSPECIFIED:
    case IBV_LINK_LAYER_INFINIBAND:
      return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET:
      return "Ethernet";
    default:
      return "Unknown";
  }
}

std::optional<std::vector<IbDevice>> listVerbsDevices(Builder& b) {
  DlHandle lib(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL));
  if (!lib) {
    const char* err = dlerror();
    b.source(fmt::format("verbs: libibverbs.so.1 not loaded ({}): no InfiniBand/RoCE devices",
                         err ? err : "not found"));
    return std::nullopt;
  }
  auto getList =
      reinterpret_cast<ibv_device** (*)(int*)>(verbsSym(lib.get(), "ibv_get_device_list"));
  auto freeList =
      reinterpret_cast<void (*)(ibv_device**)>(verbsSym(lib.get(), "ibv_free_device_list"));
  auto getName =
      reinterpret_cast<const char* (*)(ibv_device*)>(verbsSym(lib.get(), "ibv_get_device_name"));
  auto getGuid =
      reinterpret_cast<uint64_t (*)(ibv_device*)>(verbsSym(lib.get(), "ibv_get_device_guid"));
  if (!getList || !freeList || !getName || !getGuid) {
    b.source("verbs: libibverbs.so.1 lacks ibv_get_device_list/name/guid: skipped");
    return std::nullopt;
  }
  VerbsPortFns fn;
  fn.open = reinterpret_cast<decltype(fn.open)>(verbsSym(lib.get(), "ibv_open_device"));
  fn.close = reinterpret_cast<decltype(fn.close)>(verbsSym(lib.get(), "ibv_close_device"));
  fn.queryDevice =
      reinterpret_cast<decltype(fn.queryDevice)>(verbsSym(lib.get(), "ibv_query_device"));
  fn.queryPort = reinterpret_cast<decltype(fn.queryPort)>(verbsSym(lib.get(), "ibv_query_port"));
  std::string missing;
  for (auto [ok, name] : {std::pair<bool, const char*>{fn.open != nullptr, "ibv_open_device"},
                          {fn.close != nullptr, "ibv_close_device"},
                          {fn.queryDevice != nullptr, "ibv_query_device"},
                          {fn.queryPort != nullptr, "ibv_query_port"}}) {
    if (!ok) missing += (missing.empty() ? "" : ", ") + std::string(name);
  }

  int n = 0;
  ibv_device** list = getList(&n);
  std::vector<IbDevice> devs;
  int fromVerbs = 0;
  for (int i = 0; list && i < n; i++) {
    const char* name = getName(list[i]);
    if (!name) continue;
    IbDevice d;
    d.name = name;
    // The GUID as NCCL writes it: the big-endian value read as a host integer.
    d.guid = getGuid(list[i]);
    if (missing.empty()) {
      std::string why;
      d.ports = queryPorts(fn, list[i], &why);
      if (d.ports) {
        fromVerbs++;
      } else {
        b.source(fmt::format("verbs: {}: {}: its ports from sysfs", d.name, why));
      }
    }
    devs.push_back(std::move(d));
  }
  if (list) freeList(list);
  // Stays loaded, as NCCL leaves it: libibverbs caches its devices and providers in globals that
  // unloading would leak (and the IB transport loads it again anyway).
  (void)lib.release();
  if (!missing.empty()) {
    b.source(fmt::format(
        "verbs: {} InfiniBand/RoCE device(s); libibverbs.so.1 lacks {}: ports from sysfs",
        devs.size(), missing));
  } else {
    b.source(fmt::format(
        "verbs: {} InfiniBand/RoCE device(s); ports of {} from ibv_query_port, of {} from sysfs",
        devs.size(), fromVerbs, devs.size() - fromVerbs));
  }
  return devs;
}

void addNetworks(Builder& b, const std::optional<std::vector<IbDevice>>& ib) {
  std::vector<NetEntry> nets;
  std::string maxconn = "131072";  // NCCL's IB plugin
  size_t ibVerbsDevs = 0;          // devices whose ports verbs queried
  for (const IbDevice& d : ib.value_or(std::vector<IbDevice>())) {
    std::string dir = b.sysRoot + "/class/infiniband/" + d.name;
    std::string devPath = realPath(dir + "/device");
    std::vector<std::string> netdevs =
        devPath.empty() ? std::vector<std::string>() : listDir(devPath + "/net");
    std::vector<IbPort> ports;
    if (d.ports) {
      ports = *d.ports;
      ibVerbsDevs++;
    } else {
      for (const std::string& p : listDir(dir + "/ports")) {
        std::string pdir = dir + "/ports/" + p;
        IbPort port;
        port.port = std::atoi(p.c_str());
        port.state = readLine(pdir + "/state").value_or("");
        // As verbs says it (NCCL's test): ACTIVE_DEFER is not active.
        port.active = port.state == ibPortStateString(IBV_PORT_ACTIVE);
        port.linkLayer = readLine(pdir + "/link_layer").value_or("");
        port.mbps = rateMbps(readLine(pdir + "/rate").value_or(""));
        ports.push_back(std::move(port));
      }
    }
    int nic = -1;
    for (IbPort& port : ports) {
      if (!port.active) {
        b.skipped(
            fmt::format("{} port {}: state \"{}\", not active", d.name, port.port, port.state));
        continue;
      }
      if (port.mbps <= 0 && d.ports) {
        // A speed or width code newer than this table (XDR is only in active_speed_ex).
        port.mbps =
            rateMbps(readLine(fmt::format("{}/ports/{}/rate", dir, port.port)).value_or(""));
        b.skipped(fmt::format("{} port {}: rate unknown to verbs: {} Mb/s from sysfs", d.name,
                              port.port, port.mbps));
      }
      if (nic < 0) nic = nicNodeFor(b, devPath, d.name);
      NetEntry e;
      e.nic = nic;
      e.netdevs = netdevs;
      e.attrs = {{"name", d.name},
                 {"speed", std::to_string(port.mbps)},
                 {"port", std::to_string(port.port)},
                 {"latency", "0.000000"},
                 {"guid", fmt::format("{:#x}", d.guid)},
                 {"maxconn", maxconn},
                 {"gdr", b.gdrDriver ? "1" : "0"},
                 {"link_layer", port.linkLayer}};
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
  size_t ibDevs = ib ? ib->size() : 0;
  b.source(fmt::format(
      "network: {} port(s): {} InfiniBand/RoCE (attributes of {} device(s) from verbs, {} from "
      "sysfs), {} interface(s) (sysfs)",
      nets.size(), ibNets, ibVerbsDevs, ibDevs - ibVerbsDevs, nets.size() - ibNets));
}

}  // namespace loom::topo::detail
