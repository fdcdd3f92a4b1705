#include "transports/socket/socket_wire.h"

namespace loom {
namespace net {

Status checkHello(const SocketHello& m, uint64_t secret) {
  if (m.magic != kSocketHelloMagic)
    return LOOM_ERROR(kRemote, "not a Loom socket-transport handshake (magic {:#x})", m.magic);
  if (m.secret != secret) return LOOM_ERROR(kRemote, "wrong secret in handshake");
  if (m.version != kSocketWireVersion)
    return LOOM_ERROR(kRemote, "wire version {}, expected {}", m.version, kSocketWireVersion);
  if (m.nsocks < 1 || m.nsocks > kSocketMaxSocks || m.index >= m.nsocks)
    return LOOM_ERROR(kRemote, "bad socket index {} of {}", m.index, m.nsocks);
  return Status();
}

Status checkFrameHeader(const FrameHeader& h, uint64_t n) {
  if (h.magic != kSocketFrameMagic || h.seq != static_cast<uint32_t>(n) || (h.flags & ~kFrameSplit))
    return LOOM_ERROR(kRemote,
                      "corrupt frame header (frame {}: magic {:#x}, sequence {}, flags {:#x})", n,
                      h.magic, h.seq, h.flags);
  return Status();
}

}  // namespace net
}  // namespace loom
