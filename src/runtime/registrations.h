// A communicator's buffer registrations (loomCommRegister) and its scratch block, and the memory
// handles the network transport made for them, per connection.
//
// Threads: loomCommDeregister may run on another thread than the calls (the registry has its own
// lock); everything else follows the communicator's one-thread rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "src/core/status.h"
#include "transports/net.h"

namespace loom {

class Registrations {
 public:
  // net: the transport whose regMr/deregMr make and release the handles (may be set later).
  explicit Registrations(net::Transport* net = nullptr) : net_(net) {}
  Registrations(const Registrations&) = delete;
  Registrations& operator=(const Registrations&) = delete;
  void setTransport(net::Transport* net) { net_ = net; }

  // The range [buff, buff + size) is kept until deregister; ranges may overlap. The handle is
  // opaque, never null, and unique in the process (a stale or foreign handle is recognised, never
  // dereferenced).
  Result<void*> add(void* buff, size_t size);
  // Releases the registration and the transport handles made for it (deregMr on every
  // connection). Deregistering while a request that uses the range is in flight is the caller's
  // bug (as in NCCL).
  Status remove(void* handle);
  // The transport's memory handle for [p, p + n) on connection conn, or nullptr when no
  // registration contains the range (the transport then registers the buffer per message). Made
  // lazily with regMr over the whole registration, once per (connection, registration), and
  // cached until the registration or the connection goes. A failed regMr is logged once and the
  // range goes the per-message way on that connection. Cheap when nothing is registered;
  // O(log registrations) otherwise.
  void* memHandle(void* conn, const void* p, size_t n);
  // deregMr of every handle made (before the connections close).
  void releaseHandles();
  // Registrations alive (user ones, and the scratch block's when it exists).
  size_t count() const;

  // Scratch memory reused across calls (64-byte aligned), registered like a user buffer: a block
  // that grows is deregistered and the new one registered. Called only while no request of the
  // communicator is in flight.
  char* scratch(size_t bytes);

 private:
  struct Registration {
    uint64_t id = 0;
    uintptr_t begin = 0, end = 0;
    bool internal = false;            // the scratch block: not the user's to deregister
    bool warned = false;              // a regMr failure was logged
    std::map<void*, void*> mhandles;  // connection -> regMr's handle (nullptr: regMr failed)
  };
  uint64_t addRange(uintptr_t begin, size_t size, bool internal);
  // Caller holds mu_; false when id is not registered.
  bool dropLocked(uint64_t id);
  void releaseHandlesLocked(Registration* r);

  net::Transport* net_;
  mutable std::mutex mu_;  // the executor reads the map; loomCommDeregister may run elsewhere
  std::multimap<uintptr_t, std::unique_ptr<Registration>> regs_;  // by begin
  std::map<uint64_t, Registration*> byId_;
  std::set<uint64_t> deregistered_;  // recent ids, to tell "deregistered twice" (bounded)
  size_t maxLen_ = 0;                // the longest range registered since the map was empty
  std::unique_ptr<char[]> scratchMem_;
  char* scratchAligned_ = nullptr;
  size_t scratchBytes_ = 0;
  uint64_t scratchId_ = 0;
};

}  // namespace loom
