// One interface over the five ABI versions of an NCCL net plugin (ncclNet_v8_t .. ncclNet_v12_t),
// so that the transport in ncclnet_transport.cc is written once. Each version's adaptor is a few
// lines (plugin_abi.cc); what differs between versions is listed in nccl_net_abi.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transports/ncclnet/nccl_net_abi.h"

namespace loom {
namespace ncclnet {

using ncclabi::ncclResult_t;

// A device's properties, whatever the version reported them in. Versions without a field give
// NCCL's implied value (v8: no forceFlush, transfers up to 1 GiB).
struct PluginProps {
  std::string name;
  std::string pciPath;
  uint64_t guid = 0;
  int ptrSupport = ncclabi::NCCL_PTR_HOST;
  int regIsGlobal = 0;
  int forceFlush = 0;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int maxComms = 0;
  int maxRecvs = 1;
  size_t maxP2pBytes = 0;
};

// The plugin's calls in their newest form (size_t sizes, no phandles). Sizes the version cannot
// carry are refused by the caller beforehand (maxMessageBytes). Not thread-safe per comm, as the
// plugin itself.
class PluginAbi {
 public:
  virtual ~PluginAbi() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  // Member names of required functions the table leaves NULL ("" when complete).
  virtual std::string missingMembers() const = 0;
  // Largest size an isend/irecv of this version can express.
  virtual size_t maxMessageBytes() const = 0;

  // v11+: creates the context (commId; trafficClass unset); older versions: the global init.
  virtual ncclResult_t init(uint64_t commId, ncclabi::ncclDebugLogger_t logger) = 0;
  // v11+: finalize(ctx); older versions have none.
  virtual void finalize() = 0;
  virtual ncclResult_t devices(int* ndev) = 0;
  virtual ncclResult_t getProperties(int dev, PluginProps* props) = 0;
  virtual ncclResult_t listen(int dev, void* handle, void** listenComm) = 0;
  virtual ncclResult_t connect(int dev, void* handle, void** sendComm) = 0;
  virtual ncclResult_t accept(void* listenComm, void** recvComm) = 0;
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mhandle) = 0;
  // Optional in every version: NULL in a plugin that registers no dma-buf.
  virtual bool hasRegMrDmaBuf() const = 0;
  virtual ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                                   int fd, void** mhandle) = 0;
  virtual ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                             void** request) = 0;
  virtual ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags,
                             void** mhandles, void** request) = 0;
  virtual bool hasIflush() const = 0;
  virtual ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                              void** request) = 0;
  virtual ncclResult_t test(void* request, int* done, int* sizes) = 0;
  virtual ncclResult_t closeSend(void* comm) = 0;
  virtual ncclResult_t closeRecv(void* comm) = 0;
  virtual ncclResult_t closeListen(void* comm) = 0;
};

// The adaptor for the table `symbol` (the address dlsym gave for ncclNetPlugin_v<version>).
std::unique_ptr<PluginAbi> makePluginAbi(int version, const void* symbol);

// The ABI versions spoken here (symbols ncclNetPlugin_v8 .. ncclNetPlugin_v12).
constexpr int kNewestVersion = 12;
constexpr int kOldestVersion = 8;
// Most buffers in one grouped receive (NCCL's own transports allow 8; a plugin's maxRecvs may be
// lower).
constexpr int kMaxGroupedRecvs = 8;

}  // namespace ncclnet
}  // namespace loom
