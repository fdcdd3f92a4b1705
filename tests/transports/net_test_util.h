// Helpers for the tests of every net::Transport (the conformance suite and each backend's own
// file): environment overrides, message patterns, connection setup alternating connect and accept
// in one thread (the NCCL pattern), bounded request driving, and child processes that are this
// test binary started afresh (tests/child_process.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/core/clock.h"
#include "src/core/params.h"
#include "tests/child_process.h"
#include "transports/net.h"

namespace loom {
namespace testing_util {

// Every wait in these tests is bounded by this.
constexpr int64_t kTestDeadlineMs = 120000;

// Sets environment variables for its lifetime, then restores them; reloads the parameters.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& kv : vars) set(kv.first, kv.second);
  }
  void set(const std::string& name, const std::string& value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    ::setenv(name.c_str(), value.c_str(), 1);
    reloadParams();
  }
  ~ScopedEnv() {
    for (const auto& kv : saved_) {
      if (kv.second)
        ::setenv(kv.first.c_str(), kv.second->c_str(), 1);
      else
        ::unsetenv(kv.first.c_str());
    }
    reloadParams();
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Deterministic content: byte k of message `seed`.
inline void fillPattern(void* buf, size_t size, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t k = 0;
  for (; k + 8 <= size; k += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + k, &x, 8);
  }
  for (; k < size; ++k) p[k] = static_cast<unsigned char>(seed + k);
}

// Index of the first byte that differs from the pattern, or -1.
inline int64_t checkPattern(const void* buf, size_t size, uint64_t seed) {
  std::vector<unsigned char> want(size);
  fillPattern(want.data(), size, seed);
  const auto* p = static_cast<const unsigned char*>(buf);
  for (size_t k = 0; k < size; ++k)
    if (p[k] != want[k]) return static_cast<int64_t>(k);
  return -1;
}

struct Pair {
  void* send = nullptr;
  void* recv = nullptr;
};

// Connects dev to the listener `listen` (whose handle is `handle`), alternating connect and
// accept in this thread.
inline Status connectTo(net::Transport* t, int dev, const net::Handle& handle, void* listen,
                        Pair* out) {
  Deadline deadline(kTestDeadlineMs);
  Status st;
  while (out->send == nullptr || out->recv == nullptr) {
    if (out->send == nullptr) {
      st = t->connect(dev, handle, &out->send);
      if (!st.isOk()) break;
    }
    if (out->recv == nullptr) {
      st = t->accept(listen, &out->recv);
      if (!st.isOk()) break;
    }
    if (deadline.expired()) {
      st = LOOM_ERROR(kTimeout, "test: connection not established in time");
      break;
    }
  }
  return st;
}

// Connects dev to a fresh listener on dev, alternating connect and accept in this thread.
inline Status connectPair(net::Transport* t, int dev, Pair* out, void** listenOut = nullptr) {
  net::Handle handle;
  void* listen = nullptr;
  LOOM_TRY(t->listen(dev, &handle, &listen));
  Status st = connectTo(t, dev, handle, listen, out);
  if (listenOut && st.isOk())
    *listenOut = listen;
  else
    (void)t->closeListen(listen);
  return st;
}

inline void closePair(net::Transport* t, Pair* p) {
  if (p->send) {
    EXPECT_TRUE(t->closeSend(p->send).isOk());
  }
  if (p->recv) {
    EXPECT_TRUE(t->closeRecv(p->recv).isOk());
  }
  p->send = p->recv = nullptr;
}

// The widest grouped receive any transport takes (NCCL_NET_MAX_REQUESTS).
constexpr int kMaxGroup = 8;

// A posted request and, once tested to completion, its outcome. t: the transport it was posted
// on, where it is not the one drive() is given (shm: each rank has its own).
struct Req {
  void* handle = nullptr;
  net::Transport* t = nullptr;
  bool finished = false;
  Status status;
  size_t sizes[kMaxGroup] = {};
};

// Sleeps until one of the waiting requests may progress, or up to timeoutMs. Requests of several
// transports (two ranks driven by one thread) are not waited for: each transport's nap would
// wait for what only the other's progress brings.
inline void nap(net::Transport* t, const std::vector<Req*>& waiting, int timeoutMs) {
  std::vector<void*> handles;
  net::Transport* on = nullptr;
  for (Req* r : waiting) {
    net::Transport* rt = r->t ? r->t : t;
    if (on != nullptr && rt != on) return;
    on = rt;
    handles.push_back(r->handle);
  }
  if (on) on->waitActivity(handles.data(), static_cast<int>(handles.size()), nullptr, timeoutMs);
}

// Tests every unfinished request round-robin until all have finished (done or error) or the
// deadline passes (then returns false). Naps when nothing moved. t: the transport of requests
// whose own t is null. `extra` requests are tested too (without progress calls on their comms,
// the bytes of a caller-progressed comm do not move) but need not finish.
inline bool drive(net::Transport* t, std::vector<Req*> reqs, int64_t timeoutMs = kTestDeadlineMs,
                  std::vector<Req*> extra = {}) {
  Deadline deadline(timeoutMs);
  const size_t required = reqs.size();
  reqs.insert(reqs.end(), extra.begin(), extra.end());
  while (true) {
    bool all = true, progressed = false;
    std::vector<Req*> waiting;
    for (size_t k = 0; k < reqs.size(); ++k) {
      Req* r = reqs[k];
      if (r->finished) continue;
      int done = 0;
      r->status = (r->t ? r->t : t)->test(r->handle, &done, r->sizes);
      if (!r->status.isOk() || done) {
        r->finished = true;
        progressed = true;
      } else {
        if (k < required) all = false;
        waiting.push_back(r);
      }
    }
    if (all) return true;
    if (deadline.expired()) return false;
    if (!progressed) nap(t, waiting, 1);
  }
}

// Posts, retrying while the transport says "not now" (null request), driving `others` meanwhile.
template <typename PostFn>
inline Status postRetry(net::Transport* t, PostFn&& post, void** request,
                        std::vector<Req*> others = {}) {
  Deadline deadline(kTestDeadlineMs);
  while (true) {
    LOOM_TRY(post(request));
    if (*request != nullptr) return Status();
    if (deadline.expired()) return LOOM_ERROR(kTimeout, "test: could not post");
    for (Req* r : others) {
      if (r->finished) continue;
      int done = 0;
      r->status = (r->t ? r->t : t)->test(r->handle, &done, r->sizes);
      if (!r->status.isOk() || done) r->finished = true;
    }
  }
}

}  // namespace testing_util
}  // namespace loom
