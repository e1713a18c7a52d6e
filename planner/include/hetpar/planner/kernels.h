// Kernels of an op: the sharded GEMMs, attention and memory-bound traffic one rank runs
// for one op of a module under a Layout, per pass — what the executor runs for a compute
// task (sim/kernel.h). op_kernels() lives next to op_cost() in cost_model.cpp and shards
// with the same rules (cost_model.h), so the executed work is the work the simulator
// timed: a GEMM op_cost() times as gemm_time(m, n, k, batch) is a kernel of that shape,
// attention_time(flops) an attention kernel of those FLOPs, memory_time(bytes) a memory
// kernel of those bytes.
#pragma once

#include <vector>

#include "hetpar/core/units.h"
#include "hetpar/hardware/device_profile.h"
#include "hetpar/hardware/precision.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/planner/layout.h"
#include "hetpar/sim/kernel.h"
#include "hetpar/sim/task_graph.h"

namespace hetpar::planner {

struct OpKernels {
  std::vector<sim::Kernel> forward, dgrad, wgrad, recompute;
};

/// One op's kernels on one rank under `l` (the arguments of op_cost()).
OpKernels op_kernels(const models::Op& op, const models::OpGraph& g, const Layout& l,
                     bool context_parallel, hardware::Precision p);

/// The time op_cost() gives one kernel on `dev`: gemm_time, attention_time (at the kernel's
/// own key/value length; under a sliding window at a causal call of twice the window's) or
/// memory_time. `p` is the workload precision, which settles what
/// a kernel's element size means (2 bytes: bf16 unless p is fp16; 4 bytes: fp32 unless p
/// is tf32). A compute task's kernels add up to its duration (kernels_test pins it), so an
/// executor can compare kernel by kernel what the simulator assumed. `attention`: the
/// layout's attention kernel (Layout::attention_kernel; REQUIRES: the profile has it).
Time kernel_time(const sim::Kernel& k, const hardware::DeviceProfile& dev, hardware::Precision p,
                 hardware::AttentionKernel attention = hardware::AttentionKernel::kDefault);

/// The distinct GEMM shapes (m, n, k, and whether it adds into an fp32 output) the compute
/// tasks of `g` run (a batched kernel counts as its batch-1 shape), the ones with the most
/// FLOPs over all calls first (ties by shape): what `hetpar calibrate --shapes-from` measures so a
/// profile is exact at a plan's own GEMMs. Empty without kernels (LowerOptions::kernels).
std::vector<sim::Kernel> distinct_gemms(const sim::TaskGraph& g);

}  // namespace hetpar::planner
