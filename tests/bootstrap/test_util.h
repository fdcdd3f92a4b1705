// Helpers shared by the bootstrap tests: ranks as threads, raw connections for strangers.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"
#include "src/core/params.h"

namespace loom {
namespace testing {

inline SockAddr loopback(int port = 0) {
  auto a = resolveHost("127.0.0.1", port);
  EXPECT_TRUE(a.isOk()) << a.status().message();
  return a.value();
}

// A root on loopback with a fresh secret.
inline UniqueIdInfo loopbackRoot() {
  loomUniqueId id;
  SockAddr at = loopback();
  Status st = createRootAndId(&id, &at);
  EXPECT_TRUE(st.isOk()) << st.message();
  auto info = unpackUniqueId(id);
  EXPECT_TRUE(info.isOk()) << info.status().message();
  return info.value();
}

// Runs fn(rank) on n threads and joins them.
inline void runThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

inline std::string blobFor(int rank) {
  std::string b(static_cast<size_t>(rank) * 37 + (rank % 3 == 1 ? 1000 : 0), '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(rank * 31 + i * 7);
  return b;
}

// Every rank of one rendezvous: bootstraps[r] or statuses[r].
struct Ranks {
  std::vector<std::unique_ptr<Bootstrap>> boots;
  std::vector<Status> statuses;
};

inline Ranks connectAll(const UniqueIdInfo& id, int n, int64_t timeoutMs = 20000,
                        const std::vector<int>& only = {}) {
  Ranks out;
  out.boots.resize(n);
  out.statuses.resize(n);
  std::vector<int> ranks = only;
  if (ranks.empty())
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  runThreads(static_cast<int>(ranks.size()), [&](int i) {
    int r = ranks[i];
    auto b = Bootstrap::connect(id, r, n, blobFor(r), Deadline(timeoutMs), nullptr);
    if (b.isOk())
      out.boots[r] = std::move(b).value();
    else
      out.statuses[r] = b.status();
  });
  return out;
}

inline std::string helloBytes(uint64_t secret, int rank, int nranks, const SockAddr& listener,
                              uint32_t blobLen, const std::string& blob) {
  std::string out;
  wire::Writer w(&out);
  w.u32(wire::kHelloMagic);
  w.u32(wire::kVersion);
  w.u64(secret);
  w.i32(rank);
  w.i32(nranks);
  w.addr(listener);
  w.u32(blobLen);
  w.bytes(blob.data(), blob.size());
  return out;
}

inline Fd rawConnect(const SockAddr& addr) {
  auto fd = connectWithRetry(addr, Deadline(5000));
  EXPECT_TRUE(fd.isOk()) << fd.status().message();
  return fd.isOk() ? std::move(fd).value() : Fd();
}

// Reads what a peer sends until it closes (or 5 s pass); returns it.
inline std::string drain(int fd) {
  std::string out;
  Deadline d(5000);
  char buf[4096];
  while (!d.expired()) {
    auto r = recvSome(fd, buf, sizeof(buf));
    if (!r.isOk()) break;
    out.append(buf, r.value());
    if (r.value() == 0) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 50);
    }
  }
  return out;
}

// Sets (or with nullopt unsets) environment variables for one test, restoring them after; the
// parameter registry is reloaded both times.
using EnvVars = std::map<std::string, std::optional<std::string>>;
class EnvScope {
 public:
  explicit EnvScope(const EnvVars& vars) {
    for (const auto& [k, v] : vars) set(k, v);
    reloadParams();
  }
  void set(const std::string& k, const std::optional<std::string>& v) {
    if (!saved_.count(k)) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (v)
      setenv(k.c_str(), v->c_str(), 1);
    else
      unsetenv(k.c_str());
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;
  ~EnvScope() {
    for (const auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
    reloadParams();
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace testing
}  // namespace loom
