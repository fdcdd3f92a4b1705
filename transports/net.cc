#include "transports/net.h"

#include <sched.h>

namespace loom {
namespace net {

void Transport::waitActivity(void* const*, int, void*, int) { sched_yield(); }

}  // namespace net
}  // namespace loom
