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
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/planner/evaluate.h"
#include "hetpar/planner/lower.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::executor {

struct ExecuteOptions {
  int warmup = 1;
  int iterations = 3;
};

struct Measurement {
  int world = 0;
  Time iteration_time;           // median over timed iterations of the slowest rank's time
  std::vector<Time> iterations;  // every timed iteration (slowest rank)
  double tflops_per_gpu = 0;
  Flops model_flops_per_iteration;
  /// Per task category: stream time summed over ranks / ranks, mean over timed iterations.
  std::vector<planner::PhaseTime> phases;
  int64_t tasks = 0;  // tasks of the whole graph
  Bytes pool_bytes;   // the largest rank's buffer pool
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
