// Whole-file reads and all-or-nothing writes. A failed run must leave no half-written
// output, so writes go to a temporary file in the same directory and are renamed into
// place only when complete.
#pragma once

#include <string>
#include <string_view>

#include "hetpar/core/status.h"

namespace hetpar {

Result<std::string> read_file(const std::string& path);
/// Writes `content` to `path` atomically (temp file + rename). On failure nothing is left.
Status write_file_atomically(const std::string& path, std::string_view content);

}  // namespace hetpar
