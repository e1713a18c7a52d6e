#include "hetpar/planner/lower.h"

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
#include "hetpar/planner/memory.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner {

using sim::CollectiveKind;
using sim::GroupId;

OptimizerTraffic optimizer_traffic(const Layout& l, hardware::Precision p) {
  constexpr int64_t kAdam = 28, kNorm = 4;
  if (l.torch_fsdp2()) return {kNorm + 8 + kAdam, 0};
  const int64_t gb = gradient_bytes(p, l.grad_reduce_dtype);
  if (p == hardware::Precision::kFp32 || p == hardware::Precision::kTf32)
    return {kNorm + kAdam, gb};
  int64_t owned = kNorm + kAdam + 4 + weight_bytes(p);
  if (gb != 4) owned += gb + 4;                     // main grads cast to fp32
  if (p == hardware::Precision::kFp16) owned += 8;  // unscale and inf check
  // FSDP's gradient buffer is the shard itself.
  return l.fsdp ? OptimizerTraffic{owned + gb, 0} : OptimizerTraffic{owned, gb};
}

namespace {

// Comm stream indices (compute tasks use compute stream 0).
// Offset by Role::stream_offset (a heterogeneous plan's encoders use their own streams).
constexpr int32_t kTpStreamBase = 0;  // TP and EP collectives
constexpr int32_t kCpSendBase = 1, kCpRecvBase = 2;
constexpr int32_t kFwdSendBase = 3, kFwdRecvBase = 4, kBwdSendBase = 5, kBwdRecvBase = 6;
constexpr int32_t kDpStreamBase = 7;
constexpr int32_t kFsdpGatherStreamBase = 8;  // FSDP's parameter all-gathers
constexpr int32_t kEpStreamBase = 9;          // EP all-to-alls under ep_comm_overlap
constexpr int32_t kEmbeddingStreamBase = 10;  // the tied table's first / last stage all-reduce
constexpr int32_t kEpRailStreamBase = 11;     // DeepEP's transfers across nodes (moe_dispatcher)
constexpr int32_t kCommStreams = 12;          // a role's comm streams (Role::stream_offset)

enum Pass : int { kF = 0, kB = 1, kW = 2, kR = 3 };  // forward, backward, weight, recompute
constexpr std::string_view kPassName[] = {"fwd", "bwd", "wgrad", "recompute"};

enum class Part : uint8_t { kPre, kLayer, kPost };

// A block placed on a virtual stage.
struct PlacedBlock {
  size_t module = 0;
  Part part = Part::kLayer;
  std::string name;  // "llm L12", "vision pre"
};

// A block's steps as one direction runs them: without SP, "f" does nothing forward and
// "g" nothing backward; the compute steps they separated become one task.
Block for_direction(const Block& b, bool backward, bool sp) {
  Block out = b;
  out.steps.clear();
  for (const WorkStep& s : b.steps) {
    if (!sp && s.kind == (backward ? StepKind::kTpExit : StepKind::kTpEntry)) continue;
    // Backward keeps a linear that overlaps its TP entry's collective a task of its own;
    // both directions a ring-exchange linear (userbuffers).
    const bool after_ring = !out.steps.empty() && out.steps.back().ring_exchange;
    const bool apart = s.ring_exchange || after_ring ||
                       (backward && (s.overlaps_tp_entry ||
                                     (!out.steps.empty() && out.steps.back().overlaps_tp_entry)));
    if (s.kind == StepKind::kCompute && !out.steps.empty() &&
        out.steps.back().kind == StepKind::kCompute && !apart) {
      out.steps.back().cost += s.cost;
      out.steps.back().ops.insert(out.steps.back().ops.end(), s.ops.begin(), s.ops.end());
    } else
      out.steps.push_back(s);
  }
  return out;
}

ModuleCost for_direction(const ModuleCost& m, bool backward, bool sp) {
  ModuleCost out = m;
  out.pre = for_direction(m.pre, backward, sp);
  out.layer = for_direction(m.layer, backward, sp);
  out.post = for_direction(m.post, backward, sp);
  return out;
}

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
std::vector<int> owners(const Layout& l, const Reduction& r) {
  const int block = l.tp * l.cp;
  std::vector<int> first_of_class;
  std::vector<int> rep(static_cast<size_t>(l.dp));
  for (int d = 0; d < l.dp; ++d) {
    const int c = r.replica_class[static_cast<size_t>(d)];
    if (c >= static_cast<int>(first_of_class.size())) first_of_class.resize(c + 1, -1);
    if (first_of_class[c] < 0) first_of_class[c] = d;
    rep[d] = first_of_class[c];
  }
  std::vector<int> out(static_cast<size_t>(block) * l.dp);
  for (int j = 0; j < static_cast<int>(out.size()); ++j)
    out[j] = rep[j / block] * block + (r.whole_replicas ? j % block : 0);
  return out;
}

// Whether ranks [first, first + n) of one pipeline stage of `l`, all on node group `g`, are
// alike: aligned to the group's nodes (whole nodes, or several such runs per node), and CP /
// EP groups with the same shape on every node (inside one node, or one member per node for
// CP's ring; whole nodes for EP). `whole_replicas` (every rank of a representative replica
// runs tasks, Reduction): CP rings of any shape, as long as each replica's tp x cp block has
// the same shape on the nodes as every other (whole nodes each, or several blocks per node).
bool run_aligned(const Scenario& s, const Layout& l, size_t g, int first, int n,
                 bool whole_replicas) {
  const int block = l.tp * l.cp;
  const int gpn = s.cluster.groups()[g].profile.gpus_per_node;
  if (n % gpn != 0 && gpn % n != 0) return false;
  if ((first - s.cluster.group_first_gpu(g)) % std::min(n, gpn) != 0) return false;
  if (n <= gpn) return true;
  const int per_node = gpn / l.tp;  // (cp, dp) positions per node
  if (whole_replicas && block % gpn != 0 && gpn % block != 0) return false;
  if (!whole_replicas && l.cp > 1 && per_node % l.cp != 0 && per_node != 1) return false;
  if (l.ep > 1 && per_node % l.ep != 0 && l.ep % per_node != 0) return false;
  return true;
}

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
                                                bool whole_replicas = false) {
  const int n = l.tp * l.cp * l.dp;
  const int block = l.tp * l.cp;
  bool spans = false;  // some stage over several groups: replicas may differ
  for (int st = 0; st < l.pp; ++st) {
    const int first = offset + st * n;
    const hardware::ClusterSpec::GroupRange on = s.cluster.groups_of_gpus(first, n);
    if (on.size() == 0) return std::nullopt;
    spans = spans || on.size() > 1;
    for (size_t g = on.begin; g < on.end; ++g) {
      const int from = std::max(first, s.cluster.group_first_gpu(g));
      const int to = g + 1 < s.cluster.groups().size()
                         ? std::min(first + n, s.cluster.group_first_gpu(g + 1))
                         : first + n;
      // A replica's block straddling two groups, or EP groups (of replicas) that might.
      if (on.size() > 1 && (l.ep > 1 || (from - first) % block != 0 || (to - first) % block != 0))
        return std::nullopt;
      if (!run_aligned(s, l, g, from, to - from, whole_replicas)) return std::nullopt;
    }
  }
  // Every stage on one group (the usual case, evaluated plan after plan): one class.
  if (!spans) return std::vector<int>(static_cast<size_t>(l.dp), 0);
  std::map<std::vector<size_t>, int> ids;  // the group of each stage -> class
  std::vector<int> out;
  std::vector<size_t> key(static_cast<size_t>(l.pp));
  for (int d = 0; d < l.dp; ++d) {
    for (int st = 0; st < l.pp; ++st) key[st] = s.cluster.group_of_gpu(offset + st * n + d * block);
    out.push_back(ids.emplace(key, static_cast<int>(ids.size())).first->second);
  }
  return out;
}

// What one Lowering builds. The homogeneous plan: every module under the plan's layout on
// ranks [0, world). A heterogeneous plan lowers each encoder (with its projectors) and the
// LLM as separate Lowerings sharing one graph (lower_heterogeneous below).
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
  };
  // Per local rank of the stage being built: what its next compute waits for (need: the
  // step's communication; gathered: FSDP's parameter all-gather), its last task.
  struct RankState {
    // beside: a transfer that ran beside `need` (DeepEP's transfers across nodes beside its
    // NVLink all-to-all), which the next compute waits for too.
    TaskId need, gathered, last, beside;
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
                         sim::Label label, bool copy_engine, OnRank&& on_rank);
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
    const ModuleCost& mc = costs_[backward][group_[j]][pb.module];
    return pb.part == Part::kPre ? mc.pre : pb.part == Part::kLayer ? mc.layer : mc.post;
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
  std::vector<models::OpGraph> graphs_;  // per module (LowerOptions::kernels or host_)
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
  // moe_dispatcher deepep with EP groups across nodes: each EP group's members on one node
  // (NVLink all-to-all), and its members of one local index, one per node (the transfers
  // across nodes); deepep_rail_per_byte_: the across-node all-to-all's bytes per byte of the
  // plain all-to-all's buffer (see run_step). Empty / 0 otherwise.
  GroupSet ep_node_groups_, ep_rail_groups_;
  double deepep_rail_per_byte_ = 0;
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

void Lowering::run() {
  setup();
  for (int st = 0; st < l_.pp; ++st) {
    begin_stage(st);
    for (size_t i = 0; i < orders_[st].size(); ++i) op(i);
    end_stage();
  }
  finish();
}

void Lowering::setup() {
  static constexpr std::string_view kEncName[] = {"enc_fwd", "enc_bwd", "enc_wgrad",
                                                  "enc_recompute"};
  for (int pass = 0; pass < 4; ++pass)
    cat_[pass] = g_.label(role_.encoder_categories ? kEncName[pass] : kPassName[pass]);
  cat_tp_ = g_.label("tp_comm");
  cat_cp_ = g_.label("cp_comm");
  cat_pp_ = g_.label("pp_comm");
  cat_dp_ = g_.label("dp_comm");
  cat_ep_ = g_.label("ep_comm");
  cat_amax_ = g_.label("amax_comm");
  amax_fwd_ = g_.label(fmt::format("{}fp8 amax all_reduce fwd", role_.prefix));
  amax_bwd_ = g_.label(fmt::format("{}fp8 amax all_reduce bwd", role_.prefix));
  amax_tp_ = g_.label(fmt::format("{}fp8 amax all_reduce tp", role_.prefix));
  cat_opt_ = g_.label("optimizer");
  // What each comm stream carries, for the trace's track names.
  const std::pair<int32_t, std::string_view> streams[] = {
      {kTpStream, l_.ep > 1 && !l_.ep_comm_overlap ? "tp / ep collectives" : "tp collectives"},
      {kCpSend, "cp ring send"},
      {kCpRecv, "cp ring recv"},
      {kFwdSend, "pp activations send"},
      {kFwdRecv, "pp activations recv"},
      {kBwdSend, "pp gradients send"},
      {kBwdRecv, "pp gradients recv"},
      {kDpStream, "dp / fsdp gradient reductions"},
      {kFsdpGather, "fsdp parameter gathers"},
      {kEpStream, "ep all-to-alls"},
      {kEmbeddingStream, "tied embedding gradient all-reduce"},
      {kEpRailStream, "ep deepep transfers across nodes"}};
  for (const auto& [index, what] : streams)
    g_.set_stream_name(sim::StreamKind::kComm, index, fmt::format("{}{}", role_.prefix, what));
  m_ = s_.workload.global_batch / (static_cast<int64_t>(l_.micro_batch) * l_.dp);
  vstages_ = l_.pp * l_.vpp;
  split_w_ = role_.orders.empty() && splits_weight_gradient(p_.schedule);
  if (role_.modules.empty()) {  // the homogeneous plan: the whole world
    out_.world = l_.world();
    out_.micro_batches = m_;
    out_.network = build_network(s_.cluster);
  }
  const int n = stage_ranks();
  std::optional<std::vector<int>> classes;
  if (role_.modules.empty()) {
    if (!o_.full_ranks) classes = replica_classes(s_, l_, 0);
    reduced_ = classes.has_value();
    out_.representatives = reduced_;
  } else {
    reduced_ = role_.reduction.has_value();  // lower_heterogeneous sets multiplicities
  }
  if (reduced_) {
    owner_ = owners(l_, role_.modules.empty() ? Reduction{*classes, false} : *role_.reduction);
  } else {
    owner_.resize(n);
    for (int j = 0; j < n; ++j) owner_[j] = j;
  }
  slot_.assign(n, -1);
  actives_.clear();
  for (int j = 0; j < n; ++j)
    if (owner_[j] == j) {
      slot_[j] = static_cast<int>(actives_.size());
      actives_.push_back(j);
    }
  if (reduced_ && role_.modules.empty()) {  // each owner stands for the ranks it owns
    std::vector<int32_t> count(static_cast<size_t>(n), 0);
    for (int j = 0; j < n; ++j) ++count[static_cast<size_t>(owner_[j])];
    for (int st = 0; st < l_.pp; ++st)
      for (int j = 0; j < n; ++j) g_.set_multiplicity(rank_of(j, st), count[j]);
  }
  build_costs();
  place_blocks();
  orders_.resize(l_.pp);
  spans_.resize(l_.pp);
  for (int st = 0; st < l_.pp; ++st)
    orders_[st] = !role_.orders.empty() ? role_.orders[st]
                                        : stage_order(p_.schedule, st, l_.pp, l_.vpp, m_,
                                                      extra_warmup(l_), microbatch_group(l_));
}

void Lowering::begin_stage(int stage) {
  stage_ = stage;
  deferred_.clear();
  build_stage();
  buckets_ = gathers_params_in_forward() ? dp_buckets() : std::vector<Bucket>();
  bucket_gathered_.assign(buckets_.size(), std::vector<TaskId>(stage_ranks()));
  // Interleaved: chunks 0 and 1 gathered at the step's start, before (and so outside) the
  // first op, whose first task the pipeline's receive would otherwise hold back.
  param_syncs_.clear();
  if (!buckets_.empty() && l_.vpp > 1) {
    const std::vector<TaskId> start(stage_ranks());
    gather_chunk_params(0, start);
    gather_chunk_params(1, start);
    std::vector<const PipelineOp*> forwards;
    for (const PipelineOp& op : orders_[stage])
      if (op.kind == PassKind::kForward) forwards.push_back(&op);
    for (int c = 1; c + 1 < l_.vpp; ++c)
      for (size_t f = 0; f < forwards.size(); ++f)
        if (forwards[f]->chunk == c && forwards[f]->micro_batch == 0) {
          const PipelineOp& at = *forwards[f - std::min<size_t>(f, static_cast<size_t>(stage))];
          param_syncs_.push_back({at.chunk, at.micro_batch, c + 1});
          break;
        }
  }
  // Megatron-Core's combined 1F1B (Layout::ep_comm_overlap): each forward that the
  // schedule puts next to a backward of another micro-batch runs merged with it (the
  // steady state; pp 1: the backward of micro-batch k with the forward of k + 1).
  const std::vector<PipelineOp>& order = orders_[stage];
  merge_.assign(order.size(), 0);
  if (l_.ep_comm_overlap && !role_.frozen)
    for (size_t i = 0; i + 1 < order.size();) {
      const PipelineOp &a = order[i], &b = order[i + 1];
      const bool pair = a.kind != b.kind && a.kind != PassKind::kWeight &&
                        b.kind != PassKind::kWeight && a.micro_batch != b.micro_batch;
      if (!pair) {
        ++i;
        continue;
      }
      merge_[i] = 1;
      merge_[i + 1] = 2;
      i += 2;
    }
}

void Lowering::end_stage() {
  drain_deferred_wgrads();
  if (!role_.frozen) gradients_and_optimizer();
  if (stage_ == 0 && l_.pp > 1) {  // stages are alike in size: room for the rest
    const double scale = 1.05 * l_.pp;
    g_.reserve(static_cast<size_t>(g_.num_tasks() * scale),
               static_cast<size_t>(static_cast<double>(g_.num_stream_refs()) * scale),
               static_cast<size_t>(static_cast<double>(g_.num_dependencies()) * scale * 1.2));
  }
}

void Lowering::op(size_t i) {
  if (merge_[i] == 2) return;  // run_merged(i - 1) ran it
  if (merge_[i] == 1) return run_merged(i);
  run_op(orders_[stage_][i], spans_[stage_][i]);
}

void Lowering::finish() {
  if (blocking()) {  // pipeline_p2p records the transfers the calls move
    const size_t na = actives_.size();
    sent_.resize(l_.pp);
    received_.resize(l_.pp);
    for (int st = 0; st < l_.pp; ++st) {
      sent_[st].assign(orders_[st].size() * na, TaskId());
      received_[st].assign(orders_[st].size() * na, TaskId());
    }
  }
  for (int stage = 0; stage < l_.pp; ++stage) pipeline_p2p(stage);
  if (blocking())
    for (int stage = 0; stage < l_.pp; ++stage) blocking_calls(stage);
}

// Reduced: a group without a member that runs tasks is a copy of the group holding the
// owner of its first member (groups of one set partition the stage's ranks).
void Lowering::make_groups(GroupSet& gs, const std::vector<std::vector<int>>& locals) {
  gs.ids.clear();
  gs.locals = locals;
  gs.emitted.assign(locals.size(), !reduced_);
  gs.copies.assign(locals.size(), GroupId());
  for (size_t k = 0; k < locals.size(); ++k) {
    members_.clear();
    for (int j : locals[k]) members_.push_back(rank_of(j, stage_));
    gs.ids.push_back(g_.add_group(members_));
  }
  if (!reduced_) return;
  std::vector<int> group_of(static_cast<size_t>(stage_ranks()), -1);
  for (size_t k = 0; k < locals.size(); ++k)
    for (int j : locals[k]) {
      group_of[j] = static_cast<int>(k);
      if (active(j)) gs.emitted[k] = true;
    }
  std::vector<std::vector<RankId>> copies(locals.size());
  for (size_t k = 0; k < locals.size(); ++k) {
    if (gs.emitted[k]) continue;
    const int o = group_of[owner_[locals[k][0]]];
    HETPAR_CHECK(o >= 0 && gs.emitted[o], "a copied group without an emitted owner");
    for (int j : locals[k]) copies[o].push_back(rank_of(j, stage_));
  }
  for (size_t k = 0; k < locals.size(); ++k)
    if (!copies[k].empty()) gs.copies[k] = g_.add_group(copies[k]);
}

// Modules in execution order (encoders the workload feeds, each followed by its
// projector, then the LLM); their graphs give the model FLOPs and, per GPU type, costs.
void Lowering::build_costs() {
  const models::ModelSpec& model = s_.model;
  std::vector<size_t> order;
  for (size_t i = 0; i < model.modules.size() && role_.modules.empty(); ++i) {
    if (!models::is_encoder(models::kind_of(model.modules[i].spec))) continue;
    if (module_input(s_, i, l_.micro_batch).items_per_sample < 1) continue;
    order.push_back(i);
    for (const models::Edge& e : model.edges)
      if (e.from == i &&
          models::kind_of(model.modules[e.to].spec) == models::ModuleKind::kProjector)
        order.push_back(e.to);
  }
  if (role_.modules.empty())
    order.push_back(model.llm_index());
  else
    order = role_.modules;
  has_llm_ = order.back() == model.llm_index();

  std::vector<models::OpGraph> graphs;
  for (size_t i : order) {
    graphs.push_back(module_graph(s_, i, l_));
    // Model FLOPs count the routed tokens, not a token-dropping layout's padding.
    Layout dropless = l_;
    dropless.moe_capacity_factor = 0;
    const Flops flops = l_.moe_capacity_factor > 0
                            ? models::model_flops(module_graph(s_, i, dropless))
                            : models::model_flops(graphs.back());
    out_.model_flops_per_iteration += flops * static_cast<double>(m_ * l_.dp);
    module_names_.push_back(model.modules[i].name);
    cp_split_.push_back(i == model.llm_index());
  }
  for (const hardware::NodeGroup& group : s_.cluster.groups()) {
    host_op_.push_back(group.profile.host_op);
    host_ = host_ || group.profile.host_op > Time::zero();
    std::vector<ModuleCost>& fwd = costs_[0].emplace_back();
    std::vector<ModuleCost>& bwd = costs_[1].emplace_back();
    for (size_t k = 0; k < graphs.size(); ++k) {
      const ModuleCost mc = module_cost(graphs[k], l_, order[k] == model.llm_index(),
                                        group.profile.gpu, s_.workload.precision);
      fwd.push_back(for_direction(mc, false, l_.sequence_parallel));
      bwd.push_back(for_direction(mc, true, l_.sequence_parallel));
    }
  }
  if (o_.kernels || host_) graphs_ = std::move(graphs);
  group_of_rank_.clear();
  const auto& groups = s_.cluster.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    group_of_rank_.insert(group_of_rank_.end(),
                          static_cast<size_t>(groups[gi].nodes) * groups[gi].profile.gpus_per_node,
                          static_cast<int>(gi));
}

void Lowering::place_blocks() {
  chunks_.assign(vstages_, {});
  const std::vector<ModuleCost>& mc = costs_[0][0];  // the block structure is GPU-independent
  const size_t llm = has_llm_ ? mc.size() - 1 : mc.size();
  auto place = [&](int v, size_t module, Part part, std::string name) {
    const Block& b = part == Part::kPre     ? mc[module].pre
                     : part == Part::kLayer ? mc[module].layer
                                            : mc[module].post;
    if (!b.empty()) chunks_[v].push_back({module, part, std::move(name)});
  };
  // The LLM's layers over the virtual stages (even or uneven split, schedule.h); other
  // modules whole on the first. An encoder's own pipeline (non-colocated, pp > 1): its
  // layers split evenly over its stages (the first ones taking one more when pp does not
  // divide them, as memory.h), its stem on the first, its last norm and projectors on the
  // last (the boundary leaves from there).
  const size_t split_module = has_llm_ ? llm : 0;
  const int64_t split_layers = mc[split_module].layers;
  std::vector<int64_t> split;
  if (has_llm_) {
    split = layers_per_virtual_stage(l_, split_layers, nullptr);
  } else {
    for (int v = 0; v < vstages_; ++v)
      split.push_back(split_layers / vstages_ + (v < split_layers % vstages_ ? 1 : 0));
  }
  HETPAR_CHECK(!split.empty(), "infeasible pipeline split reached lower()");
  for (size_t k = 0; k < mc.size(); ++k) {
    const std::string& name = module_names_[k];
    const bool split_here = k == split_module;
    const int home = !has_llm_ && k > 0 ? vstages_ - 1 : 0;  // projectors: the last stage
    place(home, k, Part::kPre, name + " pre");
    int v = split_here ? 0 : home;
    int64_t end = split_here ? split[0] : mc[k].layers;
    for (int64_t i = 0; i < mc[k].layers; ++i) {
      while (split_here && i >= end && v + 1 < vstages_) end += split[++v];
      place(v, k, Part::kLayer, fmt::format("{} L{}", name, i));
    }
    place(split_here ? vstages_ - 1 : home, k, Part::kPost, name + " post");
  }
  labels_.assign(vstages_, {});
  for (int v = 0; v < vstages_; ++v) labels_[v].resize(chunks_[v].size() * 4);
}

// Names per (virtual stage, block, pass), not per micro-batch: the trace's timeline tells
// micro-batches apart, and a graph does not hold a string per task.
const Lowering::Labels& Lowering::labels(int v, size_t block, int pass) {
  Labels& lb = labels_[v][block * 4 + pass];
  if (lb.ready) return lb;
  const std::string base = fmt::format("{} {}", chunks_[v][block].name, kPassName[pass]);
  lb.compute = g_.label(base);
  lb.tp = g_.label(base + " tp");
  lb.ep = g_.label(base + " all-to-all");
  lb.cp = g_.label(base + " kv ring");
  lb.ready = true;
  return lb;
}

sim::KernelListId Lowering::kernels(const PlacedBlock& pb, size_t s, bool backward, Use use) {
  if (!o_.kernels && !host_) return {};
  const auto key =
      std::make_tuple(pb.module, static_cast<int>(pb.part), s, backward, static_cast<int>(use));
  if (auto it = kernel_ids_.find(key); it != kernel_ids_.end()) return it->second;
  const models::OpGraph& g = graphs_[pb.module];
  const bool cp_split = cp_split_[pb.module];
  std::vector<sim::Kernel> list;
  // One ring step's share of an attention kernel (the local queries against one rank's K,V
  // chunk, 1/cp of the keys) or of a memory pass (1/cp of its bytes); false for a GEMM,
  // which each use below sizes itself.
  auto ring_share = [&](sim::Kernel& k) {
    if (k.kind == sim::KernelKind::kGemm) return false;
    if (k.kind == sim::KernelKind::kMemory)
      k.bytes /= l_.cp;
    else
      k.seq_kv /= l_.cp;
    return true;
  };
  const bool ring = cp_split && l_.cp > 1 && l_.cp_comm == CpComm::kP2P;
  auto add = [&](const WorkStep& step) {
    for (int32_t i : step.ops) {
      const OpKernels k = op_kernels(g.ops[i], g, l_, cp_split, s_.workload.precision);
      if (use == Use::kRecompute && ring && g.ops[i].kind == models::OpKind::kAttention) {
        // Recomputed attention re-runs the ring: cp calls, each with its own memory passes
        // (the cost model times it so, cost_model.cpp).
        for (const sim::Kernel& x : k.recompute) {
          sim::Kernel chunk = x;
          if (ring_share(chunk))
            list.insert(list.end(), static_cast<size_t>(l_.cp), chunk);
          else
            list.push_back(x);
        }
        continue;
      }
      switch (use) {
        case Use::kForward:
        case Use::kRingForward:
          list.insert(list.end(), k.forward.begin(), k.forward.end());
          break;
        case Use::kBackward:
        case Use::kRingBackward:
          list.insert(list.end(), k.dgrad.begin(), k.dgrad.end());
          if (!split_w_) list.insert(list.end(), k.wgrad.begin(), k.wgrad.end());
          break;
        case Use::kRecompute:
          list.insert(list.end(), k.recompute.begin(), k.recompute.end());
          break;
        case Use::kWgrad:
        case Use::kStepWgrad:
          list.insert(list.end(), k.wgrad.begin(), k.wgrad.end());
          break;
        case Use::kDgrad:
          list.insert(list.end(), k.dgrad.begin(), k.dgrad.end());
          break;
      }
    }
  };
  if (use == Use::kWgrad) {
    for (const WorkStep& step : block(0, pb).steps) add(step);
  } else {
    add(block(0, pb, backward || use == Use::kStepWgrad || use == Use::kDgrad).steps[s]);
  }
  if (use == Use::kRingForward || use == Use::kRingBackward) {
    for (sim::Kernel& k : list)
      if (!ring_share(k)) k.batch = std::max<int64_t>(1, k.batch / l_.cp);
  }
  const sim::KernelListId id = add_kernel_list(list);
  kernel_ids_.emplace(key, id);
  return id;
}

sim::KernelListId Lowering::add_kernel_list(std::span<const sim::Kernel> list) {
  const sim::KernelListId id = g_.add_kernels(list);
  int32_t calls = 0;
  for (const sim::Kernel& k : list) calls += static_cast<int32_t>(k.launches);
  if (list_calls_.size() <= static_cast<size_t>(id.value())) list_calls_.resize(id.value() + 1);
  list_calls_[id.value()] = calls;
  return id;
}

void Lowering::compute(int j, Time d, Flops f, int pass, sim::LabelId name,
                       sim::KernelListId kernels) {
  const TaskId t = g_.add_compute(rank_of(j, stage_), 0, d, f, {cat_[pass], name});
  if (kernels.valid() && o_.kernels) g_.set_kernels(t, kernels);
  if (host_) {  // one issue per host call of its kernels (a task without a kernel list: one)
    const int32_t n = kernels.valid() ? list_calls_[kernels.value()] : 1;
    g_.set_host(t, host_op_[group_[j]] * n, false, std::max(n, 1));
  }
  RankState& rs = st_[j];
  if (rs.need.valid()) g_.add_dependency(rs.need, t);
  if (rs.gathered.valid()) g_.add_dependency(rs.gathered, t);
  if (rs.beside.valid()) g_.add_dependency(rs.beside, t);
  rs.need = rs.gathered = rs.beside = TaskId();
  rs.last = t;
}

// A TP collective over each TP group, or (ep) an all-to-all over each EP group: ep
// consecutive positions of the (cp, dp) index with the same tp rank.
// Reduced: only the group holding the representative, with the others as copies.
template <class OnRank>
void Lowering::group_collectives(const GroupSet& gs, CollectiveKind kind, Bytes bytes,
                                 int32_t stream, sim::Label label, bool copy_engine,
                                 OnRank&& on_rank) {
  for (size_t k = 0; k < gs.ids.size(); ++k) {
    if (!gs.emitted[k]) continue;
    sim::CollectiveSpec spec;
    spec.kind = kind;
    spec.group_id = gs.ids[k];
    spec.bytes = bytes;
    spec.stream = stream;
    spec.copies = gs.copies[k];
    spec.copy_engine = copy_engine;
    const TaskId c = g_.add_collective(spec, label);
    if (host_) g_.set_host(c, host_op_[group_[gs.locals[k].front()]]);
    for (int j : gs.locals[k])
      if (active(j)) on_rank(j, c);
  }
}

void Lowering::collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs) {
  collective(kind, bytes, label, gs, kTpStream);
}

void Lowering::collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs,
                          int32_t stream) {
  group_collectives(gs, kind, bytes, stream, label, [&](int j, TaskId c) {
    RankState& rs = st_[j];
    if (rs.last.valid()) g_.add_dependency(rs.last, c);
    rs.need = rs.last = c;
  });
}

void Lowering::ring_collective(CollectiveKind kind, Bytes bytes, sim::LabelId name,
                               bool after_ring) {
  group_collectives(tp_groups_, kind, bytes, kTpStream, {cat_tp_, name}, /*copy_engine=*/true,
                    [&](int j, TaskId c) {
                      if (st_[j].last.valid()) g_.add_dependency(st_[j].last, c);
                      if (after_ring && ring_[j].valid()) g_.add_dependency(ring_[j], c);
                      ring_[j] = c;
                    });
}

void Lowering::ring_linear(const PlacedBlock& pb, size_t s, int pass, const Labels& lb) {
  const bool backward = pass == kB;
  const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
  // Chunks [from, to) of a GEMM of `chunks` equal ones taking `t` and `f`, as one task.
  auto chunks_of = [&](int j, Time t, Flops f, int64_t chunks, int64_t from, int64_t to,
                       sim::KernelListId k, int run_pass) {
    auto at = [&](int64_t c) { return c == chunks ? t : Time::ps(t.count_ps() / chunks * c); };
    compute(j, at(to) - at(from), f * (static_cast<double>(to - from) / chunks), run_pass,
            lb.compute, k);
  };
  // All chunks but the last, then the last after the ring collective beside them.
  auto last_waits = [&](int j, Time t, Flops f, sim::KernelListId k, int run_pass) {
    chunks_of(j, t, f, l_.tp, 0, l_.tp - 1, k, run_pass);
    st_[j].need = std::exchange(ring_[j], TaskId());
    chunks_of(j, t, f, l_.tp, l_.tp - 1, l_.tp, k, run_pass);
  };
  if (!backward && steps[s].overlaps_tp_entry) {
    // Column-parallel: chunk i computes on the i-th slice of the all-gather beside it (its
    // TP entry, run_step); every chunk but the last has its slice in time, the last waits
    // for the whole gather.
    const sim::KernelListId k = kernels(pb, s, false, Use::kForward);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      last_waits(j, c.forward, c.forward_flops, k, pass);
    }
    return;
  }
  HETPAR_CHECK(s + 1 < steps.size() && steps[s + 1].kind == StepKind::kTpExit,
               "a ring-exchange row-parallel linear precedes a TP exit");
  const Bytes exit = steps[s + 1].bytes;
  if (!backward) {
    // Row-parallel: the partial sums of all chunks but the last move while the later chunks
    // compute, from the first chunk's end; the last chunk's reduce-scatter (the exit,
    // run_step) follows the GEMM.
    const int64_t chunks = steps[s].exit_chunks;
    const sim::KernelListId k = kernels(pb, s, false, Use::kForward);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      chunks_of(j, c.forward, c.forward_flops, chunks, 0, 1, k, pass);
    }
    ring_collective(CollectiveKind::kReduceScatter, exit * (chunks - 1) / chunks, lb.tp);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      chunks_of(j, c.forward, c.forward_flops, chunks, 1, chunks, k, pass);
    }
    return;
  }
  // The exit's backward (run_step) started the gradient's all-gather beside this dgrad,
  // whose last chunk waits for it, as the wgrad does.
  const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    last_waits(j, c.dgrad, c.dgrad_flops, kd, kB);
  }
  if (split_w_) return;  // the W pass runs the wgrad
  const sim::KernelListId kw = kernels(pb, s, true, Use::kStepWgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    compute(j, c.wgrad, c.wgrad_flops, kB, lb.compute, kw);
  }
}

// Ring attention over each cp group: attention part i runs once the K,V chunk of ring step
// i-1 has arrived; step i forwards the chunk received at step i-1 to the next cp rank.
void Lowering::cp_ring(const PlacedBlock& pb, size_t s, int pass, const Labels& lb) {
  const int cp = l_.cp;
  const bool backward = pass == kB;
  const Bytes bytes = block(0, pb, backward).steps[s].bytes * (backward ? 2 : 1);
  const sim::KernelListId part =
      kernels(pb, s, backward, backward ? Use::kRingBackward : Use::kRingForward);
  std::vector<TaskId> arrived(cp), next(cp);
  if (reduced_ && !whole_replicas()) {
    // Each representative (q = 0) computes; each ring step it sends K,V to q = 1 and
    // receives them from q = cp-1 (both mirrored) as one grouped transfer, once its
    // previous chunk arrived (and the sender's, by symmetry). Both flows are simulated so
    // that the representative's links carry its sends and receives; every other ring edge
    // of the replicas it stands for is a copy.
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int j = actives_[a];
      TaskId in;
      for (int i = 0; i < cp; ++i) {
        const PassCost& c = block(j, pb, backward).steps[s].cost;
        if (i > 0) st_[j].need = in;
        compute(j, Time::ps((backward ? c.dgrad : c.forward).count_ps() / cp),
                (backward ? c.dgrad_flops : c.forward_flops) / cp, pass, lb.compute, part);
        if (i + 1 == cp) break;
        const TaskId x = g_.add_p2p_group(cp_pairs_[a], bytes, kCpSend, kCpRecv, {cat_cp_, lb.cp},
                                          cp_copies_[a]);
        if (i > 0) g_.add_dependency(in, x);
        in = x;
      }
    }
    return;
  }
  // Every rank of the ring runs tasks (full ranks, or a representative replica whose
  // ring edges stand for those of its class: cp_edge_copies_).
  for (int dp_i = 0; dp_i < l_.dp; ++dp_i)
    for (int t = 0; t < l_.tp; ++t) {
      auto local = [&](int q) { return t + l_.tp * (q + cp * dp_i); };
      if (slot_[local(0)] < 0) continue;  // a mirrored replica
      for (int i = 0; i < cp; ++i) {
        for (int q = 0; q < cp; ++q) {
          const int j = local(q);
          const PassCost& c = block(j, pb, backward).steps[s].cost;
          if (i > 0) st_[j].need = arrived[q];
          compute(j, Time::ps((backward ? c.dgrad : c.forward).count_ps() / cp),
                  (backward ? c.dgrad_flops : c.forward_flops) / cp, pass, lb.compute, part);
        }
        if (i + 1 == cp) break;
        for (int q = 0; q < cp; ++q) {
          const int to = (q + 1) % cp;
          const TaskId x =
              g_.add_p2p(rank(t, q, dp_i, stage_), rank(t, to, dp_i, stage_), bytes, kCpSend,
                         kCpRecv, {cat_cp_, lb.cp}, cp_edge_copies_[local(q)]);
          if (i > 0) g_.add_dependency(arrived[q], x);
          next[to] = x;
        }
        std::swap(arrived, next);
      }
    }
}

bool Lowering::delays_wgrad(const PlacedBlock& pb, size_t s) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  if (!l_.ep_comm_overlap || split_w_ || s == 0 || s >= steps.size() ||
      steps[s - 1].kind != StepKind::kEpAllToAll)
    return false;
  // A plain compute step: not one that ring_linear() or linear_backward() runs.
  const WorkStep& step = steps[s];
  return step.kind == StepKind::kCompute && !(step.ring_exchange && step.overlaps_tp_exit) &&
         !step.overlaps_tp_entry;
}

bool Lowering::overlapped_entry(const PlacedBlock& pb, size_t s) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  return !split_w_ && s + 1 < steps.size() && steps[s + 1].overlaps_tp_entry;
}

void Lowering::linear_backward(const PlacedBlock& pb, size_t s, const Labels& lb) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  HETPAR_CHECK(s > 0 && steps[s - 1].kind == StepKind::kTpEntry,
               "a linear that overlaps its TP entry follows one");
  const bool sp = l_.sequence_parallel;
  const Bytes bytes = steps[s - 1].bytes;
  const int n = stage_ranks();
  // Layout::defer_embedding_wgrad: the output layer's wgrad (and its input's re-gather)
  // waits for the drain; the first wgrad_deferral_limit micro-batches (0: all).
  const bool defer = steps[s].output_layer && l_.defer_embedding_wgrad &&
                     (l_.wgrad_deferral_limit == 0 || backward_mb_ < l_.wgrad_deferral_limit);
  if (defer) deferred_.push_back({&pb, s, lb.compute, lb.tp});
  std::vector<TaskId> gathered(n), dgrad(n), reduced(n);
  if (sp && !defer) regather_input(pb, s, lb.tp, {}, gathered);
  const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    compute(j, c.dgrad, c.dgrad_flops, kB, lb.compute, kd);
    dgrad[j] = st_[j].last;
  }
  group_collectives(tp_groups_, sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
                    bytes, kTpStream, {cat_tp_, lb.tp}, [&](int j, TaskId c) {
                      g_.add_dependency(dgrad[j], c);
                      reduced[j] = c;
                    });
  if (!defer) linear_wgrad(pb, s, lb.compute, gathered);
  // The layer's earlier backward takes the reduced gradient.
  for (int j : actives_) st_[j].need = reduced[j];
}

void Lowering::regather_input(const PlacedBlock& pb, size_t s, sim::LabelId tp,
                              std::span<const TaskId> after, std::vector<TaskId>& gathered) {
  const Bytes bytes = block(0, pb, true).steps[s - 1].gather_bytes;
  group_collectives(tp_groups_, CollectiveKind::kAllGather, bytes, kTpStream, {cat_tp_, tp},
                    [&](int j, TaskId c) {
                      const TaskId a = !after.empty() && after[j].valid() ? after[j] : st_[j].last;
                      if (a.valid()) g_.add_dependency(a, c);
                      gathered[j] = c;
                    });
}

void Lowering::linear_wgrad(const PlacedBlock& pb, size_t s, sim::LabelId compute_label,
                            const std::vector<TaskId>& gathered) {
  const sim::KernelListId kw = kernels(pb, s, true, Use::kStepWgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    st_[j].need = gathered[j];
    compute(j, c.wgrad, c.wgrad_flops, kB, compute_label, kw);
  }
}

void Lowering::drain_deferred_wgrads() {
  const int n = stage_ranks();
  std::vector<TaskId> previous(n), gathered(n);
  for (const DeferredWgrad& d : deferred_) {
    // Each all-gather after the one before, so it runs beside the GEMM before it.
    if (l_.sequence_parallel) regather_input(*d.pb, d.s, d.tp, previous, gathered);
    linear_wgrad(*d.pb, d.s, d.compute, gathered);
    previous = gathered;
  }
}

// Each of the unit's FSDP shard groups in turn (param_parts: dense, then experts apart), for
// groups of two ranks or more; bytes(params) for its part, called right before the part's
// collectives are emitted (it may emit the compute they follow); on_rank(j, task, previous part's
// task on j or invalid).
template <class PartBytes, class OnRank>
Bytes Lowering::fsdp_collectives(const FsdpUnit& u, CollectiveKind kind, PartBytes&& bytes,
                                 int32_t stream, std::string_view what, OnRank&& on_rank) {
  ParamCount dense, expert;  // the unit's blocks' together
  for (const PlacedBlock* pb : u.blocks) {
    dense += block(0, *pb).dense;
    expert += block(0, *pb).expert;
  }
  std::vector<TaskId> previous(st_.size()), current(st_.size());
  Bytes total;
  for (const ParamPart& part : param_parts(dense, expert)) {
    const GroupSet& gs = *part.group;
    if (part.params.all == 0 || gs.locals.empty() || gs.locals[0].size() < 2) continue;
    const sim::LabelId name =
        g_.label(fmt::format("{}fsdp {} {}{} {} stage {}", role_.prefix, sim::to_string(kind),
                             part.prefix, what, u.name, stage_));
    const Bytes b = bytes(part.params);
    group_collectives(gs, kind, b, stream, {cat_dp_, name}, [&](int j, TaskId c) {
      on_rank(j, c, previous[j]);
      current[j] = c;
    });
    previous = current;
    total += b;
  }
  return total;
}

Lowering::FsdpUnit Lowering::fsdp_root(const std::vector<PlacedBlock>& chunk) const {
  FsdpUnit u{{}, "root"};
  for (const PlacedBlock& pb : chunk)
    if (pb.part != Part::kLayer) u.blocks.push_back(&pb);
  return u;
}

bool Lowering::fsdp_kept_to_backward(const std::vector<PlacedBlock>& chunk, size_t b) const {
  if (!l_.torch_fsdp2()) return false;
  const Part part = chunk[b].part;
  if (part == Part::kPost) return true;
  if (!l_.fsdp_root_unit) return false;
  if (part == Part::kPre) return true;
  return b + 1 < chunk.size() && chunk[b + 1].part == Part::kPost &&
         chunk[b + 1].module == chunk[b].module;
}

Bytes Lowering::fsdp_gather(const FsdpUnit& u, const std::vector<TaskId>& after) {
  // The unit's compute waits for the last gather (rs.gathered).
  return fsdp_collectives(
      u, CollectiveKind::kAllGather, [&](const ParamCount& c) { return held_bytes(c); },
      kFsdpGather, "params",
      [&](int j, TaskId c, TaskId previous) {
        if (after[j].valid()) g_.add_dependency(after[j], c);
        if (previous.valid()) g_.add_dependency(previous, c);
        st_[j].gathered = c;
      });
}

void Lowering::fsdp_copy_out(const FsdpUnit& u, Bytes gathered, int pass) {
  if (gathered.count() == 0) return;
  // Read the flat buffer, write the parameters.
  memory_pass(
      gathered + gathered, pass,
      g_.label(fmt::format("{}fsdp copy-out params {} stage {}", role_.prefix, u.name, stage_)));
}

void Lowering::memory_pass(Bytes moved, int pass, sim::LabelId name) {
  sim::KernelListId k;
  if (o_.kernels) {
    const sim::Kernel copy = sim::memory_kernel(moved.count());
    k = add_kernel_list({&copy, 1});
  }
  for (int j : actives_) {
    const hardware::DeviceProfile& dev = s_.cluster.groups()[group_[j]].profile.gpu;
    compute(j, dev.memory_kernel_time(moved), Flops(), pass, name, k);
  }
}

void Lowering::fsdp_reduce(const FsdpUnit& u) {
  const int64_t gb = gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype);
  // FSDP2's copy-in (foreach_reduce_scatter_copy_in, on the current stream before the
  // reduce-scatter stream waits for it): the part's unsharded gradients, in the parameters'
  // compute dtype, copied (cast) into the flat reduce-scatter buffer in the reduce dtype.
  const int64_t wb = weight_bytes(s_.workload.precision);
  const sim::LabelId copy_in =
      l_.torch_fsdp2()
          ? g_.label(fmt::format("{}fsdp copy-in grads {} stage {}", role_.prefix, u.name, stage_))
          : sim::LabelId();
  auto part_bytes = [&](const ParamCount& c) {
    if (l_.torch_fsdp2()) memory_pass(Bytes(c.all * (wb + gb)), kB, copy_in);
    return Bytes(c.all * gb);
  };
  fsdp_collectives(u, CollectiveKind::kReduceScatter, part_bytes, kDpStream, "grads",
                   [&](int j, TaskId c, TaskId previous) {
                     if (st_[j].last.valid()) g_.add_dependency(st_[j].last, c);
                     if (previous.valid()) g_.add_dependency(previous, c);
                     fsdp_reduced_[j] = c;
                   });
}

void Lowering::run_step(const PlacedBlock& pb, size_t s, int pass, const Labels& lb,
                        sim::LabelId recompute) {
  const bool sp = l_.sequence_parallel;
  const bool backward = pass == kB;
  const WorkStep& step = block(0, pb, backward).steps[s];
  switch (step.kind) {
    case StepKind::kCompute:
    case StepKind::kCpAttention: {
      const bool gather = step.kind == StepKind::kCpAttention && l_.cp_comm == CpComm::kAllGather;
      // All-gather CP (Megatron's --cp-comm-type all_gather): K,V gathered over the cp group
      // before the attention, forward and again before its backward (only the local chunk
      // is kept), which waits for them; dK,dV reduce-scattered back to their owners after
      // it. step.bytes is one rank's K,V chunk.
      if (gather)
        collective(CollectiveKind::kAllGather, step.bytes * l_.cp, {cat_cp_, lb.cp}, cp_groups_);
      if (backward && step.cost.recompute > Time::zero()) {  // selective recompute
        const sim::KernelListId k = kernels(pb, s, true, Use::kRecompute);
        for (int j : actives_) {
          const PassCost& c = block(j, pb, true).steps[s].cost;
          compute(j, c.recompute, c.recompute_flops, kR, recompute, k);
        }
      }
      if (step.kind == StepKind::kCpAttention && !gather) return cp_ring(pb, s, pass, lb);
      if (step.ring_exchange && (step.overlaps_tp_exit || !backward))
        return ring_linear(pb, s, pass, lb);
      if (backward && step.overlaps_tp_entry && !split_w_) return linear_backward(pb, s, lb);
      if (backward && delays_wgrad(pb, s)) {  // the wgrad runs beside the all-to-all after it
        const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
        for (int j : actives_) {
          const PassCost& c = block(j, pb, true).steps[s].cost;
          compute(j, c.dgrad, c.dgrad_flops, kB, lb.compute, kd);
        }
        return;
      }
      const sim::KernelListId k =
          kernels(pb, s, backward, backward ? Use::kBackward : Use::kForward);
      for (int j : actives_) {
        const PassCost& c = block(j, pb, backward).steps[s].cost;
        if (backward)
          compute(j, c.dgrad + (split_w_ ? Time() : c.wgrad),
                  c.dgrad_flops + (split_w_ ? Flops() : c.wgrad_flops), pass, lb.compute, k);
        else
          compute(j, c.forward, c.forward_flops, pass, lb.compute, k);
      }
      if (gather && backward)
        collective(CollectiveKind::kReduceScatter, step.bytes * l_.cp, {cat_cp_, lb.cp},
                   cp_groups_);
      return;
    }
    case StepKind::kTpEntry: {
      if (backward && overlapped_entry(pb, s)) return;  // linear_backward() ran it
      const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
      if (!backward && step.amax_reduce) reduce_tp_amax();
      if (!backward && sp && s + 1 < steps.size() && steps[s + 1].ring_exchange)
        return ring_collective(CollectiveKind::kAllGather, step.gather_bytes, lb.tp);
      if (backward)
        collective(sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, step.bytes,
                   {cat_tp_, lb.tp}, tp_groups_);
      else if (sp)
        collective(CollectiveKind::kAllGather, step.gather_bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    }
    case StepKind::kTpExit: {
      const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
      if (backward && step.amax_reduce) reduce_tp_amax();
      if (s > 0 && steps[s - 1].ring_exchange) {
        if (backward)  // the gradient's all-gather, beside the linear's dgrad (ring_linear)
          return ring_collective(CollectiveKind::kAllGather, step.bytes, lb.tp);
        // The last chunk's reduce-scatter, after the GEMM and the chunks before it.
        ring_collective(CollectiveKind::kReduceScatter, step.bytes / steps[s - 1].exit_chunks,
                        lb.tp, /*after_ring=*/true);
        for (int j : actives_) {
          st_[j].need = st_[j].last = ring_[j];
          ring_[j] = TaskId();
        }
        return;
      }
      if (!backward)
        collective(sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, step.bytes,
                   {cat_tp_, lb.tp}, tp_groups_);
      else if (sp)
        collective(CollectiveKind::kAllGather, step.bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    }
    case StepKind::kTpLossAllReduce:
    case StepKind::kTpLossAllGather:
      if (!backward)
        collective(step.kind == StepKind::kTpLossAllReduce ? CollectiveKind::kAllReduce
                                                           : CollectiveKind::kAllGather,
                   step.bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    case StepKind::kEpAllToAll: {
      // Megatron's dropless all-to-all dispatcher all-gathers each rank's tokens per expert
      // over the group (the dispatch's step carries their bytes) and needs the split sizes on
      // the host before its dispatch: the host waits for that work to finish
      // (token_dispatcher.py: preprocess, the "before_ep_alltoall" cuda_sync_point). The
      // backward reuses them: neither again. The all-gather is issued with the compute
      // (preprocess), not on the all-to-alls' stream of the EP overlap: it does not queue
      // behind a backward's all-to-all.
      if (!backward && step.expert_counts_bytes > Bytes(0)) {
        collective(CollectiveKind::kAllGather, step.expert_counts_bytes * l_.ep, {cat_ep_, lb.ep},
                   ep_groups_, kTpStream);
        if (host_)
          for (int j : actives_)
            if (st_[j].last.valid() && g_.host_issued(st_[j].last)) g_.set_host_sync(st_[j].last);
      }
      const int32_t a2a_stream = l_.ep_comm_overlap ? kEpStream : kTpStream;
      if (!ep_rail_groups_.ids.empty()) {
        // DeepEP across nodes (Layout::moe_dispatcher): one kernel pipelines the transfers
        // across nodes (each token once to each other node holding one of its experts, with
        // its routing, to the GPU of the sender's local index there) with the NVLink
        // all-to-all that forwards them and moves the node's own tokens; each GPU's NVLink
        // sends then add up to the plain all-to-all's buffer. As two collectives side by
        // side, both waited for.
        const Bytes copies = step.bytes + step.probs_bytes;
        const Bytes rail(std::llround(copies.as_double() * deepep_rail_per_byte_));
        // The NVLink part after the rank's last task; `beside` holds that task until the
        // part across nodes, which starts after it too, takes its place.
        group_collectives(ep_node_groups_, CollectiveKind::kAllToAll, copies, a2a_stream,
                          {cat_ep_, lb.ep}, [&](int j, TaskId c) {
                            RankState& rs = st_[j];
                            if (rs.last.valid()) g_.add_dependency(rs.last, c);
                            rs.beside = rs.last;
                            rs.need = rs.last = c;
                          });
        group_collectives(ep_rail_groups_, CollectiveKind::kAllToAll, rail, kEpRailStream,
                          {cat_ep_, lb.ep}, [&](int j, TaskId c) {
                            RankState& rs = st_[j];
                            if (rs.beside.valid()) g_.add_dependency(rs.beside, c);
                            rs.beside = c;
                          });
      } else {
        collective(CollectiveKind::kAllToAll, step.bytes, {cat_ep_, lb.ep}, ep_groups_, a2a_stream);
        if (step.probs_bytes > Bytes(0))  // the routing probabilities, a call of their own
          collective(CollectiveKind::kAllToAll, step.probs_bytes, {cat_ep_, lb.ep}, ep_groups_,
                     a2a_stream);
      }
      if (backward && delays_wgrad(pb, s + 1)) {  // the wgrads held back for it, beside it
        const sim::KernelListId kw = kernels(pb, s + 1, true, Use::kStepWgrad);
        for (int j : actives_) {
          const TaskId a2a = std::exchange(st_[j].need, TaskId());
          const TaskId rail = std::exchange(st_[j].beside, TaskId());
          const PassCost& c = block(j, pb, true).steps[s + 1].cost;
          compute(j, c.wgrad, c.wgrad_flops, kB, lb.compute, kw);
          st_[j].need = a2a;
          st_[j].beside = rail;
        }
      }
      return;
    }
  }
}

void Lowering::run_op(const PipelineOp& op, std::vector<OpSpan>& spans) {
  const size_t first_task = static_cast<size_t>(g_.num_tasks());
  op_pieces(op, [](bool, auto&& piece) { piece(); });
  const std::pair<size_t, size_t> range{first_task, static_cast<size_t>(g_.num_tasks())};
  record_spans({&range, 1}, spans);
}

template <class Emit>
void Lowering::op_pieces(const PipelineOp& op, Emit&& emit) {
  const int v = op.chunk * l_.pp + stage_;
  const std::vector<PlacedBlock>& blocks = chunks_[v];
  const bool fsdp = l_.fsdp && !role_.frozen;
  // Pieces may run after this returns: they hold pointers into members, not locals.
  const std::vector<PlacedBlock>* chunk_blocks = &blocks;
  // FSDP2's root unit (Layout::fsdp_root_unit) holds the chunk's blocks outside the layers:
  // gathered at the chunk's start, reduced after its whole backward.
  const bool root = fsdp && l_.fsdp_root_unit;
  auto in_root = [root](const PlacedBlock& pb) { return root && pb.part != Part::kLayer; };
  const FsdpUnit root_unit = root ? fsdp_root(blocks) : FsdpUnit{};
  auto grads_done = [this, fsdp, in_root, chunk_blocks, chunk = op.chunk](size_t b) {
    for (int j : actives_) last_grad_[chunk][b][j] = st_[j].last;
    const PlacedBlock& pb = (*chunk_blocks)[b];
    if (fsdp && !in_root(pb)) fsdp_reduce(fsdp_unit(pb));
  };
  auto all_to_all = [&](const PlacedBlock& pb, size_t s, bool backward) {
    return block(0, pb, backward).steps[s].kind == StepKind::kEpAllToAll;
  };
  // FSDP gathers each block's parameters for its forward and, resharded after it, again for
  // its backward (but those FSDP2 keeps, fsdp_kept_to_backward); a block's all-gather starts
  // once the block before it has started.
  const bool backward = op.kind == PassKind::kBackward;
  const bool gathers =
      fsdp && (op.kind == PassKind::kForward || (backward && l_.fsdp_reshard_after_forward));
  const int pass = backward ? kB : kF;
  auto gather = [this, pass](FsdpUnit u) {
    const Bytes gathered = fsdp_gather(u, fsdp_after_);
    for (int j : actives_) fsdp_after_[j] = st_[j].last;
    if (l_.torch_fsdp2()) fsdp_copy_out(u, gathered, pass);
  };
  // Scatter/gather pipeline transfers: the chunk's input (forward) or its output's gradient
  // (backward) arrives from another stage in tp pieces, all-gathered over the TP group
  // before the chunk runs (Megatron-LM's gather_split_1d_tensor, on the compute stream's
  // order). pipeline_p2p makes the transfer a dependency of this, the op's first task.
  if (op.kind != PassKind::kWeight && l_.pp > 1) {
    const bool fwd = op.kind == PassKind::kForward;
    const int from = fwd ? v - 1 : v + 1;
    if (from >= 0 && from < vstages_) {
      const Bytes gathered =
          costs_[0][0][chunks_[fwd ? from : v].back().module].boundary_gather_bytes;
      if (gathered.count() > 0) {
        if (pp_gather_names_.empty()) pp_gather_names_.resize(2 * static_cast<size_t>(vstages_));
        sim::LabelId& name = pp_gather_names_[2 * static_cast<size_t>(v) + (fwd ? 0 : 1)];
        if (!name.valid())
          name =
              g_.label(fmt::format("v{} -> v{} {} gather", from, v, fwd ? "activation" : "grad"));
        emit(false, [this, gathered, name] {
          collective(CollectiveKind::kAllGather, gathered, {cat_pp_, name}, tp_groups_);
        });
      }
    }
  }
  // The distributed optimizer's parameter all-gathers beside the chunk's first forward
  // (gathers_params_in_forward): one chunk, a bucket's before its first (lowest) block,
  // issued once the bucket before it has started; interleaved, whole chunks ahead.
  const bool bucket_gathers =
      op.kind == PassKind::kForward && op.micro_batch == 0 && !fsdp && !buckets_.empty();
  const bool by_chunk = l_.vpp > 1;
  // Interleaved: the chunks whose all-gathers this forward launches (param_syncs_), emitted
  // after the op's first block, so that the op's first task is its compute's; they follow
  // the op before it, not the pipeline's receive.
  std::vector<int> syncs;
  if (op.kind == PassKind::kForward)
    for (const ParamSync& ps : param_syncs_)
      if (ps.at_chunk == op.chunk && ps.at_micro_batch == op.micro_batch) syncs.push_back(ps.chunk);
  if (gathers || bucket_gathers || !syncs.empty())
    emit(false, [this] {
      for (int j : actives_) fsdp_after_[j] = st_[j].last;
    });
  if (gathers && !backward && !root_unit.blocks.empty())
    emit(false, [gather, root_unit] { gather(root_unit); });
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const size_t b = op.kind == PassKind::kForward ? bi : blocks.size() - 1 - bi;
    const PlacedBlock* pb = &blocks[b];
    const size_t nsteps = block(0, *pb, op.kind == PassKind::kBackward).steps.size();
    if (gathers && !in_root(*pb) && !(backward && fsdp_kept_to_backward(blocks, b)))
      emit(false, [gather, u = fsdp_unit(*pb)] { gather(u); });
    if (bucket_gathers)
      for (size_t i = 0; i < buckets_.size(); ++i)
        if (buckets_[i].chunk == op.chunk && buckets_[i].first == b)
          emit(false, [this, i, by_chunk] {
            if (!by_chunk) gather_bucket_params(i, fsdp_after_);
            for (int j : actives_) {
              if (bucket_gathered_[i][j].valid()) st_[j].gathered = bucket_gathered_[i][j];
              if (!by_chunk) fsdp_after_[j] = st_[j].last;
            }
          });
    switch (op.kind) {
      case PassKind::kForward: {
        const Labels* lb = &labels(v, b, kF);
        for (size_t s = 0; s < nsteps; ++s)
          emit(all_to_all(*pb, s, false),
               [this, pb, s, lb] { run_step(*pb, s, kF, *lb, lb->compute); });
        if (bi == 0)
          for (int chunk : syncs)
            emit(false, [this, chunk] { gather_chunk_params(chunk, fsdp_after_); });
        break;
      }
      case PassKind::kBackward: {
        const bool recompute = l_.recompute != models::Recompute::kNone;
        const sim::LabelId rl = recompute ? labels(v, b, kR).compute : sim::LabelId();
        if (l_.recompute == models::Recompute::kFull && pb->part == Part::kLayer) {
          const Labels* replay = &labels(v, b, kR);
          for (size_t s = 0; s < block(0, *pb).steps.size(); ++s)
            emit(all_to_all(*pb, s, false),
                 [this, pb, s, replay, rl] { run_step(*pb, s, kR, *replay, rl); });
        }
        const Labels* lb = &labels(v, b, kB);
        for (size_t s = nsteps; s-- > 0;)
          emit(all_to_all(*pb, s, true), [this, pb, s, lb, rl, mb = op.micro_batch] {
            backward_mb_ = mb;
            run_step(*pb, s, kB, *lb, rl);
          });
        if (!split_w_) emit(false, [grads_done, b] { grads_done(b); });
        break;
      }
      case PassKind::kWeight: {
        const Labels* lb = &labels(v, b, kW);
        const sim::KernelListId k = kernels(*pb, 0, false, Use::kWgrad);
        emit(false, [this, pb, lb, k, grads_done, b] {
          for (int j : actives_) {
            PassCost sum;
            for (const WorkStep& step : block(j, *pb).steps) sum += step.cost;
            compute(j, sum.wgrad, sum.wgrad_flops, kW, lb->compute, k);
          }
          grads_done(b);
        });
        break;
      }
    }
  }
  // Delayed scaling's amax all-reduce (reduces_amax()) as the chunk's forward and backward
  // end: 3 amaxes per FP8 GEMM forward (input, weight, output), 2 backward, four GEMMs a
  // layer.
  if (!amax_groups_.ids.empty() && op.kind != PassKind::kWeight) {
    int64_t layers = 0;
    for (const PlacedBlock& pb : blocks) layers += pb.part == Part::kLayer;
    const int64_t amaxes = 4 * layers * (op.kind == PassKind::kForward ? 3 : 2);
    if (amaxes > 0)
      emit(false, [this, amaxes, fwd = op.kind == PassKind::kForward] {
        collective(CollectiveKind::kAllReduce, Bytes(4 * amaxes),
                   {cat_amax_, fwd ? amax_fwd_ : amax_bwd_}, amax_groups_, kTpStream);
      });
  }
  // The root unit reduces once the chunk's last gradient is done (FSDP2's final callback).
  if (!root_unit.blocks.empty() && op.kind == (split_w_ ? PassKind::kWeight : PassKind::kBackward))
    emit(false, [this, root_unit] { fsdp_reduce(root_unit); });
}

void Lowering::run_merged(size_t i) {
  const std::vector<PipelineOp>& order = orders_[stage_];
  struct Program {
    size_t op = 0;
    std::vector<std::function<void()>> pieces;
    std::vector<bool> ends_all_to_all;
    std::vector<RankState> state;
    std::vector<TaskId> fsdp_after;  // FSDP: what the op's next all-gather follows
    std::vector<TaskId> ring;        // userbuffers: the op's ring collective in flight
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t next = 0;
  };
  // [0] the backward, which starts (its combine's all-to-all beside the forward's
  // attention), [1] the forward.
  Program progs[2];
  progs[0].op = order[i].kind == PassKind::kBackward ? i : i + 1;
  progs[1].op = progs[0].op == i ? i + 1 : i;
  for (Program& p : progs) {
    op_pieces(order[p.op], [&p](bool a2a, auto&& piece) {
      p.pieces.emplace_back(std::move(piece));
      p.ends_all_to_all.push_back(a2a);
    });
    p.state = st_;
    p.fsdp_after = fsdp_after_;
    p.ring = ring_;
  }
  int turn = 0, last = 0;
  while (progs[0].next < progs[0].pieces.size() || progs[1].next < progs[1].pieces.size()) {
    Program& p = progs[turn];
    if (p.next < p.pieces.size()) {
      std::swap(st_, p.state);
      std::swap(fsdp_after_, p.fsdp_after);
      std::swap(ring_, p.ring);
      const size_t begin = static_cast<size_t>(g_.num_tasks());
      while (p.next < p.pieces.size()) {
        const bool a2a = p.ends_all_to_all[p.next];
        p.pieces[p.next++]();
        if (a2a) break;
      }
      p.ranges.emplace_back(begin, static_cast<size_t>(g_.num_tasks()));
      std::swap(st_, p.state);
      std::swap(fsdp_after_, p.fsdp_after);
      std::swap(ring_, p.ring);
      last = turn;
    }
    turn ^= 1;
  }
  for (Program& p : progs) {
    std::swap(st_, p.state);
    record_spans(p.ranges, spans_[stage_][p.op]);
    std::swap(st_, p.state);
  }
  st_ = std::move(progs[last].state);  // both end with compute: the stream orders the rest
  fsdp_after_ = std::move(progs[last].fsdp_after);
  ring_ = std::move(progs[last].ring);
  for (TaskId t : progs[last ^ 1].ring)
    HETPAR_CHECK(!t.valid(), "a merged op ends with its userbuffers collective unconsumed");
}

void Lowering::record_spans(std::span<const std::pair<size_t, size_t>> ranges,
                            std::vector<OpSpan>& spans) {
  // First and last task of the op on each rank that runs tasks (for the pipeline P2P
  // dependencies), by its index in actives_.
  const int n = stage_ranks();
  spans.assign(actives_.size(), {});
  for (size_t a = 0; a < actives_.size(); ++a) spans[a].last = st_[actives_[a]].last;
  int missing = static_cast<int>(actives_.size());
  for (const auto& [begin, end] : ranges)
    for (size_t t = begin; t < end && missing > 0; ++t) {
      for (const sim::StreamRef& ref : g_.streams(TaskId(static_cast<int32_t>(t)))) {
        const int j = ref.rank.value() - role_.rank_offset - stage_ranks() * stage_;
        if (j >= 0 && j < n && slot_[j] >= 0 && !spans[slot_[j]].first.valid()) {
          spans[slot_[j]].first = TaskId(static_cast<int32_t>(t));
          --missing;
        }
      }
    }
}

void Lowering::build_stage() {
  const int n = stage_ranks();
  group_.resize(n);
  for (int j = 0; j < n; ++j) group_[j] = group_of_rank_[rank_of(j, stage_).value()];
  st_.assign(n, {});
  ring_.assign(n, TaskId());
  fsdp_after_.assign(n, TaskId());
  fsdp_reduced_.assign(n, TaskId());
  // TP groups: tp consecutive local ranks; EP groups: ep consecutive (cp, dp) positions
  // with the same tp rank.
  std::vector<std::vector<int>> locals;
  for (int j0 = 0; j0 < n; j0 += l_.tp) {
    locals.emplace_back();
    for (int i = 0; i < l_.tp; ++i) locals.back().push_back(j0 + i);
  }
  make_groups(tp_groups_, locals);
  // Experts see the stage's n ranks in their own order (Layout::etp): local rank
  // a + etp * (e + ep * d), a the expert-TP rank, e the EP rank, d the expert-DP rank; with
  // etp = tp that is t + tp * x, x = e + ep * d of the dp x cp positions.
  const int etp = l_.expert_tp(), edp = l_.expert_ranks() / l_.ep;
  auto expert_rank = [&](int a, int e, int d) { return a + etp * (e + l_.ep * d); };
  locals.clear();
  if (l_.ep > 1)
    for (int d = 0; d < edp; ++d)
      for (int a = 0; a < etp; ++a) {
        locals.emplace_back();
        for (int e = 0; e < l_.ep; ++e) locals.back().push_back(expert_rank(a, e, d));
      }
  make_groups(ep_groups_, locals);
  // DeepEP across nodes: each EP group takes whole nodes of equal size (infeasibility());
  // its members by node, and by local index across its nodes.
  std::vector<std::vector<int>> node_locals, rail_locals;
  size_t nodes = 0;  // that each EP group spans (infeasibility(): all alike)
  if (l_.moe_dispatcher == MoeDispatcher::kDeepEp)
    for (const std::vector<int>& group : locals) {
      std::vector<std::vector<int>> by_node;
      NodeId node;
      for (int j : group) {
        const NodeId at = s_.cluster.node_of_gpu(rank_of(j, stage_).value());
        if (by_node.empty() || at != node) by_node.emplace_back();
        node = at;
        by_node.back().push_back(j);
      }
      if (by_node.size() < 2) continue;
      const size_t per_node = by_node.front().size();
      for (size_t i = 0; i < per_node; ++i) {
        rail_locals.emplace_back();
        for (const std::vector<int>& members : by_node) {
          HETPAR_CHECK(members.size() == per_node, "a DeepEP group with unequal nodes");
          rail_locals.back().push_back(members[i]);
        }
      }
      nodes = by_node.size();
      for (std::vector<int>& members : by_node) node_locals.push_back(std::move(members));
    }
  deepep_rail_per_byte_ = 0;
  if (nodes > 1) {
    // A token's top_k experts, drawn evenly from the EP group's experts, fall on a given
    // other node (experts / nodes of them) unless all miss it: C(E - E/G, k) / C(E, k). It
    // goes there once, of its top_k copies in the buffer; the buffer holds one part per node.
    const auto& moe = *std::get<models::LlmSpec>(s_.model.modules[s_.model.llm_index()].spec).moe;
    const double experts = static_cast<double>(moe.experts);
    const double elsewhere = experts - experts / static_cast<double>(nodes);
    double miss = 1.0;
    for (int64_t i = 0; i < moe.top_k; ++i)
      miss *=
          std::max(0.0, elsewhere - static_cast<double>(i)) / (experts - static_cast<double>(i));
    deepep_rail_per_byte_ =
        (1.0 - miss) / static_cast<double>(moe.top_k) * static_cast<double>(nodes);
  }
  make_groups(ep_node_groups_, node_locals);
  make_groups(ep_rail_groups_, rail_locals);
  // CP groups (all-gather CP): the cp ranks of one dp replica with the same tp rank.
  locals.clear();
  if (l_.cp > 1 && l_.cp_comm == CpComm::kAllGather)
    for (int d = 0; d < l_.dp; ++d)
      for (int t = 0; t < l_.tp; ++t) {
        locals.emplace_back();
        for (int q = 0; q < l_.cp; ++q) locals.back().push_back(t + l_.tp * (q + l_.cp * d));
      }
  make_groups(cp_groups_, locals);
  // DP: the dp x cp ranks with one tp rank; expert DP: those with one ep position too.
  const int cpdp = l_.cp * l_.dp;
  locals.clear();
  for (int t = 0; t < l_.tp; ++t) {
    locals.emplace_back();
    for (int x = 0; x < cpdp; ++x) locals.back().push_back(t + l_.tp * x);
  }
  make_groups(dp_groups_, locals);
  locals.clear();
  if (experts_apart())
    for (int a = 0; a < etp; ++a)
      for (int e = 0; e < l_.ep; ++e) {
        locals.emplace_back();
        for (int d = 0; d < edp; ++d) locals.back().push_back(expert_rank(a, e, d));
      }
  make_groups(edp_groups_, locals);
  // FP8 delayed scaling's amax reduction group (reduces_amax()): the whole stage, tp x cp x dp.
  locals.clear();
  if (reduces_amax()) {
    locals.emplace_back(n);
    for (int j = 0; j < n; ++j) locals.back()[j] = j;
  }
  make_groups(amax_groups_, locals);
  // CP ring: each representative's send (0 -> 1 of tp 0 in its replica) and receive
  // (cp-1 -> 0); every other edge of the rings of the replicas it stands for is a copy.
  cp_pairs_.assign(actives_.size(), GroupId());
  cp_copies_.assign(actives_.size(), GroupId());
  cp_edge_copies_.assign(n, GroupId());
  if (reduced_ && l_.cp > 1 && whole_replicas()) {
    const int block = l_.tp * l_.cp;
    for (int d0 = 0; d0 < l_.dp; ++d0) {
      if (owner_[d0 * block] != d0 * block) continue;  // not a representative replica
      for (int t = 0; t < l_.tp; ++t)
        for (int q = 0; q < l_.cp; ++q) {
          members_.clear();
          for (int d = 0; d < l_.dp; ++d)
            if (d != d0 && owner_[d * block] == d0 * block) {
              members_.push_back(rank(t, q, d, stage_));
              members_.push_back(rank(t, (q + 1) % l_.cp, d, stage_));
            }
          if (!members_.empty())
            cp_edge_copies_[t + l_.tp * (q + l_.cp * d0)] = g_.add_group(members_);
        }
    }
  } else if (reduced_ && l_.cp > 1) {
    const int block = l_.tp * l_.cp;
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int d0 = actives_[a] / block;
      HETPAR_CHECK(actives_[a] % block == 0, "CP ring: representatives must be replica leaders");
      const RankId r0 = rank(0, 0, d0, stage_), r1 = rank(0, 1, d0, stage_),
                   rl = rank(0, l_.cp - 1, d0, stage_);
      const RankId pairs[] = {r0, r1, rl, r0};
      cp_pairs_[a] = g_.add_group(pairs);
      members_.clear();
      for (int dp_i = 0; dp_i < l_.dp; ++dp_i) {
        if (owner_[dp_i * block] != actives_[a]) continue;
        for (int t = 0; t < l_.tp; ++t)
          for (int q = 0; q < l_.cp; ++q) {
            if (dp_i == d0 && t == 0 && (q == 0 || q == l_.cp - 1)) continue;
            members_.push_back(rank(t, q, dp_i, stage_));
            members_.push_back(rank(t, (q + 1) % l_.cp, dp_i, stage_));
          }
      }
      if (!members_.empty()) cp_copies_[a] = g_.add_group(members_);
    }
  }
  last_grad_.assign(l_.vpp, {});
  for (int c = 0; c < l_.vpp; ++c)
    last_grad_[c].assign(chunks_[c * l_.pp + stage_].size(), std::vector<TaskId>(n));
  const std::vector<PipelineOp>& order = orders_[stage_];
  spans_[stage_].resize(order.size());
}

std::vector<Lowering::Bucket> Lowering::dp_buckets() const {
  const int64_t bucket_params = o_.bucket_params > 0
                                    ? o_.bucket_params
                                    : std::max<int64_t>(40'000'000, 1'000'000LL * l_.cp * l_.dp);
  std::vector<Bucket> buckets;
  for (int c = l_.vpp - 1; c >= 0; --c) {
    const std::vector<PlacedBlock>& blocks = chunks_[c * l_.pp + stage_];
    Bucket cur{c, blocks.size(), blocks.size(), {}, {}};
    for (size_t b = blocks.size(); b-- > 0;) {
      const Block& blk = block(0, blocks[b]);
      if (cur.first == blocks.size()) cur.last = b;
      cur.first = b;
      cur.dense += blk.dense;
      cur.expert += blk.expert;
      const int64_t all = cur.dense.all + cur.expert.all;
      if (all >= bucket_params || b == 0) {
        if (all > 0) buckets.push_back(cur);
        cur = Bucket{c, blocks.size(), blocks.size(), {}, {}};
      }
    }
  }
  return buckets;
}

std::vector<size_t> Lowering::grad_syncs() const {
  const bool megatron_schedule =
      p_.schedule == Schedule::kInterleaved || p_.schedule == Schedule::k1F1B;
  if (!l_.align_grad_reduce || !l_.overlap_grad_reduce || l_.fsdp || l_.pp == 1 ||
      !megatron_schedule || role_.frozen)
    return {};
  const std::vector<PipelineOp>& order = orders_[stage_];
  const size_t last_op = order.size() - 1;  // after the schedule
  if (l_.vpp == 1)  // the first stage reduces its last backward's buckets as they are ready
    return {stage_ == 0 ? SIZE_MAX : last_op};
  // Interleaved: backward virtual micro-batch k launches the chunk whose last backward is
  // k - pp_rank, so the stages launch together.
  std::vector<size_t> backwards;  // op indices, in order
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].kind == PassKind::kBackward) backwards.push_back(i);
  std::vector<size_t> syncs(l_.vpp, last_op);
  for (size_t b = 0; b < backwards.size(); ++b) {
    const PipelineOp& op = order[backwards[b]];
    if (op.micro_batch != m_ - 1) continue;  // a chunk's last backward
    const size_t at = b + static_cast<size_t>(stage_);
    if (at < backwards.size()) syncs[op.chunk] = backwards[at];
  }
  return syncs;
}

void Lowering::gather_bucket_params(size_t i, const std::vector<TaskId>& after) {
  const Bucket& bk = buckets_[i];
  std::vector<TaskId>& gathered = bucket_gathered_[i];
  std::vector<TaskId> previous(st_.size());
  const std::vector<PlacedBlock>& blocks = chunks_[bk.chunk * l_.pp + stage_];
  for (const ParamPart& part : param_parts(bk.dense, bk.expert)) {
    const GroupSet& gs = *part.group;
    const Bytes bytes = held_bytes(part.params);
    if (gs.locals.empty() || gs.locals[0].size() < 2 || bytes.count() == 0) continue;
    const sim::LabelId name =
        g_.label(fmt::format("{}dp all_gather {}params bucket {}-{} stage {}", role_.prefix,
                             part.prefix, blocks[bk.first].name, blocks[bk.last].name, stage_));
    group_collectives(gs, CollectiveKind::kAllGather, bytes, kDpStream, {cat_dp_, name},
                      [&](int j, TaskId c) {
                        if (after[j].valid()) g_.add_dependency(after[j], c);
                        if (previous[j].valid()) g_.add_dependency(previous[j], c);
                        gathered[j] = c;
                      });
    previous = gathered;
  }
}

void Lowering::gather_chunk_params(int chunk, const std::vector<TaskId>& after) {
  for (size_t i = buckets_.size(); i-- > 0;)  // readiness order reversed: forward order
    if (buckets_[i].chunk == chunk) gather_bucket_params(i, after);
}

// DP gradient buckets of this stage (see lower.h), the optimizer step, and the
// distributed optimizer's parameter all-gather.
void Lowering::gradients_and_optimizer() {
  const int n = stage_ranks();
  const int cpdp = l_.cp * l_.dp;
  const int edp = l_.expert_ranks() / l_.ep;
  const bool dist = l_.distributed_optimizer;
  const CollectiveKind reduce = dist ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
  std::vector<Bucket> buckets = dp_buckets();

  // Groups (build_stage): dense gradients over the dp x cp ranks with the same tp rank;
  // expert gradients over the expert-dp ranks (same tp rank and ep position).
  std::vector<TaskId> last_comm(n), first_comm(n);
  const int64_t gb = gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype);
  // One part (param_parts) of a bucket; `what` after the part's prefix in the label.
  auto reduce_over = [&](Bytes bytes, const Bucket& bk, const std::vector<TaskId>& after,
                         CollectiveKind kind, const ParamPart& part, std::string_view what) {
    const GroupSet& gs = *part.group;
    if (gs.locals.empty() || gs.locals[0].size() < 2 || bytes.count() == 0) return;
    const sim::LabelId name = g_.label(
        fmt::format("{}dp {} {}{} bucket {}-{} stage {}", role_.prefix, sim::to_string(kind),
                    part.prefix, what, chunks_[bk.chunk * l_.pp + stage_][bk.first].name,
                    chunks_[bk.chunk * l_.pp + stage_][bk.last].name, stage_));
    group_collectives(gs, kind, bytes, kDpStream, {cat_dp_, name}, [&](int j, TaskId c) {
      if (after[j].valid()) g_.add_dependency(after[j], c);
      if (!first_comm[j].valid()) first_comm[j] = c;
      last_comm[j] = c;
    });
  };
  std::vector<TaskId> ready(n);
  if (l_.fsdp) {  // reduced block by block after each backward (fsdp_reduce)
    buckets.clear();
    for (int j : actives_) last_comm[j] = fsdp_reduced_[j];
  }
  const std::vector<size_t> syncs = buckets.empty() ? std::vector<size_t>() : grad_syncs();
  for (const Bucket& bk : buckets) {
    const size_t sync = syncs.empty() ? SIZE_MAX : syncs[bk.chunk];
    for (int j : actives_)  // the bucket's lowest block runs its backward last
      ready[j] = !l_.overlap_grad_reduce ? spans_[stage_].back()[slot_[j]].last
                 : sync != SIZE_MAX      ? spans_[stage_][sync][slot_[j]].last
                                         : last_grad_[bk.chunk][bk.first][j];
    for (const ParamPart& part : param_parts(bk.dense, bk.expert))
      reduce_over(Bytes(part.params.all * gb), bk, ready, reduce, part, "grads");
  }

  // The optimizer step over this rank's parameters (its dp shard with the distributed
  // optimizer or FSDP): optimizer_traffic().
  int64_t dense = 0, expert = 0, synced = 0;  // synced: Block::tp_synced, below
  for (int c = 0; c < l_.vpp; ++c)
    for (const PlacedBlock& pb : chunks_[c * l_.pp + stage_]) {
      const Block& b = block(0, pb);
      dense += b.dense.all;
      expert += b.expert.all;
      synced += b.tp_synced;
    }
  const int64_t owned = l_.shards_optimizer_state() ? dense / cpdp + expert / edp : dense + expert;
  const OptimizerTraffic traffic = optimizer_traffic(l_, s_.workload.precision);
  const int64_t step_bytes =
      owned * traffic.per_owned_param + (dense + expert) * traffic.per_held_param;
  // Then (Megatron-LM's finalize_model_grads) the gradients TP replicates but its ranks
  // see apart (Block::tp_synced) all-reduced over TP as one coalesced buffer, and the tied
  // embedding's between the first and last stage.
  if (synced > 0 && !l_.torch_fsdp2()) {
    const sim::LabelId name =
        g_.label(fmt::format("{}layernorm grads all_reduce stage {}", role_.prefix, stage_));
    group_collectives(tp_groups_, CollectiveKind::kAllReduce, Bytes(synced * gb), kTpStream,
                      {cat_tp_, name}, [&](int j, TaskId c) {
                        for (TaskId t : {last_comm[j], st_[j].last})
                          if (t.valid()) g_.add_dependency(t, c);
                        last_comm[j] = c;
                      });
  }
  const std::vector<TaskId> embedding = tied_embedding_all_reduce(last_comm);
  const sim::LabelId opt_name = g_.label(fmt::format("{}optimizer stage {}", role_.prefix, stage_));
  std::vector<TaskId> opt(n);
  sim::KernelListId opt_kernels;
  for (int j : actives_) {
    const hardware::DeviceProfile& dev = s_.cluster.groups()[group_[j]].profile.gpu;
    opt[j] = g_.add_compute(rank_of(j, stage_), 0, dev.memory_kernel_time(Bytes(step_bytes)),
                            Flops(), {cat_opt_, opt_name});
    if (last_comm[j].valid()) g_.add_dependency(last_comm[j], opt[j]);
    if (!embedding.empty()) g_.add_dependency(embedding[j], opt[j]);
    // And whatever the schedule left on another stream for the compute stream to wait for
    // (the last backward's amax all-reduce).
    if (st_[j].need.valid()) g_.add_dependency(st_[j].need, opt[j]);
    if (st_[j].beside.valid()) g_.add_dependency(st_[j].beside, opt[j]);
    if (o_.kernels) {
      if (!opt_kernels.valid()) {
        const sim::Kernel adam = sim::memory_kernel(step_bytes);
        opt_kernels = g_.add_kernels({&adam, 1});
      }
      g_.set_kernels(opt[j], opt_kernels);
    }
  }
  if (stage_ == 0 && ties_embedding()) embedding_opt_ = opt;  // tied_embedding_all_reduce
  if (l_.pp_blocking_p2p && l_.pp > 1) {
    if (after_pipeline_.empty()) after_pipeline_.resize(l_.pp);
    std::vector<AfterPipeline>& after = after_pipeline_[stage_];
    after.assign(actives_.size(), {});
    for (int j : actives_)
      after[slot_[j]] = {opt[j], l_.overlap_grad_reduce ? TaskId() : first_comm[j]};
  }
  // FSDP gathers parameters when a block runs; with overlap_param_gather the distributed
  // optimizer's all-gathers run in the first forward (gathers_params_in_forward).
  if (!dist || l_.fsdp || gathers_params_in_forward()) return;
  // Parameter all-gather after the step, buckets in forward order (the reverse of readiness);
  // with overlap_param_gather (colocated plans) only the first one, the rest hides behind the
  // next forward.
  const size_t gathered =
      l_.overlap_param_gather ? std::min<size_t>(buckets.size(), 1) : buckets.size();
  for (size_t i = 0; i < gathered; ++i) {
    const Bucket& bk = buckets[buckets.size() - 1 - i];
    for (const ParamPart& part : param_parts(bk.dense, bk.expert))
      reduce_over(held_bytes(part.params), bk, opt, CollectiveKind::kAllGather, part, "params");
  }
}

bool Lowering::ties_embedding() const {
  if (!has_llm_ || role_.frozen || l_.pp < 2 || l_.torch_fsdp2()) return false;
  const auto* llm = std::get_if<models::LlmSpec>(&s_.model.modules[s_.model.llm_index()].spec);
  return llm && llm->tied_embeddings;
}

std::vector<TaskId> Lowering::tied_embedding_all_reduce(const std::vector<TaskId>& after) {
  if (!ties_embedding() || (stage_ != 0 && stage_ != l_.pp - 1)) return {};
  const int n = stage_ranks();
  if (stage_ == 0) {
    embedding_ready_.assign(n, {});
    for (int j : actives_) embedding_ready_[j] = {after[j], st_[j].last};
    return {};
  }
  const auto& llm = std::get<models::LlmSpec>(s_.model.modules[s_.model.llm_index()].spec);
  const Bytes bytes(llm.vocab * llm.block.hidden / l_.tp *
                    gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype));
  const sim::LabelId name = g_.label(
      fmt::format("{}tied embedding grads all_reduce stage 0 + {}", role_.prefix, l_.pp - 1));
  // Reduced: each representative's pair stands for the pairs of the ranks it owns.
  std::vector<std::vector<RankId>> copies(n);
  if (reduced_)
    for (int j = 0; j < n; ++j)
      if (!active(j)) {
        copies[owner_[j]].push_back(rank_of(j, 0));
        copies[owner_[j]].push_back(rank_of(j, stage_));
      }
  std::vector<TaskId> reduced(n);
  for (int j : actives_) {
    const RankId pair[] = {rank_of(j, 0), rank_of(j, stage_)};
    sim::CollectiveSpec spec;
    spec.kind = CollectiveKind::kAllReduce;
    spec.group_id = g_.add_group(pair);
    spec.bytes = bytes;
    spec.stream = kEmbeddingStream;
    if (!copies[j].empty()) spec.copies = g_.add_group(copies[j]);
    const TaskId c = g_.add_collective(spec, {cat_dp_, name});
    if (host_) g_.set_host(c, host_op_[group_[j]]);
    for (TaskId t : {embedding_ready_[j].first, embedding_ready_[j].second, after[j], st_[j].last})
      if (t.valid()) g_.add_dependency(t, c);
    g_.add_dependency(c, embedding_opt_[j]);  // the first stage's step (stage 0 came first)
    reduced[j] = c;
  }
  return reduced;
}

// P2P of activations (gradients) from each F (B) to the next (previous) virtual stage.
void Lowering::pipeline_p2p(int stage) {
  const int n = stage_ranks();
  // Op index of (kind, chunk, micro-batch) in each stage's program.
  auto key = [&](PassKind k, int chunk, int64_t mb) {
    return (static_cast<size_t>(k) * l_.vpp + chunk) * static_cast<size_t>(m_) + mb;
  };
  std::vector<std::vector<int32_t>>& index = op_index_;
  if (index.empty()) {
    index.assign(l_.pp, std::vector<int32_t>(3 * l_.vpp * m_, -1));
    for (int st = 0; st < l_.pp; ++st)
      for (size_t i = 0; i < orders_[st].size(); ++i) {
        const PipelineOp& op = orders_[st][i];
        index[st][key(op.kind, op.chunk, op.micro_batch)] = static_cast<int32_t>(i);
      }
  }
  const bool blocked = blocking();
  const size_t na = actives_.size();
  std::vector<sim::LabelId> names(2 * static_cast<size_t>(vstages_));
  // [to_stage][active index]: the transfers of the ranks each representative stands for.
  std::vector<std::vector<GroupId>> copies_to(l_.pp);
  std::vector<bool> copies_built(l_.pp, false);
  for (size_t i = 0; i < orders_[stage].size(); ++i) {
    const PipelineOp& op = orders_[stage][i];
    const int v = op.chunk * l_.pp + stage;
    const bool fwd = op.kind == PassKind::kForward;
    if (op.kind == PassKind::kWeight || (fwd && v + 1 == vstages_) || (!fwd && v == 0)) continue;
    const int to = fwd ? v + 1 : v - 1;
    const int to_stage = to % l_.pp;
    const int32_t k = index[to_stage][key(op.kind, to / l_.pp, op.micro_batch)];
    const PlacedBlock& boundary = chunks_[fwd ? v : to].back();
    const Bytes bytes = costs_[0][0][boundary.module].boundary_bytes;
    const int li = v * 2 + (fwd ? 0 : 1);
    if (!names[li].valid())
      names[li] = g_.label(fmt::format("v{} -> v{} {}", v, to, fwd ? "activation" : "grad"));
    const sim::LabelId name = names[li];
    // Reduced: the representatives' transfers; every other local rank's is a copy of its
    // owner's.
    std::vector<GroupId>& copies = copies_to[to_stage];
    if (!copies_built[to_stage]) {
      copies_built[to_stage] = true;
      copies.assign(actives_.size(), GroupId());
      if (reduced_) {
        std::vector<std::vector<RankId>> pairs(actives_.size());
        for (int j = 0; j < n; ++j) {
          if (active(j)) continue;
          std::vector<RankId>& m = pairs[slot_[owner_[j]]];
          m.push_back(rank_of(j, stage));
          m.push_back(rank_of(j, to_stage));
        }
        for (size_t a = 0; a < actives_.size(); ++a)
          if (!pairs[a].empty()) copies[a] = g_.add_group(pairs[a]);
      }
    }
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int j = actives_[a];
      const TaskId before = spans_[stage][i][a].last, after = spans_[to_stage][k][a].first;
      const RankId src = rank_of(j, stage), dst = rank_of(j, to_stage);
      if (src == dst) {
        g_.add_dependency(before, after);
        continue;
      }
      const TaskId x = g_.add_p2p(src, dst, bytes, fwd ? kFwdSend : kBwdSend,
                                  fwd ? kFwdRecv : kBwdRecv, {cat_pp_, name}, copies[a]);
      g_.add_dependency(before, x);
      g_.add_dependency(x, after);
      if (blocked) {
        sent_[stage][i * na + a] = x;
        received_[to_stage][static_cast<size_t>(k) * na + a] = x;
      }
    }
  }
}

bool Lowering::rendezvous() const {
  return blocking() && role_.orders.empty() && p_.schedule != Schedule::kZeroBubble &&
         !l_.ep_comm_overlap;
}

// The blocking calls on `stage` (schedule.h, blocking_calls): the op after a call waits for
// all it moved (after the last op: what the trainer issues then); with the rendezvous each
// transfer also waits for the calls of both its ends to be issued.
void Lowering::blocking_calls(int stage) {
  const std::vector<PipelineOp>& order = orders_[stage];
  const bool meet = rendezvous();
  // Without the rendezvous: a call after every op, the non-interleaved rule on any order.
  const PipelineCalls pc =
      planner::blocking_calls(meet ? p_.schedule : Schedule::k1F1B, order, stage, l_.pp);
  const int32_t n = static_cast<int32_t>(order.size());
  const size_t na = actives_.size();
  for (size_t a = 0; a < na; ++a) {
    // The op after call c waits for x; after the last op, what the trainer issues then.
    auto hold = [&](TaskId x, int32_t c) {
      const int32_t next = pc.calls[c].after_op + 1;
      if (next < n) {
        const TaskId t = spans_[stage][next][a].first;
        if (t.valid()) g_.add_dependency(x, t);
      } else if (stage < static_cast<int>(after_pipeline_.size()) &&
                 a < after_pipeline_[stage].size()) {  // none for a frozen module
        const AfterPipeline& after_last = after_pipeline_[stage][a];
        for (TaskId t : {after_last.optimizer, after_last.reduction})
          if (t.valid()) g_.add_dependency(x, t);
      }
    };
    auto after_op = [&](int32_t op, TaskId x) {
      if (const TaskId t = spans_[stage][op][a].last; t.valid()) g_.add_dependency(t, x);
    };
    for (int32_t i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(i) * na + a;
      if (const TaskId x = sent_[stage][at]; x.valid()) {
        const int32_t c = pc.send_call[i], issued = pc.calls[c].after_op;
        if (issued > i) after_op(issued, x);
        hold(x, c);
      }
      if (!meet) continue;
      if (const TaskId x = received_[stage][at]; x.valid()) {
        const int32_t c = pc.recv_call[i], issued = pc.calls[c].after_op;
        if (issued >= 0) after_op(issued, x);
        if (pc.calls[c].sends_first)
          if (const TaskId y = sent_[stage][static_cast<size_t>(issued) * na + a]; y.valid())
            g_.add_dependency(y, x);
        if (issued + 1 < i) hold(x, c);  // op i itself already waits for its input
      }
    }
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
                                                const std::vector<Boundary>& bounds) {
  const bool colocated = p.placement == Placement::kColocated;
  const Layout& L = p.layout;
  const bool three_phase = colocated && L.pp > 1;
  const std::optional<std::vector<int>> llm_kinds =
      replica_classes(s, L, colocated ? 0 : p.llm_first_rank, three_phase);
  if (!llm_kinds) return std::nullopt;
  // Replicas on different kinds of node (one class per kind) only where every module's
  // replica is fed from its own GPUs: colocated with the LLM at pp 1. Non-colocated, a
  // replica's boundary traffic would also depend on the kind of its feeders' nodes. Three
  // phases come close but not exactly: on the mixed example's colocated PP2 plan the
  // representatives' dp_comm differs from every rank's (0.0630 against 0.0634 s per rank,
  // 5e-5 of the iteration; the first task apart is the H100 stage's first gradient
  // reduce-scatter, 2.97 against 3.16 ms, beside the pipeline's gradient transfers), so
  // those plans keep every rank.
  const bool kinds_apart = colocated && !three_phase;
  auto one_kind = [](const std::vector<int>& kinds) {
    return std::all_of(kinds.begin(), kinds.end(), [](int c) { return c == 0; });
  };
  if (!kinds_apart && !one_kind(*llm_kinds)) return std::nullopt;
  const int world = s.cluster.total_gpus();
  HeteroReduction r;
  r.llm.replica_class.assign(static_cast<size_t>(L.dp), 0);
  r.llm.whole_replicas = three_phase;
  // Colocated, LLM pp 1: every GPU runs the same program (one class each). Three phases:
  // LLM replicas alike (each fed from its own GPUs), encoder replicas by which of their LLM
  // replica's micro-batches they feed. Non-colocated: LLM replicas by their place among an
  // encoder replica's fan-out destinations (d mod the fan-outs' lcm), encoder replicas by
  // their fan-in index and the class of the LLM replicas they feed.
  int period = 1;
  if (!colocated)
    for (const Boundary& b : bounds) period = std::lcm(period, b.fan_out);
  // Each class also keeps to one kind of node (replica_classes): (place, kind) pairs.
  std::map<std::pair<int, int>, int> llm_ids;
  for (int d = 0; d < L.dp; ++d)
    r.llm.replica_class[d] =
        llm_ids.emplace(std::pair{d % period, (*llm_kinds)[d]}, static_cast<int>(llm_ids.size()))
            .first->second;
  for (size_t k = 0; k < bounds.size(); ++k) {
    const Boundary& b = bounds[k];
    const Layout& E = p.modules[k].layout;
    if (three_phase && b.local_block == 0) return std::nullopt;
    const std::optional<std::vector<int>> kinds =
        replica_classes(s, E, colocated ? 0 : p.modules[k].first_rank);
    if (!kinds || (!kinds_apart && !one_kind(*kinds))) return std::nullopt;
    Reduction& er = r.encoders.emplace_back();
    er.whole_replicas = three_phase;
    std::map<std::tuple<int, int, int>, int> ids;
    for (int e = 0; e < E.dp; ++e) {
      std::pair<int, int> key{0, 0};
      if (three_phase) key.first = b.feeder_index(e);
      if (!colocated) {
        const int first_fed = b.fan_out > 1 ? e * b.fan_out : e / b.fan_in;
        key = {b.feeder_index(e), first_fed % period};
      }
      const std::tuple<int, int, int> full{key.first, key.second, (*kinds)[e]};
      er.replica_class.push_back(ids.emplace(full, static_cast<int>(ids.size())).first->second);
    }
    // Boundary routes alike within a class: for the pairs of one encoder step, whether
    // the leaders share the GPU or the node is the class representative's.
    if (colocated && !three_phase) continue;
    const int llm_first = colocated ? 0 : p.llm_first_rank;
    // The encoder's leaders sit on its last stage.
    const int enc_first = colocated ? 0 : p.modules[k].first_rank + (E.pp - 1) * E.tp * E.dp;
    for (int64_t i = 0; i < b.llm_per_step; ++i) {
      std::vector<int> route_of_class(static_cast<size_t>(period), -1);
      for (int d = 0; d < L.dp; ++d) {
        const int src = enc_first + b.source_replica(d, i) * E.tp;
        const int dst = llm_first + d * L.tp * L.cp;
        const int route = src == dst                                                 ? 0
                          : s.cluster.node_of_gpu(src) == s.cluster.node_of_gpu(dst) ? 1
                                                                                     : 2;
        int& known = route_of_class[static_cast<size_t>(r.llm.replica_class[d])];
        if (known >= 0 && known != route) return std::nullopt;
        known = route;
      }
    }
  }
  // Multiplicities per GPU; colocated modules must agree on every GPU they share.
  r.multiplicity.assign(static_cast<size_t>(world), -1);
  auto claim = [&](const Layout& l, const Reduction& red, int offset) {
    const std::vector<int> own = owners(l, red);
    std::vector<int32_t> count(own.size(), 0);
    for (int o : own) ++count[static_cast<size_t>(o)];
    for (int st = 0; st < l.pp; ++st)
      for (size_t j = 0; j < own.size(); ++j) {
        int32_t& m = r.multiplicity[static_cast<size_t>(offset) + st * own.size() + j];
        if (m >= 0 && m != count[j]) return false;
        m = count[j];
      }
    return true;
  };
  if (!claim(L, r.llm, colocated ? 0 : p.llm_first_rank)) return std::nullopt;
  for (size_t k = 0; k < bounds.size(); ++k)
    if (!claim(p.modules[k].layout, r.encoders[k], colocated ? 0 : p.modules[k].first_rank))
      return std::nullopt;
  return r;
}

// Colocated and non-colocated plans (boundary.h has the mapping and the communication).
// Each encoder and the LLM are Lowerings of their own modules on their own ranks, joined by
// boundary tasks; where the placement keeps DP replicas alike, representatives stand for
// their classes (hetero_reduction), and the boundary's transfers and collectives are
// emitted for the simulated ranks only, the rest as copies.
void lower_heterogeneous(const Scenario& s, const Plan& p, const LowerOptions& o,
                         LoweredPlan& out) {
  const bool colocated = p.placement == Placement::kColocated;
  const Layout& L = p.layout;
  // Colocated with LLM pp > 1: three phases (every encoder forward, the LLM's pipeline, every
  // encoder backward); the boundary then moves data as non-colocated (leader P2P +
  // broadcast), a leader sending to itself being a dependency only.
  const bool three_phase = colocated && L.pp > 1;
  const size_t llm_index = s.model.llm_index();
  out.world = s.cluster.total_gpus();
  out.network = build_network(s.cluster);
  sim::TaskGraph& g = out.graph;
  const sim::LabelId cat = g.label("boundary_comm");

  std::vector<Boundary> bounds;
  for (const ModulePlan& mp : p.modules) bounds.push_back(make_boundary(s, p, mp));
  std::optional<HeteroReduction> red;
  if (!o.full_ranks) red = hetero_reduction(s, p, bounds);
  out.representatives = red.has_value();
  if (red)
    for (int r = 0; r < out.world; ++r)
      if (red->multiplicity[r] >= 0) g.set_multiplicity(RankId(r), red->multiplicity[r]);

  Role llm_role;
  llm_role.modules = {llm_index};
  llm_role.rank_offset = colocated ? 0 : p.llm_first_rank;
  if (red) llm_role.reduction = red->llm;
  Lowering llm(s, p, o, out, llm_role);
  const std::vector<PipelineOp> llm0 = stage_order(
      p.schedule, 0, L.pp, L.vpp, s.workload.global_batch / (int64_t{L.micro_batch} * L.dp),
      extra_warmup(L), microbatch_group(L));
  const int nenc = static_cast<int>(p.modules.size());
  std::vector<std::unique_ptr<Lowering>> encs;
  std::vector<std::vector<MergedOp>> merged(p.modules.size());
  for (size_t k = 0; k < p.modules.size(); ++k) {
    const ModulePlan& mp = p.modules[k];
    Role r;
    r.layout = &mp.layout;
    r.modules = {bounds[k].encoder};
    for (const models::Edge& e : s.model.edges)
      if (e.from == bounds[k].encoder &&
          models::kind_of(s.model.modules[e.to].spec) == models::ModuleKind::kProjector)
        r.modules.push_back(e.to);
    r.rank_offset = colocated ? 0 : mp.first_rank;
    r.stream_offset = kCommStreams * static_cast<int32_t>(k + 1);
    r.encoder_categories = true;
    r.frozen = s.workload.frozen_encoders;
    for (int st = 0; st < mp.layout.pp; ++st)
      r.orders.push_back(
          three_phase ? three_phase_program(bounds[k], r.frozen)
          : colocated ? encoder_program(bounds[k], llm0, r.frozen, &merged[k])
                      : leading_stage_program(bounds[k], llm0, L.pp, r.frozen, mp.layout.pp, st));
    r.prefix = mp.module + " ";
    if (red) r.reduction = red->encoders[k];
    encs.push_back(std::make_unique<Lowering>(s, p, o, out, std::move(r)));
  }
  out.micro_batches = llm0.empty() ? 0 : s.workload.global_batch / (int64_t{L.micro_batch} * L.dp);

  if (three_phase) {
    for (auto& e : encs) {
      e->setup();
      e->begin_stage(0);
      for (size_t i = 0; i < e->order(0).size(); ++i)
        if (e->order(0)[i].kind == PassKind::kForward) e->op(i);
    }
    llm.run();
    for (auto& e : encs) {
      for (size_t i = 0; i < e->order(0).size(); ++i)
        if (e->order(0)[i].kind == PassKind::kBackward) e->op(i);
      e->end_stage();
      e->finish();
    }
  } else if (colocated) {  // one stage each, on the same ranks: interleave the programs
    llm.setup();
    llm.begin_stage(0);
    for (auto& e : encs) {
      e->setup();
      e->begin_stage(0);
    }
    // With several encoders, each runs its ops just before the LLM op they precede.
    std::vector<size_t> pos(encs.size(), 0);
    for (size_t i = 0; i < llm0.size(); ++i) {
      for (size_t k = 0; k < encs.size(); ++k)
        while (pos[k] < merged[k].size() && merged[k][pos[k]].encoder)
          encs[k]->op(merged[k][pos[k]++].index);
      for (size_t k = 0; k < encs.size(); ++k) ++pos[k];  // the LLM op itself
      llm.op(i);
      for (size_t k = 0; k < encs.size(); ++k)  // encoder backwards right after it
        while (pos[k] < merged[k].size() && merged[k][pos[k]].encoder &&
               encs[k]->order(0)[merged[k][pos[k]].index].kind == PassKind::kBackward)
          encs[k]->op(merged[k][pos[k]++].index);
    }
    for (auto& e : encs) {
      e->end_stage();
      e->finish();
    }
    llm.end_stage();
    llm.finish();
  } else {
    for (auto& e : encs) e->run();
    llm.run();
  }

  // Op indices of (kind, micro-batch) in a single-stage program (chunk 0).
  auto index_of = [](const std::vector<PipelineOp>& order, PassKind kind, int64_t m) {
    std::vector<int64_t> idx(static_cast<size_t>(m), -1);
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].kind == kind && order[i].chunk == 0)
        idx[static_cast<size_t>(order[i].micro_batch)] = static_cast<int64_t>(i);
    return idx;
  };
  const int64_t ml = llm.micro_batches();
  const std::vector<int64_t> lf = index_of(llm.order(0), PassKind::kForward, ml);
  const std::vector<int64_t> lb = index_of(llm.order(0), PassKind::kBackward, ml);
  const int llm_group = L.tp * L.cp;  // one LLM replica's ranks on stage 0
  std::vector<RankId> members;
  for (size_t k = 0; k < encs.size(); ++k) {
    Lowering& enc = *encs[k];
    const Boundary& b = bounds[k];
    const Layout& E = p.modules[k].layout;
    const bool frozen = s.workload.frozen_encoders;
    const int es = E.pp - 1;  // the encoder's last stage, where the boundary leaves
    const std::vector<int64_t> ef = index_of(enc.order(es), PassKind::kForward, b.enc_steps);
    const std::vector<int64_t> eb = index_of(enc.order(es), PassKind::kBackward, b.enc_steps);
    const int32_t base = kCommStreams * (nenc + 1) + 6 * static_cast<int32_t>(k);
    const int32_t fwd_send = base, fwd_recv = base + 1, bwd_send = base + 2, bwd_recv = base + 3,
                  fwd_coll = base + 4, bwd_coll = base + 5;
    const std::string& name = p.modules[k].module;
    static constexpr std::string_view kBoundaryStream[] = {
        "activations send", "activations recv",   "gradients send",
        "gradients recv",   "activations gather", "gradients scatter"};
    for (int32_t i = 0; i < 6; ++i)
      g.set_stream_name(sim::StreamKind::kComm, base + i,
                        fmt::format("{} boundary {}", name, kBoundaryStream[i]));
    const sim::LabelId fwd_name = g.label(fmt::format("{} -> llm activation", name));
    const sim::LabelId bwd_name = g.label(fmt::format("llm -> {} grad", name));
    auto collective = [&](CollectiveKind kind, Bytes bytes, int32_t stream, RankId root,
                          sim::LabelId label, GroupId copies) {
      sim::CollectiveSpec spec;
      spec.kind = kind;
      spec.group = members;
      spec.bytes = bytes;
      spec.stream = stream;
      spec.root = root;
      spec.copies = copies;
      return g.add_collective(spec, {cat, label});
    };
    auto group_of = [&](const std::vector<RankId>& ranks) {
      return ranks.empty() ? GroupId() : g.add_group(ranks);
    };
    if (!colocated || three_phase) {
      std::vector<RankId> fwd_pairs, bwd_pairs, llm_copies, enc_copies, cp_copies;
      for (int64_t i = 0; i < ml; ++i)
        for (int d = 0; d < L.dp; ++d) {
          const int jl = d * llm_group;
          if (!llm.simulated(jl)) continue;  // a copy of its class representative's
          const int64_t t = b.step_of(i);
          const int e = b.source_replica(d, i);
          const int je = e * E.tp;
          const RankId enc_leader = enc.rank_of(je, es), llm_leader = llm.rank_of(jl, 0);
          // Reduced: the same transfers of the other LLM replicas of d's class are copies.
          fwd_pairs.clear();
          bwd_pairs.clear();
          llm_copies.clear();
          enc_copies.clear();
          cp_copies.clear();
          for (int d2 = 0; d2 < L.dp && red; ++d2) {
            if (d2 == d || red->llm.replica_class[d2] != red->llm.replica_class[d]) continue;
            const int je2 = b.source_replica(d2, i) * E.tp, jl2 = d2 * llm_group;
            const RankId src = enc.rank_of(je2, es), dst = llm.rank_of(jl2, 0);
            fwd_pairs.insert(fwd_pairs.end(), {src, dst});
            bwd_pairs.insert(bwd_pairs.end(), {dst, src});
            for (int q = 0; q < llm_group; ++q) llm_copies.push_back(llm.rank_of(jl2 + q, 0));
            for (int q = 0; q < E.tp; ++q) enc_copies.push_back(enc.rank_of(je2 + q, es));
            for (int q = 0; q < L.cp; ++q) cp_copies.push_back(llm.rank_of(jl2 + q * L.tp, 0));
          }
          // A leader sending to itself (three-phase colocated): a dependency only.
          TaskId ready = enc.span(es, static_cast<size_t>(ef[t]), enc.owner(je)).last;
          if (enc_leader != llm_leader) {
            const TaskId x = g.add_p2p(enc_leader, llm_leader, b.bytes_per_micro_batch, fwd_send,
                                       fwd_recv, {cat, fwd_name}, group_of(fwd_pairs));
            g.add_dependency(ready, x);
            ready = x;
          }
          if (llm_group > 1) {
            members.clear();
            for (int q = 0; q < llm_group; ++q) members.push_back(llm.rank_of(jl + q, 0));
            const TaskId bc = collective(CollectiveKind::kBroadcast, b.bytes_per_micro_batch,
                                         fwd_coll, llm_leader, fwd_name, group_of(llm_copies));
            g.add_dependency(ready, bc);
            ready = bc;
          }
          for (int q = 0; q < llm_group; ++q)
            if (llm.simulated(jl + q))
              g.add_dependency(ready, llm.span(0, static_cast<size_t>(lf[i]), jl + q).first);
          if (frozen) continue;
          TaskId got = llm.span(0, static_cast<size_t>(lb[i]), jl).last;
          if (L.cp > 1) {  // the leader gathers the CP chunks of the gradient first
            members.clear();
            for (int q = 0; q < L.cp; ++q) members.push_back(llm.rank_of(jl + q * L.tp, 0));
            got = collective(CollectiveKind::kAllGather, b.bytes_per_micro_batch, bwd_coll,
                             RankId(), bwd_name, group_of(cp_copies));
            for (int q = 0; q < L.cp; ++q)
              if (llm.simulated(jl + q * L.tp))
                g.add_dependency(llm.span(0, static_cast<size_t>(lb[i]), jl + q * L.tp).last, got);
          }
          if (enc_leader != llm_leader) {
            const TaskId y = g.add_p2p(llm_leader, enc_leader, b.bytes_per_micro_batch, bwd_send,
                                       bwd_recv, {cat, bwd_name}, group_of(bwd_pairs));
            g.add_dependency(got, y);
            got = y;
          }
          if (E.tp > 1) {
            members.clear();
            for (int q = 0; q < E.tp; ++q) members.push_back(enc.rank_of(je + q, es));
            const TaskId bc = collective(CollectiveKind::kBroadcast, b.bytes_per_micro_batch,
                                         bwd_coll, enc_leader, bwd_name, group_of(enc_copies));
            g.add_dependency(got, bc);
            got = bc;
          }
          for (int q = 0; q < E.tp; ++q)
            if (enc.simulated(je + q))
              g.add_dependency(got, enc.span(es, static_cast<size_t>(eb[t]), je + q).first);
        }
      continue;
    }
    // Colocated (pp 1): rank r is local rank r of both (one stage each, offset 0). Groups
    // of GPUs; reduced (the GPUs of one node group alike, one simulated per node group):
    // only the groups holding a simulated GPU, each with the other groups on its node group
    // as its copies.
    struct Groups {
      std::vector<std::vector<RankId>> all;
      std::vector<size_t> emitted;
      std::vector<GroupId> copies;  // per emitted group
    };
    auto make = [&](std::vector<std::vector<RankId>> all) {
      Groups gs;
      gs.all = std::move(all);
      auto kind = [&](size_t q) { return s.cluster.group_of_gpu(gs.all[q].front().value()); };
      std::vector<size_t> rest;
      for (size_t q = 0; q < gs.all.size(); ++q) {
        const bool sim = std::any_of(gs.all[q].begin(), gs.all[q].end(),
                                     [&](RankId r) { return g.multiplicity(r) != 0; });
        (sim || !red ? gs.emitted : rest).push_back(q);
      }
      std::vector<std::vector<RankId>> copies(gs.emitted.size());
      for (size_t q : rest) {
        size_t e = 0;
        while (e < gs.emitted.size() && kind(gs.emitted[e]) != kind(q)) ++e;
        HETPAR_CHECK(e < gs.emitted.size(), "colocated reduction: a node group simulates none");
        copies[e].insert(copies[e].end(), gs.all[q].begin(), gs.all[q].end());
      }
      for (const std::vector<RankId>& c : copies) gs.copies.push_back(group_of(c));
      return gs;
    };
    const int world = out.world;
    // Forward fan-in: the gather groups (the fan_in encoder ranks with one encoder TP index
    // in the replicas feeding one LLM replica).
    Groups gather;
    if (b.fan_in > 1) {
      std::vector<std::vector<RankId>> all;
      for (int d = 0; d < L.dp; ++d)
        for (int tt = 0; tt < E.tp; ++tt) {
          all.emplace_back();
          for (int q = 0; q < b.fan_in; ++q)
            all.back().push_back(RankId(tt + E.tp * (d * b.fan_in + q)));
        }
      gather = make(std::move(all));
    }
    // Backward: over the LLM ranks with one TP index that hold parts of the gradient one
    // encoder replica needs: fan-out, the sibling slices of the r LLM replicas it spans (and,
    // with cp > 1, every CP chunk of each: r x cp members); fan-in / equal with cp > 1, the
    // CP chunks of one replica. Groups {r0 + q*tp}, CP index fastest.
    Groups back;
    const int n = (b.fan_out > 1 ? b.fan_out : 1) * L.cp;
    if (b.fan_out > 1 || L.cp > 1) {
      const int stride = L.tp;
      std::vector<std::vector<RankId>> all;
      for (int r0 = 0; r0 < world; ++r0) {
        if ((r0 % (stride * n)) >= stride) continue;
        all.emplace_back();
        for (int u = 0; u < n; ++u) all.back().push_back(RankId(r0 + u * stride));
      }
      back = make(std::move(all));
    }
    const Bytes step_bytes = b.bytes_per_micro_batch * b.llm_per_step;  // per LLM replica
    for (int64_t t = 0; t < b.enc_steps; ++t) {
      const int64_t i0 = t * b.llm_per_step, i1 = i0 + b.llm_per_step - 1;
      const size_t enc_f = static_cast<size_t>(ef[t]), llm_f = static_cast<size_t>(lf[i0]);
      // Forward.
      if (b.fan_in > 1) {
        for (size_t e = 0; e < gather.emitted.size(); ++e) {
          members = gather.all[gather.emitted[e]];
          const TaskId ag = collective(CollectiveKind::kAllGather, step_bytes, fwd_coll, RankId(),
                                       fwd_name, gather.copies[e]);
          for (RankId r : members) {
            if (g.multiplicity(r) == 0) continue;
            g.add_dependency(enc.span(0, enc_f, r.value()).last, ag);
            g.add_dependency(ag, llm.span(0, llm_f, r.value()).first);
          }
        }
      } else {  // equal: pass-through; fan-out: narrow to the local slice
        for (int r = 0; r < world; ++r)
          if (g.multiplicity(RankId(r)) != 0)
            g.add_dependency(enc.span(0, enc_f, r).last, llm.span(0, llm_f, r).first);
      }
      if (frozen) continue;
      // Backward: after the step's last LLM micro-batch backward on every rank.
      const size_t enc_b = static_cast<size_t>(eb[t]), llm_b = static_cast<size_t>(lb[i1]);
      if (b.fan_out > 1 || L.cp > 1) {
        const Bytes bytes = b.fan_out > 1 ? step_bytes * b.fan_out : step_bytes;
        for (size_t e = 0; e < back.emitted.size(); ++e) {
          members = back.all[back.emitted[e]];
          const TaskId ag = collective(CollectiveKind::kAllGather, bytes, bwd_coll, RankId(),
                                       bwd_name, back.copies[e]);
          for (RankId r : members) {
            if (g.multiplicity(r) == 0) continue;
            g.add_dependency(llm.span(0, llm_b, r.value()).last, ag);
            g.add_dependency(ag, enc.span(0, enc_b, r.value()).first);
          }
        }
      } else {
        for (int r = 0; r < world; ++r)
          if (g.multiplicity(RankId(r)) != 0)
            g.add_dependency(llm.span(0, llm_b, r).last, enc.span(0, enc_b, r).first);
      }
    }
  }
}

}  // namespace

bool simulates_representatives(const Scenario& s, const Plan& p) {
  if (p.placement == Placement::kHomogeneous) return replica_classes(s, p.layout, 0).has_value();
  std::vector<Boundary> bounds;
  for (const ModulePlan& mp : p.modules) bounds.push_back(make_boundary(s, p, mp));
  return hetero_reduction(s, p, bounds).has_value();
}

bool ranks_share_compute(const Scenario& s) {
  // Per node group, not per node: a search asks for every candidate it estimates.
  const auto& groups = s.cluster.groups();
  return std::any_of(groups.begin(), groups.end(), [](const hardware::NodeGroup& g) {
    return g.profile.shared_compute_units > 0;
  });
}

// About how many tasks lower() builds for `p`: simulated ranks x micro-batches x layers x
// tasks per layer and pass (forward, backward). A layer is one compute task, or with
// tp > 1 five compute stretches between four TP collectives (sequence parallelism's
// all-gathers and reduce-scatters); CP's ring attention turns one stretch into cp parts
// and cp - 1 transfers; EP adds its all-to-alls. Simulated ranks (lower.h): one
// representative per stage, a whole representative replica (colocated three-phase), or
// every rank.
double estimated_tasks(const Scenario& s, const Plan& p, bool every_rank) {
  auto per_layer = [](const Layout& l) {
    return (l.tp > 1 ? 9.0 : 1.0) + (l.cp > 1 ? 2.0 * (l.cp - 1) : 0.0) + (l.ep > 1 ? 4.0 : 0.0);
  };
  auto layers_of = [&](const std::string& module) -> double {
    const std::optional<size_t> i = s.model.find(module);
    const models::TransformerSpec* t =
        i ? models::transformer_of(s.model.modules[*i].spec) : nullptr;
    return t ? static_cast<double>(t->layers) : 1.0;
  };
  const int64_t gb = s.workload.global_batch;
  const Layout& L = p.layout;
  const bool alike = !every_rank && !ranks_share_compute(s) && simulates_representatives(s, p);
  const bool whole = p.placement == Placement::kColocated && L.pp > 1;
  const double replica = whole ? static_cast<double>(L.tp * L.cp) : 1.0;
  const double ranks = alike ? replica * L.pp : L.world();
  const double llm_layers = layers_of(s.model.modules[s.model.llm_index()].name);
  const double m = static_cast<double>(num_micro_batches(L, gb));
  double tasks = ranks * m * (llm_layers / L.pp * per_layer(L) + 2) * 2;
  if (p.placement == Placement::kHomogeneous)  // encoders on the first stage, same layout
    for (const models::Module& mod : s.model.modules)
      if (models::is_encoder(models::kind_of(mod.spec)))
        tasks += (alike ? 1.0 : L.tp * L.cp * L.dp) * m * layers_of(mod.name) * per_layer(L) * 2;
  for (const ModulePlan& e : p.modules) {
    const Layout& E = e.layout;
    const double enc_ranks = !alike ? E.world() : whole ? replica * L.pp : E.pp;
    const double steps = static_cast<double>(gb / (int64_t{E.micro_batch} * E.dp));
    tasks += enc_ranks * steps * (layers_of(e.module) / E.pp * per_layer(E) + 2) * 2;
  }
  return tasks;
}

Result<LoweredPlan> lower(const Scenario& s, const Plan& p, const LowerOptions& o) {
  std::string why = infeasibility(s, p);
  if (!why.empty()) return Status::invalid_argument(why);
  bool userbuffers = p.layout.tp_comm_overlap;
  for (const ModulePlan& m : p.modules) userbuffers = userbuffers || m.layout.tp_comm_overlap;
  if (o.kernels && userbuffers)
    return Status::invalid_argument(
        "tp_comm_overlap: the executor runs each TP collective as one NCCL call after its "
        "GEMM, not as userbuffers' chunked ring exchange");
  LoweredPlan out;
  if (o.reuse) {
    out.graph = std::move(*o.reuse);
    out.graph.clear();
  }
  if (p.placement == Placement::kHomogeneous)
    Lowering(s, p, o, out).run();
  else
    lower_heterogeneous(s, p, o, out);
  return out;
}

}  // namespace hetpar::planner
