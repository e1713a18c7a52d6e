// search(): the trainers' constraints reject with reasons, the pruned search finds what
// brute force finds, the lower bound stays below the simulated time, the result does not
// depend on the thread count, and the scenario's search section is honoured.
#include "hetpar/planner/search.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/plan_json.h"
#include "hetpar/planner/published_run.h"
#include "hetpar/planner/schedule.h"
#include "two_encoders.h"

namespace hetpar::planner {
namespace {

// A small vision encoder + projector + a 4-layer LLM (16 heads, 4 kv heads: TP 8 does not
// divide them) on one DGX H100 node: few tasks to simulate, yet compute-bound as real
// models are (the search's dominance rules assume that; see search.h).
Scenario tiny(const std::string& search = "", int global_batch = 8,
              const std::string& precision = "bf16",
              const std::string& cluster = R"({"profile": "dgx-h100", "nodes": 1})") {
  std::string text = fmt::format(R"({{
    "name": "tiny",
    "model": {{"name": "tiny-vlm", "modules": [
      {{"name": "vision", "kind": "vision_encoder", "spec": {{"layers": 4, "hidden": 1024,
        "ffn_hidden": 4096, "heads": 16, "patch_size": 14, "image_size": 336,
        "class_token": true, "activation": "gelu", "norm": "layernorm"}}}},
      {{"name": "projector", "kind": "projector", "spec": {{"input_hidden": 1024,
        "output_hidden": 2048, "layers": 2, "ffn_hidden": 2048, "activation": "gelu"}}}},
      {{"name": "llm", "kind": "llm", "spec": {{"layers": 4, "hidden": 2048,
        "ffn_hidden": 8192, "heads": 16, "kv_heads": 4, "vocab": 32000,
        "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "tied_embeddings": false}}}}],
      "edges": [["vision", "projector"], ["projector", "llm"]]}},
    "workload": {{"seq_len": 2048, "global_batch": {}, "images_per_sample": 1,
                  "precision": "{}"}},
    "cluster": {}{}
  }})",
                                 global_batch, precision, cluster,
                                 search.empty() ? "" : ", \"search\": " + search);
  auto s = parse_scenario_text(text, "tiny.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

SearchOptions threads(int n, bool exhaustive = false) {
  SearchOptions o;
  o.threads = n;
  o.exhaustive = exhaustive;
  if (exhaustive) o.top_k = 100000;
  return o;
}

SearchResult run(const Scenario& s, const SearchOptions& o) {
  auto r = search(s, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return *r;
}

TEST(Search, CountsAddUpAndRejectionsHaveReasons) {
  const SearchResult r = run(tiny(), threads(2));
  const SearchCounts& c = r.counts;
  EXPECT_EQ(c.considered,
            c.rejected + c.pruned_dominated + c.pruned_bound + c.pruned_encoder + c.simulated);
  EXPECT_GT(c.rejected, 0);
  EXPECT_GT(c.simulated, 0);
  int64_t histogram = 0;
  bool heads = false;
  for (const RejectionReason& rr : r.rejections) {
    histogram += rr.count;
    EXPECT_FALSE(rr.example.empty());
    if (rr.example.find("tp 8 does not divide llm kv_heads 4") != std::string::npos) heads = true;
  }
  EXPECT_EQ(histogram, c.rejected);
  EXPECT_TRUE(heads) << "TP 8 on 4 kv heads must be rejected with the reason";
  // Every family found a plan, and the winner is the best of its family.
  ASSERT_EQ(r.families.size(), 3u);
  for (const FamilyResult& f : r.families) EXPECT_TRUE(f.best.has_value()) << f.why_none;
  ASSERT_FALSE(r.top.empty());
  const Plan& w = r.top.front().plan;
  const FamilyResult& wf = r.families[static_cast<int>(w.placement)];
  EXPECT_EQ(wf.best->plan, w);
  // The reported plans are evaluated fully and are feasible.
  for (const RankedPlan& p : r.top) {
    EXPECT_TRUE(p.metrics.feasible);
    EXPECT_TRUE(infeasibility(tiny(), p.plan).empty());
  }
}

TEST(Search, FindsTheBruteForceBestAndTheBoundHolds) {
  // The encoder's TP fixed (to keep brute force to a few thousand simulations).
  const Scenario s = tiny(R"({"modules": {"vision": {"tp": 2}}})", 4);
  const SearchResult fast = run(s, threads(2));
  const SearchResult brute = run(s, threads(2, true));
  ASSERT_FALSE(brute.top.empty());
  EXPECT_EQ(brute.counts.pruned_bound + brute.counts.pruned_encoder, 0);
  EXPECT_GT(brute.counts.simulated, 10 * fast.counts.simulated);
  EXPECT_EQ(fast.top.front().plan, brute.top.front().plan)
      << describe(fast.top.front().plan) << " vs " << describe(brute.top.front().plan);
  EXPECT_EQ(fast.top.front().metrics.iteration_time, brute.top.front().metrics.iteration_time);
  for (int f = 0; f < 3; ++f) {
    ASSERT_EQ(fast.families[f].best.has_value(), brute.families[f].best.has_value());
    if (!brute.families[f].best) {
      ADD_FAILURE() << to_string(brute.families[f].placement) << ": " << brute.families[f].why_none;
      continue;
    }
    EXPECT_EQ(fast.families[f].best->metrics.iteration_time,
              brute.families[f].best->metrics.iteration_time)
        << describe(fast.families[f].best->plan) << " vs "
        << describe(brute.families[f].best->plan);
  }
  // The lower bound never exceeds the simulated time.
  for (const RankedPlan& p : brute.top)
    EXPECT_LE(lower_bound(s, p.plan), p.metrics.iteration_time) << describe(p.plan);
}

// On a cluster of two node groups (one DGX A100, one DGX H100) the bound takes each stage's
// work on the slowest group its ranks lie on and each module's own group where it has one:
// it stays below every simulated plan, prunes, and the pruned search still finds what brute
// force finds, the distributed optimizer's dominance rule included.
TEST(Search, TheBoundHoldsOnAMixedCluster) {
  const Scenario s = tiny(R"({"modules": {"vision": {"tp": 1}}, "llm": {"tp": 2}})", 16, "bf16",
                          R"({"node_groups": [{"profile": "dgx-a100-80gb", "nodes": 1},
                                              {"profile": "dgx-h100", "nodes": 1}]})");
  const SearchResult fast = run(s, threads(2));
  const SearchResult brute = run(s, threads(2, true));
  ASSERT_FALSE(brute.top.empty());
  EXPECT_GT(fast.counts.pruned_bound, 0);
  EXPECT_EQ(fast.top.front().metrics.iteration_time, brute.top.front().metrics.iteration_time)
      << describe(fast.top.front().plan) << " vs " << describe(brute.top.front().plan);
  for (const RankedPlan& p : brute.top)
    EXPECT_LE(lower_bound(s, p.plan), p.metrics.iteration_time) << describe(p.plan);
}

// On one DGX A100 and one DGX H100, an LLM pipelined over both gets its layers by the
// stages' speed: one on the A100s, three on the H100s,
// faster than the even split, which the search also weighs; the bound holds for both.
TEST(Search, SizesPipelineStagesToTheirGpusOnAMixedCluster) {
  const Scenario s = tiny(R"({"llm": {"tp": 2, "pp": 2, "distributed_optimizer": true},
                              "forbid_placements": ["colocated", "non_colocated"]})",
                          16, "bf16",
                          R"({"node_groups": [{"profile": "dgx-a100-80gb", "nodes": 1},
                                              {"profile": "dgx-h100", "nodes": 1}]})");
  const SearchResult r = run(s, threads(2));
  ASSERT_FALSE(r.top.empty());
  const Plan& best = r.top.front().plan;
  EXPECT_EQ(best.layout.pipeline_layout, (std::vector<int>{1, 3})) << describe(best);
  Plan even = best;
  even.layout.pipeline_layout.clear();
  auto m = evaluate(s, even);
  ASSERT_TRUE(m.is_ok() && m->feasible);
  EXPECT_LT(r.top.front().metrics.iteration_time, m->iteration_time);
  EXPECT_LE(lower_bound(s, best), r.top.front().metrics.iteration_time);
  EXPECT_LE(lower_bound(s, even), m->iteration_time);
  // On one kind of node every stage is as fast: no sized variant.
  const Scenario one = tiny(R"({"llm": {"tp": 2, "pp": 2, "distributed_optimizer": true},
                                "forbid_placements": ["colocated", "non_colocated"]})",
                            16, "bf16", R"({"profile": "dgx-h100", "nodes": 2})");
  for (const RankedPlan& p : run(one, threads(2)).top)
    EXPECT_TRUE(p.plan.layout.pipeline_layout.empty()) << describe(p.plan);
}

// On one kind of GPU the sizing balances the output layer: Llama 3.1 8B's (a 128K
// vocabulary, about 2.4 layers' work) makes the last of four stages the largest, so the
// search gives it fewer layers than the first, which beats the even split.
TEST(Search, BalancesTheOutputLayerOnOneKindOfGpu) {
  auto s = parse_scenario_text(R"({"name": "llama8b-pp4", "model": "llama-3.1-8b",
      "workload": {"seq_len": 4096, "global_batch": 32, "precision": "bf16"},
      "cluster": {"profile": "dgx-h100", "nodes": 1},
      "search": {"llm": {"tp": 2, "pp": 4, "vpp": 1, "micro_batch": 1,
                         "distributed_optimizer": true}, "schedule": "1f1b"}})",
                               "llama8b.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty());
  const Plan& best = r.top.front().plan;
  ASSERT_EQ(best.layout.pipeline_layout.size(), 4u) << describe(best);
  EXPECT_LT(best.layout.pipeline_layout.back(), best.layout.pipeline_layout.front());
  Plan even = best;
  even.layout.pipeline_layout.clear();
  auto m = evaluate(*s, even);
  ASSERT_TRUE(m.is_ok() && m->feasible);
  EXPECT_LT(r.top.front().metrics.iteration_time, m->iteration_time);
  EXPECT_LE(lower_bound(*s, best), r.top.front().metrics.iteration_time);
  // search.llm.sized_stages false: even splits only, for trainers without a layout.
  Scenario even_only = *s;
  even_only.search.llm.sized_stages = false;
  for (const RankedPlan& p : run(even_only, threads(2)).top)
    EXPECT_TRUE(p.plan.layout.pipeline_layout.empty()) << describe(p.plan);
}

// pp 2 over 31 layers has no even split and Megatron's first/last rule needs pp >= 3: the
// split sized to the stages' work is the only one, and the search finds it (without
// sized_stages, no plan at pp 2).
// A Llama-3.1-8B-shaped LLM of `layers` layers on one DGX H100, its search.llm `fixed`.
Result<Scenario> llama_layers(int layers, const std::string& fixed) {
  return parse_scenario_text(
      fmt::format(R"({{"name": "odd-layers", "model": {{"name": "llama-{0}-layers",
      "modules": [{{"name": "llm", "kind": "llm", "spec": {{"layers": {0}, "hidden": 4096,
        "ffn_hidden": 14336, "heads": 32, "kv_heads": 8, "vocab": 128256,
        "activation": "swiglu", "norm": "rmsnorm"}}}}]}},
      "workload": {{"seq_len": 4096, "global_batch": 32, "precision": "bf16"}},
      "cluster": {{"profile": "dgx-h100", "nodes": 1}},
      "search": {{"llm": {{{1}}}}}}})",
                  layers, fixed),
      "odd.json");
}

TEST(Search, SizesStagesWhereNoEvenSplitExists) {
  auto s = llama_layers(31, R"("tp": 4, "pp": 2, "micro_batch": 1, "distributed_optimizer": true)");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty());
  bool interleaved = false;
  for (const RankedPlan& p : r.top) {
    const std::vector<int>& split = p.plan.layout.pipeline_layout;
    ASSERT_EQ(split.size(), 2u * p.plan.layout.vpp) << describe(p.plan);
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), 31) << describe(p.plan);
    EXPECT_LE(lower_bound(*s, p.plan), p.metrics.iteration_time) << describe(p.plan);
    interleaved |= p.plan.schedule == Schedule::kInterleaved;
  }
  EXPECT_TRUE(interleaved);
  // The output layer's stage holds fewer layers.
  const Plan& best = r.top.front().plan;
  if (best.layout.vpp == 1) {
    EXPECT_LT(best.layout.pipeline_layout[1], best.layout.pipeline_layout[0]) << describe(best);
  }
  Scenario even_only = *s;
  even_only.search.llm.sized_stages = false;
  EXPECT_TRUE(run(even_only, threads(2)).top.empty());
}

// pp 4 over 30 layers has no even split; with the embedding and the loss counted as layers
// (Megatron's --account-for-embedding/loss-in-pipeline-split) the 32 slots split into 4 x 4
// virtual stages of 2, which the search offers interleaved (the first and last with one
// layer beside the embedding / loss); without it a fixed vpp 4 would have no plan.
TEST(Search, CountsTheEmbeddingAndLossAsLayersWhereNoEvenSplitExists) {
  auto s = llama_layers(30, R"("tp": 2, "pp": 4, "vpp": 4, "micro_batch": 1,
                               "distributed_optimizer": true, "sized_stages": false)");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty());
  for (const RankedPlan& p : r.top) {
    EXPECT_TRUE(p.plan.layout.account_for_embedding && p.plan.layout.account_for_loss)
        << describe(p.plan);
    EXPECT_EQ(p.plan.schedule, Schedule::kInterleaved);
    EXPECT_NE(describe(p.plan).find("vpp4"), std::string::npos) << describe(p.plan);
    EXPECT_NE(describe(p.plan).find("slots:embedding+loss"), std::string::npos);
    const std::vector<int64_t> split = layers_per_virtual_stage(p.plan.layout, 30, nullptr);
    ASSERT_EQ(split.size(), 16u);
    EXPECT_EQ(split.front(), 1);
    EXPECT_EQ(split.back(), 1);
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), int64_t{0}), 30);
    EXPECT_LE(lower_bound(*s, p.plan), p.metrics.iteration_time) << describe(p.plan);
  }
  // A vpp that divides no split leaves no layout at all: the reason names the fixed degrees.
  auto three = llama_layers(30, R"("tp": 2, "pp": 4, "vpp": 3, "micro_batch": 1,
                                   "distributed_optimizer": true, "sized_stages": false)");
  ASSERT_TRUE(three.is_ok()) << three.status().to_string();
  const SearchResult none = run(*three, threads(2));
  EXPECT_TRUE(none.top.empty());
  ASSERT_FALSE(none.families.empty());
  EXPECT_NE(none.families[0].why_none.find("with search.llm tp 2, pp 4, vpp 3, micro_batch 1"),
            std::string::npos)
      << none.families[0].why_none;
}

// The example scenario `file`: the lower bound stays below each of its plans' simulated
// time.
Result<Scenario> expect_bound_below_plans(const std::string& file) {
  auto s = load_scenario(std::string(HETPAR_SOURCE_DIR) + "/examples/" + file);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return s;
  for (const auto& [name, plan] : s->plans) {
    auto m = evaluate(*s, plan);
    EXPECT_TRUE(m.is_ok() && m->feasible) << name;
    if (m.is_ok()) {
      EXPECT_LE(lower_bound(*s, plan), m->iteration_time) << name;
    }
  }
  return s;
}

// With userbuffers the bound leaves out the TP collectives they hide (all but a
// reduce-scatter's last chunk): it stays below every simulated plan, and the pruned search
// still finds what brute force finds.
TEST(Search, TheBoundHoldsWithUserbuffers) {
  const Scenario s = tiny(R"({"llm": {"tp_comm_overlap": true, "pp": 1},
                              "modules": {"vision": {"tp": 2}},
                              "forbid_placements": ["non_colocated"]})",
                          4);
  const SearchResult fast = run(s, threads(2));
  const SearchResult brute = run(s, threads(2, true));
  ASSERT_FALSE(brute.top.empty());
  EXPECT_EQ(fast.top.front().metrics.iteration_time, brute.top.front().metrics.iteration_time);
  int with = 0;
  for (const RankedPlan& p : brute.top) {
    EXPECT_LE(lower_bound(s, p.plan), p.metrics.iteration_time) << describe(p.plan);
    with += p.plan.layout.tp_comm_overlap ? 1 : 0;
  }
  EXPECT_GT(with, 0);
  // On 70B GEMMs, where userbuffers hide most of the TP communication, counting it would
  // put the bound above the simulated time.
  expect_bound_below_plans("llama3-70b-64xh100-userbuffers-compare.json");
}

// "any" searches every TP layout with and without userbuffers: its best is the better of
// the two searches, and on the tiny model's launch-bound GEMMs that is without.
TEST(Search, TriesUserbuffersBothWaysWithAny) {
  const std::string fixed = R"("pp": 1}, "modules": {"vision": {"tp": 2}}})";
  const SearchResult off = run(tiny(R"({"llm": {)" + fixed), threads(2));
  const SearchResult on = run(tiny(R"({"llm": {"tp_comm_overlap": true, )" + fixed), threads(2));
  const SearchResult any = run(tiny(R"({"llm": {"tp_comm_overlap": "any", )" + fixed), threads(2));
  ASSERT_FALSE(off.top.empty() || on.top.empty() || any.top.empty());
  EXPECT_EQ(
      any.top.front().metrics.iteration_time,
      std::min(off.top.front().metrics.iteration_time, on.top.front().metrics.iteration_time));
  EXPECT_GT(any.counts.considered, off.counts.considered);
  for (const RankedPlan& p : off.top) EXPECT_FALSE(p.plan.layout.tp_comm_overlap);
}

// The EP all-to-all overlap hides communication, not compute: the bound (which leaves EP
// out) stays below its plans; search.llm.ep_comm_overlap "any" tries the MoE layouts both
// ways and, with the all-to-alls on the critical path, picks the overlap; without the
// field no plan overlaps.
TEST(Search, TriesTheEpOverlapBothWaysWithAny) {
  auto s = expect_bound_below_plans("qwen3-30b-16xh100-ep-overlap-compare.json");
  ASSERT_TRUE(s.is_ok());
  ASSERT_TRUE(s->search.llm.any_ep_comm_overlap);
  s->search.llm.cp = 1;  // a smaller search, the same question
  const SearchResult any = run(*s, threads(2));
  s->search.llm.any_ep_comm_overlap = false;
  const SearchResult off = run(*s, threads(2));
  ASSERT_FALSE(any.top.empty() || off.top.empty());
  EXPECT_GT(any.counts.considered, off.counts.considered);
  EXPECT_TRUE(any.top.front().plan.layout.ep_comm_overlap) << describe(any.top.front().plan);
  EXPECT_LT(any.top.front().metrics.iteration_time, off.top.front().metrics.iteration_time);
  for (const RankedPlan& p : off.top) EXPECT_FALSE(p.plan.layout.ep_comm_overlap);
  // Beside userbuffers: with TP 2, SP and tp_comm_overlap fixed, "any" still tries the
  // overlap in every layout it applies to, each with userbuffers.
  {
    Scenario ub = *s;
    ub.search.llm.tp = 2;
    ub.search.llm.pp = 1;
    ub.search.llm.sequence_parallel = true;
    ub.search.llm.tp_comm_overlap = true;
    ub.search.llm.any_ep_comm_overlap = true;
    const SearchResult both = run(ub, threads(2));
    ub.search.llm.any_ep_comm_overlap = false;
    const SearchResult tp_only = run(ub, threads(2));
    ASSERT_FALSE(both.top.empty() || tp_only.top.empty());
    EXPECT_GT(both.counts.considered, tp_only.counts.considered);
    bool paired = false;
    for (const RankedPlan& p : both.top)
      paired = paired || (p.plan.layout.ep_comm_overlap && p.plan.layout.tp_comm_overlap);
    EXPECT_TRUE(paired) << describe(both.top.front().plan);
  }
  // search.llm.moe_capacity_factor sets token dropping in every searched layout.
  s->search.llm.moe_capacity_factor = 1.0;
  const SearchResult drop = run(*s, threads(2));
  ASSERT_FALSE(drop.top.empty());
  for (const RankedPlan& p : drop.top) EXPECT_EQ(p.plan.layout.moe_capacity_factor, 1.0);
  // search.llm.moe_load_imbalance sets the routing's hottest rank in every searched layout;
  // its plans with EP (here EP 8, fixed) are timed at that load (faster with every expert
  // evenly loaded).
  s->search.llm.moe_capacity_factor.reset();
  s->search.llm.moe_load_imbalance = 1.5;
  s->search.llm.ep = 8;
  const SearchResult hot = run(*s, threads(2));
  ASSERT_FALSE(hot.top.empty());
  int with_ep = 0;
  for (const RankedPlan& p : hot.top) {
    EXPECT_EQ(p.plan.layout.moe_load_imbalance, 1.5);
    if (p.plan.layout.ep == 1) continue;
    Plan even = p.plan;
    even.layout.moe_load_imbalance = 1;
    auto m = evaluate(*s, even);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_LT(m->iteration_time, p.metrics.iteration_time) << describe(p.plan);
    ++with_ep;
  }
  EXPECT_GT(with_ep, 0);
}

// search.llm.cross_entropy_fusion sets the loss kernel of every searched layout (not a
// searched choice): TE's fused cross-entropy makes every plan faster, and the plan and its
// description carry it.
TEST(Search, CrossEntropyFusionIsSetForEveryLayout) {
  auto s = expect_bound_below_plans("llama3-8b-8xh100-fsdp-compare.json");
  ASSERT_TRUE(s.is_ok());
  const SearchResult plain = run(*s, threads(2));
  s->search.llm.cross_entropy_fusion = CrossEntropy::kTe;
  const SearchResult fused = run(*s, threads(2));
  ASSERT_FALSE(plain.top.empty() || fused.top.empty());
  for (const RankedPlan& p : fused.top) {
    EXPECT_EQ(p.plan.layout.cross_entropy_fusion, CrossEntropy::kTe);
    EXPECT_NE(describe(p.plan).find(" ce:te"), std::string::npos) << describe(p.plan);
  }
  EXPECT_LT(fused.top.front().metrics.iteration_time, plain.top.front().metrics.iteration_time);
}

// search.llm.recompute selective_op, attention_kernel flash2 and the layer code (torchtitan's
// checkpointing, SDPA kernel and model code) hold in every searched layout; selective_op's
// TP 1 limit prunes the rest.
TEST(Search, TorchtitanPolicyAndKernelAreSetForEveryLayout) {
  auto s = expect_bound_below_plans("llama3-8b-8xh100-fsdp-compare.json");
  ASSERT_TRUE(s.is_ok());
  s->search.llm.recompute = models::Recompute::kSelectiveOp;
  s->search.llm.attention_kernel = hardware::AttentionKernel::kFlash2;
  const SearchResult megatron_code = run(*s, threads(2));
  // torchtitan's layer code too: separate projections, repeat_kv (slower, never faster).
  s->search.llm.fused_projections = false;
  s->search.llm.repeat_kv = true;
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty() || megatron_code.top.empty());
  for (const RankedPlan& p : r.top) {
    EXPECT_EQ(p.plan.layout.recompute, models::Recompute::kSelectiveOp);
    EXPECT_EQ(p.plan.layout.attention_kernel, hardware::AttentionKernel::kFlash2);
    EXPECT_FALSE(p.plan.layout.fused_projections);
    EXPECT_TRUE(p.plan.layout.repeat_kv);
    EXPECT_EQ(p.plan.layout.tp, 1);
    EXPECT_NE(describe(p.plan).find(" attn:flash2 separate-proj repeat-kv"), std::string::npos)
        << describe(p.plan);
  }
  EXPECT_GT(r.top.front().metrics.iteration_time, megatron_code.top.front().metrics.iteration_time);
}

// A MoE LLM next to an encoder: the overlap is lowered on the LLM's own ranks
// (non-colocated), refused where the encoder's passes share its GPUs (colocated).
TEST(Search, EpOverlapBesideAnEncoderOnlyOnItsOwnRanks) {
  const std::string text = R"({
    "name": "tiny-moe-vlm",
    "model": {"name": "tiny-moe-vlm", "modules": [
      {"name": "vision", "kind": "vision_encoder", "spec": {"layers": 4, "hidden": 1024,
        "ffn_hidden": 4096, "heads": 16, "patch_size": 14, "image_size": 336,
        "class_token": true, "activation": "gelu", "norm": "layernorm"}},
      {"name": "projector", "kind": "projector", "spec": {"input_hidden": 1024,
        "output_hidden": 2048, "layers": 2, "ffn_hidden": 2048, "activation": "gelu"}},
      {"name": "llm", "kind": "llm", "spec": {"layers": 4, "hidden": 2048, "ffn_hidden": 0,
        "heads": 16, "kv_heads": 4, "vocab": 32000, "activation": "swiglu", "norm": "rmsnorm",
        "moe": {"experts": 6, "top_k": 2, "expert_ffn_hidden": 2048}}}],
      "edges": [["vision", "projector"], ["projector", "llm"]]},
    "workload": {"seq_len": 2048, "global_batch": 24, "images_per_sample": 1},
    "cluster": {"profile": "dgx-h100", "nodes": 1},
    "plans": {
      "colocated": {"dp": 8, "ep": 2, "micro_batch": 1, "ep_comm_overlap": true,
                    "placement": "colocated",
                    "modules": {"vision": {"dp": 8, "micro_batch": 1}}},
      "non_colocated": {"dp": 6, "ep": 6, "micro_batch": 1, "ep_comm_overlap": true,
                        "placement": "non_colocated", "llm_first_rank": 2,
                        "modules": {"vision": {"dp": 2, "micro_batch": 3, "first_rank": 0}}}}
  })";
  auto s = parse_scenario_text(text, "tiny-moe-vlm.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto plan_named = [&](std::string_view name) -> const Plan& {
    for (const auto& [n, p] : s->plans)
      if (n == name) return p;
    ADD_FAILURE() << "no plan " << name;
    return s->plans.front().second;
  };
  EXPECT_NE(infeasibility(*s, plan_named("colocated")).find("colocated placement is not modelled"),
            std::string::npos);
  const Plan& nc = plan_named("non_colocated");
  ASSERT_EQ(infeasibility(*s, nc), "");
  auto m = evaluate(*s, nc, {.full_ranks = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE(m->feasible) << m->infeasible_reason;
}

// An encoder's own fix turns userbuffers on for it (with TP and SP), not for the LLM.
TEST(Search, GivesAnEncoderUserbuffersWhenItsFixAsks) {
  const SearchResult r =
      run(tiny(R"({"modules": {"vision": {"tp": 2, "sp": true, "tp_comm_overlap": true}},
                   "forbid_placements": ["homogeneous"]})"),
          threads(2));
  ASSERT_FALSE(r.top.empty());
  for (const RankedPlan& p : r.top) {
    EXPECT_FALSE(p.plan.layout.tp_comm_overlap) << describe(p.plan);
    for (const ModulePlan& m : p.plan.modules) EXPECT_TRUE(m.layout.tp_comm_overlap);
    EXPECT_NE(describe(p.plan).find(" ub]"), std::string::npos) << describe(p.plan);
  }
}

TEST(Search, SameResultOnOneAndTwoThreads) {
  const Scenario s = tiny();
  const SearchResult one = run(s, threads(1));
  const SearchResult two = run(s, threads(2));
  ASSERT_EQ(one.top.size(), two.top.size());
  for (size_t i = 0; i < one.top.size(); ++i) {
    EXPECT_EQ(one.top[i].plan, two.top[i].plan);
    EXPECT_EQ(one.top[i].metrics.iteration_time, two.top[i].metrics.iteration_time);
  }
  EXPECT_EQ(one.counts.simulated, two.counts.simulated);
  EXPECT_EQ(one.counts.pruned_bound, two.counts.pruned_bound);
  EXPECT_EQ(one.counts.rejected, two.counts.rejected);
}

TEST(Search, HonoursTheSearchSection) {
  const Scenario s = tiny(R"({"llm": {"tp": 2, "micro_batch": 1},
                              "modules": {"vision": {"tp": 1}},
                              "forbid_placements": ["non_colocated"],
                              "max_memory_GiB": 20, "schedule": "1f1b", "top_k": 3})");
  EXPECT_EQ(s.search.llm.tp, 2);
  const SearchResult r = run(s, threads(2));
  ASSERT_FALSE(r.top.empty());
  EXPECT_LE(r.top.size(), 3u);
  EXPECT_FALSE(r.families[2].best.has_value());
  EXPECT_NE(r.families[2].why_none.find("forbidden"), std::string::npos);
  std::vector<RankedPlan> plans = r.top;
  for (const FamilyResult& f : r.families)
    if (f.best) plans.push_back(*f.best);
  for (const RankedPlan& p : plans) {
    EXPECT_EQ(p.plan.layout.tp, 2) << describe(p.plan);
    EXPECT_EQ(p.plan.layout.micro_batch, 1);
    EXPECT_EQ(p.plan.schedule, Schedule::k1F1B);
    EXPECT_NE(p.plan.placement, Placement::kNonColocated);
    for (const ModulePlan& m : p.plan.modules) EXPECT_EQ(m.layout.tp, 1);
    EXPECT_LE(p.metrics.memory.peak, Bytes::GiB(20));
  }
  // A cap nothing fits under: no plan, every candidate rejected by the cap or a constraint.
  const SearchResult none = run(tiny(R"({"max_memory_GiB": 0.5})"), threads(2));
  EXPECT_TRUE(none.top.empty());
  bool cap = false;
  for (const RejectionReason& rr : none.rejections)
    cap |= rr.reason.find("memory cap") != std::string::npos;
  EXPECT_TRUE(cap);
  for (const FamilyResult& f : none.families) EXPECT_FALSE(f.why_none.empty());
}

// Where pp does not divide the micro-batches per replica, the interleaved schedule runs with
// Megatron-Core's smallest micro-batch group that takes them (its default, pp, cannot):
// 3 micro-batches on 2 stages in one group of 3. Before, the search rejected them all.
TEST(Search, InterleavesWithTheSmallestMicroBatchGroupWherePpDoesNotDivide) {
  EXPECT_EQ(smallest_interleaved_group(2, 4), 2);
  EXPECT_EQ(smallest_interleaved_group(2, 3), 3);
  EXPECT_EQ(smallest_interleaved_group(4, 6), 6);
  EXPECT_EQ(smallest_interleaved_group(4, 9), 5);  // groups 5, 4: the last at least pp
  EXPECT_EQ(smallest_interleaved_group(4, 3), 0);
  const Scenario s = tiny(R"({"llm": {"tp": 2, "pp": 2, "micro_batch": 1},
                              "modules": {"vision": {"tp": 1}},
                              "schedule": "interleaved", "top_k": 50})",
                          6);
  const SearchResult r = run(s, threads(2));
  ASSERT_FALSE(r.top.empty());
  for (const RankedPlan& p : r.top) {
    const Layout& l = p.plan.layout;
    ASSERT_EQ(p.plan.schedule, Schedule::kInterleaved);
    const int64_t m = num_micro_batches(l, 6);
    EXPECT_EQ(l.microbatch_group, m % l.pp == 0 ? 0 : smallest_interleaved_group(l.pp, m))
        << describe(p.plan);
    EXPECT_TRUE(infeasibility(s, p.plan).empty()) << describe(p.plan);
    EXPECT_TRUE(p.metrics.feasible) << describe(p.plan);
    EXPECT_LE(lower_bound(s, p.plan), p.metrics.iteration_time) << describe(p.plan);
  }
  // The homogeneous LLM on dp 2: 3 micro-batches per replica, one group of 3.
  const FamilyResult& homogeneous = r.families[static_cast<int>(Placement::kHomogeneous)];
  ASSERT_TRUE(homogeneous.best.has_value()) << homogeneous.why_none;
  EXPECT_EQ(homogeneous.best->plan.layout.microbatch_group, 3) << describe(homogeneous.best->plan);
  EXPECT_NE(describe(homogeneous.best->plan).find(" vpp2 group3 dp2"), std::string::npos)
      << describe(homogeneous.best->plan);
}

// A MoE LLM alone (hidden 1024, `experts` experts of top 2) on `nodes` DGX H100 nodes, its
// search section's llm fields `llm` (JSON members).
Scenario moe_search(int experts, int nodes, int global_batch, const std::string& llm,
                    int shared_experts = 0, const std::string& search_extra = "") {
  auto s = parse_scenario_text(
      fmt::format(R"({{"name": "moe", "model": {{"name": "tiny-moe",
      "modules": [{{"name": "llm", "kind": "llm", "spec": {{"layers": 4, "hidden": 1024,
        "ffn_hidden": 0, "moe": {{"experts": {}, "top_k": 2, "expert_ffn_hidden": 2048,
                                 "shared_experts": {}}},
        "heads": 16, "kv_heads": 8, "vocab": 128, "activation": "swiglu",
        "norm": "rmsnorm"}}}}]}},
      "workload": {{"seq_len": 2048, "global_batch": {}, "precision": "bf16"}},
      "cluster": {{"profile": "dgx-h100", "nodes": {}}},
      "search": {{"llm": {{{}}}{}}}}})",
                  experts, shared_experts, global_batch, nodes, llm, search_extra),
      "moe.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

// A one-node search over `llm_spec` (a tiny LLM's spec members) with TP and CP 1 and
// micro-batch 1: the pruned search finds what brute force finds, the bound stays below
// every plan, and among the best some have stages sized to their work (without virtual
// stages), where `lighter(split)` holds: the heavy end stage holds fewer layers.
void expect_sized_stages_and_the_bound(const std::string& llm_spec,
                                       bool (*lighter)(const std::vector<int>&)) {
  auto s = parse_scenario_text(
      R"({"name": "uneven", "model": {"name": "tiny", "modules": [{"name": "llm",
        "kind": "llm", "spec": {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 8,
        "activation": "swiglu", "norm": "rmsnorm", )" +
          llm_spec + R"(}}]},
      "workload": {"seq_len": 2048, "global_batch": 16, "precision": "bf16"},
      "cluster": {"profile": "dgx-h100", "nodes": 1},
      "search": {"llm": {"tp": 1, "cp": 1, "micro_batch": 1}}})",
      "uneven.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult fast = run(*s, threads(2));
  const SearchResult brute = run(*s, threads(2, true));
  ASSERT_FALSE(brute.top.empty());
  EXPECT_EQ(fast.top.front().metrics.iteration_time, brute.top.front().metrics.iteration_time)
      << describe(fast.top.front().plan) << " vs " << describe(brute.top.front().plan);
  bool sized = false;
  for (const RankedPlan& p : brute.top) {
    EXPECT_LE(lower_bound(*s, p.plan), p.metrics.iteration_time) << describe(p.plan);
    const std::vector<int>& split = p.plan.layout.pipeline_layout;
    if (!split.empty() && p.plan.layout.vpp == 1) {
      sized = true;
      EXPECT_TRUE(lighter(split)) << describe(p.plan);
    }
  }
  EXPECT_TRUE(sized) << "no plan with stages sized to their work among the best";
}

// An MoE LLM whose first layers are dense (MoeSpec::dense_layers), heavier than its MoE
// layers: the bound counts each virtual stage's dense and MoE layers apart, and the first
// stage, which holds the dense layers, gets fewer layers.
TEST(Search, TheBoundHoldsWithDenseLayersFirst) {
  expect_sized_stages_and_the_bound(
      R"("ffn_hidden": 16384, "vocab": 128, "moe": {"experts": 8, "top_k": 2,
         "expert_ffn_hidden": 1024, "dense_layers": 2})",
      [](const std::vector<int>& split) { return split.front() < split.back(); });
}

// Sliding windows on every other layer beside dense first layers (all four layer kinds):
// the bound counts each virtual stage's layers by kind, and the sized stages still give
// the first stage fewer layers.
TEST(Search, TheBoundHoldsWithSlidingWindows) {
  expect_sized_stages_and_the_bound(
      R"("ffn_hidden": 16384, "vocab": 128, "sliding_window": {"size": 128, "full_every": 2},
         "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1024, "dense_layers": 2})",
      [](const std::vector<int>& split) { return split.front() < split.back(); });
  // And gpt-oss-120b's plans (even, sized, PP 2, EP across two nodes).
  expect_bound_below_plans("gpt-oss-120b-64xh100-compare.json");
}

// a2a CP's blocking all-to-alls in the bound: it stays below gpt-oss's 64K plans over a2a
// (their infeasible ones aside) and the long-context example under each CP exchange, the
// a2a groups inside a node and, at cp 4, across two.
TEST(Search, TheBoundHoldsWithA2AContextParallelism) {
  auto oss = load_scenario(std::string(HETPAR_SOURCE_DIR) +
                           "/examples/gpt-oss-120b-64k-64xh100-compare.json");
  ASSERT_TRUE(oss.is_ok()) << oss.status().to_string();
  int feasible = 0;
  for (const auto& [name, plan] : oss->plans) {
    auto m = evaluate(*oss, plan);
    ASSERT_TRUE(m.is_ok()) << name;
    if (!m->feasible) continue;
    ++feasible;
    EXPECT_LE(lower_bound(*oss, plan), m->iteration_time) << name;
  }
  EXPECT_EQ(feasible, 4);
  auto lc =
      load_scenario(std::string(HETPAR_SOURCE_DIR) + "/examples/long-context-16xh100-compare.json");
  ASSERT_TRUE(lc.is_ok()) << lc.status().to_string();
  const auto named = std::find_if(lc->plans.begin(), lc->plans.end(),
                                  [](const auto& np) { return np.first == "homogeneous"; });
  ASSERT_NE(named, lc->plans.end());
  Plan p = named->second;
  for (const auto& [cp, comm, inner] :
       {std::tuple{2, CpComm::kA2A, 0}, std::tuple{4, CpComm::kA2A, 0},
        std::tuple{4, CpComm::kA2AP2P, 2}}) {
    p.layout.cp = cp;
    p.layout.dp = 4 / cp;
    p.layout.cp_comm = comm;
    p.layout.cp_a2a = inner;
    auto m = evaluate(*lc, p);
    ASSERT_TRUE(m.is_ok() && m->feasible) << cp;
    EXPECT_LE(lower_bound(*lc, p), m->iteration_time) << cp << " " << to_string(comm);
  }
}

// The EP all-to-alls nothing runs beside count in the bound: it stays below the MoE
// examples' plans (EP inside a node and across two, with and without the EP overlap, DeepEP,
// the shared experts' overlap), and a plan's bound exceeds its EP-overlapped twin's (whose
// all-to-alls it leaves out) by at least a third of the all-to-all time the simulation
// exposes.
TEST(Search, TheBoundCountsTheEpAllToAlls) {
  for (const char* file :
       {"qwen3-30b-16xh100-ep-overlap-compare.json", "gpt-oss-120b-64xh100-compare.json",
        "qwen1.5-moe-16xh100-shared-overlap-compare.json", "glm-4.5-256xh100-compare.json"})
    expect_bound_below_plans(file);
  auto s = load_scenario(std::string(HETPAR_SOURCE_DIR) +
                         "/examples/qwen3-30b-16xh100-ep-overlap-compare.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto plan = [&](std::string_view name) {
    auto it = std::find_if(s->plans.begin(), s->plans.end(),
                           [&](const auto& np) { return np.first == name; });
    EXPECT_NE(it, s->plans.end()) << name;
    return it->second;
  };
  const Plan alone = plan("pp2_vpp2_ep8");
  const Plan overlapped = plan("pp2_vpp2_ep8_overlap");
  auto m = evaluate(*s, alone);
  ASSERT_TRUE(m.is_ok() && m->feasible);
  Time exposed;
  for (const ExposedComm& e : m->exposed_by_kind)
    if (e.kind == "ep_comm") exposed = e.per_rank;
  ASSERT_GT(exposed, Time::zero());
  const Time gap = lower_bound(*s, alone) - lower_bound(*s, overlapped);
  EXPECT_GT(gap * 3, exposed) << gap.to_seconds() << " of " << exposed.to_seconds();
  // Under the EP overlap the all-to-alls, whichever compute hides them, still take the
  // rank's links: across the two nodes (EP 16) they are the floor, the bound over 3/4 of
  // the step (18.0 of 23.1 s; 16.1 s, 0.70, without them). DeepEP across the two nodes:
  // the longer of its NVLink all-to-all and its transfers through the NIC (20.6 of 21.0 s;
  // before, none: 16.1 s).
  for (const char* name :
       {"ep16", "ep16_overlap", "pp2_vpp2_ep8_overlap", "ep16_deepep", "ep16_deepep_overlap"}) {
    const Plan p = plan(name);
    auto mp = evaluate(*s, p);
    ASSERT_TRUE(mp.is_ok() && mp->feasible) << name;
    const Time b = lower_bound(*s, p);
    EXPECT_LE(b, mp->iteration_time) << name;
    if (p.layout.ep == 16) {
      EXPECT_GT(b * 4, mp->iteration_time * 3)
          << b.to_seconds() << " of " << mp->iteration_time.to_seconds();
    }
  }
  // Across nodes (EP 32 over four), beside the shared experts: GLM-4.5's all-to-alls over
  // InfiniBand take half its step, and the bound, seeing them through the NICs, over 3/5 of
  // it (without them under 2/5).
  auto glm =
      load_scenario(std::string(HETPAR_SOURCE_DIR) + "/examples/glm-4.5-256xh100-compare.json");
  ASSERT_TRUE(glm.is_ok()) << glm.status().to_string();
  for (const auto& [name, p] : glm->plans) {
    if (p.layout.moe_dispatcher != MoeDispatcher::kAllToAll) continue;
    auto mg = evaluate(*glm, p);
    ASSERT_TRUE(mg.is_ok() && mg->feasible) << name;
    const Time b = lower_bound(*glm, p);
    EXPECT_LE(b, mg->iteration_time) << name;
    EXPECT_GT(b * 5, mg->iteration_time * 3)
        << name << ": " << b.to_seconds() << " of " << mg->iteration_time.to_seconds();
  }
  // And the validation suite's MoE runs with their EP group inside a node (all-to-all and
  // DeepEP, FSDP, token dropping; the EP 32 ones take seconds each), the memory model aside
  // as `hetpar validation` sets it.
  int moe = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(HETPAR_SOURCE_DIR) + "/validation/runs")) {
    auto run = load_published_run(e.path().string());
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    const Plan& p = *run->scenario.plan;
    if (p.layout.ep == 1 || p.layout.ep > 8) continue;
    ++moe;
    EvaluateOptions o;
    o.enforce_memory = false;
    auto m = evaluate(run->scenario, p, o);
    ASSERT_TRUE(m.is_ok() && m->feasible) << e.path();
    EXPECT_LE(lower_bound(run->scenario, p), m->iteration_time) << e.path();
  }
  EXPECT_GE(moe, 8);
}

// Dense and MoE layers alternating (MoeSpec::layer_pattern, Llama 4 Maverick's): the bound
// counts each virtual stage's layers by kind and stays below every plan the search keeps,
// the fast search finding what the exhaustive one does.
TEST(Search, TheBoundHoldsWithALayerPattern) {
  auto s = parse_scenario_text(
      R"({"model": {"name": "tiny", "modules": [{"name": "llm", "kind": "llm", "spec": {
        "layers": 8, "hidden": 1024, "ffn_hidden": 8192, "heads": 16, "kv_heads": 8,
        "vocab": 128, "activation": "swiglu", "norm": "rmsnorm",
        "moe": {"experts": 8, "top_k": 1, "expert_ffn_hidden": 1024, "shared_experts": 1,
                "layer_pattern": [0, 1]}}}]},
      "workload": {"seq_len": 2048, "global_batch": 16},
      "cluster": {"profile": "dgx-h100", "nodes": 1},
      "search": {"llm": {"tp": 1, "cp": 1, "micro_batch": 1}}})",
      "pattern.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult fast = run(*s, threads(2));
  const SearchResult brute = run(*s, threads(2, true));
  ASSERT_FALSE(brute.top.empty());
  EXPECT_EQ(fast.top.front().metrics.iteration_time, brute.top.front().metrics.iteration_time);
  for (const RankedPlan& p : brute.top)
    EXPECT_LE(lower_bound(*s, p.plan), p.metrics.iteration_time) << describe(p.plan);
}

// With sliding windows the search's CP layouts run a2a where the heads split, all_gather
// where they do not, and both under cp_comm any (infeasibility() refuses the ring): none is
// rejected for the window; a fixed p2p is still tried and refused with the reason.
TEST(Search, RunsContextParallelismA2AOrAllGatherWithSlidingWindows) {
  auto scenario = [](const std::string& llm, int kv_heads = 8, const std::string& top_k = "5") {
    auto s = parse_scenario_text(
        R"({"model": {"name": "tiny", "modules": [{"name": "llm", "kind": "llm", "spec": {
          "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": )" +
            std::to_string(kv_heads) + R"(,
          "vocab": 128, "activation": "swiglu", "norm": "rmsnorm",
          "sliding_window": {"size": 256, "full_every": 2}}}]},
        "workload": {"seq_len": 4096, "global_batch": 16},
        "cluster": {"profile": "dgx-h100", "nodes": 1},
        "search": {"top_k": )" +
            top_k + R"(, "llm": {"tp": 1, "micro_batch": 1)" + llm + "}}}",
        "window.json");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
  };
  const SearchResult open = run(scenario(""), threads(2));
  ASSERT_FALSE(open.top.empty());
  for (const RankedPlan& p : open.top) {
    if (p.plan.layout.cp > 1) {
      EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kA2A) << describe(p.plan);
    }
  }
  for (const RejectionReason& r : open.rejections)
    EXPECT_EQ(r.reason.find("sliding_window"), std::string::npos) << r.reason;
  const SearchResult cp2 = run(scenario(R"(, "cp": 2)"), threads(2));
  ASSERT_FALSE(cp2.top.empty());
  for (const RankedPlan& p : cp2.top) EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kA2A);
  const SearchResult fixed = run(scenario(R"(, "cp": 2, "cp_comm": "p2p")"), threads(2));
  EXPECT_TRUE(fixed.top.empty());
  ASSERT_FALSE(fixed.rejections.empty());
  EXPECT_NE(fixed.rejections.front().example.find("cp 2 with sliding_window needs cp_comm a2a"),
            std::string::npos);
  // cp 4 does not split 2 key/value heads: all_gather.
  const SearchResult wide = run(scenario(R"(, "cp": 4)", 2), threads(2));
  ASSERT_FALSE(wide.top.empty());
  for (const RankedPlan& p : wide.top) EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kAllGather);
  std::set<CpComm> tried;
  const SearchResult any = run(scenario(R"(, "cp": 2, "cp_comm": "any")", 8, "50"), threads(2));
  for (const RankedPlan& p : any.top) tried.insert(p.plan.layout.cp_comm);
  EXPECT_EQ(tried, (std::set<CpComm>{CpComm::kA2A, CpComm::kAllGather}));
}

// A multi-token-prediction depth (LlmSpec::mtp_layers) on the last stage: the bound counts
// it there, and the last stage gets fewer layers.
TEST(Search, TheBoundHoldsWithMultiTokenPrediction) {
  expect_sized_stages_and_the_bound(
      R"("ffn_hidden": 4096, "vocab": 32000, "mtp_layers": 1)",
      [](const std::vector<int>& split) { return split.back() < split.front(); });
}

// search.llm fields: EP 8 on one node, selective recompute with its modules searched.
const std::string kSelectiveEp8 =
    R"("tp": 1, "cp": 1, "pp": 1, "ep": 8, "micro_batch": 2, "recompute": "selective",
       "distributed_optimizer": true)";

// With shared experts, selective recompute is also tried with the norm, the activation and
// the shared experts (before the whole MoE layer): under a memory cap between it and the
// norm and activation alone, every plan found re-runs the shared experts.
TEST(Search, TriesTheSharedExpertsRecomputeModuleWithSharedExperts) {
  const std::string llm = kSelectiveEp8;
  const SearchResult open = run(moe_search(16, 1, 32, llm, 4), threads(2));
  ASSERT_FALSE(open.top.empty());
  const SearchResult full =
      run(moe_search(16, 1, 32,
                     R"("tp": 1, "cp": 1, "pp": 1, "ep": 8, "micro_batch": 2, "recompute": "full",
                        "distributed_optimizer": true)",
                     4),
          threads(2));
  EXPECT_EQ(open.counts.considered, 5 * full.counts.considered);
  constexpr uint8_t kNormAct = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  Plan norm_act = open.top.front().plan, shared = norm_act;
  norm_act.layout.recompute_modules = kNormAct;
  shared.layout.recompute_modules = kNormAct | models::kRecomputeSharedExperts;
  const Scenario bare = moe_search(16, 1, 32, llm, 4);
  const double norm_act_gib = estimate_memory(bare, norm_act).peak.to_GiB();
  const double shared_gib = estimate_memory(bare, shared).peak.to_GiB();
  ASSERT_LT(shared_gib, norm_act_gib);
  const SearchResult capped =
      run(moe_search(16, 1, 32, llm, 4,
                     fmt::format(R"(, "max_memory_GiB": {})", (norm_act_gib + shared_gib) / 2)),
          threads(2));
  ASSERT_FALSE(capped.top.empty());
  for (const RankedPlan& p : capped.top)
    EXPECT_EQ(p.plan.layout.recompute_modules, kNormAct | models::kRecomputeSharedExperts)
        << describe(p.plan);
}

// With latent attention each selective set is also tried with mla_up_proj, a heavier
// policy: under a memory cap that the attention core alone (and with the MLP) exceeds but
// the core with the up projections' recompute meets, every plan found runs mla_up_proj. The
// MLP is narrow here, so re-running it saves less than the attention's Q, K, V.
TEST(Search, TriesMlaUpProjWhereTheLighterSetDoesNotFit) {
  auto scenario = [](const std::string& extra) {
    auto s = parse_scenario_text(
        fmt::format(R"({{"name": "mla", "model": {{"name": "tiny-mla", "modules": [{{"name": "llm",
          "kind": "llm", "spec": {{"layers": 4, "hidden": 1024, "ffn_hidden": 512, "heads": 16,
          "vocab": 128, "activation": "swiglu", "norm": "rmsnorm",
          "mla": {{"q_lora_rank": 256, "kv_lora_rank": 128, "qk_head_dim": 64,
                   "rope_head_dim": 32, "v_head_dim": 64}}}}}}]}},
          "workload": {{"seq_len": 4096, "global_batch": 16, "precision": "bf16"}},
          "cluster": {{"profile": "dgx-h100", "nodes": 1}},
          "search": {{"llm": {{"tp": 1, "cp": 1, "pp": 1, "micro_batch": 2,
                               "recompute": "selective"}}{}}}}})",
                    extra),
        "mla.json");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
  };
  const SearchResult open = run(scenario(""), threads(2));
  ASSERT_FALSE(open.top.empty());
  Plan core = open.top.front().plan, up = core, mlp = core;
  core.layout.recompute_modules = models::kRecomputeCoreAttn;
  up.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlaUpProj;
  mlp.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
  const Scenario bare = scenario("");
  const double up_gib = estimate_memory(bare, up).peak.to_GiB();
  const double mlp_gib = estimate_memory(bare, mlp).peak.to_GiB();
  ASSERT_LT(up_gib, mlp_gib);
  ASSERT_LT(mlp_gib, estimate_memory(bare, core).peak.to_GiB());
  const SearchResult capped =
      run(scenario(fmt::format(R"(, "max_memory_GiB": {})", (up_gib + mlp_gib) / 2)), threads(2));
  ASSERT_FALSE(capped.top.empty());
  for (const RankedPlan& p : capped.top)
    EXPECT_TRUE(p.plan.layout.recompute_policy().selects(models::kRecomputeMlaUpProj))
        << describe(p.plan);
}

// An MoE LLM with dense MLP layers (here every other one, moe.layer_pattern): each selective
// set is also tried with mlp, which re-runs the dense layers' MLPs; more candidates than
// for the same model without dense layers, and under a memory cap between the norm and
// activation set and that set with mlp, the set alone is never taken and mlp is.
TEST(Search, TriesTheMlpModuleOnAnMoeLlmsDenseLayers) {
  auto scenario = [](const std::string& pattern, const std::string& extra) {
    auto s = parse_scenario_text(
        fmt::format(R"({{"name": "alt", "model": {{"name": "tiny-alt", "modules": [{{"name": "llm",
          "kind": "llm", "spec": {{"layers": 4, "hidden": 1024, {}"heads": 16,
          "vocab": 128, "activation": "swiglu", "norm": "rmsnorm",
          "moe": {{"experts": 8, "top_k": 2, "expert_ffn_hidden": 512{}}}}}}}]}},
          "workload": {{"seq_len": 4096, "global_batch": 16, "precision": "bf16"}},
          "cluster": {{"profile": "dgx-h100", "nodes": 1}},
          "search": {{"llm": {{"tp": 1, "cp": 1, "pp": 1, "ep": 8, "micro_batch": 2,
                               "recompute": "selective"}}{}}}}})",
                    pattern.empty() ? "" : R"("ffn_hidden": 8192, )", pattern, extra),
        "alt.json");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
  };
  const std::string alternating = R"(, "layer_pattern": [0, 1])";
  const SearchResult open = run(scenario(alternating, ""), threads(2));
  const SearchResult all_moe = run(scenario("", ""), threads(2));
  ASSERT_FALSE(open.top.empty());
  EXPECT_GT(open.counts.considered, all_moe.counts.considered);
  Plan norm_act = open.top.front().plan, with_mlp = norm_act;
  norm_act.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  with_mlp.layout.recompute_modules = norm_act.layout.recompute_modules | models::kRecomputeMlp;
  const Scenario bare = scenario(alternating, "");
  const double mlp_gib = estimate_memory(bare, with_mlp).peak.to_GiB();
  const double norm_act_gib = estimate_memory(bare, norm_act).peak.to_GiB();
  ASSERT_LT(mlp_gib, norm_act_gib);
  const SearchResult capped = run(
      scenario(alternating, fmt::format(R"(, "max_memory_GiB": {})", (mlp_gib + norm_act_gib) / 2)),
      threads(2));
  ASSERT_FALSE(capped.top.empty());
  bool mlp = false;
  for (const RankedPlan& p : capped.top) {
    EXPECT_NE(p.plan.layout.recompute_modules, norm_act.layout.recompute_modules)
        << describe(p.plan);
    mlp = mlp || p.plan.layout.recompute_policy().selects(models::kRecomputeMlp);
  }
  EXPECT_TRUE(mlp);
}

// search.llm.moe_shared_expert_overlap: on by default where it applies (shared experts,
// ep > 1), off for the shared experts' recompute alone (which Megatron-Core skips when they
// are overlapped) and without shared experts; "any" tries both, and the overlap wins; false
// leaves it off everywhere.
TEST(Search, OverlapsTheSharedExpertsWhereTheyAreNotCheckpointedAlone) {
  const std::string llm = kSelectiveEp8;
  const SearchResult on = run(moe_search(16, 1, 32, llm, 4), threads(2));
  ASSERT_FALSE(on.top.empty());
  for (const RankedPlan& p : on.top) {
    const models::RecomputePolicy rc = p.plan.layout.recompute_policy();
    EXPECT_EQ(p.plan.layout.moe_shared_expert_overlap,
              !rc.selects(models::kRecomputeSharedExperts) || rc.selects(models::kRecomputeMoe))
        << describe(p.plan);
  }
  EXPECT_NE(describe(on.top.front().plan).find(" shared-overlap"), std::string::npos);
  for (const RankedPlan& p : run(moe_search(16, 1, 32, llm), threads(2)).top)
    EXPECT_FALSE(p.plan.layout.moe_shared_expert_overlap) << describe(p.plan);
  const SearchResult off =
      run(moe_search(16, 1, 32, llm + R"(, "moe_shared_expert_overlap": false)", 4), threads(2));
  ASSERT_FALSE(off.top.empty());
  for (const RankedPlan& p : off.top) EXPECT_FALSE(p.plan.layout.moe_shared_expert_overlap);
  const SearchResult any =
      run(moe_search(16, 1, 32, llm + R"(, "moe_shared_expert_overlap": "any")", 4), threads(2));
  EXPECT_GT(any.counts.considered, on.counts.considered);
  ASSERT_FALSE(any.top.empty());
  EXPECT_TRUE(any.top.front().plan.layout.moe_shared_expert_overlap);
  EXPECT_LT(on.top.front().metrics.iteration_time, off.top.front().metrics.iteration_time);
}

// search.llm.moe_dispatcher: "any" tries the flex dispatcher's backends beside the
// all-to-all where they apply; over two nodes with EP across them they move fewer bytes over
// the network, and HybridEP, which permutes inside its kernels, wins; "deepep" and
// "hybridep" put one in every layout (those it does not apply to are rejected with the
// reason).
TEST(Search, TriesTheFlexDispatcherWhereTheSectionAsks) {
  auto moe = [](const std::string& dispatcher) {
    return moe_search(
        16, 2, 32,
        R"("tp": 1, "pp": 1, "ep": 16, "micro_batch": 1, "moe_dispatcher": ")" + dispatcher + "\"");
  };
  const SearchResult any = run(moe("any"), threads(2));
  ASSERT_FALSE(any.top.empty());
  EXPECT_EQ(any.top.front().plan.layout.moe_dispatcher, MoeDispatcher::kHybridEp)
      << describe(any.top.front().plan);
  bool seen[3] = {};
  for (const RankedPlan& p : any.top) seen[static_cast<int>(p.plan.layout.moe_dispatcher)] = true;
  EXPECT_TRUE(seen[0] && seen[1] && seen[2]);
  EXPECT_NE(describe(any.top.front().plan).find(" hybridep"), std::string::npos);
  const SearchResult plain = run(moe("alltoall"), threads(2));
  ASSERT_FALSE(plain.top.empty());
  EXPECT_LT(any.top.front().metrics.iteration_time, plain.top.front().metrics.iteration_time);
  for (MoeDispatcher d : {MoeDispatcher::kDeepEp, MoeDispatcher::kHybridEp})
    for (const RankedPlan& p : run(moe(std::string(to_string(d))), threads(2)).top)
      EXPECT_EQ(p.plan.layout.moe_dispatcher, d);
}

// A MoE LLM's selective recompute is searched with Megatron-Core's output-discarding
// modules too (Layout::recompute_modules): the attention core alone, the norm and the
// experts' activation alone, all three, and the norm with the whole MoE layer. Neither of
// the first two contains the other, so both are simulated; all three together, and the norm
// with the MoE layer (which re-runs the activation too), recompute no less than the norm and
// activation and are dominated once that fits. Full recompute keeps the attention core's
// default.
// A dense LLM's selective recompute is also tried with the whole MLP ("mlp"), where the
// attention core alone does not fit: under a memory cap between the two, every plan found
// re-runs the MLP; without the cap, the attention core alone.
TEST(Search, TriesTheMlpRecomputeModuleWhereTheAttentionCoreAloneDoesNotFit) {
  const std::string fixed =
      R"("llm": {"tp": 1, "cp": 1, "pp": 1, "micro_batch": 4, "recompute": "selective",
                 "distributed_optimizer": true},
         "modules": {"vision": {"recompute": "none"}},
         "forbid_placements": ["colocated", "non_colocated"])";
  const SearchResult open = run(tiny("{" + fixed + "}", 32), threads(2));
  ASSERT_FALSE(open.top.empty());
  for (const RankedPlan& p : open.top)
    EXPECT_EQ(p.plan.layout.recompute_modules, models::kRecomputeCoreAttn) << describe(p.plan);
  // The cap: halfway between the best plan's peak and its peak with the MLP re-run.
  Plan mlp = open.top.front().plan;
  mlp.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
  const Scenario bare = tiny("", 32);
  const double attn_gib = estimate_memory(bare, open.top.front().plan).peak.to_GiB();
  const double mlp_gib = estimate_memory(bare, mlp).peak.to_GiB();
  ASSERT_LT(mlp_gib, attn_gib);
  const SearchResult capped =
      run(tiny(fmt::format("{{{}, \"max_memory_GiB\": {}}}", fixed, (attn_gib + mlp_gib) / 2), 32),
          threads(2));
  ASSERT_FALSE(capped.top.empty());
  for (const RankedPlan& p : capped.top) {
    EXPECT_EQ(p.plan.layout.recompute_modules, models::kRecomputeCoreAttn | models::kRecomputeMlp)
        << describe(p.plan);
    EXPECT_NE(describe(p.plan).find("selective(core_attn, mlp)"), std::string::npos);
  }
}

TEST(Search, TriesTheMoeRecomputeModulesUnderSelective) {
  auto moe = [](const std::string& recompute) {
    return moe_search(
        16, 1, 16,
        R"("tp": 1, "pp": 1, "ep": 8, "micro_batch": 1, "recompute": ")" + recompute + "\"");
  };
  const SearchResult sel = run(moe("selective"), threads(2));
  ASSERT_FALSE(sel.top.empty());
  constexpr uint8_t kNormAct = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  std::set<uint8_t> seen;
  for (const RankedPlan& p : sel.top) {
    EXPECT_EQ(p.plan.layout.recompute, models::Recompute::kSelective);
    seen.insert(p.plan.layout.recompute_modules);
  }
  EXPECT_EQ(seen, (std::set<uint8_t>{models::kRecomputeCoreAttn, kNormAct}));
  EXPECT_GT(sel.counts.pruned_dominated, 0);
  bool named = false;
  for (const RankedPlan& p : sel.top)
    named = named || describe(p.plan).find("selective(layernorm, moe_act)") != std::string::npos;
  EXPECT_TRUE(named);
  // Four selective policies per layout where full recompute has one.
  const SearchResult full = run(moe("full"), threads(2));
  ASSERT_FALSE(full.top.empty());
  EXPECT_EQ(sel.counts.considered, 4 * full.counts.considered);
  for (const RankedPlan& p : full.top)
    EXPECT_EQ(p.plan.layout.recompute_modules, models::kRecomputeCoreAttn);
  // search.llm.recompute_modules fixes them (with recompute fixed to selective).
  const SearchResult fixed =
      run(moe_search(16, 1, 16,
                     R"("tp": 1, "pp": 1, "ep": 8, "micro_batch": 1, "recompute": "selective", )"
                     R"("recompute_modules": ["layernorm", "moe_act"])"),
          threads(2));
  ASSERT_FALSE(fixed.top.empty());
  EXPECT_EQ(fixed.counts.considered, full.counts.considered);
  for (const RankedPlan& p : fixed.top) EXPECT_EQ(p.plan.layout.recompute_modules, kNormAct);
  auto bad = parse_scenario_text(
      R"({"name": "moe", "model": "qwen3-30b-a3b",
          "workload": {"seq_len": 4096, "global_batch": 64, "precision": "bf16"},
          "cluster": {"profile": "dgx-h100", "nodes": 1},
          "search": {"llm": {"recompute_modules": ["moe_act"]}}})",
      "moe.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("search.llm.recompute_modules"), std::string::npos)
      << bad.status().to_string();
}

// A fixed EP that is not a power of two is searched (as a fixed tp is), and "any" offers
// DeepEP only for EP sizes DeepEP has a configuration for: EP 12 (three nodes, pp 2, dp 12)
// gets no DeepEP candidates, where "deepep" alone has each rejected for its size. HybridEP
// takes any size: "any" offers it, and its groups of 12 across nodes of 8 are rejected for
// not taking whole nodes.
TEST(Search, OffersDeepEpOnlyForGroupSizesItConfigures) {
  auto moe = [](const std::string& dispatcher) {
    return moe_search(12, 3, 24,
                      R"("tp": 1, "pp": 2, "vpp": 1, "ep": 12, "micro_batch": 1, )"
                      R"("moe_dispatcher": ")" +
                          dispatcher + "\"");
  };
  auto rejected_for = [](const SearchResult& r, std::string_view what) {
    int64_t n = 0;
    for (const RejectionReason& rr : r.rejections)
      if (rr.example.find(what) != std::string::npos) n += rr.count;
    return n;
  };
  const SearchResult any = run(moe("any"), threads(2));
  ASSERT_FALSE(any.top.empty());
  for (const RankedPlan& p : any.top)
    EXPECT_EQ(p.plan.layout.moe_dispatcher, MoeDispatcher::kAllToAll) << describe(p.plan);
  EXPECT_EQ(rejected_for(any, "moe_dispatcher deepep"), 0);
  EXPECT_GT(rejected_for(any, "moe_dispatcher hybridep: the EP group"), 0);
  const SearchResult deepep = run(moe("deepep"), threads(2));
  EXPECT_TRUE(deepep.top.empty());
  EXPECT_GT(rejected_for(deepep, "moe_dispatcher deepep"), 0);
  EXPECT_EQ(any.counts.considered, 2 * run(moe("alltoall"), threads(2)).counts.considered);
}

// FSDP in heterogeneous placements: search.llm.fsdp shards every LLM layout with dp > 1 (so
// every plan here, the tiny world being one node), a colocated encoder as its LLM, an
// encoder on its own ranks as search.modules.<name>.fsdp asks; every plan is feasible.
TEST(Search, ShardsHeterogeneousPlansAsTheSearchSectionAsks) {
  const Scenario s = tiny(R"({"llm": {"fsdp": true, "micro_batch": 1},
                              "modules": {"vision": {"fsdp": true, "dp": 2}},
                              "forbid_placements": ["homogeneous"], "top_k": 50})");
  SearchOptions o = threads(2);
  o.top_k = 50;
  const SearchResult r = run(s, o);
  ASSERT_FALSE(r.top.empty());
  std::vector<RankedPlan> plans = r.top;
  for (const FamilyResult& f : r.families)
    if (f.best) plans.push_back(*f.best);
  int colocated = 0, own_ranks = 0;
  for (const RankedPlan& p : plans) {
    ASSERT_EQ(infeasibility(s, p.plan), "") << describe(p.plan);
    const Layout& l = p.plan.layout;
    if (l.dp * l.cp > 1) {
      EXPECT_TRUE(l.fsdp) << describe(p.plan);
    }
    for (const ModulePlan& m : p.plan.modules) {
      if (p.plan.placement == Placement::kColocated) {
        EXPECT_EQ(m.layout.fsdp, l.fsdp) << describe(p.plan);
        ++colocated;
      } else if (m.layout.dp > 1) {
        EXPECT_TRUE(m.layout.fsdp) << describe(p.plan);
        ++own_ranks;
      }
    }
  }
  EXPECT_GT(colocated, 0);
  EXPECT_GT(own_ranks, 0);
}

// The gradient dtype is numerics too: fixed by the search section for every module,
// never searched; bf16 gradients halve the reduction and the gradient buffer.
TEST(Search, KeepsTheGradReduceDtypeOfTheSearchSection) {
  const SearchResult fp32 = run(tiny("", 8), threads(2));
  const SearchResult bf16 = run(tiny(R"({"llm": {"grad_reduce_dtype": "bf16"}})", 8), threads(2));
  ASSERT_FALSE(fp32.top.empty());
  ASSERT_FALSE(bf16.top.empty());
  for (const RankedPlan& p : bf16.top) {
    EXPECT_EQ(p.plan.layout.grad_reduce_dtype, GradReduceDtype::kBf16) << describe(p.plan);
    for (const ModulePlan& m : p.plan.modules)
      EXPECT_EQ(m.layout.grad_reduce_dtype, GradReduceDtype::kBf16);
  }
  for (const RankedPlan& p : fp32.top)
    EXPECT_EQ(p.plan.layout.grad_reduce_dtype, GradReduceDtype::kDefault);
  EXPECT_LE(bf16.top[0].metrics.iteration_time, fp32.top[0].metrics.iteration_time);
  Plan same = fp32.top[0].plan;
  same.layout.grad_reduce_dtype = GradReduceDtype::kBf16;
  const Scenario s = tiny("", 8);
  EXPECT_LT(estimate_memory(s, same).peak, estimate_memory(s, fp32.top[0].plan).peak);
}

// The FP8 recipe and FP8 parameters are the run's numerics: fixed by the search section
// (every module's layout carries them), never searched; current scaling costs the amax
// passes, so the same plans take longer than under delayed scaling.
TEST(Search, KeepsTheFp8RecipeOfTheSearchSection) {
  const SearchResult delayed = run(tiny("", 8, "fp8"), threads(2));
  const SearchResult current =
      run(tiny(R"({"llm": {"fp8_recipe": "tensorwise", "fp8_param_gather": true}})", 8, "fp8"),
          threads(2));
  ASSERT_FALSE(delayed.top.empty());
  ASSERT_FALSE(current.top.empty());
  for (const RankedPlan& p : current.top) {
    EXPECT_EQ(p.plan.layout.fp8_recipe, Fp8Recipe::kTensorwise) << describe(p.plan);
    EXPECT_TRUE(p.plan.layout.fp8_param_gather);
    for (const ModulePlan& m : p.plan.modules) {
      EXPECT_EQ(m.layout.fp8_recipe, Fp8Recipe::kTensorwise);
      EXPECT_TRUE(m.layout.fp8_param_gather);
    }
  }
  for (const RankedPlan& p : delayed.top) EXPECT_EQ(p.plan.layout.fp8_recipe, Fp8Recipe::kDelayed);
  EXPECT_GT(current.top[0].metrics.iteration_time, delayed.top[0].metrics.iteration_time);
}

// CP's exchange: the ring by default, all-gather when the search section fixes it, both
// with "any" (the winner is the faster of the two).
// FSDP is searched only when the section asks: never by default, only FSDP with true, both
// with "any" (in every placement; ShardsHeterogeneousPlansAsTheSearchSectionAsks below).
TEST(Search, SearchesFsdpOnlyWhenTheSectionAsks) {
  const SearchResult none = run(tiny(R"({"llm": {"pp": 1}})"), threads(2));
  const SearchResult only = run(tiny(R"({"llm": {"pp": 1, "fsdp": true}})"), threads(2));
  const SearchResult any = run(tiny(R"({"llm": {"pp": 1, "fsdp": "any"}})"), threads(2));
  ASSERT_FALSE(none.top.empty() || only.top.empty() || any.top.empty());
  for (const RankedPlan& p : none.top) EXPECT_FALSE(p.plan.layout.fsdp);
  for (const RankedPlan& p : only.top) {
    EXPECT_EQ(p.plan.layout.fsdp, p.plan.layout.dp * p.plan.layout.cp > 1) << describe(p.plan);
    if (p.plan.layout.fsdp) {
      EXPECT_NE(describe(p.plan).find(" fsdp"), std::string::npos);
    }
  }
  EXPECT_GT(any.counts.considered, none.counts.considered);
  ASSERT_TRUE(none.families[0].best && only.families[0].best && any.families[0].best);
  EXPECT_EQ(any.families[0].best->metrics.iteration_time,
            std::min(none.families[0].best->metrics.iteration_time,
                     only.families[0].best->metrics.iteration_time));
  auto bad = parse_scenario_text(R"({"model": "llama-3.1-8b", "workload": {"seq_len": 4096,
      "global_batch": 64}, "cluster": {"profile": "dgx-h100", "nodes": 1},
      "search": {"llm": {"fsdp": "sometimes"}}})",
                                 "bad.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("search.llm.fsdp"), std::string::npos)
      << bad.status().to_string();
}

// Kept gathered from forward to backward is PyTorch FSDP2's (Megatron-FSDP gathers again),
// with no fused accumulation (FSDP2 has no main_grad); search.llm.fsdp_implementation fixes
// one for every sharded layout (Megatron-FSDP then never keeps), or "any" searches both.
TEST(Search, KeptFsdpLayoutsAreFsdp2UnlessTheSectionFixesOne) {
  auto kinds = [](const SearchResult& r) {
    std::set<std::pair<bool, FsdpImplementation>> out;  // (kept, implementation)
    for (const RankedPlan& p : r.top) {
      const Layout& l = p.plan.layout;
      if (!l.fsdp) continue;
      out.insert({!l.fsdp_reshard_after_forward, l.fsdp_implementation});
      EXPECT_EQ(l.gradient_accumulation_fusion, !l.torch_fsdp2()) << describe(p.plan);
      EXPECT_NE(describe(p.plan).find(l.torch_fsdp2() ? " fsdp2" : " fsdp"), std::string::npos);
    }
    return out;
  };
  const SearchOptions o = threads(2, /*exhaustive=*/true);
  using F = FsdpImplementation;
  // Homogeneous layouts only: the placements do not change what is searched here.
  auto with = [&](const std::string& fix) {
    return kinds(run(tiny(R"({"llm": {"pp": 1, "fsdp": true)" + fix +
                          R"(}, "forbid_placements": ["colocated", "non_colocated"]})"),
                     o));
  };
  const auto defaults = with("");
  EXPECT_EQ(defaults,
            (std::set<std::pair<bool, F>>{{false, F::kMegatron}, {true, F::kTorchFsdp2}}));
  const auto torch = with(R"(, "fsdp_implementation": "torch_fsdp2")");
  EXPECT_EQ(torch, (std::set<std::pair<bool, F>>{{false, F::kTorchFsdp2}, {true, F::kTorchFsdp2}}));
  const auto megatron = with(R"(, "fsdp_implementation": "megatron_fsdp")");
  EXPECT_EQ(megatron, (std::set<std::pair<bool, F>>{{false, F::kMegatron}}));
  const auto both = with(R"(, "fsdp_implementation": "any")");
  EXPECT_EQ(both, (std::set<std::pair<bool, F>>{
                      {false, F::kMegatron}, {false, F::kTorchFsdp2}, {true, F::kTorchFsdp2}}));
  // NCCL user buffers fixed on: every Megatron-FSDP layout registers them, no FSDP2 one (it
  // has none), and both kinds are still searched.
  const SearchResult ub = run(tiny(R"({"llm": {"pp": 1, "fsdp": true, "nccl_ub": true,)"
                                   R"( "fsdp_implementation": "any"},)"
                                   R"( "forbid_placements": ["colocated", "non_colocated"]})"),
                              o);
  std::set<bool> registered_fsdp2;
  for (const RankedPlan& p : ub.top) {
    EXPECT_EQ(p.plan.layout.nccl_ub, !p.plan.layout.torch_fsdp2()) << describe(p.plan);
    registered_fsdp2.insert(p.plan.layout.torch_fsdp2());
  }
  EXPECT_EQ(registered_fsdp2.size(), 2u);
}

TEST(Search, SearchesTheCpExchangeTheSectionAsksFor) {
  const std::string fix = R"({"llm": {"cp": 2, "tp": 2, "cp_comm": "%"}})";
  auto with = [&](const char* comm) {
    std::string f = fix;
    f.replace(f.find('%'), 1, comm);
    return run(tiny(f), threads(2));
  };
  const SearchResult ring = run(tiny(R"({"llm": {"cp": 2, "tp": 2}})"), threads(2));
  const SearchResult gather = with("all_gather");
  const SearchResult a2a = with("a2a");
  const SearchResult any = with("any");
  ASSERT_FALSE(ring.top.empty() || gather.top.empty() || a2a.top.empty() || any.top.empty());
  for (const RankedPlan& p : ring.top) EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kP2P);
  for (const RankedPlan& p : gather.top) EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kAllGather);
  for (const RankedPlan& p : a2a.top) EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kA2A);
  EXPECT_NE(describe(gather.top[0].plan).find("cp2 ag"), std::string::npos);
  EXPECT_NE(describe(a2a.top[0].plan).find("cp2 a2a"), std::string::npos);
  EXPECT_GT(any.counts.considered, gather.counts.considered + a2a.counts.considered);
  EXPECT_EQ(any.top[0].metrics.iteration_time,
            std::min({ring.top[0].metrics.iteration_time, gather.top[0].metrics.iteration_time,
                      a2a.top[0].metrics.iteration_time}));
}

// Hierarchical CP searched: its a2a level the widest power of two under cp that splits the
// heads inside a node (2 of cp 4 here), or the one the section fixes.
TEST(Search, SearchesHierarchicalContextParallelism) {
  auto scenario = [](const std::string& llm) {
    auto s = parse_scenario_text(
        R"({"model": {"name": "tiny", "modules": [{"name": "llm", "kind": "llm", "spec": {
          "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
          "vocab": 128, "activation": "swiglu", "norm": "rmsnorm"}}]},
        "workload": {"seq_len": 8192, "global_batch": 8},
        "cluster": {"profile": "dgx-h100", "nodes": 1},
        "search": {"llm": {"tp": 2, "cp": 4, "micro_batch": 1, "cp_comm": "a2a+p2p")" +
            llm + "}}}",
        "hier.json");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
  };
  const SearchResult hier = run(scenario(""), threads(2));
  ASSERT_FALSE(hier.top.empty());
  for (const RankedPlan& p : hier.top) {
    EXPECT_EQ(p.plan.layout.cp_comm, CpComm::kA2AP2P);
    EXPECT_EQ(p.plan.layout.cp_a2a, 2);
  }
  EXPECT_NE(describe(hier.top[0].plan).find("cp4 a2a2xp2p2"), std::string::npos);
  const SearchResult wide = run(scenario(R"(, "cp_a2a": 4)"), threads(2));
  EXPECT_TRUE(wide.top.empty());
  ASSERT_FALSE(wide.rejections.empty());
  EXPECT_NE(wide.rejections.front().example.find("between 2 and cp / 2"), std::string::npos);
}

TEST(Search, PipelinesANonColocatedEncoder) {
  // The encoder's pipeline depth is searched on its own ranks; here it is fixed to 2.
  const Scenario s = tiny(R"({"modules": {"vision": {"pp": 2}},
                              "forbid_placements": ["homogeneous", "colocated"]})");
  const SearchResult r = run(s, threads(2));
  ASSERT_FALSE(r.top.empty()) << r.families[2].why_none;
  for (const RankedPlan& p : r.top) {
    EXPECT_EQ(p.plan.placement, Placement::kNonColocated);
    ASSERT_EQ(p.plan.modules.size(), 1u);
    EXPECT_EQ(p.plan.modules[0].layout.pp, 2) << describe(p.plan);
    EXPECT_LE(lower_bound(s, p.plan), p.metrics.iteration_time) << describe(p.plan);
  }
}

// Regime 3 (examples/large-encoder-72xh100-compare.json), non-colocated only: the search must
// find a plan at least as fast as this known one (ViT TP2 PP2 DP2 on node 0, LLM TP4 SP PP8
// DP2 ZB-H1, 16.7 s). Counting the three encoder layouts per LLM side in processing order
// turned it away (a held recompute variant came back after higher-bound layouts had taken
// the places) and returned 17.1 s; the rule now admits by bound (search.h).
TEST(Search, RegimeThreeNonColocatedFindsTheKnownPlan) {
  auto s = load_scenario(std::string(HETPAR_SOURCE_DIR) +
                         "/examples/large-encoder-72xh100-compare.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  s->search.forbidden_placements = {Placement::kHomogeneous, Placement::kColocated};
  auto known = parse_plan(nlohmann::json::parse(R"({
      "placement": "non_colocated", "schedule": "zb-h1", "llm_first_rank": 8,
      "tp": 4, "sp": true, "cp": 1, "pp": 8, "vpp": 1, "dp": 2, "ep": 1, "micro_batch": 1,
      "recompute": "none", "distributed_optimizer": true,
      "modules": {"vision": {"first_rank": 0, "tp": 2, "sp": false, "cp": 1, "pp": 2,
                             "vpp": 1, "dp": 2, "ep": 1, "micro_batch": 1,
                             "recompute": "full", "distributed_optimizer": true}}})"),
                          "plan");
  ASSERT_TRUE(known.is_ok()) << known.status().to_string();
  auto m = evaluate(*s, *known);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty()) << r.families[2].why_none;
  EXPECT_LE(r.top[0].metrics.iteration_time, m->iteration_time) << describe(r.top[0].plan);
}

TEST(Search, GivesEachOfTwoEncodersItsOwnRanks) {
  // A vision and an audio encoder, non-colocated: every encoder on its own rank range in
  // module order from rank 0, the LLM after them (the LLM's layout fixed to keep it small).
  auto s = parse_scenario_text(std::string(R"({"model": )") + kTwoEncoderModel + R"(,
          "workload": {"seq_len": 4096, "global_batch": 32, "images_per_sample": 1,
                       "audio_clips_per_sample": 1},
          "cluster": {"profile": "dgx-h100", "nodes": 2},
          "search": {"forbid_placements": ["homogeneous", "colocated"],
                     "llm": {"tp": 4, "pp": 2, "micro_batch": 1}}})",
                               "two.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const SearchResult r = run(*s, threads(2));
  ASSERT_FALSE(r.top.empty()) << r.families[2].why_none;
  for (const RankedPlan& p : r.top) {
    ASSERT_EQ(p.plan.modules.size(), 2u) << describe(p.plan);
    const ModulePlan &a = p.plan.modules[0], &b = p.plan.modules[1];
    EXPECT_EQ(a.first_rank, 0);
    EXPECT_EQ(b.first_rank, a.layout.world());
    EXPECT_EQ(p.plan.llm_first_rank, b.first_rank + b.layout.world());
    EXPECT_EQ(p.plan.llm_first_rank + p.plan.layout.world(), 16);
    EXPECT_TRUE(infeasibility(*s, p.plan).empty());
    EXPECT_LE(lower_bound(*s, p.plan), p.metrics.iteration_time) << describe(p.plan);
  }
}

TEST(Search, TheBoundCountsTransfersThatCrossASlowLink) {
  // Over a 20 Mb/s internet uplink the pipeline's activations and the DP reduction dominate
  // the iteration: the bound's communication floors (pipeline transfers leaving a node, the
  // DP shards entering it) must see that, and stay below the simulated time.
  const std::string model = R"("model": {"name": "tiny-llm", "modules": [
      {"name": "llm", "kind": "llm", "spec": {"layers": 4, "hidden": 2048,
        "ffn_hidden": 8192, "heads": 16, "kv_heads": 4, "vocab": 32000,
        "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "tied_embeddings": false}}]},
      "workload": {"seq_len": 2048, "global_batch": 16})";
  auto cluster = [&](const std::string& wan) {
    auto s = parse_scenario_text(
        "{" + model + R"(, "cluster": {"profile": "dgx-h100", "nodes": 2)" + wan + "}}",
        "wan.json");
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
  };
  const Scenario fast = cluster("");
  const Scenario slow =
      cluster(R"(, "wan": {"up_gbps": 0.02, "down_gbps": 0.1, "latency_ms": 40})");
  std::vector<Plan> plans;
  for (auto [pp, dp] : {std::pair{2, 8}, {4, 4}, {1, 16}}) {
    Plan p;
    p.layout.pp = pp;
    p.layout.dp = dp;
    p.layout.distributed_optimizer = true;
    plans.push_back(p);
  }
  for (const Plan& p : plans) {
    SCOPED_TRACE(describe(p));
    ASSERT_EQ(infeasibility(slow, p), "");
    auto m = evaluate(slow, p);
    ASSERT_TRUE(m.is_ok() && m->feasible);
    const Time b = lower_bound(slow, p);
    EXPECT_LE(b, m->iteration_time);
    // The floor: several times the fast network's (compute) bound, and within a factor 3
    // of the simulated time.
    EXPECT_GT(b, lower_bound(fast, p) * 5);
    EXPECT_GT(b * 3, m->iteration_time)
        << b.to_seconds() << " vs " << m->iteration_time.to_seconds();
  }
}

TEST(Search, PlansOverTheTaskCapAreRejectedWithTheField) {
  // Uncapped, the search simulates plans of several thousand tasks; capped at 1000 it
  // rejects them with the field's name and keeps only small ones (the estimate is within
  // 2x of the real count).
  const SearchResult all = run(tiny(R"({"top_k": 1000})"), threads(2));
  int64_t largest = 0;
  for (const RankedPlan& p : all.top) largest = std::max(largest, p.metrics.tasks);
  EXPECT_EQ(all.counts.too_large, 0);
  EXPECT_GT(largest, 2000);
  const SearchResult r = run(tiny(R"({"max_sim_tasks": 1000, "top_k": 1000})"), threads(2));
  EXPECT_GT(r.counts.too_large, 0);
  for (const RankedPlan& p : r.top) EXPECT_LT(p.metrics.tasks, 2000) << describe(p.plan);
  bool named = false;
  for (const RejectionReason& rr : r.rejections)
    named |= rr.example.find("over search.max_sim_tasks") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(Search, BadSearchSectionsNameThePath) {
  const std::string base = R"({"model": "llava-1.5-7b",
      "workload": {"seq_len": 4096, "global_batch": 8, "images_per_sample": 1},
      "cluster": {"profile": "dgx-h100", "nodes": 1}, "search": )";
  const std::pair<const char*, const char*> cases[] = {
      {R"({"llm": {"tpp": 2}})", "search.llm.tpp"},
      {R"({"modules": {"audio": {"tp": 1}}})", "search.modules.audio"},
      {R"({"forbid_placements": ["nowhere"]})", "search.forbid_placements[0]"},
      {R"({"schedule": "1f2b"})", "search.schedule"},
      {R"({"top_k": 0})", "search.top_k"},
      {R"({"max_sim_tasks": 10})", "search.max_sim_tasks"},
      {R"({"colour": 1})", "search.colour"},
      {R"({"llm": {"fp8_recipe": "current"}})", "search.llm.fp8_recipe"},
      {R"({"llm": {"grad_reduce_dtype": "fp8"}})", "search.llm.grad_reduce_dtype"},
      {R"({"llm": {"fp8_param_gather": "yes"}})", "search.llm.fp8_param_gather"},
  };
  for (const auto& [section, path] : cases) {
    auto s = parse_scenario_text(base + section + "}", "x.json");
    ASSERT_FALSE(s.is_ok()) << section;
    EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status().message();
  }
}

TEST(Search, DescribeNamesEveryModule) {
  Plan p;
  p.layout.tp = 2;
  p.layout.sequence_parallel = true;
  p.layout.dp = 3;
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = 2;
  p.modules.push_back({"vision", {}, 0});
  p.modules[0].layout.dp = 2;
  EXPECT_EQ(describe(p), "non_colocated vision[tp1 dp2 mb1 @0-1] llm[tp2 sp dp3 mb1 @2-7] 1f1b");
}

}  // namespace
}  // namespace hetpar::planner
