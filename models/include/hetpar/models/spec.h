// Architecture specs: a decoder-only LLM (dense or MoE), a ViT or Whisper-style audio
// encoder, an MLP projector, and a ModelSpec wiring them (encoder -> projector -> the one
// LLM). Plain data. validate_module()/validate_model() check every rule and name the field
// by its JSON path (`model.modules[2].spec.heads: ...`), so specs built in code get the
// same checks as parsed ones. Every transformer block is pre-norm.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hetpar/core/status.h"

namespace hetpar::models {

/// kSquaredRelu: relu(x)^2, ungated (Nemotron-4; Megatron-LM `--squared-relu`). kGeglu:
/// GELU-gated, gelu(x W_gate) * (x W_up) (Gemma; Megatron-Core's gated_linear_unit with
/// a GELU activation_func). kQuickGeglu: gated by GELU's sigmoid approximation,
/// g * sigmoid(1.702 g) with g = x W_gate (gpt-oss; Megatron-LM `--quick-geglu`).
enum class Activation { kGelu, kSwiglu, kSquaredRelu, kGeglu, kQuickGeglu };
inline constexpr std::array<Activation, 5> kActivations = {
    Activation::kGelu, Activation::kSwiglu, Activation::kSquaredRelu, Activation::kGeglu,
    Activation::kQuickGeglu};
/// Whether fc1 is two branches, gate and up (SwiGLU, GeGLU, quick GeGLU).
constexpr bool is_gated(Activation a) {
  return a == Activation::kSwiglu || a == Activation::kGeglu || a == Activation::kQuickGeglu;
}
enum class Norm { kLayerNorm, kRmsNorm };
enum class PositionEmbedding { kRope, kLearned, kSinusoidal };

/// Multi-head latent attention (DeepSeek-V2 / V3; Megatron-Core's MLASelfAttention, its
/// --multi-latent-attention): each head's query from a q_lora_rank-wide latent of the input
/// (0: from the input itself), its key and value from one kv_lora_rank-wide latent shared by
/// the heads, plus a rope_head_dim-wide key part shared by the heads too. A query and a key
/// are qk_head_dim + rope_head_dim wide, a value v_head_dim. Every head has its own key and
/// value (no grouping).
struct MlaSpec {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_head_dim = 0;
  int64_t rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

/// Sliding-window attention (Mistral, Gemma 2 / 3, GPT-OSS; Megatron-Core's window_size
/// (size, 0) with window_attn_skip_freq full_every): in a windowed layer each query sees
/// itself and the `size` tokens before it. With full_every N > 0 every N-th layer (the
/// 1-based layer numbers N, 2N, ...) attends to its whole causal prefix instead; with 0
/// every layer is windowed.
struct SlidingWindow {
  int64_t size = 0;
  int64_t full_every = 0;
  /// Whether 0-based layer `layer` is windowed.
  bool windowed(int64_t layer) const { return full_every == 0 || (layer + 1) % full_every != 0; }
};

/// The transformer stack every encoder and the LLM share.
struct TransformerSpec {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t ffn_hidden = 0;  // MoE LLM: its dense layers' width (MoeSpec::dense_layers), or 0
  int64_t heads = 0;
  int64_t kv_heads = 0;  // == heads without grouped-query attention
  Activation activation = Activation::kGelu;
  /// A gated activation's extras, Megatron-Core's: the gate clamped above at
  /// `activation_clamp` and the linear half to +-activation_clamp before the product
  /// (activation_func_clamp_value; 0: no clamp), and `glu_linear_offset` added to the
  /// linear half (gpt-oss: 7 and 1).
  double activation_clamp = 0;
  double glu_linear_offset = 0;
  Norm norm = Norm::kLayerNorm;
  /// Every norm scales by 1 + gamma, its weights centred on zero (Megatron-Core's
  /// layernorm_zero_centered_gamma, Megatron-LM's --apply-layernorm-1p: Nemotron-4's
  /// layernorm1p, Gemma's RMSNorm x * (1 + w)). The same kernel and cost; the exports write it,
  /// since a trainer without it trains another parameterisation.
  bool zero_centered_gamma = false;
  bool qkv_bias = false;     // biases on the Q, K, V projections
  bool linear_bias = false;  // biases on the attention output projection and MLP linears
  bool dropout = false;      // training with dropout: its masks are saved for backward
  /// Width of one attention head; 0: hidden / heads. Set where the heads' width differs
  /// (Qwen3, Gemma: heads x head_dim != hidden; Megatron-LM's --kv-channels).
  int64_t head_size = 0;
  int64_t head_dim() const { return head_size > 0 ? head_size : hidden / heads; }
  /// A norm (of `norm`'s kind, over head_dim, weights shared by the heads) on every head's
  /// query and key after the QKV projection (Qwen3, OLMo 2; Megatron-LM's --qk-layernorm).
  bool qk_norm = false;
  /// Norms after the attention's output projection and after the MLP too, each before its
  /// residual add (Gemma 2 / 3's post_attention_layernorm and post_feedforward_layernorm;
  /// Megatron-Bridge's Gemma providers put them on the output of the row-parallel linear,
  /// so under TP they run on the reduced, sequence-sliced output).
  bool post_norms = false;
  /// Multi-head latent attention instead of the Q, K, V projections (an LLM's only).
  std::optional<MlaSpec> mla;
  /// Sliding-window attention in some or all layers (an LLM's only).
  std::optional<SlidingWindow> sliding_window;
  /// Attention sinks (gpt-oss; Megatron-Core's softmax_type "learnable"): a learned logit
  /// per head that joins each query's softmax: one parameter per head and layer, no work to
  /// speak of, and a kernel that takes it (Transformer Engine runs it in cuDNN's fused
  /// attention, not FlashAttention). An LLM's only.
  bool attention_sinks = false;
};

/// Whether layer `i` (0-based) of `layers` keeps a dense MLP in an MoE stack whose first
/// `dense_layers` are dense and whose `pattern` (repeated; 0 dense, 1 MoE; empty: all MoE)
/// says which of the others are. Layers past `layers` (multi-token prediction) are MoE.
inline bool is_dense_layer(int64_t i, int64_t layers, int64_t dense_layers,
                           const std::vector<int64_t>& pattern) {
  if (i >= layers) return false;
  if (i < dense_layers) return true;
  return !pattern.empty() && pattern[static_cast<size_t>(i) % pattern.size()] == 0;
}

/// Mixture of experts replacing the layers' MLP. Each token goes to `top_k` of `experts`
/// routed experts; `shared_experts` experts (run as one MLP of width
/// shared_experts * expert_ffn_hidden) see every token. The first `dense_layers` layers
/// keep a dense MLP of the block's ffn_hidden (DeepSeek-V3's and GLM-4.5's
/// first_k_dense_replace, Megatron-LM's --moe-layer-freq [0]*k+[1]*(L-k)). Or
/// `layer_pattern`, repeated over the layers, says which are MoE layers (1) and which dense
/// (0): Llama 4 Maverick's [0, 1] (Megatron-LM's --moe-layer-freq ([0,1]*24)). At least one
/// layer is a MoE layer. Multi-token-prediction depths are MoE layers.
struct MoeSpec {
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn_hidden = 0;
  int64_t shared_experts = 0;
  int64_t dense_layers = 0;
  std::vector<int64_t> layer_pattern;
  /// The router (Megatron-Core's TopKRouter), which decides what is trained, not its cost
  /// (its kernels read and write the T x E scores either way): scores by softmax (Mixtral,
  /// Qwen, gpt-oss) or sigmoid (DeepSeek-V3, GLM-4.5, Llama 4; --moe-router-score-function),
  /// a learned per-expert bias steering the choice without an aux loss
  /// (--moe-router-enable-expert-bias), the chosen weights scaled by topk_scaling (0: not;
  /// --moe-router-topk-scaling-factor), and each token's experts from group_topk of
  /// `groups` expert groups (0: no grouping; --moe-router-num-groups, --moe-router-group-topk).
  bool sigmoid_router = false;
  bool expert_bias = false;
  double topk_scaling = 0;
  int64_t groups = 0;
  int64_t group_topk = 0;
  /// Top-1 routing that scales each expert's input by its probability instead of its output
  /// (Llama 4; Megatron-Core's moe_apply_probs_on_input): another function, and one more
  /// elementwise product (op moe_probs_in) before the experts.
  bool probs_on_input = false;
  /// The softmax over all experts before the top-k, its weights not renormalised over the
  /// chosen (Qwen1.5 / Qwen2-MoE's norm_topk_prob false; --moe-router-pre-softmax), where
  /// Megatron-Core's default takes the softmax of the top-k scores. Softmax scores only.
  bool pre_softmax = false;
  /// A sigmoid gate scaling the shared experts' output, one weight per hidden channel
  /// (Qwen1.5 / Qwen2-MoE's shared_expert_gate; --moe-shared-expert-gate): op
  /// shared_expert_gate after the shared experts. Needs shared experts.
  bool shared_expert_gate = false;
  /// Whether layer `i` (0-based) of `layers` keeps a dense MLP.
  bool dense_layer(int64_t i, int64_t layers) const {
    return is_dense_layer(i, layers, dense_layers, layer_pattern);
  }
  /// How many of `layers` keep a dense MLP.
  int64_t dense_layer_count(int64_t layers) const {
    int64_t n = 0;
    for (int64_t i = 0; i < layers; ++i) n += dense_layer(i, layers) ? 1 : 0;
    return n;
  }
};

/// YaRN (Peng et al. 2023; Megatron-Core's YarnRotaryEmbedding, Hugging Face's rope_scaling
/// of rope_type "yarn"): RoPE extended past `original_max_positions` by blending, band by
/// band, the base frequencies with ones interpolated by `factor`, the blend ramping between
/// the bands that turn beta_fast and beta_slow times over the original context (the ramp's
/// ends rounded to whole bands when `truncate`: Megatron-Core's
/// correction_range_round_to_int); cos and sin are scaled by the concentration factor
/// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), with get_mscale(s, m) =
/// 0.1 m ln(s) + 1. The frequencies cost nothing; the concentration does where it is not 1:
/// Transformer Engine's fused RoPE cannot scale, so Megatron-Core runs its unfused RoPE.
struct Yarn {
  double factor = 0;
  int64_t original_max_positions = 0;
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 1;
  double mscale_all_dim = 0;
  bool truncate = true;
  /// The factor cos and sin are scaled by.
  double concentration() const;
};

struct LlmSpec {
  TransformerSpec block;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  PositionEmbedding positions = PositionEmbedding::kRope;  // rope or learned
  int64_t max_positions = 0;                               // learned positions only
  /// RoPE's base (rope_theta; Llama 3: 500000); 0: unset, the trainer's default. Its
  /// frequencies cost nothing; the exports write it (a trainer's default is another model).
  double rope_base = 0;
  /// Llama 3.1's RoPE scaling (the low-frequency bands stretched by this factor; Megatron-LM
  /// --use-rope-scaling --rope-scaling-factor); 0: none.
  double rope_scaling_factor = 0;
  /// YaRN's extension of RoPE (gpt-oss, DeepSeek-V3), instead of Llama 3.1's scaling.
  std::optional<Yarn> yarn;
  /// The share of each query and key head RoPE rotates (GLM-4.5 and Nemotron-4: 0.5;
  /// Megatron's rotary_percent), the leading rotary_percent * head_dim channels; the rest
  /// pass through. Transformer Engine's fused kernel still reads and writes the whole head
  /// (it copies the rest), so only the rotation's FLOPs shrink.
  double rotary_percent = 1;
  /// Every no_rope_every-th layer by its 1-based number (N, 2N, ...) skips RoPE, attending
  /// without positions (Llama 4's NoPE layers, no_rope_layer_interval 4; Megatron-Core's
  /// no_rope_freq); 0: RoPE in every layer. Not costed apart: those layers are timed with
  /// their fused RoPE pass over the queries and keys (under 1% of a layer's time).
  int64_t no_rope_every = 0;
  /// Whether YaRN scales cos and sin (concentration != 1) in RoPE that Transformer Engine's
  /// fused kernel would run: Megatron-Core then runs its unfused RoPE. MLA's own kernel
  /// takes the scale.
  bool yarn_scales_rope() const { return yarn && !block.mla && yarn->concentration() != 1; }
  std::optional<MoeSpec> moe;
  /// Multi-token prediction depths (DeepSeek-V3's MTP modules, Megatron-LM's
  /// --mtp-num-layers), after the last layer: each embeds the next token (the shared table),
  /// normalises it and the hidden states, projects their concatenation (2h -> h), runs one
  /// more layer (an MoE layer in an MoE LLM), a final norm, and the shared output head with
  /// a loss of its own.
  int64_t mtp_layers = 0;
};

/// ViT: non-overlapping patches (a conv with stride = kernel = patch_size) plus an optional
/// class token, learned positions. The class token takes part in attention, but only the
/// patch tokens go downstream (as LLaVA and InternVL take them).
struct VisionEncoderSpec {
  TransformerSpec block;
  int64_t patch_size = 0;
  int64_t image_size = 0;
  int64_t channels = 3;
  bool class_token = false;
  int64_t patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t seq_len() const { return patches() + (class_token ? 1 : 0); }
};

/// Whisper-style audio encoder: conv1d(mel_bins -> hidden, kernel 3) + GELU, conv1d(hidden ->
/// hidden, kernel 3, stride 2) + GELU, then the transformer over frames / 2 positions.
struct AudioEncoderSpec {
  TransformerSpec block;
  int64_t mel_bins = 0;
  int64_t frames = 3000;
  PositionEmbedding positions = PositionEmbedding::kSinusoidal;  // learned or sinusoidal
  int64_t seq_len() const { return frames / 2; }
};

/// MLP from an encoder's hidden size to the LLM's: one Linear, or Linear, activation,
/// Linear (all with bias). `downsample` d > 1 first merges d x d neighbouring tokens into
/// one (InternVL's pixel shuffle): tokens / d^2, input width input_hidden * d^2.
struct ProjectorSpec {
  int64_t input_hidden = 0;
  int64_t output_hidden = 0;
  int64_t layers = 2;      // 1 or 2
  int64_t ffn_hidden = 0;  // width between the two linears (layers == 2)
  Activation activation = Activation::kGelu;
  int64_t downsample = 1;
};

/// The variant order matches ModuleKind.
using ModuleSpec = std::variant<LlmSpec, VisionEncoderSpec, AudioEncoderSpec, ProjectorSpec>;
enum class ModuleKind { kLlm, kVisionEncoder, kAudioEncoder, kProjector };

ModuleKind kind_of(const ModuleSpec& spec);
bool is_encoder(ModuleKind kind);
/// The JSON spellings: "llm", "vision_encoder", "audio_encoder", "projector".
std::string_view to_string(ModuleKind kind);
// "gelu", "swiglu", "squared_relu", "geglu", "quick_geglu"
std::string_view to_string(Activation a);
std::string_view to_string(Norm n);               // "layernorm", "rmsnorm"
std::string_view to_string(PositionEmbedding p);  // "rope", "learned", "sinusoidal"
/// The transformer block of an LLM or encoder; null for a projector.
const TransformerSpec* transformer_of(const ModuleSpec& spec);
/// Tokens one image or clip becomes at an encoder's output. REQUIRES: an encoder spec.
int64_t encoder_tokens_per_item(const ModuleSpec& encoder);

struct Module {
  std::string name;  // its role in the model: "vision", "projector", "llm", ...
  ModuleSpec spec;
};

/// Data flows from `from` to `to` (indices into ModelSpec::modules).
struct Edge {
  size_t from = 0;
  size_t to = 0;
};

/// A trainable model: exactly one LLM; every encoder feeds the LLM directly or through one
/// projector. A plain LLM is the one-module case.
struct ModelSpec {
  std::string name;
  std::vector<Module> modules;
  std::vector<Edge> edges;
  /// Index of the LLM module. REQUIRES: validate_model() passed.
  size_t llm_index() const;
  /// Index of the module named `name`, if any.
  std::optional<size_t> find(std::string_view name) const;
};

/// Upper bounds validate_module() puts on a module's sizes, far above any published model
/// (the deepest transformer trained, DeepNet, has 1,000 layers; the widest dense LLMs a
/// hidden size of 25,600, the largest vocabularies 256K entries, the most experts 256 per
/// layer). An op graph has ops per layer, so layers bound its size; widths bound every
/// derived count of parameters, FLOPs and bytes well inside int64. Both turn a mistyped
/// size into an error naming the field, instead of a simulation that exhausts memory.
inline constexpr int64_t kMaxLayers = 10'000;
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;      // hidden, ffn and head sizes, vocab
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;    // routed or shared, and top_k
inline constexpr int64_t kMaxInputSide = int64_t{1} << 16;  // image side, mel bins, frames
inline constexpr int64_t kMaxMtpLayers = 64;  // DeepSeek-V3 trains one; papers try up to 4
/// Parameters of one module, as a whole (sizes each within bounds can still multiply past
/// int64 in byte counts of gradients and optimizer state).
inline constexpr int64_t kMaxParams = int64_t{1} << 50;

/// Checks one module's sizes (within the bounds above) and their divisibility; errors read
/// `<path>.<field>: ...`.
Status validate_module(const ModuleSpec& spec, std::string_view path);
/// Checks every module (at `<path>.modules[i].spec`), then the wiring: one LLM, unique
/// names, edges encoder -> projector -> llm or encoder -> llm, hidden sizes that match
/// across each edge, and projector downsampling that divides the encoder's tokens.
Status validate_model(const ModelSpec& model, std::string_view path);

}  // namespace hetpar::models
