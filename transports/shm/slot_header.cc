#include "transports/shm/slot_header.h"

#include <climits>

namespace loom::shm {

Status checkSlot(const SlotHdr& h, const SlotExpect& e) {
  if (!e.started) {
    if (h.tag != e.tag)
      return LOOM_ERROR(kRemote, "message tag {:#x} does not match the posted receive's tag {:#x}",
                        h.tag, e.tag)
          .withCause(Cause::kMismatch);
    if (h.msgBytes > e.capacity)
      return LOOM_ERROR(kRemote, "message truncated: {} bytes into a buffer of {}", h.msgBytes,
                        e.capacity)
          .withCause(Cause::kMismatch);
    if (e.reduce && h.msgBytes != e.capacity)
      return LOOM_ERROR(kRemote, "message of {} bytes where a reduction of {} was posted",
                        h.msgBytes, e.capacity)
          .withCause(Cause::kMismatch);
  } else if (h.tag != e.tag || h.msgBytes != e.msgBytes) {
    return LOOM_ERROR(kInternal,
                      "shm: corrupt slot (a message of {} bytes with tag {:#x} continues as {} "
                      "bytes with tag {:#x})",
                      e.msgBytes, e.tag, h.msgBytes, h.tag);
  }
  const uint64_t msgBytes = h.msgBytes;
  const uint64_t moved = e.started ? e.moved : 0;
  if (h.kind == kRts) {
    // A single-copy message is one slot: the first of its message.
    if (e.started || (h.serial != 0 && h.fd > static_cast<uint64_t>(INT_MAX)))
      return LOOM_ERROR(kInternal, "shm: corrupt slot (single copy of {} bytes, fd {}{})",
                        h.msgBytes, h.fd, e.started ? ", after a chunk" : "");
    return Status();
  }
  if (h.kind != kData || moved > msgBytes || h.offset != moved || h.chunk > msgBytes - moved ||
      h.chunk > e.slotBytes || (h.chunk == 0 && msgBytes != moved))
    return LOOM_ERROR(kInternal, "shm: corrupt slot (kind {}, offset {}, chunk {})", h.kind,
                      h.offset, h.chunk);
  return Status();
}

}  // namespace loom::shm
