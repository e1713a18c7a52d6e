#include "hetpar/models/op_graph.h"

#include <fmt/format.h>

#include <cmath>
#include <string_view>
#include <utility>

#include "hetpar/core/attention_mask.h"
#include "hetpar/core/check.h"

namespace hetpar::models {

std::string_view to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kLoss:
      return "loss";
  }
  return "?";
}

bool is_matmul(OpKind kind) {
  return kind == OpKind::kGemm || kind == OpKind::kAttention;
}

int64_t Op::output_width() const {
  if (parts.empty()) return gemms.empty() ? 0 : gemms.front().n;
  int64_t n = 0;
  for (int64_t p : parts) n += p;
  return n;
}

Flops attention_forward_flops(const AttentionShape& s) {
  const double per_pair = 2.0 * s.batch * s.heads * static_cast<double>(s.head_dim + s.value_dim());
  if (s.windowed())  // (self-attention: seq_q == seq_kv)
    return Flops(per_pair * causal_score_pairs(s.seq_q, s.window));
  const double full = per_pair * static_cast<double>(s.seq_q) * static_cast<double>(s.seq_kv);
  return Flops(s.causal ? full / 2 : full);
}

namespace {

// selective_op: the share of a layer op's forward re-run (see Recompute::kSelectiveOp).
double selective_op_share(const Op& op) {
  if (op.layer < 0) return 0;  // torchtitan checkpoints the layers only
  switch (op.kind) {
    case OpKind::kAttention:
      return 0;  // the flash kernel's output and log-sum-exp are kept
    case OpKind::kGemm:
      // Matmuls 1-3 q, k, v (k re-run), 4 the output projection (re-run), 5-6 gate and up
      // (up re-run) or a plain fc1 (5, kept), then the down projection (no backward needs
      // its output): of a qkv or gate-and-up op its second part re-runs.
      if (op.name == "attn_out") return 1;
      if ((op.name == "qkv" || op.name == "mlp_fc1") && op.parts.size() >= 2)
        return static_cast<double>(op.parts[1]) / static_cast<double>(op.output_width());
      return 0;
    default:  // norms, RoPE, the activation, the first residual: re-run; the second is not
      return op.name == "mlp_residual" ? 0 : 1;
  }
}

}  // namespace

double recompute_share(const Op& op, RecomputePolicy policy) {
  switch (policy.kind) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      if (policy.selects(kRecomputeMoe) && is_moe_block_op(op)) return 1;
      if (policy.selects(kRecomputeMlp) && is_dense_mlp_op(op)) return 1;
      if (policy.selects(kRecomputeSharedExperts) && is_shared_expert_op(op)) return 1;
      if (policy.selects(kRecomputeMlaUpProj) && is_latent_up_op(op)) return 1;
      if (op.kind == OpKind::kAttention) return policy.selects(kRecomputeCoreAttn) ? 1 : 0;
      if (policy.selects(kRecomputeLayernorm) && op.layer >= 0 && op.name == "mlp_norm") return 1;
      return policy.selects(kRecomputeMoeAct) && op.name == "expert_act" ? 1 : 0;
    case Recompute::kFull:
      return op.layer >= 0 ? 1 : 0;
    case Recompute::kSelectiveOp:
      return selective_op_share(op);
  }
  return 0;
}

bool is_moe_block_op(const Op& op) {
  if (op.layer < 0) return false;
  const std::string_view n = op.name;
  return n == "router" || n.starts_with("moe_") || n.starts_with("expert_") ||
         n.starts_with("shared_expert_");
}

bool is_dense_mlp_op(const Op& op) {
  if (op.layer < 0) return false;
  const std::string_view n = op.name;
  return n == "mlp_norm" || n == "mlp_fc1" || n == "mlp_act" || n == "mlp_fc2" ||
         n == "mlp_post_norm";
}

bool is_latent_up_op(const Op& op) {
  if (op.layer < 0) return false;
  const std::string_view n = op.name;
  return n == "q_up" || n == "kv_up" || n == "q_proj" || n == "rope";
}

bool is_shared_expert_op(const Op& op) {
  return op.layer >= 0 && op.name.starts_with("shared_expert_");
}

bool is_recomputed(const Op& op, RecomputePolicy policy) {
  return recompute_share(op, policy) > 0;
}

bool keeps_layer_input(Recompute policy) {
  return policy == Recompute::kFull || policy == Recompute::kSelectiveOp;
}

double kept_bytes(const Op& op, RecomputePolicy policy, int dtype_bytes) {
  if (policy.kind == Recompute::kSelective) {
    // Checkpointed shared experts keep their input (the checkpoint's, whatever "layernorm"
    // drops) and nothing else; inside a checkpointed MoE layer, the rules below.
    if (policy.checkpoints_shared_experts() && is_shared_expert_op(op))
      return op.name == "shared_expert_fc1" ? op.saved.as_double() : 0;
    // The ops after a module re-run without its output keep no input (RecomputeModule).
    if (op.layer >= 0 && policy.selects(kRecomputeLayernorm) &&
        (op.name == "router" || op.name == "shared_expert_fc1"))
      return 0;
    // A checkpointed MoE layer keeps its input alone, which the router's saved input is.
    if (policy.selects(kRecomputeMoe) && is_moe_block_op(op))
      return op.name == "router" ? op.saved.as_double() : 0;
    if (policy.selects(kRecomputeMoeAct) && op.name == "expert_fc2") return 0;
    // A checkpointed dense MLP keeps its input alone, which the norm's saved input is.
    if (policy.selects(kRecomputeMlp) && is_dense_mlp_op(op))
      return op.name == "mlp_norm" ? op.saved.as_double() : 0;
    if (op.kind != OpKind::kAttention) return op.saved.as_double();
    const double qkv = static_cast<double>(op.attention->qkv_elements()) * dtype_bytes;
    // Without its re-run up projections' outputs (mla_up_proj) the attention keeps no Q, K,
    // V; re-run itself (core_attn), nothing else.
    const double kept = policy.selects(kRecomputeCoreAttn) ? qkv : op.saved.as_double();
    return policy.selects(kRecomputeMlaUpProj) ? std::max(0.0, kept - qkv) : kept;
  }
  if (policy.kind == Recompute::kSelectiveOp && op.layer >= 0) {
    const double e = dtype_bytes;
    switch (op.kind) {
      case OpKind::kAttention: {  // its output and fp32 log-sum-exp
        const AttentionShape& a = *op.attention;
        const double rows = static_cast<double>(a.batch) * a.seq_q * a.heads;
        return rows * (a.head_dim * e + 4);
      }
      case OpKind::kGemm: {  // the kept products' outputs (q and v; the gate or fc1)
        if (op.name != "qkv" && op.name != "mlp_fc1") return 0;
        double out = 0;
        for (const GemmShape& s : op.gemms) out += static_cast<double>(s.m) * s.n * s.batch;
        return out * (1 - selective_op_share(op)) * e;
      }
      default:
        return 0;
    }
  }
  if (!is_recomputed(op, policy)) return op.saved.as_double();
  return 0;
}

namespace {

// Rough FLOPs per element of the pointwise ops (memory bound; see op_graph.h).
constexpr double kNormFlops = 5;
constexpr double kGeluFlops = 8;
constexpr double kSwigluFlops = 5;
constexpr double kGegluFlops = kGeluFlops + 1;  // the GELU and the gating product
constexpr double kQuickGegluFlops = 7;          // 1.702 g, sigmoid, two products
constexpr double kSquaredReluFlops = 2;
constexpr double kAddFlops = 1;
constexpr double kRopeFlops = 3;
constexpr double kLossFlops = 5;

// An LLM's RoPE, unset without RoPE positions.
std::optional<RopeApply> rope_apply(const LlmSpec& s) {
  if (s.positions != PositionEmbedding::kRope) return std::nullopt;
  return RopeApply{s.block.head_dim(), s.rotary_percent, s.yarn_scales_rope()};
}

MlpActivation mlp_activation(const TransformerSpec& t) {
  return {t.activation, t.activation_clamp > 0, t.glu_linear_offset != 0};
}

int64_t norm_params(Norm n, int64_t h) {
  return n == Norm::kLayerNorm ? 2 * h : h;
}

// Appends ops to a graph; sizes in elements are turned into bytes with the dtype.
class Builder {
 public:
  Builder(OpGraph& g, const ModuleInput& in)
      : g_(g),
        e_(in.dtype_bytes),
        flash_(in.flash_attention),
        fused_(in.fused_projections),
        repeat_kv_(in.repeat_kv) {}

  bool repeat_kv() const { return repeat_kv_; }

  Bytes elems(double n) const { return Bytes(static_cast<int64_t>(n) * e_); }

  /// A GEMM (or several shapes under one op) owning weights k*n*batch (+ bias n*batch) unless
  /// `owns_weights` is false (tied logits); saves `saved_elems` activations.
  Op& gemm(std::string name, int layer, std::vector<GemmShape> shapes, bool bias,
           double saved_elems, bool owns_weights = true) {
    Op op = make(std::move(name), OpKind::kGemm, layer);
    double flops = 0, in = 0, weights = 0, out = 0;
    for (const GemmShape& s : shapes) {
      flops += s.flops();
      in += static_cast<double>(s.m) * s.k * s.batch;
      weights += static_cast<double>(s.k) * s.n * s.batch;
      out += static_cast<double>(s.m) * s.n * s.batch;
      if (owns_weights) op.params += s.k * s.n * s.batch + (bias ? s.n * s.batch : 0);
    }
    op.forward = op.dgrad = op.wgrad = Flops(flops);
    op.read = elems(in + weights);
    op.written = elems(out);
    op.saved = elems(saved_elems);
    op.gemms = std::move(shapes);
    g_.ops.push_back(std::move(op));
    return g_.ops.back();
  }

  /// Without fused projections (ModuleInput::fused_projections), a fused op's parts become
  /// GEMMs of their own, one shape each; the input is still read once.
  void separate(Op& op) const {
    if (fused_ || op.parts.size() < 2 || op.gemms.size() != 1) return;
    const GemmShape s = op.gemms.front();
    op.gemms.clear();
    for (int64_t n : op.parts) op.gemms.push_back({s.m, n, s.k, s.batch});
    op.separate_parts = true;
  }

  /// RoPE over T tokens of the tensors `widths` wide per token (queries, keys): the fused
  /// kernel reads and writes every channel, rotating the `a.rotated` share of them.
  Op& rope(int layer, double T, std::vector<int64_t> widths, RopeApply a) {
    double width = 0;
    for (int64_t w : widths) width += static_cast<double>(w);
    Op& op = pointwise("rope", OpKind::kElementwise, layer, T * width, T * width,
                       kRopeFlops * a.rotated, 0);
    op.parts = std::move(widths);
    op.rope = a;
    return op;
  }

  /// A pointwise op over `in` input and `out` output elements.
  Op& pointwise(std::string name, OpKind kind, int layer, double in, double out,
                double flops_per_out, double saved_elems, int64_t params = 0) {
    Op op = make(std::move(name), kind, layer);
    op.forward = Flops(flops_per_out * out);
    op.dgrad = op.forward * 2;
    op.read = elems(in + static_cast<double>(params));
    op.written = elems(out);
    op.saved = elems(saved_elems);
    op.params = params;
    g_.ops.push_back(std::move(op));
    return g_.ops.back();
  }

  void norm(std::string name, int layer, Norm n, double tokens, int64_t h) {
    pointwise(std::move(name), OpKind::kNorm, layer, tokens * h, tokens * h, kNormFlops, tokens * h,
              norm_params(n, h));
  }

  /// Residual add, with its dropout mask (1 byte per element) saved when training with dropout.
  void residual(std::string name, int layer, double tokens, int64_t h, bool dropout) {
    Op& op = pointwise(std::move(name), OpKind::kElementwise, layer, 2 * tokens * h, tokens * h,
                       kAddFlops, 0);
    if (dropout) op.saved = Bytes(static_cast<int64_t>(tokens * h));
  }

  /// fc1, activation, fc2 over token groups {m, batch} (one group for a dense MLP, one or
  /// two for routed experts: batch experts with m tokens each).
  void mlp(const std::string& prefix, int layer,
           const std::vector<std::pair<int64_t, int64_t>>& groups, int64_t h, int64_t f,
           int64_t out, MlpActivation activation, bool bias) {
    const Activation act = activation.kind;
    // Gated units: gate and up are one GEMM of 2f outputs (Megatron's linear_fc1 is
    // 2 x ffn_hidden wide for gated linear units), so one kernel reads the input once.
    const int64_t branches = is_gated(act) ? 2 : 1;
    std::vector<GemmShape> fc1, fc2;
    double tokens = 0;
    for (auto [m, batch] : groups) {
      fc1.push_back({m, branches * f, h, batch});
      fc2.push_back({m, out, f, batch});
      tokens += static_cast<double>(m) * batch;
    }
    Op& first = gemm(prefix + "fc1", layer, std::move(fc1), bias, tokens * h);
    if (branches == 2) first.parts = {f, f};
    if (prefix == "mlp_") separate(first);  // dense layers only
    pointwise(prefix + "act", OpKind::kElementwise, layer, branches * tokens * f, tokens * f,
              act == Activation::kSwiglu        ? kSwigluFlops
              : act == Activation::kGeglu       ? kGegluFlops
              : act == Activation::kQuickGeglu  ? kQuickGegluFlops
              : act == Activation::kSquaredRelu ? kSquaredReluFlops
                                                : kGeluFlops,
              branches * tokens * f)
        .activation = activation;
    gemm(prefix + "fc2", layer, std::move(fc2), bias, tokens * f);
  }

  Op& attention(int layer, const AttentionShape& s, bool dropout) {
    Op op = make("attention", OpKind::kAttention, layer);
    double qkv = static_cast<double>(s.qkv_elements());
    double o = static_cast<double>(s.batch) * s.seq_q * s.heads * s.value_dim();
    double scores = static_cast<double>(s.batch) * s.heads * s.seq_q * s.seq_kv;
    op.forward = attention_forward_flops(s);
    op.dgrad = op.forward * 2;
    op.read = elems(qkv);
    op.written = elems(o);
    op.saved = elems(qkv);
    if (flash_) {
      op.saved += Bytes(static_cast<int64_t>(4 * s.batch * s.heads * s.seq_q));  // fp32 LSE
    } else {
      // The score matrix goes out and back twice (scores, then probabilities).
      op.read += elems(2 * scores);
      op.written += elems(2 * scores);
      op.saved += elems(scores);  // softmax output
      if (dropout) op.saved += elems(scores) + Bytes(static_cast<int64_t>(scores));
    }
    op.attention = s;
    g_.ops.push_back(std::move(op));
    return g_.ops.back();
  }

  /// Ops made while set belong to a multi-token-prediction depth (Op::mtp).
  void set_mtp(bool mtp) { mtp_ = mtp; }

 private:
  Op make(std::string name, OpKind kind, int layer) const {
    Op op;
    op.name = std::move(name);
    op.kind = kind;
    op.mtp = mtp_;
    op.layer = layer;
    return op;
  }
  OpGraph& g_;
  int e_;
  bool flash_, fused_, repeat_kv_;
  bool mtp_ = false;
};

// How a MoE layer's tokens reach its experts (ModuleInput::moe_capacity_factor,
// ModuleInput::moe_load_imbalance).
struct MoeRouting {
  double capacity_factor = 0;
  double load_imbalance = 1;
};

// Multi-head latent attention after the input norm (Megatron-Core's MLASelfAttention with
// Transformer Engine: q_down and kv_down duplicated Linears, their latents normalised, q_up
// and kv_up column-parallel, RoPE on each query's and the shared key's rope part), through
// the output projection. The query and latent projections read the same normalised input,
// saved once.
void add_latent_attention(Builder& b, const TransformerSpec& t, const MlaSpec& m, int layer,
                          int64_t batch, int64_t seq, bool causal, int64_t window,
                          const std::optional<RopeApply>& rope) {
  const int64_t h = t.hidden, a = t.heads, tokens = batch * seq;
  const double T = static_cast<double>(tokens);
  const int64_t dq = m.qk_head_dim + m.rope_head_dim;
  if (m.q_lora_rank > 0) {
    b.gemm("q_down", layer, {{tokens, m.q_lora_rank, h}}, false, T * h);
    b.norm("q_norm", layer, t.norm, T, m.q_lora_rank);
  }
  // (Its input is q_down's or q_proj's, saved there.)
  b.gemm("kv_down", layer, {{tokens, m.kv_lora_rank + m.rope_head_dim, h}}, false, 0);
  b.norm("kv_norm", layer, t.norm, T, m.kv_lora_rank);
  if (m.q_lora_rank > 0)
    b.gemm("q_up", layer, {{tokens, a * dq, m.q_lora_rank}}, false, T * m.q_lora_rank);
  else
    b.gemm("q_proj", layer, {{tokens, a * dq, h}}, false, T * h);
  b.gemm("kv_up", layer, {{tokens, a * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank}}, false,
         T * m.kv_lora_rank);
  // Megatron-Core's MLA RoPE kernel (fused_mla_yarn_rope_apply) takes YaRN's scale itself.
  if (rope) b.rope(layer, T, {a * m.rope_head_dim, m.rope_head_dim}, {m.rope_head_dim, 1, false});
  b.attention(layer, {batch, a, a, seq, seq, dq, causal, m.v_head_dim, window, t.attention_sinks},
              t.dropout)
      .params = t.attention_sinks ? a : 0;  // a sink logit per head
  b.gemm("attn_out", layer, {{tokens, h, a * m.v_head_dim}}, t.linear_bias, T * a * m.v_head_dim);
}

// One pre-norm transformer layer over `batch` sequences of `seq` tokens; `window` > 0: its
// attention's sliding window (AttentionShape::window).
void add_layer(Builder& b, const TransformerSpec& t, const std::optional<MoeSpec>& moe, int layer,
               int64_t batch, int64_t seq, bool causal, const std::optional<RopeApply>& rope,
               MoeRouting routing, int64_t window = 0) {
  const int64_t h = t.hidden, a = t.heads, g = t.kv_heads, d = t.head_dim();
  const int64_t tokens = batch * seq;
  const double T = static_cast<double>(tokens);
  b.norm("attn_norm", layer, t.norm, T, h);
  if (t.mla) {
    add_latent_attention(b, t, *t.mla, layer, batch, seq, causal, window, rope);
  } else {
    Op& qkv = b.gemm("qkv", layer, {{tokens, (a + 2 * g) * d, h}}, t.qkv_bias, T * h);
    qkv.parts = {a * d, g * d, g * d};
    b.separate(qkv);
    // Megatron's q_layernorm / k_layernorm: a norm over each head's width; saves its input.
    if (t.qk_norm)
      b.pointwise("qk_norm", OpKind::kElementwise, layer, T * (a + g) * d, T * (a + g) * d,
                  kNormFlops, T * (a + g) * d, 2 * norm_params(t.norm, d));
    if (rope) b.rope(layer, T, {a * d, g * d}, {d, rope->rotated, rope->scaled});
    // repeat_kv (ModuleInput::repeat_kv): K and V written out at the query heads' width.
    const bool expand = b.repeat_kv() && g < a;
    if (expand)
      b.pointwise("repeat_kv", OpKind::kElementwise, layer, T * 2 * g * d, T * 2 * a * d, 0, 0);
    b.attention(layer,
                {batch, a, expand ? a : g, seq, seq, d, causal, 0, window, t.attention_sinks},
                t.dropout)
        .params = t.attention_sinks ? a : 0;  // a sink logit per head
    b.gemm("attn_out", layer, {{tokens, h, a * d}}, t.linear_bias, T * a * d);
  }
  if (t.post_norms) b.norm("attn_post_norm", layer, t.norm, T, h);
  b.residual("attn_residual", layer, T, h, t.dropout);
  b.norm("mlp_norm", layer, t.norm, T, h);
  if (!moe) {
    b.mlp("mlp_", layer, {{tokens, 1}}, h, t.ffn_hidden, h, mlp_activation(t), t.linear_bias);
  } else {
    const int64_t E = moe->experts, k = moe->top_k;
    // Routed token copies: all T·k dropless; with token dropping every expert's capacity
    // (ModuleInput::moe_capacity_factor), padded to it.
    const int64_t capacity =
        routing.capacity_factor > 0
            ? static_cast<int64_t>(std::ceil(static_cast<double>(tokens * k) /
                                             static_cast<double>(E) * routing.capacity_factor))
            : 0;
    const int64_t routed = capacity > 0 ? capacity * E : tokens * k;
    const double R = static_cast<double>(routed);
    // The copies an expert-parallel rank receives: the hottest rank's share, scaled up to
    // the group (ModuleInput::moe_load_imbalance).
    const int64_t received = std::llround(R * routing.load_imbalance);
    const double H = static_cast<double>(received);
    b.gemm("router", layer, {{tokens, E, h}}, false, T * h);
    b.pointwise("moe_dispatch", OpKind::kElementwise, layer, T * h, R * h, 0, 0);
    // Megatron's all-to-all dispatcher reorders the tokens it receives from (source rank,
    // expert) to (expert, source rank) order, a copy of all of them, and back before the
    // combine (sort_chunks_by_idxs, moe/token_dispatcher.py): work only under expert
    // parallelism with several local experts (planner's cost model).
    b.pointwise("moe_sort", OpKind::kElementwise, layer, H * h, H * h, 0, 0);
    // The received copies over the experts, as evenly as integers allow: r experts get one
    // token more (with capacity: each exactly its capacity).
    const int64_t q = received / E, r = received % E;
    std::vector<std::pair<int64_t, int64_t>> groups;
    if (r > 0) groups.emplace_back(q + 1, r);
    if (q > 0) groups.emplace_back(q, E - r);
    // Llama 4's top-1 routing scales the expert's input (Megatron-Core's
    // moe_apply_probs_on_input, in its expert MLPs): the received copies times their fp32
    // probabilities, kept for the probabilities' gradient (the planner's cost model times
    // its kernels).
    if (moe->probs_on_input) {
      Op& p =
          b.pointwise("moe_probs_in", OpKind::kElementwise, layer, H * h + 2 * H, H * h, 1, H * h);
      p.dgrad = Flops(2 * H * h);
    }
    b.mlp("expert_", layer, groups, h, moe->expert_ffn_hidden, h, mlp_activation(t), t.linear_bias);
    b.pointwise("moe_unsort", OpKind::kElementwise, layer, H * h, H * h, 0, 0);
    b.pointwise("moe_combine", OpKind::kElementwise, layer, R * h, T * h, 2.0 * k, R * h);
    if (moe->shared_experts > 0)
      b.mlp("shared_expert_", layer, {{tokens, 1}}, h, moe->shared_experts * moe->expert_ffn_hidden,
            h, mlp_activation(t), t.linear_bias);
    // Qwen2-MoE's gate on the shared experts' output (Megatron-Core's SharedExpertMLP with
    // moe_shared_expert_gate): sigmoid(x · w) times the output, on the layer's input x;
    // keeps the output and the gate's scores for its backward.
    if (moe->shared_expert_gate)
      b.pointwise("shared_expert_gate", OpKind::kElementwise, layer, 2 * T * h, T * h, 3, T * h + T,
                  h);
  }
  if (t.post_norms) b.norm("mlp_post_norm", layer, t.norm, T, h);
  b.residual("mlp_residual", layer, T, h, t.dropout);
}

void add_layers(Builder& b, OpGraph& g, const TransformerSpec& t, const std::optional<MoeSpec>& moe,
                int64_t batch, int64_t seq, bool causal, const std::optional<RopeApply>& rope,
                MoeRouting routing = {}) {
  g.layers = t.layers;
  g.kinds = {t.layers, moe ? moe->dense_layers : 0,
             moe ? moe->layer_pattern : std::vector<int64_t>(), t.sliding_window};
  g.layer_tokens = batch * seq;
  g.hidden = t.hidden;
  for (int64_t l = 0; l < t.layers; ++l)
    add_layer(b, t, g.kinds.dense(l) ? std::nullopt : moe, static_cast<int>(l), batch, seq, causal,
              rope, routing, g.kinds.windowed(l) ? t.sliding_window->size : 0);
  b.norm("final_norm", -1, t.norm, static_cast<double>(batch * seq), t.hidden);
}

void build(Builder& b, OpGraph& g, const LlmSpec& s, const ModuleInput& in) {
  const TransformerSpec& t = s.block;
  const int64_t tokens = in.micro_batch * in.seq_len, h = t.hidden;
  const double T = static_cast<double>(tokens);
  const bool learned = s.positions == PositionEmbedding::kLearned;
  Op& emb = b.pointwise("embedding", OpKind::kEmbedding, -1, T * h, T * h, learned ? kAddFlops : 0,
                        0, s.vocab * h + (learned ? s.max_positions * h : 0));
  emb.read = b.elems(T * h * (learned ? 2 : 1));  // gathered rows (and positions), not the table
  emb.dgrad = Flops(0);
  emb.wgrad = Flops(T * h);  // scatter-add into the table
  if (t.dropout) emb.saved = Bytes(tokens * h);
  const std::optional<RopeApply> rope = rope_apply(s);
  add_layers(b, g, t, s.moe, in.micro_batch, in.seq_len, true, rope,
             {in.moe_capacity_factor, in.moe_load_imbalance});
  auto head = [&](const std::string& prefix, bool owns_weights) {
    b.gemm(prefix + "logits", -1, {{tokens, s.vocab, h}}, false, T * h, owns_weights);
    Op& loss =
        b.pointwise(prefix + "loss", OpKind::kLoss, -1, T * s.vocab, T, kLossFlops * s.vocab, 0);
    loss.written = Bytes(tokens * 4);
    loss.saved = Bytes(tokens * s.vocab * 4);  // fp32 logits (Korthikanti 4sbv)
  };
  head("", !s.tied_embeddings);
  // Multi-token prediction (Megatron-Core's MultiTokenPredictionLayer): the next token's
  // embedding (the shared table) and the hidden states, each normalised, concatenated and
  // projected back to h (eh_proj), one more layer, a final norm, and the shared output
  // head with its loss.
  b.set_mtp(true);
  for (int64_t d = 0; d < s.mtp_layers; ++d) {
    const int layer = static_cast<int>(t.layers + d);
    Op& next = b.pointwise("mtp_embedding", OpKind::kEmbedding, -1, T * h, T * h, 0, 0);
    next.dgrad = Flops(0);
    next.wgrad = Flops(T * h);  // scatter-add into the shared table
    b.norm("mtp_enorm", layer, t.norm, T, h);
    b.norm("mtp_hnorm", layer, t.norm, T, h);
    b.gemm("mtp_eh_proj", layer, {{tokens, h, 2 * h}}, false, 2 * T * h);
    add_layer(b, t, s.moe, layer, in.micro_batch, in.seq_len, true, rope,
              {in.moe_capacity_factor, in.moe_load_imbalance});
    b.norm("mtp_final_norm", layer, t.norm, T, h);
    head("mtp_", false);
  }
  b.set_mtp(false);
  g.mtp_layers = s.mtp_layers;
}

void build(Builder& b, OpGraph& g, const VisionEncoderSpec& s, const ModuleInput& in) {
  const TransformerSpec& t = s.block;
  const int64_t images = in.micro_batch * in.items_per_sample, h = t.hidden;
  const int64_t pixels = s.channels * s.patch_size * s.patch_size;
  b.gemm("patch_embed", -1, {{images * s.patches(), h, pixels}}, t.linear_bias,
         static_cast<double>(images * s.patches() * pixels));
  const double seq_elems = static_cast<double>(images * s.seq_len() * h);
  b.pointwise("pos_embed", OpKind::kElementwise, -1, seq_elems, seq_elems, kAddFlops, 0,
              s.seq_len() * h + (s.class_token ? h : 0));
  add_layers(b, g, t, std::nullopt, images, s.seq_len(), false, std::nullopt);
}

void build(Builder& b, OpGraph& g, const AudioEncoderSpec& s, const ModuleInput& in) {
  const TransformerSpec& t = s.block;
  const int64_t clips = in.micro_batch * in.items_per_sample, h = t.hidden;
  const double F = static_cast<double>(clips * s.frames),
               S = static_cast<double>(clips * s.seq_len());
  b.gemm("conv1", -1, {{clips * s.frames, h, s.mel_bins * 3}}, t.linear_bias, F * s.mel_bins);
  b.pointwise("conv1_act", OpKind::kElementwise, -1, F * h, F * h, kGeluFlops, F * h);
  b.gemm("conv2", -1, {{clips * s.seq_len(), h, h * 3}}, t.linear_bias, F * h);
  b.pointwise("conv2_act", OpKind::kElementwise, -1, S * h, S * h, kGeluFlops, S * h);
  b.pointwise("pos_embed", OpKind::kElementwise, -1, S * h, S * h, kAddFlops, 0,
              s.positions == PositionEmbedding::kLearned ? s.seq_len() * h : 0);
  add_layers(b, g, t, std::nullopt, clips, s.seq_len(), false, std::nullopt);
}

void build(Builder& b, OpGraph& g, const ProjectorSpec& s, const ModuleInput& in) {
  const int64_t d2 = s.downsample * s.downsample;
  HETPAR_CHECK(in.seq_len % d2 == 0, "projector input of {} tokens per item is not divisible by {}",
               in.seq_len, d2);
  const int64_t tokens_in = in.micro_batch * in.items_per_sample * in.seq_len;
  const int64_t tokens = tokens_in / d2, width = s.input_hidden * d2;
  g.hidden = s.output_hidden;
  if (d2 > 1) {
    const double elems = static_cast<double>(tokens_in * s.input_hidden);
    b.pointwise("pixel_shuffle", OpKind::kElementwise, -1, elems, elems, 0, 0);
  }
  if (s.layers == 1)
    b.gemm("fc1", -1, {{tokens, s.output_hidden, width}}, true,
           static_cast<double>(tokens * width));
  else
    b.mlp("", -1, {{tokens, 1}}, width, s.ffn_hidden, s.output_hidden, {s.activation}, true);
}

}  // namespace

OpGraph build_op_graph(const ModuleSpec& spec, const ModuleInput& in) {
  HETPAR_CHECK(in.micro_batch >= 1 && in.items_per_sample >= 1 && in.dtype_bytes >= 1,
               "bad module input");
  HETPAR_CHECK(kind_of(spec) == ModuleKind::kVisionEncoder ||
                   kind_of(spec) == ModuleKind::kAudioEncoder || in.seq_len >= 1,
               "seq_len must be >= 1, got {}", in.seq_len);
  OpGraph g;
  g.kind = kind_of(spec);
  g.dtype_bytes = in.dtype_bytes;
  Builder b(g, in);
  std::visit([&](const auto& s) { build(b, g, s, in); }, spec);
  return g;
}

ModuleInput module_input(const ModelSpec& model, size_t i, const ModuleInput& model_input) {
  ModuleInput in = model_input;
  if (kind_of(model.modules[i].spec) != ModuleKind::kProjector) return in;
  for (const Edge& e : model.edges)
    if (e.to == i) in.seq_len = encoder_tokens_per_item(model.modules[e.from].spec);
  return in;
}

}  // namespace hetpar::models
