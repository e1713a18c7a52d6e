// The backend-independent parts of backend.h: dtype names and sizes, attention FLOPs,
// buffer views, and make_backend's dispatch to the implementations.
#include "hetpar/runtime/backend.h"

#include <fmt/format.h>

#include "cpu/cpu_backend.h"
#include "hetpar/core/attention_mask.h"
#include "hetpar/core/check.h"
#ifdef HETPAR_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

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
  const double pairs = causal ? causal_score_pairs(seq_q, seq_kv, window)
                              : static_cast<double>(seq_q) * static_cast<double>(seq_kv);
  return 4.0 * static_cast<double>(batch) * heads * head_dim * pairs;
}

Buffer Buffer::slice(Bytes offset, Bytes size) const {
  HETPAR_CHECK(offset.count() >= 0 && size.count() >= 0 && offset + size <= size_,
               "slice [{}, +{}) of a buffer of {} bytes", offset.count(), size.count(),
               size_.count());
  return Buffer(static_cast<std::byte*>(data_) + offset.count(), size, nullptr, nullptr);
}

int elementwise_inputs(ElementwiseOp op) {
  switch (op) {
    case ElementwiseOp::kCopy:
    case ElementwiseOp::kScale:
    case ElementwiseOp::kGelu:
    case ElementwiseOp::kRmsNorm:
      return 1;
    case ElementwiseOp::kAdd:
    case ElementwiseOp::kMul:
    case ElementwiseOp::kGeluBackward:
    case ElementwiseOp::kRmsNormBackward:
      return 2;
  }
  return 0;
}

std::vector<std::string> available_backends() {
#ifdef HETPAR_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

Result<std::unique_ptr<Backend>> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") {
#ifdef HETPAR_HAVE_CUDA
    return make_cuda_backend();
#else
    return Status::unavailable(
        "backend \"cuda\" is not built in (configure with CUDA and NCCL found, -DHETPAR_CUDA=ON)");
#endif
  }
  return Status::invalid_argument(
      fmt::format("unknown backend \"{}\" (expected cpu or cuda)", name));
}

}  // namespace hetpar::runtime
