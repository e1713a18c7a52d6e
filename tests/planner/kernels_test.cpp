// Kernel descriptions (sim/kernel.h, planner/kernels.h) attached by lower(): every compute
// task says what it runs, its kernels' FLOPs are the FLOPs the task was timed with, and
// attaching them changes no prediction.
#include "hetpar/planner/kernels.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {
namespace {

Scenario tiny(int gpus) {
  auto s = load_scenario(
      fmt::format("{}/tests/data/executor/tiny-vlm-{}.json", HETPAR_SOURCE_DIR, gpus));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

Layout layout(int tp, int cp, int pp, int dp) {
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = dp;
  return l;
}

// Each compute task's kernels add up to its FLOPs (GEMMs and attention; memory kernels
// carry none) and, timed one by one with kernel_time(), to its duration; every compute
// task has kernels.
void expect_kernels_match(const Scenario& s, const Plan& p) {
  LowerOptions o;
  o.full_ranks = true;
  o.kernels = true;
  auto lp = lower(s, p, o);
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  int compute = 0;
  for (int t = 0; t < lp->graph.num_tasks(); ++t) {
    const sim::Task& task = lp->graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute) continue;
    ++compute;
    ASSERT_TRUE(task.kernels.valid()) << lp->graph.label_text(task.label.name);
    // The host issues one call, at the profile's cost, per kernel launch of the task's list.
    if (lp->graph.host_issued(TaskId(t))) {
      int64_t launches = 0;
      for (const sim::Kernel& k : lp->graph.kernels(task.kernels)) launches += k.launches;
      EXPECT_EQ(lp->graph.host_calls(TaskId(t)), std::max<int64_t>(launches, 1))
          << lp->graph.label_text(task.label.name);
      EXPECT_EQ(lp->graph.host_issue(TaskId(t)), s.cluster.profile_of_gpu(0).host_op * launches)
          << lp->graph.label_text(task.label.name);
    }
    double flops = 0;
    for (const sim::Kernel& k : lp->graph.kernels(task.kernels)) flops += k.flops();
    EXPECT_NEAR(flops, task.flops.count(), 1e-9 * std::max(1.0, task.flops.count()))
        << lp->graph.label_text(task.label.name);
    Time timed;
    for (const sim::Kernel& k : lp->graph.kernels(task.kernels))
      timed += kernel_time(k, s.cluster.profile_of_gpu(0).gpu, s.workload.precision,
                           p.layout.attention_kernel);
    EXPECT_NEAR(timed.to_seconds(), task.duration.to_seconds(),
                1e-9 + 1e-9 * task.duration.to_seconds())
        << lp->graph.label_text(task.label.name);
    if (task.duration > Time::zero()) {
      EXPECT_FALSE(lp->graph.kernels(task.kernels).empty());
    }
  }
  EXPECT_GT(compute, 0);
  // The same prediction with and without kernels.
  o.kernels = false;
  auto plain = lower(s, p, o);
  ASSERT_TRUE(plain.is_ok());
  auto a = sim::simulate(lp->graph, lp->network, {}, nullptr);
  auto b = sim::simulate(plain->graph, plain->network, {}, nullptr);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->makespan, b->makespan);
}

TEST(Kernels, HomogeneousLayoutsMatchTaskFlops) {
  const Scenario s = tiny(4);
  for (Layout l : {layout(2, 1, 1, 2), layout(1, 2, 1, 2), layout(2, 2, 1, 1), layout(1, 1, 2, 2),
                   layout(4, 1, 1, 1)}) {
    Plan p;
    p.layout = l;
    SCOPED_TRACE(fmt::format("tp {} cp {} pp {} dp {}", l.tp, l.cp, l.pp, l.dp));
    expect_kernels_match(s, p);
    p.layout.recompute = models::Recompute::kSelective;
    expect_kernels_match(s, p);
    p.layout.recompute = models::Recompute::kFull;
    expect_kernels_match(s, p);
    if (l.tp == 1) {  // selective_op needs tp 1
      p.layout.recompute = models::Recompute::kSelectiveOp;
      expect_kernels_match(s, p);
    }
  }
  Plan zb;
  zb.layout = layout(1, 1, 2, 2);
  zb.schedule = Schedule::kZeroBubble;
  expect_kernels_match(s, zb);
}

// On an H100 (unmasked attention faster than masked) a causal ring's steps differ: the
// diagonal one runs the masked call, the others unmasked calls against half the arrived
// chunk, and each step's kernels still add up to its time; with selective recompute the
// re-run ring too; and the a2a and hierarchical exchanges likewise.
TEST(Kernels, ARingsMaskedAndUnmaskedStepsMatchTheirTimes) {
  auto s = parse_scenario_text(R"({"name": "ring", "model": {"name": "small",
      "modules": [{"name": "llm", "kind": "llm", "spec": {"layers": 2, "hidden": 1024,
        "ffn_hidden": 4096, "heads": 8, "kv_heads": 8, "vocab": 4096,
        "activation": "swiglu", "norm": "rmsnorm"}}]},
      "workload": {"seq_len": 8192, "global_batch": 8, "precision": "bf16"},
      "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "ring.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  for (int cp : {2, 4}) {
    Plan p;
    p.layout = layout(1, cp, 1, 8 / cp);
    SCOPED_TRACE(fmt::format("cp {}", cp));
    expect_kernels_match(*s, p);
    p.layout.recompute = models::Recompute::kSelective;
    expect_kernels_match(*s, p);
  }
  // CP over the heads: one call over the whole sequence (a2a), or the ring over the a2a
  // groups (a2a+p2p), each with its all-to-alls' layout copies; and all_gather's two calls
  // per rank, each its chunk against the keys up to it.
  for (auto [comm, inner] : {std::pair{CpComm::kA2A, 0}, std::pair{CpComm::kA2AP2P, 2},
                             std::pair{CpComm::kAllGather, 0}}) {
    Plan p;
    p.layout = layout(1, 4, 1, 2);
    p.layout.cp_comm = comm;
    p.layout.cp_a2a = inner;
    SCOPED_TRACE(to_string(comm));
    ASSERT_EQ(infeasibility(*s, p), "");
    expect_kernels_match(*s, p);
    p.layout.recompute = models::Recompute::kSelective;
    expect_kernels_match(*s, p);
  }
}

// Expert parallelism: a rank's experts run the tokens its ep group routes to them, as many
// as its own micro-batch routes (the task's FLOPs are the op's, not 1 / ep of them), and
// fully sharded data parallelism; both under the same kernel bookkeeping.
TEST(Kernels, ExpertParallelAndFsdpPlansMatchTaskFlops) {
  auto s = parse_scenario_text(R"({"model": {"name": "tiny-moe", "modules": [{"name": "llm",
      "kind": "llm", "spec": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512,
      "activation": "swiglu", "norm": "rmsnorm",
      "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256}}}]},
      "workload": {"seq_len": 64, "global_batch": 8},
      "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "moe.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan ep;
  ep.layout = layout(1, 1, 1, 8);
  ep.layout.ep = 4;
  expect_kernels_match(*s, ep);
  Plan fsdp;
  fsdp.layout = layout(1, 1, 1, 4);
  fsdp.layout.fsdp = true;
  expect_kernels_match(tiny(4), fsdp);
  fsdp.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;  // copy-out kernels
  fsdp.layout.gradient_accumulation_fusion = false;
  {  // with a host that issues every launch (the copy-out's too)
    Scenario host = tiny(4);
    std::vector<hardware::NodeGroup> groups = host.cluster.groups();
    groups[0].profile.host_op = Time::us(10);
    auto cluster = hardware::ClusterSpec::create(groups);
    ASSERT_TRUE(cluster.is_ok()) << cluster.status().to_string();
    host.cluster = *cluster;
    expect_kernels_match(host, fsdp);
  }
  for (bool root : {false, true}) {
    fsdp.layout.fsdp_root_unit = root;
    expect_kernels_match(tiny(4), fsdp);
  }
}

// Latent attention (its values narrower than its queries and keys), with its first layer
// dense and a multi-token-prediction depth, under TP with and without SP, the CP ring and
// full recompute: the same bookkeeping.
TEST(Kernels, LatentAttentionPlansMatchTaskFlops) {
  auto s = parse_scenario_text(R"({"model": {"name": "tiny-deepseek", "modules": [{"name": "llm",
      "kind": "llm", "spec": {"layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 4,
      "vocab": 512, "activation": "swiglu", "norm": "rmsnorm", "mtp_layers": 1,
      "mla": {"q_lora_rank": 96, "kv_lora_rank": 64, "qk_head_dim": 32, "rope_head_dim": 16,
              "v_head_dim": 32},
      "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "shared_experts": 1,
              "dense_layers": 1}}}]},
      "workload": {"seq_len": 256, "global_batch": 8},
      "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "mla.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  for (bool sp : {false, true}) {
    Plan p;
    p.layout = layout(2, 2, 2, 1);
    p.layout.sequence_parallel = sp;
    p.layout.ep = sp ? 2 : 1;
    SCOPED_TRACE(fmt::format("sp {}", sp));
    expect_kernels_match(*s, p);
    p.layout.recompute = models::Recompute::kFull;
    expect_kernels_match(*s, p);
  }
}

// Sliding windows on every other layer, with a dense first layer (all four layer kinds),
// over two pipeline stages under TP with SP and selective recompute: each layer's tasks run
// its own kind's kernels (a windowed kernel's FLOPs and time are its band's, as its task's),
// and a windowed layer's tasks do less than a full one's.
TEST(Kernels, SlidingWindowPlansMatchTaskFlops) {
  // A gpt-oss-shaped LLM of `layers` layers, the first dense, with `window`.
  auto oss = [](int layers, const std::string& window) {
    return parse_scenario_text(R"({"model": {"name": "tiny-oss", "modules": [{"name": "llm",
        "kind": "llm", "spec": {"layers": )" +
                                   std::to_string(layers) +
                                   R"(, "hidden": 256, "ffn_hidden": 512, "heads": 4,
        "kv_heads": 2, "vocab": 512, "activation": "swiglu", "norm": "rmsnorm",
        "qkv_bias": true, "linear_bias": true, "sliding_window": )" +
                                   window + R"(,
        "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "dense_layers": 1}}}]},
        "workload": {"seq_len": 256, "global_batch": 8},
        "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "oss.json");
  };
  auto s = oss(4, R"({"size": 32, "full_every": 2})");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan p;
  p.layout = layout(2, 1, 2, 2);
  p.layout.sequence_parallel = true;
  p.layout.ep = 2;
  expect_kernels_match(*s, p);
  p.layout.recompute = models::Recompute::kSelective;
  expect_kernels_match(*s, p);
  // All-gather CP: the busiest rank's two calls per layer, each a chunk's queries against
  // the keys it sees (64 queries and 96 keys under a window of 32; under one of 160, over
  // half the 256 tokens, 128 and 192 keys, reaching back to the sequence's start, as a full
  // layer's calls do), bottom-right causal; every layer windowed, then every other one.
  for (const char* window :
       {R"({"size": 32})", R"({"size": 160})", R"({"size": 32, "full_every": 2})"}) {
    auto all = oss(2, window);
    ASSERT_TRUE(all.is_ok()) << all.status().to_string();
    Plan gather;
    gather.layout = layout(2, 2, 1, 2);
    gather.layout.sequence_parallel = true;
    gather.layout.ep = 2;
    gather.layout.cp_comm = CpComm::kAllGather;
    SCOPED_TRACE(window);
    expect_kernels_match(*all, gather);
  }
  // A windowed layer's forward does less than a full one's: the trace tells them apart.
  LowerOptions o;
  o.full_ranks = true;
  auto lp = lower(*s, p, o);
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  std::map<std::string, double> flops;
  for (int t = 0; t < lp->graph.num_tasks(); ++t) {
    const sim::Task& task = lp->graph.task(TaskId(t));
    if (task.kind == sim::TaskKind::kCompute)
      flops[std::string(lp->graph.label_text(task.label.name))] += task.flops.count();
  }
  {
    // The dense layers by a layer pattern (every other one) instead of first.
    auto alt = parse_scenario_text(R"({"model": {"name": "tiny-alt", "modules": [{"name": "llm",
        "kind": "llm", "spec": {"layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 4,
        "kv_heads": 2, "vocab": 512, "activation": "swiglu", "norm": "rmsnorm",
        "sliding_window": {"size": 32, "full_every": 2},
        "moe": {"experts": 8, "top_k": 1, "expert_ffn_hidden": 128, "shared_experts": 1,
                "layer_pattern": [0, 1]}}}]},
        "workload": {"seq_len": 256, "global_batch": 8},
        "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                                   "alt.json");
    ASSERT_TRUE(alt.is_ok()) << alt.status().to_string();
    expect_kernels_match(*alt, p);
  }
  double l2 = 0, l3 = 0;  // layer 2 (0-based) windowed, layer 3 full; both MoE
  for (const auto& [name, f] : flops) {
    if (name.find("L2") != std::string::npos) l2 += f;
    if (name.find("L3") != std::string::npos) l3 += f;
  }
  EXPECT_GT(l3, l2);
  EXPECT_GT(l2, 0);
}

// Post-norms (Gemma's) after the TP exits, with and without SP and with a window.
TEST(Kernels, PostNormPlansMatchTaskFlops) {
  auto s = parse_scenario_text(R"({"model": {"name": "tiny-gemma", "modules": [{"name": "llm",
      "kind": "llm", "spec": {"layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 4,
        "kv_heads": 2, "head_dim": 64, "vocab": 512, "activation": "swiglu", "norm": "rmsnorm",
        "qk_norm": true, "post_norms": true, "tied_embeddings": true,
        "sliding_window": {"size": 32, "full_every": 2}}}]},
      "workload": {"seq_len": 256, "global_batch": 8},
      "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "gemma.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  for (bool sp : {false, true}) {
    Plan p;
    p.layout = layout(2, 1, 2, 2);
    p.layout.sequence_parallel = sp;
    SCOPED_TRACE(sp);
    expect_kernels_match(*s, p);
    // The checkpointed MLP re-runs its post-norm too.
    p.layout.recompute = models::Recompute::kSelective;
    p.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
    expect_kernels_match(*s, p);
  }
}

TEST(Kernels, HeterogeneousPlansMatchTaskFlops) {
  const Scenario s = tiny(4);
  Plan co;
  co.layout = layout(2, 1, 1, 2);
  co.placement = Placement::kColocated;
  co.modules.push_back({"vision", layout(1, 1, 1, 4), 0});
  expect_kernels_match(s, co);
  Plan non;
  non.layout = layout(2, 1, 1, 1);
  non.placement = Placement::kNonColocated;
  non.llm_first_rank = 2;
  non.modules.push_back({"vision", layout(1, 1, 1, 2), 0});
  expect_kernels_match(s, non);
}

TEST(Evaluate, RanksSharingCoresComputeSlowerTogether) {
  // The 4-rank tiny plan on a host whose 4 ranks share 2 cores (shared_compute_units):
  // the iteration is longer than on 4 devices, but not longer than doing all four ranks'
  // work on 2 cores back to back with nothing overlapped.
  Scenario s = tiny(4);
  auto own = evaluate(s, *s.plan);
  ASSERT_TRUE(own.is_ok() && own->feasible);
  std::vector<hardware::NodeGroup> groups = s.cluster.groups();
  for (hardware::NodeGroup& g : groups) g.profile.shared_compute_units = 2;
  s.cluster = *hardware::ClusterSpec::create(groups, s.cluster.overrides());
  auto shared = evaluate(s, *s.plan);
  ASSERT_TRUE(shared.is_ok() && shared->feasible);
  EXPECT_GT(shared->iteration_time.to_seconds(), 1.5 * own->iteration_time.to_seconds());
  EXPECT_LE(shared->iteration_time.to_seconds(), 2 * own->iteration_time.to_seconds() + 1e-3);
}

TEST(Kernels, DistinctGemmsCoverEveryGemmOnceMostFlopsFirst) {
  const Scenario s = tiny(1);
  LowerOptions o;
  o.full_ranks = o.kernels = true;
  auto lp = lower(s, *s.plan, o);
  ASSERT_TRUE(lp.is_ok());
  const std::vector<sim::Kernel> shapes = distinct_gemms(lp->graph);
  // What the graph runs: (m, n, k, adds into fp32) -> FLOPs.
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, double> flops;
  for (int t = 0; t < lp->graph.num_tasks(); ++t) {
    const sim::Task& task = lp->graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute) continue;
    for (const sim::Kernel& k : lp->graph.kernels(task.kernels))
      if (k.kind == sim::KernelKind::kGemm) flops[{k.m, k.n, k.k, k.accumulate_fp32}] += k.flops();
  }
  ASSERT_EQ(shapes.size(), flops.size());
  auto key = [](const sim::Kernel& k) { return std::make_tuple(k.m, k.n, k.k, k.accumulate_fp32); };
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].batch, 1);
    EXPECT_EQ(shapes[i].element_bytes, 2);  // bf16 workload
    ASSERT_TRUE(flops.count(key(shapes[i])));
    if (i == 0) continue;
    EXPECT_GE(flops[key(shapes[i - 1])], flops[key(shapes[i])]);
  }
  EXPECT_TRUE(distinct_gemms(sim::TaskGraph{}).empty());
}

// Megatron's gradient-accumulation fusion: every wgrad GEMM adds into the fp32 main_grad,
// no other GEMM does; off, or with a 16-bit gradient buffer, none. A profile that measured
// such GEMMs times them from its own table, and the kernels still add up to the tasks.
TEST(Kernels, WgradGemmsAddIntoAnFp32MainGrad) {
  Scenario s = tiny(1);
  auto flagged = [&](const Plan& p) {
    LowerOptions o;
    o.full_ranks = o.kernels = true;
    auto lp = lower(s, p, o);
    EXPECT_TRUE(lp.is_ok());
    for (int t = 0; t < lp->graph.num_tasks(); ++t) {  // only backward tasks add into it
      const sim::Task& task = lp->graph.task(TaskId(t));
      if (task.kind != sim::TaskKind::kCompute || !task.kernels.valid()) continue;
      for (const sim::Kernel& k : lp->graph.kernels(task.kernels))
        if (k.accumulate_fp32) {
          EXPECT_EQ(lp->graph.label_text(task.label.category), "bwd")
              << lp->graph.label_text(task.label.name);
        }
    }
    std::vector<sim::Kernel> out;
    for (const sim::Kernel& k : distinct_gemms(lp->graph))
      if (k.accumulate_fp32) out.push_back(k);
    return out;
  };
  Plan p = *s.plan;
  const std::vector<sim::Kernel> wgrads = flagged(p);
  EXPECT_FALSE(wgrads.empty());
  Plan off = p;
  off.layout.gradient_accumulation_fusion = false;
  EXPECT_TRUE(flagged(off).empty());
  Plan bf16 = p;
  bf16.layout.grad_reduce_dtype = GradReduceDtype::kBf16;
  EXPECT_TRUE(flagged(bf16).empty());

  // Measured at a quarter of the model's speed, the wgrads make the iteration slower.
  auto before = evaluate(s, p, {});
  ASSERT_TRUE(before.is_ok() && before->feasible);
  std::vector<hardware::NodeGroup> groups = s.cluster.groups();
  hardware::DeviceProfile& gpu = groups[0].profile.gpu;
  for (const sim::Kernel& k : wgrads) {
    const double t = gpu.gemm_time(k.m, k.n, k.k, 1, hardware::Precision::kBf16).to_seconds();
    gpu.gemm_accumulate_measured[hardware::precision_index(hardware::Precision::kBf16)].push_back(
        {k.m, k.n, k.k, FlopRate::per_second(2.0 * k.m * k.n * k.k / (4 * t))});
  }
  auto cluster = hardware::ClusterSpec::create(groups);
  ASSERT_TRUE(cluster.is_ok());
  s.cluster = *cluster;
  auto after = evaluate(s, p, {});
  ASSERT_TRUE(after.is_ok() && after->feasible);
  EXPECT_GT(after->iteration_time, before->iteration_time);
  // Unfused, the backward hook adds each gradient into main_grad in a pass of its own: per
  // weight element the bf16 gradient and the fp32 main_grad read, main_grad written (10 B),
  // after each wgrad GEMM; slower than the fused GEMM, whose add the roofline hides.
  auto unfused = evaluate(s, off, {});
  ASSERT_TRUE(unfused.is_ok() && unfused->feasible);
  EXPECT_GT(unfused->iteration_time, before->iteration_time);
  LowerOptions o;
  o.full_ranks = o.kernels = true;
  auto lp = lower(s, off, o);
  ASSERT_TRUE(lp.is_ok());
  std::multiset<int64_t> adds;  // bytes of the memory kernel right after each wgrad GEMM
  for (int t = 0; t < lp->graph.num_tasks(); ++t) {
    const sim::Task& task = lp->graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute || !task.kernels.valid()) continue;
    const auto ks = lp->graph.kernels(task.kernels);
    for (size_t i = 0; i + 1 < ks.size(); ++i)
      for (const sim::Kernel& w : wgrads)
        if (ks[i].kind == sim::KernelKind::kGemm && ks[i].m == w.m && ks[i].n == w.n &&
            ks[i].k == w.k && ks[i + 1].kind == sim::KernelKind::kMemory) {
          EXPECT_EQ(ks[i + 1].bytes, w.m * w.n * w.batch * 10) << w.m << "x" << w.n;
          adds.insert(ks[i + 1].bytes);
        }
  }
  EXPECT_FALSE(adds.empty());
  expect_kernels_match(s, p);
  expect_kernels_match(s, off);
}

TEST(Kernels, ShardedShapes) {
  // Column-parallel qkv under tp 2: N halves; the attention kernel has heads / tp and, under
  // cp, seq_q / cp.
  const Scenario s = tiny(4);
  Plan p;
  p.layout = layout(2, 2, 1, 1);
  LowerOptions o;
  o.full_ranks = o.kernels = true;
  auto lp = lower(s, p, o);
  ASSERT_TRUE(lp.is_ok());
  bool saw_attention = false;
  for (int t = 0; t < lp->graph.num_tasks(); ++t) {
    const sim::Task& task = lp->graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute) continue;
    for (const sim::Kernel& k : lp->graph.kernels(task.kernels))
      if (k.kind == sim::KernelKind::kAttentionForward && k.causal) {  // the LLM's
        saw_attention = true;
        EXPECT_EQ(k.heads, 2);      // 4 heads / tp 2
        EXPECT_EQ(k.seq_q, 16);     // 32 tokens / cp 2
        EXPECT_EQ(k.seq_kv, 16);    // one ring step: one rank's K,V chunk
        EXPECT_EQ(k.head_dim, 32);  // 128 / 4
      }
  }
  EXPECT_TRUE(saw_attention);
}

}  // namespace
}  // namespace hetpar::planner
