// The generators registered in schedule.cc. Each builds one rank's schedule for any nranks >= 1,
// count >= 0, root in [0, nranks), in place or not. Internal to algorithms/.
#pragma once

#include <cstddef>

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
RankSchedule treeAllReduce(const CollArgs& args, int rank);               // tree.cc
RankSchedule rhdAllReduce(const CollArgs& args, int rank);                // rhd.cc
RankSchedule rhdReduceScatter(const CollArgs& args, int rank);            // rhd.cc
RankSchedule rhdAllGather(const CollArgs& args, int rank);                // rhd.cc
RankSchedule bruckAllToAll(const CollArgs& args, int rank);               // bruck_alltoall.cc

// The tree AllReduce with a given number of chunks per half (>= 1; chunks beyond the half's
// element count are empty and dropped), and the number treeAllReduce uses for count elements.
RankSchedule treeAllReduceChunked(const CollArgs& args, int rank, size_t chunks);  // tree.cc
size_t treeAllReduceChunks(size_t count);                                          // tree.cc
RankSchedule hierAllReduce(const CollArgs& args, int rank);                        // hier.cc
RankSchedule hierBroadcast(const CollArgs& args, int rank);                        // hier.cc
RankSchedule hierReduce(const CollArgs& args, int rank);                           // hier.cc
RankSchedule hierAllGather(const CollArgs& args, int rank);                        // hier.cc
RankSchedule hierReduceScatter(const CollArgs& args, int rank);                    // hier.cc

}  // namespace loom
