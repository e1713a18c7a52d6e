#include "hetpar/planner/evaluate.h"

#include <algorithm>
#include <map>

#include "hetpar/core/format.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {

namespace {

bool is_comm_category(std::string_view c) {
  return c.size() > 5 && c.ends_with("_comm");
}

struct Interval {
  Time start, end;
};

// Sorts and merges overlapping intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.start <= out.back().end)
      out.back().end = std::max(out.back().end, i.end);
    else
      out.push_back(i);
  }
  return out;
}

// Length of `a` not covered by the merged, sorted intervals `cover`.
Time uncovered(const std::vector<Interval>& a, const std::vector<Interval>& cover) {
  Time total;
  size_t j = 0;
  for (const Interval& i : a) {
    Time t = i.start;
    while (j < cover.size() && cover[j].end <= t) ++j;
    for (size_t k = j; k < cover.size() && cover[k].start < i.end; ++k) {
      if (cover[k].start > t) total += cover[k].start - t;
      t = std::max(t, cover[k].end);
    }
    if (t < i.end) total += i.end - t;
  }
  return total;
}

// Per comm kind, the time its tasks ran on a rank while no compute task did, averaged
// over ranks.
std::vector<ExposedComm> exposed_by_kind(const sim::TaskGraph& g, const sim::SimResult& r,
                                         int world) {
  std::vector<std::vector<Interval>> compute(world);
  std::map<std::string, std::vector<std::vector<Interval>>> comm;
  for (int t = 0; t < g.num_tasks(); ++t) {
    TaskId id(t);
    const sim::Task& task = g.task(id);
    Interval iv{r.tasks[t].start, r.tasks[t].end};
    std::string_view cat = g.label_text(task.label.category);
    bool is_comm = task.kind != sim::TaskKind::kCompute;
    for (const sim::StreamRef& s : g.streams(id)) {
      if (!is_comm) {
        compute[s.rank.value()].push_back(iv);
        continue;
      }
      auto& per_rank = comm[std::string(is_comm_category(cat) ? cat : "other_comm")];
      if (per_rank.empty()) per_rank.resize(world);
      per_rank[s.rank.value()].push_back(iv);
    }
  }
  for (auto& c : compute) c = merged(std::move(c));
  std::vector<ExposedComm> out;
  for (auto& [kind, per_rank] : comm) {
    Time sum;
    for (int rank = 0; rank < world; ++rank)
      sum += uncovered(merged(std::move(per_rank[rank])), compute[rank]);
    out.push_back({kind, Time::ps(sum.count_ps() / world)});
  }
  return out;
}

}  // namespace

Result<PlanMetrics> evaluate(const Scenario& s, const Plan& p, const EvaluateOptions& o) {
  PlanMetrics m;
  m.world = p.layout.world();
  m.micro_batches = num_micro_batches(p.layout, s.workload.global_batch);
  if (std::string why = infeasibility(s, p); !why.empty()) {
    m.infeasible_reason = std::move(why);
    return m;
  }
  m.memory = estimate_memory(s, p);
  if (!m.memory.fits()) {
    m.infeasible_reason =
        fmt::format("out of memory: pipeline stage {} needs {} per GPU, the GPUs have {}",
                    m.memory.peak_stage, m.memory.peak, m.memory.capacity);
    return m;
  }

  HETPAR_ASSIGN_OR_RETURN(LoweredPlan lowered, lower(s, p));
  sim::SimOptions so;
  so.collectives = collective_config(s.cluster);
  so.record_tasks = true;
  HETPAR_ASSIGN_OR_RETURN(sim::SimResult r,
                          sim::simulate(lowered.graph, lowered.network, so, o.trace));

  m.feasible = true;
  m.world = lowered.world;
  m.tasks = lowered.graph.num_tasks();
  m.iteration_time = r.makespan;
  m.model_flops_per_iteration = lowered.model_flops_per_iteration;
  double seconds = r.makespan.to_seconds();
  m.tokens_per_s = static_cast<double>(s.workload.seq_len * s.workload.global_batch) / seconds;
  m.tflops_per_gpu = lowered.model_flops_per_iteration.count() / (seconds * m.world) * 1e-12;
  double peak = 0;  // mean over the GPUs (node groups may differ)
  for (const hardware::NodeGroup& g : s.cluster.groups())
    peak +=
        g.profile.gpu.peak(s.workload.precision).per_second() * g.nodes * g.profile.gpus_per_node;
  m.mfu = m.tflops_per_gpu * 1e12 / (peak / s.cluster.total_gpus());

  Time idle, exposed;
  for (const sim::RankStats& rs : r.ranks) {
    exposed += rs.exposed_comm;
    idle += r.makespan - rs.compute - rs.exposed_comm;
  }
  auto ranks = static_cast<int64_t>(r.ranks.size());
  m.exposed_comm = Time::ps(exposed.count_ps() / ranks);
  m.bubble_fraction = (idle / r.makespan) / static_cast<double>(ranks);
  for (const sim::CategoryTotal& c : r.categories)
    m.phases.push_back(
        {c.category.empty() ? "other" : c.category, Time::ps(c.rank_time.count_ps() / ranks)});
  m.exposed_by_kind = exposed_by_kind(lowered.graph, r, lowered.world);
  return m;
}

}  // namespace hetpar::planner
