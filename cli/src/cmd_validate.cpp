// `hetpar validate FILE [--profile FILE] [--iterations N] [--warmup N] [--backend cpu|cuda]
// [--json OUT] [--kernel-census N]`, run under `mpirun -np WORLD`: executes the scenario's
// plan for real (the per-rank programs the simulator replays, executor/) and prints, on
// rank 0, measured against predicted — iteration time, TFLOPS/GPU, each phase and each
// kind of kernel (the census) — with relative errors.
// The prediction uses the scenario's hardware, or the profile of --profile (e.g. from
// `hetpar calibrate`) for every node. Errors before anything runs: a world size other than
// the plan's, a plan that is infeasible or does not fit the device memory.
#include <fmt/format.h>

#include <cmath>

#include "commands.h"
#include "hetpar/core/file_io.h"
#include "hetpar/core/format.h"
#include "hetpar/executor/executor.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "render.h"

namespace hetpar::cli {

namespace {

// Every node group's profile replaced by `path`'s, keeping the scenario's GPUs per node (the
// world the plan was made for).
Status apply_profile(planner::Scenario& s, const std::string& path) {
  HETPAR_ASSIGN_OR_RETURN(hardware::SystemProfile profile, hardware::load_profile(path));
  std::vector<hardware::NodeGroup> groups = s.cluster.groups();
  for (hardware::NodeGroup& g : groups) {
    const int per_node = g.profile.gpus_per_node;
    g.profile = profile;
    g.profile.gpus_per_node = per_node;
    g.profile_ref = path;
  }
  HETPAR_ASSIGN_OR_RETURN(s.cluster,
                          hardware::ClusterSpec::create(std::move(groups), s.cluster.overrides()));
  return Status::ok();
}

std::string relative(double predicted, double measured) {
  if (measured == 0) return "-";
  return fmt::format("{:+.1f}%", 100 * (predicted - measured) / measured);
}

void print_report(const ValidateOptions& o, const planner::Scenario& s,
                  const runtime::DeviceInfo& dev, const planner::PlanMetrics& pred,
                  const executor::Measurement& m) {
  fmt::print("Validate   {} on {} ranks, {} backend ({})\n", s.name, m.world, dev.backend,
             dev.name);
  fmt::print("Profile    {}\n",
             o.profile.empty() ? std::string("the scenario's cluster") : o.profile);
  fmt::print("Runs       {} warm-up + {} timed iterations; {} tasks; buffer pool {} per rank\n\n",
             o.warmup, o.iterations, m.tasks, m.pool_bytes);
  fmt::print("{:<28} {:>12} {:>12} {:>9}\n", "", "predicted", "measured", "error");
  fmt::print("{:<28} {:>12} {:>12} {:>9}\n", "iteration time", to_string(pred.iteration_time),
             to_string(m.iteration_time),
             relative(pred.iteration_time.to_seconds(), m.iteration_time.to_seconds()));
  fmt::print("{:<28} {:>12.4f} {:>12.4f} {:>9}\n", "TFLOPS/GPU", pred.tflops_per_gpu,
             m.tflops_per_gpu, relative(pred.tflops_per_gpu, m.tflops_per_gpu));
  fmt::print("phases (stream time per rank)\n");
  const auto p = executor::group_phases(pred.phases), q = executor::group_phases(m.phases);
  for (const planner::PhaseTime& ph : p) {
    Time measured;
    for (const planner::PhaseTime& x : q)
      if (x.phase == ph.phase) measured = x.per_rank;
    fmt::print("  {:<26} {:>12} {:>12} {:>9}\n", ph.phase, to_string(ph.per_rank),
               to_string(measured), relative(ph.per_rank.to_seconds(), measured.to_seconds()));
  }
  if (!m.kernels.empty()) {
    fmt::print("kernels (each timed alone, per rank)\n");
    for (const executor::KernelTiming& k : m.kernels)
      fmt::print("  {:<16} {:>7.0f} calls {:>12} {:>12} {:>9}\n", sim::to_string(k.kind), k.calls,
                 to_string(k.predicted), to_string(k.measured),
                 relative(k.predicted.to_seconds(), k.measured.to_seconds()));
  }
  fmt::print(
      "\nTFLOPS/GPU: model FLOPs (3x forward, causal attention as half, no recompute) per "
      "iteration time and rank, as `simulate` counts them. Measured iterations:");
  for (Time t : m.iterations) fmt::print(" {}", t);
  fmt::print("\n");
}

}  // namespace

int run_validate(const ValidateOptions& o) {
  auto scenario = planner::load_scenario(o.path);
  if (!scenario.is_ok()) return report_error(scenario.status());
  if (!scenario->plan)
    return report_error(Status::invalid_argument(fmt::format(
        "{}: plan: missing required object (validate runs the \"plan\" section)", o.path)));
  if (o.iterations < 1 || o.warmup < 0 || o.census_reps < 0)
    return report_error(Status::invalid_argument(
        fmt::format("--iterations {} must be >= 1, --warmup {} and --kernel-census {} >= 0",
                    o.iterations, o.warmup, o.census_reps)));
  if (!o.profile.empty()) {
    Status st = apply_profile(*scenario, o.profile);
    if (!st.is_ok()) return report_error(st);
  }
  const planner::Plan& plan = *scenario->plan;
  auto backend = runtime::make_backend(o.backend);
  if (!backend.is_ok()) return report_error(backend.status());
  runtime::Backend& b = **backend;
  const bool lead = b.info().rank == 0;
  auto fail = [&](const Status& st) { return lead ? report_error(st) : exit_code_for(st); };
  const int world = scenario->cluster.total_gpus();
  if (b.info().world != world)
    return fail(Status::invalid_argument(fmt::format(
        "{}: the plan needs {} ranks but {} processes run it (mpirun -np {} hetpar validate ...)",
        o.path, world, b.info().world, world)));

  // The executor issues its kernels from C++, not from a trainer's Python program: no
  // host cost per call in what it is compared with.
  planner::EvaluateOptions predict;
  predict.trainer_host = false;
  auto predicted = planner::evaluate(*scenario, plan, predict);
  if (!predicted.is_ok()) return fail(predicted.status());
  if (!predicted->feasible) {
    if (lead) fmt::print(stderr, "hetpar: infeasible plan: {}\n", predicted->infeasible_reason);
    return 3;
  }
  if (predicted->memory.peak > b.info().memory) {
    if (lead)
      fmt::print(stderr,
                 "hetpar: the plan does not fit the device: it needs {} per rank, {} has {}\n",
                 predicted->memory.peak, b.info().name, b.info().memory);
    return 3;
  }
  planner::LowerOptions lo;
  lo.full_ranks = true;
  lo.kernels = true;
  auto lowered = planner::lower(*scenario, plan, lo);
  if (!lowered.is_ok()) return fail(lowered.status());
  executor::ExecuteOptions eo;
  eo.warmup = o.warmup;
  eo.iterations = o.iterations;
  eo.census_reps = o.census_reps;
  if (o.census_reps > 0) {
    eo.census_device = &scenario->cluster.profile_of_gpu(b.info().rank).gpu;
    eo.census_precision = scenario->workload.precision;
    eo.census_attention = plan.layout.attention_kernel;
  }
  auto measured = executor::execute(b, *lowered, eo);
  if (!measured.is_ok()) return fail(measured.status());
  if (!lead) return 0;
  print_report(o, *scenario, b.info(), *predicted, *measured);
  if (!o.json_path.empty()) {
    Status st = write_file_atomically(
        o.json_path,
        validate_to_json(*scenario, plan, o.profile, b.info(), *predicted, *measured) + "\n");
    if (!st.is_ok()) return report_error(st);
  }
  return 0;
}

}  // namespace hetpar::cli
