#include "src/runtime/one_pass.h"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/patterns.h"
#include "src/core/dtype.h"
#include "src/core/hash.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/reduce/reduce.h"
#include "src/runtime/comm.h"
#include "transports/shm/host_group.h"

namespace loom {

namespace {

// What a rank publishes in the first round (its low-latency buffer holds it).
struct Record {
  uint32_t pid;
  uint32_t flags;                // kTilesOk
  uint64_t inAddr, outAddr;      // in its own address space
  uint64_t inSerial, outSerial;  // shared allocations (0: none)
  uint32_t inFd, outFd;
  uint64_t inOff, outOff;
};
static_assert(sizeof(Record) <= 64, "fits the smallest low-latency buffer");
// Record::flags: this rank would pass an AllReduce's or a Broadcast's results through the shared
// tiles (ResultTiles: its outputs are cold, and LOOM_SHM_RESULT_TILES is 2, or 1 where its host's
// ranks do not outnumber its cores).
constexpr uint32_t kTilesOk = 1;

// Tiles reduced in a cache-resident buffer and then copied to every output. Larger when a peer is
// reached through system calls (process_vm_readv/writev), to spread their cost.
constexpr size_t kTileBytes = 32 << 10;
constexpr size_t kCmaTileBytes = shm::kResultTileBytes;
// How this rank reaches one buffer of one rank: a pointer in this address space (its own, a
// thread's, or a mapping of a loomMemAlloc allocation), else an address in process `pid`.
struct PeerBuf {
  char* ptr = nullptr;
  uint64_t remote = 0;
  int pid = 0;
  int rank = 0;
  bool local() const { return ptr != nullptr; }
};

// Moves bytes between local memory and offset off of b's process (write: to it), whole.
Status cmaCopy(const PeerBuf& b, size_t off, char* local, size_t bytes, bool write) {
  for (size_t done = 0; done < bytes;) {
    iovec l{local + done, bytes - done},
        r{reinterpret_cast<void*>(b.remote + off + done), bytes - done};
    ssize_t n = write ? process_vm_writev(b.pid, &l, 1, &r, 1, 0)
                      : process_vm_readv(b.pid, &l, 1, &r, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    int err = n < 0 ? errno : EFAULT;
    if (err == EINTR) continue;
    return makeError(err == ESRCH ? Code::kRemote : Code::kSystem,
                     "{} of {} bytes at {:#x} in rank {} (pid {}) failed: {}",
                     write ? "process_vm_writev" : "process_vm_readv", bytes, b.remote + off,
                     b.rank, b.pid, err == ESRCH ? "that process is gone" : std::strerror(err))
        .withCause(err == ESRCH ? Cause::kPeerGone : Cause::kUnspecified);
  }
  return Status();
}

// bytes at offset off of b: b's own memory when this process can address it, else read into stage.
Result<const char*> readFrom(const PeerBuf& b, size_t off, size_t bytes, char* stage) {
  if (b.local()) return static_cast<const char*>(b.ptr + off);
  LOOM_TRY(cmaCopy(b, off, stage, bytes, false));
  return static_cast<const char*>(stage);
}

// streaming: stored around the caches (copyStreaming), for calls larger than they are.
Status writeTo(const PeerBuf& b, size_t off, const char* src, size_t bytes, bool streaming) {
  if (!b.local()) return cmaCopy(b, off, const_cast<char*>(src), bytes, true);
  if (b.ptr + off == src) return Status();
  if (streaming)
    copyStreaming(b.ptr + off, src, bytes);
  else
    std::memcpy(b.ptr + off, src, bytes);
  return Status();
}

// Three tiles (the result and two staged peer reads), 64-byte aligned, per thread.
char* tiles(size_t tileBytes) {
  static thread_local std::unique_ptr<char[]> mem;
  static thread_local size_t have = 0;
  if (have < 3 * tileBytes) {
    mem.reset(new char[3 * tileBytes + 64]);
    have = 3 * tileBytes;
  }
  auto p = reinterpret_cast<uintptr_t>(mem.get());
  return reinterpret_cast<char*>((p + 63) & ~static_cast<uintptr_t>(63));
}

struct Layout {
  size_t inBytes = 0, outBytes = 0;
  bool usesIn = true, usesOut = true;
};

Layout layoutOf(const OpArgs& op, int rank, int n) {
  const size_t es = dataTypeSize(op.dtype);
  const CollCounts c = collCounts(op.coll, op.count, n);
  Layout l;
  l.inBytes = c.input * es;
  l.outBytes = c.output * es;
  // Buffers the collective never touches on this rank may be anything, even NULL.
  l.usesIn = collUsesInput(op.coll, rank, op.root, op.isSend);
  l.usesOut = collUsesOutput(op.coll, rank, op.root, op.isSend);
  return l;
}

uint64_t roundSignature(const OpArgs& op, uint64_t round) {
  return Fnv64().mix(opSignature(op)).mix(0x5348444952ull).mix(round).value();
}

}  // namespace

// process_vm_readv/writev walk and pin the peer's buffer page by page: on transparent huge pages
// they move 1.2-1.6x more per second than on 4 KiB pages (bench/peers/cma_bw, one core, cold
// buffers: 8.2-8.5 GB/s against 5.1-7.0).
int collapseHugePages(const void* p, size_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t kHuge = kHugePageBytes;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (hi <= lo) return 0;
  constexpr int kCollapse = 25;  // MADV_COLLAPSE, where the headers predate it
  return madvise(reinterpret_cast<void*>(lo), hi - lo, kCollapse) == 0 ? 0 : errno;
#else
  (void)p;
  (void)bytes;
  return ENOSYS;
#endif
}

#if defined(__linux__)
namespace {
// The mapping of this process that holds addr (/proc/self/maps): false where none does or the file
// cannot be read.
bool mappingOf(uintptr_t addr, uintptr_t* lo, uintptr_t* hi) {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long a = 0, b = 0;
    found = std::sscanf(line, "%lx-%lx", &a, &b) == 2 && a <= addr && addr < b;
    if (found) {
      *lo = a;
      *hi = b;
    }
    // A line longer than the buffer (a long path): skip the rest of it.
    while (std::strchr(line, '\n') == nullptr && std::fgets(line, sizeof(line), maps) != nullptr) {
    }
  }
  std::fclose(maps);
  return found;
}
}  // namespace
#endif

bool collapseReusedBuffer(const void* p, size_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t kHuge = kHugePageBytes;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p), end = start + bytes;
  struct Range {
    uintptr_t start, end;  // a buffer seen, as its call gave it
    bool tried;            // collapsed, or the kernel would not
  };
  static std::mutex mu;
  static std::vector<Range> seen;  // newest last
  std::lock_guard<std::mutex> lock(mu);
  auto it = std::find_if(seen.begin(), seen.end(),
                         [&](const Range& r) { return r.start <= start && end <= r.end; });
  if (it != seen.end() && it->tried) return false;
  if (it == seen.end()) {  // the first time: maybe a buffer used once
    // Its whole huge pages: none in a small buffer.
    if (((start + kHuge - 1) & ~(kHuge - 1)) >= (end & ~(kHuge - 1))) return false;
    if (seen.size() == 64) seen.erase(seen.begin());
    seen.push_back({start, end, false});
    return false;
  }
  // Used again (this call's range lies in one seen before: the same buffer, or a part of it, as a
  // sweep's smaller sizes are): all of what was seen, and the rest of its mapping where that is at
  // most kMappingFactor times as large (a benchmark's buffer, whose offsets rotate: collapsed
  // piece by piece as each new piece came round, it cost 6-17 ms inside timed calls each time),
  // not a large heap or arena the buffer is a small part of.
  constexpr uintptr_t kMappingFactor = 4;
  it->tried = true;
  uintptr_t mapLo = 0, mapHi = 0;
  if (mappingOf(it->start, &mapLo, &mapHi) && it->end <= mapHi &&
      mapHi - mapLo <= kMappingFactor * (it->end - it->start)) {
    it->start = mapLo;  // and nothing in it is tried again
    it->end = mapHi;
    for (Range& r : seen)
      if (mapLo <= r.start && r.end <= mapHi) r.tried = true;
  }
  const int err = collapseHugePages(reinterpret_cast<const void*>(it->start), it->end - it->start);
  if (err == 0) return true;
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LOOM_INFO(kSubShm, "a buffer of {} bytes stays on small pages (madvise MADV_COLLAPSE: {})",
              it->end - it->start, std::strerror(err));
  });
#else
  (void)p;
  (void)bytes;
#endif
  return false;
}

// The results of an out-of-place AllReduce or Broadcast between processes that reach
// each other's outputs only through process_vm_writev (LOOM_SHM_RESULT_TILES), where the outputs
// are cold: each rank stores its part of the results into its own output and into tiles of the
// shared segment, and every peer copies the tiles into its output around the caches.
// process_vm_writev would store into the peer's output with ordinary stores, which first read each
// cold line from memory: the tiles move a fifth less through memory for an AllReduce, and the
// kernel pins nothing for the results.
//
// Rank p's part is `bytes` bytes at `offset` in every output (Span); its tile j holds bytes
// [j * kResultTileBytes, ...) of it. A rank fills its tiles in order, kResultTiles ahead of the
// slowest peer at most; while it waits for a free one it copies out what its peers filled, so no
// two ranks wait for each other. The counters (host_area.h) start at 0 in every call: each rank
// resets the ones it writes before the first round, and nobody enters the next call before every
// rank has taken every tile (round 2).
class ResultTiles {
 public:
  struct Span {
    size_t offset = 0, bytes = 0;
  };
  ResultTiles(Comm* comm, shm::HostArea& area, int n, char* out, std::vector<Span> spans)
      : comm_(comm),
        area_(area),
        n_(n),
        me_(area.localIndex()),
        out_(out),
        spans_(std::move(spans)),
        taken_(static_cast<size_t>(n), 0) {}

  // Resets the counters this rank writes (before the call's first round publishes).
  static void reset(shm::HostArea& area, int n) {
    const int me = area.localIndex();
    area.tilesFilled(me).store(0, std::memory_order_relaxed);
    for (int p = 0; p < n; ++p)
      if (p != me) area.tilesTaken(p, me).store(0, std::memory_order_relaxed);
  }

  // The next tile of this rank's to fill, once every peer has taken what it held.
  Result<char*> claim() {
    auto free = [&] {
      for (int p = 0; p < n_; ++p)
        if (p != me_ && filled_ - area_.tilesTaken(me_, p).load(std::memory_order_acquire) >=
                            static_cast<uint64_t>(shm::kResultTiles))
          return false;
      return true;
    };
    LOOM_TRY(waitUntil(free, "its peers to copy out its results"));
    return area_.resultTile(me_, filled_);
  }
  // The tile claim() gave is full: peers may take it.
  void filled() {
    area_.tilesFilled(me_).store(++filled_, std::memory_order_release);
    takeAvailable();
  }
  // Copies out every peer's remaining tiles of the call.
  Status finish() {
    return waitUntil([&] { return remaining() == 0; }, "its peers' results");
  }

 private:
  uint64_t tilesOf(int p) const {
    return (spans_[static_cast<size_t>(p)].bytes + shm::kResultTileBytes - 1) /
           shm::kResultTileBytes;
  }
  uint64_t remaining() const {
    uint64_t left = 0;
    for (int p = 0; p < n_; ++p)
      if (p != me_) left += tilesOf(p) - taken_[static_cast<size_t>(p)];
    return left;
  }
  // Copies every tile the peers have filled and this rank not yet taken into its output.
  void takeAvailable() {
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      uint64_t& j = taken_[static_cast<size_t>(p)];
      const uint64_t ready = area_.tilesFilled(p).load(std::memory_order_acquire);
      const Span& sp = spans_[static_cast<size_t>(p)];
      for (; j < ready; ++j) {
        const size_t o = j * shm::kResultTileBytes;
        copyStreaming(out_ + sp.offset + o, area_.resultTile(p, j),
                      std::min(shm::kResultTileBytes, sp.bytes - o));
        area_.tilesTaken(p, me_).store(j + 1, std::memory_order_release);
      }
    }
  }
  template <typename Done>
  Status waitUntil(Done done, const char* what) {
    auto ready = [&] {
      takeAvailable();
      return done();
    };
    auto check = [&]() -> Status {
      for (int p = 0; p < n_; ++p)
        if (p != me_) LOOM_TRY(area_.peerGone(p));
      return Status();
    };
    return shm::waitFor(
        ready, [] { sched_yield(); }, check, area_.abortFlag(), area_.options().yieldWhenIdle,
        comm_->spinNs(), comm_->timeoutMs(), what);
  }

  Comm* comm_;
  shm::HostArea& area_;
  const int n_, me_;
  char* out_;
  const std::vector<Span> spans_;
  uint64_t filled_ = 0;
  std::vector<uint64_t> taken_;  // tiles of each peer copied out
};

// onePass where the results go through the shared tiles (ResultTiles): an AllReduce or a
// Broadcast fills its tiles with this rank's slice (evenBlock). Never in place. (An AllGather
// does not take them: measured on the 2-core VM, 2 ranks, 1-64 MiB in a sweep, it was up to 15%
// slower through the tiles than through process_vm_writev.)
Status tiledPass(const OpArgs& op, int me, int n, const std::vector<PeerBuf>& ins,
                 const std::vector<PeerBuf>& outs, Comm* comm, shm::HostArea& area) {
  const size_t es = dataTypeSize(op.dtype), tileBytes = shm::kResultTileBytes;
  const loomRedOp_t rop = op.op == loomAvg ? loomSum : op.op;
  std::vector<ResultTiles::Span> spans(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    const Block blk = evenBlock(op.count, n, p);
    spans[static_cast<size_t>(p)] = {blk.offset * es, blk.count * es};
  }
  ResultTiles passed(comm, area, n, outs[me].ptr, spans);
  const ResultTiles::Span mine = spans[static_cast<size_t>(me)];
  char* stage = tiles(tileBytes);  // two of its three for staged peer reads
  for (size_t o = 0; o < mine.bytes; o += tileBytes) {
    const size_t len = std::min(tileBytes, mine.bytes - o), at = mine.offset + o;
    LOOM_ASSIGN(char* shared, passed.claim());
    char* own = outs[me].ptr + at;
    if (op.coll == CollKind::kBroadcast) {
      // Slice me of the root's input, read straight into the tile.
      LOOM_ASSIGN(const char* src, readFrom(ins[op.root], at, len, shared));
      if (src != shared) std::memcpy(shared, src, len);
      copyStreaming(own, shared, len);
    } else {
      // AllReduce: the last step stores twice, this rank's output and the tile (the sum before an
      // average's division goes to the tile first).
      char* stageA = stage;
      char* stageB = stage + tileBytes;
      LOOM_ASSIGN(const char* a, readFrom(ins[0], at, len, stageA));
      const size_t count = len / es;
      for (int r = 1; r < n; ++r) {
        LOOM_ASSIGN(const char* x, readFrom(ins[r], at, len, r == 1 ? stageB : stageA));
        if (r == n - 1 && op.op != loomAvg)
          reduceBuffersTwice(own, shared, a, x, count, op.dtype, rop, true);
        else
          reduceBuffers(shared, a, x, count, op.dtype, rop);
        a = shared;
      }
      if (op.op == loomAvg) {
        finishAverage(shared, count, op.dtype, n);
        copyStreaming(own, shared, len);
      }
    }
    passed.filled();
  }
  return passed.finish();
}

// This rank's share of op, over every rank's buffers (ins/outs: unused ones are empty).
// streaming: the results go around the caches (the outputs are cold; streamingStoresFor).
Status onePass(const OpArgs& op, int me, int n, const std::vector<PeerBuf>& ins,
               const std::vector<PeerBuf>& outs, size_t tileBytes, bool streaming) {
  const size_t es = dataTypeSize(op.dtype);
  const size_t c = op.count;
  const loomRedOp_t rop = op.op == loomAvg ? loomSum : op.op;
  char* tile = tiles(tileBytes);
  char* stageA = tile + tileBytes;
  char* stageB = stageA + tileBytes;
  const size_t tileElems = tileBytes / es;
  // acc = in_0 (op) in_1 (op) ... at element offset off, len elements (rank order: every rank
  // and every run gets the same bits). With `out` (this rank's own output, streaming: it then
  // needs no copy from acc), the last step stores the result there too (kTwice) or only there
  // (kOut; acc then holds no result).
  enum class Last { kAcc, kTwice, kOut };
  auto reduceInto = [&](char* acc, size_t off, size_t len, Last last = Last::kAcc,
                        char* out = nullptr) -> Status {
    size_t b = off * es, bytes = len * es;
    auto step = [&](const char* a, const char* x, bool final) {
      if (final && last == Last::kTwice)
        reduceBuffersTwice(out, acc, a, x, len, op.dtype, rop, true);
      else if (final && last == Last::kOut)
        reduceBuffersStreaming(out, a, x, len, op.dtype, rop);
      else
        reduceBuffers(acc, a, x, len, op.dtype, rop);
    };
    LOOM_ASSIGN(const char* a, readFrom(ins[0], b, bytes, stageA));
    LOOM_ASSIGN(const char* x, readFrom(ins[1], b, bytes, stageB));
    step(a, x, n == 2);
    for (int r = 2; r < n; ++r) {
      LOOM_ASSIGN(x, readFrom(ins[r], b, bytes, stageA));
      step(acc, x, r == n - 1);
    }
    if (op.op == loomAvg) finishAverage(acc, len, op.dtype, n);
    return Status();
  };
  // The result accumulates in this rank's own output where that saves a copy: not in place with
  // more than two ranks, where the first step would overwrite this rank's input before the step
  // that reads it.
  // Where the call's buffers exceed the caches, the result accumulates in the tile instead and
  // goes to every output around the caches; not in place, where the outputs were just read.
  const bool accInOut = (!op.inPlace || n == 2) && !streaming;
  auto writeOut = [&](const PeerBuf& b, size_t off, const char* src, size_t bytes) {
    return writeTo(b, off, src, bytes, streaming);
  };
  const Block blk = evenBlock(c, n, me);
  switch (op.coll) {
    case CollKind::kAllReduce:
    case CollKind::kReduce: {
      const bool ownOut = op.coll == CollKind::kAllReduce || me == op.root;
      // Streaming, the last step stores into this rank's output as it fills the tile (not for an
      // average, whose division comes after the sum).
      const bool fused = ownOut && !accInOut && streaming && op.op != loomAvg;
      for (size_t o = 0; o < blk.count; o += tileElems) {
        size_t len = std::min(tileElems, blk.count - o), b = (blk.offset + o) * es;
        char* acc = ownOut && accInOut ? outs[me].ptr + b : tile;
        // A Reduce's non-root has no output (null): nothing to offset into then.
        char* own = ownOut ? outs[me].ptr + b : nullptr;
        LOOM_TRY(reduceInto(acc, blk.offset + o, len, fused ? Last::kTwice : Last::kAcc, own));
        for (int r = 0; r < n; ++r) {
          if (op.coll == CollKind::kReduce && r != op.root) continue;
          if (fused && r == me) continue;
          LOOM_TRY(writeOut(outs[r], b, acc, len * es));
        }
      }
      return Status();
    }
    case CollKind::kReduceScatter: {
      // Rank me's output is block me of the reduction of everyone's input (count elements each).
      // Streaming, the last step stores straight into the output (not for an average).
      const bool direct = !accInOut && streaming && op.op != loomAvg;
      for (size_t o = 0; o < c; o += tileElems) {
        size_t len = std::min(tileElems, c - o);
        char* acc = accInOut ? outs[me].ptr + o * es : tile;
        LOOM_TRY(reduceInto(acc, static_cast<size_t>(me) * c + o, len,
                            direct ? Last::kOut : Last::kAcc, outs[me].ptr + o * es));
        if (!direct) LOOM_TRY(writeOut(outs[me], o * es, acc, len * es));
      }
      return Status();
    }
    case CollKind::kBroadcast:
      // Slice me of the root's buffer into every output (the root's own, in place, is there).
      for (size_t o = 0; o < blk.count; o += tileElems) {
        size_t len = std::min(tileElems, blk.count - o), b = (blk.offset + o) * es;
        LOOM_ASSIGN(const char* src, readFrom(ins[op.root], b, len * es, stageA));
        for (int r = 0; r < n; ++r) {
          if (r == op.root && outs[r].remote == ins[r].remote) continue;
          LOOM_TRY(writeOut(outs[r], b, src, len * es));
        }
      }
      return Status();
    case CollKind::kAllGather:
      // This rank's input into block me of every output (its own, in place, is there).
      for (int r = 0; r < n; ++r) {
        size_t b = static_cast<size_t>(me) * c * es;
        if (r == me && outs[r].remote + b == ins[me].remote) continue;
        LOOM_TRY(writeOut(outs[r], b, ins[me].ptr, c * es));
      }
      return Status();
    case CollKind::kAllToAll:
      // Block r of this rank's input goes to block me of rank r's output (out of place only).
      for (int r = 0; r < n; ++r)
        LOOM_TRY(writeOut(outs[r], static_cast<size_t>(me) * c * es,
                          ins[me].ptr + static_cast<size_t>(r) * c * es, c * es));
      return Status();
    default:
      return LOOM_ERROR(kInternal, "{} has no one-pass path", collName(op.coll));
  }
}

Status runOnePass(Comm* comm, const OpArgs& op, const Decision& decision, bool* ran) {
  *ran = false;
  shm::HostGroup* g = comm->shm();
  shm::LowLatencyExchange& ll = g->exchange();
  shm::OnePassGuard& guard = g->onePass();
  shm::Transport& rings = g->rings();  // its probes: what each rank can reach of the others
  const int n = comm->nranks(), me = comm->rank();
  const int myPid = getpid();
  const Layout mine = layoutOf(op, me, n);
  const char* in = static_cast<const char*>(op.sendbuff);
  char* out = static_cast<char*>(op.recvbuff);

  // Round 1: publish the buffers (and their shared allocations, if any).
  Record rec{};
  rec.pid = static_cast<uint32_t>(myPid);
  rec.inAddr = reinterpret_cast<uint64_t>(in);
  rec.outAddr = reinterpret_cast<uint64_t>(out);
  shm::SharedRef ri, ro;
  if (mine.usesIn && mine.inBytes && shm::findShared(in, mine.inBytes, &ri)) {
    rec.inSerial = ri.serial;
    rec.inFd = static_cast<uint32_t>(ri.fd);
    rec.inOff = ri.offset;
  }
  if (mine.usesOut && mine.outBytes && shm::findShared(out, mine.outBytes, &ro)) {
    rec.outSerial = ro.serial;
    rec.outFd = static_cast<uint32_t>(ro.fd);
    rec.outOff = ro.offset;
  }
  // Plain buffers a peer in another process may reach through process_vm_readv/writev: on huge
  // pages first, before any peer can (they learn the addresses in round 1).
  if (params::kShmThp.asBool()) {
    bool cmaPeer = false;
    for (int r = 0; r < n && !cmaPeer; ++r) cmaPeer = r != me && rings.canCma(r, me);
    if (cmaPeer && mine.usesIn && mine.inBytes && !rec.inSerial)
      collapseReusedBuffer(in, mine.inBytes);
    if (cmaPeer && mine.usesOut && mine.outBytes && !rec.outSerial && out != in)
      collapseReusedBuffer(out, mine.outBytes);
  }
  // Which stores the results take: around the caches where the outputs are cold (decided once
  // per call, before round 1, since the tiles are worth it only there).
  const ByteRange myOut{out, mine.usesOut ? mine.outBytes : 0};
  const bool streaming =
      !op.inPlace &&
      streamingStoresFor((mine.inBytes + mine.outBytes) * static_cast<size_t>(n), n, &myOut, 1);
  // Results through the shared tiles, if every rank says it may (decided after round 1): where
  // its outputs are cold. Warm, process_vm_writev stores into cached lines, and the tiles' extra
  // copy between the cores costs more than it saves. With 1 (where the ranks do not outnumber the
  // cores), each rank votes for whichever way it measured faster over its recent calls
  // (tile_choice.h).
  const int64_t tilesParam = params::kShmResultTiles.asInt();
  const bool tilesOpen =
      (op.coll == CollKind::kAllReduce || op.coll == CollKind::kBroadcast) && streaming &&
      (tilesParam == 2 || (tilesParam == 1 && !g->area().options().yieldWhenIdle));
  const bool measured = tilesOpen && tilesParam == 1;
  ResultTileChoice& choice = comm->resultTileChoice(op.coll == CollKind::kBroadcast);
  uint64_t seq = comm->nextLlSeq();
  const bool tilesWanted = tilesOpen && (!measured || choice.vote());
  if (tilesWanted) {
    rec.flags |= kTilesOk;
    ResultTiles::reset(g->area(), n);
  }
  auto failed = [&](Status st) {
    guard.end();  // first: a peer failing too waits for it (shm::HostGroup::setState)
    st = comm->explainLocalWait(
        st, std::string(collName(op.coll)) + " (one pass over the peers' buffers)");
    comm->fail(st);
    return st;
  };
  Status st = ll.round(seq, &rec, sizeof(rec), roundSignature(op, 1), callNote(op), comm->spinNs(),
                       comm->timeoutMs());
  if (!st.isOk()) return failed(st);
  std::vector<Record> recs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) std::memcpy(&recs[i], ll.buffer(i, seq), sizeof(Record));

  // Can every rank reach every rank's buffers? Every rank answers for every pair from the same
  // records and the same probe matrix, so all run this path or all fall back together.
  auto reach = [&](int reader, int owner, uint64_t serial) {
    return recs[reader].pid == recs[owner].pid || (serial && rings.canMapShared(reader, owner)) ||
           rings.canCma(reader, owner);
  };
  // Some buffer needs process_vm_readv/writev (again the same answer on every rank).
  auto cma = [&](int reader, int owner, uint64_t serial) {
    return recs[reader].pid != recs[owner].pid && !(serial && rings.canMapShared(reader, owner));
  };
  bool cmaUsed = false;
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < n; ++o) {
      Layout l = layoutOf(op, o, n);
      bool usesIn = l.usesIn && l.inBytes, usesOut = l.usesOut && l.outBytes;
      if ((usesIn && !reach(r, o, recs[o].inSerial)) ||
          (usesOut && !reach(r, o, recs[o].outSerial)))
        return Status();
      cmaUsed = cmaUsed || (usesIn && cma(r, o, recs[o].inSerial)) ||
                (usesOut && cma(r, o, recs[o].outSerial));
    }
  // Priced for mapped buffers: still cheaper than the planner's schedule on these?
  if (cmaUsed && decision.onePassLimitSec >= 0 &&
      decision.onePassPlainSec >= decision.onePassLimitSec)
    return Status();

  // From here this rank may touch its peers' buffers: a peer that fails from now on waits until
  // guard.end() before its caller may free them.
  st = guard.begin();
  if (!st.isOk()) return failed(st);

  // Every rank's buffers as this rank reaches them.
  std::vector<PeerBuf> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
  bool anyCma = false, anyMapped = false;
  for (int i = 0; i < n; ++i) {
    const Record& r = recs[i];
    Layout l = layoutOf(op, i, n);
    auto place = [&](PeerBuf* b, uint64_t addr, uint64_t serial, uint32_t fd, uint64_t off,
                     size_t bytes) -> Status {
      b->pid = static_cast<int>(r.pid);
      b->rank = i;
      b->remote = addr;
      if (static_cast<int>(r.pid) == myPid) {
        b->ptr = reinterpret_cast<char*>(addr);
      } else if (serial && rings.canMapShared(me, i)) {
        LOOM_ASSIGN(b->ptr, rings.mapPeerShared(i, {serial, static_cast<int>(fd), off}, bytes));
        anyMapped = true;
      } else {
        anyCma = true;
      }
      return Status();
    };
    if (l.usesIn && l.inBytes) {
      st = place(&ins[i], r.inAddr, r.inSerial, r.inFd, r.inOff, l.inBytes);
      if (!st.isOk()) return failed(st);
    }
    if (l.usesOut && l.outBytes) {
      st = place(&outs[i], r.outAddr, r.outSerial, r.outFd, r.outOff, l.outBytes);
      if (!st.isOk()) return failed(st);
    }
  }
  // Results through the shared tiles where every rank would, and every rank reaches every peer's
  // output only through process_vm_writev (the same answer on every rank, from the records).
  bool cmaOuts = n > 1;  // every rank reaches every peer's output only by process_vm_writev
  for (int r = 0; r < n && cmaOuts; ++r)
    for (int o = 0; o < n && cmaOuts; ++o) cmaOuts = r == o || cma(r, o, recs[o].outSerial);
  bool useTiles = tilesWanted && cmaOuts;
  for (int r = 0; r < n && useTiles; ++r) useTiles = (recs[r].flags & kTilesOk) != 0;
  const auto passStart = std::chrono::steady_clock::now();
  st = useTiles ? tiledPass(op, me, n, ins, outs, comm, g->area())
                : onePass(op, me, n, ins, outs, anyCma ? kCmaTileBytes : kTileBytes, streaming);
  if (!st.isOk()) return failed(st);
  guard.end();

  // Round 2: nobody returns (and reuses its buffers) while a peer may still read or write them.
  seq = comm->nextLlSeq();
  st = ll.round(seq, nullptr, 0, roundSignature(op, 2), callNote(op), comm->spinNs(),
                comm->timeoutMs());
  if (!st.isOk()) return failed(st);
  *ran = true;
  // Timed to the end of the second round: the tiles' pass waits for the peers' last tiles, the
  // other way's for nothing until that round.
  if (measured && cmaOuts) {
    const bool first = choice.rate(useTiles) <= 0;
    choice.record(
        useTiles, op.count * dataTypeSize(op.dtype),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - passStart).count());
    static std::once_flag bothMeasured[2];  // AllReduce, Broadcast
    if (first && choice.rate(true) > 0 && choice.rate(false) > 0)
      std::call_once(bothMeasured[op.coll == CollKind::kBroadcast], [&] {
        LOOM_INFO(kSubShm,
                  "{} results passed to the peers measured at {:.2f} GB/s through the shared "
                  "tiles and {:.2f} GB/s with process_vm_writev; each call takes the faster (each "
                  "way's best of its last 5 calls; LOOM_SHM_RESULT_TILES=1)",
                  collName(op.coll), choice.rate(true) / 1e9, choice.rate(false) / 1e9);
      });
  }
  // Once per collective and way the one pass reached the buffers.
  static std::once_flag logged[7][4];
  const int how = useTiles ? 0 : anyCma ? 1 : anyMapped ? 2 : 3;
  std::call_once(logged[static_cast<int>(op.coll) % 7][how], [&] {
    static const char* const kHow[] = {"process_vm_readv, results through shared tiles",
                                       "process_vm_readv/writev", "mapped loomMemAlloc buffers",
                                       "threads of one process"};
    LOOM_INFO(kSubShm, "{} of {} bytes ran in one pass over the peers' buffers ({})",
              collName(op.coll), mine.inBytes, kHow[how]);
  });
  return Status();
}

}  // namespace loom
