// Internal to discovery (discover.cc, discover_hwloc.cc, discover_net.cc, discover_gpu.cc): the
// graph being built and the helpers its sources share. Not part of the topology API.
//
// Sources add raw nodes (type, parent, bus id, the XML attributes NCCL writes); discoverLocal()
// then exports the raw graph and imports it again, so that a discovered graph is interpreted by
// the one code path that interprets files (bandwidths, classes, links) and is, node for node, the
// graph its dump gives back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "topology/discover.h"
#include "topology/graph.h"

namespace loom::topo::detail {

struct Builder {
  Graph raw;
  std::vector<int> cpus;  // raw node ids of the <cpu> nodes, in NUMA order
  HostInfo* info = nullptr;
  std::string sysRoot = "/sys";  // tests point it at a fake tree
  bool gdrDriver = false;        // nvidia_peermem / nv_peer_mem loaded (GPUDirect RDMA possible)

  // The <cpu> node of this NUMA node; the first one when unknown.
  int cpuForNuma(int numa) const;
  // The raw node of a bus id, or -1.
  int findPci(const std::string& busId) const { return raw.findByBusId(busId); }
  void source(std::string line);
  void skipped(std::string line);
};

// Adds the <cpu> nodes and the PCI tree. Returns false (with a source line) when hwloc cannot load
// a topology; the caller then falls back to sysconf() and the sysfs PCI list.
bool addHwloc(Builder& b);
void addFallbackCpuAndPci(Builder& b);
// InfiniBand/RoCE devices as libibverbs lists them; nullopt when the library is absent.
struct IbPort {
  int port = 0;           // 1..phys_port_cnt
  std::string state;      // as sysfs writes it: "4: ACTIVE"
  bool active = false;    // IBV_PORT_ACTIVE
  std::string linkLayer;  // "InfiniBand", "Ethernet"
  long long mbps = 0;     // lanes x per-lane rate; 0 when a code is unknown (sysfs rate is used)
};
struct IbDevice {
  std::string name;   // "mlx5_0"
  uint64_t guid = 0;  // ibv_get_device_guid(), as NCCL prints it
  // Every port, from ibv_query_device/ibv_query_port; nullopt when those are missing or failed:
  // the ports are then read from /sys/class/infiniband/<name>/ports.
  std::optional<std::vector<IbPort>> ports;
};
std::optional<std::vector<IbDevice>> listVerbsDevices(Builder& b);
// Active ports of those devices (state, link layer, rate from verbs, else sysfs), then network
// interfaces (sysfs; an interface of a RoCE device is left to the device).
void addNetworks(Builder& b, const std::optional<std::vector<IbDevice>>& ib);

// ibv_port_attr codes as NCCL reads them. Lanes of active_width (1, 2, 4, 8, 16 -> 1x, 4x, 8x,
// 12x, 2x) and Mb/s per lane of active_speed (1 SDR 2500, 2 DDR 5000, 4 QDR 10000, 8 FDR10 10000,
// 16 FDR 14000, 32 EDR 25000, 64 HDR 50000, 128 NDR 100000, 256 XDR 200000); like NCCL the lowest
// known bit counts, but a code with no known bit gives 0 (NCCL would take the last entry).
int ibLanes(int activeWidth);
long long ibLaneMbps(int activeSpeed);
// Lanes x per-lane rate, the port speed NCCL uses ("4X HDR" -> 200000); 0 when a code is unknown.
long long ibRateMbps(int activeSpeed, int activeWidth);
// ibv_port_state as sysfs' ports/<n>/state writes it: 4 -> "4: ACTIVE", 9 -> "9: UNKNOWN".
std::string ibPortStateString(int state);
// ibv_port_attr::link_layer as sysfs' link_layer (and ibv_devinfo) names it: 0 (unspecified, older
// kernels) and 1 -> "InfiniBand", 2 -> "Ethernet", else "Unknown".
std::string ibLinkLayerString(int linkLayer);
// GPUs (CUDA driver) and their NVLinks (NVML).
void addGpus(Builder& b);

// A raw <pci> node for a device, with NCCL's attributes read from sysfs (class, ids, the link
// speed and width NCCL writes: the lower of the device's and its upstream port's maximum). `ids`
// are used when sysfs has no file for them. Returns the node id (or -1 for a duplicate).
struct PciIds {
  uint32_t classId = 0;  // 24-bit class, e.g. 0x020000
  uint16_t vendor = 0, device = 0, subVendor = 0, subDevice = 0;
};
int addPciNode(Builder& b, const std::string& busId, int parent, const PciIds& ids);
NodeType typeOfClass(uint32_t pciClass);

// First line of a file, whitespace-trimmed; nullopt when unreadable.
std::optional<std::string> readLine(const std::string& path);
std::optional<long long> readInt(const std::string& path, int base = 10);
// realpath(), or empty.
std::string realPath(const std::string& path);
// Entries of a directory (no . and ..), sorted; empty when unreadable.
std::vector<std::string> listDir(const std::string& path);

}  // namespace loom::topo::detail
