// A communicator's connections: the transport table (which transport carries the traffic to each
// (rank, channel), built once at init from what each transport says it reaches: NCCL's
// canConnect), the network transport's listener, and the network connections, made lazily and
// without blocking as the executor first needs them (each identified by a hello carrying the
// sender's rank, channel and the communicator's secret).
//
// Threads: the communicator's one-thread rule.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/core/memory_kind.h"
#include "src/core/status.h"
#include "transports/net.h"

namespace loom {

class Connections {
 public:
  Connections() = default;
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;
  ~Connections();

  // Opens the network transport's listener; *handle is what peers connect to.
  Status listen(net::Transport* network, net::Handle* handle);
  // The communicator's identity, for hellos and messages: rank, size, secret, each rank's listener
  // handle, and how to name a rank in errors.
  void setPeers(int rank, int nranks, uint64_t secret, std::vector<net::Handle> handles,
                std::function<std::string(int)> describe);
  // Builds the table from the transports offered (the network, and the intra-host transport when
  // there is one), channels 0..channels-1: for each (rank, channel) the reachable transport with
  // the lowest latency (the first offered on a tie).
  void buildTable(const std::vector<net::Transport*>& transports, int channels);

  // The transport for (peer, channel): the table's; channels past the table's take its last.
  net::Transport* transportFor(int peer, int channel) const;
  net::Transport* network() const { return net_; }
  // The memory kinds every transport of the table accepts (from net::Properties::ptrSupport).
  MemKindSet acceptedKinds() const;
  void* listener() const { return listener_; }

  // Nonblocking: the transport comm once the connection to / from (peer, channel) is usable,
  // nullptr while it is being established.
  Result<void*> sendConn(int peer, int channel);
  Result<void*> recvConn(int peer, int channel);

  // Closes every network connection (and pending accept); the listener too when withListener.
  void close(bool withListener);

 private:
  // One direction of one (peer, channel) network connection.
  struct Connection {
    void* comm = nullptr;      // transport sendConn / recvConn
    bool ready = false;        // send side: hello posted; recv side: hello received
    void* helloReq = nullptr;  // send side: the hello's request until it completes
    unsigned char hello[24] = {};
  };
  struct Pending {
    void* comm;
    void* req;
    unsigned char hello[24];
  };
  Status acceptPending();

  net::Transport* net_ = nullptr;
  void* listener_ = nullptr;
  int rank_ = 0, nranks_ = 0;
  uint64_t secret_ = 0;
  std::vector<net::Handle> handles_;
  std::function<std::string(int)> describe_;
  std::vector<std::vector<net::Transport*>> table_;  // [peer][channel]
  std::map<std::pair<int, int>, Connection> send_, recv_;
  std::vector<std::unique_ptr<Pending>> pendingAccepts_;  // accepted, hello not yet read
};

}  // namespace loom
