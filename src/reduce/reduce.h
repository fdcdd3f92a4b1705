// CPU reduction kernels for every datatype and op. float16 and bfloat16 are converted to float32,
// combined, and rounded once per element (they accumulate in float32 inside a step).
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/loom.h"

namespace loom {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b exactly (not partially).
// loomAvg combines as loomSum: the executor divides once at the end (finishAverage).
void reduceBuffers(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                   loomRedOp_t op);

// The same results written around the caches (non-temporal stores): for destinations that will
// not be read again soon, such as a large call's output on a host whose buffers exceed its caches,
// where an ordinary store first reads each destination line from memory. Each returns after a
// store fence, so a release that follows publishes what it wrote. Small sizes, and CPUs without
// such stores, take the ordinary form, and so does a reduction whose destination is one of its
// operands (read first, it is cached anyway). copyStreaming's ranges may overlap (then it is
// memmove).
void reduceBuffersStreaming(void* dst, const void* a, const void* b, size_t count,
                            loomDataType_t dt, loomRedOp_t op);
void copyStreaming(void* dst, const void* src, size_t bytes);
// dst[i] = copy[i] = a[i] (op) b[i]: the result stored twice, at copy with ordinary stores (a
// buffer another core reads next from the cache) and at dst streaming or not; copy may alias a or
// b exactly, dst neither. Returns after a store fence when streaming.
void reduceBuffersTwice(void* dst, void* copy, const void* a, const void* b, size_t count,
                        loomDataType_t dt, loomRedOp_t op, bool streaming);
// Which stores a call's results take: the streaming forms where its outputs are not in the caches
// anyway, so that ordinary stores would first read each destination line from memory.
struct ByteRange {
  const void* base = nullptr;
  size_t bytes = 0;
};
// A model of what the caches hold, from where recent calls wrote: a call that writes where one of
// the last calls wrote, with less traffic since that call started than a share of the last-level
// cache, finds its lines there (a benchmark that reuses one buffer, a training step's fixed
// buckets); one that writes elsewhere (nccl-tests' sweep, each iteration at the next offset; a
// fresh allocation) does not. Streaming is chosen where:
//  - the call's buffers are at least its ranks' private caches (localRanks x L2): a smaller result
//    is better left cached for whoever reads it next, and
//  - its outputs are not cached (as above), or its buffers exceed the last-level cache's share.
// The share is a quarter of the last-level cache: sysfs reports the whole socket's on some VMs,
// which other tenants use too (measured on one: a buffer reused every 64 MiB of traffic still
// cached, every 256 MiB not, with 480 MiB reported). Not thread-safe: streamingStoresFor guards the
// process's instance.
class CacheModel {
 public:
  CacheModel(size_t lastLevelBytes, size_t privateBytes);
  // hostBytes: every local rank's input and output together (the caches are the host's);
  // written: this rank's outputs. Records the traffic for later calls, and the outputs of calls
  // that may stream (smaller ones never do, whatever they write).
  bool streamingFor(size_t hostBytes, int localRanks, const ByteRange* written, size_t nWritten);
  size_t shareBytes() const { return share_; }

 private:
  struct Entry {
    uintptr_t base = 0;
    size_t bytes = 0;
    uint64_t stamp = 0;  // the traffic clock when the call that wrote it started
  };
  bool cached(const ByteRange& r) const;
  size_t share_, private_;
  uint64_t clock_ = 0;  // bytes of calls' buffers so far
  Entry recent_[16];
};
// The process's model over this machine's caches (sysfs), or where LOOM_NT_MIN is set, its plain
// size rule: hostBytes above it.
bool streamingStoresFor(size_t hostBytes, int localRanks, const ByteRange* written,
                        size_t nWritten);

// data[i] /= nranks, after a sum, to finish loomAvg. Integers truncate toward zero (as NCCL).
void finishAverage(void* data, size_t count, loomDataType_t dt, int nranks);

}  // namespace loom
