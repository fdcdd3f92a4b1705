// The executor: runs the schedules dispatch chose (src/runtime/dispatch.h), compiled into pieces
// with dependencies, over each communicator's transport table (Comm::transportFor): it knows no
// algorithm and no transport by name. Several operations, on one or several communicators, run
// together in one progress loop (a group); on each communicator they are posted in issue order, so
// sends and receives between two ranks match in the order the user issued them.
//
// Threads: executeOps runs on the calling thread and returns when every operation is complete or
// failed; it starts no thread and keeps nothing between calls but the communicators' schedule
// caches (locked). The communicators it is given belong to that thread for the call (the API's
// one-thread rule: include/loom/loom.h); loomCommAbort from another thread wakes it.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/schedule.h"
#include "loom/loom.h"
#include "src/core/cache_key.h"
#include "src/core/status.h"

namespace loom {

class Comm;

// One operation as the user issued it (already validated).
struct OpArgs {
  CollKind coll = CollKind::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  loomDataType_t dtype = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = 0;
  int peer = -1;        // kSendRecv: the peer
  bool isSend = false;  // kSendRecv: send (true) or receive
  bool inPlace = false;
  // The datatype and op exactly as the C caller passed them, before validation: a C caller may pass
  // any int, which C++ must not load as the enum type (it would be undefined behaviour).
  int rawDtype = 0;
  int rawOp = 0;
};

// A hash of what every rank must agree on for a collective: kind, count, datatype, and the op and
// root where they matter. Ranks compare it to detect mismatched calls.
uint64_t opSignature(const OpArgs& op);
// What the call is, as ranks compare it to say how their calls differ (differentCalls).
CallNote callNote(const OpArgs& op);

// A lowered schedule with its dependency graph in CSR form, shared by every call with the same
// shape. Immutable once built.
struct CompiledSchedule {
  CollArgs args;
  std::string algorithm;
  BufferLayout layout;
  LoweredSchedule lowered;
  std::vector<uint32_t> depCount;         // per piece: number of deps
  std::vector<uint32_t> dependentsStart;  // CSR: dependents of piece i are
  std::vector<uint32_t> dependents;       //   dependents[dependentsStart[i] .. [i+1])
  bool touchesOutput = false;
  bool touchesInput = false;
};

// Per-communicator cache of compiled schedules (LRU).
class ScheduleCache {
 public:
  // layout: where the ranks live (Comm::rankLayout; null: one host), part of the cache key.
  Result<std::shared_ptr<const CompiledSchedule>> get(
      const OpArgs& op, int rank, int nranks, const std::shared_ptr<const RankLayout>& layout,
      const std::string& algorithm, size_t pieceBytes);

 private:
  std::mutex mu_;
  std::list<std::pair<CacheKey, std::shared_ptr<const CompiledSchedule>>> lru_;
  std::unordered_map<CacheKey, decltype(lru_)::iterator, CacheKeyHash> index_;
};

// True when the byte ranges [a, a+na) and [b, b+nb) share a byte (null or empty ranges never do).
bool rangesOverlap(const void* a, size_t na, const void* b, size_t nb);

// True when recv is a receive and send a send (calls of one group) whose send buffer shares a byte
// with the receive's buffer: executeOps then receives into a copy, after the send has read.
bool receiveOverlapsSend(const OpArgs& recv, const OpArgs& send);

// The scratch bytes a call of args on schedule s takes from its communicator's scratch (the device
// scratch for a call on device memory), as executeOps lays it out: the schedule's scratch and
// staging, a stand-in for a buffer the call does not pass that the schedule touches, and, where a
// receive overlaps a send of its group (blocked), a copy of the receive.
size_t scheduleScratchBytes(const CompiledSchedule& s, const OpArgs& args, bool blocked);

// One call to run on a schedule: what the user issued and the algorithm dispatch chose for it
// ("p2p" for Send/Recv).
struct QueuedOp {
  Comm* comm = nullptr;
  OpArgs args;
  std::string algorithm;
  void* stream = nullptr;  // the user's CUDA stream (null: done on return)
  int device = -1;         // the CUDA device of its buffers (-1: host memory)
  // Which of its buffers are CUDA device memory, as found when the call was made (a buffer freed
  // before an enqueued call runs then faults on the device, as with NCCL, instead of being read
  // by the host).
  bool inDevice = false, outDevice = false;
  loomComm_t handle = nullptr;  // the caller's handle (whether it was aborted since it was queued)
};

// Runs the ops to completion (or failure, abort, or LOOM_TIMEOUT without progress). On failure the
// communicator involved is marked failed (Comm::fail) and the first error is returned.
Status executeOps(const std::vector<QueuedOp>& ops);

}  // namespace loom
