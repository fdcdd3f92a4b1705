// Names, buffer layouts, the registry of generators and buildSchedule.
#include "algorithms/schedule.h"

#include <algorithm>
#include <utility>

#include "algorithms/generators.h"
#include "src/core/hash.h"

namespace loom {

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
  const CollCounts c = collCounts(args.coll, args.count, args.nranks);
  l.inputCount = c.input;
  l.outputCount = c.output;
  if (args.coll == CollKind::kReduceScatter) {
    l.outputInInput = args.inPlace;
    l.outputOffsetInInput = args.inPlace ? collInPlaceOffset(args.coll, args.count, rank) : 0;
  } else {
    l.inputInOutput = args.inPlace;
    l.inputOffsetInOutput = args.inPlace ? collInPlaceOffset(args.coll, args.count, rank) : 0;
  }
  return l;
}

Result<std::shared_ptr<const RankLayout>> RankLayout::create(std::vector<int> hostOf,
                                                             std::vector<int> ringOrder,
                                                             int channels) {
  const int n = static_cast<int>(hostOf.size());
  if (n < 1) return LOOM_ERROR(kInvalidArgument, "rank layout: no ranks");
  if (channels < 1 || channels > kMaxLayoutChannels) {
    return LOOM_ERROR(kInvalidArgument, "rank layout: {} channels (1 to {})", channels,
                      kMaxLayoutChannels);
  }
  std::shared_ptr<RankLayout> l(new RankLayout());
  l->localIndex_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int h = hostOf[static_cast<size_t>(r)];
    if (h < 0 || h > l->nhosts()) {
      return LOOM_ERROR(kInvalidArgument,
                        "rank layout: rank {} is on host {}; hosts must be numbered 0, 1, ... in "
                        "order of their first rank",
                        r, h);
    }
    if (h == l->nhosts()) l->hosts_.emplace_back();
    auto& ranks = l->hosts_[static_cast<size_t>(h)];
    l->localIndex_[static_cast<size_t>(r)] = static_cast<int>(ranks.size());
    ranks.push_back(r);
    l->maxLocal_ = std::max(l->maxLocal_, static_cast<int>(ranks.size()));
  }
  if (ringOrder.empty()) {
    for (const auto& ranks : l->hosts_)
      ringOrder.insert(ringOrder.end(), ranks.begin(), ranks.end());
  }
  if (ringOrder.size() != hostOf.size()) {
    return LOOM_ERROR(kInvalidArgument, "rank layout: ring order of {} ranks for {} ranks",
                      ringOrder.size(), n);
  }
  l->ringPos_.assign(static_cast<size_t>(n), -1);
  for (int p = 0; p < n; ++p) {
    const int r = ringOrder[static_cast<size_t>(p)];
    if (r < 0 || r >= n || l->ringPos_[static_cast<size_t>(r)] >= 0) {
      return LOOM_ERROR(kInvalidArgument, "rank layout: ring order is not a permutation of 0..{}",
                        n - 1);
    }
    l->ringPos_[static_cast<size_t>(r)] = p;
  }
  Fnv64 h;
  h.mix(static_cast<uint64_t>(n)).mix(static_cast<uint64_t>(channels));
  for (int x : hostOf) h.mix(static_cast<uint64_t>(x));
  for (int x : ringOrder) h.mix(static_cast<uint64_t>(x));
  l->hostOf_ = std::move(hostOf);
  l->ringOrder_ = std::move(ringOrder);
  l->channels_ = channels;
  l->hash_ = h.value();
  return std::shared_ptr<const RankLayout>(std::move(l));
}

std::shared_ptr<const RankLayout> RankLayout::singleHost(int nranks, int channels) {
  Result<std::shared_ptr<const RankLayout>> l = create(
      std::vector<int>(static_cast<size_t>(std::max(nranks, 1)), 0), {}, std::max(channels, 1));
  return l.value();
}

std::shared_ptr<const RankLayout> effectiveLayout(const CollArgs& args) {
  return args.layout ? args.layout : RankLayout::singleHost(args.nranks);
}

uint64_t layoutHash(const CollArgs& args) { return args.layout ? args.layout->hash() : 0; }

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
      {"hier", CollKind::kAllReduce, hierAllReduce},
      {"hier", CollKind::kBroadcast, hierBroadcast},
      {"hier", CollKind::kReduce, hierReduce},
      {"hier", CollKind::kAllGather, hierAllGather},
      {"hier", CollKind::kReduceScatter, hierReduceScatter},
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
