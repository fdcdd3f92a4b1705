#include "src/runtime/run.h"

#include "src/core/dtype.h"
#include "src/runtime/comm.h"
#include "src/runtime/low_latency.h"
#include "src/runtime/one_pass.h"
#include "transports/shm/shared_alloc.h"

namespace loom {

MemKind memKindOf(const void* p, size_t bytes) {
  shm::SharedRef ref;
  if (p && bytes && shm::findShared(p, bytes, &ref)) return MemKind::kHostShared;
  return MemKind::kHost;
}

CallShape shapeOf(const OpArgs& op, int nranks, bool grouped) {
  CallShape s;
  s.coll = op.coll;
  s.count = op.count;
  s.dtype = op.dtype;
  s.op = op.op;
  s.root = op.root;
  s.inPlace = op.inPlace;
  s.grouped = grouped;
  const size_t es = dataTypeSize(op.dtype);
  const CollCounts c = collCounts(op.coll, op.count, nranks);
  s.sendKind = memKindOf(op.sendbuff, c.input * es);
  s.recvKind = memKindOf(op.recvbuff, c.output * es);
  return s;
}

Status runCalls(const std::vector<QueuedOp>& calls) {
  if (calls.empty()) return Status();
  const bool grouped = calls.size() > 1;
  std::vector<QueuedOp> scheduled;
  scheduled.reserve(calls.size());
  for (const QueuedOp& q : calls) {
    Comm* comm = q.comm;
    Result<Decision> d = comm->decide(shapeOf(q.args, comm->nranks(), grouped));
    if (!d.isOk()) {
      comm->fail(d.status());
      return d.status();
    }
    const Decision& dec = d.value();
    if (dec.path == Path::kLowLatency) return runLowLatency(comm, q.args);
    if (dec.path == Path::kOnePass && comm->onePassAttemptDue()) {
      bool ran = false;
      LOOM_TRY(runOnePass(comm, q.args, dec, &ran));
      comm->noteOnePassAttempt(ran);
      if (ran) return Status();
    }
    scheduled.push_back({comm, q.args, dec.algorithm});
  }
  return executeOps(scheduled);
}

}  // namespace loom
