// An external NCCL net plugin (libnccl-net-<name>.so: AWS's EFA plugin, NCCL's own example, Loom's
// libnccl-net-loom.so, ...) used as a Loom network transport: net::Transport over the plugin's
// ncclNet_vN function table (nccl_net_abi.h), for N = 8 to 12.
//
// What the adapter adds to the plugin:
// - Registration: Loom's runtime posts isend/irecv/iflush with mhandle == nullptr (it does not
//   register its buffers); the adapter then registers each buffer with the plugin itself.
//   - Host memory: NCCL_PTR_HOST for the life of the request, deregistered when the request
//     completes, fails or its comm closes. Correct for any plugin; costly on plugins whose
//     registration pins memory (RDMA), which is why callers that can should register once and
//     pass the mhandle.
//   - CUDA device memory: the whole allocation, once per comm, as NCCL_PTR_CUDA (through a
//     dma-buf of it where the plugin takes one, as NCCL prefers; else regMr), and kept: every later
//     request on any part of that allocation uses it. A kept registration goes when its comm
//     closes, when a later registration on the comm finds its allocation freed (CUDA's buffer id
//     tells a new allocation at the same address apart), or, least recently used first, beyond
//     kPluginIdleGpuRegistrations idle ones per comm. The dma-buf is exported by holdMemory, on the
//     thread that posts the call (the device runner's), and kept while the allocation lives (at
//     most kPluginIdleGpuRegistrations idle), so the registrations on the runner's thread make no
//     driver call that takes the CUDA driver's mapping lock.
// - Sizes: the plugin's test() (and, before v9, isend/irecv) speaks int; sizes that do not fit, or
//   exceed the device's maxP2pBytes, are refused with an error instead of being truncated.
// - Errors: every failing plugin call becomes a Status naming the plugin, the call, the
//   ncclResult_t code and the last warning the plugin logged on this thread.
//
// Loom's runtime accepts every peer's connection on one listen comm (one handle per rank, shipped
// at bootstrap): the plugin must allow several accepts on a listen comm, which NCCL itself never
// asks for (it closes the listener after one accept). Loom's own plugin allows it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "src/core/status.h"
#include "transports/net.h"

namespace loom {

// Idle GPU registrations a plugin comm keeps (above).
constexpr size_t kPluginIdleGpuRegistrations = 32;

// Loads the plugin: dlopen(nameOrPath) as given, then "libnccl-net-<nameOrPath>.so" (NCCL's rule),
// resolves the newest ncclNetPlugin_v12 .. _v8 it exports (onlyVersion 8..12: that one only; tests
// use it to drive each ABI), initialises it with a logger that forwards to Loom's log, and checks
// it has a device. The library stays loaded for the life of the process (a plugin may keep
// threads). Thread safety: as net::Transport (one thread per comm; different comms may be driven
// from different threads at once, which NCCL plugins allow).
Result<std::unique_ptr<net::Transport>> loadNcclNetPlugin(const std::string& nameOrPath,
                                                          int onlyVersion = 0);

}  // namespace loom
