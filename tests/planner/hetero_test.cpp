// Heterogeneous placements (colocated / non-colocated encoders): validation, the boundary's
// sizes and shares, the dependencies lower() builds across it, and the whole iteration.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "hetpar/planner/boundary.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/search.h"
#include "hetpar/sim/simulate.h"
#include "two_encoders.h"

namespace hetpar::planner {
namespace {

// LLaVA-1.5-7B (examples/default.json's workload) on `nodes` DGX H100 nodes.
Scenario llava(int64_t global_batch, int nodes = 1, bool frozen = false) {
  std::string text = fmt::format(
      R"({{"model": "llava-1.5-7b", "workload": {{"seq_len": 4096, "global_batch": {},
        "images_per_sample": 1, "precision": "bf16", "frozen_encoders": {}}},
        "cluster": {{"profile": "dgx-h100", "nodes": {}}}}})",
      global_batch, frozen ? "true" : "false", nodes);
  auto s = parse_scenario_text(text, "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

Layout layout(int tp, int dp, int mb = 1, int pp = 1) {
  Layout l;
  l.tp = tp;
  l.dp = dp;
  l.pp = pp;
  l.micro_batch = mb;
  return l;
}

std::string vision(const Scenario& s) {
  for (const models::Module& m : s.model.modules)
    if (models::is_encoder(models::kind_of(m.spec))) return m.name;
  return "";
}

Plan colocated(const Scenario& s, Layout llm, Layout enc) {
  Plan p;
  p.layout = llm;
  p.placement = Placement::kColocated;
  p.modules.push_back({vision(s), enc, 0});
  return p;
}

Plan non_colocated(const Scenario& s, Layout llm, int llm_first, Layout enc, int enc_first) {
  Plan p;
  p.layout = llm;
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = llm_first;
  p.modules.push_back({vision(s), enc, enc_first});
  return p;
}

// Lowers `p` (which must keep the symmetry: representatives stand for their classes) and
// evaluates it reduced and with every rank: the reduced run has fewer tasks and the same
// iteration time within `tol` (relative). Returns {reduced, full}; nothing on a failure.
std::optional<std::pair<PlanMetrics, PlanMetrics>> reduced_and_full(const Scenario& s,
                                                                    const Plan& p, double tol) {
  EXPECT_EQ(infeasibility(s, p), "");
  auto lp = lower(s, p);
  EXPECT_TRUE(lp.is_ok()) << lp.status().to_string();
  if (!lp.is_ok()) return std::nullopt;
  EXPECT_TRUE(lp->representatives);
  EvaluateOptions eo;
  eo.enforce_memory = false;
  auto reduced = evaluate(s, p, eo);
  eo.full_ranks = true;
  auto full = evaluate(s, p, eo);
  EXPECT_TRUE(reduced.is_ok() && full.is_ok());
  if (!reduced.is_ok() || !full.is_ok()) return std::nullopt;
  EXPECT_LT(reduced->tasks, full->tasks);
  EXPECT_NEAR(reduced->iteration_time / full->iteration_time, 1.0, tol);
  return std::make_pair(*reduced, *full);
}

int64_t hidden(const Scenario& s) {
  return std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec).block.hidden;
}

TEST(Boundary, BytesPerMicroBatchAreMVH2) {
  const Scenario s = llava(64);
  const Plan p = colocated(s, layout(4, 2, 2), layout(1, 8, 2));
  const Boundary b = make_boundary(s, p, p.modules[0]);
  EXPECT_EQ(b.tokens_per_sample, 576);  // CLIP ViT-L/14-336: 24 x 24 patches
  EXPECT_EQ(b.bytes_per_micro_batch.count(), 2 * 576 * hidden(s) * 2);
}

TEST(Boundary, FanInAndFanOutShares) {
  const Scenario s = llava(64);
  // Fan-in: 8 encoder replicas feed 2 LLM replicas, 4 each; one encoder step (mb 1) gives
  // each LLM replica 4 micro-batches, one from each encoder replica of its group.
  const Plan in = colocated(s, layout(4, 2), layout(1, 8));
  const Boundary bi = make_boundary(s, in, in.modules[0]);
  EXPECT_EQ(bi.fan_in, 4);
  EXPECT_EQ(bi.fan_out, 1);
  EXPECT_EQ(bi.llm_per_step, 4);
  EXPECT_EQ(bi.enc_steps * 4, bi.llm_steps);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(bi.source_replica(1, i), 4 + static_cast<int>(i));
  EXPECT_EQ(bi.step_of(5), 1);
  // Fan-out: 1 encoder replica of 8 GPUs (mb 4) feeds 4 LLM replicas, 1 micro-batch each.
  const Plan out = colocated(s, layout(2, 4), layout(8, 1, 4));
  const Boundary bo = make_boundary(s, out, out.modules[0]);
  EXPECT_EQ(bo.fan_out, 4);
  EXPECT_EQ(bo.llm_per_step, 1);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(bo.source_replica(d, 3), 0);
  // Fan-out with too small an encoder micro-batch cannot split into LLM micro-batches.
  EXPECT_NE(infeasibility(s, colocated(s, layout(2, 4), layout(8, 1, 2))).find("whole llm"),
            std::string::npos);
}

TEST(Placement, ErrorsAreClear) {
  const Scenario s = llava(48);
  auto why = [&](const Plan& p) { return infeasibility(s, p); };
  EXPECT_EQ(why(colocated(s, layout(4, 2), layout(1, 8))), "");
  EXPECT_EQ(why(non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0)), "");
  EXPECT_NE(why(colocated(s, layout(4, 2), layout(1, 4))).find("must span the world"),
            std::string::npos);
  EXPECT_NE(why(non_colocated(s, layout(2, 3), 0, layout(2, 1, 3), 0)).find("overlap"),
            std::string::npos);
  EXPECT_NE(why(non_colocated(s, layout(2, 2), 2, layout(2, 1, 2), 0)).find("tile the cluster"),
            std::string::npos);
  EXPECT_NE(why(non_colocated(s, layout(2, 3), 4, layout(2, 1, 3), 0)).find("outside"),
            std::string::npos);
  // DP sizes must divide one another: 2 encoder replicas, 3 LLM replicas.
  EXPECT_NE(why(non_colocated(s, layout(2, 3), 2, layout(1, 2), 0)).find("divide one another"),
            std::string::npos);
  Plan bad = colocated(s, layout(4, 2), layout(1, 8));
  bad.modules[0].module = "llm";
  EXPECT_NE(why(bad).find("not an encoder"), std::string::npos);
  bad.modules[0].module = "nope";
  EXPECT_NE(why(bad).find("no module named"), std::string::npos);
  bad.modules.clear();
  EXPECT_NE(why(bad).find("has no entry in plan.modules"), std::string::npos);
  EXPECT_NE(why(colocated(s, layout(4, 2), layout(1, 4, 1, 2))).find("pp 2 > 1"),
            std::string::npos);
  EXPECT_NE(why(colocated(s, layout(4, 2, 2), layout(1, 8, 3))).find("not a multiple"),
            std::string::npos);
  Layout llm_cp = layout(1, 3);
  llm_cp.cp = 2;
  EXPECT_NE(why(non_colocated(s, llm_cp, 2, layout(2, 1, 3), 0)).find("cp 2 > 1"),
            std::string::npos);
  // An encoder's own attention kernel needs flash attention, as the LLM's does.
  Layout unfused = layout(1, 8);
  unfused.flash_attention = false;
  unfused.attention_kernel = hardware::AttentionKernel::kFlash2;
  EXPECT_EQ(why(colocated(s, layout(4, 2), unfused)),
            "module \"vision\": attention_kernel flash2 needs flash_attention");
}

// Start / end of every task of a lowered heterogeneous plan.
struct SimRun {
  LoweredPlan lp;
  sim::SimResult r;
};
SimRun simulate(const Scenario& s, const Plan& p) {
  auto lp = lower(s, p);
  EXPECT_TRUE(lp.is_ok()) << lp.status().to_string();
  sim::SimOptions o;
  o.record_tasks = true;
  auto r = sim::simulate(lp->graph, lp->network, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return {std::move(lp).value(), std::move(r).value()};
}

TEST(NonColocated, LlmWaitsForEncoderAndEncoderForGradient) {
  const Scenario s = llava(24);
  // Encoder TP2 DP1 (micro-batch 3) on GPUs 0-1, LLM TP2 DP3 on GPUs 2-7: fan-out 3, each
  // encoder step feeds one micro-batch to each LLM replica.
  const Plan p = non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0);
  ASSERT_EQ(infeasibility(s, p), "");
  const SimRun run = simulate(s, p);
  const sim::TaskGraph& g = run.lp.graph;
  const int64_t m = 24 / 3;  // LLM micro-batches per replica; also encoder steps
  auto cat = [&](TaskId t) { return g.label_text(g.task(t).label.category); };
  auto rank0 = [&](TaskId t) { return g.streams(t)[0].rank.value(); };
  // Compute tasks with a boundary task before them; every such dependency holds in time.
  std::map<int, std::set<int>> fed;  // rank -> tasks
  for (const auto& [before, after] : g.dependencies()) {
    if (cat(before) != "boundary_comm" || g.task(after).kind != sim::TaskKind::kCompute) continue;
    EXPECT_LE(run.r.tasks[before.value()].end, run.r.tasks[after.value()].start);
    fed[rank0(after)].insert(after.value());
  }
  // Every LLM rank's first forward task of every micro-batch waits for the encoder output
  // (the leader's P2P, then the broadcast over its TP group)...
  for (int r = 2; r < 8; ++r) {
    ASSERT_EQ(static_cast<int64_t>(fed[r].size()), m) << "rank " << r;
    for (int t : fed[r]) {
      EXPECT_EQ(cat(TaskId(t)), "fwd");
      EXPECT_TRUE(g.label_text(g.task(TaskId(t)).label.name).starts_with("llm pre"));
    }
  }
  // ... and every encoder rank's first backward task of every step for its gradient.
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(static_cast<int64_t>(fed[r].size()), m) << "rank " << r;
    for (int t : fed[r]) EXPECT_EQ(cat(TaskId(t)), "enc_bwd");
  }
  // Boundary P2Ps carry one LLM micro-batch's encoder output each way: m·V·H·2 bytes.
  int p2p = 0;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (task.kind != sim::TaskKind::kP2P || cat(TaskId(t)) != "boundary_comm") continue;
    EXPECT_EQ(task.bytes.count(), 1 * 576 * hidden(s) * 2);
    ++p2p;
  }
  EXPECT_EQ(p2p, 2 * m * 3);  // forward and backward, per micro-batch per LLM replica
  // Time by module.
  bool enc_fwd = false, bnd = false;
  for (const sim::CategoryTotal& c : run.r.categories) {
    enc_fwd |= c.category == "enc_fwd" && c.rank_time > Time::zero();
    bnd |= c.category == "boundary_comm" && c.rank_time > Time::zero();
  }
  EXPECT_TRUE(enc_fwd);
  EXPECT_TRUE(bnd);
}

TEST(Colocated, MatchingLayoutReproducesHomogeneous) {
  const Scenario s = llava(16);
  Plan h;
  h.layout = layout(4, 2);
  const Plan c = colocated(s, layout(4, 2), layout(4, 2));
  auto hm = evaluate(s, h);
  auto cm = evaluate(s, c);
  ASSERT_TRUE(hm.is_ok()) << hm.status().to_string();
  ASSERT_TRUE(cm.is_ok()) << cm.status().to_string();
  ASSERT_TRUE(cm->feasible) << cm->infeasible_reason;
  EXPECT_DOUBLE_EQ(hm->model_flops_per_iteration.count(), cm->model_flops_per_iteration.count());
  // Same work in the same order; the encoders' DP gradient reduction runs as its own
  // buckets on its own stream rather than merged into the LLM's first bucket.
  // Measured: 1.0001 (0.83736 s vs 0.83729 s, global batch 16). The encoders' DP reduction and
  // optimizer step run on their own stream after the encoder's last backward, and each module's TP
  // collectives are sized by its own tensors; the order of work on each GPU is the same.
  EXPECT_NEAR(cm->iteration_time.to_seconds() / hm->iteration_time.to_seconds(), 1.0, 0.002)
      << cm->iteration_time.to_seconds() << " vs " << hm->iteration_time.to_seconds();
}

TEST(Colocated, ModelFlopsIndependentOfPlacement) {
  const Scenario s = llava(16);
  Plan h;
  h.layout = layout(4, 2);
  auto a = lower(s, h);
  auto b = lower(s, colocated(s, layout(4, 2), layout(1, 8)));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NEAR(a->model_flops_per_iteration.count() / b->model_flops_per_iteration.count(), 1, 1e-9);
  const Scenario s24 = llava(24);
  Plan h24;
  h24.layout = layout(4, 2);
  auto a24 = lower(s24, h24);
  auto c24 = lower(s24, non_colocated(s24, layout(2, 3), 2, layout(2, 1, 3), 0));
  ASSERT_TRUE(a24.is_ok() && c24.is_ok()) << c24.status().to_string();
  EXPECT_NEAR(a24->model_flops_per_iteration.count() / c24->model_flops_per_iteration.count(), 1,
              1e-9);
}

TEST(Colocated, FanInGathersAndFrozenRemovesEncoderBackward) {
  for (bool frozen : {false, true}) {
    const Scenario s = llava(16, 1, frozen);
    const SimRun run = simulate(s, colocated(s, layout(4, 2), layout(1, 8)));
    Time enc_bwd, enc_fwd, bnd;
    for (const sim::CategoryTotal& c : run.r.categories) {
      if (c.category == "enc_bwd") enc_bwd = c.rank_time;
      if (c.category == "enc_fwd") enc_fwd = c.rank_time;
      if (c.category == "boundary_comm") bnd = c.rank_time;
    }
    EXPECT_GT(enc_fwd, Time::zero());
    EXPECT_GT(bnd, Time::zero());
    if (frozen) {
      EXPECT_EQ(enc_bwd, Time::zero());
    } else {
      EXPECT_GT(enc_bwd, Time::zero());
    }
  }
}

TEST(NonColocated, FrozenEncodersSendNoGradient) {
  const Scenario s = llava(24, 1, true);
  const SimRun run = simulate(s, non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0));
  const sim::TaskGraph& g = run.lp.graph;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const std::string_view cat = g.label_text(g.task(TaskId(t)).label.category);
    EXPECT_NE(cat, "enc_bwd");
    if (cat == "boundary_comm" && g.task(TaskId(t)).kind == sim::TaskKind::kP2P) {
      EXPECT_LT(g.task(TaskId(t)).src.value(), 2);  // encoder -> LLM only
    }
  }
}

// The numbers of the report: LLaVA-1.5-7B, global batch 256, one 8 x H100 node.
TEST(Hetero, DISABLED_LlavaOneNode) {
  const Scenario s = llava(256);
  Plan h;
  h.layout = layout(4, 2);
  const std::vector<std::pair<std::string, Plan>> plans = {
      {"homogeneous TP4 DP2", h},
      {"colocated enc TP1 DP8 + LLM TP4 DP2", colocated(s, layout(4, 2), layout(1, 8))},
      {"homogeneous TP4 PP2",
       [&] {
         Plan q;
         q.layout = layout(4, 1, 1, 2);
         return q;
       }()},
      {"colocated three-phase enc TP1 DP8 + LLM TP4 PP2",
       colocated(s, layout(4, 1, 1, 2), layout(1, 8))},
      {"non-colocated enc TP2 DP1 mb3 (GPUs 0-1) + LLM TP2 DP3 (GPUs 2-7)",
       non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0)},
      {"non-colocated enc TP1 DP2 (GPUs 0-1) + LLM TP2 PP3 (10/11/11 layers) (GPUs 2-7)",
       [&] {
         Layout l = layout(2, 1, 1, 3);
         l.first_stage_layers = 10;
         return non_colocated(s, l, 2, layout(1, 2), 0);
       }()},
      {"non-colocated enc TP1 DP4 (GPUs 0-3) + LLM TP4 DP1 (GPUs 4-7)",
       non_colocated(s, layout(4, 1), 4, layout(1, 4), 0)},
      {"non-colocated enc TP1 DP2 (GPUs 0-1) + LLM TP2 PP3 (GPUs 2-7), frozen encoder",
       [&] {
         Layout l = layout(2, 1, 1, 3);
         l.first_stage_layers = 10;
         return non_colocated(s, l, 2, layout(1, 2), 0);
       }()},
  };
  for (const auto& [name, p] : plans) {
    Scenario s2 = s;
    if (name.find("DP3") != std::string::npos) s2 = llava(252);  // divisible by LLM dp 3
    if (name.find("frozen") != std::string::npos) s2 = llava(256, 1, true);
    auto m = evaluate(s2, p);
    ASSERT_TRUE(m.is_ok()) << name << ": " << m.status().to_string();
    fmt::print(
        "{}: feasible {} ({}), iteration {:.3f} s, {:.1f} TFLOPS/GPU, peak mem {:.1f} GiB "
        "(stage {}), bubble {:.3f}\n",
        name, m->feasible, m->infeasible_reason, m->iteration_time.to_seconds(), m->tflops_per_gpu,
        m->memory.peak.as_double() / (1 << 30), m->memory.peak_stage, m->bubble_fraction);
    for (const PhaseTime& ph : m->phases)
      fmt::print("    {} {:.3f} s\n", ph.phase, ph.per_rank.to_seconds());
  }
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

TEST(HeteroMemory, EncodersOnTheirRanksAndFrozenHoldLess) {
  const Scenario s = llava(24);
  const Plan nc = non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0);
  const MemoryReport r = estimate_memory(s, nc);
  ASSERT_EQ(r.per_stage.size(), 2u);  // the encoder's ranks, the LLM's one stage
  EXPECT_LT(r.per_stage[0].weights, r.per_stage[1].weights);
  EXPECT_GT(r.per_stage[0].activations, Bytes());
  const MemoryReport f = estimate_memory(llava(24, 1, true), nc);
  EXPECT_EQ(f.per_stage[0].gradients, Bytes());
  EXPECT_EQ(f.per_stage[0].optimizer_state, Bytes());
  EXPECT_LT(f.per_stage[0].activations, r.per_stage[0].activations);
  EXPECT_EQ(f.per_stage[1].weights, r.per_stage[1].weights);
  // Colocated: every rank holds its encoder shard on top of its LLM shard.
  const Scenario s16 = llava(16);
  Plan llm_only;
  llm_only.layout = layout(4, 2);
  const MemoryReport h = estimate_memory(s16, llm_only);
  const MemoryReport c = estimate_memory(s16, colocated(s16, layout(4, 2), layout(1, 8)));
  ASSERT_EQ(c.per_stage.size(), 1u);
  // The encoder unsharded (TP1) holds more weights than under TP4.
  EXPECT_GT(c.per_stage[0].weights, h.per_stage[0].weights);
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Every boundary shape and schedule lowers to a graph the simulator runs (no deadlock).
TEST(Hetero, ShapesAndSchedulesSimulate) {
  const Scenario s = llava(48);
  Layout cp2 = layout(2, 2);
  cp2.cp = 2;
  Layout pp2 = layout(2, 1, 1, 2);
  std::vector<Plan> plans = {
      colocated(s, layout(4, 2), layout(1, 8)),               // fan-in 4
      colocated(s, layout(4, 2, 1), layout(1, 8, 2)),         // fan-in, encoder micro-batch scale 2
      colocated(s, layout(2, 4), layout(8, 1, 4)),            // fan-out 4
      colocated(s, layout(2, 4), layout(2, 4)),               // equal
      colocated(s, cp2, layout(1, 8)),                        // fan-in, LLM CP: gradient gathered
      colocated(s, layout(4, 1, 1, 2), layout(1, 8)),         // three-phase (LLM pp 2), fan-in 8
      colocated(s, layout(2, 2, 1, 2), layout(2, 4)),         // three-phase, fan-in 2
      non_colocated(s, pp2, 0, layout(1, 4), 4),              // fan-in 4, encoder after the LLM
      non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0),  // fan-out 3
  };
  Plan zb = non_colocated(s, pp2, 4, layout(1, 4), 0);
  zb.schedule = Schedule::kZeroBubble;
  plans.push_back(zb);
  Plan il = non_colocated(s, pp2, 4, layout(2, 2), 0);
  il.schedule = Schedule::kInterleaved;
  il.layout.vpp = 2;
  plans.push_back(il);
  for (const Plan& p : plans) {
    ASSERT_EQ(infeasibility(s, p), "");
    auto lp = lower(s, p);
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    auto r = sim::simulate(lp->graph, lp->network, {});
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  }
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Colocated with LLM pp > 1: every encoder forward runs before the LLM's first forward and
// every encoder backward after the LLM's last backward on each rank; the encoders hold
// their whole local batch's activations.
TEST(Colocated, ThreePhaseSchedule) {
  const Scenario s = llava(16);
  const Plan p = colocated(s, layout(4, 1, 1, 2), layout(1, 8));
  ASSERT_EQ(infeasibility(s, p), "");
  const SimRun run = simulate(s, p);
  const sim::TaskGraph& g = run.lp.graph;
  std::vector<Time> last_enc_fwd(8), first_llm(8, Time::seconds(1e9)), last_llm(8),
      first_enc_bwd(8, Time::seconds(1e9));
  for (int t = 0; t < g.num_tasks(); ++t) {
    const TaskId id(t);
    if (g.task(id).kind != sim::TaskKind::kCompute) continue;
    const int r = g.streams(id)[0].rank.value();
    const std::string_view c = g.label_text(g.task(id).label.category);
    const sim::TaskTiming& tt = run.r.tasks[t];
    if (c == "enc_fwd") last_enc_fwd[r] = std::max(last_enc_fwd[r], tt.end);
    if (c == "enc_bwd") first_enc_bwd[r] = std::min(first_enc_bwd[r], tt.start);
    if (c == "fwd" || c == "bwd") {
      first_llm[r] = std::min(first_llm[r], tt.start);
      last_llm[r] = std::max(last_llm[r], tt.end);
    }
  }
  for (int r = 0; r < 8; ++r) {
    EXPECT_LE(last_enc_fwd[r], first_llm[r]) << r;
    EXPECT_LE(last_llm[r], first_enc_bwd[r]) << r;
  }
  const MemoryReport m = estimate_memory(s, p);
  const MemoryReport one = estimate_memory(s, colocated(s, layout(4, 2), layout(1, 8)));
  EXPECT_GT(m.per_stage[0].activations.as_double(), 0);
  EXPECT_GT(m.per_stage[0].communication_buffers, one.per_stage[0].communication_buffers);
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Non-colocated: the encoder is stage 0 of a pipeline over 1 + llm_pp stages, so it runs
// llm_pp forwards ahead before its first backward (following the LLM's stage-0 order
// instead serialised encoder and LLM on every step).
TEST(HeteroLeadingStage, EncoderRunsAheadLikeA1F1BFirstStage) {
  Boundary b;
  b.llm_per_step = 1;
  b.enc_steps = 8;
  const std::vector<PipelineOp> llm0 = stage_order(Schedule::k1F1B, 0, 4, 1, 8);
  std::vector<PipelineOp> prog = leading_stage_program(b, llm0, /*llm_pp=*/4, /*frozen=*/false);
  ASSERT_EQ(prog.size(), 16u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(prog[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(prog[5].kind, PassKind::kBackward);
  EXPECT_EQ(prog[5].micro_batch, 0);
  // An encoder step feeding two LLM micro-batches needs half the warm-up.
  b.llm_per_step = 2;
  prog = leading_stage_program(b, llm0, 4, false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(prog[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(prog[3].kind, PassKind::kBackward);
  // Frozen encoders only run forwards.
  prog = leading_stage_program(b, llm0, 4, true);
  ASSERT_EQ(prog.size(), 8u);
  for (const PipelineOp& op : prog) EXPECT_EQ(op.kind, PassKind::kForward);
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Heterogeneous plans (lower.h): representatives per class of alike DP replicas of each
// module predict what simulating every rank predicts.
Layout module_layout(int tp, int dp, int mb = 1, int pp = 1, int cp = 1) {
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = dp;
  l.micro_batch = mb;
  l.sequence_parallel = tp > 1;
  l.distributed_optimizer = true;
  return l;
}

// The layout with FSDP in place of the distributed optimizer.
Layout fsdp(Layout l, bool reshard = true) {
  l.distributed_optimizer = false;
  l.fsdp = true;
  l.fsdp_reshard_after_forward = reshard;
  return l;
}

// The layout with userbuffers' TP overlap (Layout::tp_comm_overlap; it has SP).
Layout userbuffers(Layout l) {
  l.tp_comm_overlap = true;
  return l;
}

Plan hetero(Placement where, Layout llm, int llm_first, Layout enc, int enc_first) {
  Plan p;
  p.layout = llm;
  p.placement = where;
  p.llm_first_rank = llm_first;
  p.modules.push_back({"vision", enc, enc_first});
  return p;
}

Time phase(const PlanMetrics& m, std::string_view name) {
  for (const PhaseTime& p : m.phases)
    if (p.phase == name) return p.per_rank;
  return Time::zero();
}

TEST(HeteroSymmetry, RepresentativesPredictWhatEveryRankDoes) {
  const Placement co = Placement::kColocated, nc = Placement::kNonColocated;
  struct HCase {
    std::string name;
    Scenario s;
    Plan p;
    // Relative tolerance of the per-rank phase times. (The LLM cp 2 / encoder tp 2 case,
    // whose reduced dp_comm was once 1.7e-4 short of the full one, was exact when stop 41
    // checked it and now holds the default; which change mended it was not pinned down.)
    double phase_tol = 1e-6;
    // Relative tolerance of the iteration time: exact, except where the phase residual above
    // reaches the critical path (since round 12 tasks also wait for their host's launch,
    // and in the three-phase FSDP case the residual then moves the iteration by 2e-6).
    double iteration_tol = 1e-9;
  };
  const std::vector<HCase> cases = {
      {"colocated fan-in 4", llava(32, 2),
       hetero(co, module_layout(4, 4), 0, module_layout(1, 16), 0)},
      {"colocated fan-out 4", llava(32, 2),
       hetero(co, module_layout(2, 8), 0, module_layout(8, 2, 4), 0)},
      {"colocated equal", llava(32, 2), hetero(co, module_layout(2, 8), 0, module_layout(2, 8), 0)},
      {"colocated fan-in 2, llm cp 2", llava(32, 2),
       hetero(co, module_layout(2, 4, 1, 1, 2), 0, module_layout(2, 8), 0)},
      {"colocated fan-in 4, frozen", llava(32, 2, true),
       hetero(co, module_layout(4, 4), 0, module_layout(1, 16), 0)},
      {"three-phase fan-in 8", llava(32, 2),
       hetero(co, module_layout(4, 2, 1, 2), 0, module_layout(1, 16), 0)},
      {"three-phase fan-in 2, encoder mb 2", llava(32, 2),
       hetero(co, module_layout(2, 4, 1, 2), 0, module_layout(2, 8, 2), 0)},
      {"three-phase fan-in 8, llm cp 2", llava(32, 2),
       hetero(co, module_layout(2, 2, 1, 2, 2), 0, module_layout(1, 16), 0)},
      {"three-phase fan-in 4, llm tp 1 cp 2", llava(32, 2),
       hetero(co, module_layout(1, 4, 1, 2, 2), 0, module_layout(1, 16), 0)},
      {"three-phase fan-in 4, llm cp 2, encoder tp 2", llava(32, 2),
       hetero(co, module_layout(2, 2, 1, 2, 2), 0, module_layout(2, 8), 0)},
      {"three-phase fan-in 2, encoder tp 2", llava(32, 2),
       hetero(co, module_layout(2, 4, 1, 2), 0, module_layout(2, 8), 0)},
      {"three-phase fan-in 32, llm tp 4 cp 4 (CP rings straddle nodes)", llava(64, 8),
       hetero(co, module_layout(4, 2, 1, 2, 4), 0, module_layout(1, 64), 0)},
      {"three-phase fan-in 8, llm cp 2, frozen", llava(32, 2, true),
       hetero(co, module_layout(2, 2, 1, 2, 2), 0, module_layout(1, 16), 0)},
      {"three-phase fan-in 8, frozen", llava(32, 2, true),
       hetero(co, module_layout(4, 2, 1, 2), 0, module_layout(1, 16), 0)},
      {"non-colocated fan-in 4", llava(32, 3),
       hetero(nc, module_layout(4, 2, 1, 2), 8, module_layout(1, 8), 0)},
      {"non-colocated fan-out 4", llava(32, 2),
       hetero(nc, module_layout(2, 4), 8, module_layout(8, 1, 4), 0)},
      {"non-colocated equal, llm pp 2", llava(32, 3),
       hetero(nc, module_layout(4, 2, 1, 2), 0, module_layout(4, 2), 16)},
      {"non-colocated fan-in 4, frozen", llava(32, 3, true),
       hetero(nc, module_layout(4, 2, 1, 2), 8, module_layout(1, 8), 0)},
      {"colocated fan-in 4, both fsdp", llava(32, 2),
       hetero(co, fsdp(module_layout(4, 4)), 0, fsdp(module_layout(1, 16)), 0)},
      {"colocated fan-out 4, both fsdp kept gathered", llava(32, 2),
       hetero(co, fsdp(module_layout(2, 8), false), 0, fsdp(module_layout(8, 2, 4), false), 0)},
      // dp_comm 1.2e-5 and fwd 2e-6 apart, the iteration 1.7e-6: the LLM's first parameter
      // all-gather runs beside the boundary's transfers into the other LLM replica's leader,
      // copies among representatives, which load only the links their flows cross (lower.h).
      {"three-phase fan-in 8, both fsdp", llava(32, 2),
       hetero(co, fsdp(module_layout(4, 2, 1, 2)), 0, fsdp(module_layout(1, 16)), 0), 5e-5, 1e-5},
      {"non-colocated fan-in 4, both fsdp", llava(32, 3),
       hetero(nc, fsdp(module_layout(4, 2, 1, 2)), 8, fsdp(module_layout(1, 8)), 0)},
      {"non-colocated fan-out 4, both userbuffers", llava(32, 2),
       hetero(nc, userbuffers(module_layout(2, 4)), 8, userbuffers(module_layout(8, 1, 4)), 0)},
      {"colocated fan-in 4, llm userbuffers", llava(32, 2),
       hetero(co, userbuffers(module_layout(4, 4)), 0, module_layout(1, 16), 0)},
      {"non-colocated fan-in 4, frozen, llm fsdp", llava(32, 3, true),
       hetero(nc, fsdp(module_layout(4, 2, 1, 2)), 8, fsdp(module_layout(1, 8)), 0)},
  };
  for (const HCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(infeasibility(c.s, c.p), "");
    auto lowered = lower(c.s, c.p);
    ASSERT_TRUE(lowered.is_ok()) << lowered.status().to_string();
    EXPECT_TRUE(lowered->representatives);
    EvaluateOptions eo;
    eo.enforce_memory = false;
    auto reduced = evaluate(c.s, c.p, eo);
    eo.full_ranks = true;
    auto full = evaluate(c.s, c.p, eo);
    ASSERT_TRUE(reduced.is_ok() && full.is_ok());
    ASSERT_TRUE(reduced->feasible && full->feasible) << full->infeasible_reason;
    EXPECT_LT(reduced->tasks, full->tasks);
    fmt::print("{}: reduced {:.6f} s ({} tasks), full {:.6f} s ({} tasks)\n", c.name,
               reduced->iteration_time.to_seconds(), reduced->tasks,
               full->iteration_time.to_seconds(), full->tasks);
    EXPECT_NEAR(reduced->iteration_time / full->iteration_time, 1.0, c.iteration_tol);
    ASSERT_EQ(reduced->phases.size(), full->phases.size());
    for (const PhaseTime& ph : full->phases)
      EXPECT_NEAR(phase(*reduced, ph.phase).to_seconds(), ph.per_rank.to_seconds(),
                  c.phase_tol * ph.per_rank.to_seconds() + 1e-9)
          << ph.phase;
    // Not exact: a leader's boundary P2P counts as its exposed communication while its mirrored
    // TP peers idle (the representative is a leader), as in the homogeneous reduction.
    EXPECT_NEAR(reduced->bubble_fraction, full->bubble_fraction, 0.005);
    EXPECT_EQ(reduced->boundary_bytes, full->boundary_bytes);
  }
}

TEST(HeteroFsdp, AColocatedEncoderShardsItsParametersAsTheLlmDoes) {
  const Placement co = Placement::kColocated;
  const Scenario s = llava(32, 2);
  EXPECT_EQ(infeasibility(s, hetero(co, module_layout(4, 4), 0, fsdp(module_layout(1, 16)), 0)),
            "module \"vision\": fsdp on (resharded after the forward) differs from the llm's off: "
            "a colocated encoder shares the LLM's ranks and must shard its parameters as the LLM "
            "does");
  EXPECT_NE(infeasibility(
                s, hetero(co, fsdp(module_layout(4, 4)), 0, fsdp(module_layout(1, 16), false), 0)),
            "");
  EXPECT_EQ(
      infeasibility(s, hetero(co, fsdp(module_layout(4, 4)), 0, fsdp(module_layout(1, 16)), 0)),
      "");
}

TEST(HeteroFsdp, ANonColocatedEncoderShardsItsOwnRanks) {
  // Vision on ranks 0-7 (dp 8), the LLM on 8-23: the encoder's weights shrink to its
  // eighth plus two gathered blocks (the largest, its projector, 42 MB), its gradients to
  // its eighth plus one block; its optimizer state is sharded either way.
  const Placement nc = Placement::kNonColocated;
  const Scenario s = llava(32, 3);
  const Layout llm = module_layout(4, 2, 1, 2);
  auto metrics = [&](const Layout& enc) {
    auto m = evaluate(s, hetero(nc, llm, 8, enc, 0));
    EXPECT_TRUE(m.is_ok() && m->feasible);
    return *m;
  };
  const PlanMetrics with_dopt = metrics(module_layout(1, 8));
  const PlanMetrics with_fsdp = metrics(fsdp(module_layout(1, 8)));
  // The encoder's ranks gather every block per micro-batch and reduce-scatter its gradients.
  EXPECT_GT(phase(with_fsdp, "dp_comm"), phase(with_dopt, "dp_comm") * 2);
  const MemoryBreakdown& dopt = with_dopt.memory.per_stage.at(0);  // the encoder's stage first
  const MemoryBreakdown& sharded = with_fsdp.memory.per_stage.at(0);
  EXPECT_LT(sharded.weights.as_double(), dopt.weights.as_double() / 3);
  EXPECT_LT(sharded.gradients.as_double(), dopt.gradients.as_double() / 3);
  EXPECT_EQ(sharded.optimizer_state, dopt.optimizer_state);
  EXPECT_EQ(sharded.activations, dopt.activations);
}

// A cluster of two node groups (one DGX A100, two DGX H100): a non-colocated plan whose
// encoder lies on the A100 node and whose LLM lies on the H100 nodes keeps the symmetry of
// each module (representatives predict what every rank does), and the planner's lower bound
// stays below its time; a colocated plan over both kinds of node keeps a class of DP
// replicas per kind (the A100 one the slower), and its representatives predict what every
// rank does too.
TEST(HeteroSymmetry, AModuleOnOneNodeGroupOfAMixedCluster) {
  auto s =
      load_scenario(std::string(HETPAR_SOURCE_DIR) + "/tests/data/llava-a100-h100-24gpus.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Plan p = non_colocated(*s, layout(4, 2, 1, 2), 8, layout(1, 8, 2), 0);
  const auto both = reduced_and_full(*s, p, 1e-9);
  ASSERT_TRUE(both.has_value());
  const PlanMetrics& full = both->second;
  EXPECT_LE(lower_bound(*s, p), full.iteration_time);
  // The same plan with the modules' places swapped runs the encoder on H100s: a different
  // time, so the node groups' own numbers are used.
  const Plan swapped = non_colocated(*s, layout(4, 2, 1, 2), 0, layout(1, 8, 2), 16);
  EvaluateOptions eo;
  eo.enforce_memory = false;
  auto other = evaluate(*s, swapped, eo);
  ASSERT_TRUE(other.is_ok() && other->feasible) << other->infeasible_reason;
  EXPECT_NE(other->iteration_time, full.iteration_time);
  EXPECT_LE(lower_bound(*s, swapped), other->iteration_time);
  const Plan co = colocated(*s, layout(4, 6), layout(1, 24));
  const auto c = reduced_and_full(*s, co, 1e-9);
  ASSERT_TRUE(c.has_value());
  EXPECT_LE(lower_bound(*s, co), c->second.iteration_time);
  // Two simulated ranks per module: one per kind of node.
  auto lp = lower(*s, co);
  ASSERT_TRUE(lp.is_ok());
  int simulated = 0;
  for (int r = 0; r < 24; ++r) simulated += lp->graph.multiplicity(RankId(r)) > 0 ? 1 : 0;
  EXPECT_EQ(simulated, 2);
  // Fan-out (an encoder replica over four LLM replicas) and an LLM with CP 2: the boundary's
  // backward gathers run once per kind of node, the others their copies.
  const Plan fan_out = colocated(*s, layout(1, 24), layout(4, 6, 4));
  ASSERT_TRUE(reduced_and_full(*s, fan_out, 1e-9).has_value());
  Layout with_cp = layout(2, 6);
  with_cp.cp = 2;
  ASSERT_TRUE(reduced_and_full(*s, colocated(*s, with_cp, layout(1, 24)), 1e-9).has_value());
}

// A pipeline whose stages lie on different node groups (each stage on one) keeps the
// symmetry: every DP replica has its stage s on the same kind of GPU, so representatives
// predict what every rank does, homogeneous (stage 0 on the A100 node, stages 1-2 on the
// H100s, layers sized to them) and non-colocated (the LLM's stages 0-1 on the A100 node,
// 2-3 on the H100s, the encoder on the rest); a stage straddling two groups does not.
TEST(HeteroSymmetry, PipelineStagesOnDifferentNodeGroups) {
  auto s =
      load_scenario(std::string(HETPAR_SOURCE_DIR) + "/tests/data/llava-a100-h100-24gpus.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan homo;
  homo.layout = layout(4, 2, 1, 3);
  homo.layout.pipeline_layout = {6, 13, 13};
  const auto h = reduced_and_full(*s, homo, 1e-9);
  ASSERT_TRUE(h.has_value());
  EXPECT_LE(lower_bound(*s, homo), h->second.iteration_time);
  Layout llm = layout(2, 2, 1, 4);
  llm.pipeline_layout = {5, 5, 11, 11};
  const Plan nc = non_colocated(*s, llm, 0, layout(1, 8), 16);
  const auto n = reduced_and_full(*s, nc, 1e-9);
  ASSERT_TRUE(n.has_value());
  EXPECT_LE(lower_bound(*s, nc), n->second.iteration_time);
  // A stage over both kinds with its DP replicas each on one kind: a class per kind, as
  // every rank predicts (pp 1: the A100 replicas 0-1, the H100 ones 2-5).
  Plan wide;
  wide.layout = layout(4, 6);
  const auto w = reduced_and_full(*s, wide, 1e-9);
  ASSERT_TRUE(w.has_value());
  EXPECT_LE(lower_bound(*s, wide), w->second.iteration_time);
  wide.layout = layout(2, 6);  // TP 2 x CP 2 blocks: each CP ring on one kind
  wide.layout.cp = 2;
  ASSERT_TRUE(reduced_and_full(*s, wide, 1e-9).has_value());
  // A stage not aligned to its nodes breaks it: TP 4 x DP 3 x PP 2 puts stage 1 on ranks
  // 12-23, one and a half H100 nodes.
  Plan straddle;
  straddle.layout = layout(4, 3, 1, 2);
  auto lp = lower(*s, straddle);
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  EXPECT_FALSE(lp->representatives);
}

// Where a module's stages straddle nodes (the LLM's 6 ranks per stage on 8-GPU nodes), every
// rank is simulated.
TEST(HeteroSymmetry, UnalignedPlacementSimulatesEveryRank) {
  const Scenario s = llava(24);
  auto lp = lower(s, non_colocated(s, layout(2, 3), 2, layout(2, 1, 3), 0));
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  EXPECT_FALSE(lp->representatives);
  auto co = lower(s, colocated(s, layout(4, 2), layout(1, 8)));
  ASSERT_TRUE(co.is_ok());
  EXPECT_TRUE(co->representatives);
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// A pipelined encoder (non-colocated, pp 2): its layers split over its stages, the boundary
// leaving from its last stage, 1F1B over its stages and the LLM's.
TEST(NonColocated, EncoderPipelineStages) {
  const Scenario s = llava(32, 3);
  // The ViT TP1 PP2 DP4 on node 0 (stage 0: GPUs 0-3, stage 1: GPUs 4-7), the LLM TP4 PP2
  // DP2 on nodes 1-2 (fan-in 2).
  const Plan p =
      hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 4, 1, 2), 0);
  ASSERT_EQ(infeasibility(s, p), "");
  const SimRun run = simulate(s, p);
  const sim::TaskGraph& g = run.lp.graph;
  auto cat = [&](TaskId t) { return g.label_text(g.task(t).label.category); };
  auto name = [&](TaskId t) { return g.label_text(g.task(t).label.name); };
  Time first_fwd[2] = {Time::seconds(1e9), Time::seconds(1e9)}, last_bwd[2];
  Time first_fwd_end[2] = {Time::seconds(1e9), Time::seconds(1e9)};
  Time llm_first = Time::seconds(1e9);
  for (int t = 0; t < g.num_tasks(); ++t) {
    const TaskId id(t);
    const sim::Task& task = g.task(id);
    if (task.kind == sim::TaskKind::kP2P && cat(id) == "boundary_comm") {
      // Leaders: the encoder's on its last stage (GPUs 4-7), the LLM's on its first.
      const int enc = task.src.value() < 8 ? task.src.value() : task.dst.value();
      EXPECT_GE(enc, 4) << name(id);
      EXPECT_LT(enc, 8) << name(id);
    }
    if (task.kind != sim::TaskKind::kCompute) continue;
    const int r = g.streams(id)[0].rank.value();
    const sim::TaskTiming& tt = run.r.tasks[t];
    if (r >= 8) {
      if (cat(id) == "fwd") llm_first = std::min(llm_first, tt.start);
      continue;
    }
    const int st = r / 4;
    // The ViT's 24 layers: 0-11 on stage 0, 12-23 and the projector on stage 1.
    const std::string_view n = name(id);
    if (n.starts_with("vision L")) {
      const int layer = std::stoi(std::string(n.substr(8)));
      EXPECT_EQ(layer / 12, st) << n;
    }
    if (n.starts_with("projector")) {
      EXPECT_EQ(st, 1) << n;
    }
    if (cat(id) == "enc_fwd") {
      first_fwd[st] = std::min(first_fwd[st], tt.start);
      first_fwd_end[st] = std::min(first_fwd_end[st], tt.end);
    }
    if (cat(id) == "enc_bwd") last_bwd[st] = std::max(last_bwd[st], tt.end);
  }
  EXPECT_GE(first_fwd[1], first_fwd_end[0]);  // stage 1 waits for stage 0's activation
  EXPECT_GE(llm_first, first_fwd_end[1]);     // the LLM for the boundary from stage 1
  EXPECT_GT(last_bwd[0], last_bwd[1]);        // stage 0's backward after stage 1's
  // Encoder pipeline transfers: forward and backward of every step on each of 4 replicas
  // (the representatives' and their copies).
  int pp_p2p = 0;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (task.kind == sim::TaskKind::kP2P && cat(TaskId(t)) == "pp_comm" && task.src.value() < 8)
      pp_p2p += 1 + task.num_copies;
  }
  const int64_t steps = 32 / 4;
  EXPECT_EQ(pp_p2p, 2 * steps * 4);
  // Memory: one entry per encoder stage, then the LLM's stages; the ViT's weights split.
  const MemoryReport m = estimate_memory(s, p);
  ASSERT_EQ(m.per_stage.size(), 4u);
  const MemoryReport one = estimate_memory(
      s, hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 8), 0));
  EXPECT_LT(m.per_stage[0].weights, one.per_stage[0].weights);
  EXPECT_LT(m.per_stage[1].weights, one.per_stage[0].weights);
  // Against the same GPUs unpipelined (TP1 DP8, fan-in 4): the ViT is ~3% of the work
  // here, so the iteration is nearly the same; the pipelined encoder's extra fill shows
  // as a small slowdown, not a large one.
  EvaluateOptions eo;
  eo.enforce_memory = false;
  auto a = evaluate(s, p, eo);
  auto b = evaluate(
      s, hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 8), 0),
      eo);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_TRUE(a->feasible && b->feasible);
  fmt::print("encoder pp 2: {:.4f} s, pp 1: {:.4f} s\n", a->iteration_time.to_seconds(),
             b->iteration_time.to_seconds());
  EXPECT_NEAR(a->iteration_time / b->iteration_time, 1.0, 0.03);
  EXPECT_NEAR(phase(*a, "enc_fwd") / phase(*b, "enc_fwd"), 1.0, 0.05);
  // The reduction holds for a pipelined encoder too.
  eo.full_ranks = true;
  auto full = evaluate(s, p, eo);
  ASSERT_TRUE(full.is_ok());
  EXPECT_EQ(full->iteration_time, a->iteration_time);
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// The exactly-once rule (boundary.h, docs/heterogeneous.md): the gradient of each sample's
// encoder output reaches its encoder replica once — summed by the LLM's own collectives
// (TP replicas, CP chunks) before it crosses, then only moved. Per encoder rank and step,
// the boundary's backward gives it its replica's output gradient, enc_mb·V·H·2 bytes: as a
// P2P (the leader), a broadcast from the leader (its TP peers), an all-gather of sibling
// slices (colocated fan-out) or locally (a leader that is both sides; colocated narrow /
// pass-through, after an all-gather of the CP chunks with LLM cp > 1). Summed over one rank
// per encoder replica: the global batch's encoder output once, V·H·2 per sample.
TEST(Hetero, GradientReachesEachEncoderReplicaExactlyOnce) {
  const Placement co = Placement::kColocated, nc = Placement::kNonColocated;
  struct GCase {
    std::string name;
    Scenario s;
    Plan p;
  };
  const std::vector<GCase> cases = {
      // LLM TP4 on its first stage: one gradient per micro-batch, the leader's.
      {"non-colocated fan-in 4, llm tp 4", llava(32, 3),
       hetero(nc, module_layout(4, 2, 1, 2), 8, module_layout(1, 8), 0)},
      {"non-colocated fan-out 4, encoder tp 8", llava(32, 2),
       hetero(nc, module_layout(2, 4), 8, module_layout(8, 1, 4), 0)},
      {"non-colocated equal, encoder tp 4", llava(32, 3),
       hetero(nc, module_layout(4, 2, 1, 2), 0, module_layout(4, 2), 16)},
      {"three-phase fan-in 8", llava(32, 2),
       hetero(co, module_layout(4, 2, 1, 2), 0, module_layout(1, 16), 0)},
      {"colocated gather (fan-in 4)", llava(32, 2),
       hetero(co, module_layout(4, 4), 0, module_layout(1, 16), 0)},
      {"colocated gather, llm cp 2 (CP chunks)", llava(32, 2),
       hetero(co, module_layout(2, 4, 1, 1, 2), 0, module_layout(2, 8), 0)},
      {"colocated narrow (fan-out 4)", llava(32, 2),
       hetero(co, module_layout(2, 8), 0, module_layout(8, 2, 4), 0)},
      {"colocated pass-through (equal)", llava(32, 2),
       hetero(co, module_layout(2, 8), 0, module_layout(2, 8), 0)},
  };
  for (const GCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(infeasibility(c.s, c.p), "");
    const Layout& L = c.p.layout;
    const Layout& E = c.p.modules[0].layout;
    const bool colocated = c.p.placement == co;
    const Boundary b = make_boundary(c.s, c.p, c.p.modules[0]);
    const int64_t per_sample = b.tokens_per_sample * hidden(c.s) * 2;
    const int64_t share = E.micro_batch * per_sample;  // one encoder replica, one step
    auto lp = lower(c.s, c.p, {.full_ranks = true});
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    const sim::TaskGraph& g = lp->graph;
    const int enc0 = colocated ? 0 : c.p.modules[0].first_rank;
    const int enc_ranks = E.tp * E.dp;
    std::vector<int64_t> got(static_cast<size_t>(enc_ranks), 0);  // per encoder rank
    int64_t gathers = 0;
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      if (g.label_text(task.label.name) != "llm -> vision grad") continue;
      auto mine = [&](RankId r) { return r.value() - enc0; };
      if (task.kind == sim::TaskKind::kP2P) {
        got[static_cast<size_t>(mine(task.dst))] += task.bytes.count();
      } else if (task.collective == sim::CollectiveKind::kBroadcast) {
        for (RankId r : g.group(task.group))
          if (r != task.root) got[static_cast<size_t>(mine(r))] += task.bytes.count();
      } else {
        ASSERT_EQ(task.collective, sim::CollectiveKind::kAllGather);
        ++gathers;
        // Fan-out: the sibling slices of one encoder replica's output (the whole gradient,
        // kept); LLM CP: one LLM replica's step, of which each rank keeps its own slice.
        const int64_t kept = b.fan_out > 1 ? task.bytes.count() : share;
        if (b.fan_out > 1) {
          EXPECT_EQ(task.bytes.count(), share);
          EXPECT_EQ(static_cast<int>(g.group(task.group).size()), b.fan_out);
        } else {
          EXPECT_EQ(task.bytes.count(), b.bytes_per_micro_batch.count() * b.llm_per_step);
          EXPECT_EQ(static_cast<int>(g.group(task.group).size()), L.cp);
        }
        for (RankId r : g.group(task.group)) got[static_cast<size_t>(mine(r))] += kept;
      }
    }
    // Local hand-offs: colocated LLM pp 1 without fan-out or CP (narrow / pass-through),
    // and a three-phase leader that is both sides.
    for (int64_t t = 0; t < b.enc_steps; ++t) {
      if (colocated && L.pp == 1 && b.fan_out == 1 && L.cp == 1)
        for (int64_t& x : got) x += share;
      if (colocated && L.pp > 1)
        for (int64_t i = t * b.llm_per_step; i < (t + 1) * b.llm_per_step; ++i)
          for (int d = 0; d < L.dp; ++d) {
            const int e = b.source_replica(d, i);
            if (e * E.tp != d * L.tp * L.cp) continue;
            for (int q = 0; q < E.tp; ++q) got[static_cast<size_t>(e * E.tp + q)] += share;
          }
    }
    if (colocated && L.pp == 1 && b.fan_out == 1) {
      EXPECT_EQ(gathers > 0, L.cp > 1);
    }
    // Every rank of every encoder replica: its replica's gradient of every step, once.
    int64_t total = 0;
    for (int e = 0; e < E.dp; ++e) {
      for (int q = 0; q < E.tp; ++q)
        EXPECT_EQ(got[static_cast<size_t>(e * E.tp + q)], share * b.enc_steps)
            << "encoder replica " << e << " rank " << q;
      total += got[static_cast<size_t>(e * E.tp)];
    }
    EXPECT_EQ(total, c.s.workload.global_batch * per_sample);
  }
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Megatron's MIMO path needs power-of-two TP: a ViT whose 24 heads tp 3 divides is still
// rejected, with a message naming the module and the rule.
TEST(Placement, NonPowerOfTwoEncoderTp) {
  auto s = parse_scenario_text(
      R"({"model": {"name": "vit24", "modules": [
            {"name": "vision", "kind": "vision_encoder", "spec": {"layers": 4, "hidden": 768,
             "ffn_hidden": 3072, "heads": 24, "patch_size": 14, "image_size": 336,
             "activation": "gelu", "norm": "layernorm"}},
            {"name": "projector", "kind": "projector", "spec": {"input_hidden": 768,
             "output_hidden": 4096, "layers": 2, "ffn_hidden": 4096, "activation": "gelu"}},
            {"name": "llm", "kind": "llm", "spec": "vicuna-7b"}]},
          "workload": {"seq_len": 4096, "global_batch": 24, "images_per_sample": 1},
          "cluster": {"profile": "dgx-h100", "nodes": 2}})",
      "test.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const std::string why = infeasibility(
      *s, hetero(Placement::kNonColocated, module_layout(4, 3), 0, module_layout(3, 1, 3), 12));
  EXPECT_NE(why.find("module \"vision\": tp 3 must be 1, 2, 4 or 8"), std::string::npos) << why;
  // Only the LLM's layers are placed stage by stage.
  Layout staged = module_layout(2, 1, 1, 2);
  staged.pipeline_layout = {2, 2};
  const std::string why2 =
      infeasibility(*s, hetero(Placement::kNonColocated, module_layout(4, 3), 0, staged, 12));
  EXPECT_NE(why2.find("module \"vision\": pipeline_layout places the llm's layers"),
            std::string::npos)
      << why2;
  // An encoder has no experts to overlap.
  Layout overlapped = module_layout(2, 1, 2);
  overlapped.moe_shared_expert_overlap = true;
  const std::string why3 =
      infeasibility(*s, hetero(Placement::kNonColocated, module_layout(4, 3), 0, overlapped, 12));
  EXPECT_NE(why3.find("module \"vision\": moe_shared_expert_overlap needs shared experts"),
            std::string::npos)
      << why3;
}

// An encoder micro-batch that is a multiple of the LLM's (the encoder micro-batch scale):
// half the encoder steps, each feeding twice the LLM micro-batches; the boundary still
// moves one LLM micro-batch's output per transfer, and the iteration's work is the same.
TEST(NonColocated, EncoderMicroBatchScale) {
  const Scenario s = llava(32, 3);
  const Plan one =
      hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 8, 1), 0);
  const Plan two =
      hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 8, 2), 0);
  ASSERT_EQ(infeasibility(s, two), "");
  const Boundary b1 = make_boundary(s, one, one.modules[0]);
  const Boundary b2 = make_boundary(s, two, two.modules[0]);
  EXPECT_EQ(b2.enc_steps * 2, b1.enc_steps);
  EXPECT_EQ(b2.llm_per_step, 2 * b1.llm_per_step);
  EXPECT_EQ(b2.bytes_per_micro_batch, b1.bytes_per_micro_batch);
  // Encoder replica 3 (fan-in 4) feeds LLM replica 0's micro-batches 6, 7 of each step.
  EXPECT_EQ(b2.source_replica(0, 6), 3);
  EXPECT_EQ(b2.source_replica(0, 7), 3);
  EXPECT_EQ(b2.source_replica(1, 8 + 1), 4);
  auto l1 = lower(s, one, {.full_ranks = true});
  auto l2 = lower(s, two, {.full_ranks = true});
  ASSERT_TRUE(l1.is_ok() && l2.is_ok());
  auto count = [](const sim::TaskGraph& g, std::string_view cat, sim::TaskKind kind) {
    int n = 0;
    for (int t = 0; t < g.num_tasks(); ++t)
      if (g.task(TaskId(t)).kind == kind && g.label_text(g.task(TaskId(t)).label.category) == cat)
        ++n;
    return n;
  };
  EXPECT_EQ(count(l2->graph, "boundary_comm", sim::TaskKind::kP2P),
            count(l1->graph, "boundary_comm", sim::TaskKind::kP2P));
  EXPECT_EQ(2 * count(l2->graph, "enc_fwd", sim::TaskKind::kCompute),
            count(l1->graph, "enc_fwd", sim::TaskKind::kCompute));
  EXPECT_DOUBLE_EQ(l1->model_flops_per_iteration.count(), l2->model_flops_per_iteration.count());
  auto r = sim::simulate(l2->graph, l2->network, {});
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// The interleaved schedule's first stage forwards further ahead than 1F1B's before a step's
// last backward (here 3 encoder steps for pp 4, vpp 2); a leading encoder that only ran
// ceil(pp / k) steps ahead waited for a gradient the LLM could not send (a deadlock).
TEST(NonColocated, LeadingEncoderCoversTheInterleavedWarmUp) {
  const Scenario s = llava(32, 2);
  Plan p =
      hetero(Placement::kNonColocated, module_layout(1, 2, 1, 4), 8, module_layout(4, 1, 4, 2), 0);
  p.schedule = Schedule::kInterleaved;
  p.layout.vpp = 2;
  p.layout.sequence_parallel = false;
  ASSERT_EQ(infeasibility(s, p), "");
  for (bool full : {false, true}) {
    auto lp = lower(s, p, {.full_ranks = full});
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    auto r = sim::simulate(lp->graph, lp->network, {});
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  }
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// Two encoders (a ViT and a Whisper encoder feeding Qwen2.5-7B), each with its own boundary
// shape: the representatives still predict what every rank does.
TEST(HeteroSymmetry, TwoEncoders) {
  auto s = parse_scenario_text(std::string(R"({"model": )") + kTwoEncoderModel + R"(,
          "workload": {"seq_len": 4096, "global_batch": 48, "images_per_sample": 1,
                       "audio_clips_per_sample": 1},
          "cluster": {"profile": "dgx-h100", "nodes": 3}})",
                               "test.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  std::vector<Plan> plans;
  {
    // Non-colocated: the ViT TP1 DP4 (fan-in 2) on GPUs 0-3, Whisper TP4 DP1 micro-batch 2
    // (fan-out 2) on GPUs 4-7, the LLM TP4 PP2 DP2 on nodes 1-2.
    Plan p = hetero(Placement::kNonColocated, module_layout(4, 2, 1, 2), 8, module_layout(1, 4), 0);
    p.modules.push_back({"audio", module_layout(4, 1, 2), 4});
    plans.push_back(p);
  }
  {
    // Colocated three-phase: the ViT TP1 DP24 (fan-in 12), Whisper TP2 DP12 (fan-in 6); the
    // LLM TP4 PP3 DP2 (10/9/9 layers).
    Plan p = hetero(Placement::kColocated, module_layout(4, 2, 1, 3), 0, module_layout(1, 24), 0);
    p.layout.first_stage_layers = 10;
    p.modules.push_back({"audio", module_layout(2, 12), 0});
    plans.push_back(p);
  }
  for (const Plan& p : plans) {
    SCOPED_TRACE(to_string(p.placement));
    const auto both = reduced_and_full(*s, p, 0.0);
    ASSERT_TRUE(both.has_value());
    EXPECT_EQ(both->first.iteration_time, both->second.iteration_time);
    EXPECT_EQ(both->first.boundary_bytes, both->second.boundary_bytes);
  }
}

}  // namespace
}  // namespace hetpar::planner
