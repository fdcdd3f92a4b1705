// A memory fence that ThreadSanitizer understands. TSan does not model std::atomic_thread_fence
// (gcc refuses it under -fsanitize=thread), so in a TSan build the fence becomes a
// read-modify-write of one process-wide atomic with the same order: every pair of fences then
// synchronizes through that atomic, which orders at least what the fences order. Elsewhere it is
// the plain fence.
#pragma once

#include <atomic>

namespace loom {

#if defined(__SANITIZE_THREAD__)
#define LOOM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOOM_TSAN 1
#endif
#endif

inline void fence(std::memory_order order) {
#if defined(LOOM_TSAN)
  static std::atomic<unsigned> word{0};
  word.fetch_add(0, order == std::memory_order_relaxed ? std::memory_order_relaxed
                                                       : std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(order);
#endif
}

}  // namespace loom
