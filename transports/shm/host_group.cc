#include "transports/shm/host_group.h"

namespace loom::shm {

Result<std::unique_ptr<HostGroup>> HostGroup::attach(std::unique_ptr<Segment> seg, int me,
                                                     std::vector<LocalPeer> peers, Options opts,
                                                     const std::atomic<bool>* abortFlag) {
  std::unique_ptr<HostGroup> g(new HostGroup());
  LOOM_ASSIGN(g->area_, HostArea::attach(std::move(seg), me, std::move(peers), opts, abortFlag));
  g->rings_ = std::make_unique<Transport>(*g->area_);
  g->exchange_ = std::make_unique<LowLatencyExchange>(*g->area_);
  g->onePass_ = std::make_unique<OnePassGuard>(*g->area_);
  return g;
}

void HostGroup::setState(PeerState s) {
  area_->publishState(s);
  if (s == PeerState::kAlive) return;
  onePass_->awaitPeersOut();
  rings_->awaitReaders();
}

}  // namespace loom::shm
