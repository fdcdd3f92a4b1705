// The exported entry points: libibverbs' signatures (rdma-core 44) over the engine, and the test
// controls of fake_verbs.h. Errors follow libibverbs: pointers are null with errno set, ints are
// errno values unless noted.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/transports/ib/fake_verbs/engine.h"
#include "tests/transports/ib/fake_verbs/fake_verbs.h"

// verbs.h wraps these in macros of the same name; the library defines the functions themselves.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

using namespace fakeverbs;

namespace {

Qp* qpOf(ibv_qp* qp) { return reinterpret_cast<QpHandle*>(qp)->impl; }
Cq* cqOf(ibv_cq* cq) { return reinterpret_cast<CqHandle*>(cq)->impl; }
Pd* pdOf(ibv_pd* pd) { return reinterpret_cast<PdHandle*>(pd)->impl; }
Context* ctxOf(ibv_context* ctx) { return reinterpret_cast<ContextHandle*>(ctx)->impl; }
Device* devOf(ibv_device* dev) { return reinterpret_cast<DeviceHandle*>(dev)->impl; }

int opsPostSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* qp = qpOf(ibqp);
  for (; wr != nullptr; wr = wr->next) {
    int rc = postSendOne(engine(), *qp, wr);
    if (rc != 0) {
      *bad = wr;
      return rc;
    }
  }
  return 0;
}

int opsPostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* qp = qpOf(ibqp);
  for (; wr != nullptr; wr = wr->next) {
    int rc = postRecvOne(engine(), *qp, wr);
    if (rc != 0) {
      *bad = wr;
      return rc;
    }
  }
  return 0;
}

int opsPollCq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  Cq* cq = cqOf(ibcq);
  if (n <= 0) return 0;
  Cqe out[64];
  int got = 0;
  while (got < n) {
    int batch = 0;
    {
      std::lock_guard<std::mutex> lock(cq->mu);
      while (batch < 64 && got + batch < n && !cq->q.empty()) {
        out[batch++] = std::move(cq->q.front());
        cq->q.pop_front();
      }
    }
    if (batch == 0) break;
    for (int i = 0; i < batch; ++i) {
      wc[got + i] = out[i].wc;
      // Queue slots come back when the completion is polled, as with mlx5.
      if (auto qp = out[i].qp.lock()) {
        if (qp->gen.load() == out[i].gen) {
          (out[i].send ? qp->sqUsed : qp->rqUsed).fetch_sub(int(out[i].release));
        }
      }
      out[i].qp.reset();
    }
    got += batch;
  }
  return got;
}

int opsReqNotifyCq(ibv_cq* ibcq, int solicitedOnly) {
  Cq* cq = cqOf(ibcq);
  if (cq->channel == nullptr) return EINVAL;
  if (solicitedOnly != 0) return EOPNOTSUPP;  // not emulated (fake_verbs.h)
  std::lock_guard<std::mutex> lock(cq->mu);
  cq->armed = true;
  return 0;
}

// Takes one count off a channel's eventfd without blocking, whatever O_NONBLOCK the user set.
void consumeEventCount(Channel* ch) {
  pollfd p{ch->ch.fd, POLLIN, 0};
  uint64_t v = 0;
  if (::poll(&p, 1, 0) == 1) (void)!::read(ch->ch.fd, &v, sizeof(v));
}

bool deviceAlive(Context* ctx) {
  if (ctx->dev->fatal.load()) {
    errno = EIO;
    return false;
  }
  return true;
}

}  // namespace

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
  std::vector<DeviceConfig> cfgs;
  std::string error;
  if (!parseDevices(std::getenv("LOOMTEST_FAKEVERBS_DEVICES"), &cfgs, &error)) {
    std::fprintf(stderr, "loomtest-fakeverbs: LOOMTEST_FAKEVERBS_DEVICES: %s\n", error.c_str());
    errno = EINVAL;
    return nullptr;
  }
  Engine& e = engine();
  std::vector<Device*> devs;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    for (const DeviceConfig& c : cfgs) {
      Device* found = nullptr;
      for (auto& d : e.devices) {
        if (!d->retired && d->spec == c.spec) found = d.get();
      }
      if (found == nullptr) found = createDevice(e, c, &error);
      if (found == nullptr) {
        std::fprintf(stderr, "loomtest-fakeverbs: %s\n", error.c_str());
        errno = EADDRINUSE;
        return nullptr;
      }
      devs.push_back(found);
    }
  }
  auto** list = static_cast<ibv_device**>(std::calloc(devs.size() + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); ++i) list[i] = &devs[i]->h.dev;
  if (num != nullptr) *num = int(devs.size());
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* dev) { return dev->name; }

__be64 ibv_get_device_guid(ibv_device* dev) { return htobe64(devOf(dev)->guid); }

ibv_context* ibv_open_device(ibv_device* ibdev) {
  Device* dev = devOf(ibdev);
  if (dev->fatal.load()) {
    errno = EIO;
    return nullptr;
  }
  Engine& e = engine();
  auto* c = new Context();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    delete c;
    return nullptr;
  }
  registerFd(fds[0]);
  registerFd(fds[1]);
  c->asyncRead = fds[0];
  c->asyncWrite = fds[1];
  c->dev = dev;
  std::memset(&c->h, 0, sizeof(c->h));
  c->h.impl = c;
  ibv_context& ctx = c->h.ctx;
  ctx.device = ibdev;
  ctx.ops.post_send = opsPostSend;
  ctx.ops.post_recv = opsPostRecv;
  ctx.ops.poll_cq = opsPollCq;
  ctx.ops.req_notify_cq = opsReqNotifyCq;
  ctx.cmd_fd = -1;
  ctx.async_fd = fds[0];
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  {
    std::lock_guard<std::mutex> lock(e.mu);
    dev->contexts.push_back(c);
  }
  e.nContexts.fetch_add(1);
  return &ctx;
}

int ibv_close_device(ibv_context* ibctx) {
  Context* c = ctxOf(ibctx);
  Engine& e = engine();
  {
    std::lock_guard<std::mutex> lock(e.mu);
    auto& v = c->dev->contexts;
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == c) {
        v.erase(v.begin() + long(i));
        break;
      }
    }
  }
  closeFd(c->asyncWrite);
  closeFd(c->asyncRead);
  pthread_mutex_destroy(&c->h.ctx.mutex);
  delete c;
  e.nContexts.fetch_sub(1);
  return 0;
}

int ibv_query_device(ibv_context* ibctx, ibv_device_attr* attr) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return EIO;
  std::memset(attr, 0, sizeof(*attr));
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "0.0.0 loomtest-fakeverbs");
  attr->node_guid = htobe64(c->dev->guid);
  attr->sys_image_guid = htobe64(c->dev->guid);
  attr->max_mr_size = uint64_t(1) << 40;
  attr->page_size_cap = 0xfffff000;
  attr->vendor_id = 0x02c9;
  attr->vendor_part_id = 4123;
  attr->hw_ver = 0;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = 32768;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  attr->max_sge = 32;
  attr->max_sge_rd = 32;
  attr->max_cq = 1 << 16;
  attr->max_cqe = 1 << 22;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->max_res_rd_atom = 1 << 20;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 128;
  attr->phys_port_cnt = uint8_t(c->dev->ports.size());
  return 0;
}

// The exported function takes the pre-rdma-core port attributes: everything up to link_layer.
int ibv_query_port(ibv_context* ibctx, uint8_t portNum, struct _compat_ibv_port_attr* out) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return EIO;
  if (portNum < 1 || portNum > c->dev->ports.size()) return EINVAL;
  const Port& p = *c->dev->ports[portNum - 1];
  ibv_port_attr a;
  std::memset(&a, 0, sizeof(a));
  bool up = p.active.load();
  a.state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = p.cfg.roce ? IBV_MTU_1024 : IBV_MTU_4096;
  a.gid_tbl_len = int(p.gids.size());
  a.port_cap_flags = 0;
  a.max_msg_sz = 0x80000000u;
  a.pkey_tbl_len = 128;
  a.lid = p.cfg.roce ? 0 : p.addr;
  a.sm_lid = p.cfg.roce ? 0 : 1;
  a.max_vl_num = 4;
  a.subnet_timeout = 18;
  a.active_width = p.cfg.width;
  a.active_speed = p.cfg.speed;
  a.phys_state = up ? 5 : 3;  // LinkUp : Disabled
  a.link_layer = p.cfg.roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  std::memcpy(static_cast<void*>(out), &a, offsetof(ibv_port_attr, link_layer) + 1);
  return 0;
}

int ibv_query_gid(ibv_context* ibctx, uint8_t portNum, int index, ibv_gid* gid) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return -1;
  if (portNum < 1 || portNum > c->dev->ports.size()) {
    errno = EINVAL;
    return -1;
  }
  const Port& p = *c->dev->ports[portNum - 1];
  if (index < 0 || size_t(index) >= p.gids.size()) {
    errno = EINVAL;
    return -1;
  }
  *gid = p.gids[size_t(index)];
  return 0;
}

int _ibv_query_gid_ex(ibv_context* ibctx, uint32_t portNum, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entrySize) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return EIO;
  if (flags != 0 || entrySize < sizeof(ibv_gid_entry)) return EINVAL;
  if (portNum < 1 || portNum > c->dev->ports.size()) return EINVAL;
  const Port& p = *c->dev->ports[portNum - 1];
  if (index >= p.gids.size()) return ENODATA;
  std::memset(entry, 0, sizeof(*entry));
  entry->gid = p.gids[index];
  entry->gid_index = index;
  entry->port_num = portNum;
  entry->gid_type = uint32_t(p.gidTypes[index]);
  entry->ndev_ifindex = p.cfg.roce ? 1 : 0;
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* ibctx) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return nullptr;
  auto* pd = new Pd();
  std::memset(&pd->h, 0, sizeof(pd->h));
  pd->h.impl = pd;
  pd->h.pd.context = ibctx;
  pd->ctx = c;
  engine().nPds.fetch_add(1);
  return &pd->h.pd;
}

int ibv_dealloc_pd(ibv_pd* ibpd) {
  Pd* pd = pdOf(ibpd);
  if (pd->refs.load() != 0) return EBUSY;
  delete pd;
  engine().nPds.fetch_sub(1);
  return 0;
}

namespace {

ibv_mr* registerMr(Pd* pd, char* base, uint64_t iova, size_t length, int access, void* map,
                   size_t mapLen) {
  Engine& e = engine();
  auto mr = std::make_shared<Mr>();
  mr->pd = pd;
  mr->iova = iova;
  mr->base = base;
  mr->length = length;
  mr->access = access;
  mr->map = map;
  mr->mapLen = mapLen;
  std::memset(&mr->h, 0, sizeof(mr->h));
  mr->h.impl = mr.get();
  mr->h.mr.context = pd->h.pd.context;
  mr->h.mr.pd = &pd->h.pd;
  mr->h.mr.addr = reinterpret_cast<void*>(uintptr_t(iova));
  mr->h.mr.length = length;
  {
    std::lock_guard<std::mutex> lock(e.mrMu);
    uint32_t key = e.nextKey++;
    mr->h.mr.lkey = key;
    mr->h.mr.rkey = key;
    mr->h.mr.handle = key;
    e.mrs[key] = mr;
  }
  pd->refs.fetch_add(1);
  e.nMrs.fetch_add(1);
  return &mr->h.mr;
}

bool accessValid(int access) {
  // Remote write (and atomics) need local write, as libibverbs' kernel checks.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    return false;
  }
  return true;
}

}  // namespace

ibv_mr* ibv_reg_mr(ibv_pd* ibpd, void* addr, size_t length, int access) {
  engine().nRegMrCalls.fetch_add(1);
  Pd* pd = pdOf(ibpd);
  if (!deviceAlive(pd->ctx)) return nullptr;
  if (!accessValid(access) || (addr == nullptr && length != 0)) {
    errno = EINVAL;
    return nullptr;
  }
  return registerMr(pd, static_cast<char*>(addr), uint64_t(uintptr_t(addr)), length, access,
                    nullptr, 0);
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* ibpd, uint64_t offset, size_t length, uint64_t iova, int fd,
                          int access) {
  Pd* pd = pdOf(ibpd);
  if (!deviceAlive(pd->ctx)) return nullptr;
  const char* env = std::getenv("LOOMTEST_FAKEVERBS_DMABUF");
  if (env != nullptr && std::strcmp(env, "0") == 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!accessValid(access)) {
    errno = EINVAL;
    return nullptr;
  }
  if (fd < 0) {
    errno = EBADF;
    return nullptr;
  }
  long page = ::sysconf(_SC_PAGESIZE);
  uint64_t aligned = offset & ~uint64_t(page - 1);
  size_t mapLen = size_t(offset - aligned) + length;
  if (mapLen == 0) mapLen = size_t(page);
  void* map = ::mmap(nullptr, mapLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(aligned));
  if (map == MAP_FAILED) return nullptr;
  return registerMr(pd, static_cast<char*>(map) + (offset - aligned), iova, length, access, map,
                    mapLen);
}

int ibv_dereg_mr(ibv_mr* ibmr) {
  Mr* mr = reinterpret_cast<MrHandle*>(ibmr)->impl;
  Engine& e = engine();
  Pd* pd = mr->pd;
  std::shared_ptr<Mr> keep;
  {
    std::lock_guard<std::mutex> lock(e.mrMu);
    auto it = e.mrs.find(ibmr->lkey);
    if (it == e.mrs.end() || it->second.get() != mr) return EINVAL;
    keep = std::move(it->second);
    e.mrs.erase(it);
  }
  pd->refs.fetch_sub(1);
  e.nMrs.fetch_sub(1);
  return 0;  // `keep` unmaps a dma-buf mapping here unless a copy still uses it
}

ibv_cq* ibv_create_cq(ibv_context* ibctx, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return nullptr;
  if (channel != nullptr && reinterpret_cast<Channel*>(channel)->ctx != c) {
    errno = EINVAL;
    return nullptr;
  }
  if (cqe < 1 || cqe > (1 << 22)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new Cq();
  std::memset(&cq->h, 0, sizeof(cq->h));
  cq->h.impl = cq;
  cq->h.cq.context = ibctx;
  cq->h.cq.cq_context = cqContext;
  cq->h.cq.cqe = cqe;
  pthread_mutex_init(&cq->h.cq.mutex, nullptr);
  pthread_cond_init(&cq->h.cq.cond, nullptr);
  cq->ctx = c;
  if (channel != nullptr) {
    cq->channel = reinterpret_cast<Channel*>(channel);
    cq->channel->cqRefs.fetch_add(1);
    cq->h.cq.channel = channel;
  }
  engine().nCqs.fetch_add(1);
  return &cq->h.cq;
}

int ibv_destroy_cq(ibv_cq* ibcq) {
  Cq* cq = cqOf(ibcq);
  if (cq->qpRefs.load() != 0) return EBUSY;
  if (Channel* ch = cq->channel) {
    std::lock_guard<std::mutex> lock(ch->mu);
    if (cq->acked.load() != cq->delivered) {
      // libibverbs waits for the missing acknowledgements, forever: say so and stop the test.
      std::fprintf(stderr,
                   "loomtest-fakeverbs: ibv_destroy_cq of a CQ with %llu completion events "
                   "returned and %llu acknowledged would block forever\n",
                   static_cast<unsigned long long>(cq->delivered),
                   static_cast<unsigned long long>(cq->acked.load()));
      std::abort();
    }
    // Events not yet read are dropped with the CQ, as the kernel does.
    for (auto it = ch->events.begin(); it != ch->events.end();) {
      if (*it != cq) {
        ++it;
        continue;
      }
      it = ch->events.erase(it);
      consumeEventCount(ch);
    }
    ch->cqRefs.fetch_sub(1);
  }
  pthread_mutex_destroy(&cq->h.cq.mutex);
  pthread_cond_destroy(&cq->h.cq.cond);
  delete cq;
  engine().nCqs.fetch_sub(1);
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ibctx) {
  Context* c = ctxOf(ibctx);
  if (!deviceAlive(c)) return nullptr;
  const char* env = std::getenv("LOOMTEST_FAKEVERBS_CHANNELS");
  if (env != nullptr && std::strcmp(env, "0") == 0) {
    errno = EMFILE;  // a process out of file descriptors
    return nullptr;
  }
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  registerFd(fd);
  auto* ch = new Channel();
  ch->ctx = c;
  ch->ch.context = ibctx;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  engine().nChannels.fetch_add(1);
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<Channel*>(channel);
  if (ch->cqRefs.load() != 0) return EBUSY;
  closeFd(ch->ch.fd);
  delete ch;
  engine().nChannels.fetch_sub(1);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cqOut, void** cqContext) {
  auto* ch = reinterpret_cast<Channel*>(channel);
  uint64_t v = 0;
  // Blocks unless the user made the fd O_NONBLOCK (then -1 with EAGAIN while none is queued).
  if (::read(ch->ch.fd, &v, sizeof(v)) != static_cast<ssize_t>(sizeof(v))) return -1;
  std::lock_guard<std::mutex> lock(ch->mu);
  if (ch->events.empty()) {  // its CQ was destroyed meanwhile
    errno = EAGAIN;
    return -1;
  }
  Cq* cq = ch->events.front();
  ch->events.pop_front();
  ++cq->delivered;
  *cqOut = &cq->h.cq;
  *cqContext = cq->h.cq.cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* ibcq, unsigned int nevents) { cqOf(ibcq)->acked.fetch_add(nevents); }

ibv_qp* ibv_create_qp(ibv_pd* ibpd, ibv_qp_init_attr* attr) {
  Pd* pd = pdOf(ibpd);
  if (!deviceAlive(pd->ctx)) return nullptr;
  const ibv_qp_cap& cap = attr->cap;
  if (attr->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr || attr->srq != nullptr ||
      cap.max_send_wr > 32768 || cap.max_recv_wr > 32768 || cap.max_send_sge > 32 ||
      cap.max_recv_sge > 32 || cap.max_inline_data > 1024) {
    errno = EINVAL;
    return nullptr;
  }
  Engine& e = engine();
  auto qp = std::make_shared<Qp>();
  qp->ctx = pd->ctx;
  qp->dev = pd->ctx->dev;
  qp->pd = pd;
  qp->scq = cqOf(attr->send_cq);
  qp->rcq = cqOf(attr->recv_cq);
  qp->maxSend = cap.max_send_wr;
  qp->maxRecv = cap.max_recv_wr;
  qp->maxSendSge = cap.max_send_sge;
  qp->maxRecvSge = cap.max_recv_sge;
  qp->maxInline = cap.max_inline_data;
  qp->sigAll = attr->sq_sig_all != 0;
  std::memset(&qp->h, 0, sizeof(qp->h));
  qp->h.impl = qp.get();
  ibv_qp& q = qp->h.qp;
  q.context = pd->h.pd.context;
  q.qp_context = attr->qp_context;
  q.pd = ibpd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.state = IBV_QPS_RESET;
  q.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  {
    std::lock_guard<std::mutex> lock(e.mu);
    q.qp_num = (e.nextQpn++) & 0xffffff;
    q.handle = q.qp_num;
    e.qps[q.qp_num] = qp;
  }
  pd->refs.fetch_add(1);
  qp->scq->qpRefs.fetch_add(1);
  qp->rcq->qpRefs.fetch_add(1);
  e.nQps.fetch_add(1);
  return &q;
}

int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  Qp* qp = qpOf(ibqp);
  if (qp->dev->fatal.load() && !((mask & IBV_QP_STATE) && (attr->qp_state == IBV_QPS_ERR ||
                                                           attr->qp_state == IBV_QPS_RESET))) {
    return EIO;
  }
  return modifyQp(engine(), *qp, attr, mask);
}

int ibv_destroy_qp(ibv_qp* ibqp) {
  Qp* raw = qpOf(ibqp);
  Engine& e = engine();
  std::shared_ptr<Qp> qp;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    auto it = e.qps.find(ibqp->qp_num);
    if (it == e.qps.end() || it->second.get() != raw) return EINVAL;
    qp = std::move(it->second);
    e.qps.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(qp->mu);
    destroyQpLocked(e, *qp);
  }
  qp->scq->qpRefs.fetch_sub(1);
  qp->rcq->qpRefs.fetch_sub(1);
  qp->pd->refs.fetch_sub(1);
  pthread_mutex_destroy(&qp->h.qp.mutex);
  pthread_cond_destroy(&qp->h.qp.cond);
  e.nQps.fetch_sub(1);
  return 0;
}

int ibv_get_async_event(ibv_context* ibctx, ibv_async_event* event) {
  Context* c = ctxOf(ibctx);
  char b;
  ssize_t r = ::read(c->asyncRead, &b, 1);
  if (r != 1) {
    if (r == 0) errno = EIO;
    return -1;
  }
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = c->events.front();
  c->events.pop_front();
  return 0;
}

void ibv_ack_async_event(ibv_async_event*) {}

const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const kNames[] = {"success",
                                       "local length error",
                                       "local QP operation error",
                                       "local EE context operation error",
                                       "local protection error",
                                       "Work Request Flushed Error",
                                       "memory management operation error",
                                       "bad response error",
                                       "local access error",
                                       "remote invalid request error",
                                       "remote access error",
                                       "remote operation error",
                                       "transport retry counter exceeded",
                                       "RNR retry counter exceeded",
                                       "local RDD violation error",
                                       "remote invalid RD request",
                                       "aborted error",
                                       "invalid EE context number",
                                       "invalid EE context state",
                                       "fatal error",
                                       "response timeout error",
                                       "general error",
                                       "TM error",
                                       "TM software rendezvous"};
  size_t i = size_t(status);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "unknown";
}

const char* ibv_event_type_str(ibv_event_type event) {
  static const char* const kNames[] = {"CQ error",
                                       "local work queue catastrophic error",
                                       "invalid request local work queue error",
                                       "local access violation work queue error",
                                       "communication established",
                                       "send queue drained",
                                       "path migrated",
                                       "path migration request error",
                                       "local catastrophic error",
                                       "port active",
                                       "port error",
                                       "LID change",
                                       "P_Key change",
                                       "SM change",
                                       "SRQ catastrophic error",
                                       "SRQ limit reached",
                                       "last WQE reached",
                                       "client reregistration",
                                       "GID table change",
                                       "WQ fatal"};
  size_t i = size_t(event);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "unknown";
}

int loomtest_fakeverbs_set_port_state(const char* dev, int port, int active) {
  if (dev == nullptr) return -1;
  return setPortState(engine(), dev, port, active != 0);
}

int loomtest_fakeverbs_device_fatal(const char* dev) {
  if (dev == nullptr) return -1;
  return deviceFatal(engine(), dev);
}

int loomtest_fakeverbs_count(const char* kind) {
  Engine& e = engine();
  if (kind == nullptr) return -1;
  std::string k = kind;
  if (k == "context") return e.nContexts.load();
  if (k == "pd") return e.nPds.load();
  if (k == "mr") return e.nMrs.load();
  if (k == "cq") return e.nCqs.load();
  if (k == "channel") return e.nChannels.load();
  if (k == "qp") return e.nQps.load();
  if (k == "reg_mr_calls") return e.nRegMrCalls.load();
  return -1;
}

}  // extern "C"
