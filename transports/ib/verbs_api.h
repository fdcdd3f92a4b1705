// The verbs functions the InfiniBand transport calls, as one table of function pointers filled at
// run time from a dlopened library: libibverbs.so.1 by default, LOOM_IBVERBS_LIB to override.
// libibverbs is never linked, so one binary runs where there is no RDMA stack; a missing library
// or symbol makes the transport report itself unavailable, with the reason.
//
// The structs are libibverbs' own (<infiniband/verbs.h>, rdma-core). Functions that verbs.h
// defines inline (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) dispatch through
// the context's ops table; the loader fills those entries with small wrappers that do the same, so
// any library that exports the ibv_* entry points and fills ibv_context::ops works behind this
// table. The tests' emulated device (tests/transports/ib/) is such a library; nothing outside tests
// may load it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "src/core/status.h"

namespace loom {
namespace ib {

struct VerbsApi {
  std::string path;  // the library as it was loaded, for messages

  ibv_device** (*getDeviceList)(int* num) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* dev) = nullptr;
  __be64 (*getDeviceGuid)(ibv_device* dev) = nullptr;
  ibv_context* (*openDevice)(ibv_device* dev) = nullptr;
  int (*closeDevice)(ibv_context* ctx) = nullptr;
  int (*queryDevice)(ibv_context* ctx, ibv_device_attr* attr) = nullptr;
  // The exported ibv_query_port (verbs.h wraps it in an inline of the same name).
  int (*queryPort)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) = nullptr;
  // verbs.h's inline ibv_query_gid_ex (the loader wraps the exported _ibv_query_gid_ex,
  // rdma-core 32+): the GID's type (RoCE v1 / v2). Null when the library has none; the transport
  // then reads sysfs' gid_attrs/types.
  int (*queryGidEx)(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                    uint32_t flags) = nullptr;

  ibv_pd* (*allocPd)(ibv_context* ctx) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // ibv_reg_dmabuf_mr (rdma-core 34+); null when the library has none.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;

  ibv_cq* (*createCq)(ibv_context* ctx, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  // Completion channels (a pollable fd that says a CQ got a completion after ibv_req_notify_cq
  // armed it). createCompChannel is null when the library lacks any of the four; the transport
  // then polls while it waits.
  ibv_comp_channel* (*createCompChannel)(ibv_context* ctx) = nullptr;
  int (*destroyCompChannel)(ibv_comp_channel* channel) = nullptr;
  int (*getCqEvent)(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext) = nullptr;
  void (*ackCqEvents)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;

  // Data path: through ibv_context::ops, as verbs.h's inline functions do.
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) = nullptr;
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) = nullptr;
  int (*pollCq)(ibv_cq* cq, int n, ibv_wc* wc) = nullptr;
  // verbs.h's inline ibv_req_notify_cq, through the ops table too.
  int (*reqNotifyCq)(ibv_cq* cq, int solicitedOnly) = nullptr;

  // Asynchronous events; the context's async_fd is pollable.
  int (*getAsyncEvent)(ibv_context* ctx, ibv_async_event* event) = nullptr;
  void (*ackAsyncEvent)(ibv_async_event* event) = nullptr;

  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;
  const char* (*eventTypeStr)(ibv_event_type type) = nullptr;
};

// Loads the library named by LOOM_IBVERBS_LIB (or `path` when not null) once per path and keeps
// it loaded for the life of the process. An error names the library and the missing symbol.
Result<const VerbsApi*> loadVerbs(const char* path = nullptr);

}  // namespace ib
}  // namespace loom
