#include <gtest/gtest.h>

#include "hetpar/models/totals.h"
#include "hetpar/planner/plan_json.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/planner/summary.h"

namespace hetpar::planner {
namespace {

Scenario parse(const std::string& text) {
  auto s = parse_scenario_text(text, "test.json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : Scenario{};
}

const char* kLlava = R"({"model": "llava-1.5-7b",
  "workload": {"seq_len": 4096, "global_batch": 256, "images_per_sample": 2},
  "cluster": {"profile": "dgx-h100", "nodes": 8}})";

TEST(Scenario, ModuleInputsFollowTheWorkload) {
  Scenario s = parse(kLlava);
  ASSERT_EQ(s.model.modules.size(), 3u);
  EXPECT_EQ(s.name, "llava-1.5-7b");
  models::ModuleInput vision = module_input(s, 0, 4);
  EXPECT_EQ(vision.micro_batch, 4);
  EXPECT_EQ(vision.items_per_sample, 2);
  models::ModuleInput projector = module_input(s, 1, 4);
  EXPECT_EQ(projector.seq_len, 576);  // the encoder's patch tokens per image
  EXPECT_EQ(projector.items_per_sample, 2);
  models::ModuleInput llm = module_input(s, 2, 4);
  EXPECT_EQ(llm.seq_len, 4096);
  EXPECT_EQ(modality_tokens_per_item(s.model, 0), 576);
  EXPECT_EQ(s.cluster.total_gpus(), 64);
}

TEST(Scenario, TokensPerImageSetsTheResolution) {
  Scenario s = parse(R"({"model": "llava-1.5-7b",
    "workload": {"seq_len": 4096, "global_batch": 8, "images_per_sample": 1, "tokens_per_image": 256},
    "cluster": {"profile": "dgx-a100-80gb", "nodes": 1}})");
  const auto& vit = std::get<models::VisionEncoderSpec>(s.model.modules[0].spec);
  EXPECT_EQ(vit.image_size, 16 * 14);  // 256 tokens = 16 x 16 patches of 14 px
  EXPECT_EQ(modality_tokens_per_item(s.model, 0), 256);
}

TEST(Scenario, TokensPerImageCountsProjectorDownsampling) {
  Scenario s = parse(R"({"model": {"name": "m", "modules": [
      {"name": "vision", "kind": "vision_encoder", "spec": "internvit-6b"},
      {"name": "projector", "kind": "projector",
       "spec": {"input_hidden": 3200, "output_hidden": 4096, "downsample": 2}},
      {"name": "llm", "kind": "llm", "spec": "llama-2-7b"}]},
    "workload": {"seq_len": 4096, "global_batch": 8, "images_per_sample": 1, "tokens_per_image": 256},
    "cluster": {"profile": "dgx-h100", "nodes": 1}})");
  const auto& vit = std::get<models::VisionEncoderSpec>(s.model.modules[0].spec);
  EXPECT_EQ(vit.image_size, 32 * 14);  // 256 tokens x 2^2 = 1024 = 32 x 32 patches
}

TEST(Scenario, ImageTokensMustFitTheSequence) {
  auto s = parse_scenario_text(R"({"model": "llava-1.5-7b",
    "workload": {"seq_len": 1024, "global_batch": 8, "images_per_sample": 2},
    "cluster": {"profile": "dgx-h100", "nodes": 1}})",
                               "x.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().message(),
            "x.json: workload.seq_len: 1152 modality tokens per sample do not fit in a fused "
            "sequence of 1024");
}

// plan_to_json writes what parse_plan reads back, the layout's switches included.
TEST(PlanJson, RoundTripsEveryLayoutSwitch) {
  Plan p;
  p.layout.tp = 4;
  p.layout.sequence_parallel = true;
  p.layout.dp = 16;
  p.layout.fsdp = true;
  p.layout.fsdp_reshard_after_forward = false;
  p.layout.fsdp_implementation = FsdpImplementation::kTorchFsdp2;
  p.layout.fsdp_root_unit = true;
  p.layout.tp_backward_overlap = false;
  p.layout.flash_attention = false;
  p.layout.moe_capacity_factor = 1.25;
  p.layout.moe_load_imbalance = 1.6;
  p.layout.gradient_accumulation_fusion = false;
  p.layout.fused_projections = false;
  p.layout.repeat_kv = true;
  p.layout.fused_activation = false;
  p.layout.fused_rope = false;
  p.layout.align_grad_reduce = false;
  p.layout.defer_embedding_wgrad = true;
  p.layout.wgrad_deferral_limit = 22;
  p.layout.pipeline_layout = {3, 0, 5};
  p.layout.microbatch_group = 6;
  p.layout.moe_dispatcher = MoeDispatcher::kDeepEp;
  auto back = parse_plan(plan_to_json(p), "plan");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, p);
  p.layout.fsdp = false;
  p.layout.fsdp_reshard_after_forward = true;
  p.layout.fsdp_implementation = FsdpImplementation::kMegatron;
  p.layout.fsdp_root_unit = false;
  p.layout.tp_backward_overlap = true;
  p.layout.moe_dispatcher = MoeDispatcher::kHybridEp;
  back = parse_plan(plan_to_json(p), "plan");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, p);
  auto bad = parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "fsdp": "yes"})"), "plan");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("plan.fsdp"), std::string::npos)
      << bad.status().to_string();
  bad =
      parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "moe_capacity_factor": -1})"), "plan");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("plan.moe_capacity_factor"), std::string::npos)
      << bad.status().to_string();
  bad =
      parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "moe_load_imbalance": 0.5})"), "plan");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("plan.moe_load_imbalance"), std::string::npos)
      << bad.status().to_string();
  bad = parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "moe_dispatcher": "deep-ep"})"),
                   "plan");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("plan.moe_dispatcher"), std::string::npos)
      << bad.status().to_string();
  // recompute_modules: Megatron-Core's --recompute-modules, under selective recompute only.
  auto modules = parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "recompute": "selective",
                                                      "recompute_modules": ["moe_act", "layernorm"]})"),
                            "plan");
  ASSERT_TRUE(modules.is_ok()) << modules.status().to_string();
  EXPECT_EQ(modules->layout.recompute_modules,
            models::kRecomputeLayernorm | models::kRecomputeMoeAct);
  EXPECT_EQ(plan_to_json(*modules)["recompute_modules"],
            nlohmann::json::parse(R"(["layernorm", "moe_act"])"));
  back = parse_plan(plan_to_json(*modules), "plan");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->layout.recompute_modules, modules->layout.recompute_modules);
  EXPECT_FALSE(plan_to_json(p).contains("recompute_modules"));
  // Names in any order; written back in the canonical order.
  for (const auto& [names, bits, written] :
       {std::tuple{R"(["moe", "layernorm"])", models::kRecomputeLayernorm | models::kRecomputeMoe,
                   R"(["layernorm", "moe"])"},
        std::tuple{R"(["mlp", "core_attn"])", models::kRecomputeCoreAttn | models::kRecomputeMlp,
                   R"(["core_attn", "mlp"])"}}) {
    auto named = parse_plan(
        nlohmann::json::parse(fmt::format(
            R"({{"micro_batch": 1, "recompute": "selective", "recompute_modules": {}}})", names)),
        "plan");
    ASSERT_TRUE(named.is_ok()) << named.status().to_string();
    EXPECT_EQ(named->layout.recompute_modules, bits) << names;
    EXPECT_EQ(plan_to_json(*named)["recompute_modules"], nlohmann::json::parse(written));
  }
  bad = parse_plan(nlohmann::json::parse(R"({"micro_batch": 1, "recompute": "selective",
                                             "recompute_modules": ["mhc"]})"),
                   "plan");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("is not one of core_attn, layernorm, moe_act, moe, mlp, "
                                          "shared_experts, mla_up_proj"),
            std::string::npos)
      << bad.status().to_string();
  for (const char* text :
       {R"({"micro_batch": 1, "recompute": "full", "recompute_modules": ["layernorm"]})",
        R"({"micro_batch": 1, "recompute": "selective", "recompute_modules": ["mhc"]})",
        R"({"micro_batch": 1, "recompute": "selective", "recompute_modules": []})",
        R"({"micro_batch": 1, "recompute": "selective", "recompute_modules": "moe_act"})"}) {
    bad = parse_plan(nlohmann::json::parse(text), "plan");
    ASSERT_FALSE(bad.is_ok()) << text;
    EXPECT_NE(bad.status().to_string().find("plan.recompute_modules"), std::string::npos)
        << bad.status().to_string();
  }
  for (const char* layout : {R"([4, -1])", R"([4, 2.5])", R"([4, "2"])", R"(4)"}) {
    bad = parse_plan(nlohmann::json::parse(fmt::format(
                         R"({{"micro_batch": 1, "pp": 2, "pipeline_layout": {}}})", layout)),
                     "plan");
    ASSERT_FALSE(bad.is_ok()) << layout;
    EXPECT_NE(bad.status().to_string().find("plan.pipeline_layout"), std::string::npos)
        << bad.status().to_string();
  }
}

TEST(Summary, AddsUpModulesAndClusterPeak) {
  Scenario s = parse(kLlava);
  ScenarioSummary sum = summarize(s);
  ASSERT_EQ(sum.modules.size(), 3u);
  Flops per_sample;
  for (const auto& m : sum.modules) per_sample += m.forward_per_sample + m.backward_per_sample;
  EXPECT_DOUBLE_EQ(sum.model_flops_per_sample.count(), per_sample.count());
  EXPECT_DOUBLE_EQ(sum.model_flops_per_iteration.count(), 256 * per_sample.count());
  // Backward is twice forward for the model-FLOP convention.
  for (const auto& m : sum.modules)
    EXPECT_NEAR(m.backward_per_sample / m.forward_per_sample, 2.0, 1e-12) << m.name;
  // Vision: two images of 577 tokens; LLM: one 4096-token sequence.
  EXPECT_EQ(sum.modules[0].tokens_per_sample, 2 * 577);
  EXPECT_EQ(sum.modules[2].tokens_per_sample, 4096);
  // LLM forward FLOPs per sample ~ 2 * N * s (+ attention), Vicuna-7B at 4096 tokens.
  double two_n_s = 2.0 * models::count_params(s.model.modules[2].spec).non_embedding() * 4096;
  EXPECT_GT(sum.modules[2].forward_per_sample.count(), two_n_s);
  EXPECT_LT(sum.modules[2].forward_per_sample.count(), 1.15 * two_n_s);
  EXPECT_DOUBLE_EQ(sum.cluster_peak.to_tflops(), 64 * 989.4);
  // The cluster's 64 H100s run their GEMMs at the slowest one's rate (gpu.clock_spread).
  ASSERT_EQ(sum.groups.size(), 1u);
  EXPECT_EQ(sum.groups[0].gpus_of_model, 64);
  EXPECT_EQ(sum.groups[0].slowest_gpu_rate,
            hardware::slowest_rate_share(sum.groups[0].clock_spread, 64));
  EXPECT_LT(sum.groups[0].slowest_gpu_rate, 1.0);
  EXPECT_EQ(sum.ideal_iteration_time, sum.model_flops_per_iteration / sum.cluster_peak);
}

}  // namespace
}  // namespace hetpar::planner
