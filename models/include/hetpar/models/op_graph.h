// OpGraph: one module's forward pass for one micro-batch as a list of ops in execution
// order, each with its FLOPs (forward, backward split into dgrad and wgrad), forward bytes
// read/written, parameters, activation bytes saved for backward, and GEMM / attention
// shapes for shape-dependent cost models. No parallelism here: the planner splits ops by
// layer (pipeline stages) and shards them (TP/CP/EP).
//
// Conventions
// - A multiply-add is 2 FLOPs. GEMM backward = dgrad (input gradient) + wgrad (weight
//   gradient), each equal to the forward FLOPs; bias adds are fused into GEMM epilogues and
//   not counted. Attention core: forward = 4*b*h*s_q*s_kv*d (QK^T and AV), halved when
//   causal; backward = dgrad = 2x forward (model-FLOPs convention; the flash kernel's extra
//   QK^T recompute, +0.5x forward, belongs to its efficiency). Pointwise ops (norms,
//   activations, adds, loss) carry rough per-element FLOPs and backward = dgrad = 2x forward;
//   they are memory bound and never enter model-FLOP totals (totals.h).
// - Activations saved for backward follow Korthikanti et al. 2022 (arXiv 2205.05198, sec.
//   4.1) with s tokens per sample, b samples, h hidden, a heads, e dtype bytes (2 for bf16),
//   per layer: input norm 2sbh (its input), QKV GEMM 2sbh (its input), attention core Q,K,V
//   (4sbh + 2sbh; (a+2g)/a times less K,V with g kv heads), plus without flash attention
//   softmax output 2as^2b, with dropout also its mask as^2b and output 2as^2b (flash
//   attention keeps only fp32 log-sum-exp stats, 4asb bytes); output projection 2sbh (its
//   input); residual dropout mask sbh; MLP norm 2sbh; MLP fc1 2sbh; activation input 2sbf
//   (swiglu: gate and up, 4sbf); fc2 input 2sbf; residual dropout mask sbh. With f = 4h,
//   dropout and no flash this is 34sbh + 5as^2b. Outside layers: logits GEMM input 2sbh,
//   loss fp32 logits 4sbv, embedding dropout mask sbh.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hetpar/core/units.h"
#include "hetpar/models/spec.h"

namespace hetpar::models {

enum class OpKind { kGemm, kAttention, kNorm, kElementwise, kEmbedding, kLoss };
std::string_view to_string(OpKind kind);
/// GEMMs and the attention core: the ops whose FLOPs count as model FLOPs.
bool is_matmul(OpKind kind);

/// `batch` independent products C[m,n] = A[m,k] * B[k,n]; FLOPs 2*m*n*k*batch.
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t batch = 1;
  double flops() const { return 2.0 * m * n * k * batch; }
};

/// An activation op's function: its kind and whether Megatron-Core's GLU extras
/// (TransformerSpec::activation_clamp, glu_linear_offset) run, each a kernel of its own
/// when the activation is not fused.
struct MlpActivation {
  Activation kind = Activation::kGelu;
  bool clamped = false;
  bool offset = false;
  bool operator==(const MlpActivation&) const = default;
};

/// A RoPE op's application: the width of the heads it applies to, the share of each it
/// rotates (LlmSpec::rotary_percent) and whether it scales cos and sin (YaRN's
/// concentration != 1 outside multi-head latent attention), which Transformer Engine's fused
/// RoPE cannot: Megatron-Core then runs its unfused RoPE even where the trainer fuses it.
struct RopeApply {
  int64_t head_dim = 0;
  double rotated = 1;
  bool scaled = false;
  bool operator==(const RopeApply&) const = default;
};

struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  int64_t head_dim = 0;  // of a query and a key
  bool causal = false;
  /// Of a value, where it differs from head_dim (multi-head latent attention); 0: head_dim.
  int64_t v_head_dim = 0;
  /// Causal sliding-window attention (SlidingWindow): each query sees itself and the
  /// `window` keys before it; 0: the whole causal prefix.
  int64_t window = 0;
  /// A learned softmax logit per head with no value (TransformerSpec::attention_sinks); its
  /// one more term per row is not costed.
  bool sinks = false;
  /// Whether the window leaves out keys a causal call would see.
  bool windowed() const { return causal && window > 0 && window < seq_kv; }
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  /// The width the model FLOPs count per score element, 4·b·h·s_q·s_kv·width (half causal):
  /// the mean of the query / key and value widths.
  int64_t score_width() const { return (head_dim + value_dim()) / 2; }
  /// Elements of Q, K and V together.
  int64_t qkv_elements() const {
    return batch * seq_q * (heads * head_dim + kv_heads * (head_dim + value_dim()));
  }
};
/// QK^T and AV: 2*batch*heads*seq_q*seq_kv*(head_dim + value_dim), half that when causal;
/// under a sliding window, over its causal_score_pairs() (core/attention_mask.h) instead.
Flops attention_forward_flops(const AttentionShape& s);

struct Op {
  std::string name;  // "qkv", "attention", "mlp_fc1", ... (unique within a layer)
  OpKind kind = OpKind::kElementwise;
  int layer = -1;  // transformer layer index, -1 outside the layers
  Flops forward;
  Flops dgrad;  // input-gradient part of backward
  Flops wgrad;  // weight-gradient part (zero-bubble schedules defer it)
  Bytes read;   // forward
  Bytes written;
  int64_t params = 0;
  Bytes saved;  // activations kept for backward (no recompute)
  std::vector<GemmShape> gemms;
  /// A GEMM fusing several products of one input (qkv: the q, k and v projections; a gated
  /// fc1: gate and up), their output widths in order, summing to the GEMM's n; empty: one.
  /// On a RoPE op: the widths per token of the tensors it rotates (queries, keys), which
  /// unfused RoPE applies to one at a time.
  std::vector<int64_t> parts;
  /// The parts run as GEMMs of their own (ModuleInput::fused_projections false): gemms[i]
  /// is part i, all of one input.
  bool separate_parts = false;
  std::optional<AttentionShape> attention;
  /// The MLP activation an activation op applies (mlp_act, expert_act); unset elsewhere.
  std::optional<MlpActivation> activation;
  /// What a RoPE op (rope) applies; unset elsewhere.
  std::optional<RopeApply> rope;
  /// Part of a multi-token-prediction depth (LlmSpec::mtp_layers), on the last pipeline
  /// stage. Its layer's ops, with the norms and projection before it and the norm after it
  /// (the region Megatron-Core checkpoints), carry layer index layers + depth; its embedding
  /// lookup, output head and loss, layer -1.
  bool mtp = false;
  Flops backward() const { return dgrad + wgrad; }
  /// The output width of the op's GEMM, its parts together (separate or fused).
  int64_t output_width() const;
};

/// The work of one micro-batch. LLM: micro_batch samples of seq_len tokens. Encoders:
/// micro_batch * items_per_sample images or clips (seq_len unused). Projector: seq_len is
/// the tokens per item entering it (module_input() fills it from the upstream encoder).
struct ModuleInput {
  int64_t micro_batch = 1;
  int64_t seq_len = 0;
  int64_t items_per_sample = 1;
  int dtype_bytes = 2;
  bool flash_attention = true;
  // > 0: MoE token dropping, every expert padded to its capacity of ceil(factor x tokens x
  // top_k / experts) routed tokens (Megatron's get_capacity); 0: dropless, the expected
  // (balanced) load.
  double moe_capacity_factor = 0;
  // Dropless routing's hottest expert-parallel rank: its routed tokens over the mean (>= 1;
  // 1 = every expert the same load, as --moe-router-force-load-balancing makes it). The
  // experts' work and their reorders run at that load (the graph's moe_sort, expert_* and
  // moe_unsort), since every rank of a MoE layer waits for the hottest at the combine; the
  // router, the permute and the unpermute keep the rank's own tokens. Token dropping pads
  // every expert to its capacity, so this is 1 with moe_capacity_factor.
  double moe_load_imbalance = 1;
  // The q, k, v projections and a gated MLP's gate and up as one GEMM each (Megatron's
  // linear_qkv and linear_fc1); false: a GEMM per projection, as torchtitan's and Hugging
  // Face's Llama run them (wq, wk, wv; w1, w3). Dense layers only: MoE experts keep theirs.
  bool fused_projections = true;
  // K and V copied to every query head before the attention core, by a kernel of their own
  // (torchtitan's and Hugging Face's repeat_kv), their gradients summed back after it; the
  // core then reads (and, without recompute, saves) K and V at the query heads' width.
  // False: the kernel reads the kv heads itself (grouped-query attention in Transformer
  // Engine, FlashAttention, cuDNN).
  bool repeat_kv = false;
  bool operator==(const ModuleInput&) const = default;
};

/// Which of a transformer stack's layers differ from the rest, and how: an MoE LLM's dense
/// layers (its first `dense_layers`, or the 0s of its repeated `moe_pattern`;
/// MoeSpec::dense_layer) and the layers a sliding window covers. One copy serves the op
/// graph, the cost model's blocks (planner::ModuleCost) and the search's per-stage counts.
/// Indices past `layers` (multi-token-prediction depths) are MoE layers with full attention.
struct LayerKinds {
  int64_t layers = 0;
  int64_t dense_layers = 0;
  std::vector<int64_t> moe_pattern;
  std::optional<SlidingWindow> window;
  bool dense(int64_t i) const { return is_dense_layer(i, layers, dense_layers, moe_pattern); }
  bool windowed(int64_t i) const { return window && i < layers && window->windowed(i); }
  /// One number per kind of layer: 0 the stack's layer, 1 dense, 2 windowed, 3 both.
  int kind(int64_t i) const { return (dense(i) ? 1 : 0) + (windowed(i) ? 2 : 0); }
  /// Whether the layers are alike but for dense ones first: kinds 0 and 1 in two runs.
  bool prefix_only() const { return moe_pattern.empty() && !window; }
};

struct OpGraph {
  ModuleKind kind = ModuleKind::kLlm;
  int64_t layers = 0;  // transformer layers (0 for a projector)
  /// Which layers are dense (of an MoE LLM) and which windowed (kinds.layers == layers);
  /// layers of one kind are alike. Every layer of a dense module without a window is alike.
  LayerKinds kinds;
  /// An LLM's multi-token-prediction depths (LlmSpec::mtp_layers): their ops (Op::mtp) after
  /// the loss, their layers indexed layers .. layers + mtp_layers - 1.
  int64_t mtp_layers = 0;
  int64_t layer_tokens = 0;  // tokens per micro-batch inside a layer (0 for a projector)
  int64_t hidden = 0;        // width of the residual stream
  int dtype_bytes = 2;
  std::vector<Op> ops;  // forward order
};

/// REQUIRES: validate_module(spec) passed; positive sizes in `in`; a projector's seq_len
/// divisible by downsample^2.
OpGraph build_op_graph(const ModuleSpec& spec, const ModuleInput& in);

/// `model_input` (LLM seq_len, items per sample for every encoder) adapted to module i:
/// a projector gets its upstream encoder's tokens per item as seq_len.
/// REQUIRES: validate_model(model) passed.
ModuleInput module_input(const ModelSpec& model, size_t i, const ModuleInput& model_input);

/// Activation recompute: none; selective (the attention core, Korthikanti et al.); full
/// (each layer's whole forward, keeping only the layer input); selective_op (torchtitan's
/// per-op selective activation checkpointing, its `mode selective, selective_ac_option op`:
/// each layer runs under a checkpoint that keeps the outputs of the attention kernel and of
/// every odd-numbered matmul of the layer, counting the separate q, k, v, output, gate, up
/// and down projections in the order its Llama issues them (torchtitan
/// models/llama3/parallelize_llama.py, _save_list and the mm count per block), and re-runs
/// the rest before the layer's backward: the k, output and up projections (the even ones),
/// the norms, RoPE, the first residual add and the activation. The down projection's output
/// is needed by no backward, so it is neither kept nor re-run; nor is the second residual.
/// Dense layers only (MoE layers' grouped matmuls are counted differently).
enum class Recompute { kNone, kSelective, kFull, kSelectiveOp };

/// What selective recompute re-runs: Megatron-Core's --recompute-modules (a set; its
/// default, and hetpar's, is the attention core alone). A module other than the attention
/// core runs under CheckpointWithoutOutput: its input stays, its output is dropped after the
/// next op consumed it and re-computed before that op's backward, so the next op keeps
/// nothing.
enum RecomputeModule : uint8_t {
  kRecomputeCoreAttn = 1,  // "core_attn": the attention kernel; Q, K and V are kept
  /// "layernorm": a MoE layer's pre-MLP norm (pre_mlp_layernorm, a TENorm of its own; the
  /// other norms are fused into Transformer Engine's LayerNormLinear and are not re-run); the
  /// router (and a shared expert's first linear) keep no input.
  kRecomputeLayernorm = 2,
  /// "moe_act": the experts' activation; the second expert linear keeps no input.
  kRecomputeMoeAct = 4,
  /// "moe": the whole MoE layer (router, token permutation and dispatch, experts, combine,
  /// shared experts) under tensor_parallel.checkpoint: only its input is kept (the router's;
  /// nothing with "layernorm", whose dropped output that input is), and the layer's forward,
  /// its all-to-alls included, re-runs before its backward (MoELayer.forward).
  kRecomputeMoe = 8,
  /// "mlp": a dense layer's MLP under tensor_parallel.checkpoint (TransformerLayer's
  /// recompute_mlp; MoE layers have "moe"): only its input is kept, the pre-MLP norm's (fused
  /// into the first linear by Transformer Engine, so inside the checkpoint), and its forward,
  /// the sequence-parallel all-gather and the exit's reduce-scatter (or all-reduce) included,
  /// re-runs before its backward.
  kRecomputeMlp = 16,
  /// "shared_experts": a MoE layer's shared experts under tensor_parallel.checkpoint
  /// (MoELayer's shared_experts_recompute): their input is kept, and their forward, under SP
  /// their all-gather and reduce-scatter included, re-runs before their backward. Inside a
  /// checkpointed MoE layer ("moe") it changes nothing.
  kRecomputeSharedExperts = 32,
  /// "mla_up_proj": latent attention's up projections and RoPE (MLASelfAttention's
  /// qkv_up_checkpoint, a CheckpointWithoutOutput): the attention keeps no Q, K or V (its
  /// statistics alone), and q_up, kv_up (or q_proj) and RoPE re-run before its backward.
  kRecomputeMlaUpProj = 64,
};

/// A latent attention layer's up projection (q_up, kv_up, q_proj) or its RoPE: what
/// kRecomputeMlaUpProj re-runs.
bool is_latent_up_op(const Op& op);
/// Whether op is part of a MoE layer's MLP block (router through combine, shared experts):
/// what the "moe" recompute module re-runs.
bool is_moe_block_op(const Op& op);
/// Whether op is part of a dense layer's MLP block (its norm, first linear, activation and
/// second linear, and a post-norm, which Megatron-Bridge's Gemma layers build into that
/// linear): what the "mlp" recompute module re-runs. A MoE layer's pre-MLP norm has
/// the same name: in an MoE LLM with dense layers (the only MoE graphs the planner lets
/// "mlp" run on) it re-runs too, one norm's memory pass a MoE layer that Megatron-Core does
/// not spend.
bool is_dense_mlp_op(const Op& op);
/// Whether op is one of a MoE layer's shared experts' (the "shared_experts" module's).
bool is_shared_expert_op(const Op& op);

/// A recompute policy: the kind, and under kSelective the modules it re-runs.
struct RecomputePolicy {
  Recompute kind = Recompute::kNone;
  uint8_t modules = kRecomputeCoreAttn;
  // Implicit: a kind alone is that kind with the default modules.
  RecomputePolicy(Recompute k = Recompute::kNone, uint8_t m = kRecomputeCoreAttn)  // NOLINT
      : kind(k), modules(m) {}
  bool operator==(const RecomputePolicy&) const = default;
  /// Whether selective recompute re-runs `module`.
  bool selects(RecomputeModule module) const {
    return kind == Recompute::kSelective && (modules & module) != 0;
  }
  /// Whether the shared experts run under a checkpoint of their own ("shared_experts"
  /// without "moe", whose checkpoint holds them already).
  bool checkpoints_shared_experts() const {
    return selects(kRecomputeSharedExperts) && !selects(kRecomputeMoe);
  }
};

/// Whether the backward pass re-runs (some of) op's forward under `policy`.
bool is_recomputed(const Op& op, RecomputePolicy policy);
/// The share of op's forward work the backward re-runs under `policy`: 0 or 1, or under
/// selective_op for a fused GEMM the share of its output columns (Op::parts) re-run.
double recompute_share(const Op& op, RecomputePolicy policy);
/// Bytes of op.saved's kind the forward keeps for backward under `policy`, at the graph's
/// dtype (op.saved itself without recompute). Full and selective_op also keep each layer's
/// input, which this does not include (keeps_layer_input()).
double kept_bytes(const Op& op, RecomputePolicy policy, int dtype_bytes);
/// Whether `policy` keeps each layer's input for its replay (full, selective_op).
bool keeps_layer_input(Recompute policy);

}  // namespace hetpar::models
