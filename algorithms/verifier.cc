// verifySchedule: symbolic execution of every rank of a schedule.
//
// Each element holds a symbol: the index of the input element it derives from and the set of ranks
// whose input it combines (a dynamic bitset, so any rank count works), or "undefined". Input
// element i of rank r starts as (i, {r}). A reduction requires both operands defined, of the same
// index and with disjoint rank sets (an overlap would count a rank twice); copies and transfers
// move symbols. The execution follows the executor's rules (schedule.h): steps start in order once
// every earlier conflicting step (range overlap, aliasing included) has completed; sends and
// receives are posted when they start and complete when their match is posted.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/conflicts.h"
#include "algorithms/schedule.h"

namespace loom {
namespace {

constexpr int kMaxRanks = 1 << 20;
constexpr int kMaxChannels = 1 << 20;
constexpr size_t kMaxReported = 8;  // blocked ranks / unmatched steps listed in one error

const char* bufName(BufKind b) {
  switch (b) {
    case BufKind::kInput:
      return "input";
    case BufKind::kOutput:
      return "output";
    case BufKind::kScratch:
      return "scratch";
  }
  return "?";
}

bool isComm(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
}
bool usesSrc(StepKind k) { return k != StepKind::kRecv; }
bool usesDst(StepKind k) { return k != StepKind::kSend; }

std::string describeStep(const Step& s) {
  std::string d = stepKindName(s.kind);
  if (s.kind == StepKind::kSend) {
    d += fmt::format(" to {} ch {}", s.peer, s.channel);
  } else if (isComm(s.kind)) {
    d += fmt::format(" from {} ch {}", s.peer, s.channel);
  }
  if (usesSrc(s.kind)) d += fmt::format(" src {}[{}]", bufName(s.src.buf), s.src.offset);
  if (usesDst(s.kind)) d += fmt::format(" dst {}[{}]", bufName(s.dst.buf), s.dst.offset);
  d += fmt::format(" count {}", s.count);
  return d;
}

// Symbols of one address space, structure of arrays: idx (-1: undefined), words bits per element,
// and the step that last wrote each element (-1: none). An implicit buffer is a rank's read-only
// input out of place: element i is (i, implicitBits), or undefined when implicitBits is null; it
// stores nothing (the largest buffers of AllToAll and ReduceScatter cost no memory). The arrays
// live in the thread's Arena.
struct SymBuf {
  int words = 1;
  size_t size = 0;  // elements
  int64_t* idx = nullptr;
  // An element's bits are read only while its idx is defined, and whatever defines idx writes all
  // words of its bits too: they start uninitialized.
  uint64_t* bits = nullptr;
  int32_t* writer = nullptr;
  bool implicit = false;
  const uint64_t* implicitBits = nullptr;
  int64_t idxAt(size_t i) const {
    if (implicit) return implicitBits ? static_cast<int64_t>(i) : -1;
    return idx[i];
  }
  const uint64_t* bitsAt(size_t i) const {
    if (implicit) return implicitBits;
    return at(i);
  }
  int32_t writerAt(size_t i) const { return implicit ? -1 : writer[i]; }
  uint64_t* at(size_t i) { return bits + i * static_cast<size_t>(words); }
  const uint64_t* at(size_t i) const { return bits + i * static_cast<size_t>(words); }
};

// The storage of every rank's symbols, kept by the thread from one verification to the next: a
// proof verifies thousands of schedules of similar sizes, and memory returned to the system after
// each one (hundreds of MiB at 64 ranks) costs more in page faults than the symbolic execution.
struct Arena {
  std::vector<int64_t> idx;
  std::vector<uint64_t> bits;
  std::vector<int32_t> writer;
};
Arena& threadArena() {
  thread_local Arena arena;
  return arena;
}

std::string rankSetString(const uint64_t* b, int words, int n) {
  std::string s = "{";
  int shown = 0;
  for (int r = 0; r < n;) {
    if (!((b[r / 64] >> (r % 64)) & 1)) {
      ++r;
      continue;
    }
    int e = r;
    while (e + 1 < n && ((b[(e + 1) / 64] >> ((e + 1) % 64)) & 1)) ++e;
    if (shown++) s += ",";
    if (shown > 16) {
      s += "...";
      break;
    }
    s += e == r ? fmt::format("{}", r) : fmt::format("{}-{}", r, e);
    r = e + 1;
  }
  return s + "}";
}

// Copies the symbols of count elements from [from, from + count) of src to [to, to + count) of dst
// (ranges that do not overlap).
void copySymbols(const SymBuf& src, size_t from, SymBuf& dst, size_t to, size_t count) {
  const size_t W = static_cast<size_t>(dst.words);
  if (src.implicit) {
    for (size_t k = 0; k < count; ++k) {
      dst.idx[to + k] = src.idxAt(from + k);
      uint64_t* out = dst.at(to + k);
      if (src.implicitBits) {
        std::copy(src.implicitBits, src.implicitBits + W, out);
      } else {
        std::fill(out, out + W, 0);
      }
    }
    return;
  }
  std::copy(src.idx + from, src.idx + from + count, dst.idx + to);
  std::copy(src.at(from), src.at(from) + count * W, dst.at(to));
}

// A posted send. Its symbols are read from the sender's buffer when the receive matches it, not
// copied when it is posted: until then no step of the sender that writes the source may start (it
// conflicts with the send, which has not completed), so the source holds what it held at the post.
struct Message {
  int rank = 0;       // sender
  uint32_t step = 0;  // sender's step
  size_t count = 0;
  Span src;  // in the sender's address spaces
};

struct Channel {
  // Posted, unmatched: [sendHead, sends.size()) and [recvHead, recvs.size()) (FIFO queues that
  // never shrink: cheaper than deques for the n^2 channels of an AllToAll).
  std::vector<Message> sends;
  size_t sendHead = 0;
  std::vector<std::pair<int, uint32_t>> recvs;  // (rank, step)
  size_t recvHead = 0;
};

struct RankState {
  const RankSchedule* rs = nullptr;
  BufferLayout layout;
  AddressMap map{BufferLayout{}};
  size_t bufSize[3] = {0, 0, 0};  // per BufKind
  Span writable[kNumSpaces];
  SymBuf space[kNumSpaces];
  std::vector<uint32_t> depStart;  // CSR: deps of step i are depList[depStart[i], depStart[i+1])
  std::vector<uint32_t> depList;
  std::vector<uint8_t> done;
  uint32_t pc = 0;
};

class Verifier {
 public:
  explicit Verifier(const Schedule& s) : s_(s), n_(s.args.nranks), words_((n_ + 63) / 64) {}

  Status run() {
    LOOM_TRY(checkArgs());
    ranks_.resize(static_cast<size_t>(n_));
    rankBits_.resize(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) LOOM_TRY(prepareRank(r));
    placeSymbols();
    // Ranks that may be able to start a step: all at first, then those a completion woke.
    queued_.assign(static_cast<size_t>(n_), 1);
    for (int r = n_ - 1; r >= 0; --r) work_.push_back(r);
    while (!work_.empty()) {
      const int r = work_.back();
      work_.pop_back();
      queued_[static_cast<size_t>(r)] = 0;
      LOOM_TRY(advance(r));
    }
    LOOM_TRY(checkFinished());
    return checkOutputs();
  }

 private:
  Status fail(int r, uint32_t i, const std::string& what) const {
    const Step& st = ranks_[static_cast<size_t>(r)].rs->steps[i];
    return LOOM_ERROR(kInternal, "{} {} (n={}, count={}{}{}{}): rank {} step {} ({}): {}",
                      s_.algorithm, collName(s_.args.coll), n_, s_.args.count,
                      s_.args.inPlace ? ", in place" : "",
                      isRooted() ? fmt::format(", root={}", s_.args.root) : std::string(),
                      layoutString(), r, i, describeStep(st), what);
  }
  Status failGlobal(const std::string& what) const {
    return LOOM_ERROR(
        kInternal, "{} {} (n={}, count={}{}{}{}): {}", s_.algorithm, collName(s_.args.coll), n_,
        s_.args.count, s_.args.inPlace ? ", in place" : "",
        isRooted() ? fmt::format(", root={}", s_.args.root) : std::string(), layoutString(), what);
  }
  // ", host of each rank [0,0,1], ring [...], 2 channel(s)" for a layout, "" without one.
  std::string layoutString() const {
    const RankLayout* l = s_.args.layout.get();
    if (!l) return std::string();
    std::string hosts, ring;
    for (int r = 0; r < l->nranks() && r < 32; ++r) {
      hosts += fmt::format("{}{}", r ? "," : "", l->hostOf(r));
    }
    if (l->nranks() > 32) hosts += ",...";
    for (int p = 0; p < l->nranks() && p < 32; ++p) {
      ring += fmt::format("{}{}", p ? "," : "", l->ringOrder()[static_cast<size_t>(p)]);
    }
    if (l->nranks() > 32) ring += ",...";
    return fmt::format(", host of each rank [{}], ring [{}], {} channel(s)", hosts, ring,
                       l->channels());
  }
  bool isRooted() const {
    return s_.args.coll == CollKind::kBroadcast || s_.args.coll == CollKind::kReduce;
  }

  Status checkArgs() {
    if (n_ < 1 || n_ >= kMaxRanks) return failGlobal(fmt::format("invalid nranks {}", n_));
    if (s_.ranks.size() != static_cast<size_t>(n_)) {
      return failGlobal(fmt::format("{} rank schedules for {} ranks", s_.ranks.size(), n_));
    }
    if (isRooted() && (s_.args.root < 0 || s_.args.root >= n_)) {
      return failGlobal(fmt::format("root {} out of range", s_.args.root));
    }
    if (s_.args.coll == CollKind::kSendRecv) {
      return failGlobal("point-to-point schedules have no collective definition to verify");
    }
    if (s_.args.layout && s_.args.layout->nranks() != n_) {
      return failGlobal(fmt::format("rank layout of {} ranks", s_.args.layout->nranks()));
    }
    return Status::ok();
  }

  // Static checks of one rank's steps, dependencies, and initial symbols.
  Status prepareRank(int r) {
    RankState& st = ranks_[static_cast<size_t>(r)];
    st.rs = &s_.ranks[static_cast<size_t>(r)];
    st.layout = bufferLayout(s_.args, r);
    st.map = AddressMap(st.layout);
    const BufferLayout& l = st.layout;
    st.bufSize[static_cast<int>(BufKind::kInput)] = l.inputCount;
    st.bufSize[static_cast<int>(BufKind::kOutput)] = l.outputCount;
    st.bufSize[static_cast<int>(BufKind::kScratch)] = st.rs->scratchCount;
    const bool outputWritable = !(s_.args.coll == CollKind::kReduce && r != s_.args.root);
    st.writable[static_cast<int>(Space::kIn)] =
        l.outputInInput && outputWritable
            ? Span{Space::kIn, l.outputOffsetInInput, l.outputOffsetInInput + l.outputCount}
            : Span{Space::kIn, 0, 0};
    st.writable[static_cast<int>(Space::kOut)] =
        Span{Space::kOut, 0, outputWritable ? l.outputCount : 0};
    st.writable[static_cast<int>(Space::kScratch)] = Span{Space::kScratch, 0, st.rs->scratchCount};

    const std::vector<Step>& steps = st.rs->steps;
    if (steps.size() >= (1u << 31)) return failGlobal(fmt::format("rank {}: too many steps", r));
    ConflictTracker tracker;
    std::vector<uint32_t> deps;
    st.depStart.reserve(steps.size() + 1);
    st.depStart.push_back(0);
    for (uint32_t i = 0; i < steps.size(); ++i) {
      const Step& step = steps[i];
      LOOM_TRY(checkStep(r, i, step));
      tracker.add(i, stepAccess(step, st.map), &deps);
      st.depList.insert(st.depList.end(), deps.begin(), deps.end());
      st.depStart.push_back(static_cast<uint32_t>(st.depList.size()));
    }
    st.done.assign(steps.size(), 0);

    // Spaces: the input lives in the output space when inputInOutput, and vice versa. Out of
    // place the input is never written (checkStep), so it is implicit.
    const bool inputDefined = !(s_.args.coll == CollKind::kBroadcast && r != s_.args.root);
    rankBits_[static_cast<size_t>(r)].assign(static_cast<size_t>(words_), 0);
    rankBits_[static_cast<size_t>(r)][static_cast<size_t>(r / 64)] = uint64_t{1} << (r % 64);
    SymBuf& inSpace = st.space[static_cast<int>(Space::kIn)];
    inSpace.words = words_;
    if (!l.inputInOutput && !l.outputInInput) {
      inSpace.implicit = true;
      inSpace.implicitBits = inputDefined ? rankBits_[static_cast<size_t>(r)].data() : nullptr;
    } else {
      inSpace.size = l.inputInOutput ? 0 : l.inputCount;
    }
    SymBuf& outSpace = st.space[static_cast<int>(Space::kOut)];
    outSpace.words = words_;
    outSpace.size = l.outputInInput ? 0 : l.outputCount;
    SymBuf& scratch = st.space[static_cast<int>(Space::kScratch)];
    scratch.words = words_;
    scratch.size = st.rs->scratchCount;
    if (inputDefined && l.inputCount > 0 && !inSpace.implicit) {
      const Span in = st.map.map(BufRef{BufKind::kInput, 0}, l.inputCount);
      if (in.hi > st.space[static_cast<int>(in.space)].size) {
        return failGlobal(fmt::format("rank {}: inconsistent buffer layout", r));
      }
    }
    return Status::ok();
  }

  // Places every rank's symbols in the thread's arena, all undefined but each rank's input.
  void placeSymbols() {
    size_t total = 0;
    for (const RankState& st : ranks_) {
      for (const SymBuf& sb : st.space) total += sb.implicit ? 0 : sb.size;
    }
    Arena& arena = threadArena();
    arena.idx.assign(total, -1);
    arena.writer.assign(total, -1);
    arena.bits.resize(total * static_cast<size_t>(words_));
    size_t at = 0;
    for (int r = 0; r < n_; ++r) {
      RankState& st = ranks_[static_cast<size_t>(r)];
      for (SymBuf& sb : st.space) {
        if (sb.implicit) continue;
        sb.idx = arena.idx.data() + at;
        sb.writer = arena.writer.data() + at;
        sb.bits = arena.bits.data() + at * static_cast<size_t>(words_);
        at += sb.size;
      }
      const BufferLayout& l = st.layout;
      const SymBuf& inSpace = st.space[static_cast<int>(Space::kIn)];
      const bool inputDefined = !(s_.args.coll == CollKind::kBroadcast && r != s_.args.root);
      if (!inputDefined || l.inputCount == 0 || inSpace.implicit) continue;
      const Span in = st.map.map(BufRef{BufKind::kInput, 0}, l.inputCount);
      SymBuf& sb = st.space[static_cast<int>(in.space)];
      const uint64_t* mine = rankBits_[static_cast<size_t>(r)].data();
      for (size_t i = 0; i < l.inputCount; ++i) {
        sb.idx[in.lo + i] = static_cast<int64_t>(i);
        std::copy(mine, mine + words_, sb.at(in.lo + i));
      }
    }
  }

  Status checkRef(int r, uint32_t i, const char* which, BufRef ref, size_t count) const {
    const RankState& st = ranks_[static_cast<size_t>(r)];
    const int b = static_cast<int>(ref.buf);
    if (b < 0 || b > 2) return fail(r, i, fmt::format("{} buffer kind {} is invalid", which, b));
    const size_t size = st.bufSize[b];
    if (ref.offset > size || count > size - ref.offset) {
      return fail(
          r, i,
          fmt::format("{} range {}[{}, {}) is out of bounds ({} has {} elements)", which,
                      bufName(ref.buf), ref.offset, ref.offset + count, bufName(ref.buf), size));
    }
    return Status::ok();
  }

  Status checkStep(int r, uint32_t i, const Step& step) const {
    const RankState& st = ranks_[static_cast<size_t>(r)];
    if (static_cast<int>(step.kind) > static_cast<int>(StepKind::kReduce)) {
      return fail(r, i, fmt::format("invalid step kind {}", static_cast<int>(step.kind)));
    }
    if (isComm(step.kind)) {
      if (step.peer < 0 || step.peer >= n_) {
        return fail(r, i, fmt::format("peer {} out of range [0, {})", step.peer, n_));
      }
      if (step.peer == r) return fail(r, i, "sends to or receives from itself (use Copy)");
      if (step.channel < 0 || step.channel >= kMaxChannels) {
        return fail(r, i, fmt::format("channel {} out of range", step.channel));
      }
    }
    if (usesSrc(step.kind)) LOOM_TRY(checkRef(r, i, "src", step.src, step.count));
    if (usesDst(step.kind)) LOOM_TRY(checkRef(r, i, "dst", step.dst, step.count));
    if (step.count == 0) return Status::ok();
    const StepAccess a = stepAccess(step, st.map);
    if (a.writes) {
      const Span& w = st.writable[static_cast<int>(a.write.space)];
      if (a.write.lo < w.lo || a.write.hi > w.hi) {
        return fail(
            r, i,
            fmt::format("writes {}[{}, {}), which it must not write (the user's input "
                        "is read-only outside the output; a non-root Reduce rank's "
                        "output is left untouched)",
                        bufName(step.dst.buf), step.dst.offset, step.dst.offset + step.count));
      }
      if (usesSrc(step.kind)) {
        const Span src = st.map.map(step.src, step.count);
        if (src.overlaps(a.write) && src.lo != a.write.lo) {
          return fail(r, i, "src and dst overlap partially");
        }
      }
    }
    return Status::ok();
  }

  static uint64_t channelKey(int from, int to, int channel) {
    return (static_cast<uint64_t>(from) << 42) | (static_cast<uint64_t>(to) << 21) |
           static_cast<uint64_t>(channel);
  }

  void wake(int r) {
    if (!queued_[static_cast<size_t>(r)]) {
      queued_[static_cast<size_t>(r)] = 1;
      work_.push_back(r);
    }
  }

  bool depsDone(const RankState& st, uint32_t i) const {
    for (uint32_t k = st.depStart[i]; k < st.depStart[i + 1]; ++k) {
      if (!st.done[st.depList[k]]) return false;
    }
    return true;
  }

  Status advance(int r) {
    RankState& st = ranks_[static_cast<size_t>(r)];
    const std::vector<Step>& steps = st.rs->steps;
    while (st.pc < steps.size() && depsDone(st, st.pc)) {
      const uint32_t i = st.pc++;
      LOOM_TRY(start(r, i));
    }
    return Status::ok();
  }

  std::string symString(const SymBuf& sb, size_t e) const {
    if (sb.idxAt(e) < 0) return "undefined";
    return fmt::format("input[{}] of ranks {}", sb.idxAt(e),
                       rankSetString(sb.bitsAt(e), words_, n_));
  }

  // out = a (op) b, element-wise reduction of symbols; returns an empty string or why it is wrong.
  std::string reduceInto(int64_t ai, const uint64_t* ab, int64_t bi, const uint64_t* bb,
                         int64_t* oi, uint64_t* ob) const {
    if (ai < 0 || bi < 0) return "reduces an undefined value";
    if (ai != bi) return fmt::format("reduces input[{}] with input[{}]", ai, bi);
    for (int w = 0; w < words_; ++w) {
      if (ab[w] & bb[w]) {
        return fmt::format("counts a rank twice: {} and {} overlap", rankSetString(ab, words_, n_),
                           rankSetString(bb, words_, n_));
      }
    }
    *oi = ai;
    for (int w = 0; w < words_; ++w) ob[w] = ab[w] | bb[w];
    return std::string();
  }

  Status start(int r, uint32_t i) {
    RankState& st = ranks_[static_cast<size_t>(r)];
    const Step& step = st.rs->steps[i];
    const size_t c = step.count;
    switch (step.kind) {
      case StepKind::kSend: {
        Message m;
        m.rank = r;
        m.step = i;
        m.count = c;
        m.src = st.map.map(step.src, c);
        Channel& ch = channels_[channelKey(r, step.peer, step.channel)];
        ch.sends.push_back(std::move(m));
        return match(ch);
      }
      case StepKind::kRecv:
      case StepKind::kRecvReduce: {
        Channel& ch = channels_[channelKey(step.peer, r, step.channel)];
        ch.recvs.emplace_back(r, i);
        return match(ch);
      }
      case StepKind::kCopy: {
        const Span src = st.map.map(step.src, c);
        const Span dst = st.map.map(step.dst, c);
        SymBuf& s = st.space[static_cast<int>(src.space)];
        SymBuf& d = st.space[static_cast<int>(dst.space)];
        if (!(src.space == dst.space && src.lo == dst.lo)) copySymbols(s, src.lo, d, dst.lo, c);
        std::fill(d.writer + dst.lo, d.writer + dst.hi, static_cast<int32_t>(i));
        st.done[i] = 1;
        return Status::ok();
      }
      case StepKind::kReduce: {
        const Span src = st.map.map(step.src, c);
        const Span dst = st.map.map(step.dst, c);
        SymBuf& s = st.space[static_cast<int>(src.space)];
        SymBuf& d = st.space[static_cast<int>(dst.space)];
        for (size_t k = 0; k < c; ++k) {
          const size_t se = src.lo + k, de = dst.lo + k;
          std::string why =
              reduceInto(d.idx[de], d.at(de), s.idxAt(se), s.bitsAt(se), &d.idx[de], d.at(de));
          if (!why.empty()) {
            return fail(
                r, i,
                fmt::format("element {} (dst {}[{}] = {}, src {}[{}] = {}): {}", k,
                            bufName(step.dst.buf), step.dst.offset + k, symString(d, de),
                            bufName(step.src.buf), step.src.offset + k, symString(s, se), why));
          }
          d.writer[de] = static_cast<int32_t>(i);
        }
        st.done[i] = 1;
        return Status::ok();
      }
    }
    return fail(r, i, "invalid step kind");
  }

  Status match(Channel& ch) {
    while (ch.sendHead < ch.sends.size() && ch.recvHead < ch.recvs.size()) {
      const Message m = std::move(ch.sends[ch.sendHead++]);
      const auto [rr, ri] = ch.recvs[ch.recvHead++];
      RankState& st = ranks_[static_cast<size_t>(rr)];
      const Step& step = st.rs->steps[ri];
      if (m.count != step.count) {
        return fail(
            rr, ri,
            fmt::format("count {} differs from the count {} of the matching send, "
                        "rank {} step {} ({})",
                        step.count, m.count, m.rank, m.step,
                        describeStep(ranks_[static_cast<size_t>(m.rank)].rs->steps[m.step])));
      }
      const size_t c = step.count;
      const Span dst = st.map.map(step.dst, c);
      SymBuf& d = st.space[static_cast<int>(dst.space)];
      const SymBuf& from = ranks_[static_cast<size_t>(m.rank)].space[static_cast<int>(m.src.space)];
      if (step.kind == StepKind::kRecv) {
        copySymbols(from, m.src.lo, d, dst.lo, c);
      } else {
        const Span src = st.map.map(step.src, c);
        SymBuf& s = st.space[static_cast<int>(src.space)];
        for (size_t k = 0; k < c; ++k) {
          const size_t se = src.lo + k, de = dst.lo + k, me = m.src.lo + k;
          std::string why = reduceInto(s.idxAt(se), s.bitsAt(se), from.idxAt(me), from.bitsAt(me),
                                       &d.idx[de], d.at(de));
          if (!why.empty()) {
            return fail(rr, ri,
                        fmt::format("element {} (src {}[{}] = {}, received from rank {} step {}: "
                                    "{}): {}",
                                    k, bufName(step.src.buf), step.src.offset + k, symString(s, se),
                                    m.rank, m.step, symString(from, me), why));
          }
        }
      }
      std::fill(d.writer + dst.lo, d.writer + dst.hi, static_cast<int32_t>(ri));
      st.done[ri] = 1;
      ranks_[static_cast<size_t>(m.rank)].done[m.step] = 1;
      wake(rr);
      wake(m.rank);
    }
    return Status::ok();
  }

  // Why a started transfer has not completed.
  std::string pendingWhy(int r, uint32_t i) const {
    const Step& step = ranks_[static_cast<size_t>(r)].rs->steps[i];
    if (step.kind == StepKind::kSend) {
      return fmt::format("rank {} never posts the matching receive from {} on channel {}",
                         step.peer, r, step.channel);
    }
    return fmt::format("rank {} never posts the matching send to {} on channel {}", step.peer, r,
                       step.channel);
  }

  Status checkFinished() const {
    std::vector<std::string> blocked, unmatched;
    size_t nBlocked = 0, nUnmatched = 0;
    for (int r = 0; r < n_; ++r) {
      const RankState& st = ranks_[static_cast<size_t>(r)];
      const uint32_t S = static_cast<uint32_t>(st.rs->steps.size());
      if (st.pc < S) {
        ++nBlocked;
        if (blocked.size() < kMaxReported) {
          std::string w;
          for (uint32_t k = st.depStart[st.pc]; k < st.depStart[st.pc + 1]; ++k) {
            const uint32_t d = st.depList[k];
            if (st.done[d]) continue;
            w = fmt::format("waits for step {} ({}): {}", d, describeStep(st.rs->steps[d]),
                            pendingWhy(r, d));
            break;
          }
          blocked.push_back(fmt::format("rank {} step {} ({}) {}", r, st.pc,
                                        describeStep(st.rs->steps[st.pc]), w));
        }
      }
      for (uint32_t i = 0; i < st.pc; ++i) {
        if (st.done[i]) continue;
        ++nUnmatched;
        if (unmatched.size() < kMaxReported) {
          unmatched.push_back(fmt::format("rank {} step {} ({}): {}", r, i,
                                          describeStep(st.rs->steps[i]), pendingWhy(r, i)));
        }
      }
    }
    auto join = [](const std::vector<std::string>& v, size_t total) {
      std::string s;
      for (const std::string& x : v) s += (s.empty() ? "" : "; ") + x;
      if (total > v.size()) s += fmt::format("; and {} more", total - v.size());
      return s;
    };
    if (nBlocked > 0) {
      return failGlobal(
          fmt::format("deadlock: {} rank(s) blocked: {}", nBlocked, join(blocked, nBlocked)));
    }
    if (nUnmatched > 0) {
      return failGlobal(
          fmt::format("{} transfer(s) never matched: {}", nUnmatched, join(unmatched, nUnmatched)));
    }
    return Status::ok();
  }

  Status checkOutputs() const {
    const CollArgs& a = s_.args;
    const size_t c = a.count;
    std::vector<uint64_t> all(static_cast<size_t>(words_), 0);
    for (int r = 0; r < n_; ++r) all[static_cast<size_t>(r / 64)] |= uint64_t{1} << (r % 64);
    for (int r = 0; r < n_; ++r) {
      if (a.coll == CollKind::kReduce && r != a.root) continue;
      const RankState& st = ranks_[static_cast<size_t>(r)];
      const size_t outCount = st.layout.outputCount;
      if (outCount == 0) continue;
      const Span out = st.map.map(BufRef{BufKind::kOutput, 0}, outCount);
      const SymBuf& sb = st.space[static_cast<int>(out.space)];
      for (size_t j = 0; j < outCount; ++j) {
        int64_t idx = static_cast<int64_t>(j);
        int single = -1;  // the one contributing rank, or -1 for all ranks
        switch (a.coll) {
          case CollKind::kAllReduce:
          case CollKind::kReduce:
            break;
          case CollKind::kBroadcast:
            single = a.root;
            break;
          case CollKind::kAllGather:
            single = static_cast<int>(j / c);
            idx = static_cast<int64_t>(j % c);
            break;
          case CollKind::kReduceScatter:
            idx = static_cast<int64_t>(static_cast<size_t>(r) * c + j);
            break;
          case CollKind::kAllToAll:
            single = static_cast<int>(j / c);
            idx = static_cast<int64_t>(static_cast<size_t>(r) * c + j % c);
            break;
          case CollKind::kSendRecv:
            break;
        }
        const uint64_t* want =
            single >= 0 ? rankBits_[static_cast<size_t>(single)].data() : all.data();
        const size_t e = out.lo + j;
        if (sb.idx[e] == idx) {
          const uint64_t* got = sb.at(e);
          int w = 0;
          while (w < words_ && got[w] == want[w]) ++w;
          if (w == words_) continue;
        }
        const int32_t w = sb.writer[e];
        return failGlobal(
            fmt::format("rank {} output[{}] is {} but should be input[{}] of ranks {} ({})", r, j,
                        symString(sb, e), idx, rankSetString(want, words_, n_),
                        w < 0 ? std::string("never written")
                              : fmt::format("last written by step {}: {}", w,
                                            describeStep(st.rs->steps[static_cast<size_t>(w)]))));
      }
    }
    return Status::ok();
  }

  const Schedule& s_;
  const int n_;
  const int words_;
  std::vector<RankState> ranks_;
  std::vector<std::vector<uint64_t>> rankBits_;  // per rank: the set {rank}
  std::unordered_map<uint64_t, Channel> channels_;
  std::vector<int> work_;
  std::vector<uint8_t> queued_;
};

}  // namespace

Status verifySchedule(const Schedule& schedule) { return Verifier(schedule).run(); }

}  // namespace loom
