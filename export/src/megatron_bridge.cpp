// The megatron-bridge target: a YAML file of Megatron-Bridge ConfigContainer overrides
// (keys from export/vocabulary/megatron-bridge.txt). Single-layout plans set model.* like
// Megatron-LM's TransformerConfig; heterogeneous plans set the MegatronMIMOProvider's
// per-module parallelism (megatron_mimo_parallelism_config.module_parallelisms), whose
// validation (finalize()) the refusals below mirror: research/trainer-formats.md section 3.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "writer.h"

namespace hetpar::exporter::detail {

namespace {

using planner::Layout;

std::string recompute_value(models::Recompute r) {
  switch (r) {
    case models::Recompute::kNone:
      return "null";
    case models::Recompute::kSelective:
      return yaml_string("selective");
    case models::Recompute::kFull:
      return yaml_string("full");
    case models::Recompute::kSelectiveOp:  // refused (refuse_selective_op)
      break;
  }
  return "null";
}

void add_recompute(std::vector<Setting>& s, const Layout& l) {
  s.push_back({"model.recompute_granularity", recompute_value(l.recompute)});
  if (l.names_recompute_modules())
    s.push_back({"model.recompute_modules",
                 "[" + planner::recompute_modules_names(l.recompute_modules) + "]"});
  if (l.recompute == models::Recompute::kFull) {
    s.push_back({"model.recompute_method", yaml_string("uniform")});
    s.push_back({"model.recompute_num_layers", "1"});
  }
}

void add_model_shape(std::vector<Setting>& s, const Context& c) {
  const models::LlmSpec& llm = c.llm;
  const models::TransformerSpec& b = llm.block;
  s.push_back({"model.num_layers", num(b.layers)});
  s.push_back({"model.hidden_size", num(b.hidden)});
  s.push_back({"model.num_attention_heads", num(b.heads)});
  s.push_back({"model.num_query_groups", num(b.kv_heads)});
  if (b.head_size > 0) s.push_back({"model.kv_channels", num(b.head_dim())});
  if (llm.mtp_layers > 0) s.push_back({"model.mtp_num_layers", num(llm.mtp_layers)});
  if (b.sliding_window) {  // TransformerConfig.window_size (left, right), as its providers set it
    s.push_back({"model.window_size", fmt::format("[{}, 0]", b.sliding_window->size)});
    if (b.sliding_window->full_every > 0)
      s.push_back({"model.window_attn_skip_freq", num(b.sliding_window->full_every)});
  }
  if (b.attention_sinks) s.push_back({"model.softmax_type", yaml_string("learnable")});
  if (llm.moe) {
    // With dense layers (first, or by the layer pattern), ffn_hidden_size is theirs and
    // moe_layer_freq, one entry per layer (0 dense, 1 MoE), places them.
    const bool dense_mlps = llm.moe->dense_layer_count(b.layers) > 0;
    s.push_back(
        {"model.ffn_hidden_size", num(dense_mlps ? b.ffn_hidden : llm.moe->expert_ffn_hidden)});
    if (dense_mlps) {
      std::vector<std::string_view> freq;
      for (int64_t i = 0; i < b.layers; ++i)
        freq.push_back(llm.moe->dense_layer(i, b.layers) ? "0" : "1");
      s.push_back({"model.moe_layer_freq", fmt::format("[{}]", fmt::join(freq, ", "))});
    }
    s.push_back({"model.num_moe_experts", num(llm.moe->experts)});
    s.push_back({"model.moe_router_topk", num(llm.moe->top_k)});
    s.push_back({"model.moe_ffn_hidden_size", num(llm.moe->expert_ffn_hidden)});
    // The model's router, written either way (Megatron-Bridge's MoE providers set their own).
    const models::MoeSpec& m = *llm.moe;
    s.push_back(
        {"model.moe_router_score_function", yaml_string(m.sigmoid_router ? "sigmoid" : "softmax")});
    s.push_back({"model.moe_router_enable_expert_bias", yaml_bool(m.expert_bias)});
    s.push_back({"model.moe_apply_probs_on_input", yaml_bool(m.probs_on_input)});
    s.push_back({"model.moe_router_pre_softmax", yaml_bool(m.pre_softmax)});
    if (m.shared_experts > 0)
      s.push_back({"model.moe_shared_expert_gate", yaml_bool(m.shared_expert_gate)});
    s.push_back({"model.moe_router_topk_scaling_factor",
                 m.topk_scaling > 0 ? decimal(m.topk_scaling) : "null"});
    s.push_back({"model.moe_router_num_groups", m.groups > 0 ? num(m.groups) : "null"});
    s.push_back({"model.moe_router_group_topk", m.groups > 0 ? num(m.group_topk) : "null"});
    if (llm.moe->shared_experts > 0)
      s.push_back({"model.moe_shared_expert_intermediate_size",
                   num(llm.moe->shared_experts * llm.moe->expert_ffn_hidden)});
    // The MoE layer hetpar models, as Megatron-Bridge's performance configurations run it.
    if (c.layout().flex_dispatcher()) {
      s.push_back({"model.moe_token_dispatcher_type", yaml_string("flex")});
      s.push_back({"model.moe_flex_dispatcher_backend",
                   yaml_string(planner::to_string(c.layout().moe_dispatcher))});
    } else {
      s.push_back({"model.moe_token_dispatcher_type", yaml_string("alltoall")});
    }
    s.push_back({"model.moe_grouped_gemm", yaml_bool(true)});
    s.push_back({"model.moe_permute_fusion", yaml_bool(true)});
    s.push_back({"model.moe_router_fusion", yaml_bool(true)});
    s.push_back({"model.moe_router_dtype", yaml_string("fp32")});  // as hetpar times it
  } else {
    s.push_back({"model.ffn_hidden_size", num(b.ffn_hidden)});
  }
  s.push_back({"model.gated_linear_unit", yaml_bool(models::is_gated(b.activation))});
  if (models::is_gated(b.activation) && !c.layout().fused_activation)
    s.push_back({"model.bias_activation_fusion", yaml_bool(false)});
  if (b.glu_linear_offset != 0)
    s.push_back({"model.glu_linear_offset", decimal(b.glu_linear_offset)});
  if (b.activation_clamp > 0)
    s.push_back({"model.activation_func_clamp_value", decimal(b.activation_clamp)});
  s.push_back({"model.normalization",
               yaml_string(b.norm == models::Norm::kRmsNorm ? "RMSNorm" : "LayerNorm")});
  s.push_back({"model.layernorm_zero_centered_gamma", yaml_bool(b.zero_centered_gamma)});
  const bool learned = llm.positions == models::PositionEmbedding::kLearned;
  s.push_back({"model.position_embedding_type", yaml_string(learned    ? "learned_absolute"
                                                            : llm.yarn ? "yarn"
                                                                       : "rope")});
  if (llm.rope_base > 0) s.push_back({"model.rotary_base", decimal(llm.rope_base)});
  if (llm.rotary_percent != 1) s.push_back({"model.rotary_percent", decimal(llm.rotary_percent)});
  if (llm.no_rope_every > 0) s.push_back({"model.no_rope_freq", num(llm.no_rope_every)});
  if (llm.rope_scaling_factor > 0) {
    s.push_back({"model.rope_scaling", yaml_bool(true)});
    s.push_back({"model.rope_scaling_factor", decimal(llm.rope_scaling_factor)});
  }
  if (llm.yarn) {  // GPTModelProvider's yarn_* fields (multi-latent attention is refused)
    const models::Yarn& y = *llm.yarn;
    s.push_back({"model.yarn_rotary_scaling_factor", decimal(y.factor)});
    s.push_back({"model.yarn_original_max_position_embeddings", num(y.original_max_positions)});
    s.push_back({"model.yarn_beta_fast", decimal(y.beta_fast)});
    s.push_back({"model.yarn_beta_slow", decimal(y.beta_slow)});
    s.push_back({"model.yarn_mscale", decimal(y.mscale)});
    s.push_back({"model.yarn_mscale_all_dim", decimal(y.mscale_all_dim)});
    s.push_back({"model.yarn_correction_range_round_to_int", yaml_bool(y.truncate)});
  }
  if (!learned) s.push_back({"model.apply_rope_fusion", yaml_bool(c.layout().fused_rope)});
  s.push_back({"model.share_embeddings_and_output_weights", yaml_bool(llm.tied_embeddings)});
  s.push_back({"model.add_bias_linear", yaml_bool(b.linear_bias)});
  s.push_back({"model.add_qkv_bias", yaml_bool(b.qkv_bias)});
  s.push_back({"model.qk_layernorm", yaml_bool(b.qk_norm)});
  s.push_back({"model.attention_dropout", b.dropout ? "0.1" : "0.0"});
  s.push_back({"model.hidden_dropout", b.dropout ? "0.1" : "0.0"});
  s.push_back({"model.vocab_size", num(llm.vocab)});
  s.push_back({"model.seq_length", num(c.s.workload.seq_len)});
  if (!c.layout().gradient_accumulation_fusion)
    s.push_back({"model.gradient_accumulation_fusion", "false"});
}

// train.*, dataset.*, ddp.* and the precision recipe, shared by both shapes.
void add_training(std::vector<Setting>& s, const Context& c) {
  const Layout& l = c.layout();
  s.push_back({"train.micro_batch_size", num(l.micro_batch)});
  s.push_back({"train.global_batch_size", num(c.s.workload.global_batch)});
  s.push_back({"dataset.seq_length", num(c.s.workload.seq_len)});
  // FSDP: Megatron-FSDP's ZeRO-3 strategy (write_megatron_bridge refuses it without
  // reshard), or torch FSDP2, which shards the optimizer state itself.
  const bool fsdp2 = l.torch_fsdp2();
  s.push_back({"ddp.use_distributed_optimizer", yaml_bool(megatron_distributed_optimizer(l))});
  if (l.fsdp && !fsdp2) {
    s.push_back({"dist.use_megatron_fsdp", "true"});
    s.push_back({"ddp.use_megatron_fsdp", "true"});
    s.push_back({"ddp.data_parallel_sharding_strategy", yaml_string("optim_grads_params")});
    // Megatron-FSDP in Bridge saves and loads only its fsdp_dtensor checkpoints.
    s.push_back({"checkpoint.ckpt_format", yaml_string("fsdp_dtensor")});
  } else if (fsdp2) {
    s.push_back({"dist.use_torch_fsdp2", "true"});
  }
  s.push_back({"ddp.overlap_grad_reduce", yaml_bool(l.overlap_grad_reduce)});
  if (l.overlap_grad_reduce && !l.align_grad_reduce)
    s.push_back({"dist.align_grad_reduce", "false"});
  if (l.tp_comm_overlap) s.push_back({"comm_overlap.tp_comm_overlap", "true"});  // userbuffers
  if (l.nccl_ub) s.push_back({"ddp.nccl_ub", "true"});
  if (l.defer_embedding_wgrad) {  // the output layer's wgrad at the pipeline's flush
    s.push_back({"comm_overlap.defer_embedding_wgrad_compute", "true"});
    s.push_back({"comm_overlap.wgrad_deferral_limit", num(l.wgrad_deferral_limit)});
  }
  if (l.pp_blocking_p2p && l.vpp > 1) {  // blocking, batched, synchronised transfers
    s.push_back({"comm_overlap.overlap_p2p_comm", "false"});
    s.push_back({"comm_overlap.batch_p2p_comm", "true"});
  }
  if (l.moe_capacity_factor >
      0) {  // token dropping, as the performance scripts' token-drop presets
    s.push_back({"model.moe_expert_capacity_factor", decimal(l.moe_capacity_factor)});
    s.push_back({"model.moe_pad_expert_input_to_capacity", "true"});
  }
  if (l.ep_comm_overlap) {  // combined 1F1B, as the performance scripts' moe_a2a_overlap sets
    s.push_back({"comm_overlap.overlap_moe_expert_parallel_comm", "true"});
    s.push_back({"comm_overlap.delay_wgrad_compute", "true"});
  }
  // Written either way: Megatron-Bridge's MoE model providers (DeepSeek, Qwen3-MoE, GLM)
  // switch it on by default.
  if (c.llm.moe && c.llm.moe->shared_experts > 0)
    s.push_back({"model.moe_shared_expert_overlap", yaml_bool(l.moe_shared_expert_overlap)});
  s.push_back({"ddp.overlap_param_gather", yaml_bool(megatron_overlap_param_gather(l))});
  // The recipe also sets model.pipeline_dtype, which MCore needs with PP > 1.
  // A recipe of megatron.bridge.training.mixed_precision by name; FP8 keeps bf16 outside the
  // Linear GEMMs, scaled as the plan's fp8_recipe says.
  std::string recipe = "bf16_mixed";
  if (c.s.workload.precision == hardware::Precision::kFp16) recipe = "fp16_mixed";
  if (c.s.workload.precision == hardware::Precision::kFp8)
    recipe = l.fp8_recipe == planner::Fp8Recipe::kTensorwise
                 ? "bf16_with_fp8_current_scaling_mixed"
                 : "bf16_with_fp8_delayed_scaling_mixed";
  s.push_back({"mixed_precision", yaml_string(recipe)});
}

void refuse_schedule(const Context& c, Refusals& r) {
  switch (c.p.schedule) {
    case planner::Schedule::kGpipe:
      r.add("the GPipe schedule: Megatron-Bridge runs Megatron's 1F1B (interleaved with vpp)");
      break;
    case planner::Schedule::kZeroBubble:
      r.add("the ZB-H1 schedule: Megatron-Bridge has no zero-bubble pipeline schedule");
      break;
    case planner::Schedule::kInterleaved:
      if (c.heterogeneous())
        r.add(fmt::format(
            "virtual pipeline stages (vpp {}) in a MIMO model: its multi-module schedules "
            "(1F1B across modules, colocated three-phase) have no virtual stages",
            c.layout().vpp));
      break;
    case planner::Schedule::k1F1B:
      break;
  }
}

void refuse_mimo(const Context& c, Refusals& r) {
  const Layout& l = c.layout();
  const bool colocated = c.p.placement == planner::Placement::kColocated;
  if (colocated && l.pp > 1 && c.p.modules.size() != 1)
    r.add(fmt::format(
        "{} encoders colocated with an LLM of pp {}: the colocated three-phase schedule takes "
        "exactly one modality module",
        c.p.modules.size(), l.pp));
  refuse_mimo_fsdp(c, "MegatronMIMO", r);
  refuse_mimo_ep_overlap(c, "MegatronMIMO", r);
  if (colocated && l.cp > 1)
    r.add(fmt::format("llm cp {} in a colocated placement: MegatronMIMO colocated requires CP 1",
                      l.cp));
  if (colocated && c.llm.moe && l.expert_tp() > 1)
    r.add(
        fmt::format("experts sharded over TP {} in a colocated placement: MegatronMIMO colocated "
                    "requires expert_tensor_parallel_size 1 (set etp 1)",
                    l.expert_tp()));
  for (const planner::ModulePlan& m : c.p.modules) {
    const Layout& e = m.layout;
    if (e.dp < l.dp)
      r.add(fmt::format(
          "encoder {} dp {} below llm dp {}: MegatronMIMO requires encoder DP >= LLM DP for "
          "embedding alignment",
          m.module, e.dp, l.dp));
    refuse_mimo_encoder_batch(c, m, "MegatronMIMO", r);
    refuse_mimo_ddp_mismatch(c, m, "the config has one ddp section for every module", r);
  }
}

void add_module(std::vector<Setting>& s, std::string_view name, const Layout& l, int ep, int etp,
                int rank_offset) {
  const std::string p =
      fmt::format("model.megatron_mimo_parallelism_config.module_parallelisms.{}.", name);
  s.push_back({p + "tensor_model_parallel_size", num(l.tp)});
  s.push_back({p + "pipeline_model_parallel_size", num(l.pp)});
  s.push_back({p + "context_parallel_size", num(l.cp)});
  s.push_back({p + "expert_model_parallel_size", num(ep)});
  s.push_back({p + "expert_tensor_parallel_size", num(etp)});
  s.push_back({p + "data_parallel_size", num(l.dp)});
  s.push_back({p + "rank_offset", num(rank_offset)});
}

}  // namespace

Result<std::vector<ExportFile>> write_megatron_bridge(const Context& c) {
  const Layout& l = c.layout();
  Refusals r;
  refuse_mixed_node_sizes(c, r);
  refuse_megatron_model(c, r);
  refuse_mla(c, r);  // (model.multi_latent_attention alone does not give its widths)
  refuse_selective_op(c, r);
  refuse_megatron_cross_entropy(c, r);
  refuse_schedule(c, r);
  refuse_precision_unless(
      c, r, {hardware::Precision::kBf16, hardware::Precision::kFp16, hardware::Precision::kFp8});
  if (c.heterogeneous()) refuse_mimo(c, r);
  refuse_megatron_fsdp(c, "Megatron-Bridge builds Megatron-Core's FSDP2 wrapper", r);
  if (l.torch_fsdp2() && !l.fsdp_reshard_after_forward)
    r.add(
        "torch FSDP2 kept gathered from forward to backward: Megatron-Bridge's config has no "
        "setting for it (Megatron-LM's --torch-fsdp2-no-reshard-after-forward)");
  // Every named recipe reduces gradients in fp32 with 16-bit weights of bf16, in fp16 with
  // fp16 weights; MixedPrecisionConfig.setup() copies the recipe's grad_reduce_in_fp32 over
  // ddp.grad_reduce_in_fp32, and an override naming a recipe cannot also set its fields.
  const bool fp16 = c.s.workload.precision == hardware::Precision::kFp16;
  if (c.fp32_gradients() == fp16)
    r.add(fmt::format(
        "grad_reduce_dtype {}: the YAML names a mixed-precision recipe, whose "
        "grad_reduce_in_fp32 ({}) Megatron-Bridge copies over ddp.grad_reduce_in_fp32; set "
        "cfg.mixed_precision.grad_reduce_in_fp32 = {} in a Python recipe, as its performance "
        "scripts do",
        planner::to_string(l.grad_reduce_dtype), fp16 ? "false" : "true", fp16 ? "True" : "False"));
  // Its FP8 recipes hold the Linear weights in FP8 (MixedPrecisionConfig.fp8_param_gather
  // True), which the recipe name cannot turn off.
  if (c.s.workload.precision == hardware::Precision::kFp8 && !l.fp8_param_gather)
    r.add(
        "fp8 without fp8_param_gather: Megatron-Bridge's FP8 recipes keep the Linear weights "
        "in FP8 (fp8_param_gather = True), which the YAML naming a recipe cannot turn off; set "
        "the plan's fp8_param_gather, or cfg.mixed_precision.fp8_param_gather = False in a "
        "Python recipe");
  if (!r.empty()) return r.status(c.target);

  std::string text = header(c);
  text += fmt::format(
      "# Megatron-Bridge ConfigContainer overrides: merge into your recipe's config (YAML\n"
      "# overrides of scripts/training/run_recipe.py). World size {} = {} node(s) x {} GPUs.\n",
      c.world, c.nodes, c.gpus_per_node);
  std::vector<Setting> s;
  if (!c.heterogeneous()) {
    text += fmt::format(
        "# Data parallelism {} = world / (tp x pp x cp) is implied. The activation function\n"
        "# ({}) is the provider's activation_func.\n",
        l.dp,
        c.llm.block.activation == models::Activation::kSwiglu        ? "SwiGLU: silu"
        : c.llm.block.activation == models::Activation::kGeglu       ? "GeGLU: gelu"
        : c.llm.block.activation == models::Activation::kQuickGeglu  ? "quick GeGLU: quick_gelu"
        : c.llm.block.activation == models::Activation::kSquaredRelu ? "squared ReLU"
                                                                     : "GELU");
    if (c.multimodal())
      text += "# Multimodal, homogeneous: use your VLM provider; its encoder shares this layout.\n";
    if (l.torch_fsdp2())
      for (const std::string& n : fsdp2_notes(c, "Megatron-Core", /*wraps_like_torchtitan=*/false))
        text += "# " + n + "\n";
    // Its gated units as the plan says (model.bias_activation_fusion: Megatron-Core's
    // bias_swiglu / bias_geglu); the Nemotron provider's squared ReLU is
    // torch.pow(relu(x), 2), separate PyTorch ops.
    const models::Activation act = c.llm.block.activation;
    const bool fused_act =
        models::is_gated(act) ? l.fused_activation : act != models::Activation::kSquaredRelu;
    if (std::string n = layer_code_note(
            c, "Megatron-Bridge", {.fused_activation = fused_act, .fused_rope = l.fused_rope});
        !n.empty())
      text += "# " + n + "\n";
    s.push_back({"model.tensor_model_parallel_size", num(l.tp)});
    s.push_back({"model.pipeline_model_parallel_size", num(l.pp)});
    s.push_back({"model.virtual_pipeline_model_parallel_size", l.vpp > 1 ? num(l.vpp) : "null"});
    if (l.microbatch_group > 0)
      s.push_back({"model.microbatch_group_size_per_vp_stage", num(l.microbatch_group)});
    s.push_back({"model.context_parallel_size", num(l.cp)});
    if (l.cp > 1) s.push_back({"model.cp_comm_type", yaml_string(planner::to_string(l.cp_comm))});
    if (l.cp > 1 && l.cp_comm == planner::CpComm::kA2AP2P)
      s.push_back({"model.hierarchical_context_parallel_sizes",
                   fmt::format("[{}, {}]", l.cp_a2a, l.cp_ring())});
    if (c.llm.moe) {
      s.push_back({"model.expert_model_parallel_size", num(l.ep)});
      s.push_back({"model.expert_tensor_parallel_size", num(l.expert_tp())});
    }
    s.push_back({"model.sequence_parallel", yaml_bool(l.sequence_parallel && l.tp > 1)});
    add_recompute(s, l);
    if (l.first_stage_layers > 0)
      s.push_back({"model.num_layers_in_first_pipeline_stage", num(l.first_stage_layers)});
    if (l.last_stage_layers > 0)
      s.push_back({"model.num_layers_in_last_pipeline_stage", num(l.last_stage_layers)});
    if (l.account_for_embedding)
      s.push_back({"model.account_for_embedding_in_pipeline_split", "true"});
    if (l.account_for_loss) s.push_back({"model.account_for_loss_in_pipeline_split", "true"});
    if (!l.pipeline_layout.empty())
      s.push_back(
          {"model.pipeline_model_parallel_layout", yaml_string(megatron_pipeline_layout(l))});
    s.push_back({"model.attention_backend", yaml_string(megatron_attention_backend(l))});
    // GPTModelProvider fuses the cross-entropy by default: the plan's choice, always.
    const bool fused_loss = l.cross_entropy_fusion != planner::CrossEntropy::kUnfused;
    s.push_back({"model.cross_entropy_loss_fusion", yaml_bool(fused_loss)});
    if (fused_loss)
      s.push_back({"model.cross_entropy_fusion_impl",
                   yaml_string(planner::to_string(l.cross_entropy_fusion))});
    add_model_shape(s, c);
  } else {
    const bool colocated = c.p.placement == planner::Placement::kColocated;
    text += fmt::format(
        "# model: MegatronMIMOProvider ({}). The language module must be keyed \"language\";\n"
        "# rename each encoder key to its modality name in your provider's\n"
        "# modality_submodules_spec. Set in each module's own TransformerConfig (its spec, not\n"
        "# a key of this file):\n"
        "#   language: {}{}\n",
        colocated ? "colocated: every module on ranks 0-" + num(c.world - 1)
                  : "non-colocated: disjoint rank ranges",
        transformer_config_fields(l),
        l.first_stage_layers > 0 || l.last_stage_layers > 0
            ? fmt::format(" num_layers_in_first_pipeline_stage={} "
                          "num_layers_in_last_pipeline_stage={}",
                          l.first_stage_layers, l.last_stage_layers)
        : !l.pipeline_layout.empty()
            ? fmt::format(" pipeline_model_parallel_layout=\"{}\"", megatron_pipeline_layout(l))
            : "");
    for (const planner::ModulePlan& m : c.p.modules)
      text += fmt::format("#   {}: {}\n", m.module, transformer_config_fields(m.layout));
    const bool moe = c.llm.moe.has_value();
    add_module(s, "language", l, moe ? l.ep : 1, moe ? l.expert_tp() : 1,
               colocated ? 0 : c.p.llm_first_rank);
    for (const planner::ModulePlan& m : c.p.modules)
      add_module(s, m.module, m.layout, 1, 1, colocated ? 0 : m.first_rank);
    if (c.s.workload.frozen_encoders) s.push_back({"model.freeze_modality_encoders", "true"});
  }
  add_training(s, c);
  text += render_yaml(s);
  return std::vector<ExportFile>{{"megatron_bridge.yaml", std::move(text)}};
}

}  // namespace hetpar::exporter::detail
