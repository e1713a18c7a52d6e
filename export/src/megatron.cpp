// The megatron and megatron-mimo targets: Megatron-LM launch scripts. Names follow
// export/vocabulary/megatron-lm.txt (and megatron-mimo-example.txt for the MIMO example's
// own options); research/trainer-formats.md section 2 has the rules quoted below.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "writer.h"

namespace hetpar::exporter::detail {

namespace {

using planner::Layout;
using planner::Schedule;

void refuse_schedule(const Context& c, Refusals& r, bool interleaving_ok) {
  switch (c.p.schedule) {
    case Schedule::kGpipe:
      r.add(
          "the GPipe schedule (all forwards, then all backwards): Megatron-LM runs 1F1B "
          "(interleaved with virtual stages)");
      break;
    case Schedule::kZeroBubble:
      r.add("the ZB-H1 schedule: Megatron-LM has no zero-bubble pipeline schedule");
      break;
    case Schedule::kInterleaved:
      if (!interleaving_ok)
        r.add(fmt::format(
            "virtual pipeline stages (vpp {}): MIMO's multi-module pipeline schedule is 1F1B "
            "without virtual stages",
            c.layout().vpp));
      break;
    case Schedule::k1F1B:
      break;
  }
}

void refuse_tf32(const Context& c, Refusals& r) {
  refuse_precision_unless(c, r,
                          {hardware::Precision::kBf16, hardware::Precision::kFp16,
                           hardware::Precision::kFp8, hardware::Precision::kFp32});
}

std::vector<Flag> precision_flags(const Context& c) {
  switch (c.s.workload.precision) {
    case hardware::Precision::kBf16:
      return {{"--bf16", ""}};
    case hardware::Precision::kFp16:
      return {{"--fp16", ""}};
    // FP8 GEMMs through Transformer Engine, BF16 elsewhere; --fp8-recipe names the scaling
    // (delayed, or tensorwise = current scaling).
    case hardware::Precision::kFp8:
      return {{"--bf16", ""},
              {"--fp8-format", "hybrid"},
              {"--fp8-recipe", std::string(planner::to_string(c.layout().fp8_recipe))}};
    default:
      return {};  // fp32: Megatron's default
  }
}

// --pipeline-model-parallel-size and the uneven / virtual split flags.
std::vector<Flag> pipeline_split_flags(const Context& c) {
  const Layout& l = c.layout();
  std::vector<Flag> f;
  const bool uneven = l.first_stage_layers > 0 || l.last_stage_layers > 0 ||
                      l.account_for_embedding || l.account_for_loss;
  // The layout names every virtual stage, so it sets the virtual stages per rank itself
  // (Megatron-LM takes at most one of it and the two flags below).
  if (!l.pipeline_layout.empty())
    f.push_back(
        {"--pipeline-model-parallel-layout", fmt::format("\"{}\"", megatron_pipeline_layout(l))});
  else if (l.vpp > 1) {
    // --num-layers-per-virtual-pipeline-stage needs an even split; otherwise name the
    // virtual stages per rank (at most one of the two may be given).
    const int64_t layers = c.llm.block.layers;
    if (!uneven && layers % (static_cast<int64_t>(l.pp) * l.vpp) == 0)
      f.push_back({"--num-layers-per-virtual-pipeline-stage", num(layers / (l.pp * l.vpp))});
    else
      f.push_back({"--num-virtual-stages-per-pipeline-rank", num(l.vpp)});
  }
  if (l.first_stage_layers > 0)
    f.push_back({"--decoder-first-pipeline-num-layers", num(l.first_stage_layers)});
  if (l.last_stage_layers > 0)
    f.push_back({"--decoder-last-pipeline-num-layers", num(l.last_stage_layers)});
  if (l.account_for_embedding) f.push_back({"--account-for-embedding-in-pipeline-split", ""});
  if (l.account_for_loss) f.push_back({"--account-for-loss-in-pipeline-split", ""});
  if (l.microbatch_group > 0)
    f.push_back({"--microbatch-group-size-per-virtual-pipeline-stage", num(l.microbatch_group)});
  // Blocking transfers: Megatron-LM's non-interleaved schedule always blocks; the
  // interleaved one does with its P2P overlap off.
  if (l.pp_blocking_p2p && l.vpp > 1) f.push_back({"--no-overlap-p2p-communication", ""});
  return f;
}

// Batch, recompute, optimizer, overlap, precision and attention flags of the LLM layout.
std::vector<Flag> training_flags(const Context& c) {
  const Layout& l = c.layout();
  std::vector<Flag> f = {{"--micro-batch-size", num(l.micro_batch)},
                         {"--global-batch-size", num(c.s.workload.global_batch)}};
  for (Flag& x : megatron_recompute_flags(l)) f.push_back(std::move(x));
  // FSDP (Layout::fsdp_implementation): Megatron-FSDP's ZeRO-3 strategy, which saves its
  // fsdp_dtensor checkpoints only; or torch FSDP2, which keeps the gathered parameters until
  // the backward on request and shards the optimizer state itself (Megatron-LM asserts it
  // without --use-distributed-optimizer, arguments.py).
  const bool fsdp2 = l.torch_fsdp2();
  if (megatron_distributed_optimizer(l)) f.push_back({"--use-distributed-optimizer", ""});
  if (l.fsdp && !fsdp2) {
    f.push_back({"--use-megatron-fsdp", ""});
    f.push_back({"--data-parallel-sharding-strategy", "optim_grads_params"});
    f.push_back({"--ckpt-format", "fsdp_dtensor"});
  } else if (fsdp2) {
    f.push_back({"--use-torch-fsdp2", ""});
    if (!l.fsdp_reshard_after_forward) f.push_back({"--torch-fsdp2-no-reshard-after-forward", ""});
  }
  if (l.overlap_grad_reduce) f.push_back({"--overlap-grad-reduce", ""});
  if (l.overlap_grad_reduce && !l.align_grad_reduce) f.push_back({"--no-align-grad-reduce", ""});
  if (megatron_overlap_param_gather(l)) f.push_back({"--overlap-param-gather", ""});
  for (Flag& x : precision_flags(c)) f.push_back(std::move(x));
  // The gradient buffer where it departs from Megatron's default for the precision (fp32
  // under bf16 / fp8, fp16 under fp16: arguments.py).
  const bool fp16 = c.s.workload.precision == hardware::Precision::kFp16;
  if (!c.fp32_gradients() && !fp16) f.push_back({"--grad-reduce-in-bf16", ""});
  if (c.fp32_gradients() && fp16) f.push_back({"--accumulate-allreduce-grads-in-fp32", ""});
  if (l.fp8_param_gather) f.push_back({"--fp8-param-gather", ""});
  if (l.nccl_ub) f.push_back({"--use-nccl-ub", ""});  // Megatron-FSDP: double buffers with it
  if (!l.gradient_accumulation_fusion) f.push_back({"--no-gradient-accumulation-fusion", ""});
  if (l.defer_embedding_wgrad) {
    f.push_back({"--defer-embedding-wgrad-compute", ""});
    if (l.wgrad_deferral_limit > 0)
      f.push_back({"--wgrad-deferral-limit", std::to_string(l.wgrad_deferral_limit)});
  }
  if (l.cross_entropy_fusion != planner::CrossEntropy::kUnfused) {
    f.push_back({"--cross-entropy-loss-fusion", ""});
    f.push_back(
        {"--cross-entropy-fusion-impl", std::string(planner::to_string(l.cross_entropy_fusion))});
  }
  if (l.tp_comm_overlap) f.push_back({"--tp-comm-overlap", ""});  // TE userbuffers
  if (l.moe_capacity_factor > 0) {  // token dropping, padded to capacity
    f.push_back({"--moe-expert-capacity-factor", decimal(l.moe_capacity_factor)});
    f.push_back({"--moe-pad-expert-input-to-capacity", ""});
  }
  if (l.ep_comm_overlap) {  // combined 1F1B; the weight gradients beside the all-to-alls
    f.push_back({"--overlap-moe-expert-parallel-comm", ""});
    f.push_back({"--delay-wgrad-compute", ""});
  }
  if (l.moe_shared_expert_overlap) f.push_back({"--moe-shared-expert-overlap", ""});
  f.push_back({"--attention-backend", std::string(megatron_attention_backend(l))});
  return f;
}

FlagGroup placeholder_group(const Context& c) {
  return {"DATA_ARGS",
          "Placeholders (not part of the plan): replace with your data, tokenizer and schedule.",
          {{"--tokenizer-type", "NullTokenizer"},
           {"--vocab-size", num(c.llm.vocab)},
           {"--mock-data", ""},
           {"--train-iters", "100"},
           {"--lr", "1.0e-4"}}};
}

// ["layernorm", "moe_act"]: the recompute modules as a Python list of strings.
std::string python_string_list(uint8_t modules) {
  std::vector<std::string> quoted;
  for (std::string_view name : planner::recompute_module_names(modules))
    quoted.push_back(fmt::format("\"{}\"", name));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

// Megatron-LM's arguments gate the MLP with SiLU (--swiglu) or the sigmoid approximation
// of GELU (--quick-geglu: x * sigmoid(1.702 x)); a GELU-gated unit needs a model provider.
void refuse_geglu(const Context& c, Refusals& r) {
  if (c.llm.block.activation == models::Activation::kGeglu)
    r.add(
        "activation geglu: Megatron-LM's arguments have no GELU-gated MLP (--swiglu gates with "
        "SiLU, --quick-geglu with x * sigmoid(1.702 x))");
}

}  // namespace

std::vector<Flag> megatron_recompute_flags(const Layout& l) {
  switch (l.recompute) {
    case models::Recompute::kNone:
      return {};
    // The attention core (Megatron's default --recompute-modules core_attn), or the modules
    // the plan names.
    case models::Recompute::kSelective: {
      std::vector<Flag> f{{"--recompute-granularity", "selective"}};
      if (l.names_recompute_modules()) {
        f.push_back(
            {"--recompute-modules",
             fmt::format("{}",
                         fmt::join(planner::recompute_module_names(l.recompute_modules), " "))});
      }
      return f;
    }
    // Every layer's forward, keeping each layer's input.
    case models::Recompute::kFull:
      return {{"--recompute-granularity", "full"},
              {"--recompute-method", "uniform"},
              {"--recompute-num-layers", "1"}};
    case models::Recompute::kSelectiveOp:  // refused (refuse_selective_op)
      break;
  }
  return {};
}

std::string transformer_config_fields(const Layout& l) {
  std::string out = fmt::format("sequence_parallel={}", l.sequence_parallel ? "True" : "False");
  switch (l.recompute) {
    case models::Recompute::kNone:
      out += " recompute_granularity=None";
      break;
    case models::Recompute::kSelective:
      out += " recompute_granularity=\"selective\"";
      if (l.names_recompute_modules())
        out += fmt::format(" recompute_modules={}", python_string_list(l.recompute_modules));
      break;
    case models::Recompute::kFull:
      out +=
          " recompute_granularity=\"full\" recompute_method=\"uniform\" "
          "recompute_num_layers=1";
      break;
    case models::Recompute::kSelectiveOp:  // refused (refuse_selective_op)
      break;
  }
  out += fmt::format(" attention_backend={}", megatron_attention_backend(l));
  if (l.cross_entropy_fusion != planner::CrossEntropy::kUnfused)
    out += fmt::format(" cross_entropy_loss_fusion=True cross_entropy_fusion_impl=\"{}\"",
                       planner::to_string(l.cross_entropy_fusion));
  return out;
}

void refuse_megatron_model(const Context& c, Refusals& r) {
  refuse_post_norms(c, r);
  const models::TransformerSpec& b = c.llm.block;
  // MLATransformerConfig's YaRN ramp: original_max_position_embeddings 4096, beta_fast 32,
  // beta_slow 1, rounded; Megatron-LM's --yarn-* flags set GPT attention's only.
  if (const auto& y = c.llm.yarn; y && b.mla &&
                                  (y->original_max_positions != 4096 || y->beta_fast != 32 ||
                                   y->beta_slow != 1 || !y->truncate))
    r.add(fmt::format(
        "yarn with mla: Megatron-LM's multi-latent attention keeps MLATransformerConfig's YaRN "
        "ramp (original_max_positions 4096, beta_fast 32, beta_slow 1, truncate true); the "
        "model has original_max_positions {}, beta_fast {}, beta_slow {}, truncate {}",
        y->original_max_positions, y->beta_fast, y->beta_slow, y->truncate));
  if (b.linear_bias && !b.qkv_bias)
    r.add(
        "linear biases without QKV biases: Megatron-LM's bias switch (--disable-bias-linear) "
        "covers the QKV projection too");
}

std::vector<Flag> megatron_model_flags(const Context& c) {
  const models::LlmSpec& llm = c.llm;
  const models::TransformerSpec& b = llm.block;
  std::vector<Flag> f = {{"--num-layers", num(b.layers)},
                         {"--hidden-size", num(b.hidden)},
                         {"--num-attention-heads", num(b.heads)}};
  if (b.head_size > 0) f.push_back({"--kv-channels", num(b.head_dim())});
  if (b.qk_norm) f.push_back({"--qk-layernorm", ""});
  if (b.mla) {  // Megatron-Core's MLASelfAttention (MLATransformerConfig)
    f.push_back({"--multi-latent-attention", ""});
    if (b.mla->q_lora_rank > 0) f.push_back({"--q-lora-rank", num(b.mla->q_lora_rank)});
    f.push_back({"--kv-lora-rank", num(b.mla->kv_lora_rank)});
    f.push_back({"--qk-head-dim", num(b.mla->qk_head_dim)});
    f.push_back({"--qk-pos-emb-head-dim", num(b.mla->rope_head_dim)});
    f.push_back({"--v-head-dim", num(b.mla->v_head_dim)});
  }
  // Sliding windows: Transformer Engine's (left, right) window; every full_every-th layer
  // (1-based numbers) skips it.
  if (b.sliding_window) {
    f.push_back({"--window-size", fmt::format("{},0", b.sliding_window->size)});
    if (b.sliding_window->full_every > 0)
      f.push_back({"--window-attn-skip-freq", num(b.sliding_window->full_every)});
  }
  if (b.attention_sinks) f.push_back({"--softmax-type", "learnable"});
  // Multi-token prediction, its depths on the last pipeline stage (Megatron's default).
  if (llm.mtp_layers > 0) f.push_back({"--mtp-num-layers", num(llm.mtp_layers)});
  if (b.kv_heads != b.heads) {
    f.push_back({"--group-query-attention", ""});
    f.push_back({"--num-query-groups", num(b.kv_heads)});
  }
  if (llm.moe) {
    // With dense layers, --ffn-hidden-size is theirs and --moe-layer-freq places them (a
    // Python list expression Megatron evaluates, quoted for the shell): dense ones first, or
    // the layer pattern repeated.
    const int64_t dense = llm.moe->dense_layers;
    const std::vector<int64_t>& pattern = llm.moe->layer_pattern;
    const bool dense_mlps = llm.moe->dense_layer_count(b.layers) > 0;
    f.push_back({"--ffn-hidden-size", num(dense_mlps ? b.ffn_hidden : llm.moe->expert_ffn_hidden)});
    if (dense > 0)
      f.push_back({"--moe-layer-freq", fmt::format("'([0]*{}+[1]*{})'", dense, b.layers - dense)});
    else if (dense_mlps)
      f.push_back(
          {"--moe-layer-freq", fmt::format("'([{}]*{})'", fmt::join(pattern, ","),
                                           b.layers / static_cast<int64_t>(pattern.size()))});
    f.push_back({"--num-experts", num(llm.moe->experts)});
    f.push_back({"--moe-router-topk", num(llm.moe->top_k)});
    f.push_back({"--moe-ffn-hidden-size", num(llm.moe->expert_ffn_hidden)});
    // The model's router (Megatron's default: softmax scores, no bias, scaling or groups).
    const models::MoeSpec& m = *llm.moe;
    if (m.sigmoid_router) f.push_back({"--moe-router-score-function", "sigmoid"});
    if (m.expert_bias) f.push_back({"--moe-router-enable-expert-bias", ""});
    if (m.probs_on_input) f.push_back({"--moe-apply-probs-on-input", ""});
    if (m.pre_softmax) f.push_back({"--moe-router-pre-softmax", ""});
    if (m.shared_expert_gate) f.push_back({"--moe-shared-expert-gate", ""});
    if (m.topk_scaling > 0)
      f.push_back({"--moe-router-topk-scaling-factor", decimal(m.topk_scaling)});
    if (m.groups > 0) {
      f.push_back({"--moe-router-num-groups", num(m.groups)});
      f.push_back({"--moe-router-group-topk", num(m.group_topk)});
    }
    if (llm.moe->shared_experts > 0)
      f.push_back({"--moe-shared-expert-intermediate-size",
                   num(llm.moe->shared_experts * llm.moe->expert_ffn_hidden)});
    // The MoE layer hetpar models (cost_model.cpp): the all-to-all dispatcher (Megatron's
    // default is allgather) or the flex one with DeepEP or HybridEP, grouped expert GEMMs,
    // the fused permutation and router.
    if (c.layout().flex_dispatcher()) {
      f.push_back({"--moe-token-dispatcher-type", "flex"});
      f.push_back({"--moe-flex-dispatcher-backend",
                   std::string(planner::to_string(c.layout().moe_dispatcher))});
    } else {
      f.push_back({"--moe-token-dispatcher-type", "alltoall"});
    }
    f.push_back({"--moe-grouped-gemm", ""});
    f.push_back({"--moe-permute-fusion", ""});
    f.push_back({"--moe-router-fusion", ""});
    // The router's scores and probabilities in fp32, as hetpar times them (and DeepEP takes
    // them; in bf16 Megatron-Core casts them with a warning).
    f.push_back({"--moe-router-dtype", "fp32"});
  } else {
    f.push_back({"--ffn-hidden-size", num(b.ffn_hidden)});
  }
  f.push_back({"--seq-length", num(c.s.workload.seq_len)});
  const bool learned = llm.positions == models::PositionEmbedding::kLearned;
  f.push_back({"--max-position-embeddings",
               num(learned && llm.max_positions > 0 ? llm.max_positions : c.s.workload.seq_len)});
  // YaRN: GPT attention's by --position-embedding-type yarn and its --yarn-* flags; MLA's
  // by --rope-type (MLATransformerConfig's, whose ramp and original length keep their
  // defaults: refuse_megatron_model), both scaled by --rotary-scaling-factor and --mscale.
  const bool gpt_yarn = llm.yarn && !b.mla;
  f.push_back(
      {"--position-embedding-type", learned ? "learned_absolute" : (gpt_yarn ? "yarn" : "rope")});
  if (llm.rope_base > 0) f.push_back({"--rotary-base", decimal(llm.rope_base)});
  if (llm.rotary_percent != 1) f.push_back({"--rotary-percent", decimal(llm.rotary_percent)});
  if (llm.no_rope_every > 0) f.push_back({"--no-rope-freq", num(llm.no_rope_every)});
  if (llm.rope_scaling_factor > 0) {
    f.push_back({"--use-rope-scaling", ""});
    f.push_back({"--rope-scaling-factor", decimal(llm.rope_scaling_factor)});
  }
  if (b.mla && !learned) f.push_back({"--rope-type", llm.yarn ? "yarn" : "rope"});
  if (llm.yarn) {
    const models::Yarn& y = *llm.yarn;
    f.push_back({"--rotary-scaling-factor", decimal(y.factor)});
    if (gpt_yarn) {
      f.push_back({"--yarn-original-max-position-embeddings", num(y.original_max_positions)});
      f.push_back({"--yarn-beta-fast", decimal(y.beta_fast)});
      f.push_back({"--yarn-beta-slow", decimal(y.beta_slow)});
      f.push_back({y.truncate ? "--yarn-correction-range-round-to-int"
                              : "--no-yarn-correction-range-round-to-int",
                   ""});
    }
    f.push_back({"--mscale", decimal(y.mscale)});
    f.push_back({"--mscale-all-dim", decimal(y.mscale_all_dim)});
  }
  if (!c.layout().fused_rope && !learned) f.push_back({"--no-rope-fusion", ""});
  f.push_back({"--normalization", b.norm == models::Norm::kRmsNorm ? "RMSNorm" : "LayerNorm"});
  if (b.zero_centered_gamma) f.push_back({"--apply-layernorm-1p", ""});
  if (b.activation == models::Activation::kSwiglu) f.push_back({"--swiglu", ""});
  if (b.activation == models::Activation::kSquaredRelu) f.push_back({"--squared-relu", ""});
  if (b.activation == models::Activation::kQuickGeglu) f.push_back({"--quick-geglu", ""});
  if (b.glu_linear_offset != 0) f.push_back({"--glu-linear-offset", decimal(b.glu_linear_offset)});
  if (b.activation_clamp > 0)
    f.push_back({"--activation-func-clamp-value", decimal(b.activation_clamp)});
  // Megatron-LM fuses SwiGLU by --bias-swiglu-fusion and every other activation by
  // --bias-gelu-fusion (its quick GeGLU: Megatron-Core's bias_geglu fusions).
  if (b.activation == models::Activation::kSwiglu && !c.layout().fused_activation)
    f.push_back({"--no-bias-swiglu-fusion", ""});
  if (b.activation == models::Activation::kQuickGeglu && !c.layout().fused_activation)
    f.push_back({"--no-bias-gelu-fusion", ""});
  if (!b.linear_bias) {
    f.push_back({"--disable-bias-linear", ""});
    if (b.qkv_bias) f.push_back({"--add-qkv-bias", ""});
  }
  if (!llm.tied_embeddings) f.push_back({"--untie-embeddings-and-output-weights", ""});
  if (!b.dropout) {
    f.push_back({"--attention-dropout", "0.0"});
    f.push_back({"--hidden-dropout", "0.0"});
  }
  return f;
}

Result<std::vector<ExportFile>> write_megatron(const Context& c) {
  const Layout& l = c.layout();
  Refusals r;
  refuse_mixed_node_sizes(c, r);
  refuse_heterogeneous(c, r);
  refuse_megatron_model(c, r);
  refuse_geglu(c, r);
  refuse_selective_op(c, r);
  refuse_megatron_cross_entropy(c, r);
  refuse_schedule(c, r, /*interleaving_ok=*/true);
  refuse_tf32(c, r);
  refuse_megatron_fsdp(c, "Megatron-LM's arguments.py asserts it under --use-torch-fsdp2", r);
  refuse_megatron_asserts(c, r);
  for (size_t i : c.encoders)
    if (models::kind_of(c.s.model.modules[i].spec) == models::ModuleKind::kAudioEncoder)
      r.add(fmt::format(
          "the audio encoder {}: Megatron-LM's LLaVA-style pretrain_vlm.py has a vision "
          "encoder only",
          c.s.model.modules[i].name));
  if (!r.empty()) return r.status(c.target);

  std::vector<Flag> parallel = {{"--tensor-model-parallel-size", num(l.tp)},
                                {"--pipeline-model-parallel-size", num(l.pp)},
                                {"--context-parallel-size", num(l.cp)}};
  if (l.cp > 1) parallel.push_back({"--cp-comm-type", std::string(planner::to_string(l.cp_comm))});
  if (l.cp > 1 && l.cp_comm == planner::CpComm::kA2AP2P)  // the a2a level first, then the ring
    parallel.push_back(
        {"--hierarchical-context-parallel-sizes", fmt::format("{} {}", l.cp_a2a, l.cp_ring())});
  if (c.llm.moe) {
    parallel.push_back({"--expert-model-parallel-size", num(l.ep)});
    // The experts' TP width (Layout::etp; the LLM's TP, Megatron's default, made explicit).
    parallel.push_back({"--expert-tensor-parallel-size", num(l.expert_tp())});
  }
  if (l.sequence_parallel && l.tp > 1) parallel.push_back({"--sequence-parallel", ""});
  for (Flag& f : pipeline_split_flags(c)) parallel.push_back(std::move(f));

  std::vector<std::string> notes = {fmt::format(
      "Data parallelism {} = world {} / (tp {} x pp {} x cp {}) is implied: Megatron-LM has "
      "no DP flag.",
      l.dp, c.world, l.tp, l.pp, l.cp)};
  if (l.torch_fsdp2())
    for (std::string& n : fsdp2_notes(c, "Megatron-LM", /*wraps_like_torchtitan=*/false))
      notes.push_back(std::move(n));
  // Megatron-Core: linear_qkv and linear_fc1 fused, Transformer Engine reading the kv heads;
  // its squared ReLU always jit-fused, its SwiGLU as the plan says (--no-bias-swiglu-fusion).
  const models::Activation act = c.llm.block.activation;
  const bool by_flag = act == models::Activation::kSwiglu || act == models::Activation::kQuickGeglu;
  if (std::string n = layer_code_note(c, "Megatron-LM",
                                      {.fused_activation = !by_flag || c.layout().fused_activation,
                                       .fused_rope = c.layout().fused_rope});
      !n.empty())
    notes.push_back(std::move(n));
  std::string entry = "pretrain_gpt.py";
  if (c.multimodal()) {
    entry = "pretrain_vlm.py";
    notes.push_back(fmt::format(
        "Multimodal, homogeneous: pretrain_vlm.py (examples/multimodal) builds the vision "
        "encoder on the first pipeline stage with the LLM's TP. Add examples/multimodal's own "
        "options for the encoder ({}){}; they are not in Megatron-LM's core flag list.",
        c.s.model.modules[c.encoders.front()].name,
        c.s.workload.frozen_encoders ? " and freeze it" : ""));
    if (l.sequence_parallel && l.tp > 1)
      notes.push_back(
          "Not the same as predicted: Megatron-LM's LLaVA path runs the encoder without "
          "sequence parallelism (research/trainer-formats.md 2); hetpar's homogeneous "
          "prediction gives it the LLM's SP.");
  }
  std::vector<FlagGroup> groups = {
      {"PARALLEL_ARGS", "Parallelism (the plan).", std::move(parallel)},
      {"MODEL_ARGS", fmt::format("The LLM of {}.", c.s.model.name), megatron_model_flags(c)},
      {"TRAINING_ARGS", "Batch, recompute, optimizer, overlap and precision (the plan).",
       training_flags(c)},
      placeholder_group(c)};
  return std::vector<ExportFile>{
      {"launch.sh",
       torchrun_script(c, notes, groups, entry, megatron_environment(c, l.tp > 1 || l.cp > 1))}};
}

Result<std::vector<ExportFile>> write_megatron_mimo(const Context& c) {
  const Layout& l = c.layout();
  Refusals r;
  refuse_mixed_node_sizes(c, r);
  refuse_megatron_model(c, r);
  refuse_geglu(c, r);
  refuse_selective_op(c, r);
  refuse_megatron_cross_entropy(c, r);
  refuse_schedule(c, r, /*interleaving_ok=*/false);
  refuse_tf32(c, r);
  refuse_mimo_fsdp(c, "the MIMO example", r);
  refuse_megatron_asserts(c, r);
  refuse_mimo_ep_overlap(c, "the MIMO example", r);
  if (l.cp > 1)
    r.add(fmt::format("llm cp {}: the MIMO example runs the language grid with CP 1 only", l.cp));
  const planner::ModulePlan* enc = nullptr;
  switch (c.p.placement) {
    case planner::Placement::kHomogeneous:
      if (c.multimodal())
        r.add(
            "the homogeneous placement of a multimodal model: the MIMO example gives each "
            "module its own grid (export it with --to megatron, pretrain_vlm.py)");
      break;
    case planner::Placement::kColocated:
      r.add(
          "the colocated placement: the MIMO example's grids occupy disjoint rank spans "
          "(non-colocated) only (export colocated plans with --to megatron-bridge)");
      break;
    case planner::Placement::kNonColocated:
      if (c.p.modules.size() != 1) {
        r.add(fmt::format("{} encoder layouts: the MIMO example has a single encoder grid",
                          c.p.modules.size()));
        break;
      }
      enc = &c.p.modules.front();
      if (enc->first_rank != 0)
        r.add(fmt::format(
            "encoder {} on ranks {}-{}: the MIMO example places the encoder grid at rank 0 and "
            "the LLM after it (--llm-offset)",
            enc->module, enc->first_rank, enc->first_rank + enc->layout.world() - 1));
      break;
  }
  if (enc) {
    if (enc->layout.pp > 1)
      r.add(fmt::format(
          "encoder {} pp {}: the MIMO example fixes the encoder grid's PP at 1 (export it with "
          "--to megatron-bridge, whose per-module parallelism has a pipeline size)",
          enc->module, enc->layout.pp));
    refuse_mimo_encoder_batch(c, *enc, "the MIMO example", r);
    refuse_mimo_ddp_mismatch(c, *enc,
                             "the MIMO example takes one --use-distributed-optimizer, "
                             "--overlap-grad-reduce and --overlap-param-gather for every module",
                             r);
  }
  if (!r.empty()) return r.status(c.target);

  std::vector<Flag> grids = {
      {"--model-provider",
       fmt::format("\"${{MODEL_PROVIDER:?set MODEL_PROVIDER to the examples/mimo model provider "
                   "of {}}}\"",
                   c.s.model.name)}};
  std::vector<std::string> notes;
  if (enc) {
    grids.push_back({"--encoder-tp", num(enc->layout.tp)});
    grids.push_back({"--encoder-dp", num(enc->layout.dp)});
    grids.push_back({"--llm-offset", num(c.p.llm_first_rank)});
    notes.push_back(fmt::format("Encoder {} on ranks 0-{} (TP {} x DP {}), LLM on ranks {}-{}.",
                                enc->module, enc->layout.world() - 1, enc->layout.tp,
                                enc->layout.dp, c.p.llm_first_rank,
                                c.p.llm_first_rank + l.world() - 1));
    notes.push_back(
        fmt::format("Set in the model provider's encoder TransformerConfig (not a flag): {}{}.",
                    transformer_config_fields(enc->layout),
                    c.s.workload.frozen_encoders ? "; freeze the encoder" : ""));
  } else {
    grids.push_back({"--llm-only", ""});
    grids.push_back({"--llm-offset", "0"});
  }
  grids.push_back({"--llm-tp", num(l.tp)});
  grids.push_back({"--llm-cp", num(l.cp)});
  grids.push_back({"--llm-pp", num(l.pp)});
  grids.push_back({"--llm-dp", num(l.dp)});
  if (c.llm.moe) {
    grids.push_back({"--llm-ep", num(l.ep)});
    grids.push_back({"--llm-expt-tp", num(l.expert_tp())});
  }
  std::vector<Flag> llm = pipeline_split_flags(c);
  if (l.sequence_parallel && l.tp > 1) llm.insert(llm.begin(), {"--sequence-parallel", ""});
  for (Flag& f : training_flags(c)) llm.push_back(std::move(f));
  std::vector<FlagGroup> groups = {
      {"MIMO_ARGS", "Module grids (the plan): the MIMO example's own options.", std::move(grids)},
      {"MODEL_ARGS", fmt::format("The LLM of {}.", c.s.model.name), megatron_model_flags(c)},
      {"TRAINING_ARGS", "The LLM's split, batch, recompute, optimizer and precision (the plan).",
       std::move(llm)},
      placeholder_group(c)};
  return std::vector<ExportFile>{
      {"launch.sh", torchrun_script(c, notes, groups, "examples/mimo/pretrain_mimo.py",
                                    megatron_environment(
                                        c, l.tp > 1 || l.cp > 1 || (enc && enc->layout.tp > 1)))}};
}

}  // namespace hetpar::exporter::detail
