// estimateCost: discrete-event simulation of a lowered schedule with fluid, max-min fair bandwidth
// sharing (see cost_model.h for the model).
#include "algorithms/cost_model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace loom {

CostMachine CostMachine::uniform(int nranks, int ranksPerHost) {
  CostMachine m;
  const int per = std::max(1, ranksPerHost);
  m.hostOf.resize(static_cast<size_t>(std::max(0, nranks)));
  for (int r = 0; r < nranks; ++r) m.hostOf[static_cast<size_t>(r)] = r / per;
  return m;
}

CostMachine hostCostMachine(const HostCluster& c) {
  CostMachine m;
  m.hostOf = c.hostOf;
  size_t hosts = 0;
  for (int h : c.hostOf) hosts = std::max(hosts, static_cast<size_t>(h) + 1);
  std::vector<size_t> ranksOn(hosts, 0);
  for (int h : c.hostOf) ++ranksOn[static_cast<size_t>(h)];
  // More ranks than cores on a host: its ranks share the cores' copy bandwidth (the busy ones get
  // most of the share of those that wait), and lose some of it to switching between them.
  // Calibrated with loom-plan-check against every forced algorithm of the four collectives at
  // 1-64 MiB, 4 ranks on a 2-core VM: with the whole cores as the pool and a core per rank, every
  // balanced schedule was predicted at 0.69-0.88 of its time and a direct broadcast (its root
  // copies to every peer) tied with the chain it lost to by 8-35%.
  constexpr double kOversubscribedPool = 0.8;       // of cores x memcpy
  constexpr double kOversubscribedRankShare = 1.5;  // of pool / ranks, at most one core
  m.hostMemBytesPerSec.assign(hosts, 0);
  m.hostRankMemBytesPerSec.assign(hosts, 0);
  for (size_t h = 0; h < hosts && h < c.coresPerHost.size(); ++h) {
    const uint32_t cores = c.coresPerHost[h];
    if (cores == 0 || ranksOn[h] <= cores) continue;
    m.hostMemBytesPerSec[h] = c.memcpyBytesPerSec * cores * kOversubscribedPool;
    m.hostRankMemBytesPerSec[h] =
        std::min(c.memcpyBytesPerSec, m.hostMemBytesPerSec[h] * kOversubscribedRankShare /
                                          static_cast<double>(ranksOn[h]));
  }
  m.memBytesPerSec = c.memcpyBytesPerSec;
  m.cmaSlowdown = c.cmaSlowdown;
  m.copyBytesPerSec = c.memcpyBytesPerSec;
  m.reduceBytesPerSec = c.reduceBytesPerSec;
  m.inter = LinkCost{c.netAlphaSec, c.netBytesPerSec};
  m.nicBytesPerSec = c.netBytesPerSec;
  m.serialInterAlphaPerRank = true;  // one progress thread posts a rank's messages
  if (c.shm) {
    m.intra = LinkCost{c.shmAlphaSec, c.memcpyBytesPerSec};
    m.fuseIntraRecvReduce = true;
  } else {
    m.intra = LinkCost{c.netAlphaSec, c.netBytesPerSec};  // ranks of one host over sockets
  }
  return m;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// A flow whose remaining bytes fall below this fraction of its size is done (rounding of the
// fluid advance); the flow that defines the next event is finished exactly.
constexpr double kDoneFraction = 1e-9;
constexpr size_t kMaxReported = 4;
constexpr size_t kNone = std::numeric_limits<size_t>::max();

double rateOrInf(double r) { return r > 0 ? r : kInf; }

bool isNet(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
}

struct RankSim {
  LoweredSchedule lw;
  std::vector<uint32_t> remaining;        // unmet dependencies per piece
  std::vector<uint32_t> dependentsStart;  // CSR: pieces that depend on piece i
  std::vector<uint32_t> dependents;
  std::vector<int32_t> queueOf;  // network piece -> its queue
  size_t done = 0;
  double finish = 0;
};

// The network pieces of one rank for one (peer, channel, direction), posted in order.
struct Queue {
  int rank = 0;
  int conn = -1;
  std::vector<uint32_t> pieces;
  size_t head = 0;  // pieces [0, head) are posted
};

// Directed connection (src, dst, channel): its k-th send matches its k-th receive; transfers are
// served one at a time in that order.
struct Conn {
  int src = 0;
  int dst = 0;
  int channel = 0;
  int sendQ = -1;
  int recvQ = -1;
  bool inter = false;
  size_t matched = 0;
  std::deque<uint32_t> pending;  // matched jobs waiting for the connection
  bool busy = false;
};

struct Job {
  int conn = 0;
  uint32_t sendPiece = 0;
  uint32_t recvPiece = 0;
  double bytes = 0;
};

enum class FlowKind : uint8_t { kTransfer, kReduceAfterRecv, kLocal };

struct Flow {
  double rem = 0;  // bytes left
  double bytes = 0;
  double rate = 0;
  double cap = kInf;
  int res[4] = {-1, -1, -1, -1};  // a resource listed twice counts twice
  FlowKind kind = FlowKind::kLocal;
  uint32_t job = 0;  // kTransfer
  int rank = 0;      // kReduceAfterRecv, kLocal
  uint32_t piece = 0;
};

struct Timer {
  double t;
  uint64_t seq;
  uint32_t job;
  bool operator>(const Timer& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

class Simulator {
 public:
  Simulator(const Schedule& s, const CostMachine& m, size_t elemSize, size_t pieceBytes)
      : s_(s), m_(m), elemSize_(elemSize), pieceBytes_(pieceBytes), n_(s.args.nranks) {}

  Result<CostEstimate> run() {
    LOOM_TRY(setup());
    for (int r = 0; r < n_; ++r) {
      RankSim& rk = ranks_[static_cast<size_t>(r)];
      for (uint32_t p = 0; p < rk.lw.pieces.size(); ++p) {
        if (rk.remaining[p] == 0 && !isNet(rk.lw.pieces[p].step.kind)) startLocal(r, p);
      }
    }
    for (size_t q = 0; q < queues_.size(); ++q) post(static_cast<int>(q));
    LOOM_TRY(error_);
    LOOM_TRY(loop());
    LOOM_TRY(checkFinished());
    est_.rankSeconds.resize(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const double f = ranks_[static_cast<size_t>(r)].finish;
      est_.rankSeconds[static_cast<size_t>(r)] = f;
      est_.seconds = std::max(est_.seconds, f);
    }
    for (double b : nicBytes_) est_.maxNicBytes = std::max(est_.maxNicBytes, b);
    return est_;
  }

 private:
  Status setup() {
    if (n_ < 1 || s_.ranks.size() != static_cast<size_t>(n_)) {
      return LOOM_ERROR(kInvalidArgument, "cost model: {} rank schedules for nranks {}",
                        s_.ranks.size(), n_);
    }
    if (m_.hostOf.size() != static_cast<size_t>(n_)) {
      return LOOM_ERROR(kInvalidArgument, "cost model: hostOf has {} entries for {} ranks",
                        m_.hostOf.size(), n_);
    }
    if (elemSize_ == 0) return LOOM_ERROR(kInvalidArgument, "cost model: element size 0");
    const double rates[] = {m_.intra.alphaSec,    m_.intra.bytesPerSec, m_.inter.alphaSec,
                            m_.inter.bytesPerSec, m_.nicBytesPerSec,    m_.memBytesPerSec,
                            m_.reduceBytesPerSec, m_.copyBytesPerSec};
    for (double v : rates) {
      if (!(v >= 0) || std::isinf(v)) {
        return LOOM_ERROR(kInvalidArgument,
                          "cost model: rates and latencies must be finite and "
                          ">= 0 (0: unlimited)");
      }
    }
    // Hosts: dense ids in order of first appearance.
    std::map<int, int> hostIds;
    host_.resize(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const int h = m_.hostOf[static_cast<size_t>(r)];
      if (h < 0) return LOOM_ERROR(kInvalidArgument, "cost model: rank {} has host {}", r, h);
      auto it = hostIds.emplace(h, static_cast<int>(hostIds.size())).first;
      host_[static_cast<size_t>(r)] = it->second;
    }
    const int hosts = static_cast<int>(hostIds.size());
    // Resources: rank memories [0, n), NIC egress [n, n + H), NIC ingress [n + H, n + 2H), host
    // cores [n + 2H, n + 3H).
    nicOut0_ = n_;
    nicIn0_ = n_ + hosts;
    cpu0_ = n_ + 2 * hosts;
    resCap_.assign(static_cast<size_t>(n_ + 3 * hosts), kInf);
    for (int r = 0; r < n_; ++r) resCap_[static_cast<size_t>(r)] = rateOrInf(m_.memBytesPerSec);
    for (int h = 0; h < 2 * hosts; ++h) {
      resCap_[static_cast<size_t>(n_ + h)] = rateOrInf(m_.nicBytesPerSec);
    }
    for (const auto& [id, dense] : hostIds) {
      const size_t i = static_cast<size_t>(id);
      double cap = i < m_.hostMemBytesPerSec.size() ? m_.hostMemBytesPerSec[i] : 0;
      if (!(cap >= 0) || std::isinf(cap))
        return LOOM_ERROR(kInvalidArgument, "cost model: host {} memory rate {}", id, cap);
      resCap_[static_cast<size_t>(cpu0_ + dense)] = rateOrInf(cap);
    }
    for (int r = 0; r < n_; ++r) {
      const size_t i = static_cast<size_t>(m_.hostOf[static_cast<size_t>(r)]);
      const double cap = i < m_.hostRankMemBytesPerSec.size() ? m_.hostRankMemBytesPerSec[i] : 0;
      if (!(cap >= 0) || std::isinf(cap))
        return LOOM_ERROR(kInvalidArgument, "cost model: host {} rank memory rate {}", i, cap);
      if (cap > 0) resCap_[static_cast<size_t>(r)] = std::min(resCap_[static_cast<size_t>(r)], cap);
    }
    resRem_.assign(resCap_.size(), 0);
    resCnt_.assign(resCap_.size(), 0);
    resTouched_.assign(resCap_.size(), 0);
    resSaturated_.assign(resCap_.size(), 0);
    nicBytes_.assign(static_cast<size_t>(2 * hosts), 0);

    const size_t pieceElems = pieceBytes_ == 0 ? 0 : std::max<size_t>(1, pieceBytes_ / elemSize_);
    ranks_.resize(static_cast<size_t>(n_));
    alphaFree_.assign(static_cast<size_t>(n_), 0);
    std::map<std::tuple<int, int, int>, int> connIds;  // (src, dst, channel)
    for (int r = 0; r < n_; ++r) {
      RankSim& rk = ranks_[static_cast<size_t>(r)];
      const RankSchedule& rs = s_.ranks[static_cast<size_t>(r)];
      est_.maxSteps = std::max(est_.maxSteps, static_cast<int>(rs.steps.size()));
      for (size_t i = 0; i < rs.steps.size(); ++i) {
        const Step& st = rs.steps[i];
        if (static_cast<int>(st.kind) > static_cast<int>(StepKind::kReduce)) {
          return LOOM_ERROR(kInvalidArgument, "cost model: rank {} step {}: invalid kind", r, i);
        }
        if (isNet(st.kind) && (st.peer < 0 || st.peer >= n_ || st.peer == r || st.channel < 0)) {
          return LOOM_ERROR(kInvalidArgument,
                            "cost model: rank {} step {}: invalid peer {} or channel {}", r, i,
                            st.peer, st.channel);
        }
      }
      rk.lw = lowerSchedule(rs, bufferLayout(s_.args, r), pieceElems);
      const auto& pieces = rk.lw.pieces;
      const size_t np = pieces.size();
      if (np >= std::numeric_limits<uint32_t>::max()) {
        return LOOM_ERROR(kInvalidArgument, "cost model: rank {}: too many pieces", r);
      }
      est_.maxPieces = std::max(est_.maxPieces, np);
      rk.remaining.resize(np);
      rk.queueOf.assign(np, -1);
      std::vector<uint32_t> outDegree(np, 0);
      for (size_t i = 0; i < np; ++i) {
        rk.remaining[i] = static_cast<uint32_t>(pieces[i].deps.size());
        for (uint32_t d : pieces[i].deps) ++outDegree[d];
      }
      rk.dependentsStart.assign(np + 1, 0);
      for (size_t i = 0; i < np; ++i)
        rk.dependentsStart[i + 1] = rk.dependentsStart[i] + outDegree[i];
      rk.dependents.resize(rk.dependentsStart[np]);
      std::vector<uint32_t> fill(rk.dependentsStart.begin(), rk.dependentsStart.end() - 1);
      for (size_t i = 0; i < np; ++i) {
        for (uint32_t d : pieces[i].deps) rk.dependents[fill[d]++] = static_cast<uint32_t>(i);
      }
      // Queues of this rank, keyed by (peer, channel, isSend).
      std::map<std::tuple<int, int, bool>, int> local;
      for (uint32_t i = 0; i < np; ++i) {
        const Step& st = pieces[i].step;
        if (!isNet(st.kind)) continue;
        const bool isSend = st.kind == StepKind::kSend;
        auto [it, fresh] = local.emplace(std::make_tuple(st.peer, st.channel, isSend),
                                         static_cast<int>(queues_.size()));
        if (fresh) {
          Queue q;
          q.rank = r;
          const auto key = isSend ? std::make_tuple(r, st.peer, st.channel)
                                  : std::make_tuple(st.peer, r, st.channel);
          auto [cit, cfresh] = connIds.emplace(key, static_cast<int>(conns_.size()));
          if (cfresh) {
            Conn c;
            c.src = std::get<0>(key);
            c.dst = std::get<1>(key);
            c.channel = st.channel;
            c.inter = host_[static_cast<size_t>(c.src)] != host_[static_cast<size_t>(c.dst)];
            conns_.push_back(c);
          }
          q.conn = cit->second;
          (isSend ? conns_[static_cast<size_t>(q.conn)].sendQ
                  : conns_[static_cast<size_t>(q.conn)].recvQ) = it->second;
          queues_.push_back(std::move(q));
        }
        queues_[static_cast<size_t>(it->second)].pieces.push_back(i);
        rk.queueOf[i] = it->second;
      }
    }
    return Status::ok();
  }

  const Piece& piece(int r, uint32_t p) const {
    return ranks_[static_cast<size_t>(r)].lw.pieces[p];
  }
  double bytesOf(int r, uint32_t p) const {
    return static_cast<double>(piece(r, p).step.count) * static_cast<double>(elemSize_);
  }

  // Posts the queue's pieces whose dependencies are met, in order, and matches transfers.
  void post(int qi) {
    Queue& q = queues_[static_cast<size_t>(qi)];
    const RankSim& rk = ranks_[static_cast<size_t>(q.rank)];
    const size_t before = q.head;
    while (q.head < q.pieces.size() && rk.remaining[q.pieces[q.head]] == 0) ++q.head;
    if (q.head != before) match(q.conn);
  }

  void match(int ci) {
    Conn& c = conns_[static_cast<size_t>(ci)];
    if (c.sendQ < 0 || c.recvQ < 0) return;
    const Queue& sq = queues_[static_cast<size_t>(c.sendQ)];
    const Queue& rq = queues_[static_cast<size_t>(c.recvQ)];
    while (c.matched < sq.head && c.matched < rq.head) {
      Job j;
      j.conn = ci;
      j.sendPiece = sq.pieces[c.matched];
      j.recvPiece = rq.pieces[c.matched];
      ++c.matched;
      const size_t sc = piece(c.src, j.sendPiece).step.count;
      const size_t rc = piece(c.dst, j.recvPiece).step.count;
      if (sc != rc && error_.isOk()) {
        error_ = LOOM_ERROR(kInvalidArgument,
                            "cost model: rank {} sends {} elements to rank {} on channel {} "
                            "where it receives {} (transfer {} of that connection)",
                            c.src, sc, c.dst, c.channel, rc, c.matched - 1);
      }
      j.bytes = bytesOf(c.src, j.sendPiece);
      jobs_.push_back(j);
      c.pending.push_back(static_cast<uint32_t>(jobs_.size() - 1));
    }
    startNext(ci);
  }

  // Starts the next matched transfer of an idle connection: alpha, then its bytes.
  void startNext(int ci) {
    Conn& c = conns_[static_cast<size_t>(ci)];
    if (c.busy || c.pending.empty()) return;
    c.busy = true;
    const uint32_t j = c.pending.front();
    c.pending.pop_front();
    const double alpha = c.inter ? m_.inter.alphaSec : m_.intra.alphaSec;
    if (alpha > 0) {
      double start = now_;
      if (c.inter && m_.serialInterAlphaPerRank) {
        double& free = alphaFree_[static_cast<size_t>(c.src)];
        start = std::max(start, free);
        free = start + alpha;
      }
      timers_.push(Timer{start + alpha, seq_++, j});
    } else {
      startTransfer(j);
    }
  }

  void startTransfer(uint32_t ji) {
    const Job& j = jobs_[ji];
    const Conn& c = conns_[static_cast<size_t>(j.conn)];
    Flow f;
    f.kind = FlowKind::kTransfer;
    f.job = ji;
    f.bytes = f.rem = j.bytes;
    const int hs = host_[static_cast<size_t>(c.src)], hd = host_[static_cast<size_t>(c.dst)];
    if (c.inter) {
      f.cap = rateOrInf(m_.inter.bytesPerSec);
      f.res[0] = nicOut0_ + hs;
      f.res[1] = nicIn0_ + hd;
      est_.bytesInter += j.bytes;
      ++est_.messagesInter;
      nicBytes_[static_cast<size_t>(hs)] += j.bytes;
      nicBytes_[nicBytes_.size() / 2 + static_cast<size_t>(hd)] += j.bytes;
    } else {
      f.cap = rateOrInf(m_.intra.bytesPerSec);
      if (fusedReduce(j)) f.cap = std::min(f.cap, rateOrInf(m_.reduceBytesPerSec));
      f.res[0] = c.src;
      f.res[1] = c.dst;
      f.res[2] = f.res[3] = cpu0_ + hs;  // two copies on the host's cores
      est_.bytesIntra += j.bytes;
      ++est_.messagesIntra;
    }
    addFlow(f);
  }

  bool fusedReduce(const Job& j) const {
    const Conn& c = conns_[static_cast<size_t>(j.conn)];
    return !c.inter && m_.fuseIntraRecvReduce &&
           piece(c.dst, j.recvPiece).step.kind == StepKind::kRecvReduce;
  }

  void startLocal(int r, uint32_t p) {
    const Step& st = piece(r, p).step;
    Flow f;
    f.kind = FlowKind::kLocal;
    f.rank = r;
    f.piece = p;
    f.bytes = f.rem = bytesOf(r, p);
    f.res[0] = r;
    f.res[1] = cpu0_ + host_[static_cast<size_t>(r)];
    if (st.kind == StepKind::kCopy) {
      f.cap = rateOrInf(m_.copyBytesPerSec);
      est_.bytesCopied += f.bytes;
    } else {
      f.cap = rateOrInf(m_.reduceBytesPerSec);
      est_.bytesReduced += f.bytes;
    }
    addFlow(f);
  }

  void addFlow(const Flow& f) {
    flows_.push_back(f);
    dirty_ = true;
  }

  void complete(int r, uint32_t p) {
    RankSim& rk = ranks_[static_cast<size_t>(r)];
    ++rk.done;
    rk.finish = std::max(rk.finish, now_);
    for (uint32_t k = rk.dependentsStart[p]; k < rk.dependentsStart[p + 1]; ++k) {
      const uint32_t d = rk.dependents[k];
      if (--rk.remaining[d] != 0) continue;
      if (isNet(rk.lw.pieces[d].step.kind)) {
        post(rk.queueOf[d]);
      } else {
        startLocal(r, d);
      }
    }
  }

  void finishFlow(const Flow& f) {
    switch (f.kind) {
      case FlowKind::kTransfer: {
        const Job j = jobs_[f.job];
        Conn& c = conns_[static_cast<size_t>(j.conn)];
        c.busy = false;
        complete(c.src, j.sendPiece);
        if (piece(c.dst, j.recvPiece).step.kind == StepKind::kRecvReduce) {
          est_.bytesReduced += j.bytes;
          if (fusedReduce(j)) {
            complete(c.dst, j.recvPiece);
          } else {
            Flow g;
            g.kind = FlowKind::kReduceAfterRecv;
            g.rank = c.dst;
            g.piece = j.recvPiece;
            g.bytes = g.rem = j.bytes;
            g.cap = rateOrInf(m_.reduceBytesPerSec);
            g.res[0] = c.dst;
            g.res[1] = cpu0_ + host_[static_cast<size_t>(c.dst)];
            addFlow(g);
          }
        } else {
          complete(c.dst, j.recvPiece);
        }
        startNext(j.conn);
        break;
      }
      case FlowKind::kReduceAfterRecv:
      case FlowKind::kLocal:
        complete(f.rank, f.piece);
        break;
    }
  }

  // Max-min fair rates by progressive filling: raise every unfrozen flow's rate together; a flow
  // freezes when it reaches its own cap or a resource it crosses saturates.
  void computeRates() {
    touched_.clear();
    for (Flow& f : flows_) {
      f.rate = -1;
      for (int res : f.res) {
        if (res < 0 || std::isinf(resCap_[static_cast<size_t>(res)])) continue;
        const size_t ri = static_cast<size_t>(res);
        if (!resTouched_[ri]) {
          resTouched_[ri] = 1;
          resRem_[ri] = resCap_[ri];
          resCnt_[ri] = 0;
          touched_.push_back(ri);
        }
        ++resCnt_[ri];
      }
    }
    size_t unfrozen = flows_.size();
    while (unfrozen > 0) {
      double level = kInf;
      for (const Flow& f : flows_) {
        if (f.rate < 0) level = std::min(level, f.cap);
      }
      for (size_t ri : touched_) {
        if (resCnt_[ri] > 0) level = std::min(level, std::max(0.0, resRem_[ri]) / resCnt_[ri]);
      }
      if (std::isinf(level)) {
        for (Flow& f : flows_) {
          if (f.rate < 0) f.rate = kInf;
        }
        break;
      }
      const double thr = level * (1 + 1e-12);
      for (size_t ri : touched_) {
        resSaturated_[ri] = resCnt_[ri] > 0 && std::max(0.0, resRem_[ri]) / resCnt_[ri] <= thr;
      }
      for (Flow& f : flows_) {
        if (f.rate >= 0) continue;
        bool freeze = f.cap <= thr;
        for (int res : f.res) {
          if (res >= 0 && resTouched_[static_cast<size_t>(res)] &&
              resSaturated_[static_cast<size_t>(res)]) {
            freeze = true;
          }
        }
        if (!freeze) continue;
        f.rate = level;
        --unfrozen;
        for (int res : f.res) {
          if (res < 0 || !resTouched_[static_cast<size_t>(res)]) continue;
          resRem_[static_cast<size_t>(res)] -= level;
          --resCnt_[static_cast<size_t>(res)];
        }
      }
    }
    for (size_t ri : touched_) resTouched_[ri] = 0;
    dirty_ = false;
  }

  Status loop() {
    std::vector<Flow> finished;
    while (error_.isOk()) {
      if (dirty_) computeRates();
      double next = kInf;
      size_t argmin = kNone;
      for (size_t i = 0; i < flows_.size(); ++i) {
        const Flow& f = flows_[i];
        const double t = std::isinf(f.rate) ? now_ : now_ + f.rem / f.rate;
        if (t < next) {
          next = t;
          argmin = i;
        }
      }
      if (!timers_.empty() && timers_.top().t < next) {
        next = timers_.top().t;
        argmin = kNone;
      }
      if (std::isinf(next)) break;
      ++est_.events;
      const double dt = std::max(0.0, next - now_);
      now_ = std::max(now_, next);
      finished.clear();
      for (size_t i = 0; i < flows_.size();) {
        Flow& f = flows_[i];
        if (std::isinf(f.rate)) {
          f.rem = 0;
        } else {
          f.rem -= f.rate * dt;
        }
        if (i == argmin || f.rem <= kDoneFraction * f.bytes) {
          finished.push_back(f);
          if (i == argmin) {
            argmin = kNone;
          } else if (argmin == flows_.size() - 1) {
            argmin = i;  // it moves into slot i
          }
          flows_[i] = flows_.back();
          flows_.pop_back();
          dirty_ = true;
          continue;  // slot i now holds another flow, not yet advanced
        }
        ++i;
      }
      for (const Flow& f : finished) finishFlow(f);
      while (!timers_.empty() && timers_.top().t <= now_) {
        const uint32_t j = timers_.top().job;
        timers_.pop();
        startTransfer(j);
      }
    }
    return error_;
  }

  // Every piece of every rank must have completed; otherwise the schedule deadlocks (or leaves
  // transfers unmatched), which the verifier rejects.
  Status checkFinished() const {
    std::string why;
    size_t blocked = 0;
    for (int r = 0; r < n_; ++r) {
      const RankSim& rk = ranks_[static_cast<size_t>(r)];
      if (rk.done == rk.lw.pieces.size()) continue;
      if (blocked++ >= kMaxReported) continue;
      // The first incomplete piece that has been started or is a posted network piece.
      std::string first;
      for (const Queue& q : queues_) {
        if (q.rank != r) continue;
        const Conn& c = conns_[static_cast<size_t>(q.conn)];
        const bool isSend = c.src == r;
        const size_t matched = c.matched;
        if (matched < q.head) {
          const Step& st = piece(r, q.pieces[matched]).step;
          first = fmt::format("{} {} rank {} channel {} posted but never matched",
                              stepKindName(st.kind), isSend ? "to" : "from", st.peer, st.channel);
          break;
        }
      }
      if (first.empty()) first = "waits for pieces that never complete";
      why += fmt::format("{}rank {}: {} of {} pieces done; {}", why.empty() ? "" : "; ", r, rk.done,
                         rk.lw.pieces.size(), first);
    }
    if (blocked == 0) return Status::ok();
    if (blocked > kMaxReported) why += fmt::format("; and {} more rank(s)", blocked - kMaxReported);
    return LOOM_ERROR(kInvalidArgument, "cost model: {} {} (n={}) cannot finish (deadlock): {}",
                      s_.algorithm, collName(s_.args.coll), n_, why);
  }

  const Schedule& s_;
  const CostMachine& m_;
  const size_t elemSize_;
  const size_t pieceBytes_;
  const int n_;
  std::vector<int> host_;
  int nicOut0_ = 0;
  int nicIn0_ = 0;
  int cpu0_ = 0;
  std::vector<double> resCap_, resRem_;
  std::vector<uint32_t> resCnt_;
  std::vector<uint8_t> resTouched_, resSaturated_;
  std::vector<size_t> touched_;
  std::vector<double> nicBytes_;   // egress per host, then ingress per host
  std::vector<double> alphaFree_;  // per rank: when its next inter-host alpha may start
  std::vector<RankSim> ranks_;
  std::vector<Queue> queues_;
  std::vector<Conn> conns_;
  std::vector<Job> jobs_;
  std::vector<Flow> flows_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t seq_ = 0;
  double now_ = 0;
  bool dirty_ = false;
  Status error_;
  CostEstimate est_;
};

}  // namespace

Result<CostEstimate> estimateCost(const Schedule& schedule, const CostMachine& machine,
                                  size_t elemSize, size_t pieceBytes) {
  return Simulator(schedule, machine, elemSize, pieceBytes).run();
}

}  // namespace loom
