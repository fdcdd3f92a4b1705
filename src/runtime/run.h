// Runs calls the way dispatch decided (src/runtime/dispatch.h): the low-latency exchange, the one
// pass over the peers' buffers (falling back to the decision's schedule when the buffers cannot be
// reached), or the decision's schedule on the executor. The C API's calls and groups come here
// once validated.
#pragma once

#include <vector>

#include "src/core/memory_kind.h"
#include "src/core/status.h"
#include "src/runtime/dispatch.h"
#include "src/runtime/executor.h"
#include "transports/shm/shared_alloc.h"

namespace loom {

class Comm;

// The kind of memory [p, p + bytes) lives in (host memory, or loomMemAlloc's).
inline MemKind memKindOf(const void* p, size_t bytes) {
  shm::SharedRef ref;
  if (p && bytes && shm::liveSharedAllocations() != 0 && shm::findShared(p, bytes, &ref))
    return MemKind::kHostShared;
  return MemKind::kHost;
}

// Sets s's memory kinds from op's buffers (they are host memory, unless loomMemAlloc's).
void findSharedKinds(const OpArgs& op, int nranks, CallShape* s);

// The shape dispatch reads of op (grouped: one of several calls of a group), with the kinds of its
// buffers. (Inline: every call makes one; the buffers' kinds are looked up only while loomMemAlloc
// memory exists.)
inline CallShape shapeOf(const OpArgs& op, int nranks, bool grouped) {
  CallShape s;
  s.coll = op.coll;
  s.count = op.count;
  s.dtype = op.dtype;
  s.op = op.op;
  s.root = op.root;
  s.inPlace = op.inPlace;
  s.grouped = grouped;
  if (shm::liveSharedAllocations() != 0) findSharedKinds(op, nranks, &s);
  return s;
}

// Runs one call (not in a group, or alone in one) along its decision's path, to completion.
// On failure the communicator is marked failed and the error returned.
Status runCall(Comm* comm, const OpArgs& op);
// Runs the calls of a group (on one or several communicators) to completion: several calls run
// on their schedules, together; a single one as runCall. On failure the communicator involved
// is marked failed and the first error is returned.
Status runCalls(const std::vector<QueuedOp>& calls);

}  // namespace loom
