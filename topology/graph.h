// The topology graph: devices of one host (CPU/NUMA domains, PCIe switches, GPUs, NICs and their
// ports, NVSwitches) and the links between them (type, bandwidth, latency). Import from NCCL XML
// (xml.h) and, later, discovery fill it; paths.h computes best paths over it.
//
// Nodes keep the XML tree they came from (parent, children, the attributes of their elements, in
// order) so that export writes back what was read, including attributes Loom does not interpret.
// Links are derived from that tree by buildLinks(): a Graph is not thread safe while it is built,
// and is read-only (safe to share) afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/core/status.h"

namespace loom::topo {

enum class NodeType : uint8_t {
  kCpu,        // one NUMA domain (<cpu>)
  kPciSwitch,  // a PCIe switch or bridge, or any <pci> device of a class Loom does not use
  kGpu,        // a <pci> of class 0x03xxxx and its <gpu> element (which may be absent)
  kNic,       // a network adapter: a <pci> of class 0x02xxxx with its <nic>, or a <nic> under a cpu
  kNet,       // one port of a NIC (<net>): the network endpoint
  kNvSwitch,  // a <pci> of class 0x068000, or the one NVSwitch made for invisible NVLink targets
};
const char* nodeTypeName(NodeType type);

enum class LinkType : uint8_t { kLoc, kNvl, kC2c, kPci, kSys, kNet };
const char* linkTypeName(LinkType type);

using Attrs = std::vector<std::pair<std::string, std::string>>;
// Value of attribute `name`, or nullptr when absent.
const std::string* findAttr(const Attrs& attrs, const std::string& name);

// An element that describes a link, not a device: <nvlink>, <c2c> (under <gpu>), <pcilink>.
struct LinkElement {
  std::string tag;
  Attrs attrs;
  int line = 0;
};

struct Node {
  NodeType type = NodeType::kPciSwitch;
  int parent = -1;  // enclosing node in the XML tree; -1 for a cpu (or a synthetic node)
  std::vector<int> children;
  int line = 0;  // line in the imported file (0: not imported)

  // XML as read. pciAttrs: the node's <pci> element (hasPci). elemTag/attrs: its own element
  // (cpu, gpu, nic, net; empty tag when a GPU or NIC <pci> has no such child).
  bool hasPci = false;
  Attrs pciAttrs;
  std::string elemTag;
  Attrs attrs;
  std::vector<LinkElement> linkElements;
  bool synthetic = false;  // made by import (the shared NVSwitch); never exported
  // The host the node belongs to (index into Graph::hosts()): files of several hosts (NCCL's dumps
  // of multi-node NVLink systems) mark each <cpu> with a host_hash, and bus ids repeat from host
  // to host. -1 for the NVSwitch fabric an NVLink domain's hosts share.
  int host = 0;

  // Interpreted facts.
  std::string busId;  // lower case; empty when the node has no <pci>
  uint32_t pciClass = 0;
  double pciBw = 0;  // GB/s of the PCIe link to the parent (NCCL's rounding)
  // cpu
  int numaId = -1;
  std::string arch, vendor;
  int familyId = -1, modelId = -1;
  // gpu
  int dev = -1;  // also the net's device index
  int sm = 0;
  int rank = -1;
  bool gdr = false;  // gpu and net
  // net
  std::string name;
  uint64_t guid = 0;
  int port = -1;
  double speedGBs = 0;  // speed (Mb/s) / 8000
  double latencyUs = 0;

  bool isCpuNic() const { return type == NodeType::kNic && !hasPci; }
};

struct Link {
  int from = -1;
  int to = -1;
  LinkType type = LinkType::kLoc;
  double bw = 0;  // GB/s, one direction
  double latencyUs = 0;
};

class Graph {
 public:
  // Appends a node and, when node.parent >= 0, registers it as a child of its parent and puts it
  // on its parent's host. The node's busId must be set before (it is indexed, per host, here) and
  // not changed after.
  int addNode(Node node);
  // The host of this host_hash ("" for a file without hashes), added when new; hosts are numbered
  // in order of their first cpu.
  int addHost(const std::string& hostHash);
  const std::vector<std::string>& hosts() const { return hosts_; }
  int hostCount() const { return hosts_.empty() ? 1 : static_cast<int>(hosts_.size()); }
  // Adds a directed link; a second link of the same type between the same nodes adds its
  // bandwidth to the first (NCCL does the same: several NVLinks to one NVSwitch add up).
  void addLink(int from, int to, LinkType type, double bw, double latencyUs = 0);
  void addBiLink(int a, int b, LinkType type, double bw, double latencyUs = 0) {
    addLink(a, b, type, bw, latencyUs);
    addLink(b, a, type, bw, latencyUs);
  }
  // Derives every link from the XML tree and link elements (PCIe tree, NVLink, C2C, pcilink,
  // CPU-to-CPU, NIC-to-port). Replaces links made before.
  Status buildLinks();

  int size() const { return static_cast<int>(nodes_.size()); }
  const Node& node(int i) const { return nodes_[i]; }
  Node& mutableNode(int i) { return nodes_[i]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  // Indices into links() of the links leaving node i.
  const std::vector<int>& linksFrom(int i) const { return out_[i]; }
  // The link from a to b of the given type, or nullptr.
  const Link* findLink(int a, int b, LinkType type) const;
  std::vector<int> nodesOfType(NodeType type) const;
  int count(NodeType type) const;
  // Node with this bus id (any case) on this host, or -1.
  int findByBusId(const std::string& busId, int host = 0) const;
  // The NIC a net belongs to / the CPU (NUMA domain) a node sits under; -1 if none.
  int cpuOf(int i) const;
  // "GPU dev 0 (0000:0f:00.0)" and the like, for messages.
  std::string describe(int i) const;

 private:
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;
  std::unordered_map<std::string, int> byBusId_;  // "host/busid"
  std::vector<std::string> hosts_;
};

// Empty when a and b hold the same nodes (with the same XML content) and the same links;
// otherwise a description of the first difference.
std::string diffGraphs(const Graph& a, const Graph& b);

// NCCL's numbers, used to turn XML attributes into bandwidths.
// PCIe: GB/s of `width` lanes at the sysfs speed string ("16.0 GT/s PCIe", "8 GT/s"); an empty or
// unknown speed counts as Gen3 and a width of 0 as 16, as NCCL does.
double pciBandwidth(const std::string& linkSpeed, int width);
// GB/s of one NVLink for a GPU of this compute capability (x10).
double nvlinkBandwidth(int sm);
// GB/s between two CPU sockets of this kind (arch, vendor, CPUID family and model).
double interCpuBandwidth(const std::string& arch, const std::string& vendor, int familyId,
                         int modelId);

}  // namespace loom::topo
