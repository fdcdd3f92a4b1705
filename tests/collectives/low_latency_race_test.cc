// Issue 21: a rank waiting in a small collective (the shared-memory low-latency exchange) or on a
// request judged a peer on what it had read before a slow liveness check, while the peer caught up
// in between: a valid program failed with "the ranks called different collectives" or named a
// healthy rank as gone. These tests hold the waiting rank at the check through the transport's
// test seam (shm::HostArea::setCheckHookForTesting) until the peer has moved on, so they fail
// every time on code that judges on the stale look, and pass when the check looks again.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/harness.h"
#include "transports/shm/host_area.h"

namespace loomtest {
namespace {

using loom::shm::CheckPoint;
using loom::shm::HostArea;
using loom::shm::PeerState;

// What the installed hook holds for: the peer has sent this rank a message, has closed its
// communicator, or has published a low-latency sequence.
enum class Until { kMessageQueued, kPeerClosed, kPeerInLowLatency };

struct HookState {
  std::atomic<int> victim{-1};  // local index of the rank to hold
  std::atomic<int> point{0};    // CheckPoint to hold at
  std::atomic<int> until{0};
  std::atomic<bool> entered{false};   // the victim reached the check
  std::atomic<bool> released{false};  // the peer had moved on when the hook returned
};
HookState gHook;

void holdVictim(const HostArea& a, int local, CheckPoint where) {
  if (a.localIndex() != gHook.victim.load() || static_cast<int>(where) != gHook.point.load())
    return;
  if (gHook.entered.exchange(true)) return;  // once
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto moved = [&] {
    switch (static_cast<Until>(gHook.until.load())) {
      case Until::kMessageQueued:
        return a.messageQueuedFrom(local);
      case Until::kPeerClosed:
        return a.peerState(local) != PeerState::kAlive;
      case Until::kPeerInLowLatency:
        return a.peerLlSeq(local) > 0;
    }
    return false;
  };
  while (!moved() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gHook.released = moved();
}

class LowLatencyRace : public ::testing::Test {
 protected:
  void arm(int victim, CheckPoint point, Until until) {
    gHook.victim = victim;
    gHook.point = static_cast<int>(point);
    gHook.until = static_cast<int>(until);
    gHook.entered = false;
    gHook.released = false;
    HostArea::setCheckHookForTesting(&holdVictim);
  }
  void TearDown() override { HostArea::setCheckHookForTesting(nullptr); }
  // Runs fn on n thread ranks with rank 0 held at `point` until the peer has done `until`.
  void runHeld(int n, CheckPoint point, Until until,
               const std::function<std::string(ThreadRanks&, int, loomComm_t)>& fn,
               const char* held) {
    ThreadRanks tr(n);
    ASSERT_TRUE(tr.ok()) << tr.error();
    arm(0, point, until);
    EXPECT_EQ(tr.run([&](int rank, loomComm_t comm) { return fn(tr, rank, comm); }), "");
    EXPECT_TRUE(gHook.entered && gHook.released) << "the test did not hold rank 0 until " << held;
  }
  // The late rank enters its call only once the victim is held at its check.
  static std::string waitUntilHeld() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gHook.entered && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return gHook.entered ? "" : "the waiting rank never reached its periodic check";
  }
};

std::string failure(int rank, const char* what) {
  return "rank " + std::to_string(rank) + ": " + what + ": " + loomGetLastError();
}

// A small Broadcast of `value` from root, which rank 1 enters only once the victim is held; each
// rank checks what it got.
std::string lateBroadcast(int rank, loomComm_t comm, size_t count, int root, int32_t value,
                          const std::function<std::string()>& waitUntilHeld) {
  if (rank == 1) {
    std::string e = waitUntilHeld();
    if (!e.empty()) return e;
  }
  std::vector<int32_t> b(count, rank == root ? value : 0);
  if (loomBroadcast(b.data(), b.data(), b.size(), loomInt32, root, comm, nullptr) != loomSuccess)
    return failure(rank, "broadcast");
  for (int32_t v : b)
    if (v != value) return "rank " + std::to_string(rank) + ": wrong broadcast value";
  return "";
}

// Rank 0 waits in a small Broadcast for rank 1; rank 1 arrives, finishes it and sends rank 0 the
// first message of the next call (a Send/Recv ring in a group) before rank 0's check looks at
// the rings. The message is from a later call, not a mismatch.
TEST_F(LowLatencyRace, MessageOfTheNextCallIsNotAMismatch) {
  const int n = 3;
  auto body = [&](ThreadRanks&, int rank, loomComm_t comm) -> std::string {
    std::string e = lateBroadcast(rank, comm, 1000, 0, 7, waitUntilHeld);
    if (!e.empty()) return e;
    // Each rank sends to the rank before it: rank 1's message goes to the waiting rank 0.
    std::vector<int32_t> out(1000, rank), in(1000, -1);
    loomGroupStart();
    loomSend(out.data(), out.size(), loomInt32, (rank + n - 1) % n, comm, nullptr);
    loomRecv(in.data(), in.size(), loomInt32, (rank + 1) % n, comm, nullptr);
    if (loomGroupEnd() != loomSuccess) return failure(rank, "send/recv group");
    for (int32_t v : in)
      if (v != (rank + 1) % n) return "rank " + std::to_string(rank) + ": wrong message";
    return "";
  };
  runHeld(n, CheckPoint::kLowLatencyWait, Until::kMessageQueued, body, "rank 1's message arrived");
}

// Rank 0 waits in a small Broadcast rooted at rank 1; rank 1 arrives, finishes it and destroys
// its communicator before rank 0's check looks at its state. Rank 1 did its part: rank 0 must
// complete with rank 1's data instead of reporting it gone.
TEST_F(LowLatencyRace, PeerThatFinishedAndClosedIsNotGone) {
  auto body = [&](ThreadRanks& tr, int rank, loomComm_t comm) -> std::string {
    std::string e = lateBroadcast(rank, comm, 500, 1, -3, waitUntilHeld);
    if (!e.empty()) return e;
    if (rank == 1) {
      if (loomCommDestroy(comm) != loomSuccess) return failure(rank, "destroy");
      tr.release(1);
    }
    return "";
  };
  runHeld(2, CheckPoint::kLowLatencyWait, Until::kPeerClosed, body, "rank 1 had closed");
}

// Rank 0 waits for rank 1's message (a Recv in a group); rank 1 sends it, then enters a small
// AllReduce and publishes its contribution before rank 0's check looks. A peer already in the
// next (small) call is no mismatch when what this rank waited for has arrived.
TEST_F(LowLatencyRace, PeerAlreadyInTheNextSmallCallIsNotAMismatch) {
  auto body = [&](ThreadRanks&, int rank, loomComm_t comm) -> std::string {
    std::vector<int32_t> msg(1000, rank == 1 ? 11 : -1);
    loomResult_t r;
    if (rank == 1) {
      std::string e = waitUntilHeld();
      if (!e.empty()) return e;
      r = loomSend(msg.data(), msg.size(), loomInt32, 0, comm, nullptr);
    } else {
      r = loomRecv(msg.data(), msg.size(), loomInt32, 1, comm, nullptr);
    }
    if (r != loomSuccess) return failure(rank, "send/recv");
    for (int32_t v : msg)
      if (v != 11) return "rank " + std::to_string(rank) + ": wrong message";
    std::vector<float> a(64, 1.5f), s(64, 0.0f);
    if (loomAllReduce(a.data(), s.data(), a.size(), loomFloat32, loomSum, comm, nullptr) !=
        loomSuccess)
      return failure(rank, "allreduce");
    for (float v : s)
      if (v != 3.0f) return "rank " + std::to_string(rank) + ": wrong sum";
    return "";
  };
  runHeld(2, CheckPoint::kRequestWait, Until::kPeerInLowLatency, body,
          "rank 1 published its small call");
}

}  // namespace
}  // namespace loomtest
