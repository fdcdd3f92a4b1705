// The one-pass path for collectives of a communicator whose ranks all share a host and can map
// each other's buffers (threads of one process, or buffers from loomMemAlloc): no messages, no
// staging. For an AllReduce each rank reduces its slice of every rank's input, in rank order, and
// writes the result straight into every rank's output, so each byte of input is read once and each
// byte of output written once: the least memory traffic any algorithm can have on shared memory.
// Two flag rounds of the low-latency exchange frame it: the first publishes each rank's buffers
// (and whether its peers can map them: every rank must agree before anyone touches a peer's
// memory), the second says every rank is done, so no rank returns while peers still use its
// buffers. LOOM_SHM_MAPPED=0 turns it off.
//
// When it runs: always where the planner chose the "direct" algorithm; otherwise where the model
// prices one pass (sharedDirectSeconds) below the planner's choice and every pair of ranks can map
// each other's allocations. The buffers' kind is known only in the first round, so a call on
// plain malloc memory pays that round and falls back; the communicator then skips the next
// attempts with a growing backoff (Comm::mappedAttemptDue).
#pragma once

#include "src/core/status.h"
#include "src/runtime/executor.h"

namespace loom {

class Comm;

enum class SharedDirectUse {
  kNone,     // not on this path
  kPlanned,  // the planner chose "direct": try it, else run the direct schedule
  kCheaper,  // the model prices one pass below the planner's choice: try it, else run that choice
};

struct SharedDirectChoice {
  SharedDirectUse use = SharedDirectUse::kNone;
  double planSeconds = -1;  // the model's time for the planner's own choice (< 0: not priced)
};

// Whether op may try this path: every rank decides the same from the same arguments, parameters
// and exchanged probes (the buffers are checked by runSharedDirect, which all ranks run together).
// kCheaper is decided on the price of mapped buffers; runSharedDirect prices again once it knows
// which buffers need process_vm_readv/writev. Pure: it changes no state.
SharedDirectChoice sharedDirectUse(Comm& comm, const OpArgs& op);

// The model's time for op in one pass on this communicator: each rank's reads and writes of the
// peers' buffers at the calibrated copy speed (shared by oversubscribed ranks), plus two flag
// rounds; cma: some buffers are reached through process_vm_readv/writev. Negative when the
// communicator has no planner.
double sharedDirectSeconds(Comm& comm, const OpArgs& op, bool cma);

// Runs op on this path when every rank's buffers can be reached by its peers (and the one pass
// still costs less than the planner's choice at the price of those buffers); *ran
// says whether it did (false: nothing happened on any rank; the caller runs op through the
// executor). On failure the communicator is marked failed.
Status runSharedDirect(Comm* comm, const OpArgs& op, const SharedDirectChoice& choice, bool* ran);

}  // namespace loom
