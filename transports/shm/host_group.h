// This rank's part in the shared memory of its host's ranks: the segment as this rank sees it
// (HostArea) and what is built over it, the point-to-point rings (Transport), the low-latency
// exchange and the one-pass guard. The communicator owns one (src/runtime/comm.h) and hands the
// rings to its transport table, the exchange to the low-latency path and the guard to the one pass.
//
// Threads: one thread at a time, as for each of its parts.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "src/core/status.h"
#include "transports/shm/host_area.h"
#include "transports/shm/low_latency_exchange.h"
#include "transports/shm/one_pass_guard.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_transport.h"

namespace loom::shm {

class HostGroup {
 public:
  // Wraps a mapped segment that HostArea::format formatted. peers[i] is local rank i; me is this
  // rank's index; abortFlag (may be null) ends waits early.
  static Result<std::unique_ptr<HostGroup>> attach(std::unique_ptr<Segment> seg, int me,
                                                   std::vector<LocalPeer> peers, Options opts,
                                                   const std::atomic<bool>* abortFlag);

  HostArea& area() { return *area_; }
  const HostArea& area() const { return *area_; }
  Transport& rings() { return *rings_; }
  LowLatencyExchange& exchange() { return *exchange_; }
  OnePassGuard& onePass() { return *onePass_; }

  // Sets this rank's state word (peers waiting on it see it at once) and rings every doorbell.
  // Failed or closed: then returns once no peer still works in a one pass over this rank's
  // buffers, and then once none still reads its unacknowledged single-copy messages (each wait at
  // most 5 s; a peer whose process is gone stops mattering), so that the caller may free them.
  void setState(PeerState s);

 private:
  HostGroup() = default;

  std::unique_ptr<HostArea> area_;  // first: the others refer to it, and go before it
  std::unique_ptr<Transport> rings_;
  std::unique_ptr<LowLatencyExchange> exchange_;
  std::unique_ptr<OnePassGuard> onePass_;
};

}  // namespace loom::shm
