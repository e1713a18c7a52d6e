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
// over the world (each simulated rank weighted by its multiplicity).
std::vector<ExposedComm> exposed_by_kind(const sim::TaskGraph& g, const sim::SimResult& r) {
  const int ranks = static_cast<int>(r.ranks.size());
  // Kinds by category label: index into `kinds` (-1: not seen yet).
  std::vector<int> kind_of(static_cast<size_t>(g.num_labels()) + 1, -1);
  std::vector<std::string> kinds;
  std::vector<std::vector<std::vector<Interval>>> comm;  // [kind][rank]
  std::vector<std::vector<Interval>> compute(ranks);
  for (int t = 0; t < g.num_tasks(); ++t) {
    TaskId id(t);
    const sim::Task& task = g.task(id);
    Interval iv{r.tasks[t].start, r.tasks[t].end};
    auto refs = g.streams(id);
    if (task.kind == sim::TaskKind::kCompute) {
      compute[refs[0].rank.value()].push_back(iv);
      continue;
    }
    const size_t c = task.label.category.valid() ? task.label.category.value() : kind_of.size() - 1;
    if (kind_of[c] < 0) {
      std::string_view cat = g.label_text(task.label.category);
      std::string name(is_comm_category(cat) ? cat : "other_comm");
      auto it = std::find(kinds.begin(), kinds.end(), name);
      kind_of[c] = static_cast<int>(it - kinds.begin());
      if (it == kinds.end()) {
        kinds.push_back(name);
        comm.emplace_back(ranks);
      }
    }
    for (const sim::StreamRef& s : refs) comm[kind_of[c]][s.rank.value()].push_back(iv);
  }
  int64_t world = 0;
  for (const sim::RankStats& rs : r.ranks) world += rs.multiplicity;
  for (auto& c : compute) c = merged(std::move(c));
  std::vector<ExposedComm> out;
  for (size_t k = 0; k < kinds.size(); ++k) {
    Time sum;
    for (int rank = 0; rank < ranks; ++rank) {
      if (comm[k][rank].empty()) continue;
      sum += uncovered(merged(std::move(comm[k][rank])), compute[rank]) *
             int64_t{r.ranks[rank].multiplicity};
    }
    out.push_back({kinds[k], Time::ps(sum.count_ps() / world)});
  }
  std::sort(out.begin(), out.end(),
            [](const ExposedComm& a, const ExposedComm& b) { return a.kind < b.kind; });
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
    if (o.enforce_memory) return m;
  }

  // Ranks that share a node's compute units (a CPU host) slow each other only as far as
  // they compute at once, so every rank is simulated (representatives would hide the
  // others' load).
  std::vector<double> node_units;
  for (int n = 0; n < s.cluster.num_nodes(); ++n)
    node_units.push_back(s.cluster.profile_of_node(NodeId(n)).shared_compute_units);
  const bool shared =
      std::any_of(node_units.begin(), node_units.end(), [](double u) { return u > 0; });
  LowerOptions lo;
  lo.full_ranks = o.full_ranks || shared;
  if (o.workspace) lo.reuse = &o.workspace->graph;
  HETPAR_ASSIGN_OR_RETURN(LoweredPlan lowered, lower(s, p, lo));
  sim::SimOptions so;
  so.collectives = collective_config(s.cluster);
  so.record_tasks = o.exposed_by_kind;
  so.host = o.trainer_host;
  if (shared) so.node_compute_units = node_units;
  for (int r = 0; r < lowered.world; ++r) {
    const double slow = s.cluster.profile_of_gpu(r).gpu.collective_overlap_slowdown;
    if (slow > 0 && so.collective_compute_slowdown.empty())
      so.collective_compute_slowdown.assign(static_cast<size_t>(lowered.world), 0.0);
    if (slow > 0) so.collective_compute_slowdown[static_cast<size_t>(r)] = slow;
  }
  HETPAR_ASSIGN_OR_RETURN(sim::SimResult r,
                          sim::simulate(lowered.graph, lowered.network, so, o.trace,
                                        o.workspace ? &o.workspace->sim : nullptr));

  m.feasible = true;
  m.world = lowered.world;
  m.tasks = lowered.graph.num_tasks();
  for (int t = 0; t < lowered.graph.num_tasks(); ++t) {
    const sim::Task& task = lowered.graph.task(TaskId(t));
    if (task.kind != sim::TaskKind::kCompute &&
        lowered.graph.label_text(task.label.category) == "boundary_comm")
      m.boundary_bytes += task.bytes * (1 + int64_t{task.num_copies});  // copies: lower.h
  }
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

  // Means over the world: each simulated rank stands for `multiplicity` ranks.
  Time idle, exposed, host, host_wait, launch_wait;
  int64_t ranks = 0;
  for (const sim::RankStats& rs : r.ranks) {
    if (rs.multiplicity == 0) continue;
    exposed += rs.exposed_comm * int64_t{rs.multiplicity};
    host += rs.host * int64_t{rs.multiplicity};
    host_wait += rs.host_wait * int64_t{rs.multiplicity};
    launch_wait += rs.launch_wait * int64_t{rs.multiplicity};
    idle += (r.makespan - rs.compute - rs.exposed_comm) * int64_t{rs.multiplicity};
    ranks += rs.multiplicity;
  }
  m.exposed_comm = Time::ps(exposed.count_ps() / ranks);
  m.host_busy = Time::ps(host.count_ps() / ranks);
  m.host_wait = Time::ps(host_wait.count_ps() / ranks);
  m.launch_wait = Time::ps(launch_wait.count_ps() / ranks);
  m.bubble_fraction = (idle / r.makespan) / static_cast<double>(ranks);
  for (const sim::CategoryTotal& c : r.categories)
    m.phases.push_back(
        {c.category.empty() ? "other" : c.category, Time::ps(c.rank_time.count_ps() / ranks)});
  if (o.exposed_by_kind) m.exposed_by_kind = exposed_by_kind(lowered.graph, r);
  if (o.workspace) {
    o.workspace->graph = std::move(lowered.graph);
    o.workspace->sim.recycle(std::move(r));
  }
  return m;
}

}  // namespace hetpar::planner
