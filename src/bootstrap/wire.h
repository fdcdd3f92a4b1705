// Internal to the bootstrap: the byte layouts exchanged between ranks and the root, and the little
// helpers that encode them. Every integer travels little-endian with a fixed width, whatever the
// host, so that a garbage or foreign message is detected by its magic and bounds, never by luck.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/core/status.h"
#include "transports/socket/socket_util.h"

namespace loom {
namespace wire {

constexpr uint32_t kVersion = 1;
constexpr uint32_t kHelloMagic = 0x4c424831;  // "LBH1": rank -> root
constexpr uint32_t kReplyMagic = 0x4c425231;  // "LBR1": root -> rank
constexpr uint32_t kRingMagic = 0x4c424731;   // "LBG1": rank -> successor (ring handshake)
constexpr uint32_t kAckMagic = 0x4c424131;    // "LBA1": successor -> rank (ring handshake reply)
constexpr uint32_t kFrameMagic = 0x4c424631;  // "LBF1": allGather frames on the ring

constexpr size_t kMaxBlob = 1u << 20;   // a hello's blob is at most 1 MiB
constexpr int kMaxRanks = 1 << 20;      // nranks above this is garbage
constexpr size_t kMaxErrorText = 4096;  // error frames carry at most this much text

// A socket address on the wire: u16 family (4 or 6), u16 port, 16 address bytes, u32 scope id.
constexpr size_t kAddrBytes = 24;
// Hello: u32 magic, u32 version, u64 secret, i32 rank, i32 nranks, addr listener, u32 blobLen;
// then blobLen bytes.
constexpr size_t kHelloBytes = 4 + 4 + 8 + 4 + 4 + kAddrBytes + 4;
// Reply header: u32 magic, u32 kind (kReplyTable/kReplyError), u32 code (loomResult_t of an
// error, else nranks), u32 reserved, u64 payload bytes. A table's payload is nranks entries of
// {addr listener, u32 blobLen, blob}; an error's payload is its text.
constexpr size_t kReplyBytes = 4 + 4 + 4 + 4 + 8;
constexpr uint32_t kReplyTable = 1;
constexpr uint32_t kReplyError = 2;
// Ring handshake: u32 magic, u32 version, u64 secret, i32 from rank, i32 to rank, i32 nranks.
// The acceptor answers with the same layout (kAckMagic, from = itself, to = the connector).
constexpr size_t kRingBytes = 4 + 4 + 8 + 4 + 4 + 4;
// allGather frame header: u32 magic, u32 kind (kFrameData/kFrameError), u64 payload bytes.
constexpr size_t kFrameBytes = 4 + 4 + 8;
constexpr uint32_t kFrameData = 1;
constexpr uint32_t kFrameError = 2;
// Sent to both ring neighbours by a rank that destroys its communicator in an orderly way, so that
// its closed sockets are not taken for a failure. Payload: none.
constexpr uint32_t kFrameBye = 3;

// Appends fixed-width little-endian fields to a string.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void u16(uint16_t v);
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void bytes(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  void addr(const SockAddr& a);

 private:
  std::string* out_;
};

// Reads fixed-width little-endian fields; reading past the end sets !ok() and yields zeros.
class Reader {
 public:
  Reader(const void* p, size_t n) : p_(static_cast<const uint8_t*>(p)), n_(n) {}
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  // Returns a pointer to the next n bytes (nullptr and !ok() when fewer remain).
  const uint8_t* bytes(size_t n);
  // A well-formed IPv4/IPv6 address with a nonzero port, or an error naming what is wrong.
  Result<SockAddr> addr();
  bool ok() const { return ok_; }
  size_t left() const { return ok_ ? n_ - off_ : 0; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  bool ok_ = true;
};

// 64-bit hash (FNV-1a followed by a splitmix64 finaliser); stable across hosts and builds.
uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0);
inline uint64_t hash64(const std::string& s, uint64_t seed = 0) {
  return hash64(s.data(), s.size(), seed);
}

// "2,5-7,9" for a sorted list of ranks; cut with ",..." after maxItems items.
std::string formatRanks(const int* ranks, size_t count, size_t maxItems = 32);

// Milliseconds of the per-connection handshake deadline: min(LOOM_TIMEOUT, 10 s).
int64_t handshakeTimeoutMs();

}  // namespace wire
}  // namespace loom
