// The InfiniBand verbs transport ("IB"): net::Transport over reliable-connected queue pairs, with
// the payload moved by RDMA write and GPUDirect RDMA where the NIC and the topology allow it.
// libibverbs is loaded at run time (verbs_api.h).
#pragma once

#include <memory>
#include <string>

#include "transports/ib/verbs_api.h"
#include "transports/net.h"

namespace loom {

// The transport over the devices and ports LOOM_IB_HCA selects, with the verbs library
// LOOM_IBVERBS_LIB names; nullptr, with the reason in *whyNot (library missing, no device, no
// active port, ...), when it cannot run here.
std::unique_ptr<net::Transport> makeIbTransport(std::string* whyNot);

}  // namespace loom
