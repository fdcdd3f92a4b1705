// The low-latency exchange of the ranks of one host (src/runtime/low_latency.cc and the one pass's
// flag rounds, src/runtime/one_pass.cc): a flag per rank and sequence, double-buffered. Each rank
// writes into its own buffer for a sequence number, publishes it with a signature of the
// operation, and waits until every local rank published the same sequence; the buffers live in
// the ranks' areas of the segment (host_area.h).
//
// Threads: an instance belongs to one rank of one communicator and is used by one thread at a
// time.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "src/core/status.h"
#include "transports/shm/host_area.h"

namespace loom::shm {

// Checks the flags local rank `theirs` (communicator rank theirRank) published for an operation
// whose signature is `signature`, as this rank (myRank, which called `mine`) reads them: they lie
// in memory the peer's process writes. kInvalidUsage (Cause::kMismatch), saying how the calls
// differ, when the signatures differ; kInternal when they claim more bytes than a buffer of
// llBytes holds.
Status checkPublished(const LlFlags& theirs, int theirRank, uint64_t signature, int myRank,
                      const CallNote& mine, size_t llBytes);

class LowLatencyExchange {
 public:
  // area must outlive the exchange.
  explicit LowLatencyExchange(HostArea& area) : area_(area) {}

  // The buffer rank `local` writes for sequence seq (options().llBytes bytes).
  char* buffer(int local, uint64_t seq) { return area_.llBuffer(local, seq); }
  // Publishes this rank's buffer for seq with `bytes` valid bytes and a caller-defined signature
  // (the operation's shape: readers check it matches theirs), and wakes waiting peers.
  // `call` is what this rank called: a peer whose signature differs says how.
  void publish(uint64_t seq, uint64_t bytes, uint64_t signature, const CallNote& call);
  // Waits until every local rank published seq and checks that their signatures equal
  // `signature`. Every rank publishes every sequence (a broadcast's non-roots publish 0 bytes):
  // a rank reuses its buffer for seq + 2 only after it saw every rank publish seq + 1, which they
  // do only after they finished reading seq, so no buffer is overwritten while being read.
  // Fails early (before timeoutMs) when a peer is gone, or sent this rank a message instead of
  // publishing seq (the ranks called different operations). Calls that differ fail with
  // loomInvalidUsage (Cause::kMismatch) and differentCalls()'s message. The check point
  // CheckPoint::kLowLatencyWait is in its periodic check.
  Status waitAll(uint64_t seq, uint64_t signature, int64_t spinNs, int64_t timeoutMs);
  // One round: copies `bytes` of payload into this rank's buffer for seq, publishes it and waits
  // for every local rank's (publish, then waitAll).
  Status round(uint64_t seq, const void* payload, uint64_t bytes, uint64_t signature,
               const CallNote& call, int64_t spinNs, int64_t timeoutMs) {
    if (bytes) std::memcpy(buffer(area_.localIndex(), seq), payload, bytes);
    publish(seq, bytes, signature, call);
    return waitAll(seq, signature, spinNs, timeoutMs);
  }

 private:
  bool oneReady(int local, uint64_t seq);
  // Every local rank published seq. Before it loads a rank's flag, a poll prefetches the first
  // touchBytes_ of that rank's payload: the payload's lines then travel with the flag's instead of
  // after it.
  bool allReady(uint64_t seq);
  // "ranks 1,3 of this host to enter the same call": the ranks that have not published seq.
  std::string missingRanks(uint64_t seq);

  HostArea& area_;
  size_t touchBytes_ = 0;  // set by waitAll: this rank's own payload, at most kTouchMax
};

}  // namespace loom::shm
