// How loom-perf's ranks come to be: -np N spawns N copies of this program on this host (the
// parent makes the unique id and hands it down in the environment); mpirun, torchrun or srun
// (with LOOM_COMM_ID) launch ranks that loomCommInitFromEnv finds; otherwise one rank runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/status.h"
#include "tools/perf/bench.h"
#include "tools/perf/options.h"

namespace loom {
namespace perf {

// True in a rank that spawnRanks started.
bool isSpawnedRank();
// Whether this process may hold rank 0 (the one that writes -J's file): not a spawned rank or a
// launcher's process (Open MPI, MPICH/PMI, Slurm, torchrun) of another number.
bool mayHoldRankZero();

// Runs argv again as ranks 0..np-1 (with -np removed) and waits for them. When one fails, the
// others get the Loom deadline plus a few seconds to fail too, then are killed, so a failure never
// hangs. Returns 0 when every rank exited 0, else the first failure's exit status.
// Refuses up front (exit 2, naming the figures) a run this host cannot hold: the shared segment
// larger than /dev/shm's free space, or the segment and every rank's buffers larger than the
// memory available.
int spawnRanks(const Options& opts, int argc, char** argv);
// Why opts cannot run on a host with `available` bytes of memory and `shmFree` bytes free in
// /dev/shm (0: unknown), or empty when it can.
std::string tooLargeForMachine(const Options& opts, uint64_t available, uint64_t shmFree);

// Creates this process's ranks (-t threads x -g GPUs each; one by default) in rank order. On
// failure *ranks holds those that were made, to abort.
Status initComms(const Options& opts, std::vector<RankContext>* ranks);

}  // namespace perf
}  // namespace loom
