#include "transports/shm/one_pass_guard.h"

#include <atomic>

#include "src/core/clock.h"
#include "src/core/fence.h"

namespace loom::shm {

Status OnePassGuard::begin() {
  const int me = area_.localIndex();
  area_.rankArea(me)->onePass.store(1, std::memory_order_seq_cst);
  loom::fence(std::memory_order_seq_cst);
  for (int i = 0; i < area_.nlocal(); ++i) {
    if (i == me) continue;
    auto st = static_cast<PeerState>(area_.rankArea(i)->state.load(std::memory_order_seq_cst));
    if (st != PeerState::kAlive) {
      end();
      return area_.peerGone(i);
    }
  }
  return Status();
}

void OnePassGuard::end() {
  area_.rankArea(area_.localIndex())->onePass.store(0, std::memory_order_seq_cst);
}

void OnePassGuard::awaitPeersOut() {
  // A peer that began a one pass over the buffers before it saw this rank's state finishes first
  // (begin checks the states after raising `onePass`: with both seq_cst, one of the two sees the
  // other). Bounded: 5 s.
  const int64_t deadline = nowNs() + 5 * int64_t{1000000000};
  for (int i = 0; i < area_.nlocal(); ++i)
    if (i != area_.localIndex()) area_.awaitDrop(area_.rankArea(i)->onePass, i, deadline);
}

}  // namespace loom::shm
