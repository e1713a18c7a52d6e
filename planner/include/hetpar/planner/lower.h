// lower(): a Scenario and a Plan become the per-rank programs of one training iteration
// (sim::TaskGraph) and the cluster's network (network_builder.h), so sim::simulate()
// predicts the iteration. Every module runs under the plan's one layout (the homogeneous
// baseline): encoders and projectors sit on the first pipeline stage, before the LLM's
// embedding; the LLM's layers split evenly over pp·vpp virtual stages; final norm, logits
// and loss on the last.
//
// What runs (Megatron-LM; cost_model.h has the per-rank compute and comm sizes):
// - Ranks: rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i)). One compute stream per rank.
// - Each pipeline op (schedule.h) of a micro-batch on a chunk runs its blocks in order
//   (backward in reverse): one compute task per stretch of work between communication
//   points ("mb3 llm L12 fwd"; categories "fwd", "bwd", "wgrad" for ZB-H1's W passes,
//   "recompute" before a backward under selective or full recompute).
// - TP/EP collectives sit on the critical path: compute -> collective (comm stream 0) ->
//   next compute ("tp_comm", "ep_comm"). CP: ring attention, the attention core split
//   into cp parts, part j waiting for K,V ring step j-1 (P2P to the next cp rank on comm
//   streams 1/2), overlapping the rest ("cp_comm"; backward sends K,V and dK,dV).
//   cp_comm all_gather: K,V all-gathered over the cp group before the attention and again
//   before its backward, dK,dV reduce-scattered after it, all blocking (comm stream 0).
//   cp_comm a2a: all-to-alls over the cp group of Q, K, V before the attention and of its
//   output after; backward, of the output and its gradient before and of dQ, dK, dV after;
//   all blocking (comm stream 0). cp_comm a2a+p2p: those all-to-alls over groups of cp_a2a
//   adjacent cp ranks around the ring over the cp / cp_a2a ranks cp_a2a apart.
//   EP with Layout::moe_dispatcher deepep or hybridep over nodes: each all-to-all is one
//   over the EP group's GPUs of each node, beside one between its GPUs of one local index
//   across the nodes (each token once per other node holding one of its experts; comm
//   stream 11), the next compute waiting for both. Their limits (deepep.h: DeepEP's EP
//   sizes; whole nodes of 8 GPUs for either) are infeasibilities.
// - PP: after a chunk's forward (backward) each TP x CP rank sends s·b·h/cp to its peer
//   on the next (previous) virtual stage ("pp_comm", comm streams 3-6: one per direction
//   and side, so sends and receives keep each sender's order).
// - DP: buckets of consecutive layers (backward order, >= bucket_params local params,
//   Megatron's max(40M, 1M·dp·cp) by default; one set per chunk) reduced over the dp x cp
//   ranks (expert weights over the expert-dp ranks) on comm stream 7 ("dp_comm"):
//   all-reduce, or reduce-scatter with the distributed optimizer, in gradient_bytes() per
//   parameter. overlap_grad_reduce: a bucket starts when the last backward touching its
//   layers ends, or, with a pipeline and Layout::align_grad_reduce, when the schedule
//   launches its chunk's (interleaved: pp_rank backwards after the chunk's last; 1F1B: after
//   the schedule but on the first stage); otherwise after the rank's whole backward. Then
//   the optimizer step ("optimizer"): memory-bound passes over the rank's (sharded)
//   parameters, optimizer_traffic() bytes each. Distributed optimizer: all-gather of the
//   held parameters; without overlap_param_gather after the step, bucket by bucket; with
//   it beside the step's first forward (one chunk: a bucket's dispatched when the bucket
//   before it starts its forward, its first block waiting for it; interleaved: chunks 0 and
//   1 at the step's start, chunk c + 1 at the forward pp_rank places before chunk c's first,
//   so that the stages launch together), except in a colocated plan, where only the first
//   bucket's is simulated, after the step.
// - After the DP sync, the gradients of the parameters TP replicates but its ranks see apart
//   (Block::tp_synced: under SP the norms and the MoE router, and q/k norms) all-reduced
//   over TP in one buffer, which the optimizer step waits for ("tp_comm", comm stream 0;
//   Megatron-LM's _allreduce_layernorm_grads; torch FSDP2's DTensors reduce them in the
//   backward instead, not modelled).
// - Tied embeddings (LlmSpec::tied_embeddings) over a pipeline: then each
//   first-stage rank all-reduces its table's gradient (vocab / tp x hidden, gradient_bytes()
//   each) with the last-stage rank alike in tp, cp and dp, which keeps a copy of the table
//   for the output layer, on comm stream 10 ("dp_comm"), and both ranks' optimizer steps
//   wait for it (Megatron-LM's finalize_model_grads, _allreduce_word_embedding_grads; not
//   under torch FSDP2, whose trainers do not tie across stages).
// - FP8 delayed scaling (Fp8Recipe::kDelayed): each chunk's forward and backward of a
//   micro-batch end with Transformer Engine's amax all-reduce (MAX, a few bytes per GEMM)
//   over the stage's tp x cp x dp ranks (Megatron's amax reduction group), which the
//   compute stream waits for ("amax_comm", comm stream 0). FP8 current scaling with SP:
//   a blocking 4-byte all-reduce of the amax over the TP group before each gather in FP8
//   (WorkStep::amax_reduce).
// - Layout::defer_embedding_wgrad: the last stage's output-layer wgrads of the deferred
//   micro-batches run after its last op (each after its input's re-gather under SP), the
//   gradient reductions not waiting for them.
// Symmetry (LowerOptions::full_ranks = false, the default): the ranks of one pipeline stage
// (its TP, CP and DP peers) do the same work at the same times, so when the cluster makes
// them alike too (each stage on one node type, which may differ between stages; stages on
// whole nodes or several stages per node; CP rings inside a node or one member per node;
// EP groups on whole nodes) only one representative per stage (tp, cp, dp index 0) runs
// tasks, with multiplicity tp·cp·dp; its peers are mirrored ranks (sim/task_graph.h). A
// stage over several node types (without EP) whose DP replicas each lie on one type, each
// type's run aligned to its nodes, keeps one representative replica per class of replicas
// with the same type on every stage (the first of the class; multiplicity the ranks it
// stands for). Collectives keep their whole groups, so flows take every member's route,
// and name the stage's other groups (other TP groups, the TP peers' DP groups, the other
// ring edges and pipeline transfers) as copies, so links shared between them (NICs shared
// by the GPUs of a node) carry the whole stage's load. CP: the representative receives each K,V
// chunk from its ring predecessor, which sends once its own previous chunk arrived (as the
// representative's, by symmetry). Otherwise, or with full_ranks, every rank runs its own tasks.
// Both give the same prediction where the symmetry holds (tests/planner/symmetry_test.cpp), except,
// slightly, where pipeline transfers between nodes run beside DP collectives across the same nodes:
// the first task apart is a DP collective, faster among representatives (a task's copies
// load only the links its own flows cross, sim's weigh(), so a DP ring through a mirrored
// rank's NIC misses that rank's pipeline transfer: with the other replicas' transfers
// emptied, every rank predicts what the representatives do, to the picosecond), and the
// iteration differs by up to 2e-4 (NeMo 24.07 Llama 2 70B on 64 H100, PP4 VPP20 DP4:
// 4.44868 s against 4.44939 s every rank; the DGXC Llama 3.1 70B row 2e-5; six other
// validation rows to the picosecond).
// Heterogeneous placements (Plan::placement kColocated / kNonColocated, boundary.h for the
// data mapping and the boundary's communication): the LLM runs under plan.layout as above
// (without the encoders), each encoder with its projectors under its ModulePlan's layout
// as a program of its own (colocated: pp 1; non-colocated: pp >= 1, its layers split
// evenly over its stages, the first ones taking one more where pp does not divide them,
// its stem on the first stage, its last norm and projectors on the last):
// - categories "enc_fwd", "enc_bwd" (and "enc_recompute") for encoder compute, so metrics
//   show time by module; the boundary's tasks are "boundary_comm"; an encoder's collectives
//   use comm streams 8(k+1) .. 8(k+1)+7 (encoder k), the boundary its own streams after them;
// - the encoder acts as the leading pipeline stage (boundary.h's encoder_program): its
//   forward of a step runs before LLM stage 0 first needs it, its backward after stage 0's
//   backward of the step's last LLM micro-batch; every LLM stage-0 forward depends on the
//   arrival of its encoder output, every encoder backward on the arrival of its gradient;
// - colocated, LLM pp 1: the two programs interleave on each GPU's compute stream per
//   micro-batch (encoder forward, boundary, LLM forward and backward, boundary backward,
//   encoder backward); LLM pp > 1: three phases per GPU (every encoder forward of the local
//   batch, the LLM's pipeline, every encoder backward), the boundary moving data as
//   non-colocated does (a leader that is both sides: no transfer);
// - non-colocated: disjoint rank ranges (ModulePlan::first_rank, Plan::llm_first_rank);
//   the programs run concurrently, joined by leader P2P + broadcast from the encoder's last
//   stage (boundary.h's leading_stage_program: 1F1B over the encoder's pp stages and the
//   LLM's, the encoder's stages passing activations / gradients as the LLM's do);
// - Workload::frozen_encoders: no encoder backward, DP reduction, optimizer step or
//   boundary backward (the projector is treated as frozen with its encoder);
// - model FLOPs: each module's micro-batch graph x its micro-batches, the same total as the
//   homogeneous plan's (work does not depend on placement);
// - symmetry: where DP replicas of a module behave alike, the first replica of each class
//   runs tasks for its class (its tp = cp = 0 rank, peers mirrored; colocated three-phase:
//   every rank of it), and the boundary's transfers and collectives are emitted for the
//   simulated ranks, those of the other replicas of the class as copies. Classes: colocated
//   with LLM pp 1, one (every GPU runs the same program); three-phase (each LLM replica fed
//   from its own GPUs, boundary.h), LLM replicas alike, encoder replicas by the micro-batches
//   they feed (with LLM cp > 1 the representative replica runs its whole CP rings, the
//   other replicas' ring edges as copies, so the rings may straddle nodes as long as each
//   replica's tp x cp block sits alike on the nodes); non-colocated, LLM replicas by their place
//   among an encoder replica's fan-out destinations, encoder replicas by their fan-in index and the
//   class they feed. Needed besides: each module's stages node-aligned (as above) and, within a
//   class, the boundary leaders on the same GPU / node / other node alike; otherwise every
//   rank runs tasks. Predicts what full_ranks predicts: tests/planner/hetero_test.cpp
//   (HeteroSymmetry) finds the same iteration time (to the picosecond) and phase times on
//   colocated fan-in / fan-out / equal / CP, three-phase (also with LLM CP, whose rings
//   straddle nodes in one case), non-colocated fan-in / fan-out /
//   equal, frozen encoders, a pipelined encoder and two encoders; the bubble differs by
//   < 0.5 points (the leader's boundary P2P is its exposed communication while its
//   mirrored TP peers idle). A one-off randomized check of 350 feasible plans on 1-4 nodes
//   found the same iteration time everywhere but one interleaved three-phase plan on a
//   one-NIC node (7.5e-5 relative): there, as in the homogeneous reduction, a DP ring
//   shares links with mirrored ranks' transfers whose load only the representative sees.
//   The same holds in HeteroSymmetry's three-phase plan with FSDP in both modules: the LLM's
//   first layer's parameter all-gather (dp 2, inside a node) runs beside the boundary's
//   transfers of encoder outputs into the other LLM replica's leader, which load that
//   replica's links only when every rank runs (among representatives they are copies,
//   loading the links their representative's flows cross): dp_comm 1.2e-5 and the
//   iteration 1.7e-6 apart.
// Not modelled: the vocab-parallel loss's small all-reduces, the per-micro-batch loss
// averaging over DP some trainers run for logging (each under 0.05% of a step; validation
// round 29), and the K,V ring of a selectively recomputed CP attention. (SP's backward re-gather of
// a column-parallel linear's input is: regather_input in lower.cpp, beside the dgrad GEMM, since
// validation round 7.)
#pragma once

#include <cstdint>
#include <string>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/sim/network.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::planner {

/// HBM traffic of one optimizer step per parameter, as the trainers run it.
/// Megatron (megatron/optimizer/optimizer.py's MixedPrecisionOptimizer.step; Megatron-Core's
/// optimizer.py and distrib_optimizer.py alike), over the params the rank's optimizer owns:
/// the main grads taken from the gradient buffer (a view when it is fp32, else a cast copy:
/// buffer bytes read, 4 written); fp16 training's unscale and inf check (4 read, 4 written);
/// the gradient norm (multi_tensor_l2norm: 4 read; the clip's rescale runs only when the norm
/// exceeds clip_grad, which the host checks, so it is not charged); Adam (apex / TE
/// FusedAdam: fp32 weight, grad, m, v read, weight, m, v written: 28); the fp32 master
/// weights copied to the model's (4 read, weight_bytes written; fp8 weights are taken at
/// the bf16 write). Over every param the rank holds: the gradient buffer zeroed for the
/// next iteration (zero_grad_buffer; under FSDP the rank's shard of it). fp32 training
/// (FP32Optimizer): norm and Adam only.
/// PyTorch FSDP2 (torchtitan): sharded fp32 weights and grads, torch.nn.utils'
/// clip_grads_with_norm_ (norm 4 read; the clamped rescale always runs: 4 read, 4 written)
/// and fused AdamW (28); gradients set to None, not zeroed.
struct OptimizerTraffic {
  int64_t per_owned_param = 0;  // over the rank's optimizer shard (all it holds unsharded)
  int64_t per_held_param = 0;   // over every param the rank holds
};
OptimizerTraffic optimizer_traffic(const Layout& l, hardware::Precision p);

struct LowerOptions {
  /// Local parameters per DP bucket; 0 = Megatron's max(40M, 1M x dp·cp).
  int64_t bucket_params = 0;
  /// Simulate every rank instead of one representative per stage (see the top of this
  /// file); for tests that compare the two.
  bool full_ranks = false;
  /// Attach to every compute task the kernels it runs (sim/kernel.h, planner/kernels.h),
  /// for the executor; the simulator ignores them. Off by default (the planner's search
  /// does not need them).
  bool kernels = false;
  /// A graph whose arrays lower() refills (cleared first) instead of allocating a new one,
  /// e.g. the previous plan's (evaluate()'s Workspace); may be null. Left empty.
  sim::TaskGraph* reuse = nullptr;
};

struct LoweredPlan {
  sim::TaskGraph graph;
  sim::Network network{0};  // built from the scenario's cluster (network_builder)
  int world = 0;            // ranks of the cluster (the network's ranks)
  /// Whether one representative per stage runs tasks (the others mirrored); false when
  /// every rank does.
  bool representatives = false;
  int64_t micro_batches = 0;  // per DP replica
  /// Every module, 3x forward, no recompute, causal attention halved: models::model_flops
  /// of each module's micro-batch graph x micro-batches per iteration (global batch / mbs).
  Flops model_flops_per_iteration;
};

/// Why a plan cannot run, as a user reads it ("tp 3 does not divide llm heads 32");
/// empty when feasible. Memory is not checked here. Heterogeneous plans, besides the LLM's
/// layout: every encoder the workload feeds has one ModulePlan naming an encoder; encoder
/// cp = vpp = ep = 1, pp = 1 when colocated (non-colocated: pp <= its layers); tp in
/// {1, 2, 4, 8} for every module (Megatron's MIMO path) and
/// dividing the encoder's (and projector's) heads; encoder and LLM dp divide one another
/// and an encoder step splits into whole LLM micro-batches (boundary.h); colocated:
/// encoder tp x dp = world; non-colocated: rank ranges tile the world, first
/// ranks aligned to tp, LLM cp = 1.
std::string infeasibility(const Scenario& s, const Plan& p);
/// Whether each TP rank's query and key/value heads of `block` (latent attention: every
/// head its own key and value) divide over `ranks`, as an all-to-all over the heads needs
/// (cp_comm a2a, a2a+p2p; Transformer Engine asserts it).
bool heads_split(const models::TransformerSpec& block, int tp, int ranks);
/// The most elements infeasibility() lets one tensor of a micro-batch have (4 TiB in fp32,
/// more than any GPU holds): past it, counts of bytes in int64 could overflow.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

/// Whether lower() (without full_ranks) simulates one representative per class of alike
/// ranks rather than every rank — what decides the size of the task graph (a search skips
/// plans too large to simulate). REQUIRES: infeasibility(s, p) is empty.
bool simulates_representatives(const Scenario& s, const Plan& p);

/// Whether some node's ranks share its compute units (SystemProfile::shared_compute_units, a
/// CPU host): they slow each other only as far as they compute at once, so evaluate()
/// simulates every rank there (representatives would hide the others' load).
bool ranks_share_compute(const Scenario& s);

/// About how many tasks lower() builds for `p`, with one representative per class of alike
/// ranks or, with `every_rank` (LowerOptions::full_ranks) or on a cluster whose ranks share
/// compute (ranks_share_compute()), every rank: what evaluate() simulates, which costs
/// memory (~280 bytes a task) and time. An estimate: half what lower() builds for
/// Llama 3.1 405B's DGXC layout (11.5M of 24.3M at 4096 micro-batches), within 2x on
/// Lower.RefusesAPlanTooLargeToSimulate's. REQUIRES: infeasibility(s, p) is empty.
double estimated_tasks(const Scenario& s, const Plan& p, bool every_rank = false);

/// Errors (invalid argument): the plan is infeasible (the message of infeasibility()).
Result<LoweredPlan> lower(const Scenario& s, const Plan& p, const LowerOptions& o = {});

}  // namespace hetpar::planner
