#include "hetpar/planner/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "hetpar/hardware/system_profile.h"
#include "hetpar/models/load.h"
#include "hetpar/models/totals.h"
#include "hetpar/planner/kernels.h"

namespace hetpar::planner {
namespace {

struct Fixture {
  models::OpGraph g;
  hardware::DeviceProfile dev;
};

Fixture gpt(int64_t micro_batch = 1, bool flash = true, int dtype_bytes = 2,
            const char* profile = "dgx-a100-80gb") {
  auto spec = models::load_zoo_module("gpt3-175b");
  EXPECT_TRUE(spec.is_ok());
  models::ModuleInput in;
  in.micro_batch = micro_batch;
  in.seq_len = 2048;
  in.flash_attention = flash;
  in.dtype_bytes = dtype_bytes;
  return {models::build_op_graph(*spec, in), hardware::load_profile(profile)->gpu};
}

// A zoo model's graph over one sequence of `seq` tokens.
models::OpGraph zoo_graph(std::string_view model, int64_t seq) {
  auto spec = models::load_zoo_module(model);
  EXPECT_TRUE(spec.is_ok()) << model;
  models::ModuleInput in;
  in.seq_len = seq;
  return models::build_op_graph(*spec, in);
}

const models::Op& op_named(const models::OpGraph& g, std::string_view name) {
  for (const models::Op& op : g.ops)
    if (op.name == name && op.layer <= 0) return op;
  ADD_FAILURE() << "no op " << name;
  return g.ops.front();
}

PassCost layer_total(const ModuleCost& m) {
  PassCost c;
  for (const WorkStep& s : m.layer.steps) c += s.cost;
  return c;
}

// Per rank, a layer's model FLOPs are the whole layer's / (tp·cp); time drops nearly as much.
TEST(CostModel, TensorAndContextParallelismShardTheLayer) {
  Fixture f = gpt();
  Layout one, tp8;
  tp8.tp = 8;
  const PassCost a = layer_total(module_cost(f.g, one, true, f.dev, hardware::Precision::kBf16));
  const PassCost b = layer_total(module_cost(f.g, tp8, true, f.dev, hardware::Precision::kBf16));
  EXPECT_NEAR(a.forward_flops / b.forward_flops, 8.0, 1e-9);
  EXPECT_NEAR((a.dgrad_flops + a.wgrad_flops) / a.forward_flops, 2.0, 1e-9);
  EXPECT_GT(a.forward / b.forward, 6.0);
  EXPECT_LT(a.forward / b.forward, 8.5);
  // The layer's model FLOPs match the op graph's.
  EXPECT_NEAR(a.forward_flops.count() * 96, models::forward_flops(f.g).count(),
              0.02 * models::forward_flops(f.g).count());
}

// Without SP a layer has two "f" and two "g" points; SP does not change their number.
TEST(CostModel, LayerCommunicationPoints) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  for (bool sp : {false, true}) {
    l.sequence_parallel = sp;
    ModuleCost m = module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16);
    int entry = 0, exit = 0, compute = 0;
    for (const WorkStep& s : m.layer.steps) {
      entry += s.kind == StepKind::kTpEntry;
      exit += s.kind == StepKind::kTpExit;
      compute += s.kind == StepKind::kCompute;
      if (s.kind != StepKind::kCompute) {
        EXPECT_EQ(s.bytes, Bytes(2048LL * 12288 * 2));
      }
    }
    EXPECT_EQ(entry, 2);
    EXPECT_EQ(exit, 2);
    // norm | qkv | rope..attn_out | residual+norm | fc1 | act, fc2 | residual: the
    // column-parallel linear after each entry is a step of its own.
    EXPECT_EQ(compute, 7);
    for (size_t i = 0; i < m.layer.steps.size(); ++i) {
      const bool linear = i > 0 && m.layer.steps[i - 1].kind == StepKind::kTpEntry;
      EXPECT_EQ(m.layer.steps[i].overlaps_tp_entry, linear) << i;
      if (linear) {
        ASSERT_EQ(m.layer.steps[i].ops.size(), 1u);
        const std::string& name = f.g.ops[m.layer.steps[i].ops[0]].name;
        EXPECT_TRUE(name == "qkv" || name == "mlp_fc1") << name;
      }
    }
    // 12h^2 weights split over 8 ranks (norms replicated, a rounding error here).
    EXPECT_NEAR(static_cast<double>(m.layer.dense.all) * 8, 12.0 * 12288 * 12288,
                0.001 * 12 * 12288.0 * 12288);
    // Megatron's pipeline P2P shape: the sequence divided by tp under SP, else the whole.
    EXPECT_EQ(m.boundary_bytes, Bytes(2048LL * 12288 * 2 / (sp ? 8 : 1)));
  }
}

// Transformer Engine's GroupedLinear runs one cuBLAS GEMM per local expert on 4 streams:
// Mixtral's 8 experts on one rank take two rounds of 4 concurrent GEMMs, not one batch of 8,
// in the op's time and in its kernels alike; with EP 2 a rank's 4 experts are one round.
TEST(CostModel, GroupedExpertGemmsRunFourAtATime) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  const models::Op& fc1 = op_named(g, "expert_fc1");
  const auto bf16 = hardware::Precision::kBf16;
  // The kernels: one batched product per round, each of its experts a launch; the op's time
  // is theirs.
  auto rounds = [&](const Layout& l) {
    const std::vector<sim::Kernel> ks = op_kernels(fc1, g, l, true, bf16).forward;
    std::vector<std::pair<int64_t, int64_t>> out;  // batch, launches
    Time t;
    for (const sim::Kernel& k : ks) {
      out.emplace_back(k.batch, k.launches);
      t += kernel_time(k, dev, bf16);
    }
    EXPECT_EQ(op_cost(fc1, g, l, true, dev, bf16).forward, t);
    return out;
  };
  Layout one;
  const sim::Kernel k = op_kernels(fc1, g, one, true, bf16).forward.at(0);
  using Rounds = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(rounds(one), (Rounds{{4, 4}, {4, 4}}));
  EXPECT_EQ(op_cost(fc1, g, one, true, dev, bf16).forward,
            dev.gemm_time(k.m, k.n, k.k, 4, bf16) * 2);
  EXPECT_NE(dev.gemm_time(k.m, k.n, k.k, 4, bf16) * 2, dev.gemm_time(k.m, k.n, k.k, 8, bf16));
  Layout ep2;
  ep2.ep = 2;
  ep2.dp = 2;
  EXPECT_EQ(rounds(ep2), (Rounds{{4, 4}}));
  const sim::Kernel k2 = op_kernels(fc1, g, ep2, true, bf16).forward.at(0);
  EXPECT_EQ(op_cost(fc1, g, ep2, true, dev, bf16).forward,
            dev.gemm_time(k2.m, k2.n, k2.k, 4, bf16));
}

// A MoE layer under TP with SP: the attention keeps its entry and exit; the MLP's give way
// to Megatron-Core's dispatcher collectives: the permuted tokens (top_k per token, of every TP
// rank) all-gathered after the EP all-to-all and reduce-scattered before the one back, the
// Gemma's post-norms (TransformerSpec::post_norms) normalise the row-parallel linear's
// reduced output: under TP the exit comes between the linear and its norm, with SP or
// without, and each norm step runs on the TP rank's slice with SP (1/tp of the time).
TEST(CostModel, PostNormsRunAfterTheTpExit) {
  const models::OpGraph g = zoo_graph("gemma-3-27b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  for (bool sp : {false, true}) {
    Layout l;
    l.tp = 4;
    l.sequence_parallel = sp;
    const ModuleCost m = module_cost(g, l, true, dev, hardware::Precision::kBf16);
    // The layer's step kinds, each compute step named by its first op.
    std::vector<std::string> seq;
    for (const WorkStep& s : m.layer.steps)
      seq.push_back(s.kind == StepKind::kTpExit    ? "exit"
                    : s.kind == StepKind::kTpEntry ? "entry"
                    : s.ops.empty()                ? "?"
                                                   : g.ops[s.ops[0]].name);
    int exits = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] != "exit") continue;
      ++exits;
      ASSERT_LT(i + 1, seq.size());
      EXPECT_TRUE(seq[i + 1] == "attn_post_norm" || seq[i + 1] == "mlp_post_norm")
          << sp << " " << seq[i + 1];
    }
    EXPECT_EQ(exits, 2) << sp;
  }
}

// first expert GEMM not overlapping its entry. Mixtral-sized: 8 experts, top 2, h 4096.
TEST(CostModel, MoeLayerUnderSequenceParallelGathersThePermutedTokens) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  Layout l;
  l.tp = 2;
  l.sequence_parallel = true;
  l.ep = 4;
  l.dp = 4;
  const ModuleCost m = module_cost(g, l, true, dev, hardware::Precision::kBf16);
  std::vector<StepKind> comm;
  std::vector<Bytes> bytes;
  for (const WorkStep& s : m.layer.steps)
    if (s.kind != StepKind::kCompute) {
      comm.push_back(s.kind);
      bytes.push_back(s.bytes);
    }
  const Bytes hidden(4096LL * 4096 * 2), routed = hidden * 2;
  ASSERT_EQ(comm,
            (std::vector<StepKind>{StepKind::kTpEntry, StepKind::kTpExit, StepKind::kEpAllToAll,
                                   StepKind::kTpEntry, StepKind::kTpExit, StepKind::kEpAllToAll}));
  EXPECT_EQ(bytes, (std::vector<Bytes>{hidden, hidden, routed / 2, routed, routed, routed / 2}));
  for (const WorkStep& s : m.layer.steps)
    if (s.overlaps_tp_entry) {
      ASSERT_EQ(s.ops.size(), 1u);
      EXPECT_EQ(g.ops[s.ops[0]].name, "qkv");
    }
  // Folded (etp 1): whole experts on this rank's slice, nothing gathered; the same FLOPs.
  Layout folded = l;
  folded.etp = 1;
  folded.ep = 8;
  folded.dp = 4;
  const ModuleCost f = module_cost(g, folded, true, dev, hardware::Precision::kBf16);
  comm.clear();
  for (const WorkStep& s : f.layer.steps)
    if (s.kind != StepKind::kCompute) comm.push_back(s.kind);
  EXPECT_EQ(comm, (std::vector<StepKind>{StepKind::kTpEntry, StepKind::kTpExit,
                                         StepKind::kEpAllToAll, StepKind::kEpAllToAll}));
  const OpKernels k =
      op_kernels(op_named(g, "expert_fc1"), g, folded, true, hardware::Precision::kBf16);
  ASSERT_FALSE(k.forward.empty());
  EXPECT_EQ(k.forward[0].n, 2 * 14336);  // gate and up whole; split over etp = tp 2, half
  EXPECT_EQ(
      op_kernels(op_named(g, "expert_fc1"), g, l, true, hardware::Precision::kBf16).forward[0].n,
      14336);
  EXPECT_NEAR(layer_total(f).forward_flops / layer_total(m).forward_flops, 1.0, 1e-9);
  // Per rank: one whole expert of eight, as many weights as two halves of experts / 4.
  EXPECT_EQ(f.layer.expert.all, m.layer.expert.all);
}

// FP8 under SP: the layer's entries gather qkv's and fc1's inputs as FP8 (1 byte per element,
// Transformer Engine quantises before the all-gather); their gradients' reduce-scatters, and
// everything in bf16, keep 2 bytes.
TEST(CostModel, Fp8SequenceParallelGathersFp8Inputs) {
  Fixture f = gpt(1, true, 2, "dgx-h100");
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  for (hardware::Precision p : {hardware::Precision::kBf16, hardware::Precision::kFp8}) {
    ModuleCost m = module_cost(f.g, l, true, f.dev, p);
    int entries = 0;
    for (const WorkStep& s : m.layer.steps) {
      if (s.kind != StepKind::kTpEntry) continue;
      ++entries;
      EXPECT_EQ(s.bytes, Bytes(2048LL * 12288 * 2));
      EXPECT_EQ(s.gather_bytes, p == hardware::Precision::kFp8 ? s.bytes / 2 : s.bytes);
    }
    EXPECT_EQ(entries, 2);
    for (const WorkStep& s : m.post.steps) {  // the logits: Megatron's own bf16 output layer
      if (s.kind == StepKind::kTpEntry) {
        EXPECT_EQ(s.gather_bytes, s.bytes);
      }
    }
  }
}

// Without the backward overlap (Megatron-LM of 2021) the linear merges with its neighbours
// again: five compute steps, none flagged.
TEST(CostModel, BlockingTpBackwardKeepsTheLinearInItsStep) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  l.tp_backward_overlap = false;
  ModuleCost m = module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16);
  int compute = 0;
  for (const WorkStep& s : m.layer.steps) {
    compute += s.kind == StepKind::kCompute;
    EXPECT_FALSE(s.overlaps_tp_entry);
  }
  EXPECT_EQ(compute, 5);  // norm | qkv..attn_out | residual+norm | mlp | residual
}

// Sequence parallelism splits norms and residuals over tp: the layer's memory-bound time drops.
TEST(CostModel, SequenceParallelShardsPointwiseWork) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  const PassCost a = layer_total(module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16));
  l.sequence_parallel = true;
  const PassCost b = layer_total(module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16));
  EXPECT_LT(b.forward, a.forward);
  EXPECT_DOUBLE_EQ(a.forward_flops.count(), b.forward_flops.count());
}

TEST(CostModel, ContextParallelAttentionIsARingStep) {
  Fixture f = gpt();
  Layout l;
  l.cp = 4;
  ModuleCost m = module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16);
  int rings = 0;
  for (const WorkStep& s : m.layer.steps)
    if (s.kind == StepKind::kCpAttention) {
      ++rings;
      EXPECT_EQ(s.bytes, Bytes(2LL * 512 * 12288 * 2));  // K and V of 2048/4 tokens
    }
  EXPECT_EQ(rings, 1);
  EXPECT_EQ(m.boundary_bytes, Bytes(512LL * 12288 * 2));
  // Encoders are not split by CP: every cp rank repeats them.
  ModuleCost rep = module_cost(f.g, l, false, f.dev, hardware::Precision::kBf16);
  EXPECT_GT(layer_total(rep).forward_flops / layer_total(m).forward_flops, 3.9);
}

// On a profile with unmasked rates (the H100's) the causal ring masks only its diagonal
// step: the other, of as many FLOPs, runs unmasked at the pace of the ring's slowest rank,
// whose queries meet half the arrived chunk (512 keys). The same GPT-3 layout as below,
// tp 8, cp 2, s 2048; an attention without a causal mask runs unmasked at cp 1 too.
TEST(CostModel, TheRingMasksOnlyItsDiagonalStep) {
  Fixture f = gpt(1, true, 2, "dgx-h100");
  Layout l;
  l.tp = 8;
  l.cp = 2;
  const models::Op& attn = op_named(f.g, "attention");
  const auto bf16 = hardware::Precision::kBf16;
  const PassCost c = op_cost(attn, f.g, l, true, f.dev, bf16);
  const double n = 1024.0 * 12 * 128, lse = 1024.0 * 12 * 4;
  const Bytes fwd(static_cast<int64_t>(2 * (4 * n + 4.25 * n) + 7.75 * lse));
  const Flops one = c.forward_flops / 2;
  const Time masked = f.dev.attention_time(one, bf16, false, 1024);
  const Time unmasked = f.dev.attention_time(one, bf16, false, 512, nullptr, false);
  EXPECT_EQ(c.forward, masked + unmasked + f.dev.memory_kernel_time(fwd / 2) * 2);
  EXPECT_LT(unmasked, masked);
  EXPECT_EQ(c.ring_diagonal_forward, masked - unmasked);
  models::Op bidirectional = attn;
  bidirectional.attention->causal = false;
  Layout one_rank;
  one_rank.tp = 8;
  EXPECT_EQ(op_cost(bidirectional, f.g, one_rank, true, f.dev, bf16).forward,
            f.dev.attention_time(op_cost(attn, f.g, one_rank, true, f.dev, bf16).forward_flops,
                                 bf16, false, 2048, nullptr, false));
}

// Under CP the flash attention is cp calls at the chunk's key length plus the ring's
// memory-bound corrections and accumulations (TE's AttnFuncWithCPAndKVP2P): GPT-3 175B,
// 96 heads (no GQA), tp 8, cp 2, s 2048, bf16. Nq = Nkv = 1024 x 12 x 128, L = 1024 x 12.
TEST(CostModel, ContextParallelAttentionPaysTheRingsCorrections) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  l.cp = 2;
  const models::Op& attn = op_named(f.g, "attention");
  const PassCost c = op_cost(attn, f.g, l, true, f.dev, hardware::Precision::kBf16);
  const double n = 1024.0 * 12 * 128, lse = 1024.0 * 12 * 4;
  const Bytes fwd(static_cast<int64_t>(2 * (4 * n + 4.25 * n) + 7.75 * lse));
  const Bytes bwd(static_cast<int64_t>(2 * (12.5 * n + 4.25 * n) + lse));
  const Time kernels_fwd =
      f.dev.attention_time(c.forward_flops / 2, hardware::Precision::kBf16, false, 1024) * 2;
  const Time kernels_bwd =
      f.dev.attention_time(c.dgrad_flops / 2, hardware::Precision::kBf16, true, 1024) * 2;
  // The ring's memory passes run once per ring step: cp kernels of 1/cp of the bytes.
  EXPECT_EQ(c.forward, kernels_fwd + f.dev.memory_kernel_time(fwd / 2) * 2);
  EXPECT_EQ(c.dgrad, kernels_bwd + f.dev.memory_kernel_time(bwd / 2) * 2);
  // And the kernels say the same (the executor runs them).
  const OpKernels k = op_kernels(attn, f.g, l, true, hardware::Precision::kBf16);
  ASSERT_EQ(k.forward.size(), 2u);
  EXPECT_EQ(k.forward[1].bytes, fwd.count());
  ASSERT_EQ(k.dgrad.size(), 2u);
  EXPECT_EQ(k.dgrad[1].bytes, bwd.count());
  // Without CP nothing is added.
  Layout none;
  none.tp = 8;
  EXPECT_EQ(op_kernels(attn, f.g, none, true, hardware::Precision::kBf16).forward.size(), 1u);
}

// An unfused MLP activation (Layout::fused_activation false) runs the kernels eager autograd
// launches, in passes over its output (E elements of 2 bytes on each of tp ranks): squared
// ReLU relu + pow (1 + 1 each) forward, pow_backward's copy, scalar mul and mul and relu's
// threshold_backward (2 + 2 + 3 + 3) backward; SwiGLU silu + mul (2 + 3), backward the mul's
// two gradients, silu_backward and the chunk's cat (3 + 3 + 3 + 4). GELU and the fused
// default keep one kernel each way.
// The embedding's backward returns a dense gradient of its whole local table (PyTorch's
// embedding_dense_backward zero-fills it, then adds the token rows) and Megatron's DDP hook
// adds it into main_grad, every micro-batch: Llama 3.1 8B's 128256 x 4096 table, vocab-
// parallel over tp. torch FSDP2 has no main_grad: the fill alone.
TEST(CostModel, EmbeddingGradientFillsAndAddsTheWholeTable) {
  const auto dev = hardware::load_profile("dgx-h100")->gpu;
  const models::OpGraph g = zoo_graph("llama-3.1-8b", 8192);
  const models::Op& emb = op_named(g, "embedding");
  const int64_t table = int64_t{128256} * 4096;
  ASSERT_EQ(emb.params, table);
  const auto kernels = [&](const Layout& l, hardware::Precision p) {
    std::vector<int64_t> out;
    for (const sim::Kernel& k : op_kernels(emb, g, l, true, p).wgrad) out.push_back(k.bytes);
    return out;
  };
  const int64_t scatter = 2 * 2 * 8192 * 4096 * 2;  // the token rows, read + write, twice
  Layout l;
  l.tp = 2;
  // bf16 weights, fp32 main_grad: a 2-byte fill, then 2 + 4 + 4 bytes per element.
  EXPECT_EQ(kernels(l, hardware::Precision::kBf16),
            (std::vector<int64_t>{scatter, table / 2 * 2, table / 2 * 10}));
  l.grad_reduce_dtype = GradReduceDtype::kBf16;  // a bf16 main_grad: 2 + 2 + 2
  EXPECT_EQ(kernels(l, hardware::Precision::kBf16),
            (std::vector<int64_t>{scatter, table / 2 * 2, table / 2 * 6}));
  // op_cost times those kernels, gradient accumulation fusion or not.
  Time t;
  for (int64_t b : kernels(l, hardware::Precision::kBf16)) t += dev.memory_kernel_time(Bytes(b));
  EXPECT_EQ(op_cost(emb, g, l, true, dev, hardware::Precision::kBf16).wgrad, t);
  l.gradient_accumulation_fusion = false;
  EXPECT_EQ(op_cost(emb, g, l, true, dev, hardware::Precision::kBf16).wgrad, t);
  Layout fsdp2;
  fsdp2.fsdp = true;
  fsdp2.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
  fsdp2.gradient_accumulation_fusion = false;
  EXPECT_EQ(kernels(fsdp2, hardware::Precision::kBf16), (std::vector<int64_t>{scatter, table * 2}));
}

TEST(CostModel, UnfusedActivationRunsEagerKernels) {
  const auto dev = hardware::load_profile("dgx-h100")->gpu;
  Layout fused, eager;
  fused.tp = eager.tp = 2;
  eager.fused_activation = false;
  const auto check = [&](std::string_view model, int64_t f, std::vector<int64_t> fwd,
                         std::vector<int64_t> bwd) {
    const models::OpGraph g = zoo_graph(model, 4096);
    const models::Op& act = op_named(g, "mlp_act");
    const int64_t pass = 4096 * (f / 2) * 2;  // E x 2 bytes on one of tp 2 ranks
    const OpKernels k = op_kernels(act, g, eager, true, hardware::Precision::kBf16);
    ASSERT_EQ(k.forward.size(), fwd.size()) << model;
    ASSERT_EQ(k.dgrad.size(), bwd.size()) << model;
    Time t_fwd, t_bwd;
    for (size_t i = 0; i < fwd.size(); ++i) {
      EXPECT_EQ(k.forward[i].bytes, fwd[i] * pass) << model << " forward " << i;
      t_fwd += dev.memory_kernel_time(Bytes(fwd[i] * pass));
    }
    for (size_t i = 0; i < bwd.size(); ++i) {
      EXPECT_EQ(k.dgrad[i].bytes, bwd[i] * pass) << model << " backward " << i;
      t_bwd += dev.memory_kernel_time(Bytes(bwd[i] * pass));
    }
    // op_cost times the same kernels, and more than the fused kernel pair.
    const PassCost c = op_cost(act, g, eager, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(c.forward, t_fwd) << model;
    EXPECT_EQ(c.dgrad, t_bwd) << model;
    const PassCost one = op_cost(act, g, fused, true, dev, hardware::Precision::kBf16);
    EXPECT_GT(c.forward, one.forward) << model;
    EXPECT_GT(c.dgrad, one.dgrad) << model;
    EXPECT_EQ(op_kernels(act, g, fused, true, hardware::Precision::kBf16).forward.size(), 1u);
  };
  check("nemotron-4-15b", 24576, {2, 2}, {2, 2, 3, 3});
  check("llama-3.1-8b", 14336, {2, 3}, {3, 3, 3, 4});
  // GELU: F.gelu and gelu_backward, one kernel each way, fused or not.
  const models::OpGraph g = zoo_graph("gpt3-175b", 2048);
  const models::Op& act = op_named(g, "mlp_act");
  EXPECT_EQ(op_cost(act, g, eager, true, dev, hardware::Precision::kBf16).forward,
            op_cost(act, g, fused, true, dev, hardware::Precision::kBf16).forward);
}

// Unfused RoPE (Layout::fused_rope false, or YaRN's scaled cos and sin, which Transformer
// Engine's fused kernel cannot take) runs Megatron-Core's _apply_rotary_pos_emb_bshd on the
// queries, then the keys: six small kernels on the fp32 frequencies (tokens x rotated
// channels, 8 bytes each), then passes over the rotated share f of the tensor t (t * cos 2,
// the negation 1, rotate_half's cat 2, * sin 2, the sum 3) and the cat with the rest (2);
// backward the products' gradients (2, 2), the negation's (1), the chunk's cat (2), their
// sum (3), each slice's zeros (1) and copy (2f; 2(1 - f) where f < 1) and the sum (3).
TEST(CostModel, UnfusedRopeRunsEagerKernels) {
  const auto dev = hardware::load_profile("dgx-h100")->gpu;
  const auto bytes = [](const std::vector<sim::Kernel>& ks) {
    std::vector<int64_t> out;
    for (const sim::Kernel& k : ks) out.push_back(k.bytes);
    return out;
  };
  // The kernels of rope under `l` on a rank holding 4096 tokens of q and k heads of width d
  // (bf16), rotating f of each: checked against op_kernels and returned.
  struct Expected {
    std::vector<int64_t> fwd, bwd;
  };
  const auto check = [&](const models::OpGraph& g, const Layout& l, int64_t d, double f, int64_t q,
                         int64_t k) {
    Expected e;
    for (int64_t heads : {q, k}) {
      const double t = 4096.0 * static_cast<double>(heads * d * 2);
      auto of = [&](double x) { return static_cast<int64_t>(t * x); };
      for (int i = 0; i < 6; ++i) e.fwd.push_back(8 * static_cast<int64_t>(4096.0 * d * f));
      for (double x : {2 * f, f, 2 * f, 2 * f, 3 * f, 2.0}) e.fwd.push_back(of(x));
      for (double x : {2 * f, 2 * f, f, 2 * f, 3 * f, 1.0, 2 * f, 1.0}) e.bwd.push_back(of(x));
      if (f < 1) e.bwd.push_back(of(2 * (1 - f)));
      e.bwd.push_back(of(3));
    }
    const OpKernels got = op_kernels(op_named(g, "rope"), g, l, true, hardware::Precision::kBf16);
    EXPECT_EQ(bytes(got.forward), e.fwd);
    EXPECT_EQ(bytes(got.dgrad), e.bwd);
    return e;
  };
  Layout fused, eager;
  eager.fused_rope = false;
  // Llama 3.1 8B (32 query heads, 8 key heads of 128), 4096 tokens on one rank: the fused
  // kernel unless the plan unfuses it; op_cost times the same kernels.
  {
    const models::OpGraph g = zoo_graph("llama-3.1-8b", 4096);
    const models::Op& rope = op_named(g, "rope");
    ASSERT_TRUE(rope.rope.has_value());
    EXPECT_FALSE(rope.rope->scaled);
    EXPECT_EQ(op_kernels(rope, g, fused, true, hardware::Precision::kBf16).forward.size(), 1u);
    const Expected e = check(g, eager, 128, 1, 32, 8);
    Time t_fwd, t_bwd;
    for (int64_t b : e.fwd) t_fwd += dev.memory_kernel_time(Bytes(b));
    for (int64_t b : e.bwd) t_bwd += dev.memory_kernel_time(Bytes(b));
    const PassCost c = op_cost(rope, g, eager, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(c.forward, t_fwd);
    EXPECT_EQ(c.dgrad, t_bwd);
    const PassCost one = op_cost(rope, g, fused, true, dev, hardware::Precision::kBf16);
    EXPECT_GT(c.forward, one.forward * 3);
    EXPECT_GT(c.dgrad, one.dgrad * 3);
  }
  // Nemotron-4 15B rotates half of each head (48 query, 8 key heads of 128), tp 2: the rotated
  // share's passes halve, the whole-tensor ones stay.
  Layout half = eager;
  half.tp = 2;
  check(zoo_graph("nemotron-4-15b", 4096), half, 128, 0.5, 24, 4);
  // gpt-oss's YaRN scales cos and sin by 1.35: unfused even where the plan fuses RoPE.
  {
    const models::OpGraph g = zoo_graph("gpt-oss-120b", 4096);
    ASSERT_TRUE(op_named(g, "rope").rope.has_value());
    EXPECT_TRUE(op_named(g, "rope").rope->scaled);
    check(g, fused, 64, 1, 64, 8);
  }
  // DeepSeek-V3's YaRN leaves cos and sin unscaled (mscale = mscale_all_dim), and MLA's own
  // kernel would scale them anyway: fused.
  {
    const models::OpGraph g = zoo_graph("deepseek-v3", 4096);
    const models::Op& rope = op_named(g, "rope");
    ASSERT_TRUE(rope.rope.has_value());
    EXPECT_FALSE(rope.rope->scaled);
    EXPECT_EQ(rope.parts, (std::vector<int64_t>{128 * 64, 64}));
    EXPECT_EQ(op_kernels(rope, g, fused, true, hardware::Precision::kBf16).forward.size(), 1u);
  }
}

// Llama 4's top-1 routing scales each expert's input by its probability (Megatron-Core's
// moe_apply_probs_on_input): forward the fp32 product, its cast back to bf16 and the
// probabilities reset to ones; backward the cast's, the input's gradient and its cast back,
// the probabilities' gradient and its sum over the width. Over the copies the rank's experts
// receive: 4096 on one rank, the sequence slice under SP with whole experts, the TP group's
// when the experts split over TP. op_cost times the same kernels.
TEST(CostModel, ProbsOnInputScalesEachExpertInput) {
  const auto dev = hardware::load_profile("dgx-h100")->gpu;
  const models::OpGraph g = zoo_graph("llama-4-maverick", 4096);
  const auto it = std::find_if(g.ops.begin(), g.ops.end(),
                               [](const models::Op& o) { return o.name == "moe_probs_in"; });
  ASSERT_NE(it, g.ops.end());
  const models::Op& op = *it;
  EXPECT_EQ(op.layer, 1);  // the first MoE layer (layer_pattern [0, 1])
  const auto check = [&](const Layout& l, int64_t tokens) {
    const int64_t x = tokens * 5120 * 2, f = tokens * 5120 * 4, rows = tokens * 4;
    const OpKernels k = op_kernels(op, g, l, true, hardware::Precision::kBf16);
    std::vector<int64_t> fwd, bwd;
    for (const sim::Kernel& kn : k.forward) fwd.push_back(kn.bytes);
    for (const sim::Kernel& kn : k.dgrad) bwd.push_back(kn.bytes);
    EXPECT_EQ(fwd, (std::vector<int64_t>{x + rows + f, f + x, rows}));
    EXPECT_EQ(bwd, (std::vector<int64_t>{x + f, 2 * f + rows, f + x, 2 * f + x, f + rows}));
    Time t_fwd, t_bwd;
    for (int64_t b : fwd) t_fwd += dev.memory_kernel_time(Bytes(b));
    for (int64_t b : bwd) t_bwd += dev.memory_kernel_time(Bytes(b));
    const PassCost c = op_cost(op, g, l, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(c.forward, t_fwd);
    EXPECT_EQ(c.dgrad, t_bwd);
  };
  check(Layout{}, 4096);
  Layout sp;
  sp.tp = 4;
  sp.sequence_parallel = true;
  sp.dp = 2;
  sp.ep = 8;
  sp.etp = 1;
  check(sp, 1024);
  sp.etp = 0;  // the experts split over TP: the TP group's tokens, gathered
  sp.ep = 2;
  check(sp, 4096);
  // Without the field: no such op.
  for (const models::Op& o : zoo_graph("mixtral-8x7b", 4096).ops) EXPECT_NE(o.name, "moe_probs_in");
}

// FP8 current scaling (tensorwise) quantises each tensor with three kernels (amax, scale,
// cast + transpose) where delayed scaling runs the cast alone. Per Linear GEMM: forward, the
// cast the norm can no longer fuse in front of qkv / fc1 (4 bytes per element of the local
// input, sharded by tp under SP) and its scale kernel, or attn_out's amax pass (2 bytes) and
// scale kernel before its cast; fc2 (amax fused with the activation) the scale kernel;
// backward, the amax pass and scale kernel before each output gradient's cast (2 bytes).
// GPT-3 175B, tp 8 with SP.
TEST(CostModel, Fp8CurrentScalingAddsTheAmaxPasses) {
  Fixture f = gpt(1, true, 1, "dgx-h100");
  Layout delayed;
  delayed.tp = 8;
  delayed.sequence_parallel = true;
  Layout current = delayed;
  current.fp8_recipe = Fp8Recipe::kTensorwise;
  const int64_t t = 2048, h = 12288, scale = 12;
  // Per op: the kernels current scaling adds forward and backward, as their bytes.
  using Bytes2 = std::vector<int64_t>;
  const std::map<std::string, std::pair<Bytes2, Bytes2>> extra = {
      // 0: the memset zeroing an amax, a host call without GPU time.
      {"qkv", {{scale, 4 * t * h / 8}, {0, 2 * t * 3 * h / 8, scale}}},
      {"attn_out", {{0, 2 * t * h / 8, scale}, {0, 2 * t * h, scale}}},
      {"mlp_fc1", {{scale, 4 * t * h / 8}, {0, 2 * t * 4 * h / 8, scale}}},
      {"mlp_fc2", {{scale}, {0, 2 * t * h, scale}}}};
  // The kernels of `b` not in `a` (memory kernels by size), in b's order.
  auto added = [](const std::vector<sim::Kernel>& a, const std::vector<sim::Kernel>& b) {
    std::multiset<int64_t> left;
    for (const sim::Kernel& k : a) left.insert(k.kind == sim::KernelKind::kMemory ? k.bytes : -1);
    Bytes2 out;
    for (const sim::Kernel& k : b) {
      auto it = left.find(k.kind == sim::KernelKind::kMemory ? k.bytes : -1);
      if (it != left.end())
        left.erase(it);
      else
        out.push_back(k.bytes);
    }
    return out;
  };
  for (const auto& [name, bytes] : extra) {
    const models::Op& op = op_named(f.g, name);
    const OpKernels a = op_kernels(op, f.g, delayed, true, hardware::Precision::kFp8);
    const OpKernels b = op_kernels(op, f.g, current, true, hardware::Precision::kFp8);
    EXPECT_EQ(added(a.forward, b.forward), bytes.first) << name;
    EXPECT_EQ(added(a.dgrad, b.dgrad), bytes.second) << name;
    const PassCost ca = op_cost(op, f.g, delayed, true, f.dev, hardware::Precision::kFp8);
    const PassCost cb = op_cost(op, f.g, current, true, f.dev, hardware::Precision::kFp8);
    EXPECT_EQ(cb.dgrad - ca.dgrad, f.dev.memory_kernel_time(Bytes(bytes.second[1])) +
                                       f.dev.memory_kernel_time(Bytes(scale)))
        << name;
  }
  // The logits GEMM (bf16) and the norms are untouched.
  for (std::string_view name : {"logits", "attn_norm"})
    EXPECT_EQ(
        op_cost(op_named(f.g, name), f.g, current, true, f.dev, hardware::Precision::kFp8).forward,
        op_cost(op_named(f.g, name), f.g, delayed, true, f.dev, hardware::Precision::kFp8).forward);
}

// FP8 grouped experts (Transformer Engine's GroupedLinear): fc1 quantises the permuted
// tokens itself (a MoE layer's norm is a module of its own), so both expert linears cast
// their input. Delayed scaling casts all local experts in one multi-tensor kernel; current
// scaling quantises each expert on its own, four calls apiece (a memset of its amax, the
// amax, the scale, the cast). Either way the GEMMs are one batched product launched once
// per local expert. Mixtral 8x7B, ep 2: four local experts.
TEST(CostModel, Fp8GroupedExpertsQuantiseEachExpertUnderCurrentScaling) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  Layout delayed;
  delayed.ep = 2;
  delayed.dp = 2;
  Layout current = delayed;
  current.fp8_recipe = Fp8Recipe::kTensorwise;
  auto memory_kernels = [](const std::vector<sim::Kernel>& ks) {
    int n = 0;
    for (const sim::Kernel& k : ks) n += k.kind == sim::KernelKind::kMemory ? 1 : 0;
    return n;
  };
  for (std::string_view name : {"expert_fc1", "expert_fc2"}) {
    const models::Op& op = op_named(g, name);
    const OpKernels d = op_kernels(op, g, delayed, true, hardware::Precision::kFp8);
    const OpKernels c = op_kernels(op, g, current, true, hardware::Precision::kFp8);
    EXPECT_EQ(memory_kernels(d.forward), 1) << name;  // one fused cast of every expert
    EXPECT_EQ(memory_kernels(d.dgrad), 1) << name;
    EXPECT_EQ(memory_kernels(c.forward), 4 * 4) << name;  // memset, amax, scale, cast
    EXPECT_EQ(memory_kernels(c.dgrad), 4 * 4) << name;
    for (const OpKernels* k : {&d, &c})
      for (const auto* pass : {&k->forward, &k->dgrad, &k->wgrad})
        for (const sim::Kernel& x : *pass)
          EXPECT_EQ(x.launches, x.kind == sim::KernelKind::kGemm ? 4 : 1) << name;
    // The same cast bytes either way: the input of all 4 experts, 4 bytes per element.
    const sim::Kernel& gemm = d.forward[0];
    EXPECT_EQ(d.forward[1].bytes, 4 * gemm.m * gemm.k * gemm.batch) << name;
  }
}

// The MoE layer's small kernels beyond the op graph's traffic (cost_model.cpp, moe_kernels):
// the fused router's six forward and six backward kernels over the T x E fp32 scores; the
// dispatcher's count sums, its copies of the counts to the host (host calls, no GPU time)
// and the fused permute's three row-id-map passes, and backward the MoE input's gradient
// branches added. Mixtral 8x7B over 4096 tokens: 8 experts.
TEST(CostModel, MoeLayersRunTheRoutersAndTheDispatchersSmallKernels) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  const int64_t scores = 4096 * 8;
  auto bytes = [](const std::vector<sim::Kernel>& ks) {
    std::vector<int64_t> out;
    for (const sim::Kernel& k : ks)
      if (k.kind == sim::KernelKind::kMemory) out.push_back(k.bytes);
    return out;
  };
  auto time = [&](const std::vector<sim::Kernel>& ks) {
    Time t;
    for (const sim::Kernel& k : ks) t += kernel_time(k, dev, hardware::Precision::kBf16);
    return t;
  };
  for (int ep : {1, 2}) {
    Layout l;
    l.ep = ep;
    l.dp = 2;
    const models::Op& router = op_named(g, "router");
    const OpKernels r = op_kernels(router, g, l, true, hardware::Precision::kBf16);
    EXPECT_EQ(bytes(r.forward), std::vector<int64_t>(6, 8 * scores)) << ep;
    EXPECT_EQ(bytes(r.dgrad), std::vector<int64_t>(6, 8 * scores)) << ep;
    EXPECT_TRUE(bytes(r.wgrad).empty()) << ep;
    const PassCost rc = op_cost(router, g, l, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(rc.forward, time(r.forward)) << ep;
    EXPECT_EQ(rc.dgrad, time(r.dgrad)) << ep;

    const models::Op& dispatch = op_named(g, "moe_dispatch");
    const OpKernels d = op_kernels(dispatch, g, l, true, hardware::Precision::kBf16);
    std::vector<int64_t> fwd = bytes(d.forward);
    ASSERT_FALSE(fwd.empty());
    fwd.erase(fwd.begin());  // the permute's own traffic (the op graph's)
    std::vector<int64_t> want(ep > 1 ? 6 : 1, scores);  // count sums over the routing map
    want.insert(want.end(), ep > 1 ? 4 : 1, 0);         // the counts copied to the host
    want.insert(want.end(), 3, 5 * scores);             // the row-id map
    EXPECT_EQ(fwd, want) << ep;
    ASSERT_EQ(d.dgrad.size(), 2u) << ep;
    EXPECT_EQ(d.dgrad[1].bytes, 3 * 4096 * 4096 * 2) << ep;  // two bf16 gradients added
    const PassCost dc = op_cost(dispatch, g, l, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(dc.forward, time(d.forward)) << ep;
    EXPECT_EQ(dc.dgrad, time(d.dgrad)) << ep;
  }
  // A dense model has none.
  Fixture f = gpt(1, true, 1, "dgx-h100");
  EXPECT_EQ(op_kernels(op_named(f.g, "mlp_fc1"), f.g, Layout{}, true, hardware::Precision::kBf16)
                .forward.size(),
            1u);
}

// Latent attention under TP with SP (Megatron-Core's MLASelfAttention with Transformer
// Engine): no gather after the input norm; the down projections run whole on this rank's
// sequence slice and their weights' gradients are all-reduced over TP; one TP entry gathers
// the latents (1536 + 512 + 64 wide for DeepSeek-V3) before the up projections, which TP
// splits by columns.
TEST(CostModel, LatentAttentionGathersItsLatents) {
  const models::OpGraph g = zoo_graph("deepseek-v3", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  Layout l;
  l.tp = 4;
  l.sequence_parallel = true;
  l.ep = 4;
  l.dp = 1;
  const ModuleCost m = module_cost(g, l, true, dev, hardware::Precision::kBf16);
  const Block& dense = m.dense_layer;  // layer 0 (DeepSeek-V3's first 3 are dense)
  std::vector<Bytes> entries;
  for (const WorkStep& s : dense.steps)
    if (s.kind == StepKind::kTpEntry) entries.push_back(s.bytes);
  ASSERT_EQ(entries.size(), 2u);  // the latents' and the MLP's
  EXPECT_EQ(entries[0], Bytes(4096 * (1536 + 512 + 64) * 2));
  EXPECT_EQ(entries[1], Bytes(4096 * 7168 * 2));
  const models::Op& down = op_named(g, "q_down");
  const PassCost c = op_cost(down, g, l, true, dev, hardware::Precision::kBf16);
  EXPECT_DOUBLE_EQ(c.forward_flops.count(), down.forward.count() / 4);
  const models::Op& up = op_named(g, "q_up");
  EXPECT_DOUBLE_EQ(op_cost(up, g, l, true, dev, hardware::Precision::kBf16).forward_flops.count(),
                   up.forward.count() / 4);
  int64_t synced = 0;  // the down projections' and the norms' parameters
  for (const char* name : {"q_down", "kv_down", "attn_norm", "q_norm", "kv_norm", "mlp_norm"})
    synced += op_named(g, name).params;
  EXPECT_EQ(dense.tp_synced, synced);
  EXPECT_EQ(
      dense.dense.all - synced,
      (op_named(g, "q_up").params + op_named(g, "kv_up").params + op_named(g, "attn_out").params +
       op_named(g, "mlp_fc1").params + op_named(g, "mlp_fc2").params) /
          4);
}

// A profile's time per score element (gpu.attention.fwd_element_ps) counts the score
// matrix's elements, b·h·s_q·s_kv (half causal), also where keys and values differ in width
// (latent attention: the FLOPs count their mean per element).
TEST(CostModel, LatentAttentionsScoreElements) {
  const models::OpGraph g = zoo_graph("deepseek-v3", 4096);
  hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  const models::Op& attention = op_named(g, "attention");
  const Layout l;
  const Time without = op_cost(attention, g, l, true, dev, hardware::Precision::kBf16).forward;
  dev.attention_fwd_element_ps = 1000;
  const Time with = op_cost(attention, g, l, true, dev, hardware::Precision::kBf16).forward;
  const double elements = 128.0 * 4096 * 4096 / 2;
  EXPECT_NEAR((with - without).to_seconds(),
              elements * 1e-9 / (dev.attention_sustain * dev.compute_scale), 1e-9);
}

// A sliding window's attention (gpt-oss: 128 keys, odd 1-based layers): its FLOPs are the
// band's, at the rate of a causal call of twice the window (a short call's, lower than a
// 4096-token one's), its kernels carry the window; the cost model builds a windowed and a
// full layer, which differ only in their attention, and layer_block() hands each layer its
// own.
TEST(CostModel, SlidingWindowLayersRunTheirBand) {
  const models::OpGraph g = zoo_graph("gpt-oss-120b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  const Layout l;
  const models::Op* windowed = nullptr;
  const models::Op* full = nullptr;
  for (const models::Op& op : g.ops)
    if (op.kind == models::OpKind::kAttention) (op.layer == 0 ? windowed : full) = &op;
  // (full: the last layer's)
  ASSERT_TRUE(windowed && full);
  ASSERT_EQ(windowed->attention->window, 128);
  ASSERT_EQ(full->attention->window, 0);
  const PassCost w = op_cost(*windowed, g, l, true, dev, hardware::Precision::kBf16);
  const PassCost f = op_cost(*full, g, l, true, dev, hardware::Precision::kBf16);
  const double band = 4096.0 * 128 - 128.0 * 128 / 2, causal = 4096.0 * 4096 / 2;
  EXPECT_DOUBLE_EQ(w.forward_flops.count() / f.forward_flops.count(), band / causal);
  // Per FLOP slower than the long causal call, and still far faster in all.
  EXPECT_GT(w.forward.to_seconds() / w.forward_flops.count(),
            f.forward.to_seconds() / f.forward_flops.count());
  EXPECT_LT(w.forward.to_seconds(), 0.2 * f.forward.to_seconds());
  const Time at_256 = dev.attention_time(w.forward_flops, hardware::Precision::kBf16, false, 256,
                                         nullptr, true, 64);
  EXPECT_EQ(w.forward, at_256);
  const OpKernels k = op_kernels(*windowed, g, l, true, hardware::Precision::kBf16);
  ASSERT_EQ(k.forward.size(), 1u);
  EXPECT_EQ(k.forward[0].window, 128);
  EXPECT_DOUBLE_EQ(k.forward[0].flops(), w.forward_flops.count());
  EXPECT_EQ(kernel_time(k.forward[0], dev, hardware::Precision::kBf16), w.forward);

  const ModuleCost m = module_cost(g, l, true, dev, hardware::Precision::kBf16);
  ASSERT_FALSE(m.window_layer.empty());
  EXPECT_TRUE(m.window_dense_layer.empty());
  EXPECT_TRUE(m.dense_layer.empty());
  for (int64_t i = 0; i < 36; ++i)
    EXPECT_EQ(&m.layer_block(i), i % 2 == 0 ? &m.window_layer : &m.layer) << i;
  auto total = [](const Block& b) {
    Time t;
    for (const WorkStep& s : b.steps) t += s.cost.forward;
    return t;
  };
  EXPECT_EQ(total(m.layer) - total(m.window_layer), f.forward - w.forward);
  EXPECT_EQ(m.layer.dense.all, m.window_layer.dense.all);
  EXPECT_EQ(m.layer.expert.all, m.window_layer.expert.all);
}

// Under TP with SP the router runs on this rank's sequence slice (Megatron-Core's MoELayer
// routes its [s/tp, b, h] input): its GEMM takes 1/tp of the tokens and of the FLOPs, as
// its small kernels do; without SP every TP rank routes them all.
TEST(CostModel, TheRouterRunsOnTheSequenceSlice) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  const models::Op& router = op_named(g, "router");
  for (bool sp : {false, true}) {
    Layout l;
    l.tp = 2;
    l.sequence_parallel = sp;
    l.ep = 2;
    const PassCost c = op_cost(router, g, l, true, dev, hardware::Precision::kBf16);
    EXPECT_DOUBLE_EQ(c.forward_flops.count(), router.forward.count() / (sp ? 2 : 1)) << sp;
    const OpKernels k = op_kernels(router, g, l, true, hardware::Precision::kBf16);
    double gemm = 0;
    for (const sim::Kernel& kernel : k.forward)
      if (kernel.kind == sim::KernelKind::kGemm) {
        EXPECT_EQ(kernel.m, sp ? 2048 : 4096) << sp;
        gemm += kernel.flops();
      }
    EXPECT_DOUBLE_EQ(gemm, c.forward_flops.count()) << sp;
  }
}

// Megatron's all-to-all dispatcher reorders the tokens it receives by local expert and back
// before the combine (sort_chunks_by_idxs): a copy of the routed tokens each way, forward and
// backward, only under expert parallelism with several local experts, and not with DeepEP.
// Mixtral 8x7B (top 2).
TEST(CostModel, ExpertParallelDispatcherReordersTheReceivedTokens) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  Layout l;
  l.ep = 2;
  l.dp = 2;
  const int64_t copy = 2 * 4096 * 2 * 4096 * 2;  // read + write, tokens x top 2 x h, bf16
  for (std::string_view name : {"moe_sort", "moe_unsort"}) {
    const models::Op& op = op_named(g, name);
    const OpKernels k = op_kernels(op, g, l, true, hardware::Precision::kBf16);
    // Forward: the copy, then the chunk map (moe_sort) or the split sizes' transposed copy
    // and the map (moe_unsort), one int64 per chunk of the 8 experts.
    const size_t maps = name == "moe_sort" ? 1 : 2;
    ASSERT_EQ(k.forward.size(), 1 + maps) << name;
    EXPECT_EQ(k.forward[0].bytes, copy) << name;
    for (size_t i = 1; i <= maps; ++i) EXPECT_EQ(k.forward[i].bytes, 8 * 8) << name;
    ASSERT_EQ(k.dgrad.size(), 1u) << name;
    EXPECT_EQ(k.dgrad[0].bytes, copy) << name;
    const PassCost c = op_cost(op, g, l, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(c.dgrad, dev.memory_kernel_time(Bytes(copy))) << name;
    EXPECT_EQ(c.forward, c.dgrad + dev.memory_kernel_time(Bytes(64)) * static_cast<int64_t>(maps))
        << name;
    // No expert parallelism, or one expert per rank: nothing to reorder.
    for (int ep : {1, 8}) {
      Layout o = l;
      o.ep = ep;
      o.dp = ep;
      EXPECT_TRUE(op_kernels(op, g, o, true, hardware::Precision::kBf16).forward.empty()) << ep;
      EXPECT_EQ(op_cost(op, g, o, true, dev, hardware::Precision::kBf16).forward, Time::zero());
    }
    // DeepEP's flex dispatcher permutes what it receives straight into expert order.
    Layout deepep = l;
    deepep.moe_dispatcher = MoeDispatcher::kDeepEp;
    const OpKernels kd = op_kernels(op, g, deepep, true, hardware::Precision::kBf16);
    EXPECT_TRUE(kd.forward.empty() && kd.dgrad.empty()) << name;
    const PassCost cd = op_cost(op, g, deepep, true, dev, hardware::Precision::kBf16);
    EXPECT_EQ(cd.forward + cd.dgrad, Time::zero()) << name;
  }
}

// HybridEP permutes into expert order inside its dispatch kernel and back inside its
// combine (Megatron-Core's _HybridEPManager): the permute and unpermute (the graph's
// moe_dispatch and moe_combine) keep their small routing-map kernels but move no tokens of
// their own, where DeepEP's flex dispatcher runs them as passes over the routed tokens.
TEST(CostModel, HybridEpPermutesInsideItsKernels) {
  const models::OpGraph g = zoo_graph("mixtral-8x7b", 4096);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h100")->gpu;
  Layout deepep;
  deepep.ep = 2;
  deepep.dp = 2;
  deepep.moe_dispatcher = MoeDispatcher::kDeepEp;
  Layout hybrid = deepep;
  hybrid.moe_dispatcher = MoeDispatcher::kHybridEp;
  const int64_t routed = 4096 * 2 * 4096 * 2;  // tokens x top 2 x h, bf16
  for (std::string_view name : {"moe_dispatch", "moe_combine"}) {
    const models::Op& op = op_named(g, name);
    // Forward (backward, the dispatch's op also adds the MoE input's two gradient branches).
    auto largest = [&](const Layout& l) {
      int64_t most = 0;
      for (const sim::Kernel& k : op_kernels(op, g, l, true, hardware::Precision::kBf16).forward)
        most = std::max(most, k.bytes);
      return most;
    };
    EXPECT_GE(largest(deepep), routed) << name;
    EXPECT_LT(largest(hybrid), routed / 4) << name;
    const PassCost d = op_cost(op, g, deepep, true, dev, hardware::Precision::kBf16);
    const PassCost h = op_cost(op, g, hybrid, true, dev, hardware::Precision::kBf16);
    EXPECT_LT(h.forward + h.dgrad, d.forward + d.dgrad) << name;
    // Without EP there is no dispatch to fuse into: the same as the all-to-all's.
    Layout one = hybrid;
    one.ep = 1;
    Layout plain = one;
    plain.moe_dispatcher = MoeDispatcher::kAllToAll;
    EXPECT_EQ(op_cost(op, g, one, true, dev, hardware::Precision::kBf16).forward,
              op_cost(op, g, plain, true, dev, hardware::Precision::kBf16).forward)
        << name;
  }
}

// The loss by Layout::cross_entropy_fusion, bytes per logit forward / backward: Megatron's
// unfused fp32 passes 38 / 14, Megatron-Core's fused kernel 26 / 14, Transformer Engine's
// two Triton passes over the bf16 logits 6 / 4, torch.compile's online softmax over them and
// one fused gradient pass 2 / 4. GPT-3 175B, tp 8: 2048 x 51200 / 8 logits.
TEST(CostModel, CrossEntropyFusionSetsTheLossTraffic) {
  Fixture f = gpt(1, true, 1, "dgx-h100");
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  const models::Op& loss = op_named(f.g, "loss");
  const int64_t logits = loss.read.count() / f.g.dtype_bytes / l.tp;
  const std::pair<CrossEntropy, std::pair<int64_t, int64_t>> cases[] = {
      {CrossEntropy::kUnfused, {38, 14}},
      {CrossEntropy::kNative, {26, 14}},
      {CrossEntropy::kTe, {6, 4}},
      {CrossEntropy::kCompiled, {2, 4}}};
  for (const auto& [ce, bytes] : cases) {
    l.cross_entropy_fusion = ce;
    const OpKernels k = op_kernels(loss, f.g, l, true, hardware::Precision::kBf16);
    ASSERT_EQ(k.forward.size(), 1u);
    EXPECT_EQ(k.forward[0].bytes, bytes.first * logits) << to_string(ce);
    EXPECT_EQ(k.dgrad[0].bytes, bytes.second * logits) << to_string(ce);
    EXPECT_EQ(op_cost(loss, f.g, l, true, f.dev, hardware::Precision::kBf16).forward,
              f.dev.memory_kernel_time(Bytes(bytes.first * logits)));
  }
}

// All-gather CP (cp_comm all_gather, TE's AttnFuncWithCPAndKVAllGather): two calls per rank,
// one per local chunk, against the keys up to the chunk (the busiest rank's, cp - 1: 512
// queries against 1024 and 1536 keys of 2048, bottom-right causal, 3/16 and 5/16 of the
// sequence's pairs), plus the gathered K,V reorders and the dK,dV accumulation; the same
// FLOPs as the ring, each call timed at its own keys.
TEST(CostModel, AllGatherContextParallelAttentionIsTwoCallsPerRank) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  l.cp = 2;
  l.cp_comm = CpComm::kAllGather;
  const models::Op& attn = op_named(f.g, "attention");
  const PassCost c = op_cost(attn, f.g, l, true, f.dev, hardware::Precision::kBf16);
  Layout ring = l;
  ring.cp_comm = CpComm::kP2P;
  const PassCost r = op_cost(attn, f.g, ring, true, f.dev, hardware::Precision::kBf16);
  EXPECT_DOUBLE_EQ(c.forward_flops.count(), r.forward_flops.count());
  const double nkv = 2048.0 * 12 * 128, nq = 1024.0 * 12 * 128;
  const Bytes fwd(static_cast<int64_t>(2 * (4 * nkv + 2 * nq)));
  const Bytes bwd(static_cast<int64_t>(2 * (15 * nkv + 2 * nq)));
  auto calls = [&](Flops all, bool backward) {
    const Flops per_tp = all / 8.0;
    return f.dev.attention_time(per_tp * (3.0 / 16), hardware::Precision::kBf16, backward, 1024) +
           f.dev.attention_time(per_tp * (5.0 / 16), hardware::Precision::kBf16, backward, 1536);
  };
  EXPECT_EQ(c.forward, calls(attn.forward, false) + f.dev.memory_kernel_time(fwd));
  EXPECT_EQ(c.dgrad, calls(attn.dgrad, true) + f.dev.memory_kernel_time(bwd));
  const OpKernels k = op_kernels(attn, f.g, l, true, hardware::Precision::kBf16);
  ASSERT_EQ(k.forward.size(), 3u);
  EXPECT_DOUBLE_EQ(k.forward[0].flops() + k.forward[1].flops(), c.forward_flops.count());
  EXPECT_DOUBLE_EQ(k.forward[0].flops(), c.forward_flops.count() * 3 / 8);
  EXPECT_EQ(k.forward[0].seq_q, 512);
  EXPECT_EQ(k.forward[0].seq_kv, 1024);
  EXPECT_EQ(k.forward[1].seq_kv, 1536);
  EXPECT_TRUE(k.forward[0].causal && k.forward[1].causal);
  EXPECT_EQ(k.forward[2].bytes, fwd.count());
  ASSERT_EQ(k.dgrad.size(), 3u);
  EXPECT_EQ(k.dgrad[2].bytes, bwd.count());
}

// A2A CP (cp_comm a2a, TE's AttnFuncWithCPAndQKVOA2A): one call over the whole sequence
// with the rank's heads / cp, the attention of tp 16 without CP, plus the layout copies
// around each tensor's all-to-all (4 N: Q, K, V and the output forward, the output, its
// gradient and dQ, dK, dV backward); the same FLOPs as the ring.
TEST(CostModel, A2AContextParallelAttentionRunsTheWholeSequenceOnFewerHeads) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  l.cp = 2;
  l.cp_comm = CpComm::kA2A;
  const models::Op& attn = op_named(f.g, "attention");
  const PassCost c = op_cost(attn, f.g, l, true, f.dev, hardware::Precision::kBf16);
  Layout ring = l;
  ring.cp_comm = CpComm::kP2P;
  EXPECT_EQ(c.forward_flops,
            op_cost(attn, f.g, ring, true, f.dev, hardware::Precision::kBf16).forward_flops);
  Layout wide;
  wide.tp = 16;
  const PassCost w = op_cost(attn, f.g, wide, true, f.dev, hardware::Precision::kBf16);
  const double n = 1024.0 * 12 * 128;  // one tensor's local elements (Q, K, V, output alike)
  const Bytes fwd(static_cast<int64_t>(2 * 4 * (3 * n + n)));
  const Bytes bwd(static_cast<int64_t>(2 * 4 * (2 * n + 3 * n)));
  EXPECT_EQ(c.forward, w.forward + f.dev.memory_kernel_time(fwd));
  EXPECT_EQ(c.dgrad, w.dgrad + f.dev.memory_kernel_time(bwd));
  EXPECT_EQ(c.ring_diagonal_forward, Time::zero());
  const OpKernels k = op_kernels(attn, f.g, l, true, hardware::Precision::kBf16);
  ASSERT_EQ(k.forward.size(), 2u);
  EXPECT_EQ(k.forward[0].heads, 6);
  EXPECT_EQ(k.forward[0].seq_q, 2048);
  EXPECT_EQ(k.forward[0].seq_kv, 2048);
  EXPECT_DOUBLE_EQ(k.forward[0].flops(), c.forward_flops.count());
  EXPECT_EQ(k.forward[1].bytes, fwd.count());
  ASSERT_EQ(k.dgrad.size(), 2u);
  EXPECT_EQ(k.dgrad[1].bytes, bwd.count());
}

// Hierarchical CP (cp_comm a2a+p2p, cp 4 over an a2a level of 2): the ring of the 2 ranks
// cp_a2a apart with the heads split over the a2a level, the attention of a p2p ring of 2
// at tp 16; its memory passes the a2a's layout copies and the ring's corrections.
TEST(CostModel, HierarchicalContextParallelRingsOverTheA2ALevel) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  l.cp = 4;
  l.cp_comm = CpComm::kA2AP2P;
  l.cp_a2a = 2;
  ASSERT_EQ(l.cp_heads_split(), 2);
  ASSERT_EQ(l.cp_ring(), 2);
  const models::Op& attn = op_named(f.g, "attention");
  const PassCost c = op_cost(attn, f.g, l, true, f.dev, hardware::Precision::kBf16);
  Layout ring;
  ring.tp = 16;
  ring.cp = 2;
  const PassCost r = op_cost(attn, f.g, ring, true, f.dev, hardware::Precision::kBf16);
  EXPECT_EQ(c.forward_flops, r.forward_flops);
  EXPECT_EQ(c.ring_diagonal_forward, r.ring_diagonal_forward);
  EXPECT_EQ(c.ring_diagonal_dgrad, r.ring_diagonal_dgrad);
  EXPECT_GT(c.forward, r.forward);                          // the all-to-alls' layout copies
  const double n = 512.0 * 12 * 128, lse = 512.0 * 12 * 4;  // a tensor's local elements
  const int64_t a2a_fwd = static_cast<int64_t>(2 * 4 * (3 * n + n));
  const int64_t ring_fwd = static_cast<int64_t>(2 * (4 * n + 4.25 * n) + 7.75 * lse);
  const OpKernels k = op_kernels(attn, f.g, l, true, hardware::Precision::kBf16);
  ASSERT_EQ(k.forward.size(), 2u);
  EXPECT_EQ(k.forward[0].heads, 6);
  EXPECT_EQ(k.forward[0].seq_q, 1024);
  EXPECT_EQ(k.forward[0].seq_kv, 2048);
  EXPECT_EQ(k.forward[1].bytes, a2a_fwd + ring_fwd);
}

TEST(CostModel, SelectiveRecomputeRerunsTheAttentionCore) {
  Fixture f = gpt();
  Layout l;
  l.recompute = models::Recompute::kSelective;
  const PassCost c = layer_total(module_cost(f.g, l, true, f.dev, hardware::Precision::kBf16));
  EXPECT_GT(c.recompute, Time::zero());
  EXPECT_NEAR(c.recompute_flops.count(), 4.0 * 2048 * 2048 * 12288 / 2, 1.0);
}

// torchtitan's per-op checkpointing re-runs the k of qkv (a GEMM of the k width alone), the
// output projection whole, the norms and the activation; not the attention kernel.
TEST(CostModel, SelectiveOpRecomputeRerunsEveryOtherMatmul) {
  const models::OpGraph g = zoo_graph("llama-3.1-8b", 8192);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h200")->gpu;
  Layout l;
  l.recompute = models::Recompute::kSelectiveOp;
  const auto p = hardware::Precision::kBf16;
  const PassCost qkv = op_cost(op_named(g, "qkv"), g, l, true, dev, p);
  EXPECT_EQ(qkv.recompute, dev.gemm_time(8192, 1024, 4096, 1, p));
  EXPECT_DOUBLE_EQ(qkv.recompute_flops.count(), 2.0 * 8192 * 1024 * 4096);
  const PassCost out = op_cost(op_named(g, "attn_out"), g, l, true, dev, p);
  EXPECT_EQ(out.recompute, out.forward);
  const PassCost norm = op_cost(op_named(g, "attn_norm"), g, l, true, dev, p);
  EXPECT_EQ(norm.recompute, norm.forward);
  EXPECT_EQ(op_cost(op_named(g, "attention"), g, l, true, dev, p).recompute, Time::zero());
  EXPECT_EQ(op_cost(op_named(g, "mlp_fc2"), g, l, true, dev, p).recompute, Time::zero());
  const OpKernels k = op_kernels(op_named(g, "mlp_fc1"), g, l, true, p);
  ASSERT_EQ(k.recompute.size(), 1u);  // the up projection alone
  EXPECT_EQ(k.recompute[0].n, 14336);
}

// Separate projections (torchtitan's wq, wk, wv): a GEMM per part, forward and backward;
// under FP8 the shared input is quantised once (torch.compile's common subexpressions) and
// each part's output gradient on its own; the backward reads the parts' input gradients
// where one would do: (parts - 1) x T x h bf16 bytes more, a kernel of its own. selective_op
// re-runs the k projection once, with the input's cast. Each kernel list costs what
// op_cost charges. repeat_kv: one copy forward and one pass (the sum) backward, split by TP.
TEST(CostModel, SeparateProjectionsRunAGemmPerPartAndCastTheirInputOnce) {
  const auto spec = models::load_zoo_module("llama-3.1-8b");
  ASSERT_TRUE(spec.is_ok());
  models::ModuleInput in;
  in.seq_len = 8192;
  in.fused_projections = false;
  in.repeat_kv = true;
  const models::OpGraph g = models::build_op_graph(*spec, in);
  in.fused_projections = true;
  const models::OpGraph fused = models::build_op_graph(*spec, in);
  const hardware::DeviceProfile dev = hardware::load_profile("dgx-h200")->gpu;
  const auto p = hardware::Precision::kFp8;
  Layout l;
  l.fp8_recipe = Fp8Recipe::kTensorwise;
  l.recompute = models::Recompute::kSelectiveOp;
  const auto kinds = [](const std::vector<sim::Kernel>& ks, sim::KernelKind kind) {
    return std::count_if(ks.begin(), ks.end(),
                         [&](const sim::Kernel& k) { return k.kind == kind; });
  };
  const auto cost = [&](const std::vector<sim::Kernel>& ks) {
    Time t;
    for (const sim::Kernel& k : ks) t += kernel_time(k, dev, p);
    return t;
  };
  const int64_t T = 8192, h = 4096;
  for (std::string_view name : {"qkv", "mlp_fc1"}) {
    const size_t parts = name == "qkv" ? 3 : 2;
    const OpKernels a = op_kernels(op_named(fused, name), fused, l, true, p);
    const OpKernels b = op_kernels(op_named(g, name), g, l, true, p);
    EXPECT_EQ(kinds(b.forward, sim::KernelKind::kGemm), static_cast<long>(parts)) << name;
    EXPECT_EQ(kinds(b.forward, sim::KernelKind::kMemory),
              kinds(a.forward, sim::KernelKind::kMemory))
        << name;  // one input quantisation
    EXPECT_EQ(kinds(b.dgrad, sim::KernelKind::kMemory),
              static_cast<long>(parts) * kinds(a.dgrad, sim::KernelKind::kMemory) + 1)
        << name;
    EXPECT_EQ(b.dgrad.back().bytes, static_cast<int64_t>(parts - 1) * T * h * 2) << name;
    EXPECT_EQ(kinds(b.recompute, sim::KernelKind::kGemm), 1) << name;
    const auto rerun =
        std::find_if(b.recompute.begin(), b.recompute.end(),
                     [](const sim::Kernel& k) { return k.kind == sim::KernelKind::kGemm; });
    ASSERT_NE(rerun, b.recompute.end());
    EXPECT_EQ(rerun->n, name == "qkv" ? 1024 : 14336) << name;
    const PassCost c = op_cost(op_named(g, name), g, l, true, dev, p);
    EXPECT_EQ(cost(b.forward), c.forward) << name;
    EXPECT_EQ(cost(b.dgrad), c.dgrad) << name;
    EXPECT_EQ(cost(b.recompute), c.recompute) << name;
    EXPECT_GT(c.dgrad, op_cost(op_named(fused, name), fused, l, true, dev, p).dgrad) << name;
  }
  const models::Op& repeat = op_named(g, "repeat_kv");
  const Bytes copy = repeat.read + repeat.written;
  const PassCost r = op_cost(repeat, g, l, true, dev, p);
  EXPECT_EQ(r.forward, dev.memory_kernel_time(copy));
  EXPECT_EQ(r.dgrad, r.forward);
  EXPECT_EQ(r.recompute, r.forward);
  Layout tp = l;
  tp.tp = 4;
  EXPECT_EQ(op_cost(repeat, g, tp, true, dev, p).forward, dev.memory_kernel_time(copy / 4));
}

// The attention kernel a plan names: FlashAttention-2's rates instead of the profile's cuDNN.
TEST(CostModel, AttentionKernelSelectsItsRates) {
  Fixture f = gpt(1, true, 2, "dgx-h100");
  Layout l;
  const auto p = hardware::Precision::kBf16;
  const models::Op& attn = op_named(f.g, "attention");
  const PassCost cudnn = op_cost(attn, f.g, l, true, f.dev, p);
  l.attention_kernel = hardware::AttentionKernel::kFlash2;
  const PassCost fa2 = op_cost(attn, f.g, l, true, f.dev, p);
  const hardware::AttentionRates* rates = f.dev.attention_rates(l.attention_kernel);
  EXPECT_EQ(fa2.forward, f.dev.attention_time(fa2.forward_flops, p, false, 2048, rates));
  EXPECT_GT(fa2.forward, cudnn.forward * 1.4);  // 298 against 484 TFLOP/s at 2K
  EXPECT_GT(fa2.dgrad, cudnn.dgrad * 1.4);
}

// Without flash attention the batched GEMMs compute the whole score matrix and the softmax
// and dropout passes stream it through HBM: at s = 2048 this costs several times the flash
// kernel, and the model FLOPs stay the causal half.
TEST(CostModel, UnfusedAttentionMaterializesTheScores) {
  Fixture flash = gpt(1, true), unfused = gpt(1, false);
  Layout l;
  l.tp = 8;
  const auto p = hardware::Precision::kBf16;
  const PassCost a = op_cost(op_named(flash.g, "attention"), flash.g, l, true, flash.dev, p);
  const PassCost b = op_cost(op_named(unfused.g, "attention"), unfused.g, l, true, unfused.dev, p);
  EXPECT_DOUBLE_EQ(a.forward_flops.count(), b.forward_flops.count());
  EXPECT_GT(b.forward / a.forward, 2.0);
  EXPECT_GT(b.dgrad / a.dgrad, 1.5);
  // The memory-bound part alone: 2 (softmax) + 5 (dropout) bytes per local score forward.
  const double scores = 96.0 / 8 * 2048 * 2048;
  const Time softmax_dropout = unfused.dev.memory_time(Bytes(static_cast<int64_t>(9 * scores)));
  EXPECT_GT(b.forward, softmax_dropout);
}

// FP8 runs only the layers' GEMMs in fp8: attention runs at the bf16 rate, the logits GEMM
// in bf16, and pointwise work and TP traffic move bf16 activations.
TEST(CostModel, Fp8LeavesAttentionActivationsAndLogitsInBf16) {
  Fixture bf = gpt(1, true, 2, "dgx-h100"), f8 = gpt(1, true, 1, "dgx-h100");
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  const auto kBf16 = hardware::Precision::kBf16, kFp8 = hardware::Precision::kFp8;
  for (std::string_view name : {"attention", "logits", "attn_norm", "mlp_act", "loss"}) {
    const PassCost a = op_cost(op_named(bf.g, name), bf.g, l, true, bf.dev, kBf16);
    const PassCost b = op_cost(op_named(f8.g, name), f8.g, l, true, f8.dev, kFp8);
    EXPECT_EQ(a.forward, b.forward) << name;
    EXPECT_EQ(a.dgrad, b.dgrad) << name;
  }
  // The layer GEMMs do speed up, by less than 2x (cast + transpose kernels, eta_max).
  const PassCost a = op_cost(op_named(bf.g, "mlp_fc2"), bf.g, l, true, bf.dev, kBf16);
  const PassCost b = op_cost(op_named(f8.g, "mlp_fc2"), f8.g, l, true, f8.dev, kFp8);
  EXPECT_GT(a.forward / b.forward, 1.2);
  EXPECT_LT(a.forward / b.forward, 2.0);
  const ModuleCost m = module_cost(f8.g, l, true, f8.dev, kFp8);
  EXPECT_EQ(m.boundary_bytes, Bytes(2048LL * 12288 * 2 / 8));  // bf16, SP slice
  for (const WorkStep& s : m.layer.steps) {
    if (s.kind != StepKind::kCompute) {
      EXPECT_EQ(s.bytes, Bytes(2048LL * 12288 * 2));
    }
  }
}

// The loss is Megatron's fp32 vocab-parallel cross-entropy: 38 + 14 bytes per logit.
TEST(CostModel, CrossEntropyStreamsFp32Logits) {
  Fixture f = gpt();
  Layout l;
  l.tp = 8;
  const PassCost c =
      op_cost(op_named(f.g, "loss"), f.g, l, true, f.dev, hardware::Precision::kBf16);
  const int64_t logits = 2048LL * 51200 / 8;
  EXPECT_EQ(c.forward, f.dev.memory_kernel_time(Bytes(38 * logits)));
  EXPECT_EQ(c.dgrad, f.dev.memory_kernel_time(Bytes(14 * logits)));
}

}  // namespace
}  // namespace hetpar::planner
