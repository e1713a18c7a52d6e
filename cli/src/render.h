// JSON renderings of what the subcommands print (summary_json.cpp; nlohmann stays there).
#pragma once

#include <string>

#include "hetpar/executor/executor.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/published_run.h"
#include "hetpar/planner/summary.h"

namespace hetpar::cli {

std::string summary_to_json(const planner::ScenarioSummary& s);
/// simulate --json: the metrics with at least iteration_time_s, tokens_per_s,
/// tflops_per_gpu, mfu, peak_memory_bytes, bubble_fraction and feasible.
std::string metrics_to_json(const planner::Scenario& s, const planner::Plan& p,
                            const planner::PlanMetrics& m);
std::string comparison_to_json(
    const planner::Scenario& s,
    const std::vector<std::pair<std::string, planner::PlanMetrics>>& rows,
    const std::string& winner);
std::string validation_to_json(const std::vector<planner::RunComparison>& rows, double mean_error,
                               double max_error);
/// validate --json: scenario, plan, profile, device, predicted and measured iteration time,
/// TFLOPS/GPU, phases (validate's grouping) and task categories, relative errors.
std::string validate_to_json(const planner::Scenario& s, const planner::Plan& p,
                             const std::string& profile, const runtime::DeviceInfo& dev,
                             const planner::PlanMetrics& pred, const executor::Measurement& m);
/// The zoo with each entry's parameter count.
std::string zoo_to_json();
/// The built-in profiles in full (the profile file schema, provenance included).
std::string profiles_to_json();

}  // namespace hetpar::cli
