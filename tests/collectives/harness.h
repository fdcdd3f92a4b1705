// Test harness for collective tests: ranks as threads of this process (loomCommInitAll) and ranks
// as processes (this test binary re-executed as a worker), and input patterns whose exact results
// are known for every datatype and op, checked by loom-perf's checker (tools/perf/expected.h),
// which names the first wrong element.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/collective.h"

namespace loomtest {

// The calls the tests make: every collective, and SendRecv (each rank sends to rank + 1 and
// receives from rank - 1 in one group).
using Coll = loom::CollKind;
using loom::collName;
using loom::collReduces;
// Every Coll, in enum order.
std::vector<Coll> allColls();

struct Case {
  Coll coll;
  loomDataType_t dt;
  loomRedOp_t op;
  size_t count;
  bool inPlace;
  int root;
  std::string describe() const;
};

// Every case of the matrix for nranks ranks: every datatype x op (reducing collectives) x
// in place / out of place x the given counts, roots 0 and nranks-1 for rooted collectives.
std::vector<Case> matrix(Coll coll, int nranks, const std::vector<size_t>& counts,
                         const std::vector<loomRedOp_t>& ops);
// Counts that exercise 0, 1, odd, not divisible by nranks, and several pipelined pieces (with
// LOOM_CHUNK_SIZE=4K, which the tests set).
std::vector<size_t> standardCounts(int nranks);

// Runs one case on this rank: allocates and fills buffers, calls Loom, checks every element.
// Returns "" on success, else a message naming the case, the rank and the first wrong element.
std::string runCase(loomComm_t comm, int rank, int nranks, const Case& c);

// N ranks as threads of this process; devices (empty or n of them): rank r bound to CUDA device
// devices[r] at init (loomCommInitAll's devlist).
class ThreadRanks {
 public:
  explicit ThreadRanks(int n, const std::vector<int>& devices = {});
  ~ThreadRanks();
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  int size() const { return static_cast<int>(comms_.size()); }
  loomComm_t comm(int r) const { return comms_[r]; }
  void release(int r) { comms_[r] = nullptr; }
  // Runs fn(rank, comm) on one thread per rank; returns the non-empty results joined.
  std::string run(const std::function<std::string(int, loomComm_t)>& fn);

 private:
  std::vector<loomComm_t> comms_;
  bool ok_ = false;
  std::string error_;
};

// Sets an environment variable and reloads Loom's parameter registry.
void setParam(const char* name, const char* value);

}  // namespace loomtest
