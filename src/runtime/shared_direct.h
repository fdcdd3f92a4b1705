// The one-pass path for collectives of a communicator whose ranks all share a host and can map
// each other's buffers (threads of one process, or buffers from loomMemAlloc): no messages, no
// staging. For an AllReduce each rank reduces its slice of every rank's input, in rank order, and
// writes the result straight into every rank's output, so each byte of input is read once and each
// byte of output written once: the least memory traffic any algorithm can have on shared memory.
// Two flag rounds of the low-latency exchange frame it: the first publishes each rank's buffers
// (and whether its peers can map them: every rank must agree before anyone touches a peer's
// memory), the second says every rank is done, so no rank returns while peers still use its
// buffers. The planner prices it as the "direct" algorithm; LOOM_SHM_MAPPED=0 turns it off.
#pragma once

#include "src/core/status.h"
#include "src/runtime/executor.h"

namespace loom {

class Comm;

// True when op may try this path: every rank decides the same from the same arguments and
// parameters (the buffers are checked by runSharedDirect, which all ranks run together).
bool sharedDirectEligible(Comm& comm, const OpArgs& op);

// Runs op on this path when every rank's buffers can be mapped by its peers; *ran says whether it
// did (false: nothing happened on any rank; the caller runs op through the executor). On failure
// the communicator is marked failed.
Status runSharedDirect(Comm* comm, const OpArgs& op, bool* ran);

}  // namespace loom
