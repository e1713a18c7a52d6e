// Kernel: what a compute task runs, for an executor that runs the task for real
// (executor/). The simulator ignores kernels — a task's duration is what it replays — and
// the planner attaches them when lowering asks for it (planner::LowerOptions::kernels).
// Generic compute only, like the rest of sim/: GEMM shapes, attention shapes, memory-bound
// traffic; no notion of which parallelism produced a shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "hetpar/core/ids.h"

namespace hetpar::sim {

enum class KernelKind : uint8_t {
  kGemm,               // batch x C[m,n] = A[m,k] B[k,n]
  kAttentionForward,   // softmax(Q K^T) V over [batch, seq, heads, head_dim] tensors
  kAttentionBackward,  // its gradients dQ, dK, dV
  kMemory,             // memory-bound: `bytes` of HBM traffic (read + written)
};
std::string_view to_string(KernelKind k);

struct Kernel {
  KernelKind kind = KernelKind::kGemm;
  int64_t m = 0, n = 0, k = 0;  // gemm
  int64_t batch = 1;            // gemm: independent products; attention: samples
  int64_t heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;  // attention
  bool causal = false;                                                   // attention
  int64_t bytes = 0;                                                     // memory
  int element_bytes = 2;  // operand precision: 1 fp8, 2 bf16 (or fp16), 4 fp32
  // gemm: the product is added into an fp32 output (beta 1), as a weight gradient is into
  // Megatron's fp32 main_grad when gradient accumulation is fused into the wgrad GEMM.
  bool accumulate_fp32 = false;
  // The trainer's host calls that issue it (its host cost, planner's lowering): a gemm whose
  // batch the trainer launches one product at a time (a grouped linear's experts) has
  // `batch`. A memory kernel of 0 bytes is a host call alone (an asynchronous copy to the
  // host, a memset) whose GPU time the model leaves out. The executor ignores it.
  int64_t launches = 1;
  // attention: a value's width where it differs from head_dim (multi-head latent
  // attention); 0: head_dim.
  int64_t v_head_dim = 0;
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  // attention: causal with a sliding window, each query seeing itself and the `window` keys
  // before it (models::AttentionShape::window); 0: none.
  int64_t window = 0;
  bool windowed() const { return causal && window > 0 && window < seq_kv; }
  // attention: a learned softmax logit per head (models::AttentionShape::sinks); the
  // executor runs it, its time is the call's without.
  bool sinks = false;
  // As models::AttentionShape::score_width(): the mean of the two widths.
  int64_t score_width() const { return (head_dim + value_dim()) / 2; }

  /// The model-FLOP convention of models/op_graph.h: GEMM 2mnk·batch; attention forward
  /// 2·b·h·(d + value_dim) per scored pair, sq·skv of them, causal its
  /// causal_score_pairs(seq_q, seq_kv, window) (core/attention_mask.h: bottom-right aligned,
  /// sq·skv / 2 for a square call), backward twice that; memory 0.
  double flops() const;
  bool operator==(const Kernel&) const = default;
};

inline Kernel gemm_kernel(int64_t m, int64_t n, int64_t k, int64_t batch, int element_bytes) {
  return {.kind = KernelKind::kGemm,
          .m = m,
          .n = n,
          .k = k,
          .batch = batch,
          .element_bytes = element_bytes};
}
inline Kernel memory_kernel(int64_t bytes) {
  return {.kind = KernelKind::kMemory, .bytes = bytes};
}

/// "gemm 512x1024x256 x2 bf16", "attn_fwd b1 h8/8 512x512 d64 causal", "mem 4096 B".
std::string describe(const Kernel& k);

using KernelListId = Id<struct KernelListTag>;  // a list of kernels a TaskGraph holds

}  // namespace hetpar::sim
