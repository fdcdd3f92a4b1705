// The header a sender writes in front of the payload of each slot of a ring (shm_transport.h), and
// the receiver's check of it. The header lies in memory that the sending process writes: the
// receiver checks it before it uses any of it, so that a corrupt header (a peer's bug, a stray
// write) fails the receive instead of making it read or write outside the slot, the message or
// the posted buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/status.h"
#include "transports/shm/host_area.h"

namespace loom::shm {

enum SlotKind : uint32_t { kData = 1, kRts = 2 };

// The 64-byte header in front of each slot's payload.
struct SlotHdr {
  uint32_t kind;
  int32_t tag;
  uint64_t msgBytes;  // the whole message
  uint64_t offset;    // kData: where this chunk goes in the message
  uint64_t chunk;     // kData: payload bytes in this slot
  uint64_t addr;      // kRts: the message in the sender's address space
  uint64_t serial;    // kRts from a shared allocation (loomMemAlloc): its serial, else 0
  uint64_t fd;        //   the allocation's memfd in the sender's fd table
  uint64_t allocOff;  //   the message's offset in the allocation
};
static_assert(sizeof(SlotHdr) == kLine, "slot header is one cache line");

// What the receive that takes the slot expects.
struct SlotExpect {
  int tag = 0;
  size_t capacity = 0;   // bytes of the posted buffer
  bool reduce = false;   // a reduction: the message must be exactly capacity bytes
  bool started = false;  // an earlier slot began this message (then msgBytes and moved are set)
  size_t msgBytes = 0;   // the message's size, as its first slot said
  size_t moved = 0;      // bytes of it delivered so far
  size_t slotBytes = 0;  // payload bytes a slot holds (Options::slotBytes)
};

// OK when the receive may use the slot as its header says: a data chunk at offset `moved` of at
// most slotBytes bytes that stays inside the message, or (first slot only) a single-copy message,
// each of a message that fits the posted buffer. Otherwise kRemote with Cause::kMismatch for a
// message that does not fit the receive (another tag, too large, not the reduction's size), or
// kInternal for a corrupt header.
Status checkSlot(const SlotHdr& h, const SlotExpect& e);

}  // namespace loom::shm
