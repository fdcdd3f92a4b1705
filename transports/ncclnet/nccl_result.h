// NCCL's result codes and Loom's, in both directions of the net-plugin ABI: Loom's transports
// exported to NCCL (plugin/) return ncclResultOf(status); a plugin imported as a transport
// (ncclnet_transport.cc) turns what it returns into codeOfNcclResult(rc). One table holds both.
#pragma once

#include "src/core/status.h"
#include "transports/ncclnet/nccl_net_abi.h"

namespace loom {
namespace ncclnet {

// What NCCL is told about a Loom failure: the same kind where NCCL has one, ncclRemoteError for a
// timeout (a peer that stopped answering), else ncclInternalError.
ncclabi::ncclResult_t ncclResultOf(Code code);
// The same, except that a message that does not fit its receive (Cause::kMismatch: another tag,
// more bytes) is ncclInvalidUsage, the calls of the two sides not matching, rather than
// ncclRemoteError, which NCCL reserves for a network error or a peer that went away.
ncclabi::ncclResult_t ncclResultOf(const Status& st);

// The Loom code of an NCCL result (kInternal for any NCCL has no Loom kind for, and for
// ncclInProgress, which no net call may return).
Code codeOfNcclResult(ncclabi::ncclResult_t rc);

// "ncclSystemError", ...; "unknown ncclResult_t" for a value NCCL does not define.
const char* ncclResultName(ncclabi::ncclResult_t rc);

}  // namespace ncclnet
}  // namespace loom
