#include "src/core/collective.h"

#include <fmt/format.h>

#include "src/core/dtype.h"
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

std::string describeCall(const CallNote& c) {
  if (c.coll == CallNote::kGroup) return fmt::format("a group of {} calls", c.count);
  if (c.coll > static_cast<uint8_t>(CollKind::kSendRecv)) return "no collective";
  const auto kind = static_cast<CollKind>(c.coll);
  const char* dtName =
      validDataType(c.dtype) ? dataTypeName(static_cast<loomDataType_t>(c.dtype)) : "?";
  if (kind == CollKind::kSendRecv)
    return fmt::format("{} of {} {} {} rank {}", c.isSend ? "Send" : "Recv", c.count, dtName,
                       c.isSend ? "to" : "from", c.root);
  std::string out = fmt::format("{} of {} {}", collName(kind), c.count, dtName);
  if (collReduces(kind))
    out += fmt::format(" ({})", validRedOp(c.op) ? redOpName(static_cast<loomRedOp_t>(c.op)) : "?");
  if (kind == CollKind::kBroadcast) out += fmt::format(" from root {}", c.root);
  if (kind == CollKind::kReduce) out += fmt::format(" to root {}", c.root);
  return out;
}

std::string differentCalls(int theirRank, const CallNote* theirs, int myRank,
                           const CallNote& mine) {
  std::string mineText = fmt::format("rank {} called {}", myRank, describeCall(mine));
  if (!theirs || theirs->coll == CallNote::kNoCall)
    return fmt::format(
        "calls differ between ranks: {}; what rank {} sent or published belongs to another call "
        "(a different collective, count, datatype, op or root)",
        mineText, theirRank);
  if (*theirs == mine)
    return fmt::format(
        "calls differ between ranks: {} and so did rank {}, but on another path or step (the "
        "ranks disagree on the algorithm or on a parameter read at init)",
        mineText, theirRank);
  return fmt::format("calls differ between ranks: rank {} called {}; {}", theirRank,
                     describeCall(*theirs), mineText);
}

}  // namespace loom
