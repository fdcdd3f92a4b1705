// One established socket-transport connection, either direction: the data path behind isend,
// irecv, test and waitActivity. Wire format: socket_wire.h.
//
// Threading: the comm and its requests belong to one caller thread at a time. With nthreads > 0,
// helper threads own the sockets (socket i belongs to thread i % nthreads) and move the bytes;
// the caller publishes frames through atomics and only observes completion. With nthreads == 0
// the caller's test() and waitActivity() move the bytes.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/core/status.h"
#include "transports/socket/socket_util.h"
#include "transports/socket/socket_wire.h"

namespace loom {
namespace net {

class SocketComm;

// A posted isend (one frame) or irecv (n frames). Lives in its comm's pool; freed by test() when
// it reports completion or an error.
struct SocketRequest {
  SocketComm* comm = nullptr;
  bool inUse = false;
  uint64_t firstFrame = 0;
  int n = 0;
  // Receive side: written by the poster before publication, then matched[]/received[] by the owner
  // of socket 0 as headers arrive; read by the poster once the frames are complete.
  char* data[kSocketMaxRecvs] = {};
  size_t capacity[kSocketMaxRecvs] = {};
  int tags[kSocketMaxRecvs] = {};
  bool matched[kSocketMaxRecvs] = {};
  uint64_t received[kSocketMaxRecvs] = {};
};

class SocketComm {
 public:
  enum class Role { kSend, kRecv };
  struct Options {
    int nthreads = 0;          // helper threads (0: progress in the caller)
    int maxInflight = 32;      // outstanding requests
    int64_t minSplit = 65536;  // send side: frames at least this large are split
  };

  // socks[0] is the control socket. peer names the remote end in every error message.
  static Result<std::unique_ptr<SocketComm>> create(Role role, std::vector<Fd> socks,
                                                    std::string peer, const Options& options);
  // Stops the helper threads and closes the sockets; requests in flight are dropped.
  ~SocketComm();

  Role role() const { return role_; }
  int nsocks() const { return nsocks_; }
  const std::string& peer() const { return peer_; }

  // Contracts of net::Transport::isend / irecv / test.
  Status isend(const void* data, size_t size, int tag, void** request);
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, void** request);
  Status test(SocketRequest* req, int* done, size_t* sizes);

  // For waitActivity: appends the fds whose readiness would let req progress. Returns false when
  // req can progress now (complete, failed) and the caller should not sleep.
  bool addWaitFds(const SocketRequest* req, std::vector<pollfd>* fds);
  // Brackets a sleep in waitActivity on a threaded comm (so that helpers signal completions).
  void beginWait() { waiters_.fetch_add(1, std::memory_order_seq_cst); }
  void endWait();

 private:
  struct Frame {
    FrameHeader header{};  // send side: built by the poster
    char* data = nullptr;  // send: source; receive: destination (set with the header)
    uint64_t size = 0;
    bool split = false;
    SocketRequest* req = nullptr;
    // Sockets that still have to finish their part (0: complete). Release/acquire carries the
    // frame's data and the request's received sizes to whoever sees it reach 0.
    std::atomic<int> pending{0};
  };
  struct Sock {
    Fd fd;
    uint64_t frame = 0;  // frame this socket is working on (owner only)
    uint64_t off = 0;    // bytes of that frame's share done (socket 0: header included)
    // Copy of frame, released by the owner: frames below it are no longer read by this socket, so
    // the poster may reuse their ring slots.
    std::atomic<uint64_t> passed{0};
    bool dead = false;  // an I/O error stopped this socket (owner only)
    unsigned char header[sizeof(FrameHeader)] = {};  // receive side, socket 0
  };
  struct Helper {
    std::thread thread;
    Fd wake;  // eventfd
    std::atomic<bool> sleeping{false};
    std::vector<int> socks;
  };

  SocketComm(Role role, std::vector<Fd> socks, std::string peer, const Options& options);
  Status startHelpers(int nthreads);
  void stopHelpers();
  void helperLoop(Helper* h);
  void wakeHelpers(int except = -1);
  void notifyWaiter();

  Frame& frame(uint64_t n) { return frames_[n % frameCap_]; }
  // Whether k more frames fit in the ring (every socket and the poster are past the slots).
  bool canPost(int k);
  SocketRequest* allocRequest();
  void freeRequest(SocketRequest* r);
  int sharers(const Frame& f) const;

  // Moves bytes of socket i (owner only), at most about budget bytes. Returns bytes moved.
  Result<size_t> stepSend(int i, size_t budget);
  Result<size_t> stepRecv(int i, size_t budget);
  Result<size_t> step(int i, size_t budget) {
    return role_ == Role::kSend ? stepSend(i, budget) : stepRecv(i, budget);
  }
  // Validates the header just read on socket 0 and binds frame n to its receive buffer.
  Status acceptHeader(uint64_t n);
  void finishShare(Frame& f);
  // Events socket i (owner only) waits for: POLLIN, POLLOUT or 0 (no work).
  short wantEvents(int i) const;
  // Steps every live socket (caller-driven progress); failures are recorded with fail().
  void progressAll();
  // Frames below this one may still complete; the rest fail (see fail()).
  uint64_t failFrame() const { return failFrame_.load(std::memory_order_acquire); }
  bool breaks(const SocketRequest* req) const {
    return failed_.load(std::memory_order_acquire) && req->firstFrame + req->n > failFrame();
  }
  void advanceCompleted(std::memory_order order = std::memory_order_acquire);

  Status ioError(const Status& st, int i, const char* what) const;
  // Records that the stream broke at frame `frame` (the frame the failing socket was working on):
  // requests with a frame at or past the lowest such frame fail with its status, earlier ones may
  // still complete from the sockets that are alive, and new posts fail.
  void fail(const Status& st, uint64_t frame);
  Status failure() const;

  Role role_;
  std::string peer_;
  std::unique_ptr<Sock[]> socks_;
  int nsocks_ = 0;
  Options opt_;
  std::unique_ptr<Frame[]> frames_;
  uint64_t frameCap_ = 0;
  std::vector<SocketRequest> requests_;
  std::vector<int> freeRequests_;

  uint64_t nextFrame_ = 0;            // poster's copy of posted_
  uint64_t completed_ = 0;            // poster only: frames below are complete
  std::atomic<uint64_t> posted_{0};   // frames published by the poster
  std::atomic<uint64_t> headers_{0};  // receive side: frames whose header is known

  std::vector<std::unique_ptr<Helper>> helpers_;
  bool helpersActive_ = false;  // poster only: helpers move the bytes (else the poster does)
  std::atomic<bool> stop_{false};
  std::atomic<int> waiters_{0};
  Fd notify_;  // eventfd written by helpers when a frame completes while the poster waits

  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> failFrame_{UINT64_MAX};
  mutable std::mutex failMu_;
  Status failure_;
};

}  // namespace net
}  // namespace loom
