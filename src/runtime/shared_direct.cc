#include "src/runtime/shared_direct.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "algorithms/patterns.h"
#include "src/core/dtype.h"
#include "src/core/hash.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/reduce/reduce.h"
#include "src/runtime/comm.h"
#include "transports/shm/shm_transport.h"

namespace loom {

namespace {

// What a rank publishes in the first round (its low-latency buffer holds it).
struct Record {
  uint32_t ok;  // its buffers can be reached by every peer
  uint32_t pid;
  uint64_t inAddr, outAddr;      // in its own address space (for peers in its process)
  uint64_t inSerial, outSerial;  // shared allocations (0: none)
  uint32_t inFd, outFd;
  uint64_t inOff, outOff;
};
static_assert(sizeof(Record) <= 64, "fits the smallest low-latency buffer");

// Sub-blocks reduced in a cache-resident buffer and then copied to every output.
constexpr size_t kTileBytes = 32 << 10;

struct Layout {
  size_t inBytes = 0, outBytes = 0;
  bool usesIn = true, usesOut = true;
};

Layout layoutOf(const OpArgs& op, int rank, int n) {
  size_t es = dataTypeSize(op.dtype), c = op.count, un = static_cast<size_t>(n);
  Layout l;
  switch (op.coll) {
    case CollKind::kAllGather:
      l.inBytes = c * es;
      l.outBytes = un * c * es;
      break;
    case CollKind::kReduceScatter:
      l.inBytes = un * c * es;
      l.outBytes = c * es;
      break;
    case CollKind::kAllToAll:
      l.inBytes = l.outBytes = un * c * es;
      break;
    default:
      l.inBytes = l.outBytes = c * es;
      break;
  }
  // Buffers the collective never touches on this rank may be anything, even NULL.
  if (op.coll == CollKind::kBroadcast && rank != op.root) l.usesIn = false;
  if (op.coll == CollKind::kReduce && rank != op.root) l.usesOut = false;
  return l;
}

uint64_t roundSignature(const OpArgs& op, uint64_t round) {
  return Fnv64().mix(opSignature(op)).mix(0x5348444952ull).mix(round).value();
}

}  // namespace

bool sharedDirectEligible(Comm& comm, const OpArgs& op) {
  if (!comm.allLocal() || comm.nranks() < 2 || op.count == 0) return false;
  if (op.coll == CollKind::kSendRecv || !params::kShmMapped.asBool()) return false;
  // In place, an AllToAll's blocks would be overwritten before their owner sent them.
  if (op.coll == CollKind::kAllToAll && op.inPlace) return false;
  if (comm.shm()->options().llBytes < sizeof(Record)) return false;
  // Only where the planner would run the direct algorithm (LOOM_ALGO and LOOM_SHM_DIRECT_MAX
  // apply): a forced ring stays a ring.
  Result<std::string> algo = chooseAlgorithm(comm, op);
  return algo.isOk() && algo.value() == "direct";
}

Status runSharedDirect(Comm* comm, const OpArgs& op, bool* ran) {
  *ran = false;
  shm::Transport* t = comm->shm();
  const int n = comm->nranks(), me = comm->rank();
  const int myPid = getpid();
  const Layout mine = layoutOf(op, me, n);
  const char* in = static_cast<const char*>(op.sendbuff);
  char* out = static_cast<char*>(op.recvbuff);

  // Round 1: publish the buffers and whether every peer can reach them.
  Record rec{};
  rec.pid = static_cast<uint32_t>(myPid);
  rec.inAddr = reinterpret_cast<uint64_t>(in);
  rec.outAddr = reinterpret_cast<uint64_t>(out);
  bool allThreads = true, allMap = true;
  for (int i = 0; i < n; ++i) {
    if (i == me || t->peerPid(i) == myPid) continue;
    allThreads = false;
    if (!t->canMapShared(i, me)) allMap = false;
  }
  bool ok = allThreads;
  if (!ok && allMap) {
    shm::SharedRef ri, ro;
    ok = (!mine.usesIn || mine.inBytes == 0 || shm::findShared(in, mine.inBytes, &ri)) &&
         (!mine.usesOut || mine.outBytes == 0 || shm::findShared(out, mine.outBytes, &ro));
    rec.inSerial = ri.serial;
    rec.outSerial = ro.serial;
    rec.inFd = static_cast<uint32_t>(ri.fd);
    rec.outFd = static_cast<uint32_t>(ro.fd);
    rec.inOff = ri.offset;
    rec.outOff = ro.offset;
  }
  rec.ok = ok ? 1 : 0;
  uint64_t seq = comm->nextLlSeq();
  std::memcpy(t->llBuffer(me, seq), &rec, sizeof(rec));
  t->llPublish(seq, sizeof(rec), roundSignature(op, 1));
  auto failed = [&](Status st) {
    st = st.withContext(std::string(collName(op.coll)) + " (direct path over mapped buffers)");
    comm->fail(st);
    return st;
  };
  Status st = t->llWaitAll(seq, roundSignature(op, 1), comm->spinNs(), comm->timeoutMs());
  if (!st.isOk()) return failed(st);
  std::vector<Record> recs(static_cast<size_t>(n));
  bool everyone = true;
  for (int i = 0; i < n; ++i) {
    std::memcpy(&recs[i], t->llBuffer(i, seq), sizeof(Record));
    everyone = everyone && recs[i].ok;
  }
  if (!everyone) return Status();  // every rank sees the same records: all fall back together

  // Every peer's buffers in this address space.
  std::vector<const char*> ins(static_cast<size_t>(n));
  std::vector<char*> outs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Record& r = recs[i];
    Layout l = layoutOf(op, i, n);
    if (i == me || static_cast<int>(r.pid) == myPid) {
      ins[i] = reinterpret_cast<const char*>(r.inAddr);
      outs[i] = reinterpret_cast<char*>(r.outAddr);
      continue;
    }
    if (l.usesIn && l.inBytes) {
      Result<char*> m =
          t->mapPeerShared(i, {r.inSerial, static_cast<int>(r.inFd), r.inOff}, l.inBytes);
      if (!m.isOk()) return failed(m.status());
      ins[i] = m.value();
    }
    if (l.usesOut && l.outBytes) {
      Result<char*> m =
          t->mapPeerShared(i, {r.outSerial, static_cast<int>(r.outFd), r.outOff}, l.outBytes);
      if (!m.isOk()) return failed(m.status());
      outs[i] = m.value();
    }
  }

  // This rank's share of the work.
  const size_t es = dataTypeSize(op.dtype);
  const size_t c = op.count;
  const loomRedOp_t rop = op.op == loomAvg ? loomSum : op.op;
  alignas(64) static thread_local char tile[kTileBytes];
  const size_t tileElems = kTileBytes / es;
  // tile = in_0 (op) in_1 (op) ... at element offset off, len elements (rank order: every rank
  // and every run gets the same bits).
  auto reduceTile = [&](size_t off, size_t len) {
    size_t b = off * es;
    reduceBuffers(tile, ins[0] + b, ins[1] + b, len, op.dtype, rop);
    for (int r = 2; r < n; ++r) reduceBuffers(tile, tile, ins[r] + b, len, op.dtype, rop);
    if (op.op == loomAvg) finishAverage(tile, len, op.dtype, n);
  };
  const Block blk = evenBlock(c, n, me);
  switch (op.coll) {
    case CollKind::kAllReduce:
    case CollKind::kReduce:
      for (size_t o = 0; o < blk.count; o += tileElems) {
        size_t len = std::min(tileElems, blk.count - o);
        reduceTile(blk.offset + o, len);
        for (int r = 0; r < n; ++r) {
          if (op.coll == CollKind::kReduce && r != op.root) continue;
          std::memcpy(outs[r] + (blk.offset + o) * es, tile, len * es);
        }
      }
      break;
    case CollKind::kReduceScatter:
      // Rank me's output is block me of the reduction of everyone's input (count elements each).
      for (size_t o = 0; o < c; o += tileElems) {
        size_t len = std::min(tileElems, c - o);
        reduceTile(static_cast<size_t>(me) * c + o, len);
        std::memcpy(out + o * es, tile, len * es);
      }
      break;
    case CollKind::kBroadcast:
      // Slice me of the root's buffer into every output.
      for (int r = 0; r < n; ++r) {
        char* dst = outs[r] + blk.offset * es;
        const char* src = ins[op.root] + blk.offset * es;
        if (dst != src && blk.count) std::memcpy(dst, src, blk.count * es);
      }
      break;
    case CollKind::kAllGather:
      // This rank's input into block me of every output.
      for (int r = 0; r < n; ++r) {
        char* dst = outs[r] + static_cast<size_t>(me) * c * es;
        if (dst != in) std::memcpy(dst, in, c * es);
      }
      break;
    case CollKind::kAllToAll:
      // Block r of this rank's input goes to block me of rank r's output (out of place only).
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        std::memcpy(outs[r] + static_cast<size_t>(me) * c * es,
                    in + static_cast<size_t>(r) * c * es, c * es);
      }
      if (outs[me] + static_cast<size_t>(me) * c * es != in + static_cast<size_t>(me) * c * es)
        std::memcpy(outs[me] + static_cast<size_t>(me) * c * es,
                    in + static_cast<size_t>(me) * c * es, c * es);
      break;
    default:
      return failed(LOOM_ERROR(kInternal, "{} has no direct path", collName(op.coll)));
  }

  // Round 2: nobody returns (and reuses its buffers) while a peer may still read or write them.
  seq = comm->nextLlSeq();
  t->llPublish(seq, 0, roundSignature(op, 2));
  st = t->llWaitAll(seq, roundSignature(op, 2), comm->spinNs(), comm->timeoutMs());
  if (!st.isOk()) return failed(st);
  *ran = true;
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LOOM_INFO(kSubShm, "{} of {} bytes ran in one pass over the peers' mapped buffers ({})",
              collName(op.coll), mine.inBytes, allThreads ? "threads" : "loomMemAlloc");
  });
  return Status();
}

}  // namespace loom
