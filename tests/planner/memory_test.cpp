#include "hetpar/planner/memory.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "hetpar/models/totals.h"

namespace hetpar::planner {
namespace {

Scenario scenario(const std::string& model, int64_t seq_len, int64_t global_batch,
                  const std::string& cluster = R"({"profile": "dgx-h100", "nodes": 8})",
                  int images = 0) {
  auto s = parse_scenario_text(
      fmt::format(R"({{"model": {}, "workload": {{"seq_len": {}, "global_batch": {},
                       "images_per_sample": {}}}, "cluster": {}}})",
                  model, seq_len, global_batch, images, cluster),
      "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : Scenario{};
}

Plan plan(Layout l, Schedule sch = Schedule::k1F1B) {
  Plan p;
  p.layout = l;
  p.schedule = sch;
  return p;
}

// A GPT-style LLM in Korthikanti et al.'s setting (arXiv 2205.05198): f = 4h, GELU,
// LayerNorm, dropout, no biases, multi-head attention.
constexpr int64_t kL = 4, kH = 1024, kA = 16, kV = 32000, kS = 2048, kB = 2;
const char* kGpt = R"({"name": "gpt", "modules": [{"name": "llm", "kind": "llm", "spec":
    {"layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "vocab": 32000,
     "activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
     "max_positions": 2048, "dropout": true}}]})";

class MemoryKorthikanti : public ::testing::Test {
 protected:
  // Activations of one rank, flash attention off so the softmax is materialised.
  static double activations(Layout l) {
    l.micro_batch = kB;
    Scenario s = scenario(kGpt, kS, kB * l.dp);
    l.flash_attention = false;
    return estimate_memory(s, plan(l)).per_stage[0].activations.as_double();
  }
  static constexpr double sbh = double{kS} * kB * kH;
  static constexpr double scores = 5.0 * kA * kS * kS * kB;  // 5as^2b
  // Outside the layers: embedding dropout mask sbh, final norm and logits inputs 2sbh
  // each (replicated across TP without SP), fp32 logits 4sbv (vocab parallel).
  static constexpr double outside = 5 * sbh;
  static constexpr double logits = 4.0 * kS * kB * kV;
};

TEST_F(MemoryKorthikanti, NoRecomputeIs34sbhPlus5as2bPerLayer) {
  EXPECT_DOUBLE_EQ(activations({}), kL * (34 * sbh + scores) + outside + logits);
}

TEST_F(MemoryKorthikanti, SelectiveRecomputeKeeps34sbh) {
  // Plus the working set: one layer's attention scores re-materialised in backward.
  EXPECT_DOUBLE_EQ(activations({.recompute = models::Recompute::kSelective}),
                   kL * 34 * sbh + scores + outside + logits);
}

TEST_F(MemoryKorthikanti, FullRecomputeKeepsLayerInputs) {
  // 2sbh per layer, plus one whole layer re-materialised in backward.
  EXPECT_DOUBLE_EQ(activations({.recompute = models::Recompute::kFull}),
                   kL * 2 * sbh + (34 * sbh + scores) + outside + logits);
}

TEST_F(MemoryKorthikanti, TensorParallelWithoutSpFollowsTable2) {
  // sbh(10 + 24/t + 5as/(ht)) per layer; outside the layers only the loss is split.
  constexpr double t = 4;
  EXPECT_DOUBLE_EQ(activations({.tp = 4}),
                   kL * (sbh * (10 + 24 / t) + scores / t) + outside + logits / t);
}

TEST_F(MemoryKorthikanti, SequenceParallelDividesEverything) {
  // sbh(34/t + 5as/(ht)) per layer.
  constexpr double t = 4;
  EXPECT_DOUBLE_EQ(activations({.tp = 4, .sequence_parallel = true}),
                   (kL * (34 * sbh + scores) + outside + logits) / t);
}

TEST_F(MemoryKorthikanti, ContextParallelSplitsTheSequence) {
  EXPECT_DOUBLE_EQ(activations({.cp = 2}), (kL * (34 * sbh + scores) + outside + logits) / 2);
}

TEST_F(MemoryKorthikanti, TeCrossEntropyKeepsTheLogitsNotAnFp32Copy) {
  // Transformer Engine's cross-entropy writes the gradient into the bf16 logits and keeps
  // them (2sbv), as a compiled one keeps them for its backward, where Megatron's kernels keep
  // fp32 logits (4sbv); the native fused one too.
  Layout te;
  te.cross_entropy_fusion = CrossEntropy::kTe;
  EXPECT_DOUBLE_EQ(activations(te), kL * (34 * sbh + scores) + outside + logits / 2);
  Layout compiled;
  compiled.cross_entropy_fusion = CrossEntropy::kCompiled;
  EXPECT_DOUBLE_EQ(activations(compiled), kL * (34 * sbh + scores) + outside + logits / 2);
  Layout native;
  native.cross_entropy_fusion = CrossEntropy::kNative;
  EXPECT_DOUBLE_EQ(activations(native), kL * (34 * sbh + scores) + outside + logits);
}

TEST_F(MemoryKorthikanti, Fp8HalvesTheLinearLayersInputs) {
  // Transformer Engine's FP8 Linear modules keep the FP8 transpose of their input (1 byte)
  // for the weight gradient: of the 34sbh per layer, the inputs of qkv (2sbh), attn_out
  // (2sbh), fc1 (2sbh) and fc2 (8sbh) halve; the norms', attention's, activation's inputs,
  // the dropout masks and the output layer's input (Megatron's own, bf16) stay.
  auto s = parse_scenario_text(fmt::format(R"({{"model": {}, "workload": {{"seq_len": {},
      "global_batch": {}, "precision": "fp8"}}, "cluster": {{"profile": "dgx-h100",
      "nodes": 1}}}})",
                                           kGpt, kS, kB),
                               "test.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Layout l{.micro_batch = kB};
  l.flash_attention = false;
  const double fp8 = estimate_memory(*s, plan(l)).per_stage[0].activations.as_double();
  EXPECT_DOUBLE_EQ(fp8, kL * ((34 - 7) * sbh + scores) + outside + logits);
}

TEST(MemoryInFlight, OneFOneBHoldsPpMinusStage) {
  EXPECT_EQ(in_flight_micro_batches(Schedule::k1F1B, 0, 4, 1, 16), 4);
  EXPECT_EQ(in_flight_micro_batches(Schedule::k1F1B, 3, 4, 1, 16), 1);
  EXPECT_EQ(in_flight_micro_batches(Schedule::k1F1B, 0, 4, 1, 2), 2);  // fewer micro-batches
  EXPECT_EQ(in_flight_micro_batches(Schedule::kZeroBubble, 1, 4, 1, 16), 3);
}

TEST(MemoryInFlight, GpipeHoldsEveryMicroBatch) {
  EXPECT_EQ(in_flight_micro_batches(Schedule::kGpipe, 0, 4, 1, 16), 16);
  EXPECT_EQ(in_flight_micro_batches(Schedule::kGpipe, 3, 4, 1, 16), 16);
}

TEST(MemoryInFlight, InterleavedMatchesKorthikanti) {
  // Stage 0 holds L(1 + (p-1)/(pm)) layers' worth: pp + (pp-1)/vpp stage micro-batches.
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(Schedule::kInterleaved, 0, 4, 2, 16), 4 + 3.0 / 2);
  // Last stage: (vpp-1)*pp warm-up chunks + 1 = 5 chunks of half the stage.
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(Schedule::kInterleaved, 3, 4, 2, 16), 2.5);
  // m == pp: Megatron runs all forwards first.
  EXPECT_DOUBLE_EQ(in_flight_micro_batches(Schedule::kInterleaved, 3, 4, 2, 4), 4);
}

TEST(MemoryPipeline, StagesHoldTheScheduledMicroBatches) {
  // 4 layers on 4 stages, 8 micro-batches: stage 0 holds 4, the last 1 (1F1B); GPipe 8.
  Scenario s = scenario(kGpt, 2048, 8);
  const Layout l{.pp = 4, .flash_attention = false};
  const MemoryOptions o;
  MemoryReport f = estimate_memory(s, plan(l), o);
  MemoryReport g = estimate_memory(s, plan(l, Schedule::kGpipe), o);
  ASSERT_EQ(f.per_stage.size(), 4u);
  const double layer = 2048.0 * 1024 * (34 + 5.0 * 16 * 2048 / 1024);  // b = 1
  const double mask = 2048.0 * 1024, head = 4 * 2048.0 * 1024 + 4.0 * 2048 * 32000;
  EXPECT_DOUBLE_EQ(f.per_stage[0].activations.as_double(), 4 * (layer + mask));
  EXPECT_DOUBLE_EQ(f.per_stage[1].activations.as_double(), 3 * layer);
  EXPECT_DOUBLE_EQ(f.per_stage[3].activations.as_double(), layer + head);
  EXPECT_DOUBLE_EQ(g.per_stage[1].activations.as_double(), 8 * layer);
  EXPECT_DOUBLE_EQ(g.per_stage[3].activations.as_double(), 8 * (layer + head));
  // P2P buffers: send + receive of s*b*h bf16.
  EXPECT_EQ(f.per_stage[1].communication_buffers, Bytes(2 * 2 * 2048 * 1024));

  // ZB-H1: stage s also keeps the GEMM inputs (qkv 2sbh, attn_out 2sbh, fc1 2sbh, fc2
  // 8sbh; logits 2sbh) of the s micro-batches whose W passes it defers.
  MemoryReport z = estimate_memory(s, plan(l, Schedule::kZeroBubble), o);
  const double w_inputs = 14 * 2048.0 * 1024, logits_input = 2 * 2048.0 * 1024;
  EXPECT_EQ(z.per_stage[0].activations, f.per_stage[0].activations);
  EXPECT_DOUBLE_EQ(z.per_stage[1].activations.as_double(), 3 * layer + w_inputs);
  EXPECT_DOUBLE_EQ(z.per_stage[3].activations.as_double(),
                   layer + head + 3 * (w_inputs + logits_input));
  EXPECT_EQ(z.peak, f.peak);

  // Interleaved, pp 2 x vpp 2: stage 0 runs layers 0 and 2 and holds (2 + 2 + 1) / 2
  // micro-batches of them; stage 1 layers 1 and 3, (0 + 2 + 1) / 2, and the head once.
  MemoryReport i = estimate_memory(
      s, plan({.pp = 2, .vpp = 2, .flash_attention = false}, Schedule::kInterleaved), o);
  ASSERT_EQ(i.per_stage.size(), 2u);
  EXPECT_DOUBLE_EQ(i.per_stage[0].activations.as_double(), 2.5 * (2 * layer + mask));
  EXPECT_DOUBLE_EQ(i.per_stage[1].activations.as_double(), 1.5 * 2 * layer + head);
}

TEST(MemoryModelState, Gpt3At175BOnTp8Pp8) {
  // 96 layers of 12h^2 + 13h parameters (GEMM weights and column biases 12h^2 + 9h split by
  // TP, LayerNorms 4h replicated), 12 per stage; the first stage adds the vocab-parallel
  // table (51200 x h / 8) and learned positions (2048 x h, replicated); the last the final
  // LayerNorm and its copy of the tied table.
  Scenario s = scenario(R"("gpt3-175b")", 2048, 1536);
  MemoryReport r =
      estimate_memory(s, plan({.tp = 8, .pp = 8, .recompute = models::Recompute::kFull}));
  const double h = 12288;
  const double middle = 12 * ((12 * h * h + 9 * h) / 8 + 4 * h);
  const double table = 51200 * h / 8;
  EXPECT_DOUBLE_EQ(r.per_stage[3].weights.as_double(), 2 * middle);
  EXPECT_DOUBLE_EQ(r.per_stage[0].weights.as_double(), 2 * (middle + table + 2048 * h));
  EXPECT_DOUBLE_EQ(r.per_stage[7].weights.as_double(), 2 * (middle + table + 2 * h));
  // About 175e9 / 64 parameters of 2 bytes per rank; the embedding ends exceed it by ~3%.
  const double even = 175e9 / 64 * 2;
  EXPECT_NEAR(r.per_stage[3].weights.as_double() / even, 1, 0.01);
  EXPECT_NEAR(r.per_stage[0].weights.as_double() / even, 1, 0.04);
  EXPECT_GT(r.per_stage[0].weights, r.per_stage[3].weights);
}

TEST(MemoryModelState, MegatronBytesPerParameter) {
  // Megatron-LM distributed optimizer guide: bf16 parameters with fp32 gradients take 18
  // bytes per parameter, 6 + 12/d with the distributed optimizer over d ranks (dp * cp).
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64);
  auto per_param = [&](Layout l) {
    const MemoryBreakdown b = estimate_memory(s, plan(l)).per_stage[0];
    return (b.weights + b.gradients + b.optimizer_state) / b.weights * 2;
  };
  EXPECT_NEAR(per_param({.dp = 8}), 18, 1e-9);
  EXPECT_NEAR(per_param({.dp = 8, .distributed_optimizer = true}), 6 + 12.0 / 8, 1e-9);
  EXPECT_NEAR(per_param({.cp = 2, .dp = 4, .distributed_optimizer = true}), 6 + 12.0 / 8, 1e-9);
}

TEST(MemoryModelState, Fp16TrainingKeepsFp16Gradients) {
  // Megatron-LM forces fp32 gradient accumulation and all-reduce only for bf16; fp16
  // training keeps main_grad in the parameters' dtype: 16 bytes per parameter.
  EXPECT_EQ(gradient_bytes(hardware::Precision::kBf16), 4);
  EXPECT_EQ(gradient_bytes(hardware::Precision::kFp8), 4);
  EXPECT_EQ(gradient_bytes(hardware::Precision::kFp16), 2);
  auto s = parse_scenario_text(R"({"model": "llama-3.1-8b", "workload": {"seq_len": 4096,
      "global_batch": 64, "precision": "fp16"}, "cluster": {"profile": "dgx-h100", "nodes": 8}})",
                               "test.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const MemoryBreakdown b = estimate_memory(*s, plan({.dp = 8})).per_stage[0];
  EXPECT_NEAR((b.weights + b.gradients + b.optimizer_state) / b.weights * 2, 16, 1e-9);
}

// A layout's grad_reduce_dtype names the buffer's dtype: bf16 gradients (Megatron-LM
// --grad-reduce-in-bf16, Megatron-Bridge grad_reduce_in_fp32 false) take 2 bytes a
// parameter, 16 in all; fp32 under fp16 training (--accumulate-allreduce-grads-in-fp32) 4.
TEST(MemoryModelState, GradReduceDtypeSetsTheGradientBuffer) {
  EXPECT_EQ(gradient_bytes(hardware::Precision::kBf16, GradReduceDtype::kBf16), 2);
  EXPECT_EQ(gradient_bytes(hardware::Precision::kFp8, GradReduceDtype::kBf16), 2);
  EXPECT_EQ(gradient_bytes(hardware::Precision::kFp16, GradReduceDtype::kFp32), 4);
  EXPECT_EQ(gradient_bytes(hardware::Precision::kBf16, GradReduceDtype::kFp32), 4);
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64);
  Layout half{.dp = 8};
  half.grad_reduce_dtype = GradReduceDtype::kBf16;
  const MemoryBreakdown full = estimate_memory(s, plan({.dp = 8})).per_stage[0];
  const MemoryBreakdown b = estimate_memory(s, plan(half)).per_stage[0];
  EXPECT_EQ(b.gradients * 2, full.gradients);
  EXPECT_EQ(b.weights, full.weights);
  EXPECT_NEAR((b.weights + b.gradients + b.optimizer_state) / b.weights * 2, 16, 1e-9);
}

// FSDP over d = dp x cp ranks: every state is sharded; gathered on top, the largest block's
// parameters twice (running and prefetched) and its gradient once, or, kept from forward to
// backward, all the stage's parameters. Llama 3 8B: the largest block is the head (final
// norm and the 128256 x 4096 output layer).
TEST(MemoryModelState, FsdpShardsEveryStateAndGathersBlocks) {
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64);
  const double params = static_cast<double>(models::count_params(s.model).total);
  const double head = 128256.0 * 4096 + 4096;
  MemoryBreakdown b = estimate_memory(s, plan({.dp = 8, .fsdp = true})).per_stage[0];
  EXPECT_NEAR(b.weights.as_double(), (params / 8 + 2 * head) * 2, 1e-9 * params);
  EXPECT_NEAR(b.gradients.as_double(), (params / 8 + head) * 4, 1e-9 * params);
  EXPECT_NEAR(b.optimizer_state.as_double(), params / 8 * 12, 1e-9 * params);
  b = estimate_memory(s,
                      plan({.cp = 2, .dp = 4, .fsdp = true, .fsdp_reshard_after_forward = false}))
          .per_stage[0];
  EXPECT_NEAR(b.weights.as_double(), (params / 8 + params) * 2, 1e-9 * params);
  EXPECT_NEAR(b.optimizer_state.as_double(), params / 8 * 12, 1e-9 * params);
}

// FSDP2 (torch_fsdp2) keeps [final norm, output] gathered from forward to backward beside
// two layers; with its root unit the embedding and the last layer too. Llama 3 8B: the
// 128256 x 4096 embedding and output, layers of 218M parameters.
TEST(MemoryModelState, Fsdp2KeepsTheHeadAndTheRootGathered) {
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64);
  const double params = static_cast<double>(models::count_params(s.model).total);
  const double vocab = 128256.0 * 4096, head = vocab + 4096;
  const double layer = (params - 2 * vocab - 4096) / 32;
  Layout l{.dp = 8,
           .fsdp = true,
           .fsdp_implementation = FsdpImplementation::kTorchFsdp2,
           .gradient_accumulation_fusion = false};
  MemoryBreakdown b = estimate_memory(s, plan(l)).per_stage[0];
  EXPECT_NEAR(b.weights.as_double(), (params / 8 + head + 2 * layer) * 2, 1e-9 * params);
  l.fsdp_root_unit = true;
  b = estimate_memory(s, plan(l)).per_stage[0];
  EXPECT_NEAR(b.weights.as_double(), (params / 8 + head + vocab + 3 * layer) * 2, 1e-9 * params);
}

// A search thread's estimates take the op graphs from one ModuleGraphCache across its
// layouts: each estimate equals the one built afresh, and a graph is built once per module
// and graph input (the micro-batch size, the attention kernel, token dropping, ...).
TEST(MemoryGraphCache, EstimatesEqualFreshOnesAndEachGraphIsBuiltOnce) {
  Scenario vlm =
      scenario(R"("llava-1.5-7b")", 4096, 16, R"({"profile": "dgx-h100", "nodes": 1})", 1);
  Scenario moe = scenario(R"("mixtral-8x7b")", 4096, 64);
  std::vector<Layout> layouts;
  for (int64_t mb : {1, 2})
    for (bool flash : {true, false})
      for (double capacity : {0.0, 1.0})
        layouts.push_back({.tp = 2,
                           .pp = 2,
                           .dp = 2,
                           .micro_batch = static_cast<int>(mb),
                           .flash_attention = flash,
                           .moe_capacity_factor = capacity});
  for (Scenario* s : {&vlm, &moe}) {
    ModuleGraphCache cache;
    for (int round = 0; round < 2; ++round)
      for (Layout l : layouts) {
        if (s == &moe) l.ep = 2;
        const MemoryReport fresh = estimate_memory(*s, plan(l));
        const MemoryReport cached = estimate_memory(*s, plan(l), {.graphs = &cache});
        EXPECT_EQ(cached.per_stage, fresh.per_stage)
            << "micro-batch " << l.micro_batch << " flash " << l.flash_attention << " capacity "
            << l.moe_capacity_factor;
      }
    // Two micro-batch sizes x two attention kernels x two capacity factors, per module.
    EXPECT_EQ(cache.size(), 8 * s->model.modules.size());
  }
  ModuleGraphCache cache;
  const Layout l{.tp = 2, .pp = 2, .dp = 2};
  EXPECT_EQ(&cache.get(vlm, 0, l, ExpertLoad::kMean), &cache.get(vlm, 0, l, ExpertLoad::kMean));
  EXPECT_NE(&cache.get(vlm, 0, l, ExpertLoad::kMean), &cache.get(vlm, 1, l, ExpertLoad::kMean));
}

// The traits the memory model reads from each op's name, found once per graph: a MoE layer
// with a shared expert (GLM-4.5-Air) names its routed experts, router, dispatch, shared
// expert and the ops inside the TP region; get_with_traits() gives get()'s graph.
TEST(OpNameTraits, NameTheOpsTheMemoryModelTreatsApart) {
  Scenario s = scenario(R"("glm-4.5-air")", 4096, 64);
  ModuleGraphCache cache;
  const Layout l{.tp = 2, .pp = 2, .dp = 2, .ep = 2};
  const ModuleGraphCache::WithTraits c = cache.get_with_traits(s, 0, l, ExpertLoad::kMean);
  EXPECT_EQ(&c.graph, &cache.get(s, 0, l, ExpertLoad::kMean));
  ASSERT_EQ(c.traits.size(), c.graph.ops.size());
  std::set<std::string> seen;
  for (size_t i = 0; i < c.graph.ops.size(); ++i) {
    const models::Op& op = c.graph.ops[i];
    const OpNameTraits& t = c.traits[i];
    if (op.layer < 0 || !seen.insert(op.name).second) continue;
    SCOPED_TRACE(op.name);
    EXPECT_EQ(t.routed_expert, op.name.starts_with("expert_"));
    EXPECT_EQ(t.router, op.name == "router");
    EXPECT_EQ(t.moe_dispatch, op.name == "moe_dispatch");
    EXPECT_EQ(t.shared_expert_fc1, op.name == "shared_expert_fc1");
    EXPECT_EQ(t.routed_fc1, op.name == "expert_fc1");
    if (op.name == "qkv" || op.name == "expert_fc1" || op.name == "shared_expert_fc1") {
      EXPECT_TRUE(t.fp8_linear && !t.inside_tp);
    }
    if (op.name == "attention" || op.name == "attn_out" || op.name == "expert_fc2") {
      EXPECT_TRUE(t.inside_tp);
    }
    if (op.name == "router") {
      EXPECT_FALSE(t.fp8_linear);
    }
  }
  for (const char* name : {"qkv", "attention", "attn_out", "router", "moe_dispatch", "expert_fc1",
                           "expert_fc2", "shared_expert_fc1"})
    EXPECT_TRUE(seen.contains(name)) << name;
}

TEST(MemoryModelState, RoutedExpertsSplitByEp) {
  // Mixtral 8x7B: 32 layers x 8 experts x 3 x 4096 x 14336 expert parameters; EP 8 keeps
  // one expert per layer and rank, whose optimizer state the distributed optimizer shards
  // over dp * cp / ep = 1 rank (the dense rest over dp = 8).
  Scenario s = scenario(R"("mixtral-8x7b")", 4096, 64);
  const Layout ep1{.dp = 8, .distributed_optimizer = true};
  Layout ep8 = ep1;
  ep8.ep = 8;
  const MemoryBreakdown a = estimate_memory(s, plan(ep1)).per_stage[0];
  const MemoryBreakdown b = estimate_memory(s, plan(ep8)).per_stage[0];
  const double experts = 32.0 * 8 * 3 * 4096 * 14336;
  const double dense = a.weights.as_double() / 2 - experts;
  EXPECT_DOUBLE_EQ(a.weights.as_double() - b.weights.as_double(), 2 * experts * 7 / 8);
  EXPECT_DOUBLE_EQ(b.optimizer_state.as_double(), 12 * (dense / 8 + experts / 8));
  EXPECT_DOUBLE_EQ(a.optimizer_state.as_double(), 12 * (dense + experts) / 8);
}

// Under TP with SP a MoE layer's tensors are split over the TP ranks, but the routed
// experts' first GEMM keeps its input whole: the permuted tokens of the TP group, gathered
// after the all-to-all. Mixtral 8x7B: 32 layers of 4096 tokens x top 2 x 4096 bf16 inputs.
TEST(MemoryModelState, MoeExpertInputsAreGatheredOverTp) {
  Scenario s = scenario(R"("mixtral-8x7b")", 4096, 64);
  const MemoryBreakdown one = estimate_memory(s, plan({.dp = 64})).per_stage[0];
  Layout tp2{.tp = 2, .sequence_parallel = true, .dp = 32};
  const MemoryBreakdown two = estimate_memory(s, plan(tp2)).per_stage[0];
  const double fc1_inputs = 32.0 * 4096 * 2 * 4096 * 2;
  EXPECT_NEAR(two.activations.as_double() - one.activations.as_double() / 2, fc1_inputs / 2,
              1e-6 * fc1_inputs);
}

// Folded experts (etp 1): each rank holds whole experts, experts / ep of them, their
// optimizer state sharded over the expert-DP group tp x dp / ep; the dense weights stay split
// over TP. Mixtral 8x7B, TP2 SP DP32 EP8 on 64 GPUs: expert-DP 8.
TEST(MemoryModelState, FoldedExpertsAreWholeAndShardedOverExpertDp) {
  Scenario s = scenario(R"("mixtral-8x7b")", 4096, 64);
  const double experts = 32.0 * 8 * 3 * 4096 * 14336;
  const double dense = static_cast<double>(models::count_params(s.model).total) - experts;
  Layout split{
      .tp = 2, .sequence_parallel = true, .dp = 32, .ep = 8, .distributed_optimizer = true};
  Layout folded = split;
  folded.etp = 1;
  const MemoryBreakdown a = estimate_memory(s, plan(split)).per_stage[0];
  const MemoryBreakdown b = estimate_memory(s, plan(folded)).per_stage[0];
  // Weights: split experts / (tp ep) vs whole experts / ep; the dense part (/ tp, the
  // embedding and output vocab-parallel) is the same in both.
  EXPECT_NEAR(b.weights.as_double() - a.weights.as_double(), 2 * (experts / 8 - experts / 16),
              1e-9 * experts);
  // Optimizer: experts / 16 over 32 / 8 = 4 ranks, against experts / 8 over 64 / 8 = 8.
  EXPECT_NEAR(b.optimizer_state.as_double() - a.optimizer_state.as_double(),
              12 * (experts / 8 / 8 - experts / 16 / 4), 1e-9 * experts);
  EXPECT_GT(dense, 0);
}

// fp8_param_gather holds the TE Linear weights (every GEMM of the layers) in one byte; the
// embedding, the output layer and the norms stay bf16. Llama 3.1 8B: 32 layers of
// 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 14336 weights. FSDP's shards and the
// gathered blocks follow (the largest gathered block, the bf16 head, unchanged).
TEST(MemoryModelState, Fp8ParamGatherHoldsLinearWeightsInOneByte) {
  auto s = parse_scenario_text(R"({"model": "llama-3.1-8b", "workload": {"seq_len": 4096,
      "global_batch": 64, "precision": "fp8"}, "cluster": {"profile": "dgx-h100", "nodes": 8}})",
                               "test.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const double linear = 32.0 * (4096.0 * 6144 + 4096.0 * 4096 + 3 * 4096.0 * 14336);
  for (bool fsdp : {false, true}) {
    Layout bf16{.dp = 8, .fsdp = fsdp};
    Layout fp8 = bf16;
    fp8.fp8_param_gather = true;
    const MemoryBreakdown a = estimate_memory(*s, plan(bf16)).per_stage[0];
    const MemoryBreakdown b = estimate_memory(*s, plan(fp8)).per_stage[0];
    EXPECT_NEAR(a.weights.as_double() - b.weights.as_double(), fsdp ? linear / 8 : linear,
                1e-9 * linear)
        << fsdp;
    EXPECT_EQ(a.gradients, b.gradients);
    EXPECT_EQ(a.optimizer_state, b.optimizer_state);
  }
}

// FSDP with EP: the dense state sharded over dp = 8, the routed experts (one per layer and
// rank under EP 8, two under EP 4) over their expert-DP group, dp / ep ranks; kept from
// forward to backward, every local parameter is gathered on top.
TEST(MemoryModelState, FsdpShardsExpertsOverTheirExpertDataParallelGroup) {
  Scenario s = scenario(R"("mixtral-8x7b")", 4096, 64);
  const double experts = 32.0 * 8 * 3 * 4096 * 14336;
  const double dense = static_cast<double>(models::count_params(s.model).total) - experts;
  for (int ep : {4, 8}) {
    Layout l{.dp = 8, .ep = ep, .fsdp = true, .fsdp_reshard_after_forward = false};
    const MemoryBreakdown b = estimate_memory(s, plan(l)).per_stage[0];
    const double local_experts = experts / ep, edp = 8.0 / ep;
    const double shards = dense / 8 + local_experts / edp;
    EXPECT_NEAR(b.weights.as_double(), (shards + dense + local_experts) * 2, 1e-9 * experts) << ep;
    EXPECT_NEAR(b.optimizer_state.as_double(), shards * 12, 1e-9 * experts) << ep;
  }
}

// Llama-3.1-70B (70.6e9 parameters) at seq 4096 on 64 H100s (80 GiB = 85.9e9 B), TP8 SP.
class MemoryLlama70B : public ::testing::Test {
 protected:
  static MemoryReport estimate(Layout l) {
    l.tp = 8;
    l.sequence_parallel = true;
    Scenario s = scenario(R"("llama-3.1-70b")", 4096, 64);
    return estimate_memory(s, plan(l));
  }
};

TEST_F(MemoryLlama70B, ReplicatedOptimizerDoesNotFit) {
  // 70.6e9 / 8 = 8.8e9 parameters per rank x 18 B = 159e9 B before any activation.
  MemoryReport r = estimate({.dp = 8, .recompute = models::Recompute::kSelective});
  const MemoryBreakdown& b = r.per_stage[0];
  EXPECT_EQ(r.capacity(), Bytes::GiB(80));
  EXPECT_GT(b.weights + b.gradients + b.optimizer_state, r.capacity());
  EXPECT_FALSE(r.fits());
}

TEST_F(MemoryLlama70B, DistributedOptimizerAndFullRecomputeFit) {
  // 8.8e9 x (6 + 12/8) = 66e9 B of model state; full recompute keeps 80 layers x 2sbh / 8
  // = 0.7e9 B, the fp32 logits 4 s V / 8 = 0.26e9 B, one recomputed layer 0.14e9 B;
  // plus the 1 GiB workspace allowance: ~68.5e9 B.
  MemoryReport r =
      estimate({.dp = 8, .recompute = models::Recompute::kFull, .distributed_optimizer = true});
  EXPECT_TRUE(r.fits());
  EXPECT_NEAR(r.peak.as_double(), 68.5e9, 0.5e9);
  // More pipeline stages: a quarter of the parameters per rank, 6 + 12/2 B each.
  MemoryReport pp4 = estimate(
      {.pp = 4, .dp = 2, .recompute = models::Recompute::kFull, .distributed_optimizer = true});
  EXPECT_TRUE(pp4.fits());
  EXPECT_LT(pp4.peak, r.peak);
}

TEST_F(MemoryLlama70B, ActivationsWithoutSpOrRecomputeDoNotFit) {
  // Without SP each layer keeps 8h per token replicated and 209152 B / 8 split:
  // 91680 B x 4096 tokens x 80 layers = 30e9 B on top of 66e9 B of model state.
  MemoryReport r = estimate({.dp = 8, .distributed_optimizer = true});
  ASSERT_TRUE(r.fits());  // with SP (the fixture's default): 11e9 B of activations
  Layout l{.tp = 8, .dp = 8, .distributed_optimizer = true};
  MemoryReport no_sp = estimate_memory(scenario(R"("llama-3.1-70b")", 4096, 64), plan(l));
  EXPECT_NEAR(no_sp.per_stage[0].activations.as_double(), 30.4e9, 0.2e9);
  EXPECT_FALSE(no_sp.fits());
}

TEST(MemoryMultimodal, EncodersSitOnTheFirstStage) {
  // LLaVA-1.5 with PP 2: the ViT and projector join stage 0; the last stage is the bare
  // Vicuna's.
  const Layout l{.tp = 2, .pp = 2, .dp = 2};
  Scenario vlm =
      scenario(R"("llava-1.5-7b")", 4096, 16, R"({"profile": "dgx-h100", "nodes": 1})", 1);
  Scenario llm = scenario(R"("vicuna-7b")", 4096, 16, R"({"profile": "dgx-h100", "nodes": 1})");
  MemoryReport a = estimate_memory(vlm, plan(l));
  MemoryReport b = estimate_memory(llm, plan(l));
  EXPECT_EQ(a.per_stage[1].total(), b.per_stage[1].total());
  const double encoders =
      static_cast<double>(models::count_params(vlm.model.modules[0].spec).total +
                          models::count_params(vlm.model.modules[1].spec).total);
  const double extra = (a.per_stage[0].weights - b.per_stage[0].weights).as_double() / 2;
  // TP 2 splits the layers' GEMMs: between half and all of the encoder parameters.
  EXPECT_GT(extra, encoders / 2);
  EXPECT_LT(extra, encoders);
  EXPECT_GT(a.per_stage[0].activations, b.per_stage[0].activations);
}

TEST(MemoryCapacity, SmallestGpuOfTheCluster) {
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64, R"({"node_groups": [
      {"profile": "dgx-h200", "nodes": 1}, {"profile": "dgx-h100", "nodes": 1}]})");
  MemoryReport r = estimate_memory(s, plan({.dp = 16}));
  EXPECT_EQ(r.capacity(), Bytes::GiB(80));
  EXPECT_EQ(r.peak, r.per_stage[0].total());
  EXPECT_EQ(r.per_stage[0].workspace,
            Bytes::GiB(1) + Bytes(std::llround(0.1 * r.per_stage[0].activations.as_double())));
}

// A cluster of two GPU types, one per pipeline stage: each stage is held to its own GPUs'
// memory. Llama 3.1 8B in two stages: the first on an H200 node fits, the second on RTX
// 4090s (24 GiB) does not, though the first holds more (the 1F1B warm-up's activations).
TEST(MemoryCapacity, EachStageIsHeldToItsOwnGpus) {
  Scenario s = scenario(R"("llama-3.1-8b")", 4096, 64, R"({"node_groups": [
      {"profile": "dgx-h200", "nodes": 1}, {"profile": "rtx4090-node", "nodes": 1}]})");
  Layout l;
  l.pp = 2;
  l.dp = 8;
  const MemoryReport r = estimate_memory(s, plan(l));
  ASSERT_EQ(r.stage_capacity.size(), 2u);
  EXPECT_EQ(r.stage_capacity[0], s.cluster.groups()[0].profile.gpu.memory_capacity);
  EXPECT_EQ(r.stage_capacity[1], Bytes::GiB(24));
  EXPECT_EQ(r.peak_stage, 0);
  EXPECT_LT(r.per_stage[0].total(), r.stage_capacity[0]);
  EXPECT_GT(r.per_stage[1].total(), Bytes::GiB(24));
  EXPECT_FALSE(r.fits());
  EXPECT_EQ(r.tightest_stage, 1);
  EXPECT_EQ(r.capacity(), Bytes::GiB(24));
  EXPECT_EQ(r.tightest(), r.per_stage[1].total());
}

// Layout::defer_embedding_wgrad: the last stage keeps each deferred micro-batch's logits
// gradient (s·b × V/tp) and the output layer's input slice (s·b × h / tp under SP) until
// the pipeline's flush; wgrad_deferral_limit caps the micro-batches.
TEST(Memory, DeferredOutputLayerWgradsHoldTheirBuffers) {
  Scenario s = scenario(kGpt, kS, 8 * 4);  // 8 nodes of 8: tp 8 pp 2 dp 4, 8 micro-batches
  Layout l;
  l.tp = 8;
  l.pp = 2;
  l.dp = 4;
  l.sequence_parallel = true;
  auto last = [&](bool defer, int limit) {
    Layout d = l;
    d.defer_embedding_wgrad = defer;
    d.wgrad_deferral_limit = limit;
    return estimate_memory(s, plan(d)).per_stage[1].activations.as_double();
  };
  const double per_micro_batch = kS * 2.0 * (kV / 8.0 + kH / 8.0);  // bf16
  EXPECT_DOUBLE_EQ(last(true, 0) - last(false, 0), 8 * per_micro_batch);
  EXPECT_DOUBLE_EQ(last(true, 3) - last(false, 0), 3 * per_micro_batch);
}

}  // namespace
}  // namespace hetpar::planner
