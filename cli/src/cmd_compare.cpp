// `hetpar compare FILE [--json]`: predicts each plan of the scenario's "plans" section and
// puts them side by side, with what makes the fastest one fast.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "commands.h"
#include "hetpar/core/format.h"
#include "hetpar/planner/evaluate.h"
#include "render.h"

namespace hetpar::cli {

int run_compare(const CompareOptions& opts) {
  auto scenario = planner::load_scenario(opts.path);
  if (!scenario.is_ok()) return report_error(scenario.status());
  if (scenario->plans.empty())
    return report_error(Status::invalid_argument(fmt::format(
        "{}: plans: missing required object (compare needs named plans, see docs/scenario.md)",
        opts.path)));
  std::vector<std::pair<std::string, planner::PlanMetrics>> rows;
  for (const auto& [name, plan] : scenario->plans) {
    auto m = planner::evaluate(*scenario, plan);
    if (!m.is_ok()) return report_error(m.status().with_context("plans." + name));
    rows.emplace_back(name, std::move(m).value());
  }
  const std::pair<std::string, planner::PlanMetrics>* best = nullptr;
  for (const auto& r : rows)
    if (r.second.feasible && (!best || r.second.iteration_time < best->second.iteration_time))
      best = &r;

  if (opts.json) {
    fmt::print("{}\n", comparison_to_json(*scenario, rows, best ? best->first : ""));
    return best ? 0 : 3;
  }
  fmt::print("Scenario  {} on {} GPUs\n\n", scenario->name, scenario->cluster.total_gpus());
  size_t width = 16;  // the plan column fits the longest name
  for (const auto& r : rows) width = std::max(width, r.first.size() + 1);
  fmt::print("{:<{}} {:>11} {:>10} {:>11} {:>7} {:>11} {:>8} {:>11} {:>10}\n", "plan", width,
             "iteration", "tokens/s", "TFLOPS/GPU", "MFU", "peak mem", "bubble", "exposed",
             "boundary");
  for (const auto& [name, m] : rows) {
    if (!m.feasible) {
      fmt::print("{:<{}} infeasible: {}\n", name, width, m.infeasible_reason);
      if (!m.memory.per_stage.empty() && !m.memory.fits())  // what does not fit
        fmt::print("{:<{}} stage {}: {}\n", "", width, m.memory.tightest_stage,
                   memory_breakdown_text(m.memory.per_stage[m.memory.tightest_stage]));
      continue;
    }
    fmt::print("{:<{}} {:>11} {:>10} {:>11.1f} {:>6.1f}% {:>11} {:>7.1f}% {:>11} {:>10}\n", name,
               width, m.iteration_time, format_count(m.tokens_per_s), m.tflops_per_gpu, 100 * m.mfu,
               m.memory.peak, 100 * m.bubble_fraction, m.exposed_comm, m.boundary_bytes);
  }
  if (!best) {
    fmt::print(stderr, "hetpar: no plan is feasible\n");
    return 3;
  }
  fmt::print("\nTime by phase (stream time per rank)\n{:<16}", "phase");
  std::map<std::string, bool> phases;
  std::vector<size_t> widths;  // a column is as wide as its plan's name, at least 12
  for (const auto& [name, m] : rows) {
    widths.push_back(std::max<size_t>(12, name.size()));
    fmt::print(" {:>{}}", name, widths.back());
    for (const auto& p : m.phases) phases[p.phase] = true;
  }
  fmt::print("\n");
  for (const auto& [phase, _] : phases) {
    fmt::print("{:<16}", phase);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& m = rows[i].second;
      fmt::print(" {:>{}}", m.feasible ? to_string(phase_time(m, phase)) : "-", widths[i]);
    }
    fmt::print("\n");
  }
  fmt::print("\nWinner: {} ({})\n", best->first, best->second.iteration_time);
  for (const auto& [name, m] : rows) {
    if (&m == &best->second || !m.feasible) continue;
    double gain = m.iteration_time / best->second.iteration_time - 1.0;
    fmt::print("  vs {}: {:.1f}% faster; {}\n", name, 100 * gain, advantage(best->second, m));
  }
  return 0;
}

}  // namespace hetpar::cli
