#include "src/runtime/run.h"

#include "src/core/dtype.h"
#include "src/runtime/comm.h"
#include "src/runtime/low_latency.h"
#include "src/runtime/one_pass.h"
#include "transports/shm/shared_alloc.h"

namespace loom {

void findSharedKinds(const OpArgs& op, int nranks, CallShape* s) {
  const size_t es = dataTypeSize(op.dtype);
  const CollCounts c = collCounts(op.coll, op.count, nranks);
  s->sendKind = memKindOf(op.sendbuff, c.input * es);
  s->recvKind = memKindOf(op.recvbuff, c.output * es);
}

Status runCall(Comm* comm, const OpArgs& op) {
  // Peers of the host read it when their calls and this one differ (differentCalls).
  comm->noteCall(callNote(op));
  const CallShape shape = shapeOf(op, comm->nranks(), /*grouped=*/false);
  // The exchange's offer first: a small call it takes is decided without building a Decision.
  LOOM_ASSIGN(const DispatchFacts* facts, comm->dispatchFacts());
  if (lowLatencyTakes(shape, *facts)) return runLowLatency(comm, op, shape);
  LOOM_ASSIGN(Decision d, comm->decide(shape));
  switch (d.path) {
    case Path::kLowLatency:
      return runLowLatency(comm, op, shape);
    case Path::kOnePass:
      if (comm->onePassAttemptDue()) {
        bool ran = false;
        LOOM_TRY(runOnePass(comm, op, d, &ran));
        comm->noteOnePassAttempt(ran);
        if (ran) return Status();
      }
      break;
    case Path::kSchedule:
      break;
  }
  return executeOps({QueuedOp{comm, op, std::move(d.algorithm)}});
}

Status runCalls(const std::vector<QueuedOp>& calls) {
  if (calls.empty()) return Status();
  if (calls.size() == 1) return runCall(calls[0].comm, calls[0].args);
  CallNote group;
  group.coll = CallNote::kGroup;
  group.count = calls.size();
  for (const QueuedOp& q : calls) q.comm->noteCall(group);
  std::vector<QueuedOp> scheduled;
  scheduled.reserve(calls.size());
  for (const QueuedOp& q : calls) {
    LOOM_ASSIGN(Decision d, q.comm->decide(shapeOf(q.args, q.comm->nranks(), /*grouped=*/true)));
    scheduled.push_back({q.comm, q.args, std::move(d.algorithm)});
  }
  return executeOps(scheduled);
}

}  // namespace loom
