#include "src/runtime/executor.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "src/core/clock.h"
#include "src/core/dtype.h"
#include "src/core/hash.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/process.h"
#include "src/reduce/reduce.h"
#include "src/runtime/comm.h"
#include "src/runtime/device_ops.h"
#include "src/runtime/device_runner.h"

namespace loom {

namespace {

constexpr size_t kScheduleCacheSize = 64;

constexpr int kP2pTag = 0x7fff0001;

// How long a rank with both shared-memory and socket requests in flight naps between looks.
constexpr int64_t kMixedWaitUs = 50;

}  // namespace

uint64_t opSignature(const OpArgs& op) {
  const bool reduces = collReduces(op.coll), rooted = collRooted(op.coll);
  return Fnv64()
      .mix(static_cast<uint64_t>(op.coll))
      .mix(op.count)
      .mix(static_cast<uint64_t>(op.dtype))
      .mix(reduces ? static_cast<uint64_t>(op.op) : 0)
      .mix(rooted ? static_cast<uint64_t>(op.root) : 0)
      .value();
}

CallNote callNote(const OpArgs& op) {
  CallNote c;
  c.coll = static_cast<uint8_t>(op.coll);
  c.dtype = static_cast<uint8_t>(op.dtype);
  c.op = static_cast<uint8_t>(collReduces(op.coll) ? static_cast<int>(op.op) : 0);
  c.isSend = op.isSend ? 1 : 0;
  c.root = op.coll == CollKind::kSendRecv ? op.peer : collRooted(op.coll) ? op.root : -1;
  c.count = op.count;
  return c;
}

namespace {

// The tag every message of an operation carries: a hash of what all ranks must agree on. A rank
// that runs a different collective, count, datatype, op, root, algorithm or rank layout (hosts,
// ring order, channels) sends frames whose tag matches no posted receive, and the transport
// reports it instead of corrupting memory.
int opTag(const OpArgs& op, const std::string& algorithm, uint64_t layoutId) {
  if (op.coll == CollKind::kSendRecv) return kP2pTag;
  uint64_t h = Fnv64().mixBytes(algorithm).mix(opSignature(op)).mix(layoutId).value();
  return static_cast<int>((h ^ (h >> 32)) & 0x3fffffff);
}

}  // namespace

namespace {

// The layout's hash is part of the key: schedules built for different hosts or ring orders
// differ.
CacheKey scheduleKey(const OpArgs& op, size_t pieceElems, const std::string& algo,
                     const RankLayout* layout) {
  CacheKey k;
  k.words = {static_cast<uint64_t>(op.coll) | dataTypeSize(op.dtype) << 8 |
                 uint64_t{op.isSend} << 16 | uint64_t{op.inPlace} << 17,
             op.count,
             static_cast<uint64_t>(static_cast<int64_t>(op.root)),
             static_cast<uint64_t>(static_cast<int64_t>(op.peer)),
             pieceElems,
             layout ? layout->hash() : 0};
  k.name = algo;
  return k;
}

Result<std::shared_ptr<CompiledSchedule>> compileSchedule(const OpArgs& op, int rank, int nranks,
                                                          std::shared_ptr<const RankLayout> layout,
                                                          size_t pieceElems,
                                                          const std::string& algoName) {
  auto sched = std::make_shared<CompiledSchedule>();
  CollArgs& a = sched->args;
  a.coll = op.coll;
  a.nranks = nranks;
  a.count = op.count;
  a.root = op.root;
  a.inPlace = op.inPlace;
  if (layout && layout->nranks() != nranks) {
    return LOOM_ERROR(kInternal, "rank layout of {} ranks for {} ranks", layout->nranks(), nranks);
  }
  a.layout = std::move(layout);
  RankSchedule rs;
  if (op.coll == CollKind::kSendRecv) {
    sched->algorithm = "p2p";
    Step s;
    s.kind = op.isSend ? StepKind::kSend : StepKind::kRecv;
    s.peer = op.peer;
    s.src = {BufKind::kInput, 0};
    s.dst = {BufKind::kOutput, 0};
    s.count = op.count;
    if (op.count > 0) rs.steps.push_back(s);
    sched->layout.inputCount = op.isSend ? op.count : 0;
    sched->layout.outputCount = op.isSend ? 0 : op.count;
  } else {
    const AlgorithmInfo* algo = findAlgorithm(op.coll, algoName);
    if (!algo) return LOOM_ERROR(kInternal, "no algorithm {} for {}", algoName, collName(op.coll));
    sched->algorithm = algo->name;
    rs = algo->generate(a, rank);
    sched->layout = bufferLayout(a, rank);
  }
  sched->lowered = lowerSchedule(rs, sched->layout, pieceElems);
  const auto& pieces = sched->lowered.pieces;
  size_t n = pieces.size();
  sched->depCount.resize(n);
  std::vector<uint32_t> outDegree(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    sched->depCount[i] = static_cast<uint32_t>(pieces[i].deps.size());
    for (uint32_t d : pieces[i].deps) {
      if (d >= i) return LOOM_ERROR(kInternal, "piece {} depends on later piece {}", i, d);
      ++outDegree[d];
    }
    const Step& s = pieces[i].step;
    auto touches = [&](BufKind b) {
      bool readsSrc = s.kind == StepKind::kSend || s.kind == StepKind::kRecvReduce ||
                      s.kind == StepKind::kCopy || s.kind == StepKind::kReduce;
      bool usesDst = s.kind != StepKind::kSend;
      return (readsSrc && s.src.buf == b) || (usesDst && s.dst.buf == b);
    };
    sched->touchesInput |= touches(BufKind::kInput);
    sched->touchesOutput |= touches(BufKind::kOutput);
  }
  sched->dependentsStart.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    sched->dependentsStart[i + 1] = sched->dependentsStart[i] + outDegree[i];
  sched->dependents.resize(sched->dependentsStart[n]);
  std::vector<uint32_t> fill(sched->dependentsStart.begin(), sched->dependentsStart.end() - 1);
  for (size_t i = 0; i < n; ++i)
    for (uint32_t d : pieces[i].deps) sched->dependents[fill[d]++] = static_cast<uint32_t>(i);
  return sched;
}

// One operation being executed.
struct Run {
  Comm* comm = nullptr;
  OpArgs args;
  std::shared_ptr<const CompiledSchedule> sched;
  size_t elemSize = 0;
  int tag = 0;
  char* base[3] = {nullptr, nullptr, nullptr};  // indexed by BufKind
  char* staging = nullptr;
  std::vector<uint32_t> remaining;   // unmet deps per piece
  std::vector<uint32_t> readyLocal;  // local pieces whose deps are met
  size_t done = 0;
  bool finished = false;
  // A receive whose buffer is also the source of a send of the same group (nccl-tests' in-place
  // sendrecv) lands in scratch and is copied into place once those sends have read the buffer:
  // waiting instead would deadlock a ring of such exchanges.
  std::vector<const Run*> blockers;
  char* stagedDst = nullptr;
  bool deferred = false;
  // Its buffers are CUDA device memory (a schedule over GPUDirect RDMA): local copies and
  // reductions run on the device (DeviceOps), its scratch and staging are device memory.
  bool device = false;
  // Its results are stored around the caches (streamingStoresFor: the group's outputs are not
  // cached, or its buffers exceed the caches): local copies and reductions, and its receives.
  bool streaming = false;

  char* ptr(const BufRef& r) const { return base[static_cast<int>(r.buf)] + r.offset * elemSize; }
};

struct InFlight {
  Run* run;
  uint32_t piece;
  void* request;
  int peer;
  net::Transport* transport;
  bool fused;          // a receive-reduce the transport combined itself
  bool flush = false;  // the flush that makes a receive into device memory visible (iflush)
};

using QueueKey = std::tuple<int, int, bool>;  // peer, channel, isSend

// Per-communicator state of one executeOps call.
struct CommRun {
  Comm* comm = nullptr;
  std::map<QueueKey, std::deque<std::pair<Run*, uint32_t>>> queues;
  std::vector<InFlight> inflight;
  Status error;
  bool finished = false;
  size_t pendingRuns = 0;
};

bool isNet(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
}

std::string pieceWhat(const Run& run, uint32_t p) {
  const Step& s = run.sched->lowered.pieces[p].step;
  return fmt::format("{} {} of {} elements {} rank {}", collName(run.args.coll),
                     stepKindName(s.kind), s.count, s.kind == StepKind::kSend ? "to" : "from",
                     s.peer);
}

class Executor {
 public:
  explicit Executor(const std::vector<QueuedOp>& ops) : ops_(ops) {}

  Status run() {
    LOOM_TRY(setup());
    int64_t timeoutMs = 0;
    for (auto& cr : commRuns_) timeoutMs = std::max(timeoutMs, cr.comm->timeoutMs());
    int64_t lastProgress = nowNs();
    ProgressNotice notice(timeoutMs);
    uint32_t idlePolls = 0;
    bool waiting = false;  // nothing progressed for spinNs: each idle poll waits
    int64_t spinNs = 0;
    bool yield = false;
    for (auto& cr : commRuns_) {
      spinNs = std::max(spinNs, cr.comm->spinNs());
      yield |= cr.comm->yieldWhileWaiting();
    }
    while (true) {
      bool all = true, progressed = false;
      for (auto& cr : commRuns_) {
        if (cr.finished) continue;
        bool p = false;
        Status st = step(cr, &p);
        if (!st.isOk()) finishWithError(cr, st);
        progressed |= p;
        if (!cr.finished) all = false;
      }
      if (all) break;
      if (progressed) {
        if (idlePolls > 0) notice.reset();
        idlePolls = 0;
        continue;
      }
      // The clock is read on the first idle poll after progress and every 16th after it: on a
      // busy shared-memory path a clock read per poll costs as much as the poll. Once waiting
      // (past spinNs), every poll goes on to wait again: the wait returns when something may have
      // progressed, and yielding in a loop between the waits kept 2-3% of a core busy.
      if (idlePolls++ == 0) {
        lastProgress = nowNs();
        waiting = false;
      }
      if (!waiting && (idlePolls & 15) != 1) {
        // Pause for the first polls, then yield the core to whoever wants it: a peer that is not
        // running cannot make progress however fast this rank polls.
        if (yield || idlePolls > 256)
          sched_yield();
        else
          cpuRelax();
        continue;
      }
      int64_t now = nowNs();
      if (timeoutMs > 0 && now - lastProgress > timeoutMs * 1000000) {
        for (auto& cr : commRuns_)
          if (!cr.finished) finishWithError(cr, timeoutError(cr, timeoutMs));
        break;
      }
      if (notice.due((now - lastProgress) / 1000000))
        for (auto& cr : commRuns_)
          if (!cr.finished)
            LOOM_WARN("{}", waitingText(cr, (now - lastProgress) / 1000000, timeoutMs));
      waiting = now - lastProgress >= spinNs;
      if (waiting && dev_ && !dev_->idle()) {
        // While the device works, nothing wakes a sleep when it is done: nap in proportion to
        // the wait instead (an eighth of it, at most a millisecond), as a transport that nothing
        // wakes does, rather than keep the core the device's host threads may need.
        sleepNs(net::idleNapNs(now - lastProgress, 1000000));
      } else if (waiting) {
        for (auto& cr : commRuns_) {
          if (cr.finished) continue;
          Status remote = cr.comm->pollRemoteFailure();
          if (!remote.isOk()) {
            const Run* r = runOf(cr);
            finishWithError(cr, r ? withOwnCall(*r, remote) : remote);
          }
        }
        wait(now - lastProgress);
      } else if (yield) {
        // Stay runnable, but let a peer that shares this core run (more ranks than cores):
        // without it each step costs a scheduler time slice.
        sched_yield();
      } else {
        cpuRelax();
      }
    }
    for (auto& cr : commRuns_)
      if (!cr.error.isOk()) return cr.error;
    return Status();
  }

 private:
  Status setup() {
    runs_.reserve(ops_.size());
    std::map<Comm*, size_t> commIndex;
    for (const auto& q : ops_) {
      if (!commIndex.count(q.comm)) {
        commIndex[q.comm] = commRuns_.size();
        CommRun cr;
        cr.comm = q.comm;
        commRuns_.push_back(std::move(cr));
      }
    }
    // Plans first, so that each comm's scratch can be sized for all its runs at once.
    std::vector<size_t> scratchNeed(commRuns_.size(), 0);
    runs_.resize(ops_.size());
    for (size_t i = 0; i < ops_.size(); ++i) {
      Run& r = runs_[i];
      r.comm = ops_[i].comm;
      r.args = ops_[i].args;
      r.elemSize = dataTypeSize(r.args.dtype);
      size_t pieceBytes = static_cast<size_t>(std::max<int64_t>(params::kChunkSize.asInt(), 1));
      LOOM_ASSIGN(r.sched,
                  r.comm->schedules().get(r.args, r.comm->rank(), r.comm->nranks(),
                                          r.comm->rankLayout(), ops_[i].algorithm, pieceBytes));
      r.tag = opTag(r.args, r.sched->algorithm, layoutHash(r.sched->args));
      r.device = ops_[i].inDevice || ops_[i].outDevice;
      if (r.device && !dev_) {
        DeviceRunner* runner = r.comm->runner();
        if (!runner)
          return LOOM_ERROR(kInternal, "a schedule on device memory without a device runner");
        dev_ = std::make_unique<DeviceOps>(runner->workStream());
      }
    }
    for (auto& r : runs_)
      for (const auto& s : runs_)
        if (&s != &r && s.comm == r.comm && receiveOverlapsSend(r.args, s.args))
          r.blockers.push_back(&s);
    // The whole group's buffers on this host and this rank's outputs decide: in a program whose
    // ranks make the same calls every local rank decides alike (a rank that does not only stores
    // differently).
    size_t hostBytes = 0;
    int localRanks = 1;
    std::vector<ByteRange> written;
    for (const auto& r : runs_) {
      const CollCounts c = collCounts(r.args.coll, r.args.count, r.comm->nranks());
      hostBytes += (c.input + c.output) * r.elemSize * static_cast<size_t>(r.comm->localRanks());
      localRanks = std::max(localRanks, r.comm->localRanks());
      if (!r.device && r.args.recvbuff) written.push_back({r.args.recvbuff, c.output * r.elemSize});
    }
    const bool streaming =
        streamingStoresFor(hostBytes, localRanks, written.data(), written.size());
    for (auto& r : runs_) r.streaming = streaming && !r.device;
    // Host runs share the communicator's host scratch, device runs its runner's device scratch.
    std::vector<size_t> devNeed(commRuns_.size(), 0);
    for (auto& r : runs_)
      (r.device ? devNeed : scratchNeed)[commIndex[r.comm]] += scratchBytesOf(r);
    std::vector<size_t> scratchUsed(commRuns_.size(), 0), devUsed(commRuns_.size(), 0);
    std::vector<char*> scratchBase(commRuns_.size()), devBase(commRuns_.size(), nullptr);
    for (size_t c = 0; c < commRuns_.size(); ++c) {
      scratchBase[c] = scratchNeed[c] ? commRuns_[c].comm->scratch(scratchNeed[c]) : nullptr;
      if (devNeed[c]) {
        LOOM_ASSIGN(devBase[c], commRuns_[c].comm->runner()->deviceScratch(devNeed[c]));
      }
    }
    for (auto& r : runs_) {
      size_t c = commIndex[r.comm];
      std::vector<size_t>& used = r.device ? devUsed : scratchUsed;
      char* mem = (r.device ? devBase[c] : scratchBase[c]) + used[c];
      used[c] += scratchBytesOf(r);
      LOOM_TRY(bind(r, mem));
      CommRun& cr = commRuns_[c];
      size_t n = r.sched->lowered.pieces.size();
      r.remaining = r.sched->depCount;
      for (uint32_t p = 0; p < n; ++p) {
        const Step& s = r.sched->lowered.pieces[p].step;
        if (isNet(s.kind)) {
          cr.queues[QueueKey(s.peer, s.channel, s.kind == StepKind::kSend)].emplace_back(&r, p);
        } else if (r.remaining[p] == 0) {
          r.readyLocal.push_back(p);
        }
      }
      ++cr.pendingRuns;
    }
    for (auto& cr : commRuns_)
      if (cr.pendingRuns == 0) cr.finished = true;
    for (auto& r : runs_)
      if (r.sched->lowered.pieces.empty()) finishRun(r);
    return Status();
  }

  static size_t align64(size_t b) { return (b + 63) & ~size_t(63); }

  size_t scratchBytesOf(const Run& r) const {
    return scheduleScratchBytes(*r.sched, r.args, !r.blockers.empty());
  }

  Status bind(Run& r, char* mem) {
    const auto& lw = r.sched->lowered;
    r.base[static_cast<int>(BufKind::kInput)] =
        const_cast<char*>(static_cast<const char*>(r.args.sendbuff));
    r.base[static_cast<int>(BufKind::kOutput)] = static_cast<char*>(r.args.recvbuff);
    r.base[static_cast<int>(BufKind::kScratch)] = mem;
    mem += align64(lw.scratchCount * r.elemSize);
    r.staging = mem;
    mem += align64(lw.stagingCount * r.elemSize);
    if (!r.args.recvbuff && r.sched->touchesOutput) {
      r.base[static_cast<int>(BufKind::kOutput)] = mem;
      mem += align64(r.sched->layout.outputCount * r.elemSize);
    }
    if (!r.args.sendbuff && r.sched->touchesInput) {
      r.base[static_cast<int>(BufKind::kInput)] = mem;
      const size_t bytes = r.sched->layout.inputCount * r.elemSize;
      if (r.device)
        LOOM_TRY(dev_->zeroNow(mem, bytes));
      else
        std::memset(mem, 0, bytes);
      mem += align64(r.sched->layout.inputCount * r.elemSize);
    }
    if (!r.blockers.empty()) {
      r.stagedDst = r.base[static_cast<int>(BufKind::kOutput)];
      r.base[static_cast<int>(BufKind::kOutput)] = mem;
    }
    return Status();
  }

  // One pass over a communicator: post what can be posted, run local pieces, test requests.
  Status step(CommRun& cr, bool* progressed) {
    Comm* comm = cr.comm;
    if (comm->aborted()) return LOOM_ERROR(kAborted, "communicator aborted (loomCommAbort)");
    Status async = comm->asyncError();
    if (!async.isOk()) return async;
    // Post the head of each (peer, channel, direction) queue while its dependencies are met.
    for (auto& [key, q] : cr.queues) {
      while (!q.empty()) {
        auto [run, p] = q.front();
        if (run->remaining[p] != 0) break;
        const Piece& pc = run->sched->lowered.pieces[p];
        const Step& s = pc.step;
        void* req = nullptr;
        size_t bytes = s.count * run->elemSize;
        net::Transport* t = comm->transportFor(s.peer, s.channel);
        bool fused = false;
        if (s.kind == StepKind::kSend) {
          Result<void*> conn = comm->connections().sendConn(s.peer, s.channel);
          if (!conn.isOk()) return connectError(*run, p, conn.status());
          void* sc = conn.value();
          if (!sc) break;
          // Registered memory (loomCommRegister, or the scratch block) goes with its handle;
          // a transport that registers memory registers anything else per message.
          void* mh = comm->memHandle(t, sc, run->ptr(s.src), bytes);
          Status st = t->isend(sc, run->ptr(s.src), bytes, run->tag, mh, &req);
          if (!st.isOk()) return peerError(*run, p, st);
        } else {
          Result<void*> conn = comm->connections().recvConn(s.peer, s.channel);
          if (!conn.isOk()) return connectError(*run, p, conn.status());
          void* rc = conn.value();
          if (!rc) break;
          Status st;
          if (!run->device) t->setStreamingStores(rc, run->streaming);
          if (s.kind == StepKind::kRecvReduce && !run->device && t->supportsRecvReduce()) {
            fused = true;
            st = t->irecvReduce(rc, run->ptr(s.dst), run->ptr(s.src), bytes, run->tag,
                                run->args.dtype, run->args.op, &req);
          } else {
            void* dst = s.kind == StepKind::kRecv ? run->ptr(s.dst)
                                                  : run->staging + pc.stagingOffset * run->elemSize;
            int tag = run->tag;
            void* mh = comm->memHandle(t, rc, dst, bytes);
            st = t->irecv(rc, 1, &dst, &bytes, &tag, mh ? &mh : nullptr, &req);
          }
          if (!st.isOk()) return peerError(*run, p, st);
        }
        if (!req) break;  // transport full: retry on the next pass
        cr.inflight.push_back({run, p, req, s.peer, t, fused});
        q.pop_front();
        *progressed = true;
      }
    }
    // Local pieces.
    for (auto& r : runs_) {
      if (r.comm != comm) continue;
      while (!r.readyLocal.empty()) {
        uint32_t p = r.readyLocal.back();
        r.readyLocal.pop_back();
        const Step& s = r.sched->lowered.pieces[p].step;
        const loomRedOp_t op = r.args.op == loomAvg ? loomSum : r.args.op;
        *progressed = true;
        if (r.device) {  // completes when the device has done it (pollDevice)
          LOOM_TRY(s.kind == StepKind::kCopy
                       ? dev_->copy(r.ptr(s.dst), r.ptr(s.src), s.count * r.elemSize, token(r, p))
                       : dev_->reduce(r.ptr(s.dst), r.ptr(s.dst), r.ptr(s.src), s.count,
                                      r.args.dtype, op, token(r, p)));
          continue;
        }
        if (s.kind == StepKind::kCopy && r.streaming)
          copyStreaming(r.ptr(s.dst), r.ptr(s.src), s.count * r.elemSize);
        else if (s.kind == StepKind::kCopy)
          std::memmove(r.ptr(s.dst), r.ptr(s.src), s.count * r.elemSize);
        else if (r.streaming)
          reduceBuffersStreaming(r.ptr(s.dst), r.ptr(s.dst), r.ptr(s.src), s.count, r.args.dtype,
                                 op);
        else
          reduceBuffers(r.ptr(s.dst), r.ptr(s.dst), r.ptr(s.src), s.count, r.args.dtype, op);
        complete(r, p);
      }
    }
    // Test requests in flight.
    for (size_t i = 0; i < cr.inflight.size();) {
      InFlight& f = cr.inflight[i];
      int done = 0;
      size_t got = 0;
      Status st = f.transport->test(f.request, &done, &got);
      if (!st.isOk()) {
        // The failed piece's, not the next one's: f refers to the next entry once erased.
        const Run& run = *f.run;
        const uint32_t piece = f.piece;
        cr.inflight.erase(cr.inflight.begin() + i);
        return peerError(run, piece, st);
      }
      if (!done) {
        ++i;
        continue;
      }
      Run& r = *f.run;
      uint32_t p = f.piece;
      bool fusedDone = f.fused;
      const bool flushed = f.flush;
      net::Transport* t = f.transport;
      cr.inflight.erase(cr.inflight.begin() + i);
      const Piece& pc = r.sched->lowered.pieces[p];
      const Step& s = pc.step;
      if (s.kind != StepKind::kSend) {
        size_t want = s.count * r.elemSize;
        // A message of another size than the step's is of another call: the same code and
        // message as every other sign of calls that differ.
        if (!flushed && got != want)
          return peerError(
              r, p,
              Status(Code::kRemote,
                     fmt::format("it sent {} bytes where this rank expected {}", got, want))
                  .withCause(Cause::kMismatch));
        if (r.device && !flushed && want > 0) {
          // GPUDirect RDMA: the NIC's writes into device memory may land after the receive's
          // completion; the transport's flush (a read through the NIC, which orders them) comes
          // before any kernel, copy or the stream reads them. Nothing to wait for where the
          // transport needs none.
          void* dst =
              s.kind == StepKind::kRecv ? r.ptr(s.dst) : r.staging + pc.stagingOffset * r.elemSize;
          Result<void*> conn = comm->connections().recvConn(s.peer, s.channel);
          if (!conn.isOk()) return connectError(r, p, conn.status());
          void* mh = comm->memHandle(t, conn.value(), dst, want);
          void* req = nullptr;
          Status flush = t->iflush(conn.value(), 1, &dst, &want, mh ? &mh : nullptr, &req);
          if (!flush.isOk()) return peerError(r, p, flush);
          *progressed = true;
          if (req) {
            cr.inflight.push_back({&r, p, req, s.peer, t, fusedDone, true});
            continue;
          }
        }
        if (s.kind == StepKind::kRecvReduce && !fusedDone) {
          const loomRedOp_t op = r.args.op == loomAvg ? loomSum : r.args.op;
          char* staged = r.staging + pc.stagingOffset * r.elemSize;
          if (r.device) {  // completes when the device has reduced it (pollDevice)
            LOOM_TRY(dev_->reduce(r.ptr(s.dst), r.ptr(s.src), staged, s.count, r.args.dtype, op,
                                  token(r, p)));
            *progressed = true;
            continue;
          }
          (r.streaming ? reduceBuffersStreaming : reduceBuffers)(r.ptr(s.dst), r.ptr(s.src), staged,
                                                                 s.count, r.args.dtype, op);
        }
      }
      complete(r, p);
      *progressed = true;
    }
    if (dev_) LOOM_TRY(pollDevice(progressed));
    if (cr.pendingRuns == 0 && cr.inflight.empty()) cr.finished = true;
    return Status();
  }

  // A device operation's token: the run's index and the piece.
  uint64_t token(const Run& r, uint32_t p) const {
    return static_cast<uint64_t>(&r - runs_.data()) << 32 | p;
  }

  // Completes the pieces whose device work is done.
  Status pollDevice(bool* progressed) {
    devDone_.clear();
    LOOM_TRY(dev_->poll(&devDone_));
    for (uint64_t t : devDone_) {
      complete(runs_[static_cast<size_t>(t >> 32)], static_cast<uint32_t>(t));
      *progressed = true;
    }
    return Status();
  }

  void complete(Run& r, uint32_t p) {
    const auto& sched = *r.sched;
    for (uint32_t k = sched.dependentsStart[p]; k < sched.dependentsStart[p + 1]; ++k) {
      uint32_t d = sched.dependents[k];
      if (--r.remaining[d] == 0 && !isNet(sched.lowered.pieces[d].step.kind))
        r.readyLocal.push_back(d);
    }
    if (++r.done == sched.lowered.pieces.size()) finishRun(r);
  }

  void finishRun(Run& r) {
    if (r.stagedDst) {
      for (const Run* b : r.blockers)
        if (!b->finished) {
          r.deferred = true;
          return;
        }
      if (r.device)
        noteDeviceError(r, dev_->copyNow(r.stagedDst, r.base[static_cast<int>(BufKind::kOutput)],
                                         r.args.count * r.elemSize));
      else if (r.streaming)
        copyStreaming(r.stagedDst, r.base[static_cast<int>(BufKind::kOutput)],
                      r.args.count * r.elemSize);
      else
        std::memcpy(r.stagedDst, r.base[static_cast<int>(BufKind::kOutput)],
                    r.args.count * r.elemSize);
      r.deferred = false;
    }
    r.finished = true;
    if (r.args.op == loomAvg && r.comm->nranks() > 1) {
      if (collReduces(r.args.coll) &&
          collUsesOutput(r.args.coll, r.comm->rank(), r.args.root, r.args.isSend)) {
        size_t n = r.sched->layout.outputCount;
        if (r.device)
          noteDeviceError(r, dev_->divideNow(r.base[static_cast<int>(BufKind::kOutput)], n,
                                             r.args.dtype, r.comm->nranks()));
        else
          finishAverage(r.base[static_cast<int>(BufKind::kOutput)], n, r.args.dtype,
                        r.comm->nranks());
      }
    }
    for (auto& cr : commRuns_)
      if (cr.comm == r.comm) {
        --cr.pendingRuns;
        if (cr.pendingRuns == 0 && cr.inflight.empty()) cr.finished = true;
      }
    for (auto& d : runs_)
      if (d.deferred) finishRun(d);
  }

  // A device operation of a finishing run failed: its communicator fails with it.
  void noteDeviceError(const Run& r, const Status& st) {
    if (st.isOk()) return;
    for (auto& cr : commRuns_)
      if (cr.comm == r.comm && cr.error.isOk()) finishWithError(cr, st);
  }

  // A connection to a peer that failed is refused or reset: the failure that peer reported (over
  // the bootstrap ring, within moments) is the error, not the refusal.
  Status connectError(const Run& r, uint32_t p, const Status& st) {
    Status remote = r.comm->remoteFailure(250);
    return remote.isOk() ? peerError(r, p, st) : withOwnCall(r, remote);
  }

  // Another rank's report that calls differ, with what this rank called: between hosts the rank
  // that found it knows only its own call.
  static Status withOwnCall(const Run& r, const Status& remote) {
    if (remote.code() != Code::kInvalidUsage) return remote;
    return remote.rewritten(Code::kInvalidUsage,
                            fmt::format("{}; rank {} called {}", remote.message(), r.comm->rank(),
                                        describeCall(callNote(r.args))));
  }

  // The run of cr this rank is in (for its call).
  const Run* runOf(const CommRun& cr) const {
    for (const Run& r : runs_)
      if (r.comm == cr.comm) return &r;
    return nullptr;
  }

  Status peerError(const Run& r, uint32_t p, const Status& st) {
    const Step& s = r.sched->lowered.pieces[p].step;
    std::string hint;
    const std::string& m = st.message();
    Code code = st.code() == Code::kAborted ? Code::kAborted : Code::kRemote;
    if (Comm::isClosedPeer(st)) {
      hint = r.comm->closedPeerHint();
      // The peer closed because calls differ: every rank says so with the same code.
      if (r.comm->remoteFailure(1).code() == Code::kInvalidUsage) {
        code = Code::kInvalidUsage;
        hint += fmt::format("; rank {} called {}", r.comm->rank(), describeCall(callNote(r.args)));
      }
    } else if (st.cause() == Cause::kMismatch) {
      // One message and one code for calls that differ, whichever transport saw it.
      CallNote theirs;
      const bool known = r.comm->peerCall(s.peer, &theirs);
      return st.rewritten(Code::kInvalidUsage,
                          fmt::format("{}: {} ({} {}: {})", collName(r.args.coll),
                                      differentCalls(s.peer, known ? &theirs : nullptr,
                                                     r.comm->rank(), callNote(r.args)),
                                      s.kind == StepKind::kSend ? "sending to" : "receiving from",
                                      r.comm->describe(s.peer), m));
    }
    return st.rewritten(code,
                        fmt::format("{}: {} {}: {}{}", collName(r.args.coll),
                                    s.kind == StepKind::kSend ? "sending to" : "receiving from",
                                    r.comm->describe(s.peer), m, hint));
  }

  // "AllReduce: no progress for 12 s of 300 (LOOM_TIMEOUT); waiting for ..." while it waits.
  std::string waitingText(const CommRun& cr, int64_t waitedMs, int64_t timeoutMs) {
    const Run* first = cr.inflight.empty() ? nullptr : cr.inflight.front().run;
    return fmt::format(
        "{}no progress for {} s{}{}",
        first ? std::string(collName(first->args.coll)) + ": " : std::string(), waitedMs / 1000,
        timeoutMs > 0 ? fmt::format(" of {} (LOOM_TIMEOUT)", timeoutMs / 1000) : std::string(),
        waitingFor(cr));
  }

  std::string waitingFor(const CommRun& cr) {
    std::string waiting;
    int shown = 0;
    for (const auto& f : cr.inflight) {
      if (shown++ == 3) break;
      waiting += "; " + pieceWhat(*f.run, f.piece);
    }
    for (const auto& [key, q] : cr.queues) {
      if (q.empty() || shown++ >= 4) continue;
      waiting += "; not yet posted: " + pieceWhat(*q.front().first, q.front().second);
    }
    return waiting;
  }

  Status timeoutError(const CommRun& cr, int64_t timeoutMs) {
    return LOOM_ERROR(kTimeout, "no progress for {} s (LOOM_TIMEOUT){}", timeoutMs / 1000,
                      waitingFor(cr));
  }

  void finishWithError(CommRun& cr, const Status& st) {
    cr.error = st;
    cr.finished = true;
    cr.comm->fail(st);
  }

  // Sleeps until a transport may progress. With requests on one transport only, that
  // transport's wait. With several (the transport table may give one peer's channels to different
  // transports), a brief nap on one that can be woken at once (napUs: a doorbell a peer rings),
  // then a look at the others again soon; sleeping in poll() instead would miss a doorbell for up
  // to a millisecond per step.
  // A transport is only ever given its own requests (waitActivity reads them as its request type).
  // Connections not yet made go through the network transport's listener. idleNs: how long nothing
  // progressed; a transport that nothing can wake naps in proportion to it (net::idleNapNs).
  void wait(int64_t idleNs) {
    std::vector<std::pair<net::Transport*, std::vector<void*>>> byTransport;
    void* listen = nullptr;
    net::Transport* network = nullptr;
    for (auto& cr : commRuns_) {
      if (cr.finished) continue;
      for (auto& f : cr.inflight) {
        auto it = std::find_if(byTransport.begin(), byTransport.end(),
                               [&](const auto& e) { return e.first == f.transport; });
        if (it == byTransport.end()) {
          byTransport.emplace_back(f.transport, std::vector<void*>());
          it = byTransport.end() - 1;
        }
        it->second.push_back(f.request);
      }
      if (!network) {
        network = cr.comm->transport();
        listen = cr.comm->connections().listener();
      }
    }
    if (byTransport.size() > 1)
      for (auto& [t, reqs] : byTransport)
        if (t->napUs(kMixedWaitUs)) return;
    if (byTransport.size() == 1 && byTransport[0].first != network) {
      auto& [t, reqs] = byTransport[0];
      t->waitActivityIdle(reqs.data(), static_cast<int>(reqs.size()), nullptr, 2, idleNs);
      return;
    }
    if (!network) return;
    std::vector<void*> reqs;
    for (auto& [t, r] : byTransport)
      if (t == network) reqs = r;
    network->waitActivityIdle(reqs.data(), static_cast<int>(reqs.size()), listen,
                              byTransport.size() > 1 ? 1 : 2, idleNs);
  }

  const std::vector<QueuedOp>& ops_;
  std::vector<Run> runs_;
  std::vector<CommRun> commRuns_;
  std::unique_ptr<DeviceOps> dev_;  // made when a run is on device memory
  std::vector<uint64_t> devDone_;
};

}  // namespace

Result<std::shared_ptr<const CompiledSchedule>> ScheduleCache::get(
    const OpArgs& op, int rank, int nranks, const std::shared_ptr<const RankLayout>& layout,
    const std::string& algo, size_t pieceBytes) {
  size_t es = dataTypeSize(op.dtype);
  size_t pieceElems = std::max<size_t>(1, pieceBytes / (es ? es : 1));
  CacheKey key = scheduleKey(op, pieceElems, algo, layout.get());
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  LOOM_ASSIGN(std::shared_ptr<CompiledSchedule> sched,
              compileSchedule(op, rank, nranks, layout, pieceElems, algo));
  LOOM_INFO(kSubPlan, "{} count {} {} {}: algorithm {}, {} pieces, staging {} elements",
            collName(op.coll), op.count, dataTypeName(op.dtype),
            op.inPlace ? "in place" : "out of place", sched->algorithm,
            sched->lowered.pieces.size(), sched->lowered.stagingCount);
  std::lock_guard<std::mutex> lk(mu_);
  lru_.emplace_front(key, sched);
  index_[key] = lru_.begin();
  if (lru_.size() > kScheduleCacheSize) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledSchedule>(sched);
}

size_t scheduleScratchBytes(const CompiledSchedule& s, const OpArgs& args, bool blocked) {
  auto align64 = [](size_t b) { return (b + 63) & ~size_t(63); };
  const size_t es = dataTypeSize(args.dtype);
  size_t bytes = align64(s.lowered.scratchCount * es) + align64(s.lowered.stagingCount * es);
  // A NULL buffer that the API allows (non-root Reduce output, non-root Broadcast input) gets a
  // harmless stand-in so that no schedule can dereference it.
  if (!args.recvbuff && s.touchesOutput) bytes += align64(s.layout.outputCount * es);
  if (!args.sendbuff && s.touchesInput) bytes += align64(s.layout.inputCount * es);
  if (blocked) bytes += align64(args.count * es);
  return bytes;
}

bool rangesOverlap(const void* a, size_t na, const void* b, size_t nb) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a && b && na && nb && x < y + nb && y < x + na;
}

bool receiveOverlapsSend(const OpArgs& recv, const OpArgs& send) {
  return recv.coll == CollKind::kSendRecv && !recv.isSend && send.coll == CollKind::kSendRecv &&
         send.isSend &&
         rangesOverlap(recv.recvbuff, recv.count * dataTypeSize(recv.dtype), send.sendbuff,
                       send.count * dataTypeSize(send.dtype));
}

Status executeOps(const std::vector<QueuedOp>& ops) {
  if (ops.empty()) return Status();
  Executor ex(ops);
  return ex.run();
}

}  // namespace loom
