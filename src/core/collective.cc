#include "src/core/collective.h"

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

}  // namespace loom
