// Scenario: what a user asks hetpar about — a model (zoo name or inline modules), a
// workload (fused sequence length, global batch, images/clips per sample, precision)
// and a cluster. Loaded from a scenario JSON file (docs/scenario.md); every error names
// the JSON path. The workload decides each module's input size (module_input()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/precision.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/models/spec.h"
#include "hetpar/planner/layout.h"

namespace hetpar::planner {

/// What one training iteration processes. Samples are multimodal sequences: each holds
/// images_per_sample images (audio_clips_per_sample clips) whose encoder tokens are spliced
/// into a fused LLM sequence of seq_len tokens.
struct Workload {
  int64_t seq_len = 0;       // fused LLM sequence length (text + modality tokens)
  int64_t global_batch = 0;  // samples per iteration
  int64_t images_per_sample = 0;
  int64_t audio_clips_per_sample = 0;
  /// Overrides the vision encoder's native resolution (must divide by its patch size).
  std::optional<int64_t> image_size;
  /// Modality tokens per image as the LLM sees them, another way to give the resolution:
  /// the parser turns it into the image size that yields it (through the projector's
  /// downsampling). Derived from the encoder when absent.
  std::optional<int64_t> tokens_per_image;
  hardware::Precision precision = hardware::Precision::kBf16;
  /// Encoders (and their projectors' inputs) are frozen: no encoder backward, gradients or
  /// optimizer state — common when only the projector and the LLM are trained.
  bool frozen_encoders = false;
};

/// A partial layout the search must keep: each set field is fixed, the rest searched.
struct LayoutFix {
  std::optional<int> tp, cp, pp, vpp, dp, ep, micro_batch;
  /// The experts' TP width (Layout::etp): 1 folds EP over the TP ranks in every searched
  /// MoE layout with TP; unset, the experts follow TP.
  std::optional<int> etp;
  std::optional<bool> sequence_parallel, distributed_optimizer;
  std::optional<models::Recompute> recompute;
  /// With recompute fixed to selective: the modules it re-runs (Layout::recompute_modules),
  /// fixed too; unset, a MoE LLM's are searched (the attention core, the norm and activation,
  /// all three).
  std::optional<uint8_t> recompute_modules;
  /// The FP8 scaling every searched layout uses (the LLM's fix sets the run's; default
  /// delayed). Not searched: it is the trainer's numerics, not a parallel layout.
  std::optional<Fp8Recipe> fp8_recipe;
  /// The gradient buffer's dtype every searched layout uses (Layout::grad_reduce_dtype;
  /// default: the trainers'). Not searched either: it changes the numerics.
  std::optional<GradReduceDtype> grad_reduce_dtype;
  /// The LLM's cross-entropy (Layout::cross_entropy_fusion) in every searched layout;
  /// default Megatron's unfused one. Not searched: it is the trainer's kernel choice.
  std::optional<CrossEntropy> cross_entropy_fusion;
  /// FP8 parameters (Layout::fp8_param_gather) in every searched layout; default off.
  std::optional<bool> fp8_param_gather;
  /// NCCL user buffers (Layout::nccl_ub) in every searched layout but torch FSDP2's, which
  /// has none; default off. Not searched: a trainer setting.
  std::optional<bool> nccl_ub;
  /// The attention kernel (Layout::attention_kernel) of every searched layout; default the
  /// profile's own. Not searched: it is the trainer's kernel choice.
  std::optional<hardware::AttentionKernel> attention_kernel;
  /// The trainer's model code (Layout::fused_projections, Layout::repeat_kv,
  /// Layout::fused_activation, Layout::fused_rope) in every searched layout; default
  /// Megatron's (fused, no repeat, fused activation and RoPE). Not searched: it is the code.
  std::optional<bool> fused_projections, repeat_kv, fused_activation, fused_rope;
  /// MoE token dropping (Layout::moe_capacity_factor) in every searched LLM layout; default
  /// dropless. Not searched: dropping tokens changes what is trained.
  std::optional<double> moe_capacity_factor;
  /// Dropless routing's hottest EP rank over the mean (Layout::moe_load_imbalance) in every
  /// searched LLM layout; default 1. Not searched: it is the router's and the data's.
  std::optional<double> moe_load_imbalance;
  /// MoE token dispatcher (Layout::moe_dispatcher) in every searched LLM layout; default the
  /// all-to-all; `any_moe_dispatcher`: HybridEP and DeepEP too, where they apply (ep > 1,
  /// etp 1; DeepEP also dropless at a size it configures).
  std::optional<MoeDispatcher> moe_dispatcher;
  bool any_moe_dispatcher = false;
  /// Userbuffers TP overlap (Layout::tp_comm_overlap) in every searched LLM layout with
  /// tp > 1 and SP; default off; `any_tp_comm_overlap`: both (on small GEMMs the chunks
  /// cost more than they hide).
  std::optional<bool> tp_comm_overlap;
  bool any_tp_comm_overlap = false;
  /// The EP all-to-all overlap (Layout::ep_comm_overlap) in every searched LLM layout it
  /// applies to (ep > 1; the interleaved schedule, or 1F1B with pp 1), with or without
  /// userbuffers; default off; `any_ep_comm_overlap`: both.
  std::optional<bool> ep_comm_overlap;
  bool any_ep_comm_overlap = false;
  /// The shared-expert overlap (Layout::moe_shared_expert_overlap) in every searched LLM
  /// layout it applies to (shared experts, ep > 1, no EP all-to-all overlap, the shared
  /// experts not checkpointed alone); default on, as Megatron-Bridge's MoE model providers
  /// set it; `any_moe_shared_expert_overlap`: both.
  std::optional<bool> moe_shared_expert_overlap;
  bool any_moe_shared_expert_overlap = false;
  /// How CP exchanges K,V in layouts with cp > 1; unset: the ring (p2p) only, which the
  /// simulator rates at least as fast wherever the ring's steps hide their transfers, or
  /// a2a for an LLM with sliding windows or attention sinks (its only CP); `any_cp_comm`:
  /// each that applies (more plans to simulate). a2a+p2p takes `cp_a2a` ranks for its a2a
  /// level, or the widest power of two under cp that splits the heads inside a node.
  std::optional<CpComm> cp_comm;
  std::optional<int> cp_a2a;
  bool any_cp_comm = false;
  /// Fully sharded data parallelism (Layout::fsdp) in homogeneous layouts with dp·cp > 1:
  /// unset or false, never (the default); true, always; `any_fsdp`, both.
  std::optional<bool> fsdp;
  bool any_fsdp = false;
  /// Which FSDP a sharded layout runs (Layout::fsdp_implementation); unset: Megatron-FSDP
  /// when resharding after the forward, FSDP2 when keeping parameters gathered;
  /// `any_fsdp_implementation`: both where they apply (FSDP2 alone keeps gathered).
  std::optional<FsdpImplementation> fsdp_implementation;
  bool any_fsdp_implementation = false;
  /// The LLM's pipeline stages sized to their work (Layout::pipeline_layout) as well as
  /// split evenly (default true); false for a trainer without a per-stage layout (DeepSpeed,
  /// nanotron).
  bool sized_stages = true;
  bool operator==(const LayoutFix&) const = default;
};

/// The optional "search" section: constraints on what `hetpar plan` searches
/// (planner/search.h, docs/scenario.md).
struct SearchSpec {
  LayoutFix llm;  // the LLM's layout (and, homogeneous, every module's)
  /// Per encoder (by module name) under heterogeneous placements, sorted by name.
  std::vector<std::pair<std::string, LayoutFix>> modules;
  /// Placements the search leaves out.
  std::vector<Placement> forbidden_placements;
  /// Per-GPU memory cap below the GPUs' own capacity; unset = the capacity.
  std::optional<Bytes> max_memory;
  std::optional<Schedule> schedule;  // the pipeline schedule every plan must use
  /// The search also enumerates TP groups of whole nodes (lower() accepts them in any plan:
  /// their collectives cross the scale-out network).
  bool allow_cross_node_tp = false;
  int top_k = 5;  // plans in the ranked table
  /// Plans whose task graph would exceed this many tasks (estimated) are not simulated in
  /// a search: they are rejected with that reason. A task costs about 1.3 us to simulate
  /// and 190 bytes while it runs (docs/performance.md), so the default bounds one
  /// simulation near 4 s and 0.6 GB per thread.
  int64_t max_sim_tasks = 3'000'000;
  bool operator==(const SearchSpec&) const = default;
};

struct Scenario {
  std::string name;
  std::string source;  // file it came from ("" when built in code)
  models::ModelSpec model;
  Workload workload;
  hardware::ClusterSpec cluster;
  /// The optional "plan" section: the layout `simulate` predicts.
  std::optional<Plan> plan;
  /// The optional "plans" section: named plans `compare` puts side by side (e.g. the best
  /// known homogeneous, colocated and non-colocated ones), sorted by name.
  std::vector<std::pair<std::string, Plan>> plans;
  /// The optional "search" section (defaults when absent).
  SearchSpec search;
};

/// Parses a scenario file; relative profile paths resolve against the file's directory.
Result<Scenario> load_scenario(const std::string& path);
/// Parses scenario JSON text; `source` prefixes syntax errors, `base_dir` resolves paths.
Result<Scenario> parse_scenario_text(std::string_view text, std::string_view source,
                                     std::string_view base_dir = "");

/// Replaces the profile of `s`'s one node group with `profile` (`ref` names it, a built-in
/// name or a file), re-applying the cluster's overrides (nics_per_node, nic_gbps, wan):
/// `hetpar simulate --profile`. Errors: a cluster of several node groups, or overrides the
/// new profile cannot take; `s` is unchanged then.
Status replace_profile(Scenario& s, hardware::SystemProfile profile, std::string ref);

/// Checks that what the workload asks for fits the model: an encoder for each modality it
/// uses, modality tokens of a sample within seq_len. Errors name `workload.<field>`.
/// REQUIRES: the image-size override is already applied to `model` (the parser does it).
Status validate_workload(const models::ModelSpec& model, const Workload& w);

/// Tokens one image (one clip) of encoder `encoder_index` contributes to the fused LLM
/// sequence.
int64_t modality_tokens_per_item(const models::ModelSpec& model, size_t encoder_index);

/// Input of module `index` for `micro_batch` samples: LLM sequences of seq_len, encoder
/// batches of images (clips) per sample times micro_batch, projector tokens likewise.
models::ModuleInput module_input(const Scenario& s, size_t index, int64_t micro_batch);

/// The expert load a MoE module's op graph carries: what a rank's experts run in time (the
/// hottest EP rank's, Layout::moe_rank_load(); token dropping's padded capacity), the mean
/// (what memory holds: the hottest rank moves from layer to layer), or the routed tokens
/// alone, neither padded nor hot (model FLOPs).
enum class ExpertLoad { kTimed, kMean, kRouted };

/// The op graph of module `index` for one micro-batch of `l`: its size and attention kernel
/// (Layout::flash_attention), its experts at `load`.
models::OpGraph module_graph(const Scenario& s, size_t index, const Layout& l,
                             ExpertLoad load = ExpertLoad::kTimed);

/// What the memory model (memory.cpp) reads from an op's name, decided once per op graph
/// rather than compared for every op of every layout a search estimates.
struct OpNameTraits {
  bool routed_expert = false;      // "expert_*": a routed expert's op
  bool router = false;             // "router"
  bool moe_dispatch = false;       // "moe_dispatch"
  bool fp8_linear = false;         // is_fp8_linear() (memory.h)
  bool inside_tp = false;          // TP splits its saved tensors without SP (attention, loss,
                                   // attn_out, qk_norm, *act, *fc2)
  bool routed_fc1 = false;         // "expert_*fc1"
  bool shared_expert_fc1 = false;  // "shared_expert_fc1"
};

/// module_graph()'s results kept per module and graph input, for a caller that asks for
/// the graphs of many layouts of one scenario (a search thread's memory estimates: tens of
/// thousands of layouts share a handful of micro-batch sizes). Not thread-safe.
class ModuleGraphCache {
 public:
  /// module_graph(s, index, l, load), built on the first request for its input. REQUIRES:
  /// the same `s` on every call.
  const models::OpGraph& get(const Scenario& s, size_t index, const Layout& l, ExpertLoad load);
  /// get()'s graph with the OpNameTraits of each of its ops, found as the graph is built.
  struct WithTraits {
    const models::OpGraph& graph;
    std::span<const OpNameTraits> traits;
  };
  WithTraits get_with_traits(const Scenario& s, size_t index, const Layout& l, ExpertLoad load);
  /// Graphs built so far.
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    size_t index;
    models::ModuleInput input;
    std::unique_ptr<const models::OpGraph> graph;  // a stable address across insertions
    std::vector<OpNameTraits> traits;              // per op of *graph
  };
  Entry& entry(const Scenario& s, size_t index, const Layout& l, ExpertLoad load);
  const Scenario* scenario_ = nullptr;
  std::vector<Entry> entries_;
};

}  // namespace hetpar::planner
