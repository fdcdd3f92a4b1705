// The one implementation behind libnccl-net-loom.so. The exported tables (plugin_versions.cc)
// are thin per-version adaptors over these functions, which take the newest argument types
// (size_t sizes, a per-communicator context). Everything runs over the process-wide Loom network
// transport (networkTransport(/*allowPlugin=*/false): LOOM_NET=ib|socket, automatic otherwise).
//
// Contracts are NCCL's (see nccl_net_abi.h): connect/accept never block; isend/irecv give a NULL
// request when NCCL_NET_MAX_REQUESTS (32) are outstanding on the comm; every failure is logged as a
// WARN with its cause through the logger NCCL passed to init, then returned as an ncclResult_t.
// Every function catches everything: no exception crosses into NCCL.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transports/ncclnet/nccl_net_abi.h"

namespace loom {
namespace ncclplugin {

namespace abi = ::loom::ncclabi;

// The plugin's name in NCCL's logs and for NCCL_NET=Loom.
constexpr const char* kPluginName = "Loom";
// A single transfer is capped so that test() can report its size in an int (every ABI version).
constexpr size_t kMaxTransferBytes = size_t(1) << 30;
// Largest grouped receive the plugin accepts, whatever the transport says.
constexpr int kMaxGroup = 32;

// Device properties in a version-neutral form; strings live as long as the process.
struct DeviceProps {
  const char* name = nullptr;
  const char* pciPath = nullptr;  // nullptr when unknown or virtual
  uint64_t guid = 0;
  int ptrSupport = abi::NCCL_PTR_HOST;
  int speedMbps = 0;
  int port = 0;
  float latencyUs = 0;
  int maxComms = 0;
  int maxRecvs = 1;
  size_t maxTransferBytes = kMaxTransferBytes;
};

// Process-wide part of init (every version): installs the logger (Loom's own log lines go to it
// too) and chooses the transport. May be called any number of times.
abi::ncclResult_t initProcess(abi::ncclDebugLogger_t logger);
// v11+: one context per communicator (freed by finalize). trafficClass may be
// NCCL_NET_TRAFFIC_CLASS_UNDEF.
abi::ncclResult_t initContext(void** ctx, uint64_t commId, int trafficClass,
                              abi::ncclDebugLogger_t logger);
abi::ncclResult_t finalizeContext(void* ctx);
// ctx may be nullptr (versions before 11); otherwise it must come from initContext.
abi::ncclResult_t checkContext(void* ctx, const char* what);

abi::ncclResult_t devices(int* ndev);
abi::ncclResult_t deviceProps(int dev, DeviceProps* props);

abi::ncclResult_t listen(int dev, void* handle, void** listenComm);
abi::ncclResult_t connect(int dev, void* handle, void** sendComm);
abi::ncclResult_t accept(void* listenComm, void** recvComm);

abi::ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle);
abi::ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
abi::ncclResult_t deregMr(void* comm, void* mhandle);

abi::ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
abi::ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                        void** mhandles, void** request);
// sizes as NCCL passes them (int); negative sizes are invalid arguments.
abi::ncclResult_t iflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles,
                         void** request);
abi::ncclResult_t test(void* request, int* done, int* sizes);

abi::ncclResult_t closeSend(void* sendComm);
abi::ncclResult_t closeRecv(void* recvComm);
abi::ncclResult_t closeListen(void* listenComm);

// Logs a WARN naming the call and returns ncclInvalidArgument (used by the adaptors for argument
// conversions, e.g. a negative v8 size).
abi::ncclResult_t invalidArgument(const char* what, const char* why);

}  // namespace ncclplugin
}  // namespace loom
