// `hetpar validation [DIR] [--json] [--max-mean-error X] [--max-error Y]`: predicts every
// published run in DIR (validation/runs by default) and prints predicted vs measured
// iteration time. With bounds given, exits 4 when the suite misses them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "commands.h"
#include "hetpar/core/format.h"
#include "hetpar/planner/published_run.h"
#include "render.h"

namespace hetpar::cli {

int run_validation(const ValidationOptions& opts) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(opts.dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  if (ec) return report_error(Status::io_error(fmt::format("{}: {}", opts.dir, ec.message())));
  if (files.empty())
    return report_error(
        Status::invalid_argument(fmt::format("{}: no run files (*.json)", opts.dir)));
  std::sort(files.begin(), files.end());

  std::vector<planner::PublishedRun> runs;
  for (const std::string& f : files) {
    auto run = planner::load_published_run(f);
    if (!run.is_ok()) return report_error(run.status());
    runs.push_back(std::move(run).value());
  }
  std::vector<planner::RunComparison> rows;
  std::vector<Result<planner::RunComparison>> compared = planner::compare_all(runs, opts.threads);
  for (size_t i = 0; i < compared.size(); ++i) {
    if (!compared[i].is_ok()) return report_error(compared[i].status().with_context(files[i]));
    rows.push_back(std::move(compared[i]).value());
  }

  double sum = 0, worst = 0;
  int predicted = 0, within_10 = 0;  // the per-run target: |error| <= 10%
  for (const auto& r : rows) {
    if (!r.predicted.feasible) continue;
    ++predicted;
    sum += std::fabs(r.error);
    worst = std::max(worst, std::fabs(r.error));
    if (std::fabs(r.error) <= 0.10) ++within_10;
  }
  double mean = predicted ? sum / predicted : 0;

  if (opts.json) {
    fmt::print("{}\n", validation_to_json(rows, mean, worst, within_10));
  } else {
    fmt::print("{:<52} {:>6} {:>11} {:>11} {:>8} {:>7}\n", "run", "GPUs", "measured", "predicted",
               "error", "MFU");
    for (const auto& r : rows) {
      if (!r.predicted.feasible) {
        fmt::print("{:<52} {:>6} {:>11} {:>11}  infeasible: {}\n", r.name, r.gpus, r.measured, "-",
                   r.predicted.infeasible_reason);
        continue;
      }
      fmt::print("{:<52} {:>6} {:>11} {:>11} {:>+7.1f}% {:>6.1f}% {}\n", r.name, r.gpus, r.measured,
                 r.predicted.iteration_time, 100 * r.error, 100 * r.predicted.mfu,
                 r.predicted.memory.fits()
                     ? ""
                     : fmt::format("(memory model: {} > {} by {})", r.predicted.memory.tightest(),
                                   r.predicted.memory.capacity(),
                                   r.predicted.memory.tightest() - r.predicted.memory.capacity()));
    }
    fmt::print(
        "\n{} runs, {} predicted: mean |error| {:.1f}%, max |error| {:.1f}%, {} within 10%\n",
        rows.size(), predicted, 100 * mean, 100 * worst, within_10);
    fmt::print(
        "(iteration time per run; each published figure converted to time under its "
        "source's FLOP convention, see docs/validation.md)\n");
    fmt::print("\nBy source {:>5} {:>8} {:>8}\n", "runs", "mean", "max");
    for (const planner::SourceSummary& s : planner::summarize_by_source(rows))
      fmt::print("{:>15} {:>7.1f}% {:>7.1f}%  {}\n",
                 s.predicted == s.runs ? fmt::format("{}", s.runs)
                                       : fmt::format("{}/{}", s.predicted, s.runs),
                 100 * s.mean_abs_error, 100 * s.max_abs_error, s.source);
  }
  bool missed = (opts.max_mean_error > 0 && mean > opts.max_mean_error) ||
                (opts.max_error > 0 && worst > opts.max_error) ||
                (opts.max_error > 0 && predicted < static_cast<int>(rows.size()));
  if (missed) {
    fmt::print(stderr,
               "hetpar: validation bounds missed: mean {:.1f}% (bound {:.1f}%), max {:.1f}% "
               "(bound {:.1f}%), {} of {} runs predicted\n",
               100 * mean, 100 * opts.max_mean_error, 100 * worst, 100 * opts.max_error, predicted,
               rows.size());
    return 4;
  }
  return 0;
}

}  // namespace hetpar::cli
