// Symmetry reduction (lower.h): one representative rank per pipeline stage, with mirrored
// peers and copies of its communication, predicts what simulating every rank predicts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"

namespace hetpar::planner {
namespace {

Scenario make(std::string_view profile, int nodes, int64_t global_batch, int layers = 8,
              std::string_view moe = "") {
  std::string text = fmt::format(
      R"({{"model": {{"name": "tiny", "modules": [{{"name": "llm", "kind": "llm", "spec": {{
        "layers": {}, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
        "vocab": 32000, "activation": "swiglu", "norm": "rmsnorm"{}}}}}]}},
      "workload": {{"seq_len": 4096, "global_batch": {}}},
      "cluster": {{"profile": "{}", "nodes": {}}}}})",
      layers, moe, global_batch, profile, nodes);
  auto s = parse_scenario_text(text, "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

struct Case {
  std::string name;
  Scenario scenario;
  Plan plan;
  double phase_tol = 0.005;  // relative tolerance of the per-rank phase times
};

Plan plan(int tp, int cp, int pp, int dp, Schedule sch = Schedule::k1F1B, int vpp = 1) {
  Plan p;
  p.layout.tp = tp;
  p.layout.cp = cp;
  p.layout.pp = pp;
  p.layout.dp = dp;
  p.layout.vpp = vpp;
  p.layout.sequence_parallel = tp > 1;
  p.layout.distributed_optimizer = true;
  p.schedule = sch;
  return p;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // 1 NIC per node (rtx4090-node): the TP peers' DP reductions and pipeline transfers
  // share it.
  out.push_back(
      {"rtx4090 tp4 dp4 (DP over the shared NIC)", make("rtx4090-node", 2, 16), plan(4, 1, 1, 4)});
  out.push_back({"rtx4090 tp8 pp2 dp2", make("rtx4090-node", 4, 16), plan(8, 1, 2, 2)});
  {
    Plan p = plan(2, 1, 4, 2, Schedule::kZeroBubble);
    p.layout.recompute = models::Recompute::kSelective;
    out.push_back(
        {"rtx4090 tp2 pp4 dp2 zb-h1 (two stages per node)", make("rtx4090-node", 2, 16), p});
  }
  {
    Plan p = plan(2, 1, 2, 8);
    p.layout.distributed_optimizer = false;
    p.layout.overlap_grad_reduce = false;
    out.push_back({"rtx4090 tp2 pp2 dp8 all-reduce, no overlap", make("rtx4090-node", 4, 32), p});
  }
  // One NIC per GPU.
  out.push_back({"dgx-h100 tp2 pp2 dp4", make("dgx-h100", 2, 32), plan(2, 1, 2, 4)});
  {
    Plan p = plan(4, 1, 2, 4);
    p.layout.tp_comm_overlap = true;
    out.push_back({"dgx-h100 tp4 pp2 dp4 userbuffers", make("dgx-h100", 4, 32), p});
    Plan q = plan(2, 2, 2, 4, Schedule::kInterleaved, 2);
    q.layout.tp_comm_overlap = true;
    q.layout.recompute = models::Recompute::kFull;
    out.push_back({"dgx-h100 tp2 cp2 pp2 vpp2 dp4 userbuffers, full recompute",
                   make("dgx-h100", 4, 32, 8), q});
  }
  out.push_back({"dgx-h100 tp2 cp2 pp2 dp4", make("dgx-h100", 4, 32, 8), plan(2, 2, 2, 4)});
  // Stage 1 launches chunk 1's gradient reduce-scatters aligned with stage 0 (Layout::
  // align_grad_reduce), beside chunk 0's last backward and its pipeline transfers: the
  // representative's ring takes 719 us where every rank's takes 770 us (dp_comm 1.6% short;
  // not pinned down, the candidate is the reduction's known gap, link load of mirrored
  // transfers that only the representative's copies stand for: lower.h); the iteration agrees.
  out.push_back({"dgx-h100 tp2 pp2 dp8 interleaved", make("dgx-h100", 4, 32, 8),
                 plan(2, 1, 2, 8, Schedule::kInterleaved, 2), 0.02});
  out.push_back(
      {"dgx-h100 tp8 cp2 pp2 dp2 (CP across nodes)", make("dgx-h100", 8, 16), plan(8, 2, 2, 2)});
  out.push_back(
      {"rtx4090 tp4 cp2 pp2 dp2 (CP in a node)", make("rtx4090-node", 4, 16), plan(4, 2, 2, 2)});
  {
    Plan p = plan(8, 2, 2, 2);
    p.layout.cp_comm = CpComm::kAllGather;
    out.push_back(
        {"dgx-h100 tp8 cp2 pp2 dp2 all-gather CP across nodes", make("dgx-h100", 8, 16), p});
    Plan q = plan(2, 2, 2, 4);
    q.layout.cp_comm = CpComm::kAllGather;
    q.layout.recompute = models::Recompute::kSelective;
    out.push_back({"dgx-h100 tp2 cp2 pp2 dp4 all-gather CP, selective recompute",
                   make("dgx-h100", 4, 32, 8), q});
    Plan a = q;
    a.layout.cp_comm = CpComm::kA2A;
    out.push_back(
        {"dgx-h100 tp2 cp2 pp2 dp4 a2a CP, selective recompute", make("dgx-h100", 4, 32, 8), a});
    Plan h = plan(2, 4, 2, 2);
    h.layout.cp_comm = CpComm::kA2AP2P;
    h.layout.cp_a2a = 2;
    out.push_back({"dgx-h100 tp2 cp4 (a2a 2 x p2p 2) pp2 dp2", make("dgx-h100", 4, 32, 4), h});
    Plan x = plan(8, 4, 2, 2);
    x.layout.cp_comm = CpComm::kA2AP2P;
    x.layout.cp_a2a = 2;
    Scenario wide = make("dgx-h100", 16, 32, 4);
    std::get<models::LlmSpec>(wide.model.modules[0].spec).block.kv_heads = 16;  // 2 a tp rank
    out.push_back({"dgx-h100 tp8 cp4 (a2a 2 x p2p 2) pp2 dp2, both levels across nodes", wide, x});
  }
  {
    Plan p = plan(4, 1, 2, 2, Schedule::kGpipe);
    p.layout.recompute = models::Recompute::kFull;
    out.push_back({"dgx-a100 tp4 pp2 dp2 gpipe full recompute", make("dgx-a100-80gb", 2, 8), p});
  }
  {
    Scenario s = make("dgx-h100", 8, 16);
    std::get<models::LlmSpec>(s.model.modules[0].spec).block.kv_heads = 16;  // tp 16 divides
    out.push_back({"dgx-h100 tp16 pp2 dp2 (TP groups of two whole nodes)", s, plan(16, 1, 2, 2)});
  }
  out.push_back({"dgx-h100 tp2 pp8 dp1 (stages inside and across nodes)", make("dgx-h100", 2, 16),
                 plan(2, 1, 8, 1)});
  const std::string moe =
      R"(, "ffn_hidden": 0, "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 1024})";
  {
    Plan p = plan(1, 1, 1, 16);
    p.layout.ep = 4;
    out.push_back({"dgx-h100 dp16 ep4 (MoE)", make("dgx-h100", 2, 32, 4, moe), p});
  }
  {
    Plan p = plan(2, 1, 2, 8);
    p.layout.ep = 8;
    out.push_back(
        {"rtx4090 tp2 pp2 dp8 ep8 (MoE, EP across nodes)", make("rtx4090-node", 4, 32, 4, moe), p});
  }
  {
    Plan p = plan(2, 1, 1, 8);
    p.layout.fsdp = true;
    out.push_back({"dgx-h100 tp2 dp8 fsdp (across nodes)", make("dgx-h100", 2, 32), p});
    Plan q = plan(1, 1, 1, 16);
    q.layout.ep = 4;
    q.layout.fsdp = true;
    q.layout.fsdp_reshard_after_forward = false;
    out.push_back({"dgx-h100 dp16 ep4 fsdp kept gathered (MoE: experts over expert-DP groups)",
                   make("dgx-h100", 2, 32, 4, moe), q});
    p.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;  // copy-outs on each rank
    p.layout.gradient_accumulation_fusion = false;
    out.push_back({"dgx-h100 tp2 dp8 torch fsdp2", make("dgx-h100", 2, 32), p});
    p.layout.fsdp_root_unit = true;
    out.push_back({"dgx-h100 tp2 dp8 torch fsdp2 root unit", make("dgx-h100", 2, 32), p});
  }
  {
    Plan p = plan(2, 1, 1, 8);  // EP 8 folded over TP 2 x DP 4 of each node
    p.layout.sequence_parallel = true;
    p.layout.ep = 8;
    p.layout.etp = 1;
    out.push_back({"dgx-h100 tp2 sp dp8 ep8 etp1 (MoE parallel folding)",
                   make("dgx-h100", 2, 32, 4, moe), p});
  }
  {
    Plan p = plan(1, 1, 1, 16);  // EP 16 across both nodes, its all-to-alls overlapped
    p.layout.ep = 16;
    p.layout.ep_comm_overlap = true;
    out.push_back(
        {"dgx-h100 dp16 ep16 ep_comm_overlap (merged F/B)", make("dgx-h100", 2, 64, 4, moe), p});
    Plan q = plan(1, 1, 2, 8, Schedule::kInterleaved, 2);
    q.layout.ep = 8;
    q.layout.ep_comm_overlap = true;
    out.push_back({"dgx-h100 pp2 vpp2 dp8 ep8 ep_comm_overlap (interleaved, merged F/B)",
                   make("dgx-h100", 2, 64, 4, moe), q});
    Plan f = p;  // fully sharded: each op's gathers prefetch along its own program
    f.layout.fsdp = true;
    out.push_back({"dgx-h100 dp16 ep16 fsdp ep_comm_overlap (merged F/B, sharded)",
                   make("dgx-h100", 2, 64, 4, moe), f});
    Plan u = plan(2, 1, 1, 8);  // beside userbuffers: each merged op its own ring collective
    u.layout.sequence_parallel = true;
    u.layout.tp_comm_overlap = true;
    u.layout.ep = 16;
    u.layout.etp = 1;
    u.layout.ep_comm_overlap = true;
    out.push_back({"dgx-h100 tp2 sp dp8 ep16 etp1 tp_comm_overlap ep_comm_overlap",
                   make("dgx-h100", 2, 64, 4, moe), u});
  }
  {
    // Shared experts beside the all-to-alls, EP 16 across both nodes (under TP 2 with SP:
    // their gather and reduce-scatter beside them too).
    const std::string shared = moe.substr(0, moe.size() - 1) + R"(, "shared_experts": 2})";
    Plan p = plan(2, 1, 1, 8);
    p.layout.sequence_parallel = true;
    p.layout.ep = 16;
    p.layout.etp = 1;
    p.layout.moe_shared_expert_overlap = true;
    out.push_back({"dgx-h100 tp2 sp dp8 ep16 etp1 moe_shared_expert_overlap",
                   make("dgx-h100", 2, 64, 4, shared), p});
  }
  return out;
}

Time phase(const PlanMetrics& m, std::string_view name) {
  for (const PhaseTime& p : m.phases)
    if (p.phase == name) return p.per_rank;
  return Time::zero();
}

Time exposed(const PlanMetrics& m, std::string_view kind) {
  for (const ExposedComm& e : m.exposed_by_kind)
    if (e.kind == kind) return e.per_rank;
  return Time::zero();
}

TEST(Symmetry, RepresentativesPredictWhatEveryRankDoes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto lowered = lower(c.scenario, c.plan);
    ASSERT_TRUE(lowered.is_ok()) << lowered.status().to_string();
    EXPECT_TRUE(lowered->representatives);
    auto reduced = evaluate(c.scenario, c.plan);
    auto full = evaluate(c.scenario, c.plan, {.full_ranks = true});
    ASSERT_TRUE(reduced.is_ok() && full.is_ok());
    ASSERT_TRUE(full->feasible) << full->infeasible_reason;
    ASSERT_TRUE(reduced->feasible);
    EXPECT_LT(reduced->tasks, full->tasks);
    const double it = full->iteration_time.to_seconds();
    EXPECT_NEAR(reduced->iteration_time.to_seconds() / it, 1.0, 0.005);
    ASSERT_EQ(reduced->phases.size(), full->phases.size());
    for (const PhaseTime& p : full->phases)
      EXPECT_NEAR(phase(*reduced, p.phase).to_seconds(), p.per_rank.to_seconds(),
                  c.phase_tol * p.per_rank.to_seconds() + 1e-9)
          << p.phase;
    ASSERT_EQ(reduced->exposed_by_kind.size(), full->exposed_by_kind.size());
    for (const ExposedComm& e : full->exposed_by_kind)
      EXPECT_NEAR(exposed(*reduced, e.kind).to_seconds(), e.per_rank.to_seconds(), 0.005 * it)
          << e.kind;
    EXPECT_NEAR(reduced->exposed_comm.to_seconds(), full->exposed_comm.to_seconds(), 0.005 * it);
    EXPECT_NEAR(reduced->bubble_fraction, full->bubble_fraction, 0.005);
  }
}

// Known residual: a stage's DP ring shares NVLink and NIC links with the CP rings and
// pipeline transfers of mirrored ranks, whose load only the representative's own links see.
// Iteration time still matches; the DP reductions' stream time is within 2%.
TEST(Symmetry, InterleavedWithCpWithinTwoPercent) {
  Scenario s = make("dgx-h100", 4, 32, 8);
  const Plan p = plan(2, 2, 2, 4, Schedule::kInterleaved, 2);
  auto reduced = evaluate(s, p);
  auto full = evaluate(s, p, {.full_ranks = true});
  ASSERT_TRUE(reduced.is_ok() && full.is_ok() && reduced->feasible && full->feasible);
  EXPECT_NEAR(reduced->iteration_time / full->iteration_time, 1.0, 0.005);
  for (const PhaseTime& ph : full->phases)
    EXPECT_NEAR(phase(*reduced, ph.phase) / ph.per_rank, 1.0, ph.phase == "dp_comm" ? 0.02 : 0.005)
        << ph.phase;
}

// Where ranks of a stage are not alike (CP rings mixing NVLink and network hops, stages
// straddling nodes), every rank is simulated.
TEST(Symmetry, AsymmetricLayoutsSimulateEveryRank) {
  {
    // tp 2 on 8-GPU nodes: 4 cp positions per node, a cp ring of 8 spans 2 nodes.
    Scenario s = make("dgx-h100", 2, 16);
    auto lp = lower(s, plan(2, 8, 1, 1));
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    EXPECT_FALSE(lp->representatives);
  }
  {
    // 6 ranks per stage on 8-GPU nodes.
    Scenario s = make("dgx-h100", 3, 12, 8);
    auto lp = lower(s, plan(2, 1, 4, 3));
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    EXPECT_FALSE(lp->representatives);
  }
}

// Copies load shared links: with one NIC per node, the DP reduction of tp peers shares it,
// so the representative's reduction takes about tp times as long as alone.
TEST(Symmetry, CopiesShareTheNic) {
  Scenario s = make("rtx4090-node", 2, 16);
  auto m = evaluate(s, plan(4, 1, 1, 4));
  auto full = evaluate(s, plan(4, 1, 1, 4), {.full_ranks = true});
  ASSERT_TRUE(m.is_ok() && full.is_ok());
  EXPECT_GT(phase(*m, "dp_comm"), Time::zero());
  EXPECT_NEAR(phase(*m, "dp_comm").to_seconds() / phase(*full, "dp_comm").to_seconds(), 1.0, 0.005);
}

}  // namespace
}  // namespace hetpar::planner
