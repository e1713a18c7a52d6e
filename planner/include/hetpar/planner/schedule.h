// Pipeline schedules as per-stage programs: the order in which one pipeline rank runs the
// forward (F), backward (B) and, for zero-bubble schedules, deferred weight-gradient (W)
// passes of every micro-batch on every model chunk it holds. A pure function of
// (schedule, stage, pp, vpp, m), shared by lower() and the memory model (micro-batches in
// flight per stage).
//
// - GPipe: all forwards, then all backwards (micro-batch order).
// - 1F1B (PipeDream-flush): pp-stage-1 warm-up forwards, steady one-forward-one-backward,
//   cool-down backwards.
// - Interleaved 1F1B (Megatron-LM): vpp chunks per rank; virtual micro-batch k runs chunk
//   (k / pp) % vpp (backward: vpp-1 minus that) of micro-batch (k / (pp*vpp))*pp + k % pp;
//   warm-up (pp-stage-1)*2 + (vpp-1)*pp virtual forwards. REQUIRES m % pp == 0.
// - ZB-H1 (Qi et al. 2023): the 1F1B order of F and B where B is only the input gradient;
//   each W follows its B, except that stage s keeps up to s W passes pending and runs them
//   at the end, where 1F1B leaves stage s idle for about s backward passes. Micro-batches in
//   flight (F done, W not) peak at pp on every stage: 1F1B's peak (stage 0's).
// Chunk c of stage s is virtual stage c*pp + s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetpar/planner/layout.h"

namespace hetpar::planner {

enum class PassKind : uint8_t { kForward, kBackward, kWeight };

struct PipelineOp {
  PassKind kind = PassKind::kForward;
  int64_t micro_batch = 0;
  int chunk = 0;
  bool operator==(const PipelineOp&) const = default;
};

/// Whether `s` splits the backward into B (input gradient) and W (weight gradient) passes.
bool splits_weight_gradient(Schedule s);

/// The program of pipeline stage `stage` (0-based) of `pp` with `vpp` chunks per stage
/// and `m` micro-batches: every (kind, micro-batch, chunk) exactly once, in run order.
/// REQUIRES: 0 <= stage < pp, m >= 1, vpp >= 1 (vpp > 1 for interleaved, and
/// interleaved_group_ok(pp, m, group); vpp == 1 otherwise). `extra_warmup` (interleaved
/// only): that many more warm-up forwards, as Megatron-Core runs one more under the EP
/// all-to-all overlap (Layout::ep_comm_overlap) so that each steady forward and the
/// backward merged with it are of other micro-batches. `group` (interleaved only; 0 = pp):
/// Layout::microbatch_group, Megatron-Core's schedule table (get_schedule_table): the
/// micro-batches in groups of `group`, the last one taking the rest, each group's through
/// chunk 0, then chunk 1, ...; (vpp - 1) x group warm-up forwards besides 2(pp - stage - 1).
std::vector<PipelineOp> stage_order(Schedule s, int stage, int pp, int vpp, int64_t m,
                                    int extra_warmup = 0, int64_t group = 0);
/// Whether the interleaved schedule runs `m` micro-batches in groups of `group` (0 = pp) on
/// `pp` stages, as Megatron-Core checks: pp <= group <= m, and the last group's remainder
/// m % group 0 or at least pp (with the default group: m % pp == 0).
bool interleaved_group_ok(int pp, int64_t m, int64_t group);
/// The smallest micro-batch group with which the interleaved schedule runs `m` micro-batches
/// on `pp` stages (interleaved_group_ok): pp, Megatron-Core's default, where it divides m,
/// else the smallest larger one whose last group is at least pp; 0 where none is (m < pp).
/// The fewest forwards held in flight that Megatron-Core accepts for this m.
int64_t smallest_interleaved_group(int pp, int64_t m);

/// One communication call of a stage that runs its pipeline transfers blocking
/// (Layout::pp_blocking_p2p): issued once the op it follows has ended, it sends the outputs
/// of the ops assigned to it and receives the inputs of the ops assigned to it, and the op
/// after it starts only when all of them have completed. A transfer moves once both its
/// sender's and its receiver's calls are issued (NCCL's send waits for the posted receive).
struct PipelineCall {
  int32_t after_op = -1;     // the op it follows; -1: before the first
  bool sends_first = false;  // two calls back to back: its one send (the output of
                             // `after_op`) completes before its receive is posted
};
struct PipelineCalls {
  std::vector<PipelineCall> calls;  // in program order
  std::vector<int32_t> send_call;   // per op: the call that sends its output
  std::vector<int32_t> recv_call;   // per op: the call that receives its input
};

/// The calls Megatron-LM's schedules make around `order` (stage_order of `s`), from its
/// schedules.py. Non-interleaved (1F1B, and any other order alike): a call after every op
/// and one before the first; between two ops of one kind a send_forward (send_backward) and then a
/// recv_forward (recv_backward), else one combined send_forward_recv_backward or
/// send_backward_recv_forward. Interleaved: one combined call before the first op and after
/// every op except a forward followed by a backward (the steady state's
/// send_forward_backward_recv_forward_backward follows the pair); each op's output goes in
/// the first call after it, its input comes in the last call before it, except on the
/// interleaved schedule's leading stage (`stage` of `pp`: the first stage forward, the last
/// backward), whose inputs from the other end of the pipeline (a chunk's first virtual
/// stage) come as soon as that end sends them: Megatron-Core's
/// recv_tensor_from_previous_stage receives, in the call after the leading stage's virtual
/// micro-batch k, what the ending stage produced at k - (pp - 1), queued until used. With
/// the default micro-batch groups (pp) that is the call before the op; with larger groups
/// (Layout::microbatch_group) an earlier one.
PipelineCalls blocking_calls(Schedule s, const std::vector<PipelineOp>& order, int stage = 0,
                             int pp = 1);

/// Whether Megatron-Core's combined 1F1B (Layout::ep_comm_overlap) can merge forward and
/// backward passes of schedule `s`: the interleaved one, or 1F1B without a pipeline.
bool merges_passes(Schedule s, int pp);
/// The extra warm-up forwards stage_order() runs for layout `l`: one under the EP
/// all-to-all overlap (Megatron-Core's num_warmup_microbatches += 1), else none.
int extra_warmup(const Layout& l);
/// The interleaved schedule's micro-batch group of layout `l`: Layout::microbatch_group, or pp.
int64_t microbatch_group(const Layout& l);

/// Most micro-batch chunks whose forward ran and whose last backward pass (B, or W when the
/// schedule splits it) has not, over the program: the activations the stage holds at peak.
int64_t peak_in_flight(const std::vector<PipelineOp>& order);

/// Transformer layers of each virtual stage v = chunk * pp + stage (pp * vpp entries) when
/// `layers` split under `l` (Megatron-LM): as pipeline_layout lists them; evenly; or with
/// first/last_stage_layers, stage 0
/// and / or stage pp-1 hold that many and the other stages share the rest evenly, each
/// stage's layers split evenly over its vpp chunks; or with account_for_embedding / _loss,
/// layers + 1 (+ 1) split evenly over the virtual stages, the first one giving a layer's
/// place to the embedding, the last one to the output layer and loss. Empty with `why`
/// set when the split is impossible.
std::vector<int64_t> layers_per_virtual_stage(const Layout& l, int64_t layers, std::string* why);

}  // namespace hetpar::planner
