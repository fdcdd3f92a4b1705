// The collectives and the one place where each one's buffer sizes are defined: every layer (the
// C API's checks, dispatch, the paths, the schedule generators' buffer layouts, the planner) asks
// here how many elements each buffer of a call holds and which buffers a rank touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

enum class CollKind : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,  // point-to-point: built by the runtime, not by a generator
};
const char* collName(CollKind kind);
// The collectives (every kind but SendRecv), in enum order.
extern const CollKind kCollectives[6];
// How LOOM_ALGO and tuning files name a collective: collName in lower case ("allreduce").
std::string collSpecName(CollKind kind);
// The collective whose collSpecName is name, ignoring case; false for any other name.
bool collFromSpecName(const std::string& name, CollKind* out);

// What one rank called, as ranks compare it to say how their calls differ. 16 bytes of plain
// data: ranks of a host read each other's in shared memory.
struct CallNote {
  uint8_t coll = kNoCall;  // CollKind; kNoCall: none (yet); kGroup: a group of `count` calls
  uint8_t dtype = 0;       // loomDataType_t
  uint8_t op = 0;          // loomRedOp_t, for the collectives that reduce
  uint8_t isSend = 0;      // SendRecv: a send (1) or a receive (0)
  int32_t root = -1;       // the root of Broadcast and Reduce; SendRecv: the peer
  uint64_t count = 0;      // the count the C call takes
  static constexpr uint8_t kNoCall = 0xff;
  static constexpr uint8_t kGroup = 0xfe;
  bool operator==(const CallNote& o) const {
    return coll == o.coll && dtype == o.dtype && op == o.op && isSend == o.isSend &&
           root == o.root && count == o.count;
  }
};
static_assert(sizeof(CallNote) == 16, "CallNote is shared between processes");

// "AllReduce of 1024 float (sum)", "Broadcast of 64 int8 from root 2", "Send of 8 float to rank 1".
std::string describeCall(const CallNote& call);
// The one message of calls that differ between ranks, whichever path found it: "calls differ
// between ranks: rank 1 called AllReduce of 1000 float (sum); rank 0 called AllReduce of 1024
// float (sum)". theirs may be null (that rank's call is not known here, only that its message or
// signature belongs to another call).
std::string differentCalls(int theirRank, const CallNote* theirs, int myRank, const CallNote& mine);

// AllReduce, Reduce and ReduceScatter combine the ranks' data with an op.
inline bool collReduces(CollKind kind) {
  return kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
         kind == CollKind::kReduceScatter;
}
// Broadcast and Reduce have a root.
inline bool collRooted(CollKind kind) {
  return kind == CollKind::kBroadcast || kind == CollKind::kReduce;
}

// Elements of a rank's send buffer (input) and receive buffer (output) for one call. count is the
// count the C call takes: AllReduce / Broadcast / Reduce: elements per rank; AllGather: sendcount;
// ReduceScatter: recvcount; AllToAll: elements per peer; SendRecv: the message.
struct CollCounts {
  size_t input = 0;
  size_t output = 0;
};
// (Inline: every call's checks and every small call's dispatch read them.)
inline CollCounts collCounts(CollKind kind, size_t count, int nranks) {
  const size_t n = static_cast<size_t>(nranks > 1 ? nranks : 1);
  switch (kind) {
    case CollKind::kAllGather:
      return {count, n * count};
    case CollKind::kReduceScatter:
      return {n * count, count};
    case CollKind::kAllToAll:
      return {n * count, n * count};
    default:
      return {count, count};
  }
}
// The size the tuning files, logs and nccl-tests' "size" column speak of, in elements: the larger
// buffer (the whole buffer for AllGather, ReduceScatter and AllToAll).
inline size_t collCallCount(CollKind kind, size_t count, int nranks) {
  CollCounts c = collCounts(kind, count, nranks);
  return c.input > c.output ? c.input : c.output;
}

// Whether `rank` reads its send buffer / writes its receive buffer: a Broadcast's non-roots pass
// no input, a Reduce's non-roots no output, a send has only an input and a receive only an output.
inline bool collUsesInput(CollKind kind, int rank, int root, bool isSend) {
  if (kind == CollKind::kBroadcast) return rank == root;
  if (kind == CollKind::kSendRecv) return isSend;
  return true;
}
inline bool collUsesOutput(CollKind kind, int rank, int root, bool isSend) {
  if (kind == CollKind::kReduce) return rank == root;
  if (kind == CollKind::kSendRecv) return !isSend;
  return true;
}

// In place, the smaller buffer is a block of the larger one: the offset (elements) of rank's
// block. AllGather: the input is block `rank` of the output; ReduceScatter: the output is block
// `rank` of the input; every other collective: the same buffer (0).
inline size_t collInPlaceOffset(CollKind kind, size_t count, int rank) {
  if (kind == CollKind::kAllGather || kind == CollKind::kReduceScatter)
    return static_cast<size_t>(rank > 0 ? rank : 0) * count;
  return 0;
}

}  // namespace loom
