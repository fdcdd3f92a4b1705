#include "transports/ib/gdr.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/device/cuda_driver.h"

namespace loom {
namespace ib {
namespace {

using cuda::CUdeviceptr;
using cuda::CUresult;

// The CUDA driver's table (src/device/cuda_driver.h), or why it is unusable.
const cuda::Driver& driver() { return cuda::cudaDriver(); }

bool exists(const char* path) {
  struct stat st;
  return ::stat(path, &st) == 0;
}

}  // namespace

Status cudaDriverAvailable() { return driver().status; }

bool isGpuPointer(const void* data) {
  const cuda::Driver& d = driver();
  if (!d.ok()) return false;
  unsigned type = 0;
  return d.api.cuPointerGetAttribute(&type, cuda::kPointerAttrMemoryType,
                                     reinterpret_cast<CUdeviceptr>(data)) == cuda::kSuccess &&
         type == cuda::kMemoryTypeDevice;
}

std::string gpuPciPath(const void* data) {
  const cuda::Driver& d = driver();
  if (!d.ok()) return std::string();
  int ordinal = -1;
  if (d.api.cuPointerGetAttribute(&ordinal, cuda::kPointerAttrDeviceOrdinal,
                                  reinterpret_cast<CUdeviceptr>(data)) != cuda::kSuccess)
    return std::string();
  return gpuPciPathOf(ordinal);
}

bool gdrReachesEveryGpu(const std::string& nicPath) {
  const cuda::Driver& d = driver();
  int count = 0;
  if (!d.ok() || d.api.cuDeviceGetCount(&count) != cuda::kSuccess || count == 0) return false;
  for (int i = 0; i < count; ++i)
    if (pciDistance(gpuPciPathOf(i), nicPath) > gdrLevelParam()) return false;
  return true;
}

std::string gpuPciPathOf(int ordinal) {
  const cuda::Driver& d = driver();
  int dev = -1;
  if (!d.ok() || d.api.cuDeviceGet(&dev, ordinal) != cuda::kSuccess) return std::string();
  char bus[64] = {};
  if (d.api.cuDeviceGetPCIBusId(bus, sizeof(bus), dev) != cuda::kSuccess) return std::string();
  for (char* p = bus; *p; ++p) *p = static_cast<char>(tolower(*p));
  char real[PATH_MAX];
  std::string sys = std::string("/sys/bus/pci/devices/") + bus;
  if (::realpath(sys.c_str(), real) == nullptr) return std::string();
  return real;
}

GdrSupport detectGdr(const VerbsApi& api, ibv_pd* pd) {
  GdrSupport g;
  Status cu = driver().status;
  g.cudaDriver = cu.isOk();
  std::vector<std::string> notes;
  if (!g.cudaDriver) notes.push_back(cu.message());

  bool peermemLoaded = exists("/sys/module/nvidia_peermem") || exists("/sys/module/nv_peer_mem");
  g.peermem = peermemLoaded && g.cudaDriver;
  notes.push_back(peermemLoaded ? "nvidia-peermem loaded" : "nvidia-peermem not loaded");

  std::string dmabufNote;
  if (!params::kDmabufEnable.asBool()) {
    dmabufNote = "dma-buf disabled (LOOM_DMABUF_ENABLE=0)";
  } else if (api.regDmabufMr == nullptr) {
    dmabufNote = "dma-buf: the verbs library has no ibv_reg_dmabuf_mr";
  } else {
    // A registration of fd -1 fails at once; EOPNOTSUPP / EPROTONOSUPPORT mean the NIC driver has
    // no dma-buf support at all, anything else (EBADF) that it would try.
    errno = 0;
    ibv_mr* mr = api.regDmabufMr(pd, 0, 0, 0, -1, 0);
    int err = errno;
    if (mr != nullptr) api.deregMr(mr);
    bool nicOk = mr == nullptr && err != EOPNOTSUPP && err != EPROTONOSUPPORT;
    if (!nicOk) {
      dmabufNote = "dma-buf: the NIC driver does not support it";
    } else if (!g.cudaDriver) {
      dmabufNote = "dma-buf: the NIC supports it, no CUDA driver";
    } else {
      int supported = 0, dev = 0;
      const cuda::DriverApi& c = driver().api;
      if (c.cuMemGetHandleForAddressRange != nullptr && c.cuDeviceGet(&dev, 0) == 0 &&
          c.cuDeviceGetAttribute(&supported, cuda::kAttrDmaBufSupported, dev) == 0 && supported) {
        g.dmabuf = true;
        dmabufNote = "dma-buf supported by the NIC and the CUDA driver";
      } else {
        dmabufNote = "dma-buf: the CUDA driver does not support it";
      }
    }
  }
  notes.push_back(dmabufNote);
  std::string s = g.dmabuf    ? "GPUDirect RDMA through dma-buf"
                  : g.peermem ? "GPUDirect RDMA through nvidia-peermem"
                              : "no GPUDirect RDMA";
  s += " (";
  for (size_t i = 0; i < notes.size(); ++i) s += (i ? "; " : "") + notes[i];
  s += ")";
  g.summary = s;
  return g;
}

int pciDistance(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return 4;
  if (a == b) return 0;
  auto split = [](const std::string& p) {
    std::vector<std::string> parts;
    size_t pos = 0;
    while (pos < p.size()) {
      size_t n = p.find('/', pos);
      if (n == std::string::npos) n = p.size();
      if (n > pos) parts.push_back(p.substr(pos, n - pos));
      pos = n + 1;
    }
    return parts;
  };
  // /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...: component 2 is the root complex, the
  // following ones PCI bridges and finally the device.
  std::vector<std::string> x = split(a), y = split(b);
  if (x.size() < 3 || y.size() < 3 || x[0] != "sys" || x[1] != "devices" || y[0] != "sys" ||
      y[1] != "devices" || x[2] != y[2])
    return 4;
  size_t common = 0;
  while (common < x.size() && common < y.size() && x[common] == y[common]) ++common;
  // Bridges shared below the root complex: none -> PHB; the devices sit under one bridge -> PIX;
  // several shared bridges without reaching the CPU -> PXB.
  size_t shared = common - 3;
  if (shared == 0) return 3;
  size_t below = std::max(x.size(), y.size()) - common;
  return below <= 1 ? 1 : 2;
}

int gdrLevelParam() {
  std::string v = params::kNetGdrLevel.str();
  static const char* const kNames[] = {"LOC", "PIX", "PXB", "PHB", "SYS"};
  for (int i = 0; i < 5; ++i)
    if (strcasecmp(v.c_str(), kNames[i]) == 0) return i;
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (!v.empty() && *end == '\0' && n >= 0 && n <= 4) return static_cast<int>(n);
  return 2;
}

}  // namespace ib
}  // namespace loom
