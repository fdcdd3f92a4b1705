// Discovery of GPUs (the CUDA driver, loaded at run time by src/device/cuda_driver.h) and their
// NVLinks (NVML, loaded here at run time), so that the library runs where neither exists. Only the
// few NVML entry points used are declared here; their signatures are part of NVIDIA's stable ABI.
#include <dlfcn.h>

#include <map>
#include <memory>

#include "src/core/dl.h"
#include "src/core/log.h"
#include "src/device/cuda_driver.h"
#include "topology/discover_internal.h"

namespace loom::topo::detail {

namespace {

using loom::DlHandle;

template <typename F>
F sym(void* lib, const char* name) {
  return loom::dlSymbol<F>(lib, name);
}

// NVML.
struct NvmlPciInfo {  // nvmlPciInfo_t (v2/v3 layout)
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kNvmlMaxLinks = 18;    // NVML_NVLINK_MAX_LINKS
constexpr int kNvmlDeviceTypeIbmNpu = 1;  // NVML_NVLINK_DEVICE_TYPE_IBMNPU (a POWER9 CPU)

struct Gpu {
  std::string busId;
  int cudaDev = -1;
  int sm = 0;
  bool dmaBuf = false;
};

std::vector<Gpu> cudaGpus(Builder& b) {
  const cuda::Driver& d = cuda::cudaDriver();
  if (!d.ok()) {
    b.source("CUDA: " + d.status.message() + ": no GPUs");
    return {};
  }
  std::vector<Gpu> gpus;
  for (int i = 0; i < d.devices; i++) {
    int dev = 0;
    char bus[64] = {0};
    if (d.api.cuDeviceGet(&dev, i) != cuda::kSuccess ||
        d.api.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev) != cuda::kSuccess)
      continue;
    int major = 0, minor = 0, dmaBuf = 0;
    d.api.cuDeviceGetAttribute(&major, cuda::kAttrComputeCapabilityMajor, dev);
    d.api.cuDeviceGetAttribute(&minor, cuda::kAttrComputeCapabilityMinor, dev);
    if (d.api.cuDeviceGetAttribute(&dmaBuf, cuda::kAttrDmaBufSupported, dev) != cuda::kSuccess)
      dmaBuf = 0;
    Gpu g;
    g.busId = normalizeBusId(bus);
    g.cudaDev = i;
    g.sm = major * 10 + minor;
    g.dmaBuf = dmaBuf != 0;
    if (!g.busId.empty()) gpus.push_back(g);
  }
  b.source(fmt::format("CUDA: {} GPU(s) ({})", gpus.size(), d.library));
  return gpus;
}

class Nvml {
 public:
  bool load(Builder& b) {
    lib_.reset(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
    if (!lib_) {
      b.source("NVML: libnvidia-ml.so.1 not loaded: no NVLink information");
      return false;
    }
    init_ = sym<Fn0>(lib_.get(), "nvmlInit_v2");
    shutdown_ = sym<Fn0>(lib_.get(), "nvmlShutdown");
    byBus_ = sym<ByBus>(lib_.get(), "nvmlDeviceGetHandleByPciBusId_v2");
    index_ = sym<Index>(lib_.get(), "nvmlDeviceGetIndex");
    state_ = sym<LinkInt>(lib_.get(), "nvmlDeviceGetNvLinkState");
    remote_ = sym<Remote>(lib_.get(), "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    remoteType_ = sym<LinkInt>(lib_.get(), "nvmlDeviceGetNvLinkRemoteDeviceType");  // optional
    if (!init_ || !shutdown_ || !byBus_ || !index_ || !state_ || !remote_) {
      b.source("NVML: libnvidia-ml.so.1 lacks the NVLink entry points: no NVLink information");
      return false;
    }
    int rc = init_();
    if (rc != 0) {
      b.source(fmt::format("NVML: nvmlInit failed (nvmlReturn {}): no NVLink information", rc));
      return false;
    }
    initialized_ = true;
    return true;
  }
  ~Nvml() {
    if (initialized_) shutdown_();
  }

  // NVML index of a GPU, or -1.
  int index(const std::string& busId, void** handle) {
    if (byBus_(busId.c_str(), handle) != 0) return -1;
    unsigned idx = 0;
    return index_(*handle, &idx) == 0 ? static_cast<int>(idx) : -1;
  }

  // Active links: far-end bus id -> (count, far-end NVML device type or -1).
  std::map<std::string, std::pair<int, int>> links(void* handle) {
    std::map<std::string, std::pair<int, int>> r;
    for (unsigned l = 0; l < kNvmlMaxLinks; l++) {
      int active = 0;
      if (state_(handle, l, &active) != 0 || active == 0) continue;
      NvmlPciInfo pci{};
      if (remote_(handle, l, &pci) != 0) continue;
      std::string target = normalizeBusId(pci.busId);
      if (target.empty()) continue;
      int type = -1;
      if (remoteType_ && remoteType_(handle, l, &type) != 0) type = -1;
      auto& e = r[target];
      e.first++;
      e.second = type;
    }
    return r;
  }

 private:
  using Fn0 = int (*)();
  using ByBus = int (*)(const char*, void**);
  using Index = int (*)(void*, unsigned*);
  using LinkInt = int (*)(void*, unsigned, int*);
  using Remote = int (*)(void*, unsigned, NvmlPciInfo*);
  DlHandle lib_;
  Fn0 init_ = nullptr, shutdown_ = nullptr;
  ByBus byBus_ = nullptr;
  Index index_ = nullptr;
  LinkInt state_ = nullptr, remoteType_ = nullptr;
  Remote remote_ = nullptr;
  bool initialized_ = false;
};

}  // namespace

void addGpus(Builder& b) {
  std::vector<Gpu> gpus = cudaGpus(b);
  if (gpus.empty()) return;
  Nvml nvml;
  bool haveNvml = nvml.load(b);
  int links = 0;
  for (const Gpu& g : gpus) {
    int id = b.findPci(g.busId);
    if (id < 0 || b.raw.node(id).type != NodeType::kGpu) {
      b.skipped(
          fmt::format("CUDA device {} ({}) is not in the PCI tree: left out", g.cudaDev, g.busId));
      continue;
    }
    void* handle = nullptr;
    int dev = haveNvml ? nvml.index(g.busId, &handle) : -1;
    if (dev < 0) dev = g.cudaDev;
    Node& n = b.raw.mutableNode(id);
    n.elemTag = "gpu";
    // rank: NCCL writes the rank that owns the GPU and ignores a GPU without one; a machine dump
    // has no ranks, so each GPU gets its index and NCCL sees them all.
    n.attrs = {{"dev", std::to_string(dev)},
               {"sm", std::to_string(g.sm)},
               {"rank", std::to_string(dev)},
               {"gdr", (b.gdrDriver || g.dmaBuf) ? "1" : "0"}};
    if (handle == nullptr) continue;
    for (const auto& [target, cl] : nvml.links(handle)) {
      std::string tclass;
      if (auto c = readInt(b.sysRoot + "/bus/pci/devices/" + target + "/class", 16)) {
        tclass = fmt::format("0x{:06x}", static_cast<uint32_t>(*c) & 0xffffff);
      } else if (cl.second == kNvmlDeviceTypeIbmNpu) {
        tclass = "0x068001";
      } else {
        // Invisible far end (an NVSwitch in a VM, or reported as one): NCCL's NVSwitch class.
        tclass = "0x068000";
      }
      b.raw.mutableNode(id).linkElements.push_back(
          {"nvlink",
           {{"target", target}, {"count", std::to_string(cl.first)}, {"tclass", tclass}},
           0});
      links += cl.first;
    }
  }
  if (haveNvml) b.source(fmt::format("NVML: {} active NVLink(s)", links));
}

}  // namespace loom::topo::detail
