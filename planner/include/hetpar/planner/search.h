// search(): the fastest Plans for a Scenario — per-module layouts (tp, cp, pp, vpp, dp,
// ep, micro-batch, recompute, distributed optimizer, sequence parallelism with tp > 1)
// with the pipeline schedule, under every placement: homogeneous, colocated heterogeneous,
// and non-colocated heterogeneous with every sensible split of the GPUs between the
// encoders and the LLM (one encoder: whole nodes, and sub-node ranges of a power-of-two
// size; several: each a power of two of GPUs below a node or of whole nodes, in module
// order from rank 0, the LLM after them); a non-colocated encoder may pipeline over 1, 2,
// 4 or 8 stages. Each pipelined LLM layout is also tried with its layers sized to its
// stages' work (Layout::pipeline_layout: fewer layers on slower GPUs, on the stage with the
// output layer, on a homogeneous plan's first stage, which runs the encoders), with and
// without interleaving, where that shortens the largest stage by 1% or more. An
// interleaved layout whose micro-batches per replica pp does not divide runs them in
// Megatron-Core's smallest micro-batch group that takes them (smallest_interleaved_group).
//
// How (research/planners.md, "What to beat"):
// 1. Enumerate the grid (exact factorisations of each module's GPUs) within the scenario's
//    "search" section (fixed fields, forbidden placements, schedule). Every grid point is
//    "considered".
// 2. Reject what the real trainers cannot run, with a reason a user reads:
//    infeasibility() (tp divides heads and kv heads and is part of a node or whole nodes, layers
//    split over pp·vpp, global batch divisible by micro-batch·dp, DP sizes across the boundary
//    divide each other, power-of-two TP on the MIMO path, seq divisible by 2·cp, ...), then
//    estimate_memory() against the GPUs' memory (or the search's cap).
// 3. Prune without simulating:
//    - dominated variants: for fixed everything else, more recompute only adds compute, so
//      the lightest recompute policy (per module) that fits memory is kept; the distributed
//      optimizer moves the same gradient bytes (reduce-scatter + all-gather = all-reduce),
//      shards the optimizer step and needs less memory, so it is kept on wherever dp·cp > 1;
//      GPipe runs 1F1B's work with more memory held, so 1F1B stands for it; sequence
//      parallelism is on with tp > 1 (same bytes as the all-reduce, less memory);
//      (a field fixed by the search section overrides each of these rules);
//    - a lower bound on the iteration time (lower_bound() below) worse than both the
//      current k-th best and the current best of the candidate's family;
//    - heterogeneous plans: for one LLM side (its layout, recompute, schedule and ranks),
//      only the 4 encoder layouts with the lowest bounds that fit in memory are simulated.
//      An encoder that is a few percent of the work gives dozens of layouts within noise of
//      each other, and heterogeneous simulations are the costly ones (whole replicas or
//      every rank, lower.h); where the encoder is the bottleneck its work dominates the
//      bound, which then ranks its layouts;
//    - plans whose estimated task graph exceeds the scenario's search.max_sim_tasks are
//      rejected as too large to simulate (counted in SearchCounts::too_large).
//    Of these rules only the bound is exact; the others are stated assumptions that
//    tests/planner/search_test.cpp checks against brute force on a small scenario.
// 4. Simulate the survivors with evaluate() (fully: exposed communication by kind too) in
//    order of their bound, in fixed-size batches evaluated in parallel, at most one
//    candidate of a base (layouts and placement; its recompute variants wait for a later
//    batch); the bests after each batch set the next batch's pruning threshold, so the
//    candidates simulated, and the result, do not depend on the thread count. Ties go to
//    the canonical plan order (canonical_less()).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

struct SearchProgress {
  int64_t candidates = 0;  // in the simulation queue (feasible, not dominated)
  int64_t done = 0;        // of those, simulated or pruned so far
  int64_t simulated = 0;
  double elapsed_s = 0;
  std::optional<Time> best;
};

struct SearchOptions {
  int threads = 0;  // 0: every core
  int top_k = 0;    // 0: the scenario's search.top_k
  /// Brute force, for tests: no dominance rules and no lower-bound pruning (every
  /// feasible grid point, GPipe and the distributed optimizer off included, is simulated).
  bool exhaustive = false;
  /// Called on the calling thread after enumeration and after each simulated batch.
  std::function<void(const SearchProgress&)> progress;
};

struct RankedPlan {
  Plan plan;
  PlanMetrics metrics;  // evaluated fully (exposed_by_kind on)
};

struct FamilyResult {
  Placement placement = Placement::kHomogeneous;
  std::optional<RankedPlan> best;
  /// Why there is no plan: the placement is forbidden, does not apply (a model without
  /// encoders), or its most common rejection reasons.
  std::string why_none;
  int64_t considered = 0;
  int64_t simulated = 0;
};

struct RejectionReason {
  std::string reason;   // the reason with numbers replaced by N (the histogram key)
  std::string example;  // the first rejected candidate's full reason
  int64_t count = 0;
};

struct SearchCounts {
  int64_t considered = 0;        // grid points
  int64_t rejected = 0;          // by a constraint (reasons below)
  int64_t pruned_dominated = 0;  // dominated variants (step 3)
  int64_t pruned_bound = 0;      // lower bound worse than the threshold
  /// Heterogeneous: encoder layouts beyond the 4 lowest bounds for the same LLM side
  /// (layout, recompute, schedule, ranks).
  int64_t pruned_encoder = 0;
  /// Of `rejected`: plans larger than the search's max_sim_tasks (not simulated).
  int64_t too_large = 0;
  int64_t simulated = 0;  // evaluate() calls during the search
};

struct SearchResult {
  std::vector<RankedPlan> top;  // best first, at most top_k
  /// Homogeneous, colocated, non-colocated, in that order.
  std::vector<FamilyResult> families;
  SearchCounts counts;
  std::vector<RejectionReason> rejections;  // most frequent first
  double search_time_s = 0;
  int threads = 0;
};

/// Errors: the search section names what the model lacks, or an internal failure of
/// evaluate(). No feasible plan is not an error: top is empty and the families and
/// rejections say why.
Result<SearchResult> search(const Scenario& s, const SearchOptions& o = {});

/// A lower bound on evaluate()'s iteration time for a feasible plan, from the cost model's
/// per-rank compute and TP communication (at the profile's bus bandwidth; with
/// Layout::tp_comm_overlap only what userbuffers leave exposed) of each pipeline stage times
/// its micro-batches, plus the pipeline fill and drain the stage cannot avoid
/// (forward and backward of the first / last micro-batch on the stages before it), and for
/// heterogeneous plans the encoder's work (colocated: on the same GPUs; non-colocated: its
/// own ranks, and the first step's forward and the last step's backward around the LLM's
/// pipeline). The all-to-alls that block the compute after them count at the fastest rate
/// their group can reach (inside a node the TP link or the profile's intra-node all_to_all;
/// an EP group across nodes, the share of each rank's buffer bound for other nodes through
/// its NIC): a2a CP's, and the EP dispatch's and combine's, beside the shared experts under
/// Layout::moe_shared_expert_overlap the longer of the two; under ep_comm_overlap, where
/// another micro-batch's compute may hide them, apart: a stage's work is at least its
/// micro-batches' all-to-alls on their stream; DeepEP's across nodes the longer of its
/// NVLink all-to-all and its transfers through the NIC (under ep_comm_overlap each part's
/// sum on its own stream). Ignores DP, the CP ring and pipeline transfers, the optimizer step and
/// contention, so it is below the simulated time (tests/planner/search_test.cpp checks it).
/// With one node type, the bound is also at least each of two communication floors: the
/// LLM's pipeline transfers leaving a node (every micro-batch's activation and gradient at
/// each virtual-stage boundary between nodes) over its egress, and the DP reduce-scatter's
/// shards entering and leaving a node over its ingress / egress (NICs, or the internet
/// link's down / up rates); where those dominate (internet-scale links), ties go to the
/// compute part, so an LLM side's encoder layouts keep their order.
/// REQUIRES: infeasibility(s, p) is empty.
Time lower_bound(const Scenario& s, const Plan& p);

/// The canonical order of plans (placement, then the LLM's layout fields, schedule, then
/// each module's): ties in iteration time go to the earlier plan.
bool canonical_less(const Plan& a, const Plan& b);

/// One line describing a plan: "homogeneous tp2 sp dp32 mb1 sel do 1f1b" or, with
/// encoders, "non_colocated vision[tp1 dp8 mb4 @0] llm[tp2 pp2 dp14 mb1 @8] zb-h1".
std::string describe(const Plan& p);

}  // namespace hetpar::planner
