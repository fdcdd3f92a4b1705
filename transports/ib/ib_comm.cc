#include "transports/ib/ib_comm.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "transports/ib/gdr.h"
#include "transports/ib/ib_errors.h"

namespace loom {
namespace ib {
namespace {

// wr_id: kind in the top 4 bits, a sequence number or request index below.
enum WrKind : uint64_t { kWrNone = 0, kWrImm = 1, kWrCts = 2, kWrFlush = 3, kWrRecv = 4 };
uint64_t wrId(WrKind kind, uint64_t value) {
  return (uint64_t(kind) << 60) | (value & ((1ull << 60) - 1));
}
WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 60); }
uint64_t wrValue(uint64_t id) { return id & ((1ull << 60) - 1); }

constexpr int kRecvsPerQp = 2 * kMaxRequests;  // posted zero-length receives for the immediates
constexpr int kWantSendWr = 1024;
constexpr size_t kSplitMin = 64 * 1024;  // smaller payloads travel on one queue pair
constexpr size_t kMaxWriteCap = size_t(1) << 30;
constexpr int64_t kSockCheckNs = 1000000;  // how often an incomplete request checks the peer

// Comms take no completion channel whose fd is at or above this: three quarters of the process's
// limit of open files.
int channelFdLimit() {
  static const int limit = [] {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1 << 20;
    return static_cast<int>(std::min<rlim_t>(r.rlim_cur, 1 << 22) / 4 * 3);
  }();
  return limit;
}

// The opcode of an error completion is undefined: the work request's kind says what failed.
const char* opName(uint64_t wrIdValue) {
  switch (wrKind(wrIdValue)) {
    case kWrNone:
      return "RDMA write of payload";
    case kWrImm:
      return "RDMA write with immediate";
    case kWrCts:
      return "clear-to-send RDMA write";
    case kWrFlush:
      return "flush RDMA read";
    case kWrRecv:
      return "receive for an immediate";
  }
  return "work request";
}

template <typename T>
T loadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

}  // namespace

Comm::Comm(Role role, Port* port, int nqps)
    : role_(role), port_(port), nqps_(nqps), portDowns0_(port->downs()) {
  for (auto& r : requests_) r.comm = this;
}

Result<std::unique_ptr<Comm>> Comm::create(Role role, Port* port, int nqps) {
  if (nqps < 1 || nqps > kMaxQps)
    return LOOM_ERROR(kInvalidArgument, "InfiniBand: {} queue pairs per connection (1..{})", nqps,
                      kMaxQps);
  std::unique_ptr<Comm> c(new Comm(role, port, nqps));
  LOOM_TRY(c->setup().withContext("InfiniBand: setting up a connection on " + port->name()));
  return c;
}

Status Comm::setup() {
  const VerbsApi& api = dev()->api();
  const ibv_device_attr& da = dev()->attr();
  maxSendWr_ = std::min(kWantSendWr, da.max_qp_wr > 0 ? da.max_qp_wr : kWantSendWr);
  int maxRecvWr = role_ == Role::kRecv ? kRecvsPerQp : 1;
  int cqe = nqps_ * (maxSendWr_ + maxRecvWr) + 2 * kMaxRequests;
  if (da.max_cqe > 0) cqe = std::min(cqe, da.max_cqe);
  if (api.createCompChannel != nullptr) {
    // A channel is an fd, as the handshake socket each comm keeps: a job of thousands of ranks has
    // thousands of comms, so the channels take fds only while a quarter of the limit is left for
    // everything else.
    channel_ = api.createCompChannel(dev()->ctx());
    const char* why = channel_ == nullptr ? std::strerror(errno) : nullptr;
    if (channel_ != nullptr && channel_->fd >= channelFdLimit())
      why = "file descriptors are scarce";
    if (channel_ != nullptr && !why && !setNonBlocking(channel_->fd).isOk()) why = "fcntl failed";
    if (why != nullptr) {
      if (channel_ != nullptr) api.destroyCompChannel(channel_);
      channel_ = nullptr;
      static std::once_flag said;
      std::call_once(said, [&] {
        LOOM_INFO(kSubNet,
                  "InfiniBand: a connection on {} has no completion channel ({}): its waits nap "
                  "between polls",
                  port_->name(), why);
      });
    }
  }
  cq_ = api.createCq(dev()->ctx(), cqe, nullptr, channel_, 0);
  if (cq_ == nullptr)
    return LOOM_ERROR(kSystem, "ibv_create_cq({}) failed: {}", cqe, std::strerror(errno));
  for (int i = 0; i < nqps_; ++i) {
    LOOM_ASSIGN(ibv_qp * qp, createQp(maxSendWr_, maxRecvWr));
    qps_.push_back(qp);
    dev()->watchQp(qp->qp_num, health_);
    psn_[i] = static_cast<uint32_t>(randomU64() & 0xffffff);
  }
  maxWrite_ = std::min<size_t>(port_->attr.max_msg_sz > 0 ? port_->attr.max_msg_sz : kMaxWriteCap,
                               kMaxWriteCap);
  cts_.reset(new CtsSlot[kMaxRequests]());
  records_.reset(new DoneRecord[kMaxRequests]());
  LOOM_ASSIGN(ctsMr_, dev()->regHost(cts_.get(), sizeof(CtsSlot) * kMaxRequests));
  LOOM_ASSIGN(recordsMr_, dev()->regHost(records_.get(), sizeof(DoneRecord) * kMaxRequests));
  local_.lid = port_->attr.lid;
  local_.linkLayer = port_->attr.link_layer;
  local_.mtu = port_->attr.active_mtu;
  local_.gid = port_->gid;
  return Status();
}

Comm::~Comm() {
  const VerbsApi& api = dev()->api();
  for (ibv_qp* qp : qps_) {
    dev()->unwatchQp(qp->qp_num);
    api.destroyQp(qp);
  }
  if (flushQp_ != nullptr) api.destroyQp(flushQp_);
  if (cq_ != nullptr) {
    drainEvents();  // every event taken is acknowledged: libibverbs waits for that in destroy
    api.destroyCq(cq_);
  }
  if (channel_ != nullptr) api.destroyCompChannel(channel_);
  for (auto& r : requests_)
    if (r.inUse)
      for (int i = 0; i < kMaxRecvs; ++i) dev()->deregister(r.own[i]);
  dev()->deregister(ctsMr_);
  dev()->deregister(recordsMr_);
  dev()->deregister(flushMr_);
}

Result<ibv_qp*> Comm::createQp(int maxSend, int maxRecv) {
  const VerbsApi& api = dev()->api();
  ibv_qp_init_attr ia{};
  ia.send_cq = cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = maxSend;
  ia.cap.max_recv_wr = maxRecv;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.sq_sig_all = 0;
  ibv_qp* qp = api.createQp(dev()->pd(), &ia);
  if (qp == nullptr)
    return LOOM_ERROR(kSystem, "ibv_create_qp (RC, {} send / {} receive entries) failed: {}",
                      maxSend, maxRecv, std::strerror(errno));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = static_cast<uint16_t>(params::kIbPkey.asInt());
  a.port_num = static_cast<uint8_t>(port_->port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (api.modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
      0) {
    int err = errno;
    api.destroyQp(qp);
    return LOOM_ERROR(kSystem, "moving a queue pair to INIT failed: {}", std::strerror(err));
  }
  return qp;
}

Status Comm::toRtr(ibv_qp* qp, const Endpoint& remote, uint32_t qpn, uint32_t psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(local_.mtu, remote.mtu);
  a.dest_qp_num = qpn;
  a.rq_psn = psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.sl = static_cast<uint8_t>(params::kIbSl.asInt());
  a.ah_attr.port_num = static_cast<uint8_t>(port_->port);
  // RoCE needs the GRH; IB uses it only without a LID (routed or unconfigured subnet).
  if (port_->roce || remote.lid == 0) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(port_->gidIndex);
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(params::kIbTc.asInt());
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (dev()->api().modifyQp(qp, &a, mask) != 0)
    return LOOM_ERROR(kSystem, "moving queue pair {:#x} to RTR (peer QP {:#x}) failed: {}",
                      qp->qp_num, qpn, std::strerror(errno));
  return Status();
}

Status Comm::toRts(ibv_qp* qp, uint32_t psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(std::clamp<int64_t>(params::kIbTimeout.asInt(), 1, 31));
  a.retry_cnt = static_cast<uint8_t>(std::clamp<int64_t>(params::kIbRetryCnt.asInt(), 0, 7));
  a.rnr_retry = 7;  // infinite: a receiver that posts late is slow, not dead
  a.sq_psn = psn;
  a.max_rd_atomic = 1;
  int mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
             IBV_QP_MAX_QP_RD_ATOMIC;
  if (dev()->api().modifyQp(qp, &a, mask) != 0)
    return LOOM_ERROR(kSystem, "moving queue pair {:#x} to RTS failed: {}", qp->qp_num,
                      std::strerror(errno));
  return Status();
}

void Comm::describe(EndpointWire* w, uint64_t secret) const {
  std::memset(w, 0, sizeof(*w));
  w->magic = kIbWireMagic;
  w->secret = secret;
  w->version = kIbWireVersion;
  w->nqps = static_cast<uint32_t>(nqps_);
  w->lid = local_.lid;
  w->linkLayer = local_.linkLayer;
  w->mtu = static_cast<uint8_t>(local_.mtu);
  std::memcpy(w->gid, local_.gid.raw, 16);
  if (role_ == Role::kSend) {
    w->bufAddr = reinterpret_cast<uint64_t>(cts_.get());
    w->bufRkey = ctsMr_->mr->rkey;
  } else {
    w->bufAddr = reinterpret_cast<uint64_t>(records_.get());
    w->bufRkey = recordsMr_->mr->rkey;
  }
  for (int i = 0; i < nqps_; ++i) w->qps[i] = QpWire{qps_[i]->qp_num, psn_[i]};
  std::snprintf(w->device, sizeof(w->device), "%s", port_->name().c_str());
}

Status Comm::connect(const EndpointWire& remote, const std::string& peer) {
  peer_ = fmt::format("{} ({})", peer,
                      std::string(remote.device, strnlen(remote.device, sizeof(remote.device))));
  if (static_cast<int>(remote.nqps) != nqps_)
    return LOOM_ERROR(kRemote, "InfiniBand: {} has {} queue pairs, this end {}", peer_, remote.nqps,
                      nqps_);
  Endpoint r;
  r.lid = remote.lid;
  r.linkLayer = remote.linkLayer;
  r.mtu = static_cast<ibv_mtu>(remote.mtu);
  std::memcpy(r.gid.raw, remote.gid, 16);
  if ((r.linkLayer == IBV_LINK_LAYER_ETHERNET) != port_->roce)
    return LOOM_ERROR(kRemote, "InfiniBand: {} is {} but {} is {}", peer_,
                      r.linkLayer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", port_->name(),
                      port_->roce ? "RoCE" : "InfiniBand");
  remoteAddr_ = remote.bufAddr;
  remoteRkey_ = remote.bufRkey;
  for (int i = 0; i < nqps_; ++i) {
    if (role_ == Role::kRecv) LOOM_TRY(postRecvs(i, kRecvsPerQp));
    LOOM_TRY(toRtr(qps_[i], r, remote.qps[i].qpn, remote.qps[i].psn)
                 .withContext("InfiniBand: " + peer_));
    LOOM_TRY(toRts(qps_[i], psn_[i]).withContext("InfiniBand: " + peer_));
  }
  LOOM_INFO(kSubNet, "InfiniBand: {} connection {} <-> {} with {} queue pair(s), MTU {}",
            role_ == Role::kSend ? "send" : "receive", port_->name(), peer_, nqps_,
            128 << std::min(local_.mtu, r.mtu));
  return Status();
}

Status Comm::postRecvs(int qpIndex, int count) {
  for (int k = 0; k < count; ++k) {
    ibv_recv_wr wr{};
    wr.wr_id = wrId(kWrRecv, static_cast<uint64_t>(qpIndex));
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    if (dev()->api().postRecv(qps_[qpIndex], &wr, &bad) != 0)
      return LOOM_ERROR(kSystem, "InfiniBand: posting a receive on queue pair {:#x} failed: {}",
                        qps_[qpIndex]->qp_num, std::strerror(errno));
  }
  return Status();
}

Request* Comm::allocRequest(Request::Kind kind) {
  for (auto& r : requests_) {
    if (r.inUse) continue;
    Comm* c = r.comm;
    r = Request();
    r.comm = c;
    r.kind = kind;
    r.inUse = true;
    if (kind == Request::Kind::kSend) ++sends_;
    if (kind == Request::Kind::kRecv) ++recvs_;
    if (kind == Request::Kind::kFlush) ++flushes_;
    return &r;
  }
  return nullptr;
}

void Comm::freeRequest(Request* r) {
  for (int i = 0; i < kMaxRecvs; ++i) {
    dev()->deregister(r->own[i]);
    r->own[i] = nullptr;
  }
  if (r->kind == Request::Kind::kSend) --sends_;
  if (r->kind == Request::Kind::kRecv) --recvs_;
  if (r->kind == Request::Kind::kFlush) --flushes_;
  r->inUse = false;
}

Status Comm::registerBuffer(Request* r, int i, void* data, size_t size, MemHandle* mh) {
  r->data[i] = data;
  r->size[i] = size;
  if (size == 0) return Status();
  if (data == nullptr)
    return LOOM_ERROR(kInvalidArgument, "InfiniBand: {} bytes at a null pointer", size);
  if (mh != nullptr) {
    if (mh->dev != dev())
      return LOOM_ERROR(kInvalidArgument,
                        "InfiniBand: memory registered on {} used on a connection of {}",
                        mh->dev->name(), dev()->name());
    uintptr_t p = reinterpret_cast<uintptr_t>(data);
    if (p < mh->mr->begin || p + size > mh->mr->end)
      return LOOM_ERROR(kInvalidArgument,
                        "InfiniBand: buffer of {} bytes lies outside its registration", size);
    r->lkey[i] = mh->mr->mr->lkey;
    r->rkey[i] = mh->mr->mr->rkey;
    r->gpu[i] = mh->mr->gpu;
    return Status();
  }
  // Unregistered memory (Loom's own runtime does not register): registered for this request only.
  Result<CachedMr*> m = dev()->gdr().cudaDriver && isGpuPointer(data) ? dev()->regGpu(data, size)
                                                                      : dev()->regHost(data, size);
  if (!m.isOk()) return m.status();
  r->own[i] = m.value();
  r->lkey[i] = m.value()->mr->lkey;
  r->rkey[i] = m.value()->mr->rkey;
  r->gpu[i] = m.value()->gpu;
  return Status();
}

Status Comm::isend(const void* data, size_t size, int tag, MemHandle* mh, void** request) {
  *request = nullptr;
  if (role_ != Role::kSend)
    return LOOM_ERROR(kInvalidUsage, "InfiniBand: isend on a receive comm ({})", peer_);
  progress();
  if (!failure_.isOk()) return failure_;
  if (!peerGone_.isOk()) return peerGone_;
  if (sends_ >= kMaxRequests) return Status();
  Request* r = allocRequest(Request::Kind::kSend);
  r->n = 1;
  r->tag[0] = tag;
  Status st = registerBuffer(r, 0, const_cast<void*>(data), size, mh);
  if (!st.isOk()) {
    freeRequest(r);
    return st;
  }
  unmatched_.push_back(r);
  *request = r;
  matchSends();
  return Status();
}

Status Comm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs,
                   void** request) {
  *request = nullptr;
  if (role_ != Role::kRecv)
    return LOOM_ERROR(kInvalidUsage, "InfiniBand: irecv on a send comm ({})", peer_);
  if (n < 1 || n > kMaxRecvs)
    return LOOM_ERROR(kInvalidArgument, "InfiniBand: grouped receive of {} buffers (1..{})", n,
                      kMaxRecvs);
  progress();
  if (!failure_.isOk()) return failure_;
  if (!peerGone_.isOk()) return peerGone_;
  // Not now while the receives and flushes in flight could not each take a place on the flush
  // queue pair: a receive into GPU memory is followed by its flush, and a caller posts the next
  // receive as soon as one completes, before the flush of the last has completed. Without this a
  // caller whose flushes complete slowly (a loaded host) would pile up more than the queue pair
  // holds.
  if (recvs_ >= kMaxRequests || recvs_ + flushes_ >= kMaxFlushes) return Status();
  Request* r = allocRequest(Request::Kind::kRecv);
  r->n = n;
  for (int i = 0; i < n; ++i) {
    r->tag[i] = tags[i];
    Status st = registerBuffer(r, i, data[i], sizes[i], mhs ? mhs[i] : nullptr);
    if (!st.isOk()) {
      freeRequest(r);
      return st;
    }
  }
  r->seq = recvSeq_++;
  const int slot = static_cast<int>(r->seq % kMaxRequests);
  slotRecv_[slot] = r;
  immCount_[slot] = 0;
  CtsSlot& s = cts_[slot];
  std::memset(&s, 0, sizeof(s));
  for (int i = 0; i < n; ++i) {
    s.e[i] = CtsEntry{reinterpret_cast<uint64_t>(r->data[i]),
                      r->size[i],
                      r->rkey[i],
                      r->tag[i],
                      static_cast<uint32_t>(n),
                      0,
                      r->seq + 1};
  }
  s.head = s.tail = r->seq + 1;
  ibv_sge sge{reinterpret_cast<uint64_t>(&s), sizeof(CtsSlot), ctsMr_->mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId(kWrCts, r->seq);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remoteAddr_ + slot * sizeof(CtsSlot);
  wr.wr.rdma.rkey = remoteRkey_;
  ibv_send_wr* bad = nullptr;
  if (dev()->api().postSend(qps_[0], &wr, &bad) != 0) {
    Status st = LOOM_ERROR(kSystem, "InfiniBand: posting the clear-to-send to {} failed: {}", peer_,
                           std::strerror(errno));
    fail(st);
    freeRequest(r);
    return st;
  }
  *request = r;
  return Status();
}

Status Comm::ensureFlushQp() {
  if (flushQp_ != nullptr) return Status();
  LOOM_ASSIGN(flushQp_, createQp(kMaxFlushes, 1));
  flushScratch_.reset(new char[64]());
  LOOM_ASSIGN(flushMr_, dev()->regHost(flushScratch_.get(), 64));
  uint32_t psn = static_cast<uint32_t>(randomU64() & 0xffffff);
  LOOM_TRY(toRtr(flushQp_, local_, flushQp_->qp_num, psn));
  LOOM_TRY(toRts(flushQp_, psn));
  return Status();
}

Status Comm::iflush(int n, void** data, const size_t* sizes, MemHandle** mhs, void** request) {
  *request = nullptr;
  if (params::kIbGdrFlushDisable.asBool()) return Status();
  // The last GPU buffer that received bytes: reading it through the NIC orders every earlier
  // PCIe write to GPU memory before the read's completion. A buffer without a handle (Loom's
  // runtime passes none for memory the transport registered per message) is looked up in the
  // registration cache, where a GPU allocation's registration stays (regGpu): the flush holds it
  // until it completes.
  int last = -1;
  CachedMr* found = nullptr;
  for (int i = 0; i < n; ++i) {
    if (sizes[i] == 0) continue;
    if (mhs != nullptr && mhs[i] != nullptr) {
      if (mhs[i]->mr->gpu) last = i;
    } else if (dev()->gdr().cudaDriver && isGpuPointer(data[i])) {
      last = i;
    }
  }
  if (last < 0) return Status();
  if (!failure_.isOk()) return failure_;
  // A request slot and a place on the flush queue pair always exist for a flush that follows a
  // receive (irecv keeps receives plus flushes within kMaxFlushes); a caller that issues flushes
  // of its own and never tests them is told, never skipped (the GPU would read bytes that may not
  // have landed).
  if (flushes_ >= kMaxFlushes)
    return LOOM_ERROR(kInvalidUsage,
                      "InfiniBand: {} flushes to {} are in flight, none tested: the most a "
                      "connection takes",
                      flushes_, peer_);
  LOOM_TRY(ensureFlushQp().withContext("InfiniBand: creating the flush queue pair"));
  uint32_t rkey = 0;
  if (mhs != nullptr && mhs[last] != nullptr) {
    rkey = mhs[last]->mr->mr->rkey;
  } else {
    LOOM_ASSIGN(found, dev()->regGpu(data[last], sizes[last]));
    rkey = found->mr->rkey;
  }
  Request* r = allocRequest(Request::Kind::kFlush);  // a slot is free (above)
  r->own[0] = found;
  // On the NIC at once, and local (the flush queue pair reads this process's memory): it waits
  // for the NIC, whether or not the peer is still there (it may have finished and gone).
  r->matched = true;
  ibv_sge sge{reinterpret_cast<uint64_t>(flushScratch_.get()), 1, flushMr_->mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId(kWrFlush, static_cast<uint64_t>(r - requests_));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(data[last]);
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = dev()->api().postSend(flushQp_, &wr, &bad); rc != 0) {
    freeRequest(r);
    return LOOM_ERROR(kSystem, "InfiniBand: posting the flush read failed: {}", std::strerror(rc));
  }
  *request = r;
  return Status();
}

void Comm::fail(const Status& st, bool flushed) {
  // A queue pair in error flushes its other work requests, possibly before the completion that
  // says what went wrong: that one replaces a flush.
  if (!failure_.isOk() && !(failureFlushed_ && !flushed)) return;
  failure_ = st;
  failureFlushed_ = flushed;
  LOOM_WARN("{}", st.message());
}

void Comm::checkHealth() {
  if (!failure_.isOk()) return;
  if (health_->failed())
    fail(LOOM_ERROR(kRemote, "InfiniBand connection to {} failed: {}", peer_, health_->reason()));
  else if (port_->downs() != portDowns0_)
    fail(LOOM_ERROR(kSystem, "InfiniBand connection to {} failed: {}", peer_, port_->downReason()));
  else if (dev()->health().failed())
    fail(LOOM_ERROR(kSystem, "InfiniBand connection to {} failed: {}", peer_,
                    dev()->health().reason()));
}

void Comm::pollCompletions() {
  ibv_wc wcs[16];
  while (true) {
    int got = dev()->api().pollCq(cq_, 16, wcs);
    if (got < 0) {
      fail(LOOM_ERROR(kSystem, "InfiniBand: polling the completion queue of {} failed", peer_));
      return;
    }
    for (int k = 0; k < got; ++k) {
      const ibv_wc& wc = wcs[k];
      if (wc.status != IBV_WC_SUCCESS) {
        // A remote access error: the peer deregistered the buffer, as a rank that failed does.
        Status st(Code::kRemote,
                  "InfiniBand: " + describeCompletion(dev()->api(), wc, opName(wc.wr_id), peer_));
        if (wc.status == IBV_WC_REM_ACCESS_ERR) st = st.withCause(Cause::kPeerGone);
        fail(st, wc.status == IBV_WC_WR_FLUSH_ERR);
        continue;
      }
      switch (wrKind(wc.wr_id)) {
        case kWrImm: {
          int slot = static_cast<int>(wrValue(wc.wr_id) % kMaxRequests);
          if (--slotPending_[slot] == 0) {
            for (Request* r : slotReqs_[slot]) r->done = true;
            slotReqs_[slot].clear();
          }
          break;
        }
        case kWrFlush:
          requests_[wrValue(wc.wr_id)].done = true;
          break;
        case kWrRecv: {
          uint32_t seq = ntohl(wc.imm_data);
          int slot = static_cast<int>(seq % kMaxRequests);
          int qpi = static_cast<int>(wrValue(wc.wr_id));
          Status st = postRecvs(qpi, 1);
          if (!st.isOk()) fail(st);
          if (++immCount_[slot] == nqps_) finishRecv(slot);
          break;
        }
        default:
          break;
      }
    }
    if (got < 16) return;
  }
}

void Comm::finishRecv(int slot) {
  Request* r = slotRecv_[slot];
  if (r == nullptr) return;
  slotRecv_[slot] = nullptr;
  const DoneRecord& d = records_[slot];
  Status valid = checkDoneRecord(d, r->seq, r->n, r->size);
  if (!valid.isOk()) {
    fail(valid.withContext(fmt::format("InfiniBand: receive {} from {}", r->seq, peer_)));
    return;
  }
  switch (static_cast<DoneError>(d.error)) {
    case DoneError::kNone:
      break;
    case DoneError::kTruncated:
      r->error = LOOM_ERROR(kRemote,
                            "InfiniBand: message truncated: {} sent {} bytes with tag {}, the "
                            "receive buffer holds {}",
                            peer_, d.errSize, d.errTag, d.errCapacity)
                     .withCause(Cause::kMismatch);
      break;
    case DoneError::kTagMismatch:
      r->error = LOOM_ERROR(kRemote,
                            "InfiniBand: tag mismatch: {} sent a {}-byte message with tag {} that "
                            "no buffer of the receive is posted for",
                            peer_, d.errSize, d.errTag)
                     .withCause(Cause::kMismatch);
      break;
    default:
      r->error = LOOM_ERROR(kRemote, "InfiniBand: {} failed to fill receive buffer {} (tag {})",
                            peer_, d.errIndex, d.errTag);
  }
  for (int i = 0; i < r->n; ++i) r->received[i] = d.sizes[i];
  r->done = true;
}

void Comm::matchSends() {
  while (failure_.isOk() && !unmatched_.empty()) {
    const int slot = static_cast<int>(sendSeq_ % kMaxRequests);
    const CtsSlot& s = cts_[slot];
    const uint64_t want = sendSeq_ + 1;
    if (loadAcquire(&s.head) != want || loadAcquire(&s.tail) != want) return;
    // Judged on a copy, so that what was checked is what is used.
    CtsSlot copy;
    std::memcpy(&copy, &s, sizeof(copy));
    Result<bool> complete = ctsComplete(copy, want);
    if (!complete.isOk()) {
      fail(complete.status().withContext(fmt::format("InfiniBand: from {}", peer_)));
      return;
    }
    if (!complete.value()) return;  // still arriving
    const uint32_t n = copy.e[0].n;
    if (unmatched_.size() < n) return;  // the receive's other sends come later
    std::vector<Request*> reqs(unmatched_.begin(), unmatched_.begin() + n);
    unmatched_.erase(unmatched_.begin(), unmatched_.begin() + n);
    Status st = postSlot(copy, reqs);
    if (!st.isOk()) {
      fail(st);
      return;
    }
    ++sendSeq_;
  }
}

Status Comm::postSlot(const CtsSlot& slot, std::vector<Request*>& reqs) {
  const VerbsApi& api = dev()->api();
  const uint64_t seq = sendSeq_;
  const int s = static_cast<int>(seq % kMaxRequests);
  const int n = static_cast<int>(reqs.size());
  DoneRecord& rec = records_[s];
  std::memset(&rec, 0, sizeof(rec));
  rec.seq = seq + 1;
  bool used[kMaxRecvs] = {};
  std::vector<ibv_send_wr> wrs[kMaxQps];
  std::vector<ibv_sge> sges[kMaxQps];
  for (int q = 0; q < nqps_; ++q) sges[q].reserve(64), wrs[q].reserve(64);
  auto addWrite = [&](int q, uint64_t local, uint32_t lkey, uint64_t len, uint64_t raddr,
                      uint32_t rkey) {
    sges[q].push_back(ibv_sge{local, static_cast<uint32_t>(len), lkey});
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrNone, 0);
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    wrs[q].push_back(wr);
  };
  for (int j = 0; j < n; ++j) {
    Request* r = reqs[j];
    int k = -1;
    for (int i = 0; i < n; ++i) {
      if (!used[i] && slot.e[i].tag == r->tag[0]) {
        k = i;
        break;
      }
    }
    if (k < 0) {
      r->error = LOOM_ERROR(kInvalidUsage,
                            "InfiniBand: tag mismatch: a {}-byte send with tag {} to {} matches "
                            "no buffer of the posted receive",
                            r->size[0], r->tag[0], peer_)
                     .withCause(Cause::kMismatch);
      rec.error = static_cast<uint32_t>(DoneError::kTagMismatch);
      rec.errTag = r->tag[0];
      rec.errSize = r->size[0];
      continue;
    }
    used[k] = true;
    const CtsEntry& e = slot.e[k];
    if (r->size[0] > e.size) {
      r->error = LOOM_ERROR(kInvalidUsage,
                            "InfiniBand: message truncated: a {}-byte send with tag {} to {} "
                            "exceeds the {}-byte receive buffer",
                            r->size[0], r->tag[0], peer_, e.size)
                     .withCause(Cause::kMismatch);
      rec.error = static_cast<uint32_t>(DoneError::kTruncated);
      rec.errIndex = k;
      rec.errTag = r->tag[0];
      rec.errSize = r->size[0];
      rec.errCapacity = e.size;
      continue;
    }
    rec.sizes[k] = r->size[0];
    const uint64_t size = r->size[0];
    if (size == 0) continue;
    const uint64_t local = reinterpret_cast<uint64_t>(r->data[0]);
    // Large payloads are cut into one contiguous part per queue pair (4 KiB multiples); each part
    // into writes the port accepts.
    int parts = size >= kSplitMin ? nqps_ : 1;
    uint64_t per = (size + parts - 1) / parts;
    per = (per + 4095) & ~uint64_t(4095);
    for (int p = 0; p < parts; ++p) {
      uint64_t b = per * p, end = std::min<uint64_t>(size, b + per);
      int q = parts == 1 ? static_cast<int>(seq % nqps_) : p;
      for (uint64_t off = b; off < end; off += maxWrite_) {
        uint64_t len = std::min<uint64_t>(maxWrite_, end - off);
        addWrite(q, local + off, r->lkey[0], len, e.addr + off, e.rkey);
      }
    }
  }
  for (int i = 0; i < n; ++i)
    if (!used[i] && rec.error == 0) {
      rec.error = static_cast<uint32_t>(DoneError::kMissing);
      rec.errIndex = i;
      rec.errTag = slot.e[i].tag;
    }
  addWrite(0, reinterpret_cast<uint64_t>(&rec), recordsMr_->mr->lkey, sizeof(rec),
           remoteAddr_ + s * sizeof(DoneRecord), remoteRkey_);
  for (int q = 0; q < nqps_; ++q) {
    ibv_send_wr imm{};
    imm.wr_id = wrId(kWrImm, seq);
    imm.num_sge = 0;
    imm.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    imm.send_flags = IBV_SEND_SIGNALED;
    imm.imm_data = htonl(static_cast<uint32_t>(seq));
    // The receiver ignores the address of a zero-length write; point it at the record array.
    imm.wr.rdma.remote_addr = remoteAddr_;
    imm.wr.rdma.rkey = remoteRkey_;
    wrs[q].push_back(imm);
    for (size_t w = 0; w < wrs[q].size(); ++w) {
      if (wrs[q][w].num_sge == 1) wrs[q][w].sg_list = &sges[q][w];
      wrs[q][w].next = w + 1 < wrs[q].size() ? &wrs[q][w + 1] : nullptr;
    }
  }
  slotPending_[s] = nqps_;
  for (Request* r : reqs) {
    r->matched = true;
    if (r->error.isOk()) slotReqs_[s].push_back(r);
  }
  for (int q = 0; q < nqps_; ++q) {
    ibv_send_wr* bad = nullptr;
    if (api.postSend(qps_[q], wrs[q].data(), &bad) != 0)
      return LOOM_ERROR(kSystem,
                        "InfiniBand: posting {} RDMA writes to {} on queue pair {:#x} failed: {} "
                        "(send queue of {} entries full?)",
                        wrs[q].size(), peer_, qps_[q]->qp_num, std::strerror(errno), maxSendWr_);
  }
  return Status();
}

void Comm::progress() {
  checkHealth();
  if (!failure_.isOk()) return;
  pollCompletions();
  if (role_ == Role::kSend) matchSends();
}

Status Comm::test(Request* r, int* done, size_t* sizes) {
  *done = 0;
  progress();
  auto finish = [&](Status st) {
    if (st.isOk() && sizes != nullptr) {
      if (r->kind == Request::Kind::kRecv)
        for (int i = 0; i < r->n; ++i) sizes[i] = r->received[i];
      else if (r->kind == Request::Kind::kSend)
        sizes[0] = r->size[0];
    }
    freeRequest(r);
    *done = 1;
    return st;
  };
  if (!r->error.isOk()) {
    // A send that failed alone stays in its slot's list until the slot completes; drop it.
    for (auto& v : slotReqs_) v.erase(std::remove(v.begin(), v.end(), r), v.end());
    return finish(r->error);
  }
  if (r->done) return finish(Status());
  if (!failure_.isOk()) {
    Status st = failure_;
    for (auto& v : slotReqs_) v.erase(std::remove(v.begin(), v.end(), r), v.end());
    unmatched_.erase(std::remove(unmatched_.begin(), unmatched_.end(), r), unmatched_.end());
    for (auto& s : slotRecv_)
      if (s == r) s = nullptr;
    return finish(st);
  }
  // A peer that went away never serves a request that has nothing on the wire yet (a send
  // waiting for its clear-to-send, a receive waiting for data): the handshake socket's end-of-file
  // says so. A send already written waits for the NIC instead: its acknowledgement may still be
  // on the way (the peer may have closed right after receiving), else the retries run out.
  checkPeer();
  if (!peerGone_.isOk()) {
    pollCompletions();
    if (r->done) return finish(Status());
    if (!r->matched) {
      unmatched_.erase(std::remove(unmatched_.begin(), unmatched_.end(), r), unmatched_.end());
      for (auto& s : slotRecv_)
        if (s == r) s = nullptr;
      return finish(peerGone_);
    }
  }
  return Status();
}

void Comm::drainEvents() {
  if (channel_ == nullptr || cq_ == nullptr) return;
  const VerbsApi& api = dev()->api();
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (api.getCqEvent(channel_, &cq, &context) == 0) {
    api.ackCqEvents(cq, 1);
    armed_ = false;
  }
}

Comm::WaitKind Comm::prepareWait(std::vector<pollfd>* fds) {
  if (!failure_.isOk() || !peerGone_.isOk()) return WaitKind::kReady;
  drainEvents();
  if (channel_ != nullptr && !armed_) armed_ = dev()->api().reqNotifyCq(cq_, 0) == 0;
  // What completed before the arming raised no event: take it now.
  progress();
  if (!failure_.isOk()) return WaitKind::kReady;
  if (channel_ != nullptr) fds->push_back({channel_->fd, POLLIN, 0});
  if (sock_.valid()) fds->push_back({sock_.get(), POLLIN, 0});
  if (!armed_ || !unmatched_.empty()) return WaitKind::kNap;
  return WaitKind::kSleep;
}

void Comm::checkPeer() {
  int64_t now = nowNs();
  if (!sock_.valid() || now - lastSockCheckNs_ < kSockCheckNs) return;
  lastSockCheckNs_ = now;
  pollfd pfd{sock_.get(), POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return;
  char b;
  ssize_t got = ::recv(sock_.get(), &b, 1, MSG_DONTWAIT);
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    peerGone_ = LOOM_ERROR(kRemote,
                           "InfiniBand: {} closed the connection with requests in flight (its "
                           "process exited, failed or closed its comm)",
                           peer_)
                    .withCause(Cause::kPeerGone);
    LOOM_INFO(kSubNet, "{}", peerGone_.message());
    sock_.reset();
  }
}

}  // namespace ib
}  // namespace loom
