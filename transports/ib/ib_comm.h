// One established InfiniBand connection, either direction: queue pairs, completion queue, the
// registered CTS / record arrays of the data path (ib_wire.h) and the requests in flight.
//
// Threading: a comm and its requests belong to one caller thread at a time (net.h). The device's
// event thread only touches the comm's Health.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "src/core/status.h"
#include "transports/ib/ib_device.h"
#include "transports/ib/ib_wire.h"
#include "transports/socket/socket_util.h"

namespace loom {
namespace ib {

// What regMr hands out.
struct MemHandle {
  Device* dev = nullptr;
  CachedMr* mr = nullptr;
};

class Comm;

struct Request {
  enum class Kind { kSend, kRecv, kFlush };
  Comm* comm = nullptr;
  Kind kind = Kind::kSend;
  bool inUse = false;
  bool done = false;
  bool matched = false;  // send: written to the wire (waits for the NIC, not the socket)
  Status error;          // set when the request failed on its own (truncation, tag)
  int n = 0;
  void* data[kMaxRecvs] = {};
  size_t size[kMaxRecvs] = {};
  int tag[kMaxRecvs] = {};
  uint32_t lkey[kMaxRecvs] = {};
  uint32_t rkey[kMaxRecvs] = {};
  bool gpu[kMaxRecvs] = {};
  CachedMr* own[kMaxRecvs] = {};  // registered by the transport for this request
  size_t received[kMaxRecvs] = {};
  uint64_t seq = 0;
};

// Local description of one end, for the handshake and for connecting queue pairs.
struct Endpoint {
  uint16_t lid = 0;
  uint8_t linkLayer = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  ibv_gid gid{};
};

class Comm {
 public:
  enum class Role { kSend, kRecv };
  // Flushes in flight (the flush QP's depth). irecv keeps receives plus flushes within it, so
  // that the flush following each receive into GPU memory always has a place.
  static constexpr int kMaxFlushes = 2 * kMaxRequests;
  // Creates the queue pairs (INIT state) and the registered arrays; connect() finishes the setup.
  static Result<std::unique_ptr<Comm>> create(Role role, Port* port, int nqps);
  ~Comm();

  Role role() const { return role_; }
  Port* port() const { return port_; }
  Device* dev() const { return port_->dev; }
  const std::string& peer() const { return peer_; }
  // This end's half of the handshake.
  void describe(EndpointWire* w, uint64_t secret) const;
  // Brings the queue pairs to RTR / RTS with the peer's half; peer names it in messages.
  Status connect(const EndpointWire& remote, const std::string& peer);
  // The handshake socket, kept for the comm's life: its end-of-file means the peer is gone.
  void attachSocket(Fd sock) { sock_ = std::move(sock); }

  Status isend(const void* data, size_t size, int tag, MemHandle* mh, void** request);
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, MemHandle** mhs,
               void** request);
  Status iflush(int n, void** data, const size_t* sizes, MemHandle** mhs, void** request);
  Status test(Request* r, int* done, size_t* sizes);

  // For the transport's waitActivity, before it sleeps on this comm: takes the completion events
  // the channel holds, arms the CQ for the next completion and then takes what completed before
  // the arming, and adds the fds whose readiness means the comm may progress (the channel, the
  // handshake socket: its end-of-file is a dead peer). kReady: the comm failed (do not sleep;
  // test() says how); kNap: something it waits for arrives without a completion (a send's
  // clear-to-send, which the receiver RDMA-writes), or it has no channel: sleep briefly only;
  // kSleep: every wait ends with a completion, so the fds wake the sleep.
  enum class WaitKind { kReady, kNap, kSleep };
  WaitKind prepareWait(std::vector<pollfd>* fds);

 private:
  Comm(Role role, Port* port, int nqps);
  Status setup();
  // Takes (and acknowledges) the events the completion channel holds.
  void drainEvents();
  Result<ibv_qp*> createQp(int maxSend, int maxRecv);
  Status toRtr(ibv_qp* qp, const Endpoint& remote, uint32_t qpn, uint32_t psn);
  Status toRts(ibv_qp* qp, uint32_t psn);
  Status postRecvs(int qpIndex, int count);
  Status ensureFlushQp();

  Request* allocRequest(Request::Kind kind);
  void freeRequest(Request* r);
  Status registerBuffer(Request* r, int i, void* data, size_t size, MemHandle* mh);

  // Drives the comm: completions, CTS matching, health. Records the first failure.
  void progress();
  void pollCompletions();
  void matchSends();
  Status postSlot(const CtsSlot& slot, std::vector<Request*>& reqs);
  void finishRecv(int slot);
  void checkHealth();
  void checkPeer();
  void fail(const Status& st, bool flushed = false);

  Role role_;
  Port* port_;
  int nqps_;
  uint32_t portDowns0_;  // the port's failure count when this comm was made
  std::string peer_ = "(not connected)";
  Endpoint local_;
  uint32_t psn_[kMaxQps] = {};
  std::vector<ibv_qp*> qps_;
  ibv_cq* cq_ = nullptr;
  // The CQ's completion channel (its fd non-blocking), null where the library has none or it could
  // not be made (waits then nap); armed_: ibv_req_notify_cq is in force (no event since).
  ibv_comp_channel* channel_ = nullptr;
  bool armed_ = false;
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  Fd sock_;  // the handshake socket, kept open: EOF means the peer is gone
  int maxSendWr_ = 0;
  size_t maxWrite_ = 0;

  // Send side: the FIFO the receiver writes CTS slots into, and records to send. Receive side:
  // CTS slots to send, and the record array the sender writes into.
  std::unique_ptr<CtsSlot[]> cts_;
  std::unique_ptr<DoneRecord[]> records_;
  CachedMr* ctsMr_ = nullptr;
  CachedMr* recordsMr_ = nullptr;
  uint64_t remoteAddr_ = 0;  // the peer's FIFO (receive side) or record array (send side)
  uint32_t remoteRkey_ = 0;

  // Sends and receives (kMaxRequests each) and flushes (kMaxFlushes).
  Request requests_[2 * kMaxRequests + kMaxFlushes];
  int sends_ = 0, recvs_ = 0, flushes_ = 0;  // outstanding

  // Send side.
  std::deque<Request*> unmatched_;
  uint64_t sendSeq_ = 0;  // next FIFO slot to consume
  std::vector<Request*> slotReqs_[kMaxRequests];
  int slotPending_[kMaxRequests] = {};  // immediates not yet acknowledged

  // Receive side.
  uint64_t recvSeq_ = 0;
  Request* slotRecv_[kMaxRequests] = {};
  int immCount_[kMaxRequests] = {};

  // Flush (GPUDirect receives): a queue pair connected to itself, reading a few bytes.
  ibv_qp* flushQp_ = nullptr;
  std::unique_ptr<char[]> flushScratch_;
  CachedMr* flushMr_ = nullptr;

  Status failure_;
  bool failureFlushed_ = false;
  int64_t lastSockCheckNs_ = 0;
  Status peerGone_;  // the handshake socket reached end-of-file
};

}  // namespace ib
}  // namespace loom
