// The deepspeed target: ds_config.json (keys from export/vocabulary/deepspeed.txt) and a
// launch script. DeepSpeed's JSON never states PP: the training script builds a
// PipelineModule(num_stages=pp); TP is AutoTP (tensor_parallel.autotp_size); DP is what
// is left. Its pipeline engine runs one 1F1B-style schedule and reduces gradients after
// the last micro-batch (research/trainer-formats.md section 4).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "writer.h"

namespace hetpar::exporter::detail {

Result<std::vector<ExportFile>> write_deepspeed(const Context& c) {
  const planner::Layout& l = c.layout();
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
  refuse_selective_op(c, r);
  refuse_cross_entropy_unless(c, r, {planner::CrossEntropy::kUnfused});
  refuse_mixed_node_sizes(c, r);
  refuse_heterogeneous(c, r);
  if (l.pp > 1)
    refuse_multimodal(c, r,
                      fmt::format("a PipelineModule partitions layers by its own method and "
                                  "cannot pin the encoder to stage 0 ahead of the LLM (pp {})",
                                  l.pp));
  refuse_uneven_split(c, r);
  refuse_precision_unless(c, r, {hardware::Precision::kBf16, hardware::Precision::kFp16});
  switch (c.p.schedule) {
    case planner::Schedule::kGpipe:
      r.add("the GPipe schedule: DeepSpeed's pipeline engine runs one 1F1B-style schedule");
      break;
    case planner::Schedule::kInterleaved:
      r.add(
          fmt::format("virtual pipeline stages (vpp {}, interleaved schedule): DeepSpeed has no "
                      "interleaving",
                      l.vpp));
      break;
    case planner::Schedule::kZeroBubble:
      r.add("the ZB-H1 schedule: DeepSpeed's pipeline engine has no zero-bubble schedule");
      break;
    case planner::Schedule::k1F1B:
      break;
  }
  if (l.expert_tp() != l.tp)
    r.add(fmt::format("experts of their own TP width (etp {}): AutoEP follows AutoTP's sharding",
                      l.expert_tp()));
  if (l.cp > 1 && l.cp_comm != planner::CpComm::kA2A)
    r.add(fmt::format(
        "context parallelism (cp {}, cp_comm {}): DeepSpeed's sequence parallelism (Ulysses) "
        "splits attention heads with all-to-alls (plan cp_comm a2a)",
        l.cp, planner::to_string(l.cp_comm)));
  if (l.sequence_parallel)
    r.add(
        "Megatron-style sequence parallelism: DeepSpeed AutoTP keeps activations between "
        "TP regions replicated");
  if (l.recompute == models::Recompute::kSelective)
    r.add(selective_recompute(l) +
          ": DeepSpeed checkpoints whole layers (pipeline.activation_checkpoint_interval)");
  if (l.dp > 1 && l.overlap_grad_reduce)
    r.add(
        "gradient reduction overlapped with the backward (overlap_grad_reduce): the pipeline "
        "engine reduces after the last micro-batch (set overlap_grad_reduce false)");
  if (l.dp > 1 && l.distributed_optimizer && l.overlap_param_gather)
    r.add(
        "the parameter all-gather overlapped with the forward (overlap_param_gather): ZeRO-1 "
        "gathers after the optimizer step (set overlap_param_gather false)");
  if (l.fsdp && l.pp > 1)
    r.add(fmt::format("fsdp with pp {}: DeepSpeed's pipeline engine runs ZeRO stage 1 at most",
                      l.pp));
  if (l.fsdp && !l.fsdp_reshard_after_forward)
    r.add("fsdp without resharding after the forward: ZeRO-3 releases gathered parameters");
  if (!r.empty()) return r.status(c.target);

  nlohmann::ordered_json j;
  j["train_batch_size"] = c.s.workload.global_batch;
  j["train_micro_batch_size_per_gpu"] = l.micro_batch;
  j["gradient_accumulation_steps"] = c.micro_batches;
  if (c.s.workload.precision == hardware::Precision::kBf16)
    j["bf16"] = {{"enabled", true}};
  else
    j["fp16"] = {{"enabled", true}};
  // The gradient buffer and its reduction, spelled out: DeepSpeed's defaults differ by ZeRO
  // stage and precision.
  const char* grads = c.fp32_gradients()                                     ? "fp32"
                      : c.s.workload.precision == hardware::Precision::kBf16 ? "bf16"
                                                                             : "fp16";
  j["communication_data_type"] = grads;
  j["data_types"] = {{"grad_accum_dtype", grads}};
  j["zero_optimization"] = {{"stage", l.fsdp ? 3 : l.distributed_optimizer ? 1 : 0}};
  if (l.tp > 1) j["tensor_parallel"] = {{"autotp_size", l.tp}};
  if (l.cp > 1) {
    // Ulysses's ranks reduce gradients in their own dtype setting, fp32 unless set: the
    // plan's gradient dtype, spelled out as for the data-parallel reduction.
    j["sequence_parallel_size"] = l.cp;
    j["seq_parallel_communication_data_type"] = grads;
  }
  if (l.ep > 1) j["expert_parallel"] = {{"enabled", true}, {"autoep_size", l.ep}};
  j["pipeline"] = {
      {"activation_checkpoint_interval", l.recompute == models::Recompute::kFull ? 1 : 0}};

  std::string script = "#!/bin/bash\n" + header(c);
  script += fmt::format(
      "# The training script (TRAIN_SCRIPT) wraps the model in\n"
      "#   PipelineModule(layers=..., num_stages={}, partition_method=\"uniform\",\n"
      "#                  activation_checkpoint_interval={})\n"
      "# (also for one stage) and passes ds_config.json to deepspeed.initialize. DP {} = world\n"
      "# / (tp x pp{}) is implied. Attention: {}.\n",
      l.pp, l.recompute == models::Recompute::kFull ? 1 : 0, l.dp,
      l.cp > 1 ? " x sequence_parallel_size" : "",
      l.flash_attention ? "flash" : "without flash attention");
  if (l.cp > 1)
    script += fmt::format(
        "# Ulysses over {} ranks: the training script wraps each attention in DeepSpeed's\n"
        "# DistributedAttention (deepspeed.sequence.layer) over the sequence-parallel group, or\n"
        "# registers UlyssesSPAttentionHF for a Hugging Face model, and feeds each rank its\n"
        "# 1/{} slice of every sequence.\n",
        l.cp, l.cp);
  if (l.tp > 1 && l.pp > 1)
    script +=
        "# Not verified: that AutoTP training composes with PipelineModule in this DeepSpeed.\n";
  if (l.fsdp && l.ep > 1)
    script += "# Not verified: that AutoEP composes with ZeRO stage 3 in this DeepSpeed.\n";
  if (l.cp > 1 && (l.tp > 1 || l.pp > 1))
    script +=
        "# Not verified: that Ulysses composes with AutoTP or PipelineModule in this DeepSpeed.\n";
  if (std::string n = unfused_accumulation_note(c, "DeepSpeed"); !n.empty())
    script += "# " + n + "\n";
  if (std::string n = rope_note(c.llm); !n.empty())
    script += fmt::format("# The training script's model: {}.\n", n);
  if (l.torch_fsdp2())
    script +=
        "# The plan times FSDP as PyTorch FSDP2 (a copy-out after each all-gather, [final norm,\n"
        "# output] kept gathered); ZeRO stage 3 gathers into the parameters and releases every\n"
        "# module alike: fsdp_implementation megatron_fsdp times that.\n";
  script += fmt::format(
      "# {} node(s) x {} GPUs; HOSTFILE lists the nodes (\"host slots={}\" lines).\n"
      "set -euo pipefail\n\n"
      "{}"
      "deepspeed --num_nodes {} --num_gpus {} --hostfile \"${{HOSTFILE:-hostfile}}\" \\\n"
      "  \"${{TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}}\" "
      "--deepspeed_config ds_config.json \"$@\"\n",
      c.nodes, c.gpus_per_node, c.gpus_per_node, nvls_environment(c), c.nodes, c.gpus_per_node);
  return std::vector<ExportFile>{{"ds_config.json", j.dump(2) + "\n"},
                                 {"launch.sh", std::move(script)}};
}

}  // namespace hetpar::exporter::detail
