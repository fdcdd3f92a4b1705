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
struct IbDevice {
  std::string name;   // "mlx5_0"
  uint64_t guid = 0;  // ibv_get_device_guid(), as NCCL prints it
};
std::optional<std::vector<IbDevice>> listVerbsDevices(Builder& b);
// Active ports of those devices (state, link layer, rate from sysfs), then network interfaces
// (sysfs; an interface of a RoCE device is left to the device).
void addNetworks(Builder& b, const std::optional<std::vector<IbDevice>>& ib);
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
