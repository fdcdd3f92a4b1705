// Turning verbs failures into messages a person can act on: the status, the peer, the operation
// and what usually causes it.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "transports/ib/verbs_api.h"

namespace loom {
namespace ib {

// What usually causes a completion status (empty when there is nothing useful to say).
const char* completionHint(ibv_wc_status status);

// One line: "<op> to <peer> (QP <qpn>) failed: <status name> (<code>), vendor error <v>: <hint>".
std::string describeCompletion(const VerbsApi& api, const ibv_wc& wc, const std::string& op,
                               const std::string& peer);

// What an asynchronous event means for the comms it touches ("port 1 of mlx5_0 went down: ...").
const char* asyncEventHint(ibv_event_type type);

}  // namespace ib
}  // namespace loom
