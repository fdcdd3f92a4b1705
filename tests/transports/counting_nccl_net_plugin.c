/* An NCCL net plugin that counts the registrations its caller asks for and passes every call on to
 * the plugin named by LOOMTEST_WRAPPED_NET_PLUGIN (its ncclNetPlugin_v12), for the tests of what
 * the importer registers (tests/transports/ib/plugin_gpu_test.cc). Its network is the wrapped
 * one's; only ncclNetPlugin_v12 is exported. Without LOOMTEST_WRAPPED_NET_PLUGIN (or when the
 * library cannot be loaded, which it says on stderr) every member of the table stays NULL, which
 * the importer refuses, naming them.
 *
 * loomtest_counting_net_counts(out) gives the counts since the library was loaded:
 *   out[0] regMr of NCCL_PTR_HOST   out[1] regMr of NCCL_PTR_CUDA   out[2] regMrDmaBuf
 *   out[3] deregMr                  out[4] registrations alive (made and not yet deregistered)
 * Only successful calls count. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "transports/ncclnet/nccl_net_abi.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT ncclNet_v12_t ncclNetPlugin_v12;

static const ncclNet_v12_t* gWrapped;
static long gCounts[5];

static void count(int which, int alive) {
  __atomic_add_fetch(&gCounts[which], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&gCounts[4], alive, __ATOMIC_RELAXED);
}

static ncclResult_t countedRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  ncclResult_t rc = gWrapped->regMr(comm, data, size, type, mhandle);
  if (rc == ncclSuccess) count(type == NCCL_PTR_CUDA ? 1 : 0, 1);
  return rc;
}

static ncclResult_t countedRegMrDmaBuf(void* comm, void* data, size_t size, int type,
                                       uint64_t offset, int fd, void** mhandle) {
  ncclResult_t rc = gWrapped->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle);
  if (rc == ncclSuccess) count(2, 1);
  return rc;
}

static ncclResult_t countedDeregMr(void* comm, void* mhandle) {
  ncclResult_t rc = gWrapped->deregMr(comm, mhandle);
  if (rc == ncclSuccess) count(3, -1);
  return rc;
}

__attribute__((constructor)) static void wrap(void) {
  const char* path = getenv("LOOMTEST_WRAPPED_NET_PLUGIN");
  if (path == NULL || *path == '\0') return;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const ncclNet_v12_t* table = lib ? (const ncclNet_v12_t*)dlsym(lib, "ncclNetPlugin_v12") : NULL;
  if (table == NULL) {
    fprintf(stderr, "counting net plugin: no ncclNetPlugin_v12 in %s: %s\n", path, dlerror());
    return;
  }
  gWrapped = table;
  ncclNetPlugin_v12 = *table;
  ncclNetPlugin_v12.regMr = countedRegMr;
  ncclNetPlugin_v12.regMrDmaBuf = table->regMrDmaBuf ? countedRegMrDmaBuf : NULL;
  ncclNetPlugin_v12.deregMr = countedDeregMr;
}

EXPORT void loomtest_counting_net_counts(long out[5]) {
  for (int i = 0; i < 5; ++i) out[i] = __atomic_load_n(&gCounts[i], __ATOMIC_RELAXED);
}
