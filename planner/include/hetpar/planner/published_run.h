// PublishedRun: a measured training run from a paper or vendor page (validation/runs/*.json:
// a scenario with a plan plus a "measured" block), and the comparison of hetpar's
// prediction with it. Sources count FLOPs their own way, so every published figure is
// turned into the iteration time it implies under the source's own convention and compared
// as time (like with like); see docs/validation.md.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/scenario.h"

namespace hetpar::planner {

enum class MeasuredMetric { kIterationTime, kTokensPerSecondPerGpu, kTflopsPerGpu, kMfu };

/// How the source counted FLOPs (the TFLOPS and MFU metrics need one).
enum class FlopConvention {
  kNone,          // metric needs no FLOP count (iteration time, tokens/s)
  kMegatron2021,  // Narayanan et al. 2021 eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh), full recompute
  kKorthikanti2022,  // Korthikanti et al. 2022: 72·B·s·l·h²·(1 + s/6h + V/12lh), model FLOPs
  kPalm,             // Chowdhery et al. 2022 (PaLM) app. B: (6·N + 12·l·h·s) per token
  /// Megatron-Core's num_floating_point_operations (megatron/training/training.py,
  /// transformer_flops) for a GPT or MoE LLM without latent attention, per token:
  /// 12·l·h·(dense MLP + top_k routed and shared experts, x1.5 gated, by their layers' share)
  /// + 12·l·h²·(1 + g/a + s/(2h))·(a·d/h) + 6·h·V·(mtp + 1) + 6·mtp·(3h + 2h²): causal
  /// attention as half, GQA, MTP; what Megatron-LM logs as TFLOP/s/GPU.
  kMegatronCore,
};

struct Measurement {
  MeasuredMetric metric = MeasuredMetric::kIterationTime;
  double value = 0;
  FlopConvention convention = FlopConvention::kNone;
  std::string source;  // URL
  std::string where;   // table / row
  std::string notes;
};

struct PublishedRun {
  std::string path;
  Scenario scenario;  // with its plan
  Measurement measured;
};

Result<PublishedRun> load_published_run(const std::string& path);

/// FLOPs of one iteration under `c` for the scenario's LLM. REQUIRES: c != kNone.
Flops convention_flops(const Scenario& s, FlopConvention c);
/// The iteration time the published figure implies.
Time measured_iteration_time(const PublishedRun& run);

struct RunComparison {
  std::string name;
  std::string source;  // the measurement's source document (its URL, without the rendered link)
  int gpus = 0;
  Time measured;
  PlanMetrics predicted;  // predicted.feasible false: no prediction (reason inside)
  /// predicted / measured - 1 (positive: hetpar predicts a slower iteration).
  double error = 0;
};

Result<RunComparison> compare(const PublishedRun& run);
/// compare() of each run, `threads` of them at a time (0: every core): entry i is what
/// compare(runs[i]) gives alone, whatever the thread count.
std::vector<Result<RunComparison>> compare_all(std::span<const PublishedRun> runs, int threads = 0);

/// The error of one source document's runs (only the predicted ones count).
struct SourceSummary {
  std::string source;
  int runs = 0;
  int predicted = 0;
  double mean_abs_error = 0;
  double max_abs_error = 0;
};

/// One summary per distinct RunComparison::source, in order of first appearance.
std::vector<SourceSummary> summarize_by_source(const std::vector<RunComparison>& rows);

}  // namespace hetpar::planner
