#include "hetpar/models/totals.h"

namespace hetpar::models {

namespace {

int64_t norm_params(Norm n, int64_t h) {
  return n == Norm::kLayerNorm ? 2 * h : h;
}

int64_t mlp_params(int64_t in, int64_t f, int64_t out, Activation act, bool bias) {
  int64_t branches = is_gated(act) ? 2 : 1;
  return branches * in * f + f * out + (bias ? branches * f + out : 0);
}

int64_t attention_params(const TransformerSpec& t) {
  const int64_t h = t.hidden;
  if (t.mla) {  // the projections through the latents, the latents' norms, the output
    const MlaSpec& m = *t.mla;
    const int64_t q = t.heads * (m.qk_head_dim + m.rope_head_dim);
    const int64_t query =
        m.q_lora_rank > 0
            ? h * m.q_lora_rank + norm_params(t.norm, m.q_lora_rank) + m.q_lora_rank * q
            : h * q;
    return query + h * (m.kv_lora_rank + m.rope_head_dim) + norm_params(t.norm, m.kv_lora_rank) +
           m.kv_lora_rank * t.heads * (m.qk_head_dim + m.v_head_dim) + t.heads * m.v_head_dim * h +
           (t.linear_bias ? h : 0) + (t.attention_sinks ? t.heads : 0);
  }
  const int64_t d = t.head_dim(), qkv = (t.heads + 2 * t.kv_heads) * d;
  return h * qkv + (t.qkv_bias ? qkv : 0) + t.heads * d * h + (t.linear_bias ? h : 0) +
         (t.attention_sinks ? t.heads : 0);
}

// One layer of `t`: a MoE layer when `moe` is set; `active` as one token sees it.
ParamCounts layer_params(const TransformerSpec& t, const std::optional<MoeSpec>& moe) {
  const int64_t h = t.hidden;
  const int64_t common = attention_params(t) + (t.post_norms ? 4 : 2) * norm_params(t.norm, h) +
                         (t.qk_norm ? 2 * norm_params(t.norm, t.head_dim()) : 0);
  ParamCounts c;
  if (!moe) {
    c.total = c.active = common + mlp_params(h, t.ffn_hidden, h, t.activation, t.linear_bias);
    return c;
  }
  const int64_t expert = mlp_params(h, moe->expert_ffn_hidden, h, t.activation, t.linear_bias);
  c.total = common + h * moe->experts + moe->experts * expert +
            (moe->shared_experts > 0 ? mlp_params(h, moe->shared_experts * moe->expert_ffn_hidden,
                                                  h, t.activation, t.linear_bias)
                                     : 0) +
            (moe->shared_expert_gate ? h : 0);
  c.active = c.total - (moe->experts - moe->top_k) * expert;
  return c;
}

// Layers plus the final norm; `active` as one token sees them. An MoE block's dense layers
// (MoeSpec::dense_layer) have a dense MLP.
ParamCounts block_params(const TransformerSpec& t, const std::optional<MoeSpec>& moe) {
  const int64_t dense_layers = moe ? moe->dense_layer_count(t.layers) : t.layers;
  const ParamCounts dense = layer_params(t, std::nullopt);
  const ParamCounts sparse = moe ? layer_params(t, moe) : ParamCounts{};
  ParamCounts c;
  c.total = dense_layers * dense.total + (t.layers - dense_layers) * sparse.total +
            norm_params(t.norm, t.hidden);
  c.active = dense_layers * dense.active + (t.layers - dense_layers) * sparse.active +
             norm_params(t.norm, t.hidden);
  return c;
}

ParamCounts params(const LlmSpec& s) {
  ParamCounts c = block_params(s.block, s.moe);
  const int64_t h = s.block.hidden;
  // Each MTP depth: its layer, the 2h -> h projection and three norms (the embedding and
  // the hidden states', and its final one); the embedding table and output head are shared.
  if (s.mtp_layers > 0) {
    const ParamCounts layer = layer_params(s.block, s.moe);
    const int64_t own = 2 * h * h + 3 * norm_params(s.block.norm, h);
    c.total += s.mtp_layers * (layer.total + own);
    c.active += s.mtp_layers * (layer.active + own);
  }
  c.embedding = s.vocab * h * (s.tied_embeddings ? 1 : 2) +
                (s.positions == PositionEmbedding::kLearned ? s.max_positions * h : 0);
  c.total += c.embedding;
  c.active += c.embedding;
  return c;
}

ParamCounts params(const VisionEncoderSpec& s) {
  ParamCounts c = block_params(s.block, std::nullopt);
  const int64_t h = s.block.hidden;
  c.embedding = s.seq_len() * h + (s.class_token ? h : 0);
  int64_t patch = s.channels * s.patch_size * s.patch_size * h + (s.block.linear_bias ? h : 0);
  c.total += c.embedding + patch;
  c.active = c.total;
  return c;
}

ParamCounts params(const AudioEncoderSpec& s) {
  ParamCounts c = block_params(s.block, std::nullopt);
  const int64_t h = s.block.hidden, bias = s.block.linear_bias ? h : 0;
  c.embedding = s.positions == PositionEmbedding::kLearned ? s.seq_len() * h : 0;
  c.total += c.embedding + (s.mel_bins * 3 * h + bias) + (h * 3 * h + bias);
  c.active = c.total;
  return c;
}

ParamCounts params(const ProjectorSpec& s) {
  const int64_t in = s.input_hidden * s.downsample * s.downsample;
  ParamCounts c;
  c.total = s.layers == 1 ? in * s.output_hidden + s.output_hidden
                          : mlp_params(in, s.ffn_hidden, s.output_hidden, s.activation, true);
  c.active = c.total;
  return c;
}

template <class Get>
Flops sum_matmul(const OpGraph& g, Get get) {
  Flops f;
  for (const Op& op : g.ops)
    if (is_matmul(op.kind)) f += get(op);
  return f;
}

}  // namespace

ParamCounts count_params(const ModuleSpec& spec) {
  return std::visit([](const auto& s) { return params(s); }, spec);
}

ParamCounts count_params(const ModelSpec& model) {
  ParamCounts c;
  for (const Module& m : model.modules) {
    ParamCounts p = count_params(m.spec);
    c.total += p.total;
    c.embedding += p.embedding;
    c.active += p.active;
  }
  return c;
}

Flops forward_flops(const OpGraph& g) {
  return sum_matmul(g, [](const Op& op) { return op.forward; });
}

Flops backward_flops(const OpGraph& g) {
  return sum_matmul(g, [](const Op& op) { return op.backward(); });
}

Flops recompute_flops(const OpGraph& g, RecomputePolicy policy) {
  return sum_matmul(g, [&](const Op& op) { return op.forward * recompute_share(op, policy); });
}

Flops model_flops(const OpGraph& g) {
  return forward_flops(g) + backward_flops(g);
}

Bytes activation_bytes(const OpGraph& g, RecomputePolicy policy) {
  double total = 0;
  for (const Op& op : g.ops) total += kept_bytes(op, policy, g.dtype_bytes);
  if (keeps_layer_input(policy.kind))
    total += static_cast<double>(g.layers * g.layer_tokens * g.hidden * g.dtype_bytes);
  return Bytes(static_cast<int64_t>(total));
}

int64_t llm_tokens_per_item(const ModelSpec& model, size_t encoder) {
  int64_t tokens = encoder_tokens_per_item(model.modules[encoder].spec);
  for (const Edge& e : model.edges) {
    if (e.from != encoder) continue;
    if (const auto* p = std::get_if<ProjectorSpec>(&model.modules[e.to].spec))
      tokens /= p->downsample * p->downsample;
  }
  return tokens;
}

double model_flops_per_token(const LlmSpec& llm, int64_t seq_len) {
  ModuleInput in;
  in.seq_len = seq_len;
  return model_flops(build_op_graph(ModuleSpec(llm), in)).count() / static_cast<double>(seq_len);
}

}  // namespace hetpar::models
