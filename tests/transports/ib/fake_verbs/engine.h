// The emulated device's objects and the per-process engine that connects QPs across processes
// (fake_verbs.h says what is emulated). Internal to libloom-fakeverbs.so.
//
// Locking, outermost first: Engine::mu (tables) -> Qp::mu -> Engine::linksMu -> Cq::mu,
// Channel::mu, Context::mu, Link::mu, Engine::timerMu, Engine::mrMu (leaves). Completions are
// pushed under the QP's lock, so a QP's completions keep their order and stop when the QP is
// destroyed.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tests/transports/ib/fake_verbs/device_config.h"

namespace fakeverbs {

using Clock = std::chrono::steady_clock;

struct Engine;
struct Device;
struct Context;
struct Qp;

// Bytes owned by the emulator: a send's gathered payload, a received request's payload.
struct Buffer {
  explicit Buffer(size_t n) : data(n != 0 ? new char[n] : nullptr), size(n) {}
  std::unique_ptr<char[]> data;
  size_t size;
};
using BufferPtr = std::shared_ptr<const Buffer>;

// One message between engines: a request (requester -> responder) or its answer.
enum MsgType : uint8_t { kReq = 1, kAck = 2, kNak = 3, kReadResp = 4 };
enum NakKind : uint8_t {
  kNakDead = 1,   // no such QP, not ready, port down, wrong source: the requester retries
  kNakSeq,        // out of sequence after an earlier NAK: the requester retries
  kNakRemAccess,  // IBV_WC_REM_ACCESS_ERR
  kNakRemInvReq,  // IBV_WC_REM_INV_REQ_ERR
  kNakRemOp,      // IBV_WC_REM_OP_ERR
  kNakRnrExc,     // IBV_WC_RNR_RETRY_EXC_ERR
};
struct Wire {
  uint32_t magic = 0;
  uint8_t type = 0;
  uint8_t opcode = 0;  // enum ibv_wr_opcode of a request
  uint8_t nak = 0;
  uint8_t rnrRetry = 0;
  uint32_t srcQpn = 0;
  uint32_t dstQpn = 0;
  uint16_t srcAddr = 0;
  uint16_t dstAddr = 0;
  uint32_t imm = 0;  // network order, as posted
  uint32_t rkey = 0;
  int32_t gidType = -1;  // the requester's source GID type (RoCE), -1 on InfiniBand
  uint64_t psn = 0;
  uint64_t remoteAddr = 0;
  uint64_t length = 0;      // the request's length (a READ carries no payload)
  uint64_t payloadLen = 0;  // bytes that follow this header
};

// A connected stream socket to another engine (or to this one): a reader thread handles what
// arrives; send() writes without blocking what fits and a writer thread sends the rest, so that
// no thread blocks on a write while holding a lock or while it must read.
struct Link {
  ~Link();
  void send(const Wire& hdr, BufferPtr payload = nullptr);
  bool dead();

  int fd = -1;
  bool outbound = false;
  uint16_t remoteAddr = 0;
  std::mutex mu;
  std::condition_variable cv;
  struct Out {
    Wire hdr;
    BufferPtr payload;
    size_t sent = 0;  // bytes already written
  };
  std::deque<Out> out;
  bool dead_ = false;
};

struct Port {
  Device* dev = nullptr;
  int num = 0;
  PortConfig cfg;
  uint16_t addr = 0;
  int listenFd = -1;
  std::atomic<bool> active{true};
  std::vector<ibv_gid> gids;
  std::vector<int> gidTypes;  // enum ibv_gid_type, per entry of gids
};

struct DeviceHandle {
  ibv_device dev;
  Device* impl;
};
struct Device {
  DeviceHandle h;
  std::string name;
  std::string spec;
  uint64_t guid = 0;  // host order
  std::vector<std::unique_ptr<Port>> ports;
  std::atomic<bool> fatal{false};
  bool retired = false;            // under Engine::mu
  std::vector<Context*> contexts;  // under Engine::mu
};

struct ContextHandle {
  ibv_context ctx;
  Context* impl;
};
struct Context {
  ContextHandle h;
  Device* dev = nullptr;
  int asyncRead = -1;
  int asyncWrite = -1;
  std::mutex mu;
  std::deque<ibv_async_event> events;
};

struct Pd;
struct PdHandle {
  ibv_pd pd;
  Pd* impl;
};
struct Pd {
  PdHandle h;
  Context* ctx = nullptr;
  std::atomic<int> refs{0};  // MRs and QPs
};

struct Mr;
struct MrHandle {
  ibv_mr mr;
  Mr* impl;
};
struct Mr {
  ~Mr();
  bool covers(uint64_t addr, uint64_t len) const {
    return addr >= iova && len <= length && addr - iova <= length - len;
  }
  char* at(uint64_t addr) const { return base + (addr - iova); }

  MrHandle h;
  Pd* pd = nullptr;
  uint64_t iova = 0;
  char* base = nullptr;
  size_t length = 0;
  int access = 0;
  void* map = nullptr;  // dma-buf mapping, unmapped with the last reference
  size_t mapLen = 0;
};

struct Cqe {
  ibv_wc wc;
  std::weak_ptr<Qp> qp;
  bool send = false;
  uint32_t release = 0;  // queue slots this completion frees when polled
  uint64_t gen = 0;      // the QP's generation (ibv_modify_qp to RESET starts a new one)
};
struct Cq;
struct CqHandle {
  ibv_cq cq;
  Cq* impl;
};
// A completion channel: the CQs' events in order, and an eventfd (semaphore mode) that counts them,
// so that ibv_comp_channel::fd is readable while one is queued and a blocking read waits for one.
struct Channel {
  ibv_comp_channel ch;
  Context* ctx = nullptr;
  std::mutex mu;
  std::deque<Cq*> events;
  std::atomic<int> cqRefs{0};
};
struct Cq {
  CqHandle h;
  Context* ctx = nullptr;
  Channel* channel = nullptr;
  std::mutex mu;
  std::deque<Cqe> q;
  bool armed = false;      // ibv_req_notify_cq: the next completion queues an event (under mu)
  uint64_t delivered = 0;  // events ibv_get_cq_event returned (under channel->mu)
  std::atomic<uint64_t> acked{0};
  std::atomic<int> qpRefs{0};
};

struct QpHandle {
  ibv_qp qp;
  Qp* impl;
};
struct Qp : std::enable_shared_from_this<Qp> {
  struct SendWr {
    uint64_t wrId = 0;
    ibv_wr_opcode op = IBV_WR_RDMA_WRITE;
    bool signaled = false;
    uint64_t psn = 0;
    uint64_t len = 0;
    ibv_wc_status localErr = IBV_WC_SUCCESS;
    std::vector<ibv_sge> readSges;
    Wire hdr;
    BufferPtr payload;
  };
  struct RecvWr {
    uint64_t wrId = 0;
    std::vector<ibv_sge> sges;
  };
  // A request accepted in order by this QP as responder, waiting for a receive (RNR) or behind
  // one that does.
  struct Pending {
    std::weak_ptr<Link> link;
    Wire hdr;
    BufferPtr payload;
    bool dataDone = false;
    bool armed = false;  // its RNR wait has started
    bool forever = false;
    Clock::time_point deadline;
  };

  QpHandle h;
  Context* ctx = nullptr;
  Device* dev = nullptr;
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  uint32_t maxSend = 0, maxRecv = 0, maxSendSge = 0, maxRecvSge = 0, maxInline = 0;
  bool sigAll = false;
  std::atomic<int> sqUsed{0};
  std::atomic<int> rqUsed{0};
  std::atomic<uint64_t> gen{0};

  std::mutex mu;  // everything below
  bool destroyed = false;
  ibv_qp_state state = IBV_QPS_RESET;
  Port* port = nullptr;
  unsigned access = 0;
  uint16_t remoteAddr = 0;
  uint32_t remoteQpn = 0;
  int sgidType = -1;
  uint64_t sqPsn = 0;  // next request's PSN
  uint64_t rqPsn = 0;  // next expected request's PSN
  uint8_t timeout = 14, retryCnt = 7, rnrRetry = 7, maxDestRd = 0, maxRd = 0;
  std::shared_ptr<Link> link;
  std::deque<SendWr> sq;
  std::deque<RecvWr> rq;
  std::deque<Pending> pending;
  uint32_t unsignaledDone = 0;
  bool sqBlocked = false;  // a request with a local error waits in sq: send nothing after it
  bool retrying = false;
  int retriesLeft = 0;
  Clock::time_point retryAt;
};

struct Engine {
  Engine();

  std::mutex mu;
  std::vector<std::unique_ptr<Device>> devices;  // never freed: contexts point to them
  std::map<uint32_t, std::shared_ptr<Qp>> qps;
  uint32_t nextQpn = 0;

  std::mutex linksMu;
  std::map<uint16_t, std::shared_ptr<Link>> links;  // outbound, by remote port address

  std::mutex mrMu;
  std::unordered_map<uint32_t, std::shared_ptr<Mr>> mrs;
  uint32_t nextKey = 0;

  int wakeFd = -1;  // eventfd: the listener re-reads the port list

  std::mutex timerMu;
  std::condition_variable timerCv;
  bool timerWork = false;

  // RDMA writes into GPU memory (a dma-buf registration) not yet visible: with
  // LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS=N they land N ms after the write completed, or at the
  // next read through a dma-buf registration of this process (a flush), whichever comes first.
  struct GpuWrite {
    std::shared_ptr<Mr> mr;  // keeps the mapping
    char* dst = nullptr;
    BufferPtr payload;
    size_t len = 0;
    Clock::time_point due;
  };
  std::mutex gpuMu;
  std::deque<GpuWrite> gpuWrites;

  std::atomic<int> nContexts{0}, nPds{0}, nMrs{0}, nCqs{0}, nQps{0}, nChannels{0};
  std::atomic<int> nRegMrCalls{0};  // ibv_reg_mr calls since the process started
};

// The process's engine, created on first use (and afresh in a forked child).
Engine& engine();

std::shared_ptr<Mr> findMr(Engine& e, uint32_t key);
// A new device (its ports bound to fresh addresses); the caller holds e.mu.
Device* createDevice(Engine& e, const DeviceConfig& cfg, std::string* error);
void queueEvent(Context* ctx, const ibv_async_event& ev);

// The QP's data path and state machine; each returns 0 or an errno value.
int postSendOne(Engine& e, Qp& qp, const ibv_send_wr* wr);
int postRecvOne(Engine& e, Qp& qp, const ibv_recv_wr* wr);
int modifyQp(Engine& e, Qp& qp, const ibv_qp_attr* attr, int mask);

// Under qp.mu: the error state (the oldest send completes with headStatus, everything else
// flushes); the responder gives up on an RNR-blocked request; the QP stops existing.
void errorLocked(Engine& e, Qp& qp, ibv_wc_status headStatus);
void failRnrLocked(Qp& qp);
void destroyQpLocked(Engine& e, Qp& qp);

// One pass of the timer over retries, RNR waits and GPU writes not yet visible; true while some
// still wait.
bool tick(Engine& e);

// The test controls (fake_verbs.h).
int setPortState(Engine& e, const char* dev, int port, bool active);
int deviceFatal(Engine& e, const char* dev);

// Registers an fd the emulator owns, so that a forked child closes its copy (a child holding a
// copy of a link would hide the parent's death from the peer). closeFd unregisters and closes.
void registerFd(int fd);
void closeFd(int fd);

}  // namespace fakeverbs
