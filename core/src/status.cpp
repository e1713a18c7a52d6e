#include "hetpar/core/status.h"

#include <cstdio>
#include <cstdlib>

#include "hetpar/core/check.h"

namespace hetpar {

std::string Status::to_string() const {
  const char* name = "ok";
  switch (code_) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      name = "invalid argument";
      break;
    case Code::kNotFound:
      name = "not found";
      break;
    case Code::kIoError:
      name = "I/O error";
      break;
    case Code::kUnavailable:
      name = "unavailable";
      break;
    case Code::kInternal:
      name = "internal error";
      break;
  }
  return fmt::format("{}: {}", name, message_);
}

Status Status::with_context(std::string_view prefix) const {
  if (is_ok()) return *this;
  return Status(code_, fmt::format("{}: {}", prefix, message_));
}

namespace detail {
void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "hetpar: CHECK failed at %s:%d: %s%s%s\n", file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace hetpar
