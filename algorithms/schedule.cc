// Names, buffer layouts, the registry of generators and buildSchedule.
#include "algorithms/schedule.h"

#include "algorithms/generators.h"

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

const char* stepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kSend:
      return "Send";
    case StepKind::kRecv:
      return "Recv";
    case StepKind::kRecvReduce:
      return "RecvReduce";
    case StepKind::kCopy:
      return "Copy";
    case StepKind::kReduce:
      return "Reduce";
  }
  return "unknown";
}

BufferLayout bufferLayout(const CollArgs& args, int rank) {
  BufferLayout l;
  const size_t n = static_cast<size_t>(args.nranks > 0 ? args.nranks : 1);
  const size_t c = args.count;
  const size_t r = rank < 0 ? 0 : static_cast<size_t>(rank);
  switch (args.coll) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
    case CollKind::kSendRecv:
      l.inputCount = c;
      l.outputCount = c;
      l.inputInOutput = args.inPlace;
      break;
    case CollKind::kAllGather:
      l.inputCount = c;
      l.outputCount = n * c;
      l.inputInOutput = args.inPlace;
      l.inputOffsetInOutput = args.inPlace ? r * c : 0;
      break;
    case CollKind::kReduceScatter:
      l.inputCount = n * c;
      l.outputCount = c;
      l.outputInInput = args.inPlace;
      l.outputOffsetInInput = args.inPlace ? r * c : 0;
      break;
    case CollKind::kAllToAll:
      l.inputCount = n * c;
      l.outputCount = n * c;
      l.inputInOutput = args.inPlace;
      break;
  }
  return l;
}

const std::vector<AlgorithmInfo>& algorithms() {
  // The first entry of each collective is its default.
  static const std::vector<AlgorithmInfo> kAlgorithms = {
      {"ring", CollKind::kAllReduce, ringAllReduce},
      {"rd", CollKind::kAllReduce, recursiveDoublingAllReduce},
      {"chain", CollKind::kBroadcast, chainBroadcast},
      {"chain", CollKind::kReduce, chainReduce},
      {"ring", CollKind::kAllGather, ringAllGather},
      {"ring", CollKind::kReduceScatter, ringReduceScatter},
      {"pairwise", CollKind::kAllToAll, pairwiseAllToAll},
      {"direct", CollKind::kAllReduce, directAllReduce},
      {"direct", CollKind::kReduceScatter, directReduceScatter},
      {"direct", CollKind::kAllGather, directAllGather},
      {"direct", CollKind::kBroadcast, directBroadcast},
      {"direct", CollKind::kReduce, directReduce},
      {"binomial", CollKind::kBroadcast, binomialBroadcast},
      {"binomial", CollKind::kReduce, binomialReduce},
      {"bruck", CollKind::kAllGather, bruckAllGather},
      {"tree", CollKind::kAllReduce, treeAllReduce},
      {"rhd", CollKind::kAllReduce, rhdAllReduce},
      {"rhd", CollKind::kReduceScatter, rhdReduceScatter},
      {"rhd", CollKind::kAllGather, rhdAllGather},
      {"bruck", CollKind::kAllToAll, bruckAllToAll},
  };
  return kAlgorithms;
}

const AlgorithmInfo* defaultAlgorithm(CollKind coll) {
  for (const AlgorithmInfo& a : algorithms()) {
    if (a.coll == coll) return &a;
  }
  return nullptr;
}

const AlgorithmInfo* findAlgorithm(CollKind coll, const std::string& name) {
  for (const AlgorithmInfo& a : algorithms()) {
    if (a.coll == coll && name == a.name) return &a;
  }
  return nullptr;
}

Schedule buildSchedule(const AlgorithmInfo& algo, const CollArgs& args) {
  Schedule s;
  s.args = args;
  s.algorithm = algo.name;
  s.ranks.reserve(args.nranks > 0 ? static_cast<size_t>(args.nranks) : 0);
  for (int r = 0; r < args.nranks; ++r) s.ranks.push_back(algo.generate(args, r));
  return s;
}

}  // namespace loom
