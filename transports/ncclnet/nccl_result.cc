#include "transports/ncclnet/nccl_result.h"

namespace loom {
namespace ncclnet {
namespace {

using namespace ncclabi;  // NOLINT: the ABI's own names read best unqualified here

struct ResultRow {
  ncclResult_t nccl;
  const char* name;
  Code code;  // what the result means to Loom; a Loom code goes back to its first row
};
constexpr ResultRow kResults[] = {
    {ncclSuccess, "ncclSuccess", Code::kOk},
    {ncclUnhandledCudaError, "ncclUnhandledCudaError", Code::kCuda},
    {ncclSystemError, "ncclSystemError", Code::kSystem},
    {ncclInternalError, "ncclInternalError", Code::kInternal},
    {ncclInvalidArgument, "ncclInvalidArgument", Code::kInvalidArgument},
    {ncclInvalidUsage, "ncclInvalidUsage", Code::kInvalidUsage},
    {ncclRemoteError, "ncclRemoteError", Code::kRemote},
    {ncclInProgress, "ncclInProgress", Code::kInternal},
};

const ResultRow* rowOf(ncclResult_t rc) {
  for (const ResultRow& r : kResults)
    if (r.nccl == rc) return &r;
  return nullptr;
}

}  // namespace

ncclResult_t ncclResultOf(Code code) {
  if (code == Code::kTimeout) return ncclRemoteError;  // a peer that stopped answering
  for (const ResultRow& r : kResults)
    if (r.code == code) return r.nccl;
  return ncclInternalError;  // kInProgress, kAborted
}

ncclResult_t ncclResultOf(const Status& st) {
  if (st.cause() == Cause::kMismatch) return ncclInvalidUsage;
  return ncclResultOf(st.code());
}

Code codeOfNcclResult(ncclResult_t rc) {
  const ResultRow* r = rowOf(rc);
  return r ? r->code : Code::kInternal;
}

const char* ncclResultName(ncclResult_t rc) {
  const ResultRow* r = rowOf(rc);
  return r ? r->name : "unknown ncclResult_t";
}

}  // namespace ncclnet
}  // namespace loom
