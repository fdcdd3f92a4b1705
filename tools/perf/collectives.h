// The collectives loom-perf measures: buffer sizes per test size (as nccl-tests' getCollByteCount
// computes them), how each is issued through the public API, in-place pointers, and bandwidth.
#pragma once

#include <cstddef>

#include "loom/loom.h"
#include "tools/perf/options.h"

namespace loom {
namespace perf {

// Element counts for one test size. size is the whole buffer for all_gather, reduce_scatter and
// alltoall; paramCount is the count argument of the call.
struct CollCounts {
  size_t sendCount = 0;
  size_t recvCount = 0;
  size_t paramCount = 0;
  size_t sendInplaceOffset = 0;  // in-place sendbuff = recvbuff + rank * this (elements)
  size_t recvInplaceOffset = 0;  // in-place recvbuff = sendbuff + rank * this (elements)
};

struct CollInfo {
  CollKind kind;
  const char* name;  // all_reduce
  bool hasOp;        // the reduction op matters (else the table says "none")
  bool hasRoot;      // the root matters (else the table says -1)
};

const CollInfo& collInfo(CollKind kind);

CollCounts collCounts(CollKind kind, size_t bytes, size_t elSize, int nranks);

// algbw and busbw in GB/s (decimal) of one op of paramCount elements taking sec seconds.
void collBandwidth(CollKind kind, size_t paramCount, size_t elSize, double sec, int nranks,
                   double* algBw, double* busBw);

struct CollCall {
  CollKind kind;
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // paramCount
  loomDataType_t type;
  loomRedOp_t op;
  int root;
  int rank;
  int nranks;
  loomComm_t comm;
  loomStream_t stream = nullptr;  // --mem device: the rank's stream
};

// Issues one operation; fills *what with the failing call's name on error.
loomResult_t runColl(const CollCall& call, const char** what);

}  // namespace perf
}  // namespace loom
