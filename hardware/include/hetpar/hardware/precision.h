// Precision: the number formats GEMMs and attention run in (fp32 SIMT, tf32, bf16, fp16,
// fp8), with their storage size. Names are the lower-case spellings used in JSON
// ("bf16"); parse_precision() accepts exactly those.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hetpar::hardware {

enum class Precision { kFp32, kTf32, kBf16, kFp16, kFp8 };

inline constexpr std::array<Precision, 5> kAllPrecisions = {
    Precision::kFp32, Precision::kTf32, Precision::kBf16, Precision::kFp16, Precision::kFp8};

/// Index of `p` in kAllPrecisions (for per-precision tables).
constexpr size_t precision_index(Precision p) {
  return static_cast<size_t>(p);
}

/// Bytes one element occupies in memory (tf32 is stored as fp32).
int64_t bytes_per_element(Precision p);
std::string_view to_string(Precision p);
std::optional<Precision> parse_precision(std::string_view name);

}  // namespace hetpar::hardware
