/* A broken NCCL net plugin for the loading-error tests of ncclnet_import_test.cc: its network is
 * "Fake" and what breaks is chosen by LOOMTEST_FAKE_NET_MODE at init:
 *   init-fails  init logs a warning and returns ncclSystemError
 *   no-devices  devices() reports 0
 *   (unset)     one device; listen logs a warning and returns ncclInternalError
 * ncclNetPlugin_v11 is complete; ncclNetPlugin_v9 leaves isend and test NULL. */
#include <stdlib.h>
#include <string.h>

#include "transports/ncclnet/nccl_net_abi.h"

#define EXPORT __attribute__((visibility("default")))

static ncclDebugLogger_t gLog;
static int gDevices = 1;

static ncclResult_t fakeInit11(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                               ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  const char* mode = getenv("LOOMTEST_FAKE_NET_MODE");
  (void)commId;
  (void)config;
  (void)prof;
  gLog = log;
  *ctx = &gDevices;
  gDevices = 1;
  log(NCCL_LOG_INFO, NCCL_NET, __FILE__, __LINE__, "fake: init, mode '%s'",
      mode && *mode ? mode : "default");
  if (mode && strcmp(mode, "init-fails") == 0) {
    log(NCCL_LOG_WARN, NCCL_INIT | NCCL_NET, __FILE__, __LINE__, "fake: no provider found (%d)",
        42);
    return ncclSystemError;
  }
  if (mode && strcmp(mode, "no-devices") == 0) gDevices = 0;
  return ncclSuccess;
}

static ncclResult_t fakeInit9(ncclDebugLogger_t log) {
  void* ctx;
  return fakeInit11(&ctx, 0, NULL, log, NULL);
}

static ncclResult_t fakeDevices(int* ndev) {
  *ndev = gDevices;
  return ncclSuccess;
}

static ncclResult_t fakeProps11(int dev, ncclNetProperties_v11_t* props) {
  (void)dev;
  memset(props, 0, sizeof(*props));
  props->name = (char*)"fake0";
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = 1000;
  props->maxComms = 1;
  props->maxRecvs = 1;
  props->maxP2pBytes = 1 << 20;
  props->maxCollBytes = 1 << 20;
  return ncclSuccess;
}

static ncclResult_t fakeProps9(int dev, ncclNetProperties_v9_t* props) {
  (void)dev;
  memset(props, 0, sizeof(*props));
  props->name = (char*)"fake0";
  props->maxRecvs = 1;
  props->maxP2pBytes = 1 << 20;
  return ncclSuccess;
}

static ncclResult_t fakeListen11(void* ctx, int dev, void* handle, void** listenComm) {
  (void)ctx;
  (void)dev;
  (void)handle;
  *listenComm = NULL;
  gLog(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, "fake: listen refused on device %d", dev);
  return ncclInternalError;
}

static ncclResult_t fakeListen9(int dev, void* handle, void** listenComm) {
  return fakeListen11(NULL, dev, handle, listenComm);
}

static ncclResult_t fakeConnect11(void* ctx, int dev, void* handle, void** sendComm,
                                  ncclNetDeviceHandle_v11_t** devComm) {
  (void)ctx;
  (void)dev;
  (void)handle;
  (void)devComm;
  *sendComm = NULL;
  return ncclInternalError;
}

static ncclResult_t fakeConnect9(int dev, void* handle, void** sendComm,
                                 ncclNetDeviceHandle_v9_t** devComm) {
  return fakeConnect11(NULL, dev, handle, sendComm, devComm);
}

static ncclResult_t fakeAccept(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** devComm) {
  (void)listenComm;
  (void)devComm;
  *recvComm = NULL;
  return ncclInternalError;
}

static ncclResult_t fakeRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm;
  (void)data;
  (void)size;
  (void)type;
  *mhandle = NULL;
  return ncclInternalError;
}

static ncclResult_t fakeDeregMr(void* comm, void* mhandle) {
  (void)comm;
  (void)mhandle;
  return ncclSuccess;
}

static ncclResult_t fakeIsend11(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                                void* phandle, void** request) {
  (void)sendComm;
  (void)data;
  (void)size;
  (void)tag;
  (void)mhandle;
  (void)phandle;
  *request = NULL;
  return ncclInternalError;
}

static ncclResult_t fakeIrecv11(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                                void** mhandles, void** phandles, void** request) {
  (void)recvComm;
  (void)n;
  (void)data;
  (void)sizes;
  (void)tags;
  (void)mhandles;
  (void)phandles;
  *request = NULL;
  return ncclInternalError;
}

static ncclResult_t fakeIrecv9(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** request) {
  return fakeIrecv11(recvComm, n, data, sizes, tags, mhandles, NULL, request);
}

static ncclResult_t fakeTest(void* request, int* done, int* sizes) {
  (void)request;
  (void)sizes;
  *done = 0;
  return ncclInternalError;
}

static ncclResult_t fakeClose(void* comm) {
  (void)comm;
  return ncclSuccess;
}

static ncclResult_t fakeFinalize(void* ctx) {
  (void)ctx;
  return ncclSuccess;
}

EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    "Fake",     fakeInit11, fakeDevices,  fakeProps11, fakeListen11, fakeConnect11,
    fakeAccept, fakeRegMr,  NULL,         fakeDeregMr, fakeIsend11,  fakeIrecv11,
    NULL,       fakeTest,   fakeClose,    fakeClose,   fakeClose,    NULL,
    NULL,       NULL,       fakeFinalize, NULL};

EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    "Fake",    fakeInit9, fakeDevices, fakeProps9, fakeListen9, fakeConnect9, fakeAccept,
    fakeRegMr, NULL,      fakeDeregMr, NULL,       fakeIrecv9,  NULL,         NULL,
    fakeClose, fakeClose, fakeClose,   NULL,       NULL,        NULL};
