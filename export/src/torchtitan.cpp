// The torchtitan target: a launch script passing `--section.field value` overrides
// (export/vocabulary/torchtitan.txt). torchtitan no longer reads TOML: a run is a Python
// config function chosen with --module/--config, and the section.field overrides apply on
// top of it (research/trainer-formats.md section 5). What torchtitan does differently from
// Megatron, and so refuses: data parallelism with other dimensions is FSDP (weights,
// gradients and optimizer state sharded: ZeRO-3), plain DDP runs only alone; context
// parallelism shards weights with FSDP too; bf16 mixed precision applies through FSDP or
// under pure DDP / one device only (torchtitan/config/training.py).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "hetpar/core/check.h"
#include "hetpar/planner/schedule.h"
#include "writer.h"

namespace hetpar::exporter::detail {
namespace {

// The LLM's layers per virtual stage as the plan splits them (schedule.h: even, Megatron's
// uneven first / last stage or embedding / loss slots, or Layout::pipeline_layout), in
// Megatron's order: virtual stage c·pp + s is chunk c of rank s, as torchtitan's looped
// schedules place stage i on rank i % pp. REQUIRES: the plan is feasible.
std::vector<int64_t> stage_layers(const Context& c) {
  std::string why;
  std::vector<int64_t> split =
      planner::layers_per_virtual_stage(c.layout(), c.llm.block.layers, &why);
  HETPAR_CHECK(!split.empty(), "torchtitan export of an infeasible split: {}", why);
  return split;
}

// `split` as the Python statement that sets it in the config function. The override flags
// cannot carry it: module_fqns_per_model_part is a list of lists.
std::string torchtitan_model_parts(const std::vector<int64_t>& split) {
  std::string parts;
  int64_t next = 0;
  for (size_t v = 0; v < split.size(); ++v) {
    std::vector<std::string> terms;
    if (v == 0) terms.push_back("[\"tok_embeddings\"]");
    const int64_t end = next + split[v];
    if (end > next)
      terms.push_back(fmt::format("[f\"layers.{{i}}\" for i in range({}, {})]", next, end));
    if (v + 1 == split.size()) terms.push_back("[\"norm\", \"output\"]");
    next = end;
    parts += (v == 0 ? "" : ", ") + fmt::format("{}", fmt::join(terms, " + "));
  }
  return fmt::format(
      "Required in that function, the plan's layers per pipeline stage ({}; torchtitan places "
      "stage i on rank i % pp): cfg.parallelism.module_fqns_per_model_part = [{}]",
      fmt::join(split, "|"), parts);
}

}  // namespace

Result<std::vector<ExportFile>> write_torchtitan(const Context& c) {
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
  refuse_a2a_context_parallel(c, r);
  // The eager loss times as Megatron's unfused one; the compiled loss is torch.compile's.
  refuse_cross_entropy_unless(c, r,
                              {planner::CrossEntropy::kUnfused, planner::CrossEntropy::kCompiled});
  refuse_mixed_node_sizes(c, r);
  refuse_heterogeneous(c, r);
  if (l.pp > 1)
    refuse_multimodal(c, r,
                      fmt::format("torchtitan's multimodal models do not support pipeline "
                                  "parallelism (pp {})",
                                  l.pp));
  // Every split the plan can hold (Megatron's uneven ones and pipeline_layout included)
  // goes to module_fqns_per_model_part where it is not even.
  const std::vector<int64_t> split = l.pp > 1 ? stage_layers(c) : std::vector<int64_t>();
  const bool even_split =
      std::all_of(split.begin(), split.end(), [&](int64_t n) { return n == split.front(); });
  refuse_precision_unless(
      c, r, {hardware::Precision::kBf16, hardware::Precision::kFp32, hardware::Precision::kFp8});
  const bool fp8 = c.s.workload.precision == hardware::Precision::kFp8;
  if (fp8 && l.fp8_recipe != planner::Fp8Recipe::kTensorwise)
    r.add(
        "fp8 with delayed scaling: torchtitan's float8 linears (torchao) scale each tensor by "
        "its own amax; plan fp8_recipe tensorwise");
  if (l.cp > 1 && !l.fsdp)
    r.add(fmt::format(
        "context parallelism (cp {}) without fsdp: torchtitan shards the weights over the CP "
        "group with FSDP",
        l.cp));
  if (l.ep > 1)
    r.add(fmt::format("expert parallelism (ep {}): torchtitan's EP borrows FSDP-sharded ranks",
                      l.ep));
  if (l.expert_tp() != l.tp)
    r.add(
        fmt::format("experts of their own TP width (etp {}): hetpar's torchtitan export "
                    "shards experts like the dense layers",
                    l.expert_tp()));
  const bool only_dp = l.tp == 1 && l.pp == 1 && l.cp == 1;
  if (l.fsdp) {
    // torchtitan's FSDP: data_parallel_shard_degree ranks, CP folded in as it shards.
  } else if (l.dp > 1 && l.distributed_optimizer)
    r.add(fmt::format(
        "the distributed optimizer over dp {}: torchtitan shards data parallelism with FSDP, "
        "which also shards weights and gradients (ZeRO-3), not the optimizer state alone",
        l.dp));
  else if (l.dp > 1 && !only_dp)
    r.add(
        fmt::format("data parallelism (dp {}) without FSDP next to tp {} / pp {}: torchtitan's DDP "
                    "(data_parallel_replicate_degree) runs only as the sole parallelism",
                    l.dp, l.tp, l.pp));
  if (l.dp > 1 && !l.overlap_grad_reduce && !l.fsdp)
    r.add(
        "gradient reduction after the backward (overlap_grad_reduce off): torchtitan's DDP "
        "overlaps it with the backward");
  if (c.s.workload.precision != hardware::Precision::kFp32 && !only_dp && !l.fsdp)
    r.add(fmt::format(
        "bf16 mixed precision with tp {} / pp {} and no FSDP: torchtitan applies "
        "mixed_precision_param through FSDP, or autocast under pure DDP / one device only",
        l.tp, l.pp));
  if (l.recompute == models::Recompute::kSelective)
    r.add(selective_recompute(l) +
          ": torchtitan's selective activation checkpointing keeps a different, per-op set "
          "of activations");
  switch (c.p.schedule) {
    case planner::Schedule::kZeroBubble:
      r.add(
          "the ZB-H1 schedule with one stage per rank: torchtitan's zero-bubble schedules "
          "(InterleavedZeroBubble, ZBVZeroBubble) are looped");
      break;
    default:
      break;
  }
  // A virtual stage's modules: torchtitan builds a stage from each list, and an empty one
  // (no layers, neither the embedding nor the output layer) has nothing to run.
  for (size_t v = 1; v + 1 < split.size(); ++v)
    if (split[v] == 0) {
      r.add(fmt::format(
          "virtual stage {} of the split {} holds no layers: torchtitan builds each stage of "
          "module_fqns_per_model_part from its modules",
          v, fmt::join(split, "|")));
      break;
    }
  if (!r.empty()) return r.status(c.target);

  std::string schedule = "1F1B";
  if (c.p.schedule == planner::Schedule::kGpipe) schedule = "GPipe";
  if (c.p.schedule == planner::Schedule::kInterleaved) schedule = "Interleaved1F1B";
  const int64_t seq = c.s.workload.seq_len;
  std::vector<Flag> parallel = {
      {"--parallelism.data_parallel_replicate_degree", num(l.fsdp ? 1 : l.dp)},
      {"--parallelism.data_parallel_shard_degree", num(l.fsdp ? l.dp : 1)},
      {"--parallelism.tensor_parallel_degree", num(l.tp)},
      {"--parallelism.enable_sequence_parallel", l.sequence_parallel ? "True" : "False"},
      {"--parallelism.context_parallel_degree", num(l.cp)},
      {"--parallelism.pipeline_parallel_degree", num(l.pp)},
  };
  // torchtitan's policies: "default" reshards the layers (and the embedding) but keeps
  // [final norm, output] gathered, as a torch_fsdp2 plan is timed; "always" reshards every
  // unit, as a Megatron-FSDP plan is; "never" keeps all. With pp > 1 "default" means never.
  if (l.fsdp)
    parallel.push_back(
        {"--parallelism.fsdp_reshard_after_forward", !l.fsdp_reshard_after_forward  ? "never"
                                                     : l.torch_fsdp2() && l.pp == 1 ? "default"
                                                                                    : "always"});
  if (l.pp > 1) {
    parallel.push_back({"--parallelism.pipeline_parallel_schedule", schedule});
    parallel.push_back({"--parallelism.num_pp_microbatches", num(c.micro_batches)});
    // Megatron's even split: no stage gives layers to the embedding or the loss.
    parallel.push_back({"--parallelism.pipeline_parallel_first_stage_less_layers", "0"});
    parallel.push_back({"--parallelism.pipeline_parallel_last_stage_less_layers", "0"});
    // With module_fqns_per_model_part torchtitan splits by the lists; layers_per_stage
    // would only be checked against them.
    if (l.vpp > 1 && even_split)
      parallel.push_back({"--parallelism.pipeline_parallel_layers_per_stage", num(split.front())});
  }
  std::vector<Flag> training = {
      {"--training.max_context_length", num(seq)},
      {"--training.num_tokens_per_microbatch_per_dp_rank", num(l.micro_batch * seq)},
      {"--training.num_tokens_per_train_step", num(c.s.workload.global_batch * seq)},
      {"--training.mixed_precision_param",
       c.s.workload.precision == hardware::Precision::kFp32 ? "float32" : "bfloat16"},
      // FSDP's reduce-scatter dtype, the plan's gradient buffer.
      {"--training.mixed_precision_reduce", c.fp32_gradients() ? "float32" : "bfloat16"},
  };
  // Trainer.Config raises without it when PP > 1.
  if (l.pp > 1) training.push_back({"--training.disable_cuda_graphs", "True"});

  std::string_view checkpointing = "off";
  if (l.recompute == models::Recompute::kFull) checkpointing = "full (the full-AC config class)";
  if (l.recompute == models::Recompute::kSelectiveOp)
    checkpointing = "selective per op (mode \"selective\", selective_ac_option \"op\")";
  const std::string rope = rope_note(c.llm);
  std::vector<std::string> notes = {
      "torchtitan reads a Python config function (--module / --config); the overrides below set "
      "the plan on top of it.",
      fmt::format("In that function: the model flavour of {}{}; activation checkpointing {}; "
                  "attention {}.",
                  c.s.model.name, rope.empty() ? "" : fmt::format(" ({})", rope), checkpointing,
                  l.flash_attention ? "flash (SDPA)" : "without flash attention")};
  if (!even_split) notes.push_back(torchtitan_model_parts(split));
  if (fp8)
    notes.push_back(fmt::format(
        "FP8: the float8 model converter (torchao Float8LinearConfig, tensorwise dynamic "
        "scaling) on every linear but the output layer{}.",
        l.fsdp && l.fp8_param_gather
            ? "; FSDP all-gathers the weights in float8 (enable_fsdp_float8_all_gather) with "
              "their scales precomputed after each optimizer step"
            : ""));
  const bool compiled = l.cross_entropy_fusion == planner::CrossEntropy::kCompiled;
  if (compiled)
    notes.push_back(
        "torch.compile on (compile.enable; compile.components keeps its default, model and "
        "loss): the plan times the loss as compiled, the blocks as their per-op kernels.");
  if (std::string n = unfused_accumulation_note(c, "torchtitan"); !n.empty())
    notes.push_back(std::move(n));
  // torchtitan's Llama: wq, wk, wv, w1, w3 apart, repeat_kv before SDPA; its RoPE's complex
  // product compiled into one kernel each way, as the plan times its activation.
  if (std::string n = layer_code_note(c, "torchtitan", {false, true}); !n.empty())
    notes.push_back(std::move(n));
  for (std::string& n : fsdp2_notes(c, "torchtitan", /*wraps_like_torchtitan=*/true))
    notes.push_back(std::move(n));
  if (l.pp == 1 && c.micro_batches > 1)
    notes.push_back(
        fmt::format("{} micro-batches per step run as gradient accumulation.", c.micro_batches));
  std::vector<FlagGroup> groups = {
      {"CONFIG_ARGS",
       "Your config (placeholders).",
       {{"--module", "\"${CONFIG_MODULE:?set CONFIG_MODULE to your config module}\""},
        {"--config", "\"${CONFIG_FUNCTION:?set CONFIG_FUNCTION to your config function}\""}}},
      {"PARALLEL_ARGS", "Parallelism (the plan).", std::move(parallel)},
      {"TRAINING_ARGS", "Batch in tokens, precision (the plan).", std::move(training)}};
  if (compiled)
    groups.push_back({"COMPILE_ARGS",
                      "torch.compile (the plan's compiled loss).",
                      {{"--compile.enable", "True"}}});
  return std::vector<ExportFile>{
      {"launch.sh", torchrun_script(c, notes, groups, "-m torchtitan.train")}};
}

}  // namespace hetpar::exporter::detail
