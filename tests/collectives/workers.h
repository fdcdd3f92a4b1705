// Ranks as processes: the collectives test binary re-executes itself as worker processes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/loom.h"

namespace loomtest {

struct WorkerResult {
  std::vector<int> status;          // waitpid status per rank (-1: not collected)
  std::vector<std::string> output;  // stderr of each rank
  bool exitedWith(int rank, int code) const;
  bool killedBySignal(int rank) const;
  std::string describe(int rank) const;
};

// Starts n workers running `mode` (LOOM_TEST_WORKER), with extra environment variables, on a
// fresh unique id made by this process; waits for all of them (killing all after deadlineSec).
WorkerResult runWorkers(int n, const std::string& mode,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        int deadlineSec = 240);

// Entry point of a worker process.
int workerMain();

// The worker modes that start with "dev": calls on CUDA device memory (device_calls_test.cc).
int deviceWorker(const std::string& mode, loomComm_t comm, int rank, int n);

}  // namespace loomtest
