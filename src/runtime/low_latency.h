// The low-latency path for small collectives of a communicator whose ranks all share a host: one
// flag-synchronised exchange through shared memory, no rendezvous and no schedule. Each rank copies
// its contribution into its own shared buffer and raises its flag for the operation's sequence
// number; once every flag is up, each rank computes its output from the buffers it needs (all
// ranks reduce in rank order, so every rank gets the same bits). LOOM_SHM_LL_MAX bounds it.
#pragma once

#include "src/core/status.h"
#include "src/runtime/dispatch.h"
#include "src/runtime/executor.h"

namespace loom {

class Comm;

// Runs op on the low-latency path (where dispatch chose Path::kLowLatency: src/runtime/dispatch.h
// decides when it is eligible). On failure the communicator is marked failed.
// shape: op's (run.h, shapeOf).
Status runLowLatency(Comm* comm, const OpArgs& op, const CallShape& shape);

}  // namespace loom
