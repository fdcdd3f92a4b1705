// The symbols NCCL looks up: ncclNetPlugin_v8 .. ncclNetPlugin_v12, each a thin adaptor from that
// version's argument types to the one implementation in loom_net_plugin.h. Only these five are
// exported (nccl_net_loom.map); everything else in the library is local.
#include <climits>

#include "transports/ncclnet/nccl_net_abi.h"
#include "transports/ncclnet/plugin/loom_net_plugin.h"

namespace loom {
namespace ncclplugin {
namespace {

using abi::ncclResult_t;

// Version-independent properties; fills the fields every version has.
template <typename P>
ncclResult_t fillCommon(int dev, P* props, DeviceProps* out) {
  if (props == nullptr) return invalidArgument("getProperties", "null properties pointer");
  ncclResult_t r = deviceProps(dev, out);
  if (r != abi::ncclSuccess) return r;
  *props = P{};
  props->name = const_cast<char*>(out->name);
  props->pciPath = const_cast<char*>(out->pciPath);
  props->guid = out->guid;
  props->ptrSupport = out->ptrSupport;
  props->regIsGlobal = 0;
  props->speed = out->speedMbps;
  props->port = out->port;
  props->latency = out->latencyUs;
  props->maxComms = out->maxComms;
  props->maxRecvs = out->maxRecvs;
  props->netDeviceType = abi::NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  return abi::ncclSuccess;
}

// Fields of v9 and later.
template <typename P>
ncclResult_t fillV9(int dev, P* props) {
  DeviceProps d;
  ncclResult_t r = fillCommon(dev, props, &d);
  if (r != abi::ncclSuccess) return r;
  props->forceFlush = 0;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = d.maxTransferBytes;
  props->maxCollBytes = d.maxTransferBytes;
  return abi::ncclSuccess;
}

// ---- v8: int sizes; NCCL keeps transfers at or below 1 GiB --------------------------------------

ncclResult_t getPropertiesV8(int dev, abi::ncclNetProperties_v8_t* props) {
  DeviceProps d;
  return fillCommon(dev, props, &d);
}

ncclResult_t listenV8(int dev, void* handle, void** listenComm) {
  return listen(dev, handle, listenComm);
}

ncclResult_t connectV8(int dev, void* handle, void** sendComm, abi::ncclNetDeviceHandle_t**) {
  return connect(dev, handle, sendComm);
}

ncclResult_t acceptV8(void* listenComm, void** recvComm, abi::ncclNetDeviceHandle_t**) {
  return accept(listenComm, recvComm);
}

ncclResult_t isendV8(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (request != nullptr) *request = nullptr;
  if (size < 0) return invalidArgument("isend", "negative size");
  if (static_cast<unsigned long long>(size) > NCCL_ABI_V8_MAX_SIZE_BYTES)
    return invalidArgument("isend", "more than 1 GiB in one transfer (ncclNet_v8 limit)");
  return isend(sendComm, data, static_cast<size_t>(size), tag, mhandle, request);
}

ncclResult_t irecvV8(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request) {
  if (request != nullptr) *request = nullptr;
  if (n < 1 || n > kMaxGroup) return invalidArgument("irecv", "number of buffers out of range");
  if (sizes == nullptr) return invalidArgument("irecv", "null sizes");
  size_t sz[kMaxGroup];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return invalidArgument("irecv", "negative size");
    sz[i] = static_cast<size_t>(sizes[i]);
  }
  return irecv(recvComm, n, data, sz, tags, mhandles, request);
}

ncclResult_t iflushAll(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                       void** request) {
  return iflush(recvComm, n, data, sizes, mhandles, request);
}

// ---- v9: size_t sizes -------------------------------------------------------------------------

ncclResult_t getPropertiesV9(int dev, abi::ncclNetProperties_v9_t* props) {
  return fillV9(dev, props);
}

ncclResult_t isendV9(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) {
  return isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t irecvV9(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) {
  return irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

// ---- v10: profiler callback, per-connection config, phandles ----------------------------------

ncclResult_t initV10(abi::ncclDebugLogger_t logger, abi::ncclProfilerCallback_t) {
  return initProcess(logger);
}

ncclResult_t connectV10(int dev, abi::ncclNetCommConfig_v10_t*, void* handle, void** sendComm,
                        abi::ncclNetDeviceHandle_t**) {
  return connect(dev, handle, sendComm);
}

ncclResult_t isendV10(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*,
                      void** request) {
  return isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t irecvV10(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                      void**, void** request) {
  return irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

// ---- v11/v12: per-communicator context ----------------------------------------------------------

ncclResult_t initV11(void** ctx, uint64_t commId, abi::ncclNetCommConfig_v11_t* config,
                     abi::ncclDebugLogger_t logger, abi::ncclProfilerCallback_t) {
  return initContext(ctx, commId,
                     config != nullptr ? config->trafficClass : abi::NCCL_NET_TRAFFIC_CLASS_UNDEF,
                     logger);
}

ncclResult_t getPropertiesV11(int dev, abi::ncclNetProperties_v11_t* props) {
  ncclResult_t r = fillV9(dev, props);
  if (r == abi::ncclSuccess) props->maxMultiRequestSize = 1;
  return r;
}

ncclResult_t getPropertiesV12(int dev, abi::ncclNetProperties_v12_t* props) {
  ncclResult_t r = fillV9(dev, props);
  if (r != abi::ncclSuccess) return r;
  props->maxMultiRequestSize = 1;
  props->railId = -1;  // NCCL_NET_ID_UNDEF: Loom does not know the rail layout
  props->planeId = -1;
  return abi::ncclSuccess;
}

ncclResult_t listenV11(void* ctx, int dev, void* handle, void** listenComm) {
  ncclResult_t r = checkContext(ctx, "listen");
  return r != abi::ncclSuccess ? r : listen(dev, handle, listenComm);
}

ncclResult_t connectV11(void* ctx, int dev, void* handle, void** sendComm,
                        abi::ncclNetDeviceHandle_t**) {
  ncclResult_t r = checkContext(ctx, "connect");
  return r != abi::ncclSuccess ? r : connect(dev, handle, sendComm);
}

ncclResult_t setNetAttrV11(void* ctx, abi::ncclNetAttr_v11_t*) {
  // Hints only (peer counts, op/algo/proto masks): Loom's transports do not use them.
  return checkContext(ctx, "setNetAttr");
}

}  // namespace
}  // namespace ncclplugin
}  // namespace loom

namespace p = ::loom::ncclplugin;
namespace abi = ::loom::ncclabi;

extern "C" {

__attribute__((visibility("default"))) abi::ncclNet_v8_t ncclNetPlugin_v8 = {
    p::kPluginName, p::initProcess, p::devices,   p::getPropertiesV8,
    p::listenV8,    p::connectV8,   p::acceptV8,  p::regMr,
    p::regMrDmaBuf, p::deregMr,     p::isendV8,   p::irecvV8,
    p::iflushAll,   p::test,        p::closeSend, p::closeRecv,
    p::closeListen, nullptr,        nullptr};

__attribute__((visibility("default"))) abi::ncclNet_v9_t ncclNetPlugin_v9 = {
    p::kPluginName, p::initProcess, p::devices,   p::getPropertiesV9,
    p::listenV8,    p::connectV8,   p::acceptV8,  p::regMr,
    p::regMrDmaBuf, p::deregMr,     p::isendV9,   p::irecvV9,
    p::iflushAll,   p::test,        p::closeSend, p::closeRecv,
    p::closeListen, nullptr,        nullptr,      nullptr};

__attribute__((visibility("default"))) abi::ncclNet_v10_t ncclNetPlugin_v10 = {
    p::kPluginName, p::initV10, p::devices,     p::getPropertiesV9, p::listenV8,    p::connectV10,
    p::acceptV8,    p::regMr,   p::regMrDmaBuf, p::deregMr,         p::isendV10,    p::irecvV10,
    p::iflushAll,   p::test,    p::closeSend,   p::closeRecv,       p::closeListen, nullptr,
    nullptr,        nullptr};

__attribute__((visibility("default"))) abi::ncclNet_v11_t ncclNetPlugin_v11 = {
    p::kPluginName,     p::initV11,      p::devices,   p::getPropertiesV11,
    p::listenV11,       p::connectV11,   p::acceptV8,  p::regMr,
    p::regMrDmaBuf,     p::deregMr,      p::isendV10,  p::irecvV10,
    p::iflushAll,       p::test,         p::closeSend, p::closeRecv,
    p::closeListen,     nullptr,         nullptr,      nullptr,
    p::finalizeContext, p::setNetAttrV11};

__attribute__((visibility("default"))) abi::ncclNet_v12_t ncclNetPlugin_v12 = {
    p::kPluginName,     p::initV11,      p::devices,   p::getPropertiesV12,
    p::listenV11,       p::connectV11,   p::acceptV8,  p::regMr,
    p::regMrDmaBuf,     p::deregMr,      p::isendV10,  p::irecvV10,
    p::iflushAll,       p::test,         p::closeSend, p::closeRecv,
    p::closeListen,     nullptr,         nullptr,      nullptr,
    p::finalizeContext, p::setNetAttrV11};

}  // extern "C"
