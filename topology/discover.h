// Discovery of the local machine's topology, and the one entry point the runtime calls to get it
// (loadLocalTopology: a file named by LOOM_TOPO_FILE, or discovery, optionally dumped).
//
// Sources, each optional (a missing one is logged at INFO with subsystem TOPO and noted in
// HostInfo::sources; discovery still succeeds):
//   hwloc (linked)            CPU packages, NUMA nodes (one <cpu> each), cores, caches, the PCI
//   tree sysfs                     PCI class/vendor/device ids, link speed and width; network
//   interfaces libibverbs.so.1 (dlopen)  InfiniBand/RoCE devices: ports, state, link layer, rate,
//   GUID libcuda.so.1 (dlopen)     GPUs: bus id, compute capability, dma-buf support
//   libnvidia-ml.so.1 (dlopen) NVML index, NVLink peers and link counts
//
// The graph has the shape NCCL's own dump has (see topology-xml.md), so exportXmlString() of it is
// a file NCCL reads: PCIe switches are represented by their upstream port (root ports and
// downstream ports are folded away, as NCCL does), every PCI device hwloc reports is kept (devices
// of classes Loom does not use become plain <pci> elements, which NCCL ignores), and NICs carry
// <nic><net .../></nic> with NCCL's attributes.
//
// Thread safety: discovery functions may be called from any thread; they share no state.
#pragma once

#include <string>
#include <vector>

#include "src/core/status.h"
#include "topology/graph.h"

namespace loom::topo {

// Facts about the host that the NCCL format has no place for (loom-topo prints them).
struct CacheLevel {
  std::string name;        // "L1d", "L1i", "L2", "L3"
  uint64_t sizeBytes = 0;  // of one instance
  int count = 0;           // instances
};

struct HostInfo {
  std::string hostname;
  std::string cpuModel;  // "Intel(R) Xeon(R) Processor"; empty when unknown
  int packages = 0;
  int numaNodes = 0;
  int cores = 0;
  int pus = 0;  // hardware threads
  std::vector<CacheLevel> caches;
  // One line per source: "hwloc 2.9.0: ok", "verbs: libibverbs.so.1 not found", ...
  std::vector<std::string> sources;
  // Interfaces and devices seen but left out of the graph, with the reason.
  std::vector<std::string> skipped;
};

// Discovers this machine. Fails only when not even the CPU can be described (never in practice:
// without hwloc's topology a single <cpu> from sysconf() is used). `info` may be null.
Result<Graph> discoverLocal(HostInfo* info = nullptr);

// The topology the runtime uses: the file named by LOOM_TOPO_FILE (or NCCL_TOPO_FILE when
// LOOM_TOPO_FILE is unset) replaces discovery; otherwise discoverLocal(). Then, when
// LOOM_TOPO_DUMP_FILE (or NCCL_TOPO_DUMP_FILE) is set, the result is written there in NCCL's
// format. Errors: an unreadable or invalid topology file, or an unwritable dump file. `info` (may
// be null) is filled only by discovery; `source` (may be null) gets "file <path>" or "discovered".
Result<Graph> loadLocalTopology(HostInfo* info = nullptr, std::string* source = nullptr);
// True when the user named a topology file or a dump file (LOOM_ or NCCL_ TOPO_FILE or
// TOPO_DUMP_FILE): then a failure of loadLocalTopology() is theirs to fix, not discovery's.
bool topologyFilesNamed();

// ---- helpers shared by the discovery sources (exposed for tests) ----

// NCCL's cpumask string for a set of CPU numbers: 32-bit hex words, most significant first,
// comma separated ("00000000,000000ff"); "00000000" for an empty set. At least enough words for
// CPU numbers below minCpus (sysfs cpumap files have words for every possible CPU).
std::string cpumaskString(const std::vector<int>& cpus, int minCpus = 0);
// The CPU numbers of such a mask; an error for anything that is not one.
Result<std::vector<int>> parseCpumask(const std::string& mask);
// "0000:00:03.0" from a bus id in any spelling NVML or CUDA give ("00000000:1C:00.0"); empty when
// the text is not a bus id.
std::string normalizeBusId(const std::string& text);
// The last PCI bus id among the components of a sysfs path
// ("/sys/devices/pci0000:00/0000:00:03.0/virtio2" -> "0000:00:03.0"); empty when none.
std::string pciBusIdOfSysfsPath(const std::string& path);

}  // namespace loom::topo
