// The shared segment of one communicator's ranks on one host, as one rank sees it: its layout,
// each rank's doorbell and state word, what a waiting rank reads of its peers, and the poll loop
// waits are built on. Three things are built over it, each in its own file: the point-to-point
// rings (shm_transport.h), the low-latency exchange (low_latency_exchange.h) and the one-pass
// guard (one_pass_guard.h); HostGroup (host_group.h) owns the four.
//
// Layout of the segment (all offsets, no pointers, so every rank may map it anywhere):
//   header | per-rank areas (doorbell, state, pid, probe fields, one-pass flag, two low-latency
//   buffers) | can-read matrix | one single-producer/single-consumer ring of slots per ordered
//   pair of local ranks | per rank, a ring of result tiles its peers copy from (the one pass's,
//   src/runtime/one_pass.cc) and a counter line per rank.
//
// Waiting: a rank that has nothing to do sleeps on its doorbell (a process-shared futex) after
// registering as a waiter; peers ring the doorbell only when someone waits, so the fast path is
// plain loads and stores. Peers that die are detected by pid (and by the state word they set when
// they fail or close), never by waiting for a deadline alone.
//
// Threads: an instance belongs to one rank of one communicator and is used by one thread at a
// time, as are the rings, the exchange and the guard built over it. Each rank (thread or process)
// owns its own instance over the shared segment.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "src/core/clock.h"
#include "src/core/collective.h"
#include "src/core/fence.h"
#include "src/core/log.h"
#include "src/core/process.h"
#include "src/core/status.h"
#include "transports/shm/shm_segment.h"

namespace loom::shm {

struct Options {
  size_t slotBytes = 64 << 10;  // payload bytes per slot (a multiple of 64)
  int slots = 8;                // slots per ring
  size_t llBytes = 64 << 10;    // low-latency buffer per rank (two of them)
  size_t rtsMin = 64 << 10;     // messages at least this large use single copy when possible
  // Single copy (LOOM_SHM_SINGLE_COPY): between threads of one process (memcpy from the peer's
  // buffer), and between processes with process_vm_readv where the kernel allows it.
  bool singleCopyThreads = true;
  bool singleCopyProcesses = false;
  // Between processes, messages from loomMemAlloc buffers are read through a mapping of the
  // sender's allocation (no system call per message), where /proc/<pid>/fd may be opened.
  bool singleCopyMapped = true;
  // The one-pass collectives (LOOM_SHM_MAPPED_CMA) may read and write plain buffers of other
  // processes with process_vm_readv/writev: probe whether the kernel allows it.
  bool cmaOnePass = true;
  bool yieldWhenIdle = false;       // waits yield the core between polls (more ranks than cores)
  size_t budgetBytes = 256u << 20;  // rings shrink (slot size, then count) to fit this total
};

// The options LOOM_SHM_* set (yieldWhenIdle is the communicator's to set).
Options optionsFromParams();
// The geometry every rank derives from (nlocal, options): rings shrunk to fit the budget.
Options fitOptions(int nlocal, Options opts);
size_t segmentBytes(int nlocal, const Options& opts);

struct LocalPeer {
  int rank = 0;  // rank in the communicator (for messages)
  int pid = 0;
};

enum class PeerState : uint32_t { kAlive = 0, kClosed = 1, kFailed = 2 };

constexpr size_t kLine = 64;

// Bits of the can-read matrix: what a reader can do with an owner's memory.
constexpr uint8_t kReadsAny = 1;    // any address (threads of one process, process_vm_readv)
constexpr uint8_t kMapsShared = 2;  // the owner's shared allocations (loomMemAlloc), by mapping
constexpr uint8_t kCma = 4;  // process_vm_readv/writev on the owner's memory (another process)
constexpr int64_t kPeerCheckNs = 20 * 1000000;  // how often a waiting rank checks peer liveness

// A rank's area of the segment.
struct RankArea {
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
  // fails or closes waits for 0 on every peer before it returns (OnePassGuard::awaitPeersOut).
  std::atomic<uint32_t> onePass;
  // The call this rank runs now (a CallNote's two words), for a peer that must say how their
  // calls differ.
  std::atomic<uint64_t> callWords[2];
  // Two low-latency buffers follow, each a cache line of flags (LlFlags) and llBytes of data.
};

// The cache line in front of each low-latency buffer.
struct LlFlags {
  std::atomic<uint64_t> seq;
  uint64_t bytes;
  uint64_t signature;
  CallNote call;  // what the rank called (said when signatures differ)
};
static_assert(sizeof(LlFlags) <= kLine, "the flags fit the cache line in front of the buffer");

// The ring from one local rank to another (its slots are the point-to-point transport's).
struct Ring {
  alignas(kLine) std::atomic<uint64_t> head;   // slots produced (sender)
  alignas(kLine) std::atomic<uint64_t> tail;   // slots consumed (receiver)
  alignas(kLine) std::atomic<uint64_t> acked;  // single-copy messages completed (receiver)
  // 1 while the receiver reads the sender's own memory (single copy). A sender that fails or
  // closes waits for 0 before it returns (Transport::awaitReaders), so its caller never frees a
  // buffer being read.
  alignas(kLine) std::atomic<uint32_t> pulling;
  alignas(kLine) char slots[1];  // slots x (SlotHdr + slotBytes)
};

// Each rank's ring of result tiles (one_pass.cc): kResultTiles tiles of kResultTileBytes that the
// rank fills and every peer copies out. The line in front counts the tiles filled in the current
// call; a line per peer counts those it copied out (each counter has one writer, reset before
// the call's first round).
constexpr int kResultTiles = 4;
constexpr size_t kResultTileBytes = 256 << 10;
struct TileCounter {
  alignas(kLine) std::atomic<uint64_t> count;
};

// Test seam: called by a waiting rank's periodic check after it saw that local peer `local` has
// not yet done what it waits for, before it reads the evidence it judges the peer on (the
// low-latency wait, LowLatencyExchange::waitAll, and a request's wait, Transport::test). A test
// installs one to hold the rank there while the peer moves on (issue 21); null (the default)
// costs one load per check, every 20 ms.
enum class CheckPoint { kLowLatencyWait, kRequestWait };
class HostArea;
using CheckHook = void (*)(const HostArea& area, int local, CheckPoint where);

class HostArea {
 public:
  // Formats a freshly created segment (the creator calls it once, before anyone opens it).
  static void format(char* base, int nlocal, const Options& opts);
  // Wraps a mapped, formatted segment and marks this rank alive in it. peers[i] is local rank i;
  // me is this rank's index. abortFlag (may be null) ends waits early.
  static Result<std::unique_ptr<HostArea>> attach(std::unique_ptr<Segment> seg, int me,
                                                  std::vector<LocalPeer> peers, Options opts,
                                                  const std::atomic<bool>* abortFlag);

  Segment& segment() { return *seg_; }
  int localIndex() const { return me_; }
  int nlocal() const { return static_cast<int>(peers_.size()); }
  const Options& options() const { return opts_; }
  const LocalPeer& peer(int local) const { return peers_[local]; }
  int myPid() const { return myPid_; }
  const std::atomic<bool>* abortFlag() const { return abort_; }

  // --- the layout ---
  RankArea* rankArea(int local) const {
    return reinterpret_cast<RankArea*>(base_ + areaOffset_ + local * areaBytes_);
  }
  Ring* ring(int from, int to) const {
    size_t idx = static_cast<size_t>(from) * peers_.size() + static_cast<size_t>(to);
    return reinterpret_cast<Ring*>(base_ + ringOffset_ + idx * ringBytes_);
  }
  // What local rank `reader` can do with local rank `owner`'s memory (kReadsAny | kMapsShared |
  // kCma, written by the transport's probes, shm_probes.cc).
  uint8_t* canRead(int reader, int owner) const {
    return reinterpret_cast<uint8_t*>(base_ + matrixOffset_ +
                                      static_cast<size_t>(reader) * peers_.size() + owner);
  }
  // Rank `owner`'s result tiles: how many it filled in this call, how many rank `reader` copied
  // out, and tile i (of kResultTiles).
  std::atomic<uint64_t>& tilesFilled(int owner) const { return tileCounter(owner, owner); }
  std::atomic<uint64_t>& tilesTaken(int owner, int reader) const {
    return tileCounter(owner, reader);
  }
  char* resultTile(int owner, uint64_t i) const {
    return base_ + tileOffset_ + static_cast<size_t>(owner) * tileAreaBytes_ + tileHeadBytes_ +
           (i % kResultTiles) * kResultTileBytes;
  }
  // The low-latency buffer rank `local` writes for sequence seq (options().llBytes bytes); its
  // flags are the cache line before it.
  char* llBuffer(int local, uint64_t seq) const {
    char* base = reinterpret_cast<char*>(rankArea(local)) + kLlOffset;
    return base + (seq & 1) * (kLine + opts_.llBytes) + kLine;
  }
  static LlFlags* llFlagsOf(char* buffer) { return reinterpret_cast<LlFlags*>(buffer - kLine); }
  // This rank's call now (runCall notes each one), and a peer's as it last noted it.
  void noteCall(const CallNote& call) {
    uint64_t w[2];
    std::memcpy(w, &call, sizeof(w));
    RankArea* a = rankArea(me_);
    a->callWords[0].store(w[0], std::memory_order_relaxed);
    a->callWords[1].store(w[1], std::memory_order_relaxed);
  }
  CallNote peerCall(int local) const {
    const RankArea* a = rankArea(local);
    uint64_t w[2] = {a->callWords[0].load(std::memory_order_relaxed),
                     a->callWords[1].load(std::memory_order_relaxed)};
    CallNote c;
    std::memcpy(&c, w, sizeof(c));
    return c;
  }

  // --- state and doorbells ---
  // Sets this rank's state word (peers waiting on it see it at once) and rings every doorbell.
  // HostGroup::setState does the rest of what a failing or closing rank must do.
  void publishState(PeerState s);
  // Rings local rank i's doorbell if it waits.
  void wake(int local) {
    RankArea* a = rankArea(local);
    // Pairs with the waiter's seq_cst increment of `waiters` before it re-checks the rings: either
    // it sees what we published, or we see it waiting.
    loom::fence(std::memory_order_seq_cst);
    if (a->waiters.load(std::memory_order_relaxed) == 0) return;
    ringBell(a);
  }
  // Sleeps on this rank's doorbell up to timeoutMs unless ready() (checked after registering as
  // a waiter) is already true.
  void sleepOnBell(int timeoutMs, const std::function<bool()>& ready);
  void sleepOnBellUs(int64_t timeoutUs, const std::function<bool()>& ready);
  // An error when local rank i is known to be gone (its state word, or its pid no longer runs).
  Status peerGone(int local) const;
  // Waits (until deadline; a peer whose process is gone stops mattering) for local rank i to
  // drop a flag it raised before it saw this rank's state (publishState).
  void awaitDrop(const std::atomic<uint32_t>& flag, int local, int64_t deadline) const;

  // --- what a waiting rank reads of a peer (each a fresh acquire load) ---
  // The last low-latency sequence it published (this rank's own, for local == localIndex()).
  uint64_t peerLlSeq(int local) const {
    return std::max(llFlagsOf(llBuffer(local, 0))->seq.load(std::memory_order_acquire),
                    llFlagsOf(llBuffer(local, 1))->seq.load(std::memory_order_acquire));
  }
  // A slot from it this rank has not consumed yet (only this rank consumes its incoming rings).
  bool messageQueuedFrom(int local) const {
    const Ring* r = ring(local, me_);
    return r->head.load(std::memory_order_acquire) != r->tail.load(std::memory_order_relaxed);
  }
  PeerState peerState(int local) const {
    return static_cast<PeerState>(rankArea(local)->state.load(std::memory_order_acquire));
  }

  // The test seam (CheckPoint above): where a waiting rank's check calls it.
  static void setCheckHookForTesting(CheckHook hook);
  void atCheck(int local, CheckPoint where) const {
    if (CheckHook hook = checkHook()) hook(*this, local, where);
  }

 private:
  HostArea() = default;
  static CheckHook checkHook();
  std::atomic<uint64_t>& tileCounter(int owner, int i) const {
    auto* c = reinterpret_cast<TileCounter*>(base_ + tileOffset_ +
                                             static_cast<size_t>(owner) * tileAreaBytes_);
    return c[i].count;
  }
  static void ringBell(RankArea* a);  // bumps the bell and wakes its sleepers
  // Where the low-latency buffers start in a rank's area.
  static constexpr size_t kLlOffset = (sizeof(RankArea) + kLine - 1) / kLine * kLine;

  std::unique_ptr<Segment> seg_;
  char* base_ = nullptr;
  int me_ = 0;
  std::vector<LocalPeer> peers_;
  Options opts_;
  const std::atomic<bool>* abort_ = nullptr;
  int myPid_ = 0;
  size_t areaOffset_ = 0, areaBytes_ = 0, matrixOffset_ = 0, ringOffset_ = 0, ringBytes_ = 0;
  size_t tileOffset_ = 0, tileAreaBytes_ = 0, tileHeadBytes_ = 0;
};

// What a wait waits for, for its messages: a fixed text, or a function that says it at the time
// (which ranks are still missing).
template <typename What>
std::string describeWait(const What& what) {
  if constexpr (std::is_invocable_v<const What&>)
    return what();
  else
    return std::string(what);
}

// Polls ready() (yielding the core between polls when ranks outnumber cores or the wait is not
// short, else with a pause instruction) for spinNs, then sleep()s (on the doorbell, in 1 ms naps);
// checks abort, the deadline (timeoutMs > 0: LOOM_TIMEOUT) and, every kPeerCheckNs, the peers'
// liveness (check()) between polls.
template <typename Ready, typename Sleep, typename Check, typename What>
Status waitFor(Ready ready, Sleep sleep, Check check, const std::atomic<bool>* abortFlag,
               bool yield, int64_t spinNs, int64_t timeoutMs, const What& what) {
  if (ready()) return Status();
  int64_t start = nowNs();
  int64_t lastCheck = start;
  ProgressNotice notice(timeoutMs);
  uint32_t polls = 0;
  bool sleeping = false;  // past spinNs: each pass sleeps, with no polls between the sleeps
  while (!ready()) {
    if (!sleeping && (++polls & 63) != 0) {
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
                        timeoutMs / 1000, describeWait(what));
    if (notice.due((now - start) / 1000000))
      LOOM_WARN("no progress for {} s{} waiting for {}", (now - start) / 1000000000,
                timeoutMs > 0 ? fmt::format(" of {} (LOOM_TIMEOUT)", timeoutMs / 1000) : "",
                describeWait(what));
    if (now - start >= spinNs) {
      // Woken by a peer's bell (or the sleep's limit), this rank looks at once and sleeps again
      // if nothing came: yielding in a loop between the sleeps kept 6-7% of a core busy.
      sleeping = true;
      sleep();
    }
  }
  return Status();
}

}  // namespace loom::shm
