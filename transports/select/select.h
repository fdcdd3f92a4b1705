// Which network transport a process uses between hosts: LOOM_NET_PLUGIN (an external NCCL net
// plugin), LOOM_NET (ib, socket, or the plugin's network name), or automatically the IB transport
// when a device has an active port and the socket transport otherwise.
#pragma once

#include <memory>

#include "src/core/status.h"
#include "transports/net.h"

namespace loom {

// The process-wide network transport, chosen on the first call and kept (leaked on purpose: comms
// may be destroyed during static teardown). allowPlugin false ignores LOOM_NET_PLUGIN (the NCCL
// plugin Loom exports must not load a plugin itself). An error names what was asked for and why
// it cannot run; it is returned again by later calls.
Result<net::Transport*> networkTransport(bool allowPlugin);

// The same choice made afresh, owned by the caller (networkTransport makes it once per process;
// tests call this to check each choice and its errors).
Result<std::unique_ptr<net::Transport>> makeNetworkTransport(bool allowPlugin);

}  // namespace loom
