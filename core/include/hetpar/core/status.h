// Status and Result<T>: how libraries report bad input and failed I/O (LevelDB style).
// A Status is ok or carries a code and a message naming what is wrong, e.g.
// `cluster.nodes[2].gpu: unknown profile "h300"`. Libraries never exit(); only cli/
// turns a failed Status into an exit code. Broken invariants use HETPAR_CHECK instead.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace hetpar {

class Status {
 public:
  enum class Code { kOk, kInvalidArgument, kNotFound, kIoError, kUnavailable, kInternal };

  Status() = default;
  static Status ok() { return Status(); }
  static Status invalid_argument(std::string msg) {
    return {Code::kInvalidArgument, std::move(msg)};
  }
  static Status not_found(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status io_error(std::string msg) { return {Code::kIoError, std::move(msg)}; }
  static Status unavailable(std::string msg) { return {Code::kUnavailable, std::move(msg)}; }
  static Status internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }

  bool is_ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid argument: <message>" ("ok" when ok).
  std::string to_string() const;
  /// The same status with `prefix: ` put before the message (adds context on the way up).
  Status with_context(std::string_view prefix) const;

 private:
  Status(Code c, std::string m) : code_(c), message_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

/// Either a value or a non-ok Status. REQUIRES: never built from an ok Status.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status s) : v_(std::move(s)) {}     // NOLINT: implicit by design

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace hetpar

/// Return early from a function returning Status or Result<T> when `expr` fails.
#define HETPAR_RETURN_IF_ERROR(expr)    \
  do {                                  \
    ::hetpar::Status _hp_st = (expr);   \
    if (!_hp_st.is_ok()) return _hp_st; \
  } while (0)

#define HETPAR_CONCAT_INNER(a, b) a##b
#define HETPAR_CONCAT(a, b) HETPAR_CONCAT_INNER(a, b)
/// `HETPAR_ASSIGN_OR_RETURN(auto x, make_x());` unwraps a Result or returns its Status.
#define HETPAR_ASSIGN_OR_RETURN(lhs, expr)             \
  auto HETPAR_CONCAT(_hp_res_, __LINE__) = (expr);     \
  if (!HETPAR_CONCAT(_hp_res_, __LINE__).is_ok())      \
    return HETPAR_CONCAT(_hp_res_, __LINE__).status(); \
  lhs = std::move(HETPAR_CONCAT(_hp_res_, __LINE__)).value()
