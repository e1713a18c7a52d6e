// `hetpar inspect SCENARIO [--json]`.
#include <fmt/format.h>

#include "commands.h"
#include "hetpar/core/format.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/planner/summary.h"
#include "render.h"

namespace hetpar::cli {

namespace {

void print_text(const planner::ScenarioSummary& s) {
  const planner::Workload& w = s.workload;
  fmt::print("Scenario  {}\n", s.name);
  fmt::print("Model     {} ({} parameters, {} module{})\n", s.model_name,
             format_count(static_cast<double>(s.total_params.total)), s.modules.size(),
             s.modules.size() == 1 ? "" : "s");
  fmt::print(
      "Workload  seq_len {}, global batch {}, images/sample {}, audio clips/sample {}, {}\n\n",
      w.seq_len, w.global_batch, w.images_per_sample, w.audio_clips_per_sample,
      hardware::to_string(w.precision));

  fmt::print("{:<12} {:<15} {:>8} {:>7} {:>6} {:>10} {:>12} {:>12} {:>12} {:>12}\n", "module",
             "kind", "params", "layers", "items", "tokens", "fwd/sample", "bwd/sample", "act/layer",
             "act/sample");
  for (const auto& m : s.modules) {
    fmt::print("{:<12} {:<15} {:>8} {:>7} {:>6} {:>10} {:>12} {:>12} {:>12} {:>12}\n", m.name,
               models::to_string(m.kind), format_count(static_cast<double>(m.params.total)),
               m.layers, m.items_per_sample, m.tokens_per_sample, m.forward_per_sample,
               m.backward_per_sample, m.activations_per_layer, m.activations_per_sample);
  }
  fmt::print(
      "(per sample; model FLOPs = GEMMs + attention core, causal attention as half; "
      "activations without recompute, flash attention)\n\n");
  fmt::print("Model FLOPs per sample     {}\n", s.model_flops_per_sample);
  fmt::print("Model FLOPs per iteration  {} ({} LLM tokens)\n\n", s.model_flops_per_iteration,
             format_count(static_cast<double>(s.llm_tokens_per_iteration)));

  fmt::print("Cluster   {} GPUs\n", s.total_gpus);
  for (const auto& g : s.groups) {
    fmt::print(
        "  {} x {} ({} x {}): {} per GPU ({}), HBM {} at {}, intra-node {} per GPU{}, "
        "{} x {} NICs per node\n",
        g.nodes, g.profile, g.gpus_per_node, g.gpu_model, g.peak_per_gpu,
        hardware::to_string(w.precision), g.memory_per_gpu, g.memory_bandwidth_per_gpu,
        g.intra_node_per_gpu, g.nvls ? " (NVLS)" : "", g.nics_per_node, g.nic_bandwidth);
    if (g.slowest_gpu_rate < 1)
      fmt::print(
          "    GEMMs and attention at {:.1f}% of one GPU's rate: the slowest of the cluster's {} "
          "{} (clock spread {:.2f}%)\n",
          100 * g.slowest_gpu_rate, g.gpus_of_model, g.gpu_model, 100 * g.clock_spread);
    if (g.wan)
      fmt::print("    WAN link per node: up {}, down {}, latency {}\n", g.wan->up, g.wan->down,
                 g.wan->latency);
  }
  fmt::print("  peak {} in all; one iteration at 100% MFU takes {}\n", s.cluster_peak,
             s.ideal_iteration_time);
}

}  // namespace

int run_inspect(const InspectOptions& opts) {
  auto scenario = planner::load_scenario(opts.scenario_path);
  if (!scenario.is_ok()) return report_error(scenario.status());
  planner::ScenarioSummary summary = planner::summarize(*scenario);
  if (opts.json)
    fmt::print("{}\n", summary_to_json(summary));
  else
    print_text(summary);
  return 0;
}

}  // namespace hetpar::cli
