#include "hetpar/planner/search.h"

#include <fmt/format.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <tuple>

#include "hetpar/core/format.h"
#include "hetpar/planner/cost_model.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner {

namespace {

using models::Recompute;
using models::RecomputePolicy;

constexpr Recompute kRecomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
// A MoE LLM's selective recompute also re-runs Megatron-Core's output-discarding modules
// (Layout::recompute_modules): the norm and activation alone, as the Megatron-Core MoE
// team's Qwen3 and DeepSeek-V3 recipes run them, or with the attention core; and the norm
// with the whole MoE layer, as their long-context runs do, tried where the norm and
// activation do not fit (it re-runs no less, recomputes_no_less).
constexpr uint8_t kMoeRecomputeModules[] = {
    models::kRecomputeLayernorm | models::kRecomputeMoeAct,
    models::kRecomputeCoreAttn | models::kRecomputeLayernorm | models::kRecomputeMoeAct,
    models::kRecomputeLayernorm | models::kRecomputeMoe};
// With shared experts, also the norm, the activation and the shared experts (between the
// norm and activation alone and the whole MoE layer, which re-runs no less).
constexpr uint8_t kSharedExpertsRecomputeModules =
    models::kRecomputeLayernorm | models::kRecomputeMoeAct | models::kRecomputeSharedExperts;
// A dense LLM's: the attention core with the whole MLP, between the attention core alone and
// full recompute (tried where the core alone does not fit; full, which re-runs no less, is
// then tried only where this does not).
constexpr uint8_t kDenseRecomputeModules = models::kRecomputeCoreAttn | models::kRecomputeMlp;

// The recompute policy as one key: its kind and, under selective, its modules.
int recompute_key(const Layout& l) {
  return static_cast<int>(l.recompute) * 256 + l.recompute_modules;
}

constexpr Placement kPlacements[] = {Placement::kHomogeneous, Placement::kColocated,
                                     Placement::kNonColocated};
// Candidates simulated per batch: fixed, so which candidates are simulated does not
// depend on the thread count.
constexpr size_t kBatch = 8;
// Heterogeneous plans: encoder layouts simulated per LLM side (the lowest bounds first).
// 4 since the search offers splits that count the embedding and loss as layers: with 3 the
// brute-force check (Search.FindsTheBruteForceBestAndTheBoundHolds) found a better encoder
// layout beside such a split; 4 simulates 35 -> 41 plans on examples/default.json and
// 66 -> 77 on the InternViT / Llama 70B example, its wall time within the VM's noise.
constexpr int kEncoderVariants = 4;

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The encoders the workload feeds (module indices), each with its projectors.
struct EncoderInfo {
  size_t index = 0;
  std::string name;
  std::vector<size_t> projectors;
};

std::vector<EncoderInfo> fed_encoders(const Scenario& s) {
  std::vector<EncoderInfo> out;
  const models::ModelSpec& model = s.model;
  for (size_t i = 0; i < model.modules.size(); ++i) {
    if (!models::is_encoder(models::kind_of(model.modules[i].spec))) continue;
    if (module_input(s, i, 1).items_per_sample < 1) continue;
    EncoderInfo e{i, model.modules[i].name, {}};
    for (const models::Edge& ed : model.edges)
      if (ed.from == i &&
          models::kind_of(model.modules[ed.to].spec) == models::ModuleKind::kProjector)
        e.projectors.push_back(ed.to);
    out.push_back(std::move(e));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Lower bound (see search.h).

// One block's per-micro-batch time on one rank: forward, backward (dgrad + wgrad +
// recompute) and the part of the backward that cannot be deferred (ZB-H1 defers wgrad).
// tp_hidden: the TP entries' backward collectives the next linear's wgrad may hide
// (WorkStep::overlaps_tp_entry), left out of b; a ZB-H1 schedule, which defers that wgrad,
// exposes them (b_input keeps them). ep_overlapped: under the EP all-to-all overlap, the
// dispatch's and the combine's all-to-alls forward and backward, which another
// micro-batch's compute may hide but which one stream serialises: a floor of a stage's
// time per micro-batch beside f + b; ep_rail_overlapped the same for DeepEP's transfers
// across nodes, on a stream of their own.
struct BlockTime {
  Time f, f_compute, b, b_input, tp_hidden, ep_overlapped, ep_rail_overlapped;
  BlockTime& add(const BlockTime& o, int64_t times = 1) {
    f += o.f * times;
    f_compute += o.f_compute * times;
    b += o.b * times;
    b_input += o.b_input * times;
    tp_hidden += o.tp_hidden * times;
    ep_overlapped += o.ep_overlapped * times;
    ep_rail_overlapped += o.ep_rail_overlapped * times;
    return *this;
  }
};

struct ModuleTime {
  BlockTime pre, post;
  int64_t layers = 0;
  int64_t pre_params = 0, post_params = 0;  // per rank, dense
  Bytes boundary;  // one micro-batch's activation between pipeline stages, per rank
  // A layer of each kind (models::LayerKinds::kind()): the module's layer, an MoE LLM's
  // dense layers, and either with a sliding window; their dense parameters per rank.
  std::array<BlockTime, 4> kind;
  std::array<int64_t, 4> kind_params{};
  models::LayerKinds kinds;
  // An LLM's multi-token-prediction depths (ModuleCost::mtp), after `post`.
  BlockTime mtp;
  int64_t mtp_params = 0;
  // Of layers [first, first + n), how many of each kind.
  std::array<int64_t, 4> kind_counts(int64_t first, int64_t n) const {
    if (kinds.prefix_only()) {
      const int64_t d = std::clamp<int64_t>(kinds.dense_layers - first, 0, n);
      return {n - d, d, 0, 0};
    }
    std::array<int64_t, 4> c{};
    for (int64_t i = first; i < first + n; ++i) ++c[kinds.kind(i)];
    return c;
  }
  // Layers [first, first + n) together.
  BlockTime layers_time(int64_t first, int64_t n) const {
    const std::array<int64_t, 4> c = kind_counts(first, n);
    BlockTime t;
    for (size_t k = 0; k < kind.size(); ++k) t.add(kind[k], c[k]);
    return t;
  }
  int64_t layers_params(int64_t first, int64_t n) const {
    const std::array<int64_t, 4> c = kind_counts(first, n);
    int64_t p = 0;
    for (size_t k = 0; k < kind.size(); ++k) p += kind_params[k] * c[k];
    return p;
  }
};

// A TP collective's bandwidth time on an idle link: a lower bound of what simulate() gives
// it, which adds NCCL's latency and contention and, through `ramp` (the simulation's
// CollectiveConfig scales of the TP group's scope; none set: none), runs its flows at the
// share of the link its size reaches and, inside a node, its group size (NVLS's all_reduce
// above the link's rate).
using SizeScales = std::array<std::vector<CurvePoint>, sim::kNumCollectiveKinds>;
struct TpRamp {
  const SizeScales* size = nullptr;   // size_scale of the scope
  const SizeScales* group = nullptr;  // intra_node_group_scale; null across nodes
};
Time collective_time(sim::CollectiveKind kind, Bytes bytes, int n, Bandwidth link,
                     const TpRamp& ramp) {
  if (n <= 1 || bytes.count() == 0) return Time::zero();
  double factor = kind == sim::CollectiveKind::kAllReduce ? 2.0 * (n - 1) / n : (n - 1.0) / n;
  const auto k = static_cast<size_t>(kind);
  if (ramp.size) factor /= curve_factor((*ramp.size)[k], bytes.count());
  if (ramp.group) factor /= curve_factor((*ramp.group)[k], n);
  return Time::seconds(bytes.as_double() * factor / link.bytes_per_s());
}

// The fastest an EP group's all-to-all can run (block_time): inside a node at the TP link's
// rate or the profile's intra-node all_to_all where faster; across nodes, the part of a
// rank's buffer bound for other nodes through its NIC (the network's link, before NCCL's
// ramps, which only slow it), the rank sharing its node with at most `members_per_node`
// of the group.
// DeepEP across nodes (`rail_share` > 0, deepep_rail_share() over `rail_nodes`): the NVLink
// all-to-all over the rank's node and, beside it, each token once to each other node
// holding one of its experts, through the NIC: the longer of the two. DeepEP's NVLink
// bytes, inside a node or across, are the buffer's times `nvlink_share` (each token once per
// rank of its experts, deepep_nvlink_share()).
struct EpLinks {
  Bandwidth nvlink = Bandwidth::bytes_per_s(1e30);
  Bandwidth nic = Bandwidth::bytes_per_s(1e30);
  int members_per_node = 1;
  int rail_nodes = 1;
  double rail_share = 0;
  double nvlink_share = 1;  // DeepEP's NVLink bytes per byte of the buffer (deepep.h)
  Time all_to_all(Bytes bytes, int ep) const {
    if (ep <= 1 || bytes.count() == 0) return Time::zero();
    if (members_per_node >= ep)
      return collective_time(sim::CollectiveKind::kAllToAll, bytes, ep, nvlink, TpRamp{});
    return Time::seconds(bytes.as_double() * (ep - members_per_node) / ep / nic.bytes_per_s());
  }
  // DeepEP's parts: over NVLink inside the node, and through the NIC.
  Bytes sent(Bytes bytes) const { return Bytes(std::llround(bytes.as_double() * nvlink_share)); }
  Time deepep_nvlink(Bytes bytes) const { return all_to_all(sent(bytes), members_per_node); }
  Time deepep_rail(Bytes bytes) const {
    return Time::seconds(bytes.as_double() * rail_share * (rail_nodes - 1) / rail_nodes /
                         nic.bytes_per_s());
  }
};

// `cp_link`: at least the fastest all-to-all bandwidth a CP group can reach (the TP link, or
// the profile's intra-node all_to_all where faster), so that a2a CP's blocking all-to-alls
// count no more than the simulation gives them; `ep_links` the same for EP's. [begin, end):
// the steps counted (default all).
BlockTime block_time(const Block& b, const Layout& l, Bandwidth link, Bandwidth cp_link,
                     const EpLinks& ep_links, bool frozen, const TpRamp& ramp, size_t begin = 0,
                     size_t end = SIZE_MAX) {
  using CK = sim::CollectiveKind;
  const bool sp = l.sequence_parallel;
  auto tp_collective = [&](CK kind, Bytes bytes) {
    return collective_time(kind, bytes, l.tp, link, ramp);
  };
  BlockTime t;
  end = std::min(end, b.steps.size());
  for (size_t i = begin; i < end; ++i) {
    const WorkStep& st = b.steps[i];
    switch (st.kind) {
      case StepKind::kCompute:
      case StepKind::kCpAttention: {
        t.f += st.cost.forward;
        t.f_compute += st.cost.forward;
        t.b += st.cost.dgrad + st.cost.wgrad + st.cost.recompute;
        t.b_input += st.cost.dgrad + st.cost.recompute;
        if (st.kind == StepKind::kCpAttention && l.cp_heads_split() > 1) {
          // a2a CP: forward Q,K,V and the output, backward the output and its gradient and
          // dQ,dK,dV, each all-to-all blocking the compute after it (lower.h).
          auto a2a = [&](Bytes bytes) {
            return collective_time(CK::kAllToAll, bytes, l.cp_heads_split(), cp_link, TpRamp{});
          };
          const Bytes qkv = st.query_bytes + st.bytes;
          t.f += a2a(qkv) + a2a(st.out_bytes);
          const Time bwd = a2a(st.out_bytes * 2) + a2a(qkv);
          t.b += bwd;
          t.b_input += bwd;
        }
        break;
      }
      case StepKind::kTpEntry: {  // fwd: SP all-gather; bwd: SP reduce-scatter / all-reduce
        // Userbuffers run the forward all-gather beside the (chunked) linear after it.
        const bool ring = i + 1 < b.steps.size() && b.steps[i + 1].ring_exchange;
        if (sp && !ring) t.f += tp_collective(CK::kAllGather, st.gather_bytes);
        Time bwd = tp_collective(sp ? CK::kReduceScatter : CK::kAllReduce, st.bytes);
        Time hidden;
        if (i + 1 < b.steps.size() && b.steps[i + 1].overlaps_tp_entry)
          hidden = std::min(bwd, b.steps[i + 1].cost.wgrad);
        t.b += bwd - hidden;
        t.b_input += bwd;
        t.tp_hidden += hidden;
        break;
      }
      case StepKind::kTpExit: {  // fwd: SP reduce-scatter / all-reduce; bwd: SP all-gather
        // Userbuffers: only the reduce-scatter's last chunk follows the linear; the backward
        // all-gather runs beside its dgrad.
        if (i > 0 && b.steps[i - 1].ring_exchange) {  // on the copy engines: no NCCL ramp
          t.f += collective_time(CK::kReduceScatter, st.bytes / b.steps[i - 1].exit_chunks, l.tp,
                                 link, TpRamp{});
          break;
        }
        t.f += tp_collective(sp ? CK::kReduceScatter : CK::kAllReduce, st.bytes);
        if (sp) {
          Time bwd = tp_collective(CK::kAllGather, st.bytes);
          t.b += bwd;
          t.b_input += bwd;
        }
        break;
      }
      case StepKind::kTpLossAllReduce:
        t.f += tp_collective(CK::kAllReduce, st.bytes);
        break;
      case StepKind::kTpLossAllGather:
        t.f += tp_collective(CK::kAllGather, st.bytes);
        break;
      case StepKind::kEpAllToAll: {
        // The dispatch's and the combine's all-to-alls (with the routing probabilities'),
        // forward and backward, which the compute after them waits for. Under the shared
        // experts' overlap the run of shared-expert steps after it (backward: its backward)
        // goes beside it: the pair takes at least the longer of the two, and the run's own
        // time is counted where its steps are. Under the EP overlap (another micro-batch's
        // compute beside it) apart, in ep_overlapped. DeepEP across nodes: its two parts
        // side by side, the longer of the two; under the EP overlap each on its stream.
        if (l.ep <= 1) break;
        const bool rails = ep_links.rail_share > 0;  // set for DeepEP across nodes alone
        const Bytes copies = st.bytes + st.probs_bytes;
        const Time a2a = rails ? ep_links.deepep_nvlink(copies)
                               : ep_links.all_to_all(ep_links.sent(st.bytes), l.ep) +
                                     ep_links.all_to_all(ep_links.sent(st.probs_bytes), l.ep);
        const Time rail = rails ? ep_links.deepep_rail(copies) : Time::zero();
        if (l.ep_comm_overlap) {
          t.ep_overlapped += a2a * 2;
          t.ep_rail_overlapped += rail * 2;
          break;
        }
        BlockTime beside;
        if (l.overlaps_shared_experts()) {
          size_t run_end = i + 1;
          while (run_end < b.steps.size() && b.steps[run_end].beside_all_to_all) ++run_end;
          beside = block_time(b, l, link, cp_link, ep_links, false, ramp, i + 1, run_end);
        }
        const Time longer = std::max(a2a, rail);
        auto exposed = [&](Time hidden) { return longer - std::min(longer, hidden); };
        t.f += exposed(beside.f);
        t.b += exposed(beside.b);
        t.b_input += exposed(beside.b_input);
        break;
      }
    }
  }
  if (frozen) t.b = t.b_input = t.tp_hidden = t.ep_overlapped = t.ep_rail_overlapped = Time::zero();
  return t;
}

using Groups = hardware::ClusterSpec::GroupRange;

// Stages sized to their work (Searcher::sized_to_work) are searched only where they
// shorten the largest stage by this fraction: on one kind of GPU the embedding and output
// layer move a layer or two, and each sized layout doubles a pipeline's candidates.
constexpr double kMinStageGain = 0.01;

// Per-thread memo of module times, keyed by what module_cost depends on, and of the
// modules' op graphs (which the thread's memory estimates take too).
class CostCache {
 public:
  explicit CostCache(const Scenario& s) : s_(s), collectives_(collective_config(s.cluster)) {}

  ModuleGraphCache& graphs() { return graphs_; }

  // The module's time on each node group (cluster.groups() order). Not keyed by what one
  // search fixes for all its layouts (the cross-entropy fusion, the MoE capacity factor).
  const std::vector<ModuleTime>& per_group(size_t module, const Layout& l, bool context_parallel,
                                           bool frozen) {
    auto key = std::make_tuple(
        module, l.tp, l.cp, l.sequence_parallel, l.micro_batch, recompute_key(l), l.flash_attention,
        l.fused_projections, l.repeat_kv, l.fused_activation, l.fused_rope, l.tp_backward_overlap,
        l.pp_scatter_gather, l.tp_comm_overlap, l.ep, l.expert_tp(), static_cast<int>(l.fp8_recipe),
        static_cast<int>(l.cp_comm), static_cast<int>(l.attention_kernel), l.cp_a2a,
        l.ep_comm_overlap, l.moe_shared_expert_overlap, static_cast<int>(l.moe_dispatcher),
        context_parallel, frozen);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const models::OpGraph& g = graphs_.get(s_, module, l, ExpertLoad::kTimed);
    std::vector<ModuleTime> times;
    for (size_t gi = 0; gi < s_.cluster.groups().size(); ++gi) {
      const hardware::NodeGroup& group = s_.cluster.groups()[gi];
      const ModuleCost mc =
          module_cost(g, l, context_parallel, group.profile.gpu, s_.workload.precision);
      Bandwidth link = Bandwidth::bytes_per_s(1e30);
      if (group.profile.gpus_per_node > 1)
        link =
            group.profile
                .collective(hardware::CollectiveScope::kIntraNode, hardware::Collective::kAllGather)
                .bus_bandwidth(group.profile.gpus_per_node);
      // The fastest an all-to-all over n ranks inside a node can run: the TP link, or the
      // profile's intra-node all_to_all where faster.
      auto intra_all_to_all = [&](int n) {
        if (group.profile.gpus_per_node <= 1) return link;
        return std::max(link, group.profile
                                  .collective(hardware::CollectiveScope::kIntraNode,
                                              hardware::Collective::kAllToAll)
                                  .bus_bandwidth(n));
      };
      const Bandwidth cp_link =
          l.cp > 1 && l.cp_heads_split() > 1 ? intra_all_to_all(l.cp_heads_split()) : link;
      EpLinks ep_links;
      if (l.ep > 1) {
        ep_links.nvlink = intra_all_to_all(std::min(l.ep, group.profile.gpus_per_node));
        // The network's per-NIC link (network_builder.cpp); a group member every expert_tp
        // ranks, so at most ceil(gpus_per_node / expert_tp) on one node.
        const int nodes = s_.cluster.num_nodes();
        if (nodes > 1)
          ep_links.nic = group.profile
                             .collective(hardware::CollectiveScope::kInterNode,
                                         hardware::Collective::kAllReduce)
                             .bus_bandwidth(nodes) *
                         (1.0 / std::max(group.profile.inter_node.nics_per_node, 1));
        const int etp = l.expert_tp();
        ep_links.members_per_node = std::min(l.ep, (group.profile.gpus_per_node + etp - 1) / etp);
        // The flex dispatcher's groups take whole nodes (infeasibility()).
        const auto* llm = std::get_if<models::LlmSpec>(&s_.model.modules[module].spec);
        if (l.flex_dispatcher() && llm && llm->moe)
          ep_links.nvlink_share = deepep_nvlink_share(*llm->moe, l.ep);
        if (l.flex_dispatcher() && l.ep % ep_links.members_per_node == 0 && llm && llm->moe) {
          ep_links.rail_nodes = l.ep / ep_links.members_per_node;
          ep_links.rail_share = deepep_rail_share(*llm->moe, ep_links.rail_nodes);
        }
      }
      ModuleTime& t = times.emplace_back();
      // The simulation's size scales on this group's nodes (collective_config); a TP group
      // inside one node pays the intra-node ones, one that may span nodes the inter-node ones.
      const bool tp_in_node = group.profile.gpus_per_node % l.tp == 0;
      const sim::CollectiveCurves& curves = collectives_.curves[gi];
      const TpRamp ramp =
          tp_in_node ? TpRamp{&curves.intra_node_size_scale, &curves.intra_node_group_scale}
                     : TpRamp{&curves.inter_node_size_scale, nullptr};
      t.pre = block_time(mc.pre, l, link, cp_link, ep_links, frozen, ramp);
      for (int k = 0; k < 4; ++k) {
        t.kind[k] = block_time(mc.kind_block(k), l, link, cp_link, ep_links, frozen, ramp);
        t.kind_params[k] = mc.kind_block(k).dense.all;
      }
      t.kinds = mc.kinds;
      t.post = block_time(mc.post, l, link, cp_link, ep_links, frozen, ramp);
      t.mtp = block_time(mc.mtp, l, link, cp_link, ep_links, frozen, ramp);
      t.mtp_params = mc.mtp.dense.all;
      t.layers = mc.layers;
      t.pre_params = mc.pre.dense.all;
      t.post_params = mc.post.dense.all;
      t.boundary = mc.boundary_bytes;
      if (l.recompute == Recompute::kFull && !frozen)
        // (The multi-token-prediction block re-runs only part of its forward: left out, a
        // bound.)
        for (BlockTime& b : t.kind) {
          b.b += b.f_compute;
          b.b_input += b.f_compute;
        }
    }
    return memo_.emplace(key, std::move(times)).first->second;
  }

  // The fastest of `groups`' times (all groups when empty): a bound for every rank on them.
  const ModuleTime& get(size_t module, const Layout& l, bool context_parallel, bool frozen,
                        Groups groups = {}) {
    const std::vector<ModuleTime>& times = per_group(module, l, context_parallel, frozen);
    if (groups.size() == 0) groups = {0, times.size()};
    auto total = [](const ModuleTime& m) {
      const BlockTime layers = m.layers_time(0, m.layers);
      return m.pre.f + m.pre.b + layers.f + layers.b + m.post.f + m.post.b + m.mtp.f + m.mtp.b;
    };
    const ModuleTime* best = &times[groups.begin];
    for (size_t gi = groups.begin + 1; gi < groups.end; ++gi)
      if (total(times[gi]) < total(*best)) best = &times[gi];
    return *best;
  }

 private:
  const Scenario& s_;
  const sim::CollectiveConfig collectives_;  // what simulate() gets: its size scales
  ModuleGraphCache graphs_;
  std::map<std::tuple<size_t, int, int, bool, int, int, bool, bool, bool, bool, bool, bool, bool,
                      bool, int, int, int, int, int, int, bool, bool, int, bool, bool>,
           std::vector<ModuleTime>>
      memo_;
};

BlockTime whole_module(const ModuleTime& m) {
  return BlockTime().add(m.pre).add(m.layers_time(0, m.layers)).add(m.post).add(m.mtp);
}

// An encoder and its projectors under `l`: one micro-batch of l.micro_batch samples, on the
// fastest of `groups` (all when empty).
BlockTime encoder_time(CostCache& cache, const Scenario& s, const EncoderInfo& e, const Layout& l,
                       Groups groups = {}) {
  const bool frozen = s.workload.frozen_encoders;
  BlockTime t = whole_module(cache.get(e.index, l, false, frozen, groups));
  for (size_t p : e.projectors) t.add(whole_module(cache.get(p, l, false, frozen, groups)));
  return t;
}

// The LLM's pipeline: max over stages of the fill before its first forward, its own work,
// and the drain after its last backward. `stage0_extra`: encoder work per micro-batch on
// stage 0 (the homogeneous placement). On a cluster of several node groups each stage
// counts its work on the slowest group its ranks lie on (every rank does all of it) and
// its share of the fill on the fastest (the replica that feeds a rank may be anywhere).
Time llm_pipeline_bound(CostCache& cache, const Scenario& s, const Plan& p,
                        const BlockTime& stage0_extra) {
  const Layout& l = p.layout;
  const std::vector<ModuleTime>& times = cache.per_group(s.model.llm_index(), l, true, false);
  const int vstages = l.pp * l.vpp;
  const bool zb = splits_weight_gradient(p.schedule);
  // ZB-H1 runs the TP entries' backward collectives without their wgrad beside them.
  auto backward = [zb](const BlockTime& b) { return zb ? b.b + b.tp_hidden : b.b; };
  auto add = [&backward](BlockTime& a, const BlockTime& b) {
    a.f += b.f;
    a.b += backward(b);
    a.b_input += b.b_input;
    a.ep_overlapped += b.ep_overlapped;
    a.ep_rail_overlapped += b.ep_rail_overlapped;
  };
  // The groups the LLM's ranks lie on; per group of them, per virtual stage: its forward and
  // backward per micro-batch (v[(gi - llm.begin) * vstages + i]).
  const int first = p.placement == Placement::kNonColocated ? p.llm_first_rank : 0;
  const int stage_ranks = l.tp * l.cp * l.dp;
  const Groups llm = s.cluster.groups_of_gpus(first, l.world());
  std::vector<BlockTime> v(llm.size() * vstages);
  for (size_t gi = llm.begin; gi < llm.end; ++gi) {
    const ModuleTime& mt = times[gi];
    const std::vector<int64_t> split = layers_per_virtual_stage(l, mt.layers, nullptr);
    BlockTime* g = &v[(gi - llm.begin) * vstages];
    int64_t first_layer = 0;
    for (int i = 0; i < vstages; ++i) {
      const int64_t n = i < static_cast<int>(split.size()) ? split[i] : 0;
      const std::array<int64_t, 4> c = mt.kind_counts(first_layer, n);
      for (size_t k = 0; k < c.size(); ++k) {
        g[i].f += mt.kind[k].f * c[k];
        g[i].b += backward(mt.kind[k]) * c[k];
        g[i].b_input += mt.kind[k].b_input * c[k];
        g[i].ep_overlapped += mt.kind[k].ep_overlapped * c[k];
        g[i].ep_rail_overlapped += mt.kind[k].ep_rail_overlapped * c[k];
      }
      first_layer += n;
    }
    add(g[0], mt.pre);
    add(g[0], stage0_extra);
    add(g[vstages - 1], mt.post);
    add(g[vstages - 1], mt.mtp);
  }
  const int64_t m = num_micro_batches(l, s.workload.global_batch);
  Time best, fill;
  for (int st = 0; st < l.pp; ++st) {
    const Groups on = s.cluster.groups_of_gpus(first + st * stage_ranks, stage_ranks);
    Time work, step;
    for (size_t gi = on.begin; gi < on.end; ++gi) {
      const BlockTime* g = &v[(gi - llm.begin) * vstages];
      // Each micro-batch's passes, and apart its overlapped all-to-alls on their streams
      // (which one virtual stage's may run beside another's compute).
      Time w, a2a, rail;
      for (int c = 0; c < l.vpp; ++c) {
        w += (g[c * l.pp + st].f + g[c * l.pp + st].b) * m;
        a2a += g[c * l.pp + st].ep_overlapped * m;
        rail += g[c * l.pp + st].ep_rail_overlapped * m;
      }
      work = std::max({work, w, a2a, rail});
      // ZB-H1 may leave up to `st` weight-gradient passes to the end of stage st, in
      // parallel with the earlier stages' last backwards: no drain counted.
      const Time f = g[st].f + (zb ? Time::zero() : g[st].b);
      step = gi == on.begin ? f : std::min(step, f);
    }
    best = std::max(best, fill + work);
    fill += step;
  }
  return best;
}

// The LLM's gradient reduction as a floor: the iteration ends after every stage's
// reduce-scatter (the first half of an all-reduce). Where a stage spans k nodes, a DP group
// of n = dp·cp ranks has n/k on each; each shard (1/n of the gradient G) owned on a node
// needs the other nodes' contributions at least once (in through the node's ingress), and
// each shard owned elsewhere this node's (pre-reduced) contribution (out through its
// egress): per node, gpus·G/n bytes in and gpus·G·(k-1)/n out. The links: the NICs (the
// network's inter-node bus bandwidth) or, slower, the internet link's down / up rates.
// Zero where no stage spans nodes, TP spans nodes, the LLM's ranks are not node-aligned or
// node types differ.
// A node's rates to and from other nodes, bytes/s: the network's inter-node bus bandwidth
// (its NICs, network_builder.h), or the internet link's down / up rates where slower.
struct NodeRates {
  double in = 0, out = 0;
};
NodeRates node_rates(const hardware::SystemProfile& prof, int nodes) {
  const double nic =
      prof.collective(hardware::CollectiveScope::kInterNode, hardware::Collective::kAllReduce)
          .bus_bandwidth(nodes)
          .bytes_per_s();
  if (!prof.wan) return {nic, nic};
  return {std::min(nic, prof.wan->down.bytes_per_s()), std::min(nic, prof.wan->up.bytes_per_s())};
}

Time dp_floor(CostCache& cache, const Scenario& s, const Plan& p) {
  const Layout& l = p.layout;
  const hardware::ClusterSpec& c = s.cluster;
  if (c.groups().size() != 1 || c.num_nodes() < 2 || l.dp * l.cp < 2) return Time::zero();
  const hardware::SystemProfile& prof = c.groups()[0].profile;
  const int gpn = prof.gpus_per_node;
  const int stage_ranks = l.tp * l.cp * l.dp;
  const int first = p.placement == Placement::kNonColocated ? p.llm_first_rank : 0;
  if (stage_ranks <= gpn || stage_ranks % gpn != 0 || first % gpn != 0 || l.tp > gpn)
    return Time::zero();
  const NodeRates rate = node_rates(prof, c.num_nodes());
  const int k = stage_ranks / gpn;
  const ModuleTime& mt = cache.get(s.model.llm_index(), l, true, false);
  const std::vector<int64_t> split = layers_per_virtual_stage(l, mt.layers, nullptr);
  std::vector<int64_t> first_layer(split.size() + 1);  // of each virtual stage
  for (size_t v = 0; v < split.size(); ++v) first_layer[v + 1] = first_layer[v] + split[v];
  int64_t most = 0;  // the largest stage's parameters per rank
  for (int st = 0; st < l.pp; ++st) {
    int64_t params =
        (st == 0 ? mt.pre_params : 0) + (st == l.pp - 1 ? mt.post_params + mt.mtp_params : 0);
    for (int ch = 0; ch < l.vpp; ++ch) {
      const size_t v = static_cast<size_t>(ch * l.pp + st);
      if (v < split.size()) params += mt.layers_params(first_layer[v], split[v]);
    }
    most = std::max(most, params);
  }
  const double bytes = static_cast<double>(gpn) * static_cast<double>(most) *
                       gradient_bytes(s.workload.precision, l.grad_reduce_dtype) / (l.dp * l.cp);
  return Time::seconds(std::max(bytes / rate.in, bytes * (k - 1) / rate.out));
}

// The LLM's pipeline transfers as a floor: every micro-batch crosses each virtual-stage
// boundary forward (activation) and backward (its gradient), each rank sending to its peer
// on the next (previous) stage; what leaves a node for another goes through its egress (the
// NICs, or the internet link). Zero for pp 1 or mixed node types.
Time pp_floor(CostCache& cache, const Scenario& s, const Plan& p) {
  const Layout& l = p.layout;
  const hardware::ClusterSpec& c = s.cluster;
  if (c.groups().size() != 1 || c.num_nodes() < 2 || l.pp < 2) return Time::zero();
  const hardware::SystemProfile& prof = c.groups()[0].profile;
  const int gpn = prof.gpus_per_node;
  const ModuleTime& mt = cache.get(s.model.llm_index(), l, true, false);
  const int first = p.placement == Placement::kNonColocated ? p.llm_first_rank : 0;
  const int stage_ranks = l.tp * l.cp * l.dp;
  const int vstages = l.pp * l.vpp;
  int64_t most = 0;  // the most transfers leaving one node per micro-batch
  if (stage_ranks % gpn == 0 && first % gpn == 0) {
    // Stages on whole nodes: every boundary's transfers cross, gpn per node of the sender.
    std::vector<int64_t> out(static_cast<size_t>(l.pp), 0);
    for (int v = 0; v + 1 < vstages; ++v) {
      ++out[static_cast<size_t>(v % l.pp)];        // the activation forward
      ++out[static_cast<size_t>((v + 1) % l.pp)];  // its gradient backward
    }
    for (int64_t n : out) most = std::max(most, n * gpn);
  } else {
    std::map<int, int64_t> sends;  // per node
    for (int v = 0; v + 1 < vstages; ++v) {
      const int a = v % l.pp, b = (v + 1) % l.pp;
      for (int j = 0; j < stage_ranks; ++j) {
        const int ra = first + a * stage_ranks + j, rb = first + b * stage_ranks + j;
        if (ra / gpn == rb / gpn) continue;
        ++sends[ra / gpn];
        ++sends[rb / gpn];
      }
    }
    for (const auto& [node, n] : sends) most = std::max(most, n);
  }
  const int64_t m = num_micro_batches(l, s.workload.global_batch);
  return Time::seconds(static_cast<double>(most) * static_cast<double>(m) *
                       mt.boundary.as_double() / node_rates(prof, c.num_nodes()).out);
}

// The bound from compute and TP communication (search.h); bound() is its max with
// comm_floor().
Time compute_bound(CostCache& cache, const std::vector<EncoderInfo>& encoders, const Scenario& s,
                   const Plan& p) {
  if (p.placement == Placement::kHomogeneous) {
    BlockTime extra;
    for (const EncoderInfo& e : encoders) extra.add(encoder_time(cache, s, e, p.layout));
    return llm_pipeline_bound(cache, s, p, extra);
  }
  const Time llm = llm_pipeline_bound(cache, s, p, {});
  const int64_t gb = s.workload.global_batch;
  Time enc_total, enc_first, enc_last;
  for (const ModulePlan& mp : p.modules) {
    auto it = std::find_if(encoders.begin(), encoders.end(),
                           [&](const EncoderInfo& e) { return e.name == mp.module; });
    if (it == encoders.end()) continue;
    // Non-colocated: the fastest group the encoder's own ranks lie on.
    const Groups on = p.placement == Placement::kNonColocated
                          ? s.cluster.groups_of_gpus(mp.first_rank, mp.layout.world())
                          : Groups{};
    const BlockTime t = encoder_time(cache, s, *it, mp.layout, on);
    const int64_t steps = gb / (int64_t{mp.layout.micro_batch} * mp.layout.dp);
    if (p.placement == Placement::kColocated) {
      enc_total += (t.f + t.b) * steps;
    } else {
      // Over pp stages: at least the average stage's work per step; the first forward and
      // the last backward still cross every stage.
      enc_total = std::max(enc_total, Time::ps((t.f + t.b).count_ps() * steps / mp.layout.pp));
      enc_first = std::max(enc_first, t.f);
      enc_last = std::max(enc_last, t.b);
    }
  }
  if (p.placement == Placement::kColocated) return enc_total + llm;
  // The encoder's last backward follows the LLM's last stage-0 backward (ZB-H1: its weight
  // gradients may still be running then).
  if (splits_weight_gradient(p.schedule)) enc_last = Time::zero();
  return std::max(enc_total, enc_first + llm + enc_last);
}

// The communication floors are floors of their own (not added to compute: the transfers
// may overlap any compute, the encoders' included).
Time comm_floor(CostCache& cache, const Scenario& s, const Plan& p) {
  return std::max(dp_floor(cache, s, p), pp_floor(cache, s, p));
}

Time bound(CostCache& cache, const std::vector<EncoderInfo>& encoders, const Scenario& s,
           const Plan& p) {
  return std::max(compute_bound(cache, encoders, s, p), comm_floor(cache, s, p));
}

}  // namespace

Time lower_bound(const Scenario& s, const Plan& p) {
  CostCache cache(s);
  return bound(cache, fed_encoders(s), s, p);
}

namespace {

std::vector<int> layout_key(const Layout& l) {
  std::vector<int> k{l.tp,
                     l.cp,
                     l.pp,
                     l.vpp,
                     l.dp,
                     l.ep,
                     l.expert_tp(),
                     l.micro_batch,
                     recompute_key(l),
                     l.sequence_parallel,
                     l.distributed_optimizer,
                     l.fsdp,
                     l.fsdp_reshard_after_forward,
                     static_cast<int>(l.fsdp_implementation),
                     l.fsdp_root_unit,
                     l.first_stage_layers,
                     l.last_stage_layers,
                     l.account_for_embedding,
                     l.account_for_loss,
                     l.overlap_grad_reduce,
                     l.overlap_param_gather,
                     l.flash_attention,
                     l.fused_projections,
                     l.repeat_kv,
                     l.fused_activation,
                     l.fused_rope,
                     l.tp_backward_overlap,
                     l.pp_scatter_gather,
                     l.pp_blocking_p2p,
                     l.tp_comm_overlap,
                     l.ep_comm_overlap,
                     l.moe_shared_expert_overlap,
                     static_cast<int>(l.fp8_recipe),
                     static_cast<int>(l.cp_comm),
                     static_cast<int>(l.grad_reduce_dtype),
                     l.fp8_param_gather,
                     l.nccl_ub,
                     static_cast<int>(l.cross_entropy_fusion),
                     static_cast<int>(l.attention_kernel),
                     static_cast<int>(std::lround(l.moe_capacity_factor * 1e6)),
                     static_cast<int>(std::lround(l.moe_load_imbalance * 1e6)),
                     static_cast<int>(l.moe_dispatcher),
                     l.microbatch_group,
                     static_cast<int>(l.pipeline_layout.size())};
  for (int layers : l.pipeline_layout) k.push_back(layers);
  return k;
}

// The LLM side of a plan: placement, the LLM's layout, schedule and first rank.
std::vector<int> llm_key(const Plan& p) {
  std::vector<int> k{static_cast<int>(p.placement)};
  auto l = layout_key(p.layout);
  k.insert(k.end(), l.begin(), l.end());
  k.push_back(static_cast<int>(p.schedule));
  k.push_back(p.llm_first_rank);
  return k;
}

}  // namespace

bool canonical_less(const Plan& a, const Plan& b) {
  auto key = [&](const Plan& p) {
    std::vector<int> k = llm_key(p);
    for (const ModulePlan& m : p.modules) {
      auto e = layout_key(m.layout);
      k.insert(k.end(), e.begin(), e.end());
      k.push_back(m.first_rank);
    }
    return k;
  };
  auto ka = key(a), kb = key(b);
  if (ka != kb) return ka < kb;
  for (size_t i = 0; i < std::min(a.modules.size(), b.modules.size()); ++i)
    if (a.modules[i].module != b.modules[i].module)
      return a.modules[i].module < b.modules[i].module;
  return false;
}

namespace {

// The degrees a search section fixes, as " with search.llm tp 4, pp 8" ("" when none): what
// an empty family's reason names, since a fixed degree (a vpp no split of the layers takes)
// can leave no layout at all.
std::string fixed_degrees(const LayoutFix& f) {
  std::string out;
  for (const auto& [name, v] : {std::pair{"tp", f.tp}, std::pair{"cp", f.cp}, std::pair{"pp", f.pp},
                                std::pair{"vpp", f.vpp}, std::pair{"dp", f.dp},
                                std::pair{"ep", f.ep}, std::pair{"micro_batch", f.micro_batch}})
    if (v) out += fmt::format("{}{} {}", out.empty() ? " with search.llm " : ", ", name, *v);
  return out;
}

std::string describe_layout(const Layout& l, bool llm) {
  std::string out = fmt::format("tp{}", l.tp);
  if (l.sequence_parallel) out += " sp";
  if (l.cp > 1)
    out += fmt::format(" cp{}{}", l.cp,
                       l.cp_comm == CpComm::kAllGather ? " ag"
                       : l.cp_comm == CpComm::kA2A     ? " a2a"
                       : l.cp_comm == CpComm::kA2AP2P
                           ? fmt::format(" a2a{}xp2p{}", l.cp_a2a, l.cp_ring())
                           : "");
  if (l.pp > 1) out += fmt::format(" pp{}", l.pp);
  if (l.vpp > 1) out += fmt::format(" vpp{}", l.vpp);
  if (l.microbatch_group > 0) out += fmt::format(" group{}", l.microbatch_group);
  out += fmt::format(" dp{}", l.dp);
  if (l.ep > 1) out += fmt::format(" ep{}", l.ep);
  if (l.expert_tp() != l.tp) out += fmt::format(" etp{}", l.expert_tp());
  out += fmt::format(" mb{}", l.micro_batch);
  if (l.recompute != Recompute::kNone) out += fmt::format(" rc:{}", to_string(l.recompute));
  if (l.names_recompute_modules())
    out += fmt::format("({})", recompute_modules_names(l.recompute_modules));
  if (l.distributed_optimizer) out += " dopt";
  if (l.fsdp) {
    out += l.torch_fsdp2() ? " fsdp2" : " fsdp";
    if (!l.fsdp_reshard_after_forward) out += "-kept";
    if (l.fsdp_root_unit) out += "-root";
  }
  if (l.tp_comm_overlap) out += " ub";
  if (l.ep_comm_overlap) out += " a2a-overlap";
  if (l.moe_shared_expert_overlap) out += " shared-overlap";
  if (l.moe_capacity_factor > 0) out += fmt::format(" capacity:{}", l.moe_capacity_factor);
  if (l.moe_load_imbalance > 1) out += fmt::format(" imbalance:{}", l.moe_load_imbalance);
  if (l.moe_dispatcher != MoeDispatcher::kAllToAll)
    out += fmt::format(" {}", to_string(l.moe_dispatcher));
  if (llm && l.cross_entropy_fusion != CrossEntropy::kUnfused)
    out += fmt::format(" ce:{}", to_string(l.cross_entropy_fusion));
  if (l.attention_kernel != hardware::AttentionKernel::kDefault)
    out += fmt::format(" attn:{}", hardware::to_string(l.attention_kernel));
  if (!l.fused_projections) out += " separate-proj";
  if (l.repeat_kv) out += " repeat-kv";
  if (!l.fused_activation) out += " unfused-act";
  if (!l.fused_rope) out += " unfused-rope";
  if (llm && (l.first_stage_layers > 0 || l.last_stage_layers > 0))
    out += fmt::format(" first/last {}/{}", l.first_stage_layers, l.last_stage_layers);
  if (llm && !l.pipeline_layout.empty()) out += " layers " + pipeline_layout_text(l);
  if (llm && (l.account_for_embedding || l.account_for_loss))
    out += l.account_for_embedding && l.account_for_loss ? " slots:embedding+loss"
           : l.account_for_embedding                     ? " slots:embedding"
                                                         : " slots:loss";
  return out;
}

}  // namespace

std::string describe(const Plan& p) {
  if (p.placement == Placement::kHomogeneous)
    return fmt::format("homogeneous {} {}", describe_layout(p.layout, true), to_string(p.schedule));
  std::string out(to_string(p.placement));
  const bool nc = p.placement == Placement::kNonColocated;
  for (const ModulePlan& m : p.modules) {
    out += fmt::format(" {}[{}", m.module, describe_layout(m.layout, false));
    if (nc) out += fmt::format(" @{}-{}", m.first_rank, m.first_rank + m.layout.world() - 1);
    out += "]";
  }
  out += fmt::format(" llm[{}", describe_layout(p.layout, true));
  if (nc) out += fmt::format(" @{}-{}", p.llm_first_rank, p.llm_first_rank + p.layout.world() - 1);
  out += fmt::format("] {}", to_string(p.schedule));
  return out;
}

namespace {

// "tp 3 does not divide llm heads 32" -> "tp N does not divide llm heads N": the histogram
// key.
std::string reason_key(std::string_view why) {
  std::string out;
  for (size_t i = 0; i < why.size();) {
    if (std::isdigit(static_cast<unsigned char>(why[i]))) {
      while (i < why.size() && (std::isdigit(static_cast<unsigned char>(why[i])) ||
                                (why[i] == '.' && i + 1 < why.size() &&
                                 std::isdigit(static_cast<unsigned char>(why[i + 1])))))
        ++i;
      out += 'N';
    } else {
      out += why[i++];
    }
  }
  return out;
}

struct Histogram {
  std::map<std::string, RejectionReason> by_key;
  void add(const std::string& why, int64_t n) {
    RejectionReason& r = by_key[reason_key(why)];
    if (r.count == 0) {
      r.reason = reason_key(why);
      r.example = why;
    }
    r.count += n;
  }
  void merge(const Histogram& o) {
    for (const auto& [k, r] : o.by_key) {
      RejectionReason& mine = by_key[k];
      if (mine.count == 0)
        mine = r;
      else
        mine.count += r.count;
    }
  }
  std::vector<RejectionReason> sorted() const {
    std::vector<RejectionReason> out;
    for (const auto& [k, r] : by_key) out.push_back(r);
    std::stable_sort(
        out.begin(), out.end(),
        [](const RejectionReason& a, const RejectionReason& b) { return a.count > b.count; });
    return out;
  }
};

// One grid point before its recompute variants: the plan (recompute none everywhere) and
// how many distributed-optimizer variants it stands for.
struct Base {
  Plan plan;
  int distopt_variants = 1;  // grid points per recompute combination (the others dominated)
};

// A feasible base with one recompute combination (levels per module: the LLM, then each
// encoder), and its lower bound.
struct Candidate {
  uint32_t base = 0;
  uint16_t combo = 0;
  Time bound;          // lower_bound()
  Time compute;        // its compute part (the tie-break)
  int32_t group = -1;  // heterogeneous: the LLM side (its layout and recompute), else -1
};

// What checking one Base gave: infeasible (with the reason), or its recompute
// combinations, lightest first.
struct BaseInfo {
  std::string why;
  std::vector<std::vector<RecomputePolicy>> combos;
  int64_t considered = 0, dominated = 0;
};

// Whether policy `a` recomputes no less than `b`: a heavier kind (none < selective < full),
// or under selective a superset of b's modules, the whole MoE layer counting as its
// activation and shared experts too. Selective sets that neither contains are not ordered.
bool recomputes_no_less(RecomputePolicy a, RecomputePolicy b) {
  const auto reruns = [](uint8_t m) -> uint8_t {
    return (m & models::kRecomputeMoe) != 0
               ? m | models::kRecomputeMoeAct | models::kRecomputeSharedExperts
               : m;
  };
  if (a.kind == b.kind)
    return a.kind != Recompute::kSelective || (reruns(a.modules) & b.modules) == b.modules;
  return static_cast<int>(a.kind) > static_cast<int>(b.kind);
}

// Combination `a` is dominated by `b` (which fits): the LLM recomputes no less, every
// encoder the same. Encoders' recompute is searched, not ruled: an encoder's recompute
// shifts its gradient reduction in time, and in colocated plans that can shorten the
// iteration by more than the recompute costs (tests/planner/search_test.cpp's brute force
// found such a case).
bool dominated_by(const std::vector<RecomputePolicy>& a, const std::vector<RecomputePolicy>& b) {
  if (!recomputes_no_less(a[0], b[0])) return false;
  for (size_t k = 1; k < a.size(); ++k)
    if (a[k] != b[k]) return false;
  return true;
}

Plan with_recompute(const Plan& base, const std::vector<RecomputePolicy>& levels) {
  Plan p = base;
  p.layout.recompute = levels[0].kind;
  p.layout.recompute_modules = levels[0].modules;
  // Megatron-Core checkpoints the shared experts only where they are not overlapped.
  if (p.layout.recompute_policy().checkpoints_shared_experts())
    p.layout.moe_shared_expert_overlap = false;
  for (size_t k = 0; k < p.modules.size(); ++k) {
    p.modules[k].layout.recompute = levels[k + 1].kind;
    p.modules[k].layout.recompute_modules = levels[k + 1].modules;
  }
  return p;
}

bool fixed_ok(const std::optional<int>& f, int v) {
  return !f || *f == v;
}

class Searcher {
 public:
  Searcher(const Scenario& s, const SearchOptions& o)
      : s_(s), spec_(s.search), encoders_(fed_encoders(s)), speed_(s) {
    gpn_ = 0;
    for (const hardware::NodeGroup& g : s.cluster.groups())
      gpn_ = std::gcd(gpn_, g.profile.gpus_per_node);
    world_ = s.cluster.total_gpus();
    const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
    layers_ = static_cast<int>(llm.block.layers);
    moe_experts_ = llm.moe ? static_cast<int>(llm.moe->experts) : 0;
    shared_experts_ = llm.moe && llm.moe->shared_experts > 0;
    latent_attention_ = llm.block.mla.has_value();
    a2a_cp_only_ = llm.block.attention_sinks;
    windowed_ = llm.block.sliding_window.has_value();
    block_ = llm.block;
    dense_mlps_ = llm.moe && llm.moe->dense_layer_count(llm.block.layers) > 0;
    top_k_ = o.top_k > 0 ? o.top_k : spec_.top_k;
    exhaustive_ = o.exhaustive;
  }

  // Every base plan, family by family.
  std::vector<Base> enumerate(std::vector<std::string>& why_none) {
    std::vector<Base> out;
    why_none.assign(3, "");
    for (int f = 0; f < 3; ++f) {
      const Placement pl = kPlacements[f];
      if (std::find(spec_.forbidden_placements.begin(), spec_.forbidden_placements.end(), pl) !=
          spec_.forbidden_placements.end()) {
        why_none[f] = "forbidden by the scenario's search section";
        continue;
      }
      if (pl != Placement::kHomogeneous && encoders_.empty()) {
        why_none[f] = "the model has no encoder the workload feeds";
        continue;
      }
      if (pl == Placement::kHomogeneous) {
        for (const Base& b : llm_bases(world_, 0, true, true, true)) out.push_back(b);
      } else if (pl == Placement::kColocated) {
        for (const Base& b : llm_bases(world_, 0, true, true, false)) {
          Base x = b;
          x.plan.placement = pl;
          add_encoders(x, 0, std::vector<int>(encoders_.size(), world_), out);
        }
      } else {
        // Each encoder on its own ranks, in module order from rank 0, the LLM after them.
        for (const std::vector<int>& split : encoder_split_sets()) {
          const int enc_gpus = std::accumulate(split.begin(), split.end(), 0);
          for (const Base& b : llm_bases(world_ - enc_gpus, enc_gpus, false, true, false)) {
            Base x = b;
            x.plan.placement = pl;
            x.plan.llm_first_rank = enc_gpus;
            add_encoders(x, 0, split, out);
          }
        }
      }
    }
    return out;
  }

  // Checks one base: the trainers' constraints (infeasibility()); its recompute
  // combinations, lightest first.
  BaseInfo check(const Base& base) const {
    BaseInfo r;
    const size_t nmod = 1 + base.plan.modules.size();
    std::vector<std::vector<RecomputePolicy>> options(nmod);
    options[0] = recompute_options(spec_.llm, true, moe_experts_ > 0, shared_experts_,
                                   latent_attention_, dense_mlps_);
    for (size_t k = 0; k < base.plan.modules.size(); ++k)
      options[k + 1] =
          recompute_options(module_fix(base.plan.modules[k].module), false, false, false);
    int64_t combos = 1;
    for (const auto& o : options) combos *= static_cast<int64_t>(o.size());
    r.considered = combos * base.distopt_variants;
    r.dominated = combos * (base.distopt_variants - 1);
    r.why = infeasibility(s_, base.plan);
    if (!r.why.empty()) return r;
    std::vector<size_t> idx(nmod, 0);
    for (;;) {
      std::vector<RecomputePolicy> c(nmod);
      for (size_t k = 0; k < nmod; ++k) c[k] = options[k][idx[k]];
      r.combos.push_back(std::move(c));
      size_t k = 0;
      while (k < nmod && ++idx[k] == options[k].size()) idx[k++] = 0;
      if (k == nmod) break;
    }
    auto weight = [](const std::vector<RecomputePolicy>& c) {
      int w = 0;
      for (const RecomputePolicy& x : c) w += static_cast<int>(x.kind);
      return w;
    };
    std::stable_sort(r.combos.begin(), r.combos.end(),
                     [&](const auto& a, const auto& b) { return weight(a) < weight(b); });
    return r;
  }

  // Why `p`'s memory does not fit the GPUs or the search's cap ("" when it does).
  // `graphs`: the calling thread's (MemoryOptions::graphs).
  std::string memory_verdict(const Plan& p, ModuleGraphCache& graphs) const {
    const MemoryReport mem = estimate_memory(s_, p, {.graphs = &graphs});
    if (!mem.fits())
      return fmt::format("out of memory: pipeline stage {} needs {} per GPU, the GPUs have {}",
                         mem.tightest_stage, mem.tightest(), mem.capacity());
    if (spec_.max_memory && mem.peak > *spec_.max_memory)
      return fmt::format(
          "over the search's memory cap: pipeline stage {} needs {} per GPU, the cap is {}",
          mem.peak_stage, mem.peak, *spec_.max_memory);
    return {};
  }

  static int family_of(Placement p) {
    return static_cast<int>(std::find(std::begin(kPlacements), std::end(kPlacements), p) -
                            std::begin(kPlacements));
  }

  int top_k() const { return top_k_; }
  bool exhaustive() const { return exhaustive_; }
  int64_t llm_layers() const { return layers_; }

 private:
  const LayoutFix& module_fix(const std::string& name) const {
    static const LayoutFix kNone;
    for (const auto& [n, f] : spec_.modules)
      if (n == name) return f;
    return kNone;
  }

  // A module's recompute policies: the fixed kind (and modules) or every kind; for the LLM
  // selective also with other modules (kMoeRecomputeModules, kDenseRecomputeModules) and,
  // with latent attention, each selective set also with mla_up_proj, and in an MoE LLM with
  // dense MLP layers (moe.dense_layers, moe.layer_pattern) each also with mlp (heavier: tried
  // where the set alone does not fit, dominated_by()).
  static std::vector<RecomputePolicy> recompute_options(const LayoutFix& f, bool llm, bool moe,
                                                        bool shared_experts,
                                                        bool latent_attention = false,
                                                        bool dense_mlps = false) {
    if (f.recompute_modules) return {RecomputePolicy(Recompute::kSelective, *f.recompute_modules)};
    std::vector<RecomputePolicy> out;
    if (f.recompute)
      out.emplace_back(*f.recompute);
    else
      out.assign(std::begin(kRecomputes), std::end(kRecomputes));
    if (llm && (!f.recompute || *f.recompute == Recompute::kSelective)) {
      if (moe) {
        // Lighter first: the shared experts' policy before the whole MoE layer's.
        for (uint8_t m : kMoeRecomputeModules) {
          if (shared_experts && (m & models::kRecomputeMoe) != 0)
            out.emplace_back(Recompute::kSelective, kSharedExpertsRecomputeModules);
          out.emplace_back(Recompute::kSelective, m);
        }
      } else
        out.emplace_back(Recompute::kSelective, kDenseRecomputeModules);
      if (moe && dense_mlps) {
        const size_t n = out.size();
        for (size_t i = 0; i < n; ++i)
          if (out[i].kind == Recompute::kSelective)
            out.emplace_back(Recompute::kSelective,
                             static_cast<uint8_t>(out[i].modules | models::kRecomputeMlp));
      }
      if (latent_attention) {
        const size_t n = out.size();
        for (size_t i = 0; i < n; ++i)
          if (out[i].kind == Recompute::kSelective)
            out.emplace_back(Recompute::kSelective,
                             static_cast<uint8_t>(out[i].modules | models::kRecomputeMlaUpProj));
      }
    }
    return out;
  }

  // TP degrees: powers of two within a node (or, when allowed, beyond it).
  std::vector<int> tp_options(const LayoutFix& f, int limit) const {
    std::vector<int> out;
    const int max_tp = spec_.allow_cross_node_tp ? limit : std::min(limit, gpn_);
    for (int tp = 1; tp <= max_tp; tp *= 2)
      if (limit % tp == 0 && fixed_ok(f.tp, tp)) out.push_back(tp);
    if (f.tp && std::find(out.begin(), out.end(), *f.tp) == out.end() && limit % *f.tp == 0)
      out.push_back(*f.tp);  // a fixed non-power-of-two: infeasibility() judges it
    return out;
  }

  // Micro-batch sizes: powers of two up to 8 dividing `samples` (or the fixed one).
  static std::vector<int> mbs_options(const std::optional<int>& fixed, int64_t samples, int base) {
    std::vector<int> out;
    if (fixed) {
      if (*fixed % base == 0) out.push_back(*fixed);
      return out;
    }
    for (int f = 1; f <= 8; f *= 2) {
      const int64_t mbs = int64_t{base} * f;
      if (samples % mbs == 0) out.push_back(static_cast<int>(mbs));
    }
    if (out.empty()) out.push_back(base);  // rejected with infeasibility()'s reason
    return out;
  }

  // Distributed optimizer settings of a module with dp·cp ranks: on (off is dominated), or
  // the fixed one. Returns the settings to build and sets `variants` to the grid points.
  std::vector<bool> distopt_options(const LayoutFix& f, int dp_cp, int* variants) const {
    *variants = 1;
    if (f.distributed_optimizer) return {*f.distributed_optimizer};
    if (dp_cp == 1) return {false};
    if (exhaustive_) return {true, false};
    *variants = 2;
    return {true};
  }

  // Megatron's uneven split for pp not dividing the layers: the middle stages take
  // ceil(L / pp) layers, the first and last share the rest (each at least half of that).
  bool uneven_split(int pp, Layout& l) const {
    if (pp < 3 || layers_ % pp == 0) return false;
    const int q = (layers_ + pp - 1) / pp;
    const int rest = layers_ - q * (pp - 2);
    const int first = rest / 2, last = rest - first;
    if (first < std::max(1, q / 2) || last > q) return false;
    l.first_stage_layers = first;
    l.last_stage_layers = last;
    return true;
  }

  // FSDP settings of a layout (LayoutFix::fsdp), with dp·cp > 1.
  std::vector<bool> fsdp_options(const LayoutFix& f, bool allow, int dp_cp) const {
    if (!allow || dp_cp == 1) return {false};
    if (f.any_fsdp) return {false, true};
    return {f.fsdp.value_or(false)};
  }

  // How a searched layout shards its parameters (the Layout::fsdp* fields).
  struct Sharding {
    bool fsdp = false, reshard = true;
    FsdpImplementation impl = FsdpImplementation::kMegatron;
    bool root = false;
    static Sharding of(const Layout& l) {
      return {l.fsdp, l.fsdp_reshard_after_forward, l.fsdp_implementation, l.fsdp_root_unit};
    }
    // Sets them on `l`, with no fused gradient accumulation under FSDP2 (no fp32 main_grad).
    void apply(Layout& l) const {
      l.fsdp = fsdp;
      l.fsdp_reshard_after_forward = reshard;
      l.fsdp_implementation = impl;
      l.fsdp_root_unit = root;
      l.gradient_accumulation_fusion = !l.torch_fsdp2();
      l.nccl_ub = l.nccl_ub && !l.torch_fsdp2();  // FSDP2 registers no buffers
    }
  };

  // The fully sharded settings a layout is searched with: resharded after the forward or
  // kept gathered, each with the fix's implementation (LayoutFix::fsdp_implementation), both
  // with `any_fsdp_implementation`, else Megatron-FSDP when resharding and FSDP2 when kept
  // gathered; never Megatron-FSDP kept gathered (it gathers again for the backward).
  static std::vector<Sharding> fsdp_shardings(const LayoutFix& f) {
    using F = FsdpImplementation;
    std::vector<Sharding> out;
    for (bool reshard : {true, false}) {
      std::vector<F> impls = {
          f.fsdp_implementation.value_or(reshard ? F::kMegatron : F::kTorchFsdp2)};
      if (f.any_fsdp_implementation) impls = {F::kMegatron, F::kTorchFsdp2};
      for (F impl : impls)
        if (reshard || impl != F::kMegatron) out.push_back({true, reshard, impl, false});
    }
    return out;
  }

  // The LLM's layouts on `world` GPUs from rank `first` (cp only when `allow_cp`, FSDP only
  // when `allow_fsdp`) with their schedules; `encoders_first`: the encoders run on the first
  // pipeline stage (the homogeneous placement).
  std::vector<Base> llm_bases(int world, int first, bool allow_cp, bool allow_fsdp,
                              bool encoders_first) const {
    std::vector<Base> out;
    if (world < 1) return out;
    const LayoutFix& fx = spec_.llm;
    const int64_t seq = s_.workload.seq_len;
    const int64_t gb = s_.workload.global_batch;
    for (int tp : tp_options(fx, world)) {
      for (int cp = 1; tp * cp <= world; cp *= 2) {
        if (!fixed_ok(fx.cp, cp)) continue;
        if (cp > 1 && (!allow_cp || seq % (2 * cp) != 0 || seq / cp < 1024)) continue;
        // Sinks run under CP with a2a only, whose heads must split over cp (infeasibility());
        // a fixed cp still gets the reason.
        if (cp > 1 && a2a_cp_only_ && !a2a_splits(tp, cp) && !fx.cp) continue;
        if (world % (tp * cp) != 0) continue;
        for (int pp : divisors(world / (tp * cp))) {
          if (!fixed_ok(fx.pp, pp) || pp > layers_) continue;
          const int dp = world / (tp * cp * pp);
          if (!fixed_ok(fx.dp, dp)) continue;
          Layout l;
          l.tp = tp;
          l.cp = cp;
          l.pp = pp;
          l.dp = dp;
          l.sequence_parallel = fx.sequence_parallel.value_or(tp > 1);
          l.fp8_recipe = fx.fp8_recipe.value_or(Fp8Recipe::kDelayed);
          l.grad_reduce_dtype = fx.grad_reduce_dtype.value_or(GradReduceDtype::kDefault);
          l.cross_entropy_fusion = fx.cross_entropy_fusion.value_or(CrossEntropy::kUnfused);
          l.fp8_param_gather = fx.fp8_param_gather.value_or(false);
          l.nccl_ub = fx.nccl_ub.value_or(false);
          l.attention_kernel = fx.attention_kernel.value_or(hardware::AttentionKernel::kDefault);
          l.fused_projections = fx.fused_projections.value_or(true);
          l.repeat_kv = fx.repeat_kv.value_or(false);
          l.fused_activation = fx.fused_activation.value_or(true);
          l.fused_rope = fx.fused_rope.value_or(true);
          l.moe_capacity_factor = fx.moe_capacity_factor.value_or(0);
          l.moe_load_imbalance = fx.moe_load_imbalance.value_or(1);
          l.tp_comm_overlap = fx.tp_comm_overlap.value_or(false) && tp > 1 && l.sequence_parallel;
          const bool even = layers_ % pp == 0;
          if (!even) uneven_split(pp, l);
          // Folded experts (search.llm.etp 1) take their EP ranks from TP too.
          if (moe_experts_ > 0 && fx.etp) l.etp = *fx.etp;
          const int ep_ranks = l.expert_ranks();
          std::vector<int> eps{1};
          if (moe_experts_ > 0) {
            eps.clear();
            for (int ep = 1; ep <= ep_ranks; ep *= 2)
              if (ep_ranks % ep == 0 && moe_experts_ % ep == 0) eps.push_back(ep);
            if (fx.ep && std::find(eps.begin(), eps.end(), *fx.ep) == eps.end() &&
                ep_ranks % *fx.ep == 0)
              eps.push_back(*fx.ep);  // a fixed non-power-of-two: infeasibility() judges it
          }
          // The CP exchanges tried: p2p (Megatron's default), and under cp_comm any the
          // others. With sinks a2a alone; with a window a2a where the heads split, else
          // all_gather, and both under any.
          std::vector<CpComm> comms{CpComm::kP2P};
          if (cp > 1 && (a2a_cp_only_ || windowed_)) {
            comms.clear();
            if (a2a_cp_only_ || a2a_splits(tp, cp)) comms.push_back(CpComm::kA2A);
            if (!a2a_cp_only_ && (comms.empty() || fx.any_cp_comm))
              comms.push_back(CpComm::kAllGather);
          }
          // a2a+p2p: its a2a level the widest that splits the heads inside a node, under
          // cp (fixed by search.llm.cp_a2a).
          const bool hierarchical = cp > 1 && (fx.any_cp_comm || fx.cp_comm == CpComm::kA2AP2P);
          const int inner = hierarchical ? fx.cp_a2a.value_or(hierarchical_a2a(tp, cp)) : 0;
          if (cp > 1 && fx.any_cp_comm && !a2a_cp_only_ && !windowed_) {
            comms.push_back(CpComm::kAllGather);
            if (a2a_splits(tp, cp)) comms.push_back(CpComm::kA2A);
            if (inner > 1) comms.push_back(CpComm::kA2AP2P);
          }
          if (cp > 1 && fx.cp_comm) comms = {*fx.cp_comm};
          for (CpComm comm : comms) {
            l.cp_comm = comm;
            l.cp_a2a = comm == CpComm::kA2AP2P ? inner : 0;
            for (int ep : eps) {
              if (!fixed_ok(fx.ep, ep)) continue;
              l.ep = ep;
              for (int mbs : mbs_options(fx.micro_batch, gb % dp == 0 ? gb / dp : 1, 1)) {
                l.micro_batch = mbs;
                for (bool fsdp : fsdp_options(fx, allow_fsdp, dp * cp)) {
                  if (fsdp) {  // shards the optimizer state too; resharded or kept gathered
                    for (const Sharding& sh : fsdp_shardings(fx)) {
                      Layout sharded = l;
                      sharded.distributed_optimizer = true;
                      sh.apply(sharded);
                      add_splits(sharded, first, encoders_first, even, 1, out);
                    }
                    continue;
                  }
                  int dv = 1;
                  for (bool dopt : distopt_options(fx, dp * cp, &dv)) {
                    l.distributed_optimizer = dopt;
                    add_splits(l, first, encoders_first, even, dv, out);
                  }
                }
              }
            }
          }
        }
      }
    }
    return out;
  }

  // add_schedules() for `l` as split, and for `l` with its stages sized to their work
  // (sized_to_work()) where that pays, interleaved too.
  void add_splits(const Layout& l, int first, bool encoders_first, bool even, int distopt_variants,
                  std::vector<Base>& out) const {
    add_schedules(l, even, distopt_variants, out);
    Layout sized = l;
    if (sized_to_work(first, encoders_first, sized))
      add_schedules(sized, false, distopt_variants, out);
  }

  // The LLM's layers over its pipeline stages (ranks from `first`; one virtual stage each)
  // by each stage's work, so that stages on slower GPUs, or with the embedding, the output
  // layer or (`encoders_first`, the homogeneous placement) the encoders hold fewer layers:
  // each layer goes, one at a time, to the stage that would finish its share soonest
  // (optimal for identical jobs on machines of different speeds), a stage's time per layer
  // being its slowest group's forward and backward. Sets l.pipeline_layout; false (l
  // untouched) with vpp > 1, under search.llm.sized_stages false, or where that shortens
  // the largest stage of l's own split by less than kMinStageGain. Where l has no valid
  // split of its own (pp 2 over odd layers, or Megatron's first/last rule fails), the
  // sized split is its only one and is always taken.
  bool sized_to_work(int first, bool encoders_first, Layout& l) const {
    if (l.pp < 2 || l.vpp != 1 || !spec_.llm.sized_stages) return false;
    const std::vector<ModuleTime>& times = speed_.per_group(s_.model.llm_index(), l, true, false);
    const int stage_ranks = l.tp * l.cp * l.dp;
    std::vector<Time> per_layer(static_cast<size_t>(l.pp)), fixed(static_cast<size_t>(l.pp));
    for (int st = 0; st < l.pp; ++st) {
      const Groups on = s_.cluster.groups_of_gpus(first + st * stage_ranks, stage_ranks);
      for (size_t gi = on.begin; gi < on.end; ++gi) {
        const ModuleTime& t = times[gi];
        // A layer at the mean of the layers after the dense first ones (sliding windows,
        // by their attention, and a layer pattern's dense layers make them differ).
        const int64_t first_dense = t.kinds.dense_layers;
        Time layer = t.kind[0].f + t.kind[0].b;
        if (!t.kinds.prefix_only()) {
          const int64_t rest = t.layers - first_dense;
          const BlockTime after = t.layers_time(first_dense, rest);
          layer = Time::seconds((after.f + after.b).to_seconds() / static_cast<double>(rest));
        }
        per_layer[st] = std::max(per_layer[st], layer);
        Time f;
        if (st == 0) f += t.pre.f + t.pre.b;
        // An MoE LLM's dense first layers: counted on stage 0 as what they take beyond (or
        // short of) as many of the others.
        if (st == 0 && first_dense > 0) {
          const BlockTime dense = t.layers_time(0, first_dense);
          f = std::max(Time::zero(), f + dense.f + dense.b - layer * first_dense);
        }
        if (st == l.pp - 1) f += t.post.f + t.post.b + t.mtp.f + t.mtp.b;
        if (st == 0 && encoders_first) {
          for (const EncoderInfo& e : encoders_) {
            const BlockTime b = encoder_time(speed_, s_, e, l, Groups{gi, gi + 1});
            f += b.f + b.b;
          }
        }
        fixed[st] = std::max(fixed[st], f);
      }
    }
    std::vector<int> n(static_cast<size_t>(l.pp), 1);
    for (int k = l.pp; k < layers_; ++k) {
      size_t best = 0;
      Time soonest = Time::max();
      for (size_t st = 0; st < n.size(); ++st) {
        const Time done = fixed[st] + per_layer[st] * (n[st] + 1);
        if (done < soonest) {
          soonest = done;
          best = st;
        }
      }
      ++n[best];
    }
    // Where `l` has a split of its own (even, or Megatron's uneven one), worth a second
    // search only where it shortens that split's largest stage by kMinStageGain.
    const std::vector<int64_t> split = layers_per_virtual_stage(l, layers_, nullptr);
    if (split.size() == n.size()) {
      Time before, after;
      for (size_t st = 0; st < n.size(); ++st) {
        before = std::max(before, fixed[st] + per_layer[st] * split[st]);
        after = std::max(after, fixed[st] + per_layer[st] * n[st]);
      }
      if (after.to_seconds() > before.to_seconds() * (1.0 - kMinStageGain)) return false;
    }
    l.first_stage_layers = l.last_stage_layers = 0;
    l.pipeline_layout = std::move(n);
    return true;
  }

  void add_schedules(Layout l, bool even, int distopt_variants, std::vector<Base>& out) const {
    const LayoutFix& fx = spec_.llm;
    // search.llm.tp_comm_overlap "any": each layout with TP and SP with and without.
    const bool both = fx.any_tp_comm_overlap && l.tp > 1 && l.sequence_parallel;
    auto push = [&](const Layout& lay, Schedule sch, int variants) {
      if (spec_.schedule && *spec_.schedule != sch) return;
      const size_t from = out.size();
      Base b;
      b.plan.layout = lay;
      b.plan.schedule = sch;
      b.distopt_variants = variants;
      b.plan.layout.moe_dispatcher = fx.moe_dispatcher.value_or(MoeDispatcher::kAllToAll);
      // Interleaved where pp does not divide the micro-batches per replica: Megatron-Core's
      // smallest micro-batch group that runs them (its default, pp, cannot).
      const int64_t gb = s_.workload.global_batch, per_step = int64_t{lay.micro_batch} * lay.dp;
      if (sch == Schedule::kInterleaved && gb % per_step == 0 && (gb / per_step) % lay.pp != 0)
        b.plan.layout.microbatch_group =
            static_cast<int>(smallest_interleaved_group(lay.pp, gb / per_step));
      // search.llm.ep_comm_overlap: where Megatron-Core merges forward and backward passes
      // (beside userbuffers too); "any": with and without.
      const bool a2a = lay.ep > 1 && merges_passes(sch, lay.pp);
      // search.llm.moe_shared_expert_overlap: on where it applies (shared experts beside
      // all-to-alls the EP overlap does not take); "any": with and without.
      auto shared_overlaps = [&](Base x) {
        const bool applies = shared_experts_ && lay.ep > 1 && !x.plan.layout.ep_comm_overlap;
        x.plan.layout.moe_shared_expert_overlap =
            applies && fx.moe_shared_expert_overlap.value_or(true);
        out.push_back(x);
        if (applies && fx.any_moe_shared_expert_overlap) {
          x.plan.layout.moe_shared_expert_overlap = !x.plan.layout.moe_shared_expert_overlap;
          out.push_back(std::move(x));
        }
      };
      auto ep_overlaps = [&](Base x) {
        x.plan.layout.ep_comm_overlap = a2a && fx.ep_comm_overlap.value_or(false);
        shared_overlaps(x);
        if (a2a && fx.any_ep_comm_overlap && !x.plan.layout.ep_comm_overlap) {
          x.plan.layout.ep_comm_overlap = true;
          shared_overlaps(std::move(x));
        }
      };
      ep_overlaps(b);
      if (both) {
        b.plan.layout.tp_comm_overlap = true;
        ep_overlaps(std::move(b));
      }
      // search.llm.moe_dispatcher "any": each of these with the flex dispatcher too, where
      // it applies: HybridEP with whole experts, DeepEP also at a size it configures and
      // dropless. Groups across nodes that do not take whole nodes depend on the placement:
      // infeasibility() rejects them.
      if (fx.any_moe_dispatcher && lay.ep > 1 && lay.expert_tp() == 1) {
        const bool deepep = deepep_supports(lay.ep) && lay.moe_capacity_factor <= 0;
        for (size_t i = from, to = out.size(); i < to; ++i) {
          for (MoeDispatcher m : {MoeDispatcher::kHybridEp, MoeDispatcher::kDeepEp}) {
            if (m == MoeDispatcher::kDeepEp && !deepep) continue;
            Base d = out[i];
            d.plan.layout.moe_dispatcher = m;
            out.push_back(std::move(d));
          }
        }
      }
    };
    if (fixed_ok(fx.vpp, 1)) {
      l.vpp = 1;
      if (l.pp == 1) {
        push(l, spec_.schedule.value_or(Schedule::k1F1B), distopt_variants);
      } else {
        // GPipe is dominated by 1F1B unless the search section asks for it.
        const bool gpipe = spec_.schedule == Schedule::kGpipe || exhaustive_;
        push(l, Schedule::k1F1B, distopt_variants * (gpipe ? 1 : 2));
        if (gpipe) push(l, Schedule::kGpipe, distopt_variants);
        push(l, Schedule::kZeroBubble, distopt_variants);
      }
    }
    if (l.pp > 1 && even) {
      for (int vpp : divisors(layers_ / l.pp)) {
        if (vpp < 2 || !fixed_ok(fx.vpp, vpp)) continue;
        l.vpp = vpp;
        l.first_stage_layers = l.last_stage_layers = 0;
        push(l, Schedule::kInterleaved, distopt_variants);
      }
    }
    // Where pp does not divide the layers, Megatron's --account-for-embedding/loss-in-
    // pipeline-split: the embedding and the loss each take a layer's slot and the slots
    // split evenly over the virtual stages (Megatron-Bridge's Llama 3.1 405B recipes, 128
    // slots; the MoE team's Qwen3-235B, 96), interleaved. Without interleaving it is the
    // uneven split above. Once per split: not again for its stages sized to their work.
    if (l.pp > 1 && !even && l.pipeline_layout.empty() && (layers_ + 2) % l.pp == 0) {
      Layout a = l;
      a.first_stage_layers = a.last_stage_layers = 0;
      a.account_for_embedding = a.account_for_loss = true;
      for (int vpp : divisors((layers_ + 2) / l.pp)) {
        if (vpp < 2 || !fixed_ok(fx.vpp, vpp)) continue;
        a.vpp = vpp;
        push(a, Schedule::kInterleaved, distopt_variants);
      }
    }
    // Stages sized to their GPUs (pipeline_layout, one entry per stage): interleaved with
    // the vpp values an even split would take (where pp does not divide the layers, the
    // divisors of the fewest stage's layers), each stage's layers over its vpp chunks (the
    // first chunks one more where vpp does not divide them).
    const std::vector<int> stage = l.pipeline_layout;
    if (l.pp > 1 && !stage.empty()) {
      const int fewest = *std::min_element(stage.begin(), stage.end());
      for (int vpp : divisors(layers_ % l.pp == 0 ? layers_ / l.pp : fewest)) {
        if (vpp < 2 || vpp > fewest || !fixed_ok(fx.vpp, vpp)) continue;
        l.vpp = vpp;
        l.pipeline_layout.assign(static_cast<size_t>(l.pp) * vpp, 0);
        for (int st = 0; st < l.pp; ++st)
          for (int c = 0; c < vpp; ++c)
            l.pipeline_layout[static_cast<size_t>(c) * l.pp + st] =
                stage[st] / vpp + (c < stage[st] % vpp ? 1 : 0);
        push(l, Schedule::kInterleaved, distopt_variants);
      }
    }
  }

  // Encoder GPU counts under non-colocated placement, one per encoder (ranks in module
  // order from 0; the LLM takes the rest, at least one GPU). One encoder: whole nodes, and
  // powers of two below a node. Several: each a power of two below a node or a power of two
  // of whole nodes (every combination of those grows fast with the encoders).
  std::vector<std::vector<int>> encoder_split_sets() const {
    std::vector<int> sizes;
    for (int g = 1; g < gpn_; g *= 2) sizes.push_back(g);
    if (encoders_.size() == 1) {
      for (int g = gpn_; g < world_; g += gpn_) sizes.push_back(g);
    } else {
      for (int g = gpn_; g < world_; g *= 2) sizes.push_back(g);
    }
    std::vector<std::vector<int>> out;
    std::vector<int> cur;
    auto rec = [&](auto& self, int used) -> void {
      if (cur.size() == encoders_.size()) {
        out.push_back(cur);
        return;
      }
      for (int g : sizes) {
        if (used + g >= world_) continue;
        cur.push_back(g);
        self(self, used + g);
        cur.pop_back();
      }
    };
    rec(rec, 0);
    return out;
  }

  // Adds, for encoder k onwards, every layout on `gpus[k]` ranks (colocated: the world;
  // non-colocated: encoder k's ranks start after those of encoders 0..k-1).
  void add_encoders(const Base& b, size_t k, const std::vector<int>& gpus_of,
                    std::vector<Base>& out) const {
    const int gpus = k < gpus_of.size() ? gpus_of[k] : 0;
    if (k == encoders_.size()) {
      out.push_back(b);
      return;
    }
    const EncoderInfo& e = encoders_[k];
    const LayoutFix& fx = module_fix(e.name);
    const Layout& llm = b.plan.layout;
    const int64_t gb = s_.workload.global_batch;
    // Pipeline stages: colocated encoders run on every GPU with pp 1; a non-colocated one
    // may pipeline over its own ranks (1, 2, 4 or 8 stages: encoders are shallow enough
    // that deeper pipelines only add fill; infeasibility() checks pp <= its layers).
    const bool own_ranks = b.plan.placement == Placement::kNonColocated;
    if (!fixed_ok(fx.cp, 1)) return;
    for (int tp : tp_options(fx, std::min(gpus, 8))) {
      if (gpus % tp != 0) continue;
      for (int pp = 1; pp <= (own_ranks ? 8 : 1); pp *= 2) {
        if ((gpus / tp) % pp != 0 || !fixed_ok(fx.pp, pp)) continue;
        const int dp = gpus / (tp * pp);
        if (!fixed_ok(fx.dp, dp)) continue;
        // An encoder step must split into whole LLM micro-batches (boundary.h).
        const int fan_out = llm.dp > dp && llm.dp % dp == 0 ? llm.dp / dp : 1;
        const int base_mbs = llm.micro_batch * fan_out;
        // FSDP: a colocated encoder shards as the LLM on its ranks does; one on its own
        // ranks as its fix asks (search.modules.<name>.fsdp).
        std::vector<Sharding> shardings;
        if (!own_ranks) {
          shardings.push_back(Sharding::of(llm));
        } else {
          for (bool f : fsdp_options(fx, true, dp))
            if (!f)
              shardings.push_back({});
            else
              for (const Sharding& sh : fsdp_shardings(fx)) shardings.push_back(sh);
        }
        for (int mbs : mbs_options(fx.micro_batch, gb % dp == 0 ? gb / dp : 1, base_mbs))
          for (const Sharding& sh : shardings) {
            int dv = 1;
            for (bool dopt : sh.fsdp ? std::vector<bool>{true} : distopt_options(fx, dp, &dv)) {
              Base x = b;
              ModulePlan mp;
              mp.module = e.name;
              if (own_ranks)
                mp.first_rank = std::accumulate(gpus_of.begin(), gpus_of.begin() + k, 0);
              mp.layout.tp = tp;
              mp.layout.pp = pp;
              mp.layout.dp = dp;
              mp.layout.micro_batch = mbs;
              mp.layout.sequence_parallel = fx.sequence_parallel.value_or(false);
              mp.layout.distributed_optimizer = dopt;
              sh.apply(mp.layout);
              mp.layout.fp8_recipe = fx.fp8_recipe.value_or(llm.fp8_recipe);
              mp.layout.grad_reduce_dtype = fx.grad_reduce_dtype.value_or(llm.grad_reduce_dtype);
              mp.layout.cross_entropy_fusion =
                  fx.cross_entropy_fusion.value_or(llm.cross_entropy_fusion);
              mp.layout.fp8_param_gather = fx.fp8_param_gather.value_or(llm.fp8_param_gather);
              mp.layout.nccl_ub = fx.nccl_ub.value_or(llm.nccl_ub) && !mp.layout.torch_fsdp2();
              mp.layout.attention_kernel = fx.attention_kernel.value_or(llm.attention_kernel);
              mp.layout.fused_projections = fx.fused_projections.value_or(llm.fused_projections);
              mp.layout.repeat_kv = fx.repeat_kv.value_or(llm.repeat_kv);
              mp.layout.fused_activation = fx.fused_activation.value_or(llm.fused_activation);
              mp.layout.fused_rope = fx.fused_rope.value_or(llm.fused_rope);
              // Userbuffers for an encoder when its own fix asks (it needs TP with SP).
              mp.layout.tp_comm_overlap =
                  fx.tp_comm_overlap.value_or(false) && tp > 1 && mp.layout.sequence_parallel;
              x.plan.modules.push_back(mp);
              x.distopt_variants *= dv;
              add_encoders(x, k + 1, gpus_of, out);
            }
          }
      }
    }
  }

  // Whether a2a CP can split each TP rank's query and key/value heads over cp.
  bool a2a_splits(int tp, int cp) const { return heads_split(block_, tp, cp); }
  // The a2a level a searched a2a+p2p layout takes: the largest power of two below cp whose
  // ranks split the heads and, with TP, fit in a node (NVLink, as the hierarchy intends);
  // 1 where none does.
  int hierarchical_a2a(int tp, int cp) const {
    int best = 1;
    for (int a = 2; a < cp; a *= 2)
      if (cp % a == 0 && a2a_splits(tp, a) && tp * a <= gpn_) best = a;
    return best;
  }

  const Scenario& s_;
  const SearchSpec& spec_;
  std::vector<EncoderInfo> encoders_;
  int gpn_ = 1, world_ = 1, layers_ = 1, moe_experts_ = 0, top_k_ = 5;
  bool shared_experts_ = false;
  bool latent_attention_ = false;  // models::MlaSpec: the mla_up_proj module is tried too
  // Attention sinks: CP layouts run a2a only; sliding windows a2a or all_gather
  // (infeasibility()).
  bool a2a_cp_only_ = false;
  bool windowed_ = false;
  models::TransformerSpec block_;  // the LLM's layers: its heads for a2a CP
  bool dense_mlps_ = false;        // an MoE LLM's dense MLP layers: the mlp module is tried too
  bool exhaustive_ = false;
  // Module times per node group for sized_to_work() (enumeration is single-threaded).
  mutable CostCache speed_;
};

struct Ranked {
  Plan plan;
  PlanMetrics metrics;
};

bool better(const Ranked& a, const Ranked& b) {
  if (a.metrics.iteration_time != b.metrics.iteration_time)
    return a.metrics.iteration_time < b.metrics.iteration_time;
  return canonical_less(a.plan, b.plan);
}

}  // namespace

Result<SearchResult> search(const Scenario& s, const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  SearchResult res;
  res.threads = evaluation_threads(o.threads);
  tbb::task_arena arena(res.threads);
  Searcher searcher(s, o);
  const int top_k = searcher.top_k();
  const bool exhaustive = searcher.exhaustive();
  const std::vector<EncoderInfo> encoders = fed_encoders(s);

  std::vector<std::string> why_none;
  const std::vector<Base> bases = searcher.enumerate(why_none);
  std::vector<int> family(bases.size());
  for (size_t i = 0; i < bases.size(); ++i)
    family[i] = Searcher::family_of(bases[i].plan.placement);

  // 1. The trainers' constraints per base, in parallel; merged in order.
  std::vector<BaseInfo> info(bases.size());
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, bases.size(),
                      [&](size_t i) { info[i] = searcher.check(bases[i]); });
  });
  Histogram all;
  std::vector<Histogram> by_family(3);
  std::vector<int64_t> considered(3, 0), simulated(3, 0);
  std::vector<Candidate> cands;
  std::map<std::vector<int>, int32_t> sides;
  constexpr int32_t kKinds = 4;  // Recompute's kinds, selective_op included: a group per kind
  for (size_t i = 0; i < bases.size(); ++i) {
    const BaseInfo& r = info[i];
    res.counts.considered += r.considered;
    res.counts.pruned_dominated += r.dominated;
    considered[family[i]] += r.considered;
    if (!r.why.empty()) {
      const int64_t n = r.considered - r.dominated;
      res.counts.rejected += n;
      all.add(r.why, n);
      by_family[family[i]].add(r.why, n);
      continue;
    }
    int32_t side = -1;
    if (!bases[i].plan.modules.empty()) {
      auto [it, _] = sides.emplace(llm_key(bases[i].plan), static_cast<int32_t>(sides.size()));
      side = it->second;
    }
    for (size_t c = 0; c < r.combos.size(); ++c)
      cands.push_back({static_cast<uint32_t>(i), static_cast<uint16_t>(c), Time::zero(),
                       Time::zero(),
                       side < 0 ? -1 : side * kKinds + static_cast<int32_t>(r.combos[c][0].kind)});
  }
  // Per LLM side and recompute: the bounds of the encoder layouts admitted (and not turned
  // away for memory). A layout is admitted while fewer than kEncoderVariants of them have a
  // bound at or below its own: a recompute variant held for a later batch (its lighter
  // variant did not fit) keeps the place its bound gives it rather than the slots that
  // higher-bound layouts took meanwhile.
  std::vector<std::vector<Time>> admitted(sides.size() * kKinds);
  auto ahead = [&](const Candidate& c) {
    return std::count_if(admitted[c.group].begin(), admitted[c.group].end(),
                         [&](Time b) { return b <= c.bound; });
  };

  // 2. Lower bounds, and the order they give.
  tbb::enumerable_thread_specific<CostCache> caches([&] { return CostCache(s); });
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, cands.size(), [&](size_t i) {
      const Candidate& c = cands[i];
      const Plan plan = with_recompute(bases[c.base].plan, info[c.base].combos[c.combo]);
      cands[i].compute = compute_bound(caches.local(), encoders, s, plan);
      cands[i].bound = std::max(cands[i].compute, comm_floor(caches.local(), s, plan));
    });
  });
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    // Ties (plans whose communication floor dominates) by the compute bound: the encoder
    // layouts of one LLM side then come in the order of their own work.
    return std::tie(a.bound, a.compute, a.base, a.combo) <
           std::tie(b.bound, b.compute, b.base, b.combo);
  });

  // 3. In bound order, batch by batch: prune by the bound, skip combinations dominated by a
  // lighter one of the same base that fits, check memory, simulate.
  std::vector<Ranked> top;                                   // sorted by better()
  std::vector<std::optional<Ranked>> best(3);                // per family
  std::vector<std::vector<uint16_t>> fitting(bases.size());  // combos that fit, per base
  auto dominated = [&](const Candidate& c) {
    if (exhaustive) return false;
    const auto& combos = info[c.base].combos;
    for (uint16_t f : fitting[c.base])
      if (f != c.combo && dominated_by(combos[c.combo], combos[f])) return true;
    return false;
  };
  SearchProgress progress;
  progress.candidates = static_cast<int64_t>(cands.size());
  if (o.progress) o.progress(progress);
  // Exposed communication by kind costs a pass over the recorded tasks, far less than a
  // second simulation of the plans reported.
  EvaluateOptions eo;
  eo.exposed_by_kind = true;
  // Each thread refills one graph and one set of simulator arrays, plan after plan.
  tbb::enumerable_thread_specific<Workspace> workspaces;
  size_t next = 0;
  // A batch is kBatch plans that will run: candidates are admitted in bound order, checked
  // for memory (in parallel, a chunk at a time) and kept when they fit, until the batch is
  // full. It takes at most one candidate of a base: the others (its heavier recompute
  // variants, mostly dominated once it fits) wait in `held`, in bound order, for a later
  // batch.
  std::deque<const Candidate*> held;
  while (next < cands.size() || !held.empty()) {
    const Time kth =
        static_cast<int>(top.size()) >= top_k ? top.back().metrics.iteration_time : Time::max();
    std::vector<const Candidate*> batch;
    std::vector<Plan> plans;
    std::deque<const Candidate*> later;
    while ((next < cands.size() || !held.empty()) && batch.size() < kBatch) {
      std::vector<const Candidate*> chunk;
      while ((next < cands.size() || !held.empty()) && batch.size() + chunk.size() < kBatch) {
        const Candidate* pc = nullptr;
        if (!held.empty()) {
          pc = held.front();
          held.pop_front();
        } else {
          pc = &cands[next++];
        }
        const Candidate& c = *pc;
        auto same_base = [&](const Candidate* b) { return b->base == c.base; };
        if (std::any_of(batch.begin(), batch.end(), same_base) ||
            std::any_of(chunk.begin(), chunk.end(), same_base)) {
          later.push_back(pc);
          continue;
        }
        const int f = family[c.base];
        const Time fam = best[f] ? best[f]->metrics.iteration_time : Time::max();
        ++progress.done;
        if (!exhaustive && c.bound > std::max(kth, fam)) {
          ++res.counts.pruned_bound;
        } else if (dominated(c)) {
          ++res.counts.pruned_dominated;
        } else if (!exhaustive && c.group >= 0 && ahead(c) >= kEncoderVariants) {
          ++res.counts.pruned_encoder;
        } else {
          if (c.group >= 0) admitted[c.group].push_back(c.bound);
          chunk.push_back(pc);
        }
      }
      std::vector<Plan> chunk_plans(chunk.size());
      std::vector<std::string> why(chunk.size());
      arena.execute([&] {
        tbb::parallel_for(size_t{0}, chunk.size(), [&](size_t i) {
          const Candidate& c = *chunk[i];
          chunk_plans[i] = with_recompute(bases[c.base].plan, info[c.base].combos[c.combo]);
          // The task count first: it is cheap, and the memory estimate walks a heterogeneous
          // plan's schedule one micro-batch at a time.
          const double tasks = estimated_tasks(s, chunk_plans[i]);
          if (tasks > static_cast<double>(s.search.max_sim_tasks))
            why[i] = fmt::format(
                "too large to simulate in a search: about {:.1f}M tasks, over "
                "search.max_sim_tasks {:.1f}M (a placement that breaks the ranks' symmetry "
                "is simulated on every rank)",
                tasks / 1e6, static_cast<double>(s.search.max_sim_tasks) / 1e6);
          else
            why[i] = searcher.memory_verdict(chunk_plans[i], caches.local().graphs());
        });
      });
      for (size_t i = 0; i < chunk.size(); ++i) {
        const Candidate& c = *chunk[i];
        if (!why[i].empty()) {  // does not count as one of its LLM side's encoder layouts
          if (c.group >= 0) {
            auto& in = admitted[c.group];
            in.erase(std::find(in.begin(), in.end(), c.bound));
          }
          if (why[i].starts_with("too large to simulate")) ++res.counts.too_large;
          ++res.counts.rejected;
          all.add(why[i], 1);
          by_family[family[c.base]].add(why[i], 1);
          continue;
        }
        fitting[c.base].push_back(c.combo);
        batch.push_back(chunk[i]);
        plans.push_back(std::move(chunk_plans[i]));
      }
    }
    later.insert(later.end(), held.begin(), held.end());
    held = std::move(later);
    std::vector<std::optional<Result<PlanMetrics>>> out(batch.size());
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, batch.size(), [&](size_t i) {
        EvaluateOptions mine = eo;
        mine.workspace = &workspaces.local();
        out[i] = evaluate(s, plans[i], mine);
      });
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      const int f = family[batch[i]->base];
      // Not expected (constraints and memory were checked), but one plan the simulator
      // cannot run must not end the search: it is rejected with the simulator's reason.
      std::string why = !out[i]->is_ok()       ? "cannot simulate: " + out[i]->status().message()
                        : !(*out[i])->feasible ? (*out[i])->infeasible_reason
                                               : "";
      if (!why.empty()) {
        ++res.counts.rejected;
        all.add(why, 1);
        by_family[f].add(why, 1);
        continue;
      }
      ++res.counts.simulated;
      ++simulated[f];
      ++progress.simulated;
      Ranked r{plans[i], std::move(*out[i]).value()};
      if (!best[f] || better(r, *best[f])) best[f] = r;
      auto pos = std::upper_bound(top.begin(), top.end(), r, better);
      if (pos - top.begin() < top_k) {
        top.insert(pos, r);
        if (static_cast<int>(top.size()) > top_k) top.pop_back();
      }
    }
    progress.elapsed_s = elapsed();
    if (!top.empty()) progress.best = top.front().metrics.iteration_time;
    if (o.progress && !batch.empty()) o.progress(progress);
  }

  for (const Ranked& r : top) res.top.push_back({r.plan, r.metrics});
  for (int f = 0; f < 3; ++f) {
    FamilyResult fr;
    fr.placement = kPlacements[f];
    fr.considered = considered[f];
    fr.simulated = simulated[f];
    if (best[f]) {
      fr.best = RankedPlan{best[f]->plan, best[f]->metrics};
    } else if (!why_none[f].empty()) {
      fr.why_none = why_none[f];
    } else if (considered[f] == 0) {
      fr.why_none =
          "no layout of this placement fits the cluster's GPUs" + fixed_degrees(s.search.llm);
    } else {
      std::vector<RejectionReason> reasons = by_family[f].sorted();
      std::vector<std::string> parts;
      for (size_t i = 0; i < std::min<size_t>(3, reasons.size()); ++i)
        parts.push_back(fmt::format("{} x \"{}\"", reasons[i].count, reasons[i].example));
      fr.why_none =
          fmt::format("all {} candidates rejected: {}", considered[f], fmt::join(parts, "; "));
    }
    res.families.push_back(std::move(fr));
  }
  res.rejections = all.sorted();
  res.search_time_s = elapsed();
  return res;
}

}  // namespace hetpar::planner
