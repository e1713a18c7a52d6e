#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hetpar/core/json_reader.h"
#include "hetpar/hardware/hardware_json.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/models/load.h"
#include "hetpar/models/totals.h"
#include "hetpar/planner/plan_json.h"
#include "render.h"

namespace hetpar::cli {

namespace {
nlohmann::json params_json(const models::ParamCounts& p) {
  return {{"total", p.total}, {"embedding", p.embedding}, {"active", p.active}};
}
}  // namespace

std::string summary_to_json(const planner::ScenarioSummary& s) {
  nlohmann::json modules = nlohmann::json::array();
  for (const auto& m : s.modules) {
    modules.push_back({{"name", m.name},
                       {"kind", models::to_string(m.kind)},
                       {"params", params_json(m.params)},
                       {"layers", m.layers},
                       {"items_per_sample", m.items_per_sample},
                       {"tokens_per_sample", m.tokens_per_sample},
                       {"forward_flops_per_sample", m.forward_per_sample.count()},
                       {"backward_flops_per_sample", m.backward_per_sample.count()},
                       {"activation_bytes_per_layer", m.activations_per_layer.count()},
                       {"activation_bytes_per_sample", m.activations_per_sample.count()}});
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : s.groups) {
    groups.push_back({{"profile", g.profile},
                      {"gpu", g.gpu_model},
                      {"nodes", g.nodes},
                      {"gpus_per_node", g.gpus_per_node},
                      {"peak_flops_per_gpu", g.peak_per_gpu.per_second()},
                      {"slowest_gpu_rate", g.slowest_gpu_rate},
                      {"memory_bytes_per_gpu", g.memory_per_gpu.count()},
                      {"memory_bandwidth_Bps", g.memory_bandwidth_per_gpu.bytes_per_s()},
                      {"intra_node_bandwidth_Bps", g.intra_node_per_gpu.bytes_per_s()},
                      {"nvls", g.nvls},
                      {"nics_per_node", g.nics_per_node},
                      {"nic_bandwidth_Bps", g.nic_bandwidth.bytes_per_s()},
                      {"wan", g.wan ? hardware::wan_to_json(*g.wan) : nlohmann::json()}});
  }
  const planner::Workload& w = s.workload;
  nlohmann::json j = {
      {"scenario", s.name},
      {"model", s.model_name},
      {"workload",
       {{"seq_len", w.seq_len},
        {"global_batch", w.global_batch},
        {"images_per_sample", w.images_per_sample},
        {"audio_clips_per_sample", w.audio_clips_per_sample},
        {"precision", hardware::to_string(w.precision)}}},
      {"modules", modules},
      {"params", params_json(s.total_params)},
      {"model_flops_per_sample", s.model_flops_per_sample.count()},
      {"model_flops_per_iteration", s.model_flops_per_iteration.count()},
      {"llm_tokens_per_iteration", s.llm_tokens_per_iteration},
      {"flop_convention",
       "model FLOPs: GEMMs + attention core, backward = 2x forward, causal attention as half, "
       "no recompute"},
      {"cluster",
       {{"gpus", s.total_gpus},
        {"groups", groups},
        {"peak_flops", s.cluster_peak.per_second()},
        {"ideal_iteration_time_s", s.ideal_iteration_time.to_seconds()}}}};
  return j.dump(2);
}

namespace {
// The memory model's keys: the peak, the tightest stage against its GPUs' capacity, and
// every pipeline stage's breakdown.
nlohmann::json memory_json(const planner::MemoryReport& mem) {
  nlohmann::json stages = nlohmann::json::array();
  for (size_t k = 0; k < mem.per_stage.size(); ++k) {
    const planner::MemoryBreakdown& b = mem.per_stage[k];
    stages.push_back({{"weights", b.weights.count()},
                      {"gradients", b.gradients.count()},
                      {"optimizer_state", b.optimizer_state.count()},
                      {"activations", b.activations.count()},
                      {"communication_buffers", b.communication_buffers.count()},
                      {"workspace", b.workspace.count()},
                      {"total", b.total().count()},
                      {"capacity", mem.stage_capacity[k].count()}});
  }
  return {{"peak_memory_bytes", mem.peak.count()},
          {"peak_memory_stage", mem.peak_stage},
          {"memory_tightest_stage", mem.tightest_stage},
          {"memory_capacity_bytes", mem.capacity().count()},
          {"memory_per_stage", stages}};
}

nlohmann::json metrics_json(const planner::Scenario& s, const planner::Plan& p,
                            const planner::PlanMetrics& m);
}  // namespace

std::string metrics_to_json(const planner::Scenario& s, const planner::Plan& p,
                            const planner::PlanMetrics& m) {
  return metrics_json(s, p, m).dump(2);
}

std::string search_to_json(const planner::Scenario& s, const planner::SearchResult& r,
                           const std::string& plan_file) {
  auto ranked = [&](const planner::RankedPlan& rp) {
    return nlohmann::json{{"configuration", planner::describe(rp.plan)},
                          {"plan", planner::plan_to_json(rp.plan)},
                          {"metrics", metrics_json(s, rp.plan, rp.metrics)}};
  };
  nlohmann::json families = nlohmann::json::object();
  for (const planner::FamilyResult& f : r.families) {
    nlohmann::json fj =
        f.best ? ranked(*f.best) : nlohmann::json{{"plan", nullptr}, {"reason", f.why_none}};
    fj["considered"] = f.considered;
    fj["simulated"] = f.simulated;
    families[std::string(planner::to_string(f.placement))] = fj;
  }
  nlohmann::json top = nlohmann::json::array();
  for (const planner::RankedPlan& rp : r.top) top.push_back(ranked(rp));
  nlohmann::json reasons = nlohmann::json::array();
  for (const planner::RejectionReason& rr : r.rejections)
    reasons.push_back({{"reason", rr.reason}, {"example", rr.example}, {"count", rr.count}});
  return nlohmann::json{
      {"scenario", s.name},
      {"gpus", s.cluster.total_gpus()},
      {"best", r.top.empty() ? nlohmann::json() : ranked(r.top.front())},
      {"families", families},
      {"top", top},
      {"counts",
       {{"considered", r.counts.considered},
        {"rejected", r.counts.rejected},
        {"pruned_dominated", r.counts.pruned_dominated},
        {"pruned_bound", r.counts.pruned_bound},
        {"pruned_encoder", r.counts.pruned_encoder},
        {"too_large", r.counts.too_large},
        {"simulated", r.counts.simulated}}},
      {"rejections", reasons},
      {"search_time_s", r.search_time_s},
      {"threads", r.threads},
      {"plan_file", plan_file.empty() ? nlohmann::json() : nlohmann::json(plan_file)}}
      .dump(2);
}

Result<std::string> plan_file_text(const std::string& scenario_path, const planner::Plan& p,
                                   const std::string& out_path) {
  HETPAR_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(scenario_path));
  j.erase("plans");
  j.erase("search");
  // A profile file named relative to the scenario's directory, named relative to the plan
  // file's (built-in profile names stay).
  namespace fs = std::filesystem;
  const fs::path from = fs::absolute(fs::path(scenario_path)).lexically_normal().parent_path();
  const fs::path to = fs::absolute(fs::path(out_path)).lexically_normal().parent_path();
  const std::vector<std::string> builtins = hardware::builtin_profile_names();
  auto repoint = [&](nlohmann::json& ref) {
    if (!ref.is_string()) return;
    const std::string name = ref.get<std::string>();
    if (std::find(builtins.begin(), builtins.end(), name) != builtins.end()) return;
    if (fs::path(name).is_absolute()) return;
    ref = (from / name).lexically_normal().lexically_relative(to).generic_string();
  };
  if (j.contains("cluster") && j["cluster"].is_object()) {
    nlohmann::json& c = j["cluster"];
    if (c.contains("profile")) repoint(c["profile"]);
    if (c.contains("groups") && c["groups"].is_array())
      for (nlohmann::json& g : c["groups"])
        if (g.is_object() && g.contains("profile")) repoint(g["profile"]);
  }
  j["plan"] = planner::plan_to_json(p);
  return j.dump(2) + "\n";
}

namespace {
nlohmann::json metrics_json(const planner::Scenario& s, const planner::Plan& p,
                            const planner::PlanMetrics& m) {
  nlohmann::json j = {{"scenario", s.name},
                      {"plan", planner::plan_to_json(p)},
                      {"feasible", m.feasible},
                      {"world", m.world}};
  if (!m.feasible) {
    j["infeasible_reason"] = m.infeasible_reason;
    // Refused once its memory was estimated (for memory or later): the breakdown too.
    if (!m.memory.per_stage.empty()) j.update(memory_json(m.memory));
    return j;
  }
  nlohmann::json exposed = nlohmann::json::object();
  for (const auto& e : m.exposed_by_kind) exposed[e.kind] = e.per_rank.to_seconds();
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& ph : m.phases) phases[ph.phase] = ph.per_rank.to_seconds();
  j.update({{"iteration_time_s", m.iteration_time.to_seconds()},
            {"tokens_per_s", m.tokens_per_s},
            {"tflops_per_gpu", m.tflops_per_gpu},
            {"mfu", m.mfu},
            {"flop_convention",
             "model FLOPs of every module: 3x forward, causal attention as half, no recompute"},
            {"model_flops_per_iteration", m.model_flops_per_iteration.count()},
            {"bubble_fraction", m.bubble_fraction},
            {"exposed_comm_s", m.exposed_comm.to_seconds()},
            {"exposed_comm_by_kind_s", exposed},
            {"host_busy_s", m.host_busy.to_seconds()},
            {"host_wait_s", m.host_wait.to_seconds()},
            {"launch_wait_s", m.launch_wait.to_seconds()},
            {"phase_time_per_rank_s", phases},
            {"boundary_bytes", m.boundary_bytes.count()},
            {"micro_batches", m.micro_batches},
            {"tasks", m.tasks}});
  j.update(memory_json(m.memory));
  return j;
}
}  // namespace

std::string comparison_to_json(
    const planner::Scenario& s,
    const std::vector<std::pair<std::string, planner::PlanMetrics>>& rows,
    const std::string& winner) {
  nlohmann::json plans = nlohmann::json::object();
  for (size_t i = 0; i < rows.size(); ++i)
    plans[rows[i].first] =
        nlohmann::json::parse(metrics_to_json(s, s.plans[i].second, rows[i].second));
  return nlohmann::json{{"scenario", s.name}, {"plans", plans}, {"winner", winner}}.dump(2);
}

std::string validation_to_json(const std::vector<planner::RunComparison>& rows, double mean_error,
                               double max_error, int within_10) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json row = {{"name", r.name},
                          {"source", r.source},
                          {"gpus", r.gpus},
                          {"measured_iteration_time_s", r.measured.to_seconds()},
                          {"feasible", r.predicted.feasible}};
    if (r.predicted.feasible) {
      row["predicted_iteration_time_s"] = r.predicted.iteration_time.to_seconds();
      row["error"] = r.error;
      row["predicted_mfu"] = r.predicted.mfu;
      row["predicted_peak_memory_bytes"] = r.predicted.memory.peak.count();
      row["memory_model_fits"] = r.predicted.memory.fits();
    } else {
      row["infeasible_reason"] = r.predicted.infeasible_reason;
    }
    runs.push_back(row);
  }
  nlohmann::json sources = nlohmann::json::array();
  for (const planner::SourceSummary& s : planner::summarize_by_source(rows))
    sources.push_back({{"source", s.source},
                       {"runs", s.runs},
                       {"predicted", s.predicted},
                       {"mean_abs_error", s.mean_abs_error},
                       {"max_abs_error", s.max_abs_error}});
  return nlohmann::json{{"runs", runs},
                        {"sources", sources},
                        {"mean_abs_error", mean_error},
                        {"max_abs_error", max_error},
                        {"within_10_percent", within_10}}
      .dump(2);
}

std::string zoo_to_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const models::ZooEntry& e : models::zoo_entries()) {
    nlohmann::json entry = {
        {"name", e.name}, {"kind", e.kind}, {"description", e.description}, {"source", e.source}};
    if (auto model = models::load_zoo_model(e.name); model.is_ok())
      entry["params"] = params_json(models::count_params(*model));
    else if (auto module = models::load_zoo_module(e.name); module.is_ok())
      entry["params"] = params_json(models::count_params(*module));
    out.push_back(entry);
  }
  return out.dump(2);
}

std::string profiles_to_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& name : hardware::builtin_profile_names()) {
    auto p = hardware::load_profile(name);
    if (p.is_ok()) out.push_back(hardware::profile_to_json(*p));
  }
  return out.dump(2);
}

}  // namespace hetpar::cli
