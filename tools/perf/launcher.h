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
// hangs. Then one line names the rank that failed first, not one that failed because of it
// (failureSummary). Returns 0 when every rank exited 0, else the first failure's exit status.
// Refuses up front (exit 2, naming the figures) a run this host cannot hold: the shared segment
// larger than /dev/shm's free space, or the segment and every rank's buffers larger than the
// memory available.
int spawnRanks(const Options& opts, int argc, char** argv);
// Why opts cannot run on a host with `available` bytes of memory and `shmFree` bytes free in
// /dev/shm (0: unknown), or empty when it can.
std::string tooLargeForMachine(const Options& opts, uint64_t available, uint64_t shmFree);

// In a rank that spawnRanks started, tells the launcher that `rank` failed with st (one line on a
// pipe the launcher reads); elsewhere nothing.
void reportFailure(int rank, const Status& st);
// The first rank of this spawned process (its index times -t x -g), or -1 outside spawnRanks.
int spawnedFirstRank(const Options& opts);

// What the launcher knows of one rank at the end: its own report (if it made one) and how its
// process ended.
struct RankEnd {
  int rank = -1;
  bool reported = false;
  int64_t atNs = 0;  // when it reported (CLOCK_MONOTONIC, one clock for the host)
  Code code = Code::kOk;
  std::string message;
  int waitStatus = 0;       // as waitpid gave it
  bool killedByUs = false;  // it outlived the others' failure and the grace period
};
// The line that names the rank that failed first, from every rank that failed (in the order
// their processes ended), or empty when none did. The first is a rank that died by a signal
// nobody sent it; else the earliest report of a failure of the rank's own (a message relaying
// "rank N failed: ..." is N's failure) that is not a timeout; else a rank that had to be killed
// (it hung while the others timed out waiting for it); else the earliest report.
std::string failureSummary(const std::vector<RankEnd>& failed);

// Creates this process's ranks (-t threads x -g GPUs each; one by default) in rank order. On
// failure *ranks holds those that were made, to abort.
Status initComms(const Options& opts, std::vector<RankContext>* ranks);

}  // namespace perf
}  // namespace loom
