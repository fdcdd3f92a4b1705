// LOOM_ALGO: which registered algorithms a communicator may use, in NCCL_ALGO's grammar.
//   "ring,rd"                      only these, for every collective
//   "^direct"                      every algorithm but these
//   "allreduce:ring,rd;allgather:^direct"   per collective (others unrestricted)
// Names are case-insensitive. Collective names: allreduce, broadcast, reduce, allgather,
// reducescatter, alltoall. An unknown collective or algorithm name is an error naming the valid
// ones. The filter restricts schedules; the shared-memory low-latency exchange is a protocol, not a
// schedule, and is governed by LOOM_SHM_LL_MAX (as NCCL_PROTO is apart from NCCL_ALGO).
#pragma once

#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "src/core/status.h"

namespace loom {

class AlgoFilter {
 public:
  // An empty spec allows everything. source names where the spec came from in error messages.
  static Result<AlgoFilter> parse(const std::string& spec, const char* source = "LOOM_ALGO");

  bool allows(CollKind coll, const std::string& algorithm) const;
  // The algorithm to run: `preferred` when allowed, else the first allowed algorithm registered
  // for the collective; an error when the filter leaves none.
  Result<std::string> choose(CollKind coll, const std::string& preferred) const;
  const std::string& spec() const { return spec_; }

 private:
  struct Rule {
    bool any = true;  // applies to every collective (no "coll:" prefix)
    CollKind coll = CollKind::kAllReduce;
    bool exclude = false;  // "^" list
    std::vector<std::string> names;
  };
  std::string spec_;
  std::string source_ = "LOOM_ALGO";
  std::vector<Rule> rules_;
};

}  // namespace loom
