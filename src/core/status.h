// Status and Result<T>: how every internal function reports failure. A Status is a code (the public
// loomResult_t) and a message; it is cheap when OK. Propagate with LOOM_TRY / LOOM_ASSIGN.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "loom/loom.h"

namespace loom {

enum class Code : int {
  kOk = loomSuccess,
  kCuda = loomUnhandledCudaError,
  kSystem = loomSystemError,
  kInternal = loomInternalError,
  kInvalidArgument = loomInvalidArgument,
  kInvalidUsage = loomInvalidUsage,
  kRemote = loomRemoteError,
  kInProgress = loomInProgress,
  kTimeout = loomTimeout,
  kAborted = loomAborted,
};

// Why an operation failed, where the code alone does not say it and callers act on it.
enum class Cause : uint8_t {
  kUnspecified,
  // The peer's end went away: it closed or reset the connection, its process is gone, it marked
  // itself failed or closed, or it deregistered a buffer in use (an RDMA remote access error).
  // Often the consequence of the peer's own failure, whose report then names the real cause.
  kPeerGone,
  // The peer's message does not fit the receive posted for it: another tag, or more bytes (or,
  // for a reduction, other bytes) than posted. Between ranks, the sign of calls that differ
  // (collective, count, datatype, op or root).
  kMismatch,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == Code::kOk; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  loomResult_t result() const { return static_cast<loomResult_t>(code_); }
  Cause cause() const { return cause_; }

  // Prefixes context to the message ("while connecting to rank 3: ..."); the cause stays.
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return rewritten(code_, context + ": " + message_);
  }
  // The same failure under another code and message; the cause stays.
  Status rewritten(Code code, std::string message) const {
    Status s(code, std::move(message));
    s.cause_ = cause_;
    return s;
  }
  Status withCause(Cause cause) const {
    Status s = *this;
    if (!s.isOk()) s.cause_ = cause;
    return s;
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
  Cause cause_ = Cause::kUnspecified;
};

template <typename... Args>
Status makeError(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define LOOM_ERROR(code, ...) ::loom::makeError(::loom::Code::code, __VA_ARGS__)

// errno-based system error: "<what>: <strerror(err)>".
Status systemError(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool isOk() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  Status status() const { return isOk() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

// Returns the Status of expr from the enclosing function if it failed.
#define LOOM_TRY(expr)                     \
  do {                                     \
    ::loom::Status _loom_st = (expr);      \
    if (!_loom_st.isOk()) return _loom_st; \
  } while (0)

// LOOM_ASSIGN(auto x, resultExpr): x = value, or return the Status.
#define LOOM_ASSIGN(lhs, expr) LOOM_ASSIGN_IMPL(LOOM_CONCAT(_loom_r_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                     \
  if (!tmp.isOk()) return tmp.status();  \
  lhs = std::move(tmp).value()
