#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "hetpar/core/attention_mask.h"
#include "hetpar/models/load.h"
#include "hetpar/models/model_json.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/models/spec.h"
#include "hetpar/models/totals.h"

namespace hetpar::models {
namespace {

ModelSpec zoo_model(std::string_view name) {
  auto m = load_zoo_model(name);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? *m : ModelSpec{};
}

ModuleSpec zoo_module(std::string_view name) {
  auto m = load_zoo_module(name);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? *m : ModuleSpec{};
}

LlmSpec zoo_llm(std::string_view name) {
  ModuleSpec spec = zoo_module(name);
  EXPECT_TRUE(std::holds_alternative<LlmSpec>(spec)) << name;
  return std::holds_alternative<LlmSpec>(spec) ? std::get<LlmSpec>(spec) : LlmSpec{};
}

ModuleInput input(int64_t micro_batch, int64_t seq_len, bool flash = true) {
  ModuleInput in;
  in.micro_batch = micro_batch;
  in.seq_len = seq_len;
  in.flash_attention = flash;
  return in;
}

// The names of layer `layer`'s ops, in graph order.
std::vector<std::string> layer_op_names(const OpGraph& g, int layer) {
  std::vector<std::string> names;
  for (const Op& op : g.ops)
    if (op.layer == layer) names.push_back(op.name);
  return names;
}

double rel_err(double got, double want) {
  return std::fabs(got - want) / std::fabs(want);
}

// Published parameter counts. LLMs: the exact safetensors totals shown on the Hugging Face
// model pages (config.json URLs in each zoo file's "source"); Mixtral active 12.9B and
// LLaVA-1.5-7B 7.06B from the Mistral announcement / HF page; CLIP ViT-L/14 vision tower 304M
// (CLIP paper, arXiv 2103.00020, and EVA-CLIP's table); InternViT-6B-448px-V1-5 5540M (its HF
// model card: "the last 3 blocks are discarded" of the 5903M InternViT-6B); Whisper large-v3
// encoder ~635M (of 1.55B total, arXiv 2212.04356); GPT-3 175B (arXiv 2005.14165).
TEST(Zoo, ParameterCountsMatchPublished) {
  struct Case {
    const char* name;
    double published;
  };
  // Exact published totals: the closed form reproduces them to the parameter.
  const std::vector<Case> exact = {
      {"llama-2-7b", 6'738'415'616.0},       {"vicuna-7b", 6'738'415'616.0},
      {"llama-2-13b", 13'015'864'320.0},     {"llama-2-70b", 68'976'648'192.0},
      {"llama-3.1-8b", 8'030'261'248.0},     {"llama-3.1-70b", 70'553'706'496.0},
      {"llama-3.1-405b", 405'853'388'800.0}, {"qwen2.5-7b", 7'615'616'512.0},
      {"qwen2.5-72b", 72'706'203'648.0},     {"mixtral-8x7b", 46'702'792'704.0},
  };
  for (const Case& c : exact)
    EXPECT_EQ(static_cast<double>(count_params(zoo_model(c.name)).total), c.published) << c.name;
  const std::vector<Case> rounded = {{"gpt3-175b", 175e9},
                                     {"llava-1.5-7b", 7.06e9},
                                     {"qwen3-30b-a3b", 30.5e9},
                                     {"qwen3-235b-a22b", 235e9},
                                     // "14.3B parameters in total" (its model card)
                                     {"qwen1.5-moe-a2.7b", 14.3e9},
                                     // Nemotron-4: 12.5B + 3.2B embedding (arXiv 2402.16819);
                                     // 340B (arXiv 2406.11704), 341.0B by its Table 1 shapes.
                                     {"nemotron-4-15b", 15.6e9},
                                     {"nemotron-4-340b", 340e9}};
  for (const Case& c : rounded) {
    ParamCounts p = count_params(zoo_model(c.name));
    EXPECT_LT(rel_err(static_cast<double>(p.total), c.published), 0.005)
        << c.name << " " << p.total;
  }
  // Qwen3-30B-A3B: "3.3B activated" (model card); heads x head_dim (4096) is not hidden.
  EXPECT_LT(rel_err(static_cast<double>(count_params(zoo_model("qwen3-30b-a3b")).active), 3.3e9),
            0.02);
  EXPECT_LT(rel_err(static_cast<double>(count_params(zoo_model("mixtral-8x7b")).active), 12.9e9),
            0.005);
  // GLM-4.5: "355B total parameters, 32B active" (model card; active without the
  // embeddings): 3 dense layers, 89 MoE layers of 8 routed experts and the shared one; the
  // published counts leave out the multi-token-prediction depth (352.8B without it).
  // GLM-4.5-Air: "106B total parameters, 12B active" (1 dense and 45 MoE layers: 106.8B,
  // 12.2B). Each depth adds one MoE layer, its 2h x h projection and three norms.
  auto without_mtp = [](const char* name) {
    ModuleSpec spec = zoo_module(name);
    std::get<LlmSpec>(spec).mtp_layers = 0;
    return count_params(spec);
  };
  // DeepSeek-V3: "671B total parameters with 37B activated for each token" (arXiv
  // 2412.19437; the MTP module's 14B apart): 670.9B, 37.5B (with the embeddings).
  {
    ModuleSpec spec = zoo_module("deepseek-v3");
    std::get<LlmSpec>(spec).mtp_layers = 0;
    const ParamCounts p = count_params(spec);
    EXPECT_LT(rel_err(static_cast<double>(p.total), 671e9), 0.005);
    EXPECT_LT(rel_err(static_cast<double>(p.active), 37e9), 0.02);
  }
  for (const auto& [name, total, active] :
       {std::tuple{"glm-4.5", 355e9, 32e9}, std::tuple{"glm-4.5-air", 106e9, 12e9}}) {
    const ParamCounts p = without_mtp(name);
    EXPECT_LT(rel_err(static_cast<double>(p.total), total), 0.01) << name;
    EXPECT_LT(rel_err(static_cast<double>(p.active - p.embedding), active), 0.02) << name;
    const ModuleSpec spec = zoo_module(name);
    const LlmSpec& llm = std::get<LlmSpec>(spec);
    EXPECT_EQ(llm.mtp_layers, 1) << name;
    const int64_t h = llm.block.hidden, expert = 3 * h * llm.moe->expert_ffn_hidden;
    const int64_t layer = (count_params(spec).total - p.total) - (2 * h * h + 3 * h);
    // The depth's layer: attention, two norms and the q/k norms, router, experts, shared.
    const int64_t d = llm.block.head_dim(), qkv = (llm.block.heads + 2 * llm.block.kv_heads) * d;
    EXPECT_EQ(layer, h * qkv + qkv + llm.block.heads * d * h + 2 * h +
                         (llm.block.qk_norm ? 2 * d : 0) + h * llm.moe->experts +
                         (llm.moe->experts + llm.moe->shared_experts) * expert)
        << name;
  }
  // Gemma 3 27B's language model: 25,600M non-embedding parameters (the Gemma 3 technical
  // report, arXiv 2503.19786, Table 1), the two post-norms a layer (0.7M) left out.
  {
    const ParamCounts p = count_params(zoo_model("gemma-3-27b"));
    EXPECT_LT(rel_err(static_cast<double>(p.non_embedding()), 25.6e9), 0.001) << p.total;
    EXPECT_EQ(p.embedding, int64_t{262208} * 5376);  // tied: one table
  }
  // Qwen1.5-MoE-A2.7B: "2.7B activated" (model card): 4 routed experts and the shared ones.
  EXPECT_LT(
      rel_err(static_cast<double>(count_params(zoo_model("qwen1.5-moe-a2.7b")).active), 2.7e9),
      0.01);

  const std::vector<Case> encoders = {
      {"clip-vit-l-14-336", 304e6},
      {"internvit-6b", 5540e6},
      {"whisper-large-v3-encoder", 635e6},
      // HF SiglipVisionModel counts 428,225,600 including the attention-pooling ("MAP") head
      // that VLMs switch off (vision_use_head=false); the zoo models the tower without it.
      // Head: probe h, MHA 4h^2 + 4h, layernorm 2h, MLP 2*h*f + f + h (h=1152, f=4304).
      {"siglip-so400m-patch14-384", 428'225'600.0 - (1152 + 4 * 1152 * 1152 + 4 * 1152 + 2 * 1152 +
                                                     2 * 1152 * 4304 + 4304 + 1152)},
  };
  for (const Case& c : encoders) {
    ParamCounts p = count_params(zoo_module(c.name));
    EXPECT_LT(rel_err(static_cast<double>(p.total), c.published), 0.005)
        << c.name << " " << p.total;
  }
}

// The smaller GPT-3 sizes are nominal in the paper (1.3B is 1.32B with Megatron's padded
// vocabulary), so they are checked against Narayanan et al. 2021's closed form
// P = 12lh^2 (1 + 13/(12h) + (V+s)/(12lh)), which leaves out only the final layernorm (2h).
TEST(Zoo, GptParameterCountsMatchMegatronFormula) {
  for (const char* name : {"gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"}) {
    const LlmSpec llm = zoo_llm(name);
    const int64_t l = llm.block.layers, h = llm.block.hidden, V = llm.vocab, s = llm.max_positions;
    EXPECT_EQ(count_params(ModuleSpec(llm)).total,
              12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h)
        << name;
  }
}

TEST(Zoo, EntriesAreDocumentedAndLoad) {
  std::vector<ZooEntry> entries = zoo_entries();
  EXPECT_GE(entries.size(), 18u);
  for (const ZooEntry& e : entries) {
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_EQ(e.source.rfind("https://", 0), 0u) << e.name;
    bool loads = e.kind == "model" || e.kind == "llm" ? load_zoo_model(e.name).is_ok()
                                                      : load_zoo_module(e.name).is_ok();
    EXPECT_TRUE(loads) << e.name;
  }
  auto clip = load_zoo_model("clip-vit-l-14-336");
  ASSERT_FALSE(clip.is_ok());
  EXPECT_NE(clip.status().message().find("is a vision_encoder"), std::string::npos);
}

TEST(Zoo, LlavaWiring) {
  ModelSpec m = zoo_model("llava-1.5-7b");
  ASSERT_EQ(m.modules.size(), 3u);
  EXPECT_EQ(m.modules[m.llm_index()].name, "llm");
  EXPECT_EQ(llm_tokens_per_item(m, *m.find("vision")), 576);
  ModuleInput in = module_input(m, *m.find("projector"), input(1, 2048));
  EXPECT_EQ(in.seq_len, 576);
  OpGraph proj = build_op_graph(m.modules[*m.find("projector")].spec, in);
  ASSERT_EQ(proj.ops.front().gemms.size(), 1u);
  const GemmShape& fc1 = proj.ops.front().gemms[0];
  EXPECT_EQ(fc1.m, 576);
  EXPECT_EQ(fc1.n, 4096);
  EXPECT_EQ(fc1.k, 1024);
  EXPECT_EQ(count_params(m.modules[*m.find("projector")].spec).total,
            1024 * 4096 + 4096 + 4096 * 4096 + 4096);
}

// 6N: Kaplan et al. 2020 count training FLOPs per token as 6 N (N without embeddings) plus
// 6 l s h for causal attention. Our accounting adds the untied output layer, 6 V h, and
// leaves out only the norm weights (not matmuls), so it matches 6(N - Vh_input) + 6lsh to
// 1e-4; Kaplan's estimate alone is low by the logits share, under 8% for Llama 3.1 8B at 4096.
TEST(Flops, SixNRule) {
  const LlmSpec llm = zoo_llm("llama-3.1-8b");
  const double l = 32, s = 4096, h = 4096, V = 128256;
  ParamCounts p = count_params(ModuleSpec(llm));
  double per_token = model_flops_per_token(llm, 4096);
  double exact = 6.0 * (static_cast<double>(p.total) - V * h) + 6 * l * s * h;
  EXPECT_LT(rel_err(per_token, exact), 1e-4);
  double kaplan = 6.0 * static_cast<double>(p.non_embedding()) + 6 * l * s * h;
  EXPECT_LT(rel_err(per_token, kaplan), 0.08);
  EXPECT_GT(per_token, kaplan);
}

// Narayanan et al. 2021 (arXiv 2104.04473), eq. in sec. 5.1: per iteration
//   no recompute:   72 B s l h^2 (1 + s/(6h) + V/(12 l h))
//   full recompute: 96 B s l h^2 (1 + s/(6h) + V/(16 l h))  (the logits are not recomputed).
// The formula counts full (non-causal) attention, so the test adds the halved attention
// back explicitly: each attention op's forward once more in forward, backward and recompute.
TEST(Flops, MatchesMegatronGptFormulaExactly) {
  for (const char* name : {"gpt3-175b", "gpt3-1.3b"}) {
    const LlmSpec llm = zoo_llm(name);
    const double B = 4, s = 2048, l = static_cast<double>(llm.block.layers),
                 h = static_cast<double>(llm.block.hidden), V = static_cast<double>(llm.vocab);
    OpGraph g = build_op_graph(ModuleSpec(llm), input(4, 2048));
    double attention = 0;
    for (const Op& op : g.ops)
      if (op.kind == OpKind::kAttention) attention += op.forward.count();
    double no_recompute = model_flops(g).count() + 3 * attention;
    double full_recompute = no_recompute + recompute_flops(g, Recompute::kFull).count() + attention;
    EXPECT_LT(rel_err(no_recompute, 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))),
              1e-9)
        << name;
    EXPECT_LT(
        rel_err(full_recompute, 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))),
        1e-9)
        << name;
  }
}

TEST(Flops, CausalAttentionIsHalf) {
  AttentionShape s{2, 32, 8, 4096, 4096, 128, false};
  Flops full = attention_forward_flops(s);
  EXPECT_DOUBLE_EQ(full.count(), 4.0 * 2 * 32 * 4096 * 4096 * 128);
  s.causal = true;
  EXPECT_DOUBLE_EQ(attention_forward_flops(s).count(), full.count() / 2);

  OpGraph llm = build_op_graph(zoo_module("llama-3.1-8b"), input(1, 1024));
  OpGraph vit = build_op_graph(zoo_module("clip-vit-l-14-336"), input(1, 0));
  for (const OpGraph* g : {&llm, &vit})
    for (const Op& op : g->ops) {
      if (op.attention) {
        EXPECT_EQ(op.attention->causal, g == &llm);
      }
    }
}

TEST(Flops, RecomputeViews) {
  OpGraph g = build_op_graph(zoo_module("llama-3.1-8b"), input(1, 4096));
  double attention = 0, layers = 0;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kAttention) attention += op.forward.count();
    if (op.layer >= 0 && is_matmul(op.kind)) layers += op.forward.count();
  }
  EXPECT_EQ(recompute_flops(g, Recompute::kNone).count(), 0);
  EXPECT_DOUBLE_EQ(recompute_flops(g, Recompute::kSelective).count(), attention);
  EXPECT_DOUBLE_EQ(recompute_flops(g, Recompute::kFull).count(), layers);
  EXPECT_DOUBLE_EQ(backward_flops(g).count(), 2 * forward_flops(g).count());
}

// torchtitan's per-op selective checkpointing of a Llama 3 8B block (h 4096, 32 heads of
// 128, 8 KV heads, SwiGLU 14336): of the matmuls wq, wk, wv, wo, w1, w3, w2 the even ones
// (wk, wo, w3) re-run, 4096 x (1024 + 4096 + 14336) of the block's 218M weights (36.5 %); the
// attention kernel does not. Kept per block (bf16, T tokens): the block input (T h), q and v (T
// (4096 + 1024)), the attention output (T 4096) and its fp32 log-sum-exp (4 T 32 bytes), the gate
// (T 14336).
TEST(Flops, SelectiveOpRecomputeKeepsEveryOtherMatmul) {
  const int64_t T = 8192;
  OpGraph g = build_op_graph(zoo_module("llama-3.1-8b"), input(1, T));
  double gemms = 0;
  for (const Op& op : g.ops)
    if (op.layer == 0 && op.kind == OpKind::kGemm) gemms += op.forward.count();
  EXPECT_NEAR(gemms, 2.0 * T * 4096 * (6144 + 4096 + 28672) + 2.0 * T * 14336 * 4096, 1);
  const double rerun = 2.0 * T * 4096 * (1024 + 4096 + 14336);
  EXPECT_NEAR(recompute_flops(g, Recompute::kSelectiveOp).count(), 32 * rerun, 32);
  for (const Op& op : g.ops) {
    if (op.layer != 0) continue;
    const std::map<std::string, double> expected = {
        {"qkv", 1024.0 / 6144}, {"mlp_fc1", 0.5}, {"attn_out", 1},    {"attn_norm", 1}, {"rope", 1},
        {"attention", 0},       {"mlp_fc2", 0},   {"mlp_residual", 0}};
    if (auto it = expected.find(op.name); it != expected.end()) {
      EXPECT_DOUBLE_EQ(recompute_share(op, Recompute::kSelectiveOp), it->second) << op.name;
    }
  }
  int64_t outside = 0;
  for (const Op& op : g.ops)
    if (op.layer < 0) outside += op.saved.count();
  const int64_t per_block = T * (4096 + 4096 + 1024 + 4096 + 14336) * 2 + 4 * T * 32;
  EXPECT_EQ(activation_bytes(g, Recompute::kSelectiveOp).count(), 32 * per_block + outside);
}

// Megatron-Core's --recompute-modules layernorm moe_act (RecomputePolicy): the MoE layers'
// pre-MLP norm and the experts' activation are re-run, their outputs dropped, so the router
// and the second expert linear keep no input; the attention core is re-run only when named.
TEST(Activations, RecomputeModulesDropTheOutputsTheyReRun) {
  const OpGraph g = build_op_graph(zoo_module("mixtral-8x7b"), input(1, 4096));
  const RecomputePolicy modules(Recompute::kSelective, kRecomputeLayernorm | kRecomputeMoeAct);
  double dropped = 0;
  for (const Op& op : g.ops) {
    const bool rerun = op.layer >= 0 && (op.name == "mlp_norm" || op.name == "expert_act");
    EXPECT_DOUBLE_EQ(recompute_share(op, modules), rerun ? 1 : 0) << op.name;
    const bool drops = op.layer >= 0 && (op.name == "router" || op.name == "expert_fc2");
    EXPECT_DOUBLE_EQ(kept_bytes(op, modules, g.dtype_bytes), drops ? 0 : op.saved.as_double())
        << op.name;
    if (drops) dropped += op.saved.as_double();
  }
  ASSERT_GT(dropped, 0);
  EXPECT_EQ(activation_bytes(g, modules).count(),
            activation_bytes(g, Recompute::kNone).count() - static_cast<int64_t>(dropped));
  // No matmul is re-run; with the attention core named too, its FLOPs are selective's.
  EXPECT_EQ(recompute_flops(g, modules).count(), 0);
  const RecomputePolicy all(Recompute::kSelective,
                            kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMoeAct);
  EXPECT_DOUBLE_EQ(recompute_flops(g, all).count(),
                   recompute_flops(g, Recompute::kSelective).count());
  EXPECT_EQ(activation_bytes(g, all).count(),
            activation_bytes(g, Recompute::kSelective).count() - static_cast<int64_t>(dropped));
  // Other kinds ignore the modules.
  EXPECT_EQ(activation_bytes(
                g, RecomputePolicy(Recompute::kFull,
                                   kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMoeAct))
                .count(),
            activation_bytes(g, Recompute::kFull).count());
}

// Megatron-Core's --recompute-modules moe (a checkpointed MoE layer): every op from the
// router to the combine re-runs, and of them only the router keeps its input (the layer's);
// with layernorm, whose output that input is, not even that. Attention and dense ops are
// untouched; the matmuls re-run are the router's and the experts'.
TEST(Activations, RecomputeModuleMoeKeepsOnlyTheMoeLayersInput) {
  const OpGraph g = build_op_graph(zoo_module("mixtral-8x7b"), input(1, 4096));
  const RecomputePolicy moe(Recompute::kSelective, kRecomputeMoe);
  const RecomputePolicy with_norm(Recompute::kSelective, kRecomputeLayernorm | kRecomputeMoe);
  double dropped = 0, rerun_flops = 0;
  int moe_ops = 0;
  for (const Op& op : g.ops) {
    const bool in_moe = op.layer >= 0 && (op.name == "router" || op.name.starts_with("moe_") ||
                                          op.name.starts_with("expert_"));
    EXPECT_EQ(is_moe_block_op(op), in_moe) << op.name;
    EXPECT_DOUBLE_EQ(recompute_share(op, moe), in_moe ? 1 : 0) << op.name;
    const bool keeps = !in_moe || op.name == "router";
    EXPECT_DOUBLE_EQ(kept_bytes(op, moe, g.dtype_bytes), keeps ? op.saved.as_double() : 0)
        << op.name;
    if (in_moe) {
      ++moe_ops;
      EXPECT_EQ(kept_bytes(op, with_norm, g.dtype_bytes), 0) << op.name;
      if (!keeps) dropped += op.saved.as_double();
      if (op.kind == OpKind::kGemm) rerun_flops += op.forward.count();
    }
  }
  EXPECT_EQ(moe_ops, 8 * 32);
  ASSERT_GT(dropped, 0);
  EXPECT_EQ(activation_bytes(g, moe).count(),
            activation_bytes(g, Recompute::kNone).count() - static_cast<int64_t>(dropped));
  EXPECT_DOUBLE_EQ(recompute_flops(g, moe).count(), rerun_flops);
}

TEST(Activations, RecomputeModuleMlpKeepsOnlyTheDenseMlpsInput) {
  const OpGraph g = build_op_graph(zoo_module("llama-3.1-8b"), input(1, 4096));
  const RecomputePolicy mlp(Recompute::kSelective, kRecomputeCoreAttn | kRecomputeMlp);
  const RecomputePolicy attn(Recompute::kSelective, kRecomputeCoreAttn);
  double dropped = 0, rerun_flops = 0;
  int mlp_ops = 0;
  for (const Op& op : g.ops) {
    const bool in_mlp = op.layer >= 0 && (op.name == "mlp_norm" || op.name == "mlp_fc1" ||
                                          op.name == "mlp_act" || op.name == "mlp_fc2");
    EXPECT_EQ(is_dense_mlp_op(op), in_mlp) << op.name;
    EXPECT_DOUBLE_EQ(recompute_share(op, mlp), in_mlp ? 1 : recompute_share(op, attn)) << op.name;
    const bool keeps = !in_mlp || op.name == "mlp_norm";  // the checkpoint's input
    EXPECT_DOUBLE_EQ(kept_bytes(op, mlp, g.dtype_bytes),
                     keeps ? kept_bytes(op, attn, g.dtype_bytes) : 0)
        << op.name;
    if (in_mlp) {
      ++mlp_ops;
      if (!keeps) dropped += op.saved.as_double();
      if (op.kind == OpKind::kGemm) rerun_flops += op.forward.count();
    }
  }
  EXPECT_EQ(mlp_ops, 4 * 32);
  ASSERT_GT(dropped, 0);
  EXPECT_EQ(activation_bytes(g, mlp).count(),
            activation_bytes(g, attn).count() - static_cast<int64_t>(dropped));
  EXPECT_DOUBLE_EQ(recompute_flops(g, mlp).count(), recompute_flops(g, attn).count() + rerun_flops);
  // A post-norm (Gemma's) is inside the checkpointed MLP: re-run, its input not kept.
  const OpGraph gemma = build_op_graph(zoo_module("gemma-3-27b"), input(1, 4096));
  int post = 0;
  for (const Op& op : gemma.ops) {
    if (op.name != "mlp_post_norm") continue;
    ++post;
    EXPECT_TRUE(is_dense_mlp_op(op));
    EXPECT_DOUBLE_EQ(recompute_share(op, mlp), 1);
    EXPECT_DOUBLE_EQ(kept_bytes(op, mlp, gemma.dtype_bytes), 0);
    EXPECT_GT(kept_bytes(op, attn, gemma.dtype_bytes), 0);
  }
  EXPECT_EQ(post, 62);
}

TEST(Activations, RecomputeModuleSharedExpertsKeepsOnlyTheirInput) {
  ModuleSpec spec = zoo_module("mixtral-8x7b");
  std::get<LlmSpec>(spec).moe->shared_experts = 1;
  const OpGraph g = build_op_graph(spec, input(1, 4096));
  const RecomputePolicy shared(Recompute::kSelective, kRecomputeSharedExperts);
  const RecomputePolicy with_norm(Recompute::kSelective,
                                  kRecomputeLayernorm | kRecomputeSharedExperts);
  const RecomputePolicy in_moe(Recompute::kSelective, kRecomputeMoe | kRecomputeSharedExperts);
  int shared_ops = 0;
  for (const Op& op : g.ops) {
    const bool mine = op.layer >= 0 && op.name.starts_with("shared_expert_");
    EXPECT_EQ(is_shared_expert_op(op), mine) << op.name;
    EXPECT_DOUBLE_EQ(recompute_share(op, shared), mine ? 1 : 0) << op.name;
    if (!mine) continue;
    ++shared_ops;
    // The checkpoint keeps its input, whatever "layernorm" drops; inside "moe", moe's rules.
    const double input = op.name == "shared_expert_fc1" ? op.saved.as_double() : 0;
    EXPECT_DOUBLE_EQ(kept_bytes(op, shared, g.dtype_bytes), input) << op.name;
    EXPECT_DOUBLE_EQ(kept_bytes(op, with_norm, g.dtype_bytes), input) << op.name;
    EXPECT_DOUBLE_EQ(
        kept_bytes(op, in_moe, g.dtype_bytes),
        kept_bytes(op, RecomputePolicy(Recompute::kSelective, kRecomputeMoe), g.dtype_bytes))
        << op.name;
  }
  EXPECT_EQ(shared_ops, 3 * 32);
  EXPECT_LT(activation_bytes(g, shared).count(), activation_bytes(g, Recompute::kNone).count());
}

// Every zoo module, through its op graph, with Megatron's layer code and torchtitan's
// (separate projections, repeat_kv): parameters sum to the closed-form count, GEMM FLOPs
// equal their shapes, GEMM backward splits into dgrad = wgrad = forward, attention backward
// is all dgrad, and every layer has the same ops.
TEST(OpGraph, InvariantsHoldForEveryZooModule) {
  for (const ZooEntry& e : zoo_entries()) {
    if (e.kind == "model") continue;
    for (bool torchtitan : {false, true}) {
      ModuleSpec spec = zoo_module(e.name);
      ModuleInput in = input(2, 1000);
      in.items_per_sample = 2;
      in.fused_projections = !torchtitan;
      in.repeat_kv = torchtitan;
      OpGraph g = build_op_graph(spec, in);
      int64_t params = 0;
      std::vector<int> ops_per_layer(g.layers + g.mtp_layers);
      for (const Op& op : g.ops) {
        params += op.params;
        if (op.layer >= 0) ++ops_per_layer[op.layer];
        EXPECT_DOUBLE_EQ(op.backward().count(), op.dgrad.count() + op.wgrad.count());
        if (op.kind == OpKind::kGemm) {
          double shapes = 0;
          for (const GemmShape& s : op.gemms) shapes += s.flops();
          EXPECT_DOUBLE_EQ(op.forward.count(), shapes) << e.name << " " << op.name;
          EXPECT_DOUBLE_EQ(op.dgrad.count(), op.forward.count());
          EXPECT_DOUBLE_EQ(op.wgrad.count(), op.forward.count());
        } else {
          EXPECT_TRUE(op.gemms.empty());
        }
        if (op.kind == OpKind::kAttention) {
          ASSERT_TRUE(op.attention.has_value());
          EXPECT_DOUBLE_EQ(op.forward.count(), attention_forward_flops(*op.attention).count());
          EXPECT_DOUBLE_EQ(op.dgrad.count(), 2 * op.forward.count());
          EXPECT_EQ(op.wgrad.count(), 0);
        }
      }
      EXPECT_EQ(params, count_params(spec).total) << e.name;
      // Every layer alike, an MoE LLM's dense layers (first, or by its layer pattern) among
      // themselves; a multi-token-prediction depth's layer has its norms and projection
      // besides.
      std::map<bool, int> first;  // dense or not: the first such layer's op count
      for (size_t i = 0; i < static_cast<size_t>(g.layers); ++i) {
        const bool dense = g.kinds.dense(static_cast<int64_t>(i));
        first.try_emplace(dense, ops_per_layer[i]);
        EXPECT_EQ(ops_per_layer[i], first[dense]) << e.name << " layer " << i;
      }
    }
  }
}

// Tokens are routed to top_k of E experts; expected load tokens*top_k/E, spread over
// integer GEMM shapes without losing a token.
TEST(OpGraph, MoeExpertShapes) {
  ModuleSpec spec = zoo_module("mixtral-8x7b");
  OpGraph g = build_op_graph(spec, input(1, 1001));  // 2002 routed tokens = 250 * 8 + 2
  const Op* fc1 = nullptr;
  for (const Op& op : g.ops)
    if (op.layer == 0 && op.name == "expert_fc1") fc1 = &op;
  ASSERT_NE(fc1, nullptr);
  // {251 tokens on 2 experts, 250 on 6}, gate and up one GEMM of 2 x 14336 outputs.
  ASSERT_EQ(fc1->gemms.size(), 2u);
  EXPECT_EQ(fc1->gemms[0].m, 251);
  EXPECT_EQ(fc1->gemms[0].batch, 2);
  EXPECT_EQ(fc1->gemms[0].n, 2 * 14336);
  EXPECT_EQ(fc1->gemms[1].m, 250);
  EXPECT_EQ(fc1->gemms[1].batch, 6);
  EXPECT_DOUBLE_EQ(fc1->forward.count(), 2.0 * 2 * 2002 * 4096 * 14336);
  // Forward GEMM FLOPs per token (without attention) are 2x the active matmul parameters.
  ParamCounts p = count_params(spec);
  double gemm = 0;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kGemm) gemm += op.forward.count();
  double active_matmul = static_cast<double>(p.active) - 32000.0 * 4096 - 65 * 4096;
  EXPECT_DOUBLE_EQ(gemm / 1001, 2 * active_matmul);
}

// MoeSpec::dense_layers: the first layers keep a dense MLP of the block's ffn_hidden, the
// rest route to experts; FLOPs and parameters follow layer by layer.
// MoeSpec::layer_pattern (Llama 4 Maverick's [0, 1], interleave_moe_layer_step 2): the
// even 0-based layers keep a dense MLP of ffn_hidden, the odd ones are MoE layers with the
// shared expert; 400B and 17B active as published (Meta's model card).
TEST(OpGraph, LayerPatternAlternatesDenseAndMoeLayers) {
  const ModuleSpec spec = zoo_module("llama-4-maverick");
  const OpGraph g = build_op_graph(spec, input(1, 256));
  auto has = [&](int layer, std::string_view name) {
    for (const Op& op : g.ops)
      if (op.layer == layer && op.name == name) return true;
    return false;
  };
  for (int layer = 0; layer < 48; ++layer) {
    EXPECT_EQ(g.kinds.dense(layer), layer % 2 == 0) << layer;
    EXPECT_EQ(has(layer, "mlp_fc1"), layer % 2 == 0) << layer;
    EXPECT_EQ(has(layer, "router"), layer % 2 == 1) << layer;
    EXPECT_EQ(has(layer, "shared_expert_fc1"), layer % 2 == 1) << layer;
  }
  const ParamCounts p = count_params(spec);
  EXPECT_LT(rel_err(static_cast<double>(p.total), 400e9), 0.005);
  EXPECT_LT(rel_err(static_cast<double>(p.active), 17e9), 0.02);
  const MoeSpec& moe = *std::get<LlmSpec>(spec).moe;
  EXPECT_EQ(moe.dense_layer_count(48), 24);
  EXPECT_FALSE(moe.dense_layer(48, 48));  // a multi-token-prediction depth: MoE
}

TEST(OpGraph, DenseLayersBeforeTheMoeLayers) {
  ModuleSpec spec = zoo_module("glm-4.5");
  std::get<LlmSpec>(spec).mtp_layers = 0;  // (its output head's FLOPs own no parameters)
  const OpGraph g = build_op_graph(spec, input(1, 256));
  EXPECT_EQ(g.layers, 92);
  EXPECT_EQ(g.kinds.dense_layers, 3);
  auto find = [&](int layer, std::string_view name) -> const Op* {
    for (const Op& op : g.ops)
      if (op.layer == layer && op.name == name) return &op;
    return nullptr;
  };
  for (int layer : {0, 2}) {
    const Op* fc1 = find(layer, "mlp_fc1");
    ASSERT_NE(fc1, nullptr) << layer;
    EXPECT_EQ(fc1->output_width(), 2 * 12288);
    EXPECT_EQ(find(layer, "router"), nullptr);
  }
  for (int layer : {3, 91}) {
    EXPECT_EQ(find(layer, "mlp_fc1"), nullptr) << layer;
    EXPECT_NE(find(layer, "router"), nullptr) << layer;
    EXPECT_NE(find(layer, "shared_expert_fc1"), nullptr) << layer;
  }
  // Forward GEMM FLOPs per token are 2x the active matmul parameters, dense layers and all.
  const ParamCounts p = count_params(spec);
  double gemm = 0;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kGemm) gemm += op.forward.count();
  // Active parameters outside the GEMMs: the input embedding, the norms (two per layer, the
  // q/k norms, the final one) and the QKV biases.
  const double h = 5120, qkv_bias = (96 + 2 * 8) * 128;
  const double outside = 151552 * h + 92 * (2 * h + 2 * 128 + qkv_bias) + h;
  EXPECT_DOUBLE_EQ(gemm / 256, 2 * (static_cast<double>(p.active) - outside));
}

// MlaSpec: the query through its latent (or straight from the input without one), the keys
// and values through theirs plus the shared rope key; heads of qk + rope for queries and
// keys, v for values; the attention's FLOPs count both widths.
TEST(OpGraph, LatentAttentionProjectsThroughItsLatents) {
  const ModuleSpec spec = zoo_module("deepseek-v3");
  const OpGraph g = build_op_graph(spec, input(1, 256));
  std::map<std::string, const Op*> l0;
  for (const Op& op : g.ops)
    if (op.layer == 0) l0[op.name] = &op;
  for (const char* name : {"qkv", "q_proj"}) EXPECT_FALSE(l0.contains(name)) << name;
  auto shape = [&](const char* name) {
    EXPECT_TRUE(l0.contains(name)) << name;
    const GemmShape& s = l0.at(name)->gemms.front();
    return std::tuple{s.m, s.n, s.k};
  };
  EXPECT_EQ(shape("q_down"), std::tuple(256, 1536, 7168));
  EXPECT_EQ(shape("kv_down"), std::tuple(256, 512 + 64, 7168));
  EXPECT_EQ(shape("q_up"), std::tuple(256, 128 * 192, 1536));
  EXPECT_EQ(shape("kv_up"), std::tuple(256, 128 * (128 + 128), 512));
  EXPECT_EQ(shape("attn_out"), std::tuple(256, 7168, 128 * 128));
  EXPECT_EQ(l0.at("kv_down")->saved.count(), 0);  // its input is q_down's
  const AttentionShape& a = *l0.at("attention")->attention;
  EXPECT_EQ(a.head_dim, 192);
  EXPECT_EQ(a.value_dim(), 128);
  EXPECT_EQ(a.kv_heads, 128);
  EXPECT_DOUBLE_EQ(l0.at("attention")->forward.count(), 2.0 * 128 * 256 * 256 * (192 + 128) / 2);
  // Without a query latent the query comes straight from the input.
  ModuleSpec lite = spec;
  std::get<LlmSpec>(lite).block.mla->q_lora_rank = 0;
  const OpGraph gl = build_op_graph(lite, input(1, 256));
  int q_proj = 0, q_down = 0;
  for (const Op& op : gl.ops) {
    q_proj += op.layer == 0 && op.name == "q_proj";
    q_down += op.layer == 0 && op.name == "q_down";
  }
  EXPECT_EQ(q_proj, 1);
  EXPECT_EQ(q_down, 0);
  int64_t params = 0;
  for (const Op& op : gl.ops) params += op.params;
  EXPECT_EQ(params, count_params(lite).total);
}

// SlidingWindow: Megatron-Core's window_attn_skip_freq counts layers from 1, so with
// full_every 2 the even 0-based layers are windowed (gpt-oss: layers 1, 3, ... of 36 in
// 1-based numbers) and the odd ones attend fully; a windowed layer's attention scores the
// band of seq·window − window²/2 pairs, not seq²/2, and nothing else in the layer changes.
TEST(OpGraph, SlidingWindowLayersScoreTheirBand) {
  const ModuleSpec spec = zoo_module("gpt-oss-120b");
  const int64_t seq = 4096, w = 128;
  const OpGraph g = build_op_graph(spec, input(2, seq));
  ASSERT_TRUE(g.kinds.window.has_value());
  std::map<int, const Op*> attention;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kAttention) attention[op.layer] = &op;
  ASSERT_EQ(attention.size(), 36u);
  const double per_pair = 2.0 * 2 * 64 * (64 + 64);
  for (const auto& [layer, op] : attention) {
    EXPECT_EQ(g.kinds.windowed(layer), layer % 2 == 0) << layer;
    EXPECT_EQ(op->attention->window, g.kinds.windowed(layer) ? w : 0) << layer;
    const double pairs = g.kinds.windowed(layer) ? seq * w - w * w / 2.0 : seq * seq / 2.0;
    EXPECT_DOUBLE_EQ(op->forward.count(), per_pair * pairs) << layer;
    EXPECT_DOUBLE_EQ(op->dgrad.count(), 2 * op->forward.count()) << layer;
  }
  EXPECT_EQ(attention[0]->saved, attention[1]->saved);  // flash: Q, K, V and the LSE alike
  // A window as long as the sequence is causal attention; every layer windowed without
  // full_every.
  EXPECT_DOUBLE_EQ(causal_score_pairs(seq, seq), seq * seq / 2.0);
  ModuleSpec all = spec;
  std::get<LlmSpec>(all).block.sliding_window->full_every = 0;
  const OpGraph ga = build_op_graph(all, input(2, seq));
  for (int64_t layer = 0; layer < 36; ++layer) EXPECT_TRUE(ga.kinds.windowed(layer)) << layer;
  // gpt-oss's published sizes: 116.8B and 20.9B (model card, arXiv 2508.10925; without the
  // router's bias, 4.6K and 768 parameters). Its attention sinks: a parameter per head.
  EXPECT_EQ(attention[0]->params, 64);
  EXPECT_LT(rel_err(static_cast<double>(count_params(spec).total), 116.83e9), 0.001);
  EXPECT_LT(rel_err(static_cast<double>(count_params(zoo_module("gpt-oss-20b")).total), 20.91e9),
            0.001);
}

// LlmSpec::mtp_layers: after the loss, each depth embeds the next token (the shared table:
// no parameters), normalises it and the hidden states, projects the 2h concatenation to h,
// runs one more (MoE) layer and a final norm, and the shared output head (no parameters)
// with a loss of its own; the depth's layer ops carry index layers + depth.
TEST(OpGraph, MultiTokenPredictionDepthsAfterTheLoss) {
  const ModuleSpec spec = zoo_module("glm-4.5");
  const OpGraph g = build_op_graph(spec, input(1, 256));
  EXPECT_EQ(g.mtp_layers, 1);
  size_t loss = g.ops.size();
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].name == "loss") loss = i;
  ASSERT_LT(loss, g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) EXPECT_EQ(g.ops[i].mtp, i > loss) << g.ops[i].name;
  std::map<std::string, const Op*> mtp;
  for (size_t i = loss + 1; i < g.ops.size(); ++i) mtp[g.ops[i].name] = &g.ops[i];
  for (const char* name : {"mtp_embedding", "mtp_logits", "mtp_loss"}) {
    ASSERT_TRUE(mtp.contains(name)) << name;
    EXPECT_EQ(mtp[name]->layer, -1) << name;
    EXPECT_EQ(mtp[name]->params, 0) << name;  // the shared table and output head
  }
  for (const char* name : {"mtp_enorm", "mtp_hnorm", "mtp_eh_proj", "router", "expert_fc1",
                           "shared_expert_fc1", "mtp_final_norm"}) {
    ASSERT_TRUE(mtp.contains(name)) << name;
    EXPECT_EQ(mtp[name]->layer, 92) << name;
  }
  const GemmShape& proj = mtp["mtp_eh_proj"]->gemms.front();
  EXPECT_EQ(proj.m, 256);
  EXPECT_EQ(proj.n, 5120);
  EXPECT_EQ(proj.k, 2 * 5120);
  EXPECT_DOUBLE_EQ(mtp["mtp_logits"]->forward.count(), 2.0 * 256 * 5120 * 151552);
  // Its model FLOPs: one more MoE layer, the projection and the head.
  ModuleSpec plain = spec;
  std::get<LlmSpec>(plain).mtp_layers = 0;
  const OpGraph without = build_op_graph(plain, input(1, 256));
  double layer = 0;
  for (const Op& op : without.ops)
    if (op.layer == 91 && is_matmul(op.kind)) layer += op.forward.count();
  EXPECT_DOUBLE_EQ(forward_flops(g).count() - forward_flops(without).count(),
                   layer + proj.flops() + mtp["mtp_logits"]->forward.count());
}

// Token dropping (ModuleInput::moe_capacity_factor): every expert takes its capacity,
// ceil(factor x tokens x top_k / experts) routed tokens, padded to it (Megatron's
// get_capacity and drop_and_pad), and the permutations move that many copies. 1001 tokens
// top 2 over 8 experts: 250.25 each, capacity ceil(250.25 x 1.25) = 313, or 251 at 1.0.
TEST(OpGraph, TokenDroppingPadsEveryExpertToItsCapacity) {
  ModuleSpec spec = zoo_module("mixtral-8x7b");
  for (const auto& [factor, capacity] : {std::pair{1.25, 313}, std::pair{1.0, 251}}) {
    ModuleInput in = input(1, 1001);
    in.moe_capacity_factor = factor;
    OpGraph g = build_op_graph(spec, in);
    for (const Op& op : g.ops) {
      if (op.layer != 0) continue;
      if (op.name == "expert_fc1" || op.name == "expert_fc2") {
        ASSERT_EQ(op.gemms.size(), 1u) << op.name;
        EXPECT_EQ(op.gemms[0].m, capacity) << op.name;
        EXPECT_EQ(op.gemms[0].batch, 8) << op.name;
      }
      if (op.name == "moe_dispatch") {
        EXPECT_EQ(op.written.count(), int64_t{8} * capacity * 4096 * 2) << factor;
      }
      if (op.name == "moe_combine") {
        EXPECT_EQ(op.read.count(), int64_t{8} * capacity * 4096 * 2) << factor;
      }
    }
  }
}

// Dropless routing's hottest EP rank (ModuleInput::moe_load_imbalance): the experts and the
// reorders of the copies a rank receives run at its load, 1.5 x the 2002 copies of 1001
// tokens top 2 = 3003 over 8 experts (3 of 376, 5 of 375); the router, the permute and
// the unpermute keep the rank's own 2002.
TEST(OpGraph, LoadImbalanceRunsTheExpertsAtTheHottestRanksLoad) {
  ModuleSpec spec = zoo_module("mixtral-8x7b");
  ModuleInput in = input(1, 1001);
  const OpGraph even = build_op_graph(spec, in);
  in.moe_load_imbalance = 1.5;
  const OpGraph hot = build_op_graph(spec, in);
  ASSERT_EQ(even.ops.size(), hot.ops.size());
  const int64_t copy = 4096 * 2;
  for (size_t i = 0; i < hot.ops.size(); ++i) {
    const Op& op = hot.ops[i];
    if (op.layer != 0) continue;
    if (op.name == "expert_fc1" || op.name == "expert_fc2") {
      int64_t rows = 0, experts = 0;
      for (const GemmShape& s : op.gemms) {
        rows += s.m * s.batch;
        experts += s.batch;
      }
      EXPECT_EQ(rows, 3003) << op.name;
      EXPECT_EQ(experts, 8) << op.name;
    }
    if (op.name.starts_with("expert_")) {  // fc1, the activation, fc2: 3003 / 2002 rows
      EXPECT_DOUBLE_EQ(op.forward.count(), 1.5 * even.ops[i].forward.count()) << op.name;
      if (op.kind != OpKind::kGemm) {  // a GEMM also reads its weights
        EXPECT_EQ(2 * op.read.count(), 3 * even.ops[i].read.count()) << op.name;
      }
    } else if (op.name == "moe_sort" || op.name == "moe_unsort") {
      EXPECT_EQ(op.read.count(), 3003 * copy) << op.name;
      EXPECT_EQ(op.written.count(), 3003 * copy) << op.name;
    } else {
      EXPECT_EQ(op.forward, even.ops[i].forward) << op.name;
      EXPECT_EQ(op.read, even.ops[i].read) << op.name;
      EXPECT_EQ(op.written, even.ops[i].written) << op.name;
    }
    if (op.name == "moe_dispatch") {
      EXPECT_EQ(op.written.count(), 2002 * copy);
    }
    if (op.name == "moe_combine") {
      EXPECT_EQ(op.read.count(), 2002 * copy);
    }
  }
}

// head_dim apart from hidden / heads (Qwen3): the projections and the attention take the
// heads' own width, 32 x 128 = 4096 against a 2048-wide residual stream.
TEST(OpGraph, HeadDimSetsTheAttentionWidth) {
  OpGraph g = build_op_graph(zoo_module("qwen3-30b-a3b"), input(1, 4096));
  for (const Op& op : g.ops) {
    if (op.layer != 0) continue;
    if (op.name == "qkv") {
      EXPECT_EQ(op.gemms[0].n, (32 + 2 * 4) * 128);
      EXPECT_EQ(op.gemms[0].k, 2048);
    }
    if (op.name == "attn_out") {
      EXPECT_EQ(op.gemms[0].n, 2048);
      EXPECT_EQ(op.gemms[0].k, 32 * 128);
    }
    if (op.name == "attention") {
      EXPECT_EQ(op.attention->head_dim, 128);
    }
  }
}

// torchtitan's Llama code: wq, wk, wv and w1, w3 as GEMMs of their own (one shape per part,
// the input read once, FLOPs and parameters unchanged), selective_op re-running the k and
// up projections alike; repeat_kv writes K and V at the 32 query heads' width before the
// attention core, which then reads (and saves) them at that width. MoE experts keep their
// fused gate-and-up GEMM; a model without grouped-query attention gets no copy.
TEST(OpGraph, SeparateProjectionsAndRepeatedKeysAsTorchtitanRunsThem) {
  const int64_t T = 8192;
  const ModuleSpec llama = zoo_module("llama-3.1-8b");
  ModuleInput in = input(1, T);
  const OpGraph fused = build_op_graph(llama, in);
  in.fused_projections = false;
  in.repeat_kv = true;
  const OpGraph split = build_op_graph(llama, in);
  auto layer0 = [](const OpGraph& g, std::string_view name) -> const Op* {
    for (const Op& op : g.ops)
      if (op.layer == 0 && op.name == name) return &op;
    return nullptr;
  };
  const Op* qkv = layer0(split, "qkv");
  const Op* fc1 = layer0(split, "mlp_fc1");
  ASSERT_TRUE(qkv && fc1);
  EXPECT_TRUE(qkv->separate_parts && fc1->separate_parts);
  ASSERT_EQ(qkv->gemms.size(), 3u);
  EXPECT_EQ(qkv->gemms[0].n, 4096);
  EXPECT_EQ(qkv->gemms[1].n, 1024);
  EXPECT_EQ(qkv->gemms[2].n, 1024);
  EXPECT_EQ(qkv->output_width(), 6144);
  ASSERT_EQ(fc1->gemms.size(), 2u);
  EXPECT_EQ(fc1->gemms[1].n, 14336);
  for (std::string_view name : {"qkv", "mlp_fc1"}) {
    const Op& a = *layer0(fused, name);
    const Op& b = *layer0(split, name);
    EXPECT_FALSE(a.separate_parts);
    EXPECT_DOUBLE_EQ(a.forward.count(), b.forward.count()) << name;
    EXPECT_EQ(a.params, b.params) << name;
    EXPECT_EQ(a.read, b.read) << name;
    EXPECT_DOUBLE_EQ(recompute_share(a, Recompute::kSelectiveOp),
                     recompute_share(b, Recompute::kSelectiveOp))
        << name;
  }
  EXPECT_EQ(layer0(fused, "repeat_kv"), nullptr);
  const Op* repeat = layer0(split, "repeat_kv");
  ASSERT_NE(repeat, nullptr);
  EXPECT_EQ(repeat->read.count(), T * 2 * 8 * 128 * 2);
  EXPECT_EQ(repeat->written.count(), T * 2 * 32 * 128 * 2);
  EXPECT_EQ(layer0(split, "attention")->attention->kv_heads, 32);
  EXPECT_EQ(layer0(split, "attention")->saved.count() - layer0(fused, "attention")->saved.count(),
            T * 2 * (32 - 8) * 128 * 2);
  EXPECT_DOUBLE_EQ(recompute_share(*repeat, Recompute::kSelectiveOp), 1);
  EXPECT_EQ(count_params(llama).total, [&] {
    int64_t n = 0;
    for (const Op& op : split.ops) n += op.params;
    return n;
  }());

  ModuleInput moe_in = input(1, 1001);
  moe_in.fused_projections = false;
  moe_in.repeat_kv = true;
  const OpGraph moe = build_op_graph(zoo_module("mixtral-8x7b"), moe_in);
  EXPECT_FALSE(layer0(moe, "expert_fc1")->separate_parts);
  EXPECT_TRUE(layer0(moe, "qkv")->separate_parts);
  const OpGraph mha = build_op_graph(zoo_module("gpt3-1.3b"), moe_in);
  EXPECT_EQ(layer0(mha, "repeat_kv"), nullptr);  // as many kv heads as heads
}

// Qwen3's QK-norm: an RMSNorm over each head's query and key after the projection, before
// RoPE, saving its input; two head_dim-wide weights per layer, in the parameter count.
TEST(OpGraph, QkNormNormalisesEachHeadsQueryAndKey) {
  const ModuleSpec qwen = zoo_module("qwen3-30b-a3b");
  OpGraph g = build_op_graph(qwen, input(1, 4096));
  const std::vector<std::string> order = layer_op_names(g, 0);
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(order[1], "qkv");
  EXPECT_EQ(order[2], "qk_norm");
  EXPECT_EQ(order[3], "rope");
  for (const Op& op : g.ops) {
    if (op.layer != 0 || op.name != "qk_norm") continue;
    const int64_t qk = 4096 * (32 + 4) * 128 * 2;  // bf16 queries and keys
    EXPECT_EQ(op.read.count(), qk + 2 * 128 * 2);  // and the two weights
    EXPECT_EQ(op.written.count(), qk);
    EXPECT_EQ(op.saved.count(), qk);
    EXPECT_EQ(op.params, 2 * 128);
  }
  ModuleSpec plain = qwen;
  std::get<LlmSpec>(plain).block.qk_norm = false;
  EXPECT_EQ(count_params(qwen).total - count_params(plain).total, 48 * 2 * 128);
}

// Gemma 3's post-norms: an RMSNorm on the attention's output projection and on the MLP's
// second linear, each before its residual add, saving its input; h-wide weights, two per
// layer in the parameter count.
TEST(OpGraph, PostNormsFollowTheAttentionAndTheMlp) {
  const ModuleSpec gemma = zoo_module("gemma-3-27b");
  OpGraph g = build_op_graph(gemma, input(1, 4096));
  const std::vector<std::string> order = layer_op_names(g, 0);
  auto after = [&](std::string_view name) {
    const auto it = std::find(order.begin(), order.end(), name);
    return it == order.end() || it + 1 == order.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(after("attn_out"), "attn_post_norm");
  EXPECT_EQ(after("attn_post_norm"), "attn_residual");
  EXPECT_EQ(after("mlp_fc2"), "mlp_post_norm");
  EXPECT_EQ(after("mlp_post_norm"), "mlp_residual");
  for (const Op& op : g.ops) {
    if (op.layer != 0 || !op.name.ends_with("_post_norm")) continue;
    EXPECT_EQ(op.kind, OpKind::kNorm);
    EXPECT_EQ(op.saved.count(), 4096 * 5376 * 2);
    EXPECT_EQ(op.params, 5376);
  }
  ModuleSpec plain = gemma;
  std::get<LlmSpec>(plain).block.post_norms = false;
  EXPECT_EQ(count_params(gemma).total - count_params(plain).total, 62 * 2 * 5376);
  EXPECT_EQ(build_op_graph(plain, input(1, 4096)).ops.size() + 62 * 2, g.ops.size());
}

// Korthikanti et al. 2022, sec. 4.1: 34sbh + 5as^2b bytes per layer (bf16, dropout, GeLU
// MLP of 4h, no tensor parallelism); flash attention keeps 4asb bytes of softmax stats
// instead of the 5as^2b. Selective recompute leaves 34sbh; full keeps the 2sbh layer input.
TEST(Activations, MatchKorthikanti) {
  const LlmSpec llm = zoo_llm("gpt3-1.3b");
  const int64_t s = 2048, b = 2, h = llm.block.hidden, a = llm.block.heads, l = llm.block.layers;
  for (bool flash : {false, true}) {
    OpGraph g = build_op_graph(ModuleSpec(llm), input(b, s, flash));
    int64_t layer0 = 0, outside = 0;
    for (const Op& op : g.ops) {
      if (op.layer == 0) layer0 += op.saved.count();
      if (op.layer < 0) outside += op.saved.count();
    }
    EXPECT_EQ(layer0, 34 * s * b * h + (flash ? 4 * a * s * b : 5 * a * s * s * b)) << flash;
    EXPECT_EQ(activation_bytes(g, Recompute::kSelective).count(), l * 34 * s * b * h + outside);
    EXPECT_EQ(activation_bytes(g, Recompute::kFull).count(), l * 2 * s * b * h + outside);
    EXPECT_EQ(activation_bytes(g, Recompute::kNone).count(), l * layer0 + outside);
  }
}

TEST(OpGraph, EncoderFrontEnds) {
  OpGraph whisper = build_op_graph(zoo_module("whisper-large-v3-encoder"), input(3, 0));
  EXPECT_EQ(whisper.layer_tokens, 3 * 1500);
  ASSERT_EQ(whisper.ops[0].name, "conv1");
  const GemmShape& conv1 = whisper.ops[0].gemms[0];
  EXPECT_EQ(conv1.m, 3 * 3000);
  EXPECT_EQ(conv1.n, 1280);
  EXPECT_EQ(conv1.k, 128 * 3);
  const GemmShape& conv2 = whisper.ops[2].gemms[0];
  EXPECT_EQ(conv2.m, 3 * 1500);
  EXPECT_EQ(conv2.k, 1280 * 3);

  ModuleInput in = input(2, 0);
  in.items_per_sample = 3;
  OpGraph clip = build_op_graph(zoo_module("clip-vit-l-14-336"), in);
  EXPECT_EQ(clip.layer_tokens, 6 * 577);  // 24 x 24 patches + class token, 6 images
  const GemmShape& patch = clip.ops[0].gemms[0];
  EXPECT_EQ(patch.m, 6 * 576);
  EXPECT_EQ(patch.k, 3 * 14 * 14);
}

// InternVL-style 2x2 pixel shuffle: 1024 patches -> 256 tokens of width 4 * 3200.
TEST(Json, InlineModelWithDownsamplingProjector) {
  auto m = model_from_json_text(R"({
    "name": "internvl-like",
    "modules": [
      {"name": "vision", "spec": "internvit-6b"},
      {"name": "mlp", "kind": "projector",
       "spec": {"input_hidden": 3200, "output_hidden": 5120, "ffn_hidden": 5120, "downsample": 2}},
      {"name": "llm", "kind": "llm", "spec": {"layers": 2, "hidden": 5120, "ffn_hidden": 8192,
       "heads": 40, "kv_heads": 8, "vocab": 1000, "activation": "swiglu", "norm": "rmsnorm"}}]})",
                                "test");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(llm_tokens_per_item(*m, 0), 256);
  OpGraph proj = build_op_graph(m->modules[1].spec, module_input(*m, 1, input(1, 4096)));
  EXPECT_EQ(proj.ops[0].name, "pixel_shuffle");
  EXPECT_EQ(proj.ops[1].gemms[0].m, 256);
  EXPECT_EQ(proj.ops[1].gemms[0].k, 4 * 3200);
}

// A one-layer LLM (hidden 256, ffn 1024) with activation `act`, norm `norm` and the spec's
// `extra` fields (", \"key\": value" ...), and one of its ops over a 128-token sequence.
Result<ModelSpec> one_layer_llm(const std::string& act, const std::string& norm,
                                const std::string& extra = "") {
  return model_from_json_text(
      R"({"name": "m", "modules": [{"name": "llm", "kind": "llm", "spec": {"layers": 1,
      "hidden": 256, "ffn_hidden": 1024, "heads": 4, "vocab": 100, "activation": ")" +
          act + R"(", "norm": ")" + norm + R"(")" + extra + "}}]}",
      "test");
}
// A one-layer MoE LLM (hidden 256, 4 heads) whose "moe" object holds the fields `moe`.
Result<ModelSpec> one_layer_moe(const std::string& moe) {
  return model_from_json_text(
      R"({"name": "m", "modules": [{"name": "llm", "kind": "llm", "spec": {"layers": 1,
      "hidden": 256, "heads": 4, "vocab": 100, "activation": "swiglu", "norm": "rmsnorm",
      "moe": {)" + moe + "}}}]}",
      "test");
}
Op op_named(const ModelSpec& m, const std::string& name) {
  OpGraph g = build_op_graph(m.modules[0].spec, module_input(m, 0, input(1, 128)));
  for (const Op& o : g.ops)
    if (o.name == name) return o;
  ADD_FAILURE() << name;
  return Op{};
}

// Squared ReLU (Nemotron-4) is an ungated MLP: fc1 h -> f, one activation pass over f,
// fc2 f -> h; the same bytes as GELU, fewer FLOPs per element.
TEST(Json, SquaredReluIsAnUngatedMlp) {
  auto relu2 = one_layer_llm("squared_relu", "layernorm");
  auto gelu = one_layer_llm("gelu", "layernorm");
  ASSERT_TRUE(relu2.is_ok()) << relu2.status().message();
  ASSERT_TRUE(gelu.is_ok()) << gelu.status().message();
  const auto& block = std::get<LlmSpec>(relu2->modules[0].spec).block;
  EXPECT_EQ(block.activation, Activation::kSquaredRelu);
  EXPECT_EQ(to_string(block.activation), "squared_relu");
  EXPECT_EQ(count_params(*relu2).total, count_params(*gelu).total);
  const auto op = op_named;
  EXPECT_EQ(op(*relu2, "mlp_fc1").gemms[0].n, 1024);
  const Op a = op(*relu2, "mlp_act"), g = op(*gelu, "mlp_act");
  EXPECT_EQ(a.read, g.read);
  EXPECT_EQ(a.written, g.written);
  EXPECT_LT(a.forward.count(), g.forward.count());
}

// Every activation parses from its own name (to_string), and only those names parse.
TEST(Json, EveryActivationParsesFromItsName) {
  for (Activation a : kActivations) {
    auto m = one_layer_llm(std::string(to_string(a)), "rmsnorm");
    ASSERT_TRUE(m.is_ok()) << to_string(a) << ": " << m.status().message();
    EXPECT_EQ(std::get<LlmSpec>(m->modules[0].spec).block.activation, a);
  }
  EXPECT_FALSE(one_layer_llm("relu", "rmsnorm").is_ok());
}

// GeGLU (Gemma) is gated as SwiGLU is: fc1 h -> 2f, the same parameters and bytes, a GELU's
// FLOPs per element in its activation.
TEST(Json, GegluIsAGatedMlp) {
  auto model = [](const std::string& act) { return one_layer_llm(act, "rmsnorm"); };
  auto geglu = model("geglu"), swiglu = model("swiglu");
  ASSERT_TRUE(geglu.is_ok()) << geglu.status().message();
  ASSERT_TRUE(swiglu.is_ok()) << swiglu.status().message();
  const auto& block = std::get<LlmSpec>(geglu->modules[0].spec).block;
  EXPECT_EQ(block.activation, Activation::kGeglu);
  EXPECT_EQ(to_string(block.activation), "geglu");
  EXPECT_TRUE(is_gated(Activation::kGeglu) && is_gated(Activation::kSwiglu));
  EXPECT_FALSE(is_gated(Activation::kGelu) || is_gated(Activation::kSquaredRelu));
  EXPECT_EQ(count_params(*geglu).total, count_params(*swiglu).total);
  const auto op = op_named;
  EXPECT_EQ(op(*geglu, "mlp_fc1").gemms[0].n, 2048);
  const Op a = op(*geglu, "mlp_act"), s = op(*swiglu, "mlp_act");
  EXPECT_EQ(a.read, s.read);
  EXPECT_EQ(a.written, s.written);
  EXPECT_GT(a.forward.count(), s.forward.count());
  auto bad = model("reglu");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("geglu"), std::string::npos) << bad.status().message();
}

// Quick GeGLU (gpt-oss) is gated; Megatron-Core's clamp and linear offset ride on the
// activation op (they run as kernels of their own when unfused) and need a gated unit.
TEST(Json, QuickGegluCarriesItsClampAndOffset) {
  auto model = [](const std::string& act, const std::string& extra) {
    return one_layer_llm(act, "rmsnorm", extra);
  };
  auto oss = model("quick_geglu", R"(, "activation_clamp": 7, "glu_linear_offset": 1)");
  ASSERT_TRUE(oss.is_ok()) << oss.status().message();
  const auto& block = std::get<LlmSpec>(oss->modules[0].spec).block;
  EXPECT_EQ(to_string(block.activation), "quick_geglu");
  EXPECT_EQ(block.activation_clamp, 7);
  EXPECT_EQ(block.glu_linear_offset, 1);
  EXPECT_EQ(count_params(*oss).total, count_params(*one_layer_llm("swiglu", "rmsnorm")).total);
  const Op act = op_named(*oss, "mlp_act");
  ASSERT_TRUE(act.activation.has_value());
  EXPECT_EQ(*act.activation, (MlpActivation{Activation::kQuickGeglu, true, true}));
  EXPECT_EQ(op_named(*model("quick_geglu", ""), "mlp_act").activation,
            (MlpActivation{Activation::kQuickGeglu, false, false}));
  auto ungated = model("gelu", R"(, "activation_clamp": 7)");
  ASSERT_FALSE(ungated.is_ok());
  EXPECT_NE(ungated.status().message().find("activation_clamp"), std::string::npos)
      << ungated.status().message();
  auto offset = model("squared_relu", R"(, "glu_linear_offset": 1)");
  ASSERT_FALSE(offset.is_ok());
  EXPECT_NE(offset.status().message().find("glu_linear_offset"), std::string::npos);
  auto negative = model("swiglu", R"(, "activation_clamp": -1)");
  ASSERT_FALSE(negative.is_ok());
  EXPECT_NE(negative.status().message().find("activation_clamp"), std::string::npos);
}

// RoPE's base and Llama 3.1's scaling factor: an llm's, with RoPE positions only.
TEST(Json, RopeBaseAndScalingNeedRopePositions) {
  auto model = [](const std::string& extra) { return one_layer_llm("swiglu", "rmsnorm", extra); };
  auto l31 = model(R"(, "rope_base": 500000, "rope_scaling_factor": 8)");
  ASSERT_TRUE(l31.is_ok()) << l31.status().message();
  EXPECT_EQ(std::get<LlmSpec>(l31->modules[0].spec).rope_base, 500000);
  EXPECT_EQ(std::get<LlmSpec>(l31->modules[0].spec).rope_scaling_factor, 8);
  EXPECT_EQ(std::get<LlmSpec>(model("")->modules[0].spec).rope_base, 0);  // the trainer's
  auto learned = model(R"(, "position_embedding": "learned", "max_positions": 2048, )"
                       R"("rope_base": 10000)");
  ASSERT_FALSE(learned.is_ok());
  EXPECT_NE(learned.status().message().find("rope_base"), std::string::npos)
      << learned.status().message();
  auto shrink = model(R"(, "rope_scaling_factor": 0.5)");
  ASSERT_FALSE(shrink.is_ok());
  EXPECT_NE(shrink.status().message().find("rope_scaling_factor"), std::string::npos);
}

// YaRN (gpt-oss's, DeepSeek-V3's): an llm's, with RoPE positions, instead of Llama 3.1's
// scaling; its concentration get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
// marks the RoPE op scaled where it is not 1. rotary_percent: the RoPE op rotates that share
// of each head (its FLOPs) and reads and writes all of it.
TEST(Json, YarnAndRotaryPercent) {
  auto model = [](const std::string& extra) { return one_layer_llm("swiglu", "rmsnorm", extra); };
  auto oss = model(R"(, "yarn": {"factor": 32, "original_max_positions": 4096, )"
                   R"("truncate": false})");
  ASSERT_TRUE(oss.is_ok()) << oss.status().message();
  const Yarn& y = *std::get<LlmSpec>(oss->modules[0].spec).yarn;
  EXPECT_EQ(y.factor, 32);
  EXPECT_EQ(y.original_max_positions, 4096);
  EXPECT_EQ(y.beta_fast, 32);  // Megatron-Core's and Hugging Face's defaults
  EXPECT_EQ(y.beta_slow, 1);
  EXPECT_FALSE(y.truncate);
  EXPECT_NEAR(y.concentration(), 0.1 * std::log(32.0) + 1, 1e-12);
  EXPECT_TRUE(op_named(*oss, "rope").rope->scaled);
  auto ds = model(R"(, "yarn": {"factor": 40, "original_max_positions": 4096, "mscale": 1, )"
                  R"("mscale_all_dim": 1})");
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(std::get<LlmSpec>(ds->modules[0].spec).yarn->concentration(), 1);
  EXPECT_FALSE(op_named(*ds, "rope").rope->scaled);
  EXPECT_FALSE(op_named(*model(""), "rope").rope->scaled);
  const auto refused = [&](const std::string& extra, const std::string& field) {
    auto m = model(extra);
    ASSERT_FALSE(m.is_ok()) << extra;
    EXPECT_NE(m.status().message().find(field), std::string::npos) << m.status().message();
  };
  refused(R"(, "yarn": {"factor": 0.5, "original_max_positions": 4096})", "yarn.factor");
  refused(R"(, "yarn": {"factor": 4})", "original_max_positions");
  refused(R"(, "yarn": {"factor": 4, "original_max_positions": 4096, "beta_fast": 1, )"
          R"("beta_slow": 2})",
          "yarn.beta_fast");
  refused(R"(, "yarn": {"factor": 4, "original_max_positions": 4096}, )"
          R"("rope_scaling_factor": 8)",
          "yarn");
  refused(R"(, "position_embedding": "learned", "max_positions": 2048, )"
          R"("yarn": {"factor": 4, "original_max_positions": 4096})",
          "yarn");
  auto half = model(R"(, "rotary_percent": 0.5)");
  ASSERT_TRUE(half.is_ok()) << half.status().message();
  const Op r = op_named(*half, "rope"), full = op_named(*model(""), "rope");
  EXPECT_EQ(r.rope->rotated, 0.5);
  EXPECT_EQ(r.rope->head_dim, 64);
  EXPECT_EQ(r.read, full.read);
  EXPECT_EQ(r.written, full.written);
  EXPECT_EQ(r.forward.count() * 2, full.forward.count());
  refused(R"(, "rotary_percent": 0.3)", "rotary_percent");  // 19.2 of 64 channels
  refused(R"(, "rotary_percent": 1.5)", "rotary_percent");
  refused(R"(, "rotary_percent": 0)", "rotary_percent");
}

// moe.probs_on_input: Llama 4's top-1 routing scaling the expert's input, an op of its own
// before the experts over the received copies (kept for the probabilities' gradient); only
// with top_k 1, as Megatron-Core asserts.
TEST(Json, ProbsOnInputIsTopOneAndAnOpBeforeTheExperts) {
  EXPECT_TRUE(zoo_llm("llama-4-maverick").moe->probs_on_input);
  EXPECT_FALSE(zoo_llm("mixtral-8x7b").moe->probs_on_input);
  auto model = [](int top_k) {
    return one_layer_moe(R"("experts": 8, "top_k": )" + std::to_string(top_k) +
                         R"(, "expert_ffn_hidden": 512, "probs_on_input": true)");
  };
  auto one = model(1);
  ASSERT_TRUE(one.is_ok()) << one.status().message();
  ModuleInput in;
  in.seq_len = 64;
  const OpGraph g = build_op_graph(one->modules[0].spec, in);
  const auto at = [&](std::string_view name) {
    return std::find_if(g.ops.begin(), g.ops.end(), [&](const Op& o) { return o.name == name; });
  };
  ASSERT_NE(at("moe_probs_in"), g.ops.end());
  EXPECT_EQ(at("moe_probs_in") + 1, at("expert_fc1"));
  EXPECT_EQ(at("moe_probs_in")->written, Bytes(64 * 256 * 2));  // 64 copies of 256, bf16
  EXPECT_EQ(at("moe_probs_in")->saved, Bytes(64 * 256 * 2));
  auto two = model(2);
  ASSERT_FALSE(two.is_ok());
  EXPECT_NE(two.status().message().find("moe.probs_on_input: needs top_k 1, got 2"),
            std::string::npos)
      << two.status().message();
}

// Qwen1.5-MoE's router: the softmax before the top-k (softmax scores only) and the sigmoid
// gate on its shared experts' output (shared experts needed), h parameters a layer, an op
// after the shared experts.
TEST(Json, PreSoftmaxAndSharedExpertGate) {
  const LlmSpec q = zoo_llm("qwen1.5-moe-a2.7b");
  EXPECT_TRUE(q.moe->pre_softmax && q.moe->shared_expert_gate);
  LlmSpec ungated = q;
  ungated.moe->shared_expert_gate = false;
  EXPECT_EQ(count_params(ModuleSpec(q)).total - count_params(ModuleSpec(ungated)).total, 24 * 2048);
  const OpGraph g = build_op_graph(ModuleSpec(q), input(1, 4096));
  int gates = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].name != "shared_expert_gate") continue;
    ++gates;
    EXPECT_EQ(g.ops[i - 1].name, "shared_expert_fc2");
    EXPECT_EQ(g.ops[i].params, 2048);
  }
  EXPECT_EQ(gates, 24);
  auto model = [](const std::string& moe) {
    return one_layer_moe(R"("experts": 8, "top_k": 2, "expert_ffn_hidden": 512)" + moe);
  };
  auto sigmoid = model(R"(, "score_function": "sigmoid", "pre_softmax": true)");
  ASSERT_FALSE(sigmoid.is_ok());
  EXPECT_NE(sigmoid.status().message().find("moe.pre_softmax: needs score_function softmax"),
            std::string::npos);
  auto alone = model(R"(, "shared_expert_gate": true)");
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find("moe.shared_expert_gate: needs moe.shared_experts"),
            std::string::npos);
}

// no_rope_every: Llama 4's NoPE layers (every 4th by its 1-based number), on RoPE positions
// only, every layer-th layer at most (Megatron-Core expands the integer over whole repeats),
// not with mla, whose decoupled RoPE runs in every layer.
TEST(Json, NoRopeEveryIsLlama4sAndChecked) {
  EXPECT_EQ(zoo_llm("llama-4-maverick").no_rope_every, 4);
  EXPECT_EQ(zoo_llm("llama-3.1-8b").no_rope_every, 0);
  auto model = [](const std::string& extra) { return one_layer_llm("swiglu", "rmsnorm", extra); };
  const auto refused = [&](const std::string& extra, const std::string& what) {
    auto m = model(extra);
    ASSERT_FALSE(m.is_ok()) << extra;
    EXPECT_NE(m.status().message().find(what), std::string::npos) << m.status().message();
  };
  refused(R"(, "no_rope_every": 2)", "divide layers (1)");
  refused(R"(, "no_rope_every": 1)", "1 would drop RoPE from every layer");
  refused(R"(, "position_embedding": "learned", "max_positions": 2048, "no_rope_every": 2)",
          "no_rope_every: needs position_embedding rope");
}

// The MoE router's semantics (DeepSeek-V3's: sigmoid scores, expert bias, weights scaled by
// 2.5, 4 of 8 expert groups): parsed, costing what a softmax router does, and grouped only
// where whole groups can hold top_k experts.
TEST(Json, MoeRouterFieldsParseAndCheckTheirGroups) {
  auto model = [](const std::string& router) {
    return one_layer_moe(R"("experts": 16, "top_k": 4, "expert_ffn_hidden": 64)" + router);
  };
  auto ds = model(R"(, "score_function": "sigmoid", "expert_bias": true, "topk_scaling": 2.5, )"
                  R"("groups": 8, "group_topk": 4)");
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  const MoeSpec& m = *std::get<LlmSpec>(ds->modules[0].spec).moe;
  EXPECT_TRUE(m.sigmoid_router);
  EXPECT_TRUE(m.expert_bias);
  EXPECT_EQ(m.topk_scaling, 2.5);
  EXPECT_EQ(m.groups, 8);
  EXPECT_EQ(m.group_topk, 4);
  auto plain = model("");
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_FALSE(std::get<LlmSpec>(plain->modules[0].spec).moe->sigmoid_router);
  EXPECT_EQ(count_params(*ds).total, count_params(*plain).total);
  const auto refused = [&](const std::string& router, const std::string& field) {
    auto r = model(router);
    ASSERT_FALSE(r.is_ok()) << router;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  };
  refused(R"(, "score_function": "tanh")", "score_function");
  refused(R"(, "groups": 3, "group_topk": 1)", "moe.groups");      // 3 does not divide 16
  refused(R"(, "groups": 8, "group_topk": 1)", "moe.groups");      // 2 experts < top_k 4
  refused(R"(, "groups": 8, "group_topk": 9)", "moe.groups");      // more than the groups
  refused(R"(, "group_topk": 2)", "moe.group_topk");               // no groups
}

// Norms scaled by 1 + gamma: a flag of the block, false unless given, costing nothing.
TEST(Json, ZeroCenteredGammaIsAFlagOfTheBlock) {
  auto centred = one_layer_llm("swiglu", "rmsnorm", R"(, "zero_centered_gamma": true)");
  auto plain = one_layer_llm("swiglu", "rmsnorm");
  ASSERT_TRUE(centred.is_ok()) << centred.status().message();
  ASSERT_TRUE(plain.is_ok());
  EXPECT_TRUE(std::get<LlmSpec>(centred->modules[0].spec).block.zero_centered_gamma);
  EXPECT_FALSE(std::get<LlmSpec>(plain->modules[0].spec).block.zero_centered_gamma);
  EXPECT_EQ(count_params(*centred).total, count_params(*plain).total);
  EXPECT_EQ(op_named(*centred, "attn_norm").read, op_named(*plain, "attn_norm").read);
  auto bad = one_layer_llm("swiglu", "rmsnorm", R"(, "zero_centered_gamma": 1)");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("zero_centered_gamma"), std::string::npos);
}

struct GraphTotals {
  double forward, backward;
  int64_t activations, params;
  size_t ops;
  bool operator==(const GraphTotals&) const = default;
};

GraphTotals totals(const ModelSpec& m, size_t i) {
  OpGraph g = build_op_graph(m.modules[i].spec, module_input(m, i, input(2, 2048)));
  return {forward_flops(g).count(), backward_flops(g).count(),
          activation_bytes(g, Recompute::kNone).count(), count_params(m.modules[i].spec).total,
          g.ops.size()};
}

// An inline spec with the zoo entry's fields behaves exactly like the zoo name; without
// "edges" the encoder -> projector -> llm chain is inferred.
TEST(Json, InlineSpecEqualsZoo) {
  auto inline_model = model_from_json_text(R"({
    "name": "my-llava",
    "modules": [
      {"name": "llm", "kind": "llm", "spec": {"layers": 32, "hidden": 4096, "ffn_hidden": 11008,
       "heads": 32, "vocab": 32000, "activation": "swiglu", "norm": "rmsnorm"}},
      {"name": "vision", "kind": "vision_encoder", "spec": {"layers": 24, "hidden": 1024,
       "ffn_hidden": 4096, "heads": 16, "patch_size": 14, "image_size": 336, "class_token": true,
       "activation": "gelu", "norm": "layernorm", "qkv_bias": true, "linear_bias": true}},
      {"name": "projector", "kind": "projector", "spec": {"input_hidden": 1024,
       "output_hidden": 4096, "ffn_hidden": 4096}}]})",
                                           "inline.json");
  ASSERT_TRUE(inline_model.is_ok()) << inline_model.status().message();
  ModelSpec zoo = zoo_model("llava-1.5-7b");
  ASSERT_EQ(inline_model->edges.size(), 2u);
  for (const Module& mod : zoo.modules) {
    auto i = inline_model->find(mod.name);
    ASSERT_TRUE(i.has_value()) << mod.name;
    EXPECT_EQ(totals(*inline_model, *i), totals(zoo, *zoo.find(mod.name))) << mod.name;
  }
  EXPECT_EQ(count_params(*inline_model).total, count_params(zoo).total);
}

// Malformed models: each error names the exact JSON path of the problem.
TEST(Json, BadInputsNameTheirPath) {
  const std::string llm =
      R"("layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 1000, "activation": "swiglu", "norm": "rmsnorm")";
  auto one = [](const std::string& fields) {
    return R"({"name": "m", "modules": [{"name": "llm", "kind": "llm", "spec": {)" + fields +
           "}}]}";
  };
  auto vlm = [&](const std::string& projector, const std::string& edges) {
    return R"({"name": "m", "modules": [{"name": "vision", "spec": "clip-vit-l-14-336"},
      {"name": "proj", "kind": "projector", "spec": {)" +
           projector + R"(}}, {"name": "llm", "kind": "llm", "spec": {)" + llm + "}}]" + edges +
           "}";
  };
  struct Case {
    std::string json;
    std::string path;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {R"("llama-3.1-8")", "model", "unknown zoo entry \"llama-3.1-8\" (closest: llama-3.1-8b"},
      {R"({"name": "m", "modules": [{"name": "v", "spec": "clip-vit-l-14"}]})",
       "model.modules[0].spec", "closest: clip-vit-l-14-336"},
      {one(R"("layers": 2, "hidden": 1000, "ffn_hidden": 512, "heads": 24, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.heads", "must divide hidden (1000), got 24"},
      {one(llm + R"(, "kv_heads": 3)"), "model.modules[0].spec.kv_heads",
       "must divide heads (4), got 3"},
      {one(llm + R"(, "head_dim": -8)"), "model.modules[0].spec.head_dim", "-8"},
      {one(R"("layers": 0, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.layers", "must be >= 1, got 0"},
      {one(R"("layers": 2, "hidden": 256, "ffn_hidden": -512, "heads": 4, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.ffn_hidden", "must be >= 1, got -512"},
      {one(R"("layers": 2, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.hidden", "missing required field"},
      // Sizes past any published model: an op graph per layer would exhaust memory.
      {one(R"("layers": 1000000000000, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.layers", "must be <= 10000, got 1000000000000"},
      {one(R"("layers": 2, "hidden": 2097152, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.hidden", "must be <= 1048576"},
      {one(R"("layers": 2, "hidden": 256, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 100000, "top_k": 2, "expert_ffn_hidden": 64})"),
       "model.modules[0].spec.moe.experts", "must be <= 65536"},
      // Each size within its bound, the whole past 2^50 parameters (int64 byte counts).
      {one(R"("layers": 10000, "hidden": 1048576, "heads": 1024, "vocab": 1024, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 65536, "top_k": 2, "expert_ffn_hidden": 1048576})"),
       "model.modules[0].spec", "about 2.16e+21 parameters, over the bound of 1.13e+15"},
      {one(llm + R"(, "hiden": 4)"), "model.modules[0].spec.hiden", "unknown field"},
      {one(R"("layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": "4", "vocab": 10, "activation": "gelu", "norm": "rmsnorm")"),
       "model.modules[0].spec.heads", "expected an integer"},
      {one(llm + R"(, "activation": "relu")"), "model.modules[0].spec.activation", "unknown value"},
      {one(R"("layers": 2, "hidden": 256, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 5, "expert_ffn_hidden": 64})"),
       "model.modules[0].spec.moe.top_k", "must be <= experts (4), got 5"},
      // Dense layers first: at least one MoE layer left, and their MLP width given.
      {one(R"("layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 64, "dense_layers": 2})"),
       "model.modules[0].spec.moe.dense_layers",
       "must be in [0, layers - 1] (at least one MoE layer; layers 2), got 2"},
      {one(R"("layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 64, "dense_layers": -1})"),
       "model.modules[0].spec.moe.dense_layers", "got -1"},
      {one(R"("layers": 2, "hidden": 256, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 64, "dense_layers": 1})"),
       "model.modules[0].spec.ffn_hidden", "must be >= 1, got 0"},
      {one(R"("layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "vocab": 10, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 64})"),
       "model.modules[0].spec.ffn_hidden", "unused with moe and no moe.dense_layers"},
      {one(llm +
           R"(, "mla": {"kv_lora_rank": 32, "qk_head_dim": 16, "rope_head_dim": 8, "v_head_dim": 16}, "kv_heads": 2)"),
       "model.modules[0].spec.kv_heads", "with mla every head has its own key and value"},
      {one(llm +
           R"(, "mla": {"kv_lora_rank": 32, "qk_head_dim": 16, "rope_head_dim": 8, "v_head_dim": 16}, "qk_norm": true)"),
       "model.modules[0].spec.qk_norm", "unused with mla"},
      {one(llm +
           R"(, "mla": {"kv_lora_rank": 0, "qk_head_dim": 16, "rope_head_dim": 8, "v_head_dim": 16})"),
       "model.modules[0].spec.mla.kv_lora_rank", "must be >= 1, got 0"},
      {one(llm + R"(, "mla": {"kv_lora_rank": 32, "qk_head_dim": 16, "rope_head_dim": 8})"),
       "model.modules[0].spec.mla.v_head_dim", ""},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "vision_encoder", "spec": {"layers": 1, "hidden": 64, "ffn_hidden": 64, "heads": 2, "patch_size": 14, "image_size": 336, "activation": "gelu", "norm": "layernorm", "mla": {"kv_lora_rank": 32, "qk_head_dim": 16, "rope_head_dim": 8, "v_head_dim": 16}}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.mla", "an llm's only"},
      {one(llm + R"(, "sliding_window": {"size": 0})"),
       "model.modules[0].spec.sliding_window.size", "must be >= 1, got 0"},
      {one(llm + R"(, "sliding_window": {"size": 64, "full_every": 3})"),
       "model.modules[0].spec.sliding_window.full_every", "must be in [0, layers]"},
      {one(llm + R"(, "sliding_window": {"size": 64, "full_every": 1})"),
       "model.modules[0].spec.sliding_window.full_every", "leaves no layer windowed"},
      {one(llm + R"(, "sliding_window": {"size": 64, "every": 2})"),
       "model.modules[0].spec.sliding_window.every", "unknown field"},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "vision_encoder", "spec": {"layers": 1, "hidden": 64, "ffn_hidden": 64, "heads": 2, "patch_size": 14, "image_size": 336, "activation": "gelu", "norm": "layernorm", "sliding_window": {"size": 16}}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.sliding_window", "an llm's only"},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "vision_encoder", "spec": {"layers": 1, "hidden": 64, "ffn_hidden": 64, "heads": 2, "patch_size": 14, "image_size": 336, "activation": "gelu", "norm": "layernorm", "attention_sinks": true}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.attention_sinks", "an llm's only"},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "vision_encoder", "spec": {"layers": 1, "hidden": 64, "ffn_hidden": 64, "heads": 2, "patch_size": 14, "image_size": 336, "activation": "gelu", "norm": "layernorm", "post_norms": true}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.post_norms", "an llm's only"},
      {one(llm + R"(, "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 64, "layer_pattern": [0, 2]})"),
       "model.modules[0].spec.moe.layer_pattern", "entry 1 must be 0 (a dense layer) or 1"},
      {one(llm + R"(, "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 64, "layer_pattern": [0, 0]})"),
       "model.modules[0].spec.moe.layer_pattern", "at least one MoE layer"},
      {one(llm + R"(, "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 64, "layer_pattern": [0, 1, 1]})"),
       "model.modules[0].spec.moe.layer_pattern", "must divide layers (2), got 3"},
      {one(llm + R"(, "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 64, "dense_layers": 1, "layer_pattern": [0, 1]})"),
       "model.modules[0].spec.moe.layer_pattern", "not both"},
      {one(R"("layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "activation": "swiglu", "norm": "rmsnorm", "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 64, "layer_pattern": [0, 1]})"),
       "model.modules[0].spec.ffn_hidden", ""},
      {one(llm + R"(, "mtp_layers": -1)"), "model.modules[0].spec.mtp_layers",
       "must be in [0, 64], got -1"},
      {one(llm + R"(, "mtp_layers": 65)"), "model.modules[0].spec.mtp_layers",
       "must be in [0, 64], got 65"},
      {one(llm + R"(, "position_embedding": "learned")"), "model.modules[0].spec.max_positions",
       "must be >= 1"},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "vision_encoder", "spec": {"layers": 1, "hidden": 64, "ffn_hidden": 64, "heads": 2, "patch_size": 14, "image_size": 330, "activation": "gelu", "norm": "layernorm"}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.image_size", "must be a multiple of patch_size (14), got 330"},
      {R"({"name": "m", "modules": [{"name": "a", "kind": "audio_encoder", "spec": {"layers": 1, "hidden": 256, "ffn_hidden": 64, "heads": 2, "mel_bins": 80, "frames": 3001, "activation": "gelu", "norm": "layernorm"}}, {"name": "llm", "kind": "llm", "spec": {)" +
           llm + "}}]}",
       "model.modules[0].spec.frames", "must be even"},
      {vlm(R"("input_hidden": 1152, "output_hidden": 256)", ""),
       "model.modules[1].spec.input_hidden",
       "1152 does not match the hidden size 1024 of \"vision\""},
      {vlm(R"("input_hidden": 1024, "output_hidden": 512)", ""),
       "model.modules[1].spec.output_hidden", "does not match the llm hidden size 256"},
      {vlm(R"("input_hidden": 1024, "output_hidden": 256, "downsample": 5)", ""),
       "model.modules[1].spec.downsample", "576 tokens per item"},
      {vlm(R"("input_hidden": 1024, "output_hidden": 256)",
           R"(, "edges": [["vision", "proj"], ["proj", "lm"]])"),
       "model.edges[1][1]", "unknown module \"lm\" (modules: vision, proj, llm)"},
      {vlm(R"("input_hidden": 1024, "output_hidden": 256)", R"(, "edges": [["llm", "vision"]])"),
       "model.edges[0]", "llm -> vision_encoder is not allowed"},
      {vlm(R"("input_hidden": 1024, "output_hidden": 256)", R"(, "edges": [["vision"]])"),
       "model.edges[0]", "expected [\"from\", \"to\"]"},
      {vlm(R"("input_hidden": 1024, "output_hidden": 256)", R"(, "edges": [["vision", "proj"]])"),
       "model.modules[1]", "\"proj\" feeds 0 modules"},
      {R"({"name": "m", "modules": [{"name": "a", "spec": "llama-2-7b"}, {"name": "b", "spec": "vicuna-7b"}]})",
       "model.modules[1]", "second llm module"},
      {R"({"name": "m", "modules": [{"name": "v", "spec": "clip-vit-l-14-336"}]})", "model.modules",
       "no llm module"},
      {R"({"name": "m", "modules": [{"name": "v", "kind": "llm", "spec": "clip-vit-l-14-336"}]})",
       "model.modules[0].spec", "is a vision_encoder, not a llm"},
      {R"({"name": "m", "modules": [{"name": "v", "spec": "llava-1.5-7b"}]})",
       "model.modules[0].spec", "is a whole model"},
      {R"({"name": "m", "modules": [{"name": "llm", "spec": "llama-2-7b"}, {"name": "llm", "spec": "clip-vit-l-14-336"}]})",
       "model.modules[1].name", "duplicate module name"},
      {R"({"name": "m", "modules": [{"name": "v", "spec": "clip-vit-l-14-336"}, {"name": "w", "spec": "siglip-so400m-patch14-384"}, {"name": "llm", "spec": "llama-2-7b"}]})",
       "model.edges", "required when a model has more than one encoder"},
      {R"({"name": "m", "modules": [{"name": "llm", "spec": "llama-2-7b"}], "edge": []})",
       "model.edge", "unknown field"},
      {R"({"name": "m"})", "model.modules", "missing required array"},
      {R"({"name": "m", "modules": [{"name": "x", "spec": {"layers": 2}}]})",
       "model.modules[0].kind", "an inline spec needs one of"},
  };
  for (const Case& c : cases) {
    auto m = parse_model(nlohmann::json::parse(c.json), "model");
    ASSERT_FALSE(m.is_ok()) << c.json;
    const std::string& msg = m.status().message();
    EXPECT_EQ(msg.rfind(c.path + ": ", 0), 0u) << "want path " << c.path << ", got: " << msg;
    EXPECT_NE(msg.find(c.problem), std::string::npos)
        << "want \"" << c.problem << "\", got: " << msg;
  }
}

TEST(Json, TextEntryNamesItsSource) {
  auto bad = model_from_json_text(R"({"name": "m", "modules": 3})", "scenario.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "scenario.json: modules: expected an array, got number");
  auto syntax = model_from_json_text("{", "scenario.json");
  ASSERT_FALSE(syntax.is_ok());
  EXPECT_EQ(syntax.status().message().rfind("scenario.json: malformed JSON", 0), 0u);
  auto good = model_from_json_text(R"("llama-3.1-8b")", "scenario.json");
  ASSERT_TRUE(good.is_ok());
  EXPECT_EQ(good->name, "llama-3.1-8b");
}

}  // namespace
}  // namespace hetpar::models
