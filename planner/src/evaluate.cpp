#include "hetpar/planner/evaluate.h"

#include <algorithm>
#include <map>
#include <thread>

#include "hetpar/core/format.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/network_builder.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {

namespace {

bool is_comm_category(std::string_view c) {
  return c.size() > 5 && c.ends_with("_comm");
}

// The comm kinds exposure is reported by: each category named "*_comm" is its own kind,
// every other category (and none) counts as "other_comm". Fills `so`'s map and returns
// the kinds' names by index.
std::vector<std::string> comm_kinds(const sim::TaskGraph& g, sim::SimOptions& so) {
  std::vector<std::string> kinds;
  so.comm_kind_of_category.resize(static_cast<size_t>(g.num_labels()) + 1);
  for (int c = 0; c <= g.num_labels(); ++c) {
    std::string_view cat = c < g.num_labels() ? g.label_text(sim::LabelId(c)) : "";
    std::string_view name = is_comm_category(cat) ? cat : "other_comm";
    auto it = std::find(kinds.begin(), kinds.end(), name);
    if (it == kinds.end()) it = kinds.emplace(kinds.end(), name);
    so.comm_kind_of_category[c] = static_cast<int32_t>(it - kinds.begin());
  }
  return kinds;
}

// Per comm kind the graph has, the time its tasks ran on a rank while no compute task did,
// averaged over the world (each simulated rank weighted by its multiplicity).
std::vector<ExposedComm> exposed_by_kind(const std::vector<std::string>& kinds,
                                         const sim::SimResult& r) {
  int64_t world = 0;
  for (const sim::RankStats& rs : r.ranks) world += rs.multiplicity;
  std::vector<ExposedComm> out;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (r.comm_kind_tasks[k] == 0) continue;
    Time sum;
    for (const sim::RankStats& rs : r.ranks)
      sum += rs.exposed_by_kind[k] * int64_t{rs.multiplicity};
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
  const bool shared = ranks_share_compute(s);  // then every rank is simulated
  LowerOptions lo;
  lo.full_ranks = o.full_ranks || shared;
  // A graph past kMaxSimulatedTasks would exhaust memory before its first event. Checked
  // before the memory estimate, which walks a heterogeneous plan's schedule one
  // micro-batch at a time (a billion-sample batch took 68 s and 12 GB to get there).
  if (const double tasks = estimated_tasks(s, p, lo.full_ranks);
      tasks > static_cast<double>(kMaxSimulatedTasks)) {
    m.infeasible_reason = fmt::format(
        "too large to simulate: about {:.0f}M tasks ({} micro-batches per replica{}), over the "
        "simulator's limit of {}M; a smaller global_batch or a larger micro_batch x dp fits",
        tasks / 1e6, m.micro_batches, lo.full_ranks ? ", every rank simulated" : "",
        kMaxSimulatedTasks / 1'000'000);
    return m;
  }
  m.memory = estimate_memory(s, p);
  if (!m.memory.fits()) {
    m.infeasible_reason =
        fmt::format("out of memory: pipeline stage {} needs {} per GPU, the GPUs have {}",
                    m.memory.tightest_stage, m.memory.tightest(), m.memory.capacity());
    if (o.enforce_memory) return m;
  }
  if (o.workspace) lo.reuse = &o.workspace->graph;
  HETPAR_ASSIGN_OR_RETURN(LoweredPlan lowered, lower(s, p, lo));
  double peak = 0;  // FLOP/s of every GPU together (node groups may differ)
  for (const hardware::NodeGroup& g : s.cluster.groups())
    peak +=
        g.profile.gpu.peak(s.workload.precision).per_second() * g.nodes * g.profile.gpus_per_node;
  // Integer-picosecond time spans about 106 days. An iteration that needs more than a
  // hundredth of that even with every GPU at its peak would overflow the simulator's clock
  // at a low MFU, so it is refused before it runs.
  if (const double at_peak = lowered.model_flops_per_iteration.count() / peak;
      !(at_peak <= kMaxIterationAtPeak.to_seconds())) {
    m.infeasible_reason = fmt::format(
        "too long to simulate: one iteration needs {:.3g} s even with every GPU at its peak, over "
        "the simulator's limit of {:.3g} s (its clock spans {:.0f} days)",
        at_peak, kMaxIterationAtPeak.to_seconds(), Time::max().to_seconds() / 86400);
    return m;
  }
  sim::SimOptions so;
  so.collectives = collective_config(s.cluster);
  std::vector<std::string> kinds;
  if (o.exposed_by_kind) kinds = comm_kinds(lowered.graph, so);
  so.host = o.trainer_host;
  if (shared)
    for (int n = 0; n < s.cluster.num_nodes(); ++n)
      so.node_compute_units.push_back(s.cluster.profile_of_node(NodeId(n)).shared_compute_units);
  // Compute beside NCCL's collectives, per rank from its GPU's profile (none: left empty).
  auto per_rank = [&](std::vector<double>& out, auto&& of) {
    for (int r = 0; r < lowered.world; ++r) {
      const double x = of(s.cluster.profile_of_gpu(r));
      if (x > 0 && out.empty()) out.assign(static_cast<size_t>(lowered.world), 0.0);
      if (x > 0) out[static_cast<size_t>(r)] = x;
    }
  };
  per_rank(so.collective_compute_slowdown,
           [](const hardware::SystemProfile& p) { return p.gpu.collective_overlap_slowdown; });
  per_rank(so.cross_node_collective_compute_slowdown,
           [](const hardware::SystemProfile& p) { return p.cross_node_collective_slowdown(); });
  // Beside collectives from NCCL-registered buffers (Layout::nccl_ub; only plans with such
  // buffers have them): the SMs their kernels hold (a profile without figures gives the
  // unregistered slowdowns).
  bool registers = p.layout.nccl_ub;
  for (const ModulePlan& mp : p.modules) registers = registers || mp.layout.nccl_ub;
  if (registers)
    so.registered_collective_compute_slowdown.resize(static_cast<size_t>(lowered.world));
  for (size_t r = 0; r < so.registered_collective_compute_slowdown.size(); ++r) {
    const hardware::SystemProfile& gpu = s.cluster.profile_of_gpu(static_cast<int>(r));
    so.registered_collective_compute_slowdown[r] = {
        .in_node_gather = gpu.registered_collective_slowdown(true, true),
        .in_node_reduce = gpu.registered_collective_slowdown(true, false),
        .one_per_node_gather = gpu.registered_collective_slowdown(false, true),
        .one_per_node_reduce = gpu.registered_collective_slowdown(false, false)};
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
  if (o.exposed_by_kind) m.exposed_by_kind = exposed_by_kind(kinds, r);
  if (o.workspace) {
    o.workspace->graph = std::move(lowered.graph);
    o.workspace->sim.recycle(std::move(r));
  }
  return m;
}

int evaluation_threads(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace hetpar::planner
