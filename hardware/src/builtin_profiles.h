// The built-in profiles/*.json, compiled in by hetpar_embed_files (CMakeLists.txt).
#pragma once

#include <span>

#include "hetpar/core/embedded_file.h"

namespace hetpar::hardware::detail {
std::span<const EmbeddedFile> builtin_profile_files();
}  // namespace hetpar::hardware::detail
