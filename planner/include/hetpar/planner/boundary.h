// The boundary between an encoder (with its projector) and the LLM under a heterogeneous
// placement (research/paper-heteropar.md): which encoder data-parallel replica feeds which
// LLM micro-batch, and how many bytes cross.
//
// Data mapping. Per encoder step (one encoder micro-batch on every encoder DP replica) each
// LLM DP replica d consumes c = enc_micro_batch * enc_dp / llm_dp samples, k = c /
// llm_micro_batch LLM micro-batches: LLM micro-batch i of replica d comes from encoder step
// i / k. Fan-in (enc_dp = r * llm_dp): encoder replicas d*r .. d*r+r-1 feed replica d, the
// j-th LLM micro-batch of a step (j = i % k) from replica d*r + j*llm_mb/enc_mb (concatenation
// along the batch). Fan-out (llm_dp = r * enc_dp): encoder replica d / r feeds replica d with
// one slice of its output (split along the batch). Equal: replica d feeds replica d.
// Colocated, when the encoder's tp divides the LLM's tp x cp, LLM replica d is fed by the
// encoder replicas on its own GPUs (every pipeline stage's tp x cp block of replica d, in
// stage order): with LLM pp 1 that is the fan-in order above; with pp > 1 (three phases) it
// keeps every replica's boundary traffic alike (and local to the replica's GPUs), where the
// order above would feed replica d from the GPUs of other replicas' stages.
//
// Bytes: the projector's output of one LLM micro-batch, llm_mb * V * H * bytes_per_element
// (V modality tokens per sample, H the LLM hidden size).
//
// Communication (lower_hetero.cpp emits it; category "boundary_comm"):
// - Non-colocated: one leader per DP replica on each side (its tp = cp = 0 rank; the
//   encoder's leader sits on its last pipeline stage; the LLM's on stage 0). Forward: the
//   feeding encoder leader sends each LLM micro-batch to the LLM leader (P2P), which
//   broadcasts it to the tp x cp ranks of its first stage. Backward (not for frozen
//   encoders): the LLM leader sends the micro-batch's input gradient back to the encoder
//   leader, which broadcasts it to its TP group. CP at this boundary is not supported.
// - Colocated with LLM pp > 1 (three phases): as non-colocated, a leader that is both
//   sides sending nothing; with LLM cp > 1 the leader first all-gathers the gradient's CP
//   chunks over its CP group (tp index 0) before sending it back.
// - Colocated with LLM pp 1 (every module on all ranks): fan-in: an all-gather of the step's output
// over
//   each gather group (the r encoder ranks with one encoder TP index in the r replicas that
//   feed one LLM replica; together they are that LLM replica's ranks); fan-out: each rank
//   takes its slice of the replicated encoder output (no communication); equal: nothing.
//   Backward (the adjoint): fan-in: each encoder rank narrows the gradient to its own slice
//   (no communication), except with LLM cp > 1, where the gradient of a sample is spread over
//   the CP chunks and is all-gathered over the CP group first; fan-out: the encoder's TP
//   ranks all-gather the sibling slices from the r LLM replicas they span (with LLM cp > 1
//   every CP chunk of them too: a group of r x cp ranks with one LLM TP index); equal:
//   nothing (cp > 1: the CP group's all-gather).
//
// Gradients combined exactly once: an activation that several ranks consume (LLM TP
// replicas, which all hold the full embedding input; CP chunks, which each hold a part) has
// its gradient summed by the consumer's own collective (the TP "f" all-reduce of the LLM's
// first layer, in the LLM's backward) before it crosses the boundary; the boundary then only
// moves (broadcasts, gathers or narrows) that one summed gradient and never adds
// contributions again — the encoder's TP ranks each receive the same gradient, as from the
// LLM's leader, and do not reduce it.
#pragma once

#include <cstdint>
#include <string>

#include "hetpar/core/units.h"
#include "hetpar/planner/layout.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner {

struct Boundary {
  size_t encoder = 0;  // module index
  int enc_dp = 1, llm_dp = 1;
  int fan_in = 1;   // encoder replicas per LLM replica
  int fan_out = 1;  // LLM replicas per encoder replica
  int64_t enc_micro_batch = 1, llm_micro_batch = 1;
  int64_t llm_per_step = 1;       // k: LLM micro-batches one LLM replica takes per encoder step
  int64_t enc_steps = 0;          // encoder micro-batches per encoder replica
  int64_t llm_steps = 0;          // LLM micro-batches per LLM replica
  int64_t tokens_per_sample = 0;  // V
  Bytes bytes_per_micro_batch;    // one LLM micro-batch's encoder output
  // Colocated feeding from the replica's own GPUs (above); 0 = the contiguous order.
  int local_block = 0;      // llm tp x cp: the GPUs of one LLM replica on one stage
  int llm_stage_ranks = 0;  // llm tp x cp x dp
  int enc_tp = 1;

  /// The encoder step feeding LLM micro-batch i (of any replica).
  int64_t step_of(int64_t i) const { return i / llm_per_step; }
  /// The encoder replica feeding LLM replica d's micro-batch i.
  int source_replica(int d, int64_t i) const;
  /// Fan-in: which of the fan_in encoder replicas feeding an LLM replica encoder replica e
  /// is (the one feeding its micro-batches j with j * llm_mb / enc_mb = that index); 0
  /// otherwise.
  int feeder_index(int e) const;
};

/// Why the boundary of `mp` cannot be built ("" when it can).
std::string boundary_infeasibility(const Scenario& s, const Plan& p, const ModulePlan& mp);

/// The boundary of encoder plan `mp` (its module must be an encoder of s).
/// REQUIRES: boundary_infeasibility() is empty.
Boundary make_boundary(const Scenario& s, const Plan& p, const ModulePlan& mp);

/// One op of the merged program of an encoder and the LLM's first stage.
struct MergedOp {
  bool encoder = false;
  size_t index = 0;  // into the encoder's program or the LLM's stage-0 order
};

/// The encoder's program (it acts as the leading pipeline stage of the LLM): the forward of
/// encoder step t just before the LLM's first stage first needs it (its first forward of a
/// micro-batch of t); the backward of t (none when frozen) right after that stage ran the
/// backward of t's last micro-batch. `llm0`: the LLM's stage-0 program. `merged`, when not
/// null: both programs interleaved in that order (a colocated plan's order on one GPU: per
/// micro-batch, encoder forward, LLM forward and backward, encoder backward).
std::vector<PipelineOp> encoder_program(const Boundary& b, const std::vector<PipelineOp>& llm0,
                                        bool frozen, std::vector<MergedOp>* merged = nullptr);

/// The colocated three-phase program (LLM pp > 1): every step's forward, then (after the
/// LLM's pipeline) every step's backward (none when frozen).
std::vector<PipelineOp> three_phase_program(const Boundary& b, bool frozen);

/// Non-colocated: the encoder's enc_pp stages lead a 1F1B pipeline over them and the LLM's
/// pp stages, on its own ranks; this is encoder stage `stage`'s program. Its last stage runs
/// w encoder steps of warm-up ahead of the LLM, each earlier stage one more, so encoder and
/// LLM work overlap (following the LLM's stage-0 order instead would serialise the two on
/// every step): w = ceil(llm_pp / llm_per_step) (the LLM's stages counted in encoder steps),
/// or more where the LLM's first stage (`llm0`, its program) forwards further ahead before
/// a step's last backward (the interleaved schedule's longer warm-up), so that the encoder
/// never waits for a gradient the LLM cannot send before more encoder output.
/// Frozen: forwards only.
std::vector<PipelineOp> leading_stage_program(const Boundary& b,
                                              const std::vector<PipelineOp>& llm0, int llm_pp,
                                              bool frozen, int enc_pp = 1, int stage = 0);

}  // namespace hetpar::planner
