// `hetpar plan SCENARIO [--json] [--out FILE] [--threads N] [--top K]`: searches the
// scenario's configurations (planner/search.h), prints the winner, the best plan of each
// placement, the top-k table and why the winner beats the best homogeneous plan, and
// writes the winner as a scenario file with a "plan" section (`hetpar simulate` takes it).
#include <fmt/format.h>

#include <filesystem>

#include "commands.h"
#include "hetpar/core/file_io.h"
#include "hetpar/core/format.h"
#include "hetpar/planner/schedule.h"
#include "hetpar/planner/search.h"
#include "render.h"

namespace hetpar::cli {

namespace {

std::string default_out_path(const std::string& scenario_path) {
  return std::filesystem::path(scenario_path).stem().string() + ".plan.json";
}

void print_row(int rank, const planner::RankedPlan& r) {
  const planner::PlanMetrics& m = r.metrics;
  fmt::print("{:>3} {:>10} {:>9} {:>10.1f} {:>10} {:>7.1f}% {:>10}  {}\n", rank, m.iteration_time,
             format_count(m.tokens_per_s), m.tflops_per_gpu, m.memory.peak, 100 * m.bubble_fraction,
             m.exposed_comm, planner::describe(r.plan));
}

// On a cluster of several node types: which types each module's ranks lie on, e.g.
// "vision on dgx-a100-80gb (ranks 0-31), llm on dgx-h100 (ranks 32-63)", and where the LLM's
// pipeline stages lie on different types, each stage's with its layers ("llm stage 0 (8
// layers) on dgx-a100-80gb (ranks 0-31), stage 1 (24 layers) on dgx-h100 (ranks 32-63)");
// "" on one type.
std::string node_types(const planner::Scenario& s, const planner::Plan& p) {
  const auto& groups = s.cluster.groups();
  if (groups.size() < 2) return "";
  auto types = [&](int first, int count) {
    std::string names;
    const hardware::ClusterSpec::GroupRange r = s.cluster.groups_of_gpus(first, count);
    for (size_t g = r.begin; g < r.end; ++g)
      names += (names.empty() ? "" : " + ") + groups[g].profile.name;
    return names;
  };
  auto on = [&](std::string_view module, int first, int count) {
    return fmt::format("{} on {} (ranks {}-{})", module, types(first, count), first,
                       first + count - 1);
  };
  const planner::Layout& l = p.layout;
  const int first = p.placement == planner::Placement::kNonColocated ? p.llm_first_rank : 0;
  const int stage_ranks = l.tp * l.cp * l.dp;
  bool stages_differ = false;
  for (int st = 1; st < l.pp; ++st)
    stages_differ |= types(first + st * stage_ranks, stage_ranks) != types(first, stage_ranks);
  std::string llm = on("llm", first, l.world());
  if (stages_differ) {
    const auto& spec = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
    const std::vector<int64_t> split =
        planner::layers_per_virtual_stage(l, spec.block.layers, nullptr);
    llm.clear();
    for (int st = 0; st < l.pp; ++st) {
      int64_t layers = 0;
      for (int c = 0; c < l.vpp; ++c) {
        const size_t v = static_cast<size_t>(c * l.pp + st);
        layers += v < split.size() ? split[v] : 0;
      }
      // The homogeneous placement runs the encoders on the LLM's first stage.
      const bool encoders =
          st == 0 && p.placement == planner::Placement::kHomogeneous && s.model.modules.size() > 1;
      llm += fmt::format(
          "{}{}", st == 0 ? "llm " : ", ",
          on(fmt::format("stage {} ({}{} layers)", st, encoders ? "the encoders and " : "", layers),
             first + st * stage_ranks, stage_ranks));
    }
  }
  if (p.placement == planner::Placement::kColocated)
    return "every encoder on " + types(0, s.cluster.total_gpus()) + ", " + llm;
  if (p.placement == planner::Placement::kHomogeneous)
    return stages_differ ? llm : on("every module", 0, s.cluster.total_gpus());
  std::string out;
  for (const planner::ModulePlan& m : p.modules)
    out += on(m.module, m.first_rank, m.layout.world()) + ", ";
  return out + llm;
}

void print_text(const planner::Scenario& s, const planner::SearchResult& r,
                const std::string& out_path) {
  const planner::SearchCounts& c = r.counts;
  fmt::print("Scenario  {} on {} GPUs\n", s.name, s.cluster.total_gpus());
  fmt::print(
      "Searched  {} candidates in {:.2f} s ({} threads): {} rejected by a constraint, {} "
      "dominated, {} pruned by the lower bound, {} encoder layouts pruned, {} simulated\n\n",
      c.considered, r.search_time_s, r.threads, c.rejected, c.pruned_dominated, c.pruned_bound,
      c.pruned_encoder, c.simulated);
  if (c.too_large > 0)
    fmt::print(
        "Skipped   {} plans too large to simulate (over search.max_sim_tasks, {:.1f}M tasks; "
        "raise it in the scenario's \"search\" section to include them)\n\n",
        c.too_large, static_cast<double>(s.search.max_sim_tasks) / 1e6);
  const planner::RankedPlan& w = r.top.front();
  fmt::print("Winner    {}\n", planner::describe(w.plan));
  fmt::print("          {} per iteration, {} tokens/s, {:.1f} TFLOPS/GPU ({:.1f}% MFU), peak {}\n",
             w.metrics.iteration_time, format_count(w.metrics.tokens_per_s),
             w.metrics.tflops_per_gpu, 100 * w.metrics.mfu, w.metrics.memory.peak);
  fmt::print("Written   {} (hetpar simulate takes it)\n\n", out_path);

  fmt::print("Best of each placement\n");
  for (const planner::FamilyResult& f : r.families) {
    if (f.best)
      fmt::print("  {:<14} {:>10}  {}\n", planner::to_string(f.placement),
                 f.best->metrics.iteration_time, planner::describe(f.best->plan));
    else
      fmt::print("  {:<14} {:>10}  {}\n", planner::to_string(f.placement), "none", f.why_none);
  }

  fmt::print("\nTop {}\n{:>3} {:>10} {:>9} {:>10} {:>10} {:>8} {:>10}  {}\n", r.top.size(), "#",
             "iteration", "tokens/s", "TFLOPS/GPU", "peak mem", "bubble", "exposed",
             "configuration");
  for (size_t i = 0; i < r.top.size(); ++i) print_row(static_cast<int>(i + 1), r.top[i]);

  const planner::FamilyResult& homo = r.families[0];
  if (w.plan.placement != planner::Placement::kHomogeneous && homo.best) {
    const planner::PlanMetrics& a = w.metrics;
    const planner::PlanMetrics& b = homo.best->metrics;
    fmt::print("\nWhy the winner beats the best homogeneous plan ({} -> {}, {:.1f}% faster)\n",
               b.iteration_time, a.iteration_time,
               100 * (b.iteration_time / a.iteration_time - 1.0));
    fmt::print("  {}\n", advantage(a, b));
    fmt::print("  exposed communication {} vs {}; peak memory {} vs {}\n", a.exposed_comm,
               b.exposed_comm, a.memory.peak, b.memory.peak);
    if (std::string types = node_types(s, w.plan); !types.empty())
      fmt::print("  node types: {}; the homogeneous plan: {}\n", types,
                 node_types(s, homo.best->plan));
  } else if (w.plan.placement == planner::Placement::kHomogeneous) {
    fmt::print("\nThe best plan is homogeneous");
    for (const planner::FamilyResult& f : r.families)
      if (f.best && f.placement != planner::Placement::kHomogeneous)
        fmt::print("; best {} is {:.1f}% slower ({})", planner::to_string(f.placement),
                   100 * (f.best->metrics.iteration_time / w.metrics.iteration_time - 1.0),
                   advantage(w.metrics, f.best->metrics));
    fmt::print("\n");
    if (std::string types = node_types(s, w.plan); !types.empty())
      fmt::print("  node types: {}\n", types);
  }

  fmt::print("\nMost common rejections\n");
  for (size_t i = 0; i < std::min<size_t>(5, r.rejections.size()); ++i)
    fmt::print("  {:>8}  {}\n", r.rejections[i].count, r.rejections[i].example);
}

}  // namespace

int run_plan(const PlanOptions& opts) {
  auto scenario = planner::load_scenario(opts.path);
  if (!scenario.is_ok()) return report_error(scenario.status());

  planner::SearchOptions so;
  so.threads = opts.threads;
  so.top_k = opts.top;
  double last_report = 0;
  so.progress = [&](const planner::SearchProgress& p) {
    if (p.elapsed_s < 1.0 || p.elapsed_s - last_report < 1.0) return;
    last_report = p.elapsed_s;
    fmt::print(stderr, "hetpar plan: {:.1f} s, {}/{} candidates, {} simulated{}\n", p.elapsed_s,
               p.done, p.candidates, p.simulated,
               p.best ? fmt::format(", best {}", *p.best) : std::string());
  };
  auto result = planner::search(*scenario, so);
  if (!result.is_ok()) return report_error(result.status());
  const planner::SearchResult& r = *result;

  if (r.top.empty()) {
    if (opts.json) fmt::print("{}\n", search_to_json(*scenario, r, ""));
    fmt::print(stderr, "hetpar: no feasible plan among {} candidates ({} rejected)\n",
               r.counts.considered, r.counts.rejected);
    for (size_t i = 0; i < std::min<size_t>(5, r.rejections.size()); ++i)
      fmt::print(stderr, "  {:>8} x {}\n", r.rejections[i].count, r.rejections[i].example);
    for (const planner::FamilyResult& f : r.families)
      fmt::print(stderr, "  {}: {}\n", planner::to_string(f.placement), f.why_none);
    return 3;
  }

  const std::string out_path = opts.out.empty() ? default_out_path(opts.path) : opts.out;
  auto text = plan_file_text(opts.path, r.top.front().plan, out_path);
  if (!text.is_ok()) return report_error(text.status());
  if (Status st = write_file_atomically(out_path, *text); !st.is_ok()) return report_error(st);

  if (opts.json)
    fmt::print("{}\n", search_to_json(*scenario, r, out_path));
  else
    print_text(*scenario, r, out_path);
  return 0;
}

}  // namespace hetpar::cli
