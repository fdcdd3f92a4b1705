// Wire format of the socket transport. Both ends are assumed to share byte order (as in NCCL).
//
// A connection is nsocks TCP sockets (1..16) opened by the connecting side. Each socket starts with
// a Hello naming the listener's secret, the connection id and the socket's index; the listener
// groups sockets by connection id. Socket 0 is also the control socket.
//
// Messages ("frames") are numbered 0, 1, 2, ... per connection. For each frame, in frame order:
// - socket 0 carries a FrameHeader, then the payload of an unsplit frame, or part 0 of a split one;
// - socket i > 0 carries part i of a split frame (nothing for an unsplit frame).
// A frame is split (flag in its header) when the sender chose so (size >= LOOM_SOCKET_MIN_SPLIT and
// nsocks > 1); the parts are given by framePart(), so the receiver never needs the sender's
// parameters. Per-socket order is frame order, which lets each socket run ahead independently.
#pragma once

#include <netinet/in.h>

#include <cstdint>

#include "src/core/status.h"
#include "transports/net.h"

namespace loom {
namespace net {

constexpr uint64_t kSocketHandleMagic = 0x4b434f534d4f4f4cull;  // "LOOMSOCK"
constexpr uint64_t kSocketHelloMagic = 0x4f4c45484d4f4f4cull;   // "LOOMHELO"
constexpr uint32_t kSocketFrameMagic = 0x52464d4cu;             // "LMFR"
constexpr uint32_t kSocketWireVersion = 1;
constexpr int kSocketMaxSocks = 16;
constexpr int kSocketMaxRecvs = 8;
constexpr uint32_t kFrameSplit = 1u;

// The listener's handle, stored in net::Handle::bytes.
struct SocketHandle {
  uint64_t magic;
  uint64_t secret;  // random per listener; a socket must present it in its Hello
  uint32_t addrLen;
  uint32_t reserved;
  unsigned char addr[sizeof(sockaddr_in6)];  // sockaddr_in or sockaddr_in6
};
static_assert(sizeof(SocketHandle) <= kHandleSize, "socket handle too large");

// First bytes on every socket of a connection, connector to listener.
struct SocketHello {
  uint64_t magic;
  uint64_t secret;
  uint64_t connId;  // random; equal on all sockets of one connection
  uint32_t version;
  uint16_t index;
  uint16_t nsocks;
};
static_assert(sizeof(SocketHello) == 32, "hello layout");

struct FrameHeader {
  uint32_t magic;
  uint32_t seq;  // low 32 bits of the frame number, for sanity
  uint64_t size;
  int32_t tag;
  uint32_t flags;  // kFrameSplit
};
static_assert(sizeof(FrameHeader) == 24, "frame header layout");

// The checks of what a peer sends, shared by the transport and the fuzz target
// (tests/fuzz/wire_fuzz.cc). Each returns kRemote naming what is wrong; the caller adds who sent
// it. A socket's Hello as the listener whose secret is `secret` receives it: the magic, the secret,
// the version, and an index within 1..kSocketMaxSocks sockets.
Status checkHello(const SocketHello& m, uint64_t secret);
// The header of frame number n as socket 0 of the receiving end reads it: the magic, the
// sequence number and known flags. (The size is checked against the posted receive.)
Status checkFrameHeader(const FrameHeader& h, uint64_t n);

// Payload bytes [*begin, *end) of a frame carried by socket `index`. Split frames are cut into
// nsocks contiguous parts of equal size (rounded up to 64 bytes; the last parts may be short or
// empty); unsplit frames travel whole on socket 0.
inline void framePart(uint64_t size, bool split, int nsocks, int index, uint64_t* begin,
                      uint64_t* end) {
  if (!split || nsocks <= 1) {
    *begin = 0;
    *end = index == 0 ? size : 0;
    return;
  }
  uint64_t per = (size + nsocks - 1) / nsocks;
  per = (per + 63) & ~uint64_t(63);
  uint64_t b = per * index, e = b + per;
  *begin = b < size ? b : size;
  *end = e < size ? e : size;
}

}  // namespace net
}  // namespace loom
