// loomUniqueId layout (128 bytes, little-endian):
//   0  u32 magic "LMID"      4  u8 version        5  u8 family (4 or 6)   6  u16 port
//   8  u64 secret           16  u8[16] address   32  u32 IPv6 scope id   36  u32 reserved (0)
//  40  u64 checksum = hash64(bytes 0..39)        48..127 zero
#include <cstring>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"

namespace loom {
namespace {

constexpr uint32_t kIdMagic = 0x44494d4c;  // "LMID" read little-endian
constexpr uint8_t kIdVersion = 1;
constexpr size_t kChecksummed = 40;
constexpr size_t kUsed = 48;
static_assert(kUsed <= LOOM_UNIQUE_ID_BYTES, "unique id layout exceeds LOOM_UNIQUE_ID_BYTES");

}  // namespace

void packUniqueId(const UniqueIdInfo& info, loomUniqueId* id) {
  std::string out;
  wire::Writer w(&out);
  w.u32(kIdMagic);
  uint8_t head[2] = {kIdVersion, static_cast<uint8_t>(info.root.family() == AF_INET6 ? 6 : 4)};
  w.bytes(head, 2);
  std::string addr;
  wire::Writer(&addr).addr(info.root);  // u16 family, u16 port, 16 bytes, u32 scope
  w.u16(static_cast<uint16_t>(info.root.port()));
  w.u64(info.secret);
  w.bytes(addr.data() + 4, 16);
  w.bytes(addr.data() + 20, 4);
  w.u32(0);
  w.u64(wire::hash64(out.data(), kChecksummed));
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, out.data(), out.size());
}

Result<UniqueIdInfo> unpackUniqueId(const loomUniqueId& id) {
  wire::Reader r(id.internal, sizeof(id.internal));
  uint32_t magic = r.u32();
  if (magic != kIdMagic)
    return LOOM_ERROR(kInvalidArgument,
                      "invalid unique id: bad magic 0x{:08x} (not made by loomGetUniqueId, or "
                      "corrupted in transit)",
                      magic);
  const uint8_t* head = r.bytes(2);
  if (head[0] != kIdVersion)
    return LOOM_ERROR(kInvalidArgument, "invalid unique id: version {}, this library speaks {}",
                      head[0], kIdVersion);
  uint8_t family = head[1];
  uint16_t port = r.u16();
  uint64_t secret = r.u64();
  const uint8_t* raw = r.bytes(16);
  uint32_t scope = r.u32();
  uint32_t reserved = r.u32();
  uint64_t sum = r.u64();
  if (sum != wire::hash64(id.internal, kChecksummed))
    return LOOM_ERROR(kInvalidArgument, "invalid unique id: checksum mismatch (corrupted id)");
  if (reserved != 0) return LOOM_ERROR(kInvalidArgument, "invalid unique id: reserved field set");
  for (size_t i = kUsed; i < sizeof(id.internal); ++i)
    if (id.internal[i] != 0)
      return LOOM_ERROR(kInvalidArgument, "invalid unique id: trailing byte {} is not zero", i);
  if (family != 4 && family != 6)
    return LOOM_ERROR(kInvalidArgument, "invalid unique id: address family {}", family);
  if (port == 0) return LOOM_ERROR(kInvalidArgument, "invalid unique id: port 0");
  std::string addr;
  wire::Writer w(&addr);
  w.u16(family);
  w.u16(port);
  w.bytes(raw, 16);
  w.u32(scope);
  wire::Reader ar(addr.data(), addr.size());
  auto root = ar.addr();
  if (!root.isOk()) return root.status().withContext("invalid unique id");
  UniqueIdInfo info;
  info.root = root.value();
  info.secret = secret;
  return info;
}

}  // namespace loom
