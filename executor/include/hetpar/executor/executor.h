// execute(): runs a lowered plan's per-rank programs for real on a runtime Backend — the
// very TaskGraph the simulator replays (DESIGN.md: one lowering feeds both) — and measures
// it. One process per rank under mpirun; every rank calls execute() with the same plan.
//
// What runs. This rank's tasks in the global issue order (program.h), each on its stream:
// compute tasks run their kernels (sim/kernel.h: GEMMs, attention forward/backward and
// memory-bound copies of the sharded sizes the lowering attached); collectives and P2P run
// on their groups with their byte counts (nccl-tests sizes, sim/task_graph.h: per-rank
// counts derived from them), DP gradients as fp32, everything else as bf16; a "reduce"
// runs as an all-reduce. Buffers come from a pool sized from this rank's largest kernel and
// message (one set for compute, one send/recv pair per comm stream), allocated and filled
// with random values once, not per task. Never a sleep or a synthetic delay: a task takes
// what its kernels and transfers take.
//
// What is measured (backend events): `warmup` iterations, then `iterations` timed ones,
// each started after a barrier. Iteration time: the slowest rank's time from the start to
// its last task's end, the median over timed iterations. Per task category (the lowering's:
// fwd, bwd, enc_fwd, boundary_comm, dp_comm, optimizer, ...), the stream time summed over
// ranks / ranks, as SimResult counts it — except that a blocking collective's time here
// includes waiting for its slowest member. TFLOPS/GPU: the simulator's convention
// (LoweredPlan::model_flops_per_iteration / (iteration time x world)).
//
// Kernel census (optional, after the timed iterations): each rank runs its compute tasks'
// kernels once more, one at a time with an event on either side, and sums their times by
// kind (GEMM, attention forward/backward, memory-bound) next to what the profile predicts
// for the same kernels (planner::kernel_time, the terms the simulator added up). A phase
// that misses says where; the census says which kind of kernel.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/hardware/device_profile.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::executor {

struct ExecuteOptions {
  int warmup = 1;
  int iterations = 3;
  /// Kernel census against this rank's device profile (null: no census) in the workload's
  /// precision, `census_reps` passes, the median pass per kind.
  const hardware::DeviceProfile* census_device = nullptr;
  hardware::Precision census_precision = hardware::Precision::kBf16;
  hardware::AttentionKernel census_attention = hardware::AttentionKernel::kDefault;
  int census_reps = 3;
};

/// One kind of kernel in the census: per rank (mean over ranks), one iteration's worth.
struct KernelTiming {
  sim::KernelKind kind = sim::KernelKind::kGemm;
  double calls = 0;  // kernels run per rank (empty shapes skipped)
  Time predicted;    // the profile's time for those kernels
  Time measured;     // each kernel timed alone, summed
};

struct Measurement {
  int world = 0;
  Time iteration_time;           // median over timed iterations of the slowest rank's time
  std::vector<Time> iterations;  // every timed iteration (slowest rank)
  double tflops_per_gpu = 0;
  Flops model_flops_per_iteration;
  /// Per task category: stream time summed over ranks / ranks, mean over timed iterations.
  std::vector<planner::PhaseTime> phases;
  std::vector<KernelTiming> kernels;  // the census, in KernelKind order; empty without one
  int64_t tasks = 0;                  // tasks of the whole graph
  Bytes pool_bytes;                   // the largest rank's buffer pool
};

/// Lowers nothing: `lp` must come from planner::lower() with full_ranks and kernels on (a
/// compute task without kernels is an error: it would run nothing). Collective over the
/// world: every rank calls it. Errors: the backend's world differs from lp.world; a graph
/// lowered with representatives; backend failures.
Result<Measurement> execute(runtime::Backend& backend, const planner::LoweredPlan& lp,
                            const ExecuteOptions& o = {});

/// The phase a task category belongs to, as `hetpar validate` reports them: "encoder"
/// (enc_*), "boundary", "llm forward" (fwd), "llm backward" (bwd, wgrad, recompute),
/// "dp sync", "optimizer", "tp comm", "cp comm", "pp comm", "ep comm"; else the category.
std::string phase_of(std::string_view category);

/// Category times grouped by phase_of(), in a fixed phase order.
std::vector<planner::PhaseTime> group_phases(const std::vector<planner::PhaseTime>& categories);

}  // namespace hetpar::executor
