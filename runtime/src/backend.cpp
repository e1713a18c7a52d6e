// The backend-independent parts of backend.h: dtype names and sizes, attention FLOPs.
#include "hetpar/runtime/backend.h"

#include <fmt/format.h>

namespace hetpar::runtime {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBf16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

std::string_view to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kBf16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    case DType::kF8E4M3:
      return "fp8";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view s) {
  for (DType t : {DType::kF32, DType::kBf16, DType::kF16, DType::kF8E4M3}) {
    if (s == to_string(t)) return t;
  }
  return Status::invalid_argument(
      fmt::format("unknown dtype \"{}\" (expected fp32, bf16, fp16 or fp8)", s));
}

double AttentionDesc::forward_flops() const {
  double f = 4.0 * static_cast<double>(batch) * heads * seq_q * seq_kv * head_dim;
  return causal ? f / 2 : f;
}

}  // namespace hetpar::runtime
