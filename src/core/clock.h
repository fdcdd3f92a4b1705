// Monotonic time and deadlines. Every wait in Loom has a Deadline (LOOM_TIMEOUT by default).
#pragma once

#include <chrono>
#include <cstdint>

namespace loom {

inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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

// LOOM_TIMEOUT in milliseconds (0 = forever).
int64_t defaultTimeoutMs();

}  // namespace loom
