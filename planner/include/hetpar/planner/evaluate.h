// evaluate(): predicts one training iteration of a Plan — lowers it to tasks, replays them
// in the simulator, estimates memory — and reports what a user compares plans by:
// iteration time, tokens/s, model TFLOPS/GPU and MFU, peak memory, pipeline bubble,
// exposed communication by kind, and time by phase. An infeasible plan is a result with a
// reason, not an error.
//
// Conventions: model FLOPs count every module's GEMMs and attention core, backward = 2x
// forward (3x forward in all), causal attention as half, recompute not counted. tokens/s
// counts LLM tokens (seq_len x global_batch per iteration). The bubble fraction is the
// mean over ranks of the time a rank neither computes nor waits on exposed communication.
#pragma once

#include <string>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/memory.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/sim/simulate.h"
#include "hetpar/sim/task_graph.h"
#include "hetpar/sim/trace.h"

namespace hetpar::planner {

struct PhaseTime {
  std::string phase;  // a task category: fwd, bwd, wgrad, recompute, optimizer, tp_comm, ...
  Time per_rank;      // stream time of the category summed over ranks / ranks
};

struct ExposedComm {
  std::string kind;  // tp_comm, cp_comm, pp_comm, dp_comm, ep_comm, amax_comm, ...
  Time per_rank;     // mean over ranks of the time only this kind of comm ran (no compute)
};

struct PlanMetrics {
  bool feasible = false;
  std::string infeasible_reason;  // why not, when !feasible
  Time iteration_time;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // model FLOPs / (iteration time x GPUs) / 1e12
  double mfu = 0;             // tflops_per_gpu / peak at the workload's precision
  Flops model_flops_per_iteration;
  MemoryReport memory;
  double bubble_fraction = 0;
  Time exposed_comm;  // mean over ranks
  std::vector<ExposedComm> exposed_by_kind;
  /// Mean over ranks of the host time spent issuing the rank's kernels and calls
  /// (SystemProfile::host_op; zero when the host is not modelled).
  Time host_busy;
  /// Mean over ranks of the host time held by the program's waits for the GPU (sync tasks).
  Time host_wait;
  /// Mean over ranks of the time compute tasks waited on the GPU for their host's launches
  /// (sim::RankStats::launch_wait).
  Time launch_wait;
  std::vector<PhaseTime> phases;
  int world = 0;
  int64_t micro_batches = 0;  // per DP replica
  /// Bytes the boundary communicator moves per iteration (forward and backward, every
  /// transfer, broadcast and gather counted once with its nccl-tests size).
  Bytes boundary_bytes;
  int64_t tasks = 0;  // simulated tasks (one representative rank per stage, lower.h)
};

/// What evaluate() can reuse from one plan to the next on a thread: the task graph's and
/// the simulator's arrays (sim::SimWorkspace). A search keeps one per thread; results do
/// not depend on it. One evaluate() at a time per workspace.
struct Workspace {
  sim::TaskGraph graph;
  sim::SimWorkspace sim;
};

struct EvaluateOptions {
  /// Receives every task's start and end (e.g. a ChromeTraceWriter); may be null.
  sim::TraceSink* trace = nullptr;
  /// Simulate every rank rather than one representative per pipeline stage
  /// (LowerOptions::full_ranks); the metrics are the same where the symmetry holds.
  bool full_ranks = false;
  /// A plan whose memory estimate exceeds the GPUs is infeasible. Off: it is still
  /// simulated (feasible stays true; infeasible_reason keeps the memory verdict), for
  /// runs known to have run, whose time is compared separately from the memory model.
  bool enforce_memory = true;
  /// Exposed communication by kind needs every task's start and end (SimResult::tasks)
  /// and an interval sweep; a search that only ranks plans turns it off and
  /// exposed_by_kind stays empty (everything else is unchanged).
  bool exposed_by_kind = true;
  /// Model the trainer's host (SystemProfile::host_op: a PyTorch program issuing every
  /// kernel from Python). Off for hetpar's own executor, which issues its kernels from C++.
  bool trainer_host = true;
  /// Arrays to reuse (see Workspace); may be null.
  Workspace* workspace = nullptr;
};

/// The longest iteration evaluate() simulates, as model FLOPs over every GPU's peak: a
/// hundredth of integer-picosecond time's range (about 1.07 days), so that even at 1% MFU
/// the clock cannot overflow. Past it a plan is infeasible as too long to simulate.
inline constexpr Time kMaxIterationAtPeak = Time::ps(Time::max().count_ps() / 100);

/// The most tasks (estimated_tasks()) evaluate() simulates: about 6 GB at ~280 bytes a
/// task (Llama 3.1 405B's 512-GPU DGXC layout at 4096 micro-batches per replica: estimated
/// 11.5M, built 24.3M, 6.7 GB). Past it a plan is infeasible as too large to simulate,
/// rather than lowered until the allocator gives up. A search skips plans far smaller
/// (search.max_sim_tasks, 3M by default).
inline constexpr int64_t kMaxSimulatedTasks = 20'000'000;

/// Errors only for internal failures (a graph that does not validate); a plan that does
/// not fit the scenario, the memory or the simulator (kMaxSimulatedTasks) comes back with
/// feasible = false and the reason.
Result<PlanMetrics> evaluate(const Scenario& s, const Plan& p, const EvaluateOptions& o = {});

/// Threads for evaluating plans in parallel (a search, a validation): `requested` when
/// > 0, else every core the machine reports (at least 1).
int evaluation_threads(int requested);

}  // namespace hetpar::planner
