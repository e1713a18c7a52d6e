// The nanotron target: the parallelism, tokens, optimizer and model sections of a nanotron
// YAML config (keys from export/vocabulary/nanotron.txt) and a launch script. nanotron
// trains Llama-style LLMs only (RMSNorm, SwiGLU, RoPE), with an explicit dp, two pipeline
// engines (1f1b, afab = GPipe) and whole-layer recompute (research/trainer-formats.md
// section 6).
#include <fmt/format.h>

#include "writer.h"

namespace hetpar::exporter::detail {

Result<std::vector<ExportFile>> write_nanotron(const Context& c) {
  const planner::Layout& l = c.layout();
  const models::TransformerSpec& b = c.llm.block;
  Refusals r;
  refuse_megatron_comm_overlaps(c, r);
  refuse_token_dropping(c, r);
  refuse_flex_dispatcher(c, r);
  refuse_mtp(c, r);
  refuse_mla(c, r);
  refuse_sliding_window(c, r);
  refuse_attention_sinks(c, r);
  refuse_post_norms(c, r);
  refuse_glu_extras(c, r);
  refuse_zero_centered_gamma(c, r);
  refuse_a2a_context_parallel(c, r);
  refuse_selective_op(c, r);
  refuse_cross_entropy_unless(c, r, {planner::CrossEntropy::kUnfused});
  refuse_mixed_node_sizes(c, r);
  refuse_heterogeneous(c, r);
  refuse_multimodal(c, r, "nanotron has no multimodal models");
  refuse_uneven_split(c, r);
  refuse_precision_unless(
      c, r, {hardware::Precision::kBf16, hardware::Precision::kFp16, hardware::Precision::kFp32});
  switch (c.p.schedule) {
    case planner::Schedule::kInterleaved:
      r.add(fmt::format(
          "virtual pipeline stages (vpp {}, interleaved schedule): nanotron's pipeline engines "
          "are 1f1b and afab",
          l.vpp));
      break;
    case planner::Schedule::kZeroBubble:
      r.add("the ZB-H1 schedule: nanotron's pipeline engines are 1f1b and afab");
      break;
    default:
      break;
  }
  if (l.recompute == models::Recompute::kSelective)
    r.add(selective_recompute(l) +
          ": nanotron recomputes whole layers (parallelism.recompute_layer)");
  if (c.llm.moe) r.add("a mixture-of-experts LLM: nanotron's Llama model is dense");
  if (l.fsdp) r.add("fsdp: nanotron shards the optimizer state at most (optimizer.zero_stage 1)");
  if (c.llm.rotary_percent != 1)
    r.add(fmt::format("rotary_percent {}: nanotron's Llama rotates every channel of a head",
                      c.llm.rotary_percent));
  if (c.llm.no_rope_every > 0)
    r.add(fmt::format("no_rope_every {}: nanotron's Llama applies RoPE in every layer",
                      c.llm.no_rope_every));
  if (b.head_size > 0 && b.head_size * b.heads != b.hidden)
    r.add(
        fmt::format("head_dim {} with {} heads of hidden {}: nanotron's Llama derives the head "
                    "width from hidden / heads",
                    b.head_size, b.heads, b.hidden));
  if (b.norm != models::Norm::kRmsNorm || b.activation != models::Activation::kSwiglu ||
      c.llm.positions != models::PositionEmbedding::kRope)
    r.add(fmt::format(
        "an LLM with {}, {} and {} positions: nanotron's Llama model is RMSNorm, SwiGLU, RoPE",
        models::to_string(b.norm), models::to_string(b.activation),
        models::to_string(c.llm.positions)));
  if (b.qkv_bias || b.linear_bias)
    r.add("biases on the attention / MLP linears: nanotron's Llama model has none");
  if (b.dropout) r.add("dropout: nanotron's Llama model has none");
  if (b.qk_norm) r.add("a norm on the queries and keys (qk_norm): nanotron's Llama model has none");
  if (!l.flash_attention)
    r.add("attention without flash attention: nanotron's Llama attention is flash attention");
  if (l.dp > 1 && !l.overlap_grad_reduce)
    r.add(
        "gradient reduction after the backward (overlap_grad_reduce off): nanotron's DDP "
        "overlaps it with the backward");
  if (!r.empty()) return r.status(c.target);

  const hardware::Precision prec = c.s.workload.precision;
  std::vector<Setting> s = {
      {"general.project", yaml_string("hetpar")},
      {"general.run", yaml_string(c.s.name)},
      {"parallelism.dp", num(l.dp)},
      {"parallelism.tp", num(l.tp)},
      {"parallelism.pp", num(l.pp)},
      {"parallelism.context_parallel_size", num(l.cp)},
      {"parallelism.expert_parallel_size", num(l.ep)},
      {"parallelism.pp_engine",
       yaml_string(c.p.schedule == planner::Schedule::kGpipe ? "afab" : "1f1b")},
      {"parallelism.tp_mode", yaml_string(l.sequence_parallel ? "REDUCE_SCATTER" : "ALL_REDUCE")},
      {"parallelism.tp_linear_async_communication", "false"},
      {"parallelism.recompute_layer", yaml_bool(l.recompute == models::Recompute::kFull)},
      {"model.dtype", yaml_string(prec == hardware::Precision::kBf16   ? "bfloat16"
                                  : prec == hardware::Precision::kFp16 ? "float16"
                                                                       : "float32")},
      {"model.model_config.is_llama_config", "true"},
      {"model.model_config.hidden_size", num(b.hidden)},
      {"model.model_config.intermediate_size", num(b.ffn_hidden)},
      {"model.model_config.num_hidden_layers", num(b.layers)},
      {"model.model_config.num_attention_heads", num(b.heads)},
      {"model.model_config.num_key_value_heads", num(b.kv_heads)},
      {"model.model_config.max_position_embeddings", num(c.s.workload.seq_len)},
      {"model.model_config.vocab_size", num(c.llm.vocab)},
      {"model.model_config.tie_word_embeddings", yaml_bool(c.llm.tied_embeddings)},
      // LlamaConfig's rope_theta, a float (its default 10000.0 where the model gives none).
      {"model.model_config.rope_theta",
       fmt::format("{:.1f}", c.llm.rope_base > 0 ? c.llm.rope_base : 10000.0)},
      {"tokens.sequence_length", num(c.s.workload.seq_len)},
      {"tokens.micro_batch_size", num(l.micro_batch)},
      {"tokens.batch_accumulation_per_replica", num(c.micro_batches)},
      {"tokens.train_steps", "100"},
      {"optimizer.zero_stage", l.distributed_optimizer ? "1" : "0"},
      {"optimizer.accumulate_grad_in_fp32", yaml_bool(c.fp32_gradients())},
  };
  std::string yaml = header(c);
  yaml += fmt::format(
      "# nanotron config sections for this plan: merge with the rest of your config\n"
      "# (checkpoints, data_stages, tokenizer, the optimizer's learning rate; see nanotron's\n"
      "# examples/config_tiny_llama.yaml). Global batch {} = micro_batch_size {} x\n"
      "# batch_accumulation_per_replica {} x dp {}. tokens.train_steps is a placeholder.\n",
      c.s.workload.global_batch, l.micro_batch, c.micro_batches, l.dp);
  yaml += render_yaml(s);

  std::string script = "#!/bin/bash\n" + header(c);
  script += fmt::format(
      "# Run once per node: {} node(s) x {} GPUs (tp x cp x dp x pp = {}).\n"
      "set -euo pipefail\n\n",
      c.nodes, c.gpus_per_node, c.world);
  if (std::string n = unfused_accumulation_note(c, "nanotron"); !n.empty())
    script += "# " + n + "\n";
  // Its pipeline engines let torch DDP sync in each stage's last backward only, where the
  // reducer all-reduces every bucket as it becomes ready: Megatron's unaligned reductions.
  if (l.dp > 1 && l.pp > 1 && l.overlap_grad_reduce && l.align_grad_reduce)
    script +=
        "# The plan times Megatron's aligned gradient reductions (align_grad_reduce: stages "
        "after\n# the first reduce after the schedule); nanotron's DDP reduces each bucket as "
        "it becomes\n# ready in every stage's last backward: set the plan's align_grad_reduce "
        "to false to time it so.\n";
  // nanotron's Llama: qkv_proj and gate_up_proj fused, flash-attn reading the kv heads, its
  // training forward rotating with flash-attn's fused rotary kernel (flash_rotary_embedding).
  if (std::string n = layer_code_note(c, "nanotron", {}); !n.empty()) script += "# " + n + "\n";
  if (c.llm.rope_scaling_factor > 0 || c.llm.yarn)
    script += fmt::format(
        "# Not written: the model's {} (LlamaConfig's rope_scaling, a\n"
        "# Hugging Face dict: copy the model's config.json rope_scaling into it).\n",
        c.llm.yarn ? fmt::format("YaRN RoPE by {}", c.llm.yarn->factor)
                   : fmt::format("Llama 3.1 RoPE scaling by {}", c.llm.rope_scaling_factor));
  script += launcher_environment(c);
  script +=
      "\ntorchrun --nnodes \"$NNODES\" --nproc-per-node \"$GPUS_PER_NODE\" --node-rank "
      "\"$NODE_RANK\" \\\n"
      "  --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n"
      "  run_train.py --config-file \"${CONFIG_FILE:-nanotron.yaml}\" \"$@\"\n";
  return std::vector<ExportFile>{{"nanotron.yaml", std::move(yaml)},
                                 {"launch.sh", std::move(script)}};
}

}  // namespace hetpar::exporter::detail
