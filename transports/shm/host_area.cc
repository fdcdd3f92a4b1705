#include "transports/shm/host_area.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>

#include "src/core/clock.h"
#include "src/core/fence.h"
#include "src/core/params.h"

namespace loom::shm {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
constexpr size_t kPage = 4096;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Header {
  uint64_t magic;
  uint32_t nlocal;
  uint32_t slots;
  uint64_t slotBytes;
  uint64_t llBytes;
};

long futexWait(std::atomic<uint32_t>* addr, uint32_t val, int64_t timeoutUs) {
  const timespec ts = timespecOfNs(timeoutUs * 1000);
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, val, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

size_t areaBytesOf(const Options& o) {
  return roundUp(sizeof(RankArea) + 2 * (kLine + o.llBytes), kPage);
}
size_t ringBytesOf(const Options& o) {
  return roundUp(offsetof(Ring, slots) + o.slots * (kLine + o.slotBytes), kPage);
}

// A rank's result tiles: a counter line per rank (its own: tiles filled; a peer's: taken), then
// the tiles.
size_t tileHeadBytesOf(size_t n) { return roundUp(n * kLine, kPage); }
size_t tileAreaBytesOf(size_t n) { return tileHeadBytesOf(n) + kResultTiles * kResultTileBytes; }

std::atomic<CheckHook> gCheckHook{nullptr};

}  // namespace

Options optionsFromParams() {
  Options opts;
  opts.slotBytes = static_cast<size_t>(params::kShmSlotSize.asInt());
  opts.slots = static_cast<int>(params::kShmSlots.asInt());
  // The low-latency buffers are there even with the exchange off (LOOM_SHM_LL_MAX=0).
  opts.llBytes = static_cast<size_t>(std::max<int64_t>(64, params::kShmLlMax.asInt()));
  opts.rtsMin = static_cast<size_t>(params::kShmRtsMin.asInt());
  const int64_t single = params::kShmSingleCopy.asInt();
  opts.singleCopyThreads = single >= 1;
  opts.singleCopyProcesses = single >= 2;
  opts.singleCopyMapped = single >= 1;
  opts.cmaOnePass = single >= 1 && params::kShmMapped.asBool() && params::kShmMappedCma.asBool();
  return opts;
}

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

size_t segmentBytes(int nlocal, const Options& o) {
  size_t n = static_cast<size_t>(nlocal);
  return kPage + n * areaBytesOf(o) + roundUp(n * n, kPage) + n * n * ringBytesOf(o) +
         n * tileAreaBytesOf(n);
}

void HostArea::format(char* base, int nlocal, const Options& opts) {
  auto* h = reinterpret_cast<Header*>(base);
  h->nlocal = static_cast<uint32_t>(nlocal);
  h->slots = static_cast<uint32_t>(opts.slots);
  h->slotBytes = opts.slotBytes;
  h->llBytes = opts.llBytes;
  // The segment is zero-filled; atomics at zero are valid. The magic goes last.
  loom::fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
}

Result<std::unique_ptr<HostArea>> HostArea::attach(std::unique_ptr<Segment> seg, int me,
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
  std::unique_ptr<HostArea> a(new HostArea());
  a->seg_ = std::move(seg);
  a->base_ = a->seg_->base();
  a->me_ = me;
  a->peers_ = std::move(peers);
  a->opts_ = opts;
  a->abort_ = abortFlag;
  a->myPid_ = getpid();
  a->areaOffset_ = kPage;
  a->areaBytes_ = areaBytesOf(opts);
  a->matrixOffset_ = a->areaOffset_ + n * a->areaBytes_;
  a->ringOffset_ = a->matrixOffset_ + roundUp(static_cast<size_t>(n) * n, kPage);
  a->ringBytes_ = ringBytesOf(opts);
  a->tileOffset_ = a->ringOffset_ + static_cast<size_t>(n) * n * a->ringBytes_;
  a->tileHeadBytes_ = tileHeadBytesOf(static_cast<size_t>(n));
  a->tileAreaBytes_ = tileAreaBytesOf(static_cast<size_t>(n));
  RankArea* mine = a->rankArea(me);
  mine->pid = a->myPid_;
  mine->state.store(static_cast<uint32_t>(PeerState::kAlive), std::memory_order_release);
  return a;
}

// ---- state and doorbells ----------------------------------------------------------------------

void HostArea::publishState(PeerState s) {
  rankArea(me_)->state.store(static_cast<uint32_t>(s), std::memory_order_seq_cst);
  for (int i = 0; i < nlocal(); ++i)
    if (i != me_) ringBell(rankArea(i));
}

void HostArea::ringBell(RankArea* a) {
  a->bell.fetch_add(1, std::memory_order_seq_cst);
  futexWake(&a->bell);
}

void HostArea::sleepOnBell(int timeoutMs, const std::function<bool()>& ready) {
  sleepOnBellUs(std::max(1, timeoutMs) * int64_t{1000}, ready);
}

void HostArea::sleepOnBellUs(int64_t timeoutUs, const std::function<bool()>& ready) {
  RankArea* me = rankArea(me_);
  // Registered as a waiter before the last look: a peer that publishes after that look sees us
  // waiting and rings, so the futex wait returns at once (see wake()).
  me->waiters.fetch_add(1, std::memory_order_seq_cst);
  uint32_t v = me->bell.load(std::memory_order_seq_cst);
  if (!ready()) futexWait(&me->bell, v, std::max<int64_t>(1, timeoutUs));
  me->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

Status HostArea::peerGone(int local) const {
  const LocalPeer& p = peers_[local];
  auto st = static_cast<PeerState>(rankArea(local)->state.load(std::memory_order_acquire));
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

void HostArea::awaitDrop(const std::atomic<uint32_t>& flag, int local, int64_t deadline) const {
  while (flag.load(std::memory_order_seq_cst) != 0 && nowNs() < deadline &&
         (peers_[local].pid == myPid_ || !processGone(peers_[local].pid)))
    sched_yield();
}

// ---- test seam --------------------------------------------------------------------------------

void HostArea::setCheckHookForTesting(CheckHook hook) {
  gCheckHook.store(hook, std::memory_order_release);
}

CheckHook HostArea::checkHook() { return gCheckHook.load(std::memory_order_acquire); }

}  // namespace loom::shm
