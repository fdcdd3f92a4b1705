// A communicator's failure state: its first error (what every later call reports), its abort
// flag, and what other ranks reported through the bootstrap ring.
//
// Threads: requestAbort, aborted, abortFlag and error may be called from any thread; the rest
// follows the communicator's one-thread rule.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "src/core/status.h"

namespace loom {

class Bootstrap;

class FailureState {
 public:
  // The ring other ranks report through (set once it exists; null before).
  void setBootstrap(Bootstrap* b) { bootstrap_ = b; }

  // Records st as the communicator's error (the first one wins); true the first time.
  bool record(const Status& st);
  // The recorded error, or OK.
  Status error() const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // Sets the abort flag and wakes blocked calls (the bootstrap's waits too).
  void requestAbort();
  bool aborted() const { return abort_.load(std::memory_order_acquire); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }
  std::atomic<bool>* abortFlagMutable() { return &abort_; }

  // Tells the other ranks (over the bootstrap ring, which reaches ranks that share no data
  // connection with this one) that this rank failed with st.
  void report(int rank, const Status& st);
  // A failure another rank reported (or a ring neighbour's death), checked at most every 10 ms
  // (never blocks). After requestAbort: loomAborted (what peers do next is the abort's doing).
  Status pollRemote();
  // Waits up to ms for the failure report of a rank whose connection just closed: a rank that
  // fails reports why over the ring before it closes its data connections, but the close can
  // arrive first. Returns the report (naming the rank that failed first), or OK.
  Status awaitRemote(int ms);

 private:
  Bootstrap* bootstrap_ = nullptr;
  std::atomic<bool> abort_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  Status error_;
  int64_t lastPoll_ = 0;
};

}  // namespace loom
