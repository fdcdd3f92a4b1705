#include "src/core/collective.h"

#include <algorithm>

#include "src/core/text.h"

namespace loom {

const char* collName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce:
      return "AllReduce";
    case CollKind::kBroadcast:
      return "Broadcast";
    case CollKind::kReduce:
      return "Reduce";
    case CollKind::kAllGather:
      return "AllGather";
    case CollKind::kReduceScatter:
      return "ReduceScatter";
    case CollKind::kAllToAll:
      return "AllToAll";
    case CollKind::kSendRecv:
      return "SendRecv";
  }
  return "unknown";
}

const CollKind kCollectives[6] = {CollKind::kAllReduce,     CollKind::kBroadcast,
                                  CollKind::kReduce,        CollKind::kAllGather,
                                  CollKind::kReduceScatter, CollKind::kAllToAll};

std::string collSpecName(CollKind kind) { return asciiLower(collName(kind)); }

bool collFromSpecName(const std::string& name, CollKind* out) {
  const std::string want = asciiLower(name);
  for (CollKind c : kCollectives)
    if (collSpecName(c) == want) {
      *out = c;
      return true;
    }
  return false;
}

bool collReduces(CollKind kind) {
  return kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
         kind == CollKind::kReduceScatter;
}

bool collRooted(CollKind kind) { return kind == CollKind::kBroadcast || kind == CollKind::kReduce; }

CollCounts collCounts(CollKind kind, size_t count, int nranks) {
  const size_t n = static_cast<size_t>(std::max(nranks, 1));
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

size_t collCallCount(CollKind kind, size_t count, int nranks) {
  CollCounts c = collCounts(kind, count, nranks);
  return std::max(c.input, c.output);
}

bool collUsesInput(CollKind kind, int rank, int root, bool isSend) {
  if (kind == CollKind::kBroadcast) return rank == root;
  if (kind == CollKind::kSendRecv) return isSend;
  return true;
}

bool collUsesOutput(CollKind kind, int rank, int root, bool isSend) {
  if (kind == CollKind::kReduce) return rank == root;
  if (kind == CollKind::kSendRecv) return !isSend;
  return true;
}

size_t collInPlaceOffset(CollKind kind, size_t count, int rank) {
  if (kind == CollKind::kAllGather || kind == CollKind::kReduceScatter)
    return static_cast<size_t>(std::max(rank, 0)) * count;
  return 0;
}

}  // namespace loom
