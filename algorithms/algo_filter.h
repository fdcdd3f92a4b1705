// LOOM_ALGO: which registered algorithms a communicator may use, in NCCL_ALGO's grammar.
//   "ring,rd"                      only these, for every collective
//   "^direct"                      every algorithm but these
//   "allreduce:ring,rd;allgather:^direct"   per collective (others unrestricted)
// Names are case-insensitive. Collective names: allreduce, broadcast, reduce, allgather,
// reducescatter, alltoall. An unknown collective or algorithm name is an error naming the valid
// ones. The filter restricts schedules; the shared-memory low-latency exchange is a protocol, not a
// schedule, and is governed by LOOM_SHM_LL_MAX (as NCCL_PROTO is apart from NCCL_ALGO).
//
// A rule for every collective (no "coll:" prefix) applies to the collectives it leaves an
// algorithm: "ring" restricts AllReduce, AllGather and ReduceScatter to ring, and Broadcast,
// Reduce and AllToAll, which have no ring, keep the automatic choice (note() names them, and the
// runtime warns once). So a program behaves the same whatever its sizes and grouping. A rule for
// one collective that leaves it nothing ("alltoall:^pairwise,bruck") is an error at parse time.
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
  // "" or a sentence naming the collectives a rule for every collective does not restrict (it
  // leaves them no algorithm), for a warning.
  const std::string& note() const { return note_; }
  // Logs note() as a warning, once per process for each distinct source and spec.
  void warnOnce() const;

 private:
  struct Rule {
    bool any = true;                // applies to every collective (no "coll:" prefix)...
    std::vector<CollKind> skipped;  // ...except these, to which it leaves no algorithm
    CollKind coll = CollKind::kAllReduce;
    bool exclude = false;  // "^" list
    std::vector<std::string> names;
  };
  std::string spec_;
  std::string source_ = "LOOM_ALGO";
  std::string note_;
  std::vector<Rule> rules_;
};

}  // namespace loom
