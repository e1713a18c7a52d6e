#include "hetpar/models/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "hetpar/core/check.h"

namespace hetpar::models {

ModuleKind kind_of(const ModuleSpec& spec) {
  return static_cast<ModuleKind>(spec.index());
}

const TransformerSpec* transformer_of(const ModuleSpec& spec) {
  if (const auto* s = std::get_if<LlmSpec>(&spec)) return &s->block;
  if (const auto* s = std::get_if<VisionEncoderSpec>(&spec)) return &s->block;
  if (const auto* s = std::get_if<AudioEncoderSpec>(&spec)) return &s->block;
  return nullptr;
}

namespace {
// YaRN's attention factor: 1 at no stretch (Megatron-Core's _yarn_get_mscale).
double yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}
}  // namespace

double Yarn::concentration() const {
  return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
}

bool is_encoder(ModuleKind kind) {
  return kind == ModuleKind::kVisionEncoder || kind == ModuleKind::kAudioEncoder;
}

std::string_view to_string(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kLlm:
      return "llm";
    case ModuleKind::kVisionEncoder:
      return "vision_encoder";
    case ModuleKind::kAudioEncoder:
      return "audio_encoder";
    case ModuleKind::kProjector:
      return "projector";
  }
  return "?";
}

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kSwiglu:
      return "swiglu";
    case Activation::kSquaredRelu:
      return "squared_relu";
    case Activation::kGeglu:
      return "geglu";
    case Activation::kQuickGeglu:
      return "quick_geglu";
  }
  return "?";
}
std::string_view to_string(Norm n) {
  return n == Norm::kLayerNorm ? "layernorm" : "rmsnorm";
}
std::string_view to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kRope:
      return "rope";
    case PositionEmbedding::kLearned:
      return "learned";
    case PositionEmbedding::kSinusoidal:
      return "sinusoidal";
  }
  return "?";
}

int64_t encoder_tokens_per_item(const ModuleSpec& encoder) {
  if (const auto* v = std::get_if<VisionEncoderSpec>(&encoder)) return v->patches();
  const auto* a = std::get_if<AudioEncoderSpec>(&encoder);
  HETPAR_CHECK(a != nullptr, "encoder_tokens_per_item on a {}", to_string(kind_of(encoder)));
  return a->seq_len();
}

size_t ModelSpec::llm_index() const {
  for (size_t i = 0; i < modules.size(); ++i)
    if (kind_of(modules[i].spec) == ModuleKind::kLlm) return i;
  HETPAR_CHECK(false, "model \"{}\" has no llm module", name);
  return 0;
}

std::optional<size_t> ModelSpec::find(std::string_view module_name) const {
  for (size_t i = 0; i < modules.size(); ++i)
    if (modules[i].name == module_name) return i;
  return std::nullopt;
}

namespace {

// `path.key`, or `key` at the document root.
std::string join(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

// Collects the first failed rule as `<path>.<field>: <message>`.
class Checker {
 public:
  explicit Checker(std::string_view path) : path_(path) {}
  void fail(std::string_view field, std::string message) {
    if (status_.is_ok())
      status_ = Status::invalid_argument(fmt::format("{}: {}", join(path_, field), message));
  }
  void positive(std::string_view field, int64_t v) {
    if (v < 1) fail(field, fmt::format("must be >= 1, got {}", v));
  }
  /// positive() and at most `max`.
  void size(std::string_view field, int64_t v, int64_t max) {
    positive(field, v);
    if (v > max) fail(field, fmt::format("must be <= {}, got {}", max, v));
  }
  /// `field` (value v) must divide `what` (value total).
  void divides(std::string_view field, int64_t v, std::string_view what, int64_t total) {
    if (v >= 1 && total % v != 0)
      fail(field, fmt::format("must divide {} ({}), got {}", what, total, v));
  }
  Status status() const { return status_; }

 private:
  std::string_view path_;
  Status status_;
};

// `moe`: an MoE LLM's block, whose ffn_hidden only its dense layers take (`dense`).
void check_block(Checker& c, const TransformerSpec& t, bool moe = false, bool dense = false) {
  c.size("layers", t.layers, kMaxLayers);
  c.size("hidden", t.hidden, kMaxWidth);
  if (!moe || dense) c.size("ffn_hidden", t.ffn_hidden, kMaxWidth);
  if (moe && !dense && t.ffn_hidden != 0)
    c.fail("ffn_hidden",
           "unused with moe and no moe.dense_layers (experts take moe.expert_ffn_hidden)");
  c.size("heads", t.heads, kMaxWidth);
  c.size("kv_heads", t.kv_heads, kMaxWidth);
  if (!is_gated(t.activation)) {
    if (t.activation_clamp != 0)
      c.fail("activation_clamp", fmt::format("clamps a gated unit's halves: activation {} has none",
                                             to_string(t.activation)));
    if (t.glu_linear_offset != 0)
      c.fail("glu_linear_offset", fmt::format("offsets a gated unit's linear half: activation {} "
                                              "has none",
                                              to_string(t.activation)));
  }
  if (t.mla) {  // its own widths (check_mla)
    if (t.head_size != 0) c.fail("head_dim", "unused with mla (mla.qk_head_dim, mla.v_head_dim)");
    if (t.kv_heads != t.heads)
      c.fail("kv_heads", fmt::format("with mla every head has its own key and value: must be "
                                     "heads ({}), got {}",
                                     t.heads, t.kv_heads));
    if (t.qkv_bias) c.fail("qkv_bias", "unused with mla (its projections have no bias)");
    if (t.qk_norm) c.fail("qk_norm", "unused with mla (it normalises its latents)");
    return;
  }
  if (t.head_size == 0)
    c.divides("heads", t.heads, "hidden", t.hidden);
  else
    c.size("head_dim", t.head_size, kMaxWidth);
  c.divides("kv_heads", t.kv_heads, "heads", t.heads);
}

void check_mla(Checker& c, const MlaSpec& m) {
  if (m.q_lora_rank != 0) c.size("mla.q_lora_rank", m.q_lora_rank, kMaxWidth);
  c.size("mla.kv_lora_rank", m.kv_lora_rank, kMaxWidth);
  c.size("mla.qk_head_dim", m.qk_head_dim, kMaxWidth);
  c.size("mla.rope_head_dim", m.rope_head_dim, kMaxWidth);
  c.size("mla.v_head_dim", m.v_head_dim, kMaxWidth);
}

void check_yarn(Checker& c, const Yarn& y) {
  if (!(y.factor >= 1 && y.factor <= 1e6))
    c.fail("yarn.factor",
           fmt::format("stretches the context: must be in [1, 1e6], got {}", y.factor));
  c.size("yarn.original_max_positions", y.original_max_positions, int64_t{1} << 24);
  if (!(y.beta_slow > 0 && y.beta_fast > y.beta_slow))
    c.fail("yarn.beta_fast", fmt::format("the ramp's bands need beta_fast > beta_slow > 0, got "
                                         "beta_fast {} and beta_slow {}",
                                         y.beta_fast, y.beta_slow));
  if (y.mscale < 0) c.fail("yarn.mscale", fmt::format("must be >= 0, got {}", y.mscale));
  if (y.mscale_all_dim < 0)
    c.fail("yarn.mscale_all_dim", fmt::format("must be >= 0, got {}", y.mscale_all_dim));
}

// RoPE's fields: on RoPE positions only; one extension; a rotated share of whole channel
// pairs of a head (Megatron-Core's rotary_dim = int(head_dim * rotary_percent)).
void check_rope(Checker& c, const LlmSpec& s) {
  if (s.positions != PositionEmbedding::kRope) {
    if (s.rope_base != 0) c.fail("rope_base", "needs position_embedding rope");
    if (s.rope_scaling_factor != 0) c.fail("rope_scaling_factor", "needs position_embedding rope");
    if (s.yarn) c.fail("yarn", "needs position_embedding rope");
    if (s.rotary_percent != 1) c.fail("rotary_percent", "needs position_embedding rope");
    if (s.no_rope_every != 0) c.fail("no_rope_every", "needs position_embedding rope");
    return;
  }
  // Megatron-Core expands an integer no_rope_freq to its pattern over whole repeats.
  if (s.no_rope_every != 0) {
    if (s.block.mla)
      c.fail("no_rope_every", "unused with mla (its decoupled RoPE runs in every layer)");
    else if (s.no_rope_every < 2 || s.block.layers % s.no_rope_every != 0)
      c.fail("no_rope_every",
             fmt::format("must be >= 2 (1 would drop RoPE from every layer) and divide layers "
                         "({}), got {}",
                         s.block.layers, s.no_rope_every));
  }
  if (s.rope_scaling_factor != 0 && s.rope_scaling_factor < 1)
    c.fail("rope_scaling_factor", fmt::format("stretches the low frequencies: must be >= 1, got {}",
                                              s.rope_scaling_factor));
  if (s.yarn) {
    check_yarn(c, *s.yarn);
    if (s.rope_scaling_factor != 0)
      c.fail("yarn",
             "and rope_scaling_factor (Llama 3.1's scaling) extend one RoPE two ways: "
             "give one");
  }
  if (s.rotary_percent == 1) return;
  if (s.block.mla) {
    c.fail("rotary_percent", "unused with mla (mla.rope_head_dim is its rotated width)");
    return;
  }
  const double rotated = s.rotary_percent * static_cast<double>(s.block.head_dim());
  if (!(s.rotary_percent > 0 && s.rotary_percent < 1) || rotated < 2 ||
      std::floor(rotated) != rotated || static_cast<int64_t>(rotated) % 2 != 0)
    c.fail("rotary_percent",
           fmt::format("must be in (0, 1] and rotate whole channel pairs of a head: {} of "
                       "head_dim {} is {} channels",
                       s.rotary_percent, s.block.head_dim(), rotated));
}

void check_window(Checker& c, const SlidingWindow& w, int64_t layers) {
  c.size("sliding_window.size", w.size, int64_t{1} << 24);  // workload.seq_len's bound
  if (w.full_every < 0 || w.full_every > std::max<int64_t>(layers, 1))
    c.fail("sliding_window.full_every",
           fmt::format("must be in [0, layers] (0: every layer windowed; layers {}), got {}",
                       layers, w.full_every));
  if (w.full_every == 1)
    c.fail("sliding_window.full_every",
           "1 leaves no layer windowed: drop sliding_window for full attention everywhere");
}

void check(Checker& c, const LlmSpec& s) {
  const bool dense_mlps =
      s.moe && (s.moe->dense_layers != 0 ||
                std::find(s.moe->layer_pattern.begin(), s.moe->layer_pattern.end(), 0) !=
                    s.moe->layer_pattern.end());
  check_block(c, s.block, s.moe.has_value(), dense_mlps);
  if (s.block.mla) check_mla(c, *s.block.mla);
  if (s.block.sliding_window) check_window(c, *s.block.sliding_window, s.block.layers);
  c.size("vocab", s.vocab, kMaxWidth);
  if (s.positions == PositionEmbedding::kSinusoidal)
    c.fail("position_embedding", "an llm takes rope or learned positions");
  if (s.positions == PositionEmbedding::kLearned)
    c.size("max_positions", s.max_positions, int64_t{1} << 24);  // workload.seq_len's bound
  check_rope(c, s);
  if (s.mtp_layers < 0 || s.mtp_layers > kMaxMtpLayers)
    c.fail("mtp_layers", fmt::format("must be in [0, {}], got {}", kMaxMtpLayers, s.mtp_layers));
  if (!s.moe) return;
  c.size("moe.experts", s.moe->experts, kMaxExperts);
  c.positive("moe.top_k", s.moe->top_k);
  c.size("moe.expert_ffn_hidden", s.moe->expert_ffn_hidden, kMaxWidth);
  if (s.moe->shared_experts < 0 || s.moe->shared_experts > kMaxExperts)
    c.fail("moe.shared_experts",
           fmt::format("must be in [0, {}], got {}", kMaxExperts, s.moe->shared_experts));
  if (s.moe->dense_layers < 0 || s.moe->dense_layers >= std::max<int64_t>(s.block.layers, 1))
    c.fail("moe.dense_layers",
           fmt::format("must be in [0, layers - 1] (at least one MoE layer; layers {}), got {}",
                       s.block.layers, s.moe->dense_layers));
  const std::vector<int64_t>& pattern = s.moe->layer_pattern;
  if (!pattern.empty()) {
    if (s.moe->dense_layers != 0)
      c.fail("moe.layer_pattern", "give moe.dense_layers or moe.layer_pattern, not both");
    else if (s.block.layers % static_cast<int64_t>(pattern.size()) != 0)
      c.fail("moe.layer_pattern", fmt::format("its length must divide layers ({}), got {}",
                                              s.block.layers, pattern.size()));
    else if (std::find(pattern.begin(), pattern.end(), 1) == pattern.end())
      c.fail("moe.layer_pattern", "must hold at least one MoE layer (1)");
  }
  if (s.moe->top_k > s.moe->experts)
    c.fail("moe.top_k",
           fmt::format("must be <= experts ({}), got {}", s.moe->experts, s.moe->top_k));
  // Grouped routing: whole groups of experts, enough of them chosen to hold top_k experts.
  const MoeSpec& m = *s.moe;
  if (m.probs_on_input && m.top_k != 1)  // Megatron-Core asserts it in its expert MLPs
    c.fail("moe.probs_on_input", fmt::format("needs top_k 1, got {}", m.top_k));
  if (m.pre_softmax && m.sigmoid_router)
    c.fail("moe.pre_softmax", "needs score_function softmax (a softmax before the top-k)");
  if (m.shared_expert_gate && m.shared_experts == 0)
    c.fail("moe.shared_expert_gate", "needs moe.shared_experts > 0 (it gates their output)");
  if (m.groups < 0 || m.group_topk < 0)
    c.fail(m.groups < 0 ? "moe.groups" : "moe.group_topk", "must be >= 0");
  else if (m.groups == 0 && m.group_topk != 0)
    c.fail("moe.group_topk", "needs moe.groups");
  else if (m.groups > 0 &&
           (m.experts % m.groups != 0 || m.group_topk < 1 || m.group_topk > m.groups ||
            m.group_topk * (m.experts / m.groups) < m.top_k))
    c.fail("moe.groups",
           fmt::format("{} groups must divide experts ({}), and group_topk (1..groups, got {}) "
                       "groups must hold top_k ({}) experts",
                       m.groups, m.experts, m.group_topk, m.top_k));
}

void check(Checker& c, const VisionEncoderSpec& s) {
  check_block(c, s.block);
  if (s.block.mla) c.fail("mla", "multi-head latent attention is an llm's only");
  if (s.block.sliding_window) c.fail("sliding_window", "sliding-window attention is an llm's only");
  if (s.block.attention_sinks) c.fail("attention_sinks", "attention sinks are an llm's only");
  if (s.block.post_norms) c.fail("post_norms", "norms after attention and MLP are an llm's only");
  c.size("patch_size", s.patch_size, kMaxInputSide);
  c.size("image_size", s.image_size, kMaxInputSide);
  c.size("channels", s.channels, kMaxInputSide);
  if (s.patch_size >= 1 && s.image_size % s.patch_size != 0)
    c.fail("image_size", fmt::format("must be a multiple of patch_size ({}), got {}", s.patch_size,
                                     s.image_size));
}

void check(Checker& c, const AudioEncoderSpec& s) {
  check_block(c, s.block);
  if (s.block.mla) c.fail("mla", "multi-head latent attention is an llm's only");
  if (s.block.sliding_window) c.fail("sliding_window", "sliding-window attention is an llm's only");
  if (s.block.attention_sinks) c.fail("attention_sinks", "attention sinks are an llm's only");
  if (s.block.post_norms) c.fail("post_norms", "norms after attention and MLP are an llm's only");
  c.size("mel_bins", s.mel_bins, kMaxInputSide);
  c.size("frames", s.frames, kMaxInputSide);
  if (s.frames % 2 != 0)
    c.fail("frames", fmt::format("must be even (the second conv has stride 2), got {}", s.frames));
  if (s.positions == PositionEmbedding::kRope)
    c.fail("position_embedding", "an audio encoder takes learned or sinusoidal positions");
}

void check(Checker& c, const ProjectorSpec& s) {
  c.size("input_hidden", s.input_hidden, kMaxWidth);
  c.size("output_hidden", s.output_hidden, kMaxWidth);
  if (s.layers != 1 && s.layers != 2)
    c.fail("layers", fmt::format("must be 1 or 2, got {}", s.layers));
  if (s.layers == 2) c.size("ffn_hidden", s.ffn_hidden, kMaxWidth);
  c.size("downsample", s.downsample, kMaxWidth);
}

int64_t output_hidden(const ModuleSpec& spec) {
  return std::visit(
      [](const auto& s) -> int64_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(s)>, ProjectorSpec>)
          return s.output_hidden;
        else
          return s.block.hidden;
      },
      spec);
}

// About how many parameters `spec` has, in double (count_params() sums in int64, which sizes
// within the field bounds can still overflow together). For a bound, not a count.
double approx_params(const ModuleSpec& spec) {
  auto block = [](const TransformerSpec& t, double mlp) {
    const double h = static_cast<double>(t.hidden);
    const double hd = static_cast<double>(t.head_size > 0 ? t.head_size : t.hidden / t.heads);
    const double attention = h * hd * static_cast<double>(2 * t.heads + 2 * t.kv_heads);
    return static_cast<double>(t.layers) * (attention + 3 * h * mlp);
  };
  return std::visit(
      [&](const auto& s) -> double {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, ProjectorSpec>) {
          return static_cast<double>(s.input_hidden) * static_cast<double>(s.ffn_hidden) *
                     static_cast<double>(s.downsample * s.downsample) +
                 static_cast<double>(s.ffn_hidden) * static_cast<double>(s.output_hidden);
        } else if constexpr (std::is_same_v<T, LlmSpec>) {
          const double mlp = s.moe ? static_cast<double>(s.moe->experts + s.moe->shared_experts) *
                                         static_cast<double>(s.moe->expert_ffn_hidden)
                                   : static_cast<double>(s.block.ffn_hidden);
          // (The pattern's dense layers in closed form: no loop over unchecked sizes.)
          const std::vector<int64_t>& p = s.moe ? s.moe->layer_pattern : std::vector<int64_t>();
          const double pattern_dense =
              p.empty() ? 0
                        : static_cast<double>(s.block.layers) *
                              static_cast<double>(std::count(p.begin(), p.end(), 0)) /
                              static_cast<double>(p.size());
          const double dense = s.moe ? (static_cast<double>(s.moe->dense_layers) + pattern_dense) *
                                           3 * static_cast<double>(s.block.hidden) *
                                           static_cast<double>(s.block.ffn_hidden)
                                     : 0;
          const double mtp =
              static_cast<double>(s.mtp_layers) *
              (block(s.block, mlp) / static_cast<double>(s.block.layers) +
               2 * static_cast<double>(s.block.hidden) * static_cast<double>(s.block.hidden));
          return block(s.block, mlp) + dense + mtp +
                 2 * static_cast<double>(s.vocab) * static_cast<double>(s.block.hidden);
        } else {
          return block(s.block, static_cast<double>(s.block.ffn_hidden));
        }
      },
      spec);
}

}  // namespace

Status validate_module(const ModuleSpec& spec, std::string_view path) {
  Checker c(path);
  std::visit([&](const auto& s) { check(c, s); }, spec);
  HETPAR_RETURN_IF_ERROR(c.status());
  // Each size within its bound, the module's parameters may still pass int64 in products
  // (bytes of gradients and optimizer state): bounded as a whole.
  if (const double params = approx_params(spec); params > static_cast<double>(kMaxParams))
    return Status::invalid_argument(fmt::format(
        "{}: about {:.3g} parameters, over the bound of {:.3g} (2^50; the largest published "
        "models have about 2e12): a mistyped size?",
        path, params, static_cast<double>(kMaxParams)));
  return Status::ok();
}

Status validate_model(const ModelSpec& m, std::string_view path) {
  auto module_path = [&](size_t i) { return join(path, fmt::format("modules[{}]", i)); };
  auto edge_path = [&](size_t j) { return join(path, fmt::format("edges[{}]", j)); };
  auto error = [](std::string where, std::string_view what) {
    return Status::invalid_argument(fmt::format("{}: {}", where, what));
  };
  if (m.modules.empty()) return error(join(path, "modules"), "a model needs modules");
  std::optional<size_t> llm;
  for (size_t i = 0; i < m.modules.size(); ++i) {
    const Module& mod = m.modules[i];
    HETPAR_RETURN_IF_ERROR(validate_module(mod.spec, module_path(i) + ".spec"));
    if (mod.name.empty()) return error(module_path(i) + ".name", "must not be empty");
    if (m.find(mod.name) != i)
      return error(module_path(i) + ".name", fmt::format("duplicate module name \"{}\"", mod.name));
    if (kind_of(mod.spec) != ModuleKind::kLlm) continue;
    if (llm)
      return error(module_path(i), fmt::format("second llm module (a model has exactly one; the "
                                               "first is \"{}\")",
                                               m.modules[*llm].name));
    llm = i;
  }
  if (!llm) return error(join(path, "modules"), "no llm module (a model has exactly one)");

  std::vector<int> out_degree(m.modules.size()), in_degree(m.modules.size());
  for (size_t j = 0; j < m.edges.size(); ++j) {
    const Edge& e = m.edges[j];
    if (e.from >= m.modules.size() || e.to >= m.modules.size())
      return error(edge_path(j), fmt::format("module index out of range (there are {} modules)",
                                             m.modules.size()));
    const Module& from = m.modules[e.from];
    const Module& to = m.modules[e.to];
    ModuleKind fk = kind_of(from.spec), tk = kind_of(to.spec);
    bool allowed = (is_encoder(fk) && (tk == ModuleKind::kProjector || tk == ModuleKind::kLlm)) ||
                   (fk == ModuleKind::kProjector && tk == ModuleKind::kLlm);
    if (!allowed)
      return error(edge_path(j),
                   fmt::format("{} -> {} is not allowed (edges run encoder -> projector -> llm or "
                               "encoder -> llm)",
                               to_string(fk), to_string(tk)));
    ++out_degree[e.from];
    ++in_degree[e.to];
    if (tk == ModuleKind::kProjector) {
      const auto& p = std::get<ProjectorSpec>(to.spec);
      if (p.input_hidden != output_hidden(from.spec))
        return error(module_path(e.to) + ".spec.input_hidden",
                     fmt::format("{} does not match the hidden size {} of \"{}\" it reads from",
                                 p.input_hidden, output_hidden(from.spec), from.name));
      int64_t tokens = encoder_tokens_per_item(from.spec);
      if (tokens % (p.downsample * p.downsample) != 0)
        return error(module_path(e.to) + ".spec.downsample",
                     fmt::format("{0}x{0} token merging needs the {1} tokens per item of \"{2}\" "
                                 "to be divisible by {3}",
                                 p.downsample, tokens, from.name, p.downsample * p.downsample));
    } else if (output_hidden(from.spec) != output_hidden(to.spec)) {
      std::string field =
          fk == ModuleKind::kProjector ? module_path(e.from) + ".spec.output_hidden" : edge_path(j);
      return error(field, fmt::format("hidden size {} of \"{}\" does not match the llm hidden "
                                      "size {}{}",
                                      output_hidden(from.spec), from.name, output_hidden(to.spec),
                                      fk == ModuleKind::kProjector ? "" : "; add a projector"));
    }
  }
  for (size_t i = 0; i < m.modules.size(); ++i) {
    if (i == *llm) continue;
    if (out_degree[i] != 1)
      return error(module_path(i), fmt::format("\"{}\" feeds {} modules; every encoder and "
                                               "projector feeds exactly one",
                                               m.modules[i].name, out_degree[i]));
    if (kind_of(m.modules[i].spec) == ModuleKind::kProjector && in_degree[i] != 1)
      return error(module_path(i), fmt::format("projector \"{}\" reads from {} encoders; it needs "
                                               "exactly one",
                                               m.modules[i].name, in_degree[i]));
  }
  return Status::ok();
}

}  // namespace hetpar::models
