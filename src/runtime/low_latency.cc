#include "src/runtime/low_latency.h"

#include <cstring>

#include "src/core/dtype.h"
#include "src/reduce/reduce.h"
#include "src/runtime/comm.h"
#include "src/runtime/run.h"
#include "transports/shm/host_group.h"

namespace loom {

Status runLowLatency(Comm* comm, const OpArgs& op, const CallShape& shape) {
  shm::LowLatencyExchange& ll = comm->shm()->exchange();
  int n = comm->nranks();
  int me = comm->rank();
  size_t es = dataTypeSize(op.dtype);
  size_t bytes = lowLatencyBytes(shape, me, n);
  uint64_t seq = comm->nextLlSeq();
  uint64_t signature = opSignature(op);
  Status st =
      ll.round(seq, op.sendbuff, bytes, signature, callNote(op), comm->spinNs(), comm->timeoutMs());
  if (!st.isOk()) {
    st = comm->explainLocalWait(st, std::string(collName(op.coll)) + " (low-latency path)");
    comm->fail(st);
    return st;
  }
  // The shared memory is indexed by local rank, which is the rank here (all ranks are local).
  auto in = [&](int r) -> const char* { return ll.buffer(r, seq); };
  char* out = static_cast<char*>(op.recvbuff);
  loomRedOp_t rop = op.op == loomAvg ? loomSum : op.op;
  auto reduceInto = [&](char* dst, size_t offset, size_t count) {
    if (n == 1) {
      std::memcpy(dst, in(0) + offset, count * es);
      return;
    }
    reduceBuffers(dst, in(0) + offset, in(1) + offset, count, op.dtype, rop);
    for (int r = 2; r < n; ++r) reduceBuffers(dst, dst, in(r) + offset, count, op.dtype, rop);
    if (op.op == loomAvg) finishAverage(dst, count, op.dtype, n);
  };
  switch (op.coll) {
    case CollKind::kAllReduce:
      reduceInto(out, 0, op.count);
      break;
    case CollKind::kReduce:
      if (me == op.root) reduceInto(out, 0, op.count);
      break;
    case CollKind::kBroadcast:
      if (me != op.root)
        std::memcpy(out, in(op.root), op.count * es);
      else if (out != op.sendbuff)
        std::memcpy(out, op.sendbuff, op.count * es);
      break;
    case CollKind::kAllGather:
      for (int r = 0; r < n; ++r) {
        char* dst = out + static_cast<size_t>(r) * op.count * es;
        if (dst != in(r)) std::memcpy(dst, in(r), op.count * es);
      }
      break;
    case CollKind::kReduceScatter:
      reduceInto(out, static_cast<size_t>(me) * op.count * es, op.count);
      break;
    case CollKind::kAllToAll:
      for (int r = 0; r < n; ++r)
        std::memcpy(out + static_cast<size_t>(r) * op.count * es,
                    in(r) + static_cast<size_t>(me) * op.count * es, op.count * es);
      break;
    default:
      return LOOM_ERROR(kInternal, "{} has no low-latency path", collName(op.coll));
  }
  return Status();
}

}  // namespace loom
