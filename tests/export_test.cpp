// hetpar_export: target names, the refusals every target shares (infeasible plans, layouts
// a target has no words for), and the vocabulary check: every name each writer emits, for
// plans that use every feature the writer can express, is one the trainer defines
// (export/vocabulary/). Per-target value round trips are in tests/export/.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "export/helpers.h"
#include "hetpar/core/format.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::exporter {
namespace {

using namespace testing;
using planner::Placement;
using planner::Plan;
using planner::Schedule;

TEST(ExportTargets, NamesRoundTrip) {
  ASSERT_EQ(all_targets().size(), 6u);
  for (Target t : all_targets()) EXPECT_EQ(parse_target(to_string(t)), t);
  EXPECT_FALSE(parse_target("megatron-lm"));
  EXPECT_EQ(target_list(),
            "megatron, megatron-mimo, megatron-bridge, torchtitan, deepspeed, nanotron");
}

TEST(ExportTargets, EveryTargetRefusesAnInfeasiblePlan) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p;
  p.layout = layout(3, 1, 8);  // 3 does not divide 32 heads (and 24 != 32 GPUs)
  for (Target t : all_targets())
    EXPECT_EQ(refusal(s, p, t).rfind("plan is infeasible: ", 0), 0u) << to_string(t);
}

// A heterogeneous plan: only the MIMO targets have words for it.
TEST(ExportTargets, SingleLayoutTargetsRefuseHeterogeneousPlans) {
  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  Plan p;
  p.layout = layout(2, 1, 4, 2);
  p.placement = Placement::kColocated;
  p.modules.push_back({encoder_name(s), layout(1, 1, 8, 2), 0});
  ASSERT_EQ(planner::infeasibility(s, p), "");
  for (Target t : {Target::kMegatron, Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("the colocated placement with its own layout for vision"),
              std::string::npos)
        << to_string(t) << ": " << refusal(s, p, t);
}

// On a cluster of two node types every target's header says which nodes the plan put
// where: it places modules by rank, so each node must start with its own group's node rank.
TEST(ExportTargets, MixedClustersSayWhichNodesAreWhich) {
  auto s = planner::load_scenario(std::string(HETPAR_SOURCE_DIR) +
                                  "/tests/data/llava-a100-h100-24gpus.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan p;
  p.layout = layout(4, 1, 4);
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = 8;
  p.modules.push_back({encoder_name(*s), layout(2, 1, 4), 0});
  ASSERT_EQ(planner::infeasibility(*s, p), "");
  const std::string want =
      "Node types as planned: node 0 dgx-a100-80gb (ranks 0-7), nodes 1-2 dgx-h100 (ranks "
      "8-23).";
  const std::string mimo = exported(*s, p, Target::kMegatronMimo).at("launch.sh");
  EXPECT_NE(mimo.find(want), std::string::npos) << mimo;
  Plan homogeneous;
  homogeneous.layout = layout(4, 1, 6);
  const std::string megatron = exported(*s, homogeneous, Target::kMegatron).at("launch.sh");
  EXPECT_NE(megatron.find(want), std::string::npos) << megatron;
}

TEST(ExportTargets, RefusalsNameEveryProblemAtOnce) {
  planner::Scenario s = scenario("gpt3-1.3b", 4, 2048, 512);
  Plan p;
  p.layout = layout(2, 4, 4);
  p.layout.vpp = 2;
  p.layout.recompute = models::Recompute::kSelective;
  p.schedule = Schedule::kInterleaved;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const std::string why = refusal(s, p, Target::kNanotron);
  EXPECT_EQ(why.rfind("nanotron cannot express this plan: ", 0), 0u) << why;
  for (const char* part : {"virtual pipeline stages (vpp 2", "selective recompute",
                           "layernorm, gelu and learned positions", "biases", "dropout"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in " << why;
}

TEST(ExportVocabulary, ListsLoadAndRejectUnknownNames) {
  Vocabulary megatron("megatron-lm");
  EXPECT_GT(megatron.size(), 800u);
  EXPECT_TRUE(megatron.contains("--tensor-model-parallel-size"));
  EXPECT_FALSE(megatron.contains("--encoder-tensor-model-parallel-size"));  // removed 2025
  EXPECT_FALSE(megatron.contains("--virtual-pipeline-model-parallel-size"));
  Vocabulary bridge("megatron-bridge");
  // "[ClassName]" segments are optional, "<module>" is any module name.
  EXPECT_TRUE(bridge.contains(
      "model.megatron_mimo_parallelism_config.module_parallelisms.vision.rank_offset"));
  EXPECT_FALSE(bridge.contains(
      "model.megatron_mimo_parallelism_config.module_parallelisms.vision.first_rank"));
  Vocabulary deepspeed("deepspeed");
  EXPECT_TRUE(deepspeed.contains("zero_optimization.stage"));
  EXPECT_TRUE(deepspeed.contains("zero_optimization.stage3_gather_fp16_weights_on_model_save"));
  EXPECT_FALSE(deepspeed.contains("pipeline.num_stages"));
}

// Every flag / key a writer emits for `plans` is in `vocabulary` (and `extra`, the
// example's own options for megatron-mimo).
void expect_known_names(Target t, const planner::Scenario& s, const std::vector<Plan>& plans) {
  Vocabulary megatron("megatron-lm"), mimo("megatron-mimo-example"), bridge("megatron-bridge"),
      titan("torchtitan"), ds("deepspeed"), nano("nanotron");
  for (const Plan& p : plans) {
    ASSERT_EQ(planner::infeasibility(s, p), "");
    size_t checked = 0;
    for (const auto& [path, text] : exported(s, p, t)) {
      std::vector<std::string> names;
      if (path.ends_with(".sh")) {
        for (const auto& [array, flags] : bash_arrays(text))
          if (array != "CONFIG_ARGS")  // torchtitan's --module / --config choose the config
            for (const auto& f : flags) names.push_back(f.first);
      } else if (path.ends_with(".yaml")) {
        for (const auto& [key, value] : yaml_settings(text)) names.push_back(key);
      } else if (path.ends_with(".json")) {
        names = json_paths(text);
      }
      checked += names.size();
      for (const std::string& n : names) {
        bool known = false;
        switch (t) {
          case Target::kMegatron:
            known = megatron.contains(n);
            break;
          case Target::kMegatronMimo:
            known = megatron.contains(n) || mimo.contains(n);
            break;
          case Target::kMegatronBridge:
            known = bridge.contains(n);
            break;
          case Target::kTorchtitan:
            known = n.starts_with("--") && titan.contains(n.substr(2));
            break;
          case Target::kDeepspeed:
            known = ds.contains(n);
            break;
          case Target::kNanotron:
            known = nano.contains(n);
            break;
        }
        EXPECT_TRUE(known) << to_string(t) << " " << path << ": " << n;
      }
    }
    EXPECT_GT(checked, 5u) << to_string(t);
  }
}

// Plans using every feature of the Megatron targets: interleaving (both spellings), uneven
// splits, CP, EP/MoE, full and selective recompute, every overlap, GQA, fp16 and fp8.
std::vector<Plan> megatron_plans() {
  std::vector<Plan> out;
  Plan a;  // tp 4 (sp) pp 2 dp 4, full recompute, uneven split
  a.layout = layout(4, 2, 4);
  a.layout.sequence_parallel = true;
  a.layout.recompute = models::Recompute::kFull;
  a.layout.distributed_optimizer = true;
  a.layout.first_stage_layers = 15;
  a.layout.last_stage_layers = 17;
  out.push_back(a);
  Plan b;  // interleaved, even
  b.layout = layout(2, 4, 4);
  b.layout.vpp = 2;
  b.layout.recompute = models::Recompute::kSelective;
  b.layout.flash_attention = false;
  b.schedule = Schedule::kInterleaved;
  out.push_back(b);
  Plan c = b;  // interleaved, uneven: virtual stages per rank
  c.layout.first_stage_layers = 6;
  c.layout.last_stage_layers = 10;
  out.push_back(c);
  Plan d;  // cp, embedding and loss in the split
  d.layout = layout(4, 2, 2);
  d.layout.cp = 2;
  d.layout.account_for_embedding = true;
  d.layout.account_for_loss = true;
  out.push_back(d);
  return out;
}

TEST(ExportVocabulary, MegatronEmitsOnlyMegatronLmFlags) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  expect_known_names(Target::kMegatron, s, megatron_plans());
  expect_known_names(Target::kMegatron, scenario("gpt3-1.3b", 4, 2048, 512, 0, "fp16"),
                     {megatron_plans()[3]});
  expect_known_names(Target::kMegatron, scenario("llama-3.1-8b", 4, 8192, 512, 0, "fp8"),
                     {megatron_plans()[0]});
  Plan moe;
  moe.layout = layout(2, 4, 8);
  moe.layout.ep = 8;
  moe.layout.sequence_parallel = true;  // Megatron-Core: EP with TP needs SP
  expect_known_names(Target::kMegatron, scenario("mixtral-8x7b", 8, 4096, 256), {moe});
  Plan vlm;
  vlm.layout = layout(2, 1, 4, 2);
  expect_known_names(Target::kMegatron, scenario("llava-1.5-7b", 1, 4096, 96, 1), {vlm});
}

// LLaVA on 8 GPUs: the encoder (tp 1 dp 2, ranks 0-1) fans out to the LLM (tp 1 dp 6,
// ranks 2-7); each encoder rank takes micro-batch 1 x llm dp 6 / encoder dp 2 = 3 samples.
Plan mimo_fan_out(const planner::Scenario& s) {
  Plan p;
  p.layout = layout(1, 1, 6, 1);
  p.layout.recompute = models::Recompute::kSelective;
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = 2;
  planner::Layout enc = layout(1, 1, 2, 3);
  enc.recompute = models::Recompute::kFull;
  p.modules.push_back({encoder_name(s), enc, 0});
  return p;
}

// LLaVA on 16 GPUs: encoder tp 4 dp 2 on ranks 0-7, LLM tp 4 (sp) dp 2 on ranks 8-15.
Plan mimo_equal_dp(const planner::Scenario& s) {
  Plan p;
  p.layout = layout(4, 1, 2, 2);
  p.layout.sequence_parallel = true;
  p.layout.recompute = models::Recompute::kSelective;
  p.placement = Placement::kNonColocated;
  p.llm_first_rank = 8;
  planner::Layout enc = layout(4, 1, 2, 2);
  enc.recompute = models::Recompute::kFull;
  p.modules.push_back({encoder_name(s), enc, 0});
  return p;
}

// LLaVA on 8 GPUs, colocated: LLM tp 2 pp 2 dp 2 (three-phase), encoder tp 4 dp 2.
Plan mimo_colocated(const planner::Scenario& s) {
  Plan p;
  p.layout = layout(2, 2, 2, 2);
  p.placement = Placement::kColocated;
  p.modules.push_back({encoder_name(s), layout(4, 1, 2, 2), 0});
  return p;
}

TEST(ExportVocabulary, MegatronMimoEmitsMegatronLmAndExampleFlags) {
  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  expect_known_names(Target::kMegatronMimo, s, {mimo_fan_out(s)});
  planner::Scenario s16 = scenario("llava-1.5-7b", 2, 4096, 96, 1);
  expect_known_names(Target::kMegatronMimo, s16, {mimo_equal_dp(s16)});
  Plan moe;
  moe.layout = layout(2, 4, 8);
  moe.layout.ep = 8;
  moe.layout.sequence_parallel = true;  // Megatron-Core: EP with TP needs SP
  expect_known_names(Target::kMegatronMimo, scenario("mixtral-8x7b", 8, 4096, 256), {moe});
  expect_known_names(Target::kMegatronMimo, scenario("llama-3.1-8b", 4, 8192, 512),
                     {megatron_plans()[0]});
}

TEST(ExportVocabulary, MegatronBridgeEmitsOnlyConfigContainerKeys) {
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  expect_known_names(Target::kMegatronBridge, llama, megatron_plans());
  planner::Scenario vlm = scenario("llava-1.5-7b", 1, 4096, 96, 1, "bf16", "dgx-h100", true);
  expect_known_names(Target::kMegatronBridge, vlm, {mimo_colocated(vlm)});
  planner::Scenario vlm16 = scenario("llava-1.5-7b", 2, 4096, 96, 1, "bf16", "dgx-h100", true);
  expect_known_names(Target::kMegatronBridge, vlm16, {mimo_equal_dp(vlm16)});
  Plan moe;
  moe.layout = layout(2, 4, 8);
  moe.layout.ep = 8;
  moe.layout.sequence_parallel = true;  // Megatron-Core: EP with TP needs SP
  expect_known_names(Target::kMegatronBridge, scenario("mixtral-8x7b", 8, 4096, 256, 0, "fp16"),
                     {moe});
}

TEST(ExportVocabulary, TorchtitanDeepspeedNanotronEmitOnlyTheirKeys) {
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan ddp;
  ddp.layout = layout(1, 1, 32);
  expect_known_names(Target::kTorchtitan, llama, {ddp});
  Plan pipe;
  pipe.layout = layout(8, 4, 1);
  pipe.layout.vpp = 2;
  pipe.layout.sequence_parallel = true;
  pipe.layout.recompute = models::Recompute::kFull;
  pipe.schedule = Schedule::kInterleaved;
  Plan gpipe = pipe;
  gpipe.layout.vpp = 1;
  gpipe.schedule = Schedule::kGpipe;
  // Workload files name bf16, fp16 or fp8; torchtitan pipelines without FSDP run in fp32.
  planner::Scenario fp32 = llama;
  fp32.workload.precision = hardware::Precision::kFp32;
  expect_known_names(Target::kTorchtitan, fp32, {pipe, gpipe});

  Plan ds;
  ds.layout = layout(4, 2, 4);
  ds.layout.recompute = models::Recompute::kFull;
  ds.layout.distributed_optimizer = true;
  ds.layout.overlap_grad_reduce = false;
  ds.layout.overlap_param_gather = false;
  expect_known_names(Target::kDeepspeed, llama, {ds});
  expect_known_names(Target::kDeepspeed, scenario("llama-3.1-8b", 4, 8192, 512, 0, "fp16"), {ds});
  Plan ds_moe = ds;
  ds_moe.layout = layout(1, 4, 16);  // EP with TP would need SP, which DeepSpeed lacks
  ds_moe.layout.ep = 8;
  ds_moe.layout.overlap_grad_reduce = false;
  expect_known_names(Target::kDeepspeed, scenario("mixtral-8x7b", 8, 4096, 256), {ds_moe});

  Plan nano = megatron_plans()[0];
  nano.layout.first_stage_layers = nano.layout.last_stage_layers = 0;
  nano.schedule = Schedule::kGpipe;
  Plan nano_cp = megatron_plans()[3];
  nano_cp.layout.account_for_embedding = nano_cp.layout.account_for_loss = false;
  nano_cp.layout.distributed_optimizer = true;
  expect_known_names(Target::kNanotron, llama, {nano, nano_cp});
}

// FSDP plans: each target's spelling, in its vocabulary, or a refusal that says why.
TEST(ExportFsdp, EachTrainerSpellsFullySharding) {
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p;  // Megatron-FSDP, resharded after the forward
  p.layout = layout(2, 1, 16);
  p.layout.sequence_parallel = true;
  p.layout.fsdp = true;
  Plan kept = p;
  kept.layout.fsdp_reshard_after_forward = false;
  Plan fsdp2 = p;
  fsdp2.layout.fsdp_implementation = planner::FsdpImplementation::kTorchFsdp2;
  fsdp2.layout.gradient_accumulation_fusion = false;
  Plan fsdp2_kept = fsdp2;
  fsdp2_kept.layout.fsdp_reshard_after_forward = false;
  for (Target t : {Target::kMegatron, Target::kMegatronBridge, Target::kTorchtitan})
    expect_known_names(t, llama, {p, fsdp2});
  expect_known_names(Target::kMegatron, llama, {fsdp2_kept});
  expect_known_names(Target::kTorchtitan, llama, {kept, fsdp2_kept});

  std::string script = exported(llama, p, Target::kMegatron).at("launch.sh");
  auto f = all_flags(script);
  EXPECT_EQ(f.count("--use-megatron-fsdp"), 1u);
  EXPECT_EQ(f.at("--data-parallel-sharding-strategy"), "optim_grads_params");
  EXPECT_EQ(f.at("--ckpt-format"), "fsdp_dtensor");  // Megatron-FSDP's only format
  EXPECT_EQ(f.count("--use-distributed-optimizer"), 1u);
  // Megatron-FSDP cannot keep parameters gathered; FSDP2 can, and shards the optimizer
  // state itself (Megatron-LM asserts no --use-distributed-optimizer with it).
  EXPECT_NE(refusal(llama, kept, Target::kMegatron).find("torch_fsdp2"), std::string::npos);
  f = all_flags(exported(llama, fsdp2, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.count("--use-torch-fsdp2"), 1u);
  EXPECT_EQ(f.count("--torch-fsdp2-no-reshard-after-forward"), 0u);
  EXPECT_EQ(f.count("--use-distributed-optimizer"), 0u);
  EXPECT_EQ(f.count("--overlap-param-gather"), 0u);
  EXPECT_EQ(f.count("--use-megatron-fsdp"), 0u);
  EXPECT_NE(exported(llama, fsdp2, Target::kMegatron).at("launch.sh").find("reshards it"),
            std::string::npos);  // Megatron-Core's output unit, noted
  f = all_flags(exported(llama, fsdp2_kept, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.count("--torch-fsdp2-no-reshard-after-forward"), 1u);
  Plan fused = fsdp2;
  fused.layout.gradient_accumulation_fusion = true;
  EXPECT_NE(refusal(llama, fused, Target::kMegatron).find("gradient_accumulation_fusion"),
            std::string::npos);
  Plan piped = fsdp2;
  piped.layout = layout(2, 2, 8);
  piped.layout.sequence_parallel = true;
  piped.layout.fsdp = true;
  piped.layout.fsdp_implementation = planner::FsdpImplementation::kTorchFsdp2;
  piped.layout.gradient_accumulation_fusion = false;
  EXPECT_NE(refusal(llama, piped, Target::kMegatron).find("pipeline parallelism"),
            std::string::npos);

  auto y = yaml_settings(exported(llama, p, Target::kMegatronBridge).begin()->second);
  EXPECT_EQ(y.at("ddp.use_megatron_fsdp"), "true");
  EXPECT_EQ(y.at("ddp.data_parallel_sharding_strategy"), "\"optim_grads_params\"");
  EXPECT_EQ(y.at("checkpoint.ckpt_format"), "\"fsdp_dtensor\"");
  EXPECT_NE(refusal(llama, kept, Target::kMegatronBridge).find("optim_grads_params"),
            std::string::npos);
  y = yaml_settings(exported(llama, fsdp2, Target::kMegatronBridge).begin()->second);
  EXPECT_EQ(y.at("dist.use_torch_fsdp2"), "true");
  EXPECT_EQ(y.at("ddp.use_distributed_optimizer"), "false");
  EXPECT_EQ(y.count("ddp.use_megatron_fsdp"), 0u);
  EXPECT_NE(refusal(llama, fsdp2_kept, Target::kMegatronBridge).find("no setting"),
            std::string::npos);

  // torchtitan runs FSDP2: "default" keeps [final norm, output] gathered as a torch_fsdp2
  // plan is timed; a Megatron-FSDP plan reshards everything and says what it does not time.
  script = exported(llama, p, Target::kTorchtitan).at("launch.sh");
  f = all_flags(script);
  EXPECT_EQ(f.at("--parallelism.data_parallel_shard_degree"), "16");
  EXPECT_EQ(f.at("--parallelism.data_parallel_replicate_degree"), "1");
  EXPECT_EQ(f.at("--parallelism.fsdp_reshard_after_forward"), "always");
  EXPECT_NE(script.find("set the plan's fsdp_implementation to torch_fsdp2"), std::string::npos);
  script = exported(llama, fsdp2, Target::kTorchtitan).at("launch.sh");
  EXPECT_EQ(all_flags(script).at("--parallelism.fsdp_reshard_after_forward"), "default");
  EXPECT_EQ(script.find("fsdp_implementation"), std::string::npos);
  f = all_flags(exported(llama, kept, Target::kTorchtitan).at("launch.sh"));
  EXPECT_EQ(f.at("--parallelism.fsdp_reshard_after_forward"), "never");
  Plan root = fsdp2;
  root.layout.fsdp_root_unit = true;
  EXPECT_NE(exported(llama, root, Target::kTorchtitan).at("launch.sh").find("before July 2025"),
            std::string::npos);

  Plan ds;
  ds.layout = layout(1, 1, 32);
  ds.layout.fsdp = true;
  ds.layout.overlap_grad_reduce = ds.layout.overlap_param_gather = false;
  auto j = nlohmann::json::parse(exported(llama, ds, Target::kDeepspeed).at("ds_config.json"));
  EXPECT_EQ(j["zero_optimization"]["stage"], 3);
  EXPECT_EQ(exported(llama, ds, Target::kDeepspeed).at("launch.sh").find("FSDP2"),
            std::string::npos);
  ds.layout.fsdp_implementation = planner::FsdpImplementation::kTorchFsdp2;
  ds.layout.gradient_accumulation_fusion = false;
  EXPECT_NE(exported(llama, ds, Target::kDeepspeed).at("launch.sh").find("ZeRO stage 3 gathers"),
            std::string::npos);
  ds.layout = layout(4, 2, 4);
  ds.layout.fsdp = true;
  ds.layout.overlap_grad_reduce = ds.layout.overlap_param_gather = false;
  EXPECT_NE(refusal(llama, ds, Target::kDeepspeed).find("ZeRO stage 1 at most"), std::string::npos);
  EXPECT_NE(refusal(llama, p, Target::kNanotron).find("fsdp: nanotron"), std::string::npos);
}

// A head width apart from hidden / heads (Qwen3): Megatron's --kv-channels, Megatron-Bridge's
// model.kv_channels; nanotron's Llama cannot say it.
TEST(ExportHeadDim, TheHeadsWidthTravels) {
  planner::Scenario qwen = scenario("qwen3-30b-a3b", 2, 4096, 512);
  Plan p;
  p.layout = layout(1, 2, 8);
  p.layout.ep = 8;
  expect_known_names(Target::kMegatron, qwen, {p});
  expect_known_names(Target::kMegatronBridge, qwen, {p});
  EXPECT_EQ(all_flags(exported(qwen, p, Target::kMegatron).at("launch.sh")).at("--kv-channels"),
            "128");
  EXPECT_EQ(yaml_settings(exported(qwen, p, Target::kMegatronBridge).begin()->second)
                .at("model.kv_channels"),
            "128");
  EXPECT_NE(refusal(qwen, p, Target::kNanotron).find("head_dim 128 with 32 heads"),
            std::string::npos);
  // Where the width is hidden / heads, nothing extra is written.
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan d;
  d.layout = layout(2, 1, 16);
  EXPECT_EQ(all_flags(exported(llama, d, Target::kMegatron).at("launch.sh")).count("--kv-channels"),
            0u);
}

// Qwen3's norm on each head's query and key: Megatron's --qk-layernorm, Megatron-Bridge's
// model.qk_layernorm (false where the model has none); nanotron's Llama cannot say it.
TEST(ExportQkNorm, TheQueryKeyNormTravels) {
  planner::Scenario qwen = scenario("qwen3-30b-a3b", 2, 4096, 512);
  Plan p;
  p.layout = layout(1, 2, 8);
  p.layout.ep = 8;
  EXPECT_EQ(all_flags(exported(qwen, p, Target::kMegatron).at("launch.sh")).count("--qk-layernorm"),
            1u);
  EXPECT_EQ(yaml_settings(exported(qwen, p, Target::kMegatronBridge).begin()->second)
                .at("model.qk_layernorm"),
            "true");
  EXPECT_NE(refusal(qwen, p, Target::kNanotron).find("qk_norm"), std::string::npos);
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan d;
  d.layout = layout(2, 1, 16);
  EXPECT_EQ(
      all_flags(exported(llama, d, Target::kMegatron).at("launch.sh")).count("--qk-layernorm"), 0u);
  EXPECT_EQ(yaml_settings(exported(llama, d, Target::kMegatronBridge).begin()->second)
                .at("model.qk_layernorm"),
            "false");
}

// A plan each LLM-only target with a launch script exports for Llama 3.1 8B on 4 nodes
// (scenario("llama-3.1-8b", 4, 8192, 512)).
std::vector<std::pair<Target, Plan>> llama_launch_plans() {
  Plan ddp;
  ddp.layout = layout(1, 1, 32);
  Plan nano = megatron_plans()[0];
  nano.layout.first_stage_layers = nano.layout.last_stage_layers = 0;
  Plan ds = nano;
  ds.layout.sequence_parallel = false;
  ds.layout.overlap_grad_reduce = ds.layout.overlap_param_gather = false;
  return {{Target::kMegatron, megatron_plans()[1]},
          {Target::kTorchtitan, ddp},
          {Target::kDeepspeed, ds},
          {Target::kNanotron, nano}};
}

TEST(ExportScripts, LaunchScriptsAreValidBash) {
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  planner::Scenario vlm = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  std::vector<std::tuple<Target, const planner::Scenario*, Plan>> cases = {
      {Target::kMegatronMimo, &vlm, mimo_fan_out(vlm)}};
  for (const auto& [t, p] : llama_launch_plans()) cases.emplace_back(t, &llama, p);
  for (const auto& [t, s, p] : cases) {
    const std::string path = ::testing::TempDir() + "/export_launch_" + std::to_string(getpid()) +
                             "_" + std::string(to_string(t)) + ".sh";
    std::ofstream(path) << exported(*s, p, t).at("launch.sh");
    EXPECT_EQ(std::system(("bash -n " + path).c_str()), 0) << to_string(t);
    std::filesystem::remove(path);
  }
}

// Megatron-LM's arguments.py asserts CUDA_DEVICE_MAX_CONNECTIONS: 1 with TP or CP (before
// Blackwell), more than one with FSDP; the launch scripts set it so, and 32 for the EP
// all-to-all overlap. Other trainers' do not.
TEST(ExportScripts, MegatronLaunchSetsTheHardwareQueuesItAsserts) {
  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  const std::string one = "export CUDA_DEVICE_MAX_CONNECTIONS=1";
  const std::string unset = "unset CUDA_DEVICE_MAX_CONNECTIONS";
  Plan tp = megatron_plans()[1];
  ASSERT_GT(tp.layout.tp, 1);
  EXPECT_NE(exported(llama, tp, Target::kMegatron).at("launch.sh").find(one), std::string::npos);
  Plan ddp;
  ddp.layout = layout(1, 1, 32);
  std::string script = exported(llama, ddp, Target::kMegatron).at("launch.sh");
  EXPECT_EQ(script.find("CUDA_DEVICE_MAX_CONNECTIONS"), std::string::npos);
  Plan fsdp = tp;
  fsdp.layout.fsdp = true;
  script = exported(llama, fsdp, Target::kMegatron).at("launch.sh");
  EXPECT_NE(script.find(unset), std::string::npos);
  EXPECT_EQ(script.find(one), std::string::npos);
  ddp.layout.tp = 2;
  ddp.layout.dp = 16;
  ddp.layout.fsdp = true;
  EXPECT_EQ(exported(llama, ddp, Target::kTorchtitan).at("launch.sh").find("CUDA_DEVICE_MAX"),
            std::string::npos);
  // The EP all-to-all overlap wants more queues than TP's one (Megatron-LM's warning; 32 as
  // the Megatron-Core MoE team's scripts set beside TP).
  const planner::Scenario moe = scenario("mixtral-8x7b", 4, 4096, 256);
  Plan ep;
  ep.layout = layout(2, 1, 16);
  ep.layout.sequence_parallel = true;
  ep.layout.ep = 8;
  ep.layout.ep_comm_overlap = true;
  ASSERT_EQ(planner::infeasibility(moe, ep), "");
  script = exported(moe, ep, Target::kMegatron).at("launch.sh");
  EXPECT_NE(script.find("export CUDA_DEVICE_MAX_CONNECTIONS=32"), std::string::npos) << script;
  EXPECT_EQ(script.find(one), std::string::npos);
}

// A cluster with NVLS switched off (the DGX Cloud Benchmarking runs' NCCL_NVLS_ENABLE=0) is
// predicted with ring all-reduces inside a node; every launch script sets the variable so,
// and the YAML target says it. With NVLS on (the default) nothing is written.
TEST(ExportScripts, LaunchScriptsSwitchNvlsOffWhereTheClusterDoes) {
  planner::Scenario on = scenario("llama-3.1-8b", 4, 8192, 512);
  planner::Scenario off = on;
  hardware::ClusterOverrides o;
  o.nvls = false;
  off.cluster = *hardware::ClusterSpec::create(on.cluster.groups(), o);
  for (const auto& [t, p] : llama_launch_plans()) {
    SCOPED_TRACE(to_string(t));
    const std::string script = exported(off, p, t).at("launch.sh");
    EXPECT_NE(script.find("\nexport NCCL_NVLS_ENABLE=0\n"), std::string::npos) << script;
    EXPECT_EQ(exported(on, p, t).at("launch.sh").find("NVLS"), std::string::npos);
  }
  const std::string yaml =
      exported(off, megatron_plans()[1], Target::kMegatronBridge).at("megatron_bridge.yaml");
  EXPECT_NE(yaml.find("# NCCL_NVLS_ENABLE=0 (the cluster's nvls false)"), std::string::npos)
      << yaml;
}

// A plan the memory model puts over its GPUs is still exported (the model's allowances may
// be pessimistic), with a note saying so; plans that fit carry none.
TEST(ExportScripts, SayWhereTheMemoryModelPutsThePlanOverItsGpus) {
  const planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  const std::string note = "Memory: hetpar's memory model puts pipeline stage 0 at ";
  int fitting = 0;
  for (const auto& [t, p] : llama_launch_plans()) {
    SCOPED_TRACE(to_string(t));
    const bool fits = planner::estimate_memory(llama, p).fits();
    fitting += fits ? 1 : 0;
    EXPECT_EQ(exported(llama, p, t).at("launch.sh").find("Memory:") == std::string::npos, fits);
  }
  EXPECT_GT(fitting, 0);
  Plan big;
  big.layout = layout(1, 1, 32);
  big.layout.micro_batch = 16;  // 16 sequences of 8192 tokens at once, unsharded
  const planner::MemoryReport mem = planner::estimate_memory(llama, big);
  ASSERT_FALSE(mem.fits());
  for (Target t : {Target::kMegatron, Target::kTorchtitan}) {
    const std::string script = exported(llama, big, t).at("launch.sh");
    EXPECT_NE(script.find(note + fmt::format("{}", mem.tightest())), std::string::npos) << script;
  }
}

}  // namespace
}  // namespace hetpar::exporter
