// GPUDirect RDMA support: whether the NIC may read and write GPU memory, and how to register it.
// Two mechanisms, each detected once and logged with what was found:
// - dma-buf: the CUDA driver (libcuda, dlopened) exports the GPU range as a dma-buf fd
//   (cuMemGetHandleForAddressRange) and the verbs library registers it (ibv_reg_dmabuf_mr);
//   needs LOOM_DMABUF_ENABLE, a driver that reports dma-buf support and a NIC driver that accepts
//   dma-buf registrations.
// - nvidia-peermem (or the older nv_peer_mem): a kernel module that lets ibv_reg_mr pin GPU
//   memory directly.
// Neither: GPU buffers must be staged through host memory by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/core/status.h"
#include "transports/ib/verbs_api.h"

namespace loom {
namespace ib {

struct GdrSupport {
  bool cudaDriver = false;  // libcuda loaded and initialised, with at least one GPU
  bool dmabuf = false;      // dma-buf registration works end to end
  bool peermem = false;     // nvidia-peermem / nv_peer_mem loaded (and a CUDA driver)
  std::string summary;      // one line for logs and error messages
  bool usable() const { return dmabuf || peermem; }
};

// Detects GPUDirect support for a device (pd: its protection domain, for the dma-buf probe).
GdrSupport detectGdr(const VerbsApi& api, ibv_pd* pd);

// The CUDA driver, loaded once; errors say what is missing ("no CUDA driver (libcuda.so.1: ...)").
Status cudaDriverAvailable();
// Whether data points to GPU memory (false when there is no CUDA driver).
bool isGpuPointer(const void* data);
// The sysfs path of the PCI device of the GPU owning data, or of CUDA device `ordinal` (empty when
// unknown).
std::string gpuPciPath(const void* data);
std::string gpuPciPathOf(int ordinal);
// Whether every GPU the CUDA driver lists is within LOOM_NET_GDR_LEVEL of the NIC at sysfs path
// nicPath (the registrations of GPU memory check the same per buffer); false without a GPU.
bool gdrReachesEveryGpu(const std::string& nicPath);

// PCI distance between two sysfs device paths in NCCL_NET_GDR_LEVEL's terms:
// 0 LOC (same device), 1 PIX (one bridge between), 2 PXB (several bridges, no CPU), 3 PHB (same
// root complex), 4 SYS (across CPUs / unknown).
int pciDistance(const std::string& a, const std::string& b);
// LOOM_NET_GDR_LEVEL's name as a distance (LOC..SYS, or a number); PXB when malformed.
int gdrLevelParam();

}  // namespace ib
}  // namespace loom
