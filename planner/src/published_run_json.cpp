// Reads validation/runs/*.json: a scenario (with its plan) plus a "measured" block.
#include <filesystem>

#include "hetpar/core/file_io.h"
#include "hetpar/core/json_reader.h"
#include "hetpar/planner/published_run.h"
#include "hetpar/planner/scenario_json.h"

namespace hetpar::planner {

namespace {

Result<Measurement> parse_measurement(const nlohmann::json& j) {
  JsonReader r(j, "measured");
  Measurement m;
  std::string metric = r.required_enum(
      "metric", {"iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"});
  m.value = r.required_double("value", 1e-12);
  std::string conv = r.optional_enum(
      "convention", "none",
      {"none", "tokens", "megatron-2021", "korthikanti-2022", "palm", "megatron-core"});
  m.source = r.required_string("source");
  m.where = r.optional_string("where", "");
  m.notes = r.optional_string("notes", "");
  r.optional_string("flop_convention", "");
  r.finish();
  if (!r.ok()) return r.status();
  m.metric = metric == "iteration_time_s"       ? MeasuredMetric::kIterationTime
             : metric == "tokens_per_s_per_gpu" ? MeasuredMetric::kTokensPerSecondPerGpu
             : metric == "tflops_per_gpu"       ? MeasuredMetric::kTflopsPerGpu
                                                : MeasuredMetric::kMfu;
  m.convention = conv == "megatron-2021"      ? FlopConvention::kMegatron2021
                 : conv == "korthikanti-2022" ? FlopConvention::kKorthikanti2022
                 : conv == "palm"             ? FlopConvention::kPalm
                 : conv == "megatron-core"    ? FlopConvention::kMegatronCore
                                              : FlopConvention::kNone;
  bool needs_flops = m.metric == MeasuredMetric::kTflopsPerGpu || m.metric == MeasuredMetric::kMfu;
  if (needs_flops && m.convention == FlopConvention::kNone)
    return Status::invalid_argument(
        fmt::format("measured.convention: metric \"{}\" needs a FLOP convention (megatron-2021, "
                    "korthikanti-2022, palm or megatron-core)",
                    metric));
  return m;
}

}  // namespace

Result<PublishedRun> load_published_run(const std::string& path) {
  HETPAR_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path));
  if (!j.is_object()) return Status::invalid_argument(fmt::format("{}: expected an object", path));
  auto measured = j.find("measured");
  if (measured == j.end())
    return Status::invalid_argument(fmt::format("{}: measured: missing required object", path));
  auto m = parse_measurement(*measured);
  if (!m.is_ok()) return m.status().with_context(path);
  nlohmann::json scenario = j;
  scenario.erase("measured");
  PublishedRun run;
  run.path = path;
  HETPAR_ASSIGN_OR_RETURN(
      run.scenario,
      parse_scenario(scenario, path, std::filesystem::path(path).parent_path().string()));
  if (!run.scenario.plan)
    return Status::invalid_argument(fmt::format("{}: plan: missing required object", path));
  if (m->convention == FlopConvention::kMegatronCore &&
      std::get<models::LlmSpec>(run.scenario.model.modules[run.scenario.model.llm_index()].spec)
          .block.mla)
    return Status::invalid_argument(fmt::format(
        "{}: measured.convention: megatron-core is modelled for GPT and MoE LLMs without "
        "multi-latent attention (Megatron counts its projections another way)",
        path));
  run.measured = *m;
  return run;
}

}  // namespace hetpar::planner
