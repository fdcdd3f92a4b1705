// The generators registered in schedule.cc. Each builds one rank's schedule for any nranks >= 1,
// count >= 0, root in [0, nranks), in place or not. Internal to algorithms/.
#pragma once

#include "algorithms/schedule.h"

namespace loom {

RankSchedule ringAllReduce(const CollArgs& args, int rank);               // ring.cc
RankSchedule ringAllGather(const CollArgs& args, int rank);               // ring.cc
RankSchedule ringReduceScatter(const CollArgs& args, int rank);           // ring.cc
RankSchedule chainBroadcast(const CollArgs& args, int rank);              // chain.cc
RankSchedule chainReduce(const CollArgs& args, int rank);                 // chain.cc
RankSchedule pairwiseAllToAll(const CollArgs& args, int rank);            // pairwise.cc
RankSchedule recursiveDoublingAllReduce(const CollArgs& args, int rank);  // recursive_doubling.cc
RankSchedule directAllReduce(const CollArgs& args, int rank);             // direct.cc
RankSchedule directReduceScatter(const CollArgs& args, int rank);         // direct.cc
RankSchedule directAllGather(const CollArgs& args, int rank);             // direct.cc
RankSchedule directBroadcast(const CollArgs& args, int rank);             // direct.cc
RankSchedule directReduce(const CollArgs& args, int rank);                // direct.cc
RankSchedule binomialBroadcast(const CollArgs& args, int rank);           // binomial.cc
RankSchedule binomialReduce(const CollArgs& args, int rank);              // binomial.cc
RankSchedule bruckAllGather(const CollArgs& args, int rank);              // bruck.cc

}  // namespace loom
