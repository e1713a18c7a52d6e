// HETPAR_CHECK: a broken invariant inside the libraries (a bug, never bad user input).
// It prints the condition, the place and an fmt-formatted message, then aborts. It stays
// on in release builds: the checks are cheap and a wrong simulation is worse than none.
#pragma once

#include <fmt/format.h>

namespace hetpar::detail {
[[noreturn]] void check_failed(const char* cond, const char* file, int line,
                               const std::string& msg);
inline std::string check_message() {
  return {};
}
template <class... Args>
std::string check_message(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}
}  // namespace hetpar::detail

#define HETPAR_CHECK(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      ::hetpar::detail::check_failed(#cond, __FILE__, __LINE__,                     \
                                     ::hetpar::detail::check_message(__VA_ARGS__)); \
  } while (0)
