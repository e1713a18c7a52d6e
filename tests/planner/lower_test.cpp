#include "hetpar/planner/lower.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "hetpar/models/totals.h"
#include "hetpar/planner/cost_model.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {
namespace {

// A small dense LLM: `layers` layers of hidden 1024 and a tiny vocabulary, so pipeline
// stages are nearly equal.
Scenario make(int layers, int64_t global_batch, int nodes, std::string_view profile = "dgx-h100",
              std::string_view extra_cluster = "", std::string_view moe = "") {
  std::string text = fmt::format(
      R"({{"model": {{"name": "tiny", "modules": [{{"name": "llm", "kind": "llm", "spec": {{
        "layers": {}, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
        "vocab": 128, "activation": "swiglu", "norm": "rmsnorm"{}}}}}]}},
      "workload": {{"seq_len": 2048, "global_batch": {}}},
      "cluster": {{"profile": "{}", "nodes": {}{}}}}})",
      layers, moe, global_batch, profile, nodes, extra_cluster);
  auto s = parse_scenario_text(text, "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

// The same LLM with MoE layers: `experts` experts of ffn 2048, top 2, on DGX H100 nodes.
Scenario tiny_moe(int layers, int64_t global_batch, int nodes, int experts) {
  return make(layers, global_batch, nodes, "dgx-h100", "",
              fmt::format(R"(, "ffn_hidden": 0, "moe": {{"experts": {}, "top_k": 2, )"
                          R"("expert_ffn_hidden": 2048}})",
                          experts));
}

// The same LLM with its first `dense` layers dense (ffn 16384) and the others MoE layers of
// `experts` experts of ffn 2048, top 2 (MoeSpec::dense_layers).
Scenario dense_first_moe(int layers, int dense, int64_t global_batch, int nodes, int experts) {
  return make(layers, global_batch, nodes, "dgx-h100", "",
              fmt::format(R"(, "ffn_hidden": 16384, "moe": {{"experts": {}, "top_k": 2, )"
                          R"("expert_ffn_hidden": 2048, "dense_layers": {}}})",
                          experts, dense));
}

Plan plan(int tp, int pp, int dp, Schedule sch = Schedule::k1F1B, int vpp = 1, int cp = 1) {
  Plan p;
  p.layout.tp = tp;
  p.layout.pp = pp;
  p.layout.dp = dp;
  p.layout.cp = cp;
  p.layout.vpp = vpp;
  p.schedule = sch;
  return p;
}

LoweredPlan lowered(const Scenario& s, const Plan& p, LowerOptions o = {}) {
  auto r = lower(s, p, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

sim::SimResult run(const LoweredPlan& lp, const sim::Network& net, sim::SimOptions o = {}) {
  auto r = sim::simulate(lp.graph, net, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return *r;
}

// Communication for free: a huge switch without latency, collectives without latency; and
// a host that is never behind (the closed forms count GPU work only).
sim::SimResult run_free(const LoweredPlan& lp) {
  sim::SimOptions o;
  o.host = false;
  o.collectives.ring_base = o.collectives.tree_base = o.collectives.intra_hop =
      o.collectives.ring_inter_hop = o.collectives.tree_inter_hop = Time::zero();
  return run(lp, sim::single_switch_network(lp.world, Bandwidth::GBps(1e9), Time::zero()), o);
}

// Compute time per rank and category, from the graph.
std::map<std::string, Time> compute_time(const LoweredPlan& lp, int rank) {
  std::map<std::string, Time> out;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute || lp.graph.streams(TaskId(t))[0].rank.value() != rank)
      continue;
    out[std::string(lp.graph.label_text(task.label.category))] += task.duration;
  }
  return out;
}

// The graph's tasks of one category ("cp_comm", "tp_comm", ...).
std::vector<const sim::Task*> tasks_in(const LoweredPlan& lp, std::string_view category) {
  std::vector<const sim::Task*> out;
  for (int t = 0; t < lp.graph.num_tasks(); ++t)
    if (lp.graph.label_text(lp.graph.task(TaskId(t)).label.category) == category)
      out.push_back(&lp.graph.task(TaskId(t)));
  return out;
}

Time pipeline_work(const LoweredPlan& lp, int rank) {
  Time t;
  for (auto& [cat, d] : compute_time(lp, rank))
    if (cat != "optimizer") t += d;
  return t;
}

// 1F1B with free communication: (m + p - 1) slots of a stage's F + B; here stages differ a
// little (embedding, logits), so (m - 1) x slowest + sum over stages.
TEST(Lower, OneFOneBBubbleMatchesClosedForm) {
  const int pp = 4;
  const int64_t m = 8;
  LoweredPlan lp = lowered(make(16, m, 1), plan(2, pp, 1));
  sim::SimResult r = run_free(lp);
  Time slowest, sum;
  for (int st = 0; st < pp; ++st) {
    const Time per_mb = Time::ps(pipeline_work(lp, st * 2).count_ps() / m);
    slowest = std::max(slowest, per_mb);
    sum += per_mb;
  }
  const Time opt = compute_time(lp, 0)["optimizer"];
  const Time expect = slowest * (m - 1) + sum + opt;
  EXPECT_NEAR(r.makespan / expect, 1.0, 0.01);
  // With equal stages this is the (p-1)/(m+p-1) bubble.
  const double bubble = 1.0 - (r.makespan - opt) / (slowest * (m + pp - 1));
  EXPECT_LT(std::abs(bubble), 0.02);
}

// The optimizer step's HBM traffic per parameter, read from the trainers' source
// (optimizer_traffic in lower.h): {over the owned shard, over every held parameter}.
TEST(Lower, OptimizerTrafficFollowsTheTrainersSteps) {
  using hardware::Precision;
  auto traffic = [](Precision p, auto&& edit) {
    Layout l;
    edit(l);
    const OptimizerTraffic t = optimizer_traffic(l, p);
    return std::pair<int64_t, int64_t>(t.per_owned_param, t.per_held_param);
  };
  auto none = [](Layout&) {};
  auto owned_held = [](int64_t owned, int64_t held) { return std::pair(owned, held); };
  // bf16, fp32 main grads: norm 4 + Adam 28 + master copy 4 + 2; the fp32 buffer zeroed.
  EXPECT_EQ(traffic(Precision::kBf16, none), owned_held(38, 4));
  EXPECT_EQ(traffic(Precision::kFp8, none), owned_held(38, 4));
  // bf16 gradient buffer: the main grads cast to fp32 (2 + 4), a 2-byte buffer zeroed.
  EXPECT_EQ(
      traffic(Precision::kBf16, [](Layout& l) { l.grad_reduce_dtype = GradReduceDtype::kBf16; }),
      owned_held(44, 2));
  // fp16: fp16 buffer cast (2 + 4), unscale and inf check (8).
  EXPECT_EQ(traffic(Precision::kFp16, none), owned_held(52, 2));
  // fp32 training: the weights are their own master copy.
  EXPECT_EQ(traffic(Precision::kFp32, none), owned_held(32, 4));
  // Megatron-FSDP zeroes its gradient shard; FSDP2 clips always and never zeroes.
  EXPECT_EQ(traffic(Precision::kBf16, [](Layout& l) { l.fsdp = true; }), owned_held(42, 0));
  EXPECT_EQ(traffic(Precision::kBf16,
                    [](Layout& l) {
                      l.fsdp = true;
                      l.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
                    }),
            owned_held(40, 0));
}

// The optimizer task moves the owned shard's bytes plus the held buffer's: without the
// distributed optimizer every local parameter is owned, with it a dp-th.
TEST(Lower, OptimizerStepTimeIsItsTraffic) {
  Scenario s = make(8, 8, 1);
  const hardware::DeviceProfile& dev = s.cluster.groups()[0].profile.gpu;
  for (bool dist : {false, true}) {
    Plan p = plan(2, 1, 4);
    p.layout.distributed_optimizer = dist;
    const double held = estimate_memory(s, p).per_stage[0].weights.count() / 2.0;
    const double owned = dist ? held / 4 : held;
    const Time expect = dev.memory_kernel_time(Bytes(static_cast<int64_t>(owned * 38 + held * 4)));
    const Time got = compute_time(lowered(s, p), 0)["optimizer"];
    EXPECT_NEAR(got / expect, 1.0, 1e-3) << "distributed optimizer " << dist;
  }
}

TEST(Lower, GpipeAndOneFOneBTakeTheSameTime) {
  Scenario s = make(16, 8, 1);
  sim::SimResult a = run_free(lowered(s, plan(2, 4, 1, Schedule::kGpipe)));
  sim::SimResult b = run_free(lowered(s, plan(2, 4, 1, Schedule::k1F1B)));
  EXPECT_NEAR(a.makespan / b.makespan, 1.0, 1e-3);
}

// Interleaving with vpp chunks shrinks the bubble (p-1)/m by about vpp.
TEST(Lower, InterleavingShrinksTheBubbleByVpp) {
  const int pp = 4, vpp = 2;
  const int64_t m = 8;
  Scenario s = make(16, m, 1);
  LoweredPlan base = lowered(s, plan(2, pp, 1));
  LoweredPlan inter = lowered(s, plan(2, pp, 1, Schedule::kInterleaved, vpp));
  const Time work = pipeline_work(base, 0), opt = compute_time(base, 0)["optimizer"];
  const double bubble_1f1b = (run_free(base).makespan - opt - work) / work;
  const double bubble_inter = (run_free(inter).makespan - opt - work) / work;
  EXPECT_NEAR(bubble_1f1b, (pp - 1.0) / m, 0.03);
  EXPECT_NEAR(bubble_inter, (pp - 1.0) / (vpp * m), 0.03);
}

TEST(Lower, ZeroBubbleBeatsOneFOneB) {
  Scenario s = make(16, 8, 1);
  LoweredPlan base = lowered(s, plan(2, 4, 1, Schedule::k1F1B));
  LoweredPlan zb = lowered(s, plan(2, 4, 1, Schedule::kZeroBubble));
  const Time work = pipeline_work(base, 0), opt = compute_time(base, 0)["optimizer"];
  const double bubble_1f1b = (run_free(base).makespan - opt - work) / work;
  const double bubble_zb = (run_free(zb).makespan - opt - work) / work;
  EXPECT_LT(bubble_zb, bubble_1f1b * 0.7);
}

// TP traffic per layer and micro-batch: 2 all-reduces forward and 2 backward of s·b·h
// bytes without SP; with SP an all-gather and a reduce-scatter in each place (4 + 4), plus
// the all-gather of qkv's and fc1's saved input slices again in backward (2 more).
TEST(Lower, TensorParallelCommunicationPerLayer) {
  Scenario s = make(4, 2, 1);
  for (bool sp : {false, true}) {
    Plan p = plan(8, 1, 1);
    p.layout.sequence_parallel = sp;
    LoweredPlan lp = lowered(s, p);
    std::map<sim::CollectiveKind, int> count;
    Bytes layer_bytes;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.category) != "tp_comm") continue;
      if (lp.graph.label_text(task.label.name).find(" L") == std::string_view::npos) continue;
      ++count[task.collective];
      EXPECT_EQ(task.bytes, Bytes(2048 * 1024 * 2));
      layer_bytes += task.bytes;
    }
    const int per_layer_mb = 4 * 2;  // 4 layers x 2 micro-batches
    if (sp) {
      EXPECT_EQ(count[sim::CollectiveKind::kAllGather], 6 * per_layer_mb);
      EXPECT_EQ(count[sim::CollectiveKind::kReduceScatter], 4 * per_layer_mb);
    } else {
      EXPECT_EQ(count[sim::CollectiveKind::kAllReduce], 4 * per_layer_mb);
      EXPECT_EQ(count.size(), 1u);
    }
  }
}

// The vocab-parallel loss combines each token's statistics over TP in its forward, as each
// cross-entropy implementation does (cost_model.cpp's loss_collectives): per micro-batch
// three all-reduces of the 2048 tokens' fp32 (unfused, torch's loss_parallel), two with the
// last two fused (Megatron-Core's fused loss), one all-gather of three per token from each
// of the 8 ranks (Transformer Engine's); under CP 2 each rank's half of the tokens; none at
// tp 1 or backward.
TEST(Lower, TheVocabParallelLossCombinesItsStatisticsOverTp) {
  const Scenario s = make(2, 8, 1);
  auto loss_collectives = [&](const Plan& p) {
    LoweredPlan lp = lowered(s, p);
    std::vector<std::pair<sim::CollectiveKind, Bytes>> out;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (task.kind != sim::TaskKind::kCollective ||
          lp.graph.group(task.group).front() != RankId(0))
        continue;
      const std::string_view name = lp.graph.label_text(task.label.name);
      if (name.find("llm post") == std::string_view::npos ||
          lp.graph.label_text(task.label.category) != "tp_comm")
        continue;
      if (task.collective == sim::CollectiveKind::kAllReduce && task.bytes > Bytes(1 << 20))
        continue;  // the logits' input gradient (backward, the TP entry's mirror)
      out.emplace_back(task.collective, task.bytes);
    }
    return out;
  };
  using CK = sim::CollectiveKind;
  const Bytes row(2048 * 4);
  auto repeat = [](std::vector<std::pair<CK, Bytes>> one, int times) {
    std::vector<std::pair<CK, Bytes>> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), one.begin(), one.end());
    return out;
  };
  Plan p = plan(8, 1, 1);
  p.layout.cross_entropy_fusion = CrossEntropy::kUnfused;
  EXPECT_EQ(loss_collectives(p),
            repeat({{CK::kAllReduce, row}, {CK::kAllReduce, row}, {CK::kAllReduce, row}}, 8));
  p.layout.cross_entropy_fusion = CrossEntropy::kCompiled;
  EXPECT_EQ(loss_collectives(p),
            repeat({{CK::kAllReduce, row}, {CK::kAllReduce, row}, {CK::kAllReduce, row}}, 8));
  p.layout.cross_entropy_fusion = CrossEntropy::kNative;
  EXPECT_EQ(loss_collectives(p), repeat({{CK::kAllReduce, row}, {CK::kAllReduce, row * 2}}, 8));
  p.layout.cross_entropy_fusion = CrossEntropy::kTe;
  EXPECT_EQ(loss_collectives(p), repeat({{CK::kAllGather, row * 3 * 8}}, 8));
  Plan cp = plan(4, 1, 1, Schedule::k1F1B, 1, 2);
  cp.layout.cross_entropy_fusion = CrossEntropy::kNative;
  EXPECT_EQ(loss_collectives(cp), repeat({{CK::kAllReduce, row / 2}, {CK::kAllReduce, row}}, 8));
  Plan none = plan(1, 1, 8);
  none.layout.cross_entropy_fusion = CrossEntropy::kUnfused;
  EXPECT_TRUE(loss_collectives(none).empty());
}

// Megatron's column-parallel backward: the entry's collective runs beside the linear's wgrad
// GEMM (and under SP the input re-gather beside its dgrad), so backward TP collectives
// overlap compute on rank 0; with the 2021 blocking all-reduce none does. Without SP
// that only hides the all-reduce, so the iteration gets shorter; under SP the re-gather is
// extra traffic, which on this tiny layer's short GEMMs costs more than it hides.
TEST(Lower, TensorParallelBackwardOverlapsTheLinearsGemms) {
  Scenario s = make(2, 1, 1);
  for (bool sp : {false, true}) {
    Time with, without;
    for (bool overlap : {true, false}) {
      Plan p = plan(8, 1, 1);
      p.layout.sequence_parallel = sp;
      p.layout.tp_backward_overlap = overlap;
      LoweredPlan lp = lowered(s, p);
      sim::SimOptions o;
      o.collectives = collective_config(s.cluster);
      o.record_tasks = true;
      const sim::SimResult r = run(lp, lp.network, o);
      (overlap ? with : without) = r.makespan;
      int overlapped = 0;
      for (int a = 0; a < lp.graph.num_tasks(); ++a) {
        const sim::Task& c = lp.graph.task(TaskId(a));
        if (lp.graph.label_text(c.label.category) != "tp_comm") continue;
        for (int b = 0; b < lp.graph.num_tasks(); ++b) {
          const sim::Task& k = lp.graph.task(TaskId(b));
          if (k.kind != sim::TaskKind::kCompute || lp.graph.streams(TaskId(b))[0].rank.value() != 0)
            continue;
          if (r.tasks[a].start < r.tasks[b].end && r.tasks[b].start < r.tasks[a].end &&
              lp.graph.label_text(k.label.category) == "bwd")
            ++overlapped;
        }
      }
      // Per layer: the reduction beside qkv's and fc1's wgrad, under SP also the re-gather
      // beside their dgrad (the logits' entry likewise).
      if (overlap)
        EXPECT_GE(overlapped, 2 * 2 * (sp ? 2 : 1)) << sp;
      else
        EXPECT_EQ(overlapped, 0) << sp;
    }
    if (!sp) {
      EXPECT_LT(with, without);
    }
  }
}

// Userbuffers (Layout::tp_comm_overlap), per layer and micro-batch: forward, the SP
// all-gathers before qkv and fc1 and all chunks but the last of the reduce-scatters after
// proj and fc2 run beside those GEMMs, the last chunk after them; backward, the
// gradient all-gathers before proj's and fc2's dgrad likewise. A linear's chunks but the
// last do not wait for its all-gather; the last does. The rest is as without it: the logits' entry,
// the backward of qkv and fc1 (bulk, as tp_backward_overlap), and the embedding's exit.
TEST(Lower, UserbuffersRunTheSpCollectivesBesideTheLinears) {
  const int layers = 2;
  Scenario s = make(layers, 1, 1);
  Plan p = plan(8, 1, 1);
  p.layout.sequence_parallel = true;
  const LoweredPlan base = lowered(s, p);
  p.layout.tp_comm_overlap = true;
  const LoweredPlan lp = lowered(s, p);
  const sim::TaskGraph& g = lp.graph;
  std::map<std::pair<sim::CollectiveKind, bool>, int> count;  // (kind, copy engine)
  Bytes ring_rs;
  auto tp_tasks = [](const sim::TaskGraph& graph) {
    int n = 0;
    for (int t = 0; t < graph.num_tasks(); ++t)
      n += graph.label_text(graph.task(TaskId(t)).label.category) == "tp_comm" ? 1 : 0;
    return n;
  };
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (g.label_text(task.label.category) != "tp_comm") continue;
    ++count[{task.collective, task.copy_engine}];
    if (task.copy_engine && task.collective == sim::CollectiveKind::kReduceScatter)
      ring_rs += task.bytes;
  }
  const auto ag = sim::CollectiveKind::kAllGather, rs = sim::CollectiveKind::kReduceScatter;
  EXPECT_EQ((count[{ag, true}]), layers * (2 + 2));  // qkv, fc1 forward; proj, fc2 backward
  EXPECT_EQ((count[{rs, true}]), layers * 2 * 2);    // proj, fc2: the chunks, the last one
  const Bytes activation = Bytes(2048 * 1024 * 2);   // s x h in bf16
  EXPECT_EQ(ring_rs, activation * (layers * 2));
  // In bf16, userbuffers' "pipeline" method: 4 splits, three of them beside the GEMM.
  int beside = 0;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    beside += task.copy_engine && task.collective == rs && task.bytes == activation * 3 / 4;
  }
  EXPECT_EQ(beside, layers * 2);
  EXPECT_EQ(tp_tasks(g), tp_tasks(base.graph) + layers * 2) << "one more task per reduce-scatter";
  // Every copy-engine all-gather of the forward runs beside a linear that does not wait.
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (!task.copy_engine || task.collective != ag ||
        g.label_text(task.label.name).find("bwd") != std::string_view::npos)
      continue;
    int waiting = 0;
    for (auto [before, after] : g.dependencies())
      if (before == TaskId(t)) {
        EXPECT_EQ(g.task(after).kind, sim::TaskKind::kCompute);
        // The linear's first tp - 1 chunks (lowered right after it) do not wait; its last
        // chunk does.
        EXPECT_EQ(after.value(), t + 2);
        ++waiting;
      }
    EXPECT_EQ(waiting, 1);
  }
  sim::SimOptions o;
  o.collectives = collective_config(s.cluster);
  const sim::SimResult with = run(lp, lp.network, o), without = run(base, base.network, o);
  Time exposed_with, exposed_without;
  for (const sim::RankStats& r : with.ranks) exposed_with += r.exposed_comm;
  for (const sim::RankStats& r : without.ranks) exposed_without += r.exposed_comm;
  EXPECT_LT(exposed_with, exposed_without);
}

// On a 70B layer's GEMMs the chunked GEMMs cost less than the collectives they hide:
// examples/llama3-70b-64xh100-userbuffers-compare.json, at TP4 and TP8, userbuffers win
// (on the tiny layer above, whose GEMMs are launch-bound, they lose).
TEST(Lower, UserbuffersPayOffOnLargeGemms) {
  auto s = load_scenario(std::string(HETPAR_SOURCE_DIR) +
                         "/examples/llama3-70b-64xh100-userbuffers-compare.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  std::map<std::string, Time> t, exposed_tp;
  for (const auto& [name, plan] : s->plans) {
    auto m = evaluate(*s, plan);
    ASSERT_TRUE(m.is_ok() && m->feasible) << name;
    t[name] = m->iteration_time;
    for (const ExposedComm& e : m->exposed_by_kind)
      if (e.kind == "tp_comm") exposed_tp[name] = e.per_rank;
  }
  ASSERT_EQ(t.size(), 4u);
  for (std::string tp : {"tp4", "tp8"}) {
    EXPECT_LT(t[tp + "_userbuffers"], t[tp + "_nccl"]) << tp;
    // It hides no more than the TP communication NCCL left exposed.
    EXPECT_LT(t[tp + "_nccl"] - t[tp + "_userbuffers"], exposed_tp[tp + "_nccl"]) << tp;
  }
}

// A plan too large to simulate (its tasks would exhaust memory before the first event) is
// infeasible with its size, not lowered until the allocator gives up; the estimate tracks
// the graph lower() builds.
TEST(Lower, RefusesAPlanTooLargeToSimulate) {
  const Plan p = plan(8, 2, 1);  // tp 8 x pp 2 on two DGX H100 nodes
  const Scenario small = make(4, 64, 2);
  const double estimate = estimated_tasks(small, p);
  const LoweredPlan lp = lowered(small, p);
  const double built = static_cast<double>(lp.graph.num_tasks());
  EXPECT_GT(estimate, built / 2);
  EXPECT_LT(estimate, built * 2);
  // Every rank: tp x dp ranks per stage instead of one representative.
  EXPECT_NEAR(estimated_tasks(small, p, true) / estimate, 8.0, 1e-9);
  // Nodes whose ranks share compute units (CPU hosts) are simulated rank by rank, and so
  // estimated: a search must not pass a plan there that evaluate() then refuses.
  Scenario shared = small;
  std::vector<hardware::NodeGroup> groups = shared.cluster.groups();
  for (hardware::NodeGroup& g : groups) g.profile.shared_compute_units = 2;
  shared.cluster = *hardware::ClusterSpec::create(groups, shared.cluster.overrides());
  EXPECT_FALSE(ranks_share_compute(small));
  EXPECT_TRUE(ranks_share_compute(shared));
  EXPECT_EQ(estimated_tasks(shared, p), estimated_tasks(small, p, true));

  // The global batch whose estimate passes kMaxSimulatedTasks.
  const auto per_micro_batch = estimate / 64;
  const auto over =
      static_cast<int64_t>(static_cast<double>(kMaxSimulatedTasks) / per_micro_batch) + 1;
  auto m = evaluate(make(4, over, 2), p);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->feasible);
  EXPECT_EQ(m->infeasible_reason.rfind("too large to simulate: about ", 0), 0u)
      << m->infeasible_reason;
  EXPECT_NE(m->infeasible_reason.find(fmt::format("({} micro-batches per replica)", over)),
            std::string::npos)
      << m->infeasible_reason;
  // Simulating every rank multiplies the graph: refused at an 8th of that batch.
  EvaluateOptions every;
  every.full_ranks = true;
  m = evaluate(make(4, over / 8 + 64, 2), p, every);
  ASSERT_TRUE(m.is_ok());
  EXPECT_FALSE(m->feasible);
  EXPECT_NE(m->infeasible_reason.find("every rank simulated"), std::string::npos);
}

// Sizes each within their bounds can together pass what int64 counters hold: a tensor of a
// micro-batch over kMaxTensorElements, or an iteration whose clock could overflow, is an
// infeasible plan with its reason, never a wrapped count.
TEST(Lower, RefusesWhatItsCountersCannotHold) {
  Scenario s = make(4, 512, 2);
  s.workload.seq_len = int64_t{1} << 24;
  Plan p = plan(8, 2, 1);
  p.layout.micro_batch = 32;  // 2^29 tokens x the MLP's 4096: 2^41 elements
  EXPECT_EQ(infeasibility(s, p).rfind("out of memory: one micro-batch of module \"llm\" "
                                      "(micro_batch 32) makes a tensor of about 2.2e+12 "
                                      "elements (tokens x width)",
                                      0),
            0u)
      << infeasibility(s, p);
  p.layout.micro_batch = 1;
  EXPECT_EQ(infeasibility(s, p), "");
  p.layout.flash_attention = false;  // 16 heads x (2^24)^2 scores
  EXPECT_NE(infeasibility(s, p).find("attention scores: heads x sequence^2"), std::string::npos)
      << infeasibility(s, p);

  // Attention over 2^24 tokens: ~7e18 FLOPs a sample, 512 samples on 16 GPUs take about
  // 2.3e5 s at peak, past kMaxIterationAtPeak (about 9.2e4 s).
  p.layout.flash_attention = true;
  EvaluateOptions o;
  o.enforce_memory = false;
  auto m = evaluate(s, p, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->feasible);
  EXPECT_EQ(m->infeasible_reason.rfind("too long to simulate: one iteration needs ", 0), 0u)
      << m->infeasible_reason;
  s.workload.global_batch = 64;  // an eighth: about 2.9e4 s, simulated
  m = evaluate(s, p, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE(m->feasible) << m->infeasible_reason;
  EXPECT_GT(m->iteration_time.to_seconds(), 2.9e4);
  EXPECT_LT(m->iteration_time, Time::max());
}

TEST(Lower, UserbuffersNeedSpAndAreNotForTheExecutor) {
  Scenario s = make(2, 1, 1);
  Plan p = plan(8, 1, 1);
  p.layout.tp_comm_overlap = true;
  EXPECT_EQ(infeasibility(s, p),
            "tp_comm_overlap needs tp > 1 with sequence parallelism (sp): userbuffers overlap the "
            "SP all-gathers and reduce-scatters with the GEMMs");
  p.layout.sequence_parallel = true;
  EXPECT_EQ(infeasibility(s, p), "");
  LowerOptions o;
  o.kernels = true;
  o.full_ranks = true;
  auto r = lower(s, p, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not as userbuffers"), std::string::npos);
  // Its buffers: ten of the layer's (s·b, h) in bf16 (memory.cpp).
  auto with = evaluate(s, p);
  p.layout.tp_comm_overlap = false;
  auto without = evaluate(s, p);
  ASSERT_TRUE(with.is_ok() && without.is_ok());
  EXPECT_EQ(with->memory.per_stage[0].communication_buffers -
                without->memory.per_stage[0].communication_buffers,
            Bytes(10 * 2048 * 1024 * 2));
}

// The DP gradient reduction of a plan whose DP group spans two nodes runs beside the
// backward; NCCL's channels hold 16 SMs of each member for it (inter_node.collective_sms),
// so the iteration is slower than with the field zeroed. A DP group inside one node keeps
// the in-node figure and does not move.
TEST(Lower, CrossNodeCollectivesSlowTheBackwardTheyOverlap) {
  auto without_sms = [](Scenario s) {
    std::vector<hardware::NodeGroup> groups = s.cluster.groups();
    for (hardware::NodeGroup& g : groups) g.profile.inter_node.collective_sms = 0;
    auto c = hardware::ClusterSpec::create(groups, s.cluster.overrides());
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    s.cluster = *c;
    return s;
  };
  auto time = [](const Scenario& s, const Plan& p) {
    auto m = evaluate(s, p);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m->iteration_time;
  };
  // Micro-batches of 8 sequences, so that the backward outlasts the reductions beside it.
  const Scenario across = make(32, 128, 2);
  Plan dp_across = plan(1, 1, 16);
  dp_across.layout.micro_batch = 8;
  EXPECT_GT(time(across, dp_across), time(without_sms(across), dp_across));
  const Scenario one_node = make(32, 64, 1);
  Plan dp_inside = plan(1, 1, 8);
  dp_inside.layout.micro_batch = 8;
  EXPECT_EQ(time(one_node, dp_inside), time(without_sms(one_node), dp_inside));
}

// FSDP: per micro-batch, each block (4 layers, the embedding, the head) all-gathers its
// bf16 parameters before its forward and, resharded, again before its backward, and
// reduce-scatters its fp32 gradients after it, over the dp ranks; no bucketed reduction and
// no parameter all-gather after the optimizer. Kept from forward to backward: no second
// gather. Every parameter crosses once per pass and micro-batch.
TEST(Lower, FsdpGathersAndReducesEachBlockPerMicroBatch) {
  Scenario s = make(4, 16, 2);
  const double params = static_cast<double>(models::count_params(s.model).total);
  for (bool reshard : {true, false}) {
    Plan p = plan(2, 1, 8);
    p.layout.fsdp = true;
    p.layout.fsdp_reshard_after_forward = reshard;
    LoweredPlan lp = lowered(s, p);
    const int64_t m = 2;  // 16 samples over dp 8
    std::map<sim::CollectiveKind, int> count;
    std::map<sim::CollectiveKind, Bytes> bytes;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.category) != "dp_comm") continue;
      EXPECT_NE(lp.graph.label_text(task.label.name).find("fsdp"), std::string_view::npos);
      EXPECT_EQ(lp.graph.group(task.group).size(), 8u);
      ++count[task.collective];
      bytes[task.collective] += task.bytes;
    }
    const int blocks = 4 + 2;
    EXPECT_EQ(count[sim::CollectiveKind::kAllGather], blocks * m * (reshard ? 2 : 1)) << reshard;
    EXPECT_EQ(count[sim::CollectiveKind::kReduceScatter], blocks * m) << reshard;
    EXPECT_EQ(count.size(), 2u);
    // One TP rank's tasks stand for its peer: tp 2 halves what each carries (norms,
    // replicated over tp, are a rounding error).
    EXPECT_NEAR(bytes[sim::CollectiveKind::kReduceScatter].as_double() / 4 * 2 / m, params,
                0.002 * params);
    EXPECT_NEAR(bytes[sim::CollectiveKind::kAllGather].as_double() / 2 * 2 / m,
                params * (reshard ? 2 : 1), 0.002 * params);
  }
}

// PyTorch FSDP2 (Layout::fsdp_implementation torch_fsdp2): each all-gather is followed on
// the compute stream by a copy-out kernel that reads and writes the gathered bytes, and
// [final norm, output] stays gathered from its forward to its backward: one gather fewer
// per micro-batch than Megatron-FSDP's. With the root unit (torchtitan before July 2025)
// the embedding and the head gather once per micro-batch as one unit ahead of the layers,
// the last layer is kept as well, and the root reduce-scatters after every layer. Each
// reduce-scatter follows a copy-in on the compute stream that reads the unit's bf16
// gradients and writes them in the reduce dtype (fp32): 6 bytes per 4 reduced.
TEST(Lower, Fsdp2CopiesOutEachGatherAndKeepsTheHeadGathered) {
  Scenario s = make(4, 16, 2);
  Plan p = plan(2, 1, 8);
  p.layout.fsdp = true;
  auto megatron = evaluate(s, p);
  p.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
  p.layout.gradient_accumulation_fusion = false;
  const hardware::DeviceProfile& dev = s.cluster.groups()[0].profile.gpu;
  const int m = 2;  // micro-batches
  for (bool root : {false, true}) {
    p.layout.fsdp_root_unit = root;
    LoweredPlan lp = lowered(s, p);
    int gathers = 0, copies = 0, reductions = 0, copies_in = 0;
    std::map<std::string, Bytes> gathered;  // by unit: "llm L0", "root"
    std::set<TaskId> copied_in;             // rank 0's copy-ins
    std::map<TaskId, Bytes> reduced;        // the reduce-scatters, by task
    std::string last_reduced;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      const std::string name(lp.graph.label_text(task.label.name));
      const std::string unit = name.substr(0, name.rfind(" stage"));
      if (task.kind == sim::TaskKind::kCollective &&
          task.collective == sim::CollectiveKind::kAllGather && name.starts_with("fsdp")) {
        ++gathers;
        gathered[unit.substr(unit.find("params ") + 7)] = task.bytes;
      } else if (task.kind == sim::TaskKind::kCollective && name.starts_with("fsdp")) {
        ++reductions;
        last_reduced = unit.substr(unit.find("grads ") + 6);
        reduced[TaskId(t)] = task.bytes;
      } else if (name.starts_with("fsdp copy-in") &&
                 lp.graph.streams(TaskId(t))[0].rank == RankId(0)) {
        ++copies_in;
        copied_in.insert(TaskId(t));
      } else if (name.starts_with("fsdp copy-out") &&
                 lp.graph.streams(TaskId(t))[0].rank == RankId(0)) {
        ++copies;
        const Bytes b = gathered.at(unit.substr(unit.find("params ") + 7));
        EXPECT_EQ(task.duration, dev.memory_kernel_time(b + b)) << name;
      }
    }
    // Blocks: the embedding, 4 layers, the head. Forward: each, or the root and the layers;
    // backward: all but the head, or the layers but the last.
    EXPECT_EQ(gathers, m * (root ? 5 + 3 : 6 + 5)) << root;
    EXPECT_EQ(copies, gathers) << root;
    EXPECT_EQ(reductions, m * (root ? 5 : 6)) << root;
    EXPECT_EQ(copies_in, reductions) << root;
    int followed = 0;  // reduce-scatters that wait for a copy-in of 1.5x their bytes
    for (const auto& [before, after] : lp.graph.dependencies()) {
      if (!copied_in.contains(before) || !reduced.contains(after)) continue;
      const Bytes rs = reduced.at(after);
      EXPECT_EQ(lp.graph.task(before).duration,
                dev.memory_kernel_time(Bytes(rs.count() / 4 * (2 + 4))));
      ++followed;
    }
    EXPECT_EQ(followed, reductions) << root;
    if (root) {
      EXPECT_EQ(last_reduced, "root");
      EXPECT_EQ(gathered.count("llm pre"), 0u);
    }
    auto fsdp2 = evaluate(s, p);
    ASSERT_TRUE(megatron.is_ok() && fsdp2.is_ok());
    EXPECT_GT(fsdp2->iteration_time, megatron->iteration_time) << root;  // the copies
  }
}

// The FSDP variant fields make sense only together.
// Megatron-FSDP prefetches (megatron_fsdp.py: a unit's pre-forward hook gathers it and the
// next unit): its host issues layer k+1's gather as layer k begins, before layer k's
// dispatcher makes it wait for the expert counts, so the gather of layer k+1 runs beside
// layer k rather than after its dispatch. Each layer's compute still waits for its own
// gather only. FSDP2 issues each gather from its own unit's hook, after that wait.
TEST(Lower, MegatronFsdpIssuesTheNextLayersGatherAsALayerBegins) {
  Scenario moe = tiny_moe(4, 16, 2, 8);  // expert-DP groups across the two nodes
  for (bool fsdp2 : {false, true}) {
    SCOPED_TRACE(fsdp2 ? "torch_fsdp2" : "megatron_fsdp");
    Plan p = plan(1, 1, 16);
    p.layout.ep = 8;
    p.layout.fsdp = true;
    if (fsdp2) {
      p.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
      p.layout.gradient_accumulation_fusion = false;
    }
    LoweredPlan lp = lowered(moe, p, {.kernels = true});
    const sim::TaskGraph& g = lp.graph;
    sim::SimOptions o;
    o.record_tasks = true;
    const sim::SimResult r = run(lp, lp.network, o);
    // Rank 0's forward, per layer: its expert gather, first compute task, and the host's
    // wait for the expert counts.
    std::map<int, TaskId> gather, first, counts;
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      if (g.streams(TaskId(t))[0].rank != RankId(0)) continue;
      const std::string_view name = g.label_text(task.label.name);
      int layer = -1;
      if (std::sscanf(std::string(name).c_str(), "fsdp all_gather expert params llm L%d", &layer) ==
              1 &&
          !gather.contains(layer))
        gather[layer] = TaskId(t);
      else if (task.kind == sim::TaskKind::kCompute &&
               std::sscanf(std::string(name).c_str(), "llm L%d fwd", &layer) == 1 &&
               name.ends_with(" fwd") && !first.contains(layer))
        first[layer] = TaskId(t);
      else if (g.host_sync(TaskId(t)) &&
               std::sscanf(std::string(name).c_str(), "llm L%d fwd", &layer) == 1 &&
               !counts.contains(layer))
        counts[layer] = TaskId(t);
    }
    ASSERT_EQ(gather.size(), 4u);
    ASSERT_EQ(first.size(), 4u);
    ASSERT_EQ(counts.size(), 4u);
    std::set<std::pair<int32_t, int32_t>> deps;
    for (const auto& [before, after] : g.dependencies())
      deps.emplace(before.value(), after.value());
    for (int k = 0; k < 4; ++k) {
      // A layer's compute waits for its own gather (FSDP2: through its copy-out), never for
      // the one prefetched beside it.
      if (!fsdp2) {
        EXPECT_TRUE(deps.contains({gather[k].value(), first[k].value()})) << k;
      }
      EXPECT_GE(r.tasks[first[k].value()].start, r.tasks[gather[k].value()].end) << k;
      if (k + 1 == 4) continue;
      EXPECT_FALSE(deps.contains({gather[k + 1].value(), first[k].value()})) << k;
      // Issued (tasks are issued in id order) before layer k's compute or after its wait.
      if (fsdp2) {
        EXPECT_GT(gather[k + 1].value(), counts[k].value()) << k;
        EXPECT_GE(r.tasks[gather[k + 1].value()].start, r.tasks[counts[k].value()].end) << k;
      } else {
        EXPECT_LT(gather[k + 1].value(), first[k].value()) << k;
        EXPECT_LT(r.tasks[gather[k + 1].value()].start, r.tasks[counts[k].value()].end) << k;
      }
    }
  }
}

// nccl_ub (Megatron's --use-nccl-ub): the data-parallel buffers' collectives (FSDP's
// gathers and reduce-scatters, the distributed optimizer's reductions and gathers) come
// from registered buffers, and nothing else does; compute beside them slows by the few SMs
// those hold (the profile's registered_collective_sms), so the iteration is faster. Torch
// FSDP2 has no such buffers.
TEST(Lower, NcclUserBuffersRegisterTheDataParallelCollectivesOnly) {
  Scenario moe = tiny_moe(4, 16, 2, 8);
  for (bool fsdp : {true, false}) {
    SCOPED_TRACE(fsdp ? "fsdp" : "distributed optimizer");
    Plan p = plan(2, 1, 8);
    p.layout.sequence_parallel = true;
    p.layout.ep = 8;
    p.layout.etp = 1;
    p.layout.fsdp = fsdp;
    p.layout.distributed_optimizer = true;
    Plan ub = p;
    ub.layout.nccl_ub = true;
    ASSERT_EQ(infeasibility(moe, ub), "");
    const LoweredPlan lp = lowered(moe, ub), plain = lowered(moe, p);
    int dp = 0;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (task.kind != sim::TaskKind::kCollective) continue;
      const std::string_view name = lp.graph.label_text(task.label.name);
      const bool buffers = lp.graph.label_text(task.label.category) == "dp_comm" &&
                           name.find("tied embedding") == std::string_view::npos;
      EXPECT_EQ(task.registered, buffers) << name;
      dp += buffers;
    }
    EXPECT_GT(dp, 0);
    for (int t = 0; t < plain.graph.num_tasks(); ++t)
      EXPECT_FALSE(plain.graph.task(TaskId(t)).registered);
    auto with = evaluate(moe, ub), without = evaluate(moe, p);
    ASSERT_TRUE(with.is_ok() && without.is_ok());
    // FSDP's gathers run beside every block's compute; the distributed optimizer's
    // reductions beside the last micro-batch's backward only.
    if (fsdp) {
      EXPECT_LT(with->iteration_time, without->iteration_time);
    } else {
      EXPECT_LE(with->iteration_time, without->iteration_time);
    }
  }
  Plan fsdp2 = plan(1, 1, 16);
  fsdp2.layout.fsdp = true;
  fsdp2.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
  fsdp2.layout.gradient_accumulation_fusion = false;
  fsdp2.layout.nccl_ub = true;
  EXPECT_EQ(infeasibility(make(4, 16, 2), fsdp2),
            "nccl_ub registers Megatron's data-parallel and Megatron-FSDP buffers with NCCL; "
            "torch FSDP2 (fsdp_implementation torch_fsdp2) has none");
}

TEST(Lower, FsdpVariantsNeedFsdpAndFsdp2NeedsNoFusedAccumulation) {
  Scenario s = make(4, 16, 2);
  Plan p = plan(2, 1, 8);
  p.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
  EXPECT_EQ(infeasibility(s, p), "fsdp_implementation torch_fsdp2 needs fsdp");
  p.layout.fsdp = true;
  EXPECT_NE(infeasibility(s, p).find("gradient_accumulation_fusion with torch FSDP2"),
            std::string::npos);
  p.layout.gradient_accumulation_fusion = false;
  EXPECT_EQ(infeasibility(s, p), "");
  p.layout.fsdp_implementation = FsdpImplementation::kMegatron;
  p.layout.fsdp_root_unit = true;
  EXPECT_NE(infeasibility(s, p).find("fsdp_root_unit needs"), std::string::npos);
}

// All-gather CP: per layer and micro-batch, each CP group all-gathers K,V before the
// forward attention and again before its backward, then reduce-scatters dK,dV; no ring P2P.
// tiny: 8 kv heads of 64 over tp 2, s 2048 over cp 2: one rank's K,V chunk is
// 2 x 1024 x 4 x 64 x 2 bytes, the gathered total cp times that.
TEST(Lower, AllGatherContextParallelGathersAndReduceScatters) {
  Scenario s = make(4, 4, 2);
  Plan p = plan(2, 1, 4, Schedule::k1F1B, 1, 2);
  p.layout.cp_comm = CpComm::kAllGather;
  LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  std::map<sim::CollectiveKind, int> count;
  for (const sim::Task* task : tasks_in(lp, "cp_comm")) {
    ASSERT_EQ(task->kind, sim::TaskKind::kCollective);  // no ring P2P
    ++count[task->collective];
    EXPECT_EQ(task->bytes, Bytes(2 * 2 * 1024 * 4 * 64 * 2));
    EXPECT_EQ(lp.graph.group(task->group).size(), 2u);
  }
  const int groups = 2 * 4, layers_mbs = 4 * 1;  // tp x dp groups; 4 layers x 1 micro-batch
  EXPECT_EQ(count[sim::CollectiveKind::kAllGather], 2 * groups * layers_mbs);
  EXPECT_EQ(count[sim::CollectiveKind::kReduceScatter], groups * layers_mbs);
  // The ring instead: cp_comm P2P, no collectives.
  p.layout.cp_comm = CpComm::kP2P;
  LoweredPlan ring = lowered(s, p, {.full_ranks = true});
  EXPECT_FALSE(tasks_in(ring, "cp_comm").empty());  // its P2P steps
  for (const sim::Task* task : tasks_in(ring, "cp_comm"))
    EXPECT_NE(task->kind, sim::TaskKind::kCollective);
  // cp_comm without cp is a plan error.
  Plan one = plan(2, 2, 4);
  one.layout.cp_comm = CpComm::kAllGather;
  EXPECT_EQ(infeasibility(s, one), "cp_comm all_gather needs cp > 1");
}

// A2A CP: per layer and micro-batch each CP group all-to-alls Q, K, V before the forward
// attention and its output after, the output and its gradient before the backward and
// dQ, dK, dV after; no ring P2P. tiny: 8 query and 4 key/value heads of 64 per tp rank
// (tp 2), 1024 local tokens: Q, K, V 1024 x (8 + 2 x 4) x 64 x 2 bytes, the output half that.
TEST(Lower, A2AContextParallelExchangesHeadsForTheSequence) {
  Scenario s = make(4, 4, 2);
  Plan p = plan(2, 1, 4, Schedule::k1F1B, 1, 2);
  p.layout.cp_comm = CpComm::kA2A;
  ASSERT_EQ(infeasibility(s, p), "");
  LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  std::map<int64_t, int> by_bytes;
  for (const sim::Task* task : tasks_in(lp, "cp_comm")) {
    ASSERT_EQ(task->kind, sim::TaskKind::kCollective);  // no ring P2P
    EXPECT_EQ(task->collective, sim::CollectiveKind::kAllToAll);
    EXPECT_EQ(lp.graph.group(task->group).size(), 2u);
    ++by_bytes[task->bytes.count()];
  }
  const int64_t qkv = 1024 * 16 * 64 * 2;
  const int groups = 2 * 4, layers_mbs = 4 * 1;       // tp x dp groups; 4 layers x 1 micro-batch
  EXPECT_EQ(by_bytes[qkv], 3 * groups * layers_mbs);  // Q,K,V; output + gradient; dQ,dK,dV
  EXPECT_EQ(by_bytes[qkv / 2], groups * layers_mbs);  // the output
  EXPECT_EQ(by_bytes.size(), 2u);
  auto r = evaluate(s, p);
  ASSERT_TRUE(r.is_ok() && r->feasible);
  // Each TP rank's heads must split over cp: 4 key/value heads do not over cp 8.
  Plan wide = plan(2, 1, 1, Schedule::k1F1B, 1, 8);
  wide.layout.cp_comm = CpComm::kA2A;
  EXPECT_EQ(infeasibility(s, wide),
            "cp_comm a2a: the 8 query and 4 key/value heads per tp rank (tp 2) must each divide "
            "by cp 8");
  p.layout.flash_attention = false;
  EXPECT_NE(infeasibility(s, p).find("cp_comm a2a needs flash_attention"), std::string::npos);
}

// Hierarchical CP (a2a+p2p, cp 4 as an a2a level of 2 under a ring of 2): the all-to-alls
// of A2A CP over pairs of adjacent cp ranks, and around the attention the ring's transfers
// between ranks 2 cp positions (4 ranks) apart, its K,V chunk as large as cp 4's.
TEST(Lower, HierarchicalContextParallelRingsBetweenA2AGroups) {
  Scenario s = make(4, 4, 2);
  Plan p = plan(2, 1, 2, Schedule::k1F1B, 1, 4);
  p.layout.cp_comm = CpComm::kA2AP2P;
  p.layout.cp_a2a = 2;
  ASSERT_EQ(infeasibility(s, p), "");
  LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  std::map<int64_t, int> all_to_all;
  int p2p = 0;
  const Bytes chunk(512 * 4 * 128 * 2);  // 512 local tokens x 4 kv heads x (64 + 64) x 2 B
  for (const sim::Task* task : tasks_in(lp, "cp_comm")) {
    if (task->kind == sim::TaskKind::kP2P) {
      ++p2p;
      EXPECT_EQ(std::abs(task->dst.value() - task->src.value()) % 8, 4);
      EXPECT_TRUE(task->bytes == chunk || task->bytes == chunk * 2);  // backward: dK,dV too
      continue;
    }
    EXPECT_EQ(task->collective, sim::CollectiveKind::kAllToAll);
    EXPECT_EQ(lp.graph.group(task->group).size(), 2u);
    ++all_to_all[task->bytes.count()];
  }
  const int layers_mbs = 4 * 2;  // 4 layers x 2 micro-batches
  const int pairs = 2 * 2 * 2;   // tp x dp x (cp / cp_a2a) all-to-all groups
  const int64_t qkv = 512 * 16 * 64 * 2;
  EXPECT_EQ(all_to_all[qkv], 3 * pairs * layers_mbs);
  EXPECT_EQ(all_to_all[qkv / 2], pairs * layers_mbs);
  // Each pass: one ring step after the first, one send per cp rank of each tp x dp.
  EXPECT_EQ(p2p, 2 * 4 * 2 * 2 * layers_mbs);
  auto r = evaluate(s, p);
  ASSERT_TRUE(r.is_ok() && r->feasible);
  Plan flat = p;
  flat.layout.cp_a2a = 4;
  EXPECT_NE(infeasibility(s, flat).find("a divisor of cp 4 between 2 and cp / 2"),
            std::string::npos);
  flat.layout.cp_comm = CpComm::kP2P;
  EXPECT_EQ(infeasibility(s, flat), "cp_a2a 4 needs cp_comm a2a+p2p, not p2p");
}

// One reduction per bucket per iteration, carrying every local gradient once: 4 bytes
// each, 2 with bf16 gradients (grad_reduce_dtype).
TEST(Lower, DataParallelReducesEachBucketOnce) {
  Scenario s = make(8, 16, 2);
  for (int variant = 0; variant < 3; ++variant) {
    const bool dist = variant > 0;
    const bool bf16 = variant == 2;
    Plan p = plan(2, 2, 4);
    p.layout.distributed_optimizer = dist;
    if (bf16) p.layout.grad_reduce_dtype = GradReduceDtype::kBf16;
    LowerOptions o;
    o.bucket_params = 20'000'000;  // ~1.5 layers of 12.6M / tp 2
    o.full_ranks = true;           // every TP rank's reduction is a task
    auto lp = lower(s, p, o);
    ASSERT_TRUE(lp.is_ok());
    std::map<std::string, int> names;
    Bytes reduced;
    for (int t = 0; t < lp->graph.num_tasks(); ++t) {
      const sim::Task& task = lp->graph.task(TaskId(t));
      if (lp->graph.label_text(task.label.category) != "dp_comm") continue;
      if (task.collective == sim::CollectiveKind::kAllGather) continue;
      EXPECT_EQ(task.collective,
                dist ? sim::CollectiveKind::kReduceScatter : sim::CollectiveKind::kAllReduce);
      ++names[std::string(lp->graph.label_text(task.label.name))];
      EXPECT_EQ(lp->graph.group(task.group).size(), 4u);
      reduced += task.bytes;
    }
    for (auto& [name, n] : names) EXPECT_EQ(n, 2) << name;  // once per TP rank
    // Every parameter's gradient once over the tp x pp shards (norms, replicated over
    // tp, are a rounding error).
    EXPECT_GT(names.size(), 2u);
    const double params = static_cast<double>(models::count_params(s.model).total);
    EXPECT_NEAR(reduced.as_double() / (bf16 ? 2 : 4), params, 0.002 * params) << variant;
  }
}

// The distributed optimizer's parameter all-gather moves the weights as held: bf16 (FP8
// training casts them for each GEMM), or, with fp8_param_gather, the Linear weights in one
// byte. tiny: 8 layers of 1024 x (1024 + 2 x 512) + 1024 x 1024 + 3 x 1024 x 4096 weights.
TEST(Lower, ParameterAllGatherMovesTheWeightsAsHeld) {
  Scenario s = make(8, 16, 2);
  s.workload.precision = hardware::Precision::kFp8;
  const double params = static_cast<double>(models::count_params(s.model).total);
  const double linear = 8.0 * (1024.0 * 2048 + 1024.0 * 1024 + 3 * 1024.0 * 4096);
  for (bool fp8 : {false, true}) {
    Plan p = plan(1, 1, 16);
    p.layout.distributed_optimizer = true;
    p.layout.overlap_param_gather = false;  // every bucket's gather is simulated
    p.layout.fp8_param_gather = fp8;
    LoweredPlan lp = lowered(s, p);
    Bytes gathered;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.category) == "dp_comm" &&
          task.collective == sim::CollectiveKind::kAllGather)
        gathered += task.bytes;
    }
    EXPECT_NEAR(gathered.as_double(), 2 * params - (fp8 ? linear : 0), 1e-9 * params) << fp8;
  }
}

// With overlap_param_gather the distributed optimizer's parameter all-gathers run beside the
// first forward micro-batch (Megatron-Core's forward pre-hooks; interleaved, the schedule's
// param_sync_func): every bucket's, once per step, the whole model as held; a bucket's first
// forward waits for its all-gather. One chunk: bucket b + 1's follows bucket b's forward
// start. Interleaved: chunks 0 and 1 at the step's start (no predecessors), chunk c + 1's
// after chunk c's first forward has started.
TEST(Lower, ParameterAllGathersRunBesideTheFirstForward) {
  Scenario s = make(8, 16, 2);
  const double params = static_cast<double>(models::count_params(s.model).total);
  for (int vpp : {1, 2}) {
    Plan p = plan(1, 2, 8, vpp > 1 ? Schedule::kInterleaved : Schedule::k1F1B, vpp);
    p.layout.distributed_optimizer = true;
    LowerOptions o;
    o.bucket_params = 10'000'000;  // under one layer: a bucket per block
    o.full_ranks = true;
    auto lp = lower(s, p, o);
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    const sim::TaskGraph& g = lp->graph;
    std::vector<std::vector<TaskId>> preds(static_cast<size_t>(g.num_tasks()));
    for (auto [before, after] : g.dependencies()) preds[after.value()].push_back(before);
    Bytes gathered;
    int gathers = 0, free_starts = 0;
    std::set<std::string> free;  // "bucket <first>-<last> stage <s>" of those without predecessors
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      if (g.label_text(task.label.category) != "dp_comm" ||
          task.collective != sim::CollectiveKind::kAllGather)
        continue;
      ++gathers;
      gathered += task.bytes;
      const std::string name(g.label_text(task.label.name));
      if (preds[t].empty()) {
        ++free_starts;
        free.insert(name.substr(name.find("bucket ")));
      }
      // Some forward compute waits for it.
      bool feeds_forward = false;
      for (int u = t + 1; u < g.num_tasks() && !feeds_forward; ++u)
        for (TaskId before : preds[u])
          if (before.value() == t && g.task(TaskId(u)).kind == sim::TaskKind::kCompute &&
              g.label_text(g.task(TaskId(u)).label.category) == "fwd")
            feeds_forward = true;
      EXPECT_TRUE(feeds_forward) << g.label_text(task.label.name);
    }
    // Every parameter once, in bf16, over the 2 stages' dp groups (one task per group and
    // stage with full_ranks: 1 TP rank).
    EXPECT_NEAR(gathered.as_double(), 2 * params, 1e-9 * params) << vpp;
    EXPECT_GT(gathers, 2 * 2) << vpp;
    if (vpp == 1) {
      // Stage 0's first bucket at the start, and the one its forward's pre-hook dispatches
      // before any compute; stage 1's first waits for its pipeline receive, its second
      // follows it on the DP stream; later buckets wait for their predecessor's forward.
      EXPECT_EQ(free, (std::set<std::string>{"bucket llm pre-llm pre stage 0",
                                             "bucket llm L0-llm L0 stage 0",
                                             "bucket llm L5-llm L5 stage 1"}));
    } else {
      // Every bucket is of chunk 0 or 1: all gathered at the step's start.
      EXPECT_EQ(free_starts, gathers);
    }
  }
}

// First start (s) per (chunk, stage) of the DP bucket collectives named "<what> bucket llm
// L<layer>-... stage <s>" in an interleaved tp 1 pp 4 vpp 4 dp 4 plan with the distributed
// optimizer and a bucket per layer, one layer per virtual stage (chunk = layer / 4),
// simulated with free communication and no host.
std::map<std::pair<int, int>, double> bucket_starts(std::string_view what,
                                                    bool align_grad_reduce = true) {
  Plan p = plan(1, 4, 4, Schedule::kInterleaved, 4);
  p.layout.distributed_optimizer = true;
  p.layout.align_grad_reduce = align_grad_reduce;
  LowerOptions o;
  o.bucket_params = 10'000'000;  // under one layer: a bucket per block
  const LoweredPlan lp = lowered(make(16, 16, 2), p, o);
  struct Starts final : sim::TraceSink {
    std::string key;
    std::map<std::pair<int, int>, double> at;
    void task_started(const sim::TaskSpan& span) override {
      const std::string name(span.name);
      if (name.find(key) == std::string::npos) return;
      const int layer = std::stoi(name.substr(name.find("bucket llm L") + 12));
      const int stage = std::stoi(name.substr(name.rfind(' ') + 1));
      auto [it, fresh] = at.try_emplace({layer / 4, stage}, span.start.to_seconds());
      if (!fresh) it->second = std::min(it->second, span.start.to_seconds());
    }
    void task_finished(const sim::TaskSpan&) override {}
  } starts;
  starts.key = fmt::format("{} bucket llm L", what);
  sim::SimOptions so;
  so.host = false;
  auto r = sim::simulate(lp.graph,
                         sim::single_switch_network(lp.world, Bandwidth::GBps(1e9), Time::zero()),
                         so, &starts);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return starts.at;
}

// Interleaved, chunk c + 1's all-gathers start on every stage at once (Megatron's
// param_sync_func at virtual micro-batch k + pp_rank): stage s launches them s forwards
// before its first forward of chunk c, which the pipeline starts s forwards after stage 0's.
TEST(Lower, InterleavedParameterAllGathersAlignAcrossStages) {
  std::map<std::pair<int, int>, double> at = bucket_starts("all_gather params");
  ASSERT_EQ(at.size(), 16u);
  // Chunks 2 and 3 launch pp = 4 forwards apart; each on all four stages at about one time.
  const double apart = at[{3, 0}] - at[{2, 0}];
  EXPECT_GT(apart, 0);
  for (int c : {2, 3})
    for (int st = 1; st < 4; ++st)
      EXPECT_NEAR((at[{c, st}]), (at[{c, 0}]), 0.1 * apart) << c << " " << st;
}

// Layout::align_grad_reduce. Interleaved: stage s launches a chunk's reduce-scatters
// s backwards after the chunk's last (virtual micro-batch k - pp_rank), so every stage
// launches chunks 1 to 3 at about one time; chunk 0's are left for after the schedule.
// Unaligned: each stage's as its buckets become ready, (pp - 1 - s) backwards apart.
TEST(Lower, AlignedGradientReductionsLaunchTogether) {
  for (bool align : {true, false}) {
    std::map<std::pair<int, int>, double> at = bucket_starts("reduce_scatter grads", align);
    ASSERT_EQ(at.size(), 16u);
    const double apart = at[{2, 0}] - at[{3, 0}];  // 4 backwards
    ASSERT_GT(apart, 0);
    double spread = 0;
    for (int c : {1, 2, 3})
      for (int st = 1; st < 4; ++st) spread = std::max(spread, std::abs(at[{c, st}] - at[{c, 0}]));
    if (align) {
      EXPECT_LT(spread, 0.25 * apart);
      // Chunk 0's after each stage's last backward: stage s's s backwards before stage 0's.
      for (int st = 1; st < 4; ++st)
        EXPECT_NEAR((at[{0, st}] - at[{1, st}]), (4 - st) / 4.0 * apart, 0.1 * apart) << st;
    } else {
      EXPECT_GT(spread, 0.5 * apart);
    }
  }
}

// Layout::align_grad_reduce under 1F1B: the first stage reduces its buckets as they become
// ready in its last backward, the other stages only after the schedule (in their bubble).
TEST(Lower, AlignedGradientReductionsOf1F1BWaitForTheScheduleButOnTheFirstStage) {
  Scenario s = make(16, 16, 2);
  Plan p = plan(1, 4, 4);  // 4 ranks per stage: stage = rank / 4
  p.layout.distributed_optimizer = true;
  LowerOptions o;
  o.bucket_params = 10'000'000;  // a bucket per block
  const LoweredPlan lp = lowered(s, p, o);
  struct Times final : sim::TraceSink {
    std::map<int, double> first_reduce, last_backward;  // per stage
    void task_started(const sim::TaskSpan&) override {}
    void task_finished(const sim::TaskSpan& span) override {
      const int stage = span.stream.rank.value() / 4;
      if (span.category == "bwd")
        last_backward[stage] = std::max(last_backward[stage], span.end.to_seconds());
      if (std::string(span.name).find("reduce_scatter grads") != std::string::npos &&
          !first_reduce.contains(stage))
        first_reduce[stage] = span.start.to_seconds();
    }
  } times;
  sim::SimOptions so;
  so.host = false;
  auto r = sim::simulate(lp.graph, lp.network, so, &times);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(times.first_reduce.size(), 4u);
  EXPECT_LT(times.first_reduce[0], times.last_backward[0]);
  for (int st = 1; st < 4; ++st) EXPECT_GE(times.first_reduce[st], times.last_backward[st]) << st;
}

// make(8, 16, 2) in `precision` under tp 2 pp 2 dp 4 (4 layers and 8 ranks a stage, 4
// micro-batches) with SP as `sp` and FP8 scaled by `recipe`, every rank lowered.
LoweredPlan fp8_lowered(hardware::Precision precision, bool sp, Fp8Recipe recipe) {
  Scenario s = make(8, 16, 2);
  s.workload.precision = precision;
  Plan p = plan(2, 2, 4);
  p.layout.sequence_parallel = sp;
  p.layout.fp8_recipe = recipe;
  LowerOptions o;
  o.full_ranks = true;
  return lowered(s, p, o);
}

// FP8 delayed scaling (Transformer Engine's reduce_amax): every chunk's forward and backward
// of every micro-batch ends with a MAX all-reduce of its amaxes over the stage's tp x cp x dp
// ranks, which the next compute waits for; 3 amaxes a GEMM forward, 2 backward, 4 GEMMs a
// layer. Current scaling and BF16 run none.
TEST(Lower, DelayedScalingReducesAmaxesOverTheStage) {
  auto amax_tasks = [&](hardware::Precision precision, Fp8Recipe recipe) {
    const LoweredPlan lp = fp8_lowered(precision, true, recipe);
    const sim::TaskGraph& g = lp.graph;
    std::vector<std::vector<TaskId>> succs(static_cast<size_t>(g.num_tasks()));
    for (auto [before, after] : g.dependencies()) succs[before.value()].push_back(after);
    std::map<std::string, int> count;
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      const std::string name(g.label_text(task.label.name));
      if (g.label_text(task.label.category) != "amax_comm" || name.ends_with(" tp")) continue;
      ++count[name];
      EXPECT_EQ(task.collective, sim::CollectiveKind::kAllReduce);
      EXPECT_EQ(g.group(task.group).size(), 8u);
      EXPECT_EQ(task.bytes, Bytes(4 * 4 * 4 * (name.ends_with("fwd") ? 3 : 2))) << name;
      bool blocks_compute = false;
      for (TaskId u : succs[t]) blocks_compute |= g.task(u).kind == sim::TaskKind::kCompute;
      EXPECT_TRUE(blocks_compute) << name;
    }
    return count;
  };
  // One group task per stage and micro-batch, each way.
  EXPECT_EQ(
      amax_tasks(hardware::Precision::kFp8, Fp8Recipe::kDelayed),
      (std::map<std::string, int>{{"fp8 amax all_reduce bwd", 8}, {"fp8 amax all_reduce fwd", 8}}));
  EXPECT_TRUE(amax_tasks(hardware::Precision::kFp8, Fp8Recipe::kTensorwise).empty());
  EXPECT_TRUE(amax_tasks(hardware::Precision::kBf16, Fp8Recipe::kDelayed).empty());
}

// FP8 current scaling with SP: the tensors gathered over TP in FP8 (qkv's and fc1's inputs
// forward, proj's and fc2's output gradients backward) all-reduce their amax over the TP
// group first, so all TP ranks cast with one scale (WorkStep::amax_reduce): 4 per layer and
// micro-batch, 4 bytes each, held by the compute after them. Without SP, or under delayed
// scaling, none.
TEST(Lower, CurrentScalingReducesGatheredAmaxesOverTp) {
  auto tp_amaxes = [&](bool sp, Fp8Recipe recipe) {
    const LoweredPlan lp = fp8_lowered(hardware::Precision::kFp8, sp, recipe);
    const sim::TaskGraph& g = lp.graph;
    int n = 0;
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      if (g.label_text(task.label.name) != "fp8 amax all_reduce tp") continue;
      ++n;
      EXPECT_EQ(task.bytes, Bytes(4));
      EXPECT_EQ(g.group(task.group).size(), 2u);
    }
    return n;
  };
  // 2 stages x 4 TP groups x 4 layers x 4 micro-batches x 4.
  EXPECT_EQ(tp_amaxes(true, Fp8Recipe::kTensorwise), 512);
  EXPECT_EQ(tp_amaxes(false, Fp8Recipe::kTensorwise), 0);
  EXPECT_EQ(tp_amaxes(true, Fp8Recipe::kDelayed), 0);
}

// Layout::defer_embedding_wgrad: the last stage's output-layer wgrads of the first
// wgrad_deferral_limit micro-batches (0: all) leave their backwards and run after the
// stage's last op, each after re-gathering its saved input under SP; the work is moved,
// not changed. Megatron-Core's conditions are checked.
TEST(Lower, DeferredOutputLayerWgradsRunAtTheFlush) {
  Scenario s = make(8, 16, 2);  // tp 2 pp 2 dp 4: 4 micro-batches; stage 1 is ranks 8-15
  auto compute_of_rank8 = [&](bool defer, int limit) {
    Plan p = plan(2, 2, 4);
    p.layout.sequence_parallel = true;
    p.layout.defer_embedding_wgrad = defer;
    p.layout.wgrad_deferral_limit = limit;
    LowerOptions o;
    o.full_ranks = true;
    const LoweredPlan lp = lowered(s, p, o);
    std::vector<Time> durations;  // rank 8's compute tasks in program order
    int gathers = 0;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      const auto streams = lp.graph.streams(TaskId(t));
      const bool on8 = std::any_of(streams.begin(), streams.end(),
                                   [](const sim::StreamRef& r) { return r.rank == RankId(8); });
      if (!on8) continue;
      if (task.kind == sim::TaskKind::kCompute &&
          lp.graph.label_text(task.label.category) != "optimizer")
        durations.push_back(task.duration);
      gathers += task.kind == sim::TaskKind::kCollective &&
                 task.collective == sim::CollectiveKind::kAllGather;
    }
    return std::pair(durations, gathers);
  };
  auto total = [](const std::vector<Time>& v) {
    Time t;
    for (Time d : v) t += d;
    return t;
  };
  const auto [plain, plain_gathers] = compute_of_rank8(false, 0);
  for (int limit : {0, 2}) {
    const auto [deferred, gathers] = compute_of_rank8(true, limit);
    const size_t moved = limit == 0 ? 4 : 2;
    EXPECT_EQ(total(deferred), total(plain)) << limit;
    EXPECT_EQ(gathers, plain_gathers) << limit;  // the input re-gathers move with them
    ASSERT_EQ(deferred.size(), plain.size()) << limit;
    // The last `moved` compute tasks are the deferred wgrads, all alike; they were not last.
    const std::vector<Time> tail(deferred.end() - static_cast<ptrdiff_t>(moved), deferred.end());
    EXPECT_EQ(tail, std::vector<Time>(moved, tail.front())) << limit;
    EXPECT_NE(std::vector<Time>(plain.end() - static_cast<ptrdiff_t>(moved), plain.end()), tail)
        << limit;
  }
  // Megatron-Core's conditions: pipeline parallelism and the fused gradient accumulation.
  Plan p = plan(2, 1, 8);
  p.layout.sequence_parallel = true;
  p.layout.defer_embedding_wgrad = true;
  auto r = lower(s, p, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("defer_embedding_wgrad needs pp > 1"), std::string::npos)
      << r.status().to_string();
}

TEST(Lower, GraphsValidateAndAreDeterministic) {
  Scenario s = make(8, 32, 2);
  std::vector<Plan> plans = {
      plan(1, 1, 16), plan(8, 2, 1), plan(2, 4, 2, Schedule::kInterleaved, 2),
      plan(2, 2, 2, Schedule::kZeroBubble, 1, 2), plan(4, 2, 1, Schedule::kGpipe, 1, 2)};
  plans[1].layout.sequence_parallel = true;
  plans[3].layout.recompute = models::Recompute::kSelective;
  plans[4].layout.recompute = models::Recompute::kFull;
  plans[4].layout.distributed_optimizer = true;
  for (const Plan& p : plans) {
    LoweredPlan a = lowered(s, p), b = lowered(s, p);
    EXPECT_TRUE(a.graph.validate(a.world).is_ok());
    EXPECT_EQ(a.graph.num_tasks(), b.graph.num_tasks());
    sim::SimOptions o;
    o.collectives = collective_config(s.cluster);
    EXPECT_EQ(run(a, a.network, o).makespan, run(b, b.network, o).makespan);
  }
}

// The interleaved schedule with Megatron-Core's micro-batch groups (Layout::microbatch_group):
// 8 micro-batches per replica in groups of 3 on pp 2 run, the representatives predicting
// every rank; a group of pp is the default; a larger group holds more chunks in flight.
// Megatron-Core's bounds, and blocking transfers (not modelled with groups), are refused
// with the reason.
TEST(Lower, InterleavedMicroBatchGroupsRunAndHoldMoreInFlight) {
  const Scenario s = make(8, 16, 1);
  Plan p = plan(2, 2, 2, Schedule::kInterleaved, 2);
  p.layout.microbatch_group = 3;
  ASSERT_EQ(infeasibility(s, p), "");
  // Blocking transfers too: the first stage takes the last stage's outputs as they are sent,
  // ahead of the ops that use them (blocking_calls); else the calls would deadlock.
  for (const bool blocking : {false, true}) {
    p.layout.pp_blocking_p2p = blocking;
    const LoweredPlan lp = lowered(s, p);
    EXPECT_TRUE(lp.graph.validate(lp.world).is_ok()) << blocking;
    auto full = evaluate(s, p, {.full_ranks = true});
    auto reduced = evaluate(s, p);
    ASSERT_TRUE(full.is_ok() && reduced.is_ok()) << blocking;
    EXPECT_GT(reduced->iteration_time, Time::zero());
    // The homogeneous reduction's known residual (lower.h), as with the default groups.
    EXPECT_NEAR(full->iteration_time.to_seconds() / reduced->iteration_time.to_seconds(), 1.0, 2e-4)
        << blocking;
  }
  p.layout.pp_blocking_p2p = false;
  Plan plain = p, wide = p, same = p;
  plain.layout.microbatch_group = 0;
  wide.layout.microbatch_group = 4;
  same.layout.microbatch_group = 2;  // pp: the default
  EXPECT_EQ(evaluate(s, same)->iteration_time, evaluate(s, plain)->iteration_time);
  EXPECT_NE(evaluate(s, p)->iteration_time, evaluate(s, plain)->iteration_time);
  EXPECT_GT(estimate_memory(s, wide).per_stage[0].activations,
            estimate_memory(s, plain).per_stage[0].activations);
  Plan bad = p;
  bad.layout.microbatch_group = 1;
  EXPECT_EQ(infeasibility(s, bad), "microbatch_group 1 must be at least pp 2");
  bad.layout.microbatch_group = 9;
  EXPECT_EQ(infeasibility(s, bad), "microbatch_group 9 exceeds the 8 micro-batches per replica");
  bad.layout.microbatch_group = 7;
  EXPECT_EQ(infeasibility(s, bad),
            "microbatch_group 7: the last group's 1 micro-batches (8 % 7) must be none or at least "
            "pp 2, as Megatron-Core checks");
  bad = plan(2, 2, 2);
  bad.layout.microbatch_group = 2;
  EXPECT_EQ(infeasibility(s, bad), "microbatch_group 2 needs the interleaved schedule");
}

// Under SP each TP rank's norms see its own sequence slice, so after the DP sync their
// gradients are all-reduced over TP in one buffer before the optimizer step
// (_allreduce_layernorm_grads). tiny: two RMSNorms of 1024 per layer, the final norm on the
// last stage. Without SP they are alike on every TP rank: nothing.
TEST(Lower, SequenceParallelAllReducesTheNormsGradientsOverTp) {
  const Scenario s = make(8, 16, 1);
  auto norm_all_reduces = [](const LoweredPlan& lp) {
    std::map<int, Bytes> by_first_rank;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.name).find("layernorm grads") == std::string_view::npos)
        continue;
      EXPECT_EQ(task.collective, sim::CollectiveKind::kAllReduce);
      EXPECT_EQ(lp.graph.group(task.group).size(), 2u);
      int optimizer_after = 0;
      for (const auto& [before, after] : lp.graph.dependencies())
        optimizer_after += before == TaskId(t) &&
                           lp.graph.label_text(lp.graph.task(after).label.category) == "optimizer";
      EXPECT_EQ(optimizer_after, 2);
      by_first_rank[lp.graph.group(task.group)[0].value()] = task.bytes;
    }
    return by_first_rank;
  };
  Plan p = plan(2, 2, 2);
  p.layout.sequence_parallel = true;
  LowerOptions o;
  o.full_ranks = true;
  const std::map<int, Bytes> sp = norm_all_reduces(lowered(s, p, o));
  ASSERT_EQ(sp.size(), 4u);  // per stage its dp TP groups
  for (int dp_i = 0; dp_i < 2; ++dp_i) {
    EXPECT_EQ(sp.at(2 * dp_i), Bytes(4 * 2 * 1024 * 4));            // stage 0: 4 layers
    EXPECT_EQ(sp.at(4 + 2 * dp_i), Bytes((4 * 2 + 1) * 1024 * 4));  // stage 1: and the final norm
  }
  auto full = evaluate(s, p, {.full_ranks = true});
  auto reduced = evaluate(s, p);
  ASSERT_TRUE(full.is_ok() && reduced.is_ok());
  EXPECT_EQ(full->iteration_time, reduced->iteration_time);
  p.layout.sequence_parallel = false;
  EXPECT_TRUE(norm_all_reduces(lowered(s, p, o)).empty());
}

// Tied embeddings over a pipeline: after the DP gradient sync, each first-stage rank
// all-reduces its table's gradient (vocab / tp x hidden, fp32 main_grad) with the last-stage
// rank alike in tp, cp and dp, on a stream of its own, and both ranks' optimizer steps wait
// for it (Megatron-LM's _allreduce_word_embedding_grads). Untied, or on one stage, none.
TEST(Lower, TiedEmbeddingsAllReduceTheTablesGradientBetweenFirstAndLastStage) {
  const Scenario tied = make(8, 16, 2, "dgx-h100", "", R"(, "tied_embeddings": true)");
  const Scenario untied = make(8, 16, 2);
  auto all_reduces = [](const LoweredPlan& lp) {
    std::vector<TaskId> out;
    for (int t = 0; t < lp.graph.num_tasks(); ++t)
      if (lp.graph.label_text(lp.graph.task(TaskId(t)).label.name).find("tied embedding") !=
          std::string_view::npos)
        out.push_back(TaskId(t));
    return out;
  };
  for (const bool dist : {false, true}) {
    Plan p = plan(2, 4, 2);
    p.layout.distributed_optimizer = dist;
    LowerOptions o;
    o.full_ranks = true;
    const LoweredPlan lp = lowered(tied, p, o);
    const std::vector<TaskId> ars = all_reduces(lp);
    ASSERT_EQ(ars.size(), 4u);  // tp x dp pairs
    std::set<int> members;
    for (TaskId id : ars) {
      const sim::Task& t = lp.graph.task(id);
      EXPECT_EQ(t.kind, sim::TaskKind::kCollective);
      EXPECT_EQ(t.collective, sim::CollectiveKind::kAllReduce);
      EXPECT_EQ(t.bytes, Bytes(128 * 1024 / 2 * 4));
      const auto group = lp.graph.group(t.group);
      ASSERT_EQ(group.size(), 2u);
      EXPECT_EQ(group[1].value(), group[0].value() + 3 * 4);  // stage 0 and stage 3
      EXPECT_LT(group[0].value(), 4);
      members.insert(group[0].value());
      // Both members' optimizer steps follow it.
      int steps = 0;
      for (const auto& [before, after] : lp.graph.dependencies())
        if (before == id && lp.graph.label_text(lp.graph.task(after).label.category) == "optimizer")
          ++steps;
      EXPECT_EQ(steps, 2);
    }
    EXPECT_EQ(members.size(), 4u);
    // The representatives predict what every rank does.
    auto full = evaluate(tied, p, {.full_ranks = true});
    auto reduced = evaluate(tied, p);
    ASSERT_TRUE(full.is_ok() && reduced.is_ok());
    EXPECT_LT(reduced->tasks, full->tasks);  // copies stand for the mirrored pairs
    EXPECT_EQ(full->iteration_time, reduced->iteration_time) << dist;
    EXPECT_TRUE(lowered(tied, p).graph.validate(16).is_ok());
  }
  EXPECT_TRUE(all_reduces(lowered(untied, plan(2, 4, 2))).empty());
  EXPECT_TRUE(all_reduces(lowered(tied, plan(2, 1, 8))).empty());
}

// evaluate() with a Workspace reused across plans of different sizes (as a search thread
// does) reports exactly what it reports without one.
TEST(Lower, AReusedWorkspaceGivesTheSameMetrics) {
  Scenario s = make(8, 32, 2);
  std::vector<Plan> plans = {plan(2, 4, 2, Schedule::kInterleaved, 2), plan(1, 1, 16),
                             plan(8, 2, 1), plan(4, 2, 1, Schedule::kGpipe, 1, 2)};
  plans[2].layout.sequence_parallel = true;
  Workspace ws;
  for (int round = 0; round < 2; ++round)
    for (const Plan& p : plans) {
      auto a = evaluate(s, p);
      auto b = evaluate(s, p, {.workspace = &ws});
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      EXPECT_EQ(a->iteration_time, b->iteration_time);
      EXPECT_EQ(a->tasks, b->tasks);
      EXPECT_EQ(a->exposed_comm, b->exposed_comm);
      ASSERT_EQ(a->phases.size(), b->phases.size());
      for (size_t i = 0; i < a->phases.size(); ++i)
        EXPECT_EQ(a->phases[i].per_rank, b->phases[i].per_rank) << a->phases[i].phase;
      ASSERT_EQ(a->exposed_by_kind.size(), b->exposed_by_kind.size());
      for (size_t i = 0; i < a->exposed_by_kind.size(); ++i)
        EXPECT_EQ(a->exposed_by_kind[i].per_rank, b->exposed_by_kind[i].per_rank);
    }
}

TEST(Lower, FasterNicsNeverSlowTheIterationDown) {
  Plan p = plan(8, 2, 2);
  p.layout.sequence_parallel = true;
  Time prev = Time::max();
  for (int gbps : {25, 50, 100, 200, 400}) {
    Scenario s = make(8, 16, 4, "dgx-h100", fmt::format(R"(, "nic_gbps": {})", gbps));
    LoweredPlan lp = lowered(s, p);
    sim::SimOptions o;
    o.collectives = collective_config(s.cluster);
    Time t = run(lp, lp.network, o).makespan;
    EXPECT_LE(t, prev) << gbps;
    prev = t;
  }
}

// Pipeline traffic: every activation sent forward comes back as a gradient of equal size.
TEST(Lower, PipelineBytesAreConserved) {
  Scenario s = make(8, 8, 1);
  LoweredPlan lp = lowered(s, plan(2, 4, 1, Schedule::kInterleaved, 2), {.full_ranks = true});
  Bytes fwd, bwd;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (lp.graph.label_text(task.label.category) != "pp_comm") continue;
    const bool act = lp.graph.label_text(task.label.name).ends_with("activation");
    (act ? fwd : bwd) += task.bytes;
  }
  // 7 virtual-stage boundaries x 8 micro-batches x 2 TP ranks x s·b·h·2.
  EXPECT_EQ(fwd, Bytes(7LL * 8 * 2 * 2048 * 1024 * 2));
  EXPECT_EQ(fwd, bwd);
}

// Megatron-LM's scatter/gather transfers (pp_scatter_gather): without SP each TP rank sends
// its 1/tp piece and the receiving stage all-gathers the whole tensor over its TP group
// before the chunk's forward (backward) runs; with SP the field changes nothing.
TEST(Lower, ScatterGatherSendsPiecesAndGathersThemOverTp) {
  Scenario s = make(8, 8, 1);
  Plan p = plan(2, 4, 1, Schedule::kInterleaved, 2);
  p.layout.pp_scatter_gather = true;
  LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  const Bytes activation(2048LL * 1024 * 2);  // s·b·h in bf16
  Bytes sent, gathered;
  int gathers = 0;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (lp.graph.label_text(task.label.category) != "pp_comm") continue;
    if (task.kind == sim::TaskKind::kP2P) {
      sent += task.bytes;
      continue;
    }
    ASSERT_EQ(task.kind, sim::TaskKind::kCollective);
    EXPECT_EQ(task.collective, sim::CollectiveKind::kAllGather);
    EXPECT_EQ(task.bytes, activation);
    EXPECT_NE(lp.graph.label_text(task.label.name).find("gather"), std::string_view::npos);
    gathered += task.bytes;
    ++gathers;
  }
  // 7 boundaries x 8 micro-batches x 2 directions x 2 TP ranks, each its half.
  EXPECT_EQ(sent, Bytes(7LL * 8 * 2 * 2 * activation.count() / 2));
  // Each crossing gathered once per TP group: 7 x 8 x 2.
  EXPECT_EQ(gathers, 7 * 8 * 2);
  EXPECT_EQ(gathered, Bytes(gathers * activation.count()));

  // Under SP the pieces are the sequence slices already: same bytes, no gathers.
  p.layout.sequence_parallel = true;
  Plan q = p;
  q.layout.pp_scatter_gather = false;
  const LoweredPlan with = lowered(s, p, {.full_ranks = true});
  const LoweredPlan without = lowered(s, q, {.full_ranks = true});
  EXPECT_EQ(with.graph.num_tasks(), without.graph.num_tasks());
}

// Blocking pipeline transfers (pp_blocking_p2p, Megatron-LM's waited, synchronised P2P in
// its calls): neither end computes while a transfer runs, since the transfer waits for both
// ends' calls and each end's next op for all its call moved; without it a transfer overlaps
// both ends' compute. Over a slow switch, so each transfer is long.
TEST(Lower, BlockingPipelineTransfersStallBothEnds) {
  Scenario s = make(8, 8, 1);
  struct Overlap {
    Time sender, receiver, makespan;
  };
  auto overlap = [&](Schedule sch, int vpp, bool blocking) {
    Plan p = plan(2, 4, 1, sch, vpp);
    p.layout.pp_blocking_p2p = blocking;
    LoweredPlan lp = lowered(s, p, {.full_ranks = true});
    sim::SimOptions o;
    o.record_tasks = true;
    const sim::SimResult r =
        run(lp, sim::single_switch_network(lp.world, Bandwidth::GBps(1), Time::zero()), o);
    Overlap out;
    out.makespan = r.makespan;
    for (int x = 0; x < lp.graph.num_tasks(); ++x) {
      const sim::Task& send = lp.graph.task(TaskId(x));
      if (send.kind != sim::TaskKind::kP2P || lp.graph.label_text(send.label.category) != "pp_comm")
        continue;
      const sim::TaskTiming& tx = r.tasks[x];
      for (int t = 0; t < lp.graph.num_tasks(); ++t) {
        const sim::Task& c = lp.graph.task(TaskId(t));
        if (c.kind != sim::TaskKind::kCompute) continue;
        const RankId rank = lp.graph.streams(TaskId(t))[0].rank;
        if (rank != send.src && rank != send.dst) continue;
        const Time lo = std::max(tx.start, r.tasks[t].start), hi = std::min(tx.end, r.tasks[t].end);
        if (hi > lo) (rank == send.src ? out.sender : out.receiver) += hi - lo;
      }
    }
    return out;
  };
  for (auto [sch, vpp] : {std::pair{Schedule::k1F1B, 1}, std::pair{Schedule::kInterleaved, 2}}) {
    SCOPED_TRACE(to_string(sch));
    const Overlap blocked = overlap(sch, vpp, true), free = overlap(sch, vpp, false);
    EXPECT_EQ(blocked.sender, Time::zero());
    EXPECT_EQ(blocked.receiver, Time::zero());
    EXPECT_GT(free.sender, Time::zero());
    EXPECT_GT(free.receiver, Time::zero());
    // The iteration need not be slower: inside a node an overlapped transfer slows the
    // compute beside it (gpu.collective_overlap_slowdown), which a blocked one does not.
    EXPECT_NE(blocked.makespan, free.makespan);
  }
}

TEST(Lower, ModelFlopsCountEveryMicroBatchOnce) {
  Scenario s = make(8, 16, 1);
  LoweredPlan a = lowered(s, plan(1, 1, 8)), b = lowered(s, plan(2, 2, 2));
  EXPECT_DOUBLE_EQ(a.model_flops_per_iteration.count(), b.model_flops_per_iteration.count());
  EXPECT_EQ(a.micro_batches, 2);
  EXPECT_EQ(b.micro_batches, 8);
}

TEST(Lower, InfeasiblePlansSayWhy) {
  Scenario s = make(8, 16, 1);
  auto why = [&](Plan p) { return infeasibility(s, p); };
  EXPECT_EQ(why(plan(2, 2, 2)), "");
  EXPECT_EQ(why(plan(2, 2, 1)), "tp 2 x cp 1 x pp 2 x dp 1 = 4 GPUs, the cluster has 8");
  EXPECT_EQ(why(plan(1, 1, 8, Schedule::k1F1B, 1, 1)), "");
  Scenario two = make(8, 16, 2);
  // TP over two whole nodes passes the node rule (the heads are what stop it here).
  EXPECT_EQ(infeasibility(two, plan(16, 1, 1)), "tp 16 does not divide llm kv_heads 8");
  Scenario three = make(8, 16, 3);
  EXPECT_EQ(infeasibility(three, plan(12, 1, 2)),
            "tp 12 does not fit nodes of 8 GPUs (dgx-h100): a TP group must be part of a node "
            "or whole nodes");
  Scenario odd = make(6, 16, 1);
  EXPECT_EQ(infeasibility(odd, plan(1, 4, 2)),
            "pp 4 x vpp 1 does not divide llm layers 6 (an uneven split: first_stage_layers / "
            "last_stage_layers, or account_for_embedding / account_for_loss)");
  Plan uneven = plan(1, 4, 2);
  uneven.layout.first_stage_layers = uneven.layout.last_stage_layers = 1;
  EXPECT_EQ(infeasibility(odd, uneven), "");
  uneven.layout.first_stage_layers = 2;
  EXPECT_EQ(infeasibility(odd, uneven),
            "llm layers 6 minus first_stage_layers 2 and last_stage_layers 1 do not split evenly "
            "over the other 2 pipeline stages");
  Plan staged = plan(1, 4, 2);
  staged.layout.pipeline_layout = {1, 2, 2, 1};
  EXPECT_EQ(infeasibility(odd, staged), "");
  staged.layout.pipeline_layout = {1, 2, 2, 2};
  EXPECT_EQ(infeasibility(odd, staged), "pipeline_layout places 7 layers, the llm has 6");
  Plan sp = plan(1, 1, 8);
  sp.layout.sequence_parallel = true;
  EXPECT_EQ(why(sp), "sequence parallelism needs tp > 1");
  Plan sac = plan(2, 2, 2);
  sac.layout.recompute = models::Recompute::kSelectiveOp;
  EXPECT_EQ(why(sac),
            "recompute selective_op with tp 2 (llm) is not modelled: re-running the output "
            "projection would re-run its TP collective");
  sac.layout.tp = 1;
  sac.layout.dp = 4;
  EXPECT_EQ(why(sac), "");
  EXPECT_EQ(infeasibility(tiny_moe(8, 16, 1, 8), sac),
            "recompute selective_op with a mixture-of-experts llm is not modelled: its grouped "
            "expert matmuls fall outside the per-block mm count");
  Plan fa2 = plan(2, 2, 2);
  fa2.layout.attention_kernel = hardware::AttentionKernel::kFlash2;
  EXPECT_EQ(why(fa2), "");
  fa2.layout.flash_attention = false;
  EXPECT_EQ(why(fa2), "attention_kernel flash2 needs flash_attention");
  Plan cudnn = plan(2, 2, 2);
  cudnn.layout.attention_kernel = hardware::AttentionKernel::kCudnn;
  EXPECT_EQ(infeasibility(make(8, 16, 1, "dgx-a100-80gb"), cudnn),
            "attention_kernel cudnn: profile dgx-a100-80gb has no rates for it (gpu.attention)");
  Plan current = plan(2, 2, 2);
  current.layout.fp8_recipe = Fp8Recipe::kTensorwise;
  EXPECT_EQ(why(current), "fp8_recipe tensorwise needs workload precision fp8, not bf16");
  Plan fp16_grads = plan(2, 2, 2);
  fp16_grads.layout.grad_reduce_dtype = GradReduceDtype::kFp16;
  EXPECT_EQ(why(fp16_grads),
            "grad_reduce_dtype fp16 with workload precision bf16: a 16-bit gradient buffer has "
            "the weights' dtype (bf16)");
  fp16_grads.layout.grad_reduce_dtype = GradReduceDtype::kBf16;
  EXPECT_EQ(why(fp16_grads), "");
  Plan fp8_params = plan(2, 2, 2);
  fp8_params.layout.fp8_param_gather = true;
  EXPECT_EQ(why(fp8_params), "fp8_param_gather needs workload precision fp8, not bf16");
  EXPECT_EQ(why(plan(1, 2, 4, Schedule::kInterleaved, 1)),
            "the interleaved schedule needs vpp > 1");
  EXPECT_EQ(why(plan(1, 2, 4, Schedule::k1F1B, 2)), "vpp 2 needs the interleaved schedule");
  Scenario few = make(8, 12, 1);
  EXPECT_EQ(infeasibility(few, plan(1, 4, 2, Schedule::kInterleaved, 2)),
            "interleaved schedule: 6 micro-batches per replica not divisible by pp 4");
  EXPECT_EQ(infeasibility(few, plan(1, 1, 8)),
            "micro_batch 1 x dp 8 does not divide global_batch 12");
  Plan ep = plan(1, 1, 8);
  ep.layout.ep = 2;
  EXPECT_EQ(why(ep), "ep 2 needs a mixture-of-experts llm");
  EXPECT_EQ(why(plan(1, 1, 1, Schedule::k1F1B, 1, 8)), "");
  Scenario shortseq = make(8, 16, 1);
  shortseq.workload.seq_len = 2040;
  EXPECT_EQ(infeasibility(shortseq, plan(1, 1, 1, Schedule::k1F1B, 1, 8)),
            "seq_len 2040 not divisible by 2 x cp 8");
  EXPECT_EQ(why(plan(16, 1, 1, Schedule::k1F1B, 1, 1)).substr(0, 5), "tp 16");
  Scenario heads = make(8, 16, 1);
  EXPECT_EQ(infeasibility(heads, plan(8, 1, 1)).find("kv_heads"), std::string::npos);
  Scenario moe = tiny_moe(8, 16, 1, 6);
  Plan ep4 = plan(1, 1, 8);
  ep4.layout.ep = 4;
  EXPECT_EQ(infeasibility(moe, ep4), "ep 4 does not divide experts 6");
  Plan ep2 = plan(1, 1, 8);
  ep2.layout.ep = 2;
  ep2.layout.fsdp = true;  // experts sharded over their expert-DP group
  EXPECT_EQ(infeasibility(moe, ep2), "");
  Plan ep2tp2 = plan(2, 1, 4);
  ep2tp2.layout.ep = 2;
  EXPECT_EQ(infeasibility(moe, ep2tp2), "ep 2 with tp 2 needs sequence parallelism (sp)");
  ep2tp2.layout.sequence_parallel = true;
  EXPECT_EQ(infeasibility(moe, ep2tp2), "");
  ASSERT_FALSE(lower(s, plan(3, 1, 1)).is_ok());
}

// Uneven splits place layers as Megatron does: first / last stage counts, or the embedding
// and loss taking a layer's place.
TEST(Lower, UnevenPipelineSplitsPlaceLayers) {
  Scenario s = make(10, 8, 1);
  auto layers_on = [&](const Plan& p) {
    LoweredPlan lp = lowered(s, p, {.full_ranks = true});
    std::map<int, std::set<std::string>> per_rank;  // rank -> layers it runs forward
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (task.kind != sim::TaskKind::kCompute) continue;
      const std::string_view name = lp.graph.label_text(task.label.name);
      if (name.starts_with("llm L") && name.ends_with(" fwd"))
        per_rank[lp.graph.streams(TaskId(t))[0].rank.value()].insert(std::string(name));
    }
    std::vector<int> out;
    for (auto& [rank, names] : per_rank) out.push_back(static_cast<int>(names.size()));
    return out;
  };
  Plan p = plan(2, 4, 1);
  p.layout.first_stage_layers = 1;
  p.layout.last_stage_layers = 3;
  EXPECT_EQ(layers_on(p), (std::vector<int>{1, 1, 3, 3, 3, 3, 3, 3}));
  Plan acc = plan(2, 4, 1);
  acc.layout.account_for_embedding = acc.layout.account_for_loss = true;
  EXPECT_EQ(layers_on(acc), (std::vector<int>{2, 2, 3, 3, 3, 3, 2, 2}));
}

// FSDP on a mixture-of-experts model: each block gathers and reduces its dense parameters
// over the dp ranks and, with ep > 1, its experts over their expert-DP group (dp / ep
// ranks); with ep = 1 the experts go with the dense parameters. Either way every local
// parameter crosses once per pass and micro-batch.
TEST(Lower, FsdpShardsExpertsOverTheirExpertDataParallelGroup) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  const models::ParamCounts pc = models::count_params(moe.model);
  for (int ep : {1, 2, 8}) {
    Plan p = plan(1, 1, 8);
    p.layout.ep = ep;
    p.layout.fsdp = true;
    p.layout.fsdp_reshard_after_forward = false;  // one gather per block and micro-batch
    LoweredPlan lp = lowered(moe, p, {.full_ranks = true});
    std::map<size_t, Bytes> gathered;  // by group size, over every rank's tasks
    Bytes reduced;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.category) != "dp_comm") continue;
      const size_t size = lp.graph.group(task.group).size();
      const bool expert =
          lp.graph.label_text(task.label.name).find("expert") != std::string_view::npos;
      EXPECT_EQ(size, expert ? 8u / ep : 8u) << ep;
      if (task.collective == sim::CollectiveKind::kAllGather) gathered[size] += task.bytes;
      if (task.collective == sim::CollectiveKind::kReduceScatter) reduced += task.bytes;
    }
    const int64_t m = 2;  // 16 samples over dp 8
    // Once per block and micro-batch, in bf16: the dense parameters over the one group of 8;
    // over each of the ep expert-DP groups its ranks' experts (8 / ep of the 8), so all the
    // experts once over the ep groups together.
    const double experts = static_cast<double>(pc.total - pc.active) * 8 / 6;  // 6 inactive
    const double dense = static_cast<double>(pc.total) - experts;
    EXPECT_NEAR(gathered[8].as_double() / 2 / m, ep == 1 ? dense + experts : dense, 0.002 * dense)
        << ep;
    if (ep == 2) {
      EXPECT_NEAR(gathered[4].as_double() / 2 / m, experts, 0.002 * experts);
    }
    if (ep == 8) {
      EXPECT_EQ(gathered.count(1), 0u);  // expert-DP groups of one: no shards
    }
    // fp32 gradients: twice the gathered bytes, everything sharded reduced once per micro-batch.
    Bytes all;
    for (const auto& [size, b] : gathered) all += b;
    EXPECT_EQ(reduced, all * 2) << ep;
  }
}

// The host (SystemProfile::host_op; dgx-h100: 13.48 us per call): every compute task of a
// homogeneous plan costs its host one issue per host call of its kernels (Kernel::launches:
// a grouped linear's GEMM one per local expert), every collective one; under
// EP the dropless dispatcher's host waits for the expert counts' all-gather (after the
// router) before each forward dispatch (once per layer and micro-batch), never in the
// backward; without EP it has no all-to-all to size and never waits here.
TEST(Lower, TheHostIssuesEveryKernelAndWaitsForTheRouterBeforeADroplessDispatch) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  const Time op = moe.cluster.groups()[0].profile.host_op;
  ASSERT_EQ(op, Time::us(13.48));
  for (int ep : {1, 8}) {
    Plan p = plan(1, 1, 8);
    p.layout.ep = ep;
    LoweredPlan lp = lowered(moe, p, {.kernels = true});
    const sim::TaskGraph& g = lp.graph;
    ASSERT_TRUE(g.has_host());
    int syncs = 0;
    for (int t = 0; t < g.num_tasks(); ++t) {
      const sim::Task& task = g.task(TaskId(t));
      ASSERT_TRUE(g.host_issued(TaskId(t)) || task.kind == sim::TaskKind::kP2P ||
                  g.label_text(task.label.category) == "optimizer")
          << t;
      if (task.kind == sim::TaskKind::kCompute && task.kernels.valid() &&
          g.host_issued(TaskId(t))) {
        int64_t calls = 0;
        for (const sim::Kernel& k : g.kernels(task.kernels)) {
          // Each expert a launch; the rank's 8 / ep experts batched four at a time.
          EXPECT_EQ(k.launches, k.kind == sim::KernelKind::kGemm && k.batch > 1 ? k.batch : 1);
          if (k.kind == sim::KernelKind::kGemm && k.batch > 1) {
            EXPECT_EQ(k.batch, std::min(4, 8 / ep));
          }
          calls += k.launches;
        }
        EXPECT_EQ(g.host_issue(TaskId(t)), op * calls);
      }
      if (task.kind == sim::TaskKind::kCollective) {
        EXPECT_EQ(g.host_issue(TaskId(t)), op);
      }
      if (!g.host_sync(TaskId(t))) continue;
      ++syncs;
      EXPECT_EQ(task.collective, sim::CollectiveKind::kAllGather);
      EXPECT_EQ(g.label_text(task.label.category), "ep_comm");
      EXPECT_EQ(g.label_text(task.label.name).find("bwd"), std::string_view::npos);
    }
    // One representative rank: 4 layers x 2 micro-batches.
    EXPECT_EQ(syncs, ep > 1 ? 8 : 0) << ep;
    const sim::SimResult r = run(lp, lp.network);
    EXPECT_EQ(r.ranks[0].host.count_ps() % op.count_ps(), 0);
    EXPECT_GT(r.ranks[0].host, op * 100);
  }
}

// The tiny model's kernels are shorter than their launch on a DGX H100's host, so a trainer
// running it is host-bound; hetpar's executor (trainer_host off) is not charged for it.
TEST(Lower, ATrainersHostSlowsSmallKernelsAndTheExecutorDoesNotPayIt) {
  Scenario s = make(4, 16, 1);
  Plan p = plan(8, 1, 1);
  EvaluateOptions trainer, executor;
  executor.trainer_host = false;
  auto with = evaluate(s, p, trainer), without = evaluate(s, p, executor);
  ASSERT_TRUE(with.is_ok() && without.is_ok());
  EXPECT_GT(with->host_busy, Time::zero());
  EXPECT_EQ(without->host_busy, Time::zero());
  EXPECT_GT(with->iteration_time, without->iteration_time * 1.05);
  // Host-bound: the iteration is at least what the host spends issuing.
  EXPECT_GE(with->iteration_time, with->host_busy);
}

// MoE parallel folding (etp 1, Megatron-Core's expert_tensor_parallel_size 1): whole
// experts on each rank's sequence slice, the EP groups of four taken from the stage's eight
// ranks in the experts' order (tp peers included), no TP gather of the routed tokens, and
// the expert gradients reduced over expert-DP pairs {e, e + 4}.
TEST(Lower, FoldedExpertsTakeTheirEpGroupsFromTp) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(2, 1, 4);
  p.layout.sequence_parallel = true;
  p.layout.ep = 4;
  p.layout.etp = 1;
  ASSERT_EQ(infeasibility(moe, p), "");
  LoweredPlan lp = lowered(moe, p, {.full_ranks = true});
  int a2a = 0, tp_comm = 0;
  std::set<std::vector<RankId>> expert_grads;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    const std::string_view cat = lp.graph.label_text(task.label.category);
    const auto& group = lp.graph.group(task.group);
    if (cat == "ep_comm") {
      EXPECT_EQ(group.size(), 4u);
      // ranks 0-3 or 4-7: both TP ranks of two dp replicas
      EXPECT_EQ(group.back().value() - group.front().value(), 3);
      if (task.bytes == Bytes(2048LL / 2 * 2 * 4)) continue;             // the probabilities' call
      if (task.collective == sim::CollectiveKind::kAllGather) continue;  // the expert counts
      ++a2a;
      EXPECT_EQ(task.bytes, Bytes(2048LL / 2 * 2 * 1024 * 2));  // tokens / tp x top_k x h
    }
    if (lp.graph.label_text(task.label.name).find("layernorm grads") != std::string_view::npos) {
      // After the DP sync: under SP the norms' and the routers' gradients, in fp32.
      EXPECT_EQ(task.bytes, Bytes((4 * (2 * 1024 + 8 * 1024) + 1024) * 4));
      continue;
    }
    if (cat == "tp_comm" && task.bytes == Bytes(2048LL * 4)) continue;  // the loss's statistics
    if (cat == "tp_comm") {
      ++tp_comm;
      EXPECT_EQ(task.bytes, Bytes(2048LL * 1024 * 2));  // the attention's, hidden states only
    }
    if (cat == "dp_comm" &&
        lp.graph.label_text(task.label.name).find("expert") != std::string_view::npos)
      expert_grads.insert(std::vector<RankId>(group.begin(), group.end()));
  }
  EXPECT_EQ(a2a, 2 * 4 * 4 * 2 * 2);  // 2 EP groups x 4 layers x 4 mb x 2 a2a x (fwd + bwd)
  EXPECT_GT(tp_comm, 0);
  ASSERT_FALSE(expert_grads.empty());
  for (const auto& g : expert_grads) {
    ASSERT_EQ(g.size(), 2u);
    EXPECT_EQ(g[1].value() - g[0].value(), 4);
  }
  EXPECT_TRUE(run(lp, lp.network).makespan > Time::zero());
  // Rules: etp 1 or tp, with a MoE model and SP; ep within the folded ranks.
  Plan bad = p;
  bad.layout.etp = 3;
  EXPECT_EQ(infeasibility(moe, bad),
            "etp 3 must be 1 or tp 2 (other expert TP widths are not modelled)");
  bad.layout.etp = 1;
  bad.layout.sequence_parallel = false;
  EXPECT_NE(infeasibility(moe, bad).find("needs sequence parallelism"), std::string::npos);
  bad.layout.sequence_parallel = true;
  bad.layout.ep = 16;
  EXPECT_NE(infeasibility(moe, bad).find("ep 16 does not divide"), std::string::npos);
  Plan dense = plan(2, 1, 4);
  dense.layout.sequence_parallel = true;
  dense.layout.etp = 1;
  EXPECT_EQ(infeasibility(make(4, 16, 1), dense), "etp 1 needs a mixture-of-experts llm");
}

TEST(Lower, MixtureOfExpertsAllToAllOverTheEpGroup) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(1, 1, 8);
  p.layout.ep = 4;
  LoweredPlan lp = lowered(moe, p, {.full_ranks = true});
  int a2a = 0, probs = 0, counts = 0;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (lp.graph.label_text(task.label.category) != "ep_comm") continue;
    EXPECT_EQ(lp.graph.group(task.group).size(), 4u);
    if (task.collective == sim::CollectiveKind::kAllGather) {  // the tokens per expert
      ++counts;
      EXPECT_EQ(task.bytes, Bytes(4 * 8 * 8));  // 4 ranks x 8 experts x int64
      EXPECT_EQ(lp.graph.label_text(task.label.name).find("bwd"), std::string_view::npos);
      continue;
    }
    EXPECT_EQ(task.collective, sim::CollectiveKind::kAllToAll);
    if (task.bytes == Bytes(2048LL * 2 * 4)) {  // the routing probabilities: one fp32 each
      ++probs;
      continue;
    }
    ++a2a;
    EXPECT_EQ(task.bytes, Bytes(2048LL * 2 * 1024 * 2));  // tokens x top_k x h x 2 bytes
  }
  // 2 EP groups x 4 layers x 2 micro-batches x (dispatch + combine) x (fwd + bwd), and the
  // dispatch's second call for the probabilities (Megatron-Core's dispatcher), both ways.
  EXPECT_EQ(a2a, 2 * 4 * 2 * 2 * 2);
  EXPECT_EQ(probs, 2 * 4 * 2 * 2);
  EXPECT_EQ(counts, 2 * 4 * 2);  // before each forward dispatch only
  EXPECT_TRUE(run(lp, lp.network).makespan > Time::zero());
}

// DeepEP (Layout::moe_dispatcher deepep) with an EP group over two nodes: each dispatch and
// combine is an NVLink all-to-all over the group's 8 GPUs of a node, moving what the plain
// all-to-all's buffer holds (tokens x top_k x h, with the routing), beside the transfers
// across nodes between the GPUs of one local index: each token once to the other node when
// one of its 2 experts is there, 1 - C(8, 2) / C(16, 2) of the time. Fewer bytes cross the
// network, so the iteration is shorter; representatives predict every rank; inside one node
// each token goes once to each rank of its experts.
TEST(Lower, DeepEpSendsEachTokenOnceToEachOtherNodeOfItsExperts) {
  Scenario moe = tiny_moe(4, 32, 2, 16);
  Plan p = plan(1, 1, 16);
  p.layout.ep = 16;
  Plan deepep = p;
  deepep.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  ASSERT_EQ(infeasibility(moe, deepep), "");
  LoweredPlan lp = lowered(moe, deepep, {.full_ranks = true});
  // tokens x top_k x h; the dispatch (forward and backward) with the routing probabilities
  const Bytes tokens(2048LL * 2 * 1024 * 2), with_probs = tokens + Bytes(2048LL * 2 * 4);
  const double share = (1.0 - 28.0 / 120.0) / 2;  // per copy, per other node
  auto rail = [&](Bytes b) { return Bytes(std::llround(b.as_double() * share * 2)); };
  int nvlink = 0, rails = 0, probs = 0;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (lp.graph.label_text(task.label.category) != "ep_comm" ||
        task.collective != sim::CollectiveKind::kAllToAll)
      continue;
    const auto& group = lp.graph.group(task.group);
    if (group.size() == 8u) {
      ++nvlink;
      probs += task.bytes == with_probs;
      EXPECT_TRUE(task.bytes == tokens || task.bytes == with_probs) << task.bytes.count();
      EXPECT_EQ(group.back().value() - group.front().value(), 7);  // one node
    } else {
      ++rails;
      ASSERT_EQ(group.size(), 2u);
      EXPECT_TRUE(task.bytes == rail(tokens) || task.bytes == rail(with_probs))
          << task.bytes.count();
      EXPECT_EQ(group[1].value() - group[0].value(), 8);  // one local index on each node
    }
  }
  // 4 layers x 2 micro-batches x (dispatch + combine) x (fwd + bwd), per node / local index.
  EXPECT_EQ(nvlink, 2 * 32);
  EXPECT_EQ(probs, 2 * 16);
  EXPECT_EQ(rails, 8 * 32);
  auto time = [&](const Plan& q, bool every_rank) {
    EvaluateOptions o;
    o.full_ranks = every_rank;
    auto m = evaluate(moe, q, o);
    EXPECT_TRUE(m.is_ok() && m->feasible);
    return m.is_ok() ? m->iteration_time : Time::zero();
  };
  const Time fast = time(deepep, false);
  EXPECT_LT(fast, time(p, false));
  EXPECT_EQ(fast, time(deepep, true));
  // Inside one node: the all-to-all, each token once to each rank of its experts: with 2 of
  // 8 experts on each of 4 ranks, 4 (1 - C(6, 2) / C(8, 2)) = 13/7 ranks for its 2 copies,
  // 13/14 of the plain all-to-all's bytes (tokens and probabilities alike), so faster. (With
  // one expert a rank, above, a token's ranks are its copies: the NVLink bytes as plain.)
  Scenario one = tiny_moe(4, 16, 1, 8);
  Plan in_node = plan(1, 1, 8);
  in_node.layout.ep = 4;
  Plan in_node_deepep = in_node;
  in_node_deepep.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  {
    const LoweredPlan in = lowered(one, in_node_deepep, {.full_ranks = true});
    const auto sent = [](int64_t b) {
      return Bytes(std::llround(static_cast<double>(b) * 13 / 14));
    };
    int a2a = 0;
    for (int t = 0; t < in.graph.num_tasks(); ++t) {
      const sim::Task& task = in.graph.task(TaskId(t));
      if (in.graph.label_text(task.label.category) != "ep_comm" ||
          task.collective != sim::CollectiveKind::kAllToAll)
        continue;
      ++a2a;
      EXPECT_TRUE(task.bytes == sent(2048LL * 2 * 1024 * 2) || task.bytes == sent(2048LL * 2 * 4))
          << task.bytes.count();
    }
    EXPECT_GT(a2a, 0);
  }
  EXPECT_LT(evaluate(one, in_node_deepep)->iteration_time, evaluate(one, in_node)->iteration_time);
  // What Megatron-Core's flex dispatcher takes, and what hetpar models of it.
  Plan dense = plan(1, 1, 16);
  dense.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  EXPECT_NE(infeasibility(make(4, 32, 2), dense).find("needs a mixture-of-experts llm with ep > 1"),
            std::string::npos);
  Plan bad = deepep;
  bad.layout.ep = 1;
  EXPECT_NE(infeasibility(moe, bad).find("ep > 1"), std::string::npos);
  bad = deepep;
  bad.layout.tp = 2;
  bad.layout.dp = 8;
  bad.layout.ep = 8;
  bad.layout.sequence_parallel = true;
  EXPECT_NE(infeasibility(moe, bad).find("expert tensor parallelism 2 is not modelled"),
            std::string::npos);
  bad = deepep;
  bad.layout.moe_capacity_factor = 1.0;
  EXPECT_NE(infeasibility(moe, bad).find("does not support --moe-pad-expert-input-to-capacity"),
            std::string::npos);
  // DeepEP's own limits: the EP sizes its configurations cover (40 is not one), and 8
  // NVLink peers per node for a group across nodes (none on nodes of 4).
  Plan forty = plan(1, 1, 40);
  forty.layout.ep = 40;
  EXPECT_EQ(infeasibility(tiny_moe(4, 40, 5, 40), forty), "");
  forty.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  EXPECT_NE(infeasibility(tiny_moe(4, 40, 5, 40), forty).find("DeepEP configures EP groups"),
            std::string::npos);
  const Scenario fours =
      make(4, 32, 4, HETPAR_SOURCE_DIR "/tests/data/executor/cpu-host-4.json", "",
           R"(, "ffn_hidden": 0, "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 2048})");
  EXPECT_EQ(infeasibility(fours, p), "");
  EXPECT_NE(infeasibility(fours, deepep).find("whole nodes of 8 GPUs"), std::string::npos);
}

// HybridEP (Layout::moe_dispatcher hybridep) takes DeepEP's routes: across two nodes the
// same NVLink all-to-alls beside the same transfers between the GPUs of one local index, the
// same bytes. It permutes inside its dispatch and combine kernels, so the graph's reorders
// run no kernels of their own and the iteration is shorter than DeepEP's. Megatron-Core
// takes it with token dropping and at any EP size; its groups across nodes take whole nodes.
TEST(Lower, HybridEpTakesDeepEpsRoutesAndPermutesInItsKernels) {
  Scenario moe = tiny_moe(4, 32, 2, 16);
  Plan deepep = plan(1, 1, 16);
  deepep.layout.ep = 16;
  deepep.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  Plan hybrid = deepep;
  hybrid.layout.moe_dispatcher = MoeDispatcher::kHybridEp;
  ASSERT_EQ(infeasibility(moe, hybrid), "");
  // The EP all-to-alls of each plan: group size and bytes, in graph order.
  auto exchanges = [&](const Plan& q) {
    const LoweredPlan lp = lowered(moe, q, {.full_ranks = true, .kernels = true});
    std::vector<std::pair<size_t, int64_t>> out;
    int64_t memory = 0;  // the memory-bound kernels' bytes
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (lp.graph.label_text(task.label.category) == "ep_comm" &&
          task.collective == sim::CollectiveKind::kAllToAll)
        out.emplace_back(lp.graph.group(task.group).size(), task.bytes.count());
      if (task.kind == sim::TaskKind::kCompute)
        for (const sim::Kernel& k : lp.graph.kernels(task.kernels))
          memory += k.kind == sim::KernelKind::kMemory ? k.bytes : 0;
    }
    return std::pair(out, memory);
  };
  const auto [d_a2a, d_bytes] = exchanges(deepep);
  const auto [h_a2a, h_bytes] = exchanges(hybrid);
  EXPECT_EQ(d_a2a, h_a2a);
  EXPECT_FALSE(h_a2a.empty());
  EXPECT_LT(h_bytes, d_bytes);  // no permute and unpermute passes of their own
  EXPECT_LT(evaluate(moe, hybrid)->iteration_time, evaluate(moe, deepep)->iteration_time);
  // Token dropping and EP sizes DeepEP does not configure; not etp > 1, nor a group that
  // leaves its node without taking whole nodes.
  Plan drop = hybrid;
  drop.layout.moe_capacity_factor = 1.0;
  EXPECT_EQ(infeasibility(moe, drop), "");
  Plan forty = plan(1, 1, 40);
  forty.layout.ep = 40;
  forty.layout.moe_dispatcher = MoeDispatcher::kHybridEp;
  EXPECT_EQ(infeasibility(tiny_moe(4, 40, 5, 40), forty), "");
  Plan bad = hybrid;
  bad.layout.tp = 2;
  bad.layout.dp = 8;
  bad.layout.ep = 8;
  bad.layout.sequence_parallel = true;
  EXPECT_NE(
      infeasibility(moe, bad).find("moe_dispatcher hybridep with expert tensor parallelism 2"),
      std::string::npos);
  const Scenario fours =
      make(4, 32, 4, HETPAR_SOURCE_DIR "/tests/data/executor/cpu-host-4.json", "",
           R"(, "ffn_hidden": 0, "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 2048})");
  EXPECT_NE(infeasibility(fours, hybrid).find("moe_dispatcher hybridep: the EP group"),
            std::string::npos);
}

// deepep_rail_share against an enumeration of every routing a token can take: each choice
// of group_topk of the contiguous groups (or all experts), then each top_k set of the chosen
// groups' experts, all equally likely; the share is the nodes reached per copy. Without
// groups it is the closed form 1 - C(E - E/N, k) / C(E, k) per node; with DeepSeek-V3's 4 of
// 8 groups on 8 nodes (a group a node) a token reaches at most 4 nodes, where ungrouped it
// would reach 5.29 on average.
double enumerated_rail_share(const models::MoeSpec& moe, int64_t nodes) {
  const int64_t g_all = moe.groups > 0 ? moe.groups : 1;
  const int64_t g_pick = moe.groups > 0 ? moe.group_topk : 1;
  const int64_t per_group = moe.experts / g_all, per_node = moe.experts / nodes;
  double reached = 0, routings = 0;
  for (uint32_t gs = 0; gs < (1u << g_all); ++gs) {
    if (std::popcount(gs) != g_pick) continue;
    std::vector<int64_t> pool;
    for (int64_t g = 0; g < g_all; ++g)
      if (gs >> g & 1)
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) pool.push_back(e);
    for (uint32_t es = 0; es < (1u << pool.size()); ++es) {
      if (std::popcount(es) != moe.top_k) continue;
      std::set<int64_t> hit;
      for (size_t i = 0; i < pool.size(); ++i)
        if (es >> i & 1) hit.insert(pool[i] / per_node);
      // A token's routings weigh equally within its group choice; group choices alike.
      const double w = 1.0 / std::tgamma(pool.size() + 1.0) * std::tgamma(moe.top_k + 1.0) *
                       std::tgamma(pool.size() - moe.top_k + 1.0);
      reached += w * static_cast<double>(hit.size());
      routings += w;
    }
  }
  return reached / routings / static_cast<double>(moe.top_k);
}

TEST(DeepEp, RailShareCountsTheNodesATokensExpertsReach) {
  models::MoeSpec moe;
  moe.experts = 16;
  moe.top_k = 2;
  EXPECT_DOUBLE_EQ(deepep_rail_share(moe, 1), 0.0);
  EXPECT_DOUBLE_EQ(deepep_rail_share(moe, 2), (1.0 - 28.0 / 120.0) / 2 * 2);
  EXPECT_NEAR(deepep_rail_share(moe, 4), enumerated_rail_share(moe, 4), 1e-12);
  // Groups a node each, two to a node, half a node each, and across node boundaries.
  struct Case {
    int64_t experts, top_k, groups, group_topk, nodes;
  };
  for (const Case& c : {Case{16, 3, 8, 3, 4}, Case{16, 2, 4, 2, 4}, Case{16, 2, 2, 1, 4},
                        Case{12, 2, 2, 1, 3}, Case{12, 3, 4, 2, 3}, Case{18, 2, 3, 2, 2}}) {
    moe.experts = c.experts;
    moe.top_k = c.top_k;
    moe.groups = c.groups;
    moe.group_topk = c.group_topk;
    EXPECT_NEAR(deepep_rail_share(moe, c.nodes), enumerated_rail_share(moe, c.nodes), 1e-12)
        << c.experts << " experts, " << c.groups << " groups, " << c.nodes << " nodes";
  }
  // DeepSeek-V3 on EP 64 (8 nodes): a chosen group is a node, reached unless all 8 experts
  // miss its 32 of the 128 the token's 4 groups hold.
  moe.experts = 256;
  moe.top_k = 8;
  moe.groups = 8;
  moe.group_topk = 4;
  double none = 1.0, ungrouped_none = 1.0;
  for (int i = 0; i < 8; ++i) {
    none *= (96.0 - i) / (128.0 - i);
    ungrouped_none *= (224.0 - i) / (256.0 - i);
  }
  const double grouped = deepep_rail_share(moe, 8);
  EXPECT_NEAR(grouped * 8, 8 * 0.5 * (1 - none), 1e-12);  // nodes a token reaches
  EXPECT_LE(grouped * 8, 4.0);
  moe.groups = moe.group_topk = 0;
  EXPECT_NEAR(deepep_rail_share(moe, 8) * 8, 8 * (1 - ungrouped_none), 1e-12);
  EXPECT_GT(deepep_rail_share(moe, 8) * 8, 5.2);
  // Over NVLink, once per rank: with one expert a rank, every copy; with two of 8 on each of
  // 4 ranks, 13/7 ranks for 2 copies; one rank, no exchange to share.
  models::MoeSpec small;
  small.experts = 16;
  small.top_k = 2;
  EXPECT_DOUBLE_EQ(deepep_nvlink_share(small, 16), 1.0);
  EXPECT_DOUBLE_EQ(deepep_nvlink_share(small, 1), 1.0);
  small.experts = 8;
  EXPECT_NEAR(deepep_nvlink_share(small, 4), 13.0 / 14, 1e-12);
}

// DeepEP's buffers (planner/deepep.h), from its size hints at hidden 1024 (2048 bytes a
// token): inside one node 10 channels x 8 peers x 256 tokens x (2048 + 4104 - 2048 bytes of
// routing per token) and the counters; over two nodes 288 tokens and the RDMA halves (140
// tokens each way per channel and node); 32 MiB of workspace. Every rank of a MoE stage
// holds one, counted with the communication buffers.
TEST(Memory, DeepEpHoldsItsBuffersOnEveryMoeRank) {
  EXPECT_EQ(deepep_buffer_bytes(8, 1024), Bytes(84051584 + (32 << 20)));
  EXPECT_EQ(deepep_buffer_bytes(16, 1024), Bytes(94558464 + 24123520 + (32 << 20)));
  EXPECT_TRUE(deepep_supports(16) && deepep_supports(160));
  EXPECT_FALSE(deepep_supports(1) || deepep_supports(12) || deepep_supports(40));
  const Scenario moe = tiny_moe(4, 32, 2, 16);
  Plan p = plan(1, 2, 8);
  p.layout.ep = 8;
  Plan deepep = p;
  deepep.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  ASSERT_EQ(infeasibility(moe, deepep), "");
  const MemoryReport a = estimate_memory(moe, p), d = estimate_memory(moe, deepep);
  ASSERT_EQ(d.per_stage.size(), 2u);
  for (size_t st = 0; st < 2; ++st) {
    EXPECT_EQ(d.per_stage[st].communication_buffers - a.per_stage[st].communication_buffers,
              deepep_buffer_bytes(8, 1024));
    EXPECT_EQ(d.per_stage[st].activations, a.per_stage[st].activations);
  }
}

// HybridEP's buffer (planner/deepep.h). 4096 tokens of hidden 2048, 16 local experts, one
// node of 8: M = 32768 tokens, 128 MiB of BF16 tokens, 16 MiB of fp32 probabilities (the
// node's 128 experts), 2 MiB of scales, a 4 MiB routing map (128 experts x 32768 tokens).
// Two nodes, 512 tokens of hidden 1024, 4 local experts: M = 8192, NVLink 8192 x (2048 +
// 128 + 32) and a 64 x 8192 map; RDMA 512 x (2048 + 256 + 32) to send, 512 x 2208 and 2 x
// 512 x 2176 to stage. Below 512 tokens the buffer holds 512. Every rank of a MoE stage
// holds one, sized by the tokens it dispatches (SP splits them over TP).
TEST(Memory, HybridEpHoldsItsBufferOnEveryMoeRank) {
  EXPECT_EQ(hybridep_buffer_bytes(4096, 2048, 16, 8, 1), Bytes(157286400));
  EXPECT_EQ(hybridep_buffer_bytes(512, 1024, 4, 8, 2), Bytes(18612224 + 4554752));
  EXPECT_EQ(hybridep_buffer_bytes(100, 2048, 16, 8, 1), hybridep_buffer_bytes(512, 2048, 16, 8, 1));
  const Scenario moe = tiny_moe(4, 32, 2, 16);
  struct Case {
    int tp, pp, dp, ep;
    int64_t tokens, nodes;
  };
  for (const Case& c :
       {Case{1, 2, 8, 8, 2048, 1}, Case{2, 2, 4, 8, 1024, 1}, Case{1, 1, 16, 16, 2048, 2}}) {
    Plan p = plan(c.tp, c.pp, c.dp);
    p.layout.ep = c.ep;
    p.layout.sequence_parallel = c.tp > 1;
    p.layout.etp = 1;
    Plan hybrid = p;
    hybrid.layout.moe_dispatcher = MoeDispatcher::kHybridEp;
    ASSERT_EQ(infeasibility(moe, hybrid), "") << c.tp << " " << c.ep;
    const MemoryReport a = estimate_memory(moe, p), h = estimate_memory(moe, hybrid);
    ASSERT_EQ(h.per_stage.size(), static_cast<size_t>(c.pp));
    for (size_t st = 0; st < h.per_stage.size(); ++st)
      EXPECT_EQ(h.per_stage[st].communication_buffers - a.per_stage[st].communication_buffers,
                hybridep_buffer_bytes(c.tokens, 1024, 16 / c.ep, 8, c.nodes))
          << c.tp << " " << c.ep << " stage " << st;
  }
}

// Whether a dense model refuses selective recompute of `modules`, MoE-only modules, for
// want of MoE layers.
bool dense_refuses(uint8_t modules) {
  Plan dense = plan(1, 1, 8);
  dense.layout.recompute = models::Recompute::kSelective;
  dense.layout.recompute_modules = modules;
  return infeasibility(make(4, 16, 1), dense).find("needs a mixture-of-experts llm") !=
         std::string::npos;
}

// recompute selective with recompute_modules layernorm, moe_act on a MoE model: fewer
// activations than no recompute or the attention core's recompute, the dropped outputs
// re-computed before their backward (a longer iteration than without recompute); a dense
// model has neither module.
TEST(Memory, RecomputeModulesKeepLessAndReRunTheNormAndActivation) {
  const Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan none = plan(1, 1, 8);
  none.layout.ep = 8;
  Plan attn = none, modules = none;
  attn.layout.recompute = models::Recompute::kSelective;
  modules.layout.recompute = models::Recompute::kSelective;
  modules.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  ASSERT_EQ(infeasibility(moe, modules), "");
  const MemoryReport a = estimate_memory(moe, none), b = estimate_memory(moe, attn),
                     c = estimate_memory(moe, modules);
  EXPECT_LT(c.per_stage[0].activations, a.per_stage[0].activations);
  EXPECT_LT(c.per_stage[0].activations, b.per_stage[0].activations);
  auto time = [&](const Plan& p) {
    LoweredPlan lp = lowered(moe, p);
    return run(lp, lp.network).makespan;
  };
  EXPECT_GT(time(modules), time(none));
  EXPECT_NE(describe_in_words(modules.layout, hardware::Precision::kBf16)
                .find("recompute selective (layernorm, moe_act)"),
            std::string::npos);
  EXPECT_TRUE(dense_refuses(models::kRecomputeMoeAct));
}

// The EP communication of a tiny_moe plan (hidden 1024, bf16): its token all-to-alls, each
// checked to carry `copies` routed copies (the probabilities' all-to-alls, 4 bytes a copy,
// left out), its other EP collectives, and whether any task makes the host wait.
struct EpComm {
  int token_all_to_alls = 0, others = 0;
  bool host_sync = false;
};
EpComm ep_comm(const LoweredPlan& lp, int64_t copies) {
  EpComm out;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    out.host_sync = out.host_sync || lp.graph.host_sync(TaskId(t));
    if (lp.graph.label_text(task.label.category) != "ep_comm") continue;
    if (task.collective != sim::CollectiveKind::kAllToAll) {
      ++out.others;
      continue;
    }
    if (task.bytes == Bytes(copies * 4)) continue;
    ++out.token_all_to_alls;
    EXPECT_EQ(task.bytes, Bytes(copies * 1024 * 2)) << t;
  }
  return out;
}

// `changed`, a MoE field set on the EP 4 plan `even` of tiny_moe(4, 16, 1, 8), is feasible;
// it has the plain plan's number of token all-to-alls, each carrying `copies` routed copies,
// and `even`'s model FLOPs (they count the routed tokens once). Returns its EP
// communication for the caller's own checks.
EpComm expect_routed_as(const Scenario& moe, const Plan& even, const Plan& changed,
                        int64_t copies) {
  EXPECT_EQ(infeasibility(moe, changed), "");
  LoweredPlan lp = lowered(moe, changed, {.full_ranks = true});
  const EpComm c = ep_comm(lp, copies);
  EXPECT_EQ(c.token_all_to_alls, 2 * 4 * 2 * 2 * 2);
  EXPECT_EQ(lp.model_flops_per_iteration,
            lowered(moe, even, {.full_ranks = true}).model_flops_per_iteration);
  return c;
}

// Token dropping padded to capacity (Layout::moe_capacity_factor): static split sizes, so
// no expert counts are gathered and the host never waits; the all-to-alls move every
// expert's capacity (2048 tokens x top 2 / 8 experts x 1.5 = 768 each, 6144 copies). Model
// FLOPs count the routed tokens, not the padding; a dense model has nothing to drop.
TEST(Lower, TokenDroppingMovesEveryExpertsCapacityWithoutAHostWait) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(1, 1, 8);
  p.layout.ep = 4;
  Plan drop = p;
  drop.layout.moe_capacity_factor = 1.5;
  const EpComm c = expect_routed_as(moe, p, drop, 6144);
  EXPECT_FALSE(c.host_sync);
  EXPECT_EQ(c.others, 0) << "no counts' all-gather";
  EXPECT_NE(infeasibility(make(4, 16, 1), drop)
                .find("moe_capacity_factor 1.5 needs a "
                      "mixture-of-experts llm"),
            std::string::npos);
}

// Dropless routing's hottest EP rank (Layout::moe_load_imbalance): every rank's all-to-alls
// carry what that rank receives, 1.5 x the 4096 copies of 2048 tokens x top 2, and its
// experts run at that load, so the iteration is slower; model FLOPs count the routed tokens
// once, and memory holds the mean load (the hottest rank moves between layers). Without EP
// there is no hotter rank; a dense model and token dropping refuse it.
TEST(Lower, LoadImbalanceTimesEveryRankAtTheHottestRanksLoad) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(1, 1, 8);
  p.layout.ep = 4;
  Plan hot = p;
  hot.layout.moe_load_imbalance = 1.5;
  expect_routed_as(moe, p, hot, 6144);
  auto with = evaluate(moe, hot), without = evaluate(moe, p);
  ASSERT_TRUE(with.is_ok() && without.is_ok());
  EXPECT_GT(with->iteration_time, without->iteration_time);
  EXPECT_EQ(with->memory.peak, without->memory.peak);

  Plan one = plan(1, 1, 8);  // ep 1: the one rank holds every expert
  Plan one_hot = one;
  one_hot.layout.moe_load_imbalance = 1.5;
  auto a = evaluate(moe, one_hot), b = evaluate(moe, one);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->iteration_time, b->iteration_time);

  EXPECT_NE(infeasibility(make(4, 16, 1), hot)
                .find("moe_load_imbalance 1.5 needs a "
                      "mixture-of-experts llm"),
            std::string::npos);
  hot.layout.moe_capacity_factor = 1.25;
  EXPECT_NE(infeasibility(moe, hot).find("moe_load_imbalance 1.5 with moe_capacity_factor 1.25"),
            std::string::npos);
}

// The "moe" recompute module (a checkpointed MoE layer, MoELayer.forward under
// tensor_parallel.checkpoint): each layer's backward sends its dispatch and combine again
// (6 token all-to-alls a layer and micro-batch instead of 4) and gathers the split sizes
// again, labelled as recompute; its compute re-runs (a longer iteration than re-running
// the norm and activation alone) and only its input stays (fewer activations).
// Megatron-Core refuses it beside the EP overlap; a dense model has no MoE layer.
// A recompute policy that re-runs more: a longer iteration, fewer activations on stage 0.
void expect_recompute_trades_time_for_memory(const Scenario& s, const Plan& more,
                                             const Plan& less) {
  auto slower = evaluate(s, more), faster = evaluate(s, less);
  ASSERT_TRUE(slower.is_ok() && faster.is_ok());
  EXPECT_GT(slower->iteration_time, faster->iteration_time);
  EXPECT_LT(estimate_memory(s, more).per_stage[0].activations,
            estimate_memory(s, less).per_stage[0].activations);
}

TEST(Lower, MoeRecomputeSendsTheLayersAllToAllsAgainAndKeepsOnlyItsInput) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(1, 1, 8);
  p.layout.ep = 4;
  p.layout.recompute = models::Recompute::kSelective;
  p.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  Plan layer = p;
  layer.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoe;
  ASSERT_EQ(infeasibility(moe, layer), "");
  LoweredPlan a = lowered(moe, p, {.full_ranks = true});
  LoweredPlan b = lowered(moe, layer, {.full_ranks = true});
  const EpComm ca = ep_comm(a, 4096), cb = ep_comm(b, 4096);
  EXPECT_EQ(ca.token_all_to_alls, 2 * 4 * 2 * 2 * 2);
  EXPECT_EQ(cb.token_all_to_alls * 2, ca.token_all_to_alls * 3);
  EXPECT_EQ(cb.others, 2 * ca.others);
  int replayed = 0;
  for (int t = 0; t < b.graph.num_tasks(); ++t) {
    const sim::Task& task = b.graph.task(TaskId(t));
    if (task.collective == sim::CollectiveKind::kAllToAll &&
        b.graph.label_text(task.label.name).find("recompute all-to-all") != std::string::npos)
      ++replayed;
  }
  EXPECT_EQ(replayed * 3, cb.token_all_to_alls + cb.token_all_to_alls / 2) << "a third of them";
  expect_recompute_trades_time_for_memory(moe, layer, p);
  EXPECT_NE(describe_in_words(layer.layout, hardware::Precision::kBf16)
                .find("recompute selective (layernorm, moe)"),
            std::string::npos);

  layer.layout.ep_comm_overlap = true;
  EXPECT_NE(infeasibility(moe, layer).find("recompute_modules moe with ep_comm_overlap"),
            std::string::npos);
  EXPECT_TRUE(dense_refuses(models::kRecomputeMoe));
}

// The first task named `label` in emission order; -1 if none.
int first_task(const LoweredPlan& lp, std::string_view label) {
  for (int t = 0; t < lp.graph.num_tasks(); ++t)
    if (lp.graph.label_text(lp.graph.task(TaskId(t)).label.name) == label) return t;
  return -1;
}

// The layers' TP collectives of one pass ("llm L3 fwd tp"), not the embedding's or the loss's.
int layer_tp(const LoweredPlan& lp, std::string_view pass = "fwd tp") {
  int n = 0;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    const std::string name(lp.graph.label_text(task.label.name));
    n += task.kind == sim::TaskKind::kCollective && name.find(" L") != std::string::npos &&
         name.ends_with(pass);
  }
  return n;
}

// A small MoE LLM (8 experts of ffn 2048, top 2) with `shared` shared experts.
Scenario with_shared_experts(int shared) {
  return make(4, 16, 1, "dgx-h100", "",
              fmt::format(R"(, "ffn_hidden": 0, "moe": {{"experts": 8, "top_k": 2, )"
                          R"("expert_ffn_hidden": 2048, "shared_experts": {}}})",
                          shared));
}

// Megatron-Core's shared experts are an MLP on the MoE layer's input: under SP their first
// linear all-gathers the sequence slices and their second reduce-scatters, two TP collectives
// a layer more in each direction (NCCL, and userbuffers' ring linears); without SP the
// layer's TP entry and exit already hold them.
TEST(Lower, SharedExpertsGatherAndReduceScatterUnderSequenceParallelism) {
  const Scenario routed = with_shared_experts(0), shared = with_shared_experts(1);
  for (const bool sp : {false, true})
    for (const bool userbuffers : {false, true}) {
      if (userbuffers && !sp) continue;
      SCOPED_TRACE(fmt::format("sp {} userbuffers {}", sp, userbuffers));
      Plan p = plan(2, 1, 4);
      // EP beside TP, and whole experts, need SP; without it the experts split over TP.
      p.layout.ep = sp ? 4 : 1;
      p.layout.etp = sp ? 1 : 0;
      p.layout.sequence_parallel = sp;
      p.layout.tp_comm_overlap = userbuffers;
      ASSERT_EQ(infeasibility(shared, p), "");
      const int without = layer_tp(lowered(routed, p, {.full_ranks = true}));
      const int with = layer_tp(lowered(shared, p, {.full_ranks = true}));
      ASSERT_GT(without, 0);
      // Per layer and micro-batch: the attention's two and, with SP, the shared experts' two
      // (forward; the backward mirrors them).
      EXPECT_EQ(with, sp ? 2 * without : without);
      // Checkpointed shared experts ("shared_experts") re-run their two with them under SP
      // (userbuffers' rings too); at TP without SP their ops re-run alone. Either way the
      // iteration is longer and the activations fewer. A model without them refuses it.
      Plan checkpointed = p;
      checkpointed.layout.recompute = models::Recompute::kSelective;
      checkpointed.layout.recompute_modules = models::kRecomputeSharedExperts;
      ASSERT_EQ(infeasibility(shared, checkpointed), "");
      EXPECT_NE(infeasibility(routed, checkpointed).find("needs a mixture-of-experts llm with"),
                std::string::npos);
      const LoweredPlan rerun = lowered(shared, checkpointed, {.full_ranks = true});
      EXPECT_EQ(2 * layer_tp(rerun, "recompute tp"), sp ? layer_tp(rerun) : 0);
      if (sp) {  // before the shared experts' exit's backward, the layer's first
        ASSERT_GE(first_task(rerun, "llm L3 bwd tp"), 0);
        EXPECT_LT(first_task(rerun, "llm L3 recompute tp"), first_task(rerun, "llm L3 bwd tp"));
      }
      Plan plain = checkpointed;
      plain.layout.recompute_modules = models::kRecomputeCoreAttn;
      expect_recompute_trades_time_for_memory(shared, checkpointed, plain);
      if (!sp || userbuffers) continue;
      // The checkpointed MoE layer ("moe") re-runs the shared experts' two with them.
      p.layout.recompute = models::Recompute::kSelective;
      p.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoe;
      ASSERT_EQ(infeasibility(shared, p), "");
      const LoweredPlan replayed = lowered(shared, p, {.full_ranks = true});
      EXPECT_EQ(2 * layer_tp(replayed, "recompute tp"), layer_tp(replayed));
      EXPECT_EQ(layer_tp(lowered(routed, p, {.full_ranks = true}), "recompute tp"), 0);
    }
}

// Compute tasks of the layers on rank 0 that start while one of its EP exchanges (category
// ep_comm) is in flight: {forward, backward}; each must be the shared experts'.
std::pair<int, int> compute_beside_all_to_alls(const LoweredPlan& lp) {
  struct Spans final : sim::TraceSink {
    std::vector<std::pair<Time, Time>> exchanges;
    std::vector<std::pair<Time, std::string>> computes;
    void task_started(const sim::TaskSpan&) override {}
    void task_finished(const sim::TaskSpan& span) override {
      if (span.stream.rank.value() != 0) return;
      if (span.category == "ep_comm") exchanges.emplace_back(span.start, span.end);
      const std::string name(span.name);
      if (span.stream.kind == sim::StreamKind::kCompute && name.find(" L") != std::string::npos)
        computes.emplace_back(span.start, name);
    }
  } spans;
  auto r = sim::simulate(lp.graph, lp.network, {}, &spans);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  std::pair<int, int> n;
  for (const auto& [start, name] : spans.computes)
    for (const auto& [from, to] : spans.exchanges)
      if (start >= from && start < to) {
        EXPECT_TRUE(name.ends_with(" shared experts")) << name;
        (name.find(" bwd") != std::string::npos ? n.second : n.first) += 1;
        break;
      }
  return n;
}

// Megatron-Core's shared-expert overlap (Layout::moe_shared_expert_overlap): the shared
// experts' first linear (with its SP all-gather) runs while the dispatch's all-to-all moves,
// their second (with its reduce-scatter) while the combine's does, and their backward beside
// the same exchanges' backward; nothing else changes but where the shared experts' first
// linear keeps its input: the same compute, the same collectives, a shorter iteration. At EP
// 1 there is nothing to hide behind. Megatron-Core
// refuses it beside the EP all-to-all overlap, and checkpoints the shared experts only when
// they are not overlapped; a model without shared experts has nothing to overlap.
TEST(Lower, SharedExpertOverlapRunsTheSharedExpertsBesideTheAllToAlls) {
  const Scenario routed = with_shared_experts(0), shared = with_shared_experts(2);
  for (const auto& [sp, userbuffers] : {std::pair{false, false}, {true, false}, {true, true}}) {
    SCOPED_TRACE(fmt::format("sp {} userbuffers {}", sp, userbuffers));
    Plan off = plan(sp ? 2 : 1, 1, sp ? 4 : 8);
    off.layout.ep = 4;
    off.layout.etp = 1;
    off.layout.sequence_parallel = sp;
    off.layout.tp_comm_overlap = userbuffers;
    Plan on = off;
    on.layout.moe_shared_expert_overlap = true;
    ASSERT_EQ(infeasibility(shared, on), "");
    const LoweredPlan a = lowered(shared, off), b = lowered(shared, on);
    EXPECT_TRUE(b.graph.validate(b.world).is_ok());
    // The same work: compute by category, the layers' TP collectives. Under userbuffers the
    // shared linears leave their rings (whole GEMMs, NCCL's collectives): less compute.
    const std::map<std::string, Time> ca = compute_time(a, 0), cb = compute_time(b, 0);
    if (!userbuffers) {
      EXPECT_EQ(cb, ca);
      EXPECT_EQ(layer_tp(b) + layer_tp(b, "fwd shared experts tp"), layer_tp(a));
      EXPECT_EQ(layer_tp(b, "fwd shared experts tp"), sp ? layer_tp(a) / 2 : 0);
    } else {
      EXPECT_LT(cb.at("fwd"), ca.at("fwd"));
      EXPECT_LT(cb.at("bwd"), ca.at("bwd"));
    }
    const auto [forward, backward] = compute_beside_all_to_alls(b);
    EXPECT_GT(forward, 0);
    EXPECT_GT(backward, 0);
    EXPECT_EQ(compute_beside_all_to_alls(a), std::make_pair(0, 0));
    const sim::SimResult ra = run(a, a.network), rb = run(b, b.network);
    EXPECT_LT(rb.makespan, ra.makespan);
    // Under SP the first linear, a Linear without parallel mode, keeps the gathered input.
    const double held = estimate_memory(shared, on).per_stage[0].activations.as_double();
    const double apart = estimate_memory(shared, off).per_stage[0].activations.as_double();
    if (sp) {
      EXPECT_GT(held, apart);
    } else {
      EXPECT_EQ(held, apart);
    }
    EXPECT_NE(describe_in_words(on.layout, hardware::Precision::kBf16)
                  .find("shared experts beside the all-to-alls"),
              std::string::npos);
  }
  // EP 1: no exchange; the same graph's time.
  Plan off = plan(1, 1, 8), on = off;
  on.layout.moe_shared_expert_overlap = true;
  EXPECT_EQ(run(lowered(shared, on), lowered(shared, on).network).makespan,
            run(lowered(shared, off), lowered(shared, off).network).makespan);
  // The whole MoE layer checkpointed and full recompute re-run it, not overlapped.
  on = plan(1, 1, 8);
  on.layout.ep = 4;
  on.layout.moe_shared_expert_overlap = true;
  using Policy = std::pair<models::Recompute, uint8_t>;
  for (const auto& [recompute, modules] :
       {Policy{models::Recompute::kSelective, models::kRecomputeLayernorm | models::kRecomputeMoe},
        Policy{models::Recompute::kFull, 0}}) {
    Plan rc = on;
    rc.layout.recompute = recompute;
    rc.layout.recompute_modules = modules;
    ASSERT_EQ(infeasibility(shared, rc), "");
    const LoweredPlan lp = lowered(shared, rc);
    EXPECT_TRUE(lp.graph.validate(lp.world).is_ok());
    EXPECT_GT(run(lp, lp.network).makespan, Time::zero());
  }
  Plan bad = on;
  bad.layout.ep_comm_overlap = true;
  EXPECT_NE(infeasibility(shared, bad).find("moe_shared_expert_overlap with ep_comm_overlap"),
            std::string::npos);
  bad = on;
  bad.layout.recompute = models::Recompute::kSelective;
  bad.layout.recompute_modules = models::kRecomputeSharedExperts;
  EXPECT_NE(infeasibility(shared, bad).find("recompute_modules shared_experts with moe_shared"),
            std::string::npos);
  EXPECT_NE(infeasibility(routed, on).find("needs a mixture-of-experts llm with shared experts"),
            std::string::npos);
}

// `p` (feasible on `s`) holds less activation memory on its first stage than without its
// recompute, and takes longer.
void expect_recompute_trades_time_for_activations(const Scenario& s, const Plan& p) {
  ASSERT_EQ(infeasibility(s, p), "");
  Plan none = p;
  none.layout.recompute = models::Recompute::kNone;
  auto with = evaluate(s, p);
  auto without = evaluate(s, none);
  ASSERT_TRUE(with.is_ok() && without.is_ok());
  EXPECT_LT(with->memory.per_stage[0].activations, without->memory.per_stage[0].activations);
  EXPECT_GT(with->iteration_time, without->iteration_time);
}

// recompute_modules mlp (Megatron-Core's recompute_mlp): a dense layer's MLP keeps only its
// input; under TP with SP its forward re-runs before its backward with its TP collectives
// (the SP all-gather and the reduce-scatter, userbuffers' ring linears too), without SP with
// its exit's all-reduce, at TP 1 as the ops' own re-runs. A MoE llm refuses it.
TEST(Lower, MlpRecomputeReplaysTheMlpWithItsTpCollectivesAndKeepsOnlyItsInput) {
  const Scenario dense = make(4, 16, 1);
  for (const auto& [sp, userbuffers] : {std::pair{true, false}, {true, true}, {false, false}}) {
    SCOPED_TRACE(fmt::format("sp {} userbuffers {}", sp, userbuffers));
    Plan attn = plan(2, 1, 4);
    attn.layout.sequence_parallel = sp;
    attn.layout.tp_comm_overlap = userbuffers;
    attn.layout.recompute = models::Recompute::kSelective;
    Plan mlp = attn;
    mlp.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
    ASSERT_EQ(infeasibility(dense, mlp), "");
    const LoweredPlan a = lowered(dense, attn, {.full_ranks = true});
    const LoweredPlan b = lowered(dense, mlp, {.full_ranks = true});
    EXPECT_EQ(layer_tp(a, "recompute tp"), 0);
    // Each layer's forward: the attention's gather and reduce-scatter, then the MLP's, and
    // the replay re-runs the MLP's two; without SP the two exits' all-reduces, the MLP's
    // sent again.
    ASSERT_GT(layer_tp(a, "fwd tp"), 0);
    EXPECT_EQ(layer_tp(b, "fwd tp"), layer_tp(a, "fwd tp"));
    EXPECT_EQ(2 * layer_tp(b, "recompute tp"), layer_tp(a, "fwd tp"));
    // The replay runs as the MLP's backward begins: before its exit's backward collective
    // (the first of the layer's backward; with SP, the output gradient's all-gather).
    if (sp) {
      ASSERT_GE(first_task(b, "llm L3 bwd tp"), 0);
      EXPECT_LT(first_task(b, "llm L3 recompute tp"), first_task(b, "llm L3 bwd tp"));
    }
    expect_recompute_trades_time_for_memory(dense, mlp, attn);
  }
  // TP 1: no collectives to re-run; the MLP's ops re-run before their backward.
  Plan attn = plan(1, 1, 8);
  attn.layout.recompute = models::Recompute::kSelective;
  Plan mlp = attn;
  mlp.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
  expect_recompute_trades_time_for_memory(dense, mlp, attn);
  EXPECT_NE(describe_in_words(mlp.layout, hardware::Precision::kBf16)
                .find("recompute selective (core_attn, mlp)"),
            std::string::npos);

  Plan moe = plan(1, 1, 8);
  moe.layout.ep = 4;
  moe.layout.recompute = models::Recompute::kSelective;
  moe.layout.recompute_modules = models::kRecomputeMlp;
  EXPECT_NE(infeasibility(tiny_moe(4, 16, 1, 8), moe).find("recompute_modules mlp needs dense"),
            std::string::npos);
  // An MoE LLM with dense layers first: they re-run their MLPs; the MoE layers do not. (Two
  // dense layers: one re-run at a time holds what one of them dropped.)
  expect_recompute_trades_time_for_activations(dense_first_moe(4, 2, 16, 1, 8), moe);
}

// "mla_up_proj" (MLASelfAttention's qkv_up_checkpoint): the attention keeps no Q, K, V and
// the up projections re-run before its backward: less memory, more time; it needs latent
// attention.
TEST(Lower, MlaUpProjRecomputeDropsTheAttentionsInputs) {
  const Scenario s = make(4, 16, 1, "dgx-h100", "",
                          R"(, "kv_heads": 16, "mla": {"q_lora_rank": 384, "kv_lora_rank": 256, )"
                          R"("qk_head_dim": 64, "rope_head_dim": 32, "v_head_dim": 64})");
  Plan p = plan(2, 1, 4);
  p.layout.sequence_parallel = true;
  p.layout.recompute = models::Recompute::kSelective;
  p.layout.recompute_modules = models::kRecomputeMlaUpProj;
  expect_recompute_trades_time_for_activations(s, p);
  EXPECT_NE(infeasibility(make(4, 16, 1), p).find("recompute_modules mla_up_proj needs"),
            std::string::npos);
}

// Sliding windows (every other layer over 256 of the 2048 tokens) shorten the iteration by
// what the windowed layers' attention saves, and nothing else moves; context parallelism
// with them runs a2a or all_gather (Transformer Engine's ring refuses a window), and saves
// there too: under all_gather a windowed layer's calls are each a chunk's 512 queries against
// the 768 keys of its window, the busiest rank's, so that rank does its share of the band
// and the rest of the windows of the two chunks.
TEST(Lower, SlidingWindowsShortenTheIterationAndRunContextParallelismA2AOrAllGather) {
  const Scenario full = make(4, 16, 1);
  const Scenario windowed =
      make(4, 16, 1, "dgx-h100", "", R"(, "sliding_window": {"size": 256, "full_every": 2})");
  const Plan p = plan(2, 2, 2);
  auto a = evaluate(full, p), b = evaluate(windowed, p);
  ASSERT_TRUE(a.is_ok() && a->feasible && b.is_ok() && b->feasible);
  EXPECT_LT(b->iteration_time, a->iteration_time);
  EXPECT_LT(b->model_flops_per_iteration, a->model_flops_per_iteration);
  EXPECT_EQ(b->memory.peak, a->memory.peak);  // flash attention keeps the same either way
  const Plan cp = plan(2, 2, 1, Schedule::k1F1B, 1, 2);
  EXPECT_TRUE(infeasibility(full, cp).empty());
  EXPECT_NE(
      infeasibility(windowed, cp).find("cp 2 with sliding_window needs cp_comm a2a or all_gather"),
      std::string::npos);
  Plan a2a = cp;
  a2a.layout.cp_comm = CpComm::kA2A;
  auto wa = evaluate(windowed, a2a), fa = evaluate(full, a2a);
  ASSERT_TRUE(wa.is_ok() && wa->feasible && fa.is_ok() && fa->feasible);
  EXPECT_LT(wa->iteration_time, fa->iteration_time);
  Plan gather = cp;
  gather.layout.cp_comm = CpComm::kAllGather;
  auto wg = evaluate(windowed, gather), fg = evaluate(full, gather);
  ASSERT_TRUE(wg.is_ok() && wg->feasible && fg.is_ok() && fg->feasible);
  EXPECT_LT(wg->iteration_time, fg->iteration_time);
  {
    const models::OpGraph g = module_graph(windowed, windowed.model.llm_index(), gather.layout);
    const hardware::DeviceProfile& dev = windowed.cluster.groups()[0].profile.gpu;
    for (const models::Op& op : g.ops) {
      if (op.kind != models::OpKind::kAttention || !op.attention->windowed()) continue;
      const PassCost c = op_cost(op, g, gather.layout, true, dev, windowed.workload.precision);
      // 2 calls of 512 x 768 under a window of 256 (every query a whole window), of the
      // band over 2048 tokens, on this TP rank's half of the heads.
      const double band = 2048.0 * 256 - 256.0 * 256 / 2;
      EXPECT_NEAR(c.forward_flops.count(), op.forward.count() / 2 * (2 * 512.0 * 256) / band,
                  1e-9 * op.forward.count());
      EXPECT_GT(c.forward_flops.count(), op.forward.count() / 4);  // above the mean rank's
      break;
    }
  }
  // Attention sinks: their parameter per head, split over TP as the heads are, and a kernel
  // that takes them (not FlashAttention), without CP.
  const Scenario sinks = make(4, 16, 1, "dgx-h100", "", R"(, "attention_sinks": true)");
  auto c = evaluate(sinks, p);
  ASSERT_TRUE(c.is_ok() && c->feasible);
  // (The sinks' 32 parameters a rank add nanoseconds to the gradient sync and the step.)
  EXPECT_NEAR(c->iteration_time.to_seconds(), a->iteration_time.to_seconds(),
              1e-6 * a->iteration_time.to_seconds());
  EXPECT_GT(c->memory.peak, a->memory.peak);
  // The kernels the executor runs take them: every attention call of the sinks model, none
  // of the plain one's.
  for (const bool with : {false, true}) {
    const LoweredPlan lp = lowered(with ? sinks : full, p, {.kernels = true});
    int attention = 0;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (!task.kernels.valid()) continue;
      for (const sim::Kernel& k : lp.graph.kernels(task.kernels)) {
        if (k.kind != sim::KernelKind::kAttentionForward &&
            k.kind != sim::KernelKind::kAttentionBackward)
          continue;
        ++attention;
        EXPECT_EQ(k.sinks, with) << sim::describe(k);
      }
    }
    EXPECT_GT(attention, 0);
  }
  EXPECT_NE(infeasibility(sinks, cp).find("cp 2 with attention_sinks needs cp_comm a2a"),
            std::string::npos);
  EXPECT_EQ(infeasibility(sinks, a2a), "");
  Plan flash = p;
  flash.layout.attention_kernel = hardware::AttentionKernel::kFlash2;
  EXPECT_NE(infeasibility(sinks, flash).find("attention_kernel flash2 with attention_sinks"),
            std::string::npos);
}

// GeGLU runs the kernels SwiGLU does, a GELU for the SiLU: fused (Megatron-Core's
// bias_geglu) or as separate ops (Megatron's glu, as Megatron-Bridge's Gemma runs it), the
// same memory-bound time either way; unfused it pays glu's extra passes as SwiGLU does.
TEST(Lower, GegluIsTimedAsSwiglu) {
  const Scenario swiglu = make(4, 16, 1);
  const Scenario geglu = make(4, 16, 1, "dgx-h100", "", R"(, "activation": "geglu")");
  std::optional<Time> fused;
  for (const bool f : {true, false}) {
    Plan p = plan(2, 1, 4);
    p.layout.fused_activation = f;
    auto a = evaluate(swiglu, p), b = evaluate(geglu, p);
    ASSERT_TRUE(a.is_ok() && a->feasible && b.is_ok() && b->feasible);
    EXPECT_NEAR(b->iteration_time.to_seconds(), a->iteration_time.to_seconds(),
                1e-9 * a->iteration_time.to_seconds());
    if (f)
      fused = b->iteration_time;
    else
      EXPECT_GT(b->iteration_time, *fused);
  }
}

// Quick GeGLU fused (gpt-oss's provider fuses it with its clamp and offset) costs what a
// fused SwiGLU does; unfused, its scale and sigmoid and each clamp and the offset are
// kernels of their own, so each adds time.
TEST(Lower, QuickGegluExtrasRunAsKernelsUnfused) {
  const Scenario swiglu = make(4, 16, 1);
  const Scenario plain = make(4, 16, 1, "dgx-h100", "", R"(, "activation": "quick_geglu")");
  const Scenario oss = make(4, 16, 1, "dgx-h100", "",
                            R"(, "activation": "quick_geglu", "activation_clamp": 7, )"
                            R"("glu_linear_offset": 1)");
  auto time = [](const Scenario& s, bool fused) {
    Plan p = plan(2, 1, 4);
    p.layout.fused_activation = fused;
    auto r = evaluate(s, p);
    EXPECT_TRUE(r.is_ok() && r->feasible);
    return r->iteration_time;
  };
  EXPECT_EQ(time(oss, true), time(swiglu, true));
  EXPECT_GT(time(plain, false), time(swiglu, false));
  EXPECT_GT(time(oss, false), time(plain, false));
}

// RoPE as Megatron-Core's unfused ops (Layout::fused_rope false) adds their kernels' time;
// YaRN that scales cos and sin runs them whatever the plan says, and costs nothing else.
TEST(Lower, UnfusedRopeAddsTimeAndScaledYarnRunsIt) {
  const Scenario plain = make(4, 16, 1);
  const Scenario yarn =
      make(4, 16, 1, "dgx-h100", "", R"(, "yarn": {"factor": 32, "original_max_positions": 4096})");
  auto time = [](const Scenario& s, bool fused) {
    Plan p = plan(2, 1, 4);
    p.layout.fused_rope = fused;
    auto r = evaluate(s, p);
    EXPECT_TRUE(r.is_ok() && r->feasible);
    return r->iteration_time;
  };
  EXPECT_GT(time(plain, false), time(plain, true));
  EXPECT_EQ(time(yarn, true), time(plain, false));
  EXPECT_EQ(time(yarn, false), time(plain, false));
}

// Megatron-Core's combined 1F1B (Layout::ep_comm_overlap): the same tasks, the
// all-to-alls on a stream of their own, a backward's tasks interleaved with the next
// micro-batch's forward on the compute stream, and the exposed all-to-all time falls.
TEST(Lower, EpCommOverlapMergesForwardWithTheBackwardBesideIt) {
  Scenario moe = tiny_moe(4, 64, 2, 16);
  Plan p = plan(1, 1, 16);
  p.layout.ep = 16;  // across both nodes: the all-to-alls cross InfiniBand
  Plan o = p;
  o.layout.ep_comm_overlap = true;
  ASSERT_EQ(infeasibility(moe, o), "");
  LoweredPlan base = lowered(moe, p, {.full_ranks = true});
  LoweredPlan over = lowered(moe, o, {.full_ranks = true});
  // The same work; the weight gradients before each backward all-to-all run as tasks of
  // their own beside it (--delay-wgrad-compute).
  EXPECT_GT(over.graph.num_tasks(), base.graph.num_tasks());
  EXPECT_EQ(compute_time(base, 0), compute_time(over, 0));
  std::set<int32_t> a2a_streams, other_streams;
  for (int t = 0; t < over.graph.num_tasks(); ++t) {
    const sim::Task& task = over.graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCollective) continue;
    // The all-to-alls; the expert counts' all-gather goes with the compute's collectives.
    const bool a2a = task.collective == sim::CollectiveKind::kAllToAll;
    (a2a ? a2a_streams : other_streams).insert(over.graph.streams(TaskId(t))[0].index);
    if (a2a) {
      EXPECT_EQ(over.graph.label_text(task.label.category), "ep_comm");
    }
  }
  ASSERT_EQ(a2a_streams.size(), 1u);
  EXPECT_EQ(other_streams.count(*a2a_streams.begin()), 0u);
  // Rank 0's compute program: the first backward's tasks are interleaved with forward tasks
  // (the next micro-batch's), where the plain 1F1B runs them back to back.
  auto interleaved_backward = [](const LoweredPlan& lp) {
    std::vector<std::string> cats;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      if (task.kind == sim::TaskKind::kCompute && lp.graph.streams(TaskId(t))[0].rank.value() == 0)
        cats.emplace_back(lp.graph.label_text(task.label.category));
    }
    const auto first_b = std::find(cats.begin(), cats.end(), "bwd");
    const auto next_f = std::find(first_b, cats.end(), "fwd");
    return std::find(next_f, cats.end(), "bwd") != cats.end() && std::distance(first_b, next_f) < 8;
  };
  EXPECT_FALSE(interleaved_backward(base));
  EXPECT_TRUE(interleaved_backward(over));
  auto eb = evaluate(moe, p, {.exposed_by_kind = true}),
       eo = evaluate(moe, o, {.exposed_by_kind = true});
  ASSERT_TRUE(eb.is_ok() && eo.is_ok());
  ASSERT_TRUE(eo->feasible) << eo->infeasible_reason;
  EXPECT_LT(eo->iteration_time, eb->iteration_time);
  Time exposed_b, exposed_o;
  for (const ExposedComm& e : eb->exposed_by_kind)
    if (e.kind == "ep_comm") exposed_b = e.per_rank;
  for (const ExposedComm& e : eo->exposed_by_kind)
    if (e.kind == "ep_comm") exposed_o = e.per_rank;
  EXPECT_LT(exposed_o.to_seconds(), 0.8 * exposed_b.to_seconds());
  // The backward frees a layer as the forward merged with it fills one.
  EXPECT_EQ(eo->memory.peak, eb->memory.peak);
}

TEST(Lower, EpCommOverlapRunsInterleavedPipelinesWithoutDeadlock) {
  Scenario moe = tiny_moe(8, 64, 2, 16);
  for (int pp : {2, 4})
    for (int vpp : {2}) {
      SCOPED_TRACE(fmt::format("pp {} vpp {}", pp, vpp));
      Plan p = plan(1, pp, 16 / pp, Schedule::kInterleaved, vpp);
      p.layout.ep = 16 / pp;
      p.layout.ep_comm_overlap = true;
      ASSERT_EQ(infeasibility(moe, p), "");
      LoweredPlan lp = lowered(moe, p, {.full_ranks = true});
      ASSERT_TRUE(lp.graph.validate(lp.world).is_ok());
      auto r = sim::simulate(lp.graph, lp.network, {});
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      Plan q = p;
      q.layout.ep_comm_overlap = false;
      auto e = evaluate(moe, q), eo = evaluate(moe, p);
      ASSERT_TRUE(e.is_ok() && eo.is_ok());
      EXPECT_LT(eo->iteration_time, e->iteration_time);
      EXPECT_GT(eo->memory.peak, e->memory.peak);  // one more chunk warmed up
    }
}

TEST(Lower, EpCommOverlapNeedsWhatMegatronCoreNeeds) {
  Scenario moe = tiny_moe(4, 16, 1, 8);
  Plan p = plan(1, 1, 8);
  p.layout.ep_comm_overlap = true;
  EXPECT_NE(infeasibility(moe, p).find("needs ep > 1"), std::string::npos);
  p.layout.ep = 4;
  EXPECT_EQ(infeasibility(moe, p), "");
  Plan pp2 = plan(1, 2, 4);
  pp2.layout.ep = 4;
  pp2.layout.ep_comm_overlap = true;
  EXPECT_NE(infeasibility(moe, pp2).find("needs the interleaved schedule, or 1f1b with pp 1"),
            std::string::npos);
  Plan gpipe = p;
  gpipe.schedule = Schedule::kGpipe;
  EXPECT_NE(infeasibility(moe, gpipe).find("not gpipe"), std::string::npos);
  Plan full = p;
  full.layout.recompute = models::Recompute::kFull;
  EXPECT_EQ(infeasibility(moe, full), "");  // the chunk's re-run (below)
  full.layout.fsdp = true;
  EXPECT_NE(infeasibility(moe, full).find("recompute full and fsdp"), std::string::npos);
}

// Full recompute beside the EP overlap (Megatron-Core's recompute_vpp_stage): each chunk's
// forward re-runs as its backward starts, all-to-alls included and exposed; the chunk's
// layers are held together (a larger working set than one layer's), and the overlap still
// hides what the merged passes exchange.
TEST(Lower, EpCommOverlapWithFullRecomputeReRunsTheWholeChunkFirst) {
  Scenario moe = tiny_moe(8, 64, 2, 16);
  Plan p = plan(1, 2, 8, Schedule::kInterleaved, 2);  // two layers per model chunk
  p.layout.ep = 8;
  p.layout.recompute = models::Recompute::kFull;
  Plan o = p;
  o.layout.ep_comm_overlap = true;
  ASSERT_EQ(infeasibility(moe, o), "");
  const LoweredPlan lp = lowered(moe, o, {.full_ranks = true});
  ASSERT_TRUE(lp.graph.validate(lp.world).is_ok());
  auto count = [&](std::string_view suffix) {
    int n = 0;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      const sim::Task& task = lp.graph.task(TaskId(t));
      n += task.collective == sim::CollectiveKind::kAllToAll &&
           lp.graph.label_text(task.label.name).ends_with(suffix);
    }
    return n;
  };
  ASSERT_GT(count("fwd all-to-all"), 0);
  EXPECT_EQ(count("recompute all-to-all"), count("fwd all-to-all"));
  // Rank 0's first backward: its chunk's two layers re-run (L0 then L1 recompute tasks)
  // before the first backward task of either.
  std::vector<std::string> order;
  for (int t = 0; t < lp.graph.num_tasks() && order.size() < 64; ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute || lp.graph.streams(TaskId(t))[0].rank.value() != 0)
      continue;
    const std::string name(lp.graph.label_text(task.label.name));
    if (name.ends_with("recompute") || name.ends_with("bwd")) order.push_back(name);
  }
  ASSERT_FALSE(order.empty());
  const auto first_bwd = std::find_if(order.begin(), order.end(),
                                      [](const std::string& n) { return n.ends_with("bwd"); });
  ASSERT_NE(first_bwd, order.end());
  std::set<std::string> replayed_before;
  for (auto it = order.begin(); it != first_bwd; ++it) replayed_before.insert(*it);
  EXPECT_EQ(replayed_before.size(), 2u) << "both layers of the chunk re-run first";
  EXPECT_GT(estimate_memory(moe, o).per_stage[0].workspace,
            estimate_memory(moe, p).per_stage[0].workspace);
  // Across both nodes (pp 1, EP 16 over InfiniBand) the overlap still pays.
  Plan wide = plan(1, 1, 16);
  wide.layout.ep = 16;
  wide.layout.recompute = models::Recompute::kFull;
  Plan wide_overlap = wide;
  wide_overlap.layout.ep_comm_overlap = true;
  auto with = evaluate(moe, wide_overlap), without = evaluate(moe, wide);
  ASSERT_TRUE(with.is_ok() && without.is_ok());
  EXPECT_LT(with->iteration_time, without->iteration_time);
}

// The all-to-all overlap beside userbuffers TP overlap (as the Megatron-Core MoE team's
// launch scripts run them): each merged op keeps its own ring collective, every linear waits
// for its own op's, and the overlap still hides all-to-all time.
TEST(Lower, EpCommOverlapRunsBesideUserbuffersTpOverlap) {
  Scenario moe = tiny_moe(4, 64, 2, 16);
  for (Schedule sched : {Schedule::k1F1B, Schedule::kInterleaved}) {
    const int pp = sched == Schedule::k1F1B ? 1 : 2;
    SCOPED_TRACE(to_string(sched));
    Plan p = plan(2, pp, 8 / pp, sched, sched == Schedule::k1F1B ? 1 : 2);
    p.layout.sequence_parallel = true;
    p.layout.ep = 16 / pp;  // folded over TP x DP: across both nodes at pp 1
    p.layout.etp = 1;
    p.layout.tp_comm_overlap = true;
    Plan o = p;
    o.layout.ep_comm_overlap = true;
    ASSERT_EQ(infeasibility(moe, o), "");
    LoweredPlan lp = lowered(moe, o, {.full_ranks = true});
    ASSERT_TRUE(lp.graph.validate(lp.world).is_ok());
    // Userbuffers' collectives (copy engines) are all there, each waited for by a task.
    std::vector<int> waited(lp.graph.num_tasks(), 0);
    int ring = 0, ring_base = 0;
    for (const auto& [before, after] : lp.graph.dependencies()) waited[before.value()] = 1;
    for (int t = 0; t < lp.graph.num_tasks(); ++t) {
      if (!lp.graph.task(TaskId(t)).copy_engine) continue;
      ++ring;
      EXPECT_TRUE(waited[t]) << t;
    }
    LoweredPlan base = lowered(moe, p, {.full_ranks = true});
    for (int t = 0; t < base.graph.num_tasks(); ++t)
      ring_base += base.graph.task(TaskId(t)).copy_engine ? 1 : 0;
    EXPECT_GT(ring, 0);
    EXPECT_EQ(ring, ring_base);
    auto e = evaluate(moe, p), eo = evaluate(moe, o);
    ASSERT_TRUE(e.is_ok() && eo.is_ok());
    ASSERT_TRUE(eo->feasible) << eo->infeasible_reason;
    EXPECT_LT(eo->iteration_time, e->iteration_time);
  }
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// An MoE LLM's dense layers (MoeSpec::dense_layers) run their own block: their forward
// computes the dense MLP's FLOPs without a router or all-to-all, the MoE layers after them
// theirs; over a pipeline the dense layers sit on the first stage.
TEST(Lower, DenseLayersRunTheirOwnBlockBeforeTheMoeLayers) {
  const Scenario s = dense_first_moe(4, 1, 8, 1, 8);
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[0].spec);
  models::ModuleInput in;
  in.seq_len = 2048;
  const models::OpGraph g = models::build_op_graph(llm, in);
  double per_layer[2] = {0, 0};  // forward model FLOPs of layer 0 (dense), layer 1 (MoE)
  for (const models::Op& op : g.ops)
    if ((op.layer == 0 || op.layer == 1) && models::is_matmul(op.kind))
      per_layer[op.layer] += op.forward.count();
  ASSERT_GT(per_layer[0], 0);
  EXPECT_NE(per_layer[0], per_layer[1]);
  Plan p = plan(1, 2, 4);
  p.layout.ep = 4;
  const LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  // Rank 0 (stage 0) holds L0 and L1, rank 4 (stage 1) L2 and L3.
  std::map<std::string, double> fwd;  // forward FLOPs of rank 0's and 4's layers
  std::set<std::string> exchanged;    // layers with an all-to-all
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    const std::string name(lp.graph.label_text(task.label.name));
    if (name.find(" all-to-all") != std::string::npos) exchanged.insert(name.substr(0, 6));
    if (task.kind != sim::TaskKind::kCompute || name.find(" fwd") == std::string::npos) continue;
    const int rank = lp.graph.streams(TaskId(t)).front().rank.value();
    if (rank != 0 && rank != 4) continue;
    if (name.starts_with("llm L")) fwd[name.substr(0, 6)] += task.flops.count();
  }
  const double batches = static_cast<double>(num_micro_batches(p.layout, 8));
  EXPECT_NEAR(fwd["llm L0"], per_layer[0] * batches, 1e-6 * per_layer[0] * batches);
  for (const char* moe : {"llm L1", "llm L2", "llm L3"}) {
    EXPECT_NEAR(fwd[moe], per_layer[1] * batches, 1e-6 * per_layer[1] * batches) << moe;
    EXPECT_TRUE(exchanged.contains(moe)) << moe;
  }
  EXPECT_FALSE(exchanged.contains("llm L0"));
  // Heavier than a MoE layer here (ffn 16384 against 2 routed experts of 2048): stage 0
  // computes more per micro-batch.
  std::map<int, Time> busy;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute) continue;
    const int rank = lp.graph.streams(TaskId(t)).front().rank.value();
    if (rank == 0 || rank == 4) busy[rank] += task.duration;
  }
  EXPECT_GT(busy[0], busy[4]);
  // With shared experts re-run as a module (recompute_modules shared_experts) under TP with
  // SP, the MoE layers replay theirs, collectives and all; the dense layer has none to.
  const Scenario shared =
      make(4, 8, 1, "dgx-h100", "",
           R"(, "ffn_hidden": 16384, "moe": {"experts": 8, "top_k": 2, )"
           R"("expert_ffn_hidden": 2048, "shared_experts": 1, "dense_layers": 1})");
  Plan q = plan(2, 2, 2);
  q.layout.sequence_parallel = true;
  q.layout.ep = 2;
  q.layout.recompute = models::Recompute::kSelective;
  q.layout.recompute_modules =
      models::kRecomputeLayernorm | models::kRecomputeMoeAct | models::kRecomputeSharedExperts;
  ASSERT_EQ(infeasibility(shared, q), "");
  const LoweredPlan lq = lowered(shared, q, {.full_ranks = true});
  std::set<std::string> replayed;  // layers whose shared experts' TP collectives re-run
  for (int t = 0; t < lq.graph.num_tasks(); ++t) {
    const std::string name(lq.graph.label_text(lq.graph.task(TaskId(t)).label.name));
    if (name.ends_with("recompute tp")) replayed.insert(name.substr(0, 6));
  }
  EXPECT_EQ(replayed, (std::set<std::string>{"llm L1", "llm L2", "llm L3"}));
  // The op graph's model FLOPs are what the plan reports.
  EXPECT_NEAR(lp.model_flops_per_iteration.count(),
              models::model_flops(g).count() * static_cast<double>(8),
              1e-9 * lp.model_flops_per_iteration.count());
}

}  // namespace
}  // namespace hetpar::planner

namespace hetpar::planner {
namespace {

// LlmSpec::mtp_layers: the multi-token-prediction depth runs after the output layer on the
// last stage (block "llm mtp"): its forward computes the depth's layer, projection and
// output head; full recompute re-runs all but the embedding lookup and the head; and the
// first and last stages all-reduce the embedding's gradient, as for a tied table.
TEST(Lower, MultiTokenPredictionRunsOnTheLastStage) {
  const Scenario s = make(4, 8, 1, "dgx-h100", "", R"(, "mtp_layers": 1)");
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[0].spec);
  models::ModuleInput in;
  in.seq_len = 2048;
  const models::OpGraph g = models::build_op_graph(llm, in);
  double mtp = 0, head = 0;  // forward model FLOPs of the depth, of its output head
  for (const models::Op& op : g.ops)
    if (op.mtp && models::is_matmul(op.kind)) {
      mtp += op.forward.count();
      if (op.name == "mtp_logits") head += op.forward.count();
    }
  ASSERT_GT(head, 0);
  Plan p = plan(2, 2, 2);
  p.layout.sequence_parallel = true;
  p.layout.recompute = models::Recompute::kFull;
  const LoweredPlan lp = lowered(s, p, {.full_ranks = true});
  const double batches = static_cast<double>(num_micro_batches(p.layout, 8));
  std::map<std::string, double> flops;  // by the label's pass, rank 0 (stage 0) and 4 (last)
  int tied = 0;
  for (int t = 0; t < lp.graph.num_tasks(); ++t) {
    const sim::Task& task = lp.graph.task(TaskId(t));
    const std::string name(lp.graph.label_text(task.label.name));
    if (name.find("tied embedding grads") != std::string::npos) ++tied;
    if (task.kind != sim::TaskKind::kCompute || !name.starts_with("llm mtp ")) continue;
    const int rank = lp.graph.streams(TaskId(t)).front().rank.value();
    flops[fmt::format("{} {}", rank, name.substr(8, name.find(' ', 8) - 8))] += task.flops.count();
  }
  EXPECT_NEAR(flops["4 fwd"], mtp / 2 * batches, 1e-6 * mtp * batches);  // tp 2
  EXPECT_NEAR(flops["4 recompute"], (mtp - head) / 2 * batches, 1e-6 * mtp * batches);
  EXPECT_EQ(flops.count("0 fwd"), 0u);
  EXPECT_GT(tied, 0);
  // The last stage holds the depth's parameters and a copy of the table.
  const Scenario plain = make(4, 8, 1);
  auto last = [&](const Scenario& sc) {
    auto m = evaluate(sc, p);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m->memory.per_stage.back().weights;
  };
  EXPECT_GT(last(s), last(plain));
}

}  // namespace
}  // namespace hetpar::planner
