// Monotonic time and deadlines. Every wait in Loom has a Deadline (LOOM_TIMEOUT by default).
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace loom {

inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A relative time of ns nanoseconds (>= 0) as the timespec nanosleep, ppoll and futex take.
inline timespec timespecOfNs(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// Sleeps about ns nanoseconds (a signal may end it sooner; callers look again anyway).
inline void sleepNs(int64_t ns) {
  const timespec ts = timespecOfNs(ns);
  ::nanosleep(&ts, nullptr);
}

class Deadline {
 public:
  // timeoutMs <= 0: never expires.
  explicit Deadline(int64_t timeoutMs)
      : end_(timeoutMs > 0 ? nowNs() + timeoutMs * 1000000 : INT64_MAX), timeoutMs_(timeoutMs) {}
  static Deadline never() { return Deadline(0); }
  bool expired() const { return end_ != INT64_MAX && nowNs() >= end_; }
  // Milliseconds left, clamped to [0, cap]; cap when the deadline never expires.
  int remainingMs(int cap = 1000) const {
    if (end_ == INT64_MAX) return cap;
    int64_t left = (end_ - nowNs()) / 1000000;
    if (left < 0) return 0;
    return left > cap ? cap : static_cast<int>(left);
  }
  int64_t timeoutMs() const { return timeoutMs_; }

 private:
  int64_t end_;
  int64_t timeoutMs_;
};

// When a long wait says that it still waits, so that a rank that never arrives is a line in the
// log instead of minutes of silence: first after 10 s (a quarter of the timeout when that is
// shorter), then every 30 s (or that quarter). due() is true once per notice; reset() after
// progress starts the count again.
class ProgressNotice {
 public:
  explicit ProgressNotice(int64_t timeoutMs) {
    const int64_t quarter = timeoutMs > 0 ? timeoutMs / 4 : INT64_MAX;
    first_ = std::max<int64_t>(1000, std::min<int64_t>(10000, quarter));
    every_ = std::max<int64_t>(1000, std::min<int64_t>(30000, quarter));
    next_ = first_;
  }
  bool due(int64_t waitedMs) {
    if (waitedMs < next_) return false;
    while (next_ <= waitedMs) next_ += every_;
    return true;
  }
  void reset() { next_ = first_; }

 private:
  int64_t first_, every_, next_;
};

// LOOM_TIMEOUT in milliseconds (0 = forever).
int64_t defaultTimeoutMs();

}  // namespace loom
