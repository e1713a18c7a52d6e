// Internal to hetpar_export: what every target writer shares — the plan's context, the
// list of refusals, the renderers of YAML settings and of launch scripts — and one writer
// function per target. Writers report everything they cannot express (Refusals) before
// they render anything.
#pragma once

#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hetpar/export/export.h"
#include "hetpar/hardware/precision.h"
#include "hetpar/models/spec.h"

namespace hetpar::exporter::detail {

/// The plan and the facts about the scenario every writer needs.
struct Context {
  const planner::Scenario& s;
  const planner::Plan& p;
  Target target;
  const models::LlmSpec& llm;
  /// Encoders the workload feeds (module indices): empty for an LLM-only run.
  std::vector<size_t> encoders;
  int world = 0;
  int nodes = 0;
  int gpus_per_node = 0;      // 0 when the node groups differ in GPUs per node
  int64_t micro_batches = 0;  // per LLM DP replica
  /// Where the memory model puts the plan over its GPUs, what header() says (export_plan()
  /// estimates it once); empty when it fits.
  std::string memory_over = {};

  bool multimodal() const { return !encoders.empty(); }
  bool heterogeneous() const { return p.placement != planner::Placement::kHomogeneous; }
  const planner::Layout& layout() const { return p.layout; }
  /// The LLM's gradient buffer, and its data-parallel reduction, is fp32 (planner
  /// gradient_bytes(): the plan's grad_reduce_dtype, else the trainers' default for the
  /// precision); otherwise it has the weights' 16-bit dtype.
  bool fp32_gradients() const;
  std::string_view target_name() const { return to_string(target); }
};

/// What a target cannot express, collected so the user sees every reason at once.
class Refusals {
 public:
  void add(std::string why) { why_.push_back(std::move(why)); }
  bool empty() const { return why_.empty(); }
  /// "<target> cannot express this plan: a; b". REQUIRES: !empty().
  Status status(Target t) const;

 private:
  std::vector<std::string> why_;
};

// ---- what several targets refuse the same way ----------------------------------------

/// Launch scripts start one process per GPU with one count per node.
void refuse_mixed_node_sizes(const Context& c, Refusals& r);
/// Targets with one layout for the whole model.
void refuse_heterogeneous(const Context& c, Refusals& r);
/// Targets whose pipeline engine knows nothing of an encoder placed on stage 0 ahead of
/// the LLM's layers (Megatron's LLaVA-style homogeneous layout).
void refuse_multimodal(const Context& c, Refusals& r, std::string_view why);
/// Megatron's uneven splits (first/last_stage_layers, account_for_embedding/loss) and
/// Layout::pipeline_layout, for targets that split layers evenly themselves.
void refuse_uneven_split(const Context& c, Refusals& r);
/// Megatron-Core's --pipeline-model-parallel-layout for Layout::pipeline_layout: the virtual
/// stages in its order split by '|', the embedding (E) on the first, the output layer and
/// loss (L) on the last, "Et*6|t*26L".
std::string megatron_pipeline_layout(const planner::Layout& l);
/// Precisions other than those listed.
void refuse_precision_unless(const Context& c, Refusals& r,
                             std::initializer_list<hardware::Precision> supported);

/// MIMO (Megatron-LM's example and Megatron-Bridge) runs an encoder once per LLM
/// micro-batch: each encoder rank takes llm micro_batch x llm dp / encoder dp samples.
/// Refuses an encoder micro-batch that differs. `who`: "the MIMO example", "MegatronMIMO".
void refuse_mimo_encoder_batch(const Context& c, const planner::ModulePlan& m, std::string_view who,
                               Refusals& r);
/// Megatron's communication overlaps and schedule knobs, for targets without them:
/// userbuffers TP overlap (Layout::tp_comm_overlap), the EP all-to-all overlap
/// (Layout::ep_comm_overlap), deferred output-layer wgrads (Layout::defer_embedding_wgrad)
/// and the interleaved schedule's micro-batch groups (Layout::microbatch_group).
void refuse_megatron_comm_overlaps(const Context& c, Refusals& r);
/// Megatron-Core's --attention-backend for the layout: unfused without flash attention; auto
/// for the profile's own kernel (Transformer Engine prefers cuDNN's fused attention on Hopper
/// and later, FlashAttention before, the kernels the profiles time); fused for cuDNN; flash
/// for FlashAttention-2 or -3 (whichever flash-attn package is installed).
std::string_view megatron_attention_backend(const planner::Layout& l);
/// Refuses recompute selective_op (torchtitan's per-op activation checkpointing) in any of the
/// plan's layouts: the other trainers keep other activations.
void refuse_selective_op(const Context& c, Refusals& r);
/// What a layout's selective recompute re-runs, as a refusal names it: the attention core, or
/// the plan's recompute_modules.
std::string selective_recompute(const planner::Layout& l);
/// Refuses Layout::moe_capacity_factor (token dropping padded to capacity: Megatron's alone).
void refuse_token_dropping(const Context& c, Refusals& r);
/// Refuses Layout::moe_dispatcher deepep (Megatron-Core's flex dispatcher alone).
void refuse_flex_dispatcher(const Context& c, Refusals& r);
/// Multi-token prediction depths (models::LlmSpec::mtp_layers), Megatron-Core's alone.
void refuse_mtp(const Context& c, Refusals& r);
/// Multi-head latent attention (models::MlaSpec): the Megatron-LM script's alone.
void refuse_mla(const Context& c, Refusals& r);
/// Sliding-window attention (models::SlidingWindow): Megatron-LM's and Megatron-Bridge's.
void refuse_sliding_window(const Context& c, Refusals& r);
/// Attention sinks (models::TransformerSpec::attention_sinks): Megatron-LM's and
/// Megatron-Bridge's.
void refuse_attention_sinks(const Context& c, Refusals& r);
/// Refuses a model with TransformerSpec::post_norms: no trainer's generic model takes them.
void refuse_post_norms(const Context& c, Refusals& r);
/// TransformerSpec::activation_clamp and glu_linear_offset, which only Megatron's targets
/// write.
void refuse_glu_extras(const Context& c, Refusals& r);
/// Norms scaled by 1 + gamma (TransformerSpec::zero_centered_gamma), for a target whose
/// model code has none.
void refuse_zero_centered_gamma(const Context& c, Refusals& r);
/// Context parallelism by all-to-alls over the heads (Layout cp_comm a2a, a2a+p2p).
void refuse_a2a_context_parallel(const Context& c, Refusals& r);
/// Refuses a Layout::cross_entropy_fusion other than those the target runs: Megatron's fused
/// kernels (native, te) in Megatron-LM and Megatron-Bridge, the compiled loss in torchtitan.
void refuse_cross_entropy_unless(const Context& c, Refusals& r,
                                 std::initializer_list<planner::CrossEntropy> runs);
/// Megatron-LM's and Megatron-Bridge's: unfused, native, te.
void refuse_megatron_cross_entropy(const Context& c, Refusals& r);
/// The EP all-to-all overlap (Layout::ep_comm_overlap) under a MIMO target: its schedule
/// is not Megatron-Core's combined 1F1B. `who` as above.
void refuse_mimo_ep_overlap(const Context& c, std::string_view who, Refusals& r);
/// FSDP in a heterogeneous plan (the LLM's or a module's): hetpar knows no MIMO setting
/// that fully shards a module grid, so it does not write one. `who` as above.
void refuse_mimo_fsdp(const Context& c, std::string_view who, Refusals& r);
/// MIMO takes one distributed-optimizer / overlap setting for every module (frozen
/// encoders have no optimizer: anything goes).
void refuse_mimo_ddp_mismatch(const Context& c, const planner::ModulePlan& m,
                              std::string_view where, Refusals& r);

// ---- rendering ------------------------------------------------------------------------

inline std::string num(int64_t v) {
  return std::to_string(v);
}
/// A real-valued flag or setting, shortest round-trip ("8", "0.5", "500000").
inline std::string decimal(double v) {
  return fmt::format("{}", v);
}
/// The comment block every file opens with: tool, target, scenario, plan, world. Each line
/// starts with `comment` ("# ").
std::string header(const Context& c, std::string_view comment = "# ");

/// One setting of a YAML / TOML-like config: a dotted key and its value, already spelled
/// as a YAML scalar (numbers, true/false, null, or a double-quoted string).
struct Setting {
  std::string key;
  std::string value;
};
std::string yaml_string(std::string_view s);  // "\"...\""
std::string yaml_bool(bool b);
/// Nested block YAML of `settings`, 2-space indent: keys sharing a prefix are grouped under
/// it, each group where its first key appears (a YAML mapping may not repeat a key).
std::string render_yaml(const std::vector<Setting>& settings);

/// A command-line flag: `--name value`, or `--name` alone when value is empty.
struct Flag {
  std::string name;
  std::string value;
};
/// A bash array of flags, e.g. PARALLEL_ARGS, with an optional comment above it.
struct FlagGroup {
  std::string array;  // "PARALLEL_ARGS"
  std::string comment;
  std::vector<Flag> flags;
};

/// A bash launch script run once per node: torchrun with the cluster's nodes and GPUs per
/// node (NODE_RANK / MASTER_ADDR from the environment or SLURM) starting `entry` with the
/// flag groups' arrays. `notes` are comment lines after the header; `environment`, lines
/// after the launcher's (e.g. megatron_environment).
std::string torchrun_script(const Context& c, const std::vector<std::string>& notes,
                            const std::vector<FlagGroup>& groups, std::string_view entry,
                            std::string_view environment = "");
/// What Megatron-LM's arguments.py requires of CUDA_DEVICE_MAX_CONNECTIONS: 1 with TP or CP
/// (before Blackwell it asserts so: one hardware queue keeps each TP collective ordered
/// before the GEMM that needs it), more than one with FSDP (it asserts that always), left
/// as the user has it with the EP all-to-all overlap (it warns); `any_tp_or_cp`: some module of the
/// plan has TP or CP > 1.
std::string megatron_environment(const Context& c, bool any_tp_or_cp);
/// The lines that set NNODES, GPUS_PER_NODE, NODE_RANK, MASTER_ADDR and MASTER_PORT.
std::string launcher_environment(const Context& c);
/// The shell line that switches NCCL's NVLS off where the cluster does (`nvls` false), ""
/// where it keeps it.
std::string nvls_environment(const Context& c);
/// For a trainer without Megatron's fused gradient accumulation (torchtitan, DeepSpeed,
/// nanotron): the note that the plan timed its weight-gradient GEMMs as adding into an fp32
/// main_grad (Layout::gradient_accumulation_fusion); "" when the plan has it off.
std::string unfused_accumulation_note(const Context& c, std::string_view trainer);
/// How a trainer's model code runs a layer: its q, k, v (and gate, up) projections fused
/// into one GEMM each or not, and K, V repeated to every query head or read grouped.
struct LayerCode {
  bool fused_projections = true;
  bool repeat_kv = false;
  bool fused_activation = true;  // compared only for SwiGLU and squared ReLU (GELU: one kernel)
  /// Compared only for RoPE whose cos and sin are unscaled (a scaling YaRN runs unfused).
  bool fused_rope = true;
};
/// The note that the plan timed the LLM's layer otherwise than `trainer`'s model code runs
/// it (Layout::fused_projections, Layout::repeat_kv, Layout::fused_activation,
/// Layout::fused_rope); "" when they agree.
std::string layer_code_note(const Context& c, std::string_view trainer, LayerCode code);
/// "RoPE base 500000, Llama 3.1 scaling by 8": the model's own RoPE (its base, scaling or
/// YaRN, rotated share) and MoE router where it is not softmax top-k, for targets whose
/// model code the user supplies; "" where the model leaves them unset.
std::string rope_note(const models::LlmSpec& llm);
/// For a trainer that runs PyTorch FSDP2 (`wraps_like_torchtitan`: with torchtitan's units,
/// else Megatron-Core's, which reshard the output layer like the layers): the notes on what
/// the plan's FSDP timing (Layout::fsdp_implementation, fsdp_root_unit) does not match;
/// none without FSDP.
std::vector<std::string> fsdp2_notes(const Context& c, std::string_view trainer,
                                     bool wraps_like_torchtitan);

// ---- Megatron vocabulary shared by megatron, megatron-mimo and megatron-bridge ----------

/// --recompute-* for a layout (empty for none).
std::vector<Flag> megatron_recompute_flags(const planner::Layout& l);
/// Megatron's distributed optimizer (--use-distributed-optimizer, ddp.use_distributed_optimizer)
/// is on: the plan shards the optimizer state, and not with torch FSDP2, which shards it
/// itself (Megatron-LM asserts it without the flag). Megatron-FSDP runs with it.
bool megatron_distributed_optimizer(const planner::Layout& l);
/// --overlap-param-gather (ddp.overlap_param_gather) is on: asked for, and there is a
/// parameter all-gather to overlap, the distributed optimizer's (Megatron asserts).
bool megatron_overlap_param_gather(const planner::Layout& l);
/// A module's TransformerConfig fields that MIMO sets in the module's own spec, not on the
/// command line: "sequence_parallel=True recompute_granularity=\"full\" ...".
std::string transformer_config_fields(const planner::Layout& l);
/// The LLM's shape as Megatron-LM flags (--num-layers, --hidden-size, ...).
std::vector<Flag> megatron_model_flags(const Context& c);
/// Refusals for LLM shapes Megatron cannot build.
void refuse_megatron_model(const Context& c, Refusals& r);
/// Refusals for FSDP plans Megatron-Core cannot run: kept gathered to the backward as
/// Megatron-FSDP (its optim_grads_params strategy gathers again), and torch FSDP2 with what
/// Megatron-LM's arguments.py asserts against (pipeline or expert parallelism, fp16, tied
/// embeddings; fused gradient accumulation the plan itself cannot have) or turns off (FP8
/// parameter gathers).
/// `who`: the trainer, for the messages.
void refuse_megatron_fsdp(const Context& c, std::string_view who, Refusals& r);
/// Refusals for flag combinations Megatron-LM's arguments.py asserts against beyond FSDP's:
/// the parameter all-gather overlap without the gradient-reduction overlap, FP8 parameter
/// gathers without a sharded optimizer, MoE grouped GEMMs outside bf16.
void refuse_megatron_asserts(const Context& c, Refusals& r);

// ---- the writers --------------------------------------------------------------------

Result<std::vector<ExportFile>> write_megatron(const Context& c);
Result<std::vector<ExportFile>> write_megatron_mimo(const Context& c);
Result<std::vector<ExportFile>> write_megatron_bridge(const Context& c);
Result<std::vector<ExportFile>> write_torchtitan(const Context& c);
Result<std::vector<ExportFile>> write_deepspeed(const Context& c);
Result<std::vector<ExportFile>> write_nanotron(const Context& c);

}  // namespace hetpar::exporter::detail
