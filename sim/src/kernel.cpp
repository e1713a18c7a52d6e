#include "hetpar/sim/kernel.h"

#include <fmt/format.h>

#include "hetpar/core/attention_mask.h"

namespace hetpar::sim {

std::string_view to_string(KernelKind k) {
  switch (k) {
    case KernelKind::kGemm:
      return "gemm";
    case KernelKind::kAttentionForward:
      return "attn_fwd";
    case KernelKind::kAttentionBackward:
      return "attn_bwd";
    case KernelKind::kMemory:
      return "mem";
  }
  return "?";
}

double Kernel::flops() const {
  switch (kind) {
    case KernelKind::kGemm:
      return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
             static_cast<double>(batch);
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward: {
      const double per_pair = 2.0 * static_cast<double>(batch) * static_cast<double>(heads) *
                              static_cast<double>(head_dim + value_dim());
      const double f = causal ? per_pair * causal_score_pairs(seq_q, seq_kv, window)
                              : per_pair * static_cast<double>(seq_q) * static_cast<double>(seq_kv);
      return kind == KernelKind::kAttentionBackward ? 2 * f : f;
    }
    case KernelKind::kMemory:
      return 0;
  }
  return 0;
}

namespace {
std::string_view precision(int element_bytes) {
  return element_bytes == 1 ? "fp8" : element_bytes == 4 ? "fp32" : "bf16";
}
}  // namespace

std::string describe(const Kernel& k) {
  switch (k.kind) {
    case KernelKind::kGemm:
      return fmt::format("gemm {}x{}x{} x{} {}{}{}", k.m, k.n, k.k, k.batch,
                         precision(k.element_bytes), k.accumulate_fp32 ? " += fp32" : "",
                         k.launches > 1 ? fmt::format(" in {} launches", k.launches) : "");
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward:
      return fmt::format("{} b{} h{}/{} {}x{} d{}{}{}{}", to_string(k.kind), k.batch, k.heads,
                         k.kv_heads, k.seq_q, k.seq_kv, k.head_dim, k.causal ? " causal" : "",
                         k.windowed() ? fmt::format(" window {}", k.window) : "",
                         k.sinks ? " sinks" : "");
    case KernelKind::kMemory:
      return k.bytes > 0 ? fmt::format("mem {} B", k.bytes) : std::string("host call");
  }
  return "?";
}

}  // namespace hetpar::sim
