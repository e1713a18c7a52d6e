// How long predicting one training iteration takes (lower + simulate), for the scenarios
// docs/performance.md tracks. Run: ./build/bench/hetpar_bench
#include <benchmark/benchmark.h>

#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {
namespace {

// `workload`: further workload fields, e.g. R"(, "precision": "fp8")".
Scenario make(const char* model_json, int64_t seq, int64_t gbs, const char* profile, int nodes,
              const std::string& workload = "") {
  auto s = parse_scenario_text(
      fmt::format(R"({{"model": {}, "workload": {{"seq_len": {}, "global_batch": {}{}}},
                      "cluster": {{"profile": "{}", "nodes": {}}}}})",
                  model_json, seq, gbs, workload, profile, nodes),
      "bench");
  if (!s.is_ok()) throw std::runtime_error(s.status().to_string());
  return *s;
}

Plan plan(int tp, int pp, int dp, int mbs, Schedule sch = Schedule::k1F1B, int vpp = 1) {
  Plan p;
  p.layout.tp = tp;
  p.layout.pp = pp;
  p.layout.dp = dp;
  p.layout.vpp = vpp;
  p.layout.micro_batch = mbs;
  p.layout.sequence_parallel = tp > 1;
  p.schedule = sch;
  return p;
}

// `search`: as a layout search evaluates (no exposed-comm sweep, memory not enforced, so
// that a plan the memory model rejects is still timed). Each iteration reuses one
// Workspace, as a search thread does after its first plan: one untimed evaluation fills
// it first (a run of ~1 s is timed once, so the loop alone would time the empty
// workspace). `cold`: none, as a single `hetpar simulate` runs.
void run(benchmark::State& state, const Scenario& s, const Plan& p, bool full_ranks = false,
         bool search = false, bool cold = false) {
  Workspace ws;
  const EvaluateOptions options{.full_ranks = full_ranks,
                                .enforce_memory = !search,
                                .exposed_by_kind = !search,
                                .workspace = cold ? nullptr : &ws};
  if (!cold) (void)evaluate(s, p, options);
  for (auto _ : state) {
    auto m = evaluate(s, p, options);
    if (!m.is_ok() || !m->feasible) {
      state.SkipWithError(m.is_ok() ? m->infeasible_reason.c_str() : m.status().message().c_str());
      return;
    }
    state.counters["tasks"] = static_cast<double>(m->tasks);
    state.counters["iteration_s"] = m->iteration_time.to_seconds();
  }
}

// Llama-3.1-8B on 8 DGX H100 (64 GPUs), TP2 PP1 DP32, distributed optimizer.
void BM_Llama8B_64xH100(benchmark::State& state) {
  static const Scenario s = make(R"("llama-3.1-8b")", 8192, 512, "dgx-h100", 8);
  Plan p = plan(2, 1, 32, 1);
  p.layout.distributed_optimizer = true;
  run(state, s, p);
}
BENCHMARK(BM_Llama8B_64xH100)->Unit(benchmark::kMillisecond);

// The same, every rank simulated (no symmetry reduction): the reference it is checked
// against (tests/planner/symmetry_test.cpp).
void BM_Llama8B_64xH100_FullRanks(benchmark::State& state) {
  static const Scenario s = make(R"("llama-3.1-8b")", 8192, 512, "dgx-h100", 8);
  Plan p = plan(2, 1, 32, 1);
  p.layout.distributed_optimizer = true;
  run(state, s, p, true);
}
BENCHMARK(BM_Llama8B_64xH100_FullRanks)->Unit(benchmark::kMillisecond);

// Megatron-LM's 1T GPT (128 layers, 25600 hidden, 160 heads) on 3072 A100s, TP8 PP64 DP6.
void BM_Gpt1T_3072xA100(benchmark::State& state) {
  static const Scenario s = make(
      R"({"name": "gpt-1t", "modules": [{"name": "llm", "kind": "llm", "spec": {
          "layers": 128, "hidden": 25600, "ffn_hidden": 102400, "heads": 160, "vocab": 51200,
          "activation": "gelu", "norm": "layernorm", "position_embedding": "learned",
          "max_positions": 2048, "tied_embeddings": true}}]})",
      2048, 3072, "dgx-a100-80gb", 384);
  run(state, s, plan(8, 64, 6, 1), false, false, state.range(0) == 1);
}
// Arg 0: a reused Workspace (the planner's case); 1: cold, every array allocated afresh.
BENCHMARK(BM_Gpt1T_3072xA100)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Llama-3.1-405B on 16384 H100s, TP8 PP16 DP128, seq 8192, global batch 2048: Meta's
// 7/8/.../8/7 layer split (126 layers), distributed optimizer, full recompute (the memory
// model finds 85 GiB on stage 1 without it).
void BM_Llama405B_16384xH100(benchmark::State& state) {
  static const Scenario s = make(R"("llama-3.1-405b")", 8192, 2048, "dgx-h100", 2048);
  Plan p = plan(8, 16, 128, 1);
  p.layout.first_stage_layers = p.layout.last_stage_layers = 7;
  p.layout.distributed_optimizer = true;
  p.layout.recompute = models::Recompute::kFull;
  run(state, s, p);
}
BENCHMARK(BM_Llama405B_16384xH100)->Unit(benchmark::kMillisecond);

// Qwen3-235B-A22B (128 experts, top-8) on 256 H100s in FP8 as Megatron-Bridge 25.11 ran it
// (validation/runs/mbridge-25.11-qwen3-235b-a22b-256xh100-fp8.json): TP2 PP8 VP4 DP16, EP32
// folded over TP x DP, so every MoE layer's all-to-alls span four nodes (32 x 31 flows
// each, as bundles 2 per source: sim::SimOptions::bundle_flows).
void BM_Qwen3_235B_256xH100(benchmark::State& state) {
  static const Scenario s =
      make(R"("qwen3-235b-a22b")", 4096, 2048, "dgx-h100", 32, R"(, "precision": "fp8")");
  Plan p = plan(2, 8, 16, 1, Schedule::kInterleaved, 4);
  p.layout.ep = 32;
  p.layout.etp = 1;
  p.layout.distributed_optimizer = true;
  p.layout.account_for_embedding = p.layout.account_for_loss = true;
  p.layout.fp8_param_gather = true;
  p.layout.fp8_recipe = Fp8Recipe::kTensorwise;
  p.layout.grad_reduce_dtype = GradReduceDtype::kBf16;
  run(state, s, p);
}
BENCHMARK(BM_Qwen3_235B_256xH100)->Unit(benchmark::kMillisecond);

// InternViT-6B (4 tiles per sample, pixel-shuffled to 256 tokens each) + Llama-3.1-70B on
// 1024 H100s (examples/internvit6b-llama70b-1024xh100.json), the heterogeneous plans a layout
// search evaluates by the thousand.
const Scenario& internvit_1024() {
  static const Scenario s = make(
      R"({"name": "internvit-6b-llama-3.1-70b", "modules": [
          {"name": "vision", "kind": "vision_encoder", "spec": "internvit-6b"},
          {"name": "projector", "kind": "projector", "spec": {"input_hidden": 3200,
           "output_hidden": 8192, "layers": 2, "ffn_hidden": 8192, "activation": "gelu",
           "downsample": 2}},
          {"name": "llm", "kind": "llm", "spec": "llama-3.1-70b"}],
          "edges": [["vision", "projector"], ["projector", "llm"]]})",
      8192, 1024, "dgx-h100", 128, R"(, "images_per_sample": 4)");
  return s;
}

Plan hetero(Placement where, Plan llm, int llm_first, Layout enc, int enc_first) {
  llm.placement = where;
  llm.llm_first_rank = llm_first;
  llm.layout.distributed_optimizer = true;
  llm.layout.recompute = models::Recompute::kSelective;
  enc.distributed_optimizer = true;
  llm.modules.push_back({"vision", enc, enc_first});
  return llm;
}

Layout encoder(int tp, int dp) {
  Layout l;
  l.tp = tp;
  l.dp = dp;
  return l;
}

// Colocated three-phase: the ViT TP1 DP1024 on every GPU, the LLM TP8 PP4 DP32 (fan-in 32).
void BM_Hetero_ThreePhase_1024xH100(benchmark::State& state) {
  run(state, internvit_1024(),
      hetero(Placement::kColocated, plan(8, 4, 32, 1), 0, encoder(1, 1024), 0), state.range(0) != 0,
      true);
}
BENCHMARK(BM_Hetero_ThreePhase_1024xH100)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Non-colocated: the ViT TP1 DP256 on 32 nodes, the LLM TP8 PP6 DP16 (10/15/.../10 layers)
// on the other 96 (fan-in 16).
void BM_Hetero_NonColocated_1024xH100(benchmark::State& state) {
  Plan llm = plan(8, 6, 16, 1);
  llm.layout.first_stage_layers = llm.layout.last_stage_layers = 10;
  run(state, internvit_1024(), hetero(Placement::kNonColocated, llm, 256, encoder(1, 256), 0),
      state.range(0) != 0, true);
}
BENCHMARK(BM_Hetero_NonColocated_1024xH100)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Colocated, LLM pp 1 (interleaved per micro-batch): the ViT TP1 DP1024, the LLM TP8 DP128.
void BM_Hetero_Colocated_1024xH100(benchmark::State& state) {
  Plan llm = plan(8, 1, 128, 1);
  llm.layout.recompute = models::Recompute::kFull;
  run(state, internvit_1024(), hetero(Placement::kColocated, llm, 0, encoder(1, 1024), 0),
      state.range(0) != 0, true);
}
BENCHMARK(BM_Hetero_Colocated_1024xH100)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hetpar::planner
