/* The NCCL external network plugin ABI, versions 8 to 12, declared by Loom from the published
 * facts (docs of the ABI; see docs/nccl_plugin.md). Both directions use it: the plugin Loom exports
 * (transports/ncclnet/plugin/, symbols ncclNetPlugin_v8 .. ncclNetPlugin_v12) and the transport
 * that loads an external plugin (transports/ncclnet/ncclnet_transport.cc).
 *
 * Layout contract: every struct here must have exactly the member order and types NCCL compiles
 * with; a wrong order or width is a segfault inside NCCL, not a compile error. The static_asserts
 * at the end pin the sizes and offsets for LP64 (x86-64, aarch64), the only ABI NCCL ships for.
 *
 * Valid C and C++. In C++ every name lives in namespace loom::ncclabi so that a translation unit
 * may also include NCCL's own nccl.h (which declares ncclResult_t globally) without a clash. The
 * names are NCCL's own, so that reading this header next to NCCL's documentation is easy.
 *
 * Differences between versions, in one place:
 * - v8: init(logger); listen/connect take dev, no context; isend size and irecv sizes are int
 *   (NCCL keeps transfers <= 1 GiB); properties end at netDeviceVersion (no forceFlush, vProps,
 *   max*Bytes); no makeVDevice.
 * - v9: isend/irecv sizes become size_t; properties gain forceFlush (after regIsGlobal), vProps,
 *   maxP2pBytes, maxCollBytes; makeVDevice appended.
 * - v10: init(logger, profiler); connect(dev, config, handle, ...); isend/irecv gain phandle(s).
 * - v11: per-communicator context: init(&ctx, commId, config, logger, profiler),
 *   listen(ctx, dev, ...), connect(ctx, dev, ...); properties gain maxMultiRequestSize; finalize
 * and setNetAttr appended.
 * - v12: as v11; vProps holds 8 devices instead of 4; properties gain railId and planeId (int16).
 * In every version iflush sizes and test sizes are int*.
 */
#ifndef LOOM_TRANSPORTS_NCCLNET_NCCL_NET_ABI_H_
#define LOOM_TRANSPORTS_NCCLNET_NCCL_NET_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
namespace loom {
namespace ncclabi {
#endif

/* Result of every call. Values are NCCL's public ncclResult_t. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

enum {
  NCCL_NET_HANDLE_MAXSIZE = 128,           /* bytes of the handle listen fills */
  NCCL_NET_MAX_REQUESTS = 32,              /* outstanding requests per comm */
  NCCL_NET_OPTIONAL_RECV_COMPLETION = 0x1, /* *request preset by NCCL before irecv (LL protocols) */
  NCCL_NET_MAX_DEVS_PER_NIC_V9 = 4,        /* vProps.devs in v9, v10, v11 */
  NCCL_NET_MAX_DEVS_PER_NIC_V12 = 8,       /* vProps.devs in v12 */
  NCCL_NET_TRAFFIC_CLASS_UNDEF = -1,       /* ncclNetCommConfig.trafficClass when unset */
  NCCL_NET_ATTR_UNDEF = -1                 /* ncclNetAttr fields when unset */
};

/* ptrSupport bits and regMr types. */
enum { NCCL_PTR_HOST = 0x1, NCCL_PTR_CUDA = 0x2, NCCL_PTR_DMABUF = 0x4 };

/* Largest maxP2pBytes / maxCollBytes NCCL accepts (1 TiB), and the v8 limit (1 GiB). */
#define NCCL_ABI_MAX_NET_SIZE_BYTES (1024ull * 1024 * 1024 * 1024)
#define NCCL_ABI_V8_MAX_SIZE_BYTES (1024ull * 1024 * 1024)

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags passed to the logger (a subset; NCCL defines more). */
enum {
  NCCL_INIT = 0x1,
  NCCL_P2P = 0x4,
  NCCL_NET = 0x10,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALL = ~0
};

/* NCCL's logger: printf-style. file/line name the caller. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

/* NCCL's profiler callback for network events (v10+). A plugin may ignore it. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

/* Device offload handle (the same struct in every version 7 to 12). A host-only plugin leaves
 * *sendDevComm / *recvDevComm untouched. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t;
typedef ncclNetDeviceHandle_t ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_t ncclNetDeviceHandle_v12_t;

/* ---------------------------------------------------------------------------------------------
 * Properties.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  char* name;      /* for logs */
  char* pciPath;   /* sysfs path of the PCI device; NULL for a virtual device */
  uint64_t guid;   /* equal for ports of one NIC */
  int ptrSupport;  /* NCCL_PTR_* bits */
  int regIsGlobal; /* regMr not tied to one comm */
  int speed;       /* Mb/s */
  int port;
  float latency; /* microseconds */
  int maxComms;
  int maxRecvs; /* largest n of a grouped receive */
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush; /* NCCL flushes every receive when set */
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;  /* in (0, 1 TiB] */
  size_t maxCollBytes; /* in (0, 1 TiB] */
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize; /* requests in one multi-request; 1 = none */
} ncclNetProperties_v11_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

/* Per-connection (v10) or per-context (v11+) configuration. */
typedef struct {
  int trafficClass; /* NCCL_NET_TRAFFIC_CLASS_UNDEF when unset */
} ncclNetCommConfig_v10_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;

/* Hints given by setNetAttr (v11+). */
typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;    /* bitmask of ncclFunc_t */
  uint32_t algo;  /* bitmask of algorithms */
  uint32_t proto; /* bitmask of protocols */
} ncclNetAttr_v11_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

/* ---------------------------------------------------------------------------------------------
 * Function tables. Contracts common to every version:
 * - listen fills at most NCCL_NET_HANDLE_MAXSIZE bytes of handle; NCCL ships them to the peer.
 * - connect / accept must not block: success with *sendComm / *recvComm NULL means "call again".
 * - isend / irecv: success with *request NULL means "cannot post now, retry" (not an error).
 * - irecv posts one request for n buffers (n <= maxRecvs); test reports one size per buffer.
 * - test: *done set to 1 once complete; sizes (may be NULL) receives the bytes transferred.
 * - getDeviceMr, irecvConsumed and makeVDevice may be NULL.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

typedef struct {
  const char* name;
  /* Called once per communicator; *ctx is that communicator's context. */
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v11_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

#ifdef __cplusplus
}  // namespace ncclabi
}  // namespace loom

/* The layout NCCL compiles with on LP64 targets. */
#if defined(__LP64__)
#include <cstddef>
namespace loom {
namespace ncclabi {
static_assert(sizeof(ncclNetDeviceType) == 4, "NCCL enums are int-sized");
static_assert(sizeof(ncclNetDeviceHandle_t) == 32, "ncclNetDeviceHandle layout");
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "v8 properties layout");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 properties layout");
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties layout");
static_assert(offsetof(ncclNetProperties_v9_t, speed) == 36, "v9 properties layout");
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 properties layout");
static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 properties layout");
static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties layout");
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 layout");
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties layout");
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 properties layout");
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 properties layout");
static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties layout");
static_assert(sizeof(ncclNetAttr_v11_t) == 44, "ncclNetAttr layout");
static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void*), "v8 table: name + 18 functions");
static_assert(sizeof(ncclNet_v9_t) == 20 * sizeof(void*), "v9 table: name + 19 functions");
static_assert(sizeof(ncclNet_v10_t) == 20 * sizeof(void*), "v10 table: name + 19 functions");
static_assert(sizeof(ncclNet_v11_t) == 22 * sizeof(void*), "v11 table: name + 21 functions");
static_assert(sizeof(ncclNet_v12_t) == 22 * sizeof(void*), "v12 table: name + 21 functions");
static_assert(offsetof(ncclNet_v11_t, finalize) == 20 * sizeof(void*), "v11 table order");
}  // namespace ncclabi
}  // namespace loom
#endif
#endif /* __cplusplus */

#endif /* LOOM_TRANSPORTS_NCCLNET_NCCL_NET_ABI_H_ */
