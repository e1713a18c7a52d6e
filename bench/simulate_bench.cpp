// How long predicting one training iteration takes (lower + simulate), for the scenarios
// docs/performance.md tracks. Run: ./build/bench/hetpar_bench
#include <benchmark/benchmark.h>

#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {
namespace {

Scenario make(const char* model_json, int64_t seq, int64_t gbs, const char* profile, int nodes) {
  auto s = parse_scenario_text(
      fmt::format(R"({{"model": {}, "workload": {{"seq_len": {}, "global_batch": {}}},
                      "cluster": {{"profile": "{}", "nodes": {}}}}})",
                  model_json, seq, gbs, profile, nodes),
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

void run(benchmark::State& state, const Scenario& s, const Plan& p, bool full_ranks = false) {
  for (auto _ : state) {
    auto m = evaluate(s, p, {.full_ranks = full_ranks});
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
  run(state, s, plan(8, 64, 6, 1));
}
BENCHMARK(BM_Gpt1T_3072xA100)->Unit(benchmark::kMillisecond);

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

}  // namespace
}  // namespace hetpar::planner
