// What makes one plan faster than another, for `compare` and `plan`, and a stage's memory in
// words (render.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "hetpar/core/format.h"
#include "render.h"

namespace hetpar::cli {

Time phase_time(const planner::PlanMetrics& m, std::string_view phase) {
  for (const auto& p : m.phases)
    if (p.phase == phase) return p.per_rank;
  return Time::zero();
}

std::vector<std::string> phase_deltas(const planner::PlanMetrics& a,
                                      const planner::PlanMetrics& b) {
  std::map<std::string, bool> names;
  for (const auto& p : a.phases) names[p.phase] = true;
  for (const auto& p : b.phases) names[p.phase] = true;
  std::vector<std::pair<double, std::string>> d;
  for (const auto& [name, _] : names) {
    double delta = (phase_time(a, name) - phase_time(b, name)).to_seconds();
    if (delta != 0) d.emplace_back(delta, name);
  }
  std::sort(d.begin(), d.end(),
            [](const auto& x, const auto& y) { return std::fabs(x.first) > std::fabs(y.first); });
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min<size_t>(4, d.size()); ++i)
    out.push_back(fmt::format("{} {}{}", d[i].second, d[i].first < 0 ? "-" : "+",
                              Time::seconds(std::fabs(d[i].first))));
  return out;
}

std::string memory_breakdown_text(const planner::MemoryBreakdown& b) {
  return fmt::format(
      "weights {}, gradients {}, optimizer {}, activations {}, buffers {}, workspace {}", b.weights,
      b.gradients, b.optimizer_state, b.activations, b.communication_buffers, b.workspace);
}

std::string advantage(const planner::PlanMetrics& a, const planner::PlanMetrics& b) {
  return fmt::format("per-rank time {}; bubble {:+.1f} points", fmt::join(phase_deltas(a, b), ", "),
                     100 * (a.bubble_fraction - b.bubble_fraction));
}

}  // namespace hetpar::cli
