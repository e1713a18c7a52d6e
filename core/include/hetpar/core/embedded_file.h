// A data file compiled into the binary (model zoo entries, built-in hardware profiles);
// see cmake/EmbedFiles.cmake. `name` is the file name without directory and extension.
#pragma once

#include <string_view>

namespace hetpar {

struct EmbeddedFile {
  std::string_view name;
  std::string_view text;
};

}  // namespace hetpar
