// Status and StatusOr<T>: how every tributary call reports failure.
//
// Contract: no exception crosses the public API. A function that can fail returns a Status (or a
// StatusOr<T> carrying either a value or a non-OK Status). Messages are written for the person who
// reads them: what happened, which argument/rank/peer, and what to do about it.
// Thread safety: Status and StatusOr are values; distinct objects may be used from distinct threads.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "tributary/export.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed
  kNotFound,           // a named thing (backend, option, key) does not exist
  kUnimplemented,      // the backend cannot do this (device, dtype, op)
  kFailedPrecondition, // the object is in a state that forbids the call (e.g. after a fatal error)
  kDeadlineExceeded,   // a blocking call ran past its timeout
  kUnavailable,        // a peer or resource cannot be reached
  kAborted,            // a collective was abandoned (peer died, mismatch)
  kOutOfRange,         // end of data, index out of range
  kResourceExhausted,  // out of memory
  kInternal,           // a bug in tributary or a vendor library
  kDataLoss,           // stored data is corrupt or truncated (a bad CRC, a short record)
};

// The lower-case name of a code ("invalid_argument").
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "invalid_argument: <message>", or "ok".
  std::string to_string() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status deadline_exceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }

// Either a T or a non-OK Status. Accessing value() of an error is a programming error (asserts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}             // NOLINT: implicit by design
  StatusOr(T&& value) : value_(std::move(value)) {}       // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = internal_error("StatusOr constructed from an OK Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define TRIBUTARY_RETURN_IF_ERROR(expr)                 \
  do {                                                  \
    ::tributary::Status _trib_status = (expr);          \
    if (!_trib_status.ok()) return _trib_status;        \
  } while (0)

#define TRIBUTARY_CONCAT_INNER(a, b) a##b
#define TRIBUTARY_CONCAT(a, b) TRIBUTARY_CONCAT_INNER(a, b)
// TRIBUTARY_ASSIGN_OR_RETURN(auto x, f()): assigns the value or returns the error.
#define TRIBUTARY_ASSIGN_OR_RETURN(lhs, expr) \
  TRIBUTARY_ASSIGN_OR_RETURN_IMPL(TRIBUTARY_CONCAT(_trib_or_, __LINE__), lhs, expr)
#define TRIBUTARY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
