#include "transports/shm/shm_transport.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>

#include "src/core/dtype.h"
#include "src/core/log.h"
#include "src/core/process.h"
#include "src/reduce/reduce.h"
#include "transports/shm/shared_alloc.h"

namespace loom::shm {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
constexpr size_t kBounceBytes = 256 << 10;
constexpr int64_t kPeerCheckNs = 20 * 1000000;  // how often a waiting rank checks peer liveness

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Header {
  uint64_t magic;
  uint32_t nlocal;
  uint32_t slots;
  uint64_t slotBytes;
  uint64_t llBytes;
};

enum SlotKind : uint32_t { kData = 1, kRts = 2 };

// Bits of the can-read matrix: what a reader can do with an owner's memory.
constexpr uint8_t kReadsAny = 1;    // any address (threads of one process, process_vm_readv)
constexpr uint8_t kMapsShared = 2;  // the owner's shared allocations (loomMemAlloc), by mapping
constexpr uint8_t kCma = 4;  // process_vm_readv/writev on the owner's memory (another process)

// The 64-byte header in front of each slot's payload.
struct SlotHdr {
  uint32_t kind;
  int32_t tag;
  uint64_t msgBytes;  // the whole message
  uint64_t offset;    // kData: where this chunk goes in the message
  uint64_t chunk;     // kData: payload bytes in this slot
  uint64_t addr;      // kRts: the message in the sender's address space
  uint64_t serial;    // kRts from a shared allocation (loomMemAlloc): its serial, else 0
  uint64_t fd;        //   the allocation's memfd in the sender's fd table
  uint64_t allocOff;  //   the message's offset in the allocation
};
static_assert(sizeof(SlotHdr) == kLine, "slot header is one cache line");

long futexWait(std::atomic<uint32_t>* addr, uint32_t val, int64_t timeoutUs) {
  timespec ts{static_cast<time_t>(timeoutUs / 1000000),
              static_cast<long>(timeoutUs % 1000000) * 1000};
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, val, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct Transport::RankArea {
  alignas(kLine) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> state;
  int32_t pid;
  uint64_t probeAddr;
  uint64_t probeValue;
  int32_t memfdProbeFd;  // a shared allocation peers map at init (-1: none)
  uint64_t memfdProbeSerial;
  uint64_t memfdProbeValue;
  // 1 while this rank reads or writes its peers' buffers in a one-pass collective. A rank that
  // fails or closes waits for 0 on every peer before it returns (setState).
  std::atomic<uint32_t> onePass;
  // Two low-latency buffers follow, each a cache line of flags and llBytes of data.
};

struct LlFlags {
  std::atomic<uint64_t> seq;
  uint64_t bytes;
  uint64_t signature;
};

static LlFlags* llFlagsOf(char* buffer) { return reinterpret_cast<LlFlags*>(buffer - kLine); }

struct Transport::Ring {
  alignas(kLine) std::atomic<uint64_t> head;   // slots produced (sender)
  alignas(kLine) std::atomic<uint64_t> tail;   // slots consumed (receiver)
  alignas(kLine) std::atomic<uint64_t> acked;  // single-copy messages completed (receiver)
  // 1 while the receiver reads the sender's own memory (single copy). A sender that fails or
  // closes waits for 0 before it returns, so its caller never frees a buffer being read.
  alignas(kLine) std::atomic<uint32_t> pulling;
  alignas(kLine) char slots[1];  // slots x (SlotHdr + slotBytes)
};

struct Transport::Request {
  bool isSend = false;
  bool done = false;
  bool reduce = false;
  bool rts = false;
  bool started = false;  // receive: the first slot of its message was taken
  int local = 0;
  int tag = 0;
  char* data = nullptr;       // send: source; receive: destination
  const char* src = nullptr;  // reduce: the other operand
  size_t size = 0;            // send: bytes; receive: capacity
  size_t moved = 0;           // bytes posted (send) or received (receive)
  size_t msgBytes = 0;        // receive: the incoming message's size
  uint64_t rtsIndex = 0;
  SharedRef shared;  // send by single copy from a shared allocation (serial 0: not one)
  loomDataType_t dt = loomFloat32;
  loomRedOp_t op = loomSum;
  Status error;
  int64_t lastCheckNs = 0;
};

struct Transport::SendComm {
  int local = 0;
  Ring* ring = nullptr;
  uint64_t head = 0;  // our copy of ring->head
  uint64_t rtsPosted = 0;
  bool useRts = false;           // the receiver reads any of our memory (threads, process_vm_readv)
  bool useMapped = false;        // the receiver maps our shared allocations
  std::deque<Request*> posting;  // not fully in the ring yet, in order
  std::vector<Request*> awaitingAck;
  Status broken;
};

struct Transport::RecvComm {
  int local = 0;
  Ring* ring = nullptr;
  uint64_t tail = 0;  // our copy of ring->tail
  uint64_t acked = 0;
  std::deque<Request*> posted;
  Status broken;
};

Options fitOptions(int nlocal, Options opts) {
  opts.slotBytes = std::max<size_t>(kLine, roundUp(opts.slotBytes, kLine));
  opts.slots = std::max(2, opts.slots);
  opts.llBytes = roundUp(opts.llBytes, kLine);
  size_t pairs = static_cast<size_t>(nlocal) * static_cast<size_t>(nlocal);
  auto total = [&] { return pairs * opts.slots * (opts.slotBytes + kLine); };
  while (total() > opts.budgetBytes && opts.slotBytes > 4096) opts.slotBytes /= 2;
  while (total() > opts.budgetBytes && opts.slots > 2) opts.slots /= 2;
  return opts;
}

static size_t areaBytesOf(const Options& o) {
  return roundUp(sizeof(Transport::RankArea) + 2 * (kLine + o.llBytes), kPage);
}
static size_t ringBytesOf(const Options& o) {
  return roundUp(offsetof(Transport::Ring, slots) + o.slots * (kLine + o.slotBytes), kPage);
}

size_t segmentBytes(int nlocal, const Options& o) {
  size_t n = static_cast<size_t>(nlocal);
  return kPage + n * areaBytesOf(o) + roundUp(n * n, kPage) + n * n * ringBytesOf(o);
}

void Transport::format(char* base, int nlocal, const Options& opts) {
  auto* h = reinterpret_cast<Header*>(base);
  h->nlocal = static_cast<uint32_t>(nlocal);
  h->slots = static_cast<uint32_t>(opts.slots);
  h->slotBytes = opts.slotBytes;
  h->llBytes = opts.llBytes;
  // The segment is zero-filled; atomics at zero are valid. The magic goes last.
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
}

Result<std::unique_ptr<Transport>> Transport::attach(std::unique_ptr<Segment> seg, int me,
                                                     std::vector<LocalPeer> peers, Options opts,
                                                     const std::atomic<bool>* abortFlag) {
  int n = static_cast<int>(peers.size());
  if (me < 0 || me >= n) return LOOM_ERROR(kInternal, "shm: local index {} of {}", me, n);
  if (seg->size() != segmentBytes(n, opts))
    return LOOM_ERROR(kInternal, "shm: segment of {} bytes, expected {}", seg->size(),
                      segmentBytes(n, opts));
  auto* h = reinterpret_cast<Header*>(seg->base());
  if (reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire) !=
          kMagic ||
      h->nlocal != static_cast<uint32_t>(n) || h->slots != static_cast<uint32_t>(opts.slots) ||
      h->slotBytes != opts.slotBytes || h->llBytes != opts.llBytes)
    return LOOM_ERROR(kInternal,
                      "shm: segment {} has a different geometry than this rank computed (are "
                      "the LOOM_SHM_* variables the same on every rank?)",
                      seg->name());
  std::unique_ptr<Transport> t(new Transport());
  t->seg_ = std::move(seg);
  t->me_ = me;
  t->peers_ = std::move(peers);
  t->opts_ = opts;
  t->abort_ = abortFlag;
  t->myPid_ = getpid();
  t->areaOffset_ = kPage;
  t->areaBytes_ = areaBytesOf(opts);
  t->matrixOffset_ = t->areaOffset_ + n * t->areaBytes_;
  t->ringOffset_ = t->matrixOffset_ + roundUp(static_cast<size_t>(n) * n, kPage);
  t->ringBytes_ = ringBytesOf(opts);
  RankArea* mine = t->area(me);
  mine->pid = t->myPid_;
  mine->state.store(static_cast<uint32_t>(PeerState::kAlive), std::memory_order_release);
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<SendComm>();
    s->local = i;
    s->ring = t->ring(me, i);
    s->head = s->ring->head.load(std::memory_order_acquire);
    t->sends_.push_back(std::move(s));
    auto r = std::make_unique<RecvComm>();
    r->local = i;
    r->ring = t->ring(i, me);
    r->tail = r->ring->tail.load(std::memory_order_acquire);
    r->acked = r->ring->acked.load(std::memory_order_acquire);
    t->recvs_.push_back(std::move(r));
    t->peerMaps_.push_back(std::make_unique<PeerMappings>());
  }
  t->bounce_.reset(new char[kBounceBytes + kLine]);
  t->bounceAligned_ =
      reinterpret_cast<char*>(roundUp(reinterpret_cast<uintptr_t>(t->bounce_.get()), kLine));
  return t;
}

Transport::~Transport() = default;  // requests in flight are dropped (owned_ frees them)

Transport::RankArea* Transport::area(int local) const {
  return reinterpret_cast<RankArea*>(seg_->base() + areaOffset_ + local * areaBytes_);
}

Transport::Ring* Transport::ring(int from, int to) const {
  size_t idx = static_cast<size_t>(from) * peers_.size() + static_cast<size_t>(to);
  return reinterpret_cast<Ring*>(seg_->base() + ringOffset_ + idx * ringBytes_);
}

uint8_t* Transport::canRead(int reader, int owner) const {
  return reinterpret_cast<uint8_t*>(seg_->base() + matrixOffset_ +
                                    static_cast<size_t>(reader) * peers_.size() + owner);
}

// ---- single-copy probe ----------------------------------------------------------------------

// Yama's ptrace_scope 1 (Ubuntu's default) lets a process attach only to its descendants, so
// process_vm_readv between sibling ranks fails with EPERM unless the target names its tracers.
// As Open MPI does for its CMA path, the process allows any process of its user (once per
// process, and only where Yama is at 1; 2 and 3 stay closed).
static void allowCmaUnderYama() {
  static std::once_flag once;
  std::call_once(once, [] {
    FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f) return;
    int scope = -1;
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
    if (scope != 1) return;
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
      LOOM_INFO(kSubShm,
                "Yama ptrace_scope is 1: this process lets processes of its user attach "
                "(PR_SET_PTRACER_ANY) so that local ranks can use process_vm_readv/writev; "
                "LOOM_SHM_MAPPED_CMA=0 and LOOM_SHM_SINGLE_COPY<2 prevent it");
  });
}

void Transport::publishProbe() {
  if (opts_.cmaOnePass || opts_.singleCopyProcesses) allowCmaUnderYama();
  std::random_device rd;
  probe_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x5a5a5a5a5a5a5a5aull;
  RankArea* a = area(me_);
  a->probeAddr = reinterpret_cast<uint64_t>(&probe_);
  a->probeValue = probe_;
  a->memfdProbeFd = -1;
  if (opts_.singleCopyMapped) {
    Result<ProbeInfo> pi = probeAllocation();
    if (pi.isOk()) {
      a->memfdProbeFd = pi.value().fd;
      a->memfdProbeSerial = pi.value().serial;
      a->memfdProbeValue = pi.value().value;
    } else {
      LOOM_INFO(kSubShm, "no shared allocation to probe ({}): loomMemAlloc buffers are copied",
                pi.status().message());
    }
  }
}

// Can this rank map local rank i's shared allocations (loomMemAlloc)? Mapping its probe page
// tells, and leaves that mapping cached.
bool Transport::probeMapping(int i) {
  RankArea* a = area(i);
  if (!opts_.singleCopyMapped || a->memfdProbeFd < 0) return false;
  Result<const char*> m =
      peerMaps_[i]->map(peers_[i].pid, a->memfdProbeFd, a->memfdProbeSerial, 0, sizeof(uint64_t));
  uint64_t got = 0;
  if (m.isOk()) std::memcpy(&got, m.value(), sizeof(got));
  if (m.isOk() && got == a->memfdProbeValue) return true;
  LOOM_INFO(kSubShm, "cannot map the shared buffers of rank {} (pid {}): {}", peers_[i].rank,
            peers_[i].pid, m.isOk() ? "wrong data" : m.status().message());
  return false;
}

void Transport::probePeers() {
  for (int i = 0; i < nlocal(); ++i) {
    uint8_t ok = 0;
    if (i == me_) {
      ok = kReadsAny;
    } else if (peers_[i].pid == myPid_) {
      ok = opts_.singleCopyThreads ? kReadsAny : 0;  // a thread of this process: plain memcpy
    } else if (!opts_.singleCopyProcesses && !opts_.cmaOnePass) {
      ok = probeMapping(i) ? kMapsShared : 0;
    } else {
      RankArea* a = area(i);
      uint64_t got = 0;
      iovec local{&got, sizeof(got)};
      iovec remote{reinterpret_cast<void*>(a->probeAddr), sizeof(got)};
      ssize_t n = process_vm_readv(peers_[i].pid, &local, 1, &remote, 1, 0);
      bool cma = n == static_cast<ssize_t>(sizeof(got)) && got == a->probeValue;
      if (cma) ok = kCma | (opts_.singleCopyProcesses ? kReadsAny : 0);
      if (probeMapping(i)) ok |= kMapsShared;
      if (!cma)
        LOOM_INFO(kSubShm, "process_vm_readv from rank {} (pid {}) is not allowed ({}): eager copy",
                  peers_[i].rank, peers_[i].pid, n < 0 ? std::strerror(errno) : "wrong data");
    }
    *canRead(me_, i) = ok;
  }
}

bool Transport::canMapShared(int reader, int owner) const {
  return (*canRead(reader, owner) & kMapsShared) != 0;
}

bool Transport::canCma(int reader, int owner) const {
  return opts_.cmaOnePass && (*canRead(reader, owner) & kCma) != 0;
}

bool Transport::allOneProcess() const {
  for (const LocalPeer& p : peers_)
    if (p.pid != myPid_) return false;
  return true;
}

bool Transport::everyPairCanReach() const {
  for (int r = 0; r < nlocal(); ++r)
    for (int o = 0; o < nlocal(); ++o)
      if (peers_[r].pid != peers_[o].pid && !canMapShared(r, o) && !canCma(r, o)) return false;
  return true;
}

Result<char*> Transport::mapPeerShared(int local, const SharedRef& ref, size_t bytes) {
  LOOM_ASSIGN(const char* p,
              peerMaps_[local]->map(peers_[local].pid, ref.fd, ref.serial, ref.offset, bytes));
  return const_cast<char*>(p);  // mapped read-write
}

bool Transport::receiverCanRead(int local) const { return (*canRead(local, me_) & kReadsAny) != 0; }

std::string Transport::singleCopySummary() const {
  int direct = 0, cma = 0, mapped = 0, eager = 0;
  for (int i = 0; i < nlocal(); ++i) {
    if (i == me_) continue;
    uint8_t both = *canRead(i, me_) & *canRead(me_, i);
    if (peers_[i].pid == myPid_ && (both & kReadsAny))
      ++direct;
    else if (both & kReadsAny)
      ++cma;
    else if (both & kMapsShared)
      ++mapped;
    else
      ++eager;
  }
  return fmt::format(
      "single copy with {} peer(s) by memcpy (threads), {} by process_vm_readv, {} by mapping "
      "loomMemAlloc buffers (other buffers eager), eager copy with {}",
      direct, cma, mapped, eager);
}

void* Transport::sendComm(int local) {
  SendComm* c = sends_[local].get();
  uint8_t can = *canRead(local, me_);
  c->useRts = (can & kReadsAny) != 0;
  c->useMapped = (can & kMapsShared) != 0 && peers_[local].pid != myPid_;
  return c;
}

void* Transport::recvComm(int local) { return recvs_[local].get(); }

int Transport::localOf(int rank) const {
  for (int i = 0; i < nlocal(); ++i)
    if (peers_[i].rank == rank) return i;
  return -1;
}

void* Transport::presetSendComm(int rank) {
  int i = localOf(rank);
  return i < 0 ? nullptr : sendComm(i);
}

void* Transport::presetRecvComm(int rank) {
  int i = localOf(rank);
  return i < 0 ? nullptr : recvComm(i);
}

net::Reach Transport::reach(int rank, int channel) const {
  net::Reach r;
  r.reachable = channel == 0 && localOf(rank) >= 0;
  r.latencyUs = 0.2;
  return r;
}

// ---- state and doorbells ----------------------------------------------------------------------

void Transport::setState(PeerState s) {
  area(me_)->state.store(static_cast<uint32_t>(s), std::memory_order_seq_cst);
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_) {
      RankArea* a = area(i);
      a->bell.fetch_add(1, std::memory_order_seq_cst);
      futexWake(&a->bell);
    }
  if (s == PeerState::kAlive) return;
  // Waits (until deadline; a peer whose process is gone stops mattering) for local rank i to
  // drop a flag it raised before it saw the state above.
  auto awaitDrop = [&](const std::atomic<uint32_t>& flag, int i, int64_t deadline) {
    while (flag.load(std::memory_order_seq_cst) != 0 && nowNs() < deadline &&
           (peers_[i].pid == myPid_ || !processGone(peers_[i].pid)))
      sched_yield();
  };
  // A peer that began a one pass over the buffers before it saw the state above finishes first
  // (beginOnePass checks the states after raising `onePass`: with both seq_cst, one of the two
  // sees the other). Bounded: 5 s.
  const int64_t onePassDeadline = nowNs() + 5 * int64_t{1000000000};
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_) awaitDrop(area(i)->onePass, i, onePassDeadline);
  // A receiver that began reading one of our unacknowledged single-copy messages before it saw
  // the state above finishes first (pull() checks the state after raising `pulling`, likewise).
  // Bounded: 5 s.
  const int64_t deadline = nowNs() + 5 * int64_t{1000000000};
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_ && !sends_[i]->awaitingAck.empty())
      awaitDrop(sends_[i]->ring->pulling, i, deadline);
}

Status Transport::beginOnePass() {
  area(me_)->onePass.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int i = 0; i < nlocal(); ++i) {
    if (i == me_) continue;
    auto st = static_cast<PeerState>(area(i)->state.load(std::memory_order_seq_cst));
    if (st != PeerState::kAlive) {
      endOnePass();
      return peerGone(i);
    }
  }
  return Status();
}

void Transport::endOnePass() { area(me_)->onePass.store(0, std::memory_order_seq_cst); }

void Transport::wake(int local) {
  RankArea* a = area(local);
  // Pairs with the waiter's seq_cst increment of `waiters` before it re-checks the rings: either
  // it sees what we published, or we see it waiting.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (a->waiters.load(std::memory_order_relaxed) == 0) return;
  a->bell.fetch_add(1, std::memory_order_seq_cst);
  futexWake(&a->bell);
}

Status Transport::peerGone(int local) {
  const LocalPeer& p = peers_[local];
  auto st = static_cast<PeerState>(area(local)->state.load(std::memory_order_acquire));
  if (st == PeerState::kFailed)
    return LOOM_ERROR(kRemote, "connection closed: rank {} (pid {}) failed", p.rank, p.pid)
        .withCause(Cause::kPeerGone);
  if (st == PeerState::kClosed)
    return LOOM_ERROR(kRemote, "connection closed: rank {} (pid {}) destroyed its communicator",
                      p.rank, p.pid)
        .withCause(Cause::kPeerGone);
  if (p.pid != myPid_ && processGone(p.pid))
    return LOOM_ERROR(kRemote, "connection closed: rank {} (pid {}) exited", p.rank, p.pid)
        .withCause(Cause::kPeerGone);
  return Status();
}

Status Transport::checkPeer(int local, int64_t* lastCheckNs) {
  if ((++polls_ & 127) != 0 && *lastCheckNs != 0) return Status();  // the clock is not free
  int64_t now = nowNs();
  if (*lastCheckNs == 0) {
    *lastCheckNs = now;
    return Status();
  }
  if (now - *lastCheckNs < kPeerCheckNs) return Status();
  *lastCheckNs = now;
  if (CheckHook hook = checkHook()) hook(this, local, CheckPoint::kRequestWait);
  // A peer waiting in a low-latency collective this rank did not enter (so it will never send
  // what this rank waits for): the ranks disagree about the operation. This is only evidence: the
  // caller progresses the request again before it judges (Transport::test), because the peer may
  // have finished this operation (and sent or taken what this rank waits for) after this rank
  // last looked at the ring, then entered the next call.
  uint64_t peerSeq = peerLlSeq(local);
  if (peerSeq > llSeq_)
    return LOOM_ERROR(kInvalidUsage,
                      "rank {} runs a small collective this rank is not running (it waits for "
                      "this rank's low-latency contribution {} while this rank waits for a "
                      "message): the ranks called different collectives, counts or datatypes",
                      peers_[local].rank, peerSeq);
  return peerGone(local);
}

uint64_t Transport::peerLlSeq(int local) const {
  return std::max(llFlagsOf(llBufferOf(local, 0))->seq.load(std::memory_order_acquire),
                  llFlagsOf(llBufferOf(local, 1))->seq.load(std::memory_order_acquire));
}

bool Transport::messageQueuedFrom(int local) const {
  return recvs_[local]->ring->head.load(std::memory_order_acquire) != recvs_[local]->tail;
}

PeerState Transport::peerState(int local) const {
  return static_cast<PeerState>(area(local)->state.load(std::memory_order_acquire));
}

namespace {
std::atomic<Transport::CheckHook> gCheckHook{nullptr};
}  // namespace

void Transport::setCheckHookForTesting(CheckHook hook) {
  gCheckHook.store(hook, std::memory_order_release);
}

Transport::CheckHook Transport::checkHook() { return gCheckHook.load(std::memory_order_acquire); }

// ---- data path ----------------------------------------------------------------------------

Transport::Request* Transport::newRequest() {
  if (free_.empty()) {
    owned_.push_back(std::make_unique<Request>());
    return owned_.back().get();
  }
  Request* r = free_.back();
  free_.pop_back();
  *r = Request();
  return r;
}

void Transport::freeRequest(Request* r) { free_.push_back(r); }

Status Transport::isend(void* sendComm, const void* data, size_t size, int tag, void*,
                        void** request) {
  auto* c = static_cast<SendComm*>(sendComm);
  *request = nullptr;
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->isSend = true;
  r->local = c->local;
  r->tag = tag;
  r->data = const_cast<char*>(static_cast<const char*>(data));
  r->size = size;
  r->shared = SharedRef();
  bool big = size >= opts_.rtsMin && size > 0;
  // A mapped read is cheaper than process_vm_readv (no page pinning): preferred where both work.
  bool mapped = big && c->useMapped && findShared(data, size, &r->shared);
  r->rts = mapped || (big && c->useRts);
  c->posting.push_back(r);
  *request = r;
  return progressSend(c);
}

Status Transport::irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                        void**, void** request) {
  *request = nullptr;
  if (n != 1) return LOOM_ERROR(kInternal, "shm: grouped receives (n={}) are not supported", n);
  auto* c = static_cast<RecvComm*>(recvComm);
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->local = c->local;
  r->tag = tags[0];
  r->data = static_cast<char*>(data[0]);
  r->size = sizes[0];
  c->posted.push_back(r);
  *request = r;
  return progressRecv(c);
}

Status Transport::irecvReduce(void* recvComm, void* dst, const void* src, size_t size, int tag,
                              loomDataType_t dt, loomRedOp_t op, void** request) {
  *request = nullptr;
  auto* c = static_cast<RecvComm*>(recvComm);
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->local = c->local;
  r->tag = tag;
  r->data = static_cast<char*>(dst);
  r->src = static_cast<const char*>(src);
  r->size = size;
  r->reduce = true;
  r->dt = dt;
  r->op = op == loomAvg ? loomSum : op;
  c->posted.push_back(r);
  *request = r;
  return progressRecv(c);
}

Status Transport::progressSend(SendComm* c) {
  Ring* rg = c->ring;
  bool posted = false;
  while (!c->posting.empty()) {
    Request* r = c->posting.front();
    uint64_t tail = rg->tail.load(std::memory_order_acquire);
    if (c->head - tail >= static_cast<uint64_t>(opts_.slots)) break;  // ring full
    char* slot = rg->slots + (c->head % opts_.slots) * (kLine + opts_.slotBytes);
    auto* h = reinterpret_cast<SlotHdr*>(slot);
    h->tag = r->tag;
    h->msgBytes = r->size;
    if (r->rts) {
      h->kind = kRts;
      h->addr = reinterpret_cast<uint64_t>(r->data);
      h->serial = r->shared.serial;
      h->fd = static_cast<uint64_t>(r->shared.fd);
      h->allocOff = r->shared.offset;
      r->moved = r->size;
      r->rtsIndex = ++c->rtsPosted;
    } else {
      size_t chunk = std::min(opts_.slotBytes, r->size - r->moved);
      h->kind = kData;
      h->offset = r->moved;
      h->chunk = chunk;
      if (chunk) std::memcpy(slot + kLine, r->data + r->moved, chunk);
      r->moved += chunk;
    }
    ++c->head;
    rg->head.store(c->head, std::memory_order_release);
    posted = true;
    if (r->moved == r->size) {
      c->posting.pop_front();
      if (r->rts)
        c->awaitingAck.push_back(r);
      else
        r->done = true;
    }
  }
  if (posted) wake(c->local);
  if (!c->awaitingAck.empty()) {
    uint64_t acked = rg->acked.load(std::memory_order_acquire);
    for (size_t i = 0; i < c->awaitingAck.size();) {
      if (c->awaitingAck[i]->rtsIndex <= acked) {
        c->awaitingAck[i]->done = true;
        c->awaitingAck[i] = c->awaitingAck.back();
        c->awaitingAck.pop_back();
      } else {
        ++i;
      }
    }
  }
  return Status();
}

Status Transport::pull(RecvComm* c, Request* r, const void* slotHdr) {
  const auto* h = static_cast<const SlotHdr*>(slotHdr);
  const size_t bytes = h->msgBytes;
  const LocalPeer& p = peers_[c->local];
  // Announce the read, then make sure the sender has not given up on the message (its caller
  // may free the buffer once it has): see setState.
  std::atomic<uint32_t>& pulling = c->ring->pulling;
  pulling.store(1, std::memory_order_seq_cst);
  struct Lower {
    std::atomic<uint32_t>& flag;
    ~Lower() { flag.store(0, std::memory_order_release); }
  } lower{pulling};
  if (area(c->local)->state.load(std::memory_order_seq_cst) !=
      static_cast<uint32_t>(PeerState::kAlive))
    return peerGone(c->local);
  const char* remote = reinterpret_cast<const char*>(h->addr);
  bool direct = p.pid == myPid_;    // threads of one process: read the peer's buffer directly
  if (!direct && h->serial != 0) {  // a shared allocation of the peer: read it through our mapping
    Result<const char*> m =
        peerMaps_[c->local]->map(p.pid, static_cast<int>(h->fd), h->serial, h->allocOff, bytes);
    if (!m.isOk()) {
      Status gone = peerGone(c->local);
      if (!gone.isOk()) return gone;
      return m.status().withContext(fmt::format("single copy from rank {}", p.rank));
    }
    remote = m.value();
    direct = true;
  }
  if (direct) {
    if (r->reduce) {
      size_t es = dataTypeSize(r->dt);
      reduceBuffers(r->data, r->src, remote, bytes / es, r->dt, r->op);
    } else {
      std::memcpy(r->data, remote, bytes);
    }
    return Status();
  }
  size_t done = 0;
  while (done < bytes) {
    char* into = r->reduce ? bounceAligned_ : r->data + done;
    size_t want = r->reduce ? std::min(kBounceBytes, bytes - done) : bytes - done;
    size_t got = 0;
    while (got < want) {
      iovec l{into + got, want - got};
      iovec rem{const_cast<char*>(remote + done + got), want - got};
      ssize_t n = process_vm_readv(p.pid, &l, 1, &rem, 1, 0);
      if (n <= 0) {
        int e = errno;
        Status gone = peerGone(c->local);
        if (!gone.isOk()) return gone;
        return LOOM_ERROR(kSystem, "process_vm_readv of {} bytes from rank {} (pid {}): {}",
                          want - got, p.rank, p.pid, n < 0 ? std::strerror(e) : "no progress");
      }
      got += static_cast<size_t>(n);
    }
    if (r->reduce) {
      size_t es = dataTypeSize(r->dt);
      reduceBuffers(r->data + done, r->src + done, bounceAligned_, want / es, r->dt, r->op);
    }
    done += want;
  }
  return Status();
}

Status Transport::deliver(RecvComm* c, Request* r, const char* slot) {
  const auto* h = reinterpret_cast<const SlotHdr*>(slot);
  if (!r->started) {
    if (h->tag != r->tag)
      return LOOM_ERROR(kRemote, "message tag {:#x} does not match the posted receive's tag {:#x}",
                        h->tag, r->tag)
          .withCause(Cause::kMismatch);
    if (h->msgBytes > r->size)
      return LOOM_ERROR(kRemote, "message truncated: {} bytes into a buffer of {}", h->msgBytes,
                        r->size)
          .withCause(Cause::kMismatch);
    if (r->reduce && h->msgBytes != r->size)
      return LOOM_ERROR(kRemote, "message of {} bytes where a reduction of {} was posted",
                        h->msgBytes, r->size)
          .withCause(Cause::kMismatch);
    r->started = true;
    r->msgBytes = h->msgBytes;
  }
  if (h->kind == kRts) {
    LOOM_TRY(pull(c, r, h));
    r->moved = h->msgBytes;
    return Status();
  }
  if (h->kind != kData || h->offset != r->moved || h->chunk > r->msgBytes - r->moved)
    return LOOM_ERROR(kInternal, "shm: corrupt slot (kind {}, offset {}, chunk {})", h->kind,
                      h->offset, h->chunk);
  if (h->chunk) {
    char* dst = r->data + h->offset;
    const char* in = slot + kLine;
    if (r->reduce) {
      size_t es = dataTypeSize(r->dt);
      reduceBuffers(dst, r->src + h->offset, in, h->chunk / es, r->dt, r->op);
    } else {
      std::memcpy(dst, in, h->chunk);
    }
  }
  r->moved += h->chunk;
  return Status();
}

Status Transport::progressRecv(RecvComm* c) {
  Ring* rg = c->ring;
  bool consumed = false;
  Status st;
  while (!c->posted.empty()) {
    Request* r = c->posted.front();
    uint64_t head = rg->head.load(std::memory_order_acquire);
    if (c->tail == head) break;
    const char* slot = rg->slots + (c->tail % opts_.slots) * (kLine + opts_.slotBytes);
    bool rts = reinterpret_cast<const SlotHdr*>(slot)->kind == kRts;
    st = deliver(c, r, slot);
    if (!st.isOk()) break;
    ++c->tail;
    rg->tail.store(c->tail, std::memory_order_release);
    if (rts) rg->acked.store(++c->acked, std::memory_order_release);
    consumed = true;
    if (r->moved == r->msgBytes) {
      r->done = true;
      c->posted.pop_front();
    }
  }
  if (consumed) wake(c->local);
  if (!st.isOk()) {
    c->broken = st;
    return st;
  }
  return Status();
}

Status Transport::test(void* request, int* done, size_t* sizes) {
  auto* r = static_cast<Request*>(request);
  *done = 0;
  if (!r->done) {
    auto progress = [&] {
      return r->isSend ? progressSend(sends_[r->local].get())
                       : progressRecv(recvs_[r->local].get());
    };
    Status st = progress();
    if (st.isOk() && !r->done) {
      st = checkPeer(r->local, &r->lastCheckNs);
      if (!st.isOk()) {
        // checkPeer read its evidence (the peer's state, its low-latency sequence) after the
        // progress above: whatever the peer did for this request before that evidence (post the
        // message, take ours) is visible now. Judge only if the request still cannot finish.
        Status again = progress();
        if (!again.isOk())
          st = again;
        else if (r->done)
          st = Status();
      }
    }
    if (!st.isOk()) {
      // The request stays queued in its comm (which is now broken); the caller drops it.
      return st;
    }
    if (!r->done) return Status();
  }
  *done = 1;
  if (sizes) *sizes = r->isSend ? r->size : r->msgBytes;
  freeRequest(r);
  return Status();
}

bool Transport::anythingReady() {
  for (auto& c : recvs_)
    if (!c->posted.empty() && c->ring->head.load(std::memory_order_acquire) != c->tail) return true;
  for (auto& c : sends_) {
    if (!c->posting.empty() && c->head - c->ring->tail.load(std::memory_order_acquire) <
                                   static_cast<uint64_t>(opts_.slots))
      return true;
    if (!c->awaitingAck.empty() &&
        c->ring->acked.load(std::memory_order_acquire) >= c->awaitingAck.front()->rtsIndex)
      return true;
  }
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_ && area(i)->state.load(std::memory_order_acquire) != 0) return true;
  return false;
}

void Transport::waitActivity(void* const*, int, void*, int timeoutMs) {
  waitActivityUs(std::max(1, timeoutMs) * int64_t{1000});
}

void Transport::waitActivityUs(int64_t timeoutUs) {
  sleepOnBellUs(timeoutUs, [this] {
    return anythingReady() || (abort_ && abort_->load(std::memory_order_acquire));
  });
}

Status Transport::closeSend(void*) { return Status(); }
Status Transport::closeRecv(void*) { return Status(); }
Status Transport::closeListen(void*) { return Status(); }

Status Transport::getProperties(int dev, net::Properties* props) const {
  if (dev != 0) return LOOM_ERROR(kInvalidArgument, "shm: device {} of 1", dev);
  props->name = "shm";
  props->ptrSupport = net::kPtrHost;
  props->latencyUs = 0.2f;
  return Status();
}

Status Transport::listen(int, net::Handle*, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by listen");
}
Status Transport::connect(int, const net::Handle&, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by connect");
}
Status Transport::accept(void*, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by accept");
}
Status Transport::regMr(void*, void*, size_t, int, void** mhandle) {
  *mhandle = nullptr;
  return Status();
}
Status Transport::deregMr(void*, void*) { return Status(); }

// ---- low-latency exchange -----------------------------------------------------------------

char* Transport::llBufferOf(int local, uint64_t seq) const {
  char* base = reinterpret_cast<char*>(area(local)) + roundUp(sizeof(RankArea), kLine);
  return base + (seq & 1) * (kLine + opts_.llBytes) + kLine;
}

char* Transport::llBuffer(int local, uint64_t seq) { return llBufferOf(local, seq); }

void Transport::llPublish(uint64_t seq, uint64_t bytes, uint64_t signature) {
  LlFlags* f = llFlagsOf(llBuffer(me_, seq));
  f->bytes = bytes;
  f->signature = signature;
  f->seq.store(seq, std::memory_order_release);
  llSeq_ = seq;
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_) wake(i);
}

bool Transport::llOneReady(int local, uint64_t seq) {
  return llFlagsOf(llBuffer(local, seq))->seq.load(std::memory_order_acquire) >= seq;
}

bool Transport::llAllReady(uint64_t seq) {
  for (int i = 0; i < nlocal(); ++i)
    if (!llOneReady(i, seq)) return false;
  return true;
}

void Transport::sleepOnBell(int timeoutMs, const std::function<bool()>& ready) {
  sleepOnBellUs(std::max(1, timeoutMs) * int64_t{1000}, ready);
}

void Transport::sleepOnBellUs(int64_t timeoutUs, const std::function<bool()>& ready) {
  RankArea* me = area(me_);
  // Registered as a waiter before the last look: a peer that publishes after that look sees us
  // waiting and rings, so the futex wait returns at once (see wake()).
  me->waiters.fetch_add(1, std::memory_order_seq_cst);
  uint32_t v = me->bell.load(std::memory_order_seq_cst);
  if (!ready()) futexWait(&me->bell, v, std::max<int64_t>(1, timeoutUs));
  me->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

namespace {

// Polls ready() (yielding the core between polls when ranks outnumber cores or the wait is not
// short, else with a pause instruction) for spinNs, then sleeps on the doorbell in 1 ms naps;
// checks abort, the deadline and the peers' liveness between polls.
template <typename Ready, typename Sleep, typename Check>
Status waitFor(Ready ready, Sleep sleep, Check check, const std::atomic<bool>* abortFlag,
               bool yield, int64_t spinNs, int64_t timeoutMs, const char* what) {
  if (ready()) return Status();
  int64_t start = nowNs();
  int64_t lastCheck = start;
  uint32_t polls = 0;
  while (!ready()) {
    if ((++polls & 63) != 0) {
      // The first polls only pause; after that each poll gives the core away if anyone else
      // wants it (a peer rank, or any other process on a shared machine): a peer that is not
      // running cannot raise its flag however fast this rank polls.
      if (yield || polls > 256)
        sched_yield();
      else
        cpuRelax();
      continue;
    }
    int64_t now = nowNs();
    if (abortFlag && abortFlag->load(std::memory_order_acquire))
      return LOOM_ERROR(kAborted, "communicator aborted (loomCommAbort)");
    if (now - lastCheck >= kPeerCheckNs) {
      lastCheck = now;
      LOOM_TRY(check());
    }
    // Judged on a look at the flags taken after the clock (and after the check, which can be
    // slow): not on the look that started this pass of the loop.
    if (timeoutMs > 0 && now - start > timeoutMs * 1000000 && !ready())
      return LOOM_ERROR(kTimeout, "no progress for {} s (LOOM_TIMEOUT) waiting for {}",
                        timeoutMs / 1000, what);
    if (now - start >= spinNs) sleep();
  }
  return Status();
}

}  // namespace

Status Transport::llWaitAll(uint64_t seq, uint64_t signature, int64_t spinNs, int64_t timeoutMs) {
  // Every judgment below reads its evidence first and the peer's flag again after it: a peer that
  // was late when this rank looked may have published seq since, finished this operation, sent a
  // message for its next call or even closed its communicator (its flag was published before
  // any of that, so a flag read after the evidence sees it).
  auto check = [&]() -> Status {
    for (int i = 0; i < nlocal(); ++i) {
      if (i == me_ || llOneReady(i, seq)) continue;
      if (CheckHook hook = checkHook()) hook(this, i, CheckPoint::kLowLatencyWait);
      Status gone = peerGone(i);  // slow: a kill() and a /proc read
      bool queued = messageQueuedFrom(i);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (llOneReady(i, seq)) continue;  // it caught up: neither is evidence against it
      if (!gone.isOk()) return gone;
      // A message from a peer that has not published seq was sent before it entered this
      // operation (it publishes on entry), and every message of the calls before was received:
      // the peer runs another operation here.
      if (queued)
        return LOOM_ERROR(kInvalidUsage,
                          "rank {} sent a message while this rank waits in a small "
                          "(low-latency) collective: the ranks called different collectives, "
                          "counts or datatypes",
                          peers_[i].rank)
            .withCause(Cause::kMismatch);
    }
    return Status();
  };
  LOOM_TRY(waitFor([&] { return llAllReady(seq); },
                   [&] { sleepOnBell(1, [&] { return llAllReady(seq); }); }, check, abort_,
                   opts_.yieldWhenIdle, spinNs, timeoutMs, "the other ranks of this host"));
  for (int i = 0; i < nlocal(); ++i) {
    LlFlags* f = llFlagsOf(llBuffer(i, seq));
    if (f->signature != signature)
      return LOOM_ERROR(kInvalidUsage,
                        "rank {} called a different operation than this rank (signature {:#x}, "
                        "here {:#x}): collectives, counts, datatypes, ops or roots differ between "
                        "ranks",
                        peers_[i].rank, f->signature, signature)
          .withCause(Cause::kMismatch);
  }
  return Status();
}

}  // namespace loom::shm
