#include "tools/perf/collectives.h"

namespace loom {
namespace perf {
namespace {

constexpr CollInfo kInfos[] = {
    {CollKind::kAllReduce, "all_reduce", true, false},
    {CollKind::kAllGather, "all_gather", false, false},
    {CollKind::kReduceScatter, "reduce_scatter", true, false},
    {CollKind::kBroadcast, "broadcast", false, true},
    {CollKind::kReduce, "reduce", true, true},
    {CollKind::kAllToAll, "alltoall", false, false},
    {CollKind::kSendRecv, "sendrecv", false, false},
};

// Per-rank count of the collectives whose size is the whole buffer, rounded down to 16 bytes as
// nccl-tests does.
size_t perRankCount(size_t count, size_t elSize, int nranks) {
  size_t align = elSize < 16 ? 16 / elSize : 1;
  return (count / static_cast<size_t>(nranks)) / align * align;
}

}  // namespace

const CollInfo& collInfo(CollKind kind) {
  for (const auto& info : kInfos)
    if (info.kind == kind) return info;
  return kInfos[0];
}

CollCounts collCounts(CollKind kind, size_t bytes, size_t elSize, int nranks) {
  size_t count = bytes / elSize;
  size_t n = static_cast<size_t>(nranks);
  CollCounts c;
  switch (kind) {
    case CollKind::kAllGather: {
      size_t base = perRankCount(count, elSize, nranks);
      c.sendCount = base;
      c.recvCount = base * n;
      c.paramCount = base;
      c.sendInplaceOffset = base;
      break;
    }
    case CollKind::kReduceScatter: {
      size_t base = perRankCount(count, elSize, nranks);
      c.sendCount = base * n;
      c.recvCount = base;
      c.paramCount = base;
      c.recvInplaceOffset = base;
      break;
    }
    case CollKind::kAllToAll: {
      size_t base = perRankCount(count, elSize, nranks);
      c.sendCount = base * n;
      c.recvCount = base * n;
      c.paramCount = base;
      break;
    }
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
    case CollKind::kSendRecv:
      c.sendCount = count;
      c.recvCount = count;
      c.paramCount = count;
      break;
  }
  return c;
}

void collBandwidth(CollKind kind, size_t paramCount, size_t elSize, double sec, int nranks,
                   double* algBw, double* busBw) {
  double n = nranks;
  double bytes = static_cast<double>(paramCount) * static_cast<double>(elSize);
  double factor = 1;
  switch (kind) {
    case CollKind::kAllReduce:
      factor = 2 * (n - 1) / n;
      break;
    case CollKind::kAllGather:
    case CollKind::kReduceScatter:
    case CollKind::kAllToAll:
      bytes *= n;  // counted over the whole gathered buffer
      factor = (n - 1) / n;
      break;
    case CollKind::kBroadcast:
    case CollKind::kReduce:
    case CollKind::kSendRecv:
      break;
  }
  *algBw = sec > 0 ? bytes / 1.0e9 / sec : 0;
  *busBw = *algBw * factor;
}

loomResult_t runColl(const CollCall& c, const char** what) {
  switch (c.kind) {
    case CollKind::kAllReduce:
      *what = "loomAllReduce";
      return loomAllReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm, c.stream);
    case CollKind::kAllGather:
      *what = "loomAllGather";
      return loomAllGather(c.sendbuff, c.recvbuff, c.count, c.type, c.comm, c.stream);
    case CollKind::kReduceScatter:
      *what = "loomReduceScatter";
      return loomReduceScatter(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.comm, c.stream);
    case CollKind::kBroadcast:
      *what = "loomBroadcast";
      return loomBroadcast(c.sendbuff, c.recvbuff, c.count, c.type, c.root, c.comm, c.stream);
    case CollKind::kReduce:
      *what = "loomReduce";
      return loomReduce(c.sendbuff, c.recvbuff, c.count, c.type, c.op, c.root, c.comm, c.stream);
    case CollKind::kAllToAll:
      *what = "loomAllToAll";
      return loomAllToAll(c.sendbuff, c.recvbuff, c.count, c.type, c.comm, c.stream);
    case CollKind::kSendRecv: {
      // Rank r sends to r+1 and receives from r-1, as nccl-tests' sendrecv_perf.
      int next = (c.rank + 1) % c.nranks;
      int prev = (c.rank - 1 + c.nranks) % c.nranks;
      *what = "loomGroupStart";
      loomResult_t res = loomGroupStart();
      if (res != loomSuccess) return res;
      *what = "loomSend";
      res = loomSend(c.sendbuff, c.count, c.type, next, c.comm, c.stream);
      if (res == loomSuccess) {
        *what = "loomRecv";
        res = loomRecv(c.recvbuff, c.count, c.type, prev, c.comm, c.stream);
      }
      // The group must be closed even after a failure inside it.
      loomResult_t end = loomGroupEnd();
      if (res != loomSuccess) return res;
      *what = "loomGroupEnd";
      return end;
    }
  }
  *what = "unknown collective";
  return loomInvalidArgument;
}

}  // namespace perf
}  // namespace loom
