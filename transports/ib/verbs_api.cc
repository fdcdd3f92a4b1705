#include "transports/ib/verbs_api.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>

#include "src/core/log.h"
#include "src/core/params.h"

namespace loom {
namespace ib {
namespace {

// verbs.h's inline ibv_post_send / ibv_post_recv / ibv_poll_cq dispatch through the context's ops
// table; these do the same, so the table works with any library that fills ibv_context::ops.
int postSendOps(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
int postRecvOps(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
int pollCqOps(ibv_cq* cq, int n, ibv_wc* wc) { return cq->context->ops.poll_cq(cq, n, wc); }
int reqNotifyCqOps(ibv_cq* cq, int solicitedOnly) {
  return cq->context->ops.req_notify_cq(cq, solicitedOnly);
}

// The library's exported ibv_query_port takes the pre-rdma-core (shorter) port attribute struct;
// verbs.h's inline of the same name prefers the extended context's query_port, which knows the
// struct's size. This is that inline, with the exported function from the loaded library.
using CompatQueryPort = int (*)(ibv_context*, uint8_t, _compat_ibv_port_attr*);

// _ibv_query_gid_ex takes the entry's size as its last argument (verbs.h's inline passes it).
using QueryGidExRaw = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);

struct Loaded {
  VerbsApi api;
  CompatQueryPort exportedQueryPort = nullptr;
  QueryGidExRaw queryGidExRaw = nullptr;
};

// Function pointers that depend on the library (queryPort, queryGidEx) need their library's
// exported function; the table's signatures carry no library, so the wrappers find it through a
// per-library slot. There are few libraries (one in production, two in tests): a small fixed set
// of trampolines indexed by load order.
constexpr int kMaxLibraries = 4;
Loaded* gSlots[kMaxLibraries] = {};

template <int I>
int queryPortTrampoline(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx != nullptr) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  // The compat struct is the leading part of ibv_port_attr (called through its own type).
  return gSlots[I]->exportedQueryPort(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

template <int I>
int queryGidExTrampoline(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                         uint32_t flags) {
  return gSlots[I]->queryGidExRaw(ctx, port, index, entry, flags, sizeof(*entry));
}

template <int I>
void bindTrampolines(Loaded* l) {
  l->api.queryPort = &queryPortTrampoline<I>;
  if (l->queryGidExRaw != nullptr) l->api.queryGidEx = &queryGidExTrampoline<I>;
}

void bindSlot(int slot, Loaded* l) {
  gSlots[slot] = l;
  switch (slot) {
    case 0:
      bindTrampolines<0>(l);
      break;
    case 1:
      bindTrampolines<1>(l);
      break;
    case 2:
      bindTrampolines<2>(l);
      break;
    default:
      bindTrampolines<3>(l);
      break;
  }
}

// Resolves name at the given symbol version first (libibverbs exports IBVERBS_1.0 compatibility
// versions of most entry points next to the IBVERBS_1.1 ones this table's prototypes describe),
// then unversioned (the tests' emulated library exports plain symbols).
void* resolve(void* handle, const char* name, const char* version) {
  void* sym = nullptr;
  if (version != nullptr) sym = dlvsym(handle, name, version);
  if (sym == nullptr) sym = dlsym(handle, name);
  return sym;
}

template <typename Fn>
Status need(void* handle, const std::string& path, const char* name, const char* version, Fn* out) {
  void* sym = resolve(handle, name, version);
  if (sym == nullptr) {
    return LOOM_ERROR(kSystem, "the verbs library {} has no symbol {}", path, name);
  }
  *out = reinterpret_cast<Fn>(sym);
  return Status();
}

template <typename Fn>
void optional(void* handle, const char* name, const char* version, Fn* out) {
  *out = reinterpret_cast<Fn>(resolve(handle, name, version));
}

Status fill(void* h, Loaded* l) {
  VerbsApi& a = l->api;
  const std::string& p = a.path;
  const char* v10 = "IBVERBS_1.0";
  const char* v11 = "IBVERBS_1.1";
  LOOM_TRY(need(h, p, "ibv_get_device_list", v11, &a.getDeviceList));
  LOOM_TRY(need(h, p, "ibv_free_device_list", v11, &a.freeDeviceList));
  LOOM_TRY(need(h, p, "ibv_get_device_name", v11, &a.getDeviceName));
  LOOM_TRY(need(h, p, "ibv_get_device_guid", v11, &a.getDeviceGuid));
  LOOM_TRY(need(h, p, "ibv_open_device", v11, &a.openDevice));
  LOOM_TRY(need(h, p, "ibv_close_device", v11, &a.closeDevice));
  LOOM_TRY(need(h, p, "ibv_query_device", v11, &a.queryDevice));
  LOOM_TRY(need(h, p, "ibv_query_port", v11, &l->exportedQueryPort));
  LOOM_TRY(need(h, p, "ibv_query_gid", v11, &a.queryGid));
  optional(h, "_ibv_query_gid_ex", "IBVERBS_1.11", &l->queryGidExRaw);
  LOOM_TRY(need(h, p, "ibv_alloc_pd", v11, &a.allocPd));
  LOOM_TRY(need(h, p, "ibv_dealloc_pd", v11, &a.deallocPd));
  LOOM_TRY(need(h, p, "ibv_reg_mr", v11, &a.regMr));
  optional(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", &a.regDmabufMr);
  LOOM_TRY(need(h, p, "ibv_dereg_mr", v11, &a.deregMr));
  LOOM_TRY(need(h, p, "ibv_create_cq", v11, &a.createCq));
  LOOM_TRY(need(h, p, "ibv_destroy_cq", v11, &a.destroyCq));
  // Completion channels: every libibverbs has them; without any of the four the transport polls.
  optional(h, "ibv_create_comp_channel", v10, &a.createCompChannel);
  optional(h, "ibv_destroy_comp_channel", v10, &a.destroyCompChannel);
  optional(h, "ibv_get_cq_event", v11, &a.getCqEvent);
  optional(h, "ibv_ack_cq_events", v11, &a.ackCqEvents);
  if (!a.createCompChannel || !a.destroyCompChannel || !a.getCqEvent || !a.ackCqEvents)
    a.createCompChannel = nullptr;
  LOOM_TRY(need(h, p, "ibv_create_qp", v11, &a.createQp));
  LOOM_TRY(need(h, p, "ibv_modify_qp", v11, &a.modifyQp));
  LOOM_TRY(need(h, p, "ibv_destroy_qp", v11, &a.destroyQp));
  LOOM_TRY(need(h, p, "ibv_get_async_event", v11, &a.getAsyncEvent));
  LOOM_TRY(need(h, p, "ibv_ack_async_event", v11, &a.ackAsyncEvent));
  LOOM_TRY(need(h, p, "ibv_wc_status_str", v11, &a.wcStatusStr));
  LOOM_TRY(need(h, p, "ibv_event_type_str", v11, &a.eventTypeStr));
  a.postSend = &postSendOps;
  a.postRecv = &postRecvOps;
  a.pollCq = &pollCqOps;
  a.reqNotifyCq = &reqNotifyCqOps;
  return Status();
}

}  // namespace

Result<const VerbsApi*> loadVerbs(const char* path) {
  std::string lib = path != nullptr ? std::string(path) : params::kIbverbsLib.str();
  if (lib.empty()) lib = "libibverbs.so.1";

  // Results, failures included, are cached per path: dlopen of an absent library is slow-ish and
  // its answer does not change within a process. Libraries are never closed: verbs objects and
  // the function pointers handed out live as long as the process.
  static std::mutex mu;
  static auto* cache = new std::map<std::string, Result<Loaded*>>();
  static int slotsUsed = 0;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(lib);
  if (it == cache->end()) {
    Result<Loaded*> result = [&]() -> Result<Loaded*> {
      void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* err = dlerror();
        return LOOM_ERROR(kSystem, "cannot load the verbs library {}: {}", lib,
                          err != nullptr ? err : "unknown error");
      }
      if (slotsUsed == kMaxLibraries) {
        return LOOM_ERROR(kInternal, "too many verbs libraries loaded (at most {}); {} refused",
                          kMaxLibraries, lib);
      }
      auto* l = new Loaded();  // lives for the process, as the library does
      l->api.path = lib;
      Status st = fill(h, l);
      if (!st.isOk()) {
        delete l;
        return st;
      }
      bindSlot(slotsUsed++, l);
      LOOM_INFO(kSubNet, "loaded the verbs library {}{}{}", lib,
                l->api.regDmabufMr != nullptr ? " (dma-buf registration available)" : "",
                l->queryGidExRaw != nullptr ? "" : " (no ibv_query_gid_ex)");
      return l;
    }();
    it = cache->emplace(lib, std::move(result)).first;
  }
  if (!it->second.isOk()) return it->second.status();
  return const_cast<const VerbsApi*>(&it->second.value()->api);
}

}  // namespace ib
}  // namespace loom
