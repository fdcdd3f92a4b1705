// Internal to the bootstrap: the byte layouts exchanged between ranks and the root, and the little
// helpers that encode them. Every integer travels little-endian with a fixed width, whatever the
// host, so that a garbage or foreign message is detected by its magic and bounds, never by luck.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/status.h"
#include "transports/socket/socket_util.h"

namespace loom {
namespace wire {

// Version 2: the root acknowledges each hello at once (kReplyAck).
constexpr uint32_t kVersion = 2;
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
// Reply header: u32 magic, u32 kind (kReplyTable/kReplyError/kReplyAck), u32 code (loomResult_t
// of an error, the rank of an acknowledgement, else nranks), u32 reserved, u64 payload bytes. A
// table's payload is nranks entries of {addr listener, u32 blobLen, blob}; an error's payload is
// its text; an acknowledgement has none. The root acknowledges a hello as soon as it has checked
// it, so that a rank whose hello meets silence knows within the handshake deadline that whatever
// listens at the root's address is not a Loom root (a port held by another program).
constexpr size_t kReplyBytes = 4 + 4 + 4 + 4 + 8;
constexpr uint32_t kReplyTable = 1;
constexpr uint32_t kReplyError = 2;
constexpr uint32_t kReplyAck = 3;
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

// ---- The messages. Each is written and checked by one pair of functions that the root, the ranks
// and the fuzz target (tests/fuzz/wire_fuzz.cc) share. A decoder takes the bytes as they came off
// the socket, trusts no length in them, and returns a value or kInvalidArgument naming what is
// wrong; the caller adds who sent it.

// A rank's hello to the root, header part (its blob follows on the wire).
struct Hello {
  uint64_t secret = 0;
  int rank = 0;
  int nranks = 0;
  SockAddr listener;
  uint32_t blobLen = 0;  // bytes of blob after the header
};
// The whole hello: header and blob (h.blobLen is ignored: the blob's size is sent).
std::string encodeHello(const Hello& h, const std::string& blob);
// Checks a hello header (the first kHelloBytes of p) against the root's secret and the nranks
// of the ranks already checked in (0: none yet). *foreign turns true when the bytes are not a
// Loom bootstrap hello at all (such a peer gets no reply), false otherwise.
Result<Hello> decodeHello(const void* p, size_t n, uint64_t secret, int knownNranks, bool* foreign);

// The root's reply header.
struct Reply {
  uint32_t kind = 0;  // kReplyTable, kReplyError or kReplyAck
  uint32_t code = 0;  // kReplyTable: nranks; kReplyError: the error's Code; kReplyAck: the rank
  uint64_t payloadBytes = 0;
};
std::string encodeReplyHeader(uint32_t kind, uint32_t code, uint64_t payloadBytes);
// A whole error reply: the header and the text.
std::string encodeReplyError(Code code, const std::string& text);
// Checks a reply header (the first kReplyBytes of p) as rank of nranks receives it: an error, an
// acknowledgement of this rank's hello, or a table for nranks no larger than nranks entries can
// be.
Result<Reply> decodeReplyHeader(const void* p, size_t n, int rank, int nranks);
// How a rank reports the code of an error reply: kTimeout and kInvalidArgument as they are, any
// other as kRemote.
Code replyErrorCode(uint32_t code);
// A table entry, appended to a table's payload.
void appendTableEntry(std::string* payload, const SockAddr& listener, const void* blob,
                      size_t blobLen);
// A table's payload: exactly nranks entries, nothing after them.
Status decodeTable(const void* p, size_t n, int nranks, std::vector<SockAddr>* listeners,
                   std::vector<std::string>* blobs);

// The ring handshake (kRingMagic from the connector, kAckMagic from the acceptor).
std::string encodeRing(uint32_t magic, uint64_t secret, int from, int to, int nranks);
// OK when the first kRingBytes of p are the handshake expected, else why not.
Status checkRing(const void* p, size_t n, uint32_t magic, uint64_t secret, int from, int to,
                 int nranks);

// An allGather frame header.
struct Frame {
  uint32_t kind = 0;  // kFrameData, kFrameError or kFrameBye
  uint64_t bytes = 0;
};
std::string encodeFrameHeader(uint32_t kind, uint64_t bytes);
// Checks a frame header (the first kFrameBytes of p): the magic, a known kind, and for an error
// frame a body of 4 to kMaxErrorText bytes.
Result<Frame> decodeFrameHeader(const void* p, size_t n);
// What an error frame reports.
struct ErrorReport {
  uint32_t code = 0;  // the sender's Code
  std::string text;
};
// A whole error frame: the header, the code, the text (cut to fit kMaxErrorText).
std::string encodeErrorFrame(Code code, const std::string& text);
// An error frame's body (its header's bytes of it).
Result<ErrorReport> decodeErrorBody(const void* p, size_t n);

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
