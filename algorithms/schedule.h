// Schedules as data. A schedule is, per rank, an ordered list of steps over element ranges of three
// buffers (the call's input, its output, and a scratch buffer the executor allocates). The executor
// runs any schedule without knowing which algorithm made it; the verifier proves, by executing a
// schedule symbolically for every rank, that it computes its collective and cannot deadlock.
//
// Execution semantics (the executor's and the verifier's):
// - Steps start in order, but a step only waits for the earlier steps it conflicts with: those that
//   read what it writes or write what it reads or writes (element-range overlap in one buffer).
// - A Send is posted without waiting for its receiver; it completes once the matching receive is
//   posted (rendezvous). A Recv completes when the matching send has been posted.
// - Sends from rank a to rank b on one channel match b's receives from a on that channel in order;
//   matched pieces must have the same element count.
// The executor is looser than this in-order start rule: it starts each piece as soon as its own
// conflicts are resolved, keeping only each (peer, channel, direction) queue in order, and posts
// never block. Any execution the in-order rule allows is also open to it, and it can only make
// more progress, so a schedule the verifier proves deadlock-free cannot deadlock in the executor
// either (no resource bound intervenes: staging is allocated per piece).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/collective.h"
#include "src/core/status.h"

namespace loom {

// CollKind, collName and the buffer counts of each collective: src/core/collective.h.

enum class BufKind : uint8_t { kInput, kOutput, kScratch };

struct BufRef {
  BufKind buf = BufKind::kInput;
  size_t offset = 0;  // in elements
};

enum class StepKind : uint8_t {
  kSend,        // send count elements at src to peer
  kRecv,        // receive count elements from peer into dst
  kRecvReduce,  // dst[i] = src[i] (op) received[i]; src may equal dst (never overlap partially)
  kCopy,        // dst[i] = src[i]
  kReduce,      // dst[i] = dst[i] (op) src[i]
};
const char* stepKindName(StepKind kind);

struct Step {
  StepKind kind = StepKind::kCopy;
  int peer = -1;     // Send / Recv / RecvReduce
  int channel = 0;   // sends and receives match per (peer, channel)
  BufRef src;        // Send, RecvReduce (local operand), Copy, Reduce
  BufRef dst;        // Recv, RecvReduce, Copy, Reduce
  size_t count = 0;  // elements
};

// The most channels a RankLayout may ask for.
inline constexpr int kMaxLayoutChannels = 64;

// Where the ranks live, for the topology-aware generators: which host each rank is on, the order
// rings visit the ranks in, and how many channels (independent rings on disjoint parts of the
// data, NCCL's channels) the ring generators use. Immutable once created and shared between
// CollArgs copies; every rank must hold an equal layout (the same hash) for schedules to match.
class RankLayout {
 public:
  // hostOf: rank -> host index, hosts numbered 0..H-1 in order of their first rank (every index
  // used). ringOrder: a permutation of the ranks, or empty for the default order (by host, then
  // rank: each host entered and left once). channels >= 1. Fails with kInvalidArgument otherwise.
  static Result<std::shared_ptr<const RankLayout>> create(std::vector<int> hostOf,
                                                          std::vector<int> ringOrder = {},
                                                          int channels = 1);
  // One host, ranks in index order (what a null layout means), with the given channels.
  static std::shared_ptr<const RankLayout> singleHost(int nranks, int channels = 1);

  int nranks() const { return static_cast<int>(hostOf_.size()); }
  int nhosts() const { return static_cast<int>(hosts_.size()); }
  int hostOf(int rank) const { return hostOf_[static_cast<size_t>(rank)]; }
  // The ranks of a host, ascending.
  const std::vector<int>& ranksOf(int host) const { return hosts_[static_cast<size_t>(host)]; }
  // A rank's index among its host's ranks.
  int localIndex(int rank) const { return localIndex_[static_cast<size_t>(rank)]; }
  int localSize(int rank) const { return static_cast<int>(ranksOf(hostOf(rank)).size()); }
  // The largest number of ranks on one host.
  int maxLocal() const { return maxLocal_; }
  const std::vector<int>& ringOrder() const { return ringOrder_; }
  int ringPosition(int rank) const { return ringPos_[static_cast<size_t>(rank)]; }
  int channels() const { return channels_; }
  // FNV-1a of hostOf, ringOrder and channels: equal layouts hash alike (plan cache keys).
  uint64_t hash() const { return hash_; }

 private:
  RankLayout() = default;
  std::vector<int> hostOf_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> localIndex_;
  std::vector<int> ringOrder_;
  std::vector<int> ringPos_;
  int maxLocal_ = 1;
  int channels_ = 1;
  uint64_t hash_ = 0;
};

// What a generator is asked to build. count follows the public API of the collective:
// AllReduce/Broadcast/Reduce: elements per rank; AllGather: sendcount; ReduceScatter: recvcount;
// AllToAll: elements per peer.
struct CollArgs {
  CollKind coll = CollKind::kAllReduce;
  int nranks = 1;
  size_t count = 0;
  int root = 0;
  bool inPlace = false;
  // Where the ranks live; null: one host, ranks in index order, one channel. Shared, so copying
  // CollArgs stays cheap. Its nranks() must equal nranks (the verifier checks).
  std::shared_ptr<const RankLayout> layout;
};
// The layout of args, or the single-host one a null layout stands for (built on each call).
std::shared_ptr<const RankLayout> effectiveLayout(const CollArgs& args);
// The layout's hash, or 0 for a null layout.
uint64_t layoutHash(const CollArgs& args);

// Buffer sizes (elements) of one rank for a collective, and how they alias when in place:
// in place, the input is the output at inputOffsetInOutput (AllReduce, Broadcast, Reduce, AllToAll:
// 0; AllGather: rank*count), except ReduceScatter where the output is the input at
// outputOffsetInInput (rank*count).
struct BufferLayout {
  size_t inputCount = 0;
  size_t outputCount = 0;
  bool inputInOutput = false;  // in place, input aliases output + inputOffsetInOutput
  size_t inputOffsetInOutput = 0;
  bool outputInInput = false;  // in place ReduceScatter: output aliases input + offset
  size_t outputOffsetInInput = 0;
};
BufferLayout bufferLayout(const CollArgs& args, int rank);

struct RankSchedule {
  std::vector<Step> steps;
  size_t scratchCount = 0;  // elements of scratch this rank needs
};

struct Schedule {
  CollArgs args;
  std::string algorithm;
  std::vector<RankSchedule> ranks;  // one per rank
};

// A generator builds one rank's schedule; the same function serves every rank.
using Generator = RankSchedule (*)(const CollArgs& args, int rank);

struct AlgorithmInfo {
  const char* name;  // "ring", "chain", "pairwise", ...
  CollKind coll;
  Generator generate;
};
// Every registered generator.
const std::vector<AlgorithmInfo>& algorithms();
// The default algorithm for a collective (until the planner exists).
const AlgorithmInfo* defaultAlgorithm(CollKind coll);
const AlgorithmInfo* findAlgorithm(CollKind coll, const std::string& name);

Schedule buildSchedule(const AlgorithmInfo& algo, const CollArgs& args);

// Symbolic execution of every rank. OK if the final output of every rank equals the collective's
// definition (each element the right combination of the right ranks' inputs, nothing counted
// twice), every send matches a receive of equal size, and no rank can block forever; otherwise an
// error saying which rank, step and element went wrong. Also rejected: peers out of range or equal
// to the rank itself (local moves are Copy steps), ranges outside their buffer (input/output
// sizes from bufferLayout, scratch from scratchCount), src and dst that overlap partially, and
// writes the caller does not allow: the input is read-only except where it is the output (in
// place), a non-root Reduce rank's output (and, in place, its input) is never written, and a
// non-root Broadcast rank's input holds no data. Only the root's output is checked for Reduce.
// SendRecv schedules have no collective definition and are rejected.
Status verifySchedule(const Schedule& schedule);

// ---- Lowering: what the executor runs --------------------------------------------------------
// Each step split into pieces of at most pieceElems elements (the same split on both sides of a
// send), with the dependencies of each piece on earlier pieces (range conflicts) made explicit.
struct Piece {
  Step step;                   // count <= pieceElems
  std::vector<uint32_t> deps;  // indices of earlier pieces that must complete before this starts
  size_t stagingOffset = 0;  // RecvReduce: element offset of its receive area in the staging buffer
};

struct LoweredSchedule {
  std::vector<Piece> pieces;
  size_t scratchCount = 0;
  size_t stagingCount = 0;  // elements of staging the RecvReduce pieces need
};

// Lowers as if the input and output never alias (an out-of-place layout).
LoweredSchedule lowerSchedule(const RankSchedule& rs, size_t pieceElems);
// Lowers with the rank's buffer layout, so that in place the input and output ranges that alias
// are seen to conflict. Contracts of both: steps of count 0 produce no piece; a step of count c
// becomes ceil(c / pieceElems) pieces, in order, all of pieceElems elements but the last (the
// split depends only on c, so both sides of a transfer split alike); pieceElems 0 means no
// split. deps are reduced (the last writer of each overlapping region and the readers since):
// waiting for them implies every earlier conflicting piece has completed. Each RecvReduce piece
// gets its own staging area [stagingOffset, stagingOffset + count).
LoweredSchedule lowerSchedule(const RankSchedule& rs, const BufferLayout& layout,
                              size_t pieceElems);

}  // namespace loom
