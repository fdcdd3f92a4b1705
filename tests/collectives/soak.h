// A randomized soak of the public API: every rank draws the same sequence of calls from a shared
// seed (small collectives on the low-latency exchange, Send/Recv rings in a group, empty calls,
// medium collectives on a schedule, every datatype and op, in and out of place), sleeps a random
// time of its own before some of them so that ranks arrive out of step, and checks every element.
// Used by Soak.* (ranks as threads and as processes) for a bounded time.
#pragma once

#include <cstdint>
#include <string>

#include "loom/loom.h"

namespace loomtest {

struct SoakOptions {
  uint64_t seed = 1;    // the call sequence (the same on every rank)
  double seconds = 10;  // rank 0's clock decides when to stop (all ranks stop together)
  int maxSleepMs = 30;  // a rank sleeps 0..maxSleepMs before about a third of the calls
};

// Runs the soak on this rank; returns "" or the first failure (the call, the seed, the error).
// Every rank must call it with the same seed.
std::string soak(loomComm_t comm, int rank, int nranks, const SoakOptions& opts,
                 uint64_t* callsRun = nullptr);

// LOOMTEST_SOAK_SECONDS (default `fallback`): how long each soak test runs.
double soakSeconds(double fallback);

}  // namespace loomtest
