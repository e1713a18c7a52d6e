// `hetpar validate --json OUT`: the record of one validation run.
#include <nlohmann/json.hpp>

#include "hetpar/executor/executor.h"
#include "hetpar/planner/plan_json.h"
#include "render.h"

namespace hetpar::cli {

namespace {

nlohmann::json phases_json(const std::vector<planner::PhaseTime>& phases) {
  nlohmann::json j = nlohmann::json::object();
  for (const planner::PhaseTime& p : phases) j[p.phase] = p.per_rank.to_seconds();
  return j;
}

double relative(double predicted, double measured) {
  return measured == 0 ? 0 : (predicted - measured) / measured;
}

nlohmann::json kernels_json(const std::vector<executor::KernelTiming>& kernels) {
  nlohmann::json j = nlohmann::json::array();
  for (const executor::KernelTiming& k : kernels)
    j.push_back({{"kind", sim::to_string(k.kind)},
                 {"calls_per_rank", k.calls},
                 {"predicted_s", k.predicted.to_seconds()},
                 {"measured_s", k.measured.to_seconds()},
                 {"relative_error", relative(k.predicted.to_seconds(), k.measured.to_seconds())}});
  return j;
}

}  // namespace

std::string validate_to_json(const planner::Scenario& s, const planner::Plan& p,
                             const std::string& profile, const runtime::DeviceInfo& dev,
                             const planner::PlanMetrics& pred, const executor::Measurement& m) {
  nlohmann::json iterations = nlohmann::json::array();
  for (Time t : m.iterations) iterations.push_back(t.to_seconds());
  const auto pp = executor::group_phases(pred.phases), mp = executor::group_phases(m.phases);
  nlohmann::json phase_errors = nlohmann::json::object();
  for (const planner::PhaseTime& a : pp)
    for (const planner::PhaseTime& b : mp)
      if (a.phase == b.phase)
        phase_errors[a.phase] = relative(a.per_rank.to_seconds(), b.per_rank.to_seconds());
  nlohmann::json j = {
      {"scenario", s.name},
      {"source", s.source},
      {"plan", planner::plan_to_json(p)},
      {"profile", profile},
      {"device",
       {{"backend", dev.backend},
        {"name", dev.name},
        {"versions", dev.versions},
        {"world", dev.world},
        {"hosts", dev.hosts}}},
      {"iterations", m.iterations.size()},
      {"predicted",
       {{"iteration_time_s", pred.iteration_time.to_seconds()},
        {"tflops_per_gpu", pred.tflops_per_gpu},
        {"phases_s", phases_json(pp)},
        {"categories_s", phases_json(pred.phases)}}},
      {"measured",
       {{"iteration_time_s", m.iteration_time.to_seconds()},
        {"iterations_s", iterations},
        {"tflops_per_gpu", m.tflops_per_gpu},
        {"phases_s", phases_json(mp)},
        {"categories_s", phases_json(m.phases)}}},
      {"relative_error",
       {{"iteration_time",
         relative(pred.iteration_time.to_seconds(), m.iteration_time.to_seconds())},
        {"tflops_per_gpu", relative(pred.tflops_per_gpu, m.tflops_per_gpu)},
        {"phases", phase_errors}}},
      {"kernels", kernels_json(m.kernels)},
      {"convention",
       "relative_error = (predicted - measured) / measured; TFLOPS/GPU counts model FLOPs (3x "
       "forward, causal attention as half, no recompute)"}};
  return j.dump(2);
}

}  // namespace hetpar::cli
