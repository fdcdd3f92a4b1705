// The one-pass guard (src/runtime/one_pass.cc): while a rank reads and writes its peers' buffers
// in a one pass, its `onePass` flag in the segment is up; a peer that fails or closes waits until
// no rank's flag is up before it returns, so that its caller never frees a buffer that another
// rank still touches. The flag is checked against the peers' state words with sequentially
// consistent ordering: either the rank that begins sees the peer's state, or the peer sees its
// flag.
//
// Threads: an instance belongs to one rank of one communicator and is used by one thread at a
// time.
#pragma once

#include "src/core/status.h"
#include "transports/shm/host_area.h"

namespace loom::shm {

class OnePassGuard {
 public:
  // area must outlive the guard.
  explicit OnePassGuard(HostArea& area) : area_(area) {}

  // Around a one pass over the peers' buffers: begin says this rank is about to touch them, then
  // fails (without touching anything) if a peer has failed or closed; end says it is done. Call
  // end before failing, so that peers failing at the same time do not wait for this rank.
  Status begin();
  void end();
  // After this rank published that it failed or closed (HostArea::publishState): returns once no
  // peer still works in a one pass over its buffers (at most 5 s; a peer whose process is gone
  // stops mattering).
  void awaitPeersOut();

 private:
  HostArea& area_;
};

}  // namespace loom::shm
