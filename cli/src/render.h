// Renderings of what the subcommands print: JSON (summary_json.cpp; nlohmann stays there) and
// the text shared by several of them (explain.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetpar/executor/executor.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/published_run.h"
#include "hetpar/planner/search.h"
#include "hetpar/planner/summary.h"

namespace hetpar::cli {

/// The time per rank of one phase (task category) of `m`; zero when absent.
Time phase_time(const planner::PlanMetrics& m, std::string_view phase);
/// The phases whose per-rank time differs most between `a` (the winner) and `b`, as
/// "tp_comm -0.81 s" items, largest first (at most four).
std::vector<std::string> phase_deltas(const planner::PlanMetrics& a, const planner::PlanMetrics& b);
/// Why `a` beats `b`: "per-rank time tp_comm -24.8 ms, ...; bubble -8.1 points".
std::string advantage(const planner::PlanMetrics& a, const planner::PlanMetrics& b);
/// One stage's memory in words: "weights 5.68 GiB, gradients 11.4 GiB, optimizer ..., activations
/// ..., buffers ..., workspace ...".
std::string memory_breakdown_text(const planner::MemoryBreakdown& b);

std::string summary_to_json(const planner::ScenarioSummary& s);
/// simulate --json: the metrics with at least iteration_time_s, tokens_per_s,
/// tflops_per_gpu, mfu, peak_memory_bytes, bubble_fraction and feasible.
std::string metrics_to_json(const planner::Scenario& s, const planner::Plan& p,
                            const planner::PlanMetrics& m);
std::string comparison_to_json(
    const planner::Scenario& s,
    const std::vector<std::pair<std::string, planner::PlanMetrics>>& rows,
    const std::string& winner);
/// within_10: the runs predicted within 10% (the per-run target).
std::string validation_to_json(const std::vector<planner::RunComparison>& rows, double mean_error,
                               double max_error, int within_10);
/// validate --json: scenario, plan, profile, device, predicted and measured iteration time,
/// TFLOPS/GPU, phases (validate's grouping) and task categories, relative errors.
std::string validate_to_json(const planner::Scenario& s, const planner::Plan& p,
                             const std::string& profile, const runtime::DeviceInfo& dev,
                             const planner::PlanMetrics& pred, const executor::Measurement& m);
/// plan --json: best, families, top, counts, rejections, search_time_s, plan_file.
std::string search_to_json(const planner::Scenario& s, const planner::SearchResult& r,
                           const std::string& plan_file);
/// The plan file `plan` writes to `out_path`: the scenario file's JSON without "plans" and
/// "search", with "plan" set to `p`, and profile files the scenario names by a relative
/// path re-pointed from the plan file's directory. Errors name the file when it cannot be
/// read.
Result<std::string> plan_file_text(const std::string& scenario_path, const planner::Plan& p,
                                   const std::string& out_path);
/// The zoo with each entry's parameter count.
std::string zoo_to_json();
/// The built-in profiles in full (the profile file schema, provenance included).
std::string profiles_to_json();

}  // namespace hetpar::cli
