// The torchtitan, deepspeed and nanotron targets: values round trip through what they
// emit, and each refuses what its trainer does differently from the plan.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "hetpar/planner/lower.h"

namespace hetpar::exporter {
namespace {

using namespace testing;
using planner::Layout;
using planner::Plan;
using planner::Schedule;

planner::Scenario llama() {
  return scenario("llama-3.1-8b", 4, 8192, 512);
}

TEST(ExportTorchtitan, PureDataParallelismInTokens) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(1, 1, 32, 2);
  const auto f = all_flags(exported(s, p, Target::kTorchtitan).at("launch.sh"));
  EXPECT_EQ(f.at("--parallelism.data_parallel_replicate_degree"), "32");
  EXPECT_EQ(f.at("--parallelism.data_parallel_shard_degree"), "1");
  EXPECT_EQ(f.at("--parallelism.tensor_parallel_degree"), "1");
  EXPECT_EQ(f.at("--parallelism.pipeline_parallel_degree"), "1");
  EXPECT_EQ(f.at("--training.num_tokens_per_microbatch_per_dp_rank"), "16384");  // 2 x 8192
  EXPECT_EQ(f.at("--training.num_tokens_per_train_step"), std::to_string(512 * 8192));
  EXPECT_EQ(f.at("--training.mixed_precision_param"), "bfloat16");
  EXPECT_EQ(f.at("--training.mixed_precision_reduce"), "float32");
  const Plan half = with_grads(p, planner::GradReduceDtype::kBf16);
  EXPECT_EQ(all_flags(exported(s, half, Target::kTorchtitan).at("launch.sh"))
                .at("--training.mixed_precision_reduce"),
            "bfloat16");
  // Tokens per step / (tokens per micro-batch x dp) = the plan's micro-batches.
  EXPECT_EQ(512 * 8192 / (16384 * 32), planner::num_micro_batches(p.layout, 512));
}

TEST(ExportTorchtitan, Fp32PipelinesAndTheirSchedules) {
  planner::Scenario s = llama();
  s.workload.precision = hardware::Precision::kFp32;
  Plan p;
  p.layout = layout(8, 4, 1);
  p.layout.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  auto f = all_flags(exported(s, p, Target::kTorchtitan).at("launch.sh"));
  EXPECT_EQ(f.at("--parallelism.pipeline_parallel_schedule"), "Interleaved1F1B");
  EXPECT_EQ(f.at("--parallelism.pipeline_parallel_layers_per_stage"), "4");  // 32 / (4 x 2)
  EXPECT_EQ(f.at("--parallelism.num_pp_microbatches"), "512");
  EXPECT_EQ(f.at("--training.disable_cuda_graphs"), "True");
  EXPECT_EQ(f.at("--training.mixed_precision_param"), "float32");
  p.layout.vpp = 1;
  p.schedule = Schedule::kGpipe;
  f = all_flags(exported(s, p, Target::kTorchtitan).at("launch.sh"));
  EXPECT_EQ(f.at("--parallelism.pipeline_parallel_schedule"), "GPipe");
  EXPECT_EQ(f.count("--parallelism.pipeline_parallel_layers_per_stage"), 0u);
  // Layers per virtual stage (Megatron's order, torchtitan's loop placement): the lists of
  // module_fqns_per_model_part in the config function, no layers_per_stage beside them.
  p.layout.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  p.layout.pipeline_layout = {3, 4, 4, 4, 4, 4, 4, 5};
  const std::string script = exported(s, p, Target::kTorchtitan).at("launch.sh");
  EXPECT_NE(script.find("cfg.parallelism.module_fqns_per_model_part = [[\"tok_embeddings\"] + "
                        "[f\"layers.{i}\" for i in range(0, 3)], [f\"layers.{i}\" for i in "
                        "range(3, 7)], "),
            std::string::npos)
      << script;
  EXPECT_NE(script.find("[f\"layers.{i}\" for i in range(27, 32)] + [\"norm\", \"output\"]]"),
            std::string::npos)
      << script;
  f = all_flags(script);
  EXPECT_EQ(f.at("--parallelism.pipeline_parallel_schedule"), "Interleaved1F1B");
  EXPECT_EQ(f.count("--parallelism.pipeline_parallel_layers_per_stage"), 0u);
  // A middle stage with no module would be an empty torchtitan stage.
  p.layout.pipeline_layout = {4, 4, 0, 8, 4, 4, 4, 4};
  EXPECT_NE(refusal(s, p, Target::kTorchtitan).find("virtual stage 2 of the split 4|4|0|8"),
            std::string::npos);
  // Megatron's uneven splits take the same lists: first stage 5 layers, last 3, the
  // middle two 12 each.
  p.layout.pipeline_layout.clear();
  p.layout.vpp = 1;
  p.schedule = Schedule::k1F1B;
  p.layout.first_stage_layers = 5;
  p.layout.last_stage_layers = 3;
  const std::string uneven = exported(s, p, Target::kTorchtitan).at("launch.sh");
  EXPECT_NE(uneven.find("(5|12|12|3; torchtitan places stage i on rank i % pp): "
                        "cfg.parallelism.module_fqns_per_model_part = [[\"tok_embeddings\"] + "
                        "[f\"layers.{i}\" for i in range(0, 5)], [f\"layers.{i}\" for i in "
                        "range(5, 17)], "),
            std::string::npos)
      << uneven;
  EXPECT_NE(uneven.find("[f\"layers.{i}\" for i in range(29, 32)] + [\"norm\", \"output\"]]"),
            std::string::npos);
  // An even split keeps torchtitan's own: no lists.
  p.layout.first_stage_layers = p.layout.last_stage_layers = 0;
  EXPECT_EQ(exported(s, p, Target::kTorchtitan).at("launch.sh").find("module_fqns_per_model_part"),
            std::string::npos);
}

TEST(ExportTorchtitan, RefusesFsdpStyleAndMegatronOnlyFeatures) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(1, 1, 32);
  p.layout.distributed_optimizer = true;
  EXPECT_NE(refusal(s, p, Target::kTorchtitan).find("(ZeRO-3)"), std::string::npos);
  p.layout = layout(4, 1, 8);
  const std::string why = refusal(s, p, Target::kTorchtitan);
  EXPECT_NE(why.find("runs only as the sole parallelism"), std::string::npos) << why;
  EXPECT_NE(why.find("bf16 mixed precision with tp 4"), std::string::npos) << why;
  p.layout = layout(4, 1, 4);
  p.layout.cp = 2;
  p.layout.recompute = models::Recompute::kSelective;
  p.layout.first_stage_layers = 0;
  const std::string why2 = refusal(s, p, Target::kTorchtitan);
  EXPECT_NE(why2.find("context parallelism (cp 2)"), std::string::npos);
  EXPECT_NE(why2.find("selective recompute"), std::string::npos);
  s.workload.precision = hardware::Precision::kFp32;
  p.layout = layout(8, 4, 1);
  p.schedule = Schedule::kZeroBubble;
  EXPECT_NE(refusal(s, p, Target::kTorchtitan).find("ZB-H1"), std::string::npos);
}

TEST(ExportDeepspeed, ConfigHoldsTheBatchIdentityAndZeroStage) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(4, 2, 4, 2);
  p.layout.recompute = models::Recompute::kFull;
  p.layout.distributed_optimizer = true;
  p.layout.overlap_grad_reduce = false;
  p.layout.overlap_param_gather = false;
  auto files = exported(s, p, Target::kDeepspeed);
  auto j = nlohmann::json::parse(files.at("ds_config.json"));
  EXPECT_EQ(j["train_batch_size"], 512);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 2);
  EXPECT_EQ(j["gradient_accumulation_steps"], 64);
  // DeepSpeed asserts train_batch_size = micro-batch x accumulation x DP.
  EXPECT_EQ(2 * 64 * p.layout.dp, 512);
  EXPECT_EQ(j["zero_optimization"]["stage"], 1);
  EXPECT_EQ(j["tensor_parallel"]["autotp_size"], 4);
  EXPECT_EQ(j["pipeline"]["activation_checkpoint_interval"], 1);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["communication_data_type"], "fp32");  // bf16 training's default: fp32 gradients
  EXPECT_EQ(j["data_types"]["grad_accum_dtype"], "fp32");
  const Plan half = with_grads(p, planner::GradReduceDtype::kBf16);
  auto h = nlohmann::json::parse(exported(s, half, Target::kDeepspeed).at("ds_config.json"));
  EXPECT_EQ(h["communication_data_type"], "bf16");
  EXPECT_EQ(h["data_types"]["grad_accum_dtype"], "bf16");
  EXPECT_NE(files.at("launch.sh").find("num_stages=2"), std::string::npos);
  EXPECT_NE(files.at("launch.sh").find("deepspeed --num_nodes 4 --num_gpus 8"), std::string::npos);
  // Timed with Megatron's fused accumulation (the plan's default), which DeepSpeed lacks: said.
  EXPECT_NE(files.at("launch.sh").find("DeepSpeed writes them in the parameter dtype"),
            std::string::npos);
  Plan unfused = p;
  unfused.layout.gradient_accumulation_fusion = false;
  EXPECT_EQ(exported(s, unfused, Target::kDeepspeed).at("launch.sh").find("fp32 main_grad"),
            std::string::npos);
}

TEST(ExportDeepspeed, RefusesInterleavingSequenceParallelismAndOverlap) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(2, 4, 4);
  p.layout.vpp = 2;
  p.layout.sequence_parallel = true;
  p.schedule = Schedule::kInterleaved;
  const std::string why = refusal(s, p, Target::kDeepspeed);
  EXPECT_NE(why.find("DeepSpeed has no interleaving"), std::string::npos) << why;
  EXPECT_NE(why.find("Megatron-style sequence parallelism"), std::string::npos) << why;
  EXPECT_NE(why.find("set overlap_grad_reduce false"), std::string::npos) << why;
  p.layout = layout(4, 2, 2);
  p.layout.cp = 2;
  p.schedule = Schedule::k1F1B;
  p.layout.overlap_grad_reduce = false;
  EXPECT_NE(refusal(s, p, Target::kDeepspeed).find("(Ulysses) splits attention heads"),
            std::string::npos);
}

// Context parallelism by all-to-alls over the heads (cp_comm a2a) is DeepSpeed's Ulysses:
// its sequence-parallel size in the config, the attention wrapper named in the script.
// torchtitan and nanotron have none and refuse it.
TEST(ExportDeepspeed, WritesA2AContextParallelismAsUlysses) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(4, 2, 2);
  p.layout.cp = 2;
  p.layout.cp_comm = planner::CpComm::kA2A;
  p.layout.overlap_grad_reduce = false;
  auto files = exported(s, p, Target::kDeepspeed);
  const auto j = nlohmann::json::parse(files.at("ds_config.json"));
  EXPECT_EQ(j.at("sequence_parallel_size"), 2);
  EXPECT_EQ(j.at("seq_parallel_communication_data_type"), j.at("communication_data_type"));
  EXPECT_NE(files.at("launch.sh").find("DistributedAttention"), std::string::npos);
  EXPECT_NE(files.at("launch.sh").find("that Ulysses composes with AutoTP"), std::string::npos);
  EXPECT_NE(files.at("launch.sh").find("x sequence_parallel_size) is implied"), std::string::npos);
  p.layout.fsdp = true;
  p.layout.pp = 1;
  p.layout.dp = 4;
  EXPECT_NE(refusal(s, p, Target::kTorchtitan).find("cp_comm a2a (cp 2): torchtitan has no"),
            std::string::npos);
  EXPECT_NE(refusal(s, p, Target::kNanotron).find("cp_comm a2a (cp 2)"), std::string::npos);
}

TEST(ExportNanotron, SectionsMatchThePlan) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(4, 2, 4, 2);
  p.layout.sequence_parallel = true;
  p.layout.recompute = models::Recompute::kFull;
  p.layout.distributed_optimizer = true;
  p.schedule = Schedule::kGpipe;
  // Its DDP reduces buckets as they become ready on every stage: a plan timed with
  // Megatron's aligned reductions (the default) says so; one without them does not.
  EXPECT_NE(exported(s, p, Target::kNanotron).at("launch.sh").find("align_grad_reduce to false"),
            std::string::npos);
  p.layout.align_grad_reduce = false;
  auto files = exported(s, p, Target::kNanotron);
  EXPECT_EQ(files.at("launch.sh").find("align_grad_reduce"), std::string::npos);
  auto y = yaml_settings(files.at("nanotron.yaml"));
  EXPECT_EQ(y.at("parallelism.dp"), "4");
  EXPECT_EQ(y.at("parallelism.tp"), "4");
  EXPECT_EQ(y.at("parallelism.pp"), "2");
  EXPECT_EQ(y.at("parallelism.pp_engine"), "\"afab\"");
  EXPECT_EQ(y.at("parallelism.tp_mode"), "\"REDUCE_SCATTER\"");
  EXPECT_EQ(y.at("parallelism.recompute_layer"), "true");
  EXPECT_EQ(y.at("optimizer.zero_stage"), "1");
  EXPECT_EQ(y.at("tokens.micro_batch_size"), "2");
  EXPECT_EQ(y.at("tokens.batch_accumulation_per_replica"), "64");  // 2 x 64 x 4 = 512
  EXPECT_EQ(y.at("model.model_config.num_key_value_heads"), "8");
  EXPECT_EQ(y.at("model.dtype"), "\"bfloat16\"");
  EXPECT_EQ(y.at("optimizer.accumulate_grad_in_fp32"), "true");
  const Plan half = with_grads(p, planner::GradReduceDtype::kBf16);
  EXPECT_EQ(yaml_settings(exported(s, half, Target::kNanotron).at("nanotron.yaml"))
                .at("optimizer.accumulate_grad_in_fp32"),
            "false");
  EXPECT_NE(files.at("launch.sh").find("run_train.py --config-file"), std::string::npos);
  EXPECT_NE(files.at("launch.sh").find("nanotron writes them in the parameter dtype"),
            std::string::npos);
}

TEST(ExportNanotron, RefusesMultimodalAndMoeModels) {
  Plan p;
  p.layout = layout(2, 1, 4, 2);
  EXPECT_NE(refusal(scenario("llava-1.5-7b", 1, 4096, 96, 1), p, Target::kNanotron)
                .find("nanotron has no multimodal models"),
            std::string::npos);
  EXPECT_NE(refusal(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan(), Target::kNanotron)
                .find("a mixture-of-experts LLM"),
            std::string::npos);
}

// torchtitan's FP8 (the float8 converter, tensorwise) with its per-op checkpointing over
// FSDP, as its H200 benchmark ran; delayed scaling is refused, and every other target
// refuses selective_op.
TEST(ExportTorchtitan, Fp8TensorwiseWithPerOpCheckpointing) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512, 0, "fp8");
  Plan p;
  p.layout = layout(1, 1, 32, 2);
  p.layout.fsdp = true;
  p.layout.fp8_recipe = planner::Fp8Recipe::kTensorwise;
  p.layout.fp8_param_gather = true;
  p.layout.recompute = models::Recompute::kSelectiveOp;
  const std::string script = exported(s, p, Target::kTorchtitan).at("launch.sh");
  EXPECT_EQ(all_flags(script).at("--training.mixed_precision_param"), "bfloat16");
  EXPECT_NE(script.find("selective_ac_option \"op\""), std::string::npos) << script;
  EXPECT_NE(script.find("enable_fsdp_float8_all_gather"), std::string::npos) << script;
  // Timed with Megatron's fused fp32 accumulation (the default): said; off, as FSDP2 runs.
  EXPECT_NE(script.find("adding into an fp32 main_grad"), std::string::npos) << script;
  p.layout.gradient_accumulation_fusion = false;
  EXPECT_EQ(exported(s, p, Target::kTorchtitan).at("launch.sh").find("fp32 main_grad"),
            std::string::npos);
  p.layout.fp8_recipe = planner::Fp8Recipe::kDelayed;
  EXPECT_NE(refusal(s, p, Target::kTorchtitan).find("fp8 with delayed scaling"), std::string::npos);
  p.layout.fp8_recipe = planner::Fp8Recipe::kTensorwise;
  for (Target t :
       {Target::kMegatron, Target::kMegatronBridge, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("recompute selective_op"), std::string::npos)
        << static_cast<int>(t);
}

// The layer's code: torchtitan runs separate projections and repeat_kv, Megatron-LM,
// Megatron-Bridge and nanotron fused projections with grouped K, V. An export whose plan
// times the other code says so, naming the fields; one that matches says nothing.
TEST(ExportOthers, SayWhereThePlansLayerCodeDiffersFromTheTrainers) {
  planner::Scenario s = scenario("llama-3.1-8b", 1, 8192, 64);
  Plan megatron_code;
  megatron_code.layout = layout(1, 1, 8);
  Plan torchtitan_code = megatron_code;
  torchtitan_code.layout.fused_projections = false;
  torchtitan_code.layout.repeat_kv = true;
  const std::string note = "timed otherwise than";
  const auto says = [&](const Plan& p, Target t, const std::string& file) {
    return exported(s, p, t).at(file).find(note) != std::string::npos;
  };
  const std::string titan = exported(s, megatron_code, Target::kTorchtitan).at("launch.sh");
  EXPECT_NE(titan.find("runs a GEMM per projection (fused_projections false)"), std::string::npos)
      << titan;
  EXPECT_NE(titan.find("(repeat_kv true)"), std::string::npos) << titan;
  EXPECT_FALSE(says(torchtitan_code, Target::kTorchtitan, "launch.sh"));
  EXPECT_TRUE(says(torchtitan_code, Target::kMegatron, "launch.sh"));
  EXPECT_FALSE(says(megatron_code, Target::kMegatron, "launch.sh"));
  EXPECT_TRUE(says(torchtitan_code, Target::kMegatronBridge, "megatron_bridge.yaml"));
  EXPECT_FALSE(says(megatron_code, Target::kMegatronBridge, "megatron_bridge.yaml"));
  EXPECT_TRUE(says(torchtitan_code, Target::kNanotron, "launch.sh"));
  EXPECT_FALSE(says(megatron_code, Target::kNanotron, "launch.sh"));
  Plan one = megatron_code;
  one.layout.repeat_kv = true;  // one field differs: only it is named
  const std::string m = exported(s, one, Target::kMegatron).at("launch.sh");
  EXPECT_NE(m.find("reads K and V grouped in the attention kernel (repeat_kv false)"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("fused_projections"), std::string::npos) << m;
}

// Token dropping padded to capacity is Megatron's: the other trainers refuse it.
TEST(ExportOthers, RefuseTokenDropping) {
  Plan p;
  p.layout = layout(1, 1, 8);
  p.layout.moe_capacity_factor = 1.0;
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(scenario("mixtral-8x7b", 1, 4096, 64), p, t).find("moe_capacity_factor 1"),
              std::string::npos)
        << static_cast<int>(t);
}

// DeepEP and HybridEP are Megatron-Core's flex dispatcher: the other trainers refuse them.
TEST(ExportOthers, RefuseTheFlexDispatcher) {
  Plan p;
  p.layout = layout(1, 1, 8);
  p.layout.ep = 8;
  const planner::Scenario s = scenario("mixtral-8x7b", 1, 4096, 64);
  for (planner::MoeDispatcher d :
       {planner::MoeDispatcher::kDeepEp, planner::MoeDispatcher::kHybridEp}) {
    p.layout.moe_dispatcher = d;
    ASSERT_EQ(planner::infeasibility(s, p), "");
    const std::string name = fmt::format("moe_dispatcher {}: ", planner::to_string(d));
    for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
      EXPECT_NE(refusal(s, p, t).find(name), std::string::npos) << static_cast<int>(t);
  }
}

// Multi-token prediction is Megatron-Core's: the other trainers refuse it.
TEST(ExportOthers, RefuseMultiTokenPrediction) {
  const Plan p = glm45_ep32_plan();
  const planner::Scenario s = scenario("glm-4.5", 32, 4096, 1024);
  ASSERT_EQ(planner::infeasibility(s, p), "");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("mtp_layers 1: "), std::string::npos) << static_cast<int>(t);
}

// Selective recompute is Megatron's: the other trainers refuse it, naming what it re-runs
// (the attention core, or the plan's recompute_modules).
TEST(ExportOthers, RefuseSelectiveRecomputeNamingItsModules) {
  Plan p;
  p.layout = layout(1, 1, 8);
  p.layout.recompute = models::Recompute::kSelective;
  const planner::Scenario s = scenario("mixtral-8x7b", 1, 4096, 64);
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("selective recompute of the attention core"), std::string::npos)
        << static_cast<int>(t);
  p.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron}) {
    const std::string why = refusal(s, p, t);
    EXPECT_NE(why.find("selective recompute of recompute_modules [layernorm, moe_act]"),
              std::string::npos)
        << why;
    EXPECT_EQ(why.find("attention core:"), std::string::npos) << why;
  }
}

// NCCL user buffers are Megatron's registration of its data-parallel buffers.
TEST(ExportOthers, RefuseNcclUserBuffers) {
  Plan p;
  p.layout = layout(1, 1, 32);
  p.layout.distributed_optimizer = true;
  p.layout.nccl_ub = true;
  const planner::Scenario s = llama();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("nccl_ub: "), std::string::npos) << static_cast<int>(t);
}

// Layers per pipeline stage set one by one: DeepSpeed's partition_method and nanotron's
// split cannot hold counts (torchtitan can: Fp32PipelinesAndTheirSchedules).
TEST(ExportOthers, RefuseLayersPerStageWhereTheTrainerSplitsItself) {
  planner::Scenario s = llama();
  Plan p;
  p.layout = layout(4, 2, 4);
  p.layout.pipeline_layout = {12, 20};
  for (Target t : {Target::kDeepspeed, Target::kNanotron}) {
    const std::string why = refusal(s, p, t);
    EXPECT_NE(why.find("layers per pipeline stage set one by one (pipeline_layout Et*12|t*20L)"),
              std::string::npos)
        << why;
  }
}

}  // namespace
}  // namespace hetpar::exporter
