// How long a full `hetpar plan` search takes (enumeration, constraints, bounds, memory,
// simulation of the survivors), for the scenarios docs/performance.md tracks. Targets
// (issue 5): the 64-GPU LLaVA-1.5-7B search <= 2 s, the 1024-GPU InternViT-6B +
// Llama-3.1-70B search over all three placements <= 30 s, on the 2-core development VM.
// Run: ./build/bench/hetpar_plan_bench
#include <benchmark/benchmark.h>

#include <map>
#include <stdexcept>
#include <string>

#include "hetpar/planner/scenario.h"
#include "hetpar/planner/search.h"

namespace hetpar::planner {
namespace {

const Scenario& example(const std::string& name) {
  static std::map<std::string, Scenario> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto s = load_scenario(std::string(HETPAR_SOURCE_DIR) + "/examples/" + name);
  if (!s.is_ok()) throw std::runtime_error(s.status().to_string());
  return cache.emplace(name, *s).first->second;
}

void run(benchmark::State& state, const Scenario& s) {
  for (auto _ : state) {
    auto r = search(s);
    if (!r.is_ok() || r->top.empty()) {
      state.SkipWithError(r.is_ok() ? "no feasible plan" : r.status().message().c_str());
      return;
    }
    state.counters["considered"] = static_cast<double>(r->counts.considered);
    state.counters["rejected"] = static_cast<double>(r->counts.rejected);
    state.counters["dominated"] = static_cast<double>(r->counts.pruned_dominated);
    state.counters["pruned_bound"] = static_cast<double>(r->counts.pruned_bound);
    state.counters["pruned_encoder"] = static_cast<double>(r->counts.pruned_encoder);
    state.counters["simulated"] = static_cast<double>(r->counts.simulated);
    state.counters["best_s"] = r->top.front().metrics.iteration_time.to_seconds();
  }
}

// LLaVA-1.5-7B (CLIP ViT-L/14-336 + Vicuna-7B) on 64 H100s (examples/default.json).
void BM_Plan_Llava7B_64xH100(benchmark::State& state) {
  run(state, example("default.json"));
}
BENCHMARK(BM_Plan_Llava7B_64xH100)->Unit(benchmark::kMillisecond)->UseRealTime();

// InternViT-6B + Llama-3.1-70B, 8K fused sequence, global batch 1024, on 1024 H100s.
void BM_Plan_InternViT6B_Llama70B_1024xH100(benchmark::State& state) {
  run(state, example("internvit6b-llama70b-1024xh100.json"));
}
BENCHMARK(BM_Plan_InternViT6B_Llama70B_1024xH100)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace
}  // namespace hetpar::planner
