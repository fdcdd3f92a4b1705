#include "transports/shm/low_latency_exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "src/core/fence.h"

namespace loom::shm {

Status checkPublished(const LlFlags& theirs, int theirRank, uint64_t signature, int myRank,
                      const CallNote& mine, size_t llBytes) {
  // One copy of the call note: what is described is what was compared.
  const CallNote call = theirs.call;
  if (theirs.signature != signature)
    return LOOM_ERROR(kInvalidUsage, "{}", differentCalls(theirRank, &call, myRank, mine))
        .withCause(Cause::kMismatch);
  if (theirs.bytes > llBytes)
    return LOOM_ERROR(kInternal, "shm: rank {} published {} low-latency bytes, its buffer holds {}",
                      theirRank, theirs.bytes, llBytes);
  return Status();
}

void LowLatencyExchange::publish(uint64_t seq, uint64_t bytes, uint64_t signature,
                                 const CallNote& call) {
  const int me = area_.localIndex();
  LlFlags* f = HostArea::llFlagsOf(buffer(me, seq));
  f->bytes = bytes;
  f->signature = signature;
  f->call = call;
  f->seq.store(seq, std::memory_order_release);
  for (int i = 0; i < area_.nlocal(); ++i)
    if (i != me) area_.wake(i);
}

bool LowLatencyExchange::oneReady(int local, uint64_t seq) {
  return HostArea::llFlagsOf(buffer(local, seq))->seq.load(std::memory_order_acquire) >= seq;
}

namespace {
// The most payload bytes a poll prefetches per rank: the low-latency sizes where the second
// transfer is a large part of the call.
constexpr size_t kTouchMax = 8 * kLine;
}  // namespace

bool LowLatencyExchange::allReady(uint64_t seq) {
  for (int i = 0; i < area_.nlocal(); ++i) {
    const char* p = buffer(i, seq);
    for (size_t o = 0; o < touchBytes_; o += kLine) __builtin_prefetch(p + o, 0, 3);
    if (!oneReady(i, seq)) return false;
  }
  return true;
}

std::string LowLatencyExchange::missingRanks(uint64_t seq) {
  std::vector<int> missing;
  for (int i = 0; i < area_.nlocal(); ++i)
    if (!oneReady(i, seq)) missing.push_back(area_.peer(i).rank);
  std::sort(missing.begin(), missing.end());
  return fmt::format("rank{} {} of this host to enter the same call",
                     missing.size() == 1 ? "" : "s", fmt::join(missing, ","));
}

Status LowLatencyExchange::waitAll(uint64_t seq, uint64_t signature, int64_t spinNs,
                                   int64_t timeoutMs) {
  const int me = area_.localIndex();
  touchBytes_ = std::min<size_t>(HostArea::llFlagsOf(buffer(me, seq))->bytes, kTouchMax);
  // Every judgment below reads its evidence first and the peer's flag again after it: a peer that
  // was late when this rank looked may have published seq since, finished this operation, sent a
  // message for its next call or even closed its communicator (its flag was published before
  // any of that, so a flag read after the evidence sees it).
  auto check = [&]() -> Status {
    for (int i = 0; i < area_.nlocal(); ++i) {
      if (i == me || oneReady(i, seq)) continue;
      area_.atCheck(i, CheckPoint::kLowLatencyWait);
      Status gone = area_.peerGone(i);  // slow: a kill() and a /proc read
      bool queued = area_.messageQueuedFrom(i);
      loom::fence(std::memory_order_seq_cst);
      if (oneReady(i, seq)) continue;  // it caught up: neither is evidence against it
      if (!gone.isOk()) return gone;
      // A message from a peer that has not published seq was sent before it entered this
      // operation (it publishes on entry), and every message of the calls before was received:
      // the peer runs another operation here.
      if (queued) {
        const CallNote theirs = area_.peerCall(i);
        return LOOM_ERROR(kInvalidUsage,
                          "{} (it sent a message while this rank waits in a small, "
                          "low-latency collective)",
                          differentCalls(area_.peer(i).rank, &theirs, area_.peer(me).rank,
                                         HostArea::llFlagsOf(buffer(me, seq))->call))
            .withCause(Cause::kMismatch);
      }
    }
    return Status();
  };
  LOOM_TRY(waitFor([&] { return allReady(seq); },
                   [&] { area_.sleepOnBell(1, [&] { return allReady(seq); }); }, check,
                   area_.abortFlag(), area_.options().yieldWhenIdle, spinNs, timeoutMs,
                   [&] { return missingRanks(seq); }));
  const CallNote mine = HostArea::llFlagsOf(buffer(me, seq))->call;
  for (int i = 0; i < area_.nlocal(); ++i)
    LOOM_TRY(checkPublished(*HostArea::llFlagsOf(buffer(i, seq)), area_.peer(i).rank, signature,
                            area_.peer(me).rank, mine, area_.options().llBytes));
  return Status();
}

}  // namespace loom::shm
