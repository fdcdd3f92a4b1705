// Discovery of GPUs (CUDA driver API) and their NVLinks (NVML), both loaded at run time so that
// the library runs where neither exists. Only the few C entry points used are declared here; their
// signatures are part of NVIDIA's stable driver ABI.
#include <dlfcn.h>

#include <map>
#include <memory>

#include "src/core/dl.h"
#include "src/core/log.h"
#include "topology/discover_internal.h"

namespace loom::topo::detail {

namespace {

using loom::DlHandle;

template <typename F>
F sym(void* lib, const char* name) {
  return loom::dlSymbol<F>(lib, name);
}

// CUDA driver API.
constexpr int kCuAttrCcMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kCuAttrCcMinor = 76;
constexpr int kCuAttrDmaBuf = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED

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
  DlHandle lib(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL));
  if (!lib) {
    b.source("CUDA: libcuda.so.1 not loaded: no GPUs");
    return {};
  }
  using Init = int (*)(unsigned);
  using GetCount = int (*)(int*);
  using Get = int (*)(int*, int);
  using GetBusId = int (*)(char*, int, int);
  using GetAttr = int (*)(int*, int, int);
  auto init = sym<Init>(lib.get(), "cuInit");
  auto count = sym<GetCount>(lib.get(), "cuDeviceGetCount");
  auto get = sym<Get>(lib.get(), "cuDeviceGet");
  auto busIdOf = sym<GetBusId>(lib.get(), "cuDeviceGetPCIBusId");
  auto attr = sym<GetAttr>(lib.get(), "cuDeviceGetAttribute");
  if (!init || !count || !get || !busIdOf || !attr) {
    b.source("CUDA: libcuda.so.1 lacks the driver API entry points: no GPUs");
    return {};
  }
  int rc = init(0);
  int n = 0;
  if (rc != 0 || count(&n) != 0) {
    b.source(fmt::format("CUDA: cuInit failed (CUresult {}): no GPUs", rc));
    return {};
  }
  std::vector<Gpu> gpus;
  for (int i = 0; i < n; i++) {
    int dev = 0;
    char bus[64] = {0};
    if (get(&dev, i) != 0 || busIdOf(bus, sizeof(bus) - 1, dev) != 0) continue;
    int major = 0, minor = 0, dmaBuf = 0;
    attr(&major, kCuAttrCcMajor, dev);
    attr(&minor, kCuAttrCcMinor, dev);
    if (attr(&dmaBuf, kCuAttrDmaBuf, dev) != 0) dmaBuf = 0;
    Gpu g;
    g.busId = normalizeBusId(bus);
    g.cudaDev = i;
    g.sm = major * 10 + minor;
    g.dmaBuf = dmaBuf != 0;
    if (!g.busId.empty()) gpus.push_back(g);
  }
  b.source(fmt::format("CUDA: {} GPU(s)", gpus.size()));
  // The library stays loaded: unloading the CUDA driver after cuInit is not supported.
  (void)lib.release();
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
