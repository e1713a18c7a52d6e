// The lowering of a plan to tasks, private to the planner library: the Lowering class
// (one module set under one layout on its ranks) and what its three files share.
// lower.cpp builds each stage's program and runs its steps, lower_gradients.cpp the
// gradient reductions, FSDP, the optimizer step and the pipeline's blocking calls,
// lower_hetero.cpp heterogeneous plans (a Lowering per module, joined at boundaries).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

#include "hetpar/core/check.h"
#include "hetpar/models/totals.h"
#include "hetpar/planner/boundary.h"
#include "hetpar/planner/cost_model.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/kernels.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner::lowering {

using sim::CollectiveKind;
using sim::GroupId;

// Comm stream indices (compute tasks use compute stream 0).
// Offset by Role::stream_offset (a heterogeneous plan's encoders use their own streams).
constexpr int32_t kTpStreamBase = 0;  // TP and EP collectives
constexpr int32_t kCpSendBase = 1, kCpRecvBase = 2;
constexpr int32_t kFwdSendBase = 3, kFwdRecvBase = 4, kBwdSendBase = 5, kBwdRecvBase = 6;
constexpr int32_t kDpStreamBase = 7;
constexpr int32_t kFsdpGatherStreamBase = 8;  // FSDP's parameter all-gathers
constexpr int32_t kEpStreamBase = 9;          // EP all-to-alls under ep_comm_overlap
constexpr int32_t kEmbeddingStreamBase = 10;  // the tied table's first / last stage all-reduce
constexpr int32_t kEpRailStreamBase = 11;     // the flex dispatcher's transfers across nodes
constexpr int32_t kCommStreams = 12;          // a role's comm streams (Role::stream_offset)

enum Pass : int { kF = 0, kB = 1, kW = 2, kR = 3 };  // forward, backward, weight, recompute
constexpr std::string_view kPassName[] = {"fwd", "bwd", "wgrad", "recompute"};

// kMtp: an LLM's multi-token-prediction depths (ModuleCost::mtp), after kPost.
enum class Part : uint8_t { kPre, kLayer, kPost, kMtp };

// A block placed on a virtual stage.
struct PlacedBlock {
  size_t module = 0;
  Part part = Part::kLayer;
  std::string name;  // "llm L12", "vision pre"
  // A layer's kind (ModuleCost::layer_kind(): dense or not, windowed or not); 0 elsewhere.
  int kind = 0;
  // Layers' work (a transformer layer, or the multi-token-prediction depths): what
  // recompute replays.
  bool has_layers() const { return part == Part::kLayer || part == Part::kMtp; }
  // Which of its module's ModuleCost blocks it runs (cost_block()), one index per block,
  // below kCostBlocks: the part's, or for a layer of another kind than 0 one of its own.
  size_t cost_index() const {
    return kind > 0 ? 3 + static_cast<size_t>(kind) : static_cast<size_t>(part);
  }
};
inline constexpr size_t kCostBlocks = 7;

// The ModuleCost block `pb` runs.
inline const Block& cost_block(const ModuleCost& mc, const PlacedBlock& pb) {
  switch (pb.part) {
    case Part::kPre:
      return mc.pre;
    case Part::kLayer:
      return mc.kind_block(pb.kind);
    case Part::kPost:
      return mc.post;
    case Part::kMtp:
      break;
  }
  return mc.mtp;
}

// A block's steps as one direction runs them: without SP, "f" does nothing forward and
// "g" nothing backward; the compute steps they separated become one task.
Block for_direction(const Block& b, bool backward, bool sp);
ModuleCost for_direction(const ModuleCost& m, bool backward, bool sp);

// Symmetry reduction of one module of a heterogeneous plan (lower_heterogeneous decides
// it): DP replicas of one class behave alike, so the first replica of each class runs tasks
// for all of them. Every stage uses the same classes.
struct Reduction {
  std::vector<int> replica_class;  // per DP replica, a class id
  /// The representative replicas' every rank runs tasks (colocated three-phase, where an
  /// LLM TP group hosts encoder replicas of different classes); otherwise only their
  /// tp = cp = 0 rank, its TP x CP peers mirrored.
  bool whole_replicas = false;
};

// Owner of each local rank of a stage: the rank whose tasks stand for it (itself when it
// runs tasks).
std::vector<int> owners(const Layout& l, const Reduction& r);

// Whether ranks [first, first + n) of one pipeline stage of `l`, all on node group `g`, are
// alike: aligned to the group's nodes (whole nodes, or several such runs per node), and CP /
// EP groups with the same shape on every node (inside one node, or one member per node for
// CP's ring; whole nodes for EP). `whole_replicas` (every rank of a representative replica
// runs tasks, Reduction): CP rings of any shape, as long as each replica's tp x cp block has
// the same shape on the nodes as every other (whole nodes each, or several blocks per node).
bool run_aligned(const Scenario& s, const Layout& l, size_t g, int first, int n,
                 bool whole_replicas);

// The classes of alike DP replicas of `l` on ranks from `offset` (stage st on [offset + st·n,
// offset + (st + 1)·n), n = tp·cp·dp), or none where the cluster breaks the symmetry: two
// replicas are alike when each of their stages lies on the same node group, so that their
// compute and links are alike. A stage on one node group (of a mixed cluster, stages may
// lie on different groups, as a pipeline over A100 and H100 nodes) must be aligned to its
// nodes (run_aligned); a stage over several groups must have each replica's tp x cp block
// on one group and its run on each group aligned to that group's nodes (a colocated
// encoder's or a pp 1 LLM's DP replicas over A100 and H100 nodes). Classes are numbered in
// the order of their first replica.
std::optional<std::vector<int>> replica_classes(const Scenario& s, const Layout& l, int offset,
                                                bool whole_replicas = false);

// What one Lowering builds. The homogeneous plan: every module under the plan's layout on
// ranks [0, world). A heterogeneous plan lowers each encoder (with its projectors) and the
// LLM as separate Lowerings sharing one graph (lower_heterogeneous, lower_hetero.cpp).
struct Role {
  const Layout* layout = nullptr;               // null: the plan's
  std::vector<size_t> modules;                  // empty: every module the workload feeds
  int rank_offset = 0;                          // the first rank
  int32_t stream_offset = 0;                    // added to every comm stream index
  bool encoder_categories = false;              // "enc_fwd", "enc_bwd", ...
  bool frozen = false;                          // no backward, gradients or optimizer
  std::vector<std::vector<PipelineOp>> orders;  // per stage: these programs, not the schedule's
  std::string prefix;                           // prepended to optimizer / DP labels
  std::optional<Reduction> reduction;  // heterogeneous: representatives as given; none: all
};

class Lowering {
 public:
  Lowering(const Scenario& s, const Plan& p, const LowerOptions& o, LoweredPlan& out,
           Role role = {})
      : s_(s),
        p_(p),
        o_(o),
        role_(std::move(role)),
        l_(role_.layout ? *role_.layout : p.layout),
        out_(out),
        g_(out.graph),
        kTpStream(kTpStreamBase + role_.stream_offset),
        kCpSend(kCpSendBase + role_.stream_offset),
        kCpRecv(kCpRecvBase + role_.stream_offset),
        kFwdSend(kFwdSendBase + role_.stream_offset),
        kFwdRecv(kFwdRecvBase + role_.stream_offset),
        kBwdSend(kBwdSendBase + role_.stream_offset),
        kBwdRecv(kBwdRecvBase + role_.stream_offset),
        kDpStream(kDpStreamBase + role_.stream_offset),
        kFsdpGather(kFsdpGatherStreamBase + role_.stream_offset),
        kEpStream(kEpStreamBase + role_.stream_offset),
        kEmbeddingStream(kEmbeddingStreamBase + role_.stream_offset),
        kEpRailStream(kEpRailStreamBase + role_.stream_offset) {}
  void run();
  // run() in pieces, so a colocated plan can interleave two Lowerings' programs.
  void setup();
  void begin_stage(int stage);
  void op(size_t i);
  void end_stage();
  void finish();

  struct OpSpan {
    TaskId first, last;
  };
  const std::vector<PipelineOp>& order(int stage) const { return orders_[stage]; }
  // First / last task of op i of `stage` on local rank j, which runs tasks.
  const OpSpan& span(int stage, size_t i, int j) const {
    HETPAR_CHECK(slot_[j] >= 0, "span of a mirrored rank");
    return spans_[stage][i][slot_[j]];
  }
  bool simulated(int j) const { return slot_[j] >= 0; }
  int owner(int j) const { return owner_[j]; }
  RankId rank_of(int j, int stage) const {
    return RankId(role_.rank_offset + j + stage_ranks() * stage);
  }
  int stage_ranks() const { return l_.tp * l_.cp * l_.dp; }
  bool whole_replicas() const { return role_.reduction && role_.reduction->whole_replicas; }
  int64_t micro_batches() const { return m_; }

 private:
  struct Labels {
    bool ready = false;
    sim::LabelId compute, tp, ep, cp;
    // The shared experts' steps beside the all-to-alls (Layout::moe_shared_expert_overlap),
    // named apart in the trace: their compute and their TP collectives.
    sim::LabelId shared, shared_tp;
  };
  // Per local rank of the stage being built: what its next compute waits for (need: the
  // step's communication; gathered: FSDP's parameter all-gather), its last task.
  struct RankState {
    // beside: a transfer that ran beside `need` (DeepEP's transfers across nodes beside its
    // NVLink all-to-all), which the next compute waits for too. prefetched: Megatron-FSDP's
    // gather of the next block, issued early, which becomes `gathered` as that block starts.
    TaskId need, gathered, last, beside, prefetched;
    // Layout::moe_shared_expert_overlap (run_step): the last task before the latest
    // all-to-all; a run beside it: what it ended with (`side`, which the next compute waits
    // for too) and, while it runs, the need, last and beside it put aside.
    TaskId before_all_to_all, side;
    std::array<TaskId, 3> held;
  };
  // Groups of local ranks of the stage being built, interned; with copies of the first one
  // (the group holding the representative) when reduced.
  using GroupId = sim::GroupId;
  struct GroupSet {
    std::vector<GroupId> ids;
    std::vector<std::vector<int>> locals;
    std::vector<bool> emitted;    // has a member that runs tasks (all, unreduced)
    std::vector<GroupId> copies;  // per emitted group: the groups it stands for
  };

  void make_groups(GroupSet& gs, const std::vector<std::vector<int>>& locals);
  bool active(int j) const { return slot_[j] >= 0; }
  // The routed experts reduce (and FSDP shards them) over their own expert-DP group, not
  // with the dense parameters: with EP, or with whole experts replicated over the TP ranks.
  bool experts_apart() const { return l_.ep > 1 || l_.expert_tp() != l_.tp; }
  void build_costs();
  void place_blocks();
  void build_stage();
  void run_op(const PipelineOp& op, std::vector<OpSpan>& spans);
  // An op's work as pieces in program order: emit(ends_with_all_to_all, piece) for each,
  // piece() emitting its tasks under st_ (run at once by run_op, later by run_merged).
  template <class Emit>
  void op_pieces(const PipelineOp& op, Emit&& emit);
  // Ops i and i + 1 of the stage (a forward and a backward of different micro-batches,
  // Layout::ep_comm_overlap) as one: the backward's pieces up to and including its next
  // all-to-all, then the forward's, and so on, each op with its own RankState (and FSDP
  // prefetch point).
  void run_merged(size_t i);
  // spans[a]: the first task on active rank a among the tasks in `ranges`, and its st_.last.
  void record_spans(std::span<const std::pair<size_t, size_t>> ranges, std::vector<OpSpan>& spans);
  void run_step(const PlacedBlock& pb, size_t s, int pass, const Labels& lb,
                sim::LabelId recompute);
  // What run_step() does for one step, without a run beside an all-to-all's bookkeeping.
  void run_work(const PlacedBlock& pb, size_t s, int pass, const Labels& lb,
                sim::LabelId recompute);
  void compute(int j, Time d, Flops f, int pass, sim::LabelId name, sim::KernelListId kernels = {});
  // A kernel list for compute(): added to the graph with its host calls counted (compute()
  // charges the host per call of a task's list).
  sim::KernelListId add_kernel_list(std::span<const sim::Kernel> list);
  // Backward of a column-parallel linear after a TP entry (WorkStep::overlaps_tp_entry):
  // [SP: input all-gather beside] dgrad, then the entry's collective beside wgrad.
  void linear_backward(const PlacedBlock& pb, size_t s, const Labels& lb);
  // That linear's saved input slice all-gathered again under SP, into gathered[j], after
  // after[j] (after empty or after[j] invalid: the rank's last task); and its wgrad GEMM
  // after gathered[j].
  void regather_input(const PlacedBlock& pb, size_t s, sim::LabelId tp,
                      std::span<const TaskId> after, std::vector<TaskId>& gathered);
  void linear_wgrad(const PlacedBlock& pb, size_t s, sim::LabelId compute_label,
                    const std::vector<TaskId>& gathered);
  // Whether backward step s, a TP entry, is run by the linear after it (linear_backward).
  bool overlapped_entry(const PlacedBlock& pb, size_t s);
  // Layout::ep_comm_overlap (--delay-wgrad-compute): whether backward step s, a plain
  // compute step right before an EP all-to-all, runs only its dgrad, its wgrad beside the
  // all-to-all once that is issued (run_step's kEpAllToAll).
  bool delays_wgrad(const PlacedBlock& pb, size_t s);
  // Layout::recompute_modules "moe": the forward steps of a layer block's all-to-alls (and
  // of its shared experts' SP collectives), which its backward sends again before the
  // backward step `at` (the one after its last all-to-all, or the shared experts' TP exit);
  // none (at SIZE_MAX) without the module, or without expert parallelism and shared experts
  // under SP.
  struct MoeReplay {
    size_t at = SIZE_MAX;
    std::vector<size_t> steps;
  };
  MoeReplay moe_replay(const PlacedBlock& pb) const;
  // The "mlp" recompute module under TP (models::kRecomputeMlp), and "shared_experts" under
  // TP with SP: the dense MLP's (the shared experts') forward steps from its TP entry to its
  // TP exit (without SP, the exit alone), replayed before the exit's backward (`at`, in the
  // backward list, which splits steps the forward's merges); none (empty) without them.
  struct MlpReplay {
    size_t at = SIZE_MAX;       // a backward step
    std::vector<size_t> steps;  // forward steps
    std::vector<int32_t> ops;   // the graph ops of the replayed compute, sorted
    // Whether a backward step's work re-ran in the replay (its own cost.recompute is then not
    // charged again).
    bool covers(const WorkStep& step) const {
      return !step.ops.empty() && std::all_of(step.ops.begin(), step.ops.end(), [&](int32_t i) {
        return std::binary_search(ops.begin(), ops.end(), i);
      });
    }
  };
  MlpReplay mlp_replay(const PlacedBlock& pb) const;
  // The steps full recompute re-runs before a block's backward, as [first, end) ranges: all
  // of a layer's; of the multi-token-prediction block, each depth's checkpointed region
  // (Megatron-Core's MultiTokenPredictionLayer._checkpointed_forward: the norms, eh_proj,
  // the layer and the final norm, not the embedding lookup or the output head and loss).
  using StepRanges = std::vector<std::pair<size_t, size_t>>;
  StepRanges checkpointed(const PlacedBlock& pb) const;
  // A layers' block's replays (PlacedBlock::has_layers()), computed once per stage
  // (replays_, by module and cost block); none for the other blocks.
  struct Replays {
    MoeReplay moe;
    MlpReplay mlp;
    StepRanges checkpointed;
  };
  const Replays& replays(const PlacedBlock& pb);
  // FSDP (Layout::fsdp): an FSDP unit, the blocks whose parameters gather and reduce
  // together: one block, or with Layout::fsdp_root_unit the chunk's blocks outside the layers.
  struct FsdpUnit {
    std::vector<const PlacedBlock*> blocks;
    std::string name;  // "llm L12", "root"
  };
  FsdpUnit fsdp_unit(const PlacedBlock& pb) const { return {{&pb}, pb.name}; }
  // The chunk's root unit (Layout::fsdp_root_unit): its blocks that are not layers.
  FsdpUnit fsdp_root(const std::vector<PlacedBlock>& chunk) const;
  // The unit's parameter all-gather on each rank after `after[j]` (its next compute waits
  // for it; under FSDP2, Layout::torch_fsdp2, that is fsdp_copy_out); the bytes gathered.
  Bytes fsdp_gather(const FsdpUnit& u, const std::vector<TaskId>& after);
  // FSDP2's copy-out: the `gathered` flat buffer split into the unit's parameters by a
  // memory-bound kernel on the compute stream, before the unit runs.
  void fsdp_copy_out(const FsdpUnit& u, Bytes gathered, int pass);
  // The unit's gradient reduce-scatter after its last task; under FSDP2 after its copy-in.
  void fsdp_reduce(const FsdpUnit& u);
  // One memory-bound kernel moving `moved` bytes on each active rank's compute stream.
  void memory_pass(Bytes moved, int pass, sim::LabelId name);
  // Whether block b of a chunk (the layer before a post block counts as the model's last)
  // keeps the parameters its forward gathered until its backward though the layout
  // reshards: FSDP2's [final norm, output] unit, and with the root unit the root's blocks
  // and the last layer (torchtitan's reshard_after_forward policy).
  bool fsdp_kept_to_backward(const std::vector<PlacedBlock>& chunk, size_t b) const;
  // Returns the bytes of the collectives it emitted.
  template <class PartBytes, class OnRank>
  Bytes fsdp_collectives(const FsdpUnit& u, CollectiveKind kind, PartBytes&& bytes, int32_t stream,
                         std::string_view what, OnRank&& on_rank);
  // Parameters (a block's, a bucket's) by the group that reduces, gathers and shards them:
  // the dense ones over the dp x cp ranks, with the routed experts unless those are apart
  // (experts_apart()), which go over their expert-DP group. `prefix` names the part in labels.
  struct ParamPart {
    const GroupSet* group;
    ParamCount params;
    std::string_view prefix;
  };
  std::array<ParamPart, 2> param_parts(ParamCount dense, ParamCount expert) const {
    if (!experts_apart()) dense += std::exchange(expert, {});
    return {{{&dp_groups_, dense, ""}, {&edp_groups_, expert, "expert "}}};
  }
  // Bytes of weights as held (memory.h held_weight_bytes).
  Bytes held_bytes(const ParamCount& c) const {
    return Bytes(std::llround(held_weight_bytes(
        static_cast<double>(c.all), static_cast<double>(c.fp8), s_.workload.precision, l_)));
  }
  // What a compute task of a block step runs (LowerOptions::kernels; invalid when off).
  // kDgrad / kStepWgrad: one step's dgrad / wgrad kernels; kWgrad: the whole block's wgrad.
  enum class Use : uint8_t {
    kForward,
    kBackward,
    kRecompute,
    kWgrad,
    kRingForward,
    kRingBackward,
    // A causal ring's steps off the diagonal: the attention unmasked, all the queries
    // against the first half of the arrived chunk (Transformer Engine's
    // AttnFuncWithCPAndKVP2P; the ring's slowest rank's calls, op_cost).
    kRingForwardUnmasked,
    kRingBackwardUnmasked,
    kDgrad,
    kStepWgrad
  };
  sim::KernelListId kernels(const PlacedBlock& pb, size_t s, bool backward, Use use);
  // A blocking collective over each group of `gs` (TP, EP or CP) on the TP stream: it
  // waits for each member's last task, and the member's next task waits for it.
  void collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs);
  void collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs,
                  int32_t stream);
  // One collective per group of `gs` (reduced: only the representative's group, the others
  // as its copies), then on_rank(local index, task) for each active member.
  template <class OnRank>
  void group_collectives(const GroupSet& gs, CollectiveKind kind, Bytes bytes, int32_t stream,
                         sim::Label label, OnRank&& on_rank) {
    group_collectives(gs, kind, bytes, stream, label, /*copy_engine=*/false, on_rank);
  }
  template <class OnRank>
  void group_collectives(const GroupSet& gs, CollectiveKind kind, Bytes bytes, int32_t stream,
                         sim::Label label, bool copy_engine, OnRank&& on_rank,
                         bool registered = false);
  // The same for the data-parallel buffers' collectives (gradient reductions, the
  // distributed optimizer's and FSDP's parameter gathers): from NCCL-registered buffers
  // under Layout::nccl_ub.
  template <class OnRank>
  void dp_collectives(const GroupSet& gs, CollectiveKind kind, Bytes bytes, int32_t stream,
                      sim::Label label, OnRank&& on_rank) {
    group_collectives(gs, kind, bytes, stream, label, /*copy_engine=*/false, on_rank, l_.nccl_ub);
  }
  // Userbuffers (Layout::tp_comm_overlap): a TP collective that starts after each member's
  // last task without blocking its next one, moved by the copy engines (ring exchange) or by
  // the SMs the GEMM beside it leaves free (pipeline; the cost model charges them to the
  // GEMM), so it slows no compute itself; ring_[j] holds it.
  // `after_ring`: it also waits for the ring collective it replaces in ring_.
  void ring_collective(CollectiveKind kind, Bytes bytes, sim::LabelId name,
                       bool after_ring = false);
  // A ring-exchange linear (WorkStep::ring_exchange) as two tasks, its GEMM's chunks split:
  // column-parallel forward, the last chunk after the all-gather beside the others;
  // row-parallel forward, the exit's reduce-scatter but one chunk beside the chunks after
  // the first; backward, the dgrad's last chunk and the wgrad after the gradient's
  // all-gather.
  void ring_linear(const PlacedBlock& pb, size_t s, int pass, const Labels& lb);
  void cp_ring(const PlacedBlock& pb, size_t s, int pass, const Labels& lb);
  void pipeline_p2p(int stage);
  // Blocking transfers (Layout::pp_blocking_p2p): whether the lowering runs them, and whether
  // they follow Megatron's calls with their rendezvous, else a call after every op that
  // holds back only the sender's next op (zero-bubble, custom programs, the EP overlap).
  bool blocking() const { return l_.pp_blocking_p2p && l_.pp > 1; }
  bool rendezvous() const;
  void blocking_calls(int stage);
  void gradients_and_optimizer();
  // Layout::defer_embedding_wgrad: the output layer's wgrads the stage's backwards put off,
  // run after its last op (Megatron-Core's drain_embedding_wgrad_compute): under SP each
  // after re-gathering its saved input, the next all-gather beside the GEMM before it. The
  // schedule has launched the gradient reductions before (finish_embedding_wgrad_compute
  // follows "launch any remaining grad reductions"), so they do not wait for it; the
  // optimizer step follows it on the compute stream.
  void drain_deferred_wgrads();
  // DP gradient buckets of the stage (Megatron's DDP buckets): consecutive blocks of a chunk
  // in backward order, at least bucket_params local parameters each (the last block of a
  // chunk closes one); in readiness order, chunks backward, blocks backward.
  struct Bucket {
    int chunk = 0;
    size_t first = 0, last = 0;  // block range [first, last]
    ParamCount dense, expert;
  };
  std::vector<Bucket> dp_buckets() const;
  // Layout::align_grad_reduce: per chunk, the op of the stage after which the schedule
  // launches the chunk's gradient reductions (SIZE_MAX: each bucket as it becomes ready);
  // empty when not aligned.
  std::vector<size_t> grad_syncs() const;
  // Transformer Engine's delayed scaling (Fp8Recipe::kDelayed, its recipe's reduce_amax):
  // the amaxes an FP8 autocast region recorded are all-reduced (MAX) over Megatron's amax
  // reduction group, the stage's tp x cp x dp ranks, with async_op=False, so the compute
  // stream waits: forward, when the region (Megatron-Core's TransformerBlock, one chunk) is
  // left; backward, in the backward of its first FP8 module, the chunk's last
  // (fp8.py, reduce_and_update_fp8_tensors).
  bool reduces_amax() const {
    return s_.workload.precision == hardware::Precision::kFp8 &&
           l_.fp8_recipe == Fp8Recipe::kDelayed && !role_.frozen && stage_ranks() > 1;
  }
  // FP8 current scaling's amax all-reduce over the TP group before a gather in FP8
  // (WorkStep::amax_reduce), which the cast after it waits for.
  void reduce_tp_amax() {
    collective(CollectiveKind::kAllReduce, Bytes(4), {cat_amax_, amax_tp_}, tp_groups_);
  }
  // Megatron's overlap_param_gather with the distributed optimizer (not FSDP, which gathers
  // block by block): the step's parameter all-gathers run beside the first forward
  // micro-batch of each chunk, each bucket's first block waiting for its bucket's. One chunk
  // (Megatron-Core's forward pre-hooks): a bucket's all-gather is dispatched when the bucket
  // before it starts its forward. Interleaved (align_param_gather, which Megatron-LM sets by
  // default and NeMo with pp and vpp > 1: the schedule's param_sync_func): all buckets of
  // chunks 0 and 1 at the step's start, those of chunk c + 1 at the same time on every
  // stage: stage s launches them with its forward pp_rank = s places before chunk c's first
  // (schedules.py, "launch param synchronization for next model chunk": virtual micro-batch
  // k + pp_rank), which a pipeline running s forwards behind stage 0 starts when stage 0
  // starts chunk c. Not in a colocated plan, whose modules' phases share the ranks: there
  // the first bucket's all-gather keeps its place after the step.
  bool gathers_params_in_forward() const {
    return l_.distributed_optimizer && l_.overlap_param_gather && !l_.fsdp && !role_.frozen &&
           p_.placement != Placement::kColocated && l_.cp * l_.dp > 1;
  }
  // The all-gathers of buckets_[i] on the DP stream, after after[j] and the part before;
  // bucket_gathered_[i][j] is the last.
  void gather_bucket_params(size_t i, const std::vector<TaskId>& after);
  // The all-gathers of every bucket of `chunk` in forward order, after after[j].
  void gather_chunk_params(int chunk, const std::vector<TaskId>& after);
  const Labels& labels(int v, size_t block, int pass);

  // Local rank j's view of a block in one direction (backward for kB passes).
  const Block& block(int j, const PlacedBlock& pb, bool backward = false) const {
    return cost_block(costs_[backward][group_[j]][pb.module], pb);
  }
  RankId rank(int tp_i, int cp_i, int dp_i, int pp_i) const {
    return RankId(role_.rank_offset + tp_i + l_.tp * (cp_i + l_.cp * (dp_i + l_.dp * pp_i)));
  }

  const Scenario& s_;
  const Plan& p_;
  const LowerOptions& o_;
  const Role role_;
  const Layout& l_;
  LoweredPlan& out_;
  sim::TaskGraph& g_;
  const int32_t kTpStream, kCpSend, kCpRecv, kFwdSend, kFwdRecv, kBwdSend, kBwdRecv, kDpStream,
      kFsdpGather, kEpStream, kEmbeddingStream, kEpRailStream;
  bool has_llm_ = true;
  sim::LabelId cat_[4]{}, cat_tp_, cat_cp_, cat_pp_, cat_dp_, cat_ep_, cat_amax_, cat_opt_;
  sim::LabelId amax_fwd_, amax_bwd_, amax_tp_;  // the amax all-reduces' names
  int64_t m_ = 0;
  int vstages_ = 0;
  bool split_w_ = false;
  bool reduced_ = false;      // representatives run tasks for their peers (lower.h)
  std::vector<int> owner_;    // per local rank of a stage: the rank that stands for it
  std::vector<int> actives_;  // local ranks that run tasks, ascending
  std::vector<int> slot_;     // per local rank: its index in actives_, -1 when mirrored

  std::vector<std::vector<ModuleCost>> costs_[2];  // [backward][node group][module]
  std::vector<int> group_of_rank_;
  std::vector<std::string> module_names_;
  std::vector<models::OpGraph> graphs_;          // per module, in build_costs()' order
  std::vector<std::optional<Replays>> replays_;  // per module x kCostBlocks: replays()
  // The host (sim/task_graph.h "Host"), per node group its time per issued kernel or call
  // (SystemProfile::host_op); on when a group has one. It issues compute tasks and
  // collectives in the order they are emitted, which is each rank's program order (a
  // heterogeneous plan emits a colocated encoder's ops just before the LLM op they precede,
  // the three phases one after another, non-colocated modules on ranks of their own). Not
  // host-issued: P2P transfers (pipeline transfers are emitted after all compute; a CP
  // ring step's grouped send and receive are two tasks per rank when every rank is
  // simulated but one for a representative) and the boundary's tasks (emitted after both
  // modules).
  std::vector<Time> host_op_;
  bool host_ = false;
  std::vector<bool> cp_split_;  // per module: whether cp splits its tokens
  std::map<std::tuple<size_t, int, size_t, bool, int>, sim::KernelListId> kernel_ids_;
  std::vector<int32_t> list_calls_;               // per kernel list of kernels(): its host calls
  std::vector<std::vector<PlacedBlock>> chunks_;  // per virtual stage, forward order
  std::vector<std::vector<Labels>> labels_;       // per virtual stage: [block][pass]
  std::vector<std::vector<PipelineOp>> orders_;   // per stage
  std::vector<std::vector<std::vector<OpSpan>>> spans_;  // [stage][op][j]
  // Per virtual stage and direction (2v forward, 2v + 1 backward): the label of the TP
  // all-gather of a scatter/gather pipeline transfer's pieces (Layout::pp_scatter_gather).
  std::vector<sim::LabelId> pp_gather_names_;

  // The stage being built.
  int stage_ = 0;
  std::vector<int> group_;  // node group of local rank j
  std::vector<RankState> st_;
  // Per op of the stage (Layout::ep_comm_overlap): 1 runs merged with the op after it,
  // 2 ran merged with the op before it, 0 alone.
  std::vector<uint8_t> merge_;
  // Per local rank: the userbuffers collective running beside a ring-exchange linear, which
  // the task after the linear (or the exit's tail) waits for (Layout::tp_comm_overlap).
  std::vector<TaskId> ring_;
  std::vector<std::vector<std::vector<TaskId>>> last_grad_;  // [chunk][block][j]
  // FSDP, per local rank: what the next block's all-gather follows (the task before the
  // block ahead of it started; the distributed optimizer's bucket all-gathers likewise), and
  // the last gradient reduce-scatter.
  std::vector<TaskId> fsdp_after_, fsdp_reduced_;
  // The stage's DP buckets (dp_buckets()), for the forward's parameter all-gathers, and per
  // bucket and local rank the last of its all-gather's tasks (invalid: not emitted yet).
  std::vector<Bucket> buckets_;
  std::vector<std::vector<TaskId>> bucket_gathered_;
  // The micro-batch of the backward being emitted; the output-layer wgrads the stage's
  // backwards deferred (block, step, labels).
  int64_t backward_mb_ = 0;
  struct DeferredWgrad {
    const PlacedBlock* pb = nullptr;
    size_t s = 0;
    sim::LabelId compute, tp;
  };
  std::vector<DeferredWgrad> deferred_;
  // Interleaved: the forward (chunk, micro-batch) that launches a chunk's all-gathers.
  struct ParamSync {
    int at_chunk = 0;
    int64_t at_micro_batch = 0;
    int chunk = 0;
  };
  std::vector<ParamSync> param_syncs_;
  std::vector<RankId> members_;
  GroupSet tp_groups_, ep_groups_, cp_groups_, dp_groups_, edp_groups_, amax_groups_;
  // The flex dispatcher (moe_dispatcher deepep or hybridep) with EP groups across nodes:
  // each EP group's members on one node
  // (NVLink all-to-all), and its members of one local index, one per node (the transfers
  // across nodes); flex_rail_per_byte_: the across-node all-to-all's bytes per byte of the
  // plain all-to-all's buffer (see run_step). Empty / 0 otherwise. flex_nvlink_per_byte_:
  // with the flex dispatcher, inside a node or across, the NVLink all-to-all's
  // (deepep_nvlink_share);
  // 1 otherwise.
  GroupSet ep_node_groups_, ep_rail_groups_;
  double flex_rail_per_byte_ = 0;
  double flex_nvlink_per_byte_ = 1;
  // Per active rank (reduced, leaders only): its ring step's pairs, the other edges it
  // stands for.
  std::vector<GroupId> cp_pairs_, cp_copies_;
  // Reduced with whole replicas: per local rank of a representative replica, the same
  // ring edge (from it to its CP successor) in the replicas it stands for.
  std::vector<GroupId> cp_edge_copies_;
  std::vector<std::vector<int32_t>> op_index_;  // pipeline_p2p: [stage][kind, chunk, mb]
  // pipeline_p2p, for blocking_calls: [stage][op * actives + active index] the transfer of
  // the op's output (sent_) and of its input (received_).
  std::vector<std::vector<TaskId>> sent_, received_;
  // Per stage and active index: the work the trainer issues after the pipeline's last op,
  // which blocking transfers (Layout::pp_blocking_p2p) hold back until the last one is sent.
  struct AfterPipeline {
    TaskId optimizer;
    TaskId reduction;  // the first gradient reduction, when not overlapped with the backward
  };
  std::vector<std::vector<AfterPipeline>> after_pipeline_;
  // Tied embeddings over a pipeline (tied_embedding_all_reduce): per local rank of the
  // first stage, what its table's gradient is final after, and its optimizer step.
  std::vector<std::pair<TaskId, TaskId>> embedding_ready_;
  std::vector<TaskId> embedding_opt_;
  // Whether the LLM's output layer shares the embedding's table across stages: Megatron-LM
  // keeps a copy of it on the last stage and all-reduces the two copies' gradients.
  bool ties_embedding() const;
  // Megatron-LM's finalize_model_grads (_allreduce_word_embedding_grads), after the DP
  // gradient sync: the whole local table's main_grad all-reduced between each first-stage
  // rank and the last-stage rank alike in tp, cp and dp (the embedding group), on its own
  // communicator's stream. On the first stage: keeps what the table's gradient is final
  // after (after[j], the rank's last task) and returns nothing; on the last stage: emits
  // the all-reduces, makes the first stage's optimizer steps (embedding_opt_) wait for
  // them and returns them per local rank for the last stage's.
  std::vector<TaskId> tied_embedding_all_reduce(const std::vector<TaskId>& after);
};

// Defined here: lower_gradients.cpp emits collectives too.
// A TP collective over each TP group, or (ep) an all-to-all over each EP group: ep
// consecutive positions of the (cp, dp) index with the same tp rank.
// Reduced: only the group holding the representative, with the others as copies.
template <class OnRank>
void Lowering::group_collectives(const GroupSet& gs, CollectiveKind kind, Bytes bytes,
                                 int32_t stream, sim::Label label, bool copy_engine,
                                 OnRank&& on_rank, bool registered) {
  for (size_t k = 0; k < gs.ids.size(); ++k) {
    if (!gs.emitted[k]) continue;
    sim::CollectiveSpec spec;
    spec.kind = kind;
    spec.group_id = gs.ids[k];
    spec.bytes = bytes;
    spec.stream = stream;
    spec.copies = gs.copies[k];
    spec.copy_engine = copy_engine;
    spec.registered = registered;
    const TaskId c = g_.add_collective(spec, label);
    if (host_) g_.set_host(c, host_op_[group_[gs.locals[k].front()]]);
    for (int j : gs.locals[k])
      if (active(j)) on_rank(j, c);
  }
}

// Symmetry reduction of a heterogeneous plan (lower.h): the classes of alike DP replicas of
// each module, and every GPU's multiplicity; none where the placement breaks the symmetry
// (every rank is then simulated).
struct HeteroReduction {
  Reduction llm;
  std::vector<Reduction> encoders;
  std::vector<int32_t> multiplicity;  // per GPU
};

std::optional<HeteroReduction> hetero_reduction(const Scenario& s, const Plan& p,
                                                const std::vector<Boundary>& bounds);

// Colocated and non-colocated plans (boundary.h has the mapping and the communication).
// Each encoder and the LLM are Lowerings of their own modules on their own ranks, joined by
// boundary tasks; where the placement keeps DP replicas alike, representatives stand for
// their classes (hetero_reduction), and the boundary's transfers and collectives are
// emitted for the simulated ranks only, the rest as copies.
void lower_heterogeneous(const Scenario& s, const Plan& p, const LowerOptions& o, LoweredPlan& out);

}  // namespace hetpar::planner::lowering
