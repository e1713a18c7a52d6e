#include <fmt/format.h>

#include <cstdio>

#include "commands.h"

namespace hetpar::cli {

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case Status::Code::kOk:
      return 0;
    case Status::Code::kInvalidArgument:
    case Status::Code::kNotFound:
    case Status::Code::kIoError:
      return 2;
    default:
      return 1;
  }
}

int report_error(const Status& s) {
  fmt::print(stderr, "hetpar: error: {}\n", s.message());
  return exit_code_for(s);
}

}  // namespace hetpar::cli
