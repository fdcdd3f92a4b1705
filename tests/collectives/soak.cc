#include "tests/collectives/soak.h"

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "tests/collectives/harness.h"

namespace loomtest {

namespace {

// The next call of the sequence (the shared generator) with its kind of size.
Case drawCase(std::mt19937_64& g, int n) {
  auto pick = [&](uint64_t k) { return static_cast<uint64_t>(g() % k); };
  static const Coll kColls[] = {Coll::kAllReduce, Coll::kBroadcast,     Coll::kReduce,
                                Coll::kAllGather, Coll::kReduceScatter, Coll::kAllToAll};
  static const loomRedOp_t kOps[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
  Case c{};
  c.dt = static_cast<loomDataType_t>(pick(loomNumTypes));
  c.op = kOps[pick(5)];
  c.root = static_cast<int>(pick(static_cast<uint64_t>(n)));
  c.inPlace = pick(2) == 0;
  uint64_t kind = pick(100);
  if (kind < 30) {  // a Send/Recv ring in a group
    c.coll = Coll::kSendRecv;
    c.inPlace = false;
    c.count = 1 + pick(5000);
    return c;
  }
  c.coll = kColls[pick(6)];
  if (kind < 75)
    c.count = 1 + pick(1000);  // small: the low-latency exchange where the ranks share a host
  else if (kind < 90)
    c.count = 4096 + pick(70000);  // medium: a schedule (or the one pass)
  else
    c.count = 0;
  return c;
}

}  // namespace

double soakSeconds(double fallback) {
  const char* e = getenv("LOOMTEST_SOAK_SECONDS");
  double v = e ? atof(e) : 0;
  return v > 0 ? v : fallback;
}

std::string soak(loomComm_t comm, int rank, int n, const SoakOptions& opts, uint64_t* callsRun) {
  std::mt19937_64 calls(opts.seed);
  std::mt19937_64 sleeps(opts.seed * 1000003u + static_cast<uint64_t>(rank) + 1);
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(opts.seconds * 1000));
  auto where = [&](uint64_t i) {
    return "rank " + std::to_string(rank) + "/" + std::to_string(n) + ", call " +
           std::to_string(i) + " of seed " + std::to_string(opts.seed) + ": ";
  };
  uint64_t i = 0;
  for (;; ++i) {
    // Every 16 calls the ranks agree whether to go on: rank 0's clock decides (a Broadcast, so
    // every rank stops after the same call).
    if (i % 16 == 0) {
      int32_t stop = rank == 0 && std::chrono::steady_clock::now() >= end ? 1 : 0;
      if (loomBroadcast(&stop, &stop, 1, loomInt32, 0, comm, nullptr) != loomSuccess)
        return where(i) + "the stop broadcast failed: " + loomGetLastError();
      if (stop) break;
    }
    Case c = drawCase(calls, n);
    if (opts.maxSleepMs > 0 && sleeps() % 3 == 0)
      std::this_thread::sleep_for(
          std::chrono::milliseconds(sleeps() % static_cast<uint64_t>(opts.maxSleepMs + 1)));
    std::string e = runCase(comm, rank, n, c);
    if (!e.empty()) return where(i) + e;
  }
  if (callsRun) *callsRun = i;
  return "";
}

}  // namespace loomtest
