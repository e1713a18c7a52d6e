#include "hetpar/planner/published_run.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "hetpar/core/check.h"
#include "hetpar/models/totals.h"

namespace hetpar::planner {

Flops convention_flops(const Scenario& s, FlopConvention c) {
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
  const double B = static_cast<double>(s.workload.global_batch);
  const double seq = static_cast<double>(s.workload.seq_len);
  const double l = static_cast<double>(llm.block.layers);
  const double h = static_cast<double>(llm.block.hidden);
  const double V = static_cast<double>(llm.vocab);
  switch (c) {
    case FlopConvention::kMegatron2021:
      return Flops(96.0 * B * seq * l * h * h * (1 + seq / (6 * h) + V / (16 * l * h)));
    case FlopConvention::kKorthikanti2022:
      return Flops(72.0 * B * seq * l * h * h * (1 + seq / (6 * h) + V / (12 * l * h)));
    case FlopConvention::kPalm: {
      double n = static_cast<double>(models::count_params(s.model).total);
      return Flops((6.0 * n + 12.0 * l * h * seq) * B * seq);
    }
    case FlopConvention::kMegatronCore: {
      const models::TransformerSpec& b = llm.block;
      const double glu = models::is_gated(b.activation) ? 1.5 : 1.0;
      const double mtp = static_cast<double>(llm.mtp_layers), layers = l + mtp;
      // Megatron counts MTP depths as layers of the last layer's kind.
      double moe_layers = 0, mlp = 0;
      if (llm.moe) {
        const models::MoeSpec& m = *llm.moe;
        moe_layers = static_cast<double>(b.layers - m.dense_layer_count(b.layers));
        if (!m.dense_layer(b.layers - 1, b.layers)) moe_layers += mtp;
        mlp = static_cast<double>(m.expert_ffn_hidden * (m.top_k + m.shared_experts)) * glu *
              moe_layers / layers;
      }
      mlp += static_cast<double>(b.ffn_hidden) * glu * (layers - moe_layers) / layers;
      const double a = static_cast<double>(b.heads), g = static_cast<double>(b.kv_heads);
      const double q_ratio = a * static_cast<double>(b.head_dim()) / h;
      const double attention = 12.0 * layers * h * h * (1 + g / a + seq / h / 2) * q_ratio;
      const double mtp_proj = 6.0 * mtp * (3 * h + 2 * h * h);
      return Flops(B * seq *
                   (12.0 * layers * h * mlp + attention + mtp_proj + 6.0 * h * V * (mtp + 1)));
    }
    case FlopConvention::kNone:
      break;
  }
  HETPAR_CHECK(false, "convention_flops needs a FLOP convention");
  return Flops();
}

Time measured_iteration_time(const PublishedRun& run) {
  const Scenario& s = run.scenario;
  const double gpus = s.cluster.total_gpus();
  const Measurement& m = run.measured;
  switch (m.metric) {
    case MeasuredMetric::kIterationTime:
      return Time::seconds(m.value);
    case MeasuredMetric::kTokensPerSecondPerGpu:
      return Time::seconds(static_cast<double>(s.workload.seq_len * s.workload.global_batch) /
                           (m.value * gpus));
    case MeasuredMetric::kTflopsPerGpu:
      return Time::seconds(convention_flops(s, m.convention).count() / (m.value * 1e12 * gpus));
    case MeasuredMetric::kMfu: {
      double peak = s.cluster.profile_of_gpu(0).gpu.peak(s.workload.precision).per_second();
      return Time::seconds(convention_flops(s, m.convention).count() / (m.value * peak * gpus));
    }
  }
  return Time();
}

Result<RunComparison> compare(const PublishedRun& run) {
  RunComparison c;
  c.name = run.scenario.name;
  c.source = run.measured.source.substr(0, run.measured.source.find(" ("));
  c.gpus = run.scenario.cluster.total_gpus();
  c.measured = measured_iteration_time(run);
  // The run really ran: its time is compared even when the memory model disagrees.
  EvaluateOptions o;
  o.enforce_memory = false;
  o.exposed_by_kind = false;  // only the iteration time is compared
  HETPAR_ASSIGN_OR_RETURN(c.predicted, evaluate(run.scenario, *run.scenario.plan, o));
  if (c.predicted.feasible) c.error = c.predicted.iteration_time / c.measured - 1.0;
  return c;
}

std::vector<Result<RunComparison>> compare_all(std::span<const PublishedRun> runs, int threads) {
  std::vector<std::optional<Result<RunComparison>>> out(runs.size());
  tbb::task_arena arena(evaluation_threads(threads));
  // One run per task: a run's evaluation shares nothing with another's.
  arena.execute([&] {
    tbb::parallel_for(size_t{0}, runs.size(), [&](size_t i) { out[i] = compare(runs[i]); });
  });
  std::vector<Result<RunComparison>> results;
  results.reserve(runs.size());
  for (auto& r : out) results.push_back(std::move(*r));
  return results;
}

std::vector<SourceSummary> summarize_by_source(const std::vector<RunComparison>& rows) {
  std::vector<SourceSummary> out;
  for (const RunComparison& r : rows) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const SourceSummary& s) { return s.source == r.source; });
    if (it == out.end()) it = out.insert(out.end(), SourceSummary{.source = r.source});
    ++it->runs;
    if (!r.predicted.feasible) continue;
    ++it->predicted;
    it->mean_abs_error += std::fabs(r.error);  // a sum until the end
    it->max_abs_error = std::max(it->max_abs_error, std::fabs(r.error));
  }
  for (SourceSummary& s : out)
    if (s.predicted) s.mean_abs_error /= s.predicted;
  return out;
}

}  // namespace hetpar::planner
