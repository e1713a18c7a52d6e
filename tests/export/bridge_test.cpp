// The megatron-bridge target: single-layout plans as model.* / train.* / ddp.* overrides,
// heterogeneous plans as the MegatronMIMOProvider's per-module parallelism, and the
// refusals that mirror MegatronMIMOParallelismConfig.finalize().
#include <gtest/gtest.h>

#include "helpers.h"
#include "hetpar/planner/lower.h"

namespace hetpar::exporter {
namespace {

using namespace testing;
using planner::Layout;
using planner::Placement;
using planner::Plan;
using planner::Schedule;

std::map<std::string, std::string> bridge(const planner::Scenario& s, const Plan& p) {
  return yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
}

// A plan of layout(tp, pp, dp) with sequence parallelism.
Plan sp_plan(int tp, int pp, int dp) {
  Plan p;
  p.layout = layout(tp, pp, dp);
  p.layout.sequence_parallel = true;
  return p;
}

// A MoE model as the cost model times its layers: Megatron-Bridge's GPTModelProvider
// defaults to the allgather dispatcher and per-expert MLPs, so the settings are explicit.
TEST(ExportMegatronBridge, MixtureOfExpertsRunsTheModelledDispatcher) {
  planner::Scenario s = scenario("mixtral-8x7b", 8, 4096, 256);
  const Plan p = mixtral_ep8_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto y = bridge(s, p);
  EXPECT_EQ(y.at("model.num_moe_experts"), "8");
  EXPECT_EQ(y.at("model.moe_token_dispatcher_type"), "\"alltoall\"");
  EXPECT_EQ(y.at("model.moe_grouped_gemm"), "true");
  EXPECT_EQ(y.at("model.moe_permute_fusion"), "true");
  EXPECT_EQ(y.at("model.moe_router_fusion"), "true");
  EXPECT_EQ(y.at("model.moe_router_dtype"), "\"fp32\"");
  EXPECT_EQ(y.count("model.moe_shared_expert_intermediate_size"), 0u);  // Mixtral has none
  EXPECT_EQ(y.count("model.moe_expert_capacity_factor"), 0u);
  Plan drop = p;
  drop.layout.moe_capacity_factor = 1.0;
  const auto yd = bridge(s, drop);
  EXPECT_EQ(yd.at("model.moe_expert_capacity_factor"), "1");
  EXPECT_EQ(yd.at("model.moe_pad_expert_input_to_capacity"), "true");
  Plan deepep = p;  // the flex dispatcher with DeepEP, on whole experts (etp 1)
  deepep.layout.etp = 1;
  deepep.layout.moe_dispatcher = planner::MoeDispatcher::kDeepEp;
  ASSERT_EQ(planner::infeasibility(s, deepep), "");
  const auto ye = bridge(s, deepep);
  EXPECT_EQ(ye.at("model.moe_token_dispatcher_type"), "\"flex\"");
  EXPECT_EQ(ye.at("model.moe_flex_dispatcher_backend"), "\"deepep\"");
  EXPECT_EQ(y.count("model.moe_flex_dispatcher_backend"), 0u);
  Plan hybrid = deepep;  // or with HybridEP
  hybrid.layout.moe_dispatcher = planner::MoeDispatcher::kHybridEp;
  ASSERT_EQ(planner::infeasibility(s, hybrid), "");
  const auto yh = bridge(s, hybrid);
  EXPECT_EQ(yh.at("model.moe_token_dispatcher_type"), "\"flex\"");
  EXPECT_EQ(yh.at("model.moe_flex_dispatcher_backend"), "\"hybridep\"");
}

// Dense layers first (GLM-4.5: 3 of 92): ffn_hidden_size is theirs, moe_layer_freq one
// entry per layer; mtp_num_layers its multi-token-prediction depth.
TEST(ExportMegatronBridge, DenseLayersFirstSetTheLayerPattern) {
  const planner::Scenario s = scenario("glm-4.5", 32, 4096, 1024);
  const Plan p = glm45_ep32_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto y = bridge(s, p);
  EXPECT_EQ(y.at("model.ffn_hidden_size"), "12288");
  EXPECT_EQ(y.at("model.moe_ffn_hidden_size"), "1536");
  std::string freq = "[0, 0, 0";
  for (int i = 0; i < 89; ++i) freq += ", 1";
  EXPECT_EQ(y.at("model.moe_layer_freq"), freq + "]");
  EXPECT_EQ(y.at("model.mtp_num_layers"), "1");
  EXPECT_EQ(bridge(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan())
                .count("model.moe_layer_freq"),
            0u);
}

// A layer pattern (Llama 4 Maverick's): moe_layer_freq lists every layer.
TEST(ExportMegatronBridge, LayerPatternListsEveryLayer) {
  const planner::Scenario s = scenario("llama-4-maverick", 16, 8192, 512);
  const Plan p = maverick_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto y = bridge(s, p);
  std::string freq = "[0, 1";
  for (int i = 1; i < 24; ++i) freq += ", 0, 1";
  EXPECT_EQ(y.at("model.moe_layer_freq"), freq + "]");
  EXPECT_EQ(y.at("model.ffn_hidden_size"), "16384");
  EXPECT_EQ(y.at("model.moe_apply_probs_on_input"), "true");
  EXPECT_EQ(y.at("model.no_rope_freq"), "4");
}

// Sliding windows: TransformerConfig's window_size and window_attn_skip_freq, as the
// gpt-oss providers set them.
TEST(ExportMegatronBridge, SlidingWindowsWriteTheirWindow) {
  const planner::Scenario s = scenario("gpt-oss-120b", 8, 4096, 1280);
  const Plan p = gpt_oss_ep8_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto y = bridge(s, p);
  EXPECT_EQ(y.at("model.window_size"), "[128, 0]");
  EXPECT_EQ(y.at("model.window_attn_skip_freq"), "2");
  EXPECT_EQ(y.at("model.softmax_type"), "\"learnable\"");
  EXPECT_EQ(
      bridge(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan()).count("model.window_size"),
      0u);
}

// Context parallelism over the heads: gpt-oss's only CP (a2a), and the hierarchical one
// with its two levels' sizes, the a2a level first as Megatron-Core reads them.
TEST(ExportMegatronBridge, A2AContextParallelismWritesItsLevels) {
  const planner::Scenario s = scenario("gpt-oss-120b", 8, 4096, 1280);
  Plan p = gpt_oss_ep8_plan();
  p.layout.cp = 2;
  p.layout.dp /= 2;
  p.layout.cp_comm = planner::CpComm::kA2A;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto y = bridge(s, p);
  EXPECT_EQ(y.at("model.cp_comm_type"), "\"a2a\"");
  EXPECT_EQ(y.count("model.hierarchical_context_parallel_sizes"), 0u);
  Plan h = mixtral_ep8_plan();
  h.layout.cp = 4;
  h.layout.dp = 2;
  h.layout.cp_comm = planner::CpComm::kA2AP2P;
  h.layout.cp_a2a = 2;
  const auto z = bridge(scenario("mixtral-8x7b", 8, 4096, 256), h);
  EXPECT_EQ(z.at("model.cp_comm_type"), "\"a2a+p2p\"");
  EXPECT_EQ(z.at("model.hierarchical_context_parallel_sizes"), "[2, 2]");
}

// Megatron-Core's gradient-reduction alignment (default: nothing written; off,
// dist.align_grad_reduce false) and the deferred output-layer wgrad
// (comm_overlap.defer_embedding_wgrad_compute with its limit).
TEST(ExportMegatronBridge, AlignedReductionsAndDeferredWgrad) {
  Plan p = sp_plan(2, 2, 8);
  const planner::Scenario llama = scenario("llama-3.1-8b", 4, 4096, 64);
  EXPECT_EQ(bridge(llama, p).count("dist.align_grad_reduce"), 0u);
  EXPECT_EQ(bridge(llama, p).count("comm_overlap.defer_embedding_wgrad_compute"), 0u);
  p.layout.align_grad_reduce = false;
  p.layout.defer_embedding_wgrad = true;
  p.layout.wgrad_deferral_limit = 22;
  const auto settings = bridge(llama, p);
  EXPECT_EQ(settings.at("dist.align_grad_reduce"), "false");
  EXPECT_EQ(settings.at("comm_overlap.defer_embedding_wgrad_compute"), "true");
  EXPECT_EQ(settings.at("comm_overlap.wgrad_deferral_limit"), "22");
}

// An unfused SwiGLU is model.bias_activation_fusion false; the Nemotron provider's squared
// ReLU is eager PyTorch, so a plan timing it fused is noted.
TEST(ExportMegatronBridge, ActivationFusion) {
  Plan p = sp_plan(2, 1, 8);
  const planner::Scenario llama = scenario("llama-3.1-8b", 2, 4096, 64);
  EXPECT_EQ(bridge(llama, p).count("model.bias_activation_fusion"), 0u);
  const planner::Scenario nemotron = scenario("nemotron-4-15b", 2, 4096, 64);
  auto text = [&](const planner::Scenario& s) {
    return exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml");
  };
  EXPECT_NE(text(nemotron).find("(fused_activation false)"), std::string::npos) << text(nemotron);
  p.layout.fused_activation = false;
  EXPECT_EQ(bridge(llama, p).at("model.bias_activation_fusion"), "false");
  EXPECT_EQ(text(nemotron).find("fused_activation"), std::string::npos) << text(nemotron);
}

TEST(ExportMegatronBridge, SingleLayoutSettingsMatchThePlan) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p;
  p.layout = layout(2, 4, 4, 2);
  p.layout.vpp = 2;
  p.layout.sequence_parallel = true;
  p.layout.recompute = models::Recompute::kFull;
  p.layout.distributed_optimizer = true;
  p.layout.first_stage_layers = 6;
  p.layout.last_stage_layers = 10;
  p.schedule = Schedule::kInterleaved;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  auto y = bridge(s, p);
  EXPECT_EQ(y.at("model.tensor_model_parallel_size"), "2");
  EXPECT_EQ(y.at("model.pipeline_model_parallel_size"), "4");
  EXPECT_EQ(y.at("model.virtual_pipeline_model_parallel_size"), "2");
  EXPECT_EQ(y.at("model.context_parallel_size"), "1");
  EXPECT_EQ(y.at("model.sequence_parallel"), "true");
  EXPECT_EQ(y.at("model.recompute_granularity"), "\"full\"");
  EXPECT_EQ(y.at("model.recompute_method"), "\"uniform\"");
  EXPECT_EQ(y.at("model.recompute_num_layers"), "1");
  EXPECT_EQ(y.at("model.num_layers_in_first_pipeline_stage"), "6");
  EXPECT_EQ(y.at("model.num_layers_in_last_pipeline_stage"), "10");
  EXPECT_EQ(y.at("model.num_query_groups"), "8");
  EXPECT_EQ(y.at("train.micro_batch_size"), "2");
  EXPECT_EQ(y.at("train.global_batch_size"), "512");
  EXPECT_EQ(y.at("dataset.seq_length"), "8192");
  EXPECT_EQ(y.at("ddp.use_distributed_optimizer"), "true");
  EXPECT_EQ(y.at("ddp.overlap_param_gather"), "true");
  EXPECT_EQ(y.at("mixed_precision"), "\"bf16_mixed\"");
  // Selective recompute with modules other than the attention core (a MoE model) names them.
  const planner::Scenario moe = scenario("mixtral-8x7b", 8, 4096, 256);
  Plan sel = mixtral_ep8_plan();
  sel.layout.recompute = models::Recompute::kSelective;
  sel.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMoeAct;
  auto ys = bridge(moe, sel);
  EXPECT_EQ(ys.at("model.recompute_granularity"), "\"selective\"");
  EXPECT_EQ(ys.at("model.recompute_modules"), "[core_attn, moe_act]");
  sel.layout.recompute_modules = models::kRecomputeCoreAttn;
  EXPECT_EQ(bridge(moe, sel).count("model.recompute_modules"), 0u);
  p.layout.vpp = 1;
  p.layout.first_stage_layers = p.layout.last_stage_layers = 0;
  p.layout.distributed_optimizer = false;
  p.schedule = Schedule::k1F1B;
  y = bridge(s, p);
  EXPECT_EQ(y.at("model.virtual_pipeline_model_parallel_size"), "null");
  EXPECT_EQ(y.at("ddp.overlap_param_gather"), "false");  // no parameter all-gather to overlap
  EXPECT_EQ(y.count("model.num_layers_in_first_pipeline_stage"), 0u);
  EXPECT_EQ(y.count("model.pipeline_model_parallel_layout"), 0u);
  // Layers set stage by stage: Megatron-Core's layout string.
  p.layout.pipeline_layout = {5, 9, 9, 9};
  ASSERT_EQ(planner::infeasibility(s, p), "");
  y = bridge(s, p);
  EXPECT_EQ(y.at("model.pipeline_model_parallel_layout"), "\"Et*5|t*9|t*9|t*9L\"");
}

TEST(ExportMegatronBridge, NonColocatedModulesGetTheirRanks) {
  planner::Scenario s = scenario("llava-1.5-7b", 2, 4096, 96, 1, "bf16", "dgx-h100", true);
  Plan p;  // encoder tp 4 dp 2 on ranks 0-7, LLM tp 4 dp 2 on 8-15
  p.layout = layout(4, 1, 2, 2);
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = 8;
  p.modules.push_back({encoder_name(s), layout(4, 1, 2, 2), 0});
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const std::string text = exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml");
  auto y = yaml_settings(text);
  const std::string m = "model.megatron_mimo_parallelism_config.module_parallelisms.";
  EXPECT_EQ(y.at(m + "language.tensor_model_parallel_size"), "4");
  EXPECT_EQ(y.at(m + "language.data_parallel_size"), "2");
  EXPECT_EQ(y.at(m + "language.rank_offset"), "8");
  EXPECT_EQ(y.at(m + "vision.tensor_model_parallel_size"), "4");
  EXPECT_EQ(y.at(m + "vision.data_parallel_size"), "2");
  EXPECT_EQ(y.at(m + "vision.rank_offset"), "0");
  EXPECT_EQ(y.at(m + "vision.expert_model_parallel_size"), "1");
  EXPECT_EQ(y.at("model.freeze_modality_encoders"), "true");
  EXPECT_EQ(y.at("train.micro_batch_size"), "2");
  // Ranges tile the world: [offset, offset + tp x pp x cp x dp).
  EXPECT_NE(text.find("non-colocated: disjoint rank ranges"), std::string::npos);
}

TEST(ExportMegatronBridge, ColocatedModulesShareRankZero) {
  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  Plan p;  // LLM tp 2 pp 2 dp 2 (three phases), encoder tp 4 dp 2 on every rank
  p.layout = layout(2, 2, 2, 2);
  p.placement = Placement::kColocated;
  p.modules.push_back({encoder_name(s), layout(4, 1, 2, 2), 0});
  ASSERT_EQ(planner::infeasibility(s, p), "");
  auto y = bridge(s, p);
  const std::string m = "model.megatron_mimo_parallelism_config.module_parallelisms.";
  EXPECT_EQ(y.at(m + "language.rank_offset"), "0");
  EXPECT_EQ(y.at(m + "vision.rank_offset"), "0");
  EXPECT_EQ(y.at(m + "language.pipeline_model_parallel_size"), "2");
  EXPECT_EQ(y.count("model.freeze_modality_encoders"), 0u);
}

TEST(ExportMegatronBridge, RefusesWhatMegatronMimoRejects) {
  const std::string dir = std::string(HETPAR_SOURCE_DIR) + "/examples/";
  auto llava = planner::load_scenario(dir + "llava-7b-8xh100-compare.json");
  ASSERT_TRUE(llava.is_ok());
  // plans: colocated (fan-in, encoder micro-batch 2 = two LLM micro-batches per step),
  // homogeneous, non_colocated (fan-out: encoder dp 2 < llm dp 6).
  EXPECT_NE(refusal(*llava, llava->plans[0].second, Target::kMegatronBridge)
                .find("micro-batch 2 x llm dp 4 / encoder dp 8 = 1 samples per rank"),
            std::string::npos)
      << refusal(*llava, llava->plans[0].second, Target::kMegatronBridge);
  EXPECT_NE(refusal(*llava, llava->plans[2].second, Target::kMegatronBridge)
                .find("encoder vision dp 2 below llm dp 6"),
            std::string::npos);
  auto longctx = planner::load_scenario(dir + "long-context-16xh100-compare.json");
  ASSERT_TRUE(longctx.is_ok());
  EXPECT_NE(refusal(*longctx, longctx->plans[0].second, Target::kMegatronBridge)
                .find("llm cp 2 in a colocated placement"),
            std::string::npos);

  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  Plan p;
  p.layout = layout(2, 2, 2, 2);
  p.schedule = Schedule::kGpipe;
  EXPECT_NE(refusal(s, p, Target::kMegatronBridge).find("the GPipe schedule"), std::string::npos);
  p.schedule = Schedule::k1F1B;
  p.placement = Placement::kColocated;
  p.modules.push_back({encoder_name(s), layout(4, 1, 2, 2), 0});
  p.modules[0].layout.distributed_optimizer = true;
  EXPECT_NE(refusal(s, p, Target::kMegatronBridge).find("one ddp section for every module"),
            std::string::npos);
  s.workload.frozen_encoders = true;  // a frozen encoder has no optimizer to disagree
  EXPECT_EQ(refusal(s, p, Target::kMegatronBridge), "");
  s.workload.frozen_encoders = false;
  s.workload.precision = hardware::Precision::kFp32;
  EXPECT_NE(refusal(s, p, Target::kMegatronBridge).find("precision fp32"), std::string::npos);
}

// FSDP sets ddp.* around dist.use_megatron_fsdp: each section is one YAML mapping (a
// repeated `ddp:` would replace the first, losing use_distributed_optimizer).
TEST(ExportMegatronBridge, EachSectionIsOneMapping) {
  planner::Scenario s = scenario("llama-3.1-8b", 1, 8192, 128, 0, "fp8");
  Plan p;
  p.layout = layout(1, 1, 8);
  p.layout.fsdp = true;
  p.layout.fp8_param_gather = true;
  const std::string yaml = exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml");
  std::map<std::string, int> top;
  size_t start = 0;
  while (start < yaml.size()) {
    size_t end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    const std::string line = yaml.substr(start, end - start);
    if (!line.empty() && line[0] != ' ' && line[0] != '#') ++top[line.substr(0, line.find(':'))];
    start = end + 1;
  }
  ASSERT_TRUE(top.count("ddp"));
  for (const auto& [key, n] : top) EXPECT_EQ(n, 1) << key;
  const auto y = bridge(s, p);
  EXPECT_EQ(y.at("ddp.use_distributed_optimizer"), "true");
  EXPECT_EQ(y.at("ddp.use_megatron_fsdp"), "true");
  EXPECT_EQ(y.at("dist.use_megatron_fsdp"), "true");
  EXPECT_EQ(y.count("model.gradient_accumulation_fusion"), 0u);  // the recipe's default: on
  p.layout.gradient_accumulation_fusion = false;
  EXPECT_EQ(bridge(s, p).at("model.gradient_accumulation_fusion"), "false");
  EXPECT_EQ(y.count("ddp.nccl_ub"), 0u);
  p.layout.nccl_ub = true;  // NCCL user buffers, as its performance scripts set with FSDP
  EXPECT_EQ(bridge(s, p).at("ddp.nccl_ub"), "true");
}

// FP8 plans name the mixed-precision recipe of their scaling (Megatron-Bridge's
// bf16_with_fp8_{delayed,current}_scaling_mixed), which hold the Linear weights in FP8: a
// plan without fp8_param_gather is refused.
TEST(ExportMegatronBridge, Fp8NamesItsScalingRecipe) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512, 0, "fp8");
  Plan p;
  p.layout = layout(2, 1, 16);
  EXPECT_NE(refusal(s, p, Target::kMegatronBridge).find("fp8 without fp8_param_gather"),
            std::string::npos);
  p.layout.fp8_param_gather = true;
  EXPECT_EQ(bridge(s, p).at("mixed_precision"), "\"bf16_with_fp8_delayed_scaling_mixed\"");
  p.layout.fp8_recipe = planner::Fp8Recipe::kTensorwise;
  EXPECT_EQ(bridge(s, p).at("mixed_precision"), "\"bf16_with_fp8_current_scaling_mixed\"");
  // bf16 gradients: the recipe's grad_reduce_in_fp32 wins over ddp's, and a YAML naming the
  // recipe cannot set it.
  p.layout.grad_reduce_dtype = planner::GradReduceDtype::kBf16;
  EXPECT_NE(refusal(s, p, Target::kMegatronBridge).find("grad_reduce_dtype bf16"),
            std::string::npos);
  p.layout.grad_reduce_dtype = planner::GradReduceDtype::kFp32;  // the recipe's own
  EXPECT_EQ(bridge(s, p).at("mixed_precision"), "\"bf16_with_fp8_current_scaling_mixed\"");
}

}  // namespace
}  // namespace hetpar::exporter
