// Kernels of an op: the sharded GEMMs, attention and memory-bound traffic one rank runs
// for one op of a module under a Layout, per pass — what the executor runs for a compute
// task (sim/kernel.h). op_kernels() lives next to op_cost() in cost_model.cpp and shards
// with the same rules (cost_model.h), so the executed work is the work the simulator
// timed: a GEMM op_cost() times as gemm_time(m, n, k, batch) is a kernel of that shape,
// attention_time(flops) an attention kernel of those FLOPs, memory_time(bytes) a memory
// kernel of those bytes.
#pragma once

#include <vector>

#include "hetpar/hardware/precision.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/planner/layout.h"
#include "hetpar/sim/kernel.h"

namespace hetpar::planner {

struct OpKernels {
  std::vector<sim::Kernel> forward, dgrad, wgrad, recompute;
};

/// One op's kernels on one rank under `l` (the arguments of op_cost()).
OpKernels op_kernels(const models::Op& op, const models::OpGraph& g, const Layout& l,
                     bool context_parallel, hardware::Precision p);

}  // namespace hetpar::planner
