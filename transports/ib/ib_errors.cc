#include "transports/ib/ib_errors.h"

#include <fmt/format.h>

namespace loom {
namespace ib {

const char* completionHint(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer did not acknowledge: it is dead or unreachable, or the path (cable, switch, "
             "port, RoCE routing) is down";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "the peer had no receive posted (receiver not ready) for too long";
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer refused the access: wrong rkey, or an address range outside its "
             "registration (a buffer deregistered or freed too early)";
    case IBV_WC_LOC_PROT_ERR:
      return "a local buffer is not registered, or not with this protection domain";
    case IBV_WC_WR_FLUSH_ERR:
      return "the queue pair was already in the error state: see the first error reported";
    case IBV_WC_LOC_LEN_ERR:
      return "a message was longer than the receive buffer";
    case IBV_WC_REM_INV_REQ_ERR:
      return "the peer found the request invalid (message too long, or an access it does not "
             "allow)";
    case IBV_WC_REM_OP_ERR:
      return "the peer could not complete the operation (its queue pair failed)";
    case IBV_WC_LOC_QP_OP_ERR:
      return "the local queue pair rejected the work request (queue too small, bad opcode)";
    case IBV_WC_BAD_RESP_ERR:
      return "unexpected response from the peer (mismatched QP configuration?)";
    case IBV_WC_REM_ABORT_ERR:
      return "the peer aborted the operation";
    default:
      return "";
  }
}

std::string describeCompletion(const VerbsApi& api, const ibv_wc& wc, const std::string& op,
                               const std::string& peer) {
  const char* hint = completionHint(wc.status);
  return fmt::format("{} to {} (local QP {:#x}) failed: {} (status {}, vendor error {:#x}){}{}", op,
                     peer, wc.qp_num, api.wcStatusStr(wc.status), static_cast<int>(wc.status),
                     wc.vendor_err, *hint ? ": " : "", hint);
}

const char* asyncEventHint(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_PORT_ERR:
      return "the port went down (link lost: cable, switch or peer port)";
    case IBV_EVENT_DEVICE_FATAL:
      return "the adapter failed and must be reset";
    case IBV_EVENT_QP_FATAL:
      return "a queue pair hit a fatal error";
    case IBV_EVENT_QP_REQ_ERR:
      return "the peer reported an invalid request on a queue pair";
    case IBV_EVENT_QP_ACCESS_ERR:
      return "the peer reported an access violation on a queue pair";
    case IBV_EVENT_CQ_ERR:
      return "a completion queue overflowed";
    default:
      return "";
  }
}

}  // namespace ib
}  // namespace loom
