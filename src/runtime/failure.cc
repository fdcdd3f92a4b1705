#include "src/runtime/failure.h"

#include <chrono>
#include <thread>

#include "src/bootstrap/bootstrap.h"
#include "src/core/clock.h"

namespace loom {

bool FailureState::record(const Status& st) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.isOk()) {
      error_ = st;
      first = true;
    }
  }
  failed_.store(true, std::memory_order_release);
  return first;
}

Status FailureState::error() const {
  if (!failed()) return Status();
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void FailureState::requestAbort() {
  abort_.store(true, std::memory_order_release);
  if (bootstrap_) bootstrap_->abort();
}

void FailureState::report(int rank, const Status& st) {
  if (bootstrap_ && st.code() != Code::kAborted)
    bootstrap_->reportFailure(
        Status(st.code(), fmt::format("rank {} failed: {}", rank, st.message())));
}

Status FailureState::pollRemote() {
  // Once an abort has begun, what the bootstrap says next (peers closing on it, as it closed on
  // them) is the abort's doing: the call ends as aborted, not with a peer's failure.
  if (aborted()) return LOOM_ERROR(kAborted, "communicator aborted (loomCommAbort)");
  if (!bootstrap_) return Status();
  int64_t now = nowNs();
  if (now - lastPoll_ < 10 * 1000000) return Status();
  lastPoll_ = now;
  return bootstrap_->pollFailure();
}

Status FailureState::awaitRemote(int ms) {
  if (!bootstrap_) return Status();
  Deadline d(ms);
  for (;;) {
    Status st = bootstrap_->pollFailure();
    if (!st.isOk() || d.expired()) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace loom
