// export_plan(): the target names, the context every writer gets, and what the writers
// share (refusals, YAML and launch-script rendering).
#include "hetpar/export/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <variant>

#include "hetpar/core/format.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "writer.h"

namespace hetpar::exporter {

namespace {

constexpr std::array<Target, 6> kTargets = {Target::kMegatron,       Target::kMegatronMimo,
                                            Target::kMegatronBridge, Target::kTorchtitan,
                                            Target::kDeepspeed,      Target::kNanotron};

}  // namespace

std::span<const Target> all_targets() {
  return kTargets;
}

std::string_view to_string(Target t) {
  switch (t) {
    case Target::kMegatron:
      return "megatron";
    case Target::kMegatronMimo:
      return "megatron-mimo";
    case Target::kMegatronBridge:
      return "megatron-bridge";
    case Target::kTorchtitan:
      return "torchtitan";
    case Target::kDeepspeed:
      return "deepspeed";
    case Target::kNanotron:
      return "nanotron";
  }
  return "?";
}

std::optional<Target> parse_target(std::string_view name) {
  for (Target t : kTargets)
    if (to_string(t) == name) return t;
  return std::nullopt;
}

std::string target_list() {
  std::string out;
  for (Target t : kTargets) {
    if (!out.empty()) out += ", ";
    out += to_string(t);
  }
  return out;
}

Result<std::vector<ExportFile>> export_plan(const planner::Scenario& s, const planner::Plan& p,
                                            Target target) {
  if (std::string why = planner::infeasibility(s, p); !why.empty())
    return Status::invalid_argument("plan is infeasible: " + why);
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
  detail::Context c{.s = s, .p = p, .target = target, .llm = llm, .encoders = {}};
  for (size_t i = 0; i < s.model.modules.size(); ++i) {
    const models::ModuleKind kind = models::kind_of(s.model.modules[i].spec);
    if (kind == models::ModuleKind::kVisionEncoder && s.workload.images_per_sample > 0)
      c.encoders.push_back(i);
    if (kind == models::ModuleKind::kAudioEncoder && s.workload.audio_clips_per_sample > 0)
      c.encoders.push_back(i);
  }
  c.world = s.cluster.total_gpus();
  c.nodes = s.cluster.num_nodes();
  c.gpus_per_node = s.cluster.groups().front().profile.gpus_per_node;
  for (const hardware::NodeGroup& g : s.cluster.groups())
    if (g.profile.gpus_per_node != c.gpus_per_node) c.gpus_per_node = 0;
  c.micro_batches = planner::num_micro_batches(p.layout, s.workload.global_batch);
  // The export does not refuse for memory (the model's allowances may be pessimistic), but
  // says so where the memory model puts the plan over its GPUs.
  if (const planner::MemoryReport mem = planner::estimate_memory(s, p); !mem.fits())
    c.memory_over = fmt::format(
        "Memory: hetpar's memory model puts pipeline stage {} at {} per GPU, over the {} its GPUs "
        "have (`hetpar simulate` calls the plan infeasible); check it before a long run.",
        mem.tightest_stage, mem.tightest(), mem.capacity());
  switch (target) {
    case Target::kMegatron:
      return detail::write_megatron(c);
    case Target::kMegatronMimo:
      return detail::write_megatron_mimo(c);
    case Target::kMegatronBridge:
      return detail::write_megatron_bridge(c);
    case Target::kTorchtitan:
      return detail::write_torchtitan(c);
    case Target::kDeepspeed:
      return detail::write_deepspeed(c);
    case Target::kNanotron:
      return detail::write_nanotron(c);
  }
  return Status::internal("unknown export target");
}

namespace detail {

namespace {
// Whether the run keeps NCCL's NVLS (the cluster's `nvls`, default true).
bool nvls_enabled(const Context& c) {
  return c.s.cluster.overrides().nvls.value_or(true);
}
}  // namespace

bool Context::fp32_gradients() const {
  return planner::gradient_bytes(s.workload.precision, layout().grad_reduce_dtype) == 4;
}

Status Refusals::status(Target t) const {
  std::string msg = fmt::format("{} cannot express this plan: ", to_string(t));
  for (size_t i = 0; i < why_.size(); ++i) msg += (i ? "; " : "") + why_[i];
  return Status::invalid_argument(std::move(msg));
}

void refuse_mixed_node_sizes(const Context& c, Refusals& r) {
  if (c.gpus_per_node == 0)
    r.add(
        "a cluster whose nodes differ in GPU count: the launcher starts the same number of "
        "processes on every node");
}

void refuse_heterogeneous(const Context& c, Refusals& r) {
  if (!c.heterogeneous()) return;
  std::string modules;
  for (const planner::ModulePlan& m : c.p.modules)
    modules += fmt::format("{}{} ({})", modules.empty() ? "" : ", ", m.module,
                           planner::describe_in_words(m.layout, c.s.workload.precision));
  r.add(fmt::format(
      "the {} placement with its own layout for {}: {} has one layout for the whole model "
      "(export heterogeneous plans with --to megatron-mimo or megatron-bridge)",
      planner::to_string(c.p.placement), modules, c.target_name()));
}

void refuse_multimodal(const Context& c, Refusals& r, std::string_view why) {
  if (!c.multimodal()) return;
  std::string names;
  for (size_t i : c.encoders) names += (names.empty() ? "" : ", ") + c.s.model.modules[i].name;
  r.add(fmt::format("the encoder(s) {}: {}", names, why));
}

void refuse_uneven_split(const Context& c, Refusals& r) {
  const planner::Layout& l = c.layout();
  if (l.first_stage_layers > 0 || l.last_stage_layers > 0)
    r.add(fmt::format(
        "an uneven pipeline split (first stage {} layers, last stage {}): {} splits layers "
        "evenly over the stages",
        l.first_stage_layers, l.last_stage_layers, c.target_name()));
  if (l.account_for_embedding || l.account_for_loss)
    r.add(
        fmt::format("counting the embedding / loss as a pipeline layer (account_for_embedding / "
                    "account_for_loss): {} has no such option",
                    c.target_name()));
  if (!l.pipeline_layout.empty())
    r.add(fmt::format(
        "layers per pipeline stage set one by one (pipeline_layout {}): {} splits layers "
        "evenly over the stages",
        megatron_pipeline_layout(l), c.target_name()));
}

std::string megatron_pipeline_layout(const planner::Layout& l) {
  std::string out;
  const size_t n = l.pipeline_layout.size();
  for (size_t v = 0; v < n; ++v) {
    if (v > 0) out += '|';
    if (v == 0) out += 'E';
    if (l.pipeline_layout[v] > 0) out += fmt::format("t*{}", l.pipeline_layout[v]);
    if (v + 1 == n) out += 'L';
  }
  return out;
}

void refuse_precision_unless(const Context& c, Refusals& r,
                             std::initializer_list<hardware::Precision> supported) {
  for (hardware::Precision p : supported)
    if (p == c.s.workload.precision) return;
  std::string names;
  for (hardware::Precision p : supported)
    names += (names.empty() ? "" : ", ") + std::string(hardware::to_string(p));
  r.add(fmt::format("precision {}: the export to {} supports {}",
                    hardware::to_string(c.s.workload.precision), c.target_name(), names));
}

void refuse_mimo_encoder_batch(const Context& c, const planner::ModulePlan& m, std::string_view who,
                               Refusals& r) {
  const planner::Layout& l = c.layout();
  const int64_t samples = static_cast<int64_t>(l.micro_batch) * l.dp;
  if (samples % m.layout.dp == 0 && m.layout.micro_batch == samples / m.layout.dp) return;
  r.add(fmt::format(
      "encoder {} micro-batch {}: {} runs the encoder once per LLM micro-batch, on "
      "micro-batch {} x llm dp {} / encoder dp {} = {} samples per rank",
      m.module, m.layout.micro_batch, who, l.micro_batch, l.dp, m.layout.dp,
      samples % m.layout.dp == 0 ? std::to_string(samples / m.layout.dp) : "a fraction of a"));
}

void refuse_megatron_comm_overlaps(const Context& c, Refusals& r) {
  if (c.layout().tp_comm_overlap)
    r.add(
        fmt::format("tp_comm_overlap: {} has no Transformer Engine userbuffers overlap of the "
                    "TP collectives",
                    c.target_name()));
  if (c.layout().ep_comm_overlap)
    r.add(fmt::format(
        "ep_comm_overlap: {} has no merged forward/backward schedule that hides the "
        "expert-parallel all-to-alls (Megatron-Core's --overlap-moe-expert-parallel-comm)",
        c.target_name()));
  if (c.layout().moe_shared_expert_overlap)
    r.add(fmt::format(
        "moe_shared_expert_overlap: {} does not run the shared experts on a stream of their "
        "own beside the expert-parallel all-to-alls (Megatron-Core's "
        "--moe-shared-expert-overlap)",
        c.target_name()));
  if (c.layout().defer_embedding_wgrad)
    r.add(fmt::format(
        "defer_embedding_wgrad: {} does not put the output layer's weight gradient off to the "
        "pipeline's flush (Megatron-Core's --defer-embedding-wgrad-compute)",
        c.target_name()));
  if (c.layout().nccl_ub)
    r.add(fmt::format(
        "nccl_ub: {} does not register its data-parallel buffers with NCCL (Megatron-Core's "
        "--use-nccl-ub)",
        c.target_name()));
  if (c.layout().microbatch_group > 0)
    r.add(fmt::format(
        "microbatch_group: {} does not group an interleaved schedule's micro-batches per "
        "virtual stage (Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage)",
        c.target_name()));
}

std::string_view megatron_attention_backend(const planner::Layout& l) {
  if (!l.flash_attention) return "unfused";
  switch (l.attention_kernel) {
    case hardware::AttentionKernel::kDefault:
      return "auto";
    case hardware::AttentionKernel::kCudnn:
      return "fused";
    case hardware::AttentionKernel::kFlash2:
    case hardware::AttentionKernel::kFlash3:
      return "flash";
  }
  return "auto";
}

std::string selective_recompute(const planner::Layout& l) {
  if (!l.names_recompute_modules()) return "selective recompute of the attention core";
  return fmt::format("selective recompute of recompute_modules [{}]",
                     planner::recompute_modules_names(l.recompute_modules));
}

void refuse_selective_op(const Context& c, Refusals& r) {
  bool any = c.layout().recompute == models::Recompute::kSelectiveOp;
  for (const planner::ModulePlan& m : c.p.modules)
    any = any || m.layout.recompute == models::Recompute::kSelectiveOp;
  if (any)
    r.add(fmt::format(
        "recompute selective_op: torchtitan's per-op activation checkpointing (the outputs of "
        "every other matmul and of the attention kernel kept); {} recomputes whole layers or "
        "the attention core",
        c.target_name()));
}

void refuse_flex_dispatcher(const Context& c, Refusals& r) {
  if (!c.layout().flex_dispatcher()) return;
  const std::string_view d = planner::to_string(c.layout().moe_dispatcher);
  const std::string_view name = planner::display_name(c.layout().moe_dispatcher);
  // torchtitan has backends of both names (its MoE comm backend), with its own dispatcher
  // code around them, which hetpar does not time.
  r.add(c.target == Target::kTorchtitan
            ? fmt::format("moe_dispatcher {}: hetpar times Megatron-Core's flex dispatcher "
                          "with {} (--moe-flex-dispatcher-backend {}); torchtitan's own {} "
                          "backend is not modelled",
                          d, name, d, name)
            : fmt::format("moe_dispatcher {}: {} has no {} token dispatcher (Megatron-Core's "
                          "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend {})",
                          d, c.target_name(), name, d));
}

void refuse_mla(const Context& c, Refusals& r) {
  if (c.llm.block.mla)
    r.add(fmt::format(
        "mla: {} has no multi-head latent attention layout to write here (Megatron-LM's "
        "--multi-latent-attention with its latent ranks and head widths)",
        c.target_name()));
}

void refuse_sliding_window(const Context& c, Refusals& r) {
  if (c.llm.block.sliding_window)
    r.add(
        fmt::format("sliding_window: {} has no sliding-window attention setting to write here "
                    "(Megatron-Core's --window-size with --window-attn-skip-freq)",
                    c.target_name()));
}

void refuse_attention_sinks(const Context& c, Refusals& r) {
  if (c.llm.block.attention_sinks)
    r.add(
        fmt::format("attention_sinks: {} has no learnable softmax offset to write here "
                    "(Megatron-Core's --softmax-type learnable)",
                    c.target_name()));
}

void refuse_post_norms(const Context& c, Refusals& r) {
  if (c.llm.block.post_norms)
    r.add(fmt::format(
        "post_norms: {} has no setting for norms after the attention and the MLP (Gemma 2 / "
        "3's; Megatron-Bridge builds them in its Gemma providers' layer spec)",
        c.target_name()));
}

void refuse_glu_extras(const Context& c, Refusals& r) {
  const models::TransformerSpec& b = c.llm.block;
  if (b.activation_clamp > 0)
    r.add(
        fmt::format("activation_clamp {}: {} has no setting for a clamped gated MLP "
                    "(Megatron-Core's activation_func_clamp_value)",
                    b.activation_clamp, c.target_name()));
  if (b.glu_linear_offset != 0)
    r.add(
        fmt::format("glu_linear_offset {}: {} has no setting for an offset gated MLP "
                    "(Megatron-Core's glu_linear_offset)",
                    b.glu_linear_offset, c.target_name()));
}

void refuse_zero_centered_gamma(const Context& c, Refusals& r) {
  if (c.llm.block.zero_centered_gamma)
    r.add(
        fmt::format("zero_centered_gamma: {} has no setting for norms scaled by 1 + gamma "
                    "(Megatron-Core's layernorm_zero_centered_gamma)",
                    c.target_name()));
}

void refuse_a2a_context_parallel(const Context& c, Refusals& r) {
  const planner::Layout& l = c.layout();
  if (l.cp > 1 && l.cp_heads_split() > 1)
    r.add(fmt::format(
        "cp_comm {} (cp {}): {} has no head-splitting all-to-all context parallelism to write "
        "here (Megatron-Core's --cp-comm-type a2a and a2a+p2p, DeepSpeed's Ulysses)",
        planner::to_string(l.cp_comm), l.cp, c.target_name()));
}

void refuse_mtp(const Context& c, Refusals& r) {
  if (c.llm.mtp_layers > 0)
    r.add(
        fmt::format("mtp_layers {}: {} has no multi-token prediction modules (Megatron-Core's "
                    "--mtp-num-layers)",
                    c.llm.mtp_layers, c.target_name()));
}

void refuse_token_dropping(const Context& c, Refusals& r) {
  if (c.layout().moe_capacity_factor > 0)
    r.add(
        fmt::format("moe_capacity_factor {}: {} has no padded token-dropping MoE dispatcher "
                    "(Megatron's --moe-expert-capacity-factor with "
                    "--moe-pad-expert-input-to-capacity); plan it dropless",
                    c.layout().moe_capacity_factor, c.target_name()));
}

void refuse_cross_entropy_unless(const Context& c, Refusals& r,
                                 std::initializer_list<planner::CrossEntropy> runs) {
  const planner::CrossEntropy ce = c.layout().cross_entropy_fusion;
  std::string names;
  for (planner::CrossEntropy run : runs) {
    if (run == ce) return;
    names += fmt::format("{}\"{}\"", names.empty() ? "" : " or ", planner::to_string(run));
  }
  std::string_view what =
      "Megatron-Core's fused cross-entropy kernel (Megatron's "
      "--cross-entropy-fusion-impl native)";
  if (ce == planner::CrossEntropy::kTe)
    what = "Transformer Engine's cross-entropy kernel (Megatron's --cross-entropy-fusion-impl te)";
  if (ce == planner::CrossEntropy::kCompiled)
    what = "torch.compile'd loss (torchtitan's compile.components \"loss\")";
  r.add(fmt::format("cross_entropy_fusion {}: {} has no {}; plan it as {}", planner::to_string(ce),
                    c.target_name(), what, names));
}

void refuse_megatron_cross_entropy(const Context& c, Refusals& r) {
  refuse_cross_entropy_unless(c, r,
                              {planner::CrossEntropy::kUnfused, planner::CrossEntropy::kNative,
                               planner::CrossEntropy::kTe});
}

void refuse_mimo_ep_overlap(const Context& c, std::string_view who, Refusals& r) {
  if (c.layout().ep_comm_overlap)
    r.add(fmt::format(
        "ep_comm_overlap: {} runs its own multi-module schedule, not Megatron-Core's combined "
        "1F1B that hides the expert-parallel all-to-alls",
        who));
}

void refuse_mimo_fsdp(const Context& c, std::string_view who, Refusals& r) {
  if (!c.heterogeneous()) return;
  auto refuse = [&](std::string_view module) {
    r.add(
        fmt::format("{} fsdp in the {} placement: {} builds each module's grid with Megatron's "
                    "DDP and distributed optimizer, and hetpar knows no setting that fully "
                    "shards one (use distributed_optimizer, or the homogeneous placement)",
                    module, planner::to_string(c.p.placement), who));
  };
  if (c.layout().fsdp) refuse("llm");
  for (const planner::ModulePlan& m : c.p.modules)
    if (m.layout.fsdp) refuse(fmt::format("module {}", m.module));
}

void refuse_megatron_fsdp(const Context& c, std::string_view who, Refusals& r) {
  const planner::Layout& l = c.layout();
  if (!l.fsdp) return;
  if (!l.torch_fsdp2()) {
    if (!l.fsdp_reshard_after_forward)
      r.add(
          "fsdp kept gathered from forward to backward as Megatron-FSDP: its optim_grads_params "
          "strategy gathers the parameters again for the backward; PyTorch FSDP2 keeps them "
          "(fsdp_implementation torch_fsdp2)");
    return;
  }
  // Megatron-LM's arguments.py, under --use-torch-fsdp2; Megatron-Bridge builds the same
  // Megatron-Core wrapper (TorchFullyShardedDataParallel).
  const auto refuse = [&](std::string_view what, std::string_view why) {
    r.add(fmt::format("torch FSDP2 with {}: {} ({})", what, why, who));
  };
  if (l.pp > 1)
    refuse(fmt::format("pp {}", l.pp), "Megatron-Core's FSDP2 runs without pipeline parallelism");
  if (l.ep > 1)
    refuse(fmt::format("ep {}", l.ep), "Megatron-Core's FSDP2 runs without expert parallelism");
  if (c.s.workload.precision == hardware::Precision::kFp16)
    refuse("fp16", "Megatron-Core's FSDP2 trains in bf16 or fp32");
  if (c.llm.tied_embeddings)
    refuse("tied embeddings", "it needs the output layer untied from the embedding");
  // Fused gradient accumulation under FSDP2 is infeasible already (planner::infeasibility).
  if (l.fp8_param_gather)
    refuse("FP8 parameter gathers",
           "Megatron turns fp8_param_gather off under FSDP2 with Transformer Engine 2; set it "
           "false");
}

bool megatron_distributed_optimizer(const planner::Layout& l) {
  return l.shards_optimizer_state() && !l.torch_fsdp2();
}

bool megatron_overlap_param_gather(const planner::Layout& l) {
  return l.overlap_param_gather && megatron_distributed_optimizer(l);
}

void refuse_megatron_asserts(const Context& c, Refusals& r) {
  const planner::Layout& l = c.layout();
  if (megatron_overlap_param_gather(l) && !l.overlap_grad_reduce)
    r.add(
        "overlap_param_gather without overlap_grad_reduce: Megatron-LM asserts \"Must use "
        "--overlap-param-gather with --overlap-grad-reduce\"");
  if (l.fp8_param_gather && !l.shards_optimizer_state())
    r.add(
        "fp8_param_gather without the distributed optimizer or FSDP: Megatron-LM asserts "
        "--fp8-param-gather only with a sharded optimizer (nothing else gathers parameters)");
  if (c.llm.moe && c.s.workload.precision == hardware::Precision::kFp16)
    r.add(
        "fp16 with mixture-of-experts layers: Megatron-LM's grouped GEMM for MoE, which the "
        "export runs, supports bf16 only (it asserts)");
}

void refuse_mimo_ddp_mismatch(const Context& c, const planner::ModulePlan& m,
                              std::string_view where, Refusals& r) {
  const planner::Layout& l = c.layout();
  const planner::Layout& e = m.layout;
  // One userbuffers switch for the run: an encoder that could overlap (TP with SP) must do
  // as the LLM does.
  if (e.tp > 1 && e.sequence_parallel && e.tp_comm_overlap != l.tp_comm_overlap)
    r.add(
        fmt::format("encoder {} tp_comm_overlap {} but the llm's {}: the run has one "
                    "userbuffers setting for every module",
                    m.module, e.tp_comm_overlap, l.tp_comm_overlap));
  if (c.s.workload.frozen_encoders) return;  // no encoder gradients, no encoder optimizer
  if (e.distributed_optimizer == l.distributed_optimizer &&
      e.overlap_grad_reduce == l.overlap_grad_reduce &&
      e.grad_reduce_dtype == l.grad_reduce_dtype && e.nccl_ub == l.nccl_ub &&
      (!l.distributed_optimizer || e.overlap_param_gather == l.overlap_param_gather))
    return;
  r.add(
      fmt::format("encoder {} with other distributed-optimizer / overlap / gradient-dtype settings "
                  "than the LLM: {}",
                  m.module, where));
}

std::string header(const Context& c, std::string_view comment) {
  std::string out = fmt::format("{}Generated by `hetpar export --to {}` from scenario \"{}\"{}.\n",
                                comment, c.target_name(), c.s.name,
                                c.s.source.empty() ? "" : fmt::format(" ({})", c.s.source));
  out += fmt::format("{}Placement {}, {} schedule; LLM: {}.\n", comment,
                     planner::to_string(c.p.placement), planner::to_string(c.p.schedule),
                     planner::describe_in_words(c.layout(), c.s.workload.precision));
  for (const planner::ModulePlan& m : c.p.modules)
    out += fmt::format(
        "{}Encoder {}: {}{}.\n", comment, m.module,
        planner::describe_in_words(m.layout, c.s.workload.precision),
        c.p.placement == planner::Placement::kNonColocated
            ? fmt::format(", ranks {}-{}", m.first_rank, m.first_rank + m.layout.world() - 1)
            : "");
  out += fmt::format(
      "{}Workload: sequence {}, global batch {} ({} micro-batches per LLM replica), {}; {} "
      "GPUs on {} node(s).\n",
      comment, c.s.workload.seq_len, c.s.workload.global_batch, c.micro_batches,
      hardware::to_string(c.s.workload.precision), c.world, c.nodes);
  if (!nvls_enabled(c))
    out += fmt::format(
        "{}NCCL_NVLS_ENABLE=0 (the cluster's nvls false): the prediction runs intra-node "
        "all-reduces as rings; run with it set.\n",
        comment);
  if (!c.memory_over.empty()) out += fmt::format("{}{}\n", comment, c.memory_over);
  // A cluster of several node types: the plan places its modules by rank, so each node
  // must start with the node rank of its own group's place.
  const auto& groups = c.s.cluster.groups();
  if (groups.size() > 1) {
    std::string where;
    for (size_t i = 0; i < groups.size(); ++i) {
      const hardware::NodeGroup& g = groups[i];
      const int node = c.s.cluster.group_first_node(i), gpu = c.s.cluster.group_first_gpu(i);
      where += fmt::format("{}{} {} (ranks {}-{})", where.empty() ? "" : ", ",
                           g.nodes == 1 ? fmt::format("node {}", node)
                                        : fmt::format("nodes {}-{}", node, node + g.nodes - 1),
                           g.profile.name, gpu, gpu + g.nodes * g.profile.gpus_per_node - 1);
    }
    out += fmt::format(
        "{}Node types as planned: {}. Start each node with its node rank from this order: the "
        "plan places modules by rank.\n",
        comment, where);
  }
  return out;
}

std::string yaml_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string yaml_bool(bool b) {
  return b ? "true" : "false";
}

std::string render_yaml(const std::vector<Setting>& settings) {
  auto split = [](const std::string& key) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t dot = key.find('.', start);
      parts.push_back(key.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return parts;
  };
  // Group the settings under their parents, each parent where its first key appears (a YAML
  // mapping may not repeat a key): sort by the first-appearance rank of each prefix.
  struct Entry {
    std::vector<size_t> rank;  // per prefix of the key, the index of its first setting
    std::vector<std::string> parts;
    const Setting* setting;
  };
  std::map<std::string, size_t> first;  // dotted prefix -> index of its first setting
  std::vector<Entry> order;
  for (size_t i = 0; i < settings.size(); ++i) {
    Entry e{{}, split(settings[i].key), &settings[i]};
    std::string prefix;
    for (const std::string& part : e.parts) {
      prefix += (prefix.empty() ? "" : ".") + part;
      e.rank.push_back(first.emplace(prefix, i).first->second);
    }
    order.push_back(std::move(e));
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry& a, const Entry& b) { return a.rank < b.rank; });
  std::string out;
  std::vector<std::string> open;  // the parent keys of the previous setting
  for (const Entry& entry : order) {
    const Setting& s = *entry.setting;
    const std::vector<std::string>& parts = entry.parts;
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common])
      ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      out += fmt::format("{:{}}{}:\n", "", 2 * i, parts[i]);
      open.push_back(parts[i]);
    }
    out += fmt::format("{:{}}{}: {}\n", "", 2 * (parts.size() - 1), parts.back(), s.value);
  }
  return out;
}

std::string launcher_environment(const Context& c) {
  return fmt::format(
      "NNODES={}\n"
      "GPUS_PER_NODE={}\n"
      "NODE_RANK=${{NODE_RANK:-${{SLURM_NODEID:-0}}}}\n"
      "if [[ -z \"${{MASTER_ADDR:-}}\" && -n \"${{SLURM_JOB_NODELIST:-}}\" ]]; then\n"
      "  MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
      "fi\n"
      "MASTER_ADDR=${{MASTER_ADDR:-localhost}}\n"
      "MASTER_PORT=${{MASTER_PORT:-6000}}\n"
      "{}",
      c.nodes, c.gpus_per_node, nvls_environment(c));
}

std::string nvls_environment(const Context& c) {
  return nvls_enabled(c) ? "" : "export NCCL_NVLS_ENABLE=0\n";
}

std::string unfused_accumulation_note(const Context& c, std::string_view trainer) {
  if (!c.layout().gradient_accumulation_fusion) return "";
  return fmt::format(
      "The plan times its weight-gradient GEMMs as adding into an fp32 main_grad (Megatron's "
      "fused gradient accumulation); {} writes them in the parameter dtype and accumulates with "
      "separate adds: set the plan's gradient_accumulation_fusion to false to time it so (a "
      "memory pass over every weight gradient each micro-batch, which the fused plan does not "
      "charge).",
      trainer);
}

std::string rope_note(const models::LlmSpec& llm) {
  std::vector<std::string> parts;
  if (llm.rope_base > 0) parts.push_back(fmt::format("RoPE base {}", llm.rope_base));
  if (llm.rope_scaling_factor > 0)
    parts.push_back(fmt::format("Llama 3.1 scaling by {}", llm.rope_scaling_factor));
  if (llm.yarn)
    parts.push_back(fmt::format(
        "YaRN by {} over {} positions (beta_fast {}, beta_slow {}, mscale {}, mscale_all_dim {}{})",
        llm.yarn->factor, llm.yarn->original_max_positions, llm.yarn->beta_fast,
        llm.yarn->beta_slow, llm.yarn->mscale, llm.yarn->mscale_all_dim,
        llm.yarn->truncate ? "" : ", the ramp not rounded"));
  if (llm.rotary_percent != 1)
    parts.push_back(fmt::format("rotating {} of each head", llm.rotary_percent));
  if (llm.no_rope_every > 0)
    parts.push_back(fmt::format("no RoPE in the layers numbered (from 1) in multiples of {}",
                                llm.no_rope_every));
  if (const auto& m = llm.moe) {  // named where it is not Megatron's default softmax router
    std::string router;
    if (m->expert_bias) router += " with expert bias";
    if (m->topk_scaling > 0) router += fmt::format(", its weights scaled by {}", m->topk_scaling);
    if (m->groups > 0)
      router += fmt::format(", the experts of {} of {} groups", m->group_topk, m->groups);
    if (m->probs_on_input) router += ", its probability scaling the expert's input";
    if (m->pre_softmax) router += ", its softmax over all experts before the top-k";
    if (m->shared_expert_gate) router += ", a sigmoid gate on the shared experts' output";
    if (m->sigmoid_router || !router.empty())
      parts.push_back(
          fmt::format("a {} router{}", m->sigmoid_router ? "sigmoid" : "softmax", router));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string layer_code_note(const Context& c, std::string_view trainer, LayerCode code) {
  const planner::Layout& l = c.layout();
  std::vector<std::string> differ;
  if (l.fused_projections != code.fused_projections)
    differ.push_back(code.fused_projections
                         ? "fuses the q, k, v and the gate and up projections into one GEMM each "
                           "(fused_projections true)"
                         : "runs a GEMM per projection (fused_projections false)");
  if (l.repeat_kv != code.repeat_kv)
    differ.push_back(code.repeat_kv
                         ? "copies K and V to every query head before attention (repeat_kv true)"
                         : "reads K and V grouped in the attention kernel (repeat_kv false)");
  if (l.fused_activation != code.fused_activation &&
      c.llm.block.activation != models::Activation::kGelu)
    differ.push_back(code.fused_activation ? "runs the MLP activation as one fused kernel each way "
                                             "(fused_activation true)"
                                           : "runs the MLP activation as separate PyTorch ops "
                                             "(fused_activation false)");
  if (l.fused_rope != code.fused_rope && c.llm.positions == models::PositionEmbedding::kRope &&
      !c.llm.yarn_scales_rope())
    differ.push_back(code.fused_rope ? "runs RoPE as one fused kernel each way (fused_rope true)"
                                     : "runs RoPE as separate PyTorch ops (fused_rope false)");
  if (differ.empty()) return "";
  return fmt::format(
      "The plan's layer is timed otherwise than {}'s model code runs it: it {}; "
      "set those plan fields to time it so.",
      trainer, fmt::join(differ, ", and "));
}

std::vector<std::string> fsdp2_notes(const Context& c, std::string_view trainer,
                                     bool wraps_like_torchtitan) {
  const planner::Layout& l = c.layout();
  std::vector<std::string> notes;
  if (!l.fsdp) return notes;
  if (!l.torch_fsdp2()) {
    notes.push_back(fmt::format(
        "The plan times FSDP as Megatron-FSDP (collectives in place); {} runs PyTorch FSDP2, "
        "whose copy-out kernel after each all-gather it does not charge: set the plan's "
        "fsdp_implementation to torch_fsdp2 to time it so.",
        trainer));
    return notes;
  }
  if (l.fsdp_root_unit)
    notes.push_back(fmt::format(
        "The plan times torchtitan's FSDP wrapping before July 2025 (the embedding, final norm "
        "and output in the root unit, the last layer kept gathered); {} wraps them as units of "
        "their own: set fsdp_root_unit to false to time that.",
        trainer));
  else if (!wraps_like_torchtitan && l.fsdp_reshard_after_forward)
    notes.push_back(fmt::format(
        "The plan keeps [final norm, output] gathered from their forward to their backward, as "
        "torchtitan wraps them; {} wraps the output layer as a unit of its own and reshards it "
        "like the layers, one all-gather more per micro-batch than predicted.",
        trainer));
  return notes;
}

namespace {

// CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM asserts or wants it for the plan.
std::string_view hardware_queues(const planner::Layout& l, bool any_tp_or_cp) {
  if (l.fsdp)
    return "# FSDP: Megatron-LM asserts more than one hardware queue.\n"
           "unset CUDA_DEVICE_MAX_CONNECTIONS\n";
  if (l.ep_comm_overlap)
    return "# EP all-to-all overlap: more hardware queues, so the all-to-alls run beside the "
           "compute (Megatron-LM warns that before Blackwell TP / CP want 1 and the overlap more; "
           "the Megatron-Core MoE team's launch scripts set 32 with it).\n"
           "export CUDA_DEVICE_MAX_CONNECTIONS=32\n";
  if (!any_tp_or_cp) return "";
  return "# TP / CP: Megatron-LM asserts one hardware queue before Blackwell (collectives in "
         "issue order).\n"
         "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
}

}  // namespace

std::string megatron_environment(const Context& c, bool any_tp_or_cp) {
  const planner::Layout& l = c.layout();
  std::string env;
  // HybridEP must be told its NVLink domain's size (Megatron-Core's MoE guide: a mismatch
  // costs performance and can cost correctness): a node's GPUs, or the EP group inside one.
  if (l.moe_dispatcher == planner::MoeDispatcher::kHybridEp)
    env = fmt::format(
        "# HybridEP: the EP group's ranks per NVLink domain.\n"
        "export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={}\n",
        c.gpus_per_node > 0 ? std::min(l.ep, c.gpus_per_node) : l.ep);
  return env + std::string(hardware_queues(l, any_tp_or_cp));
}

std::string torchrun_script(const Context& c, const std::vector<std::string>& notes,
                            const std::vector<FlagGroup>& groups, std::string_view entry,
                            std::string_view environment) {
  std::string out = "#!/bin/bash\n" + header(c);
  for (const std::string& n : notes) out += "# " + n + "\n";
  out += fmt::format(
      "# Run once per node: {} node(s) x {} GPUs = {} ranks (e.g. `srun --nodes {} "
      "--ntasks-per-node 1 bash launch.sh`, or set NODE_RANK and MASTER_ADDR yourself).\n",
      c.nodes, c.gpus_per_node, c.world, c.nodes);
  out += "set -euo pipefail\n\n" + launcher_environment(c);
  out += environment;
  std::string uses;
  for (const FlagGroup& g : groups) {
    out += "\n";
    if (!g.comment.empty()) out += "# " + g.comment + "\n";
    out += g.array + "=(\n";
    for (const Flag& f : g.flags)
      out += f.value.empty() ? fmt::format("  {}\n", f.name)
                             : fmt::format("  {} {}\n", f.name, f.value);
    out += ")\n";
    uses += fmt::format(" \"${{{}[@]}}\"", g.array);
  }
  out += fmt::format(
      "\ntorchrun --nnodes \"$NNODES\" --nproc-per-node \"$GPUS_PER_NODE\" --node-rank "
      "\"$NODE_RANK\" \\\n"
      "  --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n"
      "  {}{} \"$@\"\n",
      entry, uses);
  return out;
}

}  // namespace detail

}  // namespace hetpar::exporter
