// The megatron and megatron-mimo targets: the emitted flags parse back into the plan's
// layout, and what Megatron-LM (or its MIMO example) cannot run is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "helpers.h"
#include "hetpar/planner/lower.h"

namespace hetpar::exporter {
namespace {

using namespace testing;
using planner::Layout;
using planner::Placement;
using planner::Plan;
using planner::Schedule;

int flag_int(const std::map<std::string, std::string>& f, const std::string& name, int dflt) {
  auto it = f.find(name);
  return it == f.end() ? dflt : std::stoi(it->second);
}

// The layout a Megatron-LM run with these flags gets (DP from the world size, VPP from the
// virtual-stage flags, the LLM's `layers`).
Layout parse_layout(const std::map<std::string, std::string>& f, const std::string& prefix,
                    int world, int64_t layers) {
  Layout l;
  const bool mimo = prefix == "--llm-";
  l.tp = flag_int(f, mimo ? "--llm-tp" : "--tensor-model-parallel-size", 1);
  l.pp = flag_int(f, mimo ? "--llm-pp" : "--pipeline-model-parallel-size", 1);
  l.cp = flag_int(f, mimo ? "--llm-cp" : "--context-parallel-size", 1);
  l.ep = flag_int(f, mimo ? "--llm-ep" : "--expert-model-parallel-size", 1);
  l.dp = mimo ? flag_int(f, "--llm-dp", 1) : world / (l.tp * l.pp * l.cp);
  l.sequence_parallel = f.count("--sequence-parallel") > 0;
  if (f.count("--num-layers-per-virtual-pipeline-stage"))
    l.vpp =
        static_cast<int>(layers / l.pp / flag_int(f, "--num-layers-per-virtual-pipeline-stage", 1));
  l.vpp = flag_int(f, "--num-virtual-stages-per-pipeline-rank", l.vpp);
  l.microbatch_group = flag_int(f, "--microbatch-group-size-per-virtual-pipeline-stage", 0);
  l.micro_batch = flag_int(f, "--micro-batch-size", 0);
  if (f.count("--recompute-granularity")) {
    const std::string g = f.at("--recompute-granularity");
    l.recompute = g == "selective" ? models::Recompute::kSelective : models::Recompute::kFull;
    if (g == "full") {
      EXPECT_EQ(f.at("--recompute-method"), "uniform");
      EXPECT_EQ(f.at("--recompute-num-layers"), "1");
    }
    if (auto it = f.find("--recompute-modules"); it != f.end()) {
      l.recompute_modules = 0;
      std::istringstream names(it->second);
      for (std::string name; names >> name;) {
        EXPECT_NE(planner::recompute_module(name), 0) << name;
        l.recompute_modules |= planner::recompute_module(name);
      }
    }
  }
  l.distributed_optimizer = f.count("--use-distributed-optimizer") > 0;
  l.overlap_grad_reduce = f.count("--overlap-grad-reduce") > 0;
  l.overlap_param_gather = f.count("--overlap-param-gather") > 0;
  const std::string backend = f.at("--attention-backend");
  l.flash_attention = backend != "unfused";
  if (backend == "fused") l.attention_kernel = hardware::AttentionKernel::kCudnn;
  if (backend == "flash") l.attention_kernel = hardware::AttentionKernel::kFlash2;
  l.first_stage_layers = flag_int(f, "--decoder-first-pipeline-num-layers", 0);
  l.last_stage_layers = flag_int(f, "--decoder-last-pipeline-num-layers", 0);
  l.account_for_embedding = f.count("--account-for-embedding-in-pipeline-split") > 0;
  l.account_for_loss = f.count("--account-for-loss-in-pipeline-split") > 0;
  // --pipeline-model-parallel-layout "Et*6|t*10|...L": the decoder layers (t*N) of each
  // '|'-separated virtual stage; its stage count gives the virtual stages per rank.
  if (auto it = f.find("--pipeline-model-parallel-layout"); it != f.end()) {
    std::string text = it->second;
    EXPECT_EQ(text.front(), '"');
    EXPECT_EQ(text.substr(0, 2), "\"E");
    EXPECT_EQ(text.substr(text.size() - 2), "L\"");
    text = text.substr(1, text.size() - 2) + "|";
    for (size_t at = 0, bar; (bar = text.find('|', at)) != std::string::npos; at = bar + 1) {
      const std::string stage = text.substr(at, bar - at);
      const size_t t = stage.find("t*");
      l.pipeline_layout.push_back(t == std::string::npos ? 0 : std::stoi(stage.substr(t + 2)));
    }
    l.vpp = static_cast<int>(l.pipeline_layout.size()) / l.pp;
  }
  return l;
}

// What Megatron runs for plan layout `l`: no SP at TP 1, no param-gather overlap without
// the distributed optimizer.
Layout as_run(Layout l) {
  l.sequence_parallel = l.sequence_parallel && l.tp > 1;
  l.overlap_param_gather = l.overlap_param_gather && l.distributed_optimizer;
  // --attention-backend flash runs whichever FlashAttention is installed.
  if (l.attention_kernel == hardware::AttentionKernel::kFlash3)
    l.attention_kernel = hardware::AttentionKernel::kFlash2;
  return l;
}

std::vector<Plan> llama_plans() {
  std::vector<Plan> out;
  Plan a;
  a.layout = layout(4, 2, 4);
  a.layout.sequence_parallel = true;
  a.layout.recompute = models::Recompute::kFull;
  a.layout.distributed_optimizer = true;
  a.layout.first_stage_layers = 15;
  a.layout.last_stage_layers = 17;
  a.layout.attention_kernel = hardware::AttentionKernel::kCudnn;
  out.push_back(a);
  Plan b;
  b.layout = layout(2, 4, 4);
  b.layout.vpp = 2;
  b.layout.recompute = models::Recompute::kSelective;
  b.layout.flash_attention = false;
  b.layout.overlap_grad_reduce = false;
  b.schedule = Schedule::kInterleaved;
  out.push_back(b);
  Plan c = b;
  c.layout.first_stage_layers = 6;
  c.layout.last_stage_layers = 10;
  out.push_back(c);
  Plan d;
  d.layout = layout(4, 2, 2);
  d.layout.cp = 2;
  d.layout.account_for_embedding = true;
  d.layout.account_for_loss = true;
  d.layout.attention_kernel = hardware::AttentionKernel::kFlash3;
  out.push_back(d);
  // Layers set stage by stage (Layout::pipeline_layout), one and two virtual stages per rank.
  Plan e = a;
  e.layout.first_stage_layers = e.layout.last_stage_layers = 0;
  e.layout.pipeline_layout = {12, 20};
  out.push_back(e);
  Plan g = b;
  g.layout.pipeline_layout = {3, 5, 4, 4, 3, 5, 4, 4};
  out.push_back(g);
  // The dense MLP checkpointed beside the attention core (--recompute-modules core_attn mlp).
  Plan h = b;
  h.layout.sequence_parallel = true;
  h.layout.recompute_modules = models::kRecomputeCoreAttn | models::kRecomputeMlp;
  out.push_back(h);
  return out;
}

TEST(ExportMegatron, FlagsParseBackIntoThePlan) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  for (const Plan& p : llama_plans()) {
    ASSERT_EQ(planner::infeasibility(s, p), "");
    const std::string script = exported(s, p, Target::kMegatron).at("launch.sh");
    const auto f = all_flags(script);
    EXPECT_EQ(parse_layout(f, "--", 32, 32), as_run(p.layout)) << script;
    EXPECT_EQ(f.at("--global-batch-size"), "512");
    EXPECT_EQ(f.at("--seq-length"), "8192");
    EXPECT_EQ(f.at("--num-query-groups"), "8");
    EXPECT_EQ(f.count("--bf16"), 1u);
    EXPECT_NE(script.find("NNODES=4\nGPUS_PER_NODE=8\n"), std::string::npos);
    EXPECT_NE(script.find(" pretrain_gpt.py "), std::string::npos);
  }
  // Even interleaving is spelt in layers per virtual stage, uneven in stages per rank.
  EXPECT_EQ(all_flags(exported(s, llama_plans()[1], Target::kMegatron).at("launch.sh"))
                .at("--num-layers-per-virtual-pipeline-stage"),
            "4");
  EXPECT_EQ(all_flags(exported(s, llama_plans()[2], Target::kMegatron).at("launch.sh"))
                .count("--num-layers-per-virtual-pipeline-stage"),
            0u);
  // A layout names the virtual stages itself: neither virtual-stage flag beside it.
  const auto g = all_flags(exported(s, llama_plans()[5], Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(g.at("--pipeline-model-parallel-layout"), "\"Et*3|t*5|t*4|t*4|t*3|t*5|t*4|t*4L\"");
  EXPECT_EQ(g.count("--num-layers-per-virtual-pipeline-stage") +
                g.count("--num-virtual-stages-per-pipeline-rank"),
            0u);
}

// Layout::align_grad_reduce is Megatron's default (off: --no-align-grad-reduce), and
// Layout::defer_embedding_wgrad is --defer-embedding-wgrad-compute, with its limit when
// set; the trainers without the deferral refuse it.
TEST(ExportMegatron, AlignedReductionsAndDeferredWgrad) {
  Plan p;
  p.layout = layout(8, 2, 2);
  p.layout.sequence_parallel = true;
  const planner::Scenario s = scenario("llama-3.1-8b", 4, 4096, 64);
  auto flags = [&] { return all_flags(exported(s, p, Target::kMegatron).at("launch.sh")); };
  EXPECT_EQ(flags().count("--no-align-grad-reduce"), 0u);
  EXPECT_EQ(flags().count("--defer-embedding-wgrad-compute"), 0u);
  p.layout.align_grad_reduce = false;
  p.layout.defer_embedding_wgrad = true;
  EXPECT_EQ(flags().count("--no-align-grad-reduce"), 1u);
  EXPECT_EQ(flags().count("--defer-embedding-wgrad-compute"), 1u);
  EXPECT_EQ(flags().count("--wgrad-deferral-limit"), 0u);
  p.layout.wgrad_deferral_limit = 22;
  EXPECT_EQ(flags().at("--wgrad-deferral-limit"), "22");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("defer_embedding_wgrad: "), std::string::npos) << to_string(t);
}

// Layout::microbatch_group is Megatron-Core's micro-batch group per virtual stage: Megatron-LM's
// --microbatch-group-size-per-virtual-pipeline-stage, Megatron-Bridge's
// model.microbatch_group_size_per_vp_stage; the trainers without it refuse it.
TEST(ExportMegatron, MicroBatchGroupsPerVirtualStage) {
  Plan p;
  p.layout = layout(8, 2, 2);
  p.layout.vpp = 2;
  p.schedule = Schedule::kInterleaved;
  const planner::Scenario s = scenario("llama-3.1-8b", 4, 4096, 64);  // 32 micro-batches
  auto flags = [&] { return all_flags(exported(s, p, Target::kMegatron).at("launch.sh")); };
  auto bridge = [&] {
    return yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  };
  EXPECT_EQ(flags().count("--microbatch-group-size-per-virtual-pipeline-stage"), 0u);
  EXPECT_EQ(bridge().count("model.microbatch_group_size_per_vp_stage"), 0u);
  p.layout.microbatch_group = 3;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto f = flags();
  EXPECT_EQ(f.at("--microbatch-group-size-per-virtual-pipeline-stage"), "3");
  EXPECT_EQ(parse_layout(f, "--", 32, 32).microbatch_group, 3);
  EXPECT_EQ(bridge().at("model.microbatch_group_size_per_vp_stage"), "3");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("microbatch_group: "), std::string::npos) << to_string(t);
}

// The MLP's activation: --swiglu for Llama, --squared-relu for Nemotron-4, neither for GELU.
TEST(ExportMegatron, ActivationFlags) {
  Plan p;
  p.layout = layout(8, 1, 2);
  auto flags = [&](const std::string& model) {
    return all_flags(exported(scenario(model, 2, 4096, 64), p, Target::kMegatron).at("launch.sh"));
  };
  const auto nemotron = flags("nemotron-4-15b"), llama = flags("llama-3.1-8b"),
             gpt = flags("gpt3-175b");
  EXPECT_EQ(nemotron.count("--squared-relu"), 1u);
  EXPECT_EQ(nemotron.count("--swiglu"), 0u);
  EXPECT_EQ(llama.count("--swiglu"), 1u);
  EXPECT_EQ(llama.count("--squared-relu"), 0u);
  EXPECT_EQ(gpt.count("--swiglu") + gpt.count("--squared-relu"), 0u);
  // An unfused SwiGLU is Megatron's --no-bias-swiglu-fusion; its squared ReLU is always
  // jit-fused, so an unfused one is noted as timed otherwise.
  EXPECT_EQ(llama.count("--no-bias-swiglu-fusion"), 0u);
  p.layout.fused_activation = false;
  EXPECT_EQ(flags("llama-3.1-8b").count("--no-bias-swiglu-fusion"), 1u);
  const std::string script =
      exported(scenario("nemotron-4-15b", 2, 4096, 64), p, Target::kMegatron).at("launch.sh");
  EXPECT_EQ(all_flags(script).count("--no-bias-swiglu-fusion"), 0u);
  EXPECT_NE(script.find("(fused_activation true)"), std::string::npos) << script;
}

// An MoE LLM with dense layers first (GLM-4.5: 3 of 92, and one multi-token-prediction
// depth): --ffn-hidden-size is the dense layers' width and --moe-layer-freq places them,
// quoted for bash; --mtp-num-layers gives the depth; the script parses.
TEST(ExportMegatron, DenseLayersFirstSetTheLayerPattern) {
  const planner::Scenario s = scenario("glm-4.5", 32, 4096, 1024);
  const Plan p = glm45_ep32_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const std::string script = exported(s, p, Target::kMegatron).at("launch.sh");
  const auto f = all_flags(script);
  EXPECT_EQ(f.at("--ffn-hidden-size"), "12288");
  EXPECT_EQ(f.at("--moe-ffn-hidden-size"), "1536");
  EXPECT_EQ(f.at("--moe-layer-freq"), "'([0]*3+[1]*89)'");
  EXPECT_EQ(f.at("--moe-shared-expert-intermediate-size"), "1536");
  EXPECT_EQ(f.at("--mtp-num-layers"), "1");  // its multi-token-prediction depth
  const std::string path =
      ::testing::TempDir() + "/export_dense_first_" + std::to_string(getpid()) + ".sh";
  std::ofstream(path) << script;
  EXPECT_EQ(std::system(("bash -n " + path).c_str()), 0);
  std::filesystem::remove(path);
  // Without dense layers no pattern: every layer is a MoE layer, Megatron's default.
  const auto m = all_flags(
      exported(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan(), Target::kMegatron)
          .at("launch.sh"));
  EXPECT_EQ(m.count("--moe-layer-freq"), 0u);
  EXPECT_EQ(m.count("--mtp-num-layers"), 0u);
}

// Multi-head latent attention (DeepSeek-V3): Megatron-Core's MLA flags with its latent ranks
// and head widths, no GQA flags; the other trainers refuse it.
TEST(ExportMegatron, LatentAttentionWritesItsWidths) {
  const planner::Scenario s = scenario("deepseek-v3", 128, 4096, 8192);
  const Plan p = deepseek_v3_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto f = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.count("--multi-latent-attention"), 1u);
  EXPECT_EQ(f.at("--q-lora-rank"), "1536");
  EXPECT_EQ(f.at("--kv-lora-rank"), "512");
  EXPECT_EQ(f.at("--qk-head-dim"), "128");
  EXPECT_EQ(f.at("--qk-pos-emb-head-dim"), "64");
  EXPECT_EQ(f.at("--v-head-dim"), "128");
  EXPECT_EQ(f.count("--group-query-attention"), 0u);
  EXPECT_EQ(f.count("--kv-channels"), 0u);
  for (Target t : {Target::kMegatronBridge, Target::kTorchtitan, Target::kDeepspeed})
    EXPECT_NE(refusal(s, p, t).find("mla: "), std::string::npos) << static_cast<int>(t);
}

// Sliding windows (gpt-oss-120b: 128 keys, every second layer full): Transformer Engine's
// (left, right) window and the skip frequency; torchtitan, DeepSpeed and nanotron refuse it.
TEST(ExportMegatron, SlidingWindowsWriteTheirWindow) {
  const planner::Scenario s = scenario("gpt-oss-120b", 8, 4096, 1280);
  const Plan p = gpt_oss_ep8_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto f = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.at("--window-size"), "128,0");
  EXPECT_EQ(f.at("--window-attn-skip-freq"), "2");
  EXPECT_EQ(f.at("--softmax-type"), "learnable");  // its attention sinks
  EXPECT_EQ(f.at("--kv-channels"), "64");
  EXPECT_EQ(all_flags(exported(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan(),
                               Target::kMegatron)
                          .at("launch.sh"))
                .count("--window-size"),
            0u);
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron}) {
    EXPECT_NE(refusal(s, p, t).find("sliding_window: "), std::string::npos) << static_cast<int>(t);
    EXPECT_NE(refusal(s, p, t).find("attention_sinks: "), std::string::npos) << static_cast<int>(t);
  }
}

// A GELU-gated MLP (activation geglu, as Gemma's): Megatron-Bridge gates fc1 with the
// provider's GELU and fuses it as the plan says; Megatron-LM's arguments have no such
// unit (--swiglu gates with SiLU) and nanotron's Llama is SwiGLU, so both refuse it.
TEST(ExportMegatron, GegluGatesInMegatronBridgeAndIsRefusedWhereNoFlagSaysIt) {
  planner::Scenario s = scenario("llama-3.1-8b", 1, 4096, 64);
  std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec).block.activation =
      models::Activation::kGeglu;
  Plan p;
  p.layout = layout(8, 1, 1);
  ASSERT_EQ(planner::infeasibility(s, p), "");
  auto bridge = [&] { return exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"); };
  EXPECT_EQ(yaml_settings(bridge()).at("model.gated_linear_unit"), "true");
  EXPECT_NE(bridge().find("GeGLU: gelu"), std::string::npos);
  EXPECT_EQ(yaml_settings(bridge()).count("model.bias_activation_fusion"), 0u);
  p.layout.fused_activation = false;
  EXPECT_EQ(yaml_settings(bridge()).at("model.bias_activation_fusion"), "false");
  for (Target t : {Target::kMegatron, Target::kMegatronMimo})
    EXPECT_NE(refusal(s, p, t).find("activation geglu: "), std::string::npos)
        << static_cast<int>(t);
  EXPECT_NE(refusal(s, p, Target::kNanotron).find("geglu"), std::string::npos);
}

// gpt-oss's MLP: quick GeGLU with its clamp and linear offset, as Megatron-LM's flags and
// Megatron-Bridge's fields say it (unfused: --no-bias-gelu-fusion, which governs every
// activation but SwiGLU); the targets without such settings refuse the extras.
TEST(ExportMegatron, QuickGegluWritesItsClampAndOffset) {
  const planner::Scenario s = scenario("gpt-oss-120b", 8, 4096, 1280);
  Plan p = gpt_oss_ep8_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  auto flags = [&] { return all_flags(exported(s, p, Target::kMegatron).at("launch.sh")); };
  auto f = flags();
  EXPECT_EQ(f.count("--quick-geglu"), 1u);
  EXPECT_EQ(f.count("--swiglu"), 0u);
  EXPECT_EQ(f.at("--glu-linear-offset"), "1");
  EXPECT_EQ(f.at("--activation-func-clamp-value"), "7");
  EXPECT_EQ(f.count("--no-bias-gelu-fusion"), 0u);
  const auto y = yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(y.at("model.gated_linear_unit"), "true");
  EXPECT_EQ(y.at("model.glu_linear_offset"), "1");
  EXPECT_EQ(y.at("model.activation_func_clamp_value"), "7");
  p.layout.fused_activation = false;
  f = flags();
  EXPECT_EQ(f.count("--no-bias-gelu-fusion"), 1u);
  EXPECT_EQ(f.count("--no-bias-swiglu-fusion"), 0u);
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron}) {
    EXPECT_NE(refusal(s, p, t).find("activation_clamp 7: "), std::string::npos)
        << static_cast<int>(t);
    EXPECT_NE(refusal(s, p, t).find("glu_linear_offset 1: "), std::string::npos)
        << static_cast<int>(t);
  }
}

// RoPE's base and Llama 3.1's scaling are the model's, not the trainer's defaults (Megatron's
// rotary base is 10000): the Megatron targets write them, nanotron writes the base as its
// rope_theta and notes the scaling it does not write, and the targets whose model code the
// user brings say them.
TEST(ExportMegatron, RopeBaseAndLlama31ScalingAreWritten) {
  Plan p;
  p.layout = layout(8, 1, 1);
  const planner::Scenario l31 = scenario("llama-3.1-8b", 1, 4096, 64);
  const planner::Scenario l2 = scenario("llama-2-7b", 1, 4096, 64);
  ASSERT_EQ(planner::infeasibility(l31, p), "");
  auto flags = [&](const planner::Scenario& s) {
    return all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  };
  const auto f31 = flags(l31), f2 = flags(l2);
  EXPECT_EQ(f31.at("--rotary-base"), "500000");
  EXPECT_EQ(f31.count("--use-rope-scaling"), 1u);
  EXPECT_EQ(f31.at("--rope-scaling-factor"), "8");
  EXPECT_EQ(f2.at("--rotary-base"), "10000");
  EXPECT_EQ(f2.count("--use-rope-scaling") + f2.count("--rope-scaling-factor"), 0u);
  EXPECT_EQ(flags(scenario("gpt3-1.3b", 1, 2048, 64)).count("--rotary-base"), 0u);  // learned
  const auto y =
      yaml_settings(exported(l31, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(y.at("model.rotary_base"), "500000");
  EXPECT_EQ(y.at("model.rope_scaling"), "true");
  EXPECT_EQ(y.at("model.rope_scaling_factor"), "8");
  EXPECT_NE(exported(l31, p, Target::kNanotron).at("launch.sh").find("Llama 3.1 RoPE scaling by 8"),
            std::string::npos);
  EXPECT_EQ(yaml_settings(exported(l2, p, Target::kNanotron).at("nanotron.yaml"))
                .at("model.model_config.rope_theta"),
            "10000.0");
  Plan sharded;  // FSDP2, as torchtitan shards
  sharded.layout = layout(1, 1, 8);
  sharded.layout.fsdp = true;
  sharded.layout.fsdp_implementation = planner::FsdpImplementation::kTorchFsdp2;
  sharded.layout.gradient_accumulation_fusion = false;
  ASSERT_EQ(planner::infeasibility(l31, sharded), "");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed}) {
    Plan q = sharded;
    q.layout.overlap_grad_reduce = t == Target::kTorchtitan;  // DeepSpeed's engine reduces after
    std::string all;
    for (const auto& [name, text] : exported(l31, q, t)) all += text;
    EXPECT_NE(all.find("RoPE base 500000, Llama 3.1 scaling by 8"), std::string::npos)
        << static_cast<int>(t);
  }
}

// YaRN, partial rotary and unfused RoPE. gpt-oss: GPT attention's YaRN (Megatron-LM's
// --position-embedding-type yarn and its --yarn-* flags, Megatron-Bridge's yarn_* fields);
// DeepSeek-V3: MLA's (--rope-type yarn, the scale and mscales; its ramp is
// MLATransformerConfig's, and a model with another is refused); GLM-4.5: --rotary-percent.
// An unfused-RoPE plan writes --no-rope-fusion / apply_rope_fusion false; nanotron refuses a
// partial rotary and notes YaRN; torchtitan's note names both.
TEST(ExportMegatron, YarnPartialRotaryAndRopeFusionAreWritten) {
  const planner::Scenario oss = scenario("gpt-oss-120b", 8, 4096, 1280);
  Plan p = gpt_oss_ep8_plan();
  ASSERT_EQ(planner::infeasibility(oss, p), "");
  auto f = all_flags(exported(oss, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.at("--position-embedding-type"), "yarn");
  EXPECT_EQ(f.at("--rotary-base"), "150000");
  EXPECT_EQ(f.at("--rotary-scaling-factor"), "32");
  EXPECT_EQ(f.at("--yarn-original-max-position-embeddings"), "4096");
  EXPECT_EQ(f.at("--yarn-beta-fast"), "32");
  EXPECT_EQ(f.at("--yarn-beta-slow"), "1");
  EXPECT_EQ(f.count("--no-yarn-correction-range-round-to-int"), 1u);
  EXPECT_EQ(f.at("--mscale"), "1");
  EXPECT_EQ(f.at("--mscale-all-dim"), "0");
  EXPECT_EQ(f.count("--rope-type") + f.count("--no-rope-fusion") + f.count("--rotary-percent"), 0u);
  auto y = yaml_settings(exported(oss, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(y.at("model.position_embedding_type"), "\"yarn\"");
  EXPECT_EQ(y.at("model.yarn_rotary_scaling_factor"), "32");
  EXPECT_EQ(y.at("model.yarn_original_max_position_embeddings"), "4096");
  EXPECT_EQ(y.at("model.yarn_correction_range_round_to_int"), "false");
  EXPECT_EQ(y.at("model.yarn_mscale_all_dim"), "0");
  EXPECT_EQ(y.at("model.apply_rope_fusion"), "true");
  p.layout.fused_rope = false;
  EXPECT_EQ(
      all_flags(exported(oss, p, Target::kMegatron).at("launch.sh")).count("--no-rope-fusion"), 1u);
  EXPECT_EQ(yaml_settings(exported(oss, p, Target::kMegatronBridge).at("megatron_bridge.yaml"))
                .at("model.apply_rope_fusion"),
            "false");

  planner::Scenario ds = scenario("deepseek-v3", 128, 4096, 8192);
  const Plan q = deepseek_v3_plan();
  ASSERT_EQ(planner::infeasibility(ds, q), "");
  f = all_flags(exported(ds, q, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.at("--position-embedding-type"), "rope");
  EXPECT_EQ(f.at("--rope-type"), "yarn");
  EXPECT_EQ(f.at("--rotary-scaling-factor"), "40");
  EXPECT_EQ(f.at("--mscale"), "1");
  EXPECT_EQ(f.at("--mscale-all-dim"), "1");
  EXPECT_EQ(f.count("--yarn-original-max-position-embeddings"), 0u);
  std::get<models::LlmSpec>(ds.model.modules[ds.model.llm_index()].spec).yarn->beta_fast = 16;
  EXPECT_NE(refusal(ds, q, Target::kMegatron).find("yarn with mla: "), std::string::npos);

  const planner::Scenario glm = scenario("glm-4.5", 32, 4096, 1024);
  ASSERT_EQ(planner::infeasibility(glm, glm45_ep32_plan()), "");
  EXPECT_EQ(all_flags(exported(glm, glm45_ep32_plan(), Target::kMegatron).at("launch.sh"))
                .at("--rotary-percent"),
            "0.5");
  EXPECT_EQ(
      yaml_settings(
          exported(glm, glm45_ep32_plan(), Target::kMegatronBridge).at("megatron_bridge.yaml"))
          .at("model.rotary_percent"),
      "0.5");

  // nanotron: Llama-shaped models only; a copy of Llama 3.1 8B with the two RoPE extras.
  planner::Scenario l = scenario("llama-3.1-8b", 1, 4096, 64);
  auto& llm = std::get<models::LlmSpec>(l.model.modules[l.model.llm_index()].spec);
  llm.rope_scaling_factor = 0;
  llm.yarn = models::Yarn{.factor = 4, .original_max_positions = 8192};
  Plan r;
  r.layout = layout(8, 1, 1);
  ASSERT_EQ(planner::infeasibility(l, r), "");
  EXPECT_NE(exported(l, r, Target::kNanotron).at("launch.sh").find("YaRN RoPE by 4"),
            std::string::npos);
  llm.rotary_percent = 0.5;
  EXPECT_NE(refusal(l, r, Target::kNanotron).find("rotary_percent 0.5: "), std::string::npos);
  // NoPE layers (Llama 4's): Megatron-LM and Megatron-Bridge write Megatron-Core's
  // no_rope_freq, nanotron's Llama cannot, torchtitan's note names them.
  llm.no_rope_every = 4;
  EXPECT_EQ(all_flags(exported(l, r, Target::kMegatron).at("launch.sh")).at("--no-rope-freq"), "4");
  EXPECT_EQ(yaml_settings(exported(l, r, Target::kMegatronBridge).at("megatron_bridge.yaml"))
                .at("model.no_rope_freq"),
            "4");
  EXPECT_NE(refusal(l, r, Target::kNanotron).find("no_rope_every 4: "), std::string::npos);
  Plan sharded;  // FSDP2, as torchtitan shards
  sharded.layout = layout(1, 1, 8);
  sharded.layout.fsdp = true;
  sharded.layout.fsdp_implementation = planner::FsdpImplementation::kTorchFsdp2;
  sharded.layout.gradient_accumulation_fusion = false;
  sharded.layout.overlap_grad_reduce = true;
  std::string all;
  for (const auto& [name, text] : exported(l, sharded, Target::kTorchtitan)) all += text;
  EXPECT_NE(all.find("YaRN by 4 over 8192 positions"), std::string::npos);
  EXPECT_NE(all.find("rotating 0.5 of each head"), std::string::npos);
  EXPECT_NE(all.find("no RoPE in the layers numbered (from 1) in multiples of 4"),
            std::string::npos);
  llm.no_rope_every = 0;
  // A plan timing unfused RoPE: torchtitan (compiled) and nanotron (flash-attn's rotary
  // kernel) fuse it, so their exports say so; Megatron-LM writes --no-rope-fusion instead.
  llm.yarn.reset();
  llm.rotary_percent = 1;
  sharded.layout.fused_rope = false;
  all.clear();
  for (const auto& [name, text] : exported(l, sharded, Target::kTorchtitan)) all += text;
  EXPECT_NE(all.find("runs RoPE as one fused kernel each way (fused_rope true)"),
            std::string::npos);
  r.layout.fused_rope = false;
  EXPECT_NE(exported(l, r, Target::kNanotron).at("launch.sh").find("(fused_rope true)"),
            std::string::npos);
  EXPECT_EQ(exported(l, r, Target::kMegatron).at("launch.sh").find("fused_rope"),
            std::string::npos);
}

// The MoE router: DeepSeek-V3's sigmoid scores, expert bias, scaling and groups as
// Megatron-LM's flags (none for Mixtral's softmax router, Megatron's default); GLM-4.5's as
// Megatron-Bridge's fields, written either way.
TEST(ExportMegatron, MoeRouterIsWritten) {
  const auto f = all_flags(
      exported(scenario("deepseek-v3", 128, 4096, 8192), deepseek_v3_plan(), Target::kMegatron)
          .at("launch.sh"));
  EXPECT_EQ(f.at("--moe-router-score-function"), "sigmoid");
  EXPECT_EQ(f.count("--moe-router-enable-expert-bias"), 1u);
  EXPECT_EQ(f.at("--moe-router-topk-scaling-factor"), "2.5");
  EXPECT_EQ(f.at("--moe-router-num-groups"), "8");
  EXPECT_EQ(f.at("--moe-router-group-topk"), "4");
  const auto m = all_flags(
      exported(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan(), Target::kMegatron)
          .at("launch.sh"));
  EXPECT_EQ(m.count("--moe-router-score-function") + m.count("--moe-router-enable-expert-bias") +
                m.count("--moe-router-topk-scaling-factor") + m.count("--moe-router-num-groups"),
            0u);
  const auto y = yaml_settings(
      exported(scenario("glm-4.5", 32, 4096, 1024), glm45_ep32_plan(), Target::kMegatronBridge)
          .at("megatron_bridge.yaml"));
  EXPECT_EQ(y.at("model.moe_router_score_function"), "\"sigmoid\"");
  EXPECT_EQ(y.at("model.moe_router_enable_expert_bias"), "true");
  EXPECT_EQ(y.at("model.moe_router_topk_scaling_factor"), "2.5");
  EXPECT_EQ(y.at("model.moe_router_num_groups"), "null");
  EXPECT_EQ(y.at("model.moe_router_pre_softmax"), "false");
  // Qwen1.5-MoE's softmax before the top-k and its gated shared expert.
  const planner::Scenario qwen = scenario("qwen1.5-moe-a2.7b", 2, 4096, 64);
  Plan q;
  q.layout = layout(1, 1, 16);
  q.layout.ep = 4;
  ASSERT_EQ(planner::infeasibility(qwen, q), "");
  const auto qf = all_flags(exported(qwen, q, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(qf.count("--moe-router-pre-softmax") + qf.count("--moe-shared-expert-gate"), 2u);
  EXPECT_EQ(m.count("--moe-router-pre-softmax") + m.count("--moe-shared-expert-gate"), 0u);
  const auto qy =
      yaml_settings(exported(qwen, q, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(qy.at("model.moe_router_pre_softmax"), "true");
  EXPECT_EQ(qy.at("model.moe_shared_expert_gate"), "true");
}

// Norms scaled by 1 + gamma (Nemotron-4's layernorm1p): Megatron-LM's --apply-layernorm-1p,
// Megatron-Bridge's layernorm_zero_centered_gamma (written either way); torchtitan,
// DeepSpeed and nanotron have no such norm and refuse it by name.
TEST(ExportMegatron, ZeroCenteredGammaIsWrittenOrRefused) {
  Plan p;
  p.layout = layout(2, 1, 8);
  p.layout.sequence_parallel = true;
  const planner::Scenario nemotron = scenario("nemotron-4-15b", 2, 4096, 64);
  const planner::Scenario llama = scenario("llama-3.1-8b", 2, 4096, 64);
  ASSERT_EQ(planner::infeasibility(nemotron, p), "");
  auto flags = [&](const planner::Scenario& s) {
    return all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  };
  auto bridge = [&](const planner::Scenario& s) {
    return yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  };
  EXPECT_EQ(flags(nemotron).count("--apply-layernorm-1p"), 1u);
  EXPECT_EQ(flags(llama).count("--apply-layernorm-1p"), 0u);
  EXPECT_EQ(bridge(nemotron).at("model.layernorm_zero_centered_gamma"), "true");
  EXPECT_EQ(bridge(llama).at("model.layernorm_zero_centered_gamma"), "false");
  planner::Scenario centred = scenario("llama-3.1-8b", 1, 4096, 64);
  std::get<models::LlmSpec>(centred.model.modules[centred.model.llm_index()].spec)
      .block.zero_centered_gamma = true;
  Plan dp;
  dp.layout = layout(1, 1, 8);
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(centred, dp, t).find("zero_centered_gamma: "), std::string::npos)
        << static_cast<int>(t);
}

// Gemma 3's norms after attention and after the MLP (post_norms): no trainer's generic
// model has them, so every target refuses the plan with the field's name.
TEST(ExportMegatron, PostNormsAreRefusedEverywhere) {
  const planner::Scenario s = scenario("gemma-3-27b", 4, 4096, 64);
  Plan p;
  p.layout.tp = 8;
  p.layout.pp = 2;
  p.layout.dp = 2;
  p.layout.sequence_parallel = true;
  p.layout.distributed_optimizer = true;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  for (Target t : {Target::kMegatron, Target::kMegatronBridge, Target::kTorchtitan,
                   Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("post_norms: "), std::string::npos) << static_cast<int>(t);
}

// Dense and MoE layers alternating (Llama 4 Maverick's layer pattern): --moe-layer-freq
// repeats the pattern, --ffn-hidden-size is the dense layers' width.
TEST(ExportMegatron, LayerPatternSetsTheMoeLayerFrequency) {
  const planner::Scenario s = scenario("llama-4-maverick", 16, 8192, 512);
  const Plan p = maverick_plan();
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto f = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(f.at("--moe-layer-freq"), "'([0,1]*24)'");
  EXPECT_EQ(f.at("--ffn-hidden-size"), "16384");
  EXPECT_EQ(f.at("--moe-ffn-hidden-size"), "8192");
  // Its top-1 router scaling the expert's input, and its NoPE layers.
  EXPECT_EQ(f.count("--moe-apply-probs-on-input"), 1u);
  EXPECT_EQ(f.at("--no-rope-freq"), "4");
  const auto m = all_flags(
      exported(scenario("mixtral-8x7b", 8, 4096, 256), mixtral_ep8_plan(), Target::kMegatron)
          .at("launch.sh"));
  EXPECT_EQ(m.count("--moe-apply-probs-on-input") + m.count("--no-rope-freq"), 0u);
}

TEST(ExportMegatron, MixtureOfExpertsAndPrecisions) {
  planner::Scenario s = scenario("mixtral-8x7b", 8, 4096, 256, 0, "fp8");
  const Plan p = mixtral_ep8_plan();
  const auto f = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(parse_layout(f, "--", 64, 32), as_run(p.layout));
  EXPECT_EQ(f.at("--num-experts"), "8");
  EXPECT_EQ(f.at("--moe-router-topk"), "2");
  EXPECT_EQ(f.at("--expert-tensor-parallel-size"), "2");
  // The MoE layer the cost model times, not Megatron's default allgather dispatcher.
  EXPECT_EQ(f.at("--moe-token-dispatcher-type"), "alltoall");
  for (const char* flag : {"--moe-grouped-gemm", "--moe-permute-fusion", "--moe-router-fusion"})
    EXPECT_EQ(f.count(flag), 1u) << flag;
  EXPECT_EQ(f.at("--moe-router-dtype"), "fp32");           // the router as the cost model times it
  EXPECT_EQ(f.count("--moe-expert-capacity-factor"), 0u);  // dropless
  Plan drop = p;                                           // token dropping, padded to capacity
  drop.layout.moe_capacity_factor = 1.25;
  const auto fd = all_flags(exported(s, drop, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(fd.at("--moe-expert-capacity-factor"), "1.25");
  EXPECT_EQ(fd.count("--moe-pad-expert-input-to-capacity"), 1u);
  Plan folded = p;  // MoE parallel folding: whole experts, EP over TP x DP
  folded.layout.etp = 1;
  EXPECT_EQ(all_flags(exported(s, folded, Target::kMegatron).at("launch.sh"))
                .at("--expert-tensor-parallel-size"),
            "1");
  Plan deepep = folded;  // Megatron-Core's flex dispatcher with DeepEP
  deepep.layout.moe_dispatcher = planner::MoeDispatcher::kDeepEp;
  const auto fe = all_flags(exported(s, deepep, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(fe.at("--moe-token-dispatcher-type"), "flex");
  EXPECT_EQ(fe.at("--moe-flex-dispatcher-backend"), "deepep");
  EXPECT_EQ(f.count("--moe-flex-dispatcher-backend"), 0u);
  Plan hybrid = folded;  // and with HybridEP, told its NVLink domain (EP 8 in one node)
  hybrid.layout.moe_dispatcher = planner::MoeDispatcher::kHybridEp;
  const std::string hybrid_launch = exported(s, hybrid, Target::kMegatron).at("launch.sh");
  const auto fh = all_flags(hybrid_launch);
  EXPECT_EQ(fh.at("--moe-token-dispatcher-type"), "flex");
  EXPECT_EQ(fh.at("--moe-flex-dispatcher-backend"), "hybridep");
  EXPECT_NE(hybrid_launch.find("export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8\n"),
            std::string::npos);
  EXPECT_EQ(exported(s, deepep, Target::kMegatron).at("launch.sh").find("HYBRID_EP"),
            std::string::npos);
  Plan modules = p;  // selective recompute of the pre-MLP norm and the experts' activation
  modules.layout.recompute = models::Recompute::kSelective;
  modules.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoeAct;
  const auto fm = all_flags(exported(s, modules, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(fm.at("--recompute-granularity"), "selective");
  EXPECT_EQ(fm.at("--recompute-modules"), "layernorm moe_act");
  EXPECT_EQ(f.count("--recompute-modules"), 0u);
  modules.layout.recompute_modules = models::kRecomputeLayernorm | models::kRecomputeMoe;
  EXPECT_EQ(
      all_flags(exported(s, modules, Target::kMegatron).at("launch.sh")).at("--recompute-modules"),
      "layernorm moe");
  Plan sharded = p;  // Megatron-FSDP shards the experts over their expert-DP group
  sharded.layout.fsdp = true;
  const auto fs = all_flags(exported(s, sharded, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(fs.count("--use-megatron-fsdp"), 1u);
  EXPECT_EQ(fs.at("--expert-model-parallel-size"), "8");
  EXPECT_EQ(fs.count("--use-nccl-ub"), 0u);
  sharded.layout.nccl_ub = true;  // the data-parallel buffers registered with NCCL
  EXPECT_EQ(
      all_flags(exported(s, sharded, Target::kMegatron).at("launch.sh")).count("--use-nccl-ub"),
      1u);
  EXPECT_EQ(f.at("--fp8-format"), "hybrid");
  EXPECT_EQ(f.at("--fp8-recipe"), "delayed");
  EXPECT_EQ(f.count("--fp8-param-gather"), 0u);
  Plan fp8_params = p;
  fp8_params.layout.fp8_param_gather = true;
  // Megatron-LM gathers FP8 parameters only with a sharded optimizer (it asserts).
  EXPECT_NE(refusal(s, fp8_params, Target::kMegatron).find("sharded optimizer"), std::string::npos);
  fp8_params.layout.distributed_optimizer = true;
  EXPECT_EQ(all_flags(exported(s, fp8_params, Target::kMegatron).at("launch.sh"))
                .count("--fp8-param-gather"),
            1u);
  EXPECT_EQ(f.count("--no-gradient-accumulation-fusion"), 0u);  // Megatron's default: fused
  Plan unfused = p;
  unfused.layout.gradient_accumulation_fusion = false;
  EXPECT_EQ(all_flags(exported(s, unfused, Target::kMegatron).at("launch.sh"))
                .count("--no-gradient-accumulation-fusion"),
            1u);
  EXPECT_EQ(f.count("--cp-comm-type"), 0u);  // cp 1
  Plan gather = p;
  gather.layout.cp = 2;
  gather.layout.dp = 4;
  gather.layout.cp_comm = planner::CpComm::kAllGather;
  EXPECT_EQ(all_flags(exported(s, gather, Target::kMegatron).at("launch.sh")).at("--cp-comm-type"),
            "all_gather");
  Plan a2a = gather;
  a2a.layout.cp_comm = planner::CpComm::kA2A;
  EXPECT_EQ(all_flags(exported(s, a2a, Target::kMegatron).at("launch.sh")).at("--cp-comm-type"),
            "a2a");
  Plan hier = gather;
  hier.layout.cp = 4;
  hier.layout.dp = 2;
  hier.layout.cp_comm = planner::CpComm::kA2AP2P;
  hier.layout.cp_a2a = 2;
  const auto h = all_flags(exported(s, hier, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(h.at("--cp-comm-type"), "a2a+p2p");
  EXPECT_EQ(h.at("--hierarchical-context-parallel-sizes"), "2 2");
  Plan current = p;
  current.layout.fp8_recipe = planner::Fp8Recipe::kTensorwise;
  EXPECT_EQ(all_flags(exported(s, current, Target::kMegatron).at("launch.sh")).at("--fp8-recipe"),
            "tensorwise");
  // The gradient buffer: flags only where it departs from Megatron's default.
  EXPECT_EQ(
      all_flags(exported(s, p, Target::kMegatron).at("launch.sh")).count("--grad-reduce-in-bf16"),
      0u);
  EXPECT_EQ(all_flags(exported(s, with_grads(p, planner::GradReduceDtype::kBf16), Target::kMegatron)
                          .at("launch.sh"))
                .count("--grad-reduce-in-bf16"),
            1u);
  s.workload.precision = hardware::Precision::kFp16;
  // Megatron's grouped GEMM for MoE asserts bf16; fp16 is spelled on a dense model.
  EXPECT_NE(refusal(s, p, Target::kMegatron).find("bf16 only"), std::string::npos);
  planner::Scenario dense = scenario("llama-3.1-8b", 4, 8192, 512, 0, "fp16");
  const Plan d = llama_plans()[0];
  EXPECT_EQ(all_flags(exported(dense, d, Target::kMegatron).at("launch.sh")).count("--fp16"), 1u);
  const auto fp16 =
      all_flags(exported(dense, with_grads(d, planner::GradReduceDtype::kFp32), Target::kMegatron)
                    .at("launch.sh"));
  EXPECT_EQ(fp16.count("--accumulate-allreduce-grads-in-fp32"), 1u);
  EXPECT_EQ(fp16.count("--grad-reduce-in-bf16"), 0u);
  s.workload.precision = hardware::Precision::kTf32;
  EXPECT_NE(refusal(s, p, Target::kMegatron).find("precision tf32"), std::string::npos);
}

// What Megatron-LM's arguments.py asserts against is refused, not written: the parameter
// all-gather overlap without the gradient-reduction overlap.
TEST(ExportMegatron, RefusesWhatItsArgumentsAssertAgainst) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p = llama_plans()[0];
  p.layout.distributed_optimizer = true;
  ASSERT_TRUE(p.layout.overlap_param_gather && p.layout.overlap_grad_reduce);
  EXPECT_EQ(
      all_flags(exported(s, p, Target::kMegatron).at("launch.sh")).count("--overlap-param-gather"),
      1u);
  p.layout.overlap_grad_reduce = false;
  EXPECT_NE(refusal(s, p, Target::kMegatron).find("Must use --overlap-param-gather"),
            std::string::npos);
  p.layout.overlap_param_gather = false;
  EXPECT_EQ(
      all_flags(exported(s, p, Target::kMegatron).at("launch.sh")).count("--overlap-param-gather"),
      0u);
}

// Userbuffers TP overlap: Megatron-LM's --tp-comm-overlap, Megatron-Bridge's
// comm_overlap.tp_comm_overlap; the other trainers have none and refuse it.
TEST(ExportMegatron, UserbuffersTpOverlap) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p = llama_plans()[0];  // tp 4 with SP
  p.layout.tp_comm_overlap = true;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh")).count("--tp-comm-overlap"),
            1u);
  EXPECT_EQ(yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"))
                .at("comm_overlap.tp_comm_overlap"),
            "true");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("tp_comm_overlap: "), std::string::npos) << to_string(t);
  p.layout.tp_comm_overlap = false;
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh")).count("--tp-comm-overlap"),
            0u);
}

// Blocking pipeline transfers on the interleaved schedule: Megatron-LM's
// --no-overlap-p2p-communication, Megatron-Bridge's comm_overlap.overlap_p2p_comm false.
TEST(ExportMegatron, BlockingPipelineTransfers) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p = llama_plans()[1];  // interleaved, vpp 2
  ASSERT_GT(p.layout.vpp, 1);
  auto count = [&] {
    return all_flags(exported(s, p, Target::kMegatron).at("launch.sh"))
        .count("--no-overlap-p2p-communication");
  };
  EXPECT_EQ(count(), 0u);
  p.layout.pp_blocking_p2p = true;
  EXPECT_EQ(count(), 1u);
  EXPECT_EQ(yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"))
                .at("comm_overlap.overlap_p2p_comm"),
            "false");
}

// The EP all-to-all overlap: Megatron-LM's --overlap-moe-expert-parallel-comm with
// --delay-wgrad-compute, Megatron-Bridge's comm_overlap settings of the same names; the
// other trainers have no merged forward/backward schedule and refuse it.
TEST(ExportMegatron, EpAllToAllOverlap) {
  planner::Scenario s = scenario("qwen3-30b-a3b", 2, 4096, 256);
  Plan p;
  p.layout = layout(1, 1, 16);
  p.layout.ep = 16;
  p.layout.ep_comm_overlap = true;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  const auto flags = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(flags.count("--overlap-moe-expert-parallel-comm"), 1u);
  EXPECT_EQ(flags.count("--delay-wgrad-compute"), 1u);
  const auto yaml =
      yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(yaml.at("comm_overlap.overlap_moe_expert_parallel_comm"), "true");
  EXPECT_EQ(yaml.at("comm_overlap.delay_wgrad_compute"), "true");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("ep_comm_overlap: "), std::string::npos) << to_string(t);
  p.layout.ep_comm_overlap = false;
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh"))
                .count("--overlap-moe-expert-parallel-comm"),
            0u);
}

// The shared-expert overlap: Megatron-LM's --moe-shared-expert-overlap, Megatron-Bridge's
// model key of the same name (written either way for a model with shared experts: its MoE
// providers default it on); the other trainers have no such stream and refuse it.
TEST(ExportMegatron, SharedExpertOverlap) {
  planner::Scenario s = scenario("qwen1.5-moe-a2.7b", 2, 4096, 256);
  Plan p;
  p.layout = layout(1, 1, 16);
  p.layout.ep = 4;
  p.layout.moe_shared_expert_overlap = true;
  ASSERT_EQ(planner::infeasibility(s, p), "");
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh"))
                .count("--moe-shared-expert-overlap"),
            1u);
  auto yaml = yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(yaml.at("model.moe_shared_expert_overlap"), "true");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("moe_shared_expert_overlap: "), std::string::npos)
        << to_string(t);
  p.layout.moe_shared_expert_overlap = false;
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh"))
                .count("--moe-shared-expert-overlap"),
            0u);
  yaml = yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(yaml.at("model.moe_shared_expert_overlap"), "false");
  // Without shared experts the key is left to the provider.
  planner::Scenario routed = scenario("qwen3-30b-a3b", 2, 4096, 256);
  p.layout.ep = 16;
  EXPECT_EQ(yaml_settings(exported(routed, p, Target::kMegatronBridge).at("megatron_bridge.yaml"))
                .count("model.moe_shared_expert_overlap"),
            0u);
}

// A fused cross-entropy: Megatron-LM's --cross-entropy-loss-fusion with
// --cross-entropy-fusion-impl; Megatron-Bridge's model keys of the same names, written
// even when off (its GPTModelProvider fuses by default); the other trainers refuse it. The
// compiled loss is torchtitan's torch.compile (compile.enable), which the others refuse.
TEST(ExportMegatron, CrossEntropyFusion) {
  planner::Scenario s = scenario("llama-3.1-8b", 1, 8192, 64);
  Plan p;
  p.layout = layout(1, 1, 8);
  const auto yaml_off =
      yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(yaml_off.at("model.cross_entropy_loss_fusion"), "false");
  EXPECT_EQ(all_flags(exported(s, p, Target::kMegatron).at("launch.sh"))
                .count("--cross-entropy-loss-fusion"),
            0u);
  p.layout.cross_entropy_fusion = planner::CrossEntropy::kTe;
  const auto flags = all_flags(exported(s, p, Target::kMegatron).at("launch.sh"));
  EXPECT_EQ(flags.count("--cross-entropy-loss-fusion"), 1u);
  ASSERT_EQ(flags.count("--cross-entropy-fusion-impl"), 1u);
  EXPECT_EQ(flags.at("--cross-entropy-fusion-impl"), "te");
  const auto yaml =
      yaml_settings(exported(s, p, Target::kMegatronBridge).at("megatron_bridge.yaml"));
  EXPECT_EQ(yaml.at("model.cross_entropy_loss_fusion"), "true");
  EXPECT_EQ(yaml.at("model.cross_entropy_fusion_impl"), "\"te\"");
  for (Target t : {Target::kTorchtitan, Target::kDeepspeed, Target::kNanotron})
    EXPECT_NE(refusal(s, p, t).find("cross_entropy_fusion te: "), std::string::npos)
        << to_string(t);

  p.layout.cross_entropy_fusion = planner::CrossEntropy::kUnfused;
  EXPECT_EQ(
      all_flags(exported(s, p, Target::kTorchtitan).at("launch.sh")).count("--compile.enable"), 0u);
  p.layout.cross_entropy_fusion = planner::CrossEntropy::kCompiled;
  const auto titan = all_flags(exported(s, p, Target::kTorchtitan).at("launch.sh"));
  ASSERT_EQ(titan.count("--compile.enable"), 1u);
  EXPECT_EQ(titan.at("--compile.enable"), "True");
  for (Target t :
       {Target::kMegatron, Target::kMegatronBridge, Target::kDeepspeed, Target::kNanotron}) {
    const std::string why = refusal(s, p, t);
    EXPECT_NE(why.find("cross_entropy_fusion compiled: "), std::string::npos) << to_string(t);
    EXPECT_NE(why.find("torch.compile'd loss"), std::string::npos) << to_string(t);
  }
}

TEST(ExportMegatron, HomogeneousVlmUsesPretrainVlm) {
  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  Plan p;
  p.layout = layout(2, 1, 4, 2);
  const std::string script = exported(s, p, Target::kMegatron).at("launch.sh");
  EXPECT_NE(script.find(" pretrain_vlm.py "), std::string::npos);
  EXPECT_NE(script.find("vision encoder on the first pipeline stage"), std::string::npos);
}

TEST(ExportMegatron, RefusesSchedulesItDoesNotHave) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p;
  p.layout = layout(4, 2, 4);
  p.schedule = Schedule::kGpipe;
  EXPECT_NE(refusal(s, p, Target::kMegatron).find("the GPipe schedule"), std::string::npos);
  p.schedule = Schedule::kZeroBubble;
  EXPECT_NE(refusal(s, p, Target::kMegatron).find("no zero-bubble"), std::string::npos);
}

TEST(ExportMegatron, RefusesAnAudioEncoder) {
  auto s = planner::load_scenario(std::string(HETPAR_SOURCE_DIR) +
                                  "/examples/whisper-qwen-internet.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Plan p;
  p.layout = layout(1, 1, s->cluster.total_gpus());
  ASSERT_EQ(planner::infeasibility(*s, p), "");
  EXPECT_NE(refusal(*s, p, Target::kMegatron).find("the audio encoder audio"), std::string::npos);
}

// ---- megatron-mimo ---------------------------------------------------------------------

TEST(ExportMegatronMimo, NonColocatedGridsParseBack) {
  auto s = planner::load_scenario(std::string(HETPAR_SOURCE_DIR) +
                                  "/examples/large-encoder-72xh100-compare.json");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Plan& p = s->plans[1].second;
  ASSERT_EQ(s->plans[1].first, "non_colocated");
  const std::string script = exported(*s, p, Target::kMegatronMimo).at("launch.sh");
  const auto f = all_flags(script);
  const planner::ModulePlan& enc = p.modules.front();
  EXPECT_EQ(flag_int(f, "--encoder-tp", 0), enc.layout.tp);
  EXPECT_EQ(flag_int(f, "--encoder-dp", 0), enc.layout.dp);
  EXPECT_EQ(flag_int(f, "--llm-offset", -1), p.llm_first_rank);
  EXPECT_EQ(parse_layout(f, "--llm-", 72, 80), as_run(p.layout));
  // The encoder's own recompute goes into the provider's config, named in the script.
  EXPECT_NE(script.find("encoder TransformerConfig (not a flag): sequence_parallel=False "
                        "recompute_granularity=\"full\" recompute_method=\"uniform\""),
            std::string::npos)
      << script;
  EXPECT_NE(script.find("examples/mimo/pretrain_mimo.py"), std::string::npos);
}

TEST(ExportMegatronMimo, LlmOnlyRunsTheLanguageGridAlone) {
  planner::Scenario s = scenario("llama-3.1-8b", 4, 8192, 512);
  Plan p = llama_plans()[0];
  const auto f = all_flags(exported(s, p, Target::kMegatronMimo).at("launch.sh"));
  EXPECT_EQ(f.count("--llm-only"), 1u);
  EXPECT_EQ(f.at("--llm-offset"), "0");
  EXPECT_EQ(f.count("--encoder-tp"), 0u);
  EXPECT_EQ(parse_layout(f, "--llm-", 32, 32), as_run(p.layout));
}

TEST(ExportMegatronMimo, RefusesWhatTheExampleCannotRun) {
  planner::Scenario s = scenario("llava-1.5-7b", 1, 4096, 96, 1);
  const std::string enc = encoder_name(s);
  Plan colocated;
  colocated.layout = layout(2, 1, 4, 2);
  colocated.placement = Placement::kColocated;
  colocated.modules.push_back({enc, layout(1, 1, 8, 2), 0});
  EXPECT_NE(refusal(s, colocated, Target::kMegatronMimo).find("disjoint rank spans"),
            std::string::npos);
  Plan homogeneous;
  homogeneous.layout = layout(2, 1, 4, 2);
  EXPECT_NE(refusal(s, homogeneous, Target::kMegatronMimo).find("--to megatron"),
            std::string::npos);

  Plan llm_first;  // the LLM on ranks 0-5, the encoder on 6-7
  llm_first.layout = layout(1, 1, 6, 1);
  llm_first.placement = Placement::kNonColocated;
  llm_first.modules.push_back({enc, layout(1, 1, 2, 3), 6});
  ASSERT_EQ(planner::infeasibility(s, llm_first), "");
  EXPECT_NE(refusal(s, llm_first, Target::kMegatronMimo).find("places the encoder grid at rank 0"),
            std::string::npos);

  Plan two_steps = llm_first;  // encoder micro-batch 6: two LLM micro-batches per step
  two_steps.llm_first_rank = 2;
  two_steps.modules[0] = {enc, layout(1, 1, 2, 6), 0};
  ASSERT_EQ(planner::infeasibility(s, two_steps), "");
  EXPECT_NE(refusal(s, two_steps, Target::kMegatronMimo)
                .find("encoder vision micro-batch 6: the MIMO example runs the encoder once per "
                      "LLM micro-batch, on micro-batch 1 x llm dp 6 / encoder dp 2 = 3 samples"),
            std::string::npos)
      << refusal(s, two_steps, Target::kMegatronMimo);

  Plan pipelined = two_steps;  // the encoder over 2 pipeline stages on ranks 0-1
  pipelined.modules[0] = {enc, layout(1, 2, 1, 6), 0};
  ASSERT_EQ(planner::infeasibility(s, pipelined), "");
  EXPECT_NE(refusal(s, pipelined, Target::kMegatronMimo)
                .find("encoder vision pp 2: the MIMO example fixes the encoder grid's PP at 1"),
            std::string::npos)
      << refusal(s, pipelined, Target::kMegatronMimo);

  Plan overlapped = llm_first;  // the encoder with userbuffers, the LLM (TP 1) without
  overlapped.llm_first_rank = 2;
  overlapped.modules[0] = {enc, layout(2, 1, 1, 6), 0};
  overlapped.modules[0].layout.sequence_parallel = true;
  overlapped.modules[0].layout.tp_comm_overlap = true;
  ASSERT_EQ(planner::infeasibility(s, overlapped), "");
  for (Target t : {Target::kMegatronMimo, Target::kMegatronBridge})
    EXPECT_NE(
        refusal(s, overlapped, t).find("encoder vision tp_comm_overlap true but the llm's false"),
        std::string::npos)
        << refusal(s, overlapped, t);

  Plan sharded = llm_first;  // the encoder fully sharded over its 2 ranks
  sharded.llm_first_rank = 2;
  sharded.modules[0] = {enc, layout(1, 1, 2, 3), 0};
  sharded.modules[0].layout.fsdp = true;
  ASSERT_EQ(planner::infeasibility(s, sharded), "");
  EXPECT_NE(refusal(s, sharded, Target::kMegatronMimo)
                .find("module vision fsdp in the non_colocated placement: the MIMO example"),
            std::string::npos)
      << refusal(s, sharded, Target::kMegatronMimo);
  EXPECT_NE(refusal(s, sharded, Target::kMegatronBridge)
                .find("module vision fsdp in the non_colocated placement: MegatronMIMO"),
            std::string::npos)
      << refusal(s, sharded, Target::kMegatronBridge);

  planner::Scenario llama = scenario("llama-3.1-8b", 4, 8192, 512);
  EXPECT_NE(refusal(llama, llama_plans()[1], Target::kMegatronMimo).find("virtual stages"),
            std::string::npos);
  EXPECT_NE(refusal(llama, llama_plans()[3], Target::kMegatronMimo).find("llm cp 2"),
            std::string::npos);
}

}  // namespace
}  // namespace hetpar::exporter
